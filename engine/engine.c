/*
 * engine.c — kv_open / kv_close, the block calls (lookup, dump, load,
 * prefetch) and their tasks, stats, and the routing of each to the cluster
 * or to this node's store.
 *
 * Key design choice: this file is the top only. Where a call goes is
 * decided here (a cluster, when enabled, routes each shard to its owners,
 * which end up in the same local calls on their own node); what happens to
 * a shard on a node, among DRAM and the tiers below it, is decided in one
 * place, engine/store.c (kv__local_*). An engine attached to another
 * process's store (engine/host.c) sends every call there instead, through
 * kv__host_enter; the process serving it ends up in these same calls.
 */
#include <stdio.h>
#include <stdlib.h>

#include "host.h"
#include "net/cluster.h"
#include "metrics.h"
#include "net/shm.h"
#include "segment.h"
#include "store.h"
#include "net/transport.h"

enum { TASK_DUMP = 1, TASK_LOAD, TASK_PREFETCH, TASK_PUT };

const struct kv_config *kv__engine_config(kv_engine *e)
{
    return &e->cfg;
}

/* ---- tasks -------------------------------------------------------------- */

/* Runs shards [begin, end) of a task, 64 at a time: on their owners in a
 * cluster, else in this node's store; a whole task's (submit) all at once
 * when it goes to the host store's server, which takes requests of up to
 * 4096 shards (net/shm.c). */
static void run_chunk(void *ctx, struct kv__task *t, size_t begin, size_t end)
{
    kv_engine *e = ctx;
    if (t->kind == TASK_PREFETCH) {
        for (size_t i = begin; i < end; i++)
            kv__store_stage(e, t->ns, &t->ids[i]);
        return;
    }
    int stack[64], *results = NULL;
    size_t cap = KV__ARRAY_LEN(stack);
    if (t->whole && end - begin > cap && (results = malloc((end - begin) * sizeof *results)))
        cap = end - begin;
    else
        results = stack;
    for (size_t i = begin; i < end;) {
        struct kv__shm_client *hc = NULL;
        int rc = t->kind == TASK_PUT ? KV_OK : kv__host_enter(e, &hc);
        size_t max = hc ? cap : KV__ARRAY_LEN(stack);
        size_t n = end - i < max ? end - i : max;
        const kv_shard *sh = &t->shards[i];
        if (rc == KV_OK && hc) {
            rc = t->kind == TASK_DUMP ? kv__shm_dump(hc, sh, n, results)
                                      : kv__shm_load(hc, sh, n, results);
            kv__host_leave(e);
        } else if (rc == KV_OK && e->cluster)
            rc = t->kind == TASK_DUMP  ? kv__cluster_dump(e->cluster, t->ns, sh, n, results)
                 : t->kind == TASK_PUT ? kv__cluster_put(e->cluster, t->ns, sh, n, results)
                                       : kv__cluster_load(e->cluster, t->ns, sh, n, results);
        else if (rc == KV_OK)
            rc = kv__engine_run_shards(e, t->kind == TASK_DUMP, sh, n, results);
        for (size_t k = 0; k < n; k++) {
            int r = rc != KV_OK ? rc : results[k];
            if (t->results)
                t->results[i + k] = r;
            if (r == KV_ENOTFOUND)
                atomic_fetch_add(&t->misses, 1);
            if (r != KV_OK)
                kv__task_fail(t, r);
        }
        i += n;
    }
    if (results != stack)
        free(results);
}

int kv__engine_run_shards(kv_engine *e, bool dump, const kv_shard *sh, size_t n, int *results)
{
    if (e->cluster)
        return dump ? kv__cluster_dump(e->cluster, KV_NS_BLOCK, sh, n, results)
                    : kv__cluster_load(e->cluster, KV_NS_BLOCK, sh, n, results);
    if (dump)
        return kv__store_dump_many(e, KV_NS_BLOCK, sh, n, results);
    for (size_t k = 0; k < n; k++)
        results[k] = kv__local_load(e, KV_NS_BLOCK, &sh[k].block, sh[k].index, sh[k].iov,
                                    sh[k].iovcnt);
    return KV_OK;
}

