/*
 * jobs.c — the benchmark's job threads: their buffers, the objects
 * they own, and one timed phase at a time.
 *
 * Key design choices:
 * - Every job allocates and touches its buffers once, before anything is
 *   timed (first touch of fresh memory is slow and would be measured
 *   otherwise), and reuses them in every phase and against every backend.
 * - Object k's value is the job's value buffer with its first 64 bytes
 *   replaced by a header naming the object (block id, k). A write is a
 *   two-iov shard (the header, then the shared rest), so writes need one
 *   value buffer per job however large the batch, and a read can be
 *   verified completely: a value that came back for the wrong block, torn,
 *   or stale fails the header or the bytes after it. The rest of the value
 *   is the same for every object (--pattern, or fixed pseudo-random bytes),
 *   so any job can verify any object.
 * - Block ids are a hash of (salt, k): the same blocks for every backend of
 *   one invocation, different ones across invocations.
 */
#include "bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HDR 64u                     /* bytes of a value that name the object */
#define PH_MEMCPY ((enum kvctl_phase_kind)100)

/* What one job counted in one phase (mixed_rw: [0] reads, [1] writes). */
struct jstat {
    uint64_t ops, bytes, misses, verr, errs;
    int first_err;
    uint64_t *lat;                  /* ns per task: a uniform sample of at most LAT_KEEP */
    size_t nlat, cap;
    uint64_t seen, rng;             /* tasks timed; the sample's random state */
    uint64_t ns;                    /* all the tasks' time */
};

/* Latencies kept per job and phase, at most: past this a reservoir keeps a
 * uniform sample (plenty for p99), so a bench of any length holds bounded
 * memory (the soak, scripts/soak.sh, runs one for 10 minutes). */
#define LAT_KEEP 16384u

struct job {
    struct kvctl_jobs *js;
    unsigned idx;
    pthread_t th;
    uint8_t *payload;               /* value_size: the bytes every value shares */
    uint8_t *hdr;                   /* slots * HDR: headers of a write batch */
    uint8_t *rbuf;                  /* slots * value_size: read destinations */
    uint8_t *wbuf;                  /* --kv-buffers: slots * value_size of the backend's */
    void *wbuf_st;                  /* the open backend wbuf belongs to */
    uint8_t *wbuf2;                 /* write_kvbuf against js->st2: its buffers */
    void *wbuf2_st;
    uint8_t *mdst;                  /* memcpy baseline: its own destinations */
    uint64_t mslots;                /* values mdst holds */
    kv_iov *wiov;                   /* slots * 2 */
    kv_iov *riov;                   /* slots */
    kv_shard *sh;                   /* slots */
    uint64_t *obj;                  /* slots: object numbers in the batch */
    int *res;                       /* slots */
    kv_block_id *ids;               /* batch_size: a lookup batch */
    uint8_t *hit;                   /* batch_size */
    uint64_t lo, hi;                /* objects [lo, hi) are this job's */
    uint64_t written;               /* [lo, lo + written) were written */
    uint64_t seq, rng;              /* mixed_rw: fresh writes, random reads */
    struct jstat st[2];
    uint64_t end_ns;
};

struct kvctl_jobs {
    struct kvctl_workload w;
    unsigned slots;                 /* objects per read/write batch */
    struct job *job;
    /* the phase being run */
    const struct kvctl_backend *be;
    void *st;
    /* The in-process engine a write_kvbuf phase alternates with, batch by
     * batch (kvctl_jobs_set_alternate); NULL: none. */
    const struct kvctl_backend *be2;
    void *st2;
    enum kvctl_phase_kind kind;
    pthread_barrier_t go;
    uint64_t t0, deadline;          /* ns; deadline 0 = none */
    _Atomic uint64_t progress;      /* items done, for the progress line */
    _Atomic unsigned finished;
};

