/*
 * walk.c — the SSD tier's maintenance walks: list (scan) and verify every
 * checksum (scrub), for kvctl ssd ls | scrub (compact is ssd.c's).
 *
 * Key design choice: every walk works from a snapshot of the in-memory key
 * index, never from a RocksDB iterator: a scrub through one would hold a
 * snapshot of the whole database for its duration. A scrub reads the values
 * one at a time through ssd.c's kv__ssd_fetch (the same checks a load
 * makes: record header and its MAC, key, length, XXH3), so the engine keeps serving
 * (and may delete or evict under it: a value gone by the time it is read is
 * simply skipped, unless the index still says it is stored there).
 */
#include <stdlib.h>

#include "ssd_int.h"

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
    ssize_t n = kv__sidx_snapshot(&s->idx, (1u << KV__ENT_STORED) | (1u << KV__ENT_MOVING) |
                                                 (1u << KV__ENT_PENDING), &snap);
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

/* Verifies one stored value: KV_OK, KV_ECORRUPT, KV_EIO, or KV_ENOTFOUND
 * when it went away under us (not a fault). */
static int check_one(struct kv__ssd *s, const struct kv__sent *se, const char **why)
{
    void *buf = malloc(se->size ? se->size : 1);
    if (!buf)
        return KV_ENOMEM;
    kv_iov iov = { buf, se->size };
    int rc = kv__ssd_fetch(s, se, &iov, 1, why);
    free(buf);
    if (rc == KV_ECORRUPT) {
        struct kv__sent now;
        bool still = kv__sidx_get(&s->idx, (int)se->ns, se->id, se->index, &now) &&
                     now.state == KV__ENT_STORED && now.loc == se->loc;
        return still ? KV_ECORRUPT : KV_ENOTFOUND;
    }
    return rc;
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
        const char *why = NULL;
        int rc = check_one(s, &snap[i], &why);
        if (rc == KV_ENOTFOUND)
            continue;
        nchecked++;
        if (rc != KV_OK) {
            nbad++;
            if (repair && rc == KV_ECORRUPT)
                kv__ssd_drop_bad(s, &snap[i], why ? why : "scrub");
            else
                KV_WARN("ssd scrub: value (ns %u, shard %u): %s", (unsigned)snap[i].ns,
                        snap[i].index, why ? why : kv_strerror(rc));
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
