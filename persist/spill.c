/*
 * spill.c — the write-back path from DRAM to SSD: the engine's eviction
 * sink, a bounded queue of victims and the one writer thread that drains it.
 *
 * Key design choice: a queued victim is already in the index, as PENDING,
 * the moment the sink accepts it, and its bytes are still the DRAM
 * segment's (the engine does not reuse them until release()). So between
 * eviction and the write landing, contains/size answer "present" and a read
 * copies straight from the victim's DRAM bytes under the queue lock. The
 * writer takes victims in FIFO order up to tune.batch_bytes into one
 * kv__ssd_put (one value log append each, one WriteBatch of pointers);
 * only after that lands does it flip their entries to STORED, unlink them
 * from the queue and call release(). A victim that would push the queue
 * past ssd.spill_queue bytes is refused at once (released, counted in
 * spill_drops): the evictor never waits for the disk.
 *
 * The PENDING entries carry the item's claim token (ssd_int.h, "Claims"):
 * a synchronous writer may steal a shard not yet in flight (SKIP_STOLEN:
 * not written here, still readable from the queue), a remove cancels one
 * (SKIP_CANCELLED; in flight, the entry turns CANCELLED and the writer
 * deletes what it wrote).
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "ssd_int.h"

enum { SKIP_NO = 0, SKIP_CANCELLED = 1, SKIP_STOLEN = 2, SKIP_PRESENT = 3 };

static void drop(struct kv__ssd *s, struct kv__victim *v)
{
    atomic_fetch_add(&s->spill_drops, 1);
    v->release(v);
}

static void sink_accept(void *ctx, struct kv__victim *v)
{
    struct kv__ssd *s = ctx;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < v->nshards; i++)
        bytes += v->shards[i].len;
    struct kv__sq_item *it = calloc(1, sizeof *it + v->nshards);
    if (!it || v->ns < 0 || v->ns >= KV_NS_COUNT) {
        free(it);
        drop(s, v);
        return;
    }
    it->v = v;
    it->bytes = bytes;
    it->stamp = atomic_fetch_add(&s->clock, 1);
    it->token = kv__ssd_token(s);
    it->skip = (uint8_t *)(it + 1);

    pthread_mutex_lock(&s->qmu);
    if (s->closing || s->qbytes + bytes > s->qcap) {
        pthread_mutex_unlock(&s->qmu);
        free(it);
        drop(s, v);
        return;
    }
    uint32_t towrite = 0;
    for (uint32_t i = 0; i < v->nshards; i++) {
        struct kv__sent e;
        memset(&e, 0, sizeof e);
        e.ns = (unsigned)v->ns;
        memcpy(e.id, v->id.bytes, KV_BLOCK_ID_LEN);
        e.index = v->shards[i].index;
        e.size = v->shards[i].len;
        e.stamp = it->stamp;
        e.state = KV__ENT_PENDING;
        e.loc = it->token;
        /* Already on SSD (write-through, or spilled before), or being
         * written by someone else: nothing to do for this shard. Out of
         * memory: not written, not indexed. */
        if (kv__sidx_insert(&s->idx, &e, NULL) == 1)
            towrite++;
        else
            it->skip[i] = SKIP_PRESENT;
    }
    if (towrite == 0) {
        pthread_mutex_unlock(&s->qmu);
        free(it);
        v->release(v);
        return;
    }
    if (s->qtail)
        s->qtail->next = it;
    else
        s->qhead = it;
    s->qtail = it;
    s->qbytes += bytes;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
}

static uint64_t sink_drain(void *ctx, unsigned ms)
{
    struct kv__ssd *s = ctx;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->qmu);
    uint64_t start = s->qbytes;
    /* "Progress" is enough: return as soon as some bytes were released, so
     * a dump waiting for room retries early. */
    while (s->qbytes > 0 && s->qbytes >= start && ms > 0)
        if (pthread_cond_timedwait(&s->dcv, &s->qmu, &dl) == ETIMEDOUT)
            break;
    uint64_t left = s->qbytes;
    pthread_mutex_unlock(&s->qmu);
    return left;
}

struct kv__sink kv__ssd_sink(struct kv__ssd *s)
{
    struct kv__sink k = { .ctx = s, .accept = sink_accept, .drain = sink_drain };
    return k;
}

/* Counts the shards of n items from first still to be written (qmu not
 * held; the last one's next may be changing under an accept, so count, not
 * follow). */
static size_t count_puts(struct kv__sq_item *first, size_t n, uint64_t *disk)
{
    size_t np = 0;
    struct kv__sq_item *it = first;
    for (size_t k = 0; k < n; k++, it = k < n ? it->next : NULL)
        for (uint32_t i = 0; i < it->v->nshards; i++)
            if (it->skip[i] == SKIP_NO) {
                np++;
                *disk += kv__vlog_span(it->v->shards[i].len);
            }
    return np;
}

