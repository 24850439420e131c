/*
 * check_trace.c — suite "trace": `kvctl bench --scenario trace`, run as the
 * real binary, on traces written by the tests.
 *
 * Known answers come from a trace built so that every model's result can be
 * counted by hand: a chain that is reused while it is cached, pushed out by
 * a longer request, and asked for again (an infinite cache hits it, an LRU
 * of the DRAM tier's size does not, the SSD tier does). Requests are spaced
 * 50 ms apart and replayed in real time with a zero lease, so eviction
 * order is the engine's recency order alone. A second trace, far larger than
 * a small DRAM tier, is replayed by four jobs with shards per block, to check
 * that under eviction and spill no lookup promise is broken and no byte is
 * wrong. Malformed traces must fail with exit 2 and a message naming the
 * file and line, and never crash.
 *
 * The summary JSON is checked with a small strict parser kept here (the one
 * in check_tools.c is static to that suite); kvctl runs with fork/exec, its
 * output in files in a fresh directory, killed after a deadline.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "testutil_kvctl.h"

/* The summary JSON of a run; fails the test when it is not JSON. */
static struct jv *summary(const char *dir)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/summary.json", dir) > 0);
    char *text = slurp(path);
    struct jv *v = jparse(text);
    ck_assert_msg(v != NULL, "summary is not JSON:\n%.2000s", text);
    free(text);
    free(path);
    return v;
}

/* The comparison of backend name in the summary. */
static const struct jv *comparison(const struct jv *v, const char *name)
{
    const struct jv *c = jget(v, "comparisons", J_ARR);
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(jget(c->items[i], "backend", J_STR)->str, name) == 0)
            return c->items[i];
    ck_abort_msg("no comparison '%s'", name);
    return NULL;
}

/* The JSON writes ratios with six significant digits. */
#define CK_RATIO(obj, key, want)                                              \
    do {                                                                      \
        double got_ = jnum_of((obj), (key));                                  \
        ck_assert_msg(fabs(got_ - (want)) < 1e-5, "%s = %.6f, want %.6f", (key), got_, \
                      (double)(want));                                        \
    } while (0)

/* ---- traces -------------------------------------------------------------- */

/* Appends one request line: ids [lo, hi), a prompt of whole blocks. */
static void req_line(FILE *f, unsigned ts, unsigned lo, unsigned hi)
{
    fprintf(f, "{\"timestamp\": %u, \"input_length\": %u, \"output_length\": 7, \"hash_ids\": [",
            ts, (hi - lo) * 512);
    for (unsigned i = lo; i < hi; i++)
        fprintf(f, "%s%u", i > lo ? ", " : "", i);
    fprintf(f, "]}\n");
}

/*
 * The known-answer trace, 47 block references:
 *   r0 [0,10)       nothing cached: 0 hits
 *   r1 [0,12)       the chain again: 10 hits from DRAM; 10, 11 dumped
 *   r2 [100,110)    10 new blocks, then
 *   r3 [200,210)    10 more: with room for 14, the chain, least recently
 *                   used, is evicted (to SSD in dram|ssd)
 *   r4 [0,5)        infinite cache: 5 hits; LRU and pipeline dram: 0;
 *                   dram|ssd: 5 from SSD
 * So ideal = 15/47, LRU = 10/47, dram|ssd = 15/47 (10 dram, 5 ssd).
 * 4 MiB of DRAM at a 0.9 watermark over 256 KiB blocks holds 14.
 */
static char *known_trace(const char *dir)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/known.jsonl", dir) > 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    req_line(f, 0, 0, 10);
    req_line(f, 50, 0, 12);
    req_line(f, 100, 100, 110);
    req_line(f, 150, 200, 210);
    req_line(f, 200, 0, 5);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

/* Checks a run's "trace" object and phases against block counts out of the
 * 47 references (lru < 0: no LRU model applies, null). */