/* ---- objects ------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

kv_block_id kvctl_object_id(uint64_t salt, uint64_t k)
{
    kv_block_id id;
    uint64_t a = mix64(salt ^ mix64(k)), b = mix64(a ^ k);
    memcpy(id.bytes, &a, 8);
    memcpy(id.bytes + 8, &b, 8);
    return id;
}

/* The first min(HDR, value_size) bytes of object k's value. */
static void object_header(const struct job *jb, uint64_t k, const kv_block_id *id, uint8_t *out)
{
    uint8_t h[HDR];
    size_t n = jb->js->w.value_size < HDR ? jb->js->w.value_size : HDR;
    memcpy(h, jb->payload, n);
    memcpy(h, id->bytes, KV_BLOCK_ID_LEN);
    memcpy(h + KV_BLOCK_ID_LEN, &k, sizeof k);
    memcpy(out, h, n);
}

void kvctl_fill_payload(uint8_t *p, uint64_t len, int pattern)
{
    if (pattern >= 0) {
        memset(p, pattern, len);
        return;
    }
    /* Fixed pseudo-random bytes: incompressible, and the same in every job
     * so that any job can verify what another wrote. */
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (uint64_t i = 0; i < len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, len - i < 8 ? len - i : 8);
    }
}

/* ---- setup --------------------------------------------------------------- */

static void *alloc_touch(size_t n)
{
    void *p = NULL;
    if (n == 0)
        n = 1;
    if (posix_memalign(&p, 4096, n) != 0)
        return NULL;
    memset(p, 0, n);
    return p;
}

int kvctl_jobs_new(const struct kvctl_workload *w, struct kvctl_jobs **out)
{
    *out = NULL;
    struct kvctl_jobs *js = calloc(1, sizeof *js);
    if (!js)
        return KV_ENOMEM;
    js->w = *w;
    uint64_t per_job = (w->nr_objects + w->numjobs - 1) / w->numjobs;
    js->slots = (unsigned)(w->batch_size < per_job ? w->batch_size : (per_job ? per_job : 1));
    js->job = calloc(w->numjobs, sizeof *js->job);
    if (!js->job)
        goto fail;
    for (unsigned i = 0; i < w->numjobs; i++) {
        struct job *jb = &js->job[i];
        size_t s = js->slots;
        jb->js = js;
        jb->idx = i;
        jb->lo = w->nr_objects * i / w->numjobs;
        jb->hi = w->nr_objects * (i + 1) / w->numjobs;
        jb->rng = mix64(w->salt + i + 1);
        jb->payload = alloc_touch(w->value_size);
        jb->hdr = alloc_touch(s * HDR);
        jb->rbuf = alloc_touch(s * w->value_size);
        jb->wiov = calloc(s * 2, sizeof *jb->wiov);
        jb->riov = calloc(s, sizeof *jb->riov);
        jb->sh = calloc(s, sizeof *jb->sh);
        jb->obj = calloc(s, sizeof *jb->obj);
        jb->res = calloc(s, sizeof *jb->res);
        jb->ids = calloc(w->batch_size, sizeof *jb->ids);
        jb->hit = calloc(w->batch_size, 1);
        if (!jb->payload || !jb->hdr || !jb->rbuf || !jb->wiov || !jb->riov || !jb->sh ||
            !jb->obj || !jb->res || !jb->ids || !jb->hit)
            goto fail;
        kvctl_fill_payload(jb->payload, w->value_size, w->pattern);
    }
    *out = js;
    return KV_OK;
fail:
    kvctl_jobs_free(js);
    return KV_ENOMEM;
}

void kvctl_jobs_free(struct kvctl_jobs *js)
{
    if (!js)
        return;
    for (unsigned i = 0; js->job && i < js->w.numjobs; i++) {
        struct job *jb = &js->job[i];
        void *bufs[] = { jb->payload, jb->hdr, jb->rbuf, jb->wiov, jb->riov, jb->sh,
                         jb->obj, jb->res, jb->ids, jb->hit, jb->st[0].lat, jb->st[1].lat };
        for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
            free(bufs[b]);
    }
    free(js->job);
    free(js);
}

void kvctl_jobs_reset(struct kvctl_jobs *js)
{
    for (unsigned i = 0; i < js->w.numjobs; i++) {
        js->job[i].written = js->job[i].seq = 0;
        js->job[i].wbuf = NULL;   /* the backend it came from is closed (or about to be) */
        js->job[i].wbuf_st = NULL;
        js->job[i].wbuf2 = NULL;
        js->job[i].wbuf2_st = NULL;
    }
}

