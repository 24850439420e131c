/*
 * tomb.c — the tombstones of tomb.h.
 *
 * Key design choice: single keys' tombstones live twice, in an open-
 * addressed table keyed by id (the newest time of each key, for the
 * question a copy asks) and in a ring in the order they were left (for
 * forgetting the oldest first, by age or for room). Times only grow (a
 * tombstone gets max(now, the last one)), so the ring's head is always
 * the oldest; a ring entry whose key was removed again or written since
 * finds a newer time or none in the table, and only moves the horizon
 * when it is forgotten. Prefixes are few and scanned; "every key" is one
 * time.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tomb.h"

struct tkey {
    kv_block_id id;
    uint64_t t;                         /* 0: an empty slot */
};

struct tprefix {
    kv_block_id hash;
    uint32_t plen;
    uint64_t t;
};

struct kv__tomb {
    pthread_mutex_t lock;
    uint64_t ttl_ms;
    uint64_t horizon;                   /* every remove after this is known */
    uint64_t last;                      /* the newest time given out */
    /* single keys: the table (nslots, a power of two, twice the ring) */
    struct tkey *slot;
    size_t nslots, nkeys;
    /* and the ring, oldest at head */
    struct tkey *ring;
    size_t cap, head, count;
    /* every key, and prefixes */
    uint64_t all;
    struct tprefix prefix[KV__TOMB_PREFIXES];
    size_t nprefix;
};

int kv__tomb_new(size_t cap, uint64_t ttl_ms, uint64_t now_ms, struct kv__tomb **out)
{
    *out = NULL;
    size_t c = 16;
    while (c < cap)
        c *= 2;
    struct kv__tomb *t = calloc(1, sizeof *t);
    if (!t)
        return KV_ENOMEM;
    /* calloc: pages a quiet member never touches are never backed */
    t->slot = calloc(2 * c, sizeof *t->slot);
    t->ring = calloc(c, sizeof *t->ring);
    if (!t->slot || !t->ring) {
        free(t->slot);
        free(t->ring);
        free(t);
        return KV_ENOMEM;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->nslots = 2 * c;
    t->cap = c;
    t->ttl_ms = ttl_ms;
    t->horizon = t->last = now_ms;
    *out = t;
    return KV_OK;
}

void kv__tomb_free(struct kv__tomb *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t->slot);
    free(t->ring);
    free(t);
}

void kv__tomb_lock(struct kv__tomb *t) { pthread_mutex_lock(&t->lock); }
void kv__tomb_unlock(struct kv__tomb *t) { pthread_mutex_unlock(&t->lock); }

/* ---- the table of single keys (linear probing) ---------------------------- */

static size_t home(const struct kv__tomb *t, const kv_block_id *id)
{
    uint64_t h;
    memcpy(&h, id->bytes, sizeof h);    /* ids are hashes already */
    return (size_t)h & (t->nslots - 1);
}

/* id's slot, or the empty slot where it would go. */
static size_t probe(const struct kv__tomb *t, const kv_block_id *id)
{
    size_t i = home(t, id);
    while (t->slot[i].t && memcmp(&t->slot[i].id, id, sizeof *id) != 0)
        i = (i + 1) & (t->nslots - 1);
    return i;
}

/* Empties slot i, moving back the entries after it that probing would no
 * longer reach (no deleted markers: the table never fills up with them). */
static void unslot(struct kv__tomb *t, size_t i)
{
    size_t mask = t->nslots - 1;
    t->slot[i].t = 0;
    t->nkeys--;
    for (size_t j = (i + 1) & mask; t->slot[j].t; j = (j + 1) & mask) {
        size_t h = home(t, &t->slot[j].id);
        /* j's entry may move to i when i lies on its way from h to j */
        if (((j - h) & mask) >= ((j - i) & mask)) {
            t->slot[i] = t->slot[j];
            t->slot[j].t = 0;
            i = j;
        }
    }
}

/* Forgets the ring's oldest entry: the horizon passes it. */
static void forget_oldest(struct kv__tomb *t)
{
    struct tkey *e = &t->ring[t->head];
    if (e->t > t->horizon)
        t->horizon = e->t;
    size_t i = probe(t, &e->id);
    if (t->slot[i].t == e->t)           /* not removed again since */
        unslot(t, i);
    t->head = (t->head + 1) % t->cap;
    t->count--;
}

static void forget_prefix(struct kv__tomb *t, size_t i)
{
    if (t->prefix[i].t > t->horizon)
        t->horizon = t->prefix[i].t;
    t->prefix[i] = t->prefix[--t->nprefix];
}

