/*
 * dram.c — the DRAM tier: the segment, its allocator and the index tables
 * behind one struct, and every locked sequence on them written once.
 *
 * Key design choice (memcached's items.c): each operation is a do_
 * function that assumes its table-shard lock is held, and one public
 * kv__dram_* wrapper that takes it (through kv__dram_lock_find, the one
 * place that hashes, locks and finds). The lock covers index work only:
 * values are copied with no lock held, under a pin (pins > 0: the evictor
 * skips the block and a remove defers the free to the last unpin), and an
 * insert links memory that was filled before the lock was taken, so two
 * writers of one shard both succeed and the first to link wins.
 */
#include <stdio.h>
#include <stdlib.h>

#include "net/dir.h"
#include "dram.h"

/* How long an allocation may wait for write-back to release memory. */
#define WRITEBACK_WAIT_NS (10ull * 1000000000u)

/* ---- open, close, figures ------------------------------------------------- */

static void free_value(void *ctx, uint32_t off64, uint32_t len)
{
    struct kv__dram *d = ctx;
    kv__dram_free(d, kv__seg_ptr(d, off64), len);
}

void kv__dram_close(struct kv__dram *d)
{
    if (!d)
        return;
    if (d->alloc) {
        for (int ns = 0; ns < KV_NS_COUNT; ns++)
            kv__table_destroy(&d->tab[ns], free_value, d);
        kv__alloc_free_all(d->alloc);
    }
    pthread_mutex_destroy(&d->evict_lock);
    kv__dir_free(atomic_load(&d->dir));
    kv__segment_unmap(&d->seg);
    free(d);
}

int kv__dram_open(const struct kv_config *cfg, uint64_t epoch_ns, struct kv__dram **out,
                  char *err, size_t errlen)
{
    *out = NULL;
    struct kv__dram *d = calloc(1, sizeof *d);
    if (!d)
        return KV_ENOMEM;
    pthread_mutex_init(&d->evict_lock, NULL);
    d->epoch_ns = epoch_ns;
    int rc = kv__segment_map(&d->seg, cfg->dram.capacity, cfg->dram.hugepages, err, errlen);
    if (rc == KV_OK)
        rc = kv__alloc_new(&d->alloc, d->seg.base, d->seg.len, err, errlen);
    for (int ns = 0; rc == KV_OK && ns < KV_NS_COUNT; ns++)
        rc = kv__table_init(&d->tab[ns], cfg->dram.shards);
    if (rc != KV_OK) {
        kv__dram_close(d);
        return rc;
    }
    d->high_wm = (uint64_t)((double)d->seg.len * cfg->eviction.high_watermark_ratio);
    d->evict_step = (uint64_t)((double)d->seg.len * cfg->eviction.ratio);
    if (d->evict_step == 0)
        d->evict_step = 1;
    d->lease_ns = cfg->eviction.lease_ttl_ms * 1000000u;
    *out = d;
    return KV_OK;
}

void kv__dram_set_sink(struct kv__dram *d, struct kv__sink sink)
{
    d->sink = sink;
}

void kv__dram_set_dir(struct kv__dram *d, struct kv__dir *dir)
{
    atomic_store(&d->dir, dir);
}

void kv__dram_unlinked(struct kv__dram *d, int ns, struct kv__blk *b)
{
    struct kv__dir *dir = atomic_load_explicit(&d->dir, memory_order_acquire);
    if (!dir || ns != KV_NS_BLOCK)
        return;
    const struct kv__sref *r = kv__blk_srefs(b);
    for (uint32_t i = 0; i < b->nshards; i++)
        kv__dir_retract(dir, &b->id, r[i].index);
}

void kv__dram_segment(struct kv__dram *d, void **base, size_t *len)
{
    *base = d->seg.base;
    *len = d->seg.len;
}

void kv__dram_describe(struct kv__dram *d, char *buf, size_t len)
{
    snprintf(buf, len, " dram=%llu bytes (%s pages, faulted in %.1f ms) shards=%u",
             (unsigned long long)d->seg.len, d->seg.pages, (double)d->seg.fault_ns / 1e6,
             d->tab[0].n);
}

