/*
 * check_config.c — the configuration module: defaults, YAML, units, errors,
 * dotted keys, the dump round trip, validation and the example file.
 *
 * Error tests assert the whole shape of a message — "<string>:LINE: KEY:"
 * and a phrase — because the message is the interface for an operator with
 * a broken file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/config.h"
#include "testutil.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

static kv_config *fresh(void)
{
    kv_config *c = NULL;
    ck_assert_int_eq(kv_config_new(&c), KV_OK);
    ck_assert_ptr_nonnull(c);
    return c;
}

static int parse(kv_config *c, const char *yaml, char *err, size_t errlen)
{
    return kv_config_parse(c, yaml, strlen(yaml), err, errlen);
}

static void parse_ok(kv_config *c, const char *yaml)
{
    char err[512] = "";
    int rc = parse(c, yaml, err, sizeof err);
    ck_assert_msg(rc == KV_OK, "parse of [%s] failed: %s", yaml, err);
}

/*
 * Parses yaml into a fresh config and asserts a KV_ECONFIG whose message
 * starts "<string>:line: " and contains key (when given) and phrase, and
 * that the config kept its defaults (a failed parse applies nothing).
 */
static void expect_error(const char *yaml, int line, const char *key, const char *phrase)
{
    kv_config *c = fresh(), *d = fresh();
    char err[512] = "", want[64];
    int rc = parse(c, yaml, err, sizeof err);
    ck_assert_msg(rc == KV_ECONFIG, "[%s] gave %d (%s), want KV_ECONFIG", yaml, rc, err);
    snprintf(want, sizeof want, "<string>:%d: ", line);
    ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "[%s]: message \"%s\" does not start \"%s\"",
                  yaml, err, want);
    if (key) {
        char k[128];
        snprintf(k, sizeof k, "%s%s: ", want, key);
        ck_assert_msg(strncmp(err, k, strlen(k)) == 0, "[%s]: message \"%s\" does not name key %s",
                      yaml, err, key);
    }
    ck_assert_msg(strstr(err, phrase), "[%s]: message \"%s\" lacks \"%s\"", yaml, err, phrase);
    ck_assert_msg(kv__config_equal(c, d), "[%s]: a failed parse changed the config", yaml);
    kv_config_free(c);
    kv_config_free(d);
}

static void get_eq(const kv_config *c, const char *key, const char *want)
{
    char buf[512];
    ck_assert_int_eq(kv_config_get(c, key, buf, sizeof buf), KV_OK);
    ck_assert_msg(strcmp(buf, want) == 0, "%s is \"%s\", want \"%s\"", key, buf, want);
}

/* ---- defaults ------------------------------------------------------------ */

START_TEST(defaults_match_design)
{
    kv_config *c = fresh();
    ck_assert_int_eq(c->pipeline, KV_PIPE_DRAM_SSD);
    ck_assert_uint_eq(c->dram.capacity, 4 * GiB);
    ck_assert_uint_eq(c->dram.shards, 64);
    ck_assert_int_eq(c->dram.hugepages, KV_HUGE_AUTO);
    ck_assert_double_eq(c->eviction.high_watermark_ratio, 0.9);
    ck_assert_double_eq(c->eviction.ratio, 0.1);
    ck_assert_uint_eq(c->eviction.lease_ttl_ms, 60000);
    ck_assert_str_eq(c->ssd.path, "./kvdata");
    ck_assert_uint_eq(c->ssd.capacity, 64 * GiB);
    ck_assert_int_eq(c->ssd.compression, KV_COMP_LZ4);
    ck_assert(!c->ssd.write_through);
    ck_assert_double_eq(c->ssd.gc_trigger_ratio, 0.9);
    ck_assert_double_eq(c->ssd.gc_ratio, 0.1);
    ck_assert_int_eq(c->ssd.sync, KV_SYNC_NONE);
    ck_assert(c->ssd.promote);
    ck_assert_uint_eq(c->ssd.spill_queue, 256 * MiB);
    ck_assert_uint_eq(c->io.threads, 4);
    ck_assert_uint_eq(c->io.timeout_ms, 0);
    ck_assert(!c->cluster.enabled);
    ck_assert_str_eq(c->cluster.master, "127.0.0.1:50088");
    ck_assert_str_eq(c->cluster.listen, "0.0.0.0:50071");
    ck_assert_int_eq(c->cluster.protocol, KV_PROTO_AUTO);
    ck_assert_str_eq(c->cluster.device_name, "");
    ck_assert_uint_eq(c->cluster.replica_num, 1);
    ck_assert_uint_eq(c->cluster.node_ttl_ms, 10000);
    ck_assert_str_eq(c->cluster.token, "");
    ck_assert_str_eq(c->metrics.listen, "");
    ck_assert_int_eq(c->log.level, KV_LOG_INFO);

    char err[256] = "";
    ck_assert_msg(kv__config_validate(c, err, sizeof err) == KV_OK, "defaults invalid: %s", err);
    kv_config_free(c);
}
END_TEST

START_TEST(empty_documents_keep_defaults)
{
    static const char *const docs[] = { "", "\n", "# only a comment\n", "---\n", "--- ~\n",
                                        "---\n# nothing\n...\n", "{}\n", "null\n" };
    kv_config *d = fresh();
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        kv_config *c = fresh();
        parse_ok(c, docs[i]);
        ck_assert_msg(kv__config_equal(c, d), "[%s] changed the config", docs[i]);
        kv_config_free(c);
    }
    /* A section whose keys are all commented out is an empty section. */
    kv_config *c = fresh();
    parse_ok(c, "dram:\n  # capacity: 1GiB\nssd:\n");
    ck_assert(kv__config_equal(c, d));
    kv_config_free(c);
    kv_config_free(d);
}
END_TEST

START_TEST(later_values_override_and_others_stay)
{
    kv_config *c = fresh();
    parse_ok(c, "dram:\n  capacity: 1GiB\n");
    parse_ok(c, "dram:\n  shards: 8\n");
    ck_assert_uint_eq(c->dram.capacity, 1 * GiB);
    ck_assert_uint_eq(c->dram.shards, 8);
    ck_assert_int_eq(kv_config_set(c, "dram.capacity", "2GiB"), KV_OK);
    ck_assert_uint_eq(c->dram.capacity, 2 * GiB);
    ck_assert_uint_eq(c->ssd.capacity, 64 * GiB);
    kv_config_free(c);
}
END_TEST

/* ---- styles and forms ----------------------------------------------------- */

