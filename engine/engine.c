/*
 * engine.c — kv_open / kv_close, the block store (lookup, dump, load,
 * prefetch), the DRAM tier's primitives, stats, and the local-store calls
 * the network layer serves peers with.
 *
 * Key design choice: the copy path takes a table-shard lock only for index
 * work and copies with no lock held. A load pins the block (pins > 0: the
 * evictor skips it and a replacing put defers the free) for the length of
 * its copy; a dump copies into freshly allocated segment memory first and
 * links it in afterwards, so two dumps of one shard both succeed and the
 * first to link wins. Tiers are consulted in order DRAM, then SSD; a
 * cluster, when enabled, routes each shard to its owners, which end up in
 * the same local calls (kv__local_*) on their own node.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cluster.h"
#include "metrics.h"
#include "ssd.h"
#include "store.h"
#include "transport.h"

enum { TASK_DUMP = 1, TASK_LOAD, TASK_PREFETCH, TASK_PUT };

/* How long an allocation may wait for write-back to release memory. */
#define WRITEBACK_WAIT_NS (10ull * 1000000000u)

/* ---- DRAM primitives -------------------------------------------------- */

void kv__dram_free(kv_engine *e, void *p, uint64_t len)
{
    size_t sz = kv__alloc_size(e->alloc, len);
    kv__free(e->alloc, p, len);
    atomic_fetch_sub(&e->used, sz);
}

void kv__dram_free_blk(kv_engine *e, struct kv__blk *b)
{
    struct kv__sref *r = kv__blk_srefs(b);
    for (uint32_t i = 0; i < b->nshards; i++)
        kv__dram_free(e, kv__seg_ptr(e, r[i].off64), r[i].len);
    kv__blk_free(b);
}

int kv__dram_alloc(kv_engine *e, uint64_t len, void **out)
{
    *out = NULL;
    if (!e->has_dram)
        return KV_ENOSPC;
    size_t sz = kv__alloc_size(e->alloc, len);
    if (sz > e->seg.len)
        return KV_ENOSPC;
    /* Make room before the high watermark is crossed, not after. */
    if (atomic_load(&e->used) + sz > e->high_wm)
        kv__evict_maybe(e);
    /* Evicted blocks on their way to SSD still hold their memory until the
     * writer releases them: wait for that (bounded) rather than evict more
     * for the same bytes, but never wait for leases or pins — when nothing
     * is evictable and nothing is in flight, fail. */
    uint64_t deadline = kv__now_ns() + WRITEBACK_WAIT_NS;
    for (bool last = false;; ) {
        void *p = kv__alloc(e->alloc, len);
        if (p) {
            atomic_fetch_add(&e->used, sz);
            *out = p;
            return KV_OK;
        }
        if (last)
            break;
        uint64_t held = kv__in_flight(e), freed = 0;
        if (held < sz)
            freed = kv__evict(e, sz > e->evict_step ? sz : e->evict_step);
        if (e->sink.drain)
            held = e->sink.drain(e->sink.ctx, 50);
        /* Nothing more will come free (or we waited long enough): one more
         * try, since the drain may just have released what we need. */
        last = (freed == 0 && held == 0) || kv__now_ns() > deadline;
    }
    atomic_fetch_add(&e->ct.enospc, 1);
    return KV_ENOSPC;
}

int kv__dram_insert(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                    void *p, uint32_t len)
{
    uint64_t h = kv__id_hash(id);
    struct kv__tshard *ts = kv__table_shard(&e->tab[ns], h);
    pthread_mutex_lock(&ts->lock);
    struct kv__blk *b = kv__blk_find(ts, h, id);
    int rc;
    if (b && kv__blk_sref(b, index)) {
        rc = 1;                                /* another copy got there first */
    } else {
        rc = kv__blk_add(ts, h, id, index, kv__seg_off64(e, p), len, kv__engine_now(e), NULL);
    }
    pthread_mutex_unlock(&ts->lock);
    if (rc != KV_OK)
        kv__dram_free(e, p, len);
    return rc == 1 ? KV_OK : rc;
}

