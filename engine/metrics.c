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

static void head(struct buf *b, const char *name, const char *type, const char *help)
{
    bprintf(b, "# HELP kvengine_%s %s\n# TYPE kvengine_%s %s\n", name, help, name, type);
}

static void one(struct buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    head(b, name, type, help);
    bprintf(b, "kvengine_%s %" PRIu64 "\n", name, v);
}

static void tiers(struct buf *b, const char *name, const char *type, const char *help,
                  uint64_t dram, uint64_t ssd)
{
    head(b, name, type, help);
    bprintf(b, "kvengine_%s{tier=\"dram\"} %" PRIu64 "\n", name, dram);
    bprintf(b, "kvengine_%s{tier=\"ssd\"} %" PRIu64 "\n", name, ssd);
}

static void histogram(struct buf *b, struct kv__metrics *m)
{
    static const char *const names[KV__OP_COUNT] = { "dump", "load" };
    head(b, "task_duration_seconds", "histogram",
         "Time from submit to done of dump and load tasks.");
    for (int op = 0; op < KV__OP_COUNT; op++) {
        struct hist *h = &m->op[op];
        uint64_t cum = 0;
        for (size_t i = 0; i < NBUCKETS; i++) {
            cum += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
            if (i < KV__ARRAY_LEN(bucket_us))
                bprintf(b, "kvengine_task_duration_seconds_bucket{op=\"%s\",le=\"%g\"} %" PRIu64 "\n",
                        names[op], (double)bucket_us[i] / 1e6, cum);
            else
                bprintf(b, "kvengine_task_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
                        names[op], cum);
        }
        bprintf(b, "kvengine_task_duration_seconds_sum{op=\"%s\"} %.9f\n", names[op],
                (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9);
        bprintf(b, "kvengine_task_duration_seconds_count{op=\"%s\"} %" PRIu64 "\n", names[op], cum);
    }
    head(b, "tasks_total", "counter", "Dump and load tasks finished, by result.");
    for (int op = 0; op < KV__OP_COUNT; op++) {
        bprintf(b, "kvengine_tasks_total{op=\"%s\",result=\"ok\"} %" PRIu64 "\n", names[op],
                atomic_load_explicit(&m->op[op].ok, memory_order_relaxed));
        bprintf(b, "kvengine_tasks_total{op=\"%s\",result=\"failed\"} %" PRIu64 "\n", names[op],
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
    struct buf b = { .cap = 8192 };
    b.p = malloc(b.cap);
    if (!b.p)
        return KV_ENOMEM;
    b.p[0] = '\0';
    head(&b, "info", "gauge", "Library version and the engine's pipeline.");
    bprintf(&b, "kvengine_info{version=\"%s\",pipeline=\"%s\"} 1\n", kv_version(),
            kv__pipeline_name(e->cfg.pipeline));
    tiers(&b, "capacity_bytes", "gauge", "Capacity of each tier in bytes (0: none or unbounded).",
          s.dram_capacity, s.ssd_capacity);
    tiers(&b, "used_bytes", "gauge", "Bytes held by each tier.", s.dram_used, s.ssd_used);
    tiers(&b, "blocks", "gauge", "Blocks (shard 0 present) held by each tier.", s.dram_blocks,
          s.ssd_blocks);
    tiers(&b, "hits_total", "counter", "Shard reads served by each tier.", s.hits_dram, s.hits_ssd);
    /* A DRAM miss is a read DRAM could not serve: it went on to SSD (a hit
     * there) or missed everywhere. An SSD miss is one that missed there too. */
    tiers(&b, "misses_total", "counter",
          "Shard reads each tier could not serve (an SSD miss is a miss everywhere).",
          s.hits_ssd + s.misses, kv__store_depth(e) ? s.misses : 0);
    one(&b, "plain_keys", "gauge", "Plain keys stored in DRAM.", s.keys);
    one(&b, "evictions_total", "counter", "Blocks evicted from DRAM.", s.evictions);
    one(&b, "spills_total", "counter", "Evicted blocks written to the SSD tier.", s.spills);
    one(&b, "spill_drops_total", "counter",
        "Evicted blocks dropped because the spill queue was full.", s.spill_drops);
    one(&b, "checksum_failures_total", "counter",
        "Values that failed their checksum and were dropped.", s.checksum_failures);
    one(&b, "promotions_total", "counter", "SSD shards copied back into DRAM.", s.promotions);
    one(&b, "enospc_total", "counter", "Shards refused for lack of room.", s.enospc);
    one(&b, "tasks_inflight", "gauge", "Tasks submitted and not yet done.", s.tasks_inflight);
    one(&b, "dram_index_bytes", "gauge", "Memory held by the DRAM index.", s.dram_index_bytes);
    if (e->metrics)
        histogram(&b, e->metrics);
    if (e->cluster) {
        uint64_t version = 0;
        size_t members = 0, owners = 0;
        kv__cluster_view(e->cluster, &version, &members, &owners);
        head(&b, "members", "gauge", "Members in the cluster view this node last saw.");
        bprintf(&b, "kvengine_members{role=\"owner\"} %zu\n", owners);
        bprintf(&b, "kvengine_members{role=\"client\"} %zu\n", members - owners);
        one(&b, "view_version", "gauge", "Version of the cluster view this node last saw.",
            version);
        struct kv__cluster_counters k;
        kv__cluster_counters(e->cluster, &k);
        one(&b, "rereplicated_shards_total", "counter",
            "Shards this node copied to their new owners after owner changes.",
            k.rereplicated_shards);
        one(&b, "rereplicated_bytes_total", "counter",
            "Bytes of those copies (a shard sent to two owners counts twice).",
            k.rereplicated_bytes);
        one(&b, "rereplicate_failed_total", "counter",
            "Shards whose copy to a new owner failed.", k.rereplicate_failed);
        one(&b, "rereplicate_pending", "gauge",
            "Shards the running re-replication has still to copy.", k.rereplicate_pending);
        one(&b, "rereplicate_jobs_total", "counter",
            "Re-replication jobs (one per owner change) run to the end.", k.rereplicate_jobs);
        one(&b, "rereplicate_behind", "gauge",
            "Owner changes seen whose re-replication has not run to the end (0: done).",
            k.rereplicate_behind);
    }
    if (b.oom) {
        free(b.p);
        return KV_ENOMEM;
    }
    *text = b.p;
    *len = b.len;
    return KV_OK;
}

/* ---- the HTTP server --------------------------------------------------------- */

struct kv_metrics_server {
    struct MHD_Daemon *d;
    kv_metrics_fn fn;
    void *ctx;
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
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    (void)version; (void)upload; (void)upload_size; (void)con_cls;
    struct kv_metrics_server *s = cls;
    static char ok[] = "ok\n", notfound[] = "not found: try /metrics or /health\n",
                badmethod[] = "GET only\n", failed[] = "metrics unavailable\n";
    const char *plain = "text/plain; charset=utf-8";
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, plain, badmethod, sizeof badmethod - 1,
                     MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/health") == 0)
        return reply(c, MHD_HTTP_OK, plain, ok, sizeof ok - 1, MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics") != 0)
        return reply(c, MHD_HTTP_NOT_FOUND, plain, notfound, sizeof notfound - 1,
                     MHD_RESPMEM_PERSISTENT);
    char *text = NULL;
    size_t len = 0;
    if (s->fn(s->ctx, &text, &len) != KV_OK || !text) {
        free(text);
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, plain, failed, sizeof failed - 1,
                     MHD_RESPMEM_PERSISTENT);
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

KV__EXPORT int kv_metrics_serve(const char *addr, kv_metrics_fn fn, void *ctx,
                                kv_metrics_server **out, char *err, size_t errlen)
{
    if (out)
        *out = NULL;
    if (!addr || !fn || !out)
        return KV_EINVAL;
    struct sockaddr_in sa;
    if (parse_listen(addr, &sa) != KV_OK) {
        kv__errf(err, errlen, "metrics.listen: bad address '%s' (want host:port)", addr);
        return KV_ECONFIG;
    }
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
    s->fn = fn;
    s->ctx = ctx;
    s->lfd = lfd;
    s->port = ntohs(sa.sin_port);
    /* Few connections and a short idle timeout: scrapers are few, and a
     * stuck one must not pin a slot. */
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, handle, s,
                            MHD_OPTION_LISTEN_SOCKET, lfd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!s->d) {
        kv__errf(err, errlen, "metrics.listen %s: libmicrohttpd would not start", addr);
        close(lfd);
        free(s);
        return KV_ENET;
    }
    *out = s;
    return KV_OK;
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
    free(s);
}

/* ---- the engine's server ------------------------------------------------------ */

static int engine_render(void *ctx, char **text, size_t *len)
{
    return kv_metrics_render(ctx, text, len);
}

int kv__metrics_open(kv_engine *e, const struct kv_config *cfg, struct kv__metrics **out,
                     char *err, size_t errlen)
{
    *out = NULL;
    struct kv__metrics *m = calloc(1, sizeof *m);
    if (!m)
        return KV_ENOMEM;
    if (cfg->metrics.listen[0]) {
        /* The histograms must be reachable from the first scrape on. */
        e->metrics = m;
        int rc = kv_metrics_serve(cfg->metrics.listen, engine_render, e, &m->srv, err, errlen);
        if (rc != KV_OK) {
            e->metrics = NULL;
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
    free(m);
}
