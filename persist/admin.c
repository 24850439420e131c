/*
 * admin.c — the SSD tier's maintenance walks: list (scan), verify every
 * checksum (scrub) and compact, for kvctl ssd ls | scrub | compact.
 *
 * Key design choice: every walk works from a snapshot of the in-memory key
 * index, never from a RocksDB iterator over the data range: RocksDB 7.8's
 * iterator reads blob values eagerly (see rocks.c), so listing by iterator
 * would read every byte on the store, and a scrub through one would hold a
 * snapshot of the whole database for its duration. A scrub reads the values
 * one at a time with point lookups instead, so the engine keeps serving
 * (and may delete or evict under it: a value gone by the time it is read is
 * simply skipped, unless the index still says it is stored).
 *
 * The value format is rocks.c's (a 16-byte header: magic "KVB1", length,
 * XXH3-64 of the bytes seeded with the hash of the key); it is restated
 * here rather than exported so that rocks.c stays as its owner left it. A
 * change there must be made here too: check_tools' scrub test (clean store:
 * no bad values; one flipped byte: exactly one) fails otherwise.
 */
#define XXH_STATIC_LINKING_ONLY
#include <stdlib.h>
#include <xxhash.h>

#include "ssd_int.h"

#define ADM_HDR_LEN 16
#define ADM_DATA_MAGIC 0x3142564bu   /* "KVB1" little-endian, as rocks.c */

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void to_entry(const struct kv__sent *se, uint64_t seq, uint64_t total, kv_ssd_entry *out)
{
    memset(out, 0, sizeof *out);
    out->ns = se->ns == KV_NS_KEY ? KV_SSD_NS_KEY : KV_SSD_NS_BLOCK;
    memcpy(out->id.bytes, se->id, KV_BLOCK_ID_LEN);
    out->index = se->index;
    out->size = se->size;
    out->seq = seq;
    out->total = total;
}

int kv__ssd_scan(struct kv__ssd *s, kv_ssd_cb cb, void *ctx)
{
    if (!s || !cb)
        return KV_EINVAL;
    struct kv__sent *snap = NULL;
    ssize_t n = kv__sidx_snapshot(&s->idx, (1u << KV__ENT_STORED) | (1u << KV__ENT_PENDING), &snap);
    if (n < 0)
        return (int)n;
    for (ssize_t i = 0; i < n; i++) {
        kv_ssd_entry ent;
        to_entry(&snap[i], (uint64_t)i, (uint64_t)n, &ent);
        if (cb(ctx, &ent))
            break;
    }
    free(snap);
    return KV_OK;
}

/* Verifies one stored value by a point read: KV_OK, KV_ECORRUPT, KV_EIO,
 * or KV_ENOTFOUND when it went away under us (not a fault). */
static int check_one(struct kv__ssd *s, const struct kv__sent *se)
{
    uint8_t dk[KV__SSD_KEY_LEN];
    kv__ssd_key(dk, (int)se->ns, se->id, se->index, false);
    char *e = NULL;
    rocksdb_t *db = kv__ssd_db_enter(s);
    if (!db) {                                  /* down after a full disk */
        kv__ssd_db_leave(s);
        return KV_EIO;
    }
    rocksdb_pinnableslice_t *ps = rocksdb_get_pinned(db, s->ro, (const char *)dk, sizeof dk, &e);
    kv__ssd_db_leave(s);
    if (e) {
        int rc = strstr(e, "Corruption") ? KV_ECORRUPT : KV_EIO;
        KV_WARN("ssd scrub: read (ns %u, shard %u): %s", (unsigned)se->ns, se->index, e);
        rocksdb_free(e);
        return rc;
    }
    if (!ps) {
        struct kv__sent now;
        bool still = kv__sidx_get(&s->idx, (int)se->ns, se->id, se->index, &now) &&
                     now.state == KV__ENT_STORED;
        return still ? KV_ECORRUPT : KV_ENOTFOUND;
    }
    size_t vl = 0;
    const uint8_t *v = (const uint8_t *)rocksdb_pinnableslice_value(ps, &vl);
    int rc = KV_OK;
    if (vl < ADM_HDR_LEN || le32(v) != ADM_DATA_MAGIC || le32(v + 4) != vl - ADM_HDR_LEN) {
        rc = KV_ECORRUPT;
    } else {
        uint64_t seed = XXH3_64bits(dk, KV__SSD_KEY_LEN);
        if (XXH3_64bits_withSeed(v + ADM_HDR_LEN, vl - ADM_HDR_LEN, seed) != le64(v + 8))
            rc = KV_ECORRUPT;
    }
    rocksdb_pinnableslice_destroy(ps);
    return rc;
}

