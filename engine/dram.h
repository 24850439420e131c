/*
 * dram.h — the DRAM tier: one registered memory segment, the size-class
 * allocator that carves it, the two index tables (blocks, plain keys),
 * eviction, leases and pins. Used by engine/store.c (the node-local store)
 * and nothing above it; evict.c is the tier's eviction half.
 *
 * Locking, memcached-style: dram.c's do_ functions assume the table-shard
 * lock is held; every kv__dram_* call below takes and drops it itself
 * (never two at once, never across a copy of value bytes or a call out of
 * the tier). See engine/internal.h for the lock order.
 */
#ifndef KV_ENGINE_DRAM_H
#define KV_ENGINE_DRAM_H

#include "alloc.h"
#include "engine.h"
#include "index.h"
#include "segment.h"

/* The tier's state: fields are dram.c's and evict.c's alone. */
struct kv__dir;

struct kv__dram {
    struct kv__segment seg;
    struct kv__alloc *alloc;
    struct kv__table tab[KV_NS_COUNT];
    uint64_t epoch_ns;             /* the index's stamps count from here */
    _Atomic uint64_t used;         /* segment bytes held (size classes) */
    _Atomic uint64_t reserved;     /* of which reservations not yet stored */
    uint64_t high_wm;              /* bytes: eviction starts past this */
    uint64_t evict_step;           /* bytes: what one eviction round frees */
    uint64_t lease_ns;
    pthread_mutex_t evict_lock;
    struct kv__sink sink;          /* accept NULL: victims are dropped */
    struct kv__dir *_Atomic dir;   /* the mirror attached processes read (dir.c); NULL: none */
    _Atomic uint64_t evictions, enospc;
};

/* Maps the segment (cfg->dram.*) and builds the tables; eviction settings
 * from cfg->eviction. Stamps count from epoch_ns. *out NULL on failure,
 * with a message in err. */
int  kv__dram_open(const struct kv_config *cfg, uint64_t epoch_ns, struct kv__dram **out,
                   char *err, size_t errlen);
/* Frees every stored value and the segment. Victims handed to the sink
 * must have been released (the sink's tier closed) first. NULL is allowed. */
void kv__dram_close(struct kv__dram *d);

/* Where victims go from now on (the next tier's write-back). */
void kv__dram_set_sink(struct kv__dram *d, struct kv__sink sink);
/* Mirrors every block shard linked from now on into dir, which the DRAM
 * tier then owns (freed at close): what a host store's server hands its
 * clients (engine/host.c). */
void kv__dram_set_dir(struct kv__dram *d, struct kv__dir *dir);
/* b was just unlinked (table-shard lock held): its shards leave the
 * mirror before their memory can be freed. */
void kv__dram_unlinked(struct kv__dram *d, int ns, struct kv__blk *b);
void kv__dram_segment(struct kv__dram *d, void **base, size_t *len);
/* "dram=N bytes (P pages, faulted in T ms) shards=S", for the open log line. */
void kv__dram_describe(struct kv__dram *d, char *buf, size_t len);
/* Adds dram_capacity, dram_used, the table counts, evictions, enospc. */
void kv__dram_stats(struct kv__dram *d, kv_stats *out);

/* Segment memory for a value of len bytes, evicting to make room; never
 * waits on leases or pins. KV_ENOSPC when no room can be made. */
int  kv__dram_alloc(struct kv__dram *d, uint64_t len, void **out);
void kv__dram_free(struct kv__dram *d, void *p, uint64_t len);

/* Stores an allocated, filled value under (ns, id, index), taking p. When
 * the shard is already present p is freed and KV_OK returned (the first
 * copy wins). The entry may be evicted at once. */
int  kv__dram_insert(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                     void *p, uint32_t len);

/* Starts loading the index buckets of shards' blocks into the cache (a
 * hint, no lock): a batch's first probe of each is then no cache miss. */
