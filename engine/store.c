/*
 * store.c — the node-local store: DRAM, then the tiers below it in
 * pipeline order (engine/tier.h), behind the kv__local_* calls that the
 * engine's own tasks and net/ (through engine/backend.c) serve from.
 *
 * Key design choice: this file is the one place that decides where a value
 * goes among the tiers; the DRAM tier (dram.c) and every tier below
 * (persist/ssd.c ...) only store, find and delete. The rules, each written
 * once below:
 * - read: DRAM, then each tier in turn; the first that holds it serves.
 * - write (a dump): never rewrites a shard held anywhere; goes to DRAM, and
 *   on to the first tier below when that tier writes through (write_below)
 *   or when there is no DRAM.
 * - promote: a read served below DRAM is copied up into it when the tier
 *   asks for that (ssd.promote); best effort, as is prefetch's staging.
 * - spill: DRAM's eviction victims go to the first tier below, through
 *   its own write-back sink, or else written one by one (spill_accept).
 * - replace (plain keys): every older copy is dropped from every tier
 *   before the new one is stored, and a tier that cannot drop its copy
 *   fails the put, so nothing older than an acknowledged value survives.
 * No lock of the store's own: DRAM takes its table-shard locks inside
 * each call, and no tier is called with one held (the spill alone runs
 * under DRAM's evict_lock: engine/internal.h, lock order).
 */
#include <stdio.h>
#include <stdlib.h>

#include "dram.h"
#include "store.h"

/* The tier right below DRAM (where write-through and spill go); NULL. */
static const struct kv__tier *next_tier(kv_engine *e)
{
    return e->ntiers ? &e->tier[0] : NULL;
}

/* ---- opening the pipeline ------------------------------------------------- */

/* The spill of a tier without a write-back sink: each victim written through
 * the tier's write() on the evicting thread (under evict_lock), then
 * released. A shard that cannot be written is lost, as a dropped victim. */
static void spill_accept(void *ctx, struct kv__victim *v)
{
    const struct kv__tier *t = ctx;
    for (uint32_t i = 0; i < v->nshards; i++) {
        kv_iov iov = { (void *)v->shards[i].data, v->shards[i].len };
        t->ops->write(t->ctx, v->ns, &v->id, v->shards[i].index, &iov, 1);
    }
    v->release(v);
}

int kv__store_attach(kv_engine *e, const struct kv__tier_ops *ops, char *err, size_t errlen)
{
    if (e->ntiers == KV__TIERS_MAX) {
        kv__errf(err, errlen, "more than %d tiers", KV__TIERS_MAX);
        return KV_EINVAL;
    }
    struct kv__tier *t = &e->tier[e->ntiers];
    *t = (struct kv__tier){ .ops = ops };
    int rc = ops->open(&e->cfg, t, err, errlen);
    if (rc != KV_OK) {
        *t = (struct kv__tier){ 0 };
        return rc;
    }
    if (e->dram && e->ntiers == 0)
        kv__dram_set_sink(e->dram, ops->sink ? ops->sink(t->ctx)
                                             : (struct kv__sink){ t, spill_accept, NULL });
    e->ntiers++;
    return KV_OK;
}

int kv__store_open(kv_engine *e, char *err, size_t errlen)
{
    const struct kv_config *cfg = &e->cfg;
    if (KV_PIPE_HAS_DRAM(cfg->pipeline) && cfg->dram.capacity > 0) {
        int rc = kv__dram_open(cfg, e->epoch_ns, &e->dram, err, errlen);
        if (rc != KV_OK)
            return rc;
    }
    /* A pure cluster client (dram.capacity 0 with a DRAM pipeline) stores
     * nothing locally: no tier below either (net/cluster.c: not an owner). */
    if (cfg->cluster.enabled && cfg->dram.capacity == 0 && KV_PIPE_HAS_DRAM(cfg->pipeline))
        return KV_OK;
    const struct kv__tier_ops *ops;
    for (size_t i = 0; (ops = kv__tier_at(i)) != NULL; i++) {
        if (!(cfg->pipeline & ops->pipe))
            continue;
        int rc = kv__store_attach(e, ops, err, errlen);
        if (rc != KV_OK)
            return rc;
    }
    return KV_OK;
}

