/*
 * kvengine.h — the public API of libkvengine, and its manual.
 *
 * INTRODUCTION
 *
 * kvengine is an embedded store for the KV cache of LLM serving. An inference
 * server links libkvengine, dumps the KV blocks of every prefill into it
 * keyed by a 16-byte block id (an md5 of the token prefix, as in UCM v1), and
 * loads them back when a later request shares the prefix.
 *
 * A block is N shards; shard i is stored as its own value keyed by
 * (block id, i). A shard's bytes are the caller's tensors back to back,
 * given as an iovec list. Hot shards live in the DRAM tier: one segment of
 * `dram.capacity` bytes, mapped and faulted in once at kv_open, carved by a
 * size-class allocator, indexed by a hash table split into `dram.shards`
 * locked shards. When the segment fills past the high watermark, the least
 * recently used blocks are evicted whole (all their shards together); in the
 * `dram|ssd` pipeline they spill to the SSD tier instead of being dropped.
 *
 * Plain keys (1..KV_KEY_MAX bytes) with byte-string values live in a
 * namespace of their own beside the block shards (kv_put / kv_get ...).
 *
 * A typical session:
 *
 *     kv_config *cfg; kv_engine *e; kv_task t;
 *     kv_config_new(&cfg);
 *     kv_config_load(cfg, "kvengine.yaml", err, sizeof err);
 *     kv_open(cfg, &e);  kv_config_free(cfg);
 *     kv_dump(e, shards, n, &t);   kv_wait(e, t, 0);
 *     kv_lookup(e, ids, n, hit);
 *     kv_load(e, shards, n, &t);   kv_wait(e, t, 0);
 *     kv_close(e);
 *
 * ERRORS
 *
 * Every function that can fail returns KV_OK (0) or one of the negative
 * KV_E* codes listed in KV_ERR_MAP; kv_strerror() describes each and
 * kv_err_name() names it. A call that returns an error has no other effect:
 * no task is created, nothing stored changes, out parameters are NULL or 0.
 * Pointers are non-NULL unless stated; a NULL where one is required is
 * KV_EINVAL, never a crash.
 *
 * THREADING AND OWNERSHIP
 *
 * All functions are safe to call from many threads at once on one engine,
 * except kv_close, which must be the last call on an engine (it waits for
 * every in-flight task first). A kv_config is not locked: build it on one
 * thread, then it may be read (by kv_open) from any.
 *
 * The caller owns every buffer it passes in. kv_dump and kv_load only record
 * the caller's iovec arrays and buffers: the kv_shard array itself may be
 * freed as soon as the call returns (it is copied), but the iovec arrays and
 * the bytes they point to must stay valid and, for load, untouched, until the
 * task is done: kv_check reported done, or kv_wait returned (whatever it
 * returned). A wait that times out has cancelled and drained the task, so
 * the buffers are free again when it returns.
 *
 * Tasks run on `io.threads` worker threads. A task handle is a 64-bit
 * number, never 0 and never reused within an engine's life; kv_wait consumes
 * it. Every task must eventually be waited for, or the engine keeps its
 * result (a few dozen bytes) until kv_close.
 */
#ifndef KVENGINE_H
#define KVENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KV_EXPORT __attribute__((visibility("default")))
#else
#define KV_EXPORT
#endif

#define KV_VERSION_MAJOR 0
#define KV_VERSION_MINOR 1
#define KV_VERSION_PATCH 0

#define KV_BLOCK_ID_LEN 16
#define KV_KEY_MAX      250

/* The largest value one shard or plain key may hold (4 GiB - 64). */
#define KV_VALUE_MAX    ((size_t)0xffffffc0u)

typedef struct kv_engine kv_engine;   /* opaque */
typedef struct kv_config kv_config;   /* opaque */
typedef uint64_t kv_task;             /* 0 is never a valid task */

typedef struct kv_block_id { uint8_t bytes[KV_BLOCK_ID_LEN]; } kv_block_id;
typedef struct kv_iov { void *base; size_t len; } kv_iov;
typedef struct kv_shard {
    kv_block_id   block;   /* the block this shard belongs to */
    uint32_t      index;   /* shard index within the block (0 = whole block) */
    const kv_iov *iov;     /* the shard's tensors, stored back to back */
    uint32_t      iovcnt;
} kv_shard;

/*
 * Error codes. XX(name, value, description): one list generates the
 * constants, kv_strerror and kv_err_name. Values start at -101 so that no
 * code is mistaken for kv_lookup_prefix's -1 ("the first block misses") or
 * for a negated errno.
 */
