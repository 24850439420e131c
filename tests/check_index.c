/*
 * check_index.c — the DRAM tier's hash table: entries, shard lists, growth,
 * LRU order and the memory it reports.
 */
#include <stdlib.h>

#include "engine/index.h"
#include "testutil.h"

static struct kv__table t;

static void setup(void) { ck_assert_int_eq(kv__table_init(&t, 4), KV_OK); }
static void teardown(void) { kv__table_destroy(&t, NULL, NULL); }

static struct kv__tshard *shard_of(const kv_block_id *id, uint64_t *h)
{
    *h = kv__id_hash(id);
    return kv__table_shard(&t, *h);
}

START_TEST(add_find_unlink)
{
    kv_block_id id = tu_id(1, 0), other = tu_id(2, 0);
    uint64_t h;
    struct kv__tshard *ts = shard_of(&id, &h);
    struct kv__blk *b = NULL;
    ck_assert_ptr_null(kv__blk_find(ts, h, &id));
    ck_assert_int_eq(kv__blk_add(ts, h, &id, 0, 7, 100, 1, &b), KV_OK);
    ck_assert_ptr_eq(kv__blk_find(ts, h, &id), b);
    uint64_t h2;
    struct kv__tshard *ts2 = shard_of(&other, &h2);
    ck_assert_ptr_null(kv__blk_find(ts2, h2, &other));
    struct kv__sref *r = kv__blk_sref(b, 0);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->off64, 7);
    ck_assert_uint_eq(r->len, 100);
    ck_assert_ptr_null(kv__blk_sref(b, 1));
    kv__blk_unlink(ts, h, b);
    ck_assert_ptr_null(kv__blk_find(ts, h, &id));
    ck_assert_uint_eq(ts->nblocks, 0);
    ck_assert_uint_eq(ts->nshards, 0);
    kv__blk_free(b);
}
END_TEST

START_TEST(shards_stay_sorted_and_findable)
{
    kv_block_id id = tu_id(3, 0);
    uint64_t h;
    struct kv__tshard *ts = shard_of(&id, &h);
    struct kv__blk *b = NULL;
    /* Out of order, past the inline slot and several array growths. */
    for (uint32_t i = 0; i < 100; i++)
        ck_assert_int_eq(kv__blk_add(ts, h, &id, (i * 37) % 100, i, 64 + i, 1, &b), KV_OK);
    ck_assert_uint_eq(b->nshards, 100);
    ck_assert_uint_eq(ts->nblocks, 1);
    ck_assert_uint_eq(ts->nshards, 100);
    struct kv__sref *v = kv__blk_srefs(b);
    for (uint32_t i = 1; i < 100; i++)
        ck_assert_uint_lt(v[i - 1].index, v[i].index);
    for (uint32_t i = 0; i < 100; i++) {
        struct kv__sref *r = kv__blk_sref(b, (i * 37) % 100);
        ck_assert_ptr_nonnull(r);
        ck_assert_uint_eq(r->off64, i);
    }
    ck_assert_ptr_null(kv__blk_sref(b, 100));
}
END_TEST

START_TEST(buckets_grow_and_every_block_stays_findable)
{
    enum { N = 20000 };
    for (uint64_t i = 0; i < N; i++) {
        kv_block_id id = tu_id(i, 9);
        uint64_t h;
        struct kv__tshard *ts = shard_of(&id, &h);
        ck_assert_int_eq(kv__blk_add(ts, h, &id, 0, (uint32_t)i, 1, 1, NULL), KV_OK);
    }
    uint64_t blocks = 0, bytes = 0;
    for (uint32_t s = 0; s < t.n; s++) {
        blocks += t.sh[s].nblocks;
        bytes += t.sh[s].index_bytes;
        ck_assert_uint_ge(t.sh[s].mask + 1, t.sh[s].nblocks);   /* load factor <= 1 */
    }
    ck_assert_uint_eq(blocks, N);
    /* One 48-byte entry plus 8..16 bytes of buckets per single-shard block:
     * the goal of at most 64 bytes per stored shard. */
    ck_assert_uint_le(bytes / N, 64);
    ck_assert_uint_ge(bytes / N, 48 + 8);
    for (uint64_t i = 0; i < N; i++) {
        kv_block_id id = tu_id(i, 9);
        uint64_t h;
        struct kv__tshard *ts = shard_of(&id, &h);
        struct kv__blk *b = kv__blk_find(ts, h, &id);
        ck_assert_ptr_nonnull(b);
        ck_assert_uint_eq(kv__blk_sref(b, 0)->off64, i);
    }
}
END_TEST

START_TEST(sampling_offers_the_oldest_evictable_blocks)
{
    kv_block_id a = tu_id(1, 5);
    uint64_t h;
    struct kv__tshard *ts = shard_of(&a, &h);
    /* Twenty blocks in one table shard, stamped 100, 101, ... */
    struct kv__blk *b[20];
    int n = 0;
    for (uint64_t i = 0; n < 20; i++) {
        kv_block_id id = tu_id(i, 5);
        uint64_t hh;
        if (shard_of(&id, &hh) != ts)
            continue;
        ck_assert_int_eq(kv__blk_add(ts, hh, &id, 0, 0, 1, 100 + (uint64_t)n, &b[n]), KV_OK);
        n++;
    }
    b[0]->stamp = 10000;                  /* leased: a stamp in the future */
    b[1]->pins = 1;                       /* being read */
    kv__blk_touch(b[2], 500);             /* used recently */
    kv__blk_touch(b[0], 600);             /* a touch keeps the lease */
    ck_assert_uint_eq(b[0]->stamp, 10000);
    struct kv__cand c[4];
    size_t k = kv__tshard_sample(ts, 1000, 64, c, 4);
    ck_assert_uint_eq(k, 4);
    /* Oldest first, skipping the leased, the pinned and the touched. */
    for (size_t i = 0; i < k; i++) {
        ck_assert_uint_eq(c[i].stamp, 103 + i);
        ck_assert_mem_eq(c[i].id.bytes, b[3 + i]->id.bytes, KV_BLOCK_ID_LEN);
        ck_assert_uint_eq(c[i].hash, kv__id_hash(&c[i].id));
    }
    /* Nothing is evictable before any stamp. */
    ck_assert_uint_eq(kv__tshard_sample(ts, 50, 64, c, 4), 0);
    b[1]->pins = 0;
}
END_TEST

Suite *index_suite(void)
{
    Suite *s = suite_create("index");
    TCase *tc = tcase_create("index");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, add_find_unlink);
    tcase_add_test(tc, shards_stay_sorted_and_findable);
    tcase_add_test(tc, buckets_grow_and_every_block_stays_findable);
    tcase_add_test(tc, sampling_offers_the_oldest_evictable_blocks);
    suite_add_tcase(s, tc);
    return s;
}
