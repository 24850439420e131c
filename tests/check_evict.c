/*
 * check_evict.c — watermarks, LRU order, leases, pins, whole-block
 * eviction, and KV_ENOSPC when nothing can be evicted.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "testutil.h"

#define MB (1u << 20)
static uint8_t *val;   /* one 4 MiB source buffer, filled per block */

static void setup(void) { val = malloc(4 * MB); }
static void teardown(void) { free(val); }

/* 16 MiB engine: eviction starts past 8 MiB and frees 4 MiB a round. */
static kv_engine *open_small(unsigned lease_ms)
{
    return tu_open_yamlf("pipeline: dram\n"
                         "dram: { capacity: 16MiB, shards: 4 }\n"
                         "eviction: { high_watermark_ratio: 0.5, ratio: 0.25, lease_ttl_ms: %u }\n"
                         "io: { threads: 2 }\n", lease_ms);
}

static int dump_block(kv_engine *e, uint64_t n, size_t len)
{
    tu_fill(val, len, n);
    return tu_dump1(e, tu_id(n, 1), 0, val, len);
}

static bool has(kv_engine *e, uint64_t n)
{
    /* Not kv_lookup: that would grant a lease and change what is evicted. */
    uint64_t len;
    kv_block_id id = tu_id(n, 1);
    return kv__local_size(e, 0, &id, 0, &len) == KV_OK;
}

