/*
 * check_ops.c — running kvengine as a service (issue 19): /health from a
 * kvnode's start and from `kvctl stats --node --health`, the metrics
 * table and its naming rule, the metrics endpoint's limits (idle
 * connections, a bearer token beyond loopback), and the generated
 * configuration and metrics references matching the code.
 *
 * Daemons are started with tu_spawn and stopped by the test that started
 * them (stop_all); nothing is timed: waits are bounded loops that give up
 * with the daemon's log in the message.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/metrics.h"
#include "testutil.h"
#include "testutil_kvctl.h"

/* ---- small HTTP and process helpers ----------------------------------------- */

/* A connected socket from src (an address on lo, e.g. "127.0.0.2") to
 * 127.0.0.1:port, or -1. */
static int connect_from(const char *src, unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = { .tv_sec = 5 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (src) {
        struct sockaddr_in me = { .sin_family = AF_INET };
        inet_pton(AF_INET, src, &me.sin_addr);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&me, sizeof me), 0);
    }
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* GET path over fd with extra header lines (or NULL); the whole answer,
 * malloc'd, or NULL when the server closed without one. Closes fd. */
static char *get_on(int fd, const char *path, const char *headers)
{
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n%s\r\n", path, headers ? headers : "");
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    ssize_t r;
    while ((r = recv(fd, buf + len, cap - len - 1, 0)) > 0) {
        len += (size_t)r;
        if (cap - len < 1024) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
    }
    close(fd);
    buf[len] = '\0';
    if (len == 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static char *http_get(unsigned port, const char *path, const char *headers)
{
    int fd = connect_from(NULL, port);
    return fd < 0 ? NULL : get_on(fd, path, headers);
}

static pid_t daemons[4];
static int ndaemons;

static pid_t spawn(char *const argv[], const char *log)
{
    ck_assert_int_lt(ndaemons, 4);
    pid_t pid = tu_spawn(argv, log);
    daemons[ndaemons++] = pid;
    return pid;
}

/* SIGTERM, SIGKILL after 5 s; reaped. */
static void stop_one(pid_t pid)
{
    kill(pid, SIGTERM);
    uint64_t t0 = tu_now_ms();
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (tu_now_ms() - t0 > 5000) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(10000);
    }
    for (int i = 0; i < ndaemons; i++)
        if (daemons[i] == pid)
            daemons[i] = daemons[--ndaemons];
}

static void stop_all(void)
{
    while (ndaemons > 0)
        stop_one(daemons[ndaemons - 1]);
}

/* Polls /health on port until its answer holds want (up to 20 s, for a
 * loaded machine); returns the answer (malloc'd) or fails with the log. */
static char *health_until(unsigned port, const char *want, const char *log)
{
    uint64_t t0 = tu_now_ms();
    char *h = NULL;
    while (tu_now_ms() - t0 < 20000) {
        h = http_get(port, "/health", NULL);
        if (h && strstr(h, want))
            return h;
        free(h);
        h = NULL;
        usleep(50000);
    }
    ck_abort_msg("/health on %u never answered '%s'; log:\n%s", port, want, slurp(log));
    return NULL;
}

static int check_names(const char *text);

/* ---- /health ------------------------------------------------------------------ */

START_TEST(kvnode_health_from_start)
{
    char *dir = tu_mkdtemp();
    unsigned mport = tu_free_port(), nmetrics = tu_free_port();
    char s_master[96], s_nm[96], mbin[512], nbin[512], mlog[512], nlog[512], node[64];
    snprintf(s_master, sizeof s_master, "cluster.master=127.0.0.1:%u", mport);
    snprintf(s_nm, sizeof s_nm, "metrics.listen=127.0.0.1:%u", nmetrics);
    snprintf(node, sizeof node, "127.0.0.1:%u", nmetrics);
    snprintf(mlog, sizeof mlog, "%s/kvmaster.log", dir);
    snprintf(nlog, sizeof nlog, "%s/kvnode.log", dir);
    snprintf(mbin, sizeof mbin, "%s/kvmaster", tu_build_dir());
    snprintf(nbin, sizeof nbin, "%s/kvnode", tu_build_dir());

    /* The node starts before its master: /health answers at once, 503. */
    char *nargv[] = { nbin, "--set", s_master, "--set", "cluster.listen=127.0.0.1:0",
                      "--set", s_nm, "--set", "cluster.token=t0k", "--set", "pipeline=dram",
                      "--set", "dram.capacity=16MiB", "--set", "cluster.protocol=tcp", NULL };
    spawn(nargv, nlog);
    char *h = health_until(nmetrics, "joining", nlog);
    CK_HAS(h, " 503 ");
    CK_HAS(h, "unavailable: joining: waiting for the membership store (127.0.0.1:");
    free(h);
    struct out r = run_kvctl(dir, 10, "stats", "--node", node, "--health", NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.out, "joining");
    CK_HAS(r.out, "HTTP 503");
    out_free(&r);

    /* The master comes up: the node joins and serves. */
    unsigned mmetrics = tu_free_port();
    char s_mm[96];
    snprintf(s_mm, sizeof s_mm, "metrics.listen=127.0.0.1:%u", mmetrics);
    char *margv[] = { mbin, "--set", s_master, "--set", "cluster.token=t0k", "--set", s_mm, NULL };
    pid_t master = spawn(margv, mlog);
    h = health_until(nmetrics, " 200 ", nlog);
    CK_HAS(h, "\r\n\r\nok\n");
    free(h);
    /* a member's and the master's metrics are all in the table, by the rule */
    h = http_get(nmetrics, "/metrics", NULL);
    ck_assert_ptr_nonnull(h);
    CK_HAS(h, "kvengine_members{role=\"owner\"} 1\n");
    ck_assert_int_ge(check_names(h), 25);
    free(h);
    h = http_get(mmetrics, "/metrics", NULL);
    ck_assert_ptr_nonnull(h);
    CK_HAS(h, "kvengine_master_up 1\n");
    ck_assert_int_ge(check_names(h), 3);
    free(h);
    r = run_kvctl(dir, 10, "stats", "--node", node, "--health", "--json", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "\"status\":200,\"healthy\":true");
    out_free(&r);
    r = run_kvctl(dir, 10, "stats", "--node", node, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "kvengine_serving 1\n");
    out_free(&r);

    /* The master goes: the membership store is unreachable, 503 again. */
    stop_one(master);
    h = health_until(nmetrics, "membership store unreachable", nlog);
    CK_HAS(h, " 503 ");
    free(h);
    r = run_kvctl(dir, 10, "stats", "--node", node, "--health", NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.out, "membership store unreachable (kvmaster 127.0.0.1:");
    out_free(&r);

    /* usage: --health needs --node; nothing listening is a failure */
    r = run_kvctl(dir, 10, "stats", "--health", NULL);
    CK_STATUS(r, 2);
    out_free(&r);
    stop_all();
    r = run_kvctl(dir, 10, "stats", "--node", node, "--health", NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.err, "does not answer");
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(engine_health_single_process)
{
    unsigned port = tu_free_port();
    kv_engine *e = tu_open_yamlf("pipeline: dram\ndram: { capacity: 16MiB }\n"
                                 "metrics: { listen: 127.0.0.1:%u }\n", port);
    char why[256];
    ck_assert_int_eq(kv_health(e, why, sizeof why), KV_OK);
    ck_assert_str_eq(why, "ok");
    char *h = http_get(port, "/health", NULL);
    ck_assert_ptr_nonnull(h);
    CK_HAS(h, " 200 ");
    CK_HAS(h, "\r\n\r\nok\n");
    free(h);
    ck_assert_int_eq(kv_health(NULL, why, sizeof why), KV_EINVAL);
    kv_close(e);
}
END_TEST

/* ---- metrics: the table and the names ------------------------------------------- */

/* Every "# TYPE name type" in text is in the table with that type, and
 * every name follows the rule; returns how many were checked. */
static int check_names(const char *text)
{
    regex_t re;
    ck_assert_int_eq(regcomp(&re, "^kvengine_[a-z][a-z0-9_]*[a-z0-9]$", REG_EXTENDED | REG_NOSUB), 0);
    int checked = 0;
    for (const char *p = text; (p = strstr(p, "# TYPE ")); p++) {
        char name[128], type[32];
        ck_assert_int_eq(sscanf(p, "# TYPE %127s %31s", name, type), 2);
        ck_assert_msg(regexec(&re, name, 0, NULL, 0) == 0, "%s: not kvengine_ + snake case", name);
        bool counter = strcmp(type, "counter") == 0;
        size_t nl = strlen(name);
        bool total = nl > 6 && strcmp(name + nl - 6, "_total") == 0;
        ck_assert_msg(counter == total, "%s (%s): a counter ends in _total and nothing else", name,
                      type);
        if (strstr(name, "bytes"))
            ck_assert_msg(strstr(name, "_bytes") && (strcmp(name + nl - 6, "_bytes") == 0 ||
                                                     strcmp(name + nl - 12, "_bytes_total") == 0),
                          "%s: the unit is the last word", name);
        if (strcmp(type, "histogram") == 0)
            ck_assert_msg(strcmp(name + nl - 8, "_seconds") == 0, "%s: a histogram of seconds", name);
        bool found = false;
        struct kv__metric_doc d;
        for (size_t i = 0; kv__metrics_doc(i, &d) == KV_OK; i++)
            if (strcmp(d.name, name) == 0) {
                found = true;
                ck_assert_str_eq(d.type, type);
                ck_assert_msg(d.help[0] && d.who[0], "%s: no help or exporter", name);
            }
        ck_assert_msg(found, "%s is exported but not in the metrics table (engine/metrics.c)", name);
        checked++;
    }
    regfree(&re);
    return checked;
}

START_TEST(metric_names_in_the_table)
{
    /* the table itself follows the rule */
    struct kv__metric_doc d;
    size_t n = 0;
    char all[1 << 14] = "";
    for (; kv__metrics_doc(n, &d) == KV_OK; n++) {
        char line[256];
        snprintf(line, sizeof line, "# TYPE %s %s\n", d.name, d.type);
        strcat(all, line);
    }
    ck_assert_int_eq(check_names(all), (int)n);
    /* and an engine exports nothing that is not in it; its hit ratios */
    kv_engine *e = tu_open_yaml("pipeline: dram\ndram: { capacity: 16MiB }\n");
    char buf[4096];
    tu_fill(buf, sizeof buf, 3);
    ck_assert_int_eq(tu_dump1(e, tu_id(1, 3), 0, buf, sizeof buf), KV_OK);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(tu_load1(e, tu_id(1, 3), 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_load1(e, tu_id(2, 3), 0, buf, sizeof buf), KV_ENOTFOUND);
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kv_metrics_render(e, &text, &len), KV_OK);
    ck_assert_int_ge(check_names(text), 20);
    CK_HAS(text, "kvengine_hits_total{tier=\"dram\"} 3\n");
    CK_HAS(text, "kvengine_read_misses_total 1\n");
    CK_HAS(text, "kvengine_read_hit_ratio{tier=\"dram\"} 0.750000\n");
    CK_HAS(text, "kvengine_read_hit_ratio{tier=\"ssd\"} 0.000000\n");
    CK_HAS(text, "kvengine_read_hit_ratio{tier=\"all\"} 0.750000\n");
    CK_HAS(text, "kvengine_serving 1\n");
    free(text);
    kv_close(e);
}
END_TEST

/* ---- metrics endpoint limits (issue 17, 7) -------------------------------------- */

START_TEST(idle_connections_do_not_lock_scrapers_out)
{
    unsigned port = tu_free_port();
    kv_engine *e = tu_open_yamlf("pipeline: dram\ndram: { capacity: 16MiB }\n"
                                 "metrics: { listen: 127.0.0.1:%u }\n", port);
    /* 16 idle connections from one client (more than the old global cap) */
    int idle[16];
    for (int i = 0; i < 16; i++)
        idle[i] = connect_from("127.0.0.1", port);
    /* another client is served at once */
    int fd = connect_from("127.0.0.2", port);
    ck_assert_int_ge(fd, 0);
    char *m = get_on(fd, "/metrics", NULL);
    ck_assert_msg(m && strstr(m, " 200 "), "a second client was locked out: %s", m ? m : "(none)");
    free(m);
    /* the idle ones are closed by the server: each reads end-of-file (or
     * was refused past the per-client cap) without sending anything */
    int closed = 0;
    for (int i = 0; i < 16; i++) {
        if (idle[i] < 0) {
            closed++;
            continue;
        }
        struct pollfd pf = { .fd = idle[i], .events = POLLIN };
        char c;
        if (poll(&pf, 1, 30000) == 1 && recv(idle[i], &c, 1, 0) <= 0)
            closed++;
        close(idle[i]);
    }
    ck_assert_int_eq(closed, 16);
    /* and the first client is served again afterwards */
    m = http_get(port, "/health", NULL);
    ck_assert_ptr_nonnull(m);
    CK_HAS(m, " 200 ");
    free(m);
    kv_close(e);
}
END_TEST

START_TEST(beyond_loopback_needs_a_token)
{
    unsigned port = tu_free_port();
    char yaml[512], err[512] = "";
    kv_config *cfg = NULL;
    kv_engine *e = NULL;
    /* 0.0.0.0 with no token: refused, and the message says what to do */
    snprintf(yaml, sizeof yaml, "pipeline: dram\ndram: { capacity: 16MiB }\n"
                                "metrics: { listen: 0.0.0.0:%u }\n", port);
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    ck_assert_int_eq(kv_config_parse(cfg, yaml, strlen(yaml), err, sizeof err), KV_OK);
    ck_assert_int_eq(kv_open(cfg, &e), KV_ECONFIG);
    ck_assert_ptr_null(e);
    ck_assert(tu_capture_has("metrics.token"));
    /* with metrics.insecure it serves, and says so */
    ck_assert_int_eq(kv_config_set(cfg, "metrics.insecure", "true"), KV_OK);
    ck_assert_int_eq(kv_open(cfg, &e), KV_OK);
    ck_assert(tu_capture_has("to anyone"));
    char *m = http_get(port, "/metrics", NULL);
    ck_assert_ptr_nonnull(m);
    CK_HAS(m, " 200 ");
    free(m);
    kv_close(e);
    /* with a token: /metrics needs it (401 without, or with a wrong one),
     * /health does not */
    ck_assert_int_eq(kv_config_set(cfg, "metrics.insecure", "false"), KV_OK);
    ck_assert_int_eq(kv_config_set(cfg, "metrics.token", "s3cret-metrics"), KV_OK);
    ck_assert_int_eq(kv_open(cfg, &e), KV_OK);
    m = http_get(port, "/metrics", NULL);
    ck_assert_ptr_nonnull(m);
    CK_HAS(m, " 401 ");
    CK_HAS(m, "WWW-Authenticate: Bearer");
    free(m);
    m = http_get(port, "/metrics", "Authorization: Bearer s3cret-metricz\r\n");
    CK_HAS(m, " 401 ");
    free(m);
    m = http_get(port, "/metrics", "Authorization: Bearer s3cret-metric\r\n");
    CK_HAS(m, " 401 ");
    free(m);
    m = http_get(port, "/metrics", "Authorization: Bearer s3cret-metrics\r\n");
    CK_HAS(m, " 200 ");
    CK_HAS(m, "kvengine_blocks{tier=\"dram\"}");
    free(m);
    m = http_get(port, "/health", NULL);
    CK_HAS(m, " 200 ");
    free(m);
    /* kvctl sends metrics.token from its config */
    char *dir = tu_mkdtemp(), node[64];
    snprintf(node, sizeof node, "127.0.0.1:%u", port);
    struct out r = run_kvctl(dir, 10, "stats", "--node", node, NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.err, "HTTP 401");
    out_free(&r);
    r = run_kvctl(dir, 10, "--set", "metrics.token=s3cret-metrics", "stats", "--node", node, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "kvengine_blocks{tier=\"dram\"} 0\n");
    out_free(&r);
    kv_close(e);
    kv_config_free(cfg);
    tu_rmdir(dir);
}
END_TEST

/* kvmaster and kvnode follow the same rule for their own servers. */
START_TEST(daemons_refuse_open_metrics_without_a_token)
{
    char *dir = tu_mkdtemp();
    const char *progs[] = { "kvmaster", "kvnode" };
    for (int i = 0; i < 2; i++) {
        char bin[512], log[512], s_m[96], s_master[96];
        snprintf(bin, sizeof bin, "%s/%s", tu_build_dir(), progs[i]);
        snprintf(log, sizeof log, "%s/%s.log", dir, progs[i]);
        snprintf(s_m, sizeof s_m, "metrics.listen=0.0.0.0:%u", tu_free_port());
        snprintf(s_master, sizeof s_master, "cluster.master=127.0.0.1:%u", tu_free_port());
        char *argv[] = { bin, "--set", s_m, "--set", s_master, "--set", "pipeline=dram",
                         "--set", "dram.capacity=16MiB", NULL };
        pid_t pid = spawn(argv, log);
        int st = 0;
        uint64_t t0 = tu_now_ms();
        while (waitpid(pid, &st, WNOHANG) == 0 && tu_now_ms() - t0 < 20000)
            usleep(20000);
        bool exited = WIFEXITED(st) && WEXITSTATUS(st) != 0;
        if (!exited)
            stop_one(pid);
        else
            for (int j = 0; j < ndaemons; j++)
                if (daemons[j] == pid)
                    daemons[j] = daemons[--ndaemons];
        char *text = slurp(log);
        ck_assert_msg(exited, "%s served 0.0.0.0 without a token; log:\n%s", progs[i], text);
        CK_HAS(text, "metrics.token");
        free(text);
    }
    tu_rmdir(dir);
}
END_TEST

/* ---- the generated references match the code ----------------------------------- */

/* Runs build/gendoc WHAT and compares its output with the checked-in file. */
static void same_as_generated(const char *what, const char *file)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/gendoc %s | cmp -s - %s", tu_build_dir(), what, file);
    int st = system(cmd);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "%s is not what '%s/gendoc %s' writes: run make doc (and commit it)", file,
                  tu_build_dir(), what);
}