/* Writes the shards of n items, in p (np slots); rc of the batch. The skip
 * flags read here cannot change: a shard in flight is neither stolen nor
 * cancelled (kv__spill_steal, kv__spill_cancel check inflight). */
static int write_items(struct kv__ssd *s, struct kv__sq_item *first, size_t n,
                       struct kv__sput *p, kv_iov *iov, size_t np, uint64_t disk)
{
    int rc = kv__ssd_make_room(s, 0, disk);
    size_t j = 0;
    struct kv__sq_item *it = first;
    for (size_t k = 0; k < n; k++, it = k < n ? it->next : NULL) {
        struct kv__victim *v = it->v;
        for (uint32_t i = 0; i < v->nshards && j < np; i++) {
            if (it->skip[i] != SKIP_NO)
                continue;
            iov[j] = (kv_iov){ (void *)v->shards[i].data, v->shards[i].len };
            p[j] = (struct kv__sput){ .ns = v->ns, .id = v->id.bytes, .index = v->shards[i].index,
                                      .iov = &iov[j], .iovcnt = 1, .len = iov[j].len,
                                      .stamp = it->stamp, .rc = rc };
            j++;
        }
    }
    if (rc == KV_OK)
        rc = kv__ssd_put(s, p, np);
    return rc;
}

/* After a batch: each written shard becomes STORED; one removed while in
 * flight (CANCELLED) is undone; one that failed (all of them when p is
 * NULL: no memory to write with) leaves the index. Returns the entries to
 * undo (into undo, at most np). qmu held. */
static size_t settle_items(struct kv__ssd *s, struct kv__sq_item *first, struct kv__sq_item *last,
                           const struct kv__sput *p, size_t np, struct kv__sent *undo)
{
    size_t j = 0, nundo = 0;
    for (struct kv__sq_item *it = first; it != last->next; it = it->next) {
        struct kv__victim *v = it->v;
        bool ok = true;
        for (uint32_t i = 0; i < v->nshards && (!p || j < np); i++) {
            if (it->skip[i] != SKIP_NO)
                continue;
            const struct kv__sput *q = p ? &p[j++] : NULL;
            uint32_t index = v->shards[i].index;
            if (!q || q->rc != KV_OK) {
                ok = false;
                kv__sidx_del_at(&s->idx, v->ns, v->id.bytes, index, KV__ENT_PENDING, it->token);
                kv__sidx_del_at(&s->idx, v->ns, v->id.bytes, index, KV__ENT_CANCELLED, it->token);
                continue;
            }
            struct kv__sent e;
            kv__ssd_put_entry(q, &e);
            if (!kv__sidx_store(&s->idx, &e, KV__ENT_PENDING, it->token))
                undo[nundo++] = e;   /* CANCELLED: removed while being written */
        }
        atomic_fetch_add(ok ? &s->spills : &s->spill_drops, 1);
    }
    return nundo;
}

static void *writer_main(void *arg)
{
    struct kv__ssd *s = arg;
    pthread_mutex_lock(&s->qmu);
    for (;;) {
        /* Only this thread takes items, and it retires a batch before taking
         * the next, so the queue's head is never in flight here. */
        while (!s->qhead && !s->closing)
            pthread_cond_wait(&s->qcv, &s->qmu);
        if (!s->qhead)
            break;   /* closing and drained */
        struct kv__sq_item *first = s->qhead, *last = NULL;
        uint64_t taken = 0;
        size_t ntaken = 0;
        for (struct kv__sq_item *it = first;
             it && (taken == 0 || taken + it->bytes <= s->tune.batch_bytes); it = it->next) {
            it->inflight = true;
            taken += it->bytes;
            ntaken++;
            last = it;
        }
        uint64_t disk = 0;
        size_t np = count_puts(first, ntaken, &disk);
        pthread_mutex_unlock(&s->qmu);

        struct kv__sput *p = calloc(np ? np : 1, sizeof *p);
        kv_iov *iov = calloc(np ? np : 1, sizeof *iov);
        struct kv__sent *undo = calloc(np ? np : 1, sizeof *undo);
        int rc = p && iov && undo ? write_items(s, first, ntaken, p, iov, np, disk) : KV_ENOMEM;
        if (rc == KV_ENOMEM && !(p && iov && undo)) {
            free(p);
            p = NULL;
            np = 0;
        }

        pthread_mutex_lock(&s->qmu);
        size_t nundo = settle_items(s, first, last, p, np, undo);   /* p NULL: none written */
        /* Unlinked before release: no reader copies from them after it. */
        s->qhead = last->next;
        if (!s->qhead)
            s->qtail = NULL;
        pthread_mutex_unlock(&s->qmu);

        if (rc != KV_OK)
            KV_WARN("ssd: spill batch of %llu bytes not (fully) written: %s",
                    (unsigned long long)taken, kv_strerror(rc));
        /* The CANCELLED claims are still ours: delete what we wrote, then
         * let the entries go. */
        kv__ssd_unput(s, undo, nundo, true);
        struct kv__sq_item *nx;
        for (struct kv__sq_item *it = first; ntaken > 0; it = nx) {
            nx = --ntaken ? it->next : NULL;
            for (size_t u = 0; u < nundo; u++)
                if (undo[u].ns == (unsigned)it->v->ns &&
                    memcmp(undo[u].id, it->v->id.bytes, KV_BLOCK_ID_LEN) == 0)
                    kv__sidx_del_at(&s->idx, it->v->ns, undo[u].id, undo[u].index,
                                    KV__ENT_CANCELLED, it->token);
            it->v->release(it->v);
            free(it);
        }
        free(p);
        free(iov);
        free(undo);
        pthread_mutex_lock(&s->qmu);
        /* Counted out only now that release() has run: drain's "bytes still
         * held" means DRAM the engine cannot reuse yet. */
        s->qbytes -= taken;
        pthread_cond_broadcast(&s->dcv);
    }
    pthread_mutex_unlock(&s->qmu);
    return NULL;
}