void kv__store_close(kv_engine *e)
{
    /* The tier below DRAM flushes its write-back queue, releasing victims
     * (which frees their DRAM), so the tiers close before DRAM goes. */
    for (unsigned i = 0; i < e->ntiers; i++)
        e->tier[i].ops->close(e->tier[i].ctx);
    e->ntiers = 0;
    kv__dram_close(e->dram);
    e->dram = NULL;
}

const struct kv__tier *kv__store_tier(kv_engine *e, const char *name)
{
    for (unsigned i = 0; i < e->ntiers; i++)
        if (strcmp(e->tier[i].ops->name, name) == 0)
            return &e->tier[i];
    return NULL;
}

unsigned kv__store_depth(kv_engine *e)
{
    return e->ntiers;
}

bool kv__store_empty(kv_engine *e)
{
    return !e->dram && !e->ntiers;
}

void kv__store_describe(kv_engine *e, char *buf, size_t len)
{
    if (e->dram)
        kv__dram_describe(e->dram, buf, len);
    else
        snprintf(buf, len, ", no DRAM tier,");
}

void kv__store_stats(kv_engine *e, kv_stats *out)
{
    if (e->dram)
        kv__dram_stats(e->dram, out);
    for (unsigned i = 0; i < e->ntiers; i++)
        e->tier[i].ops->stats(e->tier[i].ctx, out);
}

void kv__engine_segment(kv_engine *e, void **base, size_t *len)
{
    *base = NULL;
    *len = 0;
    if (e->dram)
        kv__dram_segment(e->dram, base, len);
}

/* ---- the tiers below DRAM, in order ---------------------------------------- */

bool kv__store_below_contains(kv_engine *e, int ns, const kv_block_id *id, uint32_t index)
{
    for (unsigned i = 0; i < e->ntiers; i++)
        if (e->tier[i].ops->contains(e->tier[i].ctx, ns, id, index))
            return true;
    return false;
}

int kv__store_below_size(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                         uint64_t *len)
{
    int rc = KV_ENOTFOUND;
    for (unsigned i = 0; i < e->ntiers && rc == KV_ENOTFOUND; i++)
        rc = e->tier[i].ops->size(e->tier[i].ctx, ns, id, index, len);
    return rc;
}

/* Reads from the first tier that holds the shard; *from is that tier. */
static int read_below(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                      const kv_iov *iov, uint32_t iovcnt, const struct kv__tier **from)
{
    int rc = KV_ENOTFOUND;
    for (unsigned i = 0; i < e->ntiers && rc == KV_ENOTFOUND; i++) {
        *from = &e->tier[i];
        rc = e->tier[i].ops->read(e->tier[i].ctx, ns, id, index, iov, iovcnt);
    }
    return rc;
}

int kv__store_below_read(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                         const kv_iov *iov, uint32_t iovcnt)
{
    const struct kv__tier *from;
    return read_below(e, ns, id, index, iov, iovcnt, &from);
}

/* The write-through rule: a value just stored in DRAM (or refused a place
 * there: no DRAM tier) goes on down to the tier below when there is no DRAM
 * (it is then the only copy) or when that tier writes through. */
static int write_below(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                       const kv_iov *iov, uint32_t iovcnt)
{
    const struct kv__tier *t = next_tier(e);
    if (!t)
        return e->dram ? KV_OK : KV_ENOSPC;
    if (e->dram && !t->write_through)
        return KV_OK;
    return t->ops->write(t->ctx, ns, id, index, iov, iovcnt);
}