#define KV_ERR_MAP(XX)                                                        \
    XX(EINVAL,    -101, "invalid argument")                                   \
    XX(ENOMEM,    -102, "out of memory")                                      \
    XX(ENOSPC,    -103, "no space left in the store")                         \
    XX(ENOTFOUND, -104, "not found")                                          \
    XX(ETIMEDOUT, -105, "timed out")                                          \
    XX(EIO,       -106, "input/output error")                                 \
    XX(ECORRUPT,  -107, "stored data is corrupt")                             \
    XX(ECONFIG,   -108, "invalid configuration")                              \
    XX(ENET,      -109, "network error")                                      \
    XX(EPROTO,    -110, "protocol error")                                     \
    XX(EPERM,     -111, "permission denied")                                  \
    XX(EBUSY,     -112, "resource busy")                                      \
    XX(ENOBUFS,   -113, "buffer too small")                                   \
    XX(ECLOSED,   -114, "engine is closing")                                  \
    XX(ENOTSUP,   -115, "operation not supported")

#define KV_OK 0
enum {
#define KV__ERR_ENUM(name, value, desc) KV_##name = (value),
    KV_ERR_MAP(KV__ERR_ENUM)
#undef KV__ERR_ENUM
};

/* A static description of err ("unknown error" for codes not in the map). */
KV_EXPORT const char *kv_strerror(int err);
/* The constant's name without the KV_ prefix, e.g. "ENOSPC"; "OK" for 0. */
KV_EXPORT const char *kv_err_name(int err);
/* "MAJOR.MINOR.PATCH" of the library actually linked. */
KV_EXPORT const char *kv_version(void);

/*
 * CONFIGURATION
 *
 * A kv_config starts with the defaults documented in README.md and
 * kvengine.example.yaml, then takes a YAML file or string, then single dotted
 * keys. Later values override earlier ones; keys a document does not name
 * keep their value.
 *
 * kv_config_new: *out is a fresh config, or NULL with KV_ENOMEM.
 * kv_config_load / kv_config_parse: KV_ECONFIG for a document that is not
 *   valid YAML, names an unknown key, gives a value of the wrong type or out
 *   of range. When err is non-NULL, a NUL-terminated message of at most
 *   errlen bytes names the file (or "<string>"), the line and the key, e.g.
 *   "cfg.yaml:3: eviction.ratio: must be in (0,1), got 1.5". A document is
 *   applied whole or not at all: on any error the config is left exactly as
 *   it was. KV_EIO when the file cannot be read (the message names it),
 *   KV_ENOMEM.
 * kv_config_set: one key in the YAML's dotted form ("eviction.ratio") and its
 *   value as text ("0.2", "512MiB", "250ms", "true"); KV_ECONFIG for an
 *   unknown key or bad value, KV_EINVAL for NULL arguments.
 * kv_config_get: writes the current value of a dotted key as text into buf
 *   (NUL-terminated); KV_ENOBUFS when cap is too small, KV_ECONFIG when the
 *   key is unknown.
 * kv_config_dump: writes the whole effective config as YAML into buf;
 *   returns the length it needs (excluding the NUL) like snprintf, or a
 *   negative code.
 * kv_config_free: NULL is allowed.
 */
KV_EXPORT int  kv_config_new(kv_config **out);
KV_EXPORT int  kv_config_load(kv_config *cfg, const char *path, char *err, size_t errlen);
KV_EXPORT int  kv_config_parse(kv_config *cfg, const char *yaml, size_t len, char *err, size_t errlen);
KV_EXPORT int  kv_config_set(kv_config *cfg, const char *key, const char *value); /* "eviction.ratio", "0.2" */
KV_EXPORT int  kv_config_get(const kv_config *cfg, const char *key, char *buf, size_t cap);
KV_EXPORT int  kv_config_dump(const kv_config *cfg, char *buf, size_t cap);
KV_EXPORT void kv_config_free(kv_config *cfg);

/*
 * kv_parse_size: a size as the config writes it ("4096", "512MiB", "1.5 GiB",
 *   "16MB"; units B, KiB/KB/K, MiB/MB/M, GiB/GB/G, TiB/TB/T in any case, all
 *   powers of 1024), for tools and bindings that take sizes too. KV_OK with
 *   *bytes set; KV_EINVAL for anything else (negative, hexadecimal, a
 *   fraction of a byte, past 2^64 - 1, NULL).
 */
KV_EXPORT int kv_parse_size(const char *text, uint64_t *bytes);

/*
 * ENGINE
 *
 * kv_open: maps and faults in the DRAM segment, starts the workers, and opens
 *   the SSD tier if the pipeline has one. The config is copied: it may be
 *   freed right after. *out is the engine, or NULL on failure with KV_ENOMEM
 *   (the segment cannot be mapped), KV_ECONFIG (an inconsistent config, or a
 *   cluster member that would listen beyond 127.0.0.0/8 with an empty
 *   `cluster.token` while `cluster.insecure` is false), KV_EIO (ssd.path
 *   cannot be created or read), KV_EBUSY (the SSD tier is held by another
 *   engine), KV_ENOSPC (ssd.path's file system is full), KV_ENET (the
 *   membership store cannot be reached, or cluster.listen cannot be bound),
 *   KV_EPERM (the membership store refuses cluster.token or the etcd user;
 *   or ssd.path is another user's, writable by group or others, or holds a
 *   symbolic link where a store file should be),
 *   KV_ENOTSUP (`cluster.protocol: rdma` without an RDMA device). The reason
 *   is also logged at error level.
 * kv_close: finishes every in-flight task (their waits return their results),
 *   stops the workers, and frees everything. NULL is allowed. No call on the
 *   engine may start after kv_close has begun.
 */