START_TEST(block_and_flow_style_agree)
{
    kv_config *a = fresh(), *b = fresh();
    parse_ok(a, "pipeline: dram\n"
                "dram:\n  capacity: 512MiB\n  shards: 16\n  hugepages: off\n"
                "eviction:\n  high_watermark_ratio: 0.8\n  ratio: 0.2\n  lease_ttl_ms: 2s\n"
                "cluster:\n  enabled: true\n  token: \"s3cret\"\n");
    parse_ok(b, "pipeline: dram\n"
                "dram:     { capacity: 512MiB, shards: 16, hugepages: off }\n"
                "eviction: { high_watermark_ratio: 0.8, ratio: 0.2,\n"
                "            lease_ttl_ms: 2000 }\n"
                "cluster:  {enabled: yes, token: 's3cret'}\n");
    ck_assert(kv__config_equal(a, b));
    ck_assert_int_eq(a->pipeline, KV_PIPE_DRAM);
    ck_assert_uint_eq(a->dram.capacity, 512 * MiB);
    ck_assert_uint_eq(a->dram.shards, 16);
    ck_assert_int_eq(a->dram.hugepages, KV_HUGE_OFF);
    ck_assert_double_eq(a->eviction.high_watermark_ratio, 0.8);
    ck_assert_uint_eq(a->eviction.lease_ttl_ms, 2000);
    ck_assert(a->cluster.enabled);
    ck_assert_str_eq(a->cluster.token, "s3cret");

    /* All flow, one line, as DESIGN.md writes it. */
    kv_config *c = fresh();
    parse_ok(c, "{ pipeline: ssd, ssd: { path: /tmp/x, capacity: 1TiB } }");
    ck_assert_int_eq(c->pipeline, KV_PIPE_SSD);
    ck_assert_str_eq(c->ssd.path, "/tmp/x");
    ck_assert_uint_eq(c->ssd.capacity, TiB);
    kv_config_free(a);
    kv_config_free(b);
    kv_config_free(c);
}
END_TEST

START_TEST(size_units)
{
    static const struct { const char *s; uint64_t v; } good[] = {
        { "0", 0 }, { "1024", 1024 }, { "1B", 1 }, { "7 b", 7 },
        { "4KiB", 4 * KiB }, { "4kib", 4 * KiB }, { "4K", 4 * KiB }, { "4KB", 4 * KiB }, { "4 kb", 4 * KiB },
        { "512MiB", 512 * MiB }, { "512M", 512 * MiB }, { "512mb", 512 * MiB },
        { "30GiB", 30 * GiB }, { "30 GB", 30 * GiB }, { "30g", 30 * GiB }, { "30Gb", 30 * GiB },
        { "2TiB", 2 * TiB }, { "2t", 2 * TiB }, { "2 TB", 2 * TiB },
        { "1.5GiB", 3 * GiB / 2 }, { "0.5KiB", 512 }, { "1.25 MB", 5 * MiB / 4 },
        { " 8MiB ", 8 * MiB }, { "18446744073709551615", UINT64_MAX }, { "16777215TiB", 16777215 * TiB },
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 12345;
        ck_assert_msg(kv__parse_size(good[i].s, &v) == KV_OK, "\"%s\" refused", good[i].s);
        ck_assert_msg(v == good[i].v, "\"%s\" = %llu, want %llu", good[i].s,
                      (unsigned long long)v, (unsigned long long)good[i].v);
    }
    static const char *const bad[] = {
        "", " ", "-1", "-1GiB", "+1", "1.5", "0.3KiB", "1.", ".5GiB", "4GiBx", "4 G B", "4 GiB junk",
        "abc", "1e9", "0x10", "18446744073709551616", "16777216TiB", "99999999999999999999GiB",
        "4PiB", "4 i", "1,5GiB", "1.0000000000000000001GiB",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 12345;
        ck_assert_msg(kv__parse_size(bad[i], &v) == KV_ECONFIG, "\"%s\" accepted", bad[i]);
        ck_assert_uint_eq(v, 12345);
    }
    ck_assert_int_eq(kv__parse_size(NULL, &(uint64_t){ 0 }), KV_EINVAL);

    /* Through YAML: the space and the decimal unit. */
    kv_config *c = fresh();
    parse_ok(c, "dram:\n  capacity: 30 GB\nssd:\n  capacity: 1.5TiB\n  spill_queue: 1000\n");
    ck_assert_uint_eq(c->dram.capacity, 30 * GiB);
    ck_assert_uint_eq(c->ssd.capacity, 3 * TiB / 2);
    ck_assert_uint_eq(c->ssd.spill_queue, 1000);
    kv_config_free(c);
}
END_TEST