void kv__dram_stats(struct kv__dram *d, kv_stats *out)
{
    out->dram_capacity = d->seg.len;
    out->dram_used = atomic_load(&d->used);
    for (int ns = 0; ns < KV_NS_COUNT; ns++) {
        struct kv__table *t = &d->tab[ns];
        for (uint32_t i = 0; i < t->n; i++) {
            struct kv__tshard *ts = &t->sh[i];
            pthread_mutex_lock(&ts->lock);
            if (ns == KV_NS_BLOCK) {
                out->dram_blocks += ts->nblocks;
                out->dram_shards += ts->nshards;
            } else {
                out->keys += ts->nblocks;
            }
            out->dram_index_bytes += ts->index_bytes;
            pthread_mutex_unlock(&ts->lock);
        }
    }
    out->evictions = atomic_load(&d->evictions);
    out->enospc = atomic_load(&d->enospc);
}

/* ---- memory --------------------------------------------------------------- */

void kv__dram_free(struct kv__dram *d, void *p, uint64_t len)
{
    size_t sz = kv__alloc_size(d->alloc, len);
    kv__free(d->alloc, p, len);
    atomic_fetch_sub(&d->used, sz);
}

void kv__dram_free_blk(struct kv__dram *d, struct kv__blk *b)
{
    struct kv__sref *r = kv__blk_srefs(b);
    for (uint32_t i = 0; i < b->nshards; i++)
        kv__dram_free(d, kv__seg_ptr(d, r[i].off64), r[i].len);
    kv__blk_free(b);
}

int kv__dram_alloc(struct kv__dram *d, uint64_t len, void **out)
{
    *out = NULL;
    size_t sz = kv__alloc_size(d->alloc, len);
    if (sz > d->seg.len)
        return KV_ENOSPC;
    /* Make room before the high watermark is crossed, not after. */
    if (atomic_load(&d->used) + sz > d->high_wm)
        kv__evict_maybe(d);
    /* Evicted blocks on their way to the next tier still hold their memory
     * until the writer releases them: wait for that (bounded) rather than
     * evict more for the same bytes, but never wait for leases or pins —
     * when nothing is evictable and nothing is in flight, fail. */
    uint64_t deadline = 0;     /* read the clock only when memory is short */
    for (bool last = false;; ) {
        void *p = kv__alloc(d->alloc, len);
        if (p) {
            atomic_fetch_add(&d->used, sz);
            *out = p;
            return KV_OK;
        }
        if (last)
            break;
        if (!deadline)
            deadline = kv__now_ns() + WRITEBACK_WAIT_NS;
        uint64_t held = kv__dram_in_flight(d), freed = 0;
        if (held < sz)
            freed = kv__evict(d, sz > d->evict_step ? sz : d->evict_step);
        if (d->sink.drain)
            held = d->sink.drain(d->sink.ctx, 50);
        /* Nothing more will come free (or we waited long enough): one more
         * try, since the drain may just have released what we need. */
        last = (freed == 0 && held == 0) || kv__now_ns() > deadline;
    }
    atomic_fetch_add(&d->enospc, 1);
    return KV_ENOSPC;
}

int kv__dram_reserve(struct kv__dram *d, uint64_t len, kv__resv *r)
{
    int rc = kv__dram_alloc(d, len, &r->data);
    if (rc == KV_OK) {
        r->len = len;
        atomic_fetch_add(&d->reserved, kv__alloc_size(d->alloc, len));
    }
    return rc;
}

int kv__dram_commit(struct kv__dram *d, kv__resv *r, int ns, const kv_block_id *id,
                    uint32_t index)
{
    atomic_fetch_sub(&d->reserved, kv__alloc_size(d->alloc, r->len));
    int rc = kv__dram_insert(d, ns, id, index, r->data, (uint32_t)r->len);
    r->data = NULL;
    return rc;
}

void kv__dram_abort(struct kv__dram *d, kv__resv *r)
{
    if (!r->data)
        return;
    atomic_fetch_sub(&d->reserved, kv__alloc_size(d->alloc, r->len));
    kv__dram_free(d, r->data, r->len);
    r->data = NULL;
}

