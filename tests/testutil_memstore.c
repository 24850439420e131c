/*
 * testutil_memstore.c — a heap-backed kv__backend: a chained hash table of
 * malloc'd values under one mutex, with a byte capacity. Built into the test
 * runner only, never into the library.
 *
 * It is the store the transport and cluster tests serve (so the network
 * layer can be tested without the engine) and a reference for the backend
 * contract: pin keeps a value alive past a replacing commit (refcounts),
 * reserve hands out memory that commit adopts without a copy, and a commit
 * of a shard already present keeps the old copy and still succeeds.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "testutil_int.h"
#include "net/transport.h"

struct mval {
    struct mval *next;
    int ns;
    kv_block_id id;
    uint32_t index;
    unsigned refs;          /* 1 for the table, +1 per pin */
    uint64_t len;
    uint64_t seq;           /* commit order: scan's "last use" */
    uint8_t *data;
};

#define MS_BUCKETS 4096

struct memstore {
    struct kv__backend be;  /* first: the backend pointer is the store */
    pthread_mutex_t lock;
    uint64_t cap, used;     /* used counts stored values and reservations */
    uint64_t seq;
    struct mval *b[MS_BUCKETS];
};

static unsigned bucket(int ns, const kv_block_id *id, uint32_t index)
{
    uint32_t h = 2166136261u ^ (uint32_t)ns;
    for (int i = 0; i < KV_BLOCK_ID_LEN; i++)
        h = (h ^ id->bytes[i]) * 16777619u;
    h = (h ^ index) * 16777619u;
    return h % MS_BUCKETS;
}

static struct mval *find(struct memstore *m, int ns, const kv_block_id *id, uint32_t index)
{
    for (struct mval *v = m->b[bucket(ns, id, index)]; v; v = v->next)
        if (v->ns == ns && v->index == index && memcmp(&v->id, id, sizeof *id) == 0)
            return v;
    return NULL;
}

static void put_ref(struct memstore *m, struct mval *v)
{
    if (--v->refs == 0) {
        m->used -= v->len;
        free(v->data);
        free(v);
    }
}

static int ms_lookup(void *c, int ns, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    struct memstore *m = c;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < n; i++)
        hit[i] = find(m, ns, &ids[i], 0) != NULL;
    pthread_mutex_unlock(&m->lock);
    return KV_OK;
}

static int ms_size(void *c, int ns, const kv_block_id *id, uint32_t index, uint64_t *len)
{
    struct memstore *m = c;
    pthread_mutex_lock(&m->lock);
    struct mval *v = find(m, ns, id, index);
    if (v)
        *len = v->len;
    pthread_mutex_unlock(&m->lock);
    return v ? KV_OK : KV_ENOTFOUND;
}

static int ms_pin(void *c, int ns, const kv_block_id *id, uint32_t index, const void **data,
                  uint64_t *len, kv__pin *pin)
{
    struct memstore *m = c;
    pthread_mutex_lock(&m->lock);
    struct mval *v = find(m, ns, id, index);
    if (v) {
        v->refs++;
        *data = v->data;
        *len = v->len;
        pin->blk = v;
    }
    pthread_mutex_unlock(&m->lock);
    return v ? KV_OK : KV_ENOTFOUND;
}

static void ms_unpin(void *c, kv__pin *pin)
{
    struct memstore *m = c;
    pthread_mutex_lock(&m->lock);
    put_ref(m, pin->blk);
    pthread_mutex_unlock(&m->lock);
}

static int ms_load(void *c, int ns, const kv_block_id *id, uint32_t index,
                   const kv_iov *iov, uint32_t iovcnt)
{
    const void *d;
    uint64_t len;
    kv__pin p;
    int rc = ms_pin(c, ns, id, index, &d, &len, &p);
    if (rc)
        return rc;
    if (kv__iov_len(iov, iovcnt) != len)
        rc = KV_EINVAL;
    else
        for (size_t i = 0, off = 0; i < iovcnt; off += iov[i].len, i++)
            memcpy(iov[i].base, (const uint8_t *)d + off, iov[i].len);
    ms_unpin(c, &p);
    return rc;
}

static int ms_reserve(void *c, uint64_t len, kv__resv *r)
{
    struct memstore *m = c;
    pthread_mutex_lock(&m->lock);
    int ok = !m->cap || m->used + len <= m->cap;
    if (ok)
        m->used += len;
    pthread_mutex_unlock(&m->lock);
    if (!ok)
        return KV_ENOSPC;
    r->data = malloc(len ? len : 1);
    r->len = len;
    if (!r->data) {
        pthread_mutex_lock(&m->lock);
        m->used -= len;
        pthread_mutex_unlock(&m->lock);
        return KV_ENOMEM;
    }
    return KV_OK;
}

