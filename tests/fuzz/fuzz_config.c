/*
 * fuzz_config.c — libFuzzer harness for kv_config_parse and the round trip
 * parse -> dump -> parse.
 *
 * Key design choice: whatever a parse leaves in a config (a failed parse
 * may have applied the keys before the bad one) must survive the dump:
 * kv_config_dump's YAML parses back without error into an equal config
 * (kv__config_equal) whose own dump is the same text, and every key's
 * kv_config_get text is taken back by kv_config_set unchanged. A string
 * the dump forgets to quote, or a number it prints in a form the parser
 * refuses, fails one of these.
 */
#include <string.h>

#include "engine/config.h"
#include "fuzzutil.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *dump(const kv_config *cfg)
{
    int need = kv_config_dump(cfg, NULL, 0);
    FZ_CHECK(need > 0);
    char *buf = malloc((size_t)need + 1);
    FZ_CHECK(buf);
    FZ_CHECK(kv_config_dump(cfg, buf, (size_t)need + 1) == need);
    FZ_CHECK(strlen(buf) == (size_t)need);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kv_config *a = NULL, *b = NULL, *c = NULL;
    char err[160];
    FZ_CHECK(kv_config_new(&a) == KV_OK && kv_config_new(&b) == KV_OK &&
             kv_config_new(&c) == KV_OK);
    /* An exact-size copy without a NUL: the parser must use len only. */
    char *text = malloc(size ? size : 1);
    FZ_CHECK(text);
    memcpy(text, data, size);
    memset(err, 'x', sizeof err);
    int rc = kv_config_parse(a, text, size, err, sizeof err);
    FZ_CHECK(rc == KV_OK || rc == KV_ECONFIG);
    if (rc != KV_OK)
        FZ_CHECK(memchr(err, 0, sizeof err) != NULL && err[0] != 0);

    char *d1 = dump(a);
    int rc2 = kv_config_parse(b, d1, strlen(d1), err, sizeof err);
    if (rc2 != KV_OK)
        fprintf(stderr, "the dump does not parse back: %s\n--- dump:\n%s---\n", err, d1);
    FZ_CHECK(rc2 == KV_OK);
    FZ_CHECK(kv__config_equal(a, b));
    char *d2 = dump(b);
    FZ_CHECK(strcmp(d1, d2) == 0);

    /* Every key, one at a time, through its text form. */
    const char *key;
    for (size_t i = 0; (key = kv__config_key_name(i, NULL)); i++) {
        char val[KV_CFG_STR + 64];
        FZ_CHECK(kv_config_get(a, key, val, sizeof val) == KV_OK);
        int rs = kv_config_set(c, key, val);
        if (rs != KV_OK)
            fprintf(stderr, "kv_config_set(%s, \"%s\") refused what kv_config_get gave\n",
                    key, val);
        FZ_CHECK(rs == KV_OK);
    }
    FZ_CHECK(kv__config_equal(a, c));
    /* Cross-field validation must answer, not crash. */
    char verr[512];
    int rv = kv__config_validate(a, verr, sizeof verr);
    FZ_CHECK(rv == KV_OK || rv == KV_ECONFIG);

    free(d1);
    free(d2);
    free(text);
    kv_config_free(a);
    kv_config_free(b);
    kv_config_free(c);
    return 0;
}

/* ---- seeds -------------------------------------------------------------- */

static void write_seeds(const char *dir)
{
    static const struct { const char *name, *text; } docs[] = {
        { "pipeline", "pipeline: dram|ssd\ndram:\n  capacity: 512MiB\n  shards: 64\n" },
        { "ssd", "pipeline: ssd\nssd:\n  path: /var/lib/kv\n  capacity: 10GiB\n"
                 "  compression: lz4\n  sync: wal\n  gc_ratio: 0.25\n" },
        { "cluster", "cluster:\n  enabled: true\n  master: 127.0.0.1:50070\n"
                     "  listen: \"0.0.0.0:0\"\n  token: \"a b: #c\"\n  protocol: tcp\n" },
        { "eviction", "eviction:\n  ratio: 0.1\n  high_watermark_ratio: 0.9\n"
                      "  lease_ttl_ms: 250ms\nio:\n  threads: 8\n  timeout_ms: 2s\n" },
        { "flow", "{pipeline: dram, dram: {capacity: 64MiB}, log: {level: debug}}\n" },
        { "anchor", "dram: &d\n  capacity: 1GiB\nmetrics: *d\n" },
        { "bad-key", "dram:\n  capacty: 1GiB\n" },
        { "quoted", "ssd:\n  path: 'it''s here'\ncluster:\n  token: \"\\u00e9t\\u00e9\"\n" },
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++)
        fz_seed(dir, docs[i].name, docs[i].text, strlen(docs[i].text));
    kv_config *cfg;
    FZ_CHECK(kv_config_new(&cfg) == KV_OK);
    char *d = dump(cfg);
    fz_seed(dir, "defaults", d, strlen(d));
    free(d);
    kv_config_free(cfg);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    fz_mkcorpus(write_seeds);
    return 0;
}
