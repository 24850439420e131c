/*
 * evict.c — frees DRAM, least recently used blocks first, whole blocks.
 *
 * How it works. Each table shard keeps an exact LRU list. To approximate one
 * engine-wide LRU order without a global lock, a round looks at the oldest
 * evictable block of every table shard (both namespaces), picks the shard
 * whose candidate is oldest, and evicts from that shard's tail while its
 * blocks are no newer than the runner-up's candidate. A block is evictable
 * when nobody is copying out of it (pins == 0) and its stamp is in the past
 * (a lease is a stamp in the future; see index.h).
 * Leased and pinned blocks are skipped, never waited for: the scan from a
 * tail gives up after SCAN_LIMIT of them, so a shard full of leased blocks
 * costs a bounded look, and when nothing anywhere is evictable the round
 * returns having freed nothing and the dump fails with KV_ENOSPC at once.
 *
 * Victims leave the index under the shard lock and are handed to the sink
 * (the SSD tier in dram|ssd) with no lock held. Their memory counts as used
 * until the sink releases it: write-back finishes before DRAM is reused.
 */
#include <stdlib.h>

#include "store.h"

#define SCAN_LIMIT 64

struct cand {
    struct kv__table *tab;
    int ns;
    uint32_t shard;
    uint64_t stamp;
    bool valid;
};

/* The oldest evictable block of a shard, or NULL (lock held). A lookup
 * leases a block by moving its stamp into the future without relinking it
 * (engine.c), so the list is LRU order except for leased blocks: those met
 * here are promoted to the head (a second chance, as in CLOCK), and the
 * oldest stamp among the evictable blocks of the window wins. */
static struct kv__blk *oldest(struct kv__tshard *ts, uint64_t now)
{
    struct kv__blk *best = NULL;
    int n = 0;
    for (struct kv__blk *b = ts->lru_tail, *prev; b && n < SCAN_LIMIT; b = prev, n++) {
        prev = b->prev;
        if (b->stamp > now) {
            kv__blk_touch(ts, b, now);          /* leased: to the head */
            continue;
        }
        if (b->pins == 0 && (!best || b->stamp < best->stamp))
            best = b;
        if (best && best == b && (!prev || prev->stamp >= b->stamp))
            break;                              /* in order: nothing older ahead */
    }
    return best;
}

static void release_victim(struct kv__victim *v)
{
    kv_engine *e = v->priv;
    /* The shard array was built from the entry; free the values it names. */
    for (uint32_t i = 0; i < v->nshards; i++)
        kv__dram_free(e, (void *)v->shards[i].data, v->shards[i].len);
    free(v);
}

/* Turns an unlinked entry into a victim and hands it to the sink (or frees
 * it when there is no sink, or no memory to describe it). Returns the
 * bytes it will free. */
static uint64_t hand_off(kv_engine *e, int ns, struct kv__blk *b)
{
    uint64_t bytes = 0;
    struct kv__sref *r = kv__blk_srefs(b);
    for (uint32_t i = 0; i < b->nshards; i++)
        bytes += kv__alloc_size(e->alloc, r[i].len);
    atomic_fetch_add(&e->ct.evictions, 1);

    struct kv__victim *v = NULL;
    if (e->sink.accept)
        v = malloc(sizeof *v + b->nshards * sizeof *v->shards);
    if (!v) {
        kv__dram_free_blk(e, b);
        return bytes;
    }
    v->ns = ns;
    v->id = b->id;
    v->last_use_ms = (uint32_t)(b->stamp / 1000000u);
    v->nshards = b->nshards;
    v->shards = (struct kv__victim_shard *)(v + 1);
    for (uint32_t i = 0; i < b->nshards; i++)
        v->shards[i] = (struct kv__victim_shard){ r[i].index, r[i].len, kv__seg_ptr(e, r[i].off64) };
    v->release = release_victim;
    v->priv = e;
    kv__blk_free(b);               /* the victim now describes the values */
    e->sink.accept(e->sink.ctx, v);
    return bytes;
}

/* Finds, across every table shard, the oldest and second-oldest evictable
 * candidates. */
static void scan(kv_engine *e, uint64_t now, struct cand *best, struct cand *second)
{
    *best = *second = (struct cand){ 0 };
    for (int ns = 0; ns < KV_NS_COUNT; ns++) {
        struct kv__table *t = &e->tab[ns];
        for (uint32_t i = 0; i < t->n; i++) {
            struct kv__tshard *ts = &t->sh[i];
            pthread_mutex_lock(&ts->lock);
            struct kv__blk *b = oldest(ts, now);
            struct cand c = { t, ns, i, b ? b->stamp : 0, b != NULL };
            pthread_mutex_unlock(&ts->lock);
            if (!c.valid)
                continue;
            if (!best->valid || c.stamp < best->stamp) {
                *second = *best;
                *best = c;
            } else if (!second->valid || c.stamp < second->stamp) {
                *second = c;
            }
        }
    }
}

uint64_t kv__evict(kv_engine *e, uint64_t want)
{
    if (!e->has_dram)
        return 0;
    uint64_t freed = 0;
    pthread_mutex_lock(&e->evict_lock);
    uint64_t now = kv__engine_now(e);
    while (freed < want) {
        struct cand best, second;
        scan(e, now, &best, &second);
        if (!best.valid)
            break;                              /* all leased or pinned */
        struct kv__tshard *ts = &best.tab->sh[best.shard];
        uint64_t round = 0;
        for (;;) {
            pthread_mutex_lock(&ts->lock);
            struct kv__blk *b = oldest(ts, now);
            if (!b || (second.valid && round > 0 && second.stamp < b->stamp)) {
                pthread_mutex_unlock(&ts->lock);
                break;
            }
            kv__blk_unlink(ts, kv__id_hash(&b->id), b);
            pthread_mutex_unlock(&ts->lock);
            round += hand_off(e, best.ns, b);
            if (freed + round >= want)
                break;
        }
        freed += round;
        if (round == 0)
            break;
    }
    pthread_mutex_unlock(&e->evict_lock);
    return freed;
}

void kv__evict_maybe(kv_engine *e)
{
    if (atomic_load(&e->used) <= e->high_wm)
        return;
    if (pthread_mutex_trylock(&e->evict_lock) != 0)
        return;                                 /* someone is on it */
    pthread_mutex_unlock(&e->evict_lock);
    /* Free ratio x capacity (eviction.ratio), as Mooncake's master does. */
    uint64_t used = atomic_load(&e->used);
    if (used > e->high_wm)
        kv__evict(e, e->evict_step);
}
