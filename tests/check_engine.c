/*
 * check_engine.c — the store semantics of DESIGN.md, one test each; and
 * the node-local store's tier policy (write-through, promotion, spill,
 * replace) proved against a heap tier that reaches it through the tier
 * interface alone (engine/tier.h), as a new tier would.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/store.h"
#include "testutil.h"

#define DRAM_ONLY "pipeline: dram\ndram: { capacity: 64MiB, shards: 4 }\nio: { threads: 2 }\n"

static kv_engine *open_dram(void) { return tu_open_yaml(DRAM_ONLY); }

START_TEST(dump_then_load_gives_the_same_bytes)
{
    kv_engine *e = open_dram();
    /* Two shards of one block, each from three tensors of odd sizes. */
    uint8_t src[2][3][1000], dst[2][3][1000];
    kv_iov in[2][3], out[2][3];
    kv_shard s[2], l[2];
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++) {
            tu_fill(src[i][k], 1000 - 100 * k, (uint64_t)(i * 3 + k));
            in[i][k] = (kv_iov){ src[i][k], 1000 - 100 * (size_t)k };
            out[i][k] = (kv_iov){ dst[i][k], 1000 - 100 * (size_t)k };
        }
        s[i] = (kv_shard){ tu_id(1, 0), (uint32_t)i, in[i], 3 };
        l[i] = (kv_shard){ tu_id(1, 0), (uint32_t)i, out[i], 3 };
    }
    kv_task t;
    ck_assert_int_eq(kv_dump(e, s, 2, &t), KV_OK);
    ck_assert_int_eq(kv_wait(e, t, 0), KV_OK);
    memset(dst, 0, sizeof dst);
    ck_assert_int_eq(kv_load(e, l, 2, &t), KV_OK);
    ck_assert_int_eq(kv_wait(e, t, 0), KV_OK);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++)
            ck_assert(tu_check_fill(dst[i][k], 1000 - 100 * (size_t)k, (uint64_t)(i * 3 + k)));
    kv_close(e);
}
END_TEST

START_TEST(handles_are_never_zero_and_never_reused)
{
    kv_engine *e = open_dram();
    uint8_t buf[64] = { 1 };
    kv_iov iov = { buf, sizeof buf };
    kv_task prev = 0;
    for (int i = 0; i < 200; i++) {
        kv_shard s = { tu_id((uint64_t)i, 1), 0, &iov, 1 };
        kv_task t = 0;
        ck_assert_int_eq(kv_dump(e, &s, 1, &t), KV_OK);
        ck_assert_uint_ne(t, 0);
        ck_assert_uint_gt(t, prev);          /* increasing, hence unique */
        prev = t;
        ck_assert_int_eq(kv_wait(e, t, 0), KV_OK);
    }
    kv_close(e);
}
END_TEST

START_TEST(wait_consumes_the_handle)
{
    kv_engine *e = open_dram();
    uint8_t buf[128];
    tu_fill(buf, sizeof buf, 7);
    kv_iov iov = { buf, sizeof buf };
    kv_shard s = { tu_id(2, 0), 0, &iov, 1 };
    kv_task t;
    ck_assert_int_eq(kv_dump(e, &s, 1, &t), KV_OK);
    ck_assert_int_eq(kv_wait(e, t, 0), KV_OK);
    int done = 0;
    ck_assert_int_eq(kv_wait(e, t, 0), KV_ENOTFOUND);
    ck_assert_int_eq(kv_check(e, t, &done), KV_ENOTFOUND);
    kv_close(e);
}
END_TEST

START_TEST(check_reports_done_without_consuming)
{
    kv_engine *e = open_dram();
    uint8_t buf[4096];
    tu_fill(buf, sizeof buf, 3);
    kv_iov iov = { buf, sizeof buf };
    kv_shard s = { tu_id(3, 0), 0, &iov, 1 };
    kv_task t;
    ck_assert_int_eq(kv_dump(e, &s, 1, &t), KV_OK);
    int done = 0, polls = 0;
    uint64_t t0 = tu_now_ms();
    while (!done && tu_now_ms() - t0 < 5000) {
        ck_assert_int_eq(kv_check(e, t, &done), KV_OK);
        polls++;
    }
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(kv_check(e, t, &done), KV_OK);   /* still there */
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(kv_wait(e, t, 0), KV_OK);
    ck_assert_int_eq(kv_check(e, t, &done), KV_ENOTFOUND);
    kv_close(e);
}
END_TEST

START_TEST(a_task_nobody_waits_for_runs_while_tasks_stream)
{
    /* Tasks waited for one after the other leave a worker on standby
     * (engine/task.c), and a small task submitted then wakes nobody. One
     * that is only polled must still be run, by that standby: kv_check
     * never runs it. */
    kv_engine *e = tu_open_yaml("pipeline: dram\ndram: { capacity: 64MiB }\nio: { threads: 2 }\n");
    enum { SZ = 64 << 10 };
    static uint8_t src[SZ], dst[SZ];
    tu_fill(src, SZ, 21);
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 50; i++)
            ck_assert_int_eq(tu_dump1(e, tu_id((uint64_t)(round * 100 + i), 61), 0, src, SZ),
                             KV_OK);
        kv_iov out = { dst, SZ };
        kv_shard s = { tu_id((uint64_t)(round * 100), 61), 0, &out, 1 };
        memset(dst, 0, SZ);
        kv_task t;
        ck_assert_int_eq(kv_load(e, &s, 1, &t), KV_OK);
        int done = 0;
        uint64_t t0 = tu_now_ms();
        while (!done && tu_now_ms() - t0 < 5000) {
            ck_assert_int_eq(kv_check(e, t, &done), KV_OK);
            usleep(50);
        }
        ck_assert_int_eq(done, 1);
        ck_assert(tu_check_fill(dst, SZ, 21));
        ck_assert_int_eq(kv_wait(e, t, 0), KV_OK);
    }
    kv_close(e);
}
END_TEST