int kv__spill_start(struct kv__ssd *s)
{
    s->writer_running = pthread_create(&s->writer, NULL, writer_main, s) == 0;
    return s->writer_running ? KV_OK : KV_ENOMEM;
}

void kv__spill_stop(struct kv__ssd *s)
{
    pthread_mutex_lock(&s->qmu);
    s->closing = true;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    if (s->writer_running)
        pthread_join(s->writer, NULL);
    s->writer_running = false;
}

int kv__spill_read(struct kv__ssd *s, int ns, const uint8_t *id, uint32_t index,
                   const kv_iov *iov, uint32_t iovcnt)
{
    int rc = KV_ENOTFOUND;
    pthread_mutex_lock(&s->qmu);
    for (struct kv__sq_item *it = s->qhead; it && rc != KV_OK; it = it->next) {
        struct kv__victim *v = it->v;
        if (v->ns != ns || memcmp(v->id.bytes, id, KV_BLOCK_ID_LEN) != 0)
            continue;
        for (uint32_t i = 0; i < v->nshards; i++) {
            if (v->shards[i].index == index &&
                (it->skip[i] == SKIP_NO || it->skip[i] == SKIP_STOLEN)) {
                if (kv__iov_len(iov, iovcnt) != v->shards[i].len) {
                    rc = KV_EINVAL;
                    break;
                }
                kv__iov_scatter(iov, iovcnt, v->shards[i].data);
                rc = KV_OK;
                break;
            }
        }
    }
    pthread_mutex_unlock(&s->qmu);
    return rc;
}

size_t kv__spill_cancel(struct kv__ssd *s, int ns, const uint8_t *id, uint32_t index)
{
    size_t n = 0;
    pthread_mutex_lock(&s->qmu);
    for (struct kv__sq_item *it = s->qhead; it; it = it->next) {
        struct kv__victim *v = it->v;
        if (v->ns != ns || memcmp(v->id.bytes, id, KV_BLOCK_ID_LEN) != 0)
            continue;
        for (uint32_t i = 0; i < v->nshards; i++) {
            uint32_t idx = v->shards[i].index;
            if ((index != UINT32_MAX && idx != index) || it->skip[i] != SKIP_NO)
                continue;
            if (it->inflight) {
                n += kv__sidx_swap(&s->idx, ns, id, idx, KV__ENT_PENDING, it->token,
                                   KV__ENT_CANCELLED, it->token, NULL);
            } else {
                it->skip[i] = SKIP_CANCELLED;
                n += kv__sidx_del_at(&s->idx, ns, id, idx, KV__ENT_PENDING, it->token);
            }
        }
    }
    pthread_mutex_unlock(&s->qmu);
    return n;
}

int kv__spill_steal(struct kv__ssd *s, int ns, const uint8_t *id, uint32_t index, uint64_t token)
{
    int rc = KV_ENOTFOUND;
    pthread_mutex_lock(&s->qmu);
    for (struct kv__sq_item *it = s->qhead; it && rc == KV_ENOTFOUND; it = it->next) {
        struct kv__victim *v = it->v;
        if (v->ns != ns || memcmp(v->id.bytes, id, KV_BLOCK_ID_LEN) != 0)
            continue;
        for (uint32_t i = 0; i < v->nshards; i++) {
            if (v->shards[i].index != index || it->skip[i] != SKIP_NO)
                continue;
            if (it->inflight) {
                rc = KV_EBUSY;
            } else if (kv__sidx_swap(&s->idx, ns, id, index, KV__ENT_PENDING, it->token,
                                     KV__ENT_WRITING, token, NULL)) {
                it->skip[i] = SKIP_STOLEN;
                rc = KV_OK;
            }
            break;
        }
    }
    pthread_mutex_unlock(&s->qmu);
    return rc;
}
