/*
 * shm.h — the host store's shared-memory transport (net/shm.c): one
 * process serves its engine to the other processes of the same user on the
 * same host over a Unix stream socket, with the bytes in shared memory.
 *
 * Not a line in transport.c's table, and why: that table's transports
 * connect members by host:port, move kv__op batches against a node-local
 * kv__backend, and publish registered segments to the master. The host
 * transport is reached by a path, passes descriptors (SCM_RIGHTS), and
 * serves the engine as a whole (a cluster member's attached clients reach
 * the cluster through it), so its server side takes the wider ops table
 * below, filled by engine/host.c over the public calls. Its serving policy
 * is serve.c's: pin what DRAM holds and let the reader copy it from where
 * it lies; copy the rest (SSD, a remote owner) into memory the reader
 * shares; dumps are copied in by the server alone.
 */
#ifndef KV_NET_SHM_H
#define KV_NET_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* What the server serves, given by engine/host.c. Every call may come from
 * any connection thread at once. load/dump take at most 64 shards and
 * fill results[i] per shard (KV_OK, KV_ENOTFOUND, ...); their return is a
 * whole-call error. pin/unpin are kv__local_pin's (DRAM of this node). */
struct kv__shm_host {
    void *ctx;
    int  (*lookup)(void *ctx, const kv_block_id *ids, size_t n, uint8_t *hit);
    int  (*prefetch)(void *ctx, const kv_block_id *ids, size_t n);
    int  (*pin)(void *ctx, const kv_block_id *id, uint32_t index, const void **data,
                uint64_t *len, kv__pin *pin);
    void (*unpin)(void *ctx, kv__pin *pin);
    int  (*load)(void *ctx, const kv_shard *sh, size_t n, int *results);
    int  (*dump)(void *ctx, const kv_shard *sh, size_t n, int *results);
    int  (*put)(void *ctx, const void *key, size_t klen, const void *val, size_t vlen);
    int  (*get)(void *ctx, const void *key, size_t klen, void *buf, size_t cap, size_t *vlen);
    int  (*exists)(void *ctx, const void *key, size_t klen);
    int  (*remove)(void *ctx, const void *key, size_t klen);
    int  (*remove_all)(void *ctx, uint64_t *removed);
    int  (*stats)(void *ctx, kv_stats *out);
    /* kv_put_many / kv_get_many / kv_exists_many (what 0, 1, 2): a batch
     * is one call here, so a cluster member batches it per owner too. */
    int  (*many)(void *ctx, int what, kv_pair *items, size_t n, int *results);
    int  (*remove_prefix)(void *ctx, const void *prefix, size_t len, uint64_t *removed);
    /* The blocks clients read straight from the segment: their recency, as a
     * pinned load refreshes it (ids of blocks not stored are ignored). */
    void (*touch)(void *ctx, const kv_block_id *ids, size_t n);
    /* The segment pins point into, and its sealed memfd (-1: none, then
     * nothing is pinned and every load is copied). */
    const void *seg_base;
    size_t seg_len;
    int seg_fd;
    /* The segment's directory (net/dir.c), a sealed memfd the clients
     * map read-only to load DRAM shards without asking (-1: none). */
    int dir_fd;
    size_t dir_len;
    /* kv_ssd_scan / _scrub / _compact / _remove of the served engine; cb
     * runs on the connection's thread (the server streams the entries to
     * the client, whose cb runs on its caller's). */
    int  (*ssd_scan)(void *ctx, kv_ssd_cb cb, void *arg);
    int  (*ssd_scrub)(void *ctx, int repair, kv_ssd_cb cb, void *arg, uint64_t *checked,
                      uint64_t *bad);
    int  (*ssd_compact)(void *ctx);
    int  (*ssd_remove)(void *ctx, const kv_block_id *id);
};

/* Every hello starts with these: a peer of another version is refused, by
 * the client (its error names both versions) and by the server (it logs
 * both), before the token is proved. */
#define KV__SHM_MAGIC   0x4d53564bu   /* "KVSM" */
/* A client's pin board: 8192 pin bytes, 64 bytes of counters, a ring of
 * 1024 block ids (net/shm.c). */
#define KV__SHM_BOARD_LEN (8192u + 64u + 1024u * 16u)
#define KV__SHM_VERSION 3u            /* 2: pins end through the client's pin board;
                                         3: the segment's directory, direct loads */

/* ---- the server ---------------------------------------------------------- */
struct kv__shm_server;

/* Binds path (a stale socket there is unlinked first; the caller holds the
 * lock that makes it ours) and serves host until kv__shm_stop. Every
 * connection proves the same euid (SO_PEERCRED), the token (auth.h) and the
 * same boot id before anything else. KV_ENET with err on failure. */
int  kv__shm_serve(const char *path, const char *token, unsigned timeout_ms,
                   const struct kv__shm_host *host, struct kv__shm_server **out, char *err,
                   size_t errlen);
/* Stops accepting, ends every connection (dropping its pins, reservations
 * and mappings), unlinks the socket. NULL is a no-op. */
void kv__shm_stop(struct kv__shm_server *s);
/* Connections served now, and pins they hold. */
/* Attached clients, pins they hold, and the loads they read straight from
 * the segment (their counts, as they report them). */
