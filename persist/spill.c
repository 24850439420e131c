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
 * WriteBatch (one WAL record, one group commit); only after the batch is
 * written does it flip their entries to STORED, unlink them from the queue
 * and call release(). A victim that would push the queue past
 * ssd.spill_queue bytes is refused at once (released, counted in
 * spill_drops): the evictor never waits for the disk.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "ssd_int.h"

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
        /* Already on SSD (write-through, or spilled before): nothing to do
         * for this shard. Out of memory: not written, not indexed. */
        if (kv__sidx_insert(&s->idx, &e, NULL) == 1)
            towrite++;
        else
            it->skip[i] = 1;
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

/* Writes the n items from first (taken by the writer, qmu not held; the
 * last one's next may be changing under an accept, so count, not follow). */
static int write_items(struct kv__ssd *s, struct kv__sq_item *first, size_t n)
{
    uint64_t need = 0;
    struct kv__sq_item *it = first;
    for (size_t k = 0; k < n; k++, it = k < n ? it->next : NULL)
        for (uint32_t i = 0; i < it->v->nshards; i++)
            if (!it->skip[i])
                need += it->v->shards[i].len + 16;
    int rc = kv__ssd_make_room(s, 0, need);
    if (rc != KV_OK)
        return rc;
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    int expect = 0;
    it = first;
    for (size_t k = 0; k < n; k++, it = k < n ? it->next : NULL) {
        struct kv__victim *v = it->v;
        for (uint32_t i = 0; i < v->nshards; i++) {
            if (it->skip[i])
                continue;
            kv_iov iov = { (void *)v->shards[i].data, v->shards[i].len };
            kv__ssd_batch_put(wb, v->ns, v->id.bytes, v->shards[i].index, &iov, 1, iov.len,
                              it->stamp);
            expect += 2;
        }
    }
    rc = rocksdb_writebatch_count(wb) == expect ? kv__ssd_batch_write(s, wb) : KV_ENOMEM;
    rocksdb_writebatch_destroy(wb);
    return rc;
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
        pthread_mutex_unlock(&s->qmu);

        int rc = write_items(s, first, ntaken);

        struct kv__sent gone[64];
        size_t ngone = 0;
        pthread_mutex_lock(&s->qmu);
        for (struct kv__sq_item *it = first; it != last->next; it = it->next) {
            struct kv__victim *v = it->v;
            for (uint32_t i = 0; i < v->nshards; i++) {
                if (it->skip[i])
                    continue;
                uint32_t idx = v->shards[i].index;
                if (rc == KV_OK) {
                    /* Not PENDING any more: either a synchronous write made it
                     * STORED (fine) or a remove deleted it while in flight. */
                    if (!kv__sidx_transition(&s->idx, v->ns, v->id.bytes, idx, KV__ENT_PENDING,
                                             KV__ENT_STORED) &&
                        !kv__sidx_get(&s->idx, v->ns, v->id.bytes, idx, NULL) &&
                        ngone < KV__ARRAY_LEN(gone)) {
                        /* Removed while being written: undo on disk. */
                        memset(&gone[ngone], 0, sizeof gone[ngone]);
                        gone[ngone].ns = (unsigned)v->ns;
                        memcpy(gone[ngone].id, v->id.bytes, KV_BLOCK_ID_LEN);
                        gone[ngone].index = idx;
                        ngone++;
                    }
                } else {
                    kv__sidx_del(&s->idx, v->ns, v->id.bytes, idx, 1u << KV__ENT_PENDING, NULL);
                }
            }
            atomic_fetch_add(rc == KV_OK ? &s->spills : &s->spill_drops, 1);
        }
        /* Unlinked before release: no reader copies from them after it. */
        s->qhead = last->next;
        if (!s->qhead)
            s->qtail = NULL;
        pthread_mutex_unlock(&s->qmu);

        if (rc != KV_OK)
            KV_WARN("ssd: spill batch of %llu bytes not written: %s", (unsigned long long)taken,
                    kv_strerror(rc));
        struct kv__sq_item *nx;
        for (struct kv__sq_item *it = first; ntaken > 0; it = nx) {
            nx = --ntaken ? it->next : NULL;
            it->v->release(it->v);
            free(it);
        }
        kv__ssd_delete_keys(s, gone, ngone);
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
            if (v->shards[i].index == index && !it->skip[i]) {
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
        if (it->inflight || v->ns != ns || memcmp(v->id.bytes, id, KV_BLOCK_ID_LEN) != 0)
            continue;
        for (uint32_t i = 0; i < v->nshards; i++) {
            if ((index == UINT32_MAX || v->shards[i].index == index) && !it->skip[i]) {
                it->skip[i] = 1;
                n += kv__sidx_del(&s->idx, ns, id, v->shards[i].index, 1u << KV__ENT_PENDING, NULL);
            }
        }
    }
    pthread_mutex_unlock(&s->qmu);
    return n;
}