void kv__dram_prefetch(struct kv__dram *d, int ns, const kv_shard *sh, size_t n);
/* Presence, without touching the block (no lease, no recency). */
bool kv__dram_has(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index);
/* The stored length; KV_ENOTFOUND. No lease, no recency. */
int  kv__dram_size(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                   uint64_t *len);
/* Pins the shard's block (eviction skips it, a remove defers the free) and
 * touches it; KV_ENOTFOUND. Every pin is ended by one unpin. */
int  kv__dram_pin(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                  const void **data, uint64_t *len, kv__pin *pin);
/* kv__dram_pin without the touch: for a walk over every key (a prefix
 * clear), which must not make the keys it only looks at recently used. */
int  kv__dram_peek(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                   const void **data, uint64_t *len, kv__pin *pin);
void kv__dram_unpin(struct kv__dram *d, kv__pin *pin);
/* pin, copy into iov, unpin: KV_ENOTFOUND, KV_EINVAL when the iovecs do
 * not add up to the stored length. */
int  kv__dram_copy_out(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                       const kv_iov *iov, uint32_t iovcnt);
/* Unlinks the whole block (id) and frees it, or leaves the free to its last
 * reader's unpin. True when there was one. */
bool kv__dram_remove(struct kv__dram *d, int ns, const kv_block_id *id);
/* Refreshes the recency of the blocks among ids that are stored, as a
 * pinned read does (a lease is never shortened). */
void kv__dram_touch(struct kv__dram *d, int ns, const kv_block_id *ids, size_t n);
/* hit[i] = shard 0 of ids[i] is held; each hit is leased (lease_ttl). */
void kv__dram_lookup(struct kv__dram *d, int ns, const kv_block_id *ids, size_t n, uint8_t *hit);
/* kv__local_scan's walk (engine.h), one table shard at a time; returns
 * whether cb stopped it. */
bool kv__dram_scan(struct kv__dram *d, int ns, kv__scan_cb cb, void *arg);

/* A reservation of segment memory for an incoming value (kv__local_reserve
 * in engine.h); commit stores it (kv__dram_insert), abort frees it. */
int  kv__dram_reserve(struct kv__dram *d, uint64_t len, kv__resv *r);
int  kv__dram_commit(struct kv__dram *d, kv__resv *r, int ns, const kv_block_id *id,
                     uint32_t index);
void kv__dram_abort(struct kv__dram *d, kv__resv *r);

/* ---- between dram.c and evict.c ------------------------------------------ */

/* Nanoseconds since the engine opened: the stamps of the index. */
static inline uint64_t kv__dram_now(const struct kv__dram *d)
{
    return kv__now_ns() - d->epoch_ns;
}
static inline void *kv__seg_ptr(const struct kv__dram *d, uint32_t off64)
{
    return d->seg.base + (uint64_t)off64 * 64;
}

/* The one locked find: the table shard of id locked, and the block and
 * shard found in it (NULL when absent; index KV__ANY_SHARD finds the block
 * only). The caller does its do_ work on it and calls kv__dram_unlock. */
#define KV__ANY_SHARD UINT32_MAX
struct kv__at {
    struct kv__tshard *ts;
    uint64_t h;
    struct kv__blk *b;
    struct kv__sref *r;
};
struct kv__at kv__dram_lock_find(struct kv__dram *d, int ns, const kv_block_id *id,
                                 uint32_t index, uint64_t h);
static inline void kv__dram_unlock(struct kv__at *a)
{
    pthread_mutex_unlock(&a->ts->lock);
}
/* Frees the values of an unlinked block entry and the entry itself. */
void kv__dram_free_blk(struct kv__dram *d, struct kv__blk *b);

/* Bytes of evicted blocks still held by write-back (memory that is already
 * on its way out and must not be evicted for again). */
static inline uint64_t kv__dram_in_flight(struct kv__dram *d)
{
    return d->sink.drain ? d->sink.drain(d->sink.ctx, 0) : 0;
}

/* evict.c: frees at least want bytes of unpinned, unleased blocks, oldest
 * first, whole blocks at a time; returns the bytes handed off. */
uint64_t kv__evict(struct kv__dram *d, uint64_t want);
/* Runs one eviction round if used bytes are past the high watermark and no
 * other thread is already evicting. */
void kv__evict_maybe(struct kv__dram *d);

#endif