START_TEST(references_match_the_code)
{
    same_as_generated("config-md", "doc/config.md");
    same_as_generated("config-man", "man/kvengine.yaml.5");
    same_as_generated("metrics-md", "doc/metrics.md");
    /* every key and every metric is in them */
    char *md = NULL;
    FILE *f = fopen("doc/config.md", "r");
    ck_assert_ptr_nonnull(f);
    static char text[1 << 17];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    struct kv__config_entry k;
    for (size_t i = 0; kv__config_schema(i, &k) == KV_OK; i++) {
        char want[160];
        snprintf(want, sizeof want, "`%s`", k.name);
        CK_HAS(text, want);
    }
    f = fopen("doc/metrics.md", "r");
    ck_assert_ptr_nonnull(f);
    n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    struct kv__metric_doc d;
    for (size_t i = 0; kv__metrics_doc(i, &d) == KV_OK; i++) {
        char want[160];
        snprintf(want, sizeof want, "`%s`", d.name);
        CK_HAS(text, want);
    }
    free(md);
}
END_TEST
/* ---- hit ratios: lookups per tier, prefix (issue 19) ------------------------------ */

static kv_stats stats_of(kv_engine *e)
{
    kv_stats st;
    ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
    return st;
}

#define CK_LOOKUPS(e, d, s, m)                                                              \
    do {                                                                                   \
        kv_stats st_ = stats_of(e);                                                        \
        ck_assert_uint_eq(st_.lookup_hits_dram, (d));                                      \
        ck_assert_uint_eq(st_.lookup_hits_ssd, (s));                                       \
        ck_assert_uint_eq(st_.lookup_misses, (m));                                         \
    } while (0)