static void finish_task(void *ctx, struct kv__task *t)
{
    kv_engine *e = ctx;
    if (t->results)
        return;   /* a batch of plain keys (kv__run_items), not a task of the caller's */
    int rc = atomic_load(&t->result);
    double wait_ms = (double)(t->start_ns > t->submit_ns ? t->start_ns - t->submit_ns : 0) / 1e6;
    double cost_ms = (double)(t->done_ns - t->submit_ns) / 1e6;
    if (t->kind != TASK_PREFETCH)
        kv__metrics_task(e->metrics, t->kind == TASK_DUMP ? KV__OP_DUMP : KV__OP_LOAD,
                         t->done_ns - t->submit_ns, rc == KV_OK);
    if (t->kind == TASK_DUMP) {
        atomic_fetch_add(rc == KV_OK ? &e->ct.dumps_ok : &e->ct.dumps_failed, 1);
        KV_DEBUG("task(%llu) dump done, shards=%zu, wait=%.3fms, cost=%.3fms%s%s",
                 (unsigned long long)t->id, t->n, wait_ms, cost_ms,
                 rc ? ", error=" : "", rc ? kv_err_name(rc) : "");
    } else if (t->kind == TASK_LOAD) {
        atomic_fetch_add(rc == KV_OK ? &e->ct.loads_ok : &e->ct.loads_failed, 1);
        KV_DEBUG("task(%llu) load shards(%zu, miss=%u), wait=%.3fms, cost=%.3fms%s%s",
                 (unsigned long long)t->id, t->n, atomic_load(&t->misses), wait_ms, cost_ms,
                 rc ? ", error=" : "", rc ? kv_err_name(rc) : "");
    } else {
        KV_DEBUG("task(%llu) prefetch blocks(%zu), cost=%.3fms", (unsigned long long)t->id,
                 t->n, cost_ms);
    }
}

static int check_shards(const kv_shard *shards, size_t n)
{
    if (!shards || n == 0)
        return KV_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (shards[i].iovcnt > 0 && !shards[i].iov)
            return KV_EINVAL;
        for (uint32_t k = 0; k < shards[i].iovcnt; k++)
            if (!shards[i].iov[k].base && shards[i].iov[k].len > 0)
                return KV_EINVAL;
        if (kv__iov_len(shards[i].iov, shards[i].iovcnt) > KV_VALUE_MAX)
            return KV_EINVAL;
    }
    return KV_OK;
}

/*
 * Runs a batch of shards on the task pool, so that several workers and the
 * caller copy it, and waits; results[i] gets each item's outcome. Items a
 * timeout kept from running say KV_ETIMEDOUT.
 *
 * A batch under KV__CHUNK_BYTES would be one chunk, which one thread runs
 * whole, so it runs here on the caller's thread instead: queued, a worker
 * woken by the submit (or the standby, whose 200 us naps the queue keeps
 * alive) often claimed it before the caller's wait did, and the caller
 * slept until that worker was done. Mooncake's benchmark's batch_get_into
 * of 4 x 64 KiB in a cluster was about one context switch per call so.
 */
static int run_spread(kv_engine *e, int kind, int ns, const kv_shard *shards, size_t n,
                      int *results)
{
    if (atomic_load(&e->closing))
        return KV_ECLOSED;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += kv__iov_len(shards[i].iov, shards[i].iovcnt);
    if (bytes < KV__CHUNK_BYTES) {
        struct kv__task one = { .kind = kind, .ns = ns, .n = n, .shards = (kv_shard *)shards,
                                .results = results };
        run_chunk(e, &one, 0, n);
        return KV_OK;
    }
    struct kv__task *t;
    int rc = kv__task_new(&t, kind, ns, shards, NULL, n);
    if (rc != KV_OK)
        return rc;
    for (size_t i = 0; i < n; i++)
        results[i] = KV_ETIMEDOUT;
    t->results = results;
    kv_task h;
    if ((rc = kv__pool_submit(e->pool, t, &h)) != KV_OK)
        return rc;
    rc = kv__pool_wait(e->pool, h, 0);
    return rc == KV_ECLOSED ? rc : KV_OK;
}

