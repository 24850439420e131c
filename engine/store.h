/*
 * store.h — the engine object, and the node-local store's calls beyond the
 * kv__local_* ones of engine.h (engine/store.c). Shared by the files of
 * engine/ and nothing else.
 *
 * The engine object holds the store's parts (the DRAM tier, the tiers
 * below it), but only store.c decides what goes where among them; the
 * other files of engine/ call the store.
 */
#ifndef KV_ENGINE_STORE_H
#define KV_ENGINE_STORE_H

#include "engine.h"
#include "metrics.h"
#include "task.h"
#include "tier.h"

struct kv__dram;
struct kv__cluster;
struct kv__metrics;
struct kv__host;
struct kv__shm_regions;

/* The counters kv_stats reports that are the store's and the tasks'
 * (evictions and enospc are the DRAM tier's, a tier keeps its own). */
struct kv__counters {
    _Atomic uint64_t hits_dram, hits_ssd, misses, promotions;
    _Atomic uint64_t dumps_ok, dumps_failed, loads_ok, loads_failed;
};

#define KV__TIERS_MAX 4

struct kv_engine {
    struct kv_config cfg;
    uint64_t epoch_ns;             /* ms stamps count from here */
    uint64_t open_ns;

    /* The node-local store (store.c's alone): DRAM, then the tiers below
     * it in pipeline order. */
    struct kv__dram *dram;         /* NULL when dram.capacity is 0 or the pipeline is ssd */
    struct kv__tier tier[KV__TIERS_MAX];
    unsigned ntiers;

    struct kv__cluster *cluster;   /* NULL unless cluster.enabled */
    struct kv__metrics *metrics;   /* histograms, and the /metrics server (metrics.c) */
    struct kv__pool *pool;
    atomic_bool closing;
    struct kv__counters ct;
    struct kv__lk_counters lk;     /* lookup and prefix counters (metrics.h) */
    struct kv__host *host;         /* NULL unless the store is shared (engine/host.c) */
    struct kv__shm_regions *buffers;   /* kv_buffer_alloc's (net/shm.h) */
};

/* Opens the tiers the pipeline names: DRAM (when it has capacity), then
 * every built-in tier whose pipeline bit is set, in table order (none for
 * a pure cluster client). A message in err on failure; kv__store_close
 * then undoes what was opened. */
int  kv__store_open(kv_engine *e, char *err, size_t errlen);
/* Closes the tiers, then DRAM (a tier may still hold DRAM's victims). */
void kv__store_close(kv_engine *e);
/* Opens one more tier below the others (what kv__store_open does for each
 * built-in one); the first one below DRAM receives its victims. */
int  kv__store_attach(kv_engine *e, const struct kv__tier_ops *ops, char *err, size_t errlen);
/* The open tier of that name; NULL when the pipeline has none. */
const struct kv__tier *kv__store_tier(kv_engine *e, const char *name);
/* How many tiers below DRAM are open. */
unsigned kv__store_depth(kv_engine *e);
/* True when this node stores nothing at all (a pure cluster client). */
bool kv__store_empty(kv_engine *e);
/* The tiers' part of the "engine open" log line. */
void kv__store_describe(kv_engine *e, char *buf, size_t len);
/* Adds every tier's figures to out (kv_stats_get). */
void kv__store_stats(kv_engine *e, kv_stats *out);

/* kv__local_dump for n (at most 64) shards; results[i] each. */
int  kv__store_dump_many(kv_engine *e, int ns, const kv_shard *shards, size_t n, int *results);
/* Prefetch: copies the shards of a block the tiers below hold and DRAM
 * lacks into DRAM (best effort). False when there is nothing to stage
 * from (no DRAM, or no tier below it). */
bool kv__store_stages(kv_engine *e);
void kv__store_stage(kv_engine *e, int ns, const kv_block_id *id);

/* A put that replaces (plain keys): every older copy of (ns, id, 0) is
 * dropped from every tier first; one that cannot be dropped fails the put
 * with that tier's error (it would come back after a restart, older than
 * a value acknowledged). */
int  kv__store_put(kv_engine *e, int ns, const kv_block_id *id, const kv_iov *iov,
                   uint32_t iovcnt);
/* The tiers below DRAM alone, in order: the first that holds the shard. */
bool kv__store_below_contains(kv_engine *e, int ns, const kv_block_id *id, uint32_t index);
int  kv__store_below_size(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                          uint64_t *len);
int  kv__store_below_read(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                          const kv_iov *iov, uint32_t iovcnt);

/* engine.c: a batch of plain-key puts (put) or loads across the cluster,
 * on the task pool, waited for; results[i] per item. */
int  kv__run_items(kv_engine *e, bool put, const kv_shard *shards, size_t n, int *results);

#endif