void kvctl_jobs_set_alternate(struct kvctl_jobs *js, const struct kvctl_backend *be, void *st)
{
    js->be2 = st ? be : NULL;
    js->st2 = st;
    for (unsigned i = 0; !st && i < js->w.numjobs; i++) {
        js->job[i].wbuf2 = NULL;   /* its backend is about to close */
        js->job[i].wbuf2_st = NULL;
    }
}

/* ---- one batch ----------------------------------------------------------- */

static bool out_of_time(const struct kvctl_jobs *js)
{
    return js->deadline && kvctl_now_ns() >= js->deadline;
}

static void record(struct jstat *s, uint64_t ns)
{
    s->ns += ns;
    if (s->seen++ >= LAT_KEEP) {
        /* Algorithm R: the task replaces a kept one with chance keep/seen. */
        s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t j = (s->rng >> 11) % s->seen;
        if (j < s->nlat)
            s->lat[j] = ns;
        return;
    }
    if (s->nlat == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        uint64_t *n = realloc(s->lat, cap * sizeof *n);
        if (!n)
            return;     /* the percentiles lose a sample, nothing else */
        s->lat = n;
        s->cap = cap;
    }
    s->lat[s->nlat++] = ns;
}

static void count_error(struct jstat *s, int rc)
{
    if (s->errs++ == 0)
        s->first_err = rc;
}

/* Objects of the write_kvbuf phase: numbered from here, so that they are
 * new to a store that holds the run's other objects (a dump of a present
 * shard is skipped, and would measure nothing). */
#define KVBUF_FIRST (1ull << 48)

/* Whether this phase writes from the backend's buffers. */
static bool from_kv_buffers(const struct job *jb, const uint8_t *wbuf)
{
    return wbuf && (jb->js->w.kv_buffers || jb->js->kind == KVCTL_PH_WRITE_KVBUF);
}

/* Writes objects jb->obj[0..m) to backend be's st, from wbuf (its
 * buffers) when the phase writes from them. */
static void write_batch_to(struct job *jb, const struct kvctl_backend *be, void *st,
                           uint8_t *wbuf, size_t m, struct jstat *s)
{
    struct kvctl_jobs *js = jb->js;
    uint64_t vs = js->w.value_size;
    bool kvbuf = from_kv_buffers(jb, wbuf);
    for (size_t i = 0; i < m; i++) {
        kv_shard *sh = &jb->sh[i];
        uint8_t *h = jb->hdr + i * HDR;
        sh->block = kvctl_object_id(js->w.salt, jb->obj[i]);
        sh->index = 0;
        if (kvbuf) {   /* the value lies whole in shared memory: one iovec */
            uint8_t *v = wbuf + i * vs;
            object_header(jb, jb->obj[i], &sh->block, v);
            jb->wiov[2 * i] = (kv_iov){ v, vs };
            sh->iov = &jb->wiov[2 * i];
            sh->iovcnt = 1;
            continue;
        }
        object_header(jb, jb->obj[i], &sh->block, h);
        jb->wiov[2 * i] = (kv_iov){ h, vs < HDR ? vs : HDR };
        jb->wiov[2 * i + 1] = (kv_iov){ jb->payload + HDR, vs > HDR ? vs - HDR : 0 };
        sh->iov = &jb->wiov[2 * i];
        sh->iovcnt = vs > HDR ? 2 : 1;
    }
    uint64_t t = kvctl_now_ns();
    be->put(st, jb->sh, m, jb->res);
    record(s, kvctl_now_ns() - t);
    for (size_t i = 0; i < m; i++) {
        if (jb->res[i] == KV_OK)
            s->bytes += vs;
        else
            count_error(s, jb->res[i]);
    }
    s->ops += m;
}

static void write_batch(struct job *jb, size_t m, struct jstat *s)
{
    write_batch_to(jb, jb->js->be, jb->js->st, jb->wbuf, m, s);
}

static bool verify_one(const struct job *jb, uint64_t k, const kv_block_id *id, const uint8_t *v)
{
    uint64_t vs = jb->js->w.value_size;
    uint8_t h[HDR];
    object_header(jb, k, id, h);
    size_t hn = vs < HDR ? vs : HDR;
    return memcmp(v, h, hn) == 0 && memcmp(v + hn, jb->payload + hn, vs - hn) == 0;
}