/* ---- the index: do_ functions (table-shard lock held) ----------------------- */

struct kv__at kv__dram_lock_find(struct kv__dram *d, int ns, const kv_block_id *id,
                                 uint32_t index, uint64_t h)
{
    struct kv__at a = { kv__table_shard(&d->tab[ns], h), h, NULL, NULL };
    pthread_mutex_lock(&a.ts->lock);
    a.b = kv__blk_find(a.ts, h, id);
    if (a.b && index != KV__ANY_SHARD)
        a.r = kv__blk_sref(a.b, index);
    return a;
}

static struct kv__at lock_find(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index)
{
    return kv__dram_lock_find(d, ns, id, index, kv__id_hash(id));
}

/* Links p as the found shard (and mirrors a block shard for attached
 * readers); 1 when another copy got there first (the caller frees p),
 * KV_ENOMEM. */
static int do_insert(struct kv__dram *d, struct kv__at *a, int ns, const kv_block_id *id,
                     uint32_t index, void *p, uint32_t len)
{
    if (a->r)
        return 1;
    uint32_t off64 = (uint32_t)(((const uint8_t *)p - d->seg.base) / 64);
    int rc = kv__blk_add(a->ts, a->h, id, index, off64, len, kv__dram_now(d), NULL);
    struct kv__dir *dir = atomic_load_explicit(&d->dir, memory_order_acquire);
    if (rc == KV_OK && dir && ns == KV_NS_BLOCK)
        kv__dir_publish(dir, id, index, off64, len);
    return rc;
}

static int do_pin(struct kv__dram *d, struct kv__at *a, int ns, const void **data,
                  uint64_t *len, kv__pin *pin, bool touch)
{
    /* A pin count one short of the dead bit is full: a miss, not a wrap. */
    if (!a->r || (a->b->pins & ~KV_BLK_DEAD) == (KV_BLK_DEAD - 1))
        return KV_ENOTFOUND;
    a->b->pins++;
    if (touch)
        kv__blk_touch(a->b, kv__dram_now(d));
    *data = kv__seg_ptr(d, a->r->off64);
    *len = a->r->len;
    *pin = (kv__pin){ a->b, (uint32_t)(a->ts - d->tab[ns].sh), ns };
    return KV_OK;
}

/* True when the block is to be freed now (unlinked while pinned, and this
 * was the last pin). */
static bool do_unpin(struct kv__blk *b)
{
    b->pins--;
    return b->pins == KV_BLK_DEAD;
}

/* Unlinks the found block; true when nobody has it pinned (the caller frees
 * it), else the last unpin will. */
static bool do_unlink(struct kv__dram *d, int ns, struct kv__at *a)
{
    kv__blk_unlink(a->ts, a->h, a->b);
    kv__dram_unlinked(d, ns, a->b);
    if (!a->b->pins)
        return true;
    a->b->pins |= KV_BLK_DEAD;
    return false;
}

/* ---- the index: the locked calls ------------------------------------------- */

int kv__dram_insert(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                    void *p, uint32_t len)
{
    struct kv__at a = lock_find(d, ns, id, index);
    int rc = do_insert(d, &a, ns, id, index, p, len);
    kv__dram_unlock(&a);
    if (rc != KV_OK)
        kv__dram_free(d, p, len);
    return rc == 1 ? KV_OK : rc;
}

void kv__dram_prefetch(struct kv__dram *d, int ns, const kv_shard *sh, size_t n)
{
    struct kv__table *t = &d->tab[ns];
    for (size_t i = 0; i < n; i++) {
        uint64_t h = kv__id_hash(&sh[i].block);
        kv__bucket_prefetch(kv__table_shard(t, h), h);
    }
}

bool kv__dram_has(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index)
{
    struct kv__at a = lock_find(d, ns, id, index);
    kv__dram_unlock(&a);
    return a.r != NULL;
}