/* Presence in DRAM, without touching the block (no lease, no recency). */
static bool dram_has(kv_engine *e, int ns, const kv_block_id *id, uint32_t index)
{
    if (!e->has_dram)
        return false;
    uint64_t h = kv__id_hash(id);
    struct kv__tshard *ts = kv__table_shard(&e->tab[ns], h);
    pthread_mutex_lock(&ts->lock);
    struct kv__blk *b = kv__blk_find(ts, h, id);
    bool hit = b && kv__blk_sref(b, index);
    pthread_mutex_unlock(&ts->lock);
    return hit;
}

/* Copies a DRAM-resident shard out. KV_ENOTFOUND when absent, KV_EINVAL when
 * the iovecs do not add up to its length. */
static int dram_copy_out(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                         const kv_iov *iov, uint32_t iovcnt)
{
    kv__pin pin;
    const void *data;
    uint64_t len;
    int rc = kv__local_pin(e, ns, id, index, &data, &len, &pin);
    if (rc != KV_OK)
        return rc;
    if (len != kv__iov_len(iov, iovcnt))
        rc = KV_EINVAL;
    else
        kv__iov_scatter(iov, iovcnt, data);
    kv__local_unpin(e, &pin);
    return rc;
}

/* ---- local store (this node's tiers) ---------------------------------- */

int kv__local_pin(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                  const void **data, uint64_t *len, kv__pin *pin)
{
    if (!e->has_dram)
        return KV_ENOTFOUND;
    uint64_t h = kv__id_hash(id);
    struct kv__tshard *ts = kv__table_shard(&e->tab[ns], h);
    pthread_mutex_lock(&ts->lock);
    struct kv__blk *b = kv__blk_find(ts, h, id);
    struct kv__sref *r = b ? kv__blk_sref(b, index) : NULL;
    if (!r || (b->pins & ~KV_BLK_DEAD) == (KV_BLK_DEAD - 1)) {
        pthread_mutex_unlock(&ts->lock);
        return KV_ENOTFOUND;
    }
    b->pins++;
    kv__blk_touch(b, kv__engine_now(e));
    *data = kv__seg_ptr(e, r->off64);
    *len = r->len;
    pthread_mutex_unlock(&ts->lock);
    *pin = (kv__pin){ b, (uint32_t)(ts - e->tab[ns].sh), ns };
    return KV_OK;
}

void kv__local_unpin(kv_engine *e, kv__pin *pin)
{
    struct kv__tshard *ts = &e->tab[pin->ns].sh[pin->tshard];
    struct kv__blk *b = pin->blk;
    pthread_mutex_lock(&ts->lock);
    b->pins--;
    bool free_it = b->pins == KV_BLK_DEAD;    /* unlinked while we read */
    pthread_mutex_unlock(&ts->lock);
    if (free_it)
        kv__dram_free_blk(e, b);
    pin->blk = NULL;
}

int kv__local_size(kv_engine *e, int ns, const kv_block_id *id, uint32_t index, uint64_t *len)
{
    if (e->has_dram) {
        uint64_t h = kv__id_hash(id);
        struct kv__tshard *ts = kv__table_shard(&e->tab[ns], h);
        pthread_mutex_lock(&ts->lock);
        struct kv__blk *b = kv__blk_find(ts, h, id);
        struct kv__sref *r = b ? kv__blk_sref(b, index) : NULL;
        if (r)
            *len = r->len;
        pthread_mutex_unlock(&ts->lock);
        if (r)
            return KV_OK;
    }
    if (e->ssd)
        return kv__ssd_size(e->ssd, ns, id, index, len);
    return KV_ENOTFOUND;
}

struct ssd_walk {
    kv_engine *e;
    int ns;
    kv__scan_cb cb;
    void *arg;
};

static int ssd_visit(void *ctx, const kv_ssd_entry *ent)
{
    struct ssd_walk *w = ctx;
    int ns = ent->ns == KV_SSD_NS_KEY ? KV_NS_KEY : KV_NS_BLOCK;
    if (ns != w->ns || dram_has(w->e, ns, &ent->id, ent->index))
        return 0;   /* another namespace, or visited with DRAM's copies */
    return w->cb(w->arg, &ent->id, ent->index, ent->size, 0);   /* last use unknown: oldest */
}

