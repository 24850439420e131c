/*
 * kv.c — plain keys: put / get / exists / remove.
 *
 * Plain keys live in their own namespace (KV_NS_KEY), so they share the
 * DRAM segment, eviction and the tiers below with block shards but can
 * never collide with a block id. A key is indexed by its 128-bit XXH3 hash, and
 * the stored value carries the key itself ([klen][key][value]) so that a
 * read checks it: a hash collision reads as a miss, never as another key's
 * value. Unlike a dump, a put replaces: engine/store.c drops the older copy
 * from every tier (kv__store_put; a DRAM entry a reader has pinned is freed
 * by that reader's unpin).
 *
 * In a cluster, plain keys are placed on owners like blocks (net/cluster.h
 * says what a replace means across replicas): a put is a dump that
 * replaces on every owner, a remove asks every owner, and this node's own
 * share goes through kv__local_remove and the same serving policy as a
 * peer's (net/serve.c).
 *
 * An engine attached to another process's store (engine/host.c) sends each
 * call to that process whole (ROUTE below), which runs it as its own.
 *
 * kv_remove_prefix cannot look keys up by prefix (the index holds hashes),
 * so every holder walks its plain keys and asks each record for its key
 * (kv__key_match); the prefix goes to owners as its hash, which fits the
 * one batch item a clear already is.
 */
#include <stdlib.h>
#include <xxhash.h>

#include "dram.h"
#include "host.h"
#include "net/cluster.h"
#include "net/serve.h"
#include "net/shm.h"
#include "store.h"

static int check_key(kv_engine *e, const void *key, size_t klen)
{
    if (!e || !key || klen == 0 || klen > KV_KEY_MAX)
        return KV_EINVAL;
    return KV_OK;
}

static kv_block_id key_id(const void *key, size_t klen)
{
    XXH128_hash_t h = XXH3_128bits(key, klen);
    kv_block_id id;
    memcpy(id.bytes, &h.low64, 8);
    memcpy(id.bytes + 8, &h.high64, 8);
    return id;
}

static bool same_key(const uint8_t *stored, uint64_t slen, const void *key, size_t klen)
{
    return slen >= 1 + klen && stored[0] == klen && memcmp(stored + 1, key, klen) == 0;
}

/* Copies the value out of a stored [klen][key][value] record, wherever it
 * was read from: KV_ENOTFOUND for another key's record (a hash collision),
 * KV_ENOBUFS with *vlen set when cap is too small (buf untouched). */
static int copy_value(const uint8_t *stored, uint64_t slen, const void *key, size_t klen,
                      void *buf, size_t cap, size_t *vlen)
{
    if (!same_key(stored, slen, key, klen))
        return KV_ENOTFOUND;
    *vlen = slen - 1 - klen;
    if (*vlen > cap)
        return KV_ENOBUFS;
    if (*vlen)
        kv__copy(buf, stored + 1 + klen, *vlen);
    return KV_OK;
}

/* ---- this node's tiers ---------------------------------------------------- */

/* The stored form of a put: [klen][key][value] (see the top of this file). */
struct rec {
    uint8_t klen8;
    kv_iov iov[3];
    kv_block_id id;
};

static int make_rec(kv_engine *e, const void *key, size_t klen, const void *val, size_t vlen,
                    struct rec *r)
{
    if (check_key(e, key, klen) != KV_OK || (!val && vlen > 0) || vlen > KV_VALUE_MAX - 1 - klen)
        return KV_EINVAL;
    r->klen8 = (uint8_t)klen;
    r->iov[0] = (kv_iov){ &r->klen8, 1 };
    r->iov[1] = (kv_iov){ (void *)key, klen };
    r->iov[2] = (kv_iov){ (void *)val, vlen };
    r->id = key_id(key, klen);
    return KV_OK;
}

/* The stored record of id from the tiers below DRAM, or from its owners in
 * a cluster, in *out (malloc'd, *len bytes); KV_ENOTFOUND. */
