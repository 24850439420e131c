/*
 * index.c — the SSD tier's in-memory key index: (ns, id, index) -> (size,
 * coldness stamp, state). Lookups, contains and size answer from here and
 * never touch the disk.
 *
 * Key design choice: open addressing with linear probing and backward-shift
 * deletion, 48-byte slots stored inline, split into locked shards picked by
 * a hash of (ns, id) only. Inline slots keep the index near 43 bytes a shard
 * at the 0.75 load limit (no per-entry malloc, no pointers), and picking the
 * shard from the block alone puts all shards of a block under one lock, so
 * "remove every shard of a block" scans one shard instead of the table.
 */
#include <errno.h>
#include <stdlib.h>
#include <xxhash.h>

#include "ssd_int.h"

#define MIN_CAP 64u

static uint64_t hash_block(int ns, const uint8_t *id)
{
    return XXH3_64bits_withSeed(id, KV_BLOCK_ID_LEN, (uint64_t)ns + 1);
}

static uint64_t hash_slot(uint64_t hb, uint32_t index)
{
    uint64_t x = hb ^ ((uint64_t)index * 0x9e3779b97f4a7c15ull);
    x ^= x >> 29; x *= 0xbf58476d1ce4e5b9ull; x ^= x >> 32;
    return x;
}

static inline bool ent_is(const struct kv__sent *e, int ns, const uint8_t *id, uint32_t index)
{
    return e->state != KV__ENT_EMPTY && e->index == index && (int)e->ns == ns &&
           memcmp(e->id, id, KV_BLOCK_ID_LEN) == 0;
}

static struct kv__sishard *shard_of(struct kv__sindex *x, uint64_t hb)
{
    return &x->sh[(hb >> 40) & (x->nshards - 1)];
}

int kv__sidx_init(struct kv__sindex *x, uint32_t nshards)
{
    uint32_t n = 1;
    while (n < nshards)
        n <<= 1;
    memset(x, 0, sizeof *x);
    if (posix_memalign((void **)&x->sh, 64, n * sizeof *x->sh) != 0)
        return KV_ENOMEM;
    memset(x->sh, 0, n * sizeof *x->sh);
    for (uint32_t i = 0; i < n; i++)
        pthread_mutex_init(&x->sh[i].mu, NULL);
    x->nshards = n;
    return KV_OK;
}

void kv__sidx_destroy(struct kv__sindex *x)
{
    if (!x->sh)
        return;
    for (uint32_t i = 0; i < x->nshards; i++) {
        pthread_mutex_destroy(&x->sh[i].mu);
        free(x->sh[i].tab);
    }
    free(x->sh);
    x->sh = NULL;
}

/* Finds the slot of a key, or the empty slot where it would go. */
static uint32_t probe(const struct kv__sishard *s, uint64_t h, int ns, const uint8_t *id,
                      uint32_t index)
{
    uint32_t mask = s->cap - 1, i = (uint32_t)h & mask;
    while (s->tab[i].state != KV__ENT_EMPTY && !ent_is(&s->tab[i], ns, id, index))
        i = (i + 1) & mask;
    return i;
}

static int grow(struct kv__sishard *s)
{
    uint32_t ncap = s->cap ? s->cap * 2 : MIN_CAP;
    struct kv__sent *nt = calloc(ncap, sizeof *nt);
    if (!nt)
        return KV_ENOMEM;
    struct kv__sent *old = s->tab;
    uint32_t ocap = s->cap;
    s->tab = nt;
    s->cap = ncap;
    for (uint32_t i = 0; i < ocap; i++) {
        const struct kv__sent *e = &old[i];
        if (e->state == KV__ENT_EMPTY)
            continue;
        uint64_t h = hash_slot(hash_block((int)e->ns, e->id), e->index);
        s->tab[probe(s, h, (int)e->ns, e->id, e->index)] = *e;
    }
    free(old);
    return KV_OK;
}