/* Copies iov into fresh DRAM and links it (the first copy wins). */
static int dram_put(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                    const kv_iov *iov, uint32_t iovcnt)
{
    uint64_t len = kv__iov_len(iov, iovcnt);
    void *p;
    int rc = kv__dram_alloc(e->dram, len, &p);
    if (rc != KV_OK)
        return rc;
    kv__iov_gather(p, iov, iovcnt);
    return kv__dram_insert(e->dram, ns, id, index, p, (uint32_t)len);
}

/* The promotion rule: a shard read from a tier that promotes is copied up
 * into DRAM. Best effort: one that finds no room is simply skipped. */
static void promote(kv_engine *e, const struct kv__tier *from, int ns, const kv_block_id *id,
                    uint32_t index, const kv_iov *iov, uint32_t iovcnt)
{
    if (e->dram && from->promote && dram_put(e, ns, id, index, iov, iovcnt) == KV_OK)
        atomic_fetch_add(&e->ct.promotions, 1);
}

/* ---- the local store (engine.h) ------------------------------------------------ */

int kv__local_pin(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                  const void **data, uint64_t *len, kv__pin *pin)
{
    return e->dram ? kv__dram_pin(e->dram, ns, id, index, data, len, pin) : KV_ENOTFOUND;
}

void kv__local_unpin(kv_engine *e, kv__pin *pin)
{
    kv__dram_unpin(e->dram, pin);
}

int kv__local_size(kv_engine *e, int ns, const kv_block_id *id, uint32_t index, uint64_t *len)
{
    if (e->dram && kv__dram_size(e->dram, ns, id, index, len) == KV_OK)
        return KV_OK;
    return kv__store_below_size(e, ns, id, index, len);
}

struct below_walk {
    kv_engine *e;
    unsigned tier;        /* the tier walked */
    int ns;
    kv__scan_cb cb;
    void *arg;
    int stop;
};

static int below_visit(void *ctx, const kv_ssd_entry *ent)
{
    struct below_walk *w = ctx;
    kv_engine *e = w->e;
    int ns = ent->ns == KV_SSD_NS_KEY ? KV_NS_KEY : KV_NS_BLOCK;
    if (ns != w->ns || (e->dram && kv__dram_has(e->dram, ns, &ent->id, ent->index)))
        return 0;   /* another namespace, or visited with DRAM's shards */
    for (unsigned i = 0; i < w->tier; i++)
        if (e->tier[i].ops->contains(e->tier[i].ctx, ns, &ent->id, ent->index))
            return 0;   /* visited with a tier above */
    /* last use unknown below DRAM: the oldest */
    return w->stop = w->cb(w->arg, &ent->id, ent->index, ent->size, 0);
}

/* DRAM's shards, then those only a tier below holds (from each tier's
 * index, where it has a walk: no value is read). */
int kv__local_scan(kv_engine *e, int ns, kv__scan_cb cb, void *arg)
{
    struct below_walk w = { .e = e, .ns = ns, .cb = cb, .arg = arg };
    int rc = KV_OK;
    w.stop = e->dram && kv__dram_scan(e->dram, ns, cb, arg);
    for (unsigned i = 0; rc == KV_OK && !w.stop && i < e->ntiers; i++) {
        if (!e->tier[i].ops->scan)
            continue;
        w.tier = i;
        rc = e->tier[i].ops->scan(e->tier[i].ctx, below_visit, &w);
    }
    return rc;
}

/* Shard index held in some tier (DRAM first: no I/O anywhere). */
static bool shard_held(kv_engine *e, int ns, const kv_block_id *id, uint32_t index)
{
    return (e->dram && kv__dram_has(e->dram, ns, id, index)) ||
           kv__store_below_contains(e, ns, id, index);
}

/*
 * A hit is a promise that a load finds every shard, so a block hits only
 * once it is complete: shards 0..store.block_shards-1 each in some tier
 * (UCM's Posix store commits a block after its last shard). The shard count
 * comes from the config rather than from the dumps because a dump says
 * nothing of the shards still to come: with 4 writers each dumping one
 * shard, whichever finishes first cannot know it is not the last. With the
 * default of one shard this is today's single probe per id; the lease goes
 * with DRAM's probe of shard 0 (the whole block is one entry there), and a
 * block that turns out incomplete keeps it until its TTL, which only delays
 * its eviction. Plain keys are one value each.
 */