static void ms_abort(void *c, kv__resv *r)
{
    struct memstore *m = c;
    free(r->data);
    pthread_mutex_lock(&m->lock);
    m->used -= r->len;
    pthread_mutex_unlock(&m->lock);
    r->data = NULL;
}

static int ms_commit(void *c, kv__resv *r, int ns, const kv_block_id *id, uint32_t index)
{
    struct memstore *m = c;
    struct mval *v = calloc(1, sizeof *v);
    if (!v) {
        ms_abort(c, r);
        return KV_ENOMEM;
    }
    pthread_mutex_lock(&m->lock);
    if (find(m, ns, id, index)) {   /* present: keep the old copy */
        pthread_mutex_unlock(&m->lock);
        free(v);
        ms_abort(c, r);
        return KV_OK;
    }
    v->ns = ns;
    v->id = *id;
    v->index = index;
    v->refs = 1;
    v->len = r->len;
    v->data = r->data;
    v->seq = ++m->seq;
    unsigned bk = bucket(ns, id, index);
    v->next = m->b[bk];
    m->b[bk] = v;
    pthread_mutex_unlock(&m->lock);
    r->data = NULL;
    return KV_OK;
}

static int ms_scan(void *c, int ns, kv__scan_cb cb, void *arg)
{
    struct memstore *m = c;
    int stop = 0;
    pthread_mutex_lock(&m->lock);
    for (unsigned i = 0; i < MS_BUCKETS && !stop; i++)
        for (struct mval *v = m->b[i]; v && !stop; v = v->next)
            if (v->ns == ns)
                stop = cb(arg, &v->id, v->index, v->len, v->seq);
    pthread_mutex_unlock(&m->lock);
    return KV_OK;
}

static int ms_remove(void *c, int ns, const kv_block_id *id, uint32_t index)
{
    struct memstore *m = c;
    pthread_mutex_lock(&m->lock);
    struct mval **pp = &m->b[bucket(ns, id, index)];
    while (*pp && !((*pp)->ns == ns && (*pp)->index == index && memcmp(&(*pp)->id, id, sizeof *id) == 0))
        pp = &(*pp)->next;
    struct mval *v = *pp;
    if (v) {
        *pp = v->next;
        put_ref(m, v);   /* a pinned value goes with its last unpin */
    }
    pthread_mutex_unlock(&m->lock);
    return v ? KV_OK : KV_ENOTFOUND;
}

/* A plain key's stored record is engine/kv.c's [klen][key][value]: the
 * cluster tests' values come from engines, so the heap store can answer
 * kv_remove_prefix's questions the way the engine does. */
static int ms_rec_match(void *c, const void *rec, uint64_t len, uint32_t plen,
                        const kv_block_id *hash)
{
    const uint8_t *r = rec;
    (void)c;
    if (len < 1 || r[0] == 0 || len < 1u + r[0])
        return KV_EINVAL;
    if (r[0] < plen)
        return 0;
    XXH128_hash_t h = XXH3_128bits(r + 1, plen);
    kv_block_id got;
    memcpy(got.bytes, &h.low64, 8);
    memcpy(got.bytes + 8, &h.high64, 8);
    return memcmp(&got, hash, sizeof got) == 0;
}

static int ms_match(void *c, const kv_block_id *id, uint32_t plen, const kv_block_id *hash)
{
    struct memstore *m = c;
    pthread_mutex_lock(&m->lock);
    struct mval *v = find(m, KV_NS_KEY, id, 0);
    int r = v ? ms_rec_match(c, v->data, v->len, plen, hash) : KV_ENOTFOUND;
    pthread_mutex_unlock(&m->lock);
    return r < 0 && v ? 0 : r;
}

struct kv__backend *kv__memstore_new(uint64_t cap_bytes)
{
    struct memstore *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    pthread_mutex_init(&m->lock, NULL);
    m->cap = cap_bytes;
    m->be = (struct kv__backend){
        .ctx = m, .lookup = ms_lookup, .size = ms_size, .load = ms_load,
        .pin = ms_pin, .unpin = ms_unpin, .reserve = ms_reserve,
        .commit = ms_commit, .abort = ms_abort, .scan = ms_scan, .remove = ms_remove,
        .match = ms_match, .rec_match = ms_rec_match,
    };
    return &m->be;
}

void kv__memstore_free(struct kv__backend *b)
{
    if (!b)
        return;
    struct memstore *m = (struct memstore *)b;
    for (unsigned i = 0; i < MS_BUCKETS; i++)
        for (struct mval *v = m->b[i], *nx; v; v = nx) {
            nx = v->next;
            free(v->data);
            free(v);
        }
    pthread_mutex_destroy(&m->lock);
    free(m);
}