void kv__shm_server_stats(struct kv__shm_server *s, uint64_t *clients, uint64_t *pins,
                          uint64_t *direct);
/* Requests (frames) answered since kv__shm_serve: round trips, counted. */
uint64_t kv__shm_server_requests(struct kv__shm_server *s);

/* The fuzz harness's way in (tests/fuzz/fuzz_shm.c): a connection to the
 * server at path that has passed the real handshake (the client's own
 * code), as a connected nonblocking socket in *fd that the caller owns and
 * writes frames to: they are served by the server's own connection thread.
 * kv__shm_connect's errors. */
int  kv__shm_fuzz_dial(const char *path, const char *token, int *fd);

/* ---- shared buffers (kv_buffer_alloc) ------------------------------------ */
/* A process's shared buffers: memfds it maps and hands to the server on
 * first use by each connection, so that loads land in them and dumps are
 * copied from them by the server directly. Outlives any one connection
 * (the caller's buffers stay valid across a reconnect). */
struct kv__shm_regions;
int  kv__shm_regions_new(struct kv__shm_regions **out);
void kv__shm_regions_free(struct kv__shm_regions *r);   /* unmaps what is left */
/* memfd (shared) or anonymous (shared == false) memory of len bytes,
 * page-aligned. KV_ENOMEM. */
int  kv__shm_region_alloc(struct kv__shm_regions *r, size_t len, bool shared, void **out);
/* KV_ENOTFOUND when addr does not start a buffer of r. */
int  kv__shm_region_free(struct kv__shm_regions *r, void *addr);
/* True when every shard with bytes is one iovec inside one shared buffer
 * of r: a dump the server copies straight from them. */
bool kv__shm_regions_hold(struct kv__shm_regions *r, const kv_shard *sh, size_t n);

/* ---- the client ---------------------------------------------------------- */
struct kv__shm_client;

/* Connects to the server at path (timeout_ms bounds the whole handshake)
 * and maps its segment read-only. KV_EPERM (another user, a refused token,
 * another host's boot id), KV_ENET (nobody serves path), KV_ETIMEDOUT,
 * KV_EPROTO. err says which. */
int  kv__shm_connect(const char *path, const char *token, unsigned timeout_ms,
                     struct kv__shm_regions *regions, struct kv__shm_client **out, char *err,
                     size_t errlen);
void kv__shm_disconnect(struct kv__shm_client *c);
/* True once a call lost the server: every further call fails KV_ENET, the
 * caller reconnects. */
bool kv__shm_broken(struct kv__shm_client *c);
/* Loads of shards the server's directory names are copied with no round
 * trip (on: the default; store.direct_reads). */
void kv__shm_set_direct(struct kv__shm_client *c, bool on);

/* The calls, with the public API's contracts; any number of shards (split
 * as needed). A connection error is KV_ENET / KV_ETIMEDOUT / KV_EPROTO for
 * the whole call (a load's destinations may then be partly written). */
int kv__shm_lookup(struct kv__shm_client *c, const kv_block_id *ids, size_t n, uint8_t *hit);
int kv__shm_prefetch(struct kv__shm_client *c, const kv_block_id *ids, size_t n);
int kv__shm_load(struct kv__shm_client *c, const kv_shard *sh, size_t n, int *results);
int kv__shm_dump(struct kv__shm_client *c, const kv_shard *sh, size_t n, int *results);
int kv__shm_put(struct kv__shm_client *c, const void *key, size_t klen, const void *val,
                size_t vlen);
int kv__shm_get(struct kv__shm_client *c, const void *key, size_t klen, void *buf, size_t cap,
                size_t *vlen);
int kv__shm_exists(struct kv__shm_client *c, const void *key, size_t klen);
int kv__shm_remove(struct kv__shm_client *c, const void *key, size_t klen);
int kv__shm_remove_all(struct kv__shm_client *c, uint64_t *removed);
int kv__shm_remove_prefix(struct kv__shm_client *c, const void *prefix, size_t len,
                          uint64_t *removed);
int kv__shm_stats(struct kv__shm_client *c, kv_stats *out);
/* kv_put_many (what 0), kv_get_many (1), kv_exists_many (2) with their
 * contracts: one request per chunk of items whose values fit a frame
 * (MANY_BYTES), each value larger than a frame carries alone in its own
 * call (staged, as kv__shm_put / kv__shm_get). */
int kv__shm_many(struct kv__shm_client *c, int what, kv_pair *items, size_t n, int *results);
/* kv_ssd_scan / kv_ssd_scrub / kv_ssd_compact / kv_ssd_remove on the
 * serving engine, with their contracts: a walk's entries arrive in batches
 * and cb runs on the calling thread; its nonzero return ends the walk (the
 * server's walk stops at the end of the batch it was in: with repair, that
 * batch's bad values may already be deleted). A compaction's wait is kept
 * alive by the server, so it is bounded by the timeout only while the
 * server is silent. */
int kv__shm_ssd_scan(struct kv__shm_client *c, kv_ssd_cb cb, void *ctx);
int kv__shm_ssd_scrub(struct kv__shm_client *c, int repair, kv_ssd_cb cb, void *ctx,
                      uint64_t *checked, uint64_t *bad);
int kv__shm_ssd_compact(struct kv__shm_client *c);
int kv__shm_ssd_remove(struct kv__shm_client *c, const kv_block_id *id);

#endif