static int fetch_rec(kv_engine *e, const kv_block_id *id, uint8_t **out, uint64_t *len)
{
    *out = NULL;
    for (int tries = 0; tries < 3; tries++) {
        int rc = KV_OK;
        if (e->cluster)
            rc = kv__cluster_size(e->cluster, KV_NS_KEY, id, 0, len);
        else if (kv__store_below_size(e, KV_NS_KEY, id, 0, len) != KV_OK)
            rc = KV_ENOTFOUND;
        if (rc != KV_OK)
            return rc;
        uint8_t *tmp = malloc(*len ? *len : 1);
        if (!tmp)
            return KV_ENOMEM;
        kv_iov iov = { tmp, *len };
        if (e->cluster) {
            kv_shard sh = { *id, 0, &iov, 1 };
            int res;
            rc = kv__cluster_load(e->cluster, KV_NS_KEY, &sh, 1, &res);
            rc = rc != KV_OK ? rc : res;
        } else {
            rc = kv__store_below_read(e, KV_NS_KEY, id, 0, &iov, 1);
        }
        if (rc == KV_OK) {
            *out = tmp;
            return KV_OK;
        }
        free(tmp);
        if (rc != KV_EINVAL)
            return rc;
        /* EINVAL: replaced by a value of another length since the size was
         * read. Ask again. */
    }
    return KV_EBUSY;
}

/* kv_get after its checks. */
static int get_one(kv_engine *e, const void *key, size_t klen, void *buf, size_t cap,
                   size_t *vlen)
{
    kv_block_id id = key_id(key, klen);
    const void *data;
    uint64_t len;
    kv__pin pin;
    int rc;
    if (!e->cluster && kv__local_pin(e, KV_NS_KEY, &id, 0, &data, &len, &pin) == KV_OK) {
        rc = copy_value(data, len, key, klen, buf, cap, vlen);
        kv__local_unpin(e, &pin);
        atomic_fetch_add(rc == KV_OK ? &e->ct.hits_dram : &e->ct.misses, rc != KV_ENOBUFS);
        return rc;
    }
    uint8_t *tmp;
    rc = fetch_rec(e, &id, &tmp, &len);
    if (rc == KV_OK)
        rc = copy_value(tmp, len, key, klen, buf, cap, vlen);
    free(tmp);
    if (!e->cluster && rc != KV_ENOBUFS)
        atomic_fetch_add(rc == KV_OK ? &e->ct.hits_ssd : &e->ct.misses, 1);
    return rc;
}

static int exists_one(kv_engine *e, const void *key, size_t klen)
{
    kv_block_id id = key_id(key, klen);
    const void *data;
    uint64_t len;
    kv__pin pin;
    if (e->cluster) {
        uint8_t hit = 0;
        int rc = kv__cluster_lookup(e->cluster, KV_NS_KEY, &id, 1, &hit);
        return rc != KV_OK ? rc : hit;
    }
    if (kv__local_pin(e, KV_NS_KEY, &id, 0, &data, &len, &pin) == KV_OK) {
        bool same = same_key(data, len, key, klen);
        kv__local_unpin(e, &pin);
        return same;
    }
    return kv__store_below_contains(e, KV_NS_KEY, &id, 0);
}

/* Whether a stored [klen][key][value] record's key begins with plen bytes
 * hashing to hash (the prefix travels as its hash: see kv_remove_prefix). */
static int rec_match(const uint8_t *stored, uint64_t slen, uint32_t plen, const kv_block_id *hash)
{
    if (slen < 1 || stored[0] < plen || slen < 1u + stored[0])
        return 0;
    kv_block_id h = key_id(stored + 1, plen);
    return memcmp(h.bytes, hash->bytes, KV_BLOCK_ID_LEN) == 0;
}

int kv__key_rec_match(const void *rec, uint64_t len, uint32_t plen, const kv_block_id *hash)
{
    const uint8_t *r = rec;
    if (len < 1 || r[0] == 0 || len < 1u + r[0])
        return KV_EINVAL;
    return rec_match(r, len, plen, hash);
}

int kv__key_match(kv_engine *e, const kv_block_id *id, uint32_t plen, const kv_block_id *hash)
{
    const void *data;
    uint64_t len;
    kv__pin pin;
    if (plen == 0 || plen > KV_KEY_MAX)
        return plen == 0;   /* every key, or none (no key is that long) */
    if (e->dram && kv__dram_peek(e->dram, KV_NS_KEY, id, 0, &data, &len, &pin) == KV_OK) {
        int m = rec_match(data, len, plen, hash);
        kv__local_unpin(e, &pin);
        return m;
    }
    /* Below DRAM the key is inside the stored value: read it whole (a tier
     * reads a value whole or not at all), unless it is too short to hold
     * the prefix. */
    for (int tries = 0; tries < 3; tries++) {
        if (kv__store_below_size(e, KV_NS_KEY, id, 0, &len) != KV_OK)
            return KV_ENOTFOUND;
        if (len < 1u + plen)
            return 0;
        uint8_t *tmp = malloc(len);
        if (!tmp)
            return KV_ENOMEM;
        kv_iov iov = { tmp, len };
        int rc = kv__store_below_read(e, KV_NS_KEY, id, 0, &iov, 1);
        int m = rc == KV_OK ? rec_match(tmp, len, plen, hash) : rc;
        free(tmp);
        if (rc != KV_EINVAL)
            return m;
        /* EINVAL: replaced by a value of another length since the size
         * was read. Ask again. */
    }
    return KV_EBUSY;
}

