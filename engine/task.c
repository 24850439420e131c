/*
 * task.c — task handles, the worker pool, check and wait.
 *
 * Handles come from a 64-bit counter starting at 1: never 0, never reused.
 * The handle table is striped by handle so that check and wait from many
 * threads rarely meet. A task is owned by two references: the handle's
 * (dropped by the wait that consumes it, or by kv__pool_stop) and the
 * execution's (dropped when the last chunk finishes). Whoever drops the last
 * one frees it.
 *
 * Waking a worker costs more than a small task. A kv_dump of 8 x 64 KiB
 * copies in ~40 us; the futex wake of an idle worker, and the worker then
 * taking a CPU from the caller on a busy machine, cost 10-20 us of it (the
 * caller's wait had usually claimed the task first anyway: the wake bought
 * nothing). So while tasks keep coming, one idle worker stays on standby:
 * it sleeps STANDBY_NS at a time, looking at the queue when it wakes, and
 * a small task (one chunk) submitted while it stands by wakes nobody. Such
 * a task is started by whichever comes first, the caller's kv_wait or the
 * standby, so it starts at most STANDBY_NS after its submission even when
 * nobody waits for it; an engine idle for ACTIVE_NS has no standby and the
 * next task wakes a worker at once, as a large task always does.
 *
 * Cancellation (a wait that times out): the waiter marks the task
 * cancelled; chunks claimed afterwards fail without touching the caller's
 * buffers, chunks already running finish, and the waiter waits for that
 * (the drain) before returning, so the buffers are free when it returns.
 */
#include <errno.h>
#include <stdlib.h>

#include "task.h"

#define STRIPES 16
#define STANDBY_NS 200000u        /* the standby worker's look at the queue */
#define ACTIVE_NS 2000000u        /* a standby while tasks came this recently */

struct stripe {
    pthread_mutex_t lock;
    struct kv__task **b;
    uint32_t mask;
    uint32_t count;
} __attribute__((aligned(64)));

struct kv__pool {
    struct kv__pool_ops ops;
    uint64_t timeout_ns;
    pthread_mutex_t qlock;
    pthread_cond_t qcv;
    struct kv__task *qhead, *qtail;
    uint64_t last_submit_ns;      /* qlock */
    unsigned standby;             /* workers in the standby's timed sleep (qlock) */
    bool stopping;
    unsigned nthreads;
    pthread_t *threads;
    _Atomic uint64_t next_id;
    _Atomic uint64_t inflight;
    struct stripe st[STRIPES];
};

static void task_unref(struct kv__task *t)
{
    if (atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->shards);
    free(t->ids);
    free(t);
}

void kv__task_fail(struct kv__task *t, int err)
{
    int ok = KV_OK;
    atomic_compare_exchange_strong(&t->result, &ok, err);
}

int kv__task_new(struct kv__task **out, int kind, int ns, const kv_shard *shards,
                 const kv_block_id *ids, size_t n)
{
    *out = NULL;
    struct kv__task *t = calloc(1, sizeof *t);
    if (!t)
        return KV_ENOMEM;
    t->kind = kind;
    t->ns = ns;
    t->n = n;
    if (shards) {
        /* One allocation: the shard array, then every iovec after it. */
        size_t niov = 0;
        for (size_t i = 0; i < n; i++)
            niov += shards[i].iovcnt;
        t->shards = malloc(n * sizeof *shards + niov * sizeof(kv_iov));
        if (!t->shards) {
            free(t);
            return KV_ENOMEM;
        }
        kv_iov *iov = (kv_iov *)(t->shards + n);
        for (size_t i = 0; i < n; i++) {
            t->shards[i] = shards[i];
            memcpy(iov, shards[i].iov, shards[i].iovcnt * sizeof *iov);
            t->shards[i].iov = iov;
            iov += shards[i].iovcnt;
        }
    }
    if (ids) {
        t->ids = malloc(n * sizeof *ids);
        if (!t->ids) {
            free(t->shards);
            free(t);
            return KV_ENOMEM;
        }
        memcpy(t->ids, ids, n * sizeof *ids);
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    atomic_init(&t->refs, 3);
    *out = t;
    return KV_OK;
}

static void mark_started(struct kv__task *t)
{
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&t->start_ns, &zero, kv__now_ns());
}

static void complete(struct kv__pool *p, struct kv__task *t)
{
    t->done_ns = kv__now_ns();
    p->ops.finish(p->ops.ctx, t);
    /* Before done: a waiter woken by the broadcast may read the gauge at
     * once (kv_stats_get right after kv_wait), and must not count its own
     * task. */
    atomic_fetch_sub(&p->inflight, 1);
    pthread_mutex_lock(&t->mu);
    t->done = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    task_unref(t);
}

/* Claims and runs chunks until none is left; returns when nothing is left
 * to claim (other threads may still be running theirs). */