/* Reads objects jb->obj[0..m) into the job's destinations. */
static void read_batch(struct job *jb, size_t m, struct jstat *s)
{
    struct kvctl_jobs *js = jb->js;
    uint64_t vs = js->w.value_size;
    for (size_t i = 0; i < m; i++) {
        kv_shard *sh = &jb->sh[i];
        sh->block = kvctl_object_id(js->w.salt, jb->obj[i]);
        sh->index = 0;
        jb->riov[i] = (kv_iov){ jb->rbuf + i * vs, vs };
        sh->iov = &jb->riov[i];
        sh->iovcnt = 1;
    }
    uint64_t t = kvctl_now_ns();
    js->be->get(js->st, jb->sh, m, jb->res);
    record(s, kvctl_now_ns() - t);
    for (size_t i = 0; i < m; i++) {
        if (jb->res[i] == KV_OK) {
            s->bytes += vs;
            if (js->w.verify && !verify_one(jb, jb->obj[i], &jb->sh[i].block, jb->rbuf + i * vs))
                s->verr++;
        } else if (jb->res[i] == KV_ENOTFOUND) {
            s->misses++;
        } else {
            count_error(s, jb->res[i]);
        }
    }
    s->ops += m;
}

static void lookup_batch(struct job *jb, uint64_t first, size_t m, struct jstat *s)
{
    struct kvctl_jobs *js = jb->js;
    for (size_t i = 0; i < m; i++)
        jb->ids[i] = kvctl_object_id(js->w.salt, first + i);
    uint64_t t = kvctl_now_ns();
    int rc = js->be->lookup(js->st, jb->ids, m, jb->hit);
    record(s, kvctl_now_ns() - t);
    s->ops += m;
    if (rc != KV_OK) {
        count_error(s, rc);
        s->errs += m - 1;
        return;
    }
    for (size_t i = 0; i < m; i++)
        s->misses += !jb->hit[i];
}

/* ---- phases -------------------------------------------------------------- */

static void progress_add(struct kvctl_jobs *js, uint64_t n)
{
    atomic_fetch_add_explicit(&js->progress, n, memory_order_relaxed);
}

static void run_write(struct job *jb)
{
    struct kvctl_jobs *js = jb->js;
    for (uint64_t k = jb->lo; k < jb->hi && !out_of_time(js);) {
        size_t m = jb->hi - k < js->slots ? jb->hi - k : js->slots;
        for (size_t i = 0; i < m; i++)
            jb->obj[i] = k + i;
        write_batch(jb, m, &jb->st[0]);
        k += m;
        jb->written = k - jb->lo;
        progress_add(js, m);
    }
}

/* Every object of the job's range again, as new objects (KVBUF_FIRST on),
 * from the backend's buffers; what the other phases read is untouched.
 * With an alternate (js->st2, an in-process engine), each batch is written
 * to both, the two in turn (ABBA), timed into st[0] and st[1]: both see
 * the machine's drift alike, where two phases one after the other did
 * not (doc/perf.md, "Attached dumps, ninth round"). */
static void run_write_kvbuf(struct job *jb)
{
    struct kvctl_jobs *js = jb->js;
    bool ab = js->st2 && jb->wbuf2;
    for (uint64_t k = jb->lo, n = 0; k < jb->hi && !out_of_time(js); n++) {
        size_t m = jb->hi - k < js->slots ? jb->hi - k : js->slots;
        for (size_t i = 0; i < m; i++)
            jb->obj[i] = KVBUF_FIRST + k + i;
        for (int side = 0; side < (ab ? 2 : 1); side++) {
            bool alt = ab && (side == 0) == (n % 2 == 1);
            if (alt)
                write_batch_to(jb, js->be2, js->st2, jb->wbuf2, m, &jb->st[1]);
            else
                write_batch(jb, m, &jb->st[0]);
        }
        k += m;
        progress_add(js, m);
    }
}

static void run_read(struct job *jb)
{
    struct kvctl_jobs *js = jb->js;
    uint64_t end = jb->lo + jb->written;
    for (uint64_t k = jb->lo; k < end && !out_of_time(js);) {
        size_t m = end - k < js->slots ? end - k : js->slots;
        for (size_t i = 0; i < m; i++)
            jb->obj[i] = k + i;
        read_batch(jb, m, &jb->st[0]);
        k += m;
        progress_add(js, m);
    }
}

