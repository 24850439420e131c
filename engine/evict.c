/*
 * evict.c — frees DRAM, least recently used blocks first, whole blocks.
 *
 * How it works. Every block carries a stamp: its last use (ns since the
 * engine opened), or the end of its lease, which lies in the future. There
 * is no LRU list to keep in order; instead a round samples. Each table
 * shard (both namespaces) is sampled from its clock hand for up to
 * SAMPLE_BUDGET entries and offers its PER_SHARD oldest evictable blocks
 * (stamp in the past, nobody copying out of it). The offers of all shards
 * are sorted, and the oldest quarter is evicted — each one only if, under
 * its shard's lock, it is still there, still unpinned and not used since it
 * was sampled. A shard smaller than the budget is seen whole, so on small
 * tables the order is exact LRU; on large ones it is the approximation
 * DESIGN.md allows (the most recently used blocks survive: a block used
 * since sampling is never taken, and a fresh stamp is never among the
 * oldest offered).
 *
 * Leased and pinned blocks are skipped, never waited for: when nothing
 * anywhere is evictable a round returns having freed nothing and the dump
 * fails with KV_ENOSPC at once.
 *
 * Victims leave the index under the shard lock and are handed to the sink
 * (the next tier's write-back in dram|ssd) with no lock held. Their memory counts as used
 * until the sink releases it: write-back finishes before DRAM is reused.
 */
#include <stdlib.h>

#include "dram.h"

#define SAMPLE_BUDGET 64      /* entries looked at per shard per round */
#define PER_SHARD 8           /* candidates each shard offers per round */
#define IDLE_ROUNDS 3         /* rounds that free nothing before giving up */

struct offer {
    struct kv__cand c;
    int ns;
};

static void release_victim(struct kv__victim *v)
{
    struct kv__dram *d = v->priv;
    for (uint32_t i = 0; i < v->nshards; i++)
        kv__dram_free(d, (void *)v->shards[i].data, v->shards[i].len);
    free(v);
}

/* Turns an unlinked entry into a victim and hands it to the sink (or frees
 * it when there is no sink, or no memory to describe it). Returns the
 * bytes it will free. */
static uint64_t hand_off(struct kv__dram *d, int ns, struct kv__blk *b)
{
    uint64_t bytes = 0;
    struct kv__sref *r = kv__blk_srefs(b);
    for (uint32_t i = 0; i < b->nshards; i++)
        bytes += kv__alloc_size(d->alloc, r[i].len);
    atomic_fetch_add(&d->evictions, 1);

    struct kv__victim *v = NULL;
    if (d->sink.accept)
        v = malloc(sizeof *v + b->nshards * sizeof *v->shards);
    if (!v) {
        kv__dram_free_blk(d, b);
        return bytes;
    }
    v->ns = ns;
    v->id = b->id;
    v->last_use_ms = (uint32_t)(b->stamp / 1000000u);
    v->nshards = b->nshards;
    v->shards = (struct kv__victim_shard *)(v + 1);
    for (uint32_t i = 0; i < b->nshards; i++)
        v->shards[i] = (struct kv__victim_shard){ r[i].index, r[i].len, kv__seg_ptr(d, r[i].off64) };
    v->release = release_victim;
    v->priv = d;
    kv__blk_free(b);               /* the victim now describes the values */
    d->sink.accept(d->sink.ctx, v);
    return bytes;
}

static int by_stamp(const void *a, const void *b)
{
    uint64_t x = ((const struct offer *)a)->c.stamp, y = ((const struct offer *)b)->c.stamp;
    return x < y ? -1 : x > y;
}

/* Collects every shard's offers; returns how many. */
static size_t sample_all(struct kv__dram *d, uint64_t now, struct offer *o)
{
    size_t n = 0;
    struct kv__cand c[PER_SHARD];
    for (int ns = 0; ns < KV_NS_COUNT; ns++) {
        struct kv__table *t = &d->tab[ns];
        for (uint32_t i = 0; i < t->n; i++) {
            struct kv__tshard *ts = &t->sh[i];
            pthread_mutex_lock(&ts->lock);
            size_t k = kv__tshard_sample(ts, now, SAMPLE_BUDGET, c, PER_SHARD);
            pthread_mutex_unlock(&ts->lock);
            for (size_t j = 0; j < k; j++)
                o[n++] = (struct offer){ c[j], ns };
        }
    }
    return n;
}

/* Evicts one offered block if it is still as sampled; returns its bytes. */
static uint64_t take(struct kv__dram *d, const struct offer *o)
{
    struct kv__at a = kv__dram_lock_find(d, o->ns, &o->c.id, KV__ANY_SHARD, o->c.hash);
    struct kv__blk *b = a.b;
    bool ok = b && !b->pins && b->stamp == o->c.stamp;   /* else gone, in use, or used since */
    if (ok) {
        kv__blk_unlink(a.ts, a.h, b);
        kv__dram_unlinked(d, o->ns, b);
    }
    kv__dram_unlock(&a);
    return ok ? hand_off(d, o->ns, b) : 0;
}

uint64_t kv__evict(struct kv__dram *d, uint64_t want)
{
    size_t max = (size_t)(d->tab[0].n + d->tab[1].n) * PER_SHARD;
    struct offer *o = malloc(max * sizeof *o);
    if (!o)
        return 0;
    uint64_t freed = 0;
    pthread_mutex_lock(&d->evict_lock);
    for (int idle = 0; freed < want && idle < IDLE_ROUNDS;) {
        size_t n = sample_all(d, kv__dram_now(d), o);
        if (n == 0)
            break;                              /* all leased or pinned */
        qsort(o, n, sizeof *o, by_stamp);
        uint64_t round = 0;
        for (size_t i = 0; i < (n + 3) / 4 && freed + round < want; i++)
            round += take(d, &o[i]);
        freed += round;
        idle = round ? 0 : idle + 1;
    }
    pthread_mutex_unlock(&d->evict_lock);
    free(o);
    return freed;
}

void kv__evict_maybe(struct kv__dram *d)
{
    if (atomic_load(&d->used) <= d->high_wm)
        return;
    if (pthread_mutex_trylock(&d->evict_lock) != 0)
        return;                                 /* someone is on it */
    pthread_mutex_unlock(&d->evict_lock);
    /* Free ratio x capacity (eviction.ratio), as Mooncake's master does.
     * Memory still being written back counts as freed already: evicting
     * for it again while the writer is behind would empty the cache. */
    uint64_t used = atomic_load(&d->used), held = kv__dram_in_flight(d);
    if (used > held && used - held > d->high_wm)
        kv__evict(d, d->evict_step);
}