static void account(struct kv__sindex *x, const struct kv__sent *e, int sign)
{
    if (sign > 0) {
        atomic_fetch_add(&x->entries, 1);
        atomic_fetch_add(&x->bytes, e->size);
        if (e->index == 0 && e->ns == KV_NS_BLOCK)
            atomic_fetch_add(&x->blocks, 1);
    } else {
        atomic_fetch_sub(&x->entries, 1);
        atomic_fetch_sub(&x->bytes, e->size);
        if (e->index == 0 && e->ns == KV_NS_BLOCK)
            atomic_fetch_sub(&x->blocks, 1);
    }
}

int kv__sidx_insert(struct kv__sindex *x, const struct kv__sent *e, struct kv__sent *old)
{
    uint64_t hb = hash_block((int)e->ns, e->id), h = hash_slot(hb, e->index);
    struct kv__sishard *s = shard_of(x, hb);
    int rc = 1;
    pthread_mutex_lock(&s->mu);
    if ((uint64_t)(s->n + 1) * 4 > (uint64_t)s->cap * 3 && grow(s) != KV_OK) {
        rc = KV_ENOMEM;
        goto out;
    }
    uint32_t i = probe(s, h, (int)e->ns, e->id, e->index);
    if (s->tab[i].state != KV__ENT_EMPTY) {
        if (old)
            *old = s->tab[i];
        rc = 0;
        goto out;
    }
    s->tab[i] = *e;
    s->n++;
    account(x, e, +1);
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

bool kv__sidx_get(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index,
                  struct kv__sent *out)
{
    uint64_t hb = hash_block(ns, id), h = hash_slot(hb, index);
    struct kv__sishard *s = shard_of(x, hb);
    bool found = false;
    pthread_mutex_lock(&s->mu);
    if (s->cap) {
        uint32_t i = probe(s, h, ns, id, index);
        if (s->tab[i].state != KV__ENT_EMPTY) {
            if (out)
                *out = s->tab[i];
            found = true;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

void kv__sidx_touch(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, uint64_t stamp)
{
    uint64_t hb = hash_block(ns, id), h = hash_slot(hb, index);
    struct kv__sishard *s = shard_of(x, hb);
    pthread_mutex_lock(&s->mu);
    if (s->cap) {
        uint32_t i = probe(s, h, ns, id, index);
        if (s->tab[i].state != KV__ENT_EMPTY)
            s->tab[i].stamp = stamp;
    }
    pthread_mutex_unlock(&s->mu);
}

/* The slot of (ns, id, index) when it is in state 'from' at 'at'
 * (UINT64_MAX: anywhere), else NULL. Shard lock held. */
static struct kv__sent *find_in(struct kv__sishard *s, uint64_t h, int ns, const uint8_t *id,
                                uint32_t index, int from, uint64_t at)
{
    if (!s->cap)
        return NULL;
    struct kv__sent *t = &s->tab[probe(s, h, ns, id, index)];
    if (t->state != (unsigned)from || (at != UINT64_MAX && t->loc != at))
        return NULL;
    return t;
}

bool kv__sidx_store(struct kv__sindex *x, const struct kv__sent *e, int from, uint64_t token)
{
    uint64_t hb = hash_block((int)e->ns, e->id), h = hash_slot(hb, e->index);
    struct kv__sishard *s = shard_of(x, hb);
    pthread_mutex_lock(&s->mu);
    struct kv__sent *t = find_in(s, h, (int)e->ns, e->id, e->index, from, token);
    if (t) {
        account(x, t, -1);
        t->size = e->size;
        t->stamp = e->stamp;
        t->loc = e->loc;
        t->slen = e->slen;
        t->sum32 = e->sum32;
        t->state = KV__ENT_STORED;
        account(x, t, +1);
    }
    pthread_mutex_unlock(&s->mu);
    return t != NULL;
}

bool kv__sidx_swap(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, int from,
                   uint64_t at, int to, uint64_t token, struct kv__sent *old)
{
    uint64_t hb = hash_block(ns, id), h = hash_slot(hb, index);
    struct kv__sishard *s = shard_of(x, hb);
    pthread_mutex_lock(&s->mu);
    struct kv__sent *t = find_in(s, h, ns, id, index, from, at);
    if (t) {
        if (old)
            *old = *t;
        t->state = (unsigned)to;
        t->loc = token;
    }
    pthread_mutex_unlock(&s->mu);
    return t != NULL;
}

/* Backward-shift deletion: pulls later members of the probe run into the
 * hole so that lookups never need tombstones. Shard lock held. */
static void delete_slot(struct kv__sishard *s, uint32_t i)
{
    uint32_t mask = s->cap - 1, j = i;
    for (;;) {
        s->tab[i].state = KV__ENT_EMPTY;
        for (;;) {
            j = (j + 1) & mask;
            if (s->tab[j].state == KV__ENT_EMPTY)
                return;
            const struct kv__sent *e = &s->tab[j];
            uint32_t home = (uint32_t)hash_slot(hash_block((int)e->ns, e->id), e->index) & mask;
            /* e may move to i when its home is not cyclically in (i, j]. */
            bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
            if (!stays)
                break;
        }
        s->tab[i] = s->tab[j];
        i = j;
    }
}

bool kv__sidx_del_at(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, int state,
                     uint64_t at)
{
    uint64_t hb = hash_block(ns, id), h = hash_slot(hb, index);
    struct kv__sishard *s = shard_of(x, hb);
    pthread_mutex_lock(&s->mu);
    struct kv__sent *t = find_in(s, h, ns, id, index, state, at);
    if (t) {
        struct kv__sent e = *t;
        delete_slot(s, (uint32_t)(t - s->tab));
        s->n--;
        account(x, &e, -1);
    }
    pthread_mutex_unlock(&s->mu);
    return t != NULL;
}

size_t kv__sidx_block_shards(struct kv__sindex *x, int ns, const uint8_t *id, unsigned mask,
                             uint32_t *idx, size_t cap)
{
    uint64_t hb = hash_block(ns, id);
    struct kv__sishard *s = shard_of(x, hb);
    size_t found = 0;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->cap; i++) {
        const struct kv__sent *e = &s->tab[i];
        if (e->state != KV__ENT_EMPTY && (int)e->ns == ns &&
            memcmp(e->id, id, KV_BLOCK_ID_LEN) == 0 && (mask & (1u << e->state))) {
            if (found < cap)
                idx[found] = e->index;
            found++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

ssize_t kv__sidx_snapshot(struct kv__sindex *x, unsigned mask, struct kv__sent **out)
{
    size_t cap = atomic_load(&x->entries) + 1024, n = 0;
    struct kv__sent *a = malloc(cap * sizeof *a);
    if (!a)
        return KV_ENOMEM;
    for (uint32_t k = 0; k < x->nshards; k++) {
        struct kv__sishard *s = &x->sh[k];
        pthread_mutex_lock(&s->mu);
        if (n + s->n > cap) {
            size_t ncap = (n + s->n) * 2;
            struct kv__sent *na = realloc(a, ncap * sizeof *a);
            if (!na) {
                pthread_mutex_unlock(&s->mu);
                free(a);
                return KV_ENOMEM;
            }
            a = na;
            cap = ncap;
        }
        for (uint32_t i = 0; i < s->cap; i++)
            if (s->tab[i].state != KV__ENT_EMPTY && (mask & (1u << s->tab[i].state)))
                a[n++] = s->tab[i];
        pthread_mutex_unlock(&s->mu);
    }
    *out = a;
    return (ssize_t)n;
}

uint64_t kv__sidx_mem(struct kv__sindex *x)
{
    uint64_t m = (uint64_t)x->nshards * sizeof *x->sh;
    for (uint32_t k = 0; k < x->nshards; k++) {
        pthread_mutex_lock(&x->sh[k].mu);
        m += (uint64_t)x->sh[k].cap * sizeof(struct kv__sent);
        pthread_mutex_unlock(&x->sh[k].mu);
    }
    return m;
}