KV_EXPORT int  kv_open(const kv_config *cfg, kv_engine **out);   /* *out NULL on failure */
KV_EXPORT void kv_close(kv_engine *e);                           /* finishes in-flight tasks first */

/*
 * BLOCK STORE (UCM v1 semantics)
 *
 * kv_lookup: hit[i] = 1 when block ids[i] is complete: each of its shards
 *   0..store.block_shards-1 (1 by default: shard 0 alone) is in some tier;
 *   else 0. Never reads a value and never blocks on a task: on one node it is
 *   answered from memory; in a cluster it asks each block's owners, one
 *   batch per owner (bounded by the cluster's timeout). A hit grants the block a
 *   lease of `eviction.lease_ttl_ms` so that a load that follows is not
 *   undercut by eviction. n may be 0. KV_EINVAL for NULL ids or hit with n > 0.
 * kv_lookup_prefix: the index of the last hit in the leading run of hits, -1
 *   when ids[0] misses (or n is 0); a negative KV_E* below -1 on bad
 *   arguments. Grants leases like kv_lookup to the blocks in the run.
 * kv_prefetch: a hint to stage SSD-resident blocks into DRAM; returns at once.
 * kv_dump: starts a task that copies shards[0..n) in. A shard already
 *   present is skipped and counts as success. KV_EINVAL when n is 0, an iov
 *   is NULL with iovcnt > 0, or a shard is larger than KV_VALUE_MAX. The task
 *   fails with KV_ENOSPC when no room can be made (everything is leased or
 *   pinned): it never blocks waiting for room.
 * kv_load: starts a task that copies shards[0..n) out into the caller's
 *   iovecs. The iovec lengths must add up to exactly the stored size of the
 *   shard (else that shard fails with KV_EINVAL); a missing shard fails the
 *   task with KV_ENOTFOUND and leaves that shard's destination untouched.
 *   Any failed shard fails the whole task; the other shards are still copied.
 * kv_check: sets *done to 1 when the task has finished (successfully or
 *   not), else 0, and returns KV_OK. Never blocks and does not consume the
 *   handle: kv_wait then returns the task's result at once. KV_ENOTFOUND for
 *   a handle never issued or already consumed by kv_wait.
 * kv_wait: blocks until the task finishes (timeout_ms 0 = forever) and
 *   returns its result, consuming the handle. On timeout the task is
 *   cancelled and drained, and KV_ETIMEDOUT is returned. KV_ENOTFOUND for a
 *   handle never issued or already consumed.
 */
KV_EXPORT int     kv_lookup(kv_engine *e, const kv_block_id *ids, size_t n, uint8_t *hit);
KV_EXPORT ssize_t kv_lookup_prefix(kv_engine *e, const kv_block_id *ids, size_t n);
KV_EXPORT int     kv_prefetch(kv_engine *e, const kv_block_id *ids, size_t n);
KV_EXPORT int     kv_dump(kv_engine *e, const kv_shard *shards, size_t n, kv_task *task);
KV_EXPORT int     kv_load(kv_engine *e, const kv_shard *shards, size_t n, kv_task *task);
KV_EXPORT int     kv_check(kv_engine *e, kv_task task, int *done);
KV_EXPORT int     kv_wait(kv_engine *e, kv_task task, unsigned timeout_ms); /* 0 = forever */

/*
 * PLAIN KEY-VALUE
 *
 * Keys are 1..KV_KEY_MAX bytes (others are KV_EINVAL); values 0..KV_VALUE_MAX
 * bytes. Plain keys share the DRAM segment and its eviction with blocks, but
 * never collide with block ids. All calls are synchronous and copy: the
 * buffers are needed only during the call.
 *
 * kv_put: stores (or replaces) key's value. Once it returns KV_OK, no older
 *   value of the key is ever read again, after a restart too (a value held
 *   in DRAM only may be gone after one: a miss, never the old bytes).
 *   KV_ENOSPC when no room can be made, or when the SSD tier holds an older
 *   value it cannot delete (its disk is full). A put that fails may have
 *   dropped the key's DRAM copy (an exception to "no other effect"): the
 *   key then reads as its SSD value or as a miss, never as a mix.
 * kv_get: copies the value into buf and sets *vlen; KV_ENOBUFS with *vlen set
 *   to the size needed when cap is too small (buf is then untouched);
 *   KV_ENOTFOUND when absent. buf may be NULL when cap is 0.
 * kv_exists: 1 when present, 0 when absent, or a negative KV_E*.
 * kv_remove: KV_ENOTFOUND when absent.
 */