/* Blocks on SSD only (dumped by an ssd-pipeline engine on the same path),
 * blocks in DRAM, blocks nowhere: each lookup moves exactly its counter,
 * prefix lookups count the ids they examined and their own ratio, and
 * loads (reads) are counted apart. */
START_TEST(lookup_hits_per_tier_and_prefix_ratio)
{
    char *dir = tu_mkdtemp(), buf[4096];
    tu_fill(buf, sizeof buf, 7);
    kv_engine *e = tu_open_yamlf("pipeline: ssd\nssd: { path: %s }\n", dir);
    ck_assert_int_eq(tu_dump1(e, tu_id(1, 19), 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_dump1(e, tu_id(2, 19), 0, buf, sizeof buf), KV_OK);
    kv_close(e);
    e = tu_open_yamlf("pipeline: dram|ssd\ndram: { capacity: 16MiB }\nssd: { path: %s }\n", dir);
    ck_assert_int_eq(tu_dump1(e, tu_id(3, 19), 0, buf, sizeof buf), KV_OK);
    CK_LOOKUPS(e, 0, 0, 0);
    kv_block_id ids[4] = { tu_id(3, 19), tu_id(1, 19), tu_id(2, 19), tu_id(4, 19) };
    uint8_t hit[4];
    ck_assert_int_eq(kv_lookup(e, ids, 4, hit), KV_OK);
    ck_assert(hit[0] == 1 && hit[1] == 1 && hit[2] == 1 && hit[3] == 0);
    CK_LOOKUPS(e, 1, 2, 1);
    ck_assert_int_eq(kv_lookup(e, &ids[3], 1, hit), KV_OK);   /* a miss alone */
    CK_LOOKUPS(e, 1, 2, 2);
    ck_assert_int_eq(kv_lookup(e, ids, 1, hit), KV_OK);       /* a DRAM hit alone */
    CK_LOOKUPS(e, 2, 2, 2);
    ck_assert_int_eq(kv_lookup(e, &ids[1], 1, hit), KV_OK);   /* an SSD hit alone */
    CK_LOOKUPS(e, 2, 3, 2);

    /* prefix: DRAM, SSD, then a miss: 2 of 4 ids; the id past the miss is
     * not examined, so the lookups move by 1, 1, 1 */
    kv_block_id run[4] = { tu_id(3, 19), tu_id(1, 19), tu_id(4, 19), tu_id(3, 19) };
    ck_assert_int_eq(kv_lookup_prefix(e, run, 4), 1);
    CK_LOOKUPS(e, 3, 4, 3);
    kv_stats st = stats_of(e);
    ck_assert_uint_eq(st.prefix_ids, 4);
    ck_assert_uint_eq(st.prefix_hits, 2);
    ck_assert_int_eq(kv_lookup_prefix(e, &run[2], 1), -1);    /* 0 of 1 */
    ck_assert_int_eq(kv_lookup_prefix(e, run, 2), 1);         /* 2 of 2 */
    st = stats_of(e);
    ck_assert_uint_eq(st.prefix_ids, 7);
    ck_assert_uint_eq(st.prefix_hits, 4);
    CK_LOOKUPS(e, 4, 5, 4);
    /* lookups are not reads */
    ck_assert_uint_eq(st.hits_dram + st.hits_ssd + st.misses, 0);
    ck_assert_int_eq(tu_load1(e, tu_id(1, 19), 0, buf, sizeof buf), KV_OK);
    st = stats_of(e);
    ck_assert_uint_eq(st.hits_ssd, 1);
    CK_LOOKUPS(e, 4, 5, 4);

    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kv_metrics_render(e, &text, &len), KV_OK);
    check_names(text);
    CK_HAS(text, "kvengine_lookup_hits_total{tier=\"dram\"} 4\n");
    CK_HAS(text, "kvengine_lookup_hits_total{tier=\"ssd\"} 5\n");
    CK_HAS(text, "kvengine_lookup_misses_total 4\n");
    CK_HAS(text, "kvengine_lookup_hit_ratio{tier=\"dram\"} 0.307692\n");   /* 4 / 13 */
    CK_HAS(text, "kvengine_lookup_hit_ratio{tier=\"ssd\"} 0.384615\n");    /* 5 / 13 */
    CK_HAS(text, "kvengine_lookup_hit_ratio{tier=\"all\"} 0.692308\n");    /* 9 / 13 */
    CK_HAS(text, "kvengine_prefix_lookup_ids_total 7\n");
    CK_HAS(text, "kvengine_prefix_lookup_hits_total 4\n");
    CK_HAS(text, "kvengine_prefix_hit_ratio 0.571429\n");                  /* 4 / 7 */
    CK_HAS(text, "kvengine_read_hits_total{tier=\"ssd\"} 1\n");
    CK_HAS(text, "kvengine_hits_total{tier=\"ssd\"} 1\n");                 /* the alias */
    free(text);
    kv_close(e);
    tu_rmdir(dir);
}
END_TEST