/* How many bytes of hit[] are 1 (a hit below is a 2): eight at a time,
 * each byte's low bit summed into the top byte by one multiply, so that
 * counting costs the lookup path well under an instruction per id. */
static uint64_t count_ones(const uint8_t *hit, size_t n)
{
    const uint64_t low = 0x0101010101010101ull;
    uint64_t c = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, hit + i, 8);
        c += ((w & low) * low) >> 56;
    }
    for (; i < n; i++)
        c += hit[i] == 1;
    return c;
}

int kv__local_lookup(kv_engine *e, int ns, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    if (e->dram)
        kv__dram_lookup(e->dram, ns, ids, n, hit);
    else
        memset(hit, 0, n);
    /* While the passes run, a hit says where shard 0 is: 1 DRAM, 2 below
     * (counted as it is found); the 2s become 1s at the end. */
    uint64_t below = 0;
    for (size_t i = 0; e->ntiers && i < n; i++)
        if (!hit[i] && kv__store_below_contains(e, ns, &ids[i], 0)) {
            hit[i] = 2;
            below++;
        }
    uint32_t shards = ns == KV_NS_BLOCK ? e->cfg.store.block_shards : 1;
    for (size_t i = 0; shards > 1 && i < n; i++)
        for (uint32_t s = 1; hit[i] && s < shards; s++)
            if (!shard_held(e, ns, &ids[i], s)) {
                below -= hit[i] == 2;
                hit[i] = 0;
            }
    if (ns == KV_NS_BLOCK && n) {
        uint64_t dram = count_ones(hit, n);
        kv__metrics_lookups(&e->lk, dram, below, n - dram - below);
    }
    for (size_t i = 0; below && i < n; i++)
        hit[i] = hit[i] != 0;
    return KV_OK;
}

int kv__local_dump(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                   const kv_iov *iov, uint32_t iovcnt)
{
    if (kv__iov_len(iov, iovcnt) > KV_VALUE_MAX)
        return KV_EINVAL;
    if ((e->dram && kv__dram_has(e->dram, ns, id, index)) ||
        kv__store_below_contains(e, ns, id, index))
        return KV_OK;                          /* no rewrite */
    int rc = e->dram ? dram_put(e, ns, id, index, iov, iovcnt) : KV_OK;
    return rc == KV_OK ? write_below(e, ns, id, index, iov, iovcnt) : rc;
}

int kv__store_dump_many(kv_engine *e, int ns, const kv_shard *sh, size_t n, int *results)
{
    /* No DRAM: the tier below takes the batch at once (for the SSD tier one
     * WriteBatch, one WAL record and one sync for them all). */
    const struct kv__tier *t = next_tier(e);
    if (!e->dram && t && t->ops->write_many)
        return t->ops->write_many(t->ctx, ns, sh, n, results);
    /* The first probe of a new block's bucket is a cache miss (~0.3 us a
     * 64 KiB shard, 5% of its copy): start them all before the first copy. */
    if (e->dram)
        kv__dram_prefetch(e->dram, ns, sh, n);
    for (size_t i = 0; i < n; i++)
        results[i] = kv__local_dump(e, ns, &sh[i].block, sh[i].index, sh[i].iov, sh[i].iovcnt);
    return KV_OK;
}

