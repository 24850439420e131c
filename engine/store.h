/*
 * store.h — the engine object and the DRAM tier's primitives, shared by the
 * files of engine/ (engine.c, evict.c, kv.c) and nothing else.
 */
#ifndef KV_ENGINE_STORE_H
#define KV_ENGINE_STORE_H

#include "alloc.h"
#include "engine.h"
#include "index.h"
#include "segment.h"
#include "task.h"

struct kv__ssd;
struct kv__cluster;
struct kv__metrics;

struct kv__counters {
    _Atomic uint64_t hits_dram, hits_ssd, misses;
    _Atomic uint64_t evictions, promotions, enospc;
    _Atomic uint64_t dumps_ok, dumps_failed, loads_ok, loads_failed;
};

struct kv_engine {
    struct kv_config cfg;
    uint64_t epoch_ns;             /* ms stamps count from here */
    uint64_t open_ns;

    /* DRAM tier (absent when dram.capacity is 0 or the pipeline is ssd) */
    bool has_dram;
    struct kv__segment seg;
    struct kv__alloc *alloc;
    struct kv__table tab[KV_NS_COUNT];
    _Atomic uint64_t used;         /* segment bytes held (size classes) */
    _Atomic uint64_t reserved;     /* of which reservations not yet stored */
    uint64_t high_wm;              /* bytes: eviction starts past this */
    uint64_t evict_step;           /* bytes: what one eviction round frees */
    uint64_t lease_ns;
    pthread_mutex_t evict_lock;
    struct kv__sink sink;          /* accept NULL: victims are dropped */

    struct kv__ssd *ssd;           /* NULL without an SSD tier */
    struct kv__cluster *cluster;   /* NULL unless cluster.enabled */
    struct kv__metrics *metrics;   /* histograms, and the /metrics server (metrics.c) */
    struct kv__pool *pool;
    atomic_bool closing;
    struct kv__counters ct;
};

/* Nanoseconds since the engine opened: the stamps of the index. */
static inline uint64_t kv__engine_now(const kv_engine *e)
{
    return kv__now_ns() - e->epoch_ns;
}

static inline void *kv__seg_ptr(const kv_engine *e, uint32_t off64)
{
    return e->seg.base + (uint64_t)off64 * 64;
}
static inline uint32_t kv__seg_off64(const kv_engine *e, const void *p)
{
    return (uint32_t)(((const uint8_t *)p - e->seg.base) / 64);
}

/* Segment memory for a value of len bytes, evicting to make room; never
 * waits on leases or pins. KV_ENOSPC when no room can be made. */
int  kv__dram_alloc(kv_engine *e, uint64_t len, void **out);
void kv__dram_free(kv_engine *e, void *p, uint64_t len);

/* Stores an allocated, filled value under (ns, id, index). When the shard
 * is already present the new copy is freed and KV_OK returned (the first
 * copy wins). *out_blk is not returned: the entry may be evicted at once. */
int  kv__dram_insert(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                     void *p, uint32_t len);

/* engine.c: a batch of plain-key puts (put) or loads across the cluster,
 * on the task pool, waited for; results[i] per item. */
int  kv__run_items(kv_engine *e, bool put, const kv_shard *shards, size_t n, int *results);

/* Frees the values of an unlinked block entry and the entry itself. */
void kv__dram_free_blk(kv_engine *e, struct kv__blk *b);

/* Bytes of evicted blocks still held by write-back (memory that is already
 * on its way back and must not be evicted for again). */
static inline uint64_t kv__in_flight(kv_engine *e)
{
    return e->sink.drain ? e->sink.drain(e->sink.ctx, 0) : 0;
}

/* evict.c: frees at least want bytes of unpinned, unleased blocks, oldest
 * first, whole blocks at a time; returns the bytes handed off. */
uint64_t kv__evict(kv_engine *e, uint64_t want);
/* Runs one eviction round if used bytes are past the high watermark and no
 * other thread is already evicting. */
void kv__evict_maybe(kv_engine *e);

#endif