KV_EXPORT int kv_put(kv_engine *e, const void *key, size_t klen, const void *val, size_t vlen);
KV_EXPORT int kv_get(kv_engine *e, const void *key, size_t klen, void *buf, size_t cap, size_t *vlen);
KV_EXPORT int kv_exists(kv_engine *e, const void *key, size_t klen);   /* 1, 0, or < 0 */
KV_EXPORT int kv_remove(kv_engine *e, const void *key, size_t klen);   /* KV_ENOTFOUND if absent */

/*
 * In a cluster (cluster.enabled), plain keys are cluster-wide: placed on
 * owners like blocks (cluster.replica_num of them), from storage members
 * and pure clients alike, and reads fail over between owners. What a
 * replace means there:
 * - a put replaces the value on every owner, each atomically (a reader
 *   gets one whole value, never a mix), and returns KV_OK only when every
 *   owner in the view stored it: a put from a pure client is never
 *   acknowledged without being stored, and no owner keeps an older value
 *   that a failover could serve. An owner that is down fails puts of its
 *   keys (KV_ENET) until the view drops it (cluster.node_ttl_ms).
 * - two puts of one key that race may leave its owners holding different
 *   values (each whole) until the next put: replicas are not ordered
 *   against each other (that takes a consensus round per put, which a cache
 *   does not pay). Reads go to the first live owner, so every reader sees
 *   the same value while that owner lives.
 * - kv_get asks the owners for the size, then loads (two rounds); a value
 *   replaced by one of another length in between is read again.
 * - kv_remove asks every owner: KV_OK when one had it and all were asked,
 *   KV_ENET when an owner could not be asked (it may still hold the value).
 *   After an owner change (a member joined or left), the previous owners
 *   still asked on a miss drop their copy too, on a remove and on a put;
 *   and keys move: re-replication copies each to its new owners, and a
 *   node that no longer owns a key drops its copy once they have it.
 * - kv_exists is 1 when any owner has the key.
 * A member that rejoins with an SSD tier may serve values replaced while it
 * was away; start a returning member with its SSD tier cleared.
 *
 * BATCHES: kv_put_many / kv_get_many / kv_exists_many do n plain-key calls
 *   at once; in a cluster one round per owner (kv_get_many: two), not a
 *   round trip per key. results[i] gets each item's outcome, as the single
 *   call would return it (kv_exists_many: 1, 0 or a negative KV_E*); the
 *   return value is KV_OK when the batch ran, KV_EINVAL (items or results
 *   NULL with n > 0), KV_ENOMEM, or a cluster error that failed them all.
 *   kv_pair: key/klen as for kv_put; for a put, val/len is the value (only
 *   read); for a get, val is the buffer and len its capacity on the way in,
 *   and the value's length on the way out (when results[i] is KV_OK or
 *   KV_ENOBUFS). kv_get_many reads each value straight into val: an item
 *   that fails otherwise than KV_ENOBUFS may have had val written. Buffers
 *   are needed only during the call.
 */
typedef struct kv_pair {
    const void *key;
    size_t      klen;
    void       *val;
    size_t      len;
} kv_pair;
KV_EXPORT int kv_put_many(kv_engine *e, const kv_pair *items, size_t n, int *results);
KV_EXPORT int kv_get_many(kv_engine *e, kv_pair *items, size_t n, int *results);
KV_EXPORT int kv_exists_many(kv_engine *e, const kv_pair *items, size_t n, int *results);

/*
 * kv_remove_all: removes every plain key (blocks are left alone), from both
 *   tiers; in a cluster from every owner in the view, whoever put them (what
 *   Mooncake's remove_all does). *removed (may be NULL) gets how many keys
 *   were removed: in a cluster the copies dropped divided by the copies a
 *   key has, exact when the owners agree. KV_ENET when an owner could not
 *   be asked (it may still hold keys; the others were cleared), KV_EINVAL
 *   for a NULL engine, KV_ENOMEM when the keys could not all be listed (the
 *   listed ones are removed). Puts racing with it may survive it.
 */
KV_EXPORT int kv_remove_all(kv_engine *e, uint64_t *removed);

/*
 * kv_remove_prefix: removes every plain key whose first len bytes are
 *   prefix[0..len) (blocks are left alone), from every tier; in a cluster
 *   from every owner in the view, whoever put them, as kv_remove_all does
 *   (len 0 is kv_remove_all). What it is for: one tenant of a shared store
 *   clearing its own keys (a Mooncake tenant's remove_all). prefix is read
 *   during the call only. *removed (may be NULL) counts as kv_remove_all's.
 *   The prefix travels to the owners as its XXH3-128 hash and its length
 *   (one batch item each), and each owner hashes the first len bytes of
 *   every key it holds against it: a key below DRAM has its stored record
 *   read to learn its key, so the call reads the values that only the SSD
 *   tier holds (those shorter than the prefix excepted). KV_EINVAL for a
 *   NULL engine, len above KV_KEY_MAX, or prefix NULL with len > 0; KV_ENET,
 *   KV_ENOMEM as kv_remove_all, and a tier's error for a record that could
 *   not be read (that key stays; the others are still removed). A server or
 *   peer built before this call refuses the request as malformed (the
 *   connection's error: KV_EPROTO or KV_ENET), never a wider removal. Puts
 *   racing with it may survive it.
 */
