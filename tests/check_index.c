/*
 * check_index.c — the DRAM tier's hash table: entries, shard lists, growth,
 * LRU order and the memory it reports.
 */
#include <stdlib.h>

#include "index.h"
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
    /* One 64-byte entry plus 8..16 bytes of buckets per single-shard block. */
    ck_assert_uint_le(bytes / N, 64 + 16);
    ck_assert_uint_ge(bytes / N, 64 + 8);
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

START_TEST(touch_moves_to_the_head_and_keeps_leases)
{
    kv_block_id a = tu_id(1, 5);
    uint64_t h;
    struct kv__tshard *ts = shard_of(&a, &h);
    /* Three blocks in the same table shard. */
    kv_block_id ids[3];
    struct kv__blk *b[3];
    int n = 0;
    for (uint64_t i = 0; n < 3; i++) {
        kv_block_id id = tu_id(i, 5);
        uint64_t hh;
        if (shard_of(&id, &hh) != ts)
            continue;
        ids[n] = id;
        ck_assert_int_eq(kv__blk_add(ts, hh, &id, 0, 0, 1, (uint64_t)n + 10, &b[n]), KV_OK);
        n++;
    }
    ck_assert_ptr_eq(ts->lru_head, b[2]);
    ck_assert_ptr_eq(ts->lru_tail, b[0]);
    kv__blk_touch(ts, b[0], 100);
    ck_assert_ptr_eq(ts->lru_head, b[0]);
    ck_assert_ptr_eq(ts->lru_tail, b[1]);
    ck_assert_uint_eq(b[0]->stamp, 100);
    b[1]->stamp = 1000;                    /* a lease: a stamp in the future */
    kv__blk_touch(ts, b[1], 200);
    ck_assert_uint_eq(b[1]->stamp, 1000);  /* kept */
    ck_assert_ptr_eq(ts->lru_head, b[1]);
    (void)ids;
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
    tcase_add_test(tc, touch_moves_to_the_head_and_keeps_leases);
    suite_add_tcase(s, tc);
    return s;
}