/* ---- the public calls ------------------------------------------------------ */

/* Every public call here runs through the host store's server when e is
 * attached (host.h). */
#define ROUTE KV__HOST_ROUTE

KV__EXPORT int kv_put(kv_engine *e, const void *key, size_t klen, const void *val, size_t vlen)
{
    struct rec r;
    int rc = make_rec(e, key, klen, val, vlen, &r);
    if (rc != KV_OK)
        return rc;
    ROUTE(e, kv__shm_put(hc, key, klen, val, vlen));
    if (!e->cluster)
        return kv__store_put(e, KV_NS_KEY, &r.id, r.iov, 3);
    kv_shard sh = { r.id, 0, r.iov, 3 };
    int res;
    rc = kv__cluster_put(e->cluster, KV_NS_KEY, &sh, 1, &res);
    return rc != KV_OK ? rc : res;
}

KV__EXPORT int kv_get(kv_engine *e, const void *key, size_t klen, void *buf, size_t cap,
                      size_t *vlen)
{
    int rc = check_key(e, key, klen);
    if (rc != KV_OK || !vlen || (!buf && cap > 0))
        return rc != KV_OK ? rc : KV_EINVAL;
    ROUTE(e, kv__shm_get(hc, key, klen, buf, cap, vlen));
    return get_one(e, key, klen, buf, cap, vlen);
}

KV__EXPORT int kv_exists(kv_engine *e, const void *key, size_t klen)
{
    int rc = check_key(e, key, klen);
    if (rc != KV_OK)
        return rc;
    ROUTE(e, kv__shm_exists(hc, key, klen));
    return exists_one(e, key, klen);
}

KV__EXPORT int kv_remove(kv_engine *e, const void *key, size_t klen)
{
    int rc = check_key(e, key, klen);
    if (rc != KV_OK)
        return rc;
    ROUTE(e, kv__shm_remove(hc, key, klen));
    kv_block_id id = key_id(key, klen);
    if (!e->cluster)
        return kv__local_remove(e, KV_NS_KEY, &id, 0);
    int res;
    rc = kv__cluster_remove(e->cluster, KV_NS_KEY, &id, 1, &res);
    return rc != KV_OK ? rc : res;
}

/* kv_remove_all (plen 0) and kv_remove_prefix after their checks and
 * routing: one CLEAR op to every owner, or served here as a peer's. */
static int clear_keys(kv_engine *e, const void *prefix, size_t plen, uint64_t *removed)
{
    uint64_t n = 0;
    int rc;
    kv_block_id hash = plen ? key_id(prefix, plen) : (kv_block_id){ { 0 } };
    if (e->cluster) {
        rc = kv__cluster_clear_prefix(e->cluster, KV_NS_KEY, (uint32_t)plen, &hash, &n);
    } else {   /* the op a peer would send, served here */
        struct kv__backend be;
        kv__backend_engine(e, &be);
        struct kv__op op = { .kind = KV_OP_CLEAR, .ns = KV_NS_KEY, .index = (uint32_t)plen,
                             .id = hash };
        kv__serve_ops(&be, &op, 1);
        rc = op.result;
        n = op.len;
    }
    if (removed)
        *removed = n;
    return rc;
}

KV__EXPORT int kv_remove_all(kv_engine *e, uint64_t *removed)
{
    if (!e)
        return KV_EINVAL;
    ROUTE(e, kv__shm_remove_all(hc, removed));
    return clear_keys(e, NULL, 0, removed);
}

KV__EXPORT int kv_remove_prefix(kv_engine *e, const void *prefix, size_t len, uint64_t *removed)
{
    if (!e || len > KV_KEY_MAX || (!prefix && len))
        return KV_EINVAL;
    if (len == 0)
        return kv_remove_all(e, removed);
    ROUTE(e, kv__shm_remove_prefix(hc, prefix, len, removed));
    return clear_keys(e, prefix, len, removed);
}

/* ---- batches ----------------------------------------------------------------
 * In a cluster, a batch is one round per owner (two for gets: sizes, then
 * the values), never a round trip per key. On one node, the calls in turn.
 */
static int check_batch(kv_engine *e, const kv_pair *items, size_t n, int *results)
{
    return !e || (n && (!items || !results)) ? KV_EINVAL : KV_OK;
}