/* kv_put_many and kv_get_many across the cluster: each owner is driven by
 * several workers and the caller, as a dump is. */
int kv__run_items(kv_engine *e, bool put, const kv_shard *shards, size_t n, int *results)
{
    if (!e->cluster)
        return KV_EINVAL;
    return run_spread(e, put ? TASK_PUT : TASK_LOAD, KV_NS_KEY, shards, n, results);
}

/* An attached engine's dump, served: the client sent it whole (submit), so
 * it is spread over this engine's workers here, as kv_dump in process
 * would be. */
int kv__engine_dump_served(kv_engine *e, const kv_shard *sh, size_t n, int *results)
{
    return run_spread(e, TASK_DUMP, KV_NS_BLOCK, sh, n, results);
}

static int submit(kv_engine *e, int kind, const kv_shard *shards, size_t n, kv_task *task)
{
    if (!e || !task)
        return KV_EINVAL;
    *task = 0;
    int rc = check_shards(shards, n);
    if (rc != KV_OK)
        return rc;
    if (atomic_load(&e->closing))
        return KV_ECLOSED;
    struct kv__task *t;
    rc = kv__task_new(&t, kind, KV_NS_BLOCK, shards, NULL, n);
    if (rc != KV_OK)
        return rc;
    /* An attached dump from shared buffers is one chunk, one request: the
     * server spreads its copies over its workers (kv__engine_dump_served).
     * Cut here, each chunk was a round trip and two wakeups, a quarter of
     * the server's CPU for a 2 MiB chunk. A dump from the caller's own
     * memory is still cut, so that its workers stage one chunk while the
     * server copies another. */
    t->whole = kind == TASK_DUMP && kv__host_attached(e) && kv__shm_regions_hold(e->buffers, shards, n);
    return kv__pool_submit(e->pool, t, task);
}

KV__EXPORT int kv_dump(kv_engine *e, const kv_shard *shards, size_t n, kv_task *task)
{
    return submit(e, TASK_DUMP, shards, n, task);
}

KV__EXPORT int kv_load(kv_engine *e, const kv_shard *shards, size_t n, kv_task *task)
{
    return submit(e, TASK_LOAD, shards, n, task);
}

KV__EXPORT int kv_check(kv_engine *e, kv_task task, int *done)
{
    if (!e || !done)
        return KV_EINVAL;
    *done = 0;
    return task == 0 ? KV_ENOTFOUND : kv__pool_check(e->pool, task, done);
}

KV__EXPORT int kv_wait(kv_engine *e, kv_task task, unsigned timeout_ms)
{
    if (!e)
        return KV_EINVAL;
    return task == 0 ? KV_ENOTFOUND : kv__pool_wait(e->pool, task, timeout_ms);
}

KV__EXPORT int kv_prefetch(kv_engine *e, const kv_block_id *ids, size_t n)
{
    if (!e || (!ids && n > 0))
        return KV_EINVAL;
    struct kv__shm_client *hc;
    int rc = n ? kv__host_enter(e, &hc) : KV_OK;
    if (rc != KV_OK || (n && hc)) {
        if (rc == KV_OK) {
            rc = kv__shm_prefetch(hc, ids, n);
            kv__host_leave(e);
        }
        return rc;
    }
    if (n == 0 || e->cluster || !kv__store_stages(e))
        return KV_OK;                          /* nothing to stage */
    if (atomic_load(&e->closing))
        return KV_ECLOSED;
    struct kv__task *t;
    rc = kv__task_new(&t, TASK_PREFETCH, KV_NS_BLOCK, NULL, ids, n);
    if (rc != KV_OK)
        return rc;
    /* Nobody waits for a hint: the pool frees it at close if not before. */
    kv_task h;
    return kv__pool_submit(e->pool, t, &h);
}