/* DRAM's shards, then those only the SSD tier holds (from its in-memory
 * index: no I/O). */
int kv__local_scan(kv_engine *e, int ns, kv__scan_cb cb, void *arg)
{
    int stop = 0;
    if (e->has_dram) {
        struct kv__table *t = &e->tab[ns];
        for (uint32_t s = 0; s < t->n && !stop; s++) {
            struct kv__tshard *ts = &t->sh[s];
            pthread_mutex_lock(&ts->lock);
            for (uint32_t k = 0; k <= ts->mask && !stop; k++)
                for (struct kv__blk *b = ts->buckets[k]; b && !stop; b = b->hnext) {
                    struct kv__sref *r = kv__blk_srefs(b);
                    for (uint32_t i = 0; i < b->nshards && !stop; i++)
                        stop = cb(arg, &b->id, r[i].index, r[i].len, b->stamp);
                }
            pthread_mutex_unlock(&ts->lock);
        }
    }
    if (stop || !e->ssd)
        return KV_OK;
    struct ssd_walk w = { e, ns, cb, arg };
    int rc = kv__ssd_scan(e->ssd, ssd_visit, &w);
    return rc == KV_ENOTSUP ? KV_OK : rc;
}

/*
 * Lookup is the hot path of prefix matching (thousands of ids per request),
 * so it is written for memory-level parallelism: the bucket of the id
 * PREFETCH_AHEAD places ahead is fetched while this one is examined, and the
 * lease is granted by moving the block's stamp into the future: one store
 * into the entry the lookup already has in cache.
 */
#define PREFETCH_AHEAD 8

int kv__local_lookup(kv_engine *e, int ns, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    uint64_t hs[64];
    uint64_t lease_end = e->has_dram ? kv__engine_now(e) + e->lease_ns : 0;
    for (size_t base = 0; base < n; base += KV__ARRAY_LEN(hs)) {
        size_t m = n - base < KV__ARRAY_LEN(hs) ? n - base : KV__ARRAY_LEN(hs);
        if (e->has_dram) {
            struct kv__table *t = &e->tab[ns];
            for (size_t i = 0; i < m; i++) {
                hs[i] = kv__id_hash(&ids[base + i]);
                if (i < PREFETCH_AHEAD)
                    kv__bucket_prefetch(kv__table_shard(t, hs[i]), hs[i]);
            }
            for (size_t i = 0; i < m; i++) {
                if (i + PREFETCH_AHEAD < m)
                    kv__bucket_prefetch(kv__table_shard(t, hs[i + PREFETCH_AHEAD]),
                                        hs[i + PREFETCH_AHEAD]);
                struct kv__tshard *ts = kv__table_shard(t, hs[i]);
                pthread_mutex_lock(&ts->lock);
                struct kv__blk *b = kv__blk_find(ts, hs[i], &ids[base + i]);
                bool h = b && kv__blk_sref(b, 0);
                if (h)
                    kv__blk_touch(b, lease_end);
                pthread_mutex_unlock(&ts->lock);
                hit[base + i] = h;
            }
        } else {
            memset(hit + base, 0, m);
        }
        for (size_t i = 0; e->ssd && i < m; i++)
            if (!hit[base + i])
                hit[base + i] = kv__ssd_contains(e->ssd, ns, &ids[base + i], 0);
    }
    return KV_OK;
}

static bool present(kv_engine *e, int ns, const kv_block_id *id, uint32_t index)
{
    return dram_has(e, ns, id, index) ||
           (e->ssd && kv__ssd_contains(e->ssd, ns, id, index));
}

