/*
 * check_tools.c — suite "tools": kvctl, run as the real binary.
 *
 * Each test runs $KV_BUILD/kvctl (tu_build_dir) with fork/exec, its stdout
 * and stderr going to files in a fresh temporary directory, and checks the
 * exit status and what it printed. A child that outlives its deadline is
 * killed and reaped. The summary JSON is checked with a small parser kept
 * here (a strict one: it rejects anything that is not JSON), so "parses"
 * means parses.
 *
 * The admin commands (stats, members, lookup/put/get/rm, ssd) run against
 * stores made in a temporary directory, against a closed port on
 * 127.0.0.1 (a node that does not answer), and against a kvmaster and a
 * kvnode started here with metrics.listen; /metrics is also fetched with a
 * small socket client. Every daemon a test starts dies with it
 * (PR_SET_PDEATHSIG) and is killed and reaped at the end of the test.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "etcd_fixture.h"
#include "persist/ssd.h"
#include "testutil.h"
#include "testutil_int.h"
#include "testutil_kvctl.h"

/* Checks one phases array: DESIGN's fields, and names/ops/verify. */
static void check_phases(const struct jv *phases, const char *const *names, size_t n,
                         double ops)
{
    ck_assert_int_eq(phases->t, J_ARR);
    ck_assert_uint_eq(phases->n, n);
    for (size_t i = 0; i < n; i++) {
        const struct jv *p = phases->items[i];
        ck_assert_str_eq(jget(p, "name", J_STR)->str, names[i]);
        ck_assert_double_eq(jget(p, "ops", J_NUM)->num, ops);
        jget(p, "bytes", J_NUM);
        ck_assert(jget(p, "seconds", J_NUM)->num >= 0);
        jget(p, "mib_s", J_NUM);
        ck_assert(jget(p, "kvs_s", J_NUM)->num > 0);
        const struct jv *lat = jget(p, "lat_us", J_OBJ);
        double p50 = jget(lat, "p50", J_NUM)->num, p99 = jget(lat, "p99", J_NUM)->num;
        ck_assert(p50 > 0 && p50 <= jget(lat, "p95", J_NUM)->num && p50 <= p99);
        ck_assert_double_eq(jget(p, "misses", J_NUM)->num, 0);
        ck_assert_double_eq(jget(p, "verify_failures", J_NUM)->num, 0);
        ck_assert_double_eq(jget(p, "errors", J_NUM)->num, 0);
    }
}

/* ---- tests --------------------------------------------------------------- */