/* ---- lookup --------------------------------------------------------------- */

KV__EXPORT int kv_lookup(kv_engine *e, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    if (!e || (n > 0 && (!ids || !hit)))
        return KV_EINVAL;
    struct kv__shm_client *hc;
    int rc = n ? kv__host_enter(e, &hc) : KV_OK;
    if (rc != KV_OK || (n && hc)) {
        if (rc == KV_OK) {
            rc = kv__shm_lookup(hc, ids, n, hit);
            kv__host_leave(e);
        }
        return rc;
    }
    if (e->cluster)
        return kv__cluster_lookup(e->cluster, KV_NS_BLOCK, ids, n, hit);
    return kv__local_lookup(e, KV_NS_BLOCK, ids, n, hit);
}

static ssize_t lookup_prefix(kv_engine *e, const kv_block_id *ids, size_t n);

/* The prefix figures are counted here, per call and by the caller's engine
 * (a cluster's owners and an attached store's server see only lookups). */
KV__EXPORT ssize_t kv_lookup_prefix(kv_engine *e, const kv_block_id *ids, size_t n)
{
    if (!e || (n > 0 && !ids))
        return KV_EINVAL;
    ssize_t last = lookup_prefix(e, ids, n);
    if (last >= -1 && n)
        kv__metrics_prefix(&e->lk, n, (uint64_t)(last + 1));
    return last;
}

static ssize_t lookup_prefix(kv_engine *e, const kv_block_id *ids, size_t n)
{
    /* Locally one id at a time: the run stops at the first miss, and ids
     * past it are neither looked at nor leased. In a cluster every call is
     * a round trip, so ids go in chunks that double (1, 2, 4 ... 64): a
     * long run costs a few round trips, and at most a chunk's worth of ids
     * past the first miss are looked at. */
    uint8_t hit[64];
    size_t chunk = 1;
    for (size_t i = 0; i < n;) {
        size_t m = n - i < chunk ? n - i : chunk;
        struct kv__shm_client *hc;
        int rc = kv__host_enter(e, &hc);
        if (rc == KV_OK && hc) {   /* attached: a round trip, like a cluster's */
            rc = kv__shm_lookup(hc, &ids[i], m, hit);
            kv__host_leave(e);
        } else if (rc == KV_OK) {
            rc = e->cluster ? kv__cluster_lookup(e->cluster, KV_NS_BLOCK, &ids[i], m, hit)
                            : kv__local_lookup(e, KV_NS_BLOCK, &ids[i], m, hit);
        }
        if (rc != KV_OK)
            return rc;
        for (size_t k = 0; k < m; k++)
            if (!hit[k])
                return (ssize_t)(i + k) - 1;
        i += m;
        if ((e->cluster || hc) && chunk < KV__ARRAY_LEN(hit))
            chunk *= 2;
    }
    return (ssize_t)n - 1;
}

/* ---- zero-copy registration ------------------------------------------- */

KV__EXPORT int kv_register_buffer(kv_engine *e, void *addr, size_t len)
{
    if (!e || !addr || len == 0)
        return KV_EINVAL;
    return e->cluster ? kv__cluster_register_buffer(e->cluster, addr, len) : KV_OK;
}

KV__EXPORT int kv_unregister_buffer(kv_engine *e, void *addr)
{
    if (!e || !addr)
        return KV_EINVAL;
    return e->cluster ? kv__cluster_unregister_buffer(e->cluster, addr) : KV_OK;
}

/* ---- stats ------------------------------------------------------------------ */