int kv__local_dump(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                   const kv_iov *iov, uint32_t iovcnt)
{
    uint64_t len = kv__iov_len(iov, iovcnt);
    if (len > KV_VALUE_MAX)
        return KV_EINVAL;
    if (present(e, ns, id, index))
        return KV_OK;                          /* no rewrite */
    if (!e->has_dram)
        return e->ssd ? kv__ssd_write(e->ssd, ns, id, index, iov, iovcnt) : KV_ENOSPC;
    void *p;
    int rc = kv__dram_alloc(e, len, &p);
    if (rc != KV_OK)
        return rc;
    kv__iov_gather(p, iov, iovcnt);
    rc = kv__dram_insert(e, ns, id, index, p, (uint32_t)len);
    if (rc == KV_OK && e->ssd && e->cfg.ssd.write_through)
        rc = kv__ssd_write(e->ssd, ns, id, index, iov, iovcnt);
    return rc;
}

/* Copies a shard read from SSD into DRAM (ssd.promote). Best effort: a
 * promotion that finds no room is simply skipped. */
static void promote(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                    const kv_iov *iov, uint32_t iovcnt)
{
    uint64_t len = kv__iov_len(iov, iovcnt);
    void *p;
    if (kv__dram_alloc(e, len, &p) != KV_OK)
        return;
    kv__iov_gather(p, iov, iovcnt);
    if (kv__dram_insert(e, ns, id, index, p, (uint32_t)len) == KV_OK)
        atomic_fetch_add(&e->ct.promotions, 1);
}

int kv__local_load(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                   const kv_iov *iov, uint32_t iovcnt)
{
    int rc = dram_copy_out(e, ns, id, index, iov, iovcnt);
    if (rc == KV_OK) {
        atomic_fetch_add(&e->ct.hits_dram, 1);
        return KV_OK;
    }
    if (rc == KV_ENOTFOUND && e->ssd) {
        rc = kv__ssd_read(e->ssd, ns, id, index, iov, iovcnt);
        if (rc == KV_OK) {
            atomic_fetch_add(&e->ct.hits_ssd, 1);
            if (e->has_dram && e->cfg.ssd.promote)
                promote(e, ns, id, index, iov, iovcnt);
            return KV_OK;
        }
    }
    if (rc == KV_ENOTFOUND)
        atomic_fetch_add(&e->ct.misses, 1);
    return rc;
}

int kv__local_reserve(kv_engine *e, uint64_t len, kv__resv *r)
{
    r->data = NULL;
    r->len = 0;
    if (len > KV_VALUE_MAX)
        return KV_EINVAL;
    int rc = kv__dram_alloc(e, len, &r->data);
    if (rc == KV_OK) {
        r->len = len;
        atomic_fetch_add(&e->reserved, kv__alloc_size(e->alloc, len));
    }
    return rc;
}

int kv__local_commit(kv_engine *e, kv__resv *r, int ns, const kv_block_id *id, uint32_t index)
{
    atomic_fetch_sub(&e->reserved, kv__alloc_size(e->alloc, r->len));
    int rc = kv__dram_insert(e, ns, id, index, r->data, (uint32_t)r->len);
    if (rc == KV_OK && e->ssd && e->cfg.ssd.write_through) {
        kv_iov iov = { r->data, r->len };
        rc = kv__ssd_write(e->ssd, ns, id, index, &iov, 1);
    }
    r->data = NULL;
    return rc;
}

void kv__local_abort(kv_engine *e, kv__resv *r)
{
    if (!r->data)
        return;
    atomic_fetch_sub(&e->reserved, kv__alloc_size(e->alloc, r->len));
    kv__dram_free(e, r->data, r->len);
    r->data = NULL;
}

void kv__engine_segment(kv_engine *e, void **base, size_t *len)
{
    *base = e->has_dram ? e->seg.base : NULL;
    *len = e->has_dram ? e->seg.len : 0;
}

const struct kv_config *kv__engine_config(kv_engine *e)
{
    return &e->cfg;
}

/* ---- tasks -------------------------------------------------------------- */

/* Prefetch: copies every SSD-resident shard of a block that DRAM lacks into
 * DRAM. Best effort, like promotion: a shard that finds no room is left on
 * SSD. */