int kv__dram_size(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                  uint64_t *len)
{
    struct kv__at a = lock_find(d, ns, id, index);
    if (a.r)
        *len = a.r->len;
    kv__dram_unlock(&a);
    return a.r ? KV_OK : KV_ENOTFOUND;
}

int kv__dram_pin(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                 const void **data, uint64_t *len, kv__pin *pin)
{
    struct kv__at a = lock_find(d, ns, id, index);
    int rc = do_pin(d, &a, ns, data, len, pin, true);
    kv__dram_unlock(&a);
    return rc;
}

int kv__dram_peek(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                  const void **data, uint64_t *len, kv__pin *pin)
{
    struct kv__at a = lock_find(d, ns, id, index);
    int rc = do_pin(d, &a, ns, data, len, pin, false);
    kv__dram_unlock(&a);
    return rc;
}

void kv__dram_unpin(struct kv__dram *d, kv__pin *pin)
{
    struct kv__tshard *ts = &d->tab[pin->ns].sh[pin->tshard];
    struct kv__blk *b = pin->blk;
    pthread_mutex_lock(&ts->lock);
    bool free_it = do_unpin(b);
    pthread_mutex_unlock(&ts->lock);
    if (free_it)
        kv__dram_free_blk(d, b);
    pin->blk = NULL;
}

int kv__dram_copy_out(struct kv__dram *d, int ns, const kv_block_id *id, uint32_t index,
                      const kv_iov *iov, uint32_t iovcnt)
{
    kv__pin pin;
    const void *data;
    uint64_t len;
    int rc = kv__dram_pin(d, ns, id, index, &data, &len, &pin);
    if (rc != KV_OK)
        return rc;
    if (len != kv__iov_len(iov, iovcnt))
        rc = KV_EINVAL;
    else
        kv__iov_scatter(iov, iovcnt, data);
    kv__dram_unpin(d, &pin);
    return rc;
}

void kv__dram_touch(struct kv__dram *d, int ns, const kv_block_id *ids, size_t n)
{
    uint64_t now = kv__dram_now(d);
    for (size_t i = 0; i < n; i++) {
        struct kv__at a = lock_find(d, ns, &ids[i], KV__ANY_SHARD);
        if (a.b)
            kv__blk_touch(a.b, now);
        kv__dram_unlock(&a);
    }
}

bool kv__dram_remove(struct kv__dram *d, int ns, const kv_block_id *id)
{
    struct kv__at a = lock_find(d, ns, id, KV__ANY_SHARD);
    bool free_now = a.b && do_unlink(d, ns, &a);
    kv__dram_unlock(&a);
    if (free_now)
        kv__dram_free_blk(d, a.b);
    return a.b != NULL;
}

/*
 * Lookup is the hot path of prefix matching (thousands of ids per request),
 * so it is written for memory-level parallelism. Each id costs two
 * dependent cache misses, its bucket slot and then the entry the slot
 * points to (entries are scattered by the allocator), and a lookup that
 * waits for each in turn spends nearly all its time stalled: that was a
 * third of a cluster member's CPU under attached lookups (doc/perf.md).
 *
 * How it works. A batch is taken in chunks of LOOKUP_CHUNK ids, in three
 * passes:
 *   1. hash every id, prefetch its bucket slot (the unlocked address-only
 *      prefetch kv__bucket_prefetch allows), and group the ids by table
 *      shard (a counting sort on the shard index);
 *   2. per shard, under its lock, read each of its ids' bucket heads and
 *      prefetch the entries they point to (both cache lines: a 48-byte
 *      entry may straddle two);
 *   3. per shard, under its lock again, walk and compare, and grant the
 *      lease by moving a hit block's stamp into the future: one store into
 *      the entry pass 2 brought in.
 * Bucket heads are read only under the lock (a grow frees the old array);
 * what pass 2 learns serves only as a prefetch address, and a prefetch
 * never faults, so an entry freed between the passes costs a wasted
 * prefetch, never a wrong answer: pass 3 finds again from the head.
 * Grouping makes it two lock holds per shard per chunk instead of one per
 * id. Taking each lock twice rather than once is what puts a whole chunk's
 * entry prefetches in flight before the first compare: within one hold
 * only one shard's few ids would be (256 over 64 shards is 4), and the
 * compare stalled on the entry just prefetched. Measured through a cluster
 * member (bench/member_lookup.sh, doc/perf.md) the two-hold form was
 * faster in every round. With more table shards than a chunk has ids,
 * grouping cannot pay and the ids keep their order.
 */
