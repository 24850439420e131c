/*
 * index.c — the DRAM tier's sharded hash table of block entries.
 *
 * Chained hashing with a power-of-two bucket array per table shard, grown
 * (doubled, rehashed under the shard's lock) when blocks outnumber buckets.
 * Block ids are md5s in real use but may be anything in tests, so they are
 * hashed (XXH3) rather than used raw.
 *
 * Memory per stored shard is what the issue asks us to watch (goal: at most
 * 64 bytes). An entry is 48 bytes holding one shard inline, so a
 * single-shard block costs 48 bytes plus 8-16 bytes of bucket array, and
 * each further shard of a block 12 bytes more. Keeping recency in a stamp
 * instead of an LRU list (16 bytes of links) is what makes that fit; the
 * evictor samples stamps instead (kv__tshard_sample).
 */
#include <stdlib.h>
#include <xxhash.h>

#include "index.h"

#define MIN_BUCKETS 64u

_Static_assert(sizeof(struct kv__blk) == 48, "a block entry is 48 bytes");
_Static_assert(sizeof(struct kv__srefs) == 12, "the shard array fits the inline slot");

uint64_t kv__id_hash(const kv_block_id *id)
{
    return XXH3_64bits(id->bytes, KV_BLOCK_ID_LEN);
}

int kv__table_init(struct kv__table *t, uint32_t nshards)
{
    t->n = nshards;
    t->sh = aligned_alloc(64, sizeof *t->sh * nshards);
    if (!t->sh)
        return KV_ENOMEM;
    for (uint32_t i = 0; i < nshards; i++) {
        struct kv__tshard *ts = &t->sh[i];
        memset(ts, 0, sizeof *ts);
        pthread_mutex_init(&ts->lock, NULL);
        struct kv__blk **b = calloc(MIN_BUCKETS, sizeof *b);
        __atomic_store_n(&ts->buckets, b, __ATOMIC_RELAXED);
        if (!ts->buckets) {
            t->n = i + 1;
            kv__table_destroy(t, NULL, NULL);
            return KV_ENOMEM;
        }
        __atomic_store_n(&ts->mask, MIN_BUCKETS - 1, __ATOMIC_RELAXED);
        ts->index_bytes = MIN_BUCKETS * sizeof *ts->buckets;
    }
    return KV_OK;
}

void kv__table_destroy(struct kv__table *t, void (*free_value)(void *, uint32_t, uint32_t),
                       void *ctx)
{
    if (!t->sh)
        return;
    for (uint32_t i = 0; i < t->n; i++) {
        struct kv__tshard *ts = &t->sh[i];
        for (uint32_t k = 0; ts->buckets && k <= ts->mask; k++) {
            for (struct kv__blk *b = ts->buckets[k], *next; b; b = next) {
                next = b->hnext;
                struct kv__sref *r = kv__blk_srefs(b);
                for (uint32_t j = 0; free_value && j < b->nshards; j++)
                    free_value(ctx, r[j].off64, r[j].len);
                kv__blk_free(b);
            }
        }
        free(ts->buckets);
        pthread_mutex_destroy(&ts->lock);
    }
    free(t->sh);
    t->sh = NULL;
}

struct kv__blk *kv__blk_find(struct kv__tshard *ts, uint64_t h, const kv_block_id *id)
{
    for (struct kv__blk *b = ts->buckets[h & ts->mask]; b; b = b->hnext)
        if (memcmp(b->id.bytes, id->bytes, KV_BLOCK_ID_LEN) == 0)
            return b;
    return NULL;
}