KV_EXPORT int kv_remove_prefix(kv_engine *e, const void *prefix, size_t len, uint64_t *removed);

/*
 * ZERO-COPY
 *
 * kv_register_buffer: registers [addr, addr+len) of caller memory for RDMA so
 *   that loads into it and dumps from it need no bounce copy. A no-op that
 *   succeeds when the transport is tcp or the engine is not clustered.
 *   KV_EBUSY when the range overlaps one already registered. The memory must
 *   stay mapped until kv_unregister_buffer(addr) (KV_ENOTFOUND when addr is
 *   not the start of a registered range).
 */
KV_EXPORT int kv_register_buffer(kv_engine *e, void *addr, size_t len);
KV_EXPORT int kv_unregister_buffer(kv_engine *e, void *addr);

/*
 * ONE STORE PER HOST
 *
 * Processes of one user on one host that open kvengine with the same
 * `store.name`, or (with an SSD tier) the same `ssd.path`, share ONE store:
 * the same blocks and plain keys, one DRAM budget (`dram.capacity` is
 * mapped once, by the process that serves it), one SSD tier. The first
 * opener takes `<store.dir>/<id>.lock` and SERVES the store (or kvnode does,
 * as the host's daemon); every later opener is ATTACHED: it opens no tier
 * (no DRAM of its own) and every call above goes to the server over
 * `<id>.sock`. An engine alone behaves exactly as an unshared one.
 *
 * What is shared, and what a client may touch: the server's DRAM segment
 * is mapped READ-ONLY into attached processes (a sealed memfd), and so is
 * its directory (where each block shard in DRAM lies): a load of shards in
 * DRAM copies each straight from the segment into the caller's buffer and
 * asks the server nothing, checking afterwards that the shard was not moved
 * meanwhile (else it asks; `store.direct_reads: false`: every load asks,
 * and the server pins the shards while they are copied). A dump is copied into the segment by the server, from
 * the caller's staging memory (or straight from a kv_buffer_alloc buffer):
 * no attached process can write stored bytes. Only the same uid (checked
 * on the socket, which lives in a 0700 directory) that proves
 * `cluster.token`, on the same boot of the same host, attaches (KV_EPERM
 * otherwise).
 *
 * When either side dies: a client's pins, staging and buffer mappings are
 * dropped by the server when its connection ends, at any point. A server's
 * death fails the calls in flight (KV_ENET, within io.timeout_ms or 5 s);
 * the next call reconnects: to a restarted server, or it takes the lock
 * and serves the store itself. Blocks on SSD then load byte for byte;
 * blocks that lived only in the dead server's DRAM are misses.
 * kv_ssd_scan, kv_ssd_scrub, kv_ssd_compact and kv_ssd_remove of an
 *   attached engine run on the serving process's SSD tier (see ADMIN);
 *   kv_ssd_recover is offline and refuses while any process serves the store.
 * fork(): a child of a process that has the store open keeps none of the
 *   store's locks or sockets (they are closed in the child) and must not use
 *   the parent's engine; it kv_open's its own (it attaches). It can take a
 *   store without an SSD tier over; one with an SSD tier is taken over by a
 *   process not forked from the server (RocksDB's table of locked files is
 *   copied by fork).
 *
 * kv_buffer_alloc: *out = len bytes of page-aligned memory for dump sources
 *   and load destinations. On an attached engine it is a memfd the server
 *   maps too: a load of a shard whose one iovec lies in it is copied there
 *   by the server directly when the shard is not in DRAM, and a dump from
 *   it is one copy (the server's) instead of two. On any other engine it is
 *   plain memory (registered for RDMA in a cluster). The memory stays
 *   valid across a reconnect or a takeover, until kv_buffer_free(addr) or
 *   kv_close. KV_OK, KV_EINVAL (len 0 or above KV_VALUE_MAX), KV_ENOMEM.
 * kv_buffer_free: frees a buffer kv_buffer_alloc gave (addr its start):
 *   KV_OK, KV_ENOTFOUND when it is not one. No task may be using it.
 */
KV_EXPORT int kv_buffer_alloc(kv_engine *e, size_t len, void **out);
KV_EXPORT int kv_buffer_free(kv_engine *e, void *addr);

/*
 * COUNTERS
 *
 * A consistent-enough snapshot (each field is read atomically; fields are not
 * read under one lock). Counters count since kv_open.
 */
/* Units: *_capacity and *_used are bytes; *_blocks count blocks (shard 0
 * present); hits_*, misses count shards looked for by loads and gets;
 * evictions count blocks dropped or spilled from DRAM; spills and
 * spill_drops count evicted blocks written to / dropped before the SSD
 * tier; checksum_failures count values that failed a check and were
 * deleted; tasks_inflight is a gauge of tasks not yet consumed by a wait. */