static void check_trace_fields(const struct jv *run, int hits, int dram, int ssd, int ideal,
                               int lru)
{
    const double R = 47;
    const struct jv *t = jget(run, "trace", J_OBJ);
    ck_assert_double_eq(jnum_of(t, "requests"), 5);
    ck_assert_double_eq(jnum_of(t, "block_refs"), 47);
    ck_assert_double_eq(jnum_of(t, "hits"), hits);
    CK_RATIO(t, "prefix_hit_ratio", hits / R);
    CK_RATIO(t, "hit_ratio_dram", dram / R);
    CK_RATIO(t, "hit_ratio_ssd", ssd / R);
    CK_RATIO(t, "ideal_hit_ratio", ideal / R);
    if (lru < 0) {
        jget(t, "lru_hit_ratio", J_NULL);
        jget(t, "lru_blocks", J_NULL);
    } else {
        CK_RATIO(t, "lru_hit_ratio", lru / R);
    }
    ck_assert_double_eq(jnum_of(t, "broken_promises"), 0);
    ck_assert_double_eq(jnum_of(t, "verify_failures"), 0);
    ck_assert(jnum_of(t, "load_mib_s") > 0);
    ck_assert(jnum_of(t, "dump_mib_s") > 0);
    /* Replayed in real time: the last request starts 200 ms in. */
    ck_assert(jnum_of(t, "seconds") >= 0.2 && jnum_of(t, "seconds") < 20);
    const struct jv *lat = jget(t, "lookup_load_lat_us", J_OBJ);
    ck_assert(jnum_of(lat, "p50") > 0 && jnum_of(lat, "p50") <= jnum_of(lat, "p99"));
    ck_assert_double_eq(jnum_of(t, "prompt_tokens"), 47 * 512);
    ck_assert_double_eq(jnum_of(t, "tokens_skipped"), hits * 512);
    CK_RATIO(t, "tokens_skipped_ratio", hits / R);
    /* DESIGN's phases, lookup, load and dump, with what each moved. */
    const struct jv *ph = jget(run, "phases", J_ARR);
    ck_assert_uint_eq(ph->n, 3);
    ck_assert_str_eq(jget(ph->items[0], "name", J_STR)->str, "lookup");
    ck_assert_str_eq(jget(ph->items[1], "name", J_STR)->str, "load");
    ck_assert_str_eq(jget(ph->items[2], "name", J_STR)->str, "dump");
    ck_assert_double_eq(jnum_of(ph->items[0], "ops"), 47);
    ck_assert_double_eq(jnum_of(ph->items[0], "misses"), 47 - hits);
    ck_assert_double_eq(jnum_of(ph->items[1], "bytes"), (double)hits * (256 << 10));
    /* Every block not loaded is dumped; a dump the tier refused for lack
     * of room (dram|ssd, see the README) moved no bytes. */
    double refused = jnum_of(t, "dumps_refused");
    ck_assert_double_eq(jnum_of(ph->items[2], "ops"), 47 - hits);
    ck_assert_double_eq(jnum_of(ph->items[2], "bytes"), (47 - hits - refused) * (256 << 10));
    for (size_t i = 0; i < 3; i++) {
        ck_assert_double_eq(jnum_of(ph->items[i], "errors"), 0);
        ck_assert_double_eq(jnum_of(ph->items[i], "verify_failures"), 0);
        jget(jget(ph->items[i], "lat_us", J_OBJ), "p99", J_NUM);
    }
    ck_assert(jget(run, "ok", J_BOOL)->num == 1);
}

