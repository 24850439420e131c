/*
 * metrics.c — Prometheus metrics: the engine's text exposition, its task
 * latency histograms, and a small HTTP server (libmicrohttpd) for /metrics
 * and /health that kv_open starts when metrics.listen is set and any
 * program (kvmaster) can start with kv_metrics_serve.
 *
 * Key design choices:
 * - Nothing is computed per scrape that the engine does not already keep:
 *   the exposition is kv_stats_get plus the histograms, rendered into one
 *   malloc'd buffer that libmicrohttpd sends and frees (MUST_FREE), so a
 *   scrape never holds an engine lock while writing to a socket.
 * - The histograms are fixed log-spaced buckets of relaxed atomic counters,
 *   recorded once per task by the worker that finishes it: no lock and no
 *   allocation on the data path. Prometheus' cumulative "le" counts are
 *   summed at render time, so a record is one bucket increment, not many.
 * - The server runs on libmicrohttpd's own polling thread; the engine's
 *   workers never see it. kv_close stops it before anything it reads goes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/cluster.h"
#include "metrics.h"
#include "store.h"

/* Upper bounds of the latency buckets, in microseconds (+Inf follows). */
static const uint64_t bucket_us[] = {
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000,
    100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
};
#define NBUCKETS (KV__ARRAY_LEN(bucket_us) + 1)

struct hist {
    _Atomic uint64_t bucket[NBUCKETS];   /* not cumulative */
    _Atomic uint64_t sum_ns, ok, failed;
};

struct kv__metrics {
    struct hist op[KV__OP_COUNT];
    kv_metrics_server *srv;
    /* kv_health's last answer (hlock): when, its code and its reason */
    pthread_mutex_t hlock;
    uint64_t hwhen;
    int hrc;
    char hwhy[256];
};

/* ---- histograms ------------------------------------------------------------ */