#define LOOKUP_CHUNK 256

static inline void entry_prefetch(const struct kv__blk *b)
{
    __builtin_prefetch(b);
    __builtin_prefetch((const char *)b + sizeof *b - 1);
}

void kv__dram_lookup(struct kv__dram *d, int ns, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    uint64_t hs[LOOKUP_CHUNK];
    uint16_t ord[LOOKUP_CHUNK];         /* chunk positions, grouped by shard */
    uint16_t sh[LOOKUP_CHUNK];          /* each position's table shard (grouping only) */
    uint16_t cnt[LOOKUP_CHUNK + 1];
    uint64_t lease_end = kv__dram_now(d) + d->lease_ns;
    struct kv__table *t = &d->tab[ns];
    bool group = t->n <= LOOKUP_CHUNK;
    for (size_t base = 0; base < n; base += LOOKUP_CHUNK) {
        const kv_block_id *id = ids + base;
        size_t m = n - base < LOOKUP_CHUNK ? n - base : LOOKUP_CHUNK;
        /* Pass 1. */
        if (group)
            memset(cnt, 0, (t->n + 1) * sizeof *cnt);
        for (size_t i = 0; i < m; i++) {
            hs[i] = kv__id_hash(&id[i]);
            struct kv__tshard *ts = kv__table_shard(t, hs[i]);
            kv__bucket_prefetch(ts, hs[i]);
            if (group) {
                sh[i] = (uint16_t)(ts - t->sh);
                cnt[sh[i] + 1]++;
            } else {
                ord[i] = (uint16_t)i;
            }
        }
        if (group) {
            for (uint32_t s = 0; s < t->n; s++)
                cnt[s + 1] += cnt[s];
            for (size_t i = 0; i < m; i++)
                ord[cnt[sh[i]]++] = (uint16_t)i;
        }
        /* Passes 2 and 3: runs of ord with one shard share a lock hold. */
        for (int pass = 2; pass <= 3; pass++) {
            for (size_t j = 0; j < m; ) {
                struct kv__tshard *ts = kv__table_shard(t, hs[ord[j]]);
                size_t end = j + 1;
                while (end < m && kv__table_shard(t, hs[ord[end]]) == ts)
                    end++;
                pthread_mutex_lock(&ts->lock);
                for (; j < end; j++) {
                    size_t i = ord[j];
                    if (pass == 2) {
                        struct kv__blk *b = ts->buckets[hs[i] & ts->mask];
                        if (b)
                            entry_prefetch(b);
                        continue;
                    }
                    struct kv__blk *b = kv__blk_find(ts, hs[i], &id[i]);
                    bool found = b && kv__blk_sref(b, 0);
                    if (found)
                        kv__blk_touch(b, lease_end);
                    hit[base + i] = found;
                }
                pthread_mutex_unlock(&ts->lock);
            }
        }
    }
}

bool kv__dram_scan(struct kv__dram *d, int ns, kv__scan_cb cb, void *arg)
{
    struct kv__table *t = &d->tab[ns];
    int stop = 0;
    for (uint32_t s = 0; s < t->n && !stop; s++) {
        struct kv__tshard *ts = &t->sh[s];
        pthread_mutex_lock(&ts->lock);
        for (uint32_t k = 0; k <= ts->mask && !stop; k++)
            for (struct kv__blk *b = ts->buckets[k]; b && !stop; b = b->hnext) {
                struct kv__sref *r = kv__blk_srefs(b);
                for (uint32_t i = 0; i < b->nshards && !stop; i++)
                    stop = cb(arg, &b->id, r[i].index, r[i].len, b->stamp);
            }
        pthread_mutex_unlock(&ts->lock);
    }
    return stop != 0;
}