/* A batch on an attached engine (what: 0 put, 1 get, 2 exists): the items
 * that are well formed go to the server in as few round trips as frames
 * allow (kv__shm_many); a connection error ends it. */
static int attached_many(struct kv__shm_client *hc, int what, kv_pair *items, size_t n,
                         int *results)
{
    kv_pair *ok = malloc(n * sizeof *ok);
    size_t *at = malloc(n * sizeof *at);
    int *res = malloc(n * sizeof *res);
    int rc = ok && at && res ? KV_OK : KV_ENOMEM;
    size_t m = 0;
    for (size_t i = 0; rc == KV_OK && i < n; i++) {
        kv_pair *it = &items[i];
        if (!it->key || it->klen == 0 || it->klen > KV_KEY_MAX || (what < 2 && !it->val && it->len) ||
            (what == 0 && it->len > KV_VALUE_MAX - 1 - it->klen)) {
            results[i] = KV_EINVAL;
            continue;
        }
        ok[m] = *it;
        at[m++] = i;
    }
    if (rc == KV_OK && m)
        rc = kv__shm_many(hc, what, ok, m, res);
    for (size_t j = 0; rc == KV_OK && j < m; j++) {
        results[at[j]] = res[j];
        items[at[j]].len = ok[j].len;   /* a get's value length */
    }
    free(ok);
    free(at);
    free(res);
    return rc;
}

KV__EXPORT int kv_put_many(kv_engine *e, const kv_pair *items, size_t n, int *results)
{
    int rc = check_batch(e, items, n, results);
    if (rc != KV_OK || n == 0)
        return rc;
    ROUTE(e, attached_many(hc, 0, (kv_pair *)items, n, results));
    struct rec *r = malloc(n * sizeof *r);
    kv_shard *sh = e->cluster ? malloc(n * sizeof *sh) : NULL;
    int *res = e->cluster ? malloc(n * sizeof *res) : NULL;
    size_t *at = e->cluster ? malloc(n * sizeof *at) : NULL;
    if (!r || (e->cluster && (!sh || !res || !at))) {
        rc = KV_ENOMEM;
        goto out;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        results[i] = make_rec(e, items[i].key, items[i].klen, items[i].val, items[i].len, &r[i]);
        if (results[i] != KV_OK)
            continue;
        if (!e->cluster) {
            results[i] = kv__store_put(e, KV_NS_KEY, &r[i].id, r[i].iov, 3);
            continue;
        }
        sh[m] = (kv_shard){ r[i].id, 0, r[i].iov, 3 };
        at[m++] = i;
    }
    if (m && (rc = kv__run_items(e, true, sh, m, res)) == KV_OK)
        for (size_t j = 0; j < m; j++)
            results[at[j]] = res[j];
out:
    free(r);
    free(sh);
    free(res);
    free(at);
    return rc;
}