void kv__metrics_task(struct kv__metrics *m, int op, uint64_t ns, bool ok)
{
    if (!m || op < 0 || op >= KV__OP_COUNT)
        return;
    struct hist *h = &m->op[op];
    uint64_t us = ns / 1000;
    size_t b = 0;
    while (b < KV__ARRAY_LEN(bucket_us) && us > bucket_us[b])
        b++;
    atomic_fetch_add_explicit(&h->bucket[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(ok ? &h->ok : &h->failed, 1, memory_order_relaxed);
}

/* ---- lookup counters ------------------------------------------------------------ */

static _Atomic unsigned next_stripe;
static _Thread_local unsigned my_stripe;   /* 0: none yet; else stripe + 1 */

static struct kv__lk_stripe *stripe(struct kv__lk_counters *c)
{
    if (!my_stripe)
        my_stripe = atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) %
                    KV__LK_STRIPES + 1;
    return &c->s[my_stripe - 1];
}

static void add(_Atomic uint64_t *v, uint64_t n)
{
    if (n)
        atomic_fetch_add_explicit(v, n, memory_order_relaxed);
}

void kv__metrics_lookups(struct kv__lk_counters *c, uint64_t dram, uint64_t ssd, uint64_t miss)
{
    struct kv__lk_stripe *s = stripe(c);
    add(&s->hits_dram, dram);
    add(&s->hits_ssd, ssd);
    add(&s->misses, miss);
}

void kv__metrics_prefix(struct kv__lk_counters *c, uint64_t ids, uint64_t hits)
{
    struct kv__lk_stripe *s = stripe(c);
    add(&s->prefix_ids, ids);
    add(&s->prefix_hits, hits);
}

void kv__metrics_lookup_sum(struct kv__lk_counters *c, kv_stats *out)
{
    out->lookup_hits_dram = out->lookup_hits_ssd = out->lookup_misses = 0;
    out->prefix_ids = out->prefix_hits = 0;
    for (size_t i = 0; i < KV__LK_STRIPES; i++) {
        struct kv__lk_stripe *s = &c->s[i];
        out->lookup_hits_dram += atomic_load_explicit(&s->hits_dram, memory_order_relaxed);
        out->lookup_hits_ssd += atomic_load_explicit(&s->hits_ssd, memory_order_relaxed);
        out->lookup_misses += atomic_load_explicit(&s->misses, memory_order_relaxed);
        out->prefix_ids += atomic_load_explicit(&s->prefix_ids, memory_order_relaxed);
        out->prefix_hits += atomic_load_explicit(&s->prefix_hits, memory_order_relaxed);
    }
}

/* ---- text ---------------------------------------------------------------- */

/* A growing output buffer; on allocation failure it goes quiet and says so
 * at the end (oom). */
struct buf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void bprintf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(struct buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap * 2 + (size_t)n;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

/* ---- the metrics: one table ------------------------------------------------
 *
 * Every name this file exports, with its type, labels and help, once: the
 * exposition writes HELP and TYPE from it and doc/metrics.md is generated
 * from it (scripts/gendoc.c through kv__metrics_doc), so the table, the
 * text and the docs cannot disagree. Names follow Prometheus' rules as the
 * test in check_tools.c enforces them: kvengine_ + lower snake case, a
 * counter ends in _total and nothing else does, a unit is the last word
 * (_bytes, _seconds) and a share is a _ratio in [0,1]. "Reads" are shard
 * loads and plain-key gets: each is served by one tier or misses.
 */
#define KV__METRICS(X)                                                                        \
    X(INFO, "info", "gauge", "version, pipeline", "engine",                                    \
      "Library version and the engine's pipeline (always 1).")                                \
    X(SERVING, "serving", "gauge", "", "engine",                                               \
      "1 when /health answers 200 (tiers open; in the view when a member), else 0.")          \
    X(CAPACITY, "capacity_bytes", "gauge", "tier", "engine",                                   \
      "Capacity of each tier in bytes (0: none or unbounded).")                               \
    X(USED, "used_bytes", "gauge", "tier", "engine", "Bytes held by each tier.")               \
    X(BLOCKS, "blocks", "gauge", "tier", "engine", "Blocks (shard 0 present) held by each tier.") \
    X(LOOKUP_HITS, "lookup_hits_total", "counter", "tier", "engine",                           \
      "Block ids looked up (kv_lookup, kv_lookup_prefix, a peer's lookup) that this node's "  \
      "store found complete, by the tier holding shard 0 (DRAM first).")                      \
    X(LOOKUP_MISSES, "lookup_misses_total", "counter", "", "engine",                           \
      "Block ids looked up that no tier held complete.")                                      \
    X(LOOKUP_HIT_RATIO, "lookup_hit_ratio", "gauge", "tier", "engine",                         \
      "Share of block ids looked up since open that hit in each tier; tier=\"all\": in any.") \
    X(PREFIX_IDS, "prefix_lookup_ids_total", "counter", "", "engine",                          \
      "Block ids passed to kv_lookup_prefix on this engine.")                                 \
    X(PREFIX_HITS, "prefix_lookup_hits_total", "counter", "", "engine",                        \
      "Of those, the ids in the leading run of hits (the prefix found).")                     \
    X(PREFIX_HIT_RATIO, "prefix_hit_ratio", "gauge", "", "engine",                             \
      "prefix_lookup_hits_total / prefix_lookup_ids_total since open (0 before any call).")   \
    X(READ_HITS, "read_hits_total", "counter", "tier", "engine",                               \
      "Reads (shard loads, plain-key gets) served by each tier.")                             \
    X(READ_MISSES, "read_misses_total", "counter", "", "engine",                               \
      "Reads no tier could serve (the shard or key was nowhere).")                            \
    X(READ_HIT_RATIO, "read_hit_ratio", "gauge", "tier", "engine",                             \
      "Share of all reads since open served by each tier; tier=\"all\": by any tier.")        \
    X(HITS, "hits_total", "counter", "tier", "engine",                                         \
      "Deprecated alias of kvengine_read_hits_total (the same value); it goes in a later "    \
      "release.")                                                                             \
    X(MISSES, "misses_total", "counter", "tier", "engine",                                     \
      "Deprecated: reads each tier could not serve (dram: read_hits_total{tier=\"ssd\"} + "   \
      "read_misses_total; ssd: read_misses_total); it goes in a later release.")              \
    X(PLAIN_KEYS, "plain_keys", "gauge", "", "engine", "Plain keys stored in DRAM.")           \
    X(EVICTIONS, "evictions_total", "counter", "", "engine", "Blocks evicted from DRAM.")       \
    X(SPILLS, "spills_total", "counter", "", "engine", "Evicted blocks written to the SSD tier.") \
    X(SPILL_DROPS, "spill_drops_total", "counter", "", "engine",                               \
      "Evicted blocks dropped because the spill queue was full.")                             \
    X(CHECKSUM, "checksum_failures_total", "counter", "", "engine",                            \
      "Values that failed their checksum and were dropped.")                                  \
    X(PROMOTIONS, "promotions_total", "counter", "", "engine",                                 \
      "SSD shards copied back into DRAM.")                                                    \
    X(ENOSPC, "enospc_total", "counter", "", "engine", "Shards refused for lack of room.")      \
    X(INFLIGHT, "tasks_inflight", "gauge", "", "engine", "Tasks submitted and not yet done.")  \
    X(INDEX, "dram_index_bytes", "gauge", "", "engine", "Memory held by the DRAM index.")      \
    X(TASK_SECONDS, "task_duration_seconds", "histogram", "op, le", "engine",                  \
      "Time from submit to done of dump and load tasks.")                                     \
    X(TASKS, "tasks_total", "counter", "op, result", "engine",                                 \
      "Dump and load tasks finished, by result (ok, failed).")                                \
    X(MEMBERS, "members", "gauge", "role", "engine (cluster), kvmaster",                       \
      "Members in the cluster view, by role (owner, client).")                                \
    X(VIEW_VERSION, "view_version", "gauge", "", "engine (cluster), kvmaster",                 \
      "Version of the cluster view (grows on every change).")                                 \
    X(RR_SHARDS, "rereplicated_shards_total", "counter", "", "engine (cluster)",               \
      "Shards this node copied to their new owners after owner changes.")                     \
    X(RR_BYTES, "rereplicated_bytes_total", "counter", "", "engine (cluster)",                 \
      "Bytes of those copies (a shard sent to two owners counts twice).")                     \
    X(RR_FAILED, "rereplicate_failed_total", "counter", "", "engine (cluster)",                \
      "Shards whose copy to a new owner failed.")                                             \
    X(RR_PENDING, "rereplicate_pending", "gauge", "", "engine (cluster)",                      \
      "Shards the running re-replication has still to copy.")                                 \
    X(RR_JOBS, "rereplicate_jobs_total", "counter", "", "engine (cluster)",                    \
      "Re-replication jobs (one per owner change) run to the end.")                           \
    X(RR_BEHIND, "rereplicate_behind", "gauge", "", "engine (cluster)",                        \
      "Owner changes seen whose re-replication has not run to the end (0: done).")            \
    X(REFUSED_STALE, "copies_refused_total", "counter", "", "engine (cluster)",                \
      "Plain keys' copies from members refused here as read before a remove served here.")    \
    X(REMOVES_FENCED, "removes_fenced_total", "counter", "", "engine (cluster)",              \
      "Removes of plain keys from here that ran a second round, a member's copy in the way.")  \
    X(LOOKUPS_UNSURE, "lookups_unsure_total", "counter", "", "engine (cluster)",              \
      "Block ids a lookup from here reported absent while an owner could not be asked.")      \
    X(MASTER_UP, "master_up", "gauge", "", "kvmaster",                                         \
      "Whether the master answered its own view query.")

enum {
#define M_ENUM(id, name, type, labels, who, help) M_##id,
    KV__METRICS(M_ENUM)
#undef M_ENUM
    M_COUNT
};

static const struct kv__metric_doc metric_docs[M_COUNT] = {
#define M_DOC(id, n, t, l, w, h) { .name = "kvengine_" n, .type = t, .labels = l, .who = w, .help = h },
    KV__METRICS(M_DOC)
#undef M_DOC
};

int kv__metrics_doc(size_t i, struct kv__metric_doc *out)
{
    if (i >= M_COUNT || !out)
        return KV_ENOTFOUND;
    *out = metric_docs[i];
    return KV_OK;
}

static void head(struct buf *b, int m)
{
    const struct kv__metric_doc *d = &metric_docs[m];
    bprintf(b, "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name, d->type);
}

static void one(struct buf *b, int m, uint64_t v)
{
    head(b, m);
    bprintf(b, "%s %" PRIu64 "\n", metric_docs[m].name, v);
}

static void tiers(struct buf *b, int m, uint64_t dram, uint64_t ssd)
{
    head(b, m);
    bprintf(b, "%s{tier=\"dram\"} %" PRIu64 "\n", metric_docs[m].name, dram);
    bprintf(b, "%s{tier=\"ssd\"} %" PRIu64 "\n", metric_docs[m].name, ssd);
}

static double share(uint64_t part, uint64_t whole)
{
    return whole ? (double)part / (double)whole : 0.0;
}

/* Shares of dram hits, ssd hits and both among all (hits and misses). */
static void ratios(struct buf *b, int m, uint64_t dram, uint64_t ssd, uint64_t miss)
{
    const char *n = metric_docs[m].name;
    uint64_t all = dram + ssd + miss;
    head(b, m);
    bprintf(b, "%s{tier=\"dram\"} %.6f\n", n, share(dram, all));
    bprintf(b, "%s{tier=\"ssd\"} %.6f\n", n, share(ssd, all));
    bprintf(b, "%s{tier=\"all\"} %.6f\n", n, share(dram + ssd, all));
}

static void histogram(struct buf *b, struct kv__metrics *m)
{
    static const char *const names[KV__OP_COUNT] = { "dump", "load" };
    const char *n = metric_docs[M_TASK_SECONDS].name;
    head(b, M_TASK_SECONDS);
    for (int op = 0; op < KV__OP_COUNT; op++) {
        struct hist *h = &m->op[op];
        uint64_t cum = 0;
        for (size_t i = 0; i < NBUCKETS; i++) {
            cum += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
            if (i < KV__ARRAY_LEN(bucket_us))
                bprintf(b, "%s_bucket{op=\"%s\",le=\"%g\"} %" PRIu64 "\n", n, names[op],
                        (double)bucket_us[i] / 1e6, cum);
            else
                bprintf(b, "%s_bucket{op=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", n, names[op], cum);
        }
        bprintf(b, "%s_sum{op=\"%s\"} %.9f\n", n, names[op],
                (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9);
        bprintf(b, "%s_count{op=\"%s\"} %" PRIu64 "\n", n, names[op], cum);
    }
    n = metric_docs[M_TASKS].name;
    head(b, M_TASKS);
    for (int op = 0; op < KV__OP_COUNT; op++) {
        bprintf(b, "%s{op=\"%s\",result=\"ok\"} %" PRIu64 "\n", n, names[op],
                atomic_load_explicit(&m->op[op].ok, memory_order_relaxed));
        bprintf(b, "%s{op=\"%s\",result=\"failed\"} %" PRIu64 "\n", n, names[op],
                atomic_load_explicit(&m->op[op].failed, memory_order_relaxed));
    }
}

KV__EXPORT int kv_metrics_render(kv_engine *e, char **text, size_t *len)
{
    if (text)
        *text = NULL;
    if (len)
        *len = 0;
    if (!e || !text || !len)
        return KV_EINVAL;
    kv_stats s;
    int rc = kv_stats_get(e, &s);
    if (rc != KV_OK)
        return rc;
    char why[256];
    int health = kv_health(e, why, sizeof why);
    struct buf b = { .cap = 8192 };
    b.p = malloc(b.cap);
    if (!b.p)
        return KV_ENOMEM;
    b.p[0] = '\0';
    head(&b, M_INFO);
    bprintf(&b, "kvengine_info{version=\"%s\",pipeline=\"%s\"} 1\n", kv_version(),
            kv__pipeline_name(e->cfg.pipeline));
    one(&b, M_SERVING, health == KV_OK);
    tiers(&b, M_CAPACITY, s.dram_capacity, s.ssd_capacity);
    tiers(&b, M_USED, s.dram_used, s.ssd_used);
    tiers(&b, M_BLOCKS, s.dram_blocks, s.ssd_blocks);
    tiers(&b, M_LOOKUP_HITS, s.lookup_hits_dram, s.lookup_hits_ssd);
    one(&b, M_LOOKUP_MISSES, s.lookup_misses);
    ratios(&b, M_LOOKUP_HIT_RATIO, s.lookup_hits_dram, s.lookup_hits_ssd, s.lookup_misses);
    one(&b, M_PREFIX_IDS, s.prefix_ids);
    one(&b, M_PREFIX_HITS, s.prefix_hits);
    head(&b, M_PREFIX_HIT_RATIO);
    bprintf(&b, "%s %.6f\n", metric_docs[M_PREFIX_HIT_RATIO].name,
            share(s.prefix_hits, s.prefix_ids));
    tiers(&b, M_READ_HITS, s.hits_dram, s.hits_ssd);
    one(&b, M_READ_MISSES, s.misses);
    ratios(&b, M_READ_HIT_RATIO, s.hits_dram, s.hits_ssd, s.misses);
    tiers(&b, M_HITS, s.hits_dram, s.hits_ssd);
    tiers(&b, M_MISSES, s.hits_ssd + s.misses, kv__store_depth(e) ? s.misses : 0);
    one(&b, M_PLAIN_KEYS, s.keys);
    one(&b, M_EVICTIONS, s.evictions);
    one(&b, M_SPILLS, s.spills);
    one(&b, M_SPILL_DROPS, s.spill_drops);
    one(&b, M_CHECKSUM, s.checksum_failures);
    one(&b, M_PROMOTIONS, s.promotions);
    one(&b, M_ENOSPC, s.enospc);
    one(&b, M_INFLIGHT, s.tasks_inflight);
    one(&b, M_INDEX, s.dram_index_bytes);
    if (e->metrics)
        histogram(&b, e->metrics);
    if (e->cluster) {
        uint64_t version = 0;
        size_t members = 0, owners = 0;
        kv__cluster_view(e->cluster, &version, &members, &owners);
        head(&b, M_MEMBERS);
        bprintf(&b, "kvengine_members{role=\"owner\"} %zu\n", owners);
        bprintf(&b, "kvengine_members{role=\"client\"} %zu\n", members - owners);
        one(&b, M_VIEW_VERSION, version);
        struct kv__cluster_counters k;
        kv__cluster_counters(e->cluster, &k);
        one(&b, M_RR_SHARDS, k.rereplicated_shards);
        one(&b, M_RR_BYTES, k.rereplicated_bytes);
        one(&b, M_RR_FAILED, k.rereplicate_failed);
        one(&b, M_RR_PENDING, k.rereplicate_pending);
        one(&b, M_RR_JOBS, k.rereplicate_jobs);
        one(&b, M_RR_BEHIND, k.rereplicate_behind);
        one(&b, M_REFUSED_STALE, k.refused_stale);
        one(&b, M_REMOVES_FENCED, k.removes_fenced);
        one(&b, M_LOOKUPS_UNSURE, k.lookups_unsure);
    }
    if (b.oom) {
        free(b.p);
        return KV_ENOMEM;
    }
    *text = b.p;
    *len = b.len;
    return KV_OK;
}

/* ---- health -------------------------------------------------------------------
 *
 * An engine serves when kv_open returned it (its tiers opened) and, as a
 * cluster member, when the membership store answers and lists this node.
 * The engine keeps no such state of its own, so health asks the store
 * itself (kv_members, with the engine's config and token), at most once a
 * second: a prober that asks every 100 ms costs one query a second.
 */
#define HEALTH_CACHE_MS 1000

KV__EXPORT int kv_health(kv_engine *e, char *why, size_t cap)
{
    if (!e)
        return KV_EINVAL;
    kv_stats st;
    int rc = kv_stats_get(e, &st);
    if (rc != KV_OK) {
        kv__errf(why, cap, "a tier failed: its figures are unavailable: %s", kv_strerror(rc));
        return KV_EIO;
    }
    struct kv__metrics *m = e->metrics;
    if (!e->cluster || !m) {
        kv__errf(why, cap, "ok");
        return KV_OK;
    }
    pthread_mutex_lock(&m->hlock);
    uint64_t now = kv__now_ms();
    if (!m->hwhen || now - m->hwhen >= HEALTH_CACHE_MS) {
        uint64_t version = 0;
        kv_member_info *mi = NULL;
        size_t n = 0;
        const char *self = kv__cluster_addr(e->cluster);
        const struct kv_config *c = &e->cfg;
        const char *where = c->cluster.metadata == KV_META_ETCD ? c->cluster.etcd_endpoints
                                                                : c->cluster.master;
        int r = kv_members(c, &version, &mi, &n);
        if (r != KV_OK) {
            m->hrc = r == KV_EPERM ? KV_EPERM : KV_ENET;
            kv__errf(m->hwhy, sizeof m->hwhy, "membership store unreachable (%s %s): %s",
                     c->cluster.metadata == KV_META_ETCD ? "etcd" : "kvmaster", where,
                     kv_strerror(r));
        } else {
            bool in = !self || !self[0];   /* a pure client is in no view */
            for (size_t i = 0; !in && i < n; i++)
                in = strcmp(mi[i].addr, self) == 0;
            m->hrc = in ? KV_OK : KV_EBUSY;
            snprintf(m->hwhy, sizeof m->hwhy, "%s", in ? "ok" : "joining: not in the view yet");
        }
        free(mi);
        m->hwhen = now;
    }
    rc = m->hrc;
    kv__errf(why, cap, "%s", m->hwhy);
    pthread_mutex_unlock(&m->hlock);
    return rc;
}

/* ---- the HTTP server ---------------------------------------------------------
 *
 * Limits, so that a few clients cannot lock every scraper out (issue 17,
 * 7): at most CONN_MAX connections, at most CONN_PER_IP from one address,
 * and a connection that has not sent a whole request in IDLE_S seconds is
 * closed. A scraper from another address always finds a slot; one from the
 * same address does once the idle ones time out. Beyond loopback the
 * endpoint needs metrics.token (sent as "Authorization: Bearer TOKEN",
 * compared in constant time) unless metrics.insecure says otherwise; the
 * token guards /metrics, not /health, whose answer (200 or 503 and a reason
 * such as "joining") is what load balancers that send no headers probe.
 */
#define CONN_MAX    64
#define CONN_PER_IP 8
#define IDLE_S      5

struct kv_metrics_server {
    struct MHD_Daemon *d;
    pthread_mutex_t lock;     /* fn, ctx, health, hctx: kv_metrics_retarget swaps them */
    kv_metrics_fn fn;
    void *ctx;
    kv_health_fn health;
    void *hctx;
    char token[KV_CFG_STR];
    int lfd;
    int port;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *ctype,
                             char *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* a == b in time that depends on neither's contents (only on the longer
 * length): a token guessed byte by byte learns nothing from the clock. */
static bool same_secret(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), n = la > lb ? la : lb;
    unsigned diff = la != lb;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned)(uint8_t)(i < la ? a[i] : 0) ^ (unsigned)(uint8_t)(i < lb ? b[i] : 0);
    return diff == 0;
}

static bool authorized(struct kv_metrics_server *s, struct MHD_Connection *c)
{
    if (!s->token[0])
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7;
    while (*h == ' ')
        h++;
    return same_secret(h, s->token);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    (void)version; (void)upload; (void)upload_size; (void)con_cls;
    struct kv_metrics_server *s = cls;
    static char notfound[] = "not found: try /metrics or /health\n", badmethod[] = "GET only\n",
                failed[] = "metrics unavailable\n", unauth[] = "a bearer token is required\n";
    const char *plain = "text/plain; charset=utf-8";
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, plain, badmethod, sizeof badmethod - 1,
                     MHD_RESPMEM_PERSISTENT);
    pthread_mutex_lock(&s->lock);
    kv_metrics_fn fn = s->fn;
    kv_health_fn health = s->health;
    void *ctx = s->ctx, *hctx = s->hctx;
    pthread_mutex_unlock(&s->lock);
    if (strcmp(url, "/health") == 0) {
        char why[256] = "ok";
        int rc = health ? health(hctx, why, sizeof why) : KV_OK;
        char *body = NULL;
        int n = rc == KV_OK ? asprintf(&body, "ok\n") : asprintf(&body, "unavailable: %s\n", why);
        if (n < 0)
            return MHD_NO;
        return reply(c, rc == KV_OK ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, plain, body,
                     (size_t)n, MHD_RESPMEM_MUST_FREE);
    }
    if (strcmp(url, "/metrics") != 0)
        return reply(c, MHD_HTTP_NOT_FOUND, plain, notfound, sizeof notfound - 1,
                     MHD_RESPMEM_PERSISTENT);
    if (!authorized(s, c))
        return reply(c, MHD_HTTP_UNAUTHORIZED, plain, unauth, sizeof unauth - 1,
                     MHD_RESPMEM_PERSISTENT);
    char *text = NULL;
    size_t len = 0;
    int rc = fn ? fn(ctx, &text, &len) : KV_EBUSY;
    if (rc != KV_OK || !text) {
        free(text);
        return reply(c, rc == KV_EBUSY ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_INTERNAL_SERVER_ERROR,
                     plain, failed, sizeof failed - 1, MHD_RESPMEM_PERSISTENT);
    }
    return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len,
                 MHD_RESPMEM_MUST_FREE);
}

