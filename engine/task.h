/*
 * task.h — asynchronous tasks: handles, a worker pool, check and wait.
 *
 * A task is n items (shards or block ids) processed by a callback in
 * chunks. Workers claim chunks with an atomic counter, so one large task is
 * spread over several workers, and kv_wait's caller helps with chunks nobody
 * has claimed yet instead of sleeping (that saves two thread hand-offs per
 * task, which matter next to a 70 µs copy of 1 MiB).
 */
#ifndef KV_ENGINE_TASK_H
#define KV_ENGINE_TASK_H

#include "internal.h"

struct kv__task {
    kv_task id;
    int kind;                     /* the runner's (dump, load, prefetch) */
    int ns;
    size_t n;                     /* items */
    kv_shard *shards;             /* a copy of the caller's array, iovs too */
    kv_block_id *ids;             /* for id-only tasks (prefetch) */
    size_t chunk;                 /* items per claim */
    _Atomic size_t next;          /* next item to claim */
    _Atomic size_t finished;      /* items finished */
    _Atomic int result;           /* first failure, else KV_OK */
    _Atomic uint32_t misses;      /* shards not found (load) */
    _Atomic uint32_t skipped;     /* shards already present (dump) */
    int *results;                 /* per item outcome, written by run(), when
                                     the submitter wants one (kv__run_items) */
    atomic_bool cancelled;
    bool whole;                   /* one chunk, whatever its size (set before submit) */
    int want;                     /* workers still to take it (queue lock) */
    bool done;                    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int refs;             /* the handle's, the execution's, the queue's */
    uint64_t submit_ns, done_ns;
    _Atomic uint64_t start_ns;    /* set by whoever starts it first */
    struct kv__task *qnext, *tnext;
};

struct kv__pool;

/* A task is spread over the workers in pieces of about this many bytes; a
 * smaller one is a single chunk, run whole by whichever thread claims it. */
#define KV__CHUNK_BYTES (1u << 20)

/* run() processes items [begin, end) and records failures with
 * kv__task_fail; finish() is called once when the task is done. */
struct kv__pool_ops {
    void *ctx;
    void (*run)(void *ctx, struct kv__task *t, size_t begin, size_t end);
    void (*finish)(void *ctx, struct kv__task *t);
};

/* timeout_ms (io.timeout_ms): a task not finished that long after it was
 * submitted fails its remaining items with KV_ETIMEDOUT; 0 = no limit. */
int  kv__pool_start(struct kv__pool **out, unsigned threads, uint64_t timeout_ms,
                    struct kv__pool_ops ops);
/* Runs every queued task to completion, joins the workers, frees all tasks
 * (including finished ones nobody waited for). */
void kv__pool_stop(struct kv__pool *p);

/* A new task with n items, shards copied (with their iovecs) when given. */
int  kv__task_new(struct kv__task **out, int kind, int ns, const kv_shard *shards,
                  const kv_block_id *ids, size_t n);
/* Gives the task a handle and queues it; the pool owns it from here on. */
int  kv__pool_submit(struct kv__pool *p, struct kv__task *t, kv_task *handle);
void kv__task_fail(struct kv__task *t, int err);

int  kv__pool_check(struct kv__pool *p, kv_task h, int *done);
int  kv__pool_wait(struct kv__pool *p, kv_task h, unsigned timeout_ms);
uint64_t kv__pool_inflight(struct kv__pool *p);

#endif