typedef struct kv_stats {
    uint64_t dram_capacity, dram_used, dram_blocks;
    uint64_t ssd_capacity, ssd_used, ssd_blocks;
    uint64_t hits_dram, hits_ssd, misses;
    uint64_t evictions, spills, spill_drops, checksum_failures;
    uint64_t tasks_inflight;
    /* more may follow */
    uint64_t dram_shards;        /* shard values stored in DRAM */
    uint64_t dram_index_bytes;   /* memory held by the DRAM index */
    uint64_t promotions;         /* SSD shards copied back into DRAM */
    uint64_t keys;               /* plain keys stored */
    uint64_t dumps_ok, dumps_failed, loads_ok, loads_failed;
    uint64_t enospc;             /* shards refused for lack of room */
    uint64_t open_ns;            /* time kv_open took, nanoseconds */
    uint64_t host_clients;       /* processes' connections this engine serves its store to now */
    uint64_t host_pins;          /* DRAM shards pinned for attached readers now (a pin
                                  * ends with the reader's next request, or within
                                  * 10 ms of its copy) */
    uint64_t host_attached;      /* 1 when this engine is attached to another process's store */
    /* Lookups of blocks (kv_lookup, kv_lookup_prefix, and in a cluster the
     * lookups peers send this node) answered by this engine's store: each
     * block id examined is one hit, by the tier that holds its shard 0
     * (DRAM first), or one miss (absent or incomplete). */
    uint64_t lookup_hits_dram, lookup_hits_ssd, lookup_misses;
    /* kv_lookup_prefix calls made on this engine handle: ids passed in,
     * and of those the ids in the leading run of hits (the prefix found). */
    uint64_t prefix_ids, prefix_hits;
    uint64_t reserved[8];
} kv_stats;
KV_EXPORT int kv_stats_get(kv_engine *e, kv_stats *out);

/*
 * CLUSTER DAEMONS
 *
 * What tools/kvmaster (and any program that wants to embed one) runs.
 *
 * kv_master_run: serves cluster membership on `cluster.master` until *stop
 *   becomes nonzero (checked at least every 20 ms; set it from a signal
 *   handler), then returns KV_OK. Members JOIN with their id, address and
 *   registered segments and must present `cluster.token` (a wrong or missing
 *   token is refused, KV_EPERM on their side); a member silent for
 *   `cluster.node_ttl_ms` leaves the view. The master is never on the data
 *   path. KV_ECONFIG for a bad address, or for one beyond 127.0.0.0/8 with
 *   an empty token unless `cluster.insecure` is true (then it is logged);
 *   KV_ENET when it cannot listen; when
 *   err is non-NULL a NUL-terminated message of at most errlen bytes says
 *   why. cfg is only read, and must stay valid until the call returns.
 *
 * A storage node (tools/kvnode) needs nothing more: it is kv_open with
 * `cluster.enabled: true`, kept open until it is told to stop.
 */
KV_EXPORT int kv_master_run(const kv_config *cfg, volatile int *stop, char *err, size_t errlen);

/*
 * ADMIN
 *
 * What an operator's tool (kvctl) and a monitoring system need beyond the
 * data path: walking and checking the SSD tier, the Prometheus metrics of an
 * engine, serving metrics from any process, and the cluster view as kvmaster
 * holds it. None of these is on the data path; all are safe to call while
 * the engine serves, from any thread.
 *
 * kv_ssd_entry: one value stored on the SSD tier. ns is KV_SSD_NS_BLOCK for
 *   a block shard (id, index) or KV_SSD_NS_KEY for a plain key (id is the
 *   key's 16-byte hash: plain keys cannot be listed by name; index is 0).
 *   size is the value's length in bytes. seq counts entries from 0 and total
 *   is how many the walk will visit, for progress displays. status is KV_OK,
 *   or for a scrub KV_ECORRUPT when the value failed its checksum (or is
 *   gone from disk although indexed), KV_EIO when it could not be read.
 * kv_ssd_cb: called once per entry on the calling thread; the entry is
 *   valid only during the call. Return 0 to go on, nonzero to stop the walk
 *   (the function then returns KV_OK with what it counted so far).
 * Attached (one store per host): the walk runs in the serving process and
 *   its entries come back in batches of at most 1024, each handed to cb here
 *   before the next is asked for; a stop ends the walk there at the end of
 *   the batch it fell in (a scrub with repair may have deleted that batch's
 *   later bad values; its counts are what cb saw). KV_ENET / KV_ETIMEDOUT
 *   when the serving process goes away mid-walk. kv_ssd_compact and
 *   kv_ssd_remove run there too; a compaction's wait is kept alive by the
 *   server however long it takes.
 * kv_ssd_scan: visits every value the SSD tier holds (including values
 *   queued for write-back), from its in-memory index: no I/O. KV_ENOTSUP
 *   when the engine has no SSD tier, KV_ENOMEM.
 * kv_ssd_scrub: reads every value on disk and verifies its checksum; cb
 *   (NULL allowed) sees each with its status. A bad value is left as it is
 *   unless repair is nonzero: then it is deleted (and counted in
 *   checksum_failures), as a load that met it would. *checked and *bad
 *   (either may be NULL) receive the counts. KV_ENOTSUP without an SSD tier.
 * kv_ssd_compact: gives the space of deleted values back to the file
 *   system: value log files more than half dead are compacted (their live
 *   values copied out, readable throughout, the files removed), then the
 *   tier's RocksDB index is fully compacted. Large values' space comes back
 *   when they are deleted; this is for what small ones leave. Blocks until
 *   done (seconds on a large store). KV_ENOTSUP without an SSD tier.
 */