static void run_lookup(struct job *jb)
{
    struct kvctl_jobs *js = jb->js;
    uint64_t end = jb->lo + jb->written;
    for (uint64_t k = jb->lo; k < end && !out_of_time(js);) {
        size_t m = end - k < js->w.batch_size ? end - k : js->w.batch_size;
        lookup_batch(jb, k, m, &jb->st[0]);
        k += m;
        progress_add(js, m);
    }
}

static uint64_t next_rand(struct job *jb)
{
    return jb->rng = mix64(jb->rng);
}

/* Picks m objects at random among those written in the preparation. */
static bool pick_written(struct job *jb, size_t m)
{
    struct kvctl_jobs *js = jb->js;
    for (size_t i = 0; i < m; i++) {
        unsigned j = (unsigned)(next_rand(jb) % js->w.numjobs), tries = 0;
        while (js->job[j].written == 0 && tries++ < js->w.numjobs)
            j = (j + 1) % js->w.numjobs;
        if (js->job[j].written == 0)
            return false;
        jb->obj[i] = js->job[j].lo + next_rand(jb) % js->job[j].written;
    }
    return true;
}

/* Until the deadline: a read batch of random prepared objects with
 * probability rwmixread%, else a write batch of objects never written
 * before (numbers past nr_objects, interleaved across jobs). */
static void run_mixed(struct job *jb)
{
    struct kvctl_jobs *js = jb->js;
    size_t m = js->slots;
    while (!out_of_time(js)) {
        if (next_rand(jb) % 100 < js->w.rwmixread && pick_written(jb, m)) {
            read_batch(jb, m, &jb->st[0]);
        } else {
            for (size_t i = 0; i < m; i++)
                jb->obj[i] = js->w.nr_objects + (jb->seq++) * js->w.numjobs + jb->idx;
            write_batch(jb, m, &jb->st[1]);
        }
        progress_add(js, m);
    }
}

/* At least this many copies per job, so that a tiny run still times
 * something longer than the clock's resolution. */
#define MEMCPY_MIN_COPIES 256
/* The baseline's destinations, all jobs together, at most. */
#define MEMCPY_MAX_DST (1ull << 30)

/* The baseline copies each job's value into destinations of the same total
 * size as the job's share of the data set (up to MEMCPY_MAX_DST), faulted
 * in beforehand: the copy a store must make into memory that is not in
 * cache, not a copy between two cache-hot buffers. */
static void run_memcpy(struct job *jb)
{
    struct kvctl_jobs *js = jb->js;
    uint64_t vs = js->w.value_size;
    uint64_t copies = jb->hi - jb->lo > MEMCPY_MIN_COPIES ? jb->hi - jb->lo : MEMCPY_MIN_COPIES;
    for (uint64_t k = 0; k < copies && !out_of_time(js); k++) {
        memcpy(jb->mdst + (k % jb->mslots) * vs, jb->payload, vs);
        jb->st[0].bytes += vs;
        jb->st[0].ops++;
        if ((k & 63) == 63)
            progress_add(js, 64);
    }
}

static void *job_main(void *arg)
{
    struct job *jb = arg;
    struct kvctl_jobs *js = jb->js;
    pthread_barrier_wait(&js->go);
    switch ((int)js->kind) {
    case KVCTL_PH_WRITE: run_write(jb); break;
    case KVCTL_PH_READ: run_read(jb); break;
    case KVCTL_PH_LOOKUP: run_lookup(jb); break;
    case KVCTL_PH_MIXED: run_mixed(jb); break;
    case KVCTL_PH_WRITE_KVBUF: run_write_kvbuf(jb); break;
    default: run_memcpy(jb); break;
    }
    jb->end_ns = kvctl_now_ns();
    atomic_fetch_add(&js->finished, 1);
    return NULL;
}