static void work_on(struct kv__pool *p, struct kv__task *t)
{
    for (;;) {
        size_t begin = atomic_fetch_add(&t->next, t->chunk);
        if (begin >= t->n)
            return;
        size_t end = begin + t->chunk < t->n ? begin + t->chunk : t->n;
        if (atomic_load(&t->cancelled) ||
            (p->timeout_ns && kv__now_ns() - t->submit_ns > p->timeout_ns))
            kv__task_fail(t, KV_ETIMEDOUT);
        else
            p->ops.run(p->ops.ctx, t, begin, end);
        if (atomic_fetch_add(&t->finished, end - begin) + (end - begin) == t->n) {
            complete(p, t);
            return;
        }
    }
}

static void *worker(void *arg)
{
    struct kv__pool *p = arg;
    pthread_mutex_lock(&p->qlock);
    for (;;) {
        while (!p->qhead && !p->stopping) {
            uint64_t now = kv__now_ns();
            if (p->standby > 0 || now - p->last_submit_ns > ACTIVE_NS) {
                pthread_cond_wait(&p->qcv, &p->qlock);
                continue;
            }
            /* The standby (see the top): a timed sleep; a task queued
             * meanwhile without a wake is found when it ends. */
            uint64_t at = now + STANDBY_NS;
            struct timespec dl = { (time_t)(at / 1000000000u), (long)(at % 1000000000u) };
            p->standby++;
            pthread_cond_timedwait(&p->qcv, &p->qlock, &dl);
            p->standby--;
        }
        struct kv__task *t = p->qhead;
        if (!t)
            break;                          /* stopping and drained */
        /* Our own reference while we work; the queue's is ours to drop
         * when we are the last worker the task asked for. */
        atomic_fetch_add(&t->refs, 1);
        bool dequeued = --t->want == 0;
        if (dequeued) {
            p->qhead = t->qnext;
            if (!p->qhead)
                p->qtail = NULL;
        }
        pthread_mutex_unlock(&p->qlock);
        if (dequeued)
            task_unref(t);
        mark_started(t);
        work_on(p, t);
        task_unref(t);
        pthread_mutex_lock(&p->qlock);
    }
    pthread_mutex_unlock(&p->qlock);
    return NULL;
}

int kv__pool_start(struct kv__pool **out, unsigned threads, uint64_t timeout_ms,
                   struct kv__pool_ops ops)
{
    *out = NULL;
    struct kv__pool *p = calloc(1, sizeof *p);
    if (!p)
        return KV_ENOMEM;
    p->ops = ops;
    p->timeout_ns = timeout_ms * 1000000u;
    pthread_mutex_init(&p->qlock, NULL);
    /* The standby's deadline is a kv__now_ns() (CLOCK_MONOTONIC). */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->qcv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&p->next_id, 1);
    for (int i = 0; i < STRIPES; i++) {
        pthread_mutex_init(&p->st[i].lock, NULL);
        p->st[i].mask = 63;
        p->st[i].b = calloc(64, sizeof *p->st[i].b);
        if (!p->st[i].b)
            goto fail;
    }
    p->threads = calloc(threads, sizeof *p->threads);
    if (!p->threads)
        goto fail;
    for (unsigned i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0)
            goto fail;
        p->nthreads++;
    }
    *out = p;
    return KV_OK;
fail:
    kv__pool_stop(p);
    return KV_ENOMEM;
}

void kv__pool_stop(struct kv__pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->qlock);
    p->stopping = true;
    pthread_cond_broadcast(&p->qcv);
    pthread_mutex_unlock(&p->qlock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    /* Workers drained the queue: every task is done; drop the handles'
     * references of those nobody waited for. */
    for (int i = 0; i < STRIPES; i++) {
        struct stripe *s = &p->st[i];
        for (uint32_t k = 0; s->b && k <= s->mask; k++) {
            for (struct kv__task *t = s->b[k], *next; t; t = next) {
                next = t->tnext;
                task_unref(t);
            }
        }
        free(s->b);
        pthread_mutex_destroy(&s->lock);
    }
    free(p->threads);
    pthread_mutex_destroy(&p->qlock);
    pthread_cond_destroy(&p->qcv);
    free(p);
}

static struct stripe *stripe_of(struct kv__pool *p, kv_task h)
{
    return &p->st[h % STRIPES];
}

static uint32_t slot_of(const struct stripe *s, kv_task h)
{
    return (uint32_t)(h / STRIPES) & s->mask;
}

static void stripe_grow(struct stripe *s)
{
    uint32_t n = (s->mask + 1) * 2;
    struct kv__task **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    for (uint32_t i = 0; i <= s->mask; i++) {
        for (struct kv__task *t = s->b[i], *next; t; t = next) {
            next = t->tnext;
            uint32_t k = (uint32_t)(t->id / STRIPES) & (n - 1);
            t->tnext = nb[k];
            nb[k] = t;
        }
    }
    free(s->b);
    s->b = nb;
    s->mask = n - 1;
}