#define KV_SSD_NS_BLOCK 0
#define KV_SSD_NS_KEY   1
typedef struct kv_ssd_entry {
    int         ns;
    kv_block_id id;
    uint32_t    index;
    uint64_t    size;
    uint64_t    seq, total;
    int         status;
} kv_ssd_entry;
typedef int (*kv_ssd_cb)(void *ctx, const kv_ssd_entry *ent);

KV_EXPORT int kv_ssd_scan(kv_engine *e, kv_ssd_cb cb, void *ctx);
KV_EXPORT int kv_ssd_scrub(kv_engine *e, int repair, kv_ssd_cb cb, void *ctx,
                           uint64_t *checked, uint64_t *bad);
KV_EXPORT int kv_ssd_compact(kv_engine *e);

/*
 * kv_ssd_recover: rebuilds the SSD tier's index from its value log, offline.
 *   Every value's record in the log is self-describing (key, lengths, write
 *   stamp, checksum), so RocksDB's files (which only say where values are)
 *   can be rebuilt from it: they are moved into ssd.path/damaged-TIME/ (kept
 *   for a post-mortem, never deleted) and a new index is written from every
 *   intact record (each checked against its checksum; of two copies of one
 *   key the newer write wins; deleted values stay deleted). kv_open does the
 *   same by itself when RocksDB's files cannot be opened or are missing, and
 *   re-indexes at every open the values the log holds beyond what RocksDB
 *   points to (a WAL cut short by damage); this call is for an operator who
 *   distrusts an index that still opens. *recovered (NULL allowed) gets the
 *   number of values indexed. cfg is only read; the store must not be open
 *   (KV_EBUSY): while a process serves it on this host (store.name, or the
 *   pipeline's ssd.path), err says "store ID is served by pid N (LOCK);
 *   stop it first", and the store's lock is held for the whole rebuild so
 *   that no process starts serving it meanwhile. KV_ENOTSUP when cfg has no SSD tier (pipeline dram);
 *   KV_ENOSPC, KV_EIO with err naming the cause. Reads the whole log: about
 *   as long as reading ssd.capacity from the disk.
 */
KV_EXPORT int kv_ssd_recover(const kv_config *cfg, uint64_t *recovered, char *err, size_t errlen);

/*
 * kv_shard_size: the stored length of shard (id, index) wherever the engine
 *   finds it (DRAM, SSD, or its owner in a cluster), so that a caller can
 *   size the buffers of a kv_load. KV_ENOTFOUND when absent.
 * kv_ssd_remove: deletes every shard of block id from the SSD tier (DRAM
 *   copies are left alone: a tool opens the store offline with no DRAM
 *   tier). KV_ENOTFOUND when the tier holds none, KV_ENOTSUP without one.
 */
KV_EXPORT int kv_shard_size(kv_engine *e, const kv_block_id *id, uint32_t index, uint64_t *len);
KV_EXPORT int kv_ssd_remove(kv_engine *e, const kv_block_id *id);

/*
 * Metrics.
 *
 * kv_metrics_render: the engine's figures in the Prometheus text format
 *   (version 0.0.4): every name starts with kvengine_ — capacity, used
 *   bytes and blocks per tier, hits and misses per tier, evictions, spills,
 *   spill drops, checksum failures, tasks, task latency histograms
 *   (kvengine_task_duration_seconds{op="dump"|"load"}), and in a cluster the
 *   members of the view. *text is malloc'd and NUL-terminated (free() it),
 *   *len its length without the NUL. KV_ENOMEM.
 * An engine whose config sets `metrics.listen` serves this at
 *   http://LISTEN/metrics, and kv_health's answer at /health, from kv_open to kv_close
 *   (kv_open fails with KV_ENET when it cannot listen there).
 *
 * kv_metrics_serve: serves whatever fn renders at /metrics, and /health,
 *   over HTTP on addr ("host:port", IPv4) from a thread of its own, until
 *   kv_metrics_stop. fn is called on that thread for every scrape and must
 *   set *text to a malloc'd buffer of *len bytes (the server frees it) and
 *   return KV_OK; an error is answered with HTTP 500. KV_ECONFIG for a bad
 *   address, KV_ENET when it cannot listen (err says why when non-NULL).
 *   What kvmaster uses; any program may.
 * kv_metrics_port: the TCP port the server listens on.
 * kv_metrics_stop: stops serving and frees; waits for a scrape in progress.
 *   NULL is allowed.
 */