START_TEST(size_formatting)
{
    static const struct { uint64_t v; const char *s; } cases[] = {
        { 0, "0" }, { 1, "1" }, { 1536, "1536" }, { KiB, "1KiB" }, { 3 * KiB, "3KiB" },
        { 4 * GiB, "4GiB" }, { 1024 * GiB, "1TiB" }, { 3 * GiB / 2, "1536MiB" },
        { UINT64_MAX, "18446744073709551615" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[32];
        int n = kv__format_size(cases[i].v, buf, sizeof buf);
        ck_assert_str_eq(buf, cases[i].s);
        ck_assert_int_eq(n, (int)strlen(cases[i].s));
        uint64_t back;
        ck_assert_int_eq(kv__parse_size(buf, &back), KV_OK);
        ck_assert_uint_eq(back, cases[i].v);
    }
}
END_TEST

START_TEST(duration_forms)
{
    static const struct { const char *s; uint64_t v; } good[] = {
        { "0", 0 }, { "250", 250 }, { "250ms", 250 }, { "250 ms", 250 }, { "250MS", 250 },
        { "2s", 2000 }, { "2 s", 2000 }, { "1.5s", 1500 }, { "0.001s", 1 }, { "60000", 60000 },
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 7;
        ck_assert_msg(kv__parse_duration_ms(good[i].s, &v) == KV_OK, "\"%s\" refused", good[i].s);
        ck_assert_msg(v == good[i].v, "\"%s\" = %llu", good[i].s, (unsigned long long)v);
    }
    static const char *const bad[] = { "", "ms", "-1", "1.5", "1.5ms", "0.0001s", "2m", "2 sec",
                                       "2h", "1s2", "s2" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 7;
        ck_assert_msg(kv__parse_duration_ms(bad[i], &v) == KV_ECONFIG, "\"%s\" accepted", bad[i]);
        ck_assert_uint_eq(v, 7);
    }

    kv_config *c = fresh();
    parse_ok(c, "eviction: { lease_ttl_ms: 1.5s }\nio: { timeout_ms: 250ms }\ncluster: { node_ttl_ms: 3s }\n");
    ck_assert_uint_eq(c->eviction.lease_ttl_ms, 1500);
    ck_assert_uint_eq(c->io.timeout_ms, 250);
    ck_assert_uint_eq(c->cluster.node_ttl_ms, 3000);
    /* Durations fit 32 bits of milliseconds. */
    ck_assert_int_eq(kv_config_set(c, "io.timeout_ms", "4294967295"), KV_OK);
    ck_assert_int_eq(kv_config_set(c, "io.timeout_ms", "4294967296"), KV_ECONFIG);
    ck_assert_uint_eq(c->io.timeout_ms, 4294967295u);
    kv_config_free(c);
}
END_TEST

START_TEST(booleans_and_enums)
{
    kv_config *c = fresh();
    static const char *const yes[] = { "true", "yes", "on", "TRUE", "Yes", "On" };
    static const char *const no[] = { "false", "no", "off", "False", "NO", "OFF" };
    for (size_t i = 0; i < 6; i++) {
        ck_assert_int_eq(kv_config_set(c, "ssd.write_through", yes[i]), KV_OK);
        ck_assert(c->ssd.write_through);
        ck_assert_int_eq(kv_config_set(c, "ssd.write_through", no[i]), KV_OK);
        ck_assert(!c->ssd.write_through);
    }
    ck_assert_int_eq(kv_config_set(c, "ssd.promote", "maybe"), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(c, "ssd.promote", "1"), KV_ECONFIG);

    static const struct { const char *key, *text; size_t off; int want; } e[] = {
#define F(f) offsetof(struct kv_config, f)
        { "pipeline", "dram", F(pipeline), KV_PIPE_DRAM },
        { "pipeline", "ssd", F(pipeline), KV_PIPE_SSD },
        { "pipeline", "dram|ssd", F(pipeline), KV_PIPE_DRAM_SSD },
        { "dram.hugepages", "on", F(dram.hugepages), KV_HUGE_ON },
        { "dram.hugepages", "off", F(dram.hugepages), KV_HUGE_OFF },
        { "dram.hugepages", "true", F(dram.hugepages), KV_HUGE_ON },
        { "dram.hugepages", "false", F(dram.hugepages), KV_HUGE_OFF },
        { "dram.hugepages", "auto", F(dram.hugepages), KV_HUGE_AUTO },
        { "ssd.compression", "none", F(ssd.compression), KV_COMP_NONE },
        { "ssd.compression", "lz4", F(ssd.compression), KV_COMP_LZ4 },
        { "ssd.sync", "wal", F(ssd.sync), KV_SYNC_WAL },
        { "ssd.sync", "fsync", F(ssd.sync), KV_SYNC_FSYNC },
        { "ssd.sync", "none", F(ssd.sync), KV_SYNC_NONE },
        { "cluster.protocol", "tcp", F(cluster.protocol), KV_PROTO_TCP },
        { "cluster.protocol", "rdma", F(cluster.protocol), KV_PROTO_RDMA },
        { "cluster.protocol", "auto", F(cluster.protocol), KV_PROTO_AUTO },
        { "log.level", "error", F(log.level), KV_LOG_ERROR },
        { "log.level", "warn", F(log.level), KV_LOG_WARN },
        { "log.level", "debug", F(log.level), KV_LOG_DEBUG },
        { "log.level", "info", F(log.level), KV_LOG_INFO },
#undef F
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        ck_assert_int_eq(kv_config_set(c, e[i].key, e[i].text), KV_OK);
        ck_assert_int_eq(*(int *)((char *)c + e[i].off), e[i].want);
    }
    ck_assert_str_eq(kv__pipeline_name(KV_PIPE_DRAM_SSD), "dram|ssd");
    ck_assert_str_eq(kv__pipeline_name(KV_PIPE_DRAM), "dram");
    ck_assert_str_eq(kv__pipeline_name(KV_PIPE_SSD), "ssd");
    ck_assert_str_eq(kv__pipeline_name(0), "invalid");

    parse_ok(c, "pipeline: dram|ssd\ndram: { hugepages: true }\n");
    ck_assert_int_eq(c->pipeline, KV_PIPE_DRAM_SSD);
    ck_assert_int_eq(c->dram.hugepages, KV_HUGE_ON);
    kv_config_free(c);
}
END_TEST

/* ---- errors ---------------------------------------------------------------- */

START_TEST(error_unknown_key_and_section)
{
    expect_error("dram:\n  capacity: 1GiB\n  capcity: 2GiB\n", 3, "dram.capcity",
                 "unknown key (did you mean dram.capacity?)");
    expect_error("# c\nssd:\n  gc_ration: 0.1\n", 3, "ssd.gc_ration", "did you mean ssd.gc_ratio?");
    expect_error("dram:\n  path: /x\n", 2, "dram.path", "unknown key (did you mean ssd.path?)");
    expect_error("dram:\n  frobnicate: 1\n", 2, "dram.frobnicate", "unknown key");
    expect_error("pipeline: dram\ndrma:\n  capacity: 1GiB\n", 2, "drma",
                 "unknown section (did you mean dram?)");
    expect_error("pipline: dram\n", 1, "pipline", "unknown key (did you mean pipeline?)");
    expect_error("storage:\n  x: 1\n", 1, "storage", "unknown section");
    expect_error("dram:\n  ssd:\n    path: x\n", 2, "dram.ssd", "unknown key");
    /* Dotted names are for --set; the file nests them. */
    expect_error("dram.capacity: 1GiB\n", 1, "dram.capacity", "nest the key");
}
END_TEST

START_TEST(error_wrong_types)
{
    expect_error("pipeline: dram\ndram: 5\n", 2, "dram", "expected a mapping, got a scalar");
    expect_error("dram:\n  - capacity\n", 2, "dram", "expected a mapping, got a sequence");
    expect_error("dram: [1, 2]\n", 1, "dram", "expected a mapping, got a sequence");
    expect_error("dram:\n  capacity:\n    value: 4GiB\n", 3, "dram.capacity",
                 "expected a scalar, got a mapping");
    expect_error("dram:\n  capacity: [4GiB]\n", 2, "dram.capacity", "expected a scalar, got a sequence");
    expect_error("pipeline:\n  - dram\n", 2, "pipeline", "expected a scalar, got a sequence");
    expect_error("dram:\n  capacity:\n", 2, "dram.capacity", "a value is missing");
    expect_error("dram:\n  ? [a, b]\n  : 1\n", 2, "dram", "keys must be names");
    expect_error("dram:\n  shards: 1.5\n", 2, "dram.shards", "must be an integer in 1..4096");
    expect_error("io:\n  threads: four\n", 2, "io.threads", "must be an integer in 1..256");
}
END_TEST

START_TEST(error_ranges)
{
    expect_error("eviction:\n  ratio: 1.5\n", 2, "eviction.ratio", "must be in (0,1), got 1.5");
    expect_error("eviction:\n  ratio: 1\n", 2, "eviction.ratio", "must be in (0,1), got 1");
    expect_error("eviction:\n  ratio: 0\n", 2, "eviction.ratio", "must be in (0,1), got 0");
    expect_error("eviction:\n  ratio: -0.1\n", 2, "eviction.ratio", "must be");
    expect_error("eviction:\n  high_watermark_ratio: 0\n", 2, "eviction.high_watermark_ratio",
                 "must be in (0,1], got 0");
    expect_error("eviction:\n  high_watermark_ratio: 1.01\n", 2, "eviction.high_watermark_ratio",
                 "must be in (0,1], got 1.01");
    expect_error("ssd:\n  gc_trigger_ratio: 2\n", 2, "ssd.gc_trigger_ratio", "must be in (0,1], got 2");
    expect_error("ssd:\n  gc_trigger_ratio: 0.0\n", 2, "ssd.gc_trigger_ratio", "must be in (0,1]");
    expect_error("ssd:\n  gc_ratio: 1.0\n", 2, "ssd.gc_ratio", "must be in (0,1), got 1.0");
    expect_error("ssd:\n  gc_ratio: 0\n", 2, "ssd.gc_ratio", "must be in (0,1)");
    expect_error("ssd:\n  gc_ratio: nan\n", 2, "ssd.gc_ratio", "must be a number");
    expect_error("ssd:\n  gc_ratio: 0x0.1p1\n", 2, "ssd.gc_ratio", "must be a number");
    expect_error("ssd:\n  gc_ratio: 0.1x\n", 2, "ssd.gc_ratio", "must be a number");
    expect_error("dram:\n  shards: 0\n", 2, "dram.shards", "must be in 1..4096, got 0");
    expect_error("dram:\n  shards: 4097\n", 2, "dram.shards", "must be in 1..4096, got 4097");
    expect_error("io:\n  threads: 0\n", 2, "io.threads", "must be in 1..256, got 0");
    expect_error("io:\n  threads: 257\n", 2, "io.threads", "must be in 1..256");
    expect_error("cluster:\n  replica_num: 0\n", 2, "cluster.replica_num", "must be in 1..16");
    expect_error("cluster:\n  replica_num: 17\n", 2, "cluster.replica_num", "must be in 1..16");
    expect_error("dram:\n  capacity: 257GiB\n", 2, "dram.capacity", "must be at most 256GiB, got 257GiB");

    /* The edges themselves are fine. */
    kv_config *c = fresh();
    parse_ok(c, "eviction: { high_watermark_ratio: 1, ratio: 0.999 }\n"
                "ssd: { gc_trigger_ratio: 1.0, gc_ratio: 1e-3 }\n"
                "dram: { shards: 4096, capacity: 256GiB }\nio: { threads: 256 }\n"
                "cluster: { replica_num: 16 }\n");
    ck_assert_double_eq(c->eviction.high_watermark_ratio, 1.0);
    ck_assert_double_eq(c->ssd.gc_ratio, 0.001);
    ck_assert_uint_eq(c->dram.capacity, 256 * GiB);
    parse_ok(c, "dram: { shards: 1 }\nio: { threads: 1 }\ncluster: { replica_num: 1 }\n");
    ck_assert_uint_eq(c->dram.shards, 1);
    kv_config_free(c);
}
END_TEST

START_TEST(error_bad_enum_size_duration)
{
    expect_error("pipeline: posix\n", 1, "pipeline", "must be one of dram|ssd, dram, ssd; got \"posix\"");
    expect_error("pipeline: dram|posix\n", 1, "pipeline", "must be one of");
    expect_error("ssd:\n  compression: zstd\n", 2, "ssd.compression", "must be one of none, lz4");
    expect_error("ssd:\n  sync: always\n", 2, "ssd.sync", "must be one of none, wal, fsync");
    expect_error("cluster:\n  protocol: udp\n", 2, "cluster.protocol", "must be one of auto, tcp, rdma");
    expect_error("log:\n  level: verbose\n", 2, "log.level", "must be one of error, warn, info, debug");
    expect_error("dram:\n  hugepages: maybe\n", 2, "dram.hugepages", "must be one of auto, on, off");
    expect_error("ssd:\n  write_through: sometimes\n", 2, "ssd.write_through", "must be true or false");

    expect_error("dram:\n  capacity: 4 gigs\n", 2, "dram.capacity", "bad size: unknown unit");
    expect_error("dram:\n  capacity: -1\n", 2, "dram.capacity", "bad size: must not be negative");
    expect_error("ssd:\n  capacity: 1.5\n", 2, "ssd.capacity", "bad size: not a whole number of bytes");
    expect_error("ssd:\n  spill_queue: 99999999999999999999\n", 2, "ssd.spill_queue", "bad size: too large");
    expect_error("ssd:\n  capacity: 4GiB extra\n", 2, "ssd.capacity", "bad size");
    expect_error("eviction:\n  lease_ttl_ms: 5 minutes\n", 2, "eviction.lease_ttl_ms",
                 "bad duration: unknown unit");
    expect_error("io:\n  timeout_ms: 1.5ms\n", 2, "io.timeout_ms", "not a whole number of milliseconds");
    expect_error("cluster:\n  node_ttl_ms: -5\n", 2, "cluster.node_ttl_ms", "must not be negative");
    expect_error("cluster:\n  node_ttl_ms: 5000000000\n", 2, "cluster.node_ttl_ms",
                 "must be at most 4294967295ms");
}
END_TEST

START_TEST(error_duplicates_aliases_documents)
{
    expect_error("dram:\n  capacity: 1GiB\n  shards: 4\n  capacity: 2GiB\n", 4, "dram.capacity",
                 "duplicate key (first given on line 2)");
    expect_error("dram: { shards: 4 }\nssd: {}\ndram: { capacity: 1GiB }\n", 3, "dram",
                 "duplicate key (first given on line 1)");
    expect_error("pipeline: dram\npipeline: ssd\n", 2, "pipeline", "duplicate key");
    expect_error("dram: &d { shards: 4 }\n", 1, "dram", "anchors and aliases are not supported");
    expect_error("dram:\n  shards: &n 4\n", 2, "dram.shards", "anchors and aliases");
    expect_error("eviction:\n  ratio: &r 0.2\n  high_watermark_ratio: *r\n", 2, "eviction.ratio",
                 "anchors and aliases");
    expect_error("dram: { shards: 4 }\nssd: *x\n", 2, "ssd", "anchors and aliases");   /* undefined */
    expect_error("&top { dram: {} }\n", 1, NULL, "anchors and aliases");
    expect_error("dram: { shards: 4 }\n---\nssd: {}\n", 2, NULL, "only one YAML document is allowed");
}
END_TEST

START_TEST(error_syntax_and_top_level)
{
    expect_error("dram:\n  capacity: 1GiB\nssd: { path: x,\n  capacity: 1GiB\n", 5, NULL, "YAML syntax error");
    expect_error("dram:\n  capacity: 1GiB\n shards: 4\n", 3, NULL, "YAML syntax error");
    expect_error("pipeline: dram\nssd:\n  path: a: b\n", 3, NULL, "YAML syntax error: mapping values");
    expect_error("dram:\n\tcapacity: 1GiB\n", 2, NULL, "YAML syntax error");
    expect_error("pipeline: \"dram\n", 2, NULL, "YAML syntax error");
    /* Broken UTF-8 is a reader error, which libyaml reports by offset. */
    expect_error("dram:\n  shards: 4\nssd:\n  path: \xff\xfe\n", 4, NULL, "YAML syntax error");

    expect_error("- dram\n- ssd\n", 1, NULL, "the top level must be a mapping, got a sequence");
    expect_error("# a comment\nhello\n", 2, NULL, "the top level must be a mapping, got a scalar");
    expect_error("\"\"\n", 1, NULL, "the top level must be a mapping, got a scalar");
}
END_TEST

START_TEST(error_strings_and_addresses)
{
    char yaml[600], s[300];
    memset(s, 'p', 255);
    s[255] = '\0';
    kv_config *c = fresh();
    snprintf(yaml, sizeof yaml, "ssd:\n  path: %s\n", s);
    parse_ok(c, yaml);
    ck_assert_uint_eq(strlen(c->ssd.path), 255);
    kv_config_free(c);
    s[255] = 'p';
    s[256] = '\0';
    snprintf(yaml, sizeof yaml, "ssd:\n  path: %s\n", s);
    expect_error(yaml, 2, "ssd.path", "longer than 255 bytes");
    snprintf(yaml, sizeof yaml, "cluster:\n  enabled: true\n  token: \"%s\"\n", s);
    expect_error(yaml, 3, "cluster.token", "longer than 255 bytes");
    expect_error("ssd:\n  path: \"a\\tb\"\n", 2, "ssd.path", "printable");
    expect_error("ssd:\n  path: \"a\\0b\"\n", 2, "ssd.path", "NUL");

    expect_error("cluster:\n  master: localhost\n", 2, "cluster.master", "expected host:port");
    expect_error("cluster:\n  master: \":50088\"\n", 2, "cluster.master", "the host is empty");
    expect_error("cluster:\n  master: host:0\n", 2, "cluster.master", "1..65535");
    expect_error("cluster:\n  listen: host:65536\n", 2, "cluster.listen", "0..65535");
    expect_error("cluster:\n  listen: host:http\n", 2, "cluster.listen", "0..65535");
    expect_error("cluster:\n  listen: \"host:\"\n", 2, "cluster.listen", "0..65535");
    expect_error("metrics:\n  listen: host:99999\n", 2, "metrics.listen", "0..65535");
    expect_error("cluster:\n  listen: \"\"\n", 2, "cluster.listen", "expected host:port");
    expect_error("cluster:\n  master: ::1:50088\n", 2, "cluster.master", "brackets");
    expect_error("cluster:\n  master: \"[::1]50088\"\n", 2, "cluster.master", "expected [host]:port");
    expect_error("cluster:\n  master: ho/st:80\n", 2, "cluster.master", "host");
    expect_error("metrics:\n  listen: 9300\n", 2, "metrics.listen", "expected host:port");

    c = fresh();
    parse_ok(c, "cluster:\n  master: \"[::1]:50088\"\n  listen: node-1.example.com:65535\n"
                "metrics:\n  listen: 127.0.0.1:9300\n");
    ck_assert_str_eq(c->cluster.master, "[::1]:50088");
    ck_assert_str_eq(c->cluster.listen, "node-1.example.com:65535");
    ck_assert_str_eq(c->metrics.listen, "127.0.0.1:9300");
    parse_ok(c, "metrics:\n  listen: \"\"\ncluster:\n  token: ~\n  device_name:\n");
    ck_assert_str_eq(c->metrics.listen, "");
    ck_assert_str_eq(c->cluster.token, "");
    kv_config_free(c);
}
END_TEST

START_TEST(error_buffer_rules)
{
    kv_config *c = fresh();
    const char *bad = "dram:\n  shards: 0\n";
    char err[64];
    /* errlen 0: nothing written. NULL err: fine. */
    memset(err, 'x', sizeof err);
    ck_assert_int_eq(parse(c, bad, err, 0), KV_ECONFIG);
    ck_assert_int_eq(err[0], 'x');
    ck_assert_int_eq(parse(c, bad, NULL, 0), KV_ECONFIG);
    ck_assert_int_eq(parse(c, bad, NULL, 100), KV_ECONFIG);
    /* A short buffer gets a truncated, terminated message. */
    ck_assert_int_eq(parse(c, bad, err, 10), KV_ECONFIG);
    ck_assert_uint_eq(strlen(err), 9);
    ck_assert_int_eq(strncmp(err, "<string>:", 9), 0);
    ck_assert_int_eq(err[10], 'x');
    /* len bounds the document: what follows is not read. */
    const char *two = "dram: { shards: 8 }\nio: { threads: 0 }\n";
    ck_assert_int_eq(kv_config_parse(c, two, 20, err, sizeof err), KV_OK);
    ck_assert_uint_eq(c->dram.shards, 8);
    ck_assert_uint_eq(c->io.threads, 4);
    kv_config_free(c);
}
END_TEST

/* ---- files ------------------------------------------------------------------ */

START_TEST(load_file)
{
    char *dir = tu_mkdtemp(), path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/cfg.yaml", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("pipeline: dram\ndram:\n  capacity: 1GiB\n", f);
    ck_assert_int_eq(fclose(f), 0);

    kv_config *c = fresh();
    ck_assert_msg(kv_config_load(c, path, err, sizeof err) == KV_OK, "%s", err);
    ck_assert_int_eq(c->pipeline, KV_PIPE_DRAM);
    ck_assert_uint_eq(c->dram.capacity, GiB);

    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("pipeline: ssd\n# a comment\neviction:\n  ratio: 1.5\n", f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(kv_config_load(c, path, err, sizeof err), KV_ECONFIG);
    char want[600];
    snprintf(want, sizeof want, "%s:4: eviction.ratio: must be in (0,1), got 1.5", path);
    ck_assert_str_eq(err, want);
    ck_assert_int_eq(c->pipeline, KV_PIPE_DRAM);   /* nothing of the bad file applied */

    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("dram:\n  capacity: 1GiB\nssd: { path: x,\n  capacity: 1GiB\n", f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(kv_config_load(c, path, err, sizeof err), KV_ECONFIG);
    snprintf(want, sizeof want, "%s:5: YAML syntax error", path);
    ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "%s", err);

    /* A directory opens but cannot be read. */
    ck_assert_int_eq(kv_config_load(c, dir, err, sizeof err), KV_EIO);
    ck_assert_msg(strstr(err, dir) && strstr(err, strerror(EISDIR)), "%s", err);

    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(kv_config_load(c, path, err, sizeof err), KV_EIO);
    ck_assert_msg(strstr(err, path) && strstr(err, strerror(ENOENT)), "%s", err);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

START_TEST(example_file_is_the_defaults)
{
    kv_config *c = fresh(), *d = fresh();
    char err[512] = "";
    int rc = kv_config_load(c, "kvengine.example.yaml", err, sizeof err);
    ck_assert_msg(rc == KV_OK, "kvengine.example.yaml: %s (run from the repo root)", err);
    ck_assert(kv__config_equal(c, d));

    /* Every key is written out in it, under its section, with a comment. */
    FILE *f = fopen("kvengine.example.yaml", "r");
    ck_assert_ptr_nonnull(f);
    static char text[64 * 1024];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    const char *doc = NULL, *name;
    for (size_t i = 0; (name = kv__config_key_name(i, &doc)); i++) {
        ck_assert_msg(doc && *doc, "%s has no doc line", name);
        char sect[64], line[128];
        const char *dot = strchr(name, '.');
        if (dot) {
            snprintf(sect, sizeof sect, "\n%.*s:\n", (int)(dot - name), name);
            snprintf(line, sizeof line, "\n  %s: ", dot + 1);
        } else {
            snprintf(sect, sizeof sect, "\n");
            snprintf(line, sizeof line, "\n%s: ", name);
        }
        const char *s = strstr(text, sect);
        ck_assert_msg(s, "section of %s missing", name);
        const char *k = strstr(s, line);
        const char *next = dot ? strstr(s + strlen(sect), "\n\n") : NULL;
        ck_assert_msg(k && (!next || k < next), "%s is not in kvengine.example.yaml", name);
        const char *prev = k;   /* k is the newline before the key: find the line above */
        while (prev > text && prev[-1] != '\n')
            prev--;
        prev += strspn(prev, " ");
        ck_assert_msg(*prev == '#', "%s has no comment on the line above it", name);
    }
    kv_config_free(c);
    kv_config_free(d);
}
END_TEST

/* ---- set, get, dump ---------------------------------------------------------- */

START_TEST(set_and_get)
{
    kv_config *c = fresh();
    get_eq(c, "pipeline", "dram|ssd");
    get_eq(c, "dram.capacity", "4GiB");
    get_eq(c, "ssd.spill_queue", "256MiB");
    get_eq(c, "eviction.high_watermark_ratio", "0.9");
    get_eq(c, "eviction.lease_ttl_ms", "60000");
    get_eq(c, "ssd.write_through", "false");
    get_eq(c, "cluster.master", "127.0.0.1:50088");
    get_eq(c, "cluster.token", "");
    get_eq(c, "log.level", "info");

    /* Listening addresses may ask for any free port; the master may not. */
    ck_assert_int_eq(kv_config_set(c, "cluster.listen", "127.0.0.1:0"), KV_OK);
    ck_assert_int_eq(kv_config_set(c, "metrics.listen", "127.0.0.1:0"), KV_OK);
    ck_assert_int_eq(kv_config_set(c, "cluster.master", "127.0.0.1:0"), KV_ECONFIG);

    ck_assert_int_eq(kv_config_set(c, "eviction.ratio", "0.2"), KV_OK);
    ck_assert_double_eq(c->eviction.ratio, 0.2);
    get_eq(c, "eviction.ratio", "0.2");
    ck_assert_int_eq(kv_config_set(c, "eviction.ratio", "0.123456789012345"), KV_OK);
    get_eq(c, "eviction.ratio", "0.123456789012345");
    ck_assert_int_eq(kv_config_set(c, "dram.capacity", "1536"), KV_OK);
    get_eq(c, "dram.capacity", "1536");
    ck_assert_int_eq(kv_config_set(c, "dram.capacity", "30GB"), KV_OK);
    get_eq(c, "dram.capacity", "30GiB");
    ck_assert_int_eq(kv_config_set(c, "dram.capacity", "0"), KV_OK);
    get_eq(c, "dram.capacity", "0");
    ck_assert_int_eq(kv_config_set(c, "eviction.lease_ttl_ms", "2s"), KV_OK);
    get_eq(c, "eviction.lease_ttl_ms", "2000");
    ck_assert_int_eq(kv_config_set(c, "dram.hugepages", "true"), KV_OK);
    get_eq(c, "dram.hugepages", "on");
    ck_assert_int_eq(kv_config_set(c, "log.level", "WARNING"), KV_OK);
    get_eq(c, "log.level", "warn");
    ck_assert_int_eq(kv_config_set(c, "cluster.token", "a b: #c"), KV_OK);
    get_eq(c, "cluster.token", "a b: #c");
    ck_assert_int_eq(kv_config_set(c, "cluster.token", ""), KV_OK);
    get_eq(c, "cluster.token", "");
    ck_assert_int_eq(kv_config_set(c, "io.threads", "12"), KV_OK);
    get_eq(c, "io.threads", "12");

    /* A bad value or key changes nothing. */
    kv_config *before = fresh();
    memcpy(before, c, sizeof *before);
    ck_assert_int_eq(kv_config_set(c, "eviction.ratio", "1.5"), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(c, "io.threads", ""), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(c, "cluster.master", "nope"), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(c, "eviction.rato", "0.2"), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(c, "eviction", "0.2"), KV_ECONFIG);   /* a section */
    ck_assert_int_eq(kv_config_set(c, "", "0.2"), KV_ECONFIG);
    ck_assert(kv__config_equal(c, before));
    kv_config_free(before);

    char err[256];
    ck_assert_int_eq(kv__config_set(c, "eviction.rato", "0.2", err, sizeof err), KV_ECONFIG);
    ck_assert_str_eq(err, "eviction.rato: unknown key (did you mean eviction.ratio?)");
    ck_assert_int_eq(kv__config_set(c, "eviction.ratio", "2", err, sizeof err), KV_ECONFIG);
    ck_assert_str_eq(err, "eviction.ratio: must be in (0,1), got 2");
    /* store.name becomes part of a file name: no path, no hidden file. */
    ck_assert_int_eq(kv_config_set(c, "store.name", "ucm-0_a.b"), KV_OK);
    ck_assert_int_eq(kv__config_set(c, "store.name", "../x", err, sizeof err), KV_ECONFIG);
    ck_assert_ptr_nonnull(strstr(err, "store.name: may hold letters, digits and - _ . only"));
    ck_assert_int_eq(kv_config_set(c, "store.name", ".x"), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(c, "store.name", "x/y"), KV_ECONFIG);

    char buf[64];
    ck_assert_int_eq(kv_config_get(c, "nope.key", buf, sizeof buf), KV_ECONFIG);
    ck_assert_int_eq(kv_config_get(c, "dram", buf, sizeof buf), KV_ECONFIG);
    ck_assert_int_eq(kv_config_get(c, "pipeline", buf, 8), KV_ENOBUFS);   /* "dram|ssd" needs 9 */
    ck_assert_int_eq(kv_config_get(c, "pipeline", buf, 9), KV_OK);
    ck_assert_str_eq(buf, "dram|ssd");
    ck_assert_int_eq(kv_config_get(c, "pipeline", buf, 0), KV_ENOBUFS);

    /* Every key gets and sets back to itself. */
    const char *name;
    for (size_t i = 0; (name = kv__config_key_name(i, NULL)); i++) {
        char v[512];
        ck_assert_int_eq(kv_config_get(c, name, v, sizeof v), KV_OK);
        ck_assert_msg(kv_config_set(c, name, v) == KV_OK, "%s = \"%s\" does not set back", name, v);
    }
    kv_config_free(c);
}
END_TEST

static void round_trip(const kv_config *c)
{
    int n = kv_config_dump(c, NULL, 0);
    ck_assert_int_gt(n, 0);
    char *text = malloc((size_t)n + 1);
    ck_assert_int_eq(kv_config_dump(c, text, (size_t)n + 1), n);
    ck_assert_uint_eq(strlen(text), (size_t)n);
    kv_config *back = fresh();
    ck_assert_int_eq(kv_config_set(back, "pipeline", "ssd"), KV_OK);   /* overwritten by the dump */
    char err[512] = "";
    int rc = kv_config_parse(back, text, (size_t)n, err, sizeof err);
    ck_assert_msg(rc == KV_OK, "dump does not parse: %s\n%s", err, text);
    ck_assert_msg(kv__config_equal(c, back), "dump does not read back the same:\n%s", text);
    char *again = malloc((size_t)n + 1);
    ck_assert_int_eq(kv_config_dump(back, again, (size_t)n + 1), n);
    ck_assert_str_eq(text, again);
    free(again);
    free(text);
    kv_config_free(back);
}

START_TEST(dump_round_trip)
{
    kv_config *c = fresh();
    round_trip(c);
    char text[4096];
    int n = kv_config_dump(c, text, sizeof text);
    ck_assert_int_lt(n, (int)sizeof text);
    ck_assert_ptr_nonnull(strstr(text, "pipeline: dram|ssd\ndram:\n  capacity: 4GiB\n  shards: 64\n"));
    ck_assert_ptr_nonnull(strstr(text, "\n  device_name: \"\"\n"));
    ck_assert_ptr_nonnull(strstr(text, "\n  master: 127.0.0.1:50088\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nlog:\n  level: info\n"));

    static const char *const sets[][2] = {
        { "pipeline", "dram" }, { "dram.capacity", "1.5GiB" }, { "dram.shards", "7" },
        { "dram.hugepages", "off" }, { "eviction.high_watermark_ratio", "0.95" },
        { "eviction.ratio", "0.1234567890123" }, { "eviction.lease_ttl_ms", "1.5s" },
        { "ssd.path", "/var/lib/kv data/#1" }, { "ssd.capacity", "1000001" },
        { "ssd.compression", "none" }, { "ssd.write_through", "on" }, { "ssd.gc_trigger_ratio", "1" },
        { "ssd.gc_ratio", "3e-5" }, { "ssd.sync", "fsync" }, { "ssd.promote", "no" },
        { "ssd.spill_queue", "0" }, { "io.threads", "256" }, { "io.timeout_ms", "4294967295" },
        { "cluster.enabled", "true" }, { "cluster.master", "[fe80::1%eth0]:1" },
        { "cluster.listen", "localhost:65535" }, { "cluster.protocol", "rdma" },
        { "cluster.device_name", "yes" }, { "cluster.replica_num", "16" },
        { "cluster.node_ttl_ms", "0" }, { "cluster.token", "\"q\\u\": - x # y 'z' \xc3\xa9" },
        { "metrics.listen", "127.0.0.1:9300" }, { "log.level", "debug" },
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        ck_assert_msg(kv_config_set(c, sets[i][0], sets[i][1]) == KV_OK, "%s", sets[i][0]);
    round_trip(c);

    /* Strings that a plain scalar would change. */
    static const char *const tricky[] = { "~", "null", "- a", "-a", ":x", "x:", "a: b", "a #b",
                                          " lead", "trail ", "[x]", "{x}", "&a", "*a", "!t", "|",
                                          ">", "'", "\"", "%x", "@x", "`x", "#x", "?x", ",x", "x,y" };
    for (size_t i = 0; i < sizeof tricky / sizeof tricky[0]; i++) {
        ck_assert_int_eq(kv_config_set(c, "cluster.token", tricky[i]), KV_OK);
        ck_assert_int_eq(kv_config_set(c, "ssd.path", tricky[i]), KV_OK);
        round_trip(c);
    }

    /* snprintf rules: the needed length, a terminated prefix when short. */
    n = kv_config_dump(c, NULL, 0);
    char small[16];
    memset(small, 'x', sizeof small);
    ck_assert_int_eq(kv_config_dump(c, small, 10), n);
    ck_assert_uint_eq(strlen(small), 9);
    ck_assert_int_eq(small[10], 'x');
    kv_config_free(c);
}
END_TEST

/* ---- validation, NULLs -------------------------------------------------------- */

static void expect_invalid(const char *yaml, const char *phrase)
{
    kv_config *c = fresh();
    char err[512] = "";
    parse_ok(c, yaml);
    ck_assert_int_eq(kv__config_validate(c, err, sizeof err), KV_ECONFIG);
    ck_assert_msg(strstr(err, phrase), "[%s]: \"%s\" lacks \"%s\"", yaml, err, phrase);
    kv_config_free(c);
}

static void expect_valid(const char *yaml)
{
    kv_config *c = fresh();
    char err[512] = "";
    parse_ok(c, yaml);
    ck_assert_msg(kv__config_validate(c, err, sizeof err) == KV_OK, "[%s]: %s", yaml, err);
    kv_config_free(c);
}

START_TEST(validate_cross_field)
{
    expect_invalid("dram: { capacity: 0 }\n", "dram.capacity: 0 is only allowed with cluster.enabled");
    expect_invalid("pipeline: dram\ndram: { capacity: 0 }\n", "cluster.enabled");
    expect_valid("dram: { capacity: 0 }\ncluster: { enabled: true }\n");
    expect_valid("pipeline: ssd\ndram: { capacity: 0 }\n");
    expect_invalid("ssd: { path: \"\" }\n", "ssd.path: must be set when pipeline is dram|ssd");
    expect_invalid("pipeline: ssd\nssd: { path: ~ }\n", "ssd.path");
    expect_valid("pipeline: dram\nssd: { path: \"\" }\n");
    expect_invalid("ssd: { gc_ratio: 0.5, gc_trigger_ratio: 0.5 }\n",
                   "ssd.gc_ratio (0.5) must be less than ssd.gc_trigger_ratio (0.5)");
    expect_invalid("ssd: { gc_ratio: 0.6, gc_trigger_ratio: 0.5 }\n", "ssd.gc_trigger_ratio");
    expect_valid("ssd: { gc_ratio: 0.4, gc_trigger_ratio: 0.5 }\n");
    expect_invalid("eviction: { ratio: 0.6, high_watermark_ratio: 0.5 }\n",
                   "eviction.ratio (0.6) must be at most eviction.high_watermark_ratio (0.5)");
    expect_valid("eviction: { ratio: 0.5, high_watermark_ratio: 0.5 }\n");

    /* A struct filled in by hand is range-checked too. */
    kv_config *c = fresh();
    char err[256] = "";
    c->dram.shards = 0;
    ck_assert_int_eq(kv__config_validate(c, err, sizeof err), KV_ECONFIG);
    ck_assert_ptr_nonnull(strstr(err, "dram.shards"));
    kv__config_defaults(c);
    c->pipeline = 7;
    ck_assert_int_eq(kv__config_validate(c, err, sizeof err), KV_ECONFIG);
    ck_assert_ptr_nonnull(strstr(err, "pipeline"));
    ck_assert_int_eq(kv__config_validate(c, NULL, 0), KV_ECONFIG);
    ck_assert_int_eq(kv__config_validate(NULL, err, sizeof err), KV_EINVAL);
    kv_config_free(c);
}
END_TEST

START_TEST(null_arguments)
{
    kv_config *c = fresh();
    char buf[64], err[64];
    memset(err, 'x', sizeof err);
    ck_assert_int_eq(kv_config_new(NULL), KV_EINVAL);
    ck_assert_int_eq(kv_config_parse(NULL, "", 0, err, sizeof err), KV_EINVAL);
    ck_assert_int_eq(kv_config_parse(c, NULL, 0, err, sizeof err), KV_EINVAL);
    ck_assert_int_eq(kv_config_parse(c, NULL, 0, NULL, 0), KV_EINVAL);
    ck_assert_int_eq(kv_config_load(NULL, "x", err, sizeof err), KV_EINVAL);
    ck_assert_int_eq(kv_config_load(c, NULL, err, sizeof err), KV_EINVAL);
    ck_assert_int_eq(kv_config_load(c, NULL, NULL, 0), KV_EINVAL);
    ck_assert_int_eq(err[0], 'x');
    ck_assert_int_eq(kv_config_set(NULL, "io.threads", "2"), KV_EINVAL);
    ck_assert_int_eq(kv_config_set(c, NULL, "2"), KV_EINVAL);
    ck_assert_int_eq(kv_config_set(c, "io.threads", NULL), KV_EINVAL);
    ck_assert_int_eq(kv_config_get(NULL, "io.threads", buf, sizeof buf), KV_EINVAL);
    ck_assert_int_eq(kv_config_get(c, NULL, buf, sizeof buf), KV_EINVAL);
    ck_assert_int_eq(kv_config_get(c, "io.threads", NULL, 8), KV_EINVAL);
    ck_assert_int_eq(kv_config_dump(NULL, buf, sizeof buf), KV_EINVAL);
    ck_assert_int_eq(kv_config_dump(c, NULL, 8), KV_EINVAL);
    ck_assert_int_eq(kv__parse_duration_ms(NULL, &(uint64_t){ 0 }), KV_EINVAL);
    ck_assert_int_eq(kv__parse_size("1", NULL), KV_EINVAL);
    kv_config_free(NULL);
    /* Nothing above touched the config. */
    kv_config *d = fresh();
    ck_assert(kv__config_equal(c, d));
    kv_config_free(d);
    kv_config_free(c);
}
END_TEST

/* kv_parse_size: the config's syntax, and nothing else (kvctl used to
 * take "0x10" through strtod). */
START_TEST(parse_size_public)
{
    static const struct { const char *in; uint64_t want; } ok[] = {
        { "4096", 4096 }, { "512MiB", 512ull << 20 }, { "1.5 GiB", 3ull << 29 },
        { "16MB", 16ull << 20 }, { "2k", 2048 }, { "1t", 1ull << 40 }, { " 7 ", 7 },
    };
    static const char *bad[] = { "0x10", "-1", "1.5B", "abc", "", "12 parsecs",
                                 "20000000TiB", "1e3", "0.1KiB" };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 0;
        ck_assert_msg(kv_parse_size(ok[i].in, &v) == KV_OK && v == ok[i].want, "'%s' -> %llu",
                      ok[i].in, (unsigned long long)v);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 99;
        ck_assert_msg(kv_parse_size(bad[i], &v) == KV_EINVAL, "'%s' accepted", bad[i]);
    }
    uint64_t v;
    ck_assert_int_eq(kv_parse_size(NULL, &v), KV_EINVAL);
    ck_assert_int_eq(kv_parse_size("1", NULL), KV_EINVAL);
}
END_TEST

Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, defaults_match_design);
    tcase_add_test(tc, empty_documents_keep_defaults);
    tcase_add_test(tc, later_values_override_and_others_stay);
    tcase_add_test(tc, block_and_flow_style_agree);
    tcase_add_test(tc, size_units);
    tcase_add_test(tc, size_formatting);
    tcase_add_test(tc, duration_forms);
    tcase_add_test(tc, booleans_and_enums);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, error_unknown_key_and_section);
    tcase_add_test(tc, error_wrong_types);
    tcase_add_test(tc, error_ranges);
    tcase_add_test(tc, error_bad_enum_size_duration);
    tcase_add_test(tc, error_duplicates_aliases_documents);
    tcase_add_test(tc, error_syntax_and_top_level);
    tcase_add_test(tc, error_strings_and_addresses);
    tcase_add_test(tc, error_buffer_rules);
    suite_add_tcase(s, tc);

    tc = tcase_create("api");
    tcase_add_test(tc, load_file);
    tcase_add_test(tc, example_file_is_the_defaults);
    tcase_add_test(tc, set_and_get);
    tcase_add_test(tc, dump_round_trip);
    tcase_add_test(tc, validate_cross_field);
    tcase_add_test(tc, null_arguments);
    tcase_add_test(tc, parse_size_public);
    suite_add_tcase(s, tc);
    return s;
}