START_TEST(unknown_handles_are_not_found)
{
    kv_engine *e = open_dram();
    int done = 0;
    ck_assert_int_eq(kv_check(e, 0, &done), KV_ENOTFOUND);
    ck_assert_int_eq(kv_check(e, 12345, &done), KV_ENOTFOUND);
    ck_assert_int_eq(kv_wait(e, 0, 0), KV_ENOTFOUND);
    ck_assert_int_eq(kv_wait(e, 999999, 10), KV_ENOTFOUND);
    kv_close(e);
}
END_TEST

START_TEST(dumping_a_present_shard_is_a_noop_success)
{
    kv_engine *e = open_dram();
    uint8_t a[256], b[256], out[256];
    tu_fill(a, sizeof a, 1);
    tu_fill(b, sizeof b, 2);
    ck_assert_int_eq(tu_dump1(e, tu_id(4, 0), 0, a, sizeof a), KV_OK);
    ck_assert_int_eq(tu_dump1(e, tu_id(4, 0), 0, b, sizeof b), KV_OK);
    ck_assert_int_eq(tu_load1(e, tu_id(4, 0), 0, out, sizeof out), KV_OK);
    ck_assert(tu_check_fill(out, sizeof out, 1));            /* no rewrite */
    kv_stats st;
    ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
    ck_assert_uint_eq(st.dram_shards, 1);
    kv_close(e);
}
END_TEST

START_TEST(loading_a_missing_shard_fails_and_leaves_it_untouched)
{
    kv_engine *e = open_dram();
    uint8_t src[512], present[512], missing[512];
    tu_fill(src, sizeof src, 9);
    ck_assert_int_eq(tu_dump1(e, tu_id(5, 0), 0, src, sizeof src), KV_OK);
    memset(present, 0xEE, sizeof present);
    memset(missing, 0xEE, sizeof missing);
    kv_iov i0 = { present, sizeof present }, i1 = { missing, sizeof missing };
    kv_shard l[2] = { { tu_id(5, 0), 0, &i0, 1 }, { tu_id(5, 0), 1, &i1, 1 } };
    kv_task t;
    ck_assert_int_eq(kv_load(e, l, 2, &t), KV_OK);
    ck_assert_int_eq(kv_wait(e, t, 0), KV_ENOTFOUND);
    ck_assert(tu_check_fill(present, sizeof present, 9));    /* the hit is copied */
    for (size_t i = 0; i < sizeof missing; i++)
        ck_assert_uint_eq(missing[i], 0xEE);
    kv_close(e);
}
END_TEST

START_TEST(any_failed_shard_fails_the_task)
{
    kv_engine *e = open_dram();
    uint8_t src[512], out[256];
    tu_fill(src, sizeof src, 1);
    ck_assert_int_eq(tu_dump1(e, tu_id(6, 0), 0, src, sizeof src), KV_OK);
    /* A destination of the wrong size is the caller's error. */
    ck_assert_int_eq(tu_load1(e, tu_id(6, 0), 0, out, sizeof out), KV_EINVAL);
    kv_close(e);
}
END_TEST