/* Sums the jobs' slot `which` into out, with latency percentiles. */
static void gather(struct kvctl_jobs *js, int which, struct kvctl_phase *out)
{
    size_t n = 0;
    for (unsigned i = 0; i < js->w.numjobs; i++)
        n += js->job[i].st[which].nlat;
    uint64_t *all = malloc((n ? n : 1) * sizeof *all);
    size_t at = 0;
    for (unsigned i = 0; i < js->w.numjobs; i++) {
        struct jstat *s = &js->job[i].st[which];
        out->ops += s->ops;
        out->bytes += s->bytes;
        out->misses += s->misses;
        out->verify_failures += s->verr;
        if (s->errs && !out->errors)
            out->first_error = s->first_err;
        out->errors += s->errs;
        if (all && s->nlat)
            memcpy(all + at, s->lat, s->nlat * sizeof *all);
        at += s->nlat;
    }
    if (all)
        kvctl_phase_latency(out, all, n);
    free(all);
}

static uint64_t phase_total(struct kvctl_jobs *js, enum kvctl_phase_kind kind)
{
    uint64_t total = 0;
    for (unsigned i = 0; i < js->w.numjobs; i++) {
        const struct job *jb = &js->job[i];
        total += kind == KVCTL_PH_READ || kind == KVCTL_PH_LOOKUP ? jb->written : jb->hi - jb->lo;
    }
    return kind == KVCTL_PH_MIXED ? 0 : total;
}

static void run_phase(struct kvctl_jobs *js, const struct kvctl_backend *be, void *st,
                      enum kvctl_phase_kind kind, double seconds, const char *label)
{
    js->be = be;
    js->st = st;
    js->kind = kind;
    atomic_store(&js->progress, 0);
    atomic_store(&js->finished, 0);
    for (unsigned i = 0; i < js->w.numjobs; i++) {
        struct job *jb = &js->job[i];
        for (int w = 0; w < 2; w++) {
            free(jb->st[w].lat);
            jb->st[w] = (struct jstat){ 0 };
        }
        jb->end_ns = 0;
    }
    struct kvctl_progress prog;
    kvctl_progress_start(&prog, label, phase_total(js, kind), seconds,
                         kind == KVCTL_PH_LOOKUP ? 0 : js->w.value_size);
    pthread_barrier_init(&js->go, NULL, js->w.numjobs + 1);
    unsigned started = 0;
    for (; started < js->w.numjobs; started++)
        if (pthread_create(&js->job[started].th, NULL, job_main, &js->job[started]) != 0)
            break;
    if (started < js->w.numjobs) {
        /* Cannot happen at sane --numjobs; fail loudly rather than hang
         * the barrier. */
        fprintf(stderr, "kvctl: cannot start job threads\n");
        exit(KVCTL_EXIT_FAIL);
    }
    js->t0 = kvctl_now_ns();
    js->deadline = seconds > 0 ? js->t0 + (uint64_t)(seconds * 1e9) : 0;
    pthread_barrier_wait(&js->go);
    while (atomic_load(&js->finished) < js->w.numjobs) {
        usleep(10000);
        kvctl_progress_tick(&prog, atomic_load_explicit(&js->progress, memory_order_relaxed));
    }
    for (unsigned i = 0; i < js->w.numjobs; i++)
        pthread_join(js->job[i].th, NULL);
    kvctl_progress_end(&prog);
    pthread_barrier_destroy(&js->go);
}

static double phase_seconds(const struct kvctl_jobs *js)
{
    uint64_t end = js->t0;
    for (unsigned i = 0; i < js->w.numjobs; i++)
        if (js->job[i].end_ns > end)
            end = js->job[i].end_ns;
    return (double)(end - js->t0) / 1e9;
}