KV__EXPORT int kv_stats_get(kv_engine *e, kv_stats *out)
{
    if (!e || !out)
        return KV_EINVAL;
    memset(out, 0, sizeof *out);
    struct kv__shm_client *hc;
    int rc = kv__host_enter(e, &hc);
    if (rc != KV_OK || hc) {   /* the store's figures are its server's */
        if (rc == KV_OK) {
            rc = kv__shm_stats(hc, out);
            kv__host_leave(e);
        }
        out->host_attached = 1;
        /* the store's lookups are its server's; the prefix calls are ours */
        kv_stats mine;
        kv__metrics_lookup_sum(&e->lk, &mine);
        out->prefix_ids = mine.prefix_ids;
        out->prefix_hits = mine.prefix_hits;
        return rc;
    }
    kv__store_stats(e, out);
    kv__metrics_lookup_sum(&e->lk, out);
    out->hits_dram = atomic_load(&e->ct.hits_dram);
    out->hits_ssd = atomic_load(&e->ct.hits_ssd);
    out->misses = atomic_load(&e->ct.misses);
    out->promotions = atomic_load(&e->ct.promotions);
    out->dumps_ok = atomic_load(&e->ct.dumps_ok);
    out->dumps_failed = atomic_load(&e->ct.dumps_failed);
    out->loads_ok = atomic_load(&e->ct.loads_ok);
    out->loads_failed = atomic_load(&e->ct.loads_failed);
    out->tasks_inflight = kv__pool_inflight(e->pool);
    out->open_ns = e->open_ns;
    if (e->cluster)
        kv__cluster_stats(e->cluster, out);
    kv__host_stats(e, out);
    return KV_OK;
}

/* ---- shared buffers ----------------------------------------------------------- */

KV__EXPORT int kv_buffer_alloc(kv_engine *e, size_t len, void **out)
{
    if (out)
        *out = NULL;
    if (!e || !out || len == 0 || len > KV_VALUE_MAX)
        return KV_EINVAL;
    struct kv__shm_client *hc;
    int rc = kv__host_enter(e, &hc);
    if (rc != KV_OK)
        return rc;
    /* Attached: a memfd the server maps too (loads land in it, dumps are
     * copied from it, by the server). Else plain page-aligned memory. */
    rc = kv__shm_region_alloc(e->buffers, len, hc != NULL, out);
    if (hc)
        kv__host_leave(e);
    if (rc == KV_OK && !hc && e->cluster && (rc = kv_register_buffer(e, *out, len)) != KV_OK) {
        kv__shm_region_free(e->buffers, *out);
        *out = NULL;
    }
    return rc;
}

KV__EXPORT int kv_buffer_free(kv_engine *e, void *addr)
{
    if (!e || !addr)
        return KV_EINVAL;
    if (e->cluster)
        kv_unregister_buffer(e, addr);
    return kv__shm_region_free(e->buffers, addr);
}

/* ---- open and close --------------------------------------------------- */

/* Tears down whatever kv_open built. The order matters: the metrics
 * server first (its scrapes read everything), then the tasks (they use the
 * cluster and the tiers, and record into the metrics' histograms), then
 * the cluster (peers' requests use the local tiers), then the tiers. */
static void teardown(kv_engine *e)
{
    kv__metrics_stop(e->metrics);
    kv__host_stop(e);   /* attached processes first: they fail fast and take over */
    kv__pool_stop(e->pool);
    kv__metrics_close(e->metrics);
    kv__cluster_stop(e->cluster);
    kv__store_close(e);
    kv__host_close(e);  /* the lock last: the tiers (the SSD's own lock) are closed */
    kv__shm_regions_free(e->buffers);
    free(e);
}

/* The tiers and the cluster, for kv_open and for a takeover (host.c);
 * undone again on failure. The segment of a shared store is a memfd. */
