/*
 * check_spill.c — the SSD tier behind the public API: dram|ssd spilling
 * under eviction, the ssd-only pipeline, write-through, reopen.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "testutil.h"

static kv_stats stats(kv_engine *e)
{
    kv_stats st;
    memset(&st, 0, sizeof st);
    ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
    return st;
}

/* Every dump must succeed: while evicted blocks are being written back,
 * a dump waits for their memory instead of failing with KV_ENOSPC. */
static void dump_n(kv_engine *e, uint64_t from, uint64_t to, size_t len)
{
    uint8_t *b = malloc(len);
    for (uint64_t n = from; n < to; n++) {
        tu_fill(b, len, n);
        int rc = tu_dump1(e, tu_id(n, 3), 0, b, len);
        ck_assert_msg(rc == KV_OK, "dump %llu: %s", (unsigned long long)n, kv_strerror(rc));
    }
    free(b);
}

static void load_n(kv_engine *e, uint64_t from, uint64_t to, size_t len)
{
    uint8_t *b = malloc(len);
    for (uint64_t n = from; n < to; n++) {
        memset(b, 0, len);
        int rc = tu_load1(e, tu_id(n, 3), 0, b, len);
        ck_assert_msg(rc == KV_OK, "block %llu: %s", (unsigned long long)n, kv_strerror(rc));
        ck_assert_msg(tu_check_fill(b, len, n), "block %llu: wrong bytes", (unsigned long long)n);
    }
    free(b);
}

START_TEST(dram_ssd_spills_and_loads_everything)
{
    char *dir = tu_mkdtemp();
    /* 4 MiB of DRAM, 16 MiB of blocks: most must spill to SSD. */
    kv_engine *e = tu_open_yamlf("pipeline: dram|ssd\n"
                                 "dram: {capacity: 4MiB, hugepages: off}\n"
                                 "ssd: {path: \"%s/ssd\", compression: none, promote: false}\n",
                                 dir);
    const size_t len = 65536;
    const uint64_t n = 256;
    dump_n(e, 0, n, len);
    kv_stats st = stats(e);
    ck_assert_uint_gt(st.evictions, 0);
    ck_assert_uint_gt(st.spills, 0);
    ck_assert_uint_eq(st.spill_drops, 0);
    /* Every block is still there: lookup hits them all, load reads them. */
    kv_block_id ids[256];
    uint8_t hit[256];
    for (uint64_t i = 0; i < n; i++)
        ids[i] = tu_id(i, 3);
    ck_assert_int_eq(kv_lookup(e, ids, n, hit), KV_OK);
    for (uint64_t i = 0; i < n; i++)
        ck_assert_msg(hit[i], "block %llu missing", (unsigned long long)i);
    load_n(e, 0, n, len);
    st = stats(e);
    ck_assert_uint_gt(st.hits_ssd, 0);
    ck_assert_uint_gt(st.ssd_blocks, 0);
    ck_assert_uint_eq(st.checksum_failures, 0);
    kv_close(e);
    tu_rmdir(dir);
}
END_TEST

START_TEST(ssd_pipeline_alone)
{
    char *dir = tu_mkdtemp();
    kv_engine *e = tu_open_yamlf("pipeline: ssd\nssd: {path: \"%s/ssd\", sync: wal}\n", dir);
    dump_n(e, 0, 50, 20000);
    kv_stats st = stats(e);
    ck_assert_uint_eq(st.ssd_blocks, 50);
    ck_assert_uint_eq(st.ssd_used, 50 * 20000);
    load_n(e, 0, 50, 20000);
    ck_assert_uint_eq(stats(e).hits_ssd, 50);
    uint8_t b[10];
    ck_assert_int_eq(tu_load1(e, tu_id(999, 3), 0, b, sizeof b), KV_ENOTFOUND);
    /* Plain keys reach the SSD tier too. */
    ck_assert_int_eq(kv_put(e, "k", 1, "value", 5), KV_OK);
    char v[16];
    size_t vl = 0;
    ck_assert_int_eq(kv_get(e, "k", 1, v, sizeof v, &vl), KV_OK);
    ck_assert_uint_eq(vl, 5);
    ck_assert_mem_eq(v, "value", 5);
    kv_close(e);
    /* Reopen keeps blocks and keys. */
    e = tu_open_yamlf("pipeline: ssd\nssd: {path: \"%s/ssd\"}\n", dir);
    ck_assert_uint_eq(stats(e).ssd_blocks, 50);
    load_n(e, 0, 50, 20000);
    ck_assert_int_eq(kv_exists(e, "k", 1), 1);
    kv_close(e);
    tu_rmdir(dir);
}
END_TEST

START_TEST(write_through_persists_every_dump)
{
    char *dir = tu_mkdtemp();
    kv_engine *e = tu_open_yamlf("pipeline: dram|ssd\n"
                                 "dram: {capacity: 64MiB, hugepages: off}\n"
                                 "ssd: {path: \"%s/ssd\", write_through: true, sync: wal}\n",
                                 dir);
    dump_n(e, 0, 40, 30000);
    kv_stats st = stats(e);
    ck_assert_uint_eq(st.ssd_blocks, 40);   /* on SSD with no eviction at all */
    ck_assert_uint_eq(st.evictions, 0);
    load_n(e, 0, 40, 30000);
    ck_assert_uint_eq(stats(e).hits_ssd, 0);   /* served from DRAM */
    kv_close(e);
    /* A new engine (empty DRAM) finds them all on SSD. */
    e = tu_open_yamlf("pipeline: dram|ssd\n"
                      "dram: {capacity: 64MiB, hugepages: off}\n"
                      "ssd: {path: \"%s/ssd\"}\n", dir);
    load_n(e, 0, 40, 30000);
    ck_assert_uint_eq(stats(e).hits_ssd, 40);
    kv_close(e);
    tu_rmdir(dir);
}
END_TEST