double kvctl_jobs_memcpy(struct kvctl_jobs *js, double seconds)
{
    struct kvctl_phase p = { .name = "memcpy" };
    uint64_t vs = js->w.value_size, cap = MEMCPY_MAX_DST / js->w.numjobs / vs;
    for (unsigned i = 0; i < js->w.numjobs; i++) {
        struct job *jb = &js->job[i];
        jb->mslots = jb->hi - jb->lo < cap ? jb->hi - jb->lo : cap;
        if (jb->mslots == 0)
            jb->mslots = 1;
        jb->mdst = alloc_touch(jb->mslots * vs);
        if (!jb->mdst) {                   /* no memory: the cache-hot slots */
            jb->mdst = jb->rbuf;
            jb->mslots = js->slots;
        }
    }
    run_phase(js, NULL, NULL, PH_MEMCPY, seconds, "memcpy");
    for (unsigned i = 0; i < js->w.numjobs; i++) {
        if (js->job[i].mdst != js->job[i].rbuf)
            free(js->job[i].mdst);
        js->job[i].mdst = NULL;
    }
    p.seconds = phase_seconds(js);
    gather(js, 0, &p);
    return kvctl_phase_mib_s(&p);
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A job's write slots in backend be's buffers (*buf, from *owner = st),
 * the payload laid in; kept while they are st's. */
static void take_wbuf(struct job *jb, const struct kvctl_backend *be, void *st, uint8_t **buf,
                      void **owner)
{
    const struct kvctl_jobs *js = jb->js;
    if (*owner == st)
        return;
    *buf = be->buffer(st, js->slots * js->w.value_size);
    *owner = st;
    for (size_t k = 0; *buf && k < js->slots; k++)
        memcpy(*buf + k * js->w.value_size, jb->payload, js->w.value_size);
}

unsigned kvctl_jobs_run(struct kvctl_jobs *js, const struct kvctl_backend *be, void *st,
                        enum kvctl_phase_kind kind, double seconds, struct kvctl_phase *out)
{
    static const char *names[] = { "write", "lookup", "read", "mixed", "write_kvbuf" };
    /* --kv-buffers (or the write_kvbuf phase): each job's write slots in the
     * backend's shared memory (and the alternate's, write_kvbuf's), the
     * payload laid in once (as a caller would produce its values there); a
     * write then only stamps each value's header. */
    bool kvbuf = js->w.kv_buffers || kind == KVCTL_PH_WRITE_KVBUF;
    bool ab = kind == KVCTL_PH_WRITE_KVBUF && js->st2 && js->be2->buffer;
    for (unsigned i = 0; js->w.value_size >= HDR && i < js->w.numjobs; i++) {
        if (kvbuf && be->buffer)
            take_wbuf(&js->job[i], be, st, &js->job[i].wbuf, &js->job[i].wbuf_st);
        if (ab)
            take_wbuf(&js->job[i], js->be2, js->st2, &js->job[i].wbuf2, &js->job[i].wbuf2_st);
    }
    double srv0 = be->server_cpu_s ? be->server_cpu_s(st) : -1;
    double cpu0 = cpu_now();
    run_phase(js, be, st, kind, seconds, names[kind]);
    double secs = phase_seconds(js), cpu = cpu_now() - cpu0;
    double srv1 = srv0 >= 0 ? be->server_cpu_s(st) : -1;
    bool has_srv = srv0 >= 0 && srv1 >= srv0;
    double srv = has_srv ? srv1 - srv0 : 0;
    if (kind == KVCTL_PH_MIXED) {
        out[0] = (struct kvctl_phase){ .name = "mixed_read", .seconds = secs, .cpu_s = cpu,
                                       .has_server_cpu = has_srv, .server_cpu_s = srv };
        out[1] = (struct kvctl_phase){ .name = "mixed_write", .seconds = secs, .cpu_s = cpu,
                                       .has_server_cpu = has_srv, .server_cpu_s = srv };
        gather(js, 0, &out[0]);
        gather(js, 1, &out[1]);
        return 2;
    }
    out[0] = (struct kvctl_phase){ .seconds = secs, .cpu_s = cpu,
                                   .lookup = kind == KVCTL_PH_LOOKUP,
                                   .has_server_cpu = has_srv, .server_cpu_s = srv };
    snprintf(out[0].name, sizeof out[0].name, "%s", names[kind]);
    gather(js, 0, &out[0]);
    if (ab) {
        /* Two sides of one phase: each one's seconds are its own batches'
         * (per job); the CPU figures are the phase's, both sides'. */
        out[1] = (struct kvctl_phase){ .name = "kvbuf_inproc", .cpu_s = cpu };
        gather(js, 1, &out[1]);
        uint64_t ns[2] = { 0, 0 };
        for (unsigned i = 0; i < js->w.numjobs; i++)
            for (int w = 0; w < 2; w++)
                ns[w] += js->job[i].st[w].ns;
        out[0].seconds = (double)ns[0] / js->w.numjobs / 1e9;
        out[1].seconds = (double)ns[1] / js->w.numjobs / 1e9;
    }
    return ab ? 2 : 1;
}