START_TEST(help_lists_commands_and_exit_codes)
{
    char *dir = tu_mkdtemp();
    struct out r = run_kvctl(dir, 10, "--help", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "config check FILE");
    CK_HAS(r.out, "config show");
    CK_HAS(r.out, "bench");
    CK_HAS(r.out, "--set KEY=VALUE");
    CK_HAS(r.out, "Exit status");
    CK_HAS(r.out, "2  usage or configuration error");
    out_free(&r);

    r = run_kvctl(dir, 10, "bench", "--help", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "--scenario NAME");
    CK_HAS(r.out, "default: read_perf");
    CK_HAS(r.out, "mixed_rw");
    CK_HAS(r.out, "--compare BACKEND");
    out_free(&r);

    r = run_kvctl(dir, 10, "config", "--help", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "config check FILE");
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(config_check_prints_effective_config)
{
    char *dir = tu_mkdtemp();
    char *cfg = write_file(dir, "good.yaml",
                           "pipeline: dram\n"
                           "dram:\n"
                           "  capacity: 512MiB\n");
    struct out r = run_kvctl(dir, 10, "--set", "eviction.ratio=0.25", "config", "check", cfg,
                             NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "pipeline: dram\n");
    CK_HAS(r.out, "capacity: 512MiB");
    CK_HAS(r.out, "ratio: 0.25");
    CK_HAS(r.out, "lease_ttl_ms: 60000");   /* a default it did not name */
    out_free(&r);

    /* show: the same from --config and --set, either side of the command */
    r = run_kvctl(dir, 10, "config", "show", "--config", cfg, "--set", "io.threads=3", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "capacity: 512MiB");
    CK_HAS(r.out, "threads: 3");
    out_free(&r);
    free(cfg);
    tu_rmdir(dir);
}
END_TEST

START_TEST(config_check_bad_file_names_line_and_key)
{
    char *dir = tu_mkdtemp();
    char *cfg = write_file(dir, "bad.yaml",
                           "dram:\n"
                           "  capacity: 1GiB\n"
                           "eviction:\n"
                           "  ratio: 1.5\n");
    struct out r = run_kvctl(dir, 10, "config", "check", cfg, NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "bad.yaml:4");
    CK_HAS(r.err, "eviction.ratio");
    ck_assert_str_eq(r.out, "");
    out_free(&r);

    char *unknown = write_file(dir, "unknown.yaml", "dram:\n  capacty: 1GiB\n");
    r = run_kvctl(dir, 10, "config", "check", unknown, NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "unknown.yaml:2");
    CK_HAS(r.err, "dram.capacty");
    out_free(&r);

    r = run_kvctl(dir, 10, "config", "check", "/nonexistent/kv.yaml", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "/nonexistent/kv.yaml");
    out_free(&r);
    free(cfg);
    free(unknown);
    tu_rmdir(dir);
}
END_TEST

START_TEST(bad_usage_exits_2)
{
    char *dir = tu_mkdtemp();
    static const char *const cases[][4] = {
        { "--bogus", NULL },
        { "frobnicate", NULL },
        { NULL },
        { "--set", "noequals", "config", "show" },
        { "--set", "dram.capacity=lots", "config", "show" },
        { "--set", "no.such.key=1", "config", "show" },
        { "config", "check", NULL },
        { "bench", "--value-size", "abc" },
        { "bench", "--scenario", "nope" },
        { "bench", "--numjobs", "0" },
        { "bench", "--compare", "ramfs" },
        { "bench", "--scenario", "mixed_rw", "--runtime" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct out r = run_kvctl(dir, 10, cases[i][0], cases[i][1], cases[i][2], cases[i][3],
                                 NULL);
        ck_assert_msg(r.status == 2, "case %zu (%s %s): exit %d\n%s", i,
                      cases[i][0] ? cases[i][0] : "", cases[i][1] ? cases[i][1] : "", r.status,
                      r.err);
        ck_assert_msg(r.err[0] != '\0', "case %zu: nothing on stderr", i);
        out_free(&r);
    }
    /* a bad --set value is explained: the key, and why */
    struct out r = run_kvctl(dir, 10, "--set", "dram.capacity=lots", "config", "show", NULL);
    CK_HAS(r.err, "dram.capacity");
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(tiny_verify_write_summary_json)
{
    char *dir = tu_mkdtemp();
    char *json = NULL;
    ck_assert(asprintf(&json, "%s/summary.json", dir) > 0);
    struct out r = run_kvctl(dir, 60, "bench", "--scenario", "verify_write", "--nr-objects", "16",
                             "--value-size", "64KiB", "--summary-json", json, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "verify_write");
    CK_HAS(r.out, "[kvengine]");
    ck_assert_msg(strchr(r.err, '\r') == NULL, "progress written to a pipe");
    char *text = slurp(json);
    struct jv *v = jparse(text);
    ck_assert_msg(v != NULL, "summary is not JSON:\n%s", text);
    ck_assert_str_eq(jget(v, "scenario", J_STR)->str, "verify_write");
    ck_assert(jget(v, "memcpy_mib_s", J_NUM)->num > 0);
    static const char *const names[] = { "write", "read" };
    check_phases(jget(v, "phases", J_ARR), names, 2, 16);
    ck_assert_double_eq(jget(jget(v, "phases", J_ARR)->items[1], "bytes", J_NUM)->num,
                        16.0 * 65536);
    ck_assert_double_eq(jget(v, "value_size", J_NUM)->num, 65536);
    ck_assert_str_eq(jget(v, "pipeline", J_STR)->str, "dram");
    ck_assert(jget(v, "ok", J_BOOL)->num == 1);
    ck_assert(jget(v, "index_bytes_per_shard", J_NUM)->num > 0);
    ck_assert(jget(v, "rss_mib", J_NUM)->num > 0);
    jfree(v);
    free(text);
    free(json);
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

static size_t count_entries(const char *path)
{
    DIR *d = opendir(path);
    ck_assert_ptr_nonnull(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

START_TEST(compare_posix_runs_both)
{
    char *dir = tu_mkdtemp();
    char *json = NULL, *pdir = NULL;
    ck_assert(asprintf(&json, "%s/summary.json", dir) > 0);
    ck_assert(asprintf(&pdir, "%s/posix", dir) > 0);
    ck_assert_int_eq(mkdir(pdir, 0755), 0);
    struct out r = run_kvctl(dir, 60, "bench", "--scenario", "read_perf", "--nr-objects", "16",
                             "--value-size", "64KiB", "--verify", "--compare", "posix",
                             "--posix-dir", pdir, "--summary-json", json, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "[kvengine]");
    CK_HAS(r.out, "[posix]");
    CK_HAS(r.out, "kvengine / posix");
    /* the posix backend's files are gone */
    ck_assert_uint_eq(count_entries(pdir), 0);
    char *text = slurp(json);
    struct jv *v = jparse(text);
    ck_assert_msg(v != NULL, "summary is not JSON:\n%s", text);
    static const char *const names[] = { "write", "lookup", "read" };
    check_phases(jget(v, "phases", J_ARR), names, 3, 16);
    const struct jv *cmp = jget(v, "comparisons", J_ARR);
    ck_assert_uint_eq(cmp->n, 1);
    const struct jv *px = cmp->items[0];
    ck_assert_str_eq(jget(px, "backend", J_STR)->str, "posix");
    check_phases(jget(px, "phases", J_ARR), names, 3, 16);
    const struct jv *ratios = jget(px, "ratios", J_OBJ);
    ck_assert(jget(jget(ratios, "read", J_OBJ), "kvs_s", J_NUM)->num > 0);
    ck_assert(jget(jget(ratios, "read", J_OBJ), "mib_s", J_NUM)->num > 0);
    ck_assert(jget(jget(ratios, "lookup", J_OBJ), "ids_s", J_NUM)->num > 0);
    jfree(v);
    free(text);
    free(json);
    free(pdir);
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(mixed_rw_is_time_based)
{
    char *dir = tu_mkdtemp();
    uint64_t t0 = tu_now_ms();
    struct out r = run_kvctl(dir, 60, "bench", "--scenario", "mixed_rw", "--nr-objects", "32",
                             "--value-size", "64KiB", "--runtime", "0.3", "--rwmixread", "50",
                             "--verify", "--summary-json", "-", NULL);
    CK_STATUS(r, 0);
    ck_assert_uint_ge(tu_now_ms() - t0, 300);
    /* --summary-json - puts the JSON on stdout after the table */
    char *brace = strstr(r.out, "\n{\"scenario\"");
    ck_assert_msg(brace != NULL, "no JSON on stdout:\n%s", r.out);
    struct jv *v = jparse(brace + 1);
    ck_assert_ptr_nonnull(v);
    const struct jv *ph = jget(v, "phases", J_ARR);
    ck_assert_uint_eq(ph->n, 3);
    ck_assert_str_eq(jget(ph->items[1], "name", J_STR)->str, "mixed_read");
    ck_assert_str_eq(jget(ph->items[2], "name", J_STR)->str, "mixed_write");
    ck_assert(jget(ph->items[1], "ops", J_NUM)->num > 0);
    ck_assert(jget(ph->items[2], "ops", J_NUM)->num > 0);
    ck_assert(jget(ph->items[1], "seconds", J_NUM)->num >= 0.29);
    ck_assert_double_eq(jget(ph->items[1], "verify_failures", J_NUM)->num, 0);
    jfree(v);
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(ssd_pipeline_gets_a_temporary_path)
{
    char *dir = tu_mkdtemp();
    char *env = NULL;
    /* The bench puts its temporary ssd.path under $TMPDIR: point that at
     * our directory to see it made and removed. */
    ck_assert(asprintf(&env, "%s", dir) > 0);
    setenv("TMPDIR", env, 1);
    struct out r = run_kvctl(dir, 60, "--set", "pipeline=dram|ssd", "bench", "--scenario",
                             "verify_write", "--nr-objects", "8", "--value-size", "64KiB", NULL);
    unsetenv("TMPDIR");
    CK_STATUS(r, 0);
    CK_HAS(r.out, "pipeline dram|ssd");
    /* only our stdout and stderr files remain */
    ck_assert_uint_eq(count_entries(dir), 2);
    out_free(&r);
    free(env);
    tu_rmdir(dir);
}
END_TEST

/* ---- admin commands -------------------------------------------------------- */

/* GET path from 127.0.0.1:port (HTTP/1.0); the whole answer, headers and
 * all, or NULL when nothing answered within 3 s. */
static char *http_get(unsigned port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = { .tv_sec = 3 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return NULL;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
    ck_assert_int_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
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
    return buf;
}

/* Daemons of the running test: killed and reaped by stop_all, and killed by
 * the kernel should the test process die first. */
static pid_t daemons[4];
static int ndaemons;

static pid_t spawn_daemon(char *const argv[], const char *log)
{
    ck_assert_int_lt(ndaemons, 4);
    pid_t pid = tu_spawn(argv, log);
    daemons[ndaemons++] = pid;
    return pid;
}

/* SIGTERM (a clean stop: the node leaves the view), SIGKILL after 3 s. */
static void stop_all(void)
{
    for (int i = ndaemons - 1; i >= 0; i--) {
        kill(daemons[i], SIGTERM);
        uint64_t t0 = tu_now_ms();
        int st;
        while (waitpid(daemons[i], &st, WNOHANG) == 0) {
            if (tu_now_ms() - t0 > 3000) {
                kill(daemons[i], SIGKILL);
                waitpid(daemons[i], &st, 0);
                break;
            }
            usleep(10000);
        }
    }
    ndaemons = 0;
}

/* Waits for /health on port to answer 200 (10 s at most): a kvnode serves
 * it from its start, 503 until it has joined. */
static void wait_health(unsigned port, const char *what, const char *log)
{
    uint64_t t0 = tu_now_ms();
    char *h = NULL;
    while (tu_now_ms() - t0 < 10000 && (!(h = http_get(port, "/health")) || !strstr(h, " 200 "))) {
        free(h);
        h = NULL;
        usleep(20000);
    }
    ck_assert_msg(h != NULL, "%s never served /health; its log:\n%s", what, slurp(log));
    CK_HAS(h, "200 OK");
    CK_HAS(h, "\r\n\r\nok\n");
    free(h);
}

START_TEST(admin_help_and_usage_errors)
{
    char *dir = tu_mkdtemp();
    static const char *const cmds[] = { "stats", "members", "lookup", "put", "get", "rm", "ssd" };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        struct out r = run_kvctl(dir, 10, cmds[i], "--help", NULL);
        CK_STATUS(r, 0);
        CK_HAS(r.out, "usage: kvctl");
        CK_HAS(r.out, cmds[i]);
        CK_HAS(r.out, "Exit status:");
        CK_HAS(r.out, "3  not found");
        out_free(&r);
        r = run_kvctl(dir, 10, "help", cmds[i], NULL);
        CK_STATUS(r, 0);
        CK_HAS(r.out, "usage: kvctl");
        out_free(&r);
    }
    struct out r = run_kvctl(dir, 10, "--help", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "ssd ls|scrub|compact");
    CK_HAS(r.out, "members");
    out_free(&r);
    /* bad arguments: 2, and the cause on stderr */
    r = run_kvctl(dir, 10, "get", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "missing argument");
    out_free(&r);
    r = run_kvctl(dir, 10, "get", "--block", "nothex", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "not a block id");
    out_free(&r);
    r = run_kvctl(dir, 10, "lookup", "--key", "--block", "k", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "exclude each other");
    out_free(&r);
    r = run_kvctl(dir, 10, "put", "--index", "x", "k", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "--index");
    out_free(&r);
    r = run_kvctl(dir, 10, "stats", "--repair", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "does not apply");
    out_free(&r);
    r = run_kvctl(dir, 10, "ssd", "defrag", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "unknown subcommand 'defrag'");
    out_free(&r);
    r = run_kvctl(dir, 10, "stats", "--node", "nocolon", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "not HOST:PORT");
    out_free(&r);
    r = run_kvctl(dir, 10, "--set", "pipeline=dram", "lookup", "k", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "keeps nothing between runs");
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(admin_missing_store_and_silent_node)
{
    char *dir = tu_mkdtemp();
    char *set = NULL;
    ck_assert(asprintf(&set, "ssd.path=%s/nothing-here", dir) > 0);
    static const char *const cmds[][2] = { { "stats", NULL }, { "lookup", "k" }, { "get", "k" },
                                           { "rm", "k" }, { "ssd", "ls" }, { "ssd", "scrub" } };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        struct out r = run_kvctl(dir, 10, "--set", set, cmds[i][0], cmds[i][1], NULL);
        CK_STATUS(r, 1);
        CK_HAS(r.err, "no store at");
        CK_HAS(r.err, "nothing-here");
        out_free(&r);
    }
    struct stat st;
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/nothing-here", dir) > 0);
    ck_assert_int_ne(stat(path, &st), 0);   /* and none was made */
    /* a closed port: the node and the master do not answer */
    char node[64], master[64];
    snprintf(node, sizeof node, "127.0.0.1:%u", tu_free_port());
    snprintf(master, sizeof master, "cluster.master=127.0.0.1:%u", tu_free_port());
    struct out r = run_kvctl(dir, 10, "stats", "--node", node, NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.err, "does not answer");
    CK_HAS(r.err, node);
    out_free(&r);
    r = run_kvctl(dir, 10, "--set", master, "members", NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.err, "does not answer");
    out_free(&r);
    free(path);
    free(set);
    tu_rmdir(dir);
}
END_TEST

START_TEST(admin_put_get_lookup_rm)
{
    char *dir = tu_mkdtemp();
    char *yaml = NULL;
    ck_assert(asprintf(&yaml, "pipeline: dram|ssd\nssd:\n  path: %s/store\n", dir) > 0);
    char *cfg = write_file(dir, "kv.yaml", yaml);
    char value[3000];
    for (size_t i = 0; i < sizeof value - 1; i++)
        value[i] = (char)('a' + i % 26);
    value[sizeof value - 1] = '\0';
    char *vfile = write_file(dir, "value.txt", value);
    const char *id = "00112233445566778899aabbccddeeff";

    struct out r = run_kvctl(dir, 20, "-c", cfg, "put", "greeting", vfile, NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    r = run_kvctl(dir, 20, "-c", cfg, "put", "--index", "1", id, vfile, NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    r = run_kvctl(dir, 20, "-c", cfg, "put", id, cfg, NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    /* from standard input */
    char *in = write_file(dir, "stdin", "piped value");
    r = run_kvctl(dir, 20, "-c", cfg, "put", "--key", "piped", NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    ck_assert_int_eq(unlink(in), 0);
    free(in);
    r = run_kvctl(dir, 20, "-c", cfg, "get", "piped", NULL);
    CK_STATUS(r, 0);
    ck_assert_str_eq(r.out, "piped value");
    out_free(&r);
    /* read back, from a fresh process: it went to disk */
    r = run_kvctl(dir, 20, "-c", cfg, "get", "greeting", NULL);
    CK_STATUS(r, 0);
    ck_assert_str_eq(r.out, value);
    out_free(&r);
    char *ofile = NULL;
    ck_assert(asprintf(&ofile, "%s/shard1", dir) > 0);
    r = run_kvctl(dir, 20, "-c", cfg, "get", id, "--index", "1", "-o", ofile, NULL);
    CK_STATUS(r, 0);
    ck_assert_str_eq(r.out, "");
    char *got = slurp(ofile);
    ck_assert_str_eq(got, value);
    free(got);
    out_free(&r);
    r = run_kvctl(dir, 20, "-c", cfg, "get", id, NULL);
    CK_STATUS(r, 0);
    ck_assert_str_eq(r.out, yaml);
    out_free(&r);
    /* lookup: 0 when all hit, 3 with a miss; JSON */
    r = run_kvctl(dir, 20, "-c", cfg, "lookup", "greeting", id, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "greeting\tkey\thit");
    CK_HAS(r.out, "block\thit");
    out_free(&r);
    r = run_kvctl(dir, 20, "-c", cfg, "lookup", "--json", "greeting", "absent",
                  "ffffffffffffffffffffffffffffffff", NULL);
    CK_STATUS(r, 3);
    struct jv *v = jparse(r.out);
    ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
    const struct jv *res = jget(v, "results", J_ARR);
    ck_assert_uint_eq(res->n, 3);
    ck_assert(jget(res->items[0], "hit", J_BOOL)->num == 1);
    ck_assert(jget(res->items[1], "hit", J_BOOL)->num == 0);
    ck_assert_str_eq(jget(res->items[2], "kind", J_STR)->str, "block");
    ck_assert(jget(res->items[2], "hit", J_BOOL)->num == 0);
    jfree(v);
    out_free(&r);
    /* stats of the store */
    r = run_kvctl(dir, 20, "-c", cfg, "stats", "--json", NULL);
    CK_STATUS(r, 0);
    v = jparse(r.out);
    ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
    ck_assert_double_eq(jget(v, "ssd_blocks", J_NUM)->num, 1);
    ck_assert(jget(v, "ssd_used", J_NUM)->num >= 2 * 2999);
    /* the lookup figures are there (this kvctl's own engine made none) */
    ck_assert_double_eq(jget(v, "lookup_misses", J_NUM)->num, 0);
    ck_assert_double_eq(jget(v, "prefix_ids", J_NUM)->num, 0);
    jget(v, "lookup_hits_dram", J_NUM);
    jget(v, "lookup_hits_ssd", J_NUM);
    jget(v, "prefix_hits", J_NUM);
    jfree(v);
    out_free(&r);
    r = run_kvctl(dir, 20, "-c", cfg, "stats", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "ssd");
    CK_HAS(r.out, "checksum failures 0");
    out_free(&r);
    /* rm: 0, then 3 when absent; get of a removed key is 3 */
    r = run_kvctl(dir, 20, "-c", cfg, "rm", "greeting", id, NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    r = run_kvctl(dir, 20, "-c", cfg, "rm", "greeting", NULL);
    CK_STATUS(r, 3);
    CK_HAS(r.err, "greeting: not found");
    out_free(&r);
    r = run_kvctl(dir, 20, "-c", cfg, "get", id, NULL);
    CK_STATUS(r, 3);
    CK_HAS(r.err, "not found");
    out_free(&r);
    /* a store held by a running engine: kvctl attaches to it (one store
     * per host, issue 16) and sees what the engine put */
    char *ydoc = NULL;
    ck_assert(asprintf(&ydoc, "pipeline: ssd\nssd: { path: %s/store }\n", dir) > 0);
    kv_engine *held = tu_open_yaml(ydoc);
    ck_assert_int_eq(kv_put(held, "held", 4, "by the engine", 13), KV_OK);
    r = run_kvctl(dir, 20, "-c", cfg, "get", "held", NULL);
    CK_STATUS(r, 0);
    ck_assert_str_eq(r.out, "by the engine");
    out_free(&r);
    kv_close(held);
    free(ydoc);
    free(ofile);
    free(vfile);
    free(cfg);
    free(yaml);
    tu_rmdir(dir);
}
END_TEST

/* A store at path with n good block values and one whose stored bytes were
 * flipped (as a silent disk error would), written through the SSD tier. */
static void make_store(const char *path, int n)
{
    kv_config *cfg = NULL;
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    ck_assert_int_eq(kv_config_set(cfg, "pipeline", "ssd"), KV_OK);
    ck_assert_int_eq(kv_config_set(cfg, "ssd.path", path), KV_OK);
    struct kv__ssd *s = NULL;
    char err[256] = "";
    int rc = kv__ssd_open(cfg, &s, err, sizeof err);
    ck_assert_msg(rc == KV_OK, "kv__ssd_open: %s", err);
    char buf[5000];
    for (int i = 0; i < n; i++) {
        kv_block_id id = tu_id((uint64_t)i, 77);
        tu_fill(buf, sizeof buf, (uint64_t)i);
        kv_iov iov = { buf, sizeof buf };
        ck_assert_int_eq(kv__ssd_write(s, KV_NS_BLOCK, &id, 0, &iov, 1), KV_OK);
    }
    kv_block_id bad = tu_id(1000, 77);
    ck_assert_int_eq(kv__ssd_write_corrupt(s, KV_NS_BLOCK, &bad, 0, buf, sizeof buf, 4000), KV_OK);
    kv__ssd_close(s);
    kv_config_free(cfg);
}

START_TEST(admin_ssd_ls_scrub_repair_compact)
{
    char *dir = tu_mkdtemp();
    char *path = NULL, *set = NULL;
    ck_assert(asprintf(&path, "%s/store", dir) > 0);
    ck_assert(asprintf(&set, "ssd.path=%s", path) > 0);
    make_store(path, 5);
    struct out r = run_kvctl(dir, 20, "--set", set, "ssd", "ls", "--json", NULL);
    CK_STATUS(r, 0);
    struct jv *v = jparse(r.out);
    ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
    ck_assert_double_eq(jget(v, "count", J_NUM)->num, 6);
    const struct jv *e = jget(v, "entries", J_ARR);
    ck_assert_uint_eq(e->n, 6);
    ck_assert_str_eq(jget(e->items[0], "kind", J_STR)->str, "block");
    ck_assert_double_eq(jget(e->items[0], "size", J_NUM)->num, 5000);
    ck_assert_uint_eq(strlen(jget(e->items[0], "id", J_STR)->str), 32);
    jfree(v);
    out_free(&r);
    /* scrub finds the one bad value, keeps it, exits 1 */
    r = run_kvctl(dir, 20, "--set", set, "ssd", "scrub", NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.out, "bad\tblock\t");
    CK_HAS(r.err, "6 values checked, 1 bad (kept");
    ck_assert_msg(strchr(r.err, '\r') == NULL, "a progress line on a file:\n%s", r.err);
    out_free(&r);
    r = run_kvctl(dir, 20, "--set", set, "ssd", "scrub", "--json", "--repair", NULL);
    CK_STATUS(r, 1);
    v = jparse(r.out);
    ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
    ck_assert_double_eq(jget(v, "checked", J_NUM)->num, 6);
    ck_assert_double_eq(jget(v, "bad_count", J_NUM)->num, 1);
    ck_assert_uint_eq(jget(v, "bad", J_ARR)->n, 1);
    ck_assert_str_eq(jget(jget(v, "bad", J_ARR)->items[0], "status", J_STR)->str, "ECORRUPT");
    jfree(v);
    out_free(&r);
    /* repaired: clean now, five values left */
    r = run_kvctl(dir, 20, "--set", set, "ssd", "scrub", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.err, "5 values checked, 0 bad");
    out_free(&r);
    r = run_kvctl(dir, 30, "--set", set, "ssd", "compact", "--json", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "\"compacted\":true");
    out_free(&r);
    r = run_kvctl(dir, 20, "--set", set, "ssd", "ls", NULL);
    CK_STATUS(r, 0);
    int lines = 0;
    for (const char *p = r.out; (p = strchr(p, '\n')); p++)
        lines++;
    ck_assert_int_eq(lines, 5);
    out_free(&r);
    free(set);
    free(path);
    tu_rmdir(dir);
}
END_TEST

/* Checks the names a scrape must carry. */
static void check_engine_metrics(const char *text)
{
    static const char *const names[] = {
        "kvengine_capacity_bytes{tier=\"dram\"}", "kvengine_capacity_bytes{tier=\"ssd\"}",
        "kvengine_used_bytes{tier=\"dram\"}", "kvengine_blocks{tier=\"dram\"}",
        "kvengine_hits_total{tier=\"dram\"}", "kvengine_misses_total{tier=\"ssd\"}",
        "kvengine_evictions_total ", "kvengine_spills_total ", "kvengine_spill_drops_total ",
        "kvengine_checksum_failures_total ",
        "kvengine_task_duration_seconds_bucket{op=\"load\",le=\"+Inf\"}",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CK_HAS(text, names[i]);
}

START_TEST(metrics_of_an_engine)
{
    unsigned port = tu_free_port();
    kv_engine *e = tu_open_yamlf("pipeline: dram\ndram: { capacity: 32MiB }\n"
                                 "metrics: { listen: 127.0.0.1:%u }\n", port);
    char buf[4096];
    tu_fill(buf, sizeof buf, 5);
    ck_assert_int_eq(tu_dump1(e, tu_id(1, 5), 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_load1(e, tu_id(1, 5), 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_load1(e, tu_id(2, 5), 0, buf, sizeof buf), KV_ENOTFOUND);
    char *m = http_get(port, "/metrics");
    ck_assert_ptr_nonnull(m);
    ck_assert_msg(strncmp(m, "HTTP/1.", 7) == 0 && strstr(m, " 200 OK\r\n"), "%.300s", m);
    CK_HAS(m, "text/plain; version=0.0.4");
    check_engine_metrics(m);
    CK_HAS(m, "# TYPE kvengine_task_duration_seconds histogram\n");
    CK_HAS(m, "# TYPE kvengine_evictions_total counter\n");
    CK_HAS(m, "kvengine_blocks{tier=\"dram\"} 1\n");
    CK_HAS(m, "kvengine_hits_total{tier=\"dram\"} 1\n");
    CK_HAS(m, "kvengine_task_duration_seconds_count{op=\"dump\"} 1\n");
    CK_HAS(m, "kvengine_task_duration_seconds_count{op=\"load\"} 2\n");
    CK_HAS(m, "kvengine_tasks_total{op=\"load\",result=\"failed\"} 1\n");
    free(m);
    char *h = http_get(port, "/health");
    ck_assert_ptr_nonnull(h);
    CK_HAS(h, "\r\n\r\nok\n");
    free(h);
    char *nf = http_get(port, "/nope");
    ck_assert_ptr_nonnull(nf);
    CK_HAS(nf, " 404 ");
    free(nf);
    /* kvctl reads it too */
    char *dir = tu_mkdtemp(), node[64];
    snprintf(node, sizeof node, "127.0.0.1:%u", port);
    struct out r = run_kvctl(dir, 10, "stats", "--node", node, "--json", NULL);
    CK_STATUS(r, 0);
    struct jv *v = jparse(r.out);
    ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
    const struct jv *mm = jget(v, "metrics", J_OBJ);
    ck_assert_double_eq(jget(mm, "kvengine_blocks{tier=\"dram\"}", J_NUM)->num, 1);
    jfree(v);
    out_free(&r);
    /* a second engine cannot listen on the same address */
    kv_config *cfg = NULL;
    kv_engine *e2 = NULL;
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    ck_assert_int_eq(kv_config_set(cfg, "pipeline", "dram"), KV_OK);
    ck_assert_int_eq(kv_config_set(cfg, "dram.capacity", "8MiB"), KV_OK);
    ck_assert_int_eq(kv_config_set(cfg, "metrics.listen", node), KV_OK);
    ck_assert_int_eq(kv_open(cfg, &e2), KV_ENET);
    ck_assert_ptr_null(e2);
    kv_config_free(cfg);
    kv_close(e);
    /* and once closed, nothing answers there */
    ck_assert_ptr_null(http_get(port, "/health"));
    tu_rmdir(dir);
}
END_TEST

START_TEST(cluster_members_metrics_and_bench)
{
    char *dir = tu_mkdtemp();
    unsigned mport = tu_free_port(), mmetrics = tu_free_port(), nport = tu_free_port(),
             nmetrics = tu_free_port();
    char bin[512], master[64], s_master[96], s_mm[96], s_listen[96], s_nm[96], mlog[512],
        nlog[512];
    snprintf(master, sizeof master, "127.0.0.1:%u", mport);
    snprintf(s_master, sizeof s_master, "cluster.master=%s", master);
    snprintf(s_mm, sizeof s_mm, "metrics.listen=127.0.0.1:%u", mmetrics);
    snprintf(s_listen, sizeof s_listen, "cluster.listen=127.0.0.1:%u", nport);
    snprintf(s_nm, sizeof s_nm, "metrics.listen=127.0.0.1:%u", nmetrics);
    snprintf(mlog, sizeof mlog, "%s/kvmaster.log", dir);
    snprintf(nlog, sizeof nlog, "%s/kvnode.log", dir);
    snprintf(bin, sizeof bin, "%s/kvmaster", tu_build_dir());
    char *margv[] = { bin, "--set", s_master, "--set", s_mm, "--set", "cluster.token=t0k", NULL };
    spawn_daemon(margv, mlog);
    wait_health(mmetrics, "kvmaster", mlog);
    char nbin[512];
    snprintf(nbin, sizeof nbin, "%s/kvnode", tu_build_dir());
    char *nargv[] = { nbin, "--set", s_master, "--set", s_listen, "--set", s_nm,
                      "--set", "cluster.token=t0k", "--set", "pipeline=dram",
                      "--set", "dram.capacity=64MiB", "--set", "cluster.protocol=tcp", NULL };
    spawn_daemon(nargv, nlog);
    wait_health(nmetrics, "kvnode", nlog);

    /* members: the node, as an owner; a wrong token is refused */
    struct out r = run_kvctl(dir, 10, "--set", s_master, "--set", "cluster.token=t0k", "members",
                             "--json", NULL);
    CK_STATUS(r, 0);
    struct jv *v = jparse(r.out);
    ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
    const struct jv *mem = jget(v, "members", J_ARR);
    ck_assert_uint_eq(mem->n, 1);
    ck_assert_str_eq(jget(mem->items[0], "role", J_STR)->str, "owner");
    CK_HAS(jget(mem->items[0], "addr", J_STR)->str, s_listen + strlen("cluster.listen="));
    jfree(v);
    out_free(&r);
    r = run_kvctl(dir, 10, "--set", s_master, "--set", "cluster.token=wrong", "members", NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.err, "refused cluster.token");
    out_free(&r);
    /* the master's /metrics counts it */
    char *m = http_get(mmetrics, "/metrics");
    ck_assert_ptr_nonnull(m);
    CK_HAS(m, "kvengine_members{role=\"owner\"} 1\n");
    CK_HAS(m, "kvengine_master_up 1\n");
    CK_HAS(m, "kvengine_view_version ");
    free(m);

    /* the bench as a pure client of the cluster */
    r = run_kvctl(dir, 60, "--set", s_master, "--set", "cluster.token=t0k", "--set",
                  "cluster.enabled=true", "--set", "dram.capacity=0", "--set",
                  "cluster.protocol=tcp", "bench", "--scenario", "verify_write", "--nr-objects",
                  "16", "--value-size", "64KiB", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "dram.capacity 0");
    ck_assert_msg(strchr(r.err, '\r') == NULL, "a progress line on a file:\n%s", r.err);
    out_free(&r);
    /* put/get through the cluster; the node holds the block */
    char *vfile = write_file(dir, "v", "cluster value\n");
    const char *id = "0123456789abcdef0123456789abcdef";
    r = run_kvctl(dir, 20, "--set", s_master, "--set", "cluster.token=t0k", "--set",
                  "cluster.enabled=true", "--set", "cluster.protocol=tcp", "put", id, vfile, NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    r = run_kvctl(dir, 20, "--set", s_master, "--set", "cluster.token=t0k", "--set",
                  "cluster.enabled=true", "--set", "cluster.protocol=tcp", "get", id, NULL);
    CK_STATUS(r, 0);
    ck_assert_str_eq(r.out, "cluster value\n");
    out_free(&r);
    /* the node's /metrics: engine metrics and the view; 17 blocks stored */
    char node[64];
    snprintf(node, sizeof node, "127.0.0.1:%u", nmetrics);
    r = run_kvctl(dir, 10, "stats", "--node", node, NULL);
    CK_STATUS(r, 0);
    check_engine_metrics(r.out);
    CK_HAS(r.out, "kvengine_members{role=\"owner\"} 1\n");
    CK_HAS(r.out, "kvengine_blocks{tier=\"dram\"} 17\n");
    out_free(&r);
    stop_all();
    free(vfile);
    tu_rmdir(dir);
}
END_TEST

/* ---- kvctl members: each member's figures (issue 19) ------------------------------ */

/* A cluster member in this process: DRAM and SSD sized apart per node so
 * that kvctl's rows can be told apart by capacity; settings[] are the
 * membership store's. */
static kv_engine *open_member(const char *dir, const char *name, const char *dram,
                              const char *ssd, const char *const *settings)
{
    kv_config *cfg = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    const char *kv[][2] = {
        { "pipeline", "dram|ssd" }, { "dram.capacity", dram }, { "ssd.capacity", ssd },
        { "ssd.path", path }, { "ssd.write_through", "true" }, { "cluster.enabled", "true" },
        { "cluster.protocol", "tcp" }, { "cluster.listen", "127.0.0.1:0" },
        { "cluster.token", "t0k" }, { "cluster.node_ttl_ms", "2000" },
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        ck_assert_int_eq(kv_config_set(cfg, kv[i][0], kv[i][1]), KV_OK);
    for (size_t i = 0; settings[i]; i++) {
        char k[128];
        const char *eq = strchr(settings[i], '=');
        snprintf(k, sizeof k, "%.*s", (int)(eq - settings[i]), settings[i]);
        ck_assert_int_eq(kv_config_set(cfg, k, eq + 1), KV_OK);
    }
    kv_engine *e = NULL;
    ck_assert_int_eq(kv_open(cfg, &e), KV_OK);
    kv_config_free(cfg);
    return e;
}

/* The view version a member has installed (its kvengine_view_version). */
static uint64_t view_version(kv_engine *e)
{
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kv_metrics_render(e, &text, &len), KV_OK);
    const char *p = strstr(text, "\nkvengine_view_version ");
    ck_assert_ptr_nonnull(p);
    uint64_t v = strtoull(p + strlen("\nkvengine_view_version "), NULL, 10);
    free(text);
    return v;
}

/* Whether row (a member of kvctl members --json) carries st's figures. */
static bool row_is(const struct jv *row, const kv_stats *st)
{
    return jnum_of(row, "dram_capacity") == (double)st->dram_capacity &&
           jnum_of(row, "dram_used") == (double)st->dram_used &&
           jnum_of(row, "ssd_capacity") == (double)st->ssd_capacity &&
           jnum_of(row, "ssd_used") == (double)st->ssd_used &&
           jnum_of(row, "dram_blocks") == (double)st->dram_blocks &&
           jnum_of(row, "ssd_blocks") == (double)st->ssd_blocks &&
           jnum_of(row, "keys") == (double)st->keys;
}

/* Two members; blocks and a key stored through the cluster after they
 * joined; kvctl members (asking only the membership store) shows, within
 * a few heartbeats, each node's figures as its own kv_stats has them, and
 * totals that add up. */
static void members_show_figures(const char *dir, const char *const *store, bool kvmaster)
{
    kv_engine *a = open_member(dir, "a", "48MiB", "1GiB", store);
    kv_engine *b = open_member(dir, "b", "24MiB", "2GiB", store);
    enum { N = 24 };
    static char buf[N][8192];
    kv_shard sh[N];
    kv_iov iov[N];
    for (int i = 0; i < N; i++) {
        tu_fill(buf[i], sizeof buf[i], (uint64_t)i);
        iov[i] = (kv_iov){ buf[i], sizeof buf[i] };
        sh[i] = (kv_shard){ tu_id((uint64_t)i, 77), 0, &iov[i], 1 };
    }
    ck_assert_int_eq(tu_task(a, 1, sh, N), KV_OK);
    ck_assert_int_eq(kv_put(b, "figures", 7, "value", 5), KV_OK);
    kv_stats sa, sb;
    ck_assert_int_eq(kv_stats_get(a, &sa), KV_OK);
    ck_assert_int_eq(kv_stats_get(b, &sb), KV_OK);
    ck_assert_uint_ge(sa.dram_blocks + sb.dram_blocks, N);   /* on one node or both */
    ck_assert_uint_gt(sa.ssd_used + sb.ssd_used, 0);

    char *args[24];
    int na = 0;
    for (size_t i = 0; store[i]; i++) {
        args[na++] = "--set";
        args[na++] = (char *)store[i];
    }
    args[na++] = "--set";
    args[na++] = "cluster.token=t0k";
    args[na++] = "members";
    args[na++] = "--json";
    args[na] = NULL;
    bool ok = false;
    char *last = NULL;
    double view = -1;
    uint64_t va = 0, vb = 0;
    for (int tries = 0; tries < 200 && !ok; tries++) {
        if (tries)
            usleep(50000);
        /* the nodes' own figures move too (re-replication once b is in
         * a's view): compare with them as they are now */
        ck_assert_int_eq(kv_stats_get(a, &sa), KV_OK);
        ck_assert_int_eq(kv_stats_get(b, &sb), KV_OK);
        va = view_version(a);
        vb = view_version(b);
        struct out r = run_argv(dir, 10, args);
        CK_STATUS(r, 0);
        free(last);
        last = strdup(r.out);
        struct jv *v = jparse(r.out);
        ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
        const struct jv *mem = jget(v, "members", J_ARR);
        if (mem->n == 2) {
            const struct jv *ra = mem->items[0], *rb = mem->items[1];
            if (jnum_of(ra, "dram_capacity") != (double)sa.dram_capacity) {
                ra = mem->items[1];
                rb = mem->items[0];
            }
            ok = row_is(ra, &sa) && row_is(rb, &sb) && va == view_version(a) &&
                 vb == view_version(b);
            if (ok) {
                view = jnum_of(v, "version");
                for (int k = 0; k < 2; k++) {
                    const struct jv *row = mem->items[k];
                    ck_assert_str_eq(jget(row, "role", J_STR)->str, "owner");
                    ck_assert_str_eq(jget(row, "lib_version", J_STR)->str, kv_version());
                    ck_assert(jnum_of(row, "heartbeat_age_ms") >= 0);
                }
                const struct jv *t = jget(v, "totals", J_OBJ);
                ck_assert_double_eq(jnum_of(t, "owners"), 2);
                ck_assert_double_eq(jnum_of(t, "dram_capacity"),
                                    (double)(sa.dram_capacity + sb.dram_capacity));
                ck_assert_double_eq(jnum_of(t, "dram_used"), (double)(sa.dram_used + sb.dram_used));
                ck_assert_double_eq(jnum_of(t, "ssd_capacity"),
                                    (double)(sa.ssd_capacity + sb.ssd_capacity));
                ck_assert_double_eq(jnum_of(t, "ssd_used"), (double)(sa.ssd_used + sb.ssd_used));
                ck_assert_double_eq(jnum_of(t, "dram_blocks"),
                                    (double)(sa.dram_blocks + sb.dram_blocks));
                ck_assert_double_eq(jnum_of(t, "keys"), (double)(sa.keys + sb.keys));
            }
        }
        jfree(v);
        out_free(&r);
    }
    ck_assert_msg(ok, "kvctl members never showed the nodes' figures (a: dram %llu/%llu ssd "
                  "%llu/%llu blocks %llu/%llu keys %llu; b: dram %llu/%llu ssd %llu/%llu "
                  "blocks %llu/%llu keys %llu); last answer:\n%s",
                  (unsigned long long)sa.dram_used, (unsigned long long)sa.dram_capacity,
                  (unsigned long long)sa.ssd_used, (unsigned long long)sa.ssd_capacity,
                  (unsigned long long)sa.dram_blocks, (unsigned long long)sa.ssd_blocks,
                  (unsigned long long)sa.keys, (unsigned long long)sb.dram_used,
                  (unsigned long long)sb.dram_capacity, (unsigned long long)sb.ssd_used,
                  (unsigned long long)sb.ssd_capacity, (unsigned long long)sb.dram_blocks,
                  (unsigned long long)sb.ssd_blocks, (unsigned long long)sb.keys, last);
    free(last);
    /* new figures come with the next heartbeats, and are no new view (no
     * member reinstalls its placement for them) */
    ck_assert_int_eq(kv_put(b, "figures2", 8, "value", 5), KV_OK);
    ck_assert_int_eq(kv_put(b, "figures3", 8, "value", 5), KV_OK);
    ck_assert_int_eq(kv_stats_get(a, &sa), KV_OK);
    ck_assert_int_eq(kv_stats_get(b, &sb), KV_OK);
    ok = false;
    for (int tries = 0; tries < 200 && !ok; tries++) {
        usleep(50000);
        struct out r = run_argv(dir, 10, args);
        CK_STATUS(r, 0);
        struct jv *v = jparse(r.out);
        ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
        const struct jv *t = jget(v, "totals", J_OBJ);
        ok = jnum_of(t, "keys") == (double)(sa.keys + sb.keys);
        /* etcd's version read without joining is the revision of the read */
        if (ok && kvmaster)
            ck_assert_msg(jnum_of(v, "version") == view, "figures changed the view:\n%s", r.out);
        jfree(v);
        out_free(&r);
    }
    ck_assert_msg(ok, "the new keys never showed in kvctl members");
    ck_assert_uint_eq(view_version(a), va);
    ck_assert_uint_eq(view_version(b), vb);
    /* the table: both rows and the totals */
    args[na - 1] = NULL;
    struct out r = run_argv(dir, 10, args);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "2 members (2 owners, 0 clients)");
    CK_HAS(r.out, "48 MiB");
    CK_HAS(r.out, "24 MiB");
    CK_HAS(r.out, "\ntotal ");
    CK_HAS(r.out, "72 MiB");
    CK_HAS(r.out, kv_version());
    out_free(&r);
    kv_close(b);
    kv_close(a);
}

START_TEST(members_figures_kvmaster)
{
    char *dir = tu_mkdtemp();
    unsigned mport = tu_free_port(), mmetrics = tu_free_port();
    char bin[512], s_master[96], s_mm[96], mlog[512];
    snprintf(s_master, sizeof s_master, "cluster.master=127.0.0.1:%u", mport);
    snprintf(s_mm, sizeof s_mm, "metrics.listen=127.0.0.1:%u", mmetrics);
    snprintf(mlog, sizeof mlog, "%s/kvmaster.log", dir);
    snprintf(bin, sizeof bin, "%s/kvmaster", tu_build_dir());
    char *margv[] = { bin, "--set", s_master, "--set", s_mm, "--set", "cluster.token=t0k",
                      "--set", "cluster.node_ttl_ms=2000", NULL };
    spawn_daemon(margv, mlog);
    wait_health(mmetrics, "kvmaster", mlog);
    const char *store[] = { s_master, NULL };
    members_show_figures(dir, store, true);
    stop_all();
    tu_rmdir(dir);
}
END_TEST

START_TEST(members_figures_etcd)
{
    if (!tu_etcd_available()) {
        fprintf(stderr, "tools: no etcd (%s); members' figures over etcd not checked\n",
                tu_etcd_bin());
        return;
    }
    char *dir = tu_mkdtemp();
    struct tu_etcd etcd;
    tu_etcd_start(&etcd, dir, 1);
    char s_ep[256];
    snprintf(s_ep, sizeof s_ep, "cluster.etcd_endpoints=%s", etcd.endpoints);
    const char *store[] = { "cluster.metadata=etcd", s_ep, NULL };
    members_show_figures(dir, store, false);
    tu_etcd_stop(&etcd);
    tu_rmdir(dir);
}
END_TEST

START_TEST(bench_plot_draws_a_png)
{
    if (access("/usr/bin/gnuplot", X_OK) != 0) {
        fprintf(stderr, "tools: gnuplot not installed (scripts/deps.sh installs gnuplot-nox); "
                        "bench --plot not checked\n");
        return;
    }
    char *dir = tu_mkdtemp();
    char *png = NULL;
    ck_assert(asprintf(&png, "%s/bench.png", dir) > 0);
    struct out r = run_kvctl(dir, 60, "bench", "--scenario", "read_perf", "--nr-objects", "16",
                             "--value-size", "64KiB", "--compare", "posix", "--plot", png, NULL);
    CK_STATUS(r, 0);
    FILE *f = fopen(png, "rb");
    ck_assert_ptr_nonnull(f);
    unsigned char magic[8] = { 0 };
    ck_assert_uint_eq(fread(magic, 1, 8, f), 8);
    fseek(f, 0, SEEK_END);
    ck_assert_int_gt(ftell(f), 10000);
    fclose(f);
    ck_assert_int_eq(memcmp(magic, "\x89PNG\r\n\x1a\n", 8), 0);
    out_free(&r);
    free(png);
    tu_rmdir(dir);
}
END_TEST

/* ---- the network peers (redis, memcached), the TCP baseline, --salt ----- */

/* The absolute path of a program on $PATH, or NULL. */
static char *find_exe(const char *name)
{
    const char *path = getenv("PATH");
    char *copy = strdup(path ? path : "/usr/bin:/bin"), *save = NULL, *found = NULL;
    for (char *d = strtok_r(copy, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char *cand = NULL;
        ck_assert(asprintf(&cand, "%s/%s", d, name) > 0);
        if (access(cand, X_OK) == 0)
            found = cand;
        else
            free(cand);
    }
    free(copy);
    return found;
}

/* Waits (3 s at most) for a listener on 127.0.0.1:port. */
static void wait_listening(unsigned port, const char *what, const char *log)
{
    uint64_t t0 = tu_now_ms();
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        ck_assert_int_ge(fd, 0);
        int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
        close(fd);
        if (rc == 0)
            return;
        ck_assert_msg(tu_now_ms() - t0 < 3000, "%s never listened on %u; its log:\n%s", what,
                      port, slurp(log));
        usleep(20000);
    }
}

/* The comparison run of backend `name` in the summary, checked: the
 * read_perf phases, every byte verified, a ratio to the TCP baseline. */
static void check_peer_run(const struct jv *v, const char *name, double objects)
{
    const struct jv *cmp = jget(v, "comparisons", J_ARR);
    for (size_t i = 0; i < cmp->n; i++) {
        if (strcmp(jget(cmp->items[i], "backend", J_STR)->str, name) != 0)
            continue;
        static const char *const names[] = { "write", "lookup", "read" };
        check_phases(jget(cmp->items[i], "phases", J_ARR), names, 3, objects);
        ck_assert(jget(cmp->items[i], "ok", J_BOOL)->num == 1);
        ck_assert(jget(jget(cmp->items[i], "tcp_ratio", J_OBJ), "read", J_NUM)->num > 0);
        CK_HAS(jget(cmp->items[i], "addr", J_STR)->str, "127.0.0.1:");
        return;
    }
    ck_abort_msg("no %s run in the summary", name);
}

START_TEST(compare_redis_and_memcached)
{
    char *redis = find_exe("redis-server"), *mc = find_exe("memcached");
    if (!redis && !mc) {
        fprintf(stderr, "tools: neither redis-server nor memcached installed; "
                        "bench --compare redis/memcached not checked\n");
        return;
    }
    char *dir = tu_mkdtemp();
    char rlog[512], mlog[512], rport[16], mport[16], rcmp[64], mcmp[64], json[512];
    unsigned rp = tu_free_port(), mp = tu_free_port();
    snprintf(rlog, sizeof rlog, "%s/redis.log", dir);
    snprintf(mlog, sizeof mlog, "%s/memcached.log", dir);
    snprintf(rport, sizeof rport, "%u", rp);
    snprintf(mport, sizeof mport, "%u", mp);
    snprintf(rcmp, sizeof rcmp, "redis=127.0.0.1:%u", rp);
    snprintf(mcmp, sizeof mcmp, "memcached=127.0.0.1:%u", mp);
    snprintf(json, sizeof json, "%s/summary.json", dir);
    if (redis) {
        char *argv[] = { redis, "--port", rport, "--bind", "127.0.0.1", "--save", "",
                         "--appendonly", "no", "--daemonize", "no", NULL };
        spawn_daemon(argv, rlog);
        wait_listening(rp, "redis-server", rlog);
    } else {
        fprintf(stderr, "tools: redis-server not installed; bench --compare redis not checked\n");
    }
    if (mc) {
        /* -u: memcached will not run as root without it. */
        char *argv[] = { mc, "-t", "2", "-m", "256", "-I", "8m", "-p", mport, "-l",
                         "127.0.0.1", getuid() == 0 ? "-u" : NULL, "nobody", NULL };
        spawn_daemon(argv, mlog);
        wait_listening(mp, "memcached", mlog);
    } else {
        fprintf(stderr, "tools: memcached not installed; bench --compare memcached not checked\n");
    }
    /* 1 MiB + 64 B values: bigger than one read buffer, odd-sized iovecs. */
    struct out r = run_kvctl(dir, 60, "bench", "--scenario", "read_perf", "--nr-objects", "12",
                             "--numjobs", "3", "--batch-size", "3", "--value-size", "1048640",
                             "--verify", "--compare", redis ? rcmp : mcmp, "--compare",
                             mc ? mcmp : rcmp, "--summary-json", json, NULL);
    if (!redis || !mc) {
        /* the same backend twice is a usage error: run the one there is */
        CK_STATUS(r, 2);
        out_free(&r);
        r = run_kvctl(dir, 60, "bench", "--scenario", "read_perf", "--nr-objects", "12",
                      "--numjobs", "3", "--batch-size", "3", "--value-size", "1048640",
                      "--verify", "--compare", redis ? rcmp : mcmp, "--summary-json", json,
                      NULL);
    }
    CK_STATUS(r, 0);
    if (redis)
        CK_HAS(r.out, "kvengine / redis");
    if (mc)
        CK_HAS(r.out, "kvengine / memcached");
    CK_HAS(r.out, "loopback TCP");
    char *text = slurp(json);
    struct jv *v = jparse(text);
    ck_assert_msg(v != NULL, "summary is not JSON:\n%s", text);
    ck_assert(jget(v, "tcp_mib_s", J_NUM)->num > 0);
    if (redis)
        check_peer_run(v, "redis", 12);
    if (mc)
        check_peer_run(v, "memcached", 12);
    jfree(v);
    free(text);
    out_free(&r);
    stop_all();
    free(redis);
    free(mc);
    tu_rmdir(dir);
}
END_TEST

START_TEST(compare_bad_address)
{
    char *dir = tu_mkdtemp();
    char arg[64];
    /* nothing listens there: exit 1 at once, saying where and why, before
     * kvengine is measured */
    snprintf(arg, sizeof arg, "redis=127.0.0.1:%u", tu_free_port());
    struct out r = run_kvctl(dir, 20, "bench", "--nr-objects", "4", "--compare", arg, NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.err, "cannot connect to 127.0.0.1:");
    CK_HAS(r.err, "refused");
    ck_assert_msg(strstr(r.out, "[kvengine]") == NULL, "measured before failing:\n%s", r.out);
    out_free(&r);
    snprintf(arg, sizeof arg, "memcached=127.0.0.1:%u", tu_free_port());
    r = run_kvctl(dir, 20, "bench", "--nr-objects", "4", "--compare", arg, NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.err, "memcached");
    CK_HAS(r.err, "cannot connect");
    out_free(&r);
    /* not HOST:PORT, no address, an unknown backend, one backend twice: usage */
    static const char *const bad[][2] = {
        { "redis=localhost", NULL }, { "redis", NULL }, { "memcached=:11211", NULL },
        { "redis=127.0.0.1:99999", NULL }, { "posix=/tmp", NULL }, { "posix", "posix" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = run_kvctl(dir, 10, "bench", "--compare", bad[i][0], bad[i][1] ? "--compare" : NULL,
                      bad[i][1], NULL);
        ck_assert_msg(r.status == 2, "--compare %s: exit %d\n%s", bad[i][0], r.status, r.err);
        CK_HAS(r.err, "--compare");
        out_free(&r);
    }
    tu_rmdir(dir);
}
END_TEST

/* kvengine_blocks{tier="dram"} of the node whose metrics listen on port. */
static long node_blocks(const char *dir, unsigned port)
{
    char node[64];
    snprintf(node, sizeof node, "127.0.0.1:%u", port);
    struct out r = run_kvctl(dir, 10, "stats", "--node", node, NULL);
    CK_STATUS(r, 0);
    const char *m = strstr(r.out, "kvengine_blocks{tier=\"dram\"} ");
    ck_assert_msg(m != NULL, "no dram blocks in:\n%.2000s", r.out);
    long n = strtol(m + strlen("kvengine_blocks{tier=\"dram\"} "), NULL, 10);
    out_free(&r);
    return n;
}

/* One bench run as a pure client of the cluster; its summary, parsed. */
static struct jv *cluster_bench(const char *dir, const char *s_master, const char *salt)
{
    char json[512];
    snprintf(json, sizeof json, "%s/summary.json", dir);
    struct out r = run_kvctl(dir, 30, "--set", s_master, "--set", "cluster.enabled=true",
                             "--set", "dram.capacity=0", "--set", "cluster.protocol=tcp", "bench",
                             "--scenario", "write_perf", "--nr-objects", "8", "--value-size",
                             "64KiB", "--numjobs", "2", "--summary-json", json,
                             salt ? "--salt" : NULL, salt, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "loopback TCP");
    CK_HAS(r.out, ", salt ");
    out_free(&r);
    char *text = slurp(json);
    struct jv *v = jparse(text);
    ck_assert_msg(v != NULL, "summary is not JSON:\n%s", text);
    free(text);
    return v;
}

START_TEST(cluster_salt_and_tcp_baseline)
{
    char *dir = tu_mkdtemp();
    unsigned mport = tu_free_port(), nport = tu_free_port(), nmetrics = tu_free_port();
    char mbin[512], nbin[512], s_master[96], s_listen[96], s_nm[96], mlog[512], nlog[512];
    snprintf(s_master, sizeof s_master, "cluster.master=127.0.0.1:%u", mport);
    snprintf(s_listen, sizeof s_listen, "cluster.listen=127.0.0.1:%u", nport);
    snprintf(s_nm, sizeof s_nm, "metrics.listen=127.0.0.1:%u", nmetrics);
    snprintf(mlog, sizeof mlog, "%s/kvmaster.log", dir);
    snprintf(nlog, sizeof nlog, "%s/kvnode.log", dir);
    snprintf(mbin, sizeof mbin, "%s/kvmaster", tu_build_dir());
    snprintf(nbin, sizeof nbin, "%s/kvnode", tu_build_dir());
    char *margv[] = { mbin, "--set", s_master, NULL };
    spawn_daemon(margv, mlog);
    wait_listening(mport, "kvmaster", mlog);
    char *nargv[] = { nbin, "--set", s_master, "--set", s_listen, "--set", s_nm,
                      "--set", "pipeline=dram", "--set", "dram.capacity=32MiB",
                      "--set", "cluster.protocol=tcp", NULL };
    spawn_daemon(nargv, nlog);
    wait_health(nmetrics, "kvnode", nlog);

    /* the TCP baseline is measured and every data phase has its ratio */
    struct jv *v = cluster_bench(dir, s_master, "42");
    ck_assert(jget(v, "tcp_mib_s", J_NUM)->num > 0);
    ck_assert(jget(jget(v, "tcp_ratio", J_OBJ), "write", J_NUM)->num > 0);
    ck_assert_double_eq(jget(v, "salt", J_NUM)->num, 42);
    jfree(v);
    ck_assert_int_eq(node_blocks(dir, nmetrics), 8);
    /* the same salt: the same ids, already there (nothing new stored) */
    jfree(cluster_bench(dir, s_master, "42"));
    ck_assert_int_eq(node_blocks(dir, nmetrics), 8);
    /* no --salt: a fresh one per run, so every run stores its own values */
    v = cluster_bench(dir, s_master, NULL);
    double salt1 = jget(v, "salt", J_NUM)->num;
    jfree(v);
    ck_assert_int_eq(node_blocks(dir, nmetrics), 16);
    v = cluster_bench(dir, s_master, NULL);
    ck_assert(jget(v, "salt", J_NUM)->num != salt1);
    jfree(v);
    ck_assert_int_eq(node_blocks(dir, nmetrics), 24);
    stop_all();
    tu_rmdir(dir);
}
END_TEST

Suite *tools_suite(void)
{
    Suite *s = suite_create("tools");
    TCase *tc = tcase_create("kvctl");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, help_lists_commands_and_exit_codes);
    tcase_add_test(tc, config_check_prints_effective_config);
    tcase_add_test(tc, config_check_bad_file_names_line_and_key);
    tcase_add_test(tc, bad_usage_exits_2);
    tcase_add_test(tc, tiny_verify_write_summary_json);
    tcase_add_test(tc, compare_posix_runs_both);
    tcase_add_test(tc, mixed_rw_is_time_based);
    tcase_add_test(tc, ssd_pipeline_gets_a_temporary_path);
    suite_add_tcase(s, tc);

    TCase *adm = tcase_create("admin");
    tcase_set_timeout(adm, 60);
    tcase_add_test(adm, admin_help_and_usage_errors);
    tcase_add_test(adm, admin_missing_store_and_silent_node);
    tcase_add_test(adm, admin_put_get_lookup_rm);
    tcase_add_test(adm, admin_ssd_ls_scrub_repair_compact);
    tcase_add_test(adm, bench_plot_draws_a_png);
    suite_add_tcase(s, adm);

    TCase *met = tcase_create("metrics");
    tcase_set_timeout(met, 60);
    tcase_add_test(met, metrics_of_an_engine);
    tcase_add_test(met, cluster_members_metrics_and_bench);
    tcase_add_test(met, members_figures_kvmaster);
    tcase_add_test(met, members_figures_etcd);
    suite_add_tcase(s, met);

    TCase *peers = tcase_create("peers");
    tcase_set_timeout(peers, 60);
    tcase_add_test(peers, compare_redis_and_memcached);
    tcase_add_test(peers, compare_bad_address);
    tcase_add_test(peers, cluster_salt_and_tcp_baseline);
    suite_add_tcase(s, peers);
    return s;
}