/* "host:port" (IPv4 literal or a name that resolves to one). */
static int parse_listen(const char *listen, struct sockaddr_in *sa)
{
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || !colon[1])
        return KV_ECONFIG;
    char host[256];
    size_t hl = (size_t)(colon - listen);
    if (hl >= sizeof host)
        return KV_ECONFIG;
    memcpy(host, listen, hl);
    host[hl] = '\0';
    char *end = NULL;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || port > 65535)
        return KV_ECONFIG;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) == 1)
        return KV_OK;
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return KV_ECONFIG;
    sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return KV_OK;
}

static int serve(const char *addr, const char *token, bool insecure, kv_metrics_fn fn,
                 void *ctx, kv_metrics_server **out, char *err, size_t errlen)
{
    if (out)
        *out = NULL;
    if (!addr || !out)
        return KV_EINVAL;
    struct sockaddr_in sa;
    if (parse_listen(addr, &sa) != KV_OK) {
        kv__errf(err, errlen, "metrics.listen: bad address '%s' (want host:port)", addr);
        return KV_ECONFIG;
    }
    if (token && strlen(token) >= KV_CFG_STR)
        return KV_EINVAL;
    bool loopback = (ntohl(sa.sin_addr.s_addr) >> 24) == 127;
    if (!loopback && (!token || !token[0]) && !insecure) {
        kv__errf(err, errlen, "metrics.listen %s: beyond loopback /metrics needs metrics.token "
                 "(or metrics.insecure: true to serve it to anyone)", addr);
        return KV_ECONFIG;
    }
    if (!loopback && (!token || !token[0]))
        KV_WARN("metrics: serving /metrics on %s to anyone (metrics.insecure: true, no token)",
                addr);
    /* Our own listening socket, handed to libmicrohttpd: SO_REUSEADDR so a
     * port whose last connections sit in TIME_WAIT can be bound again at
     * once, and bind's own errno in the message. */
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (lfd < 0)
        return kv__err_from_errno(errno);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 64) != 0) {
        kv__errf(err, errlen, "metrics.listen %s: cannot listen: %s", addr, strerror(errno));
        close(lfd);
        return KV_ENET;
    }
    socklen_t sl = sizeof sa;
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    struct kv_metrics_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(lfd);
        return KV_ENOMEM;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->fn = fn;
    s->ctx = ctx;
    snprintf(s->token, sizeof s->token, "%s", token ? token : "");
    s->lfd = lfd;
    s->port = ntohs(sa.sin_port);
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, handle,
                            s, MHD_OPTION_LISTEN_SOCKET, lfd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONN_MAX,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)CONN_PER_IP,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_S, MHD_OPTION_END);
    if (!s->d) {
        kv__errf(err, errlen, "metrics.listen %s: libmicrohttpd would not start", addr);
        close(lfd);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return KV_ENET;
    }
    *out = s;
    return KV_OK;
}