KV__EXPORT int kv_get_many(kv_engine *e, kv_pair *items, size_t n, int *results)
{
    int rc = check_batch(e, items, n, results);
    if (rc != KV_OK || n == 0)
        return rc;
    ROUTE(e, attached_many(hc, 1, items, n, results));
    for (size_t i = 0; i < n; i++)
        results[i] = check_key(e, items[i].key, items[i].klen) != KV_OK ||
                     (!items[i].val && items[i].len) ? KV_EINVAL : KV_OK;
    if (!e->cluster) {
        for (size_t i = 0; i < n; i++)
            if (results[i] == KV_OK) {
                size_t vl = 0;
                results[i] = get_one(e, items[i].key, items[i].klen, items[i].val, items[i].len,
                                     &vl);
                if (results[i] == KV_OK || results[i] == KV_ENOBUFS)
                    items[i].len = vl;
            }
        return KV_OK;
    }
    /* Each value is read straight into the caller's buffer, behind a
     * scratch copy of its [klen][key] prefix (checked after). The first
     * round guesses that a value fills its buffer (what a Mooncake
     * get_into caller passes: the object's size); an owner holding another
     * length answers KV_EINVAL without sending it. Only those then have
     * their sizes asked (one round to every owner) and are read again. */
    kv_block_id *ids = malloc(n * sizeof *ids);
    uint64_t *lens = malloc(n * sizeof *lens);
    int *res = malloc(n * sizeof *res);
    kv_iov *iov = malloc(2 * n * sizeof *iov);
    kv_shard *sh = malloc(n * sizeof *sh);
    size_t *at = malloc(n * sizeof *at);
    uint8_t (*head)[1 + KV_KEY_MAX] = malloc(n * sizeof *head);
    if (!ids || !lens || !res || !iov || !sh || !at || !head) {
        rc = KV_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ids[i] = results[i] == KV_OK ? key_id(items[i].key, items[i].klen) : (kv_block_id){ { 0 } };
        lens[i] = 1 + items[i].klen + items[i].len;   /* the guess */
    }
    for (int round = 0; round < 2; round++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            kv_pair *it = &items[i];
            if (results[i] != (round == 0 ? KV_OK : KV_EINVAL))
                continue;
            if (round == 1 && res[i] != KV_OK) {
                results[i] = res[i];   /* its size: KV_ENOTFOUND, or an owner's error */
                continue;
            }
            if (lens[i] < 1 + it->klen) {
                results[i] = KV_ENOTFOUND;   /* not a plain key's record: a collision */
                continue;
            }
            uint64_t vlen = lens[i] - 1 - it->klen;
            if (vlen > it->len) {
                results[i] = KV_ENOBUFS;
                it->len = vlen;
                continue;
            }
            iov[2 * i] = (kv_iov){ head[i], 1 + it->klen };
            iov[2 * i + 1] = (kv_iov){ it->val, vlen };
            sh[m] = (kv_shard){ ids[i], 0, &iov[2 * i], 2 };
            at[m++] = i;
        }
        if (m && (rc = kv__run_items(e, false, sh, m, res)) != KV_OK)
            goto out;
        size_t again = 0;
        for (size_t j = 0; j < m; j++) {
            size_t i = at[j];
            kv_pair *it = &items[i];
            if (res[j] == KV_OK) {
                results[i] = same_key(head[i], 1 + it->klen, it->key, it->klen) ? KV_OK : KV_ENOTFOUND;
                it->len = results[i] == KV_OK ? iov[2 * i + 1].len : it->len;
            } else if (res[j] == KV_EINVAL && round == 0) {
                results[i] = KV_EINVAL;   /* another length: asked below */
                again++;
            } else if (res[j] == KV_EINVAL) {
                /* Replaced by yet another length between the rounds. */
                size_t vl = 0;
                results[i] = get_one(e, it->key, it->klen, it->val, it->len, &vl);
                if (results[i] == KV_OK || results[i] == KV_ENOBUFS)
                    it->len = vl;
            } else {
                results[i] = res[j];
            }
        }
        if (!again)
            break;
        /* The sizes of those alone, in one round; scattered back by item. */
        kv_block_id *q = malloc(again * sizeof *q);
        uint64_t *ql = malloc(again * sizeof *ql);
        int *qr = malloc(again * sizeof *qr);
        size_t k = 0;
        for (size_t i = 0; q && i < n; i++)
            if (results[i] == KV_EINVAL) {
                q[k] = ids[i];
                at[k++] = i;
            }
        rc = q && ql && qr ? kv__cluster_sizes(e->cluster, KV_NS_KEY, q, 0, k, ql, qr) : KV_ENOMEM;
        for (size_t j = 0; rc == KV_OK && j < k; j++) {
            lens[at[j]] = ql[j];
            res[at[j]] = qr[j];
        }
        free(q);
        free(ql);
        free(qr);
        if (rc != KV_OK)
            goto out;
    }
out:
    free(ids);
    free(lens);
    free(res);
    free(iov);
    free(sh);
    free(at);
    free(head);
    return rc;
}

KV__EXPORT int kv_exists_many(kv_engine *e, const kv_pair *items, size_t n, int *results)
{
    int rc = check_batch(e, items, n, results);
    if (rc != KV_OK || n == 0)
        return rc;
    ROUTE(e, attached_many(hc, 2, (kv_pair *)items, n, results));
    if (!e->cluster) {
        for (size_t i = 0; i < n; i++) {
            rc = check_key(e, items[i].key, items[i].klen);
            results[i] = rc != KV_OK ? rc : exists_one(e, items[i].key, items[i].klen);
        }
        return KV_OK;
    }
    kv_block_id *ids = malloc(n * sizeof *ids);
    uint8_t *hit = malloc(n);
    rc = ids && hit ? KV_OK : KV_ENOMEM;
    for (size_t i = 0; rc == KV_OK && i < n; i++) {
        results[i] = check_key(e, items[i].key, items[i].klen);
        ids[i] = results[i] == KV_OK ? key_id(items[i].key, items[i].klen) : (kv_block_id){ { 0 } };
    }
    if (rc == KV_OK && (rc = kv__cluster_lookup(e->cluster, KV_NS_KEY, ids, n, hit)) == KV_OK)
        for (size_t i = 0; i < n; i++)
            if (results[i] == KV_OK)
                results[i] = hit[i];
    free(ids);
    free(hit);
    return rc;
}