START_TEST(known_answers_dram_ssd_dram_posix)
{
    char *dir = tu_mkdtemp();
    char *trace = known_trace(dir);
    struct out r = run_kvctl(dir, 60, "--set", "pipeline=dram|ssd", "--set",
                             "dram.capacity=4MiB", "--set", "eviction.lease_ttl_ms=0", "bench",
                             "--scenario", "trace", "--trace", trace, "--value-size", "256KiB",
                             "--trace-speed", "1", "--compare", "dram", "--compare", "posix",
                             "--summary-json", "summary.json", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "scenario trace, pipeline dram|ssd");
    CK_HAS(r.out, "5 requests, 47 block refs");
    CK_HAS(r.out, "broken promises 0, verify failures 0");
    out_free(&r);
    struct jv *v = summary(dir);
    ck_assert_str_eq(jget(v, "scenario", J_STR)->str, "trace");
    jget(v, "memcpy_mib_s", J_NUM);
    ck_assert_double_eq(jnum_of(v, "lease_ttl_ms"), 0);
    ck_assert_double_eq(jnum_of(v, "distinct_blocks"), 32);
    /* dram|ssd: everything an infinite cache serves, the chain's return
     * from SSD; the LRU model of its 14-block DRAM tier misses it. */
    check_trace_fields(v, 15, 10, 5, 15, 10);
    ck_assert_double_eq(jnum_of(jget(v, "trace", J_OBJ), "lru_blocks"), 14);
    /* pipeline dram: exactly the LRU's answer. */
    const struct jv *d = comparison(v, "dram");
    ck_assert_str_eq(jget(d, "pipeline", J_STR)->str, "dram");
    check_trace_fields(d, 10, 10, 0, 15, 10);
    ck_assert_double_eq(jnum_of(jget(d, "trace", J_OBJ), "dumps_refused"), 0);
    /* posix keeps every file: the infinite cache; no DRAM tier, no LRU. */
    const struct jv *p = comparison(v, "posix");
    check_trace_fields(p, 15, 0, 15, 15, -1);
    ck_assert_double_eq(jnum_of(jget(p, "trace", J_OBJ), "dumps_refused"), 0);
    jget(jget(p, "ratios", J_OBJ), "replay", J_OBJ);
    jfree(v);
    free(trace);
    tu_rmdir(dir);
}
END_TEST

/* A trace of `docs` shared documents of 20 blocks: each request reads a
 * prefix of one (5..20 blocks) and adds 1..3 blocks of its own. */
static char *shared_prefix_trace(const char *dir, unsigned nreq, unsigned docs)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/shared.jsonl", dir) > 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    uint64_t x = 88172645463325252ull;
    unsigned own = 1000000;
    for (unsigned i = 0; i < nreq; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned doc = (unsigned)(x % docs), len = 5 + (unsigned)((x >> 20) % 16),
                 extra = 1 + (unsigned)((x >> 40) % 3);
        fprintf(f, "{\"timestamp\":%u,\"input_length\":%u,\"hash_ids\":[", i, (len + extra) * 512);
        for (unsigned k = 0; k < len; k++)
            fprintf(f, "%s%u", k ? "," : "", doc * 100 + k);
        for (unsigned k = 0; k < extra; k++)
            fprintf(f, ",%u", own++);
        fprintf(f, "]}\n");
    }
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