KV__EXPORT int kv_metrics_serve(const char *addr, kv_metrics_fn fn, void *ctx,
                                kv_metrics_server **out, char *err, size_t errlen)
{
    if (!fn)
        return KV_EINVAL;
    return serve(addr, NULL, true, fn, ctx, out, err, errlen);
}

KV__EXPORT int kv_metrics_serve_config(const kv_config *cfg, kv_metrics_fn fn, void *ctx,
                                       kv_metrics_server **out, char *err, size_t errlen)
{
    if (out)
        *out = NULL;
    if (!cfg || !out)
        return KV_EINVAL;
    return serve(cfg->metrics.listen, cfg->metrics.token, cfg->metrics.insecure, fn, ctx, out,
                 err, errlen);
}

KV__EXPORT void kv_metrics_retarget(kv_metrics_server *s, kv_metrics_fn fn, void *ctx,
                                    kv_health_fn health, void *hctx)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->fn = fn;
    s->ctx = ctx;
    s->health = health;
    s->hctx = hctx;
    pthread_mutex_unlock(&s->lock);
}

KV__EXPORT int kv_metrics_port(const kv_metrics_server *s)
{
    return s ? s->port : KV_EINVAL;
}

KV__EXPORT void kv_metrics_stop(kv_metrics_server *s)
{
    if (!s)
        return;
    /* Quiesce first: it hands the listening socket back, so it is closed
     * here exactly once whatever libmicrohttpd's version does at stop. */
    int fd = MHD_quiesce_daemon(s->d);
    MHD_stop_daemon(s->d);
    if (fd >= 0)
        close(fd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ---- the engine's server ------------------------------------------------------ */

static int engine_render(void *ctx, char **text, size_t *len)
{
    return kv_metrics_render(ctx, text, len);
}

static int engine_health(void *ctx, char *why, size_t cap)
{
    return kv_health(ctx, why, cap);
}

int kv__metrics_open(kv_engine *e, const struct kv_config *cfg, struct kv__metrics **out,
                     char *err, size_t errlen)
{
    *out = NULL;
    struct kv__metrics *m = calloc(1, sizeof *m);
    if (!m)
        return KV_ENOMEM;
    pthread_mutex_init(&m->hlock, NULL);
    if (cfg->metrics.listen[0]) {
        /* The histograms must be reachable from the first scrape on. */
        e->metrics = m;
        int rc = kv_metrics_serve_config(cfg, engine_render, e, &m->srv, err, errlen);
        if (rc == KV_OK)
            kv_metrics_retarget(m->srv, engine_render, e, engine_health, e);
        if (rc != KV_OK) {
            e->metrics = NULL;
            pthread_mutex_destroy(&m->hlock);
            free(m);
            return rc;
        }
        KV_INFO("metrics: serving /metrics and /health on %s", cfg->metrics.listen);
    }
    *out = m;
    return KV_OK;
}

void kv__metrics_stop(struct kv__metrics *m)
{
    if (!m)
        return;
    kv_metrics_stop(m->srv);
    m->srv = NULL;
}

void kv__metrics_close(struct kv__metrics *m)
{
    if (!m)
        return;
    kv__metrics_stop(m);
    pthread_mutex_destroy(&m->hlock);
    free(m);
}
