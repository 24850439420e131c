/*
 * engine.h — the engine's local store as the other layers see it.
 *
 * The network layer (net/) serves remote requests against the local tiers
 * through these calls (engine/store.c, the node-local store); they bypass
 * tasks and placement: they act on this node's DRAM tier and the tiers
 * below it only, synchronously, on the calling thread. All are safe from
 * many threads at once.
 */
#ifndef KV_ENGINE_ENGINE_H
#define KV_ENGINE_ENGINE_H

#include "internal.h"

/* The DRAM segment, for registration with a transport (RDMA memory regions).
 * base NULL and len 0 for an engine without a DRAM tier. */
void kv__engine_segment(kv_engine *e, void **base, size_t *len);

/* The engine's effective config (read-only, lives as long as the engine). */
const struct kv_config *kv__engine_config(kv_engine *e);

/* The engine's local store as a network backend (engine/backend.c): the
 * kv__local_* calls below behind net/transport.h's ops table. */
struct kv__backend;
void kv__backend_engine(kv_engine *e, struct kv__backend *out);

/* Presence of shard 0 of each block in the local tiers; grants leases. */
int kv__local_lookup(kv_engine *e, int ns, const kv_block_id *ids, size_t n, uint8_t *hit);

/* Copies one shard in / out of the local tiers (DRAM, falling back to the
 * tiers below for load). Same results as a one-shard task: KV_OK,
 * KV_ENOTFOUND, KV_ENOSPC, KV_EINVAL (iov total differs from the stored
 * length). */
int kv__local_dump(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                   const kv_iov *iov, uint32_t iovcnt);
int kv__local_load(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                   const kv_iov *iov, uint32_t iovcnt);

/* The stored length of a shard in the local tiers; KV_ENOTFOUND. */
int kv__local_size(kv_engine *e, int ns, const kv_block_id *id, uint32_t index, uint64_t *len);

/* Calls cb for every shard this node holds in ns: its block, index,
 * length, and the block's last use (ns since the engine opened; larger is
 * more recent; 0 for a shard held only below DRAM, whose use is not
 * known). DRAM's shards first, one table shard at a time under its lock,
 * then each tier's (from its index), so cb must be quick and must not call
 * into the engine; nonzero from cb stops the walk. For re-replication and
 * kv_remove_all. */
typedef int (*kv__scan_cb)(void *arg, const kv_block_id *id, uint32_t index, uint64_t len,
                           uint64_t used);
int kv__local_scan(kv_engine *e, int ns, kv__scan_cb cb, void *arg);

/* Deletes a plain key's value (ns KV_NS_KEY, index 0) from the local tiers
 * (every tier): KV_OK, KV_ENOTFOUND when absent, or the error of a tier
 * when it holds the value and cannot delete it (the value then stays).
 * Anything else is KV_EINVAL: blocks leave by eviction only. */
int kv__local_remove(kv_engine *e, int ns, const kv_block_id *id, uint32_t index);

/* 1 when the plain key this node stores under id (any local tier) begins
 * with plen bytes whose XXH3-128 is hash, 0 when not, KV_ENOTFOUND when
 * none is stored, KV_ENOMEM / a tier's error when its record cannot be
 * read. engine/kv.c (it owns how a key is stored), for kv_remove_prefix. */
int kv__key_match(kv_engine *e, const kv_block_id *id, uint32_t plen, const kv_block_id *hash);
/* The same question of a record's bytes rec[0..len) (a plain key's value
 * as stored, not stored here yet: a copy a peer sends): 1, 0, or
 * KV_EINVAL when rec is no record. */
int kv__key_rec_match(const void *rec, uint64_t len, uint32_t plen, const kv_block_id *hash);

/*
 * Zero-copy serving. kv__local_pin finds a DRAM-resident shard and pins its
 * block (eviction skips it, a replacing put defers the free) so the caller
 * may send straight from the segment; kv__local_unpin ends that. Only DRAM
 * is consulted (KV_ENOTFOUND otherwise).
 *
 * kv__local_reserve carves len bytes from the segment (evicting as a dump
 * would) for an incoming value; the caller fills them (recv, RDMA WRITE) and
 * then either commits them under a key (a shard already present keeps its
 * old copy and the reservation is freed: still KV_OK) or aborts.
 */
typedef struct kv__pin { void *blk; uint32_t tshard; int ns; } kv__pin;
int  kv__local_pin(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                   const void **data, uint64_t *len, kv__pin *pin);
void kv__local_unpin(kv_engine *e, kv__pin *pin);

typedef struct kv__resv { void *data; uint64_t len; } kv__resv;
int  kv__local_reserve(kv_engine *e, uint64_t len, kv__resv *r);
int  kv__local_commit(kv_engine *e, kv__resv *r, int ns, const kv_block_id *id, uint32_t index);
void kv__local_abort(kv_engine *e, kv__resv *r);

#endif