typedef struct kv_metrics_server kv_metrics_server;   /* opaque */
typedef int (*kv_metrics_fn)(void *ctx, char **text, size_t *len);

KV_EXPORT int  kv_metrics_render(kv_engine *e, char **text, size_t *len);
KV_EXPORT int  kv_metrics_serve(const char *addr, kv_metrics_fn fn, void *ctx,
                                kv_metrics_server **out, char *err, size_t errlen);
KV_EXPORT int  kv_metrics_port(const kv_metrics_server *s);
KV_EXPORT void kv_metrics_stop(kv_metrics_server *s);

/*
 * Health and the metrics endpoint's access rule (issue 19).
 *
 * kv_health: whether e serves: KV_OK (why = "ok") once kv_open returned it
 *   and, for a cluster member, while the membership store answers and lists
 *   this node; else KV_EBUSY (joining: not in the view yet), KV_ENET (the
 *   membership store unreachable), KV_EPERM (it refuses the token) or KV_EIO
 *   (a tier's figures are unavailable), with why saying so (NUL-terminated,
 *   at most cap bytes). Asks the membership store at most once a second.
 *   What /health answers: 200 "ok", or 503 "unavailable: WHY".
 * kv_health_fn: a /health source for kv_metrics_retarget, same contract.
 * kv_metrics_serve_config: kv_metrics_serve on cfg's metrics.listen with
 *   its access rule: beyond 127.0.0.0/8 it needs metrics.token (then
 *   /metrics answers 401 without "Authorization: Bearer TOKEN"; /health
 *   stays open) or metrics.insecure: true, else KV_ECONFIG. fn may be NULL
 *   (/metrics answers 503 until retargeted); a fn returning KV_EBUSY is
 *   answered 503 too. Every server keeps at most 64 connections, 8 from one
 *   address, and closes one idle for 5 s.
 * kv_metrics_retarget: swaps what s serves (NULL health: always "ok"), e.g.
 *   from "starting" to an engine once kv_open returned; safe while serving.
 */
typedef int (*kv_health_fn)(void *ctx, char *why, size_t cap);
KV_EXPORT int  kv_health(kv_engine *e, char *why, size_t cap);
KV_EXPORT int  kv_metrics_serve_config(const kv_config *cfg, kv_metrics_fn fn, void *ctx,
                                       kv_metrics_server **out, char *err, size_t errlen);
KV_EXPORT void kv_metrics_retarget(kv_metrics_server *s, kv_metrics_fn fn, void *ctx,
                                   kv_health_fn health, void *hctx);

/*
 * Cluster view.
 *
 * kv_members: asks the kvmaster at cfg's `cluster.master` (presenting
 *   `cluster.token`), or with `cluster.metadata: etcd` the etcd at
 *   `cluster.etcd_endpoints` (records under `cluster.etcd_prefix`, as
 *   `cluster.etcd_user` when set), for its current view, without joining
 *   it; the version is then etcd's revision of the last change. *members is
 *   a malloc'd array of *n entries (free() it; NULL when *n is 0), *version
 *   the view's version. owner is 1 for a member that stores blocks, 0 for a
 *   pure client; segments and segment_bytes describe the DRAM it registered
 *   for RDMA (none on tcp); the figures (DRAM and SSD capacity and use,
 *   blocks, keys, version) are the member's own, signed by it with the rest
 *   of its record at its last heartbeat.
 *   KV_ENET when the master (or every etcd endpoint) does not answer,
 *   KV_ETIMEDOUT when it does not answer within `io.timeout_ms` (2 s when
 *   0), KV_EPERM when it refuses the token, KV_EPROTO for a malformed answer.
 */
typedef struct kv_member_info {
    char     id[129];
    char     addr[129];
    int      owner;
    uint32_t segments;
    uint64_t segment_bytes;
    /* The member's figures as its record carries them, refreshed by every
     * heartbeat (its store's kv_stats; 0 for a pure client): */
    uint64_t dram_capacity, dram_used;   /* bytes */
    uint64_t ssd_capacity, ssd_used;     /* bytes */
    uint64_t dram_blocks, ssd_blocks;    /* blocks (shard 0 present) per tier */
    uint64_t keys;                       /* plain keys */
    int64_t  heartbeat_age_ms;           /* since the record was last refreshed: our
                                          * wall clock against its stamp (0 when
                                          * ahead of ours); -1 when unknown */
    char     version[33];                /* its library's kv_version() */
    uint64_t reserved[8];
} kv_member_info;

KV_EXPORT int kv_members(const kv_config *cfg, uint64_t *version, kv_member_info **members,
                         size_t *n);

#ifdef __cplusplus
}
#endif
#endif /* KVENGINE_H */