static void stage_block(kv_engine *e, int ns, const kv_block_id *id)
{
    uint32_t idx[256];
    size_t n = kv__ssd_block_shards(e->ssd, ns, id, idx, KV__ARRAY_LEN(idx));
    for (size_t k = 0; k < n && k < KV__ARRAY_LEN(idx); k++) {
        uint64_t len;
        void *p;
        if (dram_has(e, ns, id, idx[k]) || kv__ssd_size(e->ssd, ns, id, idx[k], &len) != KV_OK ||
            kv__dram_alloc(e, len, &p) != KV_OK)
            continue;
        kv_iov iov = { p, len };
        if (kv__ssd_read(e->ssd, ns, id, idx[k], &iov, 1) != KV_OK)
            kv__dram_free(e, p, len);
        else if (kv__dram_insert(e, ns, id, idx[k], p, (uint32_t)len) == KV_OK)
            atomic_fetch_add(&e->ct.promotions, 1);   /* insert frees p otherwise */
    }
}

static void run_chunk(void *ctx, struct kv__task *t, size_t begin, size_t end)
{
    kv_engine *e = ctx;
    if (t->kind == TASK_PREFETCH) {
        for (size_t i = begin; i < end; i++)
            stage_block(e, t->ns, &t->ids[i]);
        return;
    }
    if (e->cluster) {
        int results[64];
        for (size_t i = begin; i < end; i += KV__ARRAY_LEN(results)) {
            size_t n = end - i < KV__ARRAY_LEN(results) ? end - i : KV__ARRAY_LEN(results);
            int rc = t->kind == TASK_DUMP  ? kv__cluster_dump(e->cluster, t->ns, &t->shards[i], n, results)
                     : t->kind == TASK_PUT ? kv__cluster_put(e->cluster, t->ns, &t->shards[i], n, results)
                                           : kv__cluster_load(e->cluster, t->ns, &t->shards[i], n, results);
            for (size_t k = 0; k < n; k++) {
                int r = rc != KV_OK ? rc : results[k];
                if (t->results)
                    t->results[i + k] = r;
                if (r == KV_ENOTFOUND)
                    atomic_fetch_add(&t->misses, 1);
                if (r != KV_OK)
                    kv__task_fail(t, r);
            }
        }
        return;
    }
    if (t->kind == TASK_DUMP && !e->has_dram && e->ssd) {
        /* SSD only: the chunk is written as WriteBatches of up to 64
         * shards (one WAL record, one sync each) rather than one by one. */
        int results[64];
        for (size_t i = begin; i < end; i += KV__ARRAY_LEN(results)) {
            size_t n = end - i < KV__ARRAY_LEN(results) ? end - i : KV__ARRAY_LEN(results);
            int rc = kv__ssd_write_many(e->ssd, t->ns, &t->shards[i], n, results);
            for (size_t k = 0; k < n; k++)
                if ((rc != KV_OK ? rc : results[k]) != KV_OK)
                    kv__task_fail(t, rc != KV_OK ? rc : results[k]);
        }
        return;
    }
    for (size_t i = begin; i < end; i++) {
        const kv_shard *s = &t->shards[i];
        int rc = t->kind == TASK_DUMP
                     ? kv__local_dump(e, t->ns, &s->block, s->index, s->iov, s->iovcnt)
                     : kv__local_load(e, t->ns, &s->block, s->index, s->iov, s->iovcnt);
        if (rc == KV_ENOTFOUND)
            atomic_fetch_add(&t->misses, 1);
        if (rc != KV_OK)
            kv__task_fail(t, rc);
    }
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
 * Runs a batch of plain-key shards across the cluster on the task pool (so
 * that its owners are driven by several workers and the caller, as a dump
 * is), and waits; results[i] gets each item's outcome. For kv_put_many and
 * kv_get_many. Items a timeout kept from running say KV_ETIMEDOUT.
 */
int kv__run_items(kv_engine *e, bool put, const kv_shard *shards, size_t n, int *results)
{
    if (!e->cluster)
        return KV_EINVAL;
    if (atomic_load(&e->closing))
        return KV_ECLOSED;
    struct kv__task *t;
    int rc = kv__task_new(&t, put ? TASK_PUT : TASK_LOAD, KV_NS_KEY, shards, NULL, n);
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
    if (n == 0 || !e->ssd || !e->has_dram || e->cluster)
        return KV_OK;                          /* nothing to stage */
    if (atomic_load(&e->closing))
        return KV_ECLOSED;
    struct kv__task *t;
    int rc = kv__task_new(&t, TASK_PREFETCH, KV_NS_BLOCK, NULL, ids, n);
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
    if (e->cluster)
        return kv__cluster_lookup(e->cluster, KV_NS_BLOCK, ids, n, hit);
    return kv__local_lookup(e, KV_NS_BLOCK, ids, n, hit);
}

KV__EXPORT ssize_t kv_lookup_prefix(kv_engine *e, const kv_block_id *ids, size_t n)
{
    if (!e || (n > 0 && !ids))
        return KV_EINVAL;
    /* Locally one id at a time: the run stops at the first miss, and ids
     * past it are neither looked at nor leased. In a cluster every call is
     * a round trip, so ids go in chunks that double (1, 2, 4 ... 64): a
     * long run costs a few round trips, and at most a chunk's worth of ids
     * past the first miss are looked at. */
    uint8_t hit[64];
    size_t chunk = 1;
    for (size_t i = 0; i < n;) {
        size_t m = n - i < chunk ? n - i : chunk;
        int rc = e->cluster ? kv__cluster_lookup(e->cluster, KV_NS_BLOCK, &ids[i], m, hit)
                            : kv__local_lookup(e, KV_NS_BLOCK, &ids[i], m, hit);
        if (rc != KV_OK)
            return rc;
        for (size_t k = 0; k < m; k++)
            if (!hit[k])
                return (ssize_t)(i + k) - 1;
        i += m;
        if (e->cluster && chunk < KV__ARRAY_LEN(hit))
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
    out->dram_capacity = e->has_dram ? e->seg.len : 0;
    out->dram_used = atomic_load(&e->used);
    for (int ns = 0; ns < KV_NS_COUNT && e->has_dram; ns++) {
        struct kv__table *t = &e->tab[ns];
        for (uint32_t i = 0; i < t->n; i++) {
            struct kv__tshard *ts = &t->sh[i];
            pthread_mutex_lock(&ts->lock);
            if (ns == KV_NS_BLOCK) {
                out->dram_blocks += ts->nblocks;
                out->dram_shards += ts->nshards;
            } else {
                out->keys += ts->nblocks;
            }
            out->dram_index_bytes += ts->index_bytes;
            pthread_mutex_unlock(&ts->lock);
        }
    }
    out->hits_dram = atomic_load(&e->ct.hits_dram);
    out->hits_ssd = atomic_load(&e->ct.hits_ssd);
    out->misses = atomic_load(&e->ct.misses);
    out->evictions = atomic_load(&e->ct.evictions);
    out->promotions = atomic_load(&e->ct.promotions);
    out->enospc = atomic_load(&e->ct.enospc);
    out->dumps_ok = atomic_load(&e->ct.dumps_ok);
    out->dumps_failed = atomic_load(&e->ct.dumps_failed);
    out->loads_ok = atomic_load(&e->ct.loads_ok);
    out->loads_failed = atomic_load(&e->ct.loads_failed);
    out->tasks_inflight = kv__pool_inflight(e->pool);
    out->open_ns = e->open_ns;
    if (e->ssd)
        kv__ssd_stats(e->ssd, out);
    if (e->cluster)
        kv__cluster_stats(e->cluster, out);
    return KV_OK;
}

/* ---- open and close --------------------------------------------------- */

static void free_value(void *ctx, uint32_t off64, uint32_t len)
{
    kv_engine *e = ctx;
    kv__dram_free(e, kv__seg_ptr(e, off64), len);
}

/* Tears down whatever kv_open built. The order matters: the metrics
 * server first (its scrapes read everything), then the tasks (they use the
 * cluster and the tiers, and record into the metrics' histograms), then
 * the cluster (peers' requests use the local tiers), then the tiers. */
static void teardown(kv_engine *e)
{
    kv__metrics_stop(e->metrics);
    kv__pool_stop(e->pool);
    kv__metrics_close(e->metrics);
    kv__cluster_stop(e->cluster);
    /* The SSD tier flushes its spill queue, releasing victims (which frees
     * their DRAM), so it closes before the DRAM tier goes. */
    kv__ssd_close(e->ssd);
    if (e->has_dram) {
        for (int ns = 0; ns < KV_NS_COUNT; ns++)
            kv__table_destroy(&e->tab[ns], free_value, e);
        kv__alloc_free_all(e->alloc);
    }
    pthread_mutex_destroy(&e->evict_lock);
    kv__segment_unmap(&e->seg);
    free(e);
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
    kv_engine *e = calloc(1, sizeof *e);
    if (!e)
        return KV_ENOMEM;
    uint64_t t0 = kv__now_ns();
    e->cfg = *cfg;
    e->epoch_ns = t0;
    pthread_mutex_init(&e->evict_lock, NULL);
    kv__log_set_level(cfg->log.level);

    e->has_dram = KV_PIPE_HAS_DRAM(cfg->pipeline) && cfg->dram.capacity > 0;
    if (e->has_dram) {
        rc = kv__segment_map(&e->seg, cfg->dram.capacity, cfg->dram.hugepages, err, sizeof err);
        if (rc == KV_OK)
            rc = kv__alloc_new(&e->alloc, e->seg.base, e->seg.len, err, sizeof err);
        for (int ns = 0; rc == KV_OK && ns < KV_NS_COUNT; ns++)
            rc = kv__table_init(&e->tab[ns], cfg->dram.shards);
        if (rc != KV_OK) {
            e->has_dram = e->alloc != NULL;
            goto fail;
        }
        e->high_wm = (uint64_t)((double)e->seg.len * cfg->eviction.high_watermark_ratio);
        e->evict_step = (uint64_t)((double)e->seg.len * cfg->eviction.ratio);
        if (e->evict_step == 0)
            e->evict_step = 1;
        e->lease_ns = cfg->eviction.lease_ttl_ms * 1000000u;
    }
    /* A pure cluster client (dram.capacity 0 with a DRAM pipeline) stores
     * nothing locally: no SSD tier either (net/cluster.c: not an owner). */
    bool pure_client = cfg->cluster.enabled && cfg->dram.capacity == 0 &&
                       cfg->pipeline != KV_PIPE_SSD;
    if (KV_PIPE_HAS_SSD(cfg->pipeline) && !pure_client) {
        rc = kv__ssd_open(cfg, &e->ssd, err, sizeof err);
        if (rc != KV_OK)
            goto fail;
        if (e->has_dram)
            e->sink = kv__ssd_sink(e->ssd);
    }
    rc = kv__pool_start(&e->pool, cfg->io.threads, cfg->io.timeout_ms,
                        (struct kv__pool_ops){ e, run_chunk, finish_task });
    if (rc != KV_OK) {
        snprintf(err, sizeof err, "cannot start %u io threads", cfg->io.threads);
        goto fail;
    }
    if (cfg->cluster.enabled) {
        struct kv__backend be;
        kv__backend_engine(e, &be);
        rc = kv__cluster_start(&be, cfg, &e->cluster, err, sizeof err);
        if (rc != KV_OK)
            goto fail;
    }
    /* Last: from here on scrapes read the engine from another thread. */
    e->open_ns = kv__now_ns() - t0;
    rc = kv__metrics_open(e, cfg, &e->metrics, err, sizeof err);
    if (rc != KV_OK)
        goto fail;
    if (e->has_dram)
        KV_INFO("engine open: pipeline=%s dram=%llu bytes (%s pages, faulted in %.1f ms) "
                "shards=%u threads=%u%s in %.1f ms",
                kv__pipeline_name(cfg->pipeline), (unsigned long long)e->seg.len, e->seg.pages,
                (double)e->seg.fault_ns / 1e6, cfg->dram.shards, cfg->io.threads,
                e->cluster ? " cluster" : "", (double)e->open_ns / 1e6);
    else
        KV_INFO("engine open: pipeline=%s, no DRAM tier, threads=%u%s in %.1f ms",
                kv__pipeline_name(cfg->pipeline), cfg->io.threads,
                !e->cluster ? "" : e->ssd ? " cluster" : " cluster (pure client)",
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