START_TEST(lookup_is_a_per_block_mask_on_shard_zero)
{
    kv_engine *e = open_dram();
    uint8_t buf[100] = { 0 };
    ck_assert_int_eq(tu_dump1(e, tu_id(10, 0), 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_dump1(e, tu_id(12, 0), 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_dump1(e, tu_id(13, 0), 1, buf, sizeof buf), KV_OK);  /* no shard 0 */
    kv_block_id ids[4] = { tu_id(10, 0), tu_id(11, 0), tu_id(12, 0), tu_id(13, 0) };
    uint8_t hit[4] = { 9, 9, 9, 9 };
    ck_assert_int_eq(kv_lookup(e, ids, 4, hit), KV_OK);
    ck_assert_uint_eq(hit[0], 1);
    ck_assert_uint_eq(hit[1], 0);
    ck_assert_uint_eq(hit[2], 1);                 /* not a prefix mask */
    ck_assert_uint_eq(hit[3], 0);
    ck_assert_int_eq(kv_lookup(e, ids, 0, hit), KV_OK);
    kv_close(e);
}
END_TEST

/* kv__dram_lookup takes a batch in chunks of 256 ids grouped by table
 * shard (engine/dram.c): every answer must still land on its own id, across
 * chunk boundaries, with repeated ids, with one table shard, with many, and
 * with more shards than a chunk has ids (no grouping). */
START_TEST(batched_lookups_answer_each_id_in_place)
{
    static const unsigned shards[] = { 1, 7, 64, 300 };
    enum { N = 1500 };
    kv_block_id *ids = malloc(N * sizeof *ids);
    uint8_t *hit = malloc(N), buf[64] = { 0 };
    ck_assert_ptr_nonnull(ids);
    ck_assert_ptr_nonnull(hit);
    for (size_t k = 0; k < KV__ARRAY_LEN(shards); k++) {
        kv_engine *e = tu_open_yamlf("pipeline: dram\ndram: { capacity: 64MiB, shards: %u }\n"
                                     "io: { threads: 2 }\n", shards[k]);
        /* Blocks 3i+1 are stored; ids are drawn from 0..999 in a scrambled
         * order, so some repeat and hits and misses interleave. */
        for (uint64_t i = 1; i < 1000; i += 3)
            ck_assert_int_eq(tu_dump1(e, tu_id(i, 5), 0, buf, sizeof buf), KV_OK);
        uint64_t want[N];
        for (size_t i = 0; i < N; i++) {
            want[i] = (i * 7919u + k) % 1000;
            ids[i] = tu_id(want[i], 5);
        }
        memset(hit, 9, N);
        ck_assert_int_eq(kv_lookup(e, ids, N, hit), KV_OK);
        for (size_t i = 0; i < N; i++)
            ck_assert_msg(hit[i] == (want[i] % 3 == 1), "shards %u: id %zu (block %llu): hit %u",
                          shards[k], i, (unsigned long long)want[i], hit[i]);
        kv_close(e);
    }
    free(ids);
    free(hit);
}
END_TEST

/* UCM's Posix store commits a block after its last shard: with
 * store.block_shards 4, shards 0..2 are a miss, the fourth makes the hit.
 * (Before store.block_shards, lookup said hit once shard 0 was in.) */
START_TEST(a_block_hits_only_once_every_shard_is_stored)
{
    kv_engine *e = tu_open_yaml(DRAM_ONLY "store: { block_shards: 4 }\n");
    uint8_t buf[100] = { 0 };
    kv_block_id ids[2] = { tu_id(20, 0), tu_id(21, 0) };
    for (uint32_t s = 0; s < 3; s++)
        ck_assert_int_eq(tu_dump1(e, ids[0], s, buf, sizeof buf), KV_OK);
    for (uint32_t s = 1; s < 4; s++)                      /* all but shard 0 */
        ck_assert_int_eq(tu_dump1(e, ids[1], s, buf, sizeof buf), KV_OK);
    uint8_t hit[2] = { 9, 9 };
    ck_assert_int_eq(kv_lookup(e, ids, 2, hit), KV_OK);
    ck_assert_uint_eq(hit[0], 0);
    ck_assert_uint_eq(hit[1], 0);
    ck_assert_int_eq(kv_lookup_prefix(e, ids, 2), -1);
    ck_assert_int_eq(tu_dump1(e, ids[0], 3, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_dump1(e, ids[1], 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(kv_lookup(e, ids, 2, hit), KV_OK);
    ck_assert_uint_eq(hit[0], 1);
    ck_assert_uint_eq(hit[1], 1);
    ck_assert_int_eq(kv_lookup_prefix(e, ids, 2), 1);
    kv_close(e);
}
END_TEST

START_TEST(block_shards_is_configured_and_checked)
{
    kv_config *cfg;
    char v[32];
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    ck_assert_int_eq(kv_config_get(cfg, "store.block_shards", v, sizeof v), KV_OK);
    ck_assert_str_eq(v, "1");
    ck_assert_int_eq(kv_config_set(cfg, "store.block_shards", "0"), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(cfg, "store.block_shards", "65537"), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(cfg, "store.block_shards", "8"), KV_OK);
    ck_assert_int_eq(kv_config_get(cfg, "store.block_shards", v, sizeof v), KV_OK);
    ck_assert_str_eq(v, "8");
    kv_config_free(cfg);
}
END_TEST

START_TEST(lookup_prefix_is_the_last_hit_of_the_leading_run)
{
    kv_engine *e = open_dram();
    uint8_t buf[100] = { 0 };
    for (uint64_t i = 0; i < 5; i++)
        if (i != 3)
            ck_assert_int_eq(tu_dump1(e, tu_id(20 + i, 0), 0, buf, sizeof buf), KV_OK);
    kv_block_id ids[5];
    for (uint64_t i = 0; i < 5; i++)
        ids[i] = tu_id(20 + i, 0);
    ck_assert_int_eq(kv_lookup_prefix(e, ids, 5), 2);
    ck_assert_int_eq(kv_lookup_prefix(e, ids, 3), 2);
    ck_assert_int_eq(kv_lookup_prefix(e, ids, 1), 0);
    ck_assert_int_eq(kv_lookup_prefix(e, ids, 0), -1);
    ck_assert_int_eq(kv_lookup_prefix(e, ids + 3, 2), -1);  /* first misses */
    kv_close(e);
}
END_TEST

struct same_args { kv_engine *e; uint64_t seed; int rc; };

static void *dump_same(void *arg)
{
    struct same_args *a = arg;
    static uint8_t buf[2][1 << 20];
    uint8_t *b = buf[a->seed];
    tu_fill(b, sizeof buf[0], 77);              /* both copies are equal */
    a->rc = tu_dump1(a->e, tu_id(30, 0), 0, b, sizeof buf[0]);
    return NULL;
}

START_TEST(two_dumps_of_one_shard_both_succeed_and_one_copy_is_kept)
{
    kv_engine *e = open_dram();
    for (int round = 0; round < 20; round++) {
        pthread_t th[2];
        struct same_args a[2] = { { e, 0, -100 }, { e, 1, -100 } };
        for (int i = 0; i < 2; i++)
            pthread_create(&th[i], NULL, dump_same, &a[i]);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        ck_assert_int_eq(a[0].rc, KV_OK);
        ck_assert_int_eq(a[1].rc, KV_OK);
    }
    kv_stats st;
    kv_stats_get(e, &st);
    ck_assert_uint_eq(st.dram_shards, 1);
    ck_assert_uint_le(st.dram_used, (2u << 20));
    kv_close(e);
}
END_TEST

START_TEST(wait_timeout_cancels_and_drains)
{
    /* One worker, busy for well over 100 ms copying 4 GiB (one 1 MiB shard
     * loaded 4096 times): the dump queued behind it cannot start before the
     * 1 ms deadline, so it is cancelled and stores nothing. */
    kv_engine *e = tu_open_yaml("pipeline: dram\ndram: { capacity: 64MiB }\nio: { threads: 1 }\n");
    enum { N = 4096, SZ = 1 << 20 };
    uint8_t *src = malloc(SZ), *dst = malloc(SZ);
    tu_fill(src, SZ, 5);
    ck_assert_int_eq(tu_dump1(e, tu_id(1, 40), 0, src, SZ), KV_OK);
    kv_iov out = { dst, SZ }, in = { src, SZ };
    kv_shard *l = malloc(N * sizeof *l);
    for (int i = 0; i < N; i++)
        l[i] = (kv_shard){ tu_id(1, 40), 0, &out, 1 };
    kv_task t1, t2;
    ck_assert_int_eq(kv_load(e, l, N, &t1), KV_OK);
    kv_shard late = { tu_id(999, 40), 0, &in, 1 };
    ck_assert_int_eq(kv_dump(e, &late, 1, &t2), KV_OK);
    ck_assert_int_eq(kv_wait(e, t2, 1), KV_ETIMEDOUT);
    ck_assert_int_eq(kv_wait(e, t2, 0), KV_ENOTFOUND);     /* consumed */
    ck_assert_int_eq(kv_wait(e, t1, 0), KV_OK);
    ck_assert(tu_check_fill(dst, SZ, 5));
    uint8_t hit = 1;
    ck_assert_int_eq(kv_lookup(e, &late.block, 1, &hit), KV_OK);
    ck_assert_uint_eq(hit, 0);                             /* cancelled */
    kv_close(e);
    free(l);
    free(src);
    free(dst);
}
END_TEST

START_TEST(io_timeout_fails_tasks_that_cannot_start_in_time)
{
    /* One worker and a 20 ms deadline. The first task copies 4 GiB (one
     * 1 MiB shard loaded 4096 times): its second half cannot start in time,
     * and neither can the task queued behind it — whether the worker woke
     * at once or late. */
    kv_engine *e = tu_open_yaml("pipeline: dram\ndram: { capacity: 64MiB }\n"
                                "io: { threads: 1, timeout_ms: 20 }\n");
    enum { N = 4096, SZ = 1 << 20 };
    uint8_t *src = malloc(SZ), *dst = malloc(SZ);
    tu_fill(src, SZ, 5);
    ck_assert_int_eq(tu_dump1(e, tu_id(1, 41), 0, src, SZ), KV_OK);
    kv_iov out = { dst, SZ };
    kv_shard *l = malloc(N * sizeof *l);
    for (int i = 0; i < N; i++)
        l[i] = (kv_shard){ tu_id(1, 41), 0, &out, 1 };
    kv_task t1, t2;
    ck_assert_int_eq(kv_load(e, l, N, &t1), KV_OK);
    kv_iov in = { src, SZ };
    kv_shard late = { tu_id(999, 41), 0, &in, 1 };
    ck_assert_int_eq(kv_dump(e, &late, 1, &t2), KV_OK);
    usleep(30 * 1000);     /* a waiter runs its own task: only after the deadline */
    ck_assert_int_eq(kv_wait(e, t2, 0), KV_ETIMEDOUT);
    ck_assert_int_eq(kv_wait(e, t1, 0), KV_ETIMEDOUT);
    uint8_t hit = 1;
    ck_assert_int_eq(kv_lookup(e, &late.block, 1, &hit), KV_OK);
    ck_assert_uint_eq(hit, 0);
    kv_close(e);
    free(l);
    free(src);
    free(dst);
}
END_TEST

START_TEST(a_pure_cluster_client_opens_no_ssd_tier)
{
    /* dram.capacity 0 in a cluster stores nothing locally. The master is a
     * closed port, so the open fails, but only after the tiers are set up:
     * no SSD directory may have been created by then. */
    char *dir = tu_mkdtemp();
    char yaml[1024], path[512];
    snprintf(path, sizeof path, "%s/ssd", dir);
    snprintf(yaml, sizeof yaml,
             "pipeline: dram|ssd\ndram: { capacity: 0 }\nssd: { path: %s }\n"
             "cluster: { enabled: true, master: 127.0.0.1:1, protocol: tcp }\n", path);
    kv_config *cfg;
    char err[256];
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    ck_assert_int_eq(kv_config_parse(cfg, yaml, strlen(yaml), err, sizeof err), KV_OK);
    kv_engine *e = (kv_engine *)1;
    ck_assert_int_eq(kv_open(cfg, &e), KV_ENET);
    ck_assert_ptr_null(e);
    ck_assert_int_ne(access(path, F_OK), 0);
    kv_config_free(cfg);
    tu_rmdir(dir);
}
END_TEST

START_TEST(bad_arguments_are_einval)
{
    kv_engine *e = open_dram();
    uint8_t buf[16];
    kv_iov iov = { buf, sizeof buf };
    kv_shard s = { tu_id(1, 0), 0, &iov, 1 };
    kv_task t = 77;
    ck_assert_int_eq(kv_dump(e, NULL, 1, &t), KV_EINVAL);
    ck_assert_uint_eq(t, 0);
    ck_assert_int_eq(kv_dump(e, &s, 0, &t), KV_EINVAL);
    ck_assert_int_eq(kv_dump(e, &s, 1, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_dump(NULL, &s, 1, &t), KV_EINVAL);
    kv_shard noiov = { tu_id(1, 0), 0, NULL, 2 };
    ck_assert_int_eq(kv_dump(e, &noiov, 1, &t), KV_EINVAL);
    kv_iov nullbase = { NULL, 10 };
    kv_shard nb = { tu_id(1, 0), 0, &nullbase, 1 };
    ck_assert_int_eq(kv_load(e, &nb, 1, &t), KV_EINVAL);
    kv_iov huge[2] = { { buf, KV_VALUE_MAX }, { buf, 64 } };
    kv_shard big = { tu_id(1, 0), 0, huge, 2 };
    ck_assert_int_eq(kv_dump(e, &big, 1, &t), KV_EINVAL);
    uint8_t hit;
    ck_assert_int_eq(kv_lookup(e, NULL, 1, &hit), KV_EINVAL);
    ck_assert_int_eq(kv_lookup(e, &s.block, 1, NULL), KV_EINVAL);
    ck_assert_int_lt(kv_lookup_prefix(e, NULL, 1), -1);
    ck_assert_int_eq(kv_check(e, 1, NULL), KV_EINVAL);
    ck_assert_int_eq(kv_stats_get(e, NULL), KV_EINVAL);
    kv_engine *none = (kv_engine *)1;
    ck_assert_int_eq(kv_open(NULL, &none), KV_EINVAL);
    ck_assert_ptr_null(none);
    kv_close(NULL);
    kv_close(e);
}
END_TEST

START_TEST(close_finishes_tasks_in_flight)
{
    kv_engine *e = open_dram();
    enum { N = 64, SZ = 64 << 10 };
    static uint8_t src[SZ], dst[N][SZ];
    tu_fill(src, SZ, 11);
    kv_iov in = { src, SZ };
    kv_task t;
    for (int i = 0; i < N; i++) {
        kv_shard s = { tu_id((uint64_t)i, 50), 0, &in, 1 };
        ck_assert_int_eq(kv_dump(e, &s, 1, &t), KV_OK);
        ck_assert_int_eq(kv_wait(e, t, 0), KV_OK);
    }
    /* Loads in flight, never waited for: close must finish them. */
    kv_iov out[N];
    for (int i = 0; i < N; i++) {
        out[i] = (kv_iov){ dst[i], SZ };
        kv_shard l = { tu_id((uint64_t)i, 50), 0, &out[i], 1 };
        ck_assert_int_eq(kv_load(e, &l, 1, &t), KV_OK);
    }
    kv_close(e);
    for (int i = 0; i < N; i++)
        ck_assert(tu_check_fill(dst[i], SZ, 11));
}
END_TEST

START_TEST(stats_count_what_is_stored)
{
    kv_engine *e = open_dram();
    uint8_t buf[10000];
    tu_fill(buf, sizeof buf, 1);
    for (uint64_t i = 0; i < 1000; i++)
        ck_assert_int_eq(tu_dump1(e, tu_id(i, 60), 0, buf, 1000 + (i % 7)), KV_OK);
    kv_stats st;
    ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
    ck_assert_uint_eq(st.dram_capacity, 64u << 20);
    ck_assert_uint_eq(st.dram_blocks, 1000);
    ck_assert_uint_eq(st.dram_shards, 1000);
    ck_assert_uint_ge(st.dram_used, 1000 * 1000);
    ck_assert_uint_eq(st.dumps_ok, 1000);
    /* The index goal: at most 64 bytes per stored shard (a 48-byte entry
     * and 8-16 bytes of bucket array). */
    ck_assert_uint_le(st.dram_index_bytes / st.dram_shards, 64);
    ck_assert_uint_gt(st.open_ns, 0);
    ck_assert_uint_eq(st.tasks_inflight, 0);
    kv_close(e);
}
END_TEST

START_TEST(debug_lines_follow_the_seed_shape)
{
    char path[] = "/tmp/kvlogXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    int saved = dup(2);
    dup2(fd, 2);
    kv_engine *e = tu_open_yaml(DRAM_ONLY "log: { level: debug }\n");
    uint8_t buf[100] = { 0 }, out[100];
    tu_dump1(e, tu_id(1, 70), 0, buf, sizeof buf);
    tu_load1(e, tu_id(2, 70), 0, out, sizeof out);
    kv_close(e);
    fflush(stderr);
    dup2(saved, 2);
    char text[8192] = "";
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    unlink(path);
    ck_assert_int_gt(n, 0);
    ck_assert_msg(strstr(text, "task(1) dump done, shards=1,") != NULL, "log: %s", text);
    ck_assert_msg(strstr(text, "task(2) load shards(1, miss=1), wait=") != NULL, "log: %s", text);
    ck_assert_msg(strstr(text, "ms, cost=") != NULL, "log: %s", text);
}
END_TEST


/* ---- a heap tier, through engine/tier.h only ---------------------------- */

struct ment {
    int ns;
    kv_block_id id;
    uint32_t index;
    uint64_t len;
    uint8_t *data;
};

/* One per test process (Check forks each test). */
static struct {
    pthread_mutex_t mu;
    struct ment ent[256];
    size_t n;
    unsigned writes, reads, removes;
    int remove_rc;                 /* nonzero: remove fails with it */
    bool write_through, promote;
} mt = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* The entry for (ns, id, index), or NULL; mt.mu held. */
static struct ment *mt_find(int ns, const kv_block_id *id, uint32_t index)
{
    for (size_t i = 0; i < mt.n; i++)
        if (mt.ent[i].ns == ns && mt.ent[i].index == index &&
            memcmp(&mt.ent[i].id, id, sizeof *id) == 0)
            return &mt.ent[i];
    return NULL;
}

static int mt_open(const struct kv_config *cfg, struct kv__tier *t, char *err, size_t errlen)
{
    t->ctx = &mt;
    t->write_through = mt.write_through;
    t->promote = mt.promote;
    return KV_OK;
}

static void mt_close(void *c)
{
    for (size_t i = 0; i < mt.n; i++)
        free(mt.ent[i].data);
    mt.n = 0;
}

static bool mt_contains(void *c, int ns, const kv_block_id *id, uint32_t x)
{
    pthread_mutex_lock(&mt.mu);
    bool hit = mt_find(ns, id, x) != NULL;
    pthread_mutex_unlock(&mt.mu);
    return hit;
}

static int mt_size(void *c, int ns, const kv_block_id *id, uint32_t x, uint64_t *len)
{
    pthread_mutex_lock(&mt.mu);
    struct ment *m = mt_find(ns, id, x);
    if (m)
        *len = m->len;
    pthread_mutex_unlock(&mt.mu);
    return m ? KV_OK : KV_ENOTFOUND;
}

static int mt_read(void *c, int ns, const kv_block_id *id, uint32_t x, const kv_iov *iov,
                   uint32_t n)
{
    pthread_mutex_lock(&mt.mu);
    struct ment *m = mt_find(ns, id, x);
    int rc = !m ? KV_ENOTFOUND : m->len != kv__iov_len(iov, n) ? KV_EINVAL : KV_OK;
    if (rc == KV_OK) {
        kv__iov_scatter(iov, n, m->data);
        mt.reads++;
    }
    pthread_mutex_unlock(&mt.mu);
    return rc;
}

static int mt_write(void *c, int ns, const kv_block_id *id, uint32_t x, const kv_iov *iov,
                    uint32_t n)
{
    pthread_mutex_lock(&mt.mu);
    int rc = KV_OK;
    if (!mt_find(ns, id, x)) {
        uint64_t len = kv__iov_len(iov, n);
        struct ment *m = &mt.ent[mt.n];
        if (mt.n == KV__ARRAY_LEN(mt.ent) || !(m->data = malloc(len ? len : 1))) {
            rc = KV_ENOSPC;
        } else {
            *m = (struct ment){ ns, *id, x, len, m->data };
            kv__iov_gather(m->data, iov, n);
            mt.n++;
            mt.writes++;
        }
    }
    pthread_mutex_unlock(&mt.mu);
    return rc;
}

static int mt_remove(void *c, int ns, const kv_block_id *id, uint32_t x)
{
    pthread_mutex_lock(&mt.mu);
    struct ment *m = mt_find(ns, id, x);
    int rc = !m ? KV_ENOTFOUND : mt.remove_rc ? mt.remove_rc : KV_OK;
    if (rc == KV_OK) {
        free(m->data);
        *m = mt.ent[--mt.n];
        mt.removes++;
    }
    pthread_mutex_unlock(&mt.mu);
    return rc;
}

static size_t mt_block_shards(void *c, int ns, const kv_block_id *id, uint32_t *idx, size_t cap)
{
    size_t k = 0;
    pthread_mutex_lock(&mt.mu);
    for (size_t i = 0; i < mt.n; i++)
        if (mt.ent[i].ns == ns && memcmp(&mt.ent[i].id, id, sizeof *id) == 0 && k++ < cap)
            idx[k - 1] = mt.ent[i].index;
    pthread_mutex_unlock(&mt.mu);
    return k;
}

/* The heap tier has no figures of its own to add. */
static void mt_stats(void *c, kv_stats *out) {}

/* No sink and no write_many: the store must spill and batch through write. */
static const struct kv__tier_ops mem_tier = {
    .name = "mem", .open = mt_open, .close = mt_close, .contains = mt_contains,
    .size = mt_size, .read = mt_read, .write = mt_write, .remove = mt_remove,
    .block_shards = mt_block_shards, .stats = mt_stats,
};

/* A DRAM engine with the heap tier attached below DRAM. */
static kv_engine *open_tiered(const char *dram, bool write_through, bool promote)
{
    mt.writes = mt.reads = mt.removes = 0;
    mt.remove_rc = 0;
    mt.write_through = write_through;
    mt.promote = promote;
    kv_engine *e = tu_open_yamlf("pipeline: dram\ndram: { capacity: %s, shards: 4 }\n"
                                 "io: { threads: 2 }\n", dram);
    char err[256] = "";
    ck_assert_msg(kv__store_attach(e, &mem_tier, err, sizeof err) == KV_OK, "attach: %s", err);
    ck_assert_uint_eq(kv__store_depth(e), 1);
    ck_assert_ptr_eq(kv__store_tier(e, "mem")->ops, &mem_tier);
    return e;
}

/* A block whose shards sit in different tiers is complete too: shards 0
 * and 1 in DRAM, 2 and 3 only in the tier below. */
START_TEST(a_complete_block_may_span_the_tiers)
{
    mt.writes = mt.reads = mt.removes = 0;
    mt.remove_rc = 0;
    mt.write_through = mt.promote = false;
    kv_engine *e = tu_open_yaml(DRAM_ONLY "store: { block_shards: 4 }\n");
    char err[256] = "";
    ck_assert_msg(kv__store_attach(e, &mem_tier, err, sizeof err) == KV_OK, "attach: %s", err);
    uint8_t buf[300] = { 0 };
    kv_iov iov = { buf, sizeof buf };
    kv_block_id id = tu_id(3, 81);
    ck_assert_int_eq(tu_dump1(e, id, 0, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(tu_dump1(e, id, 1, buf, sizeof buf), KV_OK);
    ck_assert_int_eq(mt_write(NULL, KV_NS_BLOCK, &id, 2, &iov, 1), KV_OK);
    uint8_t hit = 9;
    ck_assert_int_eq(kv_lookup(e, &id, 1, &hit), KV_OK);
    ck_assert_uint_eq(hit, 0);
    ck_assert_int_eq(mt_write(NULL, KV_NS_BLOCK, &id, 3, &iov, 1), KV_OK);
    ck_assert_int_eq(kv_lookup(e, &id, 1, &hit), KV_OK);
    ck_assert_uint_eq(hit, 1);
    kv_close(e);
}
END_TEST

START_TEST(the_tier_table_names_the_ssd_tier)
{
    ck_assert_ptr_eq(kv__tier_find("ssd"), &kv__ssd_tier);
    ck_assert_ptr_eq(kv__tier_at(0), &kv__ssd_tier);
    ck_assert_ptr_null(kv__tier_find("mem"));
    /* A DRAM-only pipeline opens no tier: the kv_ssd_* calls have none. */
    kv_engine *e = open_dram();
    ck_assert_uint_eq(kv__store_depth(e), 0);
    ck_assert_int_eq(kv_ssd_compact(e), KV_ENOTSUP);
    kv_close(e);
}
END_TEST

START_TEST(a_dump_writes_through_only_when_the_tier_asks)
{
    uint8_t buf[3000], out[3000];
    tu_fill(buf, sizeof buf, 7);
    for (int wt = 0; wt < 2; wt++) {
        kv_engine *e = open_tiered("16MiB", wt, false);
        kv_block_id id = tu_id(1, 80);
        ck_assert_int_eq(tu_dump1(e, id, 0, buf, sizeof buf), KV_OK);
        ck_assert_uint_eq(mt.writes, (unsigned)wt);
        ck_assert_int_eq(mt_contains(NULL, KV_NS_BLOCK, &id, 0), wt);
        /* A shard held anywhere is never rewritten. */
        ck_assert_int_eq(tu_dump1(e, id, 0, buf, sizeof buf), KV_OK);
        ck_assert_uint_eq(mt.writes, (unsigned)wt);
        ck_assert_int_eq(tu_load1(e, id, 0, out, sizeof out), KV_OK);
        ck_assert_mem_eq(out, buf, sizeof buf);
        kv_close(e);
    }
}
END_TEST

START_TEST(a_read_served_below_is_promoted_only_when_the_tier_asks)
{
    uint8_t buf[5000], out[5000];
    tu_fill(buf, sizeof buf, 8);
    for (int pr = 0; pr < 2; pr++) {
        kv_engine *e = open_tiered("16MiB", false, pr);
        kv_block_id id = tu_id(2, 80);
        kv_iov iov = { buf, sizeof buf };
        ck_assert_int_eq(mt_write(NULL, KV_NS_BLOCK, &id, 3, &iov, 1), KV_OK);
        uint8_t hit = 0;
        ck_assert_int_eq(kv_lookup(e, &id, 1, &hit), KV_OK);
        ck_assert_int_eq(hit, 0);                 /* lookup is shard 0 */
        memset(out, 0, sizeof out);
        ck_assert_int_eq(tu_load1(e, id, 3, out, sizeof out), KV_OK);
        ck_assert_mem_eq(out, buf, sizeof buf);
        kv_stats st;
        ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
        ck_assert_uint_eq(st.hits_ssd, 1);
        ck_assert_uint_eq(st.hits_dram, 0);
        ck_assert_uint_eq(st.promotions, (unsigned)pr);
        ck_assert_uint_eq(st.dram_shards, (unsigned)pr);
        /* The second read comes from DRAM only if it was promoted. */
        ck_assert_int_eq(tu_load1(e, id, 3, out, sizeof out), KV_OK);
        ck_assert_uint_eq(mt.reads, (pr ? 1u : 2u));
        /* Prefetch stages what the tier holds into DRAM (shard 4 too). */
        ck_assert_int_eq(mt_write(NULL, KV_NS_BLOCK, &id, 4, &iov, 1), KV_OK);
        ck_assert_int_eq(kv_prefetch(e, &id, 1), KV_OK);
        for (int i = 0; i < 200 && (kv_stats_get(e, &st), st.dram_shards < 2); i++)
            usleep(5000);
        ck_assert_uint_eq(st.dram_shards, 2);
        kv_close(e);
    }
}
END_TEST

START_TEST(dram_victims_spill_into_the_tier_below)
{
    /* 24 blocks of 512 KiB into 4 MiB of DRAM: most are evicted, and each
     * victim must land in the tier (through its write op: it has no sink). */
    enum { N = 24, LEN = 512 << 10 };
    kv_engine *e = open_tiered("4MiB", false, false);
    uint8_t *buf = malloc(LEN), *out = malloc(LEN);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(out);
    for (uint64_t i = 0; i < N; i++) {
        tu_fill(buf, LEN, 100 + i);
        ck_assert_int_eq(tu_dump1(e, tu_id(i, 81), 0, buf, LEN), KV_OK);
    }
    kv_stats st;
    ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
    ck_assert_uint_gt(st.evictions, N / 2);
    ck_assert_uint_eq(mt.writes, st.evictions);
    for (uint64_t i = 0; i < N; i++) {
        tu_fill(buf, LEN, 100 + i);
        memset(out, 0, LEN);
        ck_assert_int_eq(tu_load1(e, tu_id(i, 81), 0, out, LEN), KV_OK);
        ck_assert_mem_eq(out, buf, LEN);
    }
    ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
    ck_assert_uint_eq(st.misses, 0);
    ck_assert_uint_gt(st.hits_ssd, 0);
    kv_close(e);
    free(buf);
    free(out);
}
END_TEST

START_TEST(a_put_fails_when_a_tier_cannot_drop_the_older_copy)
{
    kv_engine *e = open_tiered("16MiB", true, false);
    char v[16];
    size_t vl = 0;
    ck_assert_int_eq(kv_put(e, "k", 1, "old", 3), KV_OK);
    ck_assert_uint_eq(mt.writes, 1);              /* written through */
    mt.remove_rc = KV_ENOSPC;
    ck_assert_int_eq(kv_put(e, "k", 1, "newer", 5), KV_ENOSPC);
    /* Not acknowledged, so nothing newer is visible: the old value is what
     * a read (and a restart) finds. */
    ck_assert_int_eq(kv_get(e, "k", 1, v, sizeof v, &vl), KV_OK);
    ck_assert_uint_eq(vl, 3);
    ck_assert_mem_eq(v, "old", 3);
    mt.remove_rc = 0;
    ck_assert_int_eq(kv_put(e, "k", 1, "newer", 5), KV_OK);
    ck_assert_int_eq(kv_get(e, "k", 1, v, sizeof v, &vl), KV_OK);
    ck_assert_uint_eq(vl, 5);
    ck_assert_mem_eq(v, "newer", 5);
    ck_assert_uint_eq(mt.n, 1);                   /* one copy below, the new one */
    ck_assert_int_eq(kv_remove(e, "k", 1), KV_OK);
    ck_assert_uint_eq(mt.n, 0);
    ck_assert_int_eq(kv_exists(e, "k", 1), 0);
    kv_close(e);
}
END_TEST

Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("semantics");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, dump_then_load_gives_the_same_bytes);
    tcase_add_test(tc, handles_are_never_zero_and_never_reused);
    tcase_add_test(tc, wait_consumes_the_handle);
    tcase_add_test(tc, check_reports_done_without_consuming);
    tcase_add_test(tc, a_task_nobody_waits_for_runs_while_tasks_stream);
    tcase_add_test(tc, unknown_handles_are_not_found);
    tcase_add_test(tc, dumping_a_present_shard_is_a_noop_success);
    tcase_add_test(tc, loading_a_missing_shard_fails_and_leaves_it_untouched);
    tcase_add_test(tc, any_failed_shard_fails_the_task);
    tcase_add_test(tc, lookup_is_a_per_block_mask_on_shard_zero);
    tcase_add_test(tc, batched_lookups_answer_each_id_in_place);
    tcase_add_test(tc, lookup_prefix_is_the_last_hit_of_the_leading_run);
    tcase_add_test(tc, a_block_hits_only_once_every_shard_is_stored);
    tcase_add_test(tc, block_shards_is_configured_and_checked);
    tcase_add_test(tc, two_dumps_of_one_shard_both_succeed_and_one_copy_is_kept);
    tcase_add_test(tc, wait_timeout_cancels_and_drains);
    tcase_add_test(tc, io_timeout_fails_tasks_that_cannot_start_in_time);
    tcase_add_test(tc, a_pure_cluster_client_opens_no_ssd_tier);
    tcase_add_test(tc, bad_arguments_are_einval);
    tcase_add_test(tc, close_finishes_tasks_in_flight);
    tcase_add_test(tc, stats_count_what_is_stored);
    tcase_add_test(tc, debug_lines_follow_the_seed_shape);
    suite_add_tcase(s, tc);
    tc = tcase_create("tiers");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, the_tier_table_names_the_ssd_tier);
    tcase_add_test(tc, a_dump_writes_through_only_when_the_tier_asks);
    tcase_add_test(tc, a_read_served_below_is_promoted_only_when_the_tier_asks);
    tcase_add_test(tc, dram_victims_spill_into_the_tier_below);
    tcase_add_test(tc, a_complete_block_may_span_the_tiers);
    tcase_add_test(tc, a_put_fails_when_a_tier_cannot_drop_the_older_copy);
    suite_add_tcase(s, tc);
    return s;
}