START_TEST(eviction_and_spill_keep_promises)
{
    char *dir = tu_mkdtemp();
    /* ~1,500 distinct blocks of 16 KiB (24 MiB) against 4 MiB of DRAM
     * (~230 blocks): most of the trace lives on SSD, or is dropped in
     * pipeline dram, while four jobs look up, load and dump at once. */
    char *trace = shared_prefix_trace(dir, 400, 40);
    struct out r = run_kvctl(dir, 90, "--set", "pipeline=dram|ssd", "--set",
                             "dram.capacity=4MiB", "bench", "--scenario", "trace", "--trace",
                             trace, "--value-size", "16KiB", "--numjobs", "4", "--compare",
                             "dram", "--summary-json", "summary.json", NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    struct jv *v = summary(dir);
    ck_assert_double_eq(jnum_of(v, "shards"), 1);
    ck_assert_double_eq(jnum_of(v, "numjobs"), 4);
    const struct jv *runs[2] = { v, comparison(v, "dram") };
    for (int i = 0; i < 2; i++) {
        const struct jv *t = jget(runs[i], "trace", J_OBJ);
        ck_assert_double_eq(jnum_of(t, "requests"), 400);
        ck_assert_double_eq(jnum_of(t, "broken_promises"), 0);
        ck_assert_double_eq(jnum_of(t, "verify_failures"), 0);
        double prefix = jnum_of(t, "prefix_hit_ratio"), ideal = jnum_of(t, "ideal_hit_ratio");
        ck_assert(prefix > 0 && prefix <= ideal + 1e-9);
        const struct jv *ph = jget(runs[i], "phases", J_ARR);
        for (size_t k = 0; k < ph->n; k++)
            ck_assert_double_eq(jnum_of(ph->items[k], "errors"), 0);
        ck_assert(jget(runs[i], "ok", J_BOOL)->num == 1);
    }
    const struct jv *main_t = jget(v, "trace", J_OBJ), *dram_t = jget(runs[1], "trace", J_OBJ);
    /* Evicted blocks came back from SSD in dram|ssd, and are gone in dram. */
    ck_assert(jnum_of(main_t, "hit_ratio_ssd") > 0.1);
    ck_assert(jnum_of(main_t, "prefix_hit_ratio") > jnum_of(dram_t, "prefix_hit_ratio") + 0.1);
    ck_assert(jnum_of(dram_t, "prefix_hit_ratio") < jnum_of(dram_t, "ideal_hit_ratio") - 0.1);
    CK_RATIO(dram_t, "hit_ratio_ssd", 0);
    jfree(v);

    /* Three shards per block, evicted and spilled together, one job (see
     * the README: with several jobs, a block whose shard 0 has landed is
     * found before its other shards are stored). 6 MiB hold ~115 blocks. */
    r = run_kvctl(dir, 60, "--set", "pipeline=dram|ssd", "--set", "dram.capacity=6MiB", "bench",
                  "--scenario", "trace", "--trace", trace, "--value-size", "16KiB", "--shards",
                  "3", "--summary-json", "summary.json", NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    v = summary(dir);
    const struct jv *t = jget(v, "trace", J_OBJ);
    ck_assert_double_eq(jnum_of(v, "shards"), 3);
    ck_assert_double_eq(jnum_of(t, "broken_promises"), 0);
    ck_assert_double_eq(jnum_of(t, "verify_failures"), 0);
    ck_assert(jnum_of(t, "hit_ratio_ssd") > 0.1);
    CK_RATIO(t, "prefix_hit_ratio", jnum_of(t, "ideal_hit_ratio"));
    ck_assert(jnum_of(t, "lru_blocks") > 100 && jnum_of(t, "lru_blocks") < 130);
    jfree(v);
    free(trace);
    tu_rmdir(dir);
}
END_TEST

/* A trace whose line `line` is text; the others are good requests. */
static void expect_bad_trace(const char *dir, const char *text, size_t len, unsigned line,
                             const char *why)
{
    char buf[512];
    size_t n = 0;
    for (unsigned i = 1; i < line; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n,
                              "{\"timestamp\": %u, \"input_length\": 1024, \"hash_ids\": [%u, 7]}\n",
                              i, i);
    ck_assert(n + len < sizeof buf);
    memcpy(buf + n, text, len);
    char *path = write_data(dir, "bad.jsonl", buf, n + len);
    struct out r = run_kvctl(dir, 20, "bench", "--scenario", "trace", "--trace", path, NULL);
    CK_STATUS(r, 2);
    char where[600];
    snprintf(where, sizeof where, "%s:%u:", path, line);
    CK_HAS(r.err, where);
    CK_HAS(r.err, why);
    out_free(&r);
    free(path);
}

#define BAD(text, line, why) expect_bad_trace(dir, (text), sizeof(text) - 1, (line), (why))

START_TEST(malformed_traces_name_the_line)
{
    char *dir = tu_mkdtemp();
    BAD("", 1, "empty trace: no requests");
    BAD("\n   \n", 1, "empty trace: no requests");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1, 2,]}\n", 3, "expected a number");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1, 2]\n", 2, "expected ',' or '}'");
    BAD("{\"timestamp\": 1, \"input_length\": 5}\n", 2, "missing \"hash_ids\"");
    BAD("{\"input_length\": 5, \"hash_ids\": []}\n", 1, "missing \"timestamp\"");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [99999999999999999999999]}\n", 4,
        "number out of range");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [9007199254740992]}\n", 2,
        "number out of range");
    BAD("{\"timestamp\": 1e999, \"input_length\": 5, \"hash_ids\": [1]}\n", 2, "timestamp");
    BAD("{\"timestamp\": 1, \"input_length\": -5, \"hash_ids\": [1]}\n", 2, "whole number");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1.5]}\n", 2, "whole number");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [3, 4, 3]}\n", 2, "appears twice");
    BAD("{\"timestamp\": 1, \"timestamp\": 2, \"input_length\": 5, \"hash_ids\": [1]}\n", 2,
        "given twice");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": \"1,2\"}\n", 2, "'['");
    BAD("[1, 2, 3]\n", 2, "a request is a JSON object");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1]} x\n", 2, "text after");
    BAD("{\"timestamp\": 01, \"input_length\": 5, \"hash_ids\": [1]}\n", 2, "leading zero");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1], \"s\": \"\xff\"}\n", 2,
        "not UTF-8");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1], \"s\": \"a\\q\"}\n", 2,
        "bad escape");
    BAD("{\"timestamp\": 1, \"input_length\": 5, \"hash_ids\": [1], \"s\": \"abc\n", 2,
        "unterminated string");
    BAD("{\"timestamp\": 1, \"in\0put\": 5, \"hash_ids\": [1]}\n", 2, "NUL byte");
    BAD("{\"timestamp\": tru, \"input_length\": 5, \"hash_ids\": [1]}\n", 2, "expected a number");
    /* Unknown keys are parsed (strictly) and skipped; nesting is bounded. */
    char deep[300];
    int n = snprintf(deep, sizeof deep, "{\"timestamp\": 1, \"input_length\": 5, \"x\": ");
    for (int i = 0; i < 100; i++)
        deep[n++] = '[';
    snprintf(deep + n, sizeof deep - (size_t)n, "\n");
    expect_bad_trace(dir, deep, strlen(deep), 2, "nested deeper than");

    /* A good line with extra keys replays. */
    const char good[] = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1,"
                        " \"session\": {\"id\": [1, \"two\", null, true]}, \"hash_ids\": [5, 6]}\r\n"
                        "\n"
                        "{\"hash_ids\": [5, 6, 8], \"timestamp\": 2.5, \"input_length\": 1500}";
    char *path = write_data(dir, "good.jsonl", good, sizeof good - 1);
    struct out r = run_kvctl(dir, 30, "bench", "--scenario", "trace", "--trace", path,
                             "--value-size", "4KiB", "--summary-json", "summary.json", NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    struct jv *v = summary(dir);
    const struct jv *t = jget(v, "trace", J_OBJ);
    ck_assert_double_eq(jnum_of(t, "requests"), 2);
    ck_assert_double_eq(jnum_of(t, "block_refs"), 5);
    CK_RATIO(t, "prefix_hit_ratio", 2.0 / 5);
    CK_RATIO(t, "ideal_hit_ratio", 2.0 / 5);
    ck_assert_double_eq(jnum_of(t, "prompt_tokens"), 2100);
    ck_assert_double_eq(jnum_of(t, "tokens_skipped"), 1024);
    jfree(v);
    free(path);
    tu_rmdir(dir);
}
END_TEST

