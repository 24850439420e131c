/*
 * check_kv.c — plain keys: put / get / exists / remove.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "engine/engine.h"
#include "testutil.h"

static kv_engine *open_kv(void)
{
    return tu_open_yaml("pipeline: dram\ndram: { capacity: 32MiB, shards: 4 }\nio: { threads: 1 }\n");
}

START_TEST(put_get_exists_remove)
{
    kv_engine *e = open_kv();
    char buf[64];
    size_t n = 0;
    ck_assert_int_eq(kv_exists(e, "alpha", 5), 0);
    ck_assert_int_eq(kv_get(e, "alpha", 5, buf, sizeof buf, &n), KV_ENOTFOUND);
    ck_assert_int_eq(kv_put(e, "alpha", 5, "one", 3), KV_OK);
    ck_assert_int_eq(kv_exists(e, "alpha", 5), 1);
    ck_assert_int_eq(kv_get(e, "alpha", 5, buf, sizeof buf, &n), KV_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_mem_eq(buf, "one", 3);
    ck_assert_int_eq(kv_remove(e, "alpha", 5), KV_OK);
    ck_assert_int_eq(kv_exists(e, "alpha", 5), 0);
    ck_assert_int_eq(kv_remove(e, "alpha", 5), KV_ENOTFOUND);
    kv_close(e);
}
END_TEST

START_TEST(put_replaces)
{
    kv_engine *e = open_kv();
    char buf[64];
    size_t n;
    ck_assert_int_eq(kv_put(e, "k", 1, "first value", 11), KV_OK);
    ck_assert_int_eq(kv_put(e, "k", 1, "2nd", 3), KV_OK);
    ck_assert_int_eq(kv_get(e, "k", 1, buf, sizeof buf, &n), KV_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_mem_eq(buf, "2nd", 3);
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_eq(st.keys, 1);
    kv_close(e);
}
END_TEST

START_TEST(a_small_buffer_gets_enobufs_and_the_size_needed)
{
    kv_engine *e = open_kv();
    char val[1000], buf[10];
    memset(val, 'x', sizeof val);
    memset(buf, 0, sizeof buf);
    ck_assert_int_eq(kv_put(e, "big", 3, val, sizeof val), KV_OK);
    size_t n = 0;
    ck_assert_int_eq(kv_get(e, "big", 3, buf, sizeof buf, &n), KV_ENOBUFS);
    ck_assert_uint_eq(n, 1000);
    for (size_t i = 0; i < sizeof buf; i++)
        ck_assert_int_eq(buf[i], 0);                  /* untouched */
    n = 0;
    ck_assert_int_eq(kv_get(e, "big", 3, NULL, 0, &n), KV_ENOBUFS);
    ck_assert_uint_eq(n, 1000);
    kv_close(e);
}
END_TEST