int kv__pool_submit(struct kv__pool *p, struct kv__task *t, kv_task *handle)
{
    uint64_t bytes = 0;
    for (size_t i = 0; t->shards && i < t->n; i++)
        bytes += kv__iov_len(t->shards[i].iov, t->shards[i].iovcnt);
    size_t pieces = bytes / KV__CHUNK_BYTES + 1;
    if (pieces > t->n)
        pieces = t->n;
    if (pieces > p->nthreads)
        pieces = p->nthreads;
    if (pieces == 0)
        pieces = 1;
    /* A small task (under KV__CHUNK_BYTES) is one chunk: whoever claims it first
     * (a worker, or the caller waiting for it) runs all of it, so a cluster
     * batch goes to each owner in one frame. Larger ones are cut into two
     * chunks per worker, so the caller can help too, unless whole. */
    t->chunk = bytes < KV__CHUNK_BYTES || t->whole ? t->n : (t->n + pieces * 2 - 1) / (pieces * 2);
    if (t->chunk == 0)
        t->chunk = 1;
    t->want = (int)pieces;
    t->submit_ns = kv__now_ns();
    t->id = atomic_fetch_add(&p->next_id, 1);
    *handle = t->id;

    struct stripe *s = stripe_of(p, t->id);
    pthread_mutex_lock(&s->lock);
    uint32_t k = slot_of(s, t->id);
    t->tnext = s->b[k];
    s->b[k] = t;
    if (++s->count > s->mask + 1)
        stripe_grow(s);
    pthread_mutex_unlock(&s->lock);

    atomic_fetch_add(&p->inflight, 1);
    pthread_mutex_lock(&p->qlock);
    t->qnext = NULL;
    if (p->qtail)
        p->qtail->qnext = t;
    else
        p->qhead = t;
    p->qtail = t;
    p->last_submit_ns = t->submit_ns;
    /* One chunk with a standby: it or the caller's wait will start it. */
    if (pieces > 1)
        pthread_cond_broadcast(&p->qcv);
    else if (p->standby == 0)
        pthread_cond_signal(&p->qcv);
    pthread_mutex_unlock(&p->qlock);
    return KV_OK;
}

/* Finds a handle; with take, also removes it (the wait that consumes it). */
static struct kv__task *lookup(struct kv__pool *p, kv_task h, bool take)
{
    struct stripe *s = stripe_of(p, h);
    pthread_mutex_lock(&s->lock);
    struct kv__task **pp = &s->b[slot_of(s, h)];
    while (*pp && (*pp)->id != h)
        pp = &(*pp)->tnext;
    struct kv__task *t = *pp;
    if (t && take) {
        *pp = t->tnext;
        s->count--;
    }
    pthread_mutex_unlock(&s->lock);
    return t;
}

int kv__pool_check(struct kv__pool *p, kv_task h, int *done)
{
    struct stripe *s = stripe_of(p, h);
    pthread_mutex_lock(&s->lock);
    struct kv__task *t = s->b[slot_of(s, h)];
    while (t && t->id != h)
        t = t->tnext;
    int rc = KV_ENOTFOUND;
    if (t) {
        /* Read under the stripe lock: the handle's reference cannot be
         * dropped while we hold it (wait takes the task out under it). */
        *done = atomic_load(&t->finished) == t->n;
        rc = KV_OK;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Takes a one-chunk task out of the queue before its caller runs it: no
 * worker need look at it, and it is freed by the thread that made it (a
 * worker's free of it would send its memory to that worker's cache, and
 * the caller's next task would start in cold memory). */
static void unqueue(struct kv__pool *p, struct kv__task *t)
{
    bool found = false;
    pthread_mutex_lock(&p->qlock);
    for (struct kv__task **pp = &p->qhead, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->qnext) {
        if (*pp != t)
            continue;
        *pp = t->qnext;
        if (p->qtail == t)
            p->qtail = prev;
        t->want = 0;
        found = true;
        break;
    }
    pthread_mutex_unlock(&p->qlock);
    if (found)
        task_unref(t);                  /* the queue's reference */
}

int kv__pool_wait(struct kv__pool *p, kv_task h, unsigned timeout_ms)
{
    struct kv__task *t = lookup(p, h, true);
    if (!t)
        return KV_ENOTFOUND;
    if (timeout_ms == 0) {
        /* Help: run whatever nobody has claimed yet on this thread. Safe,
         * since we hold the handle's reference. */
        if (t->chunk >= t->n && atomic_load(&t->next) == 0)
            unqueue(p, t);
        mark_started(t);
        work_on(p, t);
    }
    bool timed_out = false;
    pthread_mutex_lock(&t->mu);
    if (timeout_ms) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)(timeout_ms % 1000) * 1000000u;
        dl.tv_sec += timeout_ms / 1000 + (time_t)(ns / 1000000000u);
        dl.tv_nsec = (long)(ns % 1000000000u);
        while (!t->done) {
            if (pthread_cond_timedwait(&t->cv, &t->mu, &dl) == ETIMEDOUT && !t->done) {
                timed_out = true;
                atomic_store(&t->cancelled, true);
                break;
            }
        }
    }
    while (!t->done)                    /* forever, or the drain */
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    int rc = timed_out ? KV_ETIMEDOUT : atomic_load(&t->result);
    task_unref(t);
    return rc;
}

uint64_t kv__pool_inflight(struct kv__pool *p)
{
    return atomic_load(&p->inflight);
}