/* What a load that met the bad value would do: delete it and count it. */
static void repair_one(struct kv__ssd *s, const struct kv__sent *se)
{
    struct kv__sent del = *se;
    if (kv__sidx_del(&s->idx, (int)se->ns, se->id, se->index, 1u << KV__ENT_STORED, NULL)) {
        kv__ssd_delete_keys(s, &del, 1);
        atomic_fetch_add(&s->checksum_failures, 1);
        KV_WARN("ssd scrub: value (ns %u, shard %u) failed its check; deleted",
                (unsigned)se->ns, se->index);
    }
}

int kv__ssd_scrub(struct kv__ssd *s, bool repair, kv_ssd_cb cb, void *ctx, uint64_t *checked,
                  uint64_t *bad)
{
    uint64_t nchecked = 0, nbad = 0;
    if (checked)
        *checked = 0;
    if (bad)
        *bad = 0;
    if (!s)
        return KV_EINVAL;
    struct kv__sent *snap = NULL;
    /* Values still queued for write-back are in DRAM, not on disk: nothing
     * to verify yet. */
    ssize_t n = kv__sidx_snapshot(&s->idx, 1u << KV__ENT_STORED, &snap);
    if (n < 0)
        return (int)n;
    for (ssize_t i = 0; i < n; i++) {
        int rc = check_one(s, &snap[i]);
        if (rc == KV_ENOTFOUND)
            continue;
        nchecked++;
        if (rc != KV_OK) {
            nbad++;
            if (repair && rc == KV_ECORRUPT)
                repair_one(s, &snap[i]);
        }
        if (cb) {
            kv_ssd_entry ent;
            to_entry(&snap[i], (uint64_t)i, (uint64_t)n, &ent);
            ent.status = rc;
            if (cb(ctx, &ent))
                break;
        }
    }
    free(snap);
    if (checked)
        *checked = nchecked;
    if (bad)
        *bad = nbad;
    return KV_OK;
}

int kv__ssd_compact(struct kv__ssd *s)
{
    if (!s)
        return KV_EINVAL;
    /* Blob GC is off in normal running (rocks.c turns it on only around its
     * own compactions); a compaction without it would leave the blob files
     * of deleted values in place. Like rocks.c's own compactions it runs
     * without gc_mu, so writers that need room are not held up behind it. */
    const char *k[] = { "enable_blob_garbage_collection" }, *on[] = { "true" }, *off[] = { "false" };
    int rc = KV_OK;
    char *e = NULL;
    rocksdb_t *db = kv__ssd_db_enter(s);     /* a reopen waits for us */
    if (!db) {
        kv__ssd_db_leave(s);
        return KV_EIO;
    }
    rocksdb_set_options(db, 1, k, on, &e);
    if (e) {
        KV_WARN("ssd compact: enabling blob GC: %s", e);
        rocksdb_free(e);
        rc = KV_EIO;
    }
    rocksdb_compact_range(db, NULL, 0, NULL, 0);
    e = NULL;
    rocksdb_set_options(db, 1, k, off, &e);
    if (e) {
        KV_WARN("ssd compact: disabling blob GC: %s", e);
        rocksdb_free(e);
    }
    kv__ssd_db_leave(s);
    return rc;
}