/* A block hits only once complete (store.block_shards): until then its
 * lookup is a miss, not a DRAM hit; plain keys' lookups are not counted. */
START_TEST(lookup_counts_complete_blocks_only)
{
    kv_engine *e = tu_open_yaml("pipeline: dram\ndram: { capacity: 16MiB }\n"
                                "store: { block_shards: 2 }\n");
    char buf[512];
    tu_fill(buf, sizeof buf, 1);
    kv_block_id id = tu_id(9, 19);
    uint8_t hit;
    ck_assert_int_eq(tu_dump1(e, id, 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(kv_lookup(e, &id, 1, &hit), KV_OK);
    ck_assert_int_eq(hit, 0);
    CK_LOOKUPS(e, 0, 0, 1);
    ck_assert_int_eq(tu_dump1(e, id, 1, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(kv_lookup(e, &id, 1, &hit), KV_OK);
    ck_assert_int_eq(hit, 1);
    CK_LOOKUPS(e, 1, 0, 1);
    ck_assert_int_eq(kv_put(e, "k", 1, "v", 1), KV_OK);
    ck_assert_int_eq(kv_exists(e, "k", 1), 1);
    CK_LOOKUPS(e, 1, 0, 1);
    kv_close(e);
}
END_TEST

struct lk_arg {
    kv_engine *e;
    int rounds;
};

static void *lookup_loop(void *p)
{
    struct lk_arg *a = p;
    kv_block_id ids[3] = { tu_id(1, 20), tu_id(2, 20), tu_id(3, 20) };
    uint8_t hit[3];
    for (int i = 0; i < a->rounds; i++) {
        if (kv_lookup(a->e, ids, 3, hit) != KV_OK || kv_lookup_prefix(a->e, ids, 3) != 1)
            return (void *)1;
    }
    return NULL;
}

/* Counters striped per thread still add up exactly. */
START_TEST(lookup_counters_exact_across_threads)
{
    kv_engine *e = tu_open_yaml("pipeline: dram\ndram: { capacity: 16MiB }\n");
    char buf[256];
    tu_fill(buf, sizeof buf, 2);
    ck_assert_int_eq(tu_dump1(e, tu_id(1, 20), 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_dump1(e, tu_id(2, 20), 0, buf, sizeof buf), KV_OK);
    enum { T = 20, R = 500 };
    pthread_t th[T];
    struct lk_arg a = { e, R };
    for (int i = 0; i < T; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, lookup_loop, &a), 0);
    for (int i = 0; i < T; i++) {
        void *r;
        pthread_join(th[i], &r);
        ck_assert_ptr_null(r);
    }
    /* per round: lookup 2 hits + 1 miss; prefix examines all 3 (2 + 1) */
    CK_LOOKUPS(e, 4ull * T * R, 0, 2ull * T * R);
    kv_stats st = stats_of(e);
    ck_assert_uint_eq(st.prefix_ids, 3ull * T * R);
    ck_assert_uint_eq(st.prefix_hits, 2ull * T * R);
    kv_close(e);
}
END_TEST

Suite *ops_suite(void)
{
    Suite *s = suite_create("ops");
    TCase *h = tcase_create("health");
    tcase_set_timeout(h, 120);
    tcase_add_test(h, kvnode_health_from_start);
    tcase_add_test(h, engine_health_single_process);
    suite_add_tcase(s, h);
    TCase *m = tcase_create("metrics");
    tcase_set_timeout(m, 120);
    tcase_add_test(m, metric_names_in_the_table);
    tcase_add_test(m, idle_connections_do_not_lock_scrapers_out);
    tcase_add_test(m, beyond_loopback_needs_a_token);
    tcase_add_test(m, daemons_refuse_open_metrics_without_a_token);
    tcase_add_test(m, lookup_hits_per_tier_and_prefix_ratio);
    tcase_add_test(m, lookup_counts_complete_blocks_only);
    tcase_add_test(m, lookup_counters_exact_across_threads);
    suite_add_tcase(s, m);
    TCase *d = tcase_create("docs");
    tcase_add_test(d, references_match_the_code);
    suite_add_tcase(s, d);
    return s;
}