/* Forgets what is ttl_ms old at now. */
static void expire(struct kv__tomb *t, uint64_t now)
{
    while (t->count && t->ring[t->head].t + t->ttl_ms <= now)
        forget_oldest(t);
    for (size_t i = 0; i < t->nprefix;)
        if (t->prefix[i].t + t->ttl_ms <= now)
            forget_prefix(t, i);
        else
            i++;
    if (t->all && t->all + t->ttl_ms <= now) {
        if (t->all > t->horizon)
            t->horizon = t->all;
        t->all = 0;
    }
}

/* The time of a tombstone left at now: never older than the last one, so
 * that the ring stays in order when the clock steps back. */
static uint64_t stamp(struct kv__tomb *t, uint64_t now)
{
    if (now > t->last)
        t->last = now;
    return t->last ? t->last : (t->last = 1);
}

void kv__tomb_remove(struct kv__tomb *t, const kv_block_id *id, uint64_t now_ms)
{
    pthread_mutex_lock(&t->lock);
    expire(t, now_ms);
    uint64_t at = stamp(t, now_ms);
    if (t->count == t->cap)
        forget_oldest(t);
    size_t i = probe(t, id);
    if (!t->slot[i].t) {
        t->slot[i].id = *id;
        t->nkeys++;
    }
    t->slot[i].t = at;
    t->ring[(t->head + t->count++) % t->cap] = (struct tkey){ .id = *id, .t = at };
    pthread_mutex_unlock(&t->lock);
}

void kv__tomb_clear(struct kv__tomb *t, uint32_t plen, const kv_block_id *hash, uint64_t now_ms)
{
    pthread_mutex_lock(&t->lock);
    expire(t, now_ms);
    uint64_t at = stamp(t, now_ms);
    if (plen == 0) {
        t->all = at;
        pthread_mutex_unlock(&t->lock);
        return;
    }
    size_t i = 0;
    while (i < t->nprefix &&
           !(t->prefix[i].plen == plen && memcmp(&t->prefix[i].hash, hash, sizeof *hash) == 0))
        i++;
    if (i == t->nprefix && t->nprefix == KV__TOMB_PREFIXES) {
        size_t old = 0;
        for (size_t j = 1; j < t->nprefix; j++)
            if (t->prefix[j].t < t->prefix[old].t)
                old = j;
        forget_prefix(t, old);
        i = t->nprefix;
    }
    if (i == t->nprefix)
        t->nprefix++;
    t->prefix[i] = (struct tprefix){ .hash = *hash, .plen = plen, .t = at };
    pthread_mutex_unlock(&t->lock);
}

void kv__tomb_put(struct kv__tomb *t, const kv_block_id *id)
{
    pthread_mutex_lock(&t->lock);
    if (t->nkeys) {
        size_t i = probe(t, id);
        if (t->slot[i].t)
            unslot(t, i);   /* its ring entry stays, and finds nothing */
    }
    pthread_mutex_unlock(&t->lock);
}

int kv__tomb_do_admit(struct kv__tomb *t, const kv_block_id *id, uint64_t stamp_ms,
                      kv__tomb_match_fn match, void *arg, uint64_t now_ms)
{
    expire(t, now_ms);
    /* "Not older than the stamp, within the margin": t + margin >= stamp. */
    uint64_t m = KV__TOMB_SKEW_MS;
    if (stamp_ms <= t->horizon + m || (t->all && stamp_ms <= t->all + m))
        return KV_EBUSY;
    if (t->nkeys) {
        size_t i = probe(t, id);
        if (t->slot[i].t && stamp_ms <= t->slot[i].t + m)
            return KV_EBUSY;
    }
    for (size_t i = 0; i < t->nprefix; i++) {
        const struct tprefix *p = &t->prefix[i];
        if (stamp_ms > p->t + m)
            continue;
        if (!match || match(arg, p->plen, &p->hash) != 0)
            return KV_EBUSY;
    }
    return KV_OK;
}

int kv__tomb_admit(struct kv__tomb *t, const kv_block_id *id, uint64_t stamp_ms,
                   kv__tomb_match_fn match, void *arg, uint64_t now_ms)
{
    pthread_mutex_lock(&t->lock);
    int rc = kv__tomb_do_admit(t, id, stamp_ms, match, arg, now_ms);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void kv__tomb_stats(struct kv__tomb *t, uint64_t now_ms, struct kv__tomb_stats *out)
{
    pthread_mutex_lock(&t->lock);
    expire(t, now_ms);
    *out = (struct kv__tomb_stats){ .keys = t->nkeys, .prefixes = t->nprefix, .all = t->all != 0,
                                    .horizon_ms = t->horizon };
    pthread_mutex_unlock(&t->lock);
}