START_TEST(trace_usage_errors)
{
    char *dir = tu_mkdtemp();
    char *trace = known_trace(dir);
    struct {
        const char *a[8];
        const char *why;
    } cases[] = {
        { { "bench", "--scenario", "trace", NULL }, "needs --trace" },
        { { "bench", "--scenario", "fill", "--trace", "x.jsonl", NULL }, "only with --scenario trace" },
        { { "bench", "--scenario", "read_perf", "--shards", "2", NULL }, "only with --scenario trace" },
        { { "bench", "--scenario", "trace", "--trace", trace, "--trace-speed", "-1", NULL },
          "--trace-speed" },
        { { "bench", "--scenario", "trace", "--trace", trace, "--shards", "0", NULL }, "--shards" },
        { { "bench", "--scenario", "trace", "--trace", trace, "--trace-limit", "0", NULL },
          "--trace-limit" },
        { { "bench", "--scenario", "trace", "--trace", "/nonexistent/t.jsonl", NULL },
          "/nonexistent/t.jsonl: No such file" },
        { { "bench", "--compare", "dram=1.2.3.4:5", NULL }, "take no address" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct out r = run_argv(dir, 10, (char **)cases[i].a);
        CK_STATUS(r, 2);
        CK_HAS(r.err, cases[i].why);
        out_free(&r);
    }
    struct out r = run_kvctl(dir, 10, "bench", "--help", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "--trace FILE.jsonl");
    CK_HAS(r.out, "--trace-speed X");
    CK_HAS(r.out, "--shards K");
    CK_HAS(r.out, "--trace-limit N");
    out_free(&r);
    /* --trace-limit keeps the first requests only: a bad line after them is
     * never read. */
    FILE *f = fopen(trace, "a");
    ck_assert_ptr_nonnull(f);
    fputs("not json\n", f);
    ck_assert_int_eq(fclose(f), 0);
    r = run_kvctl(dir, 30, "bench", "--scenario", "trace", "--trace", trace, "--trace-limit", "2",
                  "--value-size", "4KiB", "--summary-json", "summary.json", NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    struct jv *v = summary(dir);
    ck_assert_double_eq(jnum_of(jget(v, "trace", J_OBJ), "requests"), 2);
    ck_assert_double_eq(jnum_of(jget(v, "trace", J_OBJ), "block_refs"), 22);
    CK_RATIO(jget(v, "trace", J_OBJ), "prefix_hit_ratio", 10.0 / 22);
    jfree(v);
    free(trace);
    tu_rmdir(dir);
}
END_TEST

/* SIGTERM, then SIGKILL after 3 s; reaped either way. */
static void stop(pid_t pid)
{
    kill(pid, SIGTERM);
    uint64_t t0 = tu_now_ms();
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (tu_now_ms() - t0 > 3000) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return;
        }
        usleep(10000);
    }
}

