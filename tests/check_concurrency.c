/*
 * check_concurrency.c — several threads dumping, loading and looking up
 * shared and private blocks at once, under eviction pressure, for a
 * bounded time; every byte that comes back is checked.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define THREADS 4
#define SHARED 48
#define SZ (96u << 10)
#define RUN_MS 1500
#define MAX_OPS 20000

struct worker {
    kv_engine *e;
    int me;
    uint64_t ops, loads_ok, misses, bad_bytes, errors;
};

/* A block's bytes depend only on its id and shard, so every copy of a
 * shared block is the same and any copy that comes back can be checked. */
static uint64_t seed_of(uint64_t n, uint64_t salt, uint32_t shard)
{
    return n * 1000003u + salt * 7919u + shard;
}

static void *run(void *arg)
{
    struct worker *w = arg;
    uint8_t *src = malloc(2 * SZ), *dst = malloc(2 * SZ);
    unsigned rnd = (unsigned)w->me * 2654435761u + 1;
    uint64_t t0 = tu_now_ms();
    while (tu_now_ms() - t0 < RUN_MS && w->ops < MAX_OPS) {
        rnd = rnd * 1103515245u + 12345u;
        bool shared = (rnd >> 8) & 1;
        uint64_t n = shared ? (rnd >> 9) % SHARED : (rnd >> 9) % 200;
        uint64_t salt = shared ? 1000 : 2000 + (uint64_t)w->me;
        kv_block_id id = tu_id(n, salt);
        int op = (int)((rnd >> 20) % 3);
        w->ops++;
        if (op == 0) {                                  /* dump two shards */
            kv_iov iov[2] = { { src, SZ }, { src + SZ, SZ / 2 } };
            tu_fill(src, SZ, seed_of(n, salt, 0));
            tu_fill(src + SZ, SZ / 2, seed_of(n, salt, 1));
            kv_shard s[2] = { { id, 0, &iov[0], 1 }, { id, 1, &iov[1], 1 } };
            kv_task t;
            int rc = kv_dump(w->e, s, 2, &t);
            if (rc == KV_OK)
                rc = kv_wait(w->e, t, 0);
            if (rc != KV_OK && rc != KV_ENOSPC)
                w->errors++;
        } else if (op == 1) {                           /* load both shards */
            kv_iov iov[2] = { { dst, SZ }, { dst + SZ, SZ / 2 } };
            kv_shard s[2] = { { id, 0, &iov[0], 1 }, { id, 1, &iov[1], 1 } };
            kv_task t;
            int rc = kv_load(w->e, s, 2, &t);
            if (rc == KV_OK)
                rc = kv_wait(w->e, t, 0);
            if (rc == KV_OK) {
                w->loads_ok++;
                if (!tu_check_fill(dst, SZ, seed_of(n, salt, 0)) ||
                    !tu_check_fill(dst + SZ, SZ / 2, seed_of(n, salt, 1)))
                    w->bad_bytes++;
            } else if (rc == KV_ENOTFOUND) {
                w->misses++;
            } else {
                w->errors++;
            }
        } else {                                        /* lookup a batch */
            kv_block_id ids[16];
            uint8_t hit[16];
            for (int i = 0; i < 16; i++)
                ids[i] = tu_id((n + (uint64_t)i) % SHARED, 1000);
            if (kv_lookup(w->e, ids, 16, hit) != KV_OK)
                w->errors++;
        }
    }
    free(src);
    free(dst);
    return NULL;
}

START_TEST(threads_share_blocks_and_every_byte_is_right)
{
    /* 16 MiB holds about 100 of the 144 KiB blocks: eviction runs all the
     * time, while leases from the lookups protect some. */
    kv_engine *e = tu_open_yaml("pipeline: dram\n"
                                "dram: { capacity: 16MiB, shards: 8 }\n"
                                "eviction: { high_watermark_ratio: 0.9, ratio: 0.1, lease_ttl_ms: 5 }\n"
                                "io: { threads: 3 }\n");
    pthread_t th[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){ .e = e, .me = i };
        pthread_create(&th[i], NULL, run, &w[i]);
    }
    uint64_t ops = 0, loads = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_uint_eq(w[i].bad_bytes, 0);
        ck_assert_uint_eq(w[i].errors, 0);
        ops += w[i].ops;
        loads += w[i].loads_ok;
    }
    ck_assert_uint_gt(ops, 100);
    ck_assert_uint_gt(loads, 10);
    kv_stats st;
    ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
    ck_assert_uint_gt(st.evictions, 0);
    ck_assert_uint_le(st.dram_used, st.dram_capacity);
    ck_assert_uint_eq(st.tasks_inflight, 0);
    kv_close(e);
}
END_TEST

static void *put_get(void *arg)
{
    struct worker *w = arg;
    char key[32], val[256], buf[256];
    for (int i = 0; i < 3000; i++) {
        int kl = snprintf(key, sizeof key, "k%d", i % 50);   /* all threads share 50 keys */
        int vl = snprintf(val, sizeof val, "%s=%0*d", key, 10 + i % 100, w->me);
        if (kv_put(w->e, key, (size_t)kl, val, (size_t)vl) != KV_OK)
            w->errors++;
        size_t n;
        int rc = kv_get(w->e, key, (size_t)kl, buf, sizeof buf, &n);
        /* Whoever wrote last, the value names this key. */
        if (rc == KV_OK && (n < (size_t)kl + 1 || memcmp(buf, key, (size_t)kl) != 0 || buf[kl] != '='))
            w->bad_bytes++;
        else if (rc != KV_OK && rc != KV_ENOTFOUND)
            w->errors++;
        if (i % 7 == 0)
            kv_remove(w->e, key, (size_t)kl);
    }
    return NULL;
}

START_TEST(threads_replace_and_remove_shared_keys)
{
    kv_engine *e = tu_open_yaml("pipeline: dram\ndram: { capacity: 16MiB, shards: 4 }\n");
    pthread_t th[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){ .e = e, .me = i };
        pthread_create(&th[i], NULL, put_get, &w[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_uint_eq(w[i].bad_bytes, 0);
        ck_assert_uint_eq(w[i].errors, 0);
    }
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_le(st.keys, 50);
    kv_close(e);
}
END_TEST

Suite *concurrency_suite(void)
{
    Suite *s = suite_create("concurrency");
    TCase *tc = tcase_create("threads");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, threads_share_blocks_and_every_byte_is_right);
    tcase_add_test(tc, threads_replace_and_remove_shared_keys);
    suite_add_tcase(s, tc);
    return s;
}
