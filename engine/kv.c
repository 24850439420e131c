/*
 * kv.c — plain keys: put / get / exists / remove.
 *
 * Plain keys live in the engine's second table (KV_NS_KEY), so they share
 * the segment, eviction and the SSD tier with block shards but can never
 * collide with a block id. A key is indexed by its 128-bit XXH3 hash, and
 * the stored value carries the key itself ([klen][key][value]) so that a
 * read checks it: a hash collision reads as a miss, never as another key's
 * value. Unlike a dump, a put replaces: the old entry is unlinked, and freed
 * at once or, while a reader has it pinned, by that reader's unpin.
 *
 * Plain keys are local to the node in cluster mode: they are not placed on
 * owners like blocks (a put is a replace, which placement's "first copy
 * wins" would break).
 */
#include <stdlib.h>
#include <xxhash.h>

#include "ssd.h"
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
        memcpy(buf, stored + 1 + klen, *vlen);
    return KV_OK;
}

/* Unlinks the key's DRAM entry, if any. Returns true when there was one. */
static bool dram_unlink(kv_engine *e, const kv_block_id *id)
{
    if (!e->has_dram)
        return false;
    uint64_t h = kv__id_hash(id);
    struct kv__tshard *ts = kv__table_shard(&e->tab[KV_NS_KEY], h);
    pthread_mutex_lock(&ts->lock);
    struct kv__blk *b = kv__blk_find(ts, h, id);
    bool free_now = false;
    if (b) {
        kv__blk_unlink(ts, h, b);
        if (b->pins)
            b->pins |= KV_BLK_DEAD;          /* the last reader frees it */
        else
            free_now = true;
    }
    pthread_mutex_unlock(&ts->lock);
    if (free_now)
        kv__dram_free_blk(e, b);
    return b != NULL;
}

KV__EXPORT int kv_put(kv_engine *e, const void *key, size_t klen, const void *val, size_t vlen)
{
    int rc = check_key(e, key, klen);
    if (rc != KV_OK)
        return rc;
    if ((!val && vlen > 0) || vlen > KV_VALUE_MAX - 1 - klen)
        return KV_EINVAL;
    uint8_t klen8 = (uint8_t)klen;
    kv_iov iov[3] = { { &klen8, 1 }, { (void *)key, klen }, { (void *)val, vlen } };
    uint64_t len = 1 + klen + vlen;
    kv_block_id id = key_id(key, klen);

    void *p = NULL;
    if (e->has_dram) {
        rc = kv__dram_alloc(e, len, &p);
        if (rc != KV_OK)
            return rc;
        kv__iov_gather(p, iov, 3);
    }
    /* Replace: no older copy may survive in either tier. An SSD copy that
     * cannot be deleted (a full disk under RocksDB's WAL) fails the put: it
     * would come back after a restart, older than a value acknowledged. */
    dram_unlink(e, &id);
    if (e->ssd) {
        rc = kv__ssd_remove(e->ssd, KV_NS_KEY, &id, 0);
        if (rc != KV_OK && rc != KV_ENOTFOUND) {
            if (p)
                kv__dram_free(e, p, len);
            return rc;
        }
        rc = KV_OK;
    }
    if (p) {
        rc = kv__dram_insert(e, KV_NS_KEY, &id, 0, p, (uint32_t)len);
        if (rc != KV_OK)
            return rc;
    }
    if (e->ssd && (!e->has_dram || e->cfg.ssd.write_through))
        rc = kv__ssd_write(e->ssd, KV_NS_KEY, &id, 0, iov, 3);
    return rc;
}

KV__EXPORT int kv_get(kv_engine *e, const void *key, size_t klen, void *buf, size_t cap,
                      size_t *vlen)
{
    int rc = check_key(e, key, klen);
    if (rc != KV_OK || !vlen || (!buf && cap > 0))
        return rc != KV_OK ? rc : KV_EINVAL;
    kv_block_id id = key_id(key, klen);
    const void *data;
    uint64_t len;
    kv__pin pin;
    if (kv__local_pin(e, KV_NS_KEY, &id, 0, &data, &len, &pin) == KV_OK) {
        rc = copy_value(data, len, key, klen, buf, cap, vlen);
        kv__local_unpin(e, &pin);
        atomic_fetch_add(rc == KV_OK ? &e->ct.hits_dram : &e->ct.misses, rc != KV_ENOBUFS);
        return rc;
    }
    if (!e->ssd || kv__ssd_size(e->ssd, KV_NS_KEY, &id, 0, &len) != KV_OK) {
        atomic_fetch_add(&e->ct.misses, 1);
        return KV_ENOTFOUND;
    }
    uint8_t *tmp = malloc(len ? len : 1);
    if (!tmp)
        return KV_ENOMEM;
    kv_iov iov = { tmp, len };
    rc = kv__ssd_read(e->ssd, KV_NS_KEY, &id, 0, &iov, 1);
    if (rc == KV_OK)
        rc = copy_value(tmp, len, key, klen, buf, cap, vlen);
    free(tmp);
    if (rc != KV_ENOBUFS)
        atomic_fetch_add(rc == KV_OK ? &e->ct.hits_ssd : &e->ct.misses, 1);
    return rc;
}

KV__EXPORT int kv_exists(kv_engine *e, const void *key, size_t klen)
{
    int rc = check_key(e, key, klen);
    if (rc != KV_OK)
        return rc;
    kv_block_id id = key_id(key, klen);
    const void *data;
    uint64_t len;
    kv__pin pin;
    if (kv__local_pin(e, KV_NS_KEY, &id, 0, &data, &len, &pin) == KV_OK) {
        bool same = same_key(data, len, key, klen);
        kv__local_unpin(e, &pin);
        return same;
    }
    return e->ssd && kv__ssd_contains(e->ssd, KV_NS_KEY, &id, 0);
}

KV__EXPORT int kv_remove(kv_engine *e, const void *key, size_t klen)
{
    int rc = check_key(e, key, klen);
    if (rc != KV_OK)
        return rc;
    kv_block_id id = key_id(key, klen);
    bool found = dram_unlink(e, &id);
    if (e->ssd && kv__ssd_contains(e->ssd, KV_NS_KEY, &id, 0)) {
        found = true;
        rc = kv__ssd_remove(e->ssd, KV_NS_KEY, &id, 0);
    }
    return !found ? KV_ENOTFOUND : rc;
}