START_TEST(eviction_starts_at_the_high_watermark)
{
    kv_engine *e = open_small(0);
    kv_stats st;
    for (uint64_t i = 0; i < 7; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    kv_stats_get(e, &st);
    ck_assert_uint_eq(st.evictions, 0);            /* below 8 MiB */
    for (uint64_t i = 7; i < 12; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    kv_stats_get(e, &st);
    ck_assert_uint_gt(st.evictions, 0);
    ck_assert_uint_le(st.dram_used, 16u * MB);
    /* A round frees about ratio x capacity = 4 blocks, oldest first. */
    ck_assert(!has(e, 0));
    ck_assert(has(e, 11));
    kv_close(e);
}
END_TEST

START_TEST(least_recently_used_goes_first)
{
    kv_engine *e = open_small(0);
    for (uint64_t i = 0; i < 6; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    /* Touch block 0 by loading it: it becomes the most recent. */
    ck_assert_int_eq(tu_load1(e, tu_id(0, 1), 0, val, MB - 4096), KV_OK);
    for (uint64_t i = 6; i < 10; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    ck_assert(has(e, 0));
    ck_assert(!has(e, 1));
    ck_assert(!has(e, 2));
    kv_close(e);
}
END_TEST

START_TEST(a_lookup_hit_leases_the_block_until_the_ttl)
{
    kv_engine *e = open_small(300);
    for (uint64_t i = 0; i < 6; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    kv_block_id id = tu_id(0, 1);
    uint8_t hit = 0;
    ck_assert_int_eq(kv_lookup(e, &id, 1, &hit), KV_OK);
    ck_assert_uint_eq(hit, 1);
    /* Make block 0 the oldest again by touching every other block. */
    for (uint64_t i = 1; i < 6; i++)
        ck_assert_int_eq(tu_load1(e, tu_id(i, 1), 0, val, MB - 4096), KV_OK);
    for (uint64_t i = 6; i < 10; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    ck_assert(has(e, 0));                          /* leased: skipped */
    ck_assert(!has(e, 1));
    usleep(400 * 1000);                            /* the lease expires */
    /* From here block 0 is an ordinary block last used when its lease
     * ended; enough newer blocks push it out. */
    for (uint64_t i = 10; i < 30; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    ck_assert(!has(e, 0));
    kv_close(e);
}
END_TEST

START_TEST(a_pinned_block_is_never_evicted)
{
    kv_engine *e = open_small(0);
    ck_assert_int_eq(dump_block(e, 0, MB - 4096), KV_OK);
    kv_block_id id = tu_id(0, 1);
    const void *data;
    uint64_t len;
    kv__pin pin;
    ck_assert_int_eq(kv__local_pin(e, 0, &id, 0, &data, &len, &pin), KV_OK);
    for (uint64_t i = 1; i < 30; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    ck_assert(has(e, 0));
    ck_assert(tu_check_fill(data, len, 0));        /* bytes intact under the pin */
    kv__local_unpin(e, &pin);
    for (uint64_t i = 30; i < 40; i++)
        ck_assert_int_eq(dump_block(e, i, MB - 4096), KV_OK);
    ck_assert(!has(e, 0));
    kv_close(e);
}
END_TEST

START_TEST(all_shards_of_a_block_go_together)
{
    kv_engine *e = open_small(0);
    enum { SHARDS = 4, SZ = 256 << 10 };
    for (uint64_t b = 0; b < 60; b++) {
        for (uint32_t s = 0; s < SHARDS; s++) {
            tu_fill(val, SZ, b * 16 + s);
            ck_assert_int_eq(tu_dump1(e, tu_id(b, 2), s, val, SZ), KV_OK);
        }
    }
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_gt(st.evictions, 0);
    int whole = 0;
    for (uint64_t b = 0; b < 60; b++) {
        int present = 0;
        for (uint32_t s = 0; s < SHARDS; s++) {
            int rc = tu_load1(e, tu_id(b, 2), s, val, SZ);
            if (rc == KV_OK) {
                present++;
                ck_assert(tu_check_fill(val, SZ, b * 16 + s));
            } else {
                ck_assert_int_eq(rc, KV_ENOTFOUND);
            }
        }
        /* The last block may still be half written; earlier ones are
         * either whole or gone. */
        if (b < 59)
            ck_assert_msg(present == 0 || present == SHARDS, "block %d has %d shards", (int)b, present);
        whole += present == SHARDS;
    }
    ck_assert_int_gt(whole, 0);
    kv_close(e);
}
END_TEST

START_TEST(when_everything_is_leased_a_dump_fails_fast_with_enospc)
{
    kv_engine *e = tu_open_yaml("pipeline: dram\n"
                                "dram: { capacity: 8MiB, shards: 2 }\n"
                                "eviction: { high_watermark_ratio: 0.9, ratio: 0.1, lease_ttl_ms: 60000 }\n");
    int stored = 0;
    for (uint64_t i = 0; i < 7; i++)
        if (dump_block(e, i, MB - 4096) == KV_OK)
            stored++;
    ck_assert_int_ge(stored, 6);
    kv_block_id ids[7];
    uint8_t hit[7];
    for (uint64_t i = 0; i < 7; i++)
        ids[i] = tu_id(i, 1);
    ck_assert_int_eq(kv_lookup(e, ids, 7, hit), KV_OK);   /* leases them all */
    uint64_t t0 = tu_now_ms();
    int rc = KV_OK;
    for (uint64_t i = 100; i < 104 && rc == KV_OK; i++)
        rc = dump_block(e, i, 2 * MB);
    ck_assert_int_eq(rc, KV_ENOSPC);
    ck_assert_uint_lt(tu_now_ms() - t0, 2000);             /* never blocks */
    for (uint64_t i = 0; i < 7; i++)
        if (hit[i])
            ck_assert(has(e, i));                          /* nothing leased lost */
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_gt(st.enospc, 0);
    kv_close(e);
}
END_TEST

START_TEST(a_value_larger_than_the_segment_is_enospc)
{
    kv_engine *e = open_small(0);
    uint8_t *big = malloc(17 * MB);
    memset(big, 1, 17 * MB);
    ck_assert_int_eq(tu_dump1(e, tu_id(1, 3), 0, big, 17 * MB), KV_ENOSPC);
    free(big);
    kv_close(e);
}
END_TEST

Suite *evict_suite(void)
{
    Suite *s = suite_create("evict");
    TCase *tc = tcase_create("evict");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, eviction_starts_at_the_high_watermark);
    tcase_add_test(tc, least_recently_used_goes_first);
    tcase_add_test(tc, a_lookup_hit_leases_the_block_until_the_ttl);
    tcase_add_test(tc, a_pinned_block_is_never_evicted);
    tcase_add_test(tc, all_shards_of_a_block_go_together);
    tcase_add_test(tc, when_everything_is_leased_a_dump_fails_fast_with_enospc);
    tcase_add_test(tc, a_value_larger_than_the_segment_is_enospc);
    suite_add_tcase(s, tc);
    return s;
}