int kv__local_load(kv_engine *e, int ns, const kv_block_id *id, uint32_t index,
                   const kv_iov *iov, uint32_t iovcnt)
{
    int rc = e->dram ? kv__dram_copy_out(e->dram, ns, id, index, iov, iovcnt) : KV_ENOTFOUND;
    if (rc == KV_OK) {
        atomic_fetch_add(&e->ct.hits_dram, 1);
        return KV_OK;
    }
    if (rc == KV_ENOTFOUND) {
        const struct kv__tier *from = NULL;
        rc = read_below(e, ns, id, index, iov, iovcnt, &from);
        if (rc == KV_OK) {
            atomic_fetch_add(&e->ct.hits_ssd, 1);
            promote(e, from, ns, id, index, iov, iovcnt);
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
    return e->dram ? kv__dram_reserve(e->dram, len, r) : KV_ENOSPC;
}

int kv__local_commit(kv_engine *e, kv__resv *r, int ns, const kv_block_id *id, uint32_t index)
{
    kv_iov iov = { r->data, r->len };
    int rc = kv__dram_commit(e->dram, r, ns, id, index);
    return rc == KV_OK ? write_below(e, ns, id, index, &iov, 1) : rc;
}

void kv__local_abort(kv_engine *e, kv__resv *r)
{
    if (e->dram)
        kv__dram_abort(e->dram, r);
}

int kv__local_remove(kv_engine *e, int ns, const kv_block_id *id, uint32_t index)
{
    if (!e || !id || ns != KV_NS_KEY || index != 0)
        return KV_EINVAL;
    bool found = e->dram && kv__dram_remove(e->dram, ns, id);
    for (unsigned i = 0; i < e->ntiers; i++) {
        int rc = e->tier[i].ops->remove(e->tier[i].ctx, ns, id, index);
        if (rc == KV_OK)
            found = true;
        else if (rc != KV_ENOTFOUND)
            return rc;
    }
    return found ? KV_OK : KV_ENOTFOUND;
}

int kv__store_put(kv_engine *e, int ns, const kv_block_id *id, const kv_iov *iov,
                  uint32_t iovcnt)
{
    uint64_t len = kv__iov_len(iov, iovcnt);
    void *p = NULL;
    if (e->dram) {
        int rc = kv__dram_alloc(e->dram, len, &p);
        if (rc != KV_OK)
            return rc;
        kv__iov_gather(p, iov, iovcnt);
    }
    /* Replace: no older copy may survive in any tier. One that cannot be
     * deleted (a full disk under RocksDB's WAL) fails the put: it would
     * come back after a restart, older than a value acknowledged. */
    int rc = kv__local_remove(e, ns, id, 0);
    if (rc != KV_OK && rc != KV_ENOTFOUND) {
        if (p)
            kv__dram_free(e->dram, p, len);
        return rc;
    }
    if (p && (rc = kv__dram_insert(e->dram, ns, id, 0, p, (uint32_t)len)) != KV_OK)
        return rc;
    return write_below(e, ns, id, 0, iov, iovcnt);
}

/* ---- prefetch -------------------------------------------------------------- */

bool kv__store_stages(kv_engine *e)
{
    return e->dram && e->ntiers;
}

/* Copies every shard of a block that a tier below holds and DRAM lacks into
 * DRAM. Best effort, like promotion: a shard that finds no room is left
 * where it is. */
void kv__store_stage(kv_engine *e, int ns, const kv_block_id *id)
{
    for (unsigned t = 0; t < e->ntiers && e->dram; t++) {
        const struct kv__tier *tr = &e->tier[t];
        uint32_t idx[256];
        size_t n = tr->ops->block_shards(tr->ctx, ns, id, idx, KV__ARRAY_LEN(idx));
        for (size_t k = 0; k < n && k < KV__ARRAY_LEN(idx); k++) {
            uint64_t len;
            void *p;
            if (kv__dram_has(e->dram, ns, id, idx[k]) ||
                tr->ops->size(tr->ctx, ns, id, idx[k], &len) != KV_OK ||
                kv__dram_alloc(e->dram, len, &p) != KV_OK)
                continue;
            kv_iov iov = { p, len };
            if (tr->ops->read(tr->ctx, ns, id, idx[k], &iov, 1) != KV_OK)
                kv__dram_free(e->dram, p, len);
            else if (kv__dram_insert(e->dram, ns, id, idx[k], p, (uint32_t)len) == KV_OK)
                atomic_fetch_add(&e->ct.promotions, 1);   /* insert frees p otherwise */
        }
    }
}