/* The replay as a pure client of a one-node cluster (kvmaster and kvnode
 * on loopback, started here): the node's DRAM holds the whole trace, so
 * the client sees the infinite cache's hits; it cannot say which tier of
 * the node served them, and has no DRAM tier of its own to model. One job:
 * with two, a request could look up before the dump of the one 50 ms ahead
 * of it had finished over loopback tcp on a loaded machine, and miss what
 * the model counts as a hit (seen once: 11 hits of 15). */
START_TEST(pure_cluster_client)
{
    char *dir = tu_mkdtemp();
    char *trace = known_trace(dir);
    unsigned mport = tu_free_port(), nport = tu_free_port();
    char bin[512], nbin[512], s_master[96], s_listen[96], mlog[512], nlog[512];
    snprintf(s_master, sizeof s_master, "cluster.master=127.0.0.1:%u", mport);
    snprintf(s_listen, sizeof s_listen, "cluster.listen=127.0.0.1:%u", nport);
    snprintf(mlog, sizeof mlog, "%s/kvmaster.log", dir);
    snprintf(nlog, sizeof nlog, "%s/kvnode.log", dir);
    snprintf(bin, sizeof bin, "%s/kvmaster", tu_build_dir());
    snprintf(nbin, sizeof nbin, "%s/kvnode", tu_build_dir());
    char *margv[] = { bin, "--set", s_master, "--set", "cluster.token=tr4ce", NULL };
    pid_t master = tu_spawn(margv, mlog);
    char *nargv[] = { nbin, "--set", s_master, "--set", s_listen, "--set", "cluster.token=tr4ce",
                      "--set", "pipeline=dram", "--set", "dram.capacity=64MiB", "--set",
                      "cluster.protocol=tcp", NULL };
    usleep(200000);
    pid_t node = tu_spawn(nargv, nlog);
    /* The node is in the view once members lists an owner (5 s at most). */
    bool up = false;
    for (uint64_t t0 = tu_now_ms(); !up && tu_now_ms() - t0 < 5000; usleep(100000)) {
        struct out m = run_kvctl(dir, 5, "--set", s_master, "--set", "cluster.token=tr4ce",
                                 "members", NULL);
        up = m.status == 0 && strstr(m.out, "owner") != NULL;
        out_free(&m);
    }
    ck_assert_msg(up, "the node never joined; its log:\n%s", slurp(nlog));
    struct out r = run_kvctl(dir, 60, "--set", s_master, "--set", "cluster.token=tr4ce", "--set",
                             "cluster.enabled=true", "--set", "dram.capacity=0", "--set",
                             "cluster.protocol=tcp", "bench", "--scenario", "trace", "--trace",
                             trace, "--value-size", "256KiB", "--numjobs", "1", "--trace-speed",
                             "1", "--summary-json", "summary.json", NULL);
    stop(node);
    stop(master);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "dram.capacity 0");
    out_free(&r);
    struct jv *v = summary(dir);
    const struct jv *t = jget(v, "trace", J_OBJ);
    ck_assert_double_eq(jnum_of(t, "block_refs"), 47);
    CK_RATIO(t, "ideal_hit_ratio", 15.0 / 47);
    CK_RATIO(t, "prefix_hit_ratio", 15.0 / 47);
    jget(t, "hit_ratio_dram", J_NULL);
    jget(t, "hit_ratio_ssd", J_NULL);
    jget(t, "lru_hit_ratio", J_NULL);
    ck_assert_double_eq(jnum_of(t, "broken_promises"), 0);
    ck_assert_double_eq(jnum_of(t, "verify_failures"), 0);
    jget(v, "tcp_mib_s", J_NUM);
    jfree(v);
    free(trace);
    tu_rmdir(dir);
}
END_TEST