/* Binary search in the block's sorted shard list; NULL when absent. */
struct kv__sref *kv__blk_sref(struct kv__blk *b, uint32_t index)
{
    struct kv__sref *r = kv__blk_srefs(b);
    uint32_t lo = 0, hi = b->nshards;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (r[mid].index == index)
            return &r[mid];
        if (r[mid].index < index)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void grow(struct kv__tshard *ts)
{
    uint32_t n = (ts->mask + 1) * 2;
    struct kv__blk **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;                 /* longer chains, still correct */
    for (uint32_t i = 0; i <= ts->mask; i++) {
        for (struct kv__blk *b = ts->buckets[i], *next; b; b = next) {
            next = b->hnext;
            uint64_t h = kv__id_hash(&b->id);
            b->hnext = nb[h & (n - 1)];
            nb[h & (n - 1)] = b;
        }
    }
    ts->index_bytes += (uint64_t)(n - (ts->mask + 1)) * sizeof *nb;
    free(ts->buckets);
    __atomic_store_n(&ts->buckets, nb, __ATOMIC_RELAXED);
    __atomic_store_n(&ts->mask, n - 1, __ATOMIC_RELAXED);
}

/* Inserts a shard reference into a block's sorted list. */
static int srefs_insert(struct kv__tshard *ts, struct kv__blk *b, struct kv__sref r)
{
    if (b->nshards == 0) {
        b->s.one = r;
        b->nshards = 1;
        return KV_OK;
    }
    if (b->nshards == UINT16_MAX)
        return KV_ENOSPC;
    struct kv__sref *v;
    uint32_t cap;
    if (b->nshards == 1) {
        cap = 4;
        v = malloc(cap * sizeof *v);
        if (!v)
            return KV_ENOMEM;
        v[0] = b->s.one;
        ts->index_bytes += cap * sizeof *v;
    } else {
        v = b->s.many.v;
        cap = b->s.many.cap;
        if (b->nshards == cap) {
            struct kv__sref *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv)
                return KV_ENOMEM;
            ts->index_bytes += cap * sizeof *v;
            v = nv;
            cap *= 2;
        }
    }
    uint32_t i = b->nshards;
    while (i > 0 && v[i - 1].index > r.index) {
        v[i] = v[i - 1];
        i--;
    }
    v[i] = r;
    b->s.many.v = v;
    b->s.many.cap = cap;
    b->nshards++;
    return KV_OK;
}

int kv__blk_add(struct kv__tshard *ts, uint64_t h, const kv_block_id *id, uint32_t index,
                uint32_t off64, uint32_t len, uint64_t now, struct kv__blk **out)
{
    struct kv__blk *b = kv__blk_find(ts, h, id);
    bool fresh = b == NULL;
    if (fresh) {
        b = calloc(1, sizeof *b);
        if (!b)
            return KV_ENOMEM;
        b->id = *id;
        b->stamp = now;
    }
    int rc = srefs_insert(ts, b, (struct kv__sref){ off64, len, index });
    if (rc != KV_OK) {
        if (fresh)
            free(b);
        return rc;
    }
    ts->nshards++;
    if (fresh) {
        b->hnext = ts->buckets[h & ts->mask];
        ts->buckets[h & ts->mask] = b;
        ts->nblocks++;
        ts->index_bytes += sizeof *b;
        if (ts->nblocks > (uint64_t)ts->mask + 1)
            grow(ts);
    } else {
        kv__blk_touch(b, now);
    }
    if (out)
        *out = b;
    return KV_OK;
}

void kv__blk_unlink(struct kv__tshard *ts, uint64_t h, struct kv__blk *b)
{
    struct kv__blk **pp = &ts->buckets[h & ts->mask];
    while (*pp && *pp != b)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = b->hnext;
    b->hnext = NULL;
    ts->nblocks--;
    ts->nshards -= b->nshards;
    ts->index_bytes -= sizeof *b;
    if (b->nshards > 1)
        ts->index_bytes -= b->s.many.cap * sizeof(struct kv__sref);
}

void kv__blk_free(struct kv__blk *b)
{
    if (b->nshards > 1)
        free(b->s.many.v);
    free(b);
}

/*
 * How sampling works. The hand walks the buckets like a clock: each call
 * starts where the last stopped, so successive rounds see different parts
 * of the table, and a small shard is seen whole every time. Among the
 * entries it looks at it keeps the k oldest evictable ones by insertion into
 * a sorted array of at most k (k is small).
 */
size_t kv__tshard_sample(struct kv__tshard *ts, uint64_t now, unsigned budget,
                         struct kv__cand *out, size_t k)
{
    size_t kept = 0;
    uint32_t nb = ts->mask + 1, seen = 0, steps = 0;
    uint32_t at = ts->hand & ts->mask;
    while (seen < budget && seen < ts->nblocks && steps < nb) {
        for (struct kv__blk *b = ts->buckets[at]; b; b = b->hnext) {
            seen++;
            if (b->pins || b->stamp > now)
                continue;
            if (kept == k && out[k - 1].stamp <= b->stamp)
                continue;
            size_t i = kept < k ? kept++ : k - 1;
            while (i > 0 && out[i - 1].stamp > b->stamp) {
                out[i] = out[i - 1];
                i--;
            }
            out[i] = (struct kv__cand){ b->stamp, 0, b->id };
        }
        at = (at + 1) & ts->mask;
        steps++;
    }
    ts->hand = at;
    for (size_t i = 0; i < kept; i++)
        out[i].hash = kv__id_hash(&out[i].id);
    return kept;
}