START_TEST(key_lengths_outside_1_to_250_are_refused)
{
    kv_engine *e = open_kv();
    char key[KV_KEY_MAX + 1];
    memset(key, 'k', sizeof key);
    char buf[8];
    size_t n;
    ck_assert_int_eq(kv_put(e, key, 0, "v", 1), KV_EINVAL);
    ck_assert_int_eq(kv_put(e, key, KV_KEY_MAX + 1, "v", 1), KV_EINVAL);
    ck_assert_int_eq(kv_get(e, key, KV_KEY_MAX + 1, buf, sizeof buf, &n), KV_EINVAL);
    ck_assert_int_eq(kv_exists(e, key, 0), KV_EINVAL);
    ck_assert_int_eq(kv_remove(e, key, KV_KEY_MAX + 1), KV_EINVAL);
    ck_assert_int_eq(kv_put(e, NULL, 3, "v", 1), KV_EINVAL);
    ck_assert_int_eq(kv_put(e, "k", 1, NULL, 5), KV_EINVAL);
    ck_assert_int_eq(kv_get(e, "k", 1, buf, sizeof buf, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_put(NULL, "k", 1, "v", 1), KV_EINVAL);
    /* The longest key works, and an empty value is a value. */
    ck_assert_int_eq(kv_put(e, key, KV_KEY_MAX, "", 0), KV_OK);
    ck_assert_int_eq(kv_get(e, key, KV_KEY_MAX, buf, sizeof buf, &n), KV_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kv_exists(e, key, KV_KEY_MAX - 1), 0);   /* a prefix is another key */
    kv_close(e);
}
END_TEST

START_TEST(keys_and_blocks_never_meet)
{
    kv_engine *e = open_kv();
    kv_block_id id = tu_id(1, 0);
    /* A plain key whose bytes are a block id is not that block... */
    ck_assert_int_eq(kv_put(e, id.bytes, sizeof id.bytes, "v", 1), KV_OK);
    uint8_t hit = 1;
    ck_assert_int_eq(kv_lookup(e, &id, 1, &hit), KV_OK);
    ck_assert_uint_eq(hit, 0);
    /* ...and a block is not a plain key. */
    uint8_t buf[32] = { 0 };
    kv_block_id id2 = tu_id(2, 0);
    ck_assert_int_eq(tu_dump1(e, id2, 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(kv_exists(e, id2.bytes, sizeof id2.bytes), 0);
    kv_close(e);
}
END_TEST

START_TEST(many_keys)
{
    kv_engine *e = open_kv();
    char key[32], val[64], buf[64];
    for (int i = 0; i < 5000; i++) {
        int kl = snprintf(key, sizeof key, "key-%d", i);
        int vl = snprintf(val, sizeof val, "value-%d-%d", i, i * 7);
        ck_assert_int_eq(kv_put(e, key, (size_t)kl, val, (size_t)vl), KV_OK);
    }
    for (int i = 0; i < 5000; i++) {
        int kl = snprintf(key, sizeof key, "key-%d", i);
        int vl = snprintf(val, sizeof val, "value-%d-%d", i, i * 7);
        size_t n;
        ck_assert_int_eq(kv_get(e, key, (size_t)kl, buf, sizeof buf, &n), KV_OK);
        ck_assert_uint_eq(n, (size_t)vl);
        ck_assert_mem_eq(buf, val, n);
    }
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_eq(st.keys, 5000);
    kv_close(e);
}
END_TEST

START_TEST(keys_spill_to_ssd_and_come_back)
{
    char *dir = tu_mkdtemp();
    kv_engine *e = tu_open_yamlf("pipeline: dram|ssd\n"
                                 "dram: { capacity: 4MiB, shards: 2 }\n"
                                 "ssd: { path: %s/ssd, compression: none }\n", dir);
    enum { N = 60, SZ = 200 << 10 };
    uint8_t *val = malloc(SZ), *buf = malloc(SZ);
    char key[32];
    for (int i = 0; i < N; i++) {
        int kl = snprintf(key, sizeof key, "spilled-%d", i);
        tu_fill(val, SZ, (uint64_t)i);
        ck_assert_int_eq(kv_put(e, key, (size_t)kl, val, SZ), KV_OK);
    }
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_gt(st.evictions, 0);
    /* Replace one that has surely been evicted: the SSD copy must not win. */
    ck_assert_int_eq(kv_put(e, "spilled-0", 9, "new", 3), KV_OK);
    size_t n;
    ck_assert_int_eq(kv_get(e, "spilled-0", 9, buf, SZ, &n), KV_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_mem_eq(buf, "new", 3);
    for (int i = 1; i < N; i++) {
        int kl = snprintf(key, sizeof key, "spilled-%d", i);
        int rc = kv_get(e, key, (size_t)kl, buf, SZ, &n);
        ck_assert_msg(rc == KV_OK, "%s: %s", key, kv_strerror(rc));
        ck_assert_uint_eq(n, SZ);
        ck_assert(tu_check_fill(buf, SZ, (uint64_t)i));
    }
    kv_stats_get(e, &st);
    ck_assert_uint_gt(st.hits_ssd, 0);
    /* Remove reaches the SSD copy too. */
    ck_assert_int_eq(kv_remove(e, "spilled-1", 9), KV_OK);
    ck_assert_int_eq(kv_exists(e, "spilled-1", 9), 0);
    ck_assert_int_eq(kv_get(e, "spilled-1", 9, buf, SZ, &n), KV_ENOTFOUND);
    /* So does remove_all: the keys only the SSD tier holds are gone too. */
    uint64_t removed = 0;
    ck_assert_int_eq(kv_remove_all(e, &removed), KV_OK);
    ck_assert_uint_eq(removed, N - 1);
    for (int i = 0; i < N; i++) {
        int kl = snprintf(key, sizeof key, "spilled-%d", i);
        ck_assert_msg(kv_exists(e, key, (size_t)kl) == 0, "%s survived remove_all", key);
    }
    kv_close(e);
    free(val);
    free(buf);
    tu_rmdir(dir);
}
END_TEST

/* remove_all drops every plain key and no block; it counts what it removed. */
START_TEST(remove_all_leaves_blocks)
{
    kv_engine *e = open_kv();
    char key[32];
    for (int i = 0; i < 500; i++) {
        int kl = snprintf(key, sizeof key, "gone-%d", i);
        ck_assert_int_eq(kv_put(e, key, (size_t)kl, key, (size_t)kl), KV_OK);
    }
    uint8_t blk[4096], back[4096];
    for (int i = 0; i < 10; i++) {
        tu_fill(blk, sizeof blk, (uint64_t)i);
        ck_assert_int_eq(tu_dump1(e, tu_id(i, 0), 0, blk, sizeof blk), KV_OK);
    }
    uint64_t removed = 0;
    ck_assert_int_eq(kv_remove_all(e, &removed), KV_OK);
    ck_assert_uint_eq(removed, 500);
    for (int i = 0; i < 500; i++) {
        int kl = snprintf(key, sizeof key, "gone-%d", i);
        ck_assert_int_eq(kv_exists(e, key, (size_t)kl), 0);
    }
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_eq(st.keys, 0);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(tu_load1(e, tu_id(i, 0), 0, back, sizeof back), KV_OK);
        ck_assert(tu_check_fill(back, sizeof back, (uint64_t)i));
    }
    ck_assert_int_eq(kv_remove_all(e, &removed), KV_OK);
    ck_assert_uint_eq(removed, 0);
    ck_assert_int_eq(kv_remove_all(e, NULL), KV_OK);
    ck_assert_int_eq(kv_remove_all(NULL, &removed), KV_EINVAL);
    kv_close(e);
}
END_TEST

/* remove_prefix drops exactly the keys that begin with the prefix: not a
 * key shorter than it, not one that holds it elsewhere, not blocks. */
START_TEST(remove_prefix_takes_only_its_prefix)
{
    kv_engine *e = open_kv();
    char key[32];
    for (int i = 0; i < 300; i++) {
        int kl = snprintf(key, sizeof key, "%s-%d", i % 3 == 0 ? "t1/" : i % 3 == 1 ? "t2/" : "x-t1/", i);
        ck_assert_int_eq(kv_put(e, key, (size_t)kl, key, (size_t)kl), KV_OK);
    }
    ck_assert_int_eq(kv_put(e, "t1/", 3, "exact", 5), KV_OK);   /* the prefix itself */
    ck_assert_int_eq(kv_put(e, "t1", 2, "short", 5), KV_OK);    /* shorter than it */
    uint8_t blk[4096], back[4096];
    tu_fill(blk, sizeof blk, 3);
    ck_assert_int_eq(tu_dump1(e, tu_id(1, 0), 0, blk, sizeof blk), KV_OK);
    uint64_t removed = 0;
    ck_assert_int_eq(kv_remove_prefix(e, "t1/", 3, &removed), KV_OK);
    ck_assert_uint_eq(removed, 101);
    for (int i = 0; i < 300; i++) {
        int kl = snprintf(key, sizeof key, "%s-%d", i % 3 == 0 ? "t1/" : i % 3 == 1 ? "t2/" : "x-t1/", i);
        char buf[32];
        size_t n = 0;
        if (i % 3 == 0) {
            ck_assert_msg(kv_exists(e, key, (size_t)kl) == 0, "%s survived", key);
        } else {
            ck_assert_int_eq(kv_get(e, key, (size_t)kl, buf, sizeof buf, &n), KV_OK);
            ck_assert(n == (size_t)kl && memcmp(buf, key, n) == 0);
        }
    }
    ck_assert_int_eq(kv_exists(e, "t1/", 3), 0);
    ck_assert_int_eq(kv_exists(e, "t1", 2), 1);
    ck_assert_int_eq(tu_load1(e, tu_id(1, 0), 0, back, sizeof back), KV_OK);
    ck_assert(tu_check_fill(back, sizeof back, 3));
    ck_assert_int_eq(kv_remove_prefix(e, "t1/", 3, &removed), KV_OK);
    ck_assert_uint_eq(removed, 0);
    /* A prefix as long as a key may be, and the bad arguments. */
    char longp[KV_KEY_MAX + 1];
    memset(longp, 'z', sizeof longp);
    ck_assert_int_eq(kv_put(e, longp, KV_KEY_MAX, "v", 1), KV_OK);
    ck_assert_int_eq(kv_remove_prefix(e, longp, KV_KEY_MAX, &removed), KV_OK);
    ck_assert_uint_eq(removed, 1);
    ck_assert_int_eq(kv_remove_prefix(e, longp, KV_KEY_MAX + 1, &removed), KV_EINVAL);
    ck_assert_int_eq(kv_remove_prefix(e, NULL, 1, &removed), KV_EINVAL);
    ck_assert_int_eq(kv_remove_prefix(NULL, "t", 1, &removed), KV_EINVAL);
    ck_assert_int_eq(kv_remove_prefix(e, "t2/", 3, NULL), KV_OK);
    ck_assert_int_eq(kv_exists(e, "t2/-1", 5), 0);
    /* len 0 is remove_all: the 100 x-t1/ keys and "t1" */
    ck_assert_int_eq(kv_remove_prefix(e, NULL, 0, &removed), KV_OK);
    ck_assert_uint_eq(removed, 101);
    kv_close(e);
}
END_TEST

struct used_of { kv_block_id id; uint64_t used; int seen; };

static int find_used(void *arg, const kv_block_id *id, uint32_t index, uint64_t len,
                     uint64_t used)
{
    struct used_of *u = arg;
    (void)index;
    (void)len;
    if (memcmp(id, &u->id, sizeof *id) == 0) {
        u->used = used;
        u->seen = 1;
    }
    return 0;
}

/* The last use DRAM records for the plain key "stay" (kv__local_scan). */
static uint64_t used_of_stay(kv_engine *e)
{
    struct used_of u = { .seen = 0 };
    /* kv.c's id of a key: its XXH3-128, low half first. */
    XXH128_hash_t h = XXH3_128bits("stay", 4);
    memcpy(u.id.bytes, &h.low64, 8);
    memcpy(u.id.bytes + 8, &h.high64, 8);
    ck_assert_int_eq(kv__local_scan(e, KV_NS_KEY, find_used, &u), KV_OK);
    ck_assert(u.seen);
    return u.used;
}

/* A prefix clear looks at every key but uses none: the keys it keeps are
 * not made recently used (they would outlive fresher ones in eviction).
 * Before, each kept key's last use became the clear's time. */
START_TEST(remove_prefix_leaves_recency_alone)
{
    kv_engine *e = open_kv();
    ck_assert_int_eq(kv_put(e, "stay", 4, "v", 1), KV_OK);
    uint64_t before = used_of_stay(e);
    for (int i = 0; i < 100; i++) {
        char key[16];
        int kl = snprintf(key, sizeof key, "go/%d", i);
        ck_assert_int_eq(kv_put(e, key, (size_t)kl, "v", 1), KV_OK);
    }
    uint64_t removed = 0;
    ck_assert_int_eq(kv_remove_prefix(e, "go/", 3, &removed), KV_OK);
    ck_assert_uint_eq(removed, 100);
    ck_assert_uint_eq(used_of_stay(e), before);
    kv_close(e);
}
END_TEST

/* Keys only the SSD tier holds are matched by reading their records: the
 * prefix's keys go, the others come back byte for byte. */
START_TEST(remove_prefix_reaches_ssd)
{
    char *dir = tu_mkdtemp();
    kv_engine *e = tu_open_yamlf("pipeline: dram|ssd\n"
                                 "dram: { capacity: 4MiB, shards: 2 }\n"
                                 "ssd: { path: %s/ssd, compression: none }\n", dir);
    enum { N = 60, SZ = 200 << 10 };
    uint8_t *val = malloc(SZ), *buf = malloc(SZ);
    char key[32];
    for (int i = 0; i < N; i++) {
        int kl = snprintf(key, sizeof key, "%s%d", i % 2 ? "odd/" : "even/", i);
        tu_fill(val, SZ, (uint64_t)i);
        ck_assert_int_eq(kv_put(e, key, (size_t)kl, val, SZ), KV_OK);
    }
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_gt(st.evictions, 0);
    uint64_t removed = 0;
    ck_assert_int_eq(kv_remove_prefix(e, "odd/", 4, &removed), KV_OK);
    ck_assert_uint_eq(removed, N / 2);
    for (int i = 0; i < N; i++) {
        int kl = snprintf(key, sizeof key, "%s%d", i % 2 ? "odd/" : "even/", i);
        size_t n = 0;
        int rc = kv_get(e, key, (size_t)kl, buf, SZ, &n);
        if (i % 2) {
            ck_assert_msg(rc == KV_ENOTFOUND, "%s: %s", key, kv_strerror(rc));
        } else {
            ck_assert_msg(rc == KV_OK, "%s: %s", key, kv_strerror(rc));
            ck_assert(n == SZ && tu_check_fill(buf, SZ, (uint64_t)i));
        }
    }
    kv_close(e);
    /* And after a reopen, from the SSD tier alone. */
    e = tu_open_yamlf("pipeline: dram|ssd\n"
                      "dram: { capacity: 4MiB, shards: 2 }\n"
                      "ssd: { path: %s/ssd, compression: none }\n", dir);
    ck_assert_int_eq(kv_remove_prefix(e, "odd/", 4, &removed), KV_OK);
    ck_assert_uint_eq(removed, 0);
    ck_assert_int_eq(kv_remove_prefix(e, "even/1", 6, &removed), KV_OK);
    ck_assert_uint_eq(removed, 5);   /* even/10, 12, 14, 16, 18 */
    ck_assert_int_eq(kv_exists(e, "even/2", 6), 1);
    kv_close(e);
    free(val);
    free(buf);
    tu_rmdir(dir);
}
END_TEST

Suite *kv_suite(void)
{
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("kv");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, put_get_exists_remove);
    tcase_add_test(tc, put_replaces);
    tcase_add_test(tc, a_small_buffer_gets_enobufs_and_the_size_needed);
    tcase_add_test(tc, key_lengths_outside_1_to_250_are_refused);
    tcase_add_test(tc, keys_and_blocks_never_meet);
    tcase_add_test(tc, many_keys);
    tcase_add_test(tc, keys_spill_to_ssd_and_come_back);
    tcase_add_test(tc, remove_all_leaves_blocks);
    tcase_add_test(tc, remove_prefix_takes_only_its_prefix);
    tcase_add_test(tc, remove_prefix_reaches_ssd);
    tcase_add_test(tc, remove_prefix_leaves_recency_alone);
    suite_add_tcase(s, tc);
    return s;
}