/* The published trace, when the tree sits beside ../shared: its README says
 * an infinite cache serves 64.0% of its block references. */
START_TEST(real_trace_ideal_ratio)
{
    char *real = realpath("../shared/traces/synthetic_trace.jsonl", NULL);
    if (!real)
        return;                             /* not beside this checkout */
    char *dir = tu_mkdtemp();
    struct out r = run_kvctl(dir, 60, "--set", "dram.capacity=32MiB", "bench", "--scenario",
                             "trace", "--trace", real, "--value-size", "64", "--summary-json",
                             "summary.json", NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    struct jv *v = summary(dir);
    const struct jv *t = jget(v, "trace", J_OBJ);
    ck_assert_double_eq(jnum_of(t, "requests"), 3993);
    ck_assert_double_eq(jnum_of(t, "block_refs"), 121877);
    ck_assert_double_eq(jnum_of(v, "distinct_blocks"), 43924);
    double ideal = jnum_of(t, "ideal_hit_ratio");
    ck_assert_msg(fabs(ideal - 0.640) < 0.0005, "ideal %f", ideal);
    /* DRAM sized to the trace: the engine serves what the model does. */
    CK_RATIO(t, "prefix_hit_ratio", ideal);
    jfree(v);
    free(real);
    tu_rmdir(dir);
}
END_TEST

Suite *trace_suite(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("replay");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, known_answers_dram_ssd_dram_posix);
    tcase_add_test(tc, eviction_and_spill_keep_promises);
    tcase_add_test(tc, malformed_traces_name_the_line);
    tcase_add_test(tc, trace_usage_errors);
    tcase_add_test(tc, real_trace_ideal_ratio);
    tcase_add_test(tc, pure_cluster_client);
    suite_add_tcase(s, tc);
    return s;
}