START_TEST(reopen_keeps_spilled_blocks)
{
    char *dir = tu_mkdtemp();
    const char *yaml = "pipeline: dram|ssd\n"
                       "dram: {capacity: 4MiB, hugepages: off}\n"
                       "ssd: {path: \"%s/ssd\", compression: lz4}\n";
    kv_engine *e = tu_open_yamlf(yaml, dir);
    dump_n(e, 0, 200, 65536);
    uint64_t spilled = stats(e).spills;
    ck_assert_uint_gt(spilled, 0);
    kv_close(e);   /* DRAM contents are gone; spilled blocks are not */
    e = tu_open_yamlf(yaml, dir);
    kv_stats st = stats(e);
    ck_assert_uint_ge(st.ssd_blocks, spilled);
    /* The oldest blocks were the ones evicted. */
    load_n(e, 0, 20, 65536);
    kv_close(e);
    tu_rmdir(dir);
}
END_TEST

/* One store per host (issue 16): a second engine on the same path shares
 * the first one's store instead of failing with KV_EBUSY. */
START_TEST(second_engine_on_the_same_path_shares_it)
{
    char *dir = tu_mkdtemp();
    kv_engine *e = tu_open_yamlf("pipeline: ssd\nssd: {path: \"%s/ssd\"}\n"
                                 "store: {dir: \"%s/rv\"}\n", dir, dir);
    kv_engine *e2 = tu_open_yamlf("pipeline: ssd\nssd: {path: \"%s/ssd\"}\n"
                                  "store: {dir: \"%s/rv\"}\n", dir, dir);
    uint8_t b[5000], c[5000];
    tu_fill(b, sizeof b, 5);
    ck_assert_int_eq(tu_dump1(e2, tu_id(5, 3), 0, b, sizeof b), KV_OK);
    ck_assert_int_eq(tu_load1(e, tu_id(5, 3), 0, c, sizeof c), KV_OK);
    ck_assert(tu_check_fill(c, sizeof c, 5));
    ck_assert_uint_eq(stats(e2).ssd_blocks, 1);
    kv_close(e2);
    kv_close(e);
    tu_rmdir(dir);
}
END_TEST

START_TEST(prefetch_stages_every_shard_of_a_block)
{
    char *dir = tu_mkdtemp();
    kv_engine *e = tu_open_yamlf("pipeline: dram|ssd\n"
                                 "dram: {capacity: 8MiB, hugepages: off}\n"
                                 "ssd: {path: \"%s/ssd\", compression: none, promote: false}\n",
                                 dir);
    enum { SZ = 65536, SHARDS = 3 };
    uint8_t *b = malloc(SZ);
    /* Block 0 with three shards, then enough others to push it to SSD. */
    for (uint32_t s = 0; s < SHARDS; s++) {
        tu_fill(b, SZ, 1000 + s);
        ck_assert_int_eq(tu_dump1(e, tu_id(0, 7), s, b, SZ), KV_OK);
    }
    for (uint64_t n = 1; n < 300; n++) {
        tu_fill(b, SZ, n);
        ck_assert_int_eq(tu_dump1(e, tu_id(n, 7), 0, b, SZ), KV_OK);
    }
    kv_block_id id = tu_id(0, 7);
    uint64_t len;
    ck_assert_int_eq(kv__local_size(e, 0, &id, 2, &len), KV_OK);     /* on SSD */
    kv_stats st;
    kv_stats_get(e, &st);
    uint64_t before = st.promotions;
    ck_assert_int_eq(kv_prefetch(e, &id, 1), KV_OK);
    /* A hint: wait (bounded) until its three shards are in DRAM. */
    const void *data;
    kv__pin pin;
    int staged = 0;
    for (uint64_t t0 = tu_now_ms(); staged < SHARDS && tu_now_ms() - t0 < 5000;) {
        staged = 0;
        for (uint32_t s = 0; s < SHARDS; s++) {
            if (kv__local_pin(e, 0, &id, s, &data, &len, &pin) == KV_OK) {
                ck_assert(tu_check_fill(data, len, 1000 + s));
                kv__local_unpin(e, &pin);
                staged++;
            }
        }
        if (staged < SHARDS)
            usleep(2000);
    }
    kv_stats_get(e, &st);
    ck_assert_msg(staged == SHARDS, "staged %d of %d shards (promotions %llu -> %llu, evictions %llu)",
                  staged, SHARDS, (unsigned long long)before, (unsigned long long)st.promotions,
                  (unsigned long long)st.evictions);
    ck_assert_uint_ge(st.promotions, before + SHARDS);
    free(b);
    kv_close(e);
    tu_rmdir(dir);
}
END_TEST

Suite *spill_suite(void)
{
    Suite *s = suite_create("spill");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, dram_ssd_spills_and_loads_everything);
    tcase_add_test(tc, prefetch_stages_every_shard_of_a_block);
    tcase_add_test(tc, ssd_pipeline_alone);
    tcase_add_test(tc, write_through_persists_every_dump);
    tcase_add_test(tc, reopen_keeps_spilled_blocks);
    tcase_add_test(tc, second_engine_on_the_same_path_shares_it);
    suite_add_tcase(s, tc);
    return s;
}