int kv__engine_open_local(kv_engine *e, char *err, size_t errlen)
{
    const struct kv_config *cfg = &e->cfg;
    /* The flag rides on the hugepages setting for the one call that maps
     * the segment (segment.h), and comes off at once. */
    int huge = e->cfg.dram.hugepages;
    if (e->host)
        e->cfg.dram.hugepages |= KV__SEG_MEMFD;
    int rc = kv__store_open(e, err, errlen);
    e->cfg.dram.hugepages = huge;
    if (rc == KV_OK && cfg->cluster.enabled) {
        struct kv__backend be;
        kv__backend_engine(e, &be);
        rc = kv__cluster_start(&be, cfg, &e->cluster, err, errlen);
    }
    if (rc != KV_OK)
        kv__engine_close_local(e);
    return rc;
}

void kv__engine_close_local(kv_engine *e)
{
    kv__cluster_stop(e->cluster);
    e->cluster = NULL;
    kv__store_close(e);   /* e->dram NULL, no tiers: the engine opens nothing again */
}

KV__EXPORT int kv_open(const kv_config *cfg, kv_engine **out)
{
    if (!out)
        return KV_EINVAL;
    *out = NULL;
    if (!cfg)
        return KV_EINVAL;
    char err[512] = "";
    int rc = kv__config_validate(cfg, err, sizeof err);
    if (rc != KV_OK) {
        KV_ERROR("kv_open: %s", err);
        return rc;
    }
    /* Aligned: the lookup counters' stripes are a cache line each. */
    kv_engine *e = aligned_alloc(_Alignof(kv_engine), sizeof *e);
    if (!e)
        return KV_ENOMEM;
    memset(e, 0, sizeof *e);
    uint64_t t0 = kv__now_ns();
    e->cfg = *cfg;
    e->epoch_ns = t0;
    kv__log_set_level(cfg->log.level);

    bool serve = false;
    if ((rc = kv__shm_regions_new(&e->buffers)) != KV_OK)
        goto fail;
    rc = kv__host_open(e, &serve, err, sizeof err);
    if (rc != KV_OK)
        goto fail;
    /* Attached (e->host && !serve): no tier, no cluster of our own; every
     * call goes to the store's server. */
    if ((!e->host || serve) && (rc = kv__engine_open_local(e, err, sizeof err)) != KV_OK)
        goto fail;
    rc = kv__pool_start(&e->pool, cfg->io.threads, cfg->io.timeout_ms,
                        (struct kv__pool_ops){ e, run_chunk, finish_task });
    if (rc != KV_OK) {
        snprintf(err, sizeof err, "cannot start %u io threads", cfg->io.threads);
        goto fail;
    }
    /* Before the host store's server starts: from then on its threads, and
     * scrapes, read the engine (kv_stats_get) from other threads. */
    e->open_ns = kv__now_ns() - t0;
    if (serve && (rc = kv__host_serve(e, err, sizeof err)) != KV_OK)
        goto fail;
    rc = kv__metrics_open(e, cfg, &e->metrics, err, sizeof err);
    if (rc != KV_OK)
        goto fail;
    char tiers[160];
    kv__store_describe(e, tiers, sizeof tiers);
    KV_INFO("engine open: pipeline=%s%s threads=%u%s in %.1f ms", kv__pipeline_name(cfg->pipeline),
            tiers, cfg->io.threads,
            !e->cluster ? "" : kv__store_empty(e) ? " cluster (pure client)" : " cluster",
            (double)e->open_ns / 1e6);
    *out = e;
    return KV_OK;
fail:
    KV_ERROR("kv_open: %s (%s)", err[0] ? err : kv_strerror(rc), kv_err_name(rc));
    teardown(e);
    return rc;
}

KV__EXPORT void kv_close(kv_engine *e)
{
    if (!e)
        return;
    atomic_store(&e->closing, true);
    teardown(e);
}

/* ---- iovec helpers ---------------------------------------------------- */
