/*
 * check_host.c — one store per host, with real processes: sharing by
 * ssd.path and by store.name, the DRAM budget counted once, clients
 * SIGKILLed mid-load, the server SIGKILLed (takeover), another uid, and a
 * client that tries to write the segment.
 *
 * Every test has its own store.dir under its temp directory. Children are
 * forked BEFORE the parent opens anything (a child would inherit a
 * serving parent's lock) and report through their exit status; pipes
 * order them.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "testutil_kvctl.h"
#include "engine/host.h"   /* kv__host_requests: the server's round trips, counted */
#include "engine/internal.h"
#include "net/auth.h"
#include "net/dir.h"       /* the directory, on its own */
#include "net/sock.h"
#include "net/shm.h"       /* the hello, spoken by hand to a peer of another version */
#include "persist/ssd_int.h" /* the value log's layout, to damage records behind a server */
#include <dirent.h>

/* ---- helpers -------------------------------------------------------------- */

static kv_engine *open_cfg(const char *yaml, int *rc)
{
    kv_config *cfg = NULL;
    char err[512] = "";
    kv_engine *e = NULL;
    if (kv_config_new(&cfg) != KV_OK)
        return NULL;
    *rc = kv_config_parse(cfg, yaml, strlen(yaml), err, sizeof err);
    if (*rc == KV_OK)
        *rc = kv_open(cfg, &e);
    kv_config_free(cfg);
    return e;
}

static kv_stats stats(kv_engine *e)
{
    kv_stats st;
    memset(&st, 0, sizeof st);
    ck_assert_int_eq(kv_stats_get(e, &st), KV_OK);
    return st;
}

/* A child that runs fn(arg) and exits with its result (0 = all good). It
 * dies with the test process. */
static pid_t child(int (*fn)(void *, int), void *arg, int k)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(fn(arg, k));
    }
    return pid;
}

static int reap(pid_t pid)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static void wait_byte(int fd)
{
    char c;
    while (read(fd, &c, 1) < 0 && errno == EINTR) {
    }
}

static void send_bytes(int fd, int n)
{
    for (int i = 0; i < n; i++)
        if (write(fd, "x", 1) != 1)
            break;
}

/* RSS of this process in bytes (VmRSS). */
static uint64_t rss_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    size_t fl = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':')
            sscanf(line + fl + 1, "%llu", &kb);
    if (f)
        fclose(f);
    return (uint64_t)kb * 1024;
}

/* The world of one test: a temp dir, the YAML every process opens. */
struct world {
    char *dir;
    char yaml[1024];
    int go[2], done[2];      /* parent -> children, children -> parent */
    int go2[2];              /* parent -> children, the second step (a byte on go
                              * must never be taken for it) */
};

static void world_new(struct world *w, const char *fmt)
{
    w->dir = tu_mkdtemp();
    /* fmt takes the dir twice (ssd.path's and store.dir's, or unused) */
    snprintf(w->yaml, sizeof w->yaml, fmt, w->dir, w->dir);
    ck_assert_int_eq(pipe(w->go), 0);
    ck_assert_int_eq(pipe(w->done), 0);
    ck_assert_int_eq(pipe(w->go2), 0);
}

static void world_free(struct world *w)
{
    close(w->go[0]);
    close(w->go[1]);
    close(w->done[0]);
    close(w->done[1]);
    close(w->go2[0]);
    close(w->go2[1]);
    tu_rmdir(w->dir);
}

#define SSD_YAML                                                                \
    "pipeline: dram|ssd\n"                                                       \
    "dram: {capacity: 64MiB, hugepages: off}\n"                                  \
    "ssd: {path: \"%s/ssd\", compression: none}\n"                               \
    "store: {dir: \"%s/rv\"}\n"                                                  \
    "io: {threads: 2}\n"
#define NAME_YAML                                                               \
    "pipeline: dram\n"                                                           \
    "dram: {capacity: 64MiB, hugepages: off}\n"                                  \
    "store: {name: \"host-test\", dir: \"%s/rv\"}\n"                             \
    "io: {threads: 2}\n"

enum { BLK = 200000 };   /* not a power of two: offsets and lengths are odd */

static int dump_one(kv_engine *e, uint64_t n, size_t len)
{
    uint8_t *b = malloc(len);
    tu_fill(b, len, n);
    int rc = tu_dump1(e, tu_id(n, 16), 0, b, len);
    free(b);
    return rc;
}

/* 0 when block n loads as dumped; else the error (or 99 for wrong bytes). */
static int load_one(kv_engine *e, uint64_t n, size_t len)
{
    uint8_t *b = malloc(len);
    memset(b, 0xee, len);
    int rc = tu_load1(e, tu_id(n, 16), 0, b, len);
    if (rc == KV_OK && !tu_check_fill(b, len, n))
        rc = 99;
    free(b);
    return rc;
}

static int key_check(kv_engine *e, const char *key, const char *want)
{
    char buf[64];
    size_t vl = 0;
    int rc = kv_get(e, key, strlen(key), buf, sizeof buf, &vl);
    if (rc != KV_OK)
        return rc;
    return vl == strlen(want) && memcmp(buf, want, vl) == 0 ? 0 : 98;
}

/* ---- sharing -------------------------------------------------------------------- */

/* Child k: attaches, dumps block 100+k and key "c<k>", tells the parent,
 * waits, then checks the parent's block 1 / key "p" and every other
 * child's (nchildren in the yaml world's arg). */
struct share_arg {
    struct world *w;
    int nchildren;
};

static int share_child(void *arg, int k)
{
    struct share_arg *a = arg;
    wait_byte(a->w->go[0]);   /* the parent serves now */
    int rc, bad = 0;
    kv_engine *e = open_cfg(a->w->yaml, &rc);
    kv_stats st;
    char key[16], val[16];
    snprintf(key, sizeof key, "c%d", k);
    snprintf(val, sizeof val, "v%d", k);
    if (!e)
        bad = 10;
    else if (kv_stats_get(e, &st) != KV_OK || st.host_attached != 1)
        bad = 11;
    else if ((rc = dump_one(e, 100 + (uint64_t)k, BLK)) != KV_OK ||
             (rc = kv_put(e, key, strlen(key), val, strlen(val))) != KV_OK)
        bad = 12;
    if (bad)
        fprintf(stderr, "child %d: step %d: %s\n", k, bad, kv_strerror(rc));
    send_bytes(a->w->done[1], 1);
    if (bad)
        return bad;
    wait_byte(a->w->go2[0]);   /* everyone has dumped */
    if (load_one(e, 1, BLK) != 0 || key_check(e, "p", "parent") != 0)
        return 13;
    for (int j = 0; j < a->nchildren; j++) {
        snprintf(key, sizeof key, "c%d", j);
        snprintf(val, sizeof val, "v%d", j);
        if (load_one(e, 100 + (uint64_t)j, BLK) != 0 || key_check(e, key, val) != 0)
            return 14;
        uint8_t hit = 0;
        kv_block_id id = tu_id(100 + (uint64_t)j, 16);
        if (kv_lookup(e, &id, 1, &hit) != KV_OK || !hit)
            return 15;
    }
    if (kv_exists(e, "p", 1) != 1)
        return 16;
    kv_close(e);
    return 0;
}

static void share(const char *fmt, int nchildren)
{
    struct world w;
    world_new(&w, fmt);
    struct share_arg a = { &w, nchildren };
    pid_t pids[8];
    for (int k = 0; k < nchildren; k++)
        pids[k] = child(share_child, &a, k);
    kv_engine *e = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(e).host_attached, 0);
    ck_assert_int_eq(dump_one(e, 1, BLK), KV_OK);
    ck_assert_int_eq(kv_put(e, "p", 1, "parent", 6), KV_OK);
    send_bytes(w.go[1], nchildren);
    for (int k = 0; k < nchildren; k++)
        wait_byte(w.done[0]);
    send_bytes(w.go2[1], nchildren);
    for (int k = 0; k < nchildren; k++) {
        int rc = reap(pids[k]);
        ck_assert_msg(rc == 0, "child %d exited %d", k, rc);
    }
    /* and the other way: what the children wrote, the server reads */
    for (int k = 0; k < nchildren; k++) {
        char key[16], val[16];
        snprintf(key, sizeof key, "c%d", k);
        snprintf(val, sizeof val, "v%d", k);
        ck_assert_int_eq(load_one(e, 100 + (uint64_t)k, BLK), 0);
        ck_assert_int_eq(key_check(e, key, val), 0);
    }
    kv_stats st = stats(e);
    ck_assert_uint_eq(st.dram_blocks, 1 + (uint64_t)nchildren);
    ck_assert_uint_eq(st.host_pins, 0);
    kv_close(e);
    world_free(&w);
}

START_TEST(two_processes_share_by_ssd_path) { share(SSD_YAML, 1); }
END_TEST
START_TEST(two_processes_share_by_store_name) { share(NAME_YAML, 1); }
END_TEST
START_TEST(eight_processes_share_by_ssd_path) { share(SSD_YAML, 8); }
END_TEST
START_TEST(eight_processes_share_by_store_name) { share(NAME_YAML, 8); }
END_TEST

/* Two engines of one process with one identity: the second attaches to the
 * first; shared buffers work both ways; the many forms go through. */
START_TEST(second_engine_in_a_process_attaches)
{
    struct world w;
    world_new(&w, NAME_YAML);
    kv_engine *a = tu_open_yaml(w.yaml);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(a).host_attached, 0);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    ck_assert_uint_eq(stats(a).host_clients, 1);
    void *buf = NULL;
    ck_assert_int_eq(kv_buffer_alloc(b, BLK, &buf), KV_OK);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq((uintptr_t)buf % 4096, 0);
    tu_fill(buf, BLK, 7);
    ck_assert_int_eq(tu_dump1(b, tu_id(7, 16), 0, buf, BLK), KV_OK);   /* one copy: the server's */
    ck_assert_int_eq(load_one(a, 7, BLK), 0);
    memset(buf, 0, BLK);
    ck_assert_int_eq(tu_load1(b, tu_id(7, 16), 0, buf, BLK), KV_OK);
    ck_assert(tu_check_fill(buf, BLK, 7));
    ck_assert_int_eq(kv_buffer_free(b, buf), KV_OK);
    ck_assert_int_eq(kv_buffer_free(b, buf), KV_ENOTFOUND);
    /* a wrong length is KV_EINVAL, a missing block a miss, as in process */
    ck_assert_int_eq(load_one(b, 7, BLK - 1), KV_EINVAL);
    ck_assert_int_eq(load_one(b, 8, BLK), KV_ENOTFOUND);
    uint8_t hit[2];
    kv_block_id ids[2] = { tu_id(7, 16), tu_id(8, 16) };
    ck_assert_int_eq(kv_lookup(b, ids, 2, hit), KV_OK);
    ck_assert(hit[0] && !hit[1]);
    ck_assert_int_eq(kv_lookup_prefix(b, ids, 2), 0);
    /* plain keys, one at a time and many; a value above the inline size */
    size_t big = (3u << 20) + 5;
    uint8_t *v = malloc(big), *back = malloc(big);
    tu_fill(v, big, 9);
    ck_assert_int_eq(kv_put(b, "big", 3, v, big), KV_OK);
    size_t vl = 0;
    ck_assert_int_eq(kv_get(a, "big", 3, back, big, &vl), KV_OK);
    ck_assert_uint_eq(vl, big);
    ck_assert(tu_check_fill(back, big, 9));
    memset(back, 0, big);
    ck_assert_int_eq(kv_get(b, "big", 3, back, big, &vl), KV_OK);
    ck_assert(tu_check_fill(back, big, 9));
    ck_assert_int_eq(kv_get(b, "big", 3, back, 10, &vl), KV_ENOBUFS);
    ck_assert_uint_eq(vl, big);
    kv_pair items[2] = { { "k1", 2, "one", 3 }, { "k2", 2, "two", 3 } };
    int res[2];
    ck_assert_int_eq(kv_put_many(b, items, 2, res), KV_OK);
    ck_assert(res[0] == KV_OK && res[1] == KV_OK);
    char g1[8], g2[8];
    kv_pair gets[2] = { { "k1", 2, g1, sizeof g1 }, { "nope", 4, g2, sizeof g2 } };
    ck_assert_int_eq(kv_get_many(b, gets, 2, res), KV_OK);
    ck_assert_int_eq(res[0], KV_OK);
    ck_assert_int_eq(res[1], KV_ENOTFOUND);
    ck_assert(gets[0].len == 3 && memcmp(g1, "one", 3) == 0);
    ck_assert_int_eq(kv_exists_many(b, items, 2, res), KV_OK);
    ck_assert(res[0] == 1 && res[1] == 1);
    ck_assert_int_eq(kv_remove(b, "k1", 2), KV_OK);
    ck_assert_int_eq(kv_remove(b, "k1", 2), KV_ENOTFOUND);
    uint64_t removed = 0;
    /* by prefix, from the attached engine: only "k..." goes, on the server */
    ck_assert_int_eq(kv_put(b, "k3", 2, "three", 5), KV_OK);
    ck_assert_int_eq(kv_remove_prefix(b, "k", 1, &removed), KV_OK);
    ck_assert_uint_eq(removed, 2);   /* k2, k3 */
    ck_assert_int_eq(kv_exists(a, "k3", 2), 0);
    ck_assert_int_eq(kv_exists(a, "big", 3), 1);
    ck_assert_int_eq(kv_put(b, "k2", 2, "two", 3), KV_OK);
    ck_assert_int_eq(kv_remove_prefix(b, "k", KV_KEY_MAX + 1, &removed), KV_EINVAL);
    ck_assert_int_eq(kv_remove_all(b, &removed), KV_OK);
    ck_assert_uint_eq(removed, 2);   /* big, k2 */
    ck_assert_int_eq(kv_exists(a, "k2", 2), 0);
    free(v);
    free(back);
    kv_close(b);
    uint64_t t0 = tu_now_ms();   /* the server sees the connection end */
    while (stats(a).host_clients && tu_now_ms() - t0 < 5000)
        usleep(5000);
    ck_assert_uint_eq(stats(a).host_clients, 0);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* An attached dump from kv_buffer_alloc memory goes to the server whole, in
 * one request, and the server spreads the copies over its own workers; a
 * dump from the caller's own memory is still cut into chunks, so that the
 * client stages one while the server copies another. Every shard lands,
 * byte for byte. (Before: 8 MiB in shared buffers went as 7 requests, one
 * per chunk on up to 3 connections; 512 small shards as one per 64.) */
START_TEST(a_dump_from_shared_buffers_is_one_request)
{
    struct world w;
    world_new(&w, NAME_YAML);
    kv_engine *a = tu_open_yaml(w.yaml);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    enum { N = 8, LEN = 1 << 20 };
    void *mem = NULL;
    ck_assert_int_eq(kv_buffer_alloc(b, (size_t)N * LEN, &mem), KV_OK);
    uint8_t *buf = mem, *own = malloc((size_t)N * LEN);
    kv_iov iov[N];
    kv_shard sh[N];
    for (uint64_t round = 0; round < 2; round++) {
        uint8_t *src = round == 0 ? buf : own;
        for (int n = 0; n < N; n++) {
            uint64_t id = 10 * round + (uint64_t)n;
            tu_fill(src + (size_t)n * LEN, LEN, id);
            iov[n] = (kv_iov){ src + (size_t)n * LEN, LEN };
            sh[n] = (kv_shard){ tu_id(id, 16), 0, &iov[n], 1 };
        }
        uint64_t r0 = kv__host_requests(a);
        kv_task t = 0;
        ck_assert_int_eq(kv_dump(b, sh, N, &t), KV_OK);
        ck_assert_int_eq(kv_wait(b, t, 0), KV_OK);
        uint64_t asked = kv__host_requests(a) - r0;
        if (round == 0)
            ck_assert_uint_le(asked, 2);   /* the DUMP (and the buffer's REGION, once) */
        else
            ck_assert_uint_ge(asked, 3);   /* chunks */
        for (int n = 0; n < N; n++)
            ck_assert_int_eq(load_one(a, 10 * round + (uint64_t)n, LEN), 0);
    }
    /* Small shards: 512 x 16 KiB is one request too, not one per 64. */
    enum { SMALL = 512, SLEN = 16 << 10 };
    kv_iov *siov = calloc(SMALL, sizeof *siov);
    kv_shard *ssh = calloc(SMALL, sizeof *ssh);
    for (int n = 0; n < SMALL; n++) {
        tu_fill(buf + (size_t)n * SLEN, SLEN, 100 + (uint64_t)n);
        siov[n] = (kv_iov){ buf + (size_t)n * SLEN, SLEN };
        ssh[n] = (kv_shard){ tu_id(100 + (uint64_t)n, 16), 0, &siov[n], 1 };
    }
    uint64_t r0 = kv__host_requests(a);
    kv_task t = 0;
    ck_assert_int_eq(kv_dump(b, ssh, SMALL, &t), KV_OK);
    ck_assert_int_eq(kv_wait(b, t, 0), KV_OK);
    ck_assert_uint_le(kv__host_requests(a) - r0, 2);   /* (+ REGION on another connection) */
    for (int n = 0; n < SMALL; n++)
        ck_assert_int_eq(load_one(a, 100 + (uint64_t)n, SLEN), 0);
    free(siov);
    free(ssh);
    free(own);
    ck_assert_int_eq(kv_buffer_free(b, mem), KV_OK);
    kv_close(b);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* The many forms of an attached engine: one round trip per chunk of items
 * (ITEMS_MAX items, MANY_BYTES of values), never one per item; a value too
 * large for a frame goes alone; every result and length as in process. */
START_TEST(many_calls_are_one_round_trip_per_chunk)
{
    struct world w;
    world_new(&w, NAME_YAML);
    kv_engine *a = tu_open_yaml(w.yaml);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    enum { N = 5000 };
    static char keys[N][24];
    static uint8_t vals[N][64];
    kv_pair *items = calloc(N, sizeof *items);
    int *res = calloc(N, sizeof *res);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "many-%d", i);
        tu_fill(vals[i], sizeof vals[i], (uint64_t)i);
        items[i] = (kv_pair){ keys[i], strlen(keys[i]), vals[i], 1 + (size_t)i % 64 };
    }
    /* 1000 puts: one request (before: 1000) */
    uint64_t r0 = kv__host_requests(a);
    ck_assert_int_eq(kv_put_many(b, items, 1000, res), KV_OK);
    ck_assert_uint_eq(kv__host_requests(a) - r0, 1);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(res[i], KV_OK);
    /* 5000 more than ITEMS_MAX (4096): two */
    r0 = kv__host_requests(a);
    ck_assert_int_eq(kv_put_many(b, items, N, res), KV_OK);
    ck_assert_uint_eq(kv__host_requests(a) - r0, 2);
    /* exists: one request for 1000, a malformed key answered here */
    items[3].klen = 0;
    r0 = kv__host_requests(a);
    ck_assert_int_eq(kv_exists_many(b, items, 1000, res), KV_OK);
    ck_assert_uint_eq(kv__host_requests(a) - r0, 1);
    ck_assert_int_eq(res[3], KV_EINVAL);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(res[i], i == 3 ? KV_EINVAL : 1);
    items[3].klen = strlen(keys[3]);
    /* gets into other buffers: found, missing, too small, and one too large
     * for a frame (a 5 MiB value, by itself) */
    size_t big = 5u << 20;
    uint8_t *v = malloc(big), *back = malloc(big);
    tu_fill(v, big, 77);
    ck_assert_int_eq(kv_put(b, "big", 3, v, big), KV_OK);
    static uint8_t got[1000][64];
    kv_pair *gets = calloc(1003, sizeof *gets);
    for (int i = 0; i < 1000; i++)
        gets[i] = (kv_pair){ keys[i], strlen(keys[i]), got[i], sizeof got[i] };
    gets[5].len = 2;                                         /* many-5 holds 6 bytes */
    gets[1000] = (kv_pair){ "absent", 6, got[0], 8 };
    gets[1001] = (kv_pair){ "big", 3, back, big };
    gets[1002] = (kv_pair){ "bad", 3, NULL, 8 };             /* no buffer */
    r0 = kv__host_requests(a);
    ck_assert_int_eq(kv_get_many(b, gets, 1003, res), KV_OK);
    ck_assert_uint_le(kv__host_requests(a) - r0, 3);        /* the batch, the big one (+ staging) */
    for (int i = 0; i < 1000; i++) {
        if (i == 5)
            continue;
        ck_assert_int_eq(res[i], KV_OK);
        ck_assert_uint_eq(gets[i].len, 1 + (size_t)i % 64);
        ck_assert(memcmp(got[i], vals[i], gets[i].len) == 0);
    }
    ck_assert_int_eq(res[5], KV_ENOBUFS);
    ck_assert_uint_eq(gets[5].len, 6);
    ck_assert_int_eq(res[1000], KV_ENOTFOUND);
    ck_assert_int_eq(res[1001], KV_OK);
    ck_assert_uint_eq(gets[1001].len, big);
    ck_assert(tu_check_fill(back, big, 77));
    ck_assert_int_eq(res[1002], KV_EINVAL);
    /* what the attached engine put, the server reads */
    size_t vl = 0;
    uint8_t one[64];
    ck_assert_int_eq(kv_get(a, keys[4999], strlen(keys[4999]), one, sizeof one, &vl), KV_OK);
    ck_assert_uint_eq(vl, 1 + 4999 % 64);
    ck_assert(memcmp(one, vals[4999], vl) == 0);
    free(v);
    free(back);
    free(gets);
    free(items);
    free(res);
    kv_close(b);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* A second HOST of one ssd.path (another store.dir, so the lock files
 * differ): the SSD tier's own lock says KV_EBUSY, naming it. */
START_TEST(a_second_host_of_one_ssd_path_is_busy)
{
    struct world w;
    world_new(&w, SSD_YAML);
    kv_engine *a = tu_open_yaml(w.yaml);
    char other[1200];
    snprintf(other, sizeof other,
             "pipeline: dram|ssd\ndram: {capacity: 16MiB, hugepages: off}\n"
             "ssd: {path: \"%s/ssd\"}\nstore: {dir: \"%s/rv2\"}\n", w.dir, w.dir);
    int rc;
    kv_engine *b = open_cfg(other, &rc);
    ck_assert_ptr_null(b);
    ck_assert_int_eq(rc, KV_EBUSY);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* A child that takes the store's lock as take_lock does (its pid written
 * in it) and then opens for 1.5 s, past io.timeout_ms; the engine w's
 * config opens meanwhile, and the child is reaped. */
static kv_engine *open_past_an_opening_holder(struct world *w, const char *lock)
{
    pid_t holder = fork();
    ck_assert_int_ge(holder, 0);
    if (holder == 0) {
        int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || flock(fd, LOCK_EX) != 0 || ftruncate(fd, 0) != 0)
            _exit(1);
        dprintf(fd, "%ld\n", (long)getpid());
        if (write(w->done[1], "L", 1) != 1)
            _exit(2);
        usleep(1500 * 1000);
        _exit(0);
    }
    wait_byte(w->done[0]);
    int rc = KV_OK;
    kv_engine *e = open_cfg(w->yaml, &rc);
    ck_assert_msg(e != NULL, "kv_open while the holder opens: %s", kv_strerror(rc));
    int st = 0;
    ck_assert_int_eq(waitpid(holder, &st, 0), holder);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return e;
}

/* The store's lock held by a process that is still opening it (alive, its
 * socket not bound yet) for longer than io.timeout_ms: an engine opening
 * the store meanwhile waits for it instead of failing, and serves it once
 * that process is gone. Before: KV_EBUSY after the timeout (a UCM worker
 * gave up so while its scheduler built the store under load). */
START_TEST(an_opening_holder_is_waited_for)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 16MiB, hugepages: off}\n"
                  "store: {name: slow-open, dir: \"%s/rv\"}\n"
                  "io: {threads: 2, timeout_ms: 300}\n");
    char rv[1100], lock[1200];
    snprintf(rv, sizeof rv, "%s/rv", w.dir);
    ck_assert_int_eq(mkdir(rv, 0700), 0);
    snprintf(lock, sizeof lock, "%s/slow-open.lock", rv);
    kv_engine *e = open_past_an_opening_holder(&w, lock);
    kv_stats s;
    ck_assert_int_eq(kv_stats_get(e, &s), KV_OK);
    ck_assert(!s.host_attached);   /* the holder never served: this one does */
    ck_assert_int_eq(dump_one(e, 7, BLK), 0);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* The same, after a server was SIGKILLed: its socket file stays behind,
 * and a waiter must not take it for the new holder's. A holder is still
 * opening while the socket at the path is older than its hold on the lock.
 * Before: KV_EBUSY after io.timeout_ms ("held by another process that does
 * not answer"), which Mooncake's setup() and kvnode give up on, whenever a
 * takeover took longer than the timeout (an SSD tier under load). */
static int server_child(void *arg, int k);   /* below: it dumps 40 blocks and serves */

START_TEST(an_opening_holder_is_waited_for_past_a_dead_servers_socket)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 16MiB, hugepages: off}\n"
                  "store: {name: slow-open, dir: \"%s/rv\"}\n"
                  "io: {threads: 2, timeout_ms: 300}\n");
    char rv[1100], lock[1200], sock[1200];
    snprintf(rv, sizeof rv, "%s/rv", w.dir);
    snprintf(lock, sizeof lock, "%s/slow-open.lock", rv);
    snprintf(sock, sizeof sock, "%s/slow-open.sock", rv);
    pid_t srv = child(server_child, &w, 0);
    wait_byte(w.done[0]);
    kill(srv, SIGKILL);
    ck_assert_int_eq(reap(srv), 128 + SIGKILL);
    ck_assert_int_eq(access(sock, F_OK), 0);   /* left behind */
    usleep(50 * 1000);   /* the clock's tick: the lock is taken after the socket was bound */
    kv_engine *e = open_past_an_opening_holder(&w, lock);
    ck_assert(!stats(e).host_attached);   /* the holder never served: this one does */
    ck_assert_int_eq(dump_one(e, 7, BLK), 0);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* store.dir must be ours and private. */
START_TEST(an_unsafe_store_dir_is_refused)
{
    char *dir = tu_mkdtemp();
    char yaml[1024], path[512];
    snprintf(path, sizeof path, "%s/open", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(chmod(path, 0755), 0);
    snprintf(yaml, sizeof yaml, "pipeline: dram\ndram: {capacity: 8MiB}\n"
             "store: {name: x, dir: \"%s\"}\n", path);
    int rc;
    ck_assert_ptr_null(open_cfg(yaml, &rc));
    ck_assert_int_eq(rc, KV_EPERM);
    snprintf(path, sizeof path, "%s/link", dir);
    char target[512];
    snprintf(target, sizeof target, "%s/real", dir);
    ck_assert_int_eq(mkdir(target, 0700), 0);
    ck_assert_int_eq(symlink(target, path), 0);
    snprintf(yaml, sizeof yaml, "pipeline: dram\ndram: {capacity: 8MiB}\n"
             "store: {name: x, dir: \"%s\"}\n", path);
    ck_assert_ptr_null(open_cfg(yaml, &rc));
    ck_assert_int_eq(rc, KV_EPERM);
    tu_rmdir(dir);
}
END_TEST

/* ---- the DRAM budget ------------------------------------------------------------ */

/* Under ASan or TSan, VmRSS counts the sanitizer's shadow memory and its
 * quarantine of freed blocks, not the engine's: the budget is checked in
 * the plain build only. */
#if defined(__SANITIZE_THREAD__)
#define RSS_CHECKED 0
#else
#define RSS_CHECKED 1
#endif

static int budget_child(void *arg, int k)
{
    struct world *w = arg;
    wait_byte(w->go[0]);
    /* What this process held before it opened the store (a forked child
     * counts the pages it shares with the runner; a sanitizer build adds
     * its own shadow): only the growth is the store's. */
    uint64_t base = rss_bytes("VmRSS");
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (!e)
        return 10;
    enum { N = 32, LEN = 1 << 20 };
    uint8_t *b = malloc(LEN);
    for (uint64_t n = 0; n < N; n++) {
        tu_fill(b, LEN, n);
        if (tu_dump1(e, tu_id(n, 16), 0, b, LEN) != KV_OK)
            return 11;
    }
    for (uint64_t n = 0; n < N; n++)
        if (tu_load1(e, tu_id(n, 16), 0, b, LEN) != KV_OK || !tu_check_fill(b, LEN, n))
            return 12;
    free(b);
    kv_stats st;
    if (kv_stats_get(e, &st) != KV_OK || st.dram_capacity != (256u << 20) ||
        st.dram_used < (uint64_t)N * LEN)
        return 13;
    /* The segment is the server's: this process holds its own buffers,
     * staging and the pages of the segment it read, not dram.capacity. */
    uint64_t rss = rss_bytes("VmRSS");
    if (RSS_CHECKED && rss - base >= (256u << 20) / 4) {
        fprintf(stderr, "attached VmRSS grew by %llu bytes (from %llu)\n",
                (unsigned long long)(rss - base), (unsigned long long)base);
        return 14;
    }
    kv_close(e);
    return 0;
}

START_TEST(the_dram_budget_is_counted_once)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 256MiB, hugepages: off}\n"
                  "store: {name: budget, dir: \"%s/rv\"}\n");
    pid_t p = child(budget_child, &w, 0);
    kv_engine *e = tu_open_yaml(w.yaml);
    send_bytes(w.go[1], 1);
    int rc = reap(p);
    ck_assert_msg(rc == 0, "child exited %d", rc);
    ck_assert_uint_ge(stats(e).dram_used, 32u << 20);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* A field of /proc/self/smaps_rollup in bytes (0 when absent). */
static uint64_t smaps_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    unsigned long long kb = 0;
    size_t fl = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':')
            sscanf(line + fl + 1, "%llu", &kb);
    if (f)
        fclose(f);
    return (uint64_t)kb * 1024;
}

/* Whether this kernel makes 2 MiB shmem pages on request (MADV_COLLAPSE)
 * here, asked of a memfd of our own: what the engine relies on. */
static bool can_collapse_shmem(void)
{
    const size_t len = 4u << 20;
    int fd = memfd_create("test-collapse", MFD_CLOEXEC);
    uint8_t *r = fd >= 0 && ftruncate(fd, (off_t)len) == 0
                     ? mmap(NULL, 2 * len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                     : MAP_FAILED;
    bool ok = false;
    if (r != MAP_FAILED) {
        uint8_t *p = (uint8_t *)(((uintptr_t)r + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
        if (mmap(p, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == p) {
            p[0] = p[2u << 20] = 1;
            ok = madvise(p, len, 25 /* MADV_COLLAPSE */) == 0;
        }
        munmap(r, 2 * len);
    }
    if (fd >= 0)
        close(fd);
    return ok;
}

/* ShmemPmdMapped once it reaches want bytes, or after 45 s (then less):
 * the background collapse (engine/segment.c) takes its time on a busy
 * host, and no figure of it is asserted. */
static uint64_t wait_pmd(uint64_t want)
{
    uint64_t until = tu_now_ms() + 45000, got;
    while ((got = smaps_bytes("ShmemPmdMapped")) < want && tu_now_ms() < until)
        usleep(20000);
    return got;
}

static int huge_child(void *arg, int k)
{
    struct world *w = arg;
    bool huge = k != 0;
    wait_byte(w->go[0]);
    uint64_t base = rss_bytes("VmRSS");
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (!e)
        return 10;
    enum { N = 32, LEN = 1 << 20 };
    uint8_t *b = malloc(LEN);
    for (uint64_t n = 0; n < N; n++) {
        tu_fill(b, LEN, n);
        if (tu_dump1(e, tu_id(n, 16), 0, b, LEN) != KV_OK)
            return 11;
    }
    for (uint64_t n = 0; n < N; n++)
        if (tu_load1(e, tu_id(n, 16), 0, b, LEN) != KV_OK || !tu_check_fill(b, LEN, n))
            return 12;
    free(b);
    /* The loads were copied out of 2 MiB mappings of the segment... */
    uint64_t pmd = smaps_bytes("ShmemPmdMapped");
    if (huge && pmd < (uint64_t)N * LEN / 2) {
        fprintf(stderr, "attached ShmemPmdMapped %llu bytes after reading %u MiB\n",
                (unsigned long long)pmd, (unsigned)N);
        return 13;
    }
    /* ...and this process holds what it read, rounded to 2 MiB, not the segment. */
    uint64_t rss = rss_bytes("VmRSS");
    if (RSS_CHECKED && rss - base >= (256u << 20) / 4) {
        fprintf(stderr, "attached VmRSS grew by %llu bytes (from %llu)\n",
                (unsigned long long)(rss - base), (unsigned long long)base);
        return 14;
    }
    kv_close(e);
    return 0;
}

/* A shared store's segment gets 2 MiB pages where shmem_enabled is
 * "never" (Debian's default, this VM's): the server builds them with
 * MADV_COLLAPSE (engine/segment.c) and maps them whole, and an attached
 * process, which maps the segment 2 MiB aligned (net/shm.c), copies its
 * loads out of 2 MiB mappings, no 4 KiB fault per 16 pages, while its RSS
 * stays what it read. Where this kernel cannot collapse shmem (asked of a
 * memfd of our own), only the RSS half is checked. Before: ShmemPmdMapped
 * was 0 in both processes. */
START_TEST(a_shared_segment_gets_huge_pages_without_shmem_thp)
{
    bool huge = can_collapse_shmem();
    if (!huge)
        fprintf(stderr, "note: this kernel cannot collapse shmem: huge pages not checked\n");
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 256MiB, hugepages: auto}\n"
                  "store: {name: hugepg, dir: \"%s/rv\"}\n");
    pid_t p = child(huge_child, &w, huge);
    kv_engine *e = tu_open_yaml(w.yaml);
    if (huge)   /* collapsed after the open, on the segment's own thread */
        ck_assert_uint_ge(wait_pmd(254u << 20), 254u << 20);
    send_bytes(w.go[1], 1);
    int rc = reap(p);
    ck_assert_msg(rc == 0, "child exited %d", rc);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* The segment is collapsed into 2 MiB pages after kv_open returns, not
 * inside it (a loaded host waited seconds for it), and the store serves
 * meanwhile: blocks dumped while the collapse runs read back whole once it
 * is over, and ShmemPmdMapped then covers the segment. When open returns
 * only its first 2 MiB were collapsed by the open itself: a collapse of the
 * whole segment inside the open, as before, had all 512 MiB mapped huge by
 * then (this test failed so). The thread may have done some more by the
 * time we look, not 255 extents' allocations and copies. */
START_TEST(a_shared_segment_is_collapsed_after_open)
{
    if (!can_collapse_shmem()) {
        fprintf(stderr, "note: this kernel cannot collapse shmem: not checked\n");
        return;
    }
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 512MiB, hugepages: auto}\n"
                  "store: {name: collapse, dir: \"%s/rv\"}\n");
    kv_engine *e = tu_open_yaml(w.yaml);
    uint64_t at_open = smaps_bytes("ShmemPmdMapped");
    ck_assert_msg(at_open < (510u << 20), "%llu bytes mapped huge when kv_open returned",
                  (unsigned long long)at_open);
    enum { N = 64, LEN = 1 << 20 };
    uint8_t *b = malloc(LEN);
    for (uint64_t n = 0; n < N; n++) {
        tu_fill(b, LEN, n);
        ck_assert_int_eq(tu_dump1(e, tu_id(n, 16), 0, b, LEN), KV_OK);
    }
    ck_assert_uint_ge(wait_pmd(510u << 20), 510u << 20);
    for (uint64_t n = 0; n < N; n++) {
        ck_assert_int_eq(tu_load1(e, tu_id(n, 16), 0, b, LEN), KV_OK);
        ck_assert(tu_check_fill(b, LEN, n));
    }
    free(b);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* ---- clients killed mid-load ----------------------------------------------------- */

static int loader_child(void *arg, int k)
{
    struct world *w = arg;
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    send_bytes(w->done[1], 1);
    if (!e)
        return 10;
    enum { N = 16, LEN = 256 << 10 };
    uint8_t *b = malloc((size_t)N * LEN);
    kv_iov iov[N];
    kv_shard sh[N];
    for (uint64_t n = 0; n < N; n++) {
        iov[n] = (kv_iov){ b + n * LEN, LEN };
        sh[n] = (kv_shard){ tu_id(n, 16), 0, &iov[n], 1 };
    }
    for (;;) {   /* until killed */
        uint8_t hit[N];
        kv_block_id ids[N];
        for (int n = 0; n < N; n++)
            ids[n] = sh[n].block;
        kv_lookup(e, ids, N, hit);
        kv_task t;
        if (kv_load(e, sh, N, &t) == KV_OK)
            kv_wait(e, t, 0);
    }
}

/* Forks the loaders from a process that holds no engine (a fork of a
 * process with engine threads could inherit a lock held mid-call): asked
 * through go, it forks one, says its pid on done2, reaps it once killed,
 * and says how it ended. */
static int zygote(void *arg, int k)
{
    int *pp = arg;   /* [0] commands in, [1] answers out, [2] [3] the parent's ends, then the world */
    close(pp[2]);
    close(pp[3]);
    for (;;) {
        char c;
        if (read(pp[0], &c, 1) != 1)
            return 0;
        pid_t p = fork();
        if (p == 0)
            _exit(loader_child(*(struct world **)(void *)(pp + 4), 0));
        if (write(pp[1], &p, sizeof p) != sizeof p)
            return 1;
        int st = 0;
        waitpid(p, &st, 0);
        int how = WIFSIGNALED(st) ? WTERMSIG(st) : -1;
        if (write(pp[1], &how, sizeof how) != sizeof how)
            return 1;
    }
}

START_TEST(killed_clients_leave_nothing_behind)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 64MiB, hugepages: off}\n"
                  "eviction: {lease_ttl_ms: 300ms}\n"
                  "store: {name: kills, dir: \"%s/rv\"}\n"
                  "io: {threads: 2}\n");
    int cmd[2], ans[2];
    ck_assert_int_eq(pipe(cmd), 0);
    ck_assert_int_eq(pipe(ans), 0);
    struct { int pp[4]; struct world *w; } za = { { cmd[0], ans[1], cmd[1], ans[0] }, &w };
    pid_t z = child(zygote, &za, 0);
    kv_engine *e = tu_open_yaml(w.yaml);
    enum { N = 16, LEN = 256 << 10 };
    for (uint64_t n = 0; n < N; n++)
        ck_assert_int_eq(dump_one(e, n, LEN), KV_OK);
    kv_stats base = stats(e);
    unsigned seed = 16;
    for (int i = 0; i < 50; i++) {
        send_bytes(cmd[1], 1);
        pid_t p = 0;
        ck_assert_int_eq(read(ans[0], &p, sizeof p), sizeof p);
        wait_byte(w.done[0]);
        usleep(2000 + (unsigned)(rand_r(&seed) % 20000));
        kill(p, SIGKILL);
        int how = 0;
        ck_assert_int_eq(read(ans[0], &how, sizeof how), sizeof how);
        ck_assert_int_eq(how, SIGKILL);
    }
    close(cmd[1]);
    ck_assert_int_eq(reap(z), 0);
    close(cmd[0]);
    close(ans[0]);
    close(ans[1]);
    /* The connections end with their processes; the leases lapse. */
    uint64_t t0 = tu_now_ms();
    kv_stats st = stats(e);
    while ((st.host_clients || st.host_pins) && tu_now_ms() - t0 < 5000) {
        usleep(20000);
        st = stats(e);
    }
    ck_assert_uint_eq(st.host_clients, 0);
    ck_assert_uint_eq(st.host_pins, 0);
    ck_assert_uint_eq(st.dram_used, base.dram_used);
    ck_assert_uint_eq(st.dram_blocks, base.dram_blocks);
    usleep(400000);   /* past the lease TTL */
    /* Nothing pinned or leased: every block can be evicted now. Fill the
     * store with new blocks; the old ones must make room. */
    for (uint64_t n = 1000; n < 1000 + 64 * 4; n++)
        ck_assert_int_eq(dump_one(e, n, LEN), KV_OK);
    uint8_t hit[N];
    kv_block_id ids[N];
    for (int n = 0; n < N; n++)
        ids[n] = tu_id((uint64_t)n, 16);
    ck_assert_int_eq(kv_lookup(e, ids, N, hit), KV_OK);
    int left = 0;
    for (int n = 0; n < N; n++)
        left += hit[n];
    ck_assert_int_eq(left, 0);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* A load's pins cost no message of their own: a load of 16 DRAM shards is
 * ONE request (it was two: LOAD, then RELEASE), the pins end with the
 * client's next request of any kind, and a client that goes quiet has its
 * copied pins ended by the server within HOLD_MS, so that eviction can take
 * those blocks. (Before: 2 requests per load.) The pinned path is the one
 * of store.direct_reads: false. */
START_TEST(pins_end_without_a_message_of_their_own)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 64MiB, hugepages: off}\n"
                  "eviction: {lease_ttl_ms: 0}\n"
                  "store: {name: pins, dir: \"%s/rv\", direct_reads: false}\n"
                  "io: {threads: 2}\n");
    kv_engine *a = tu_open_yaml(w.yaml);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    enum { N = 16, LEN = 48 << 10 };   /* 768 KiB: one chunk, so one LOAD */
    for (uint64_t n = 0; n < N; n++)
        ck_assert_int_eq(dump_one(a, n, LEN), KV_OK);
    uint8_t *dst = malloc((size_t)N * LEN);
    kv_iov iov[N];
    kv_shard sh[N];
    ck_assert_int_eq(load_one(b, 0, LEN), 0);   /* the connection's staging memfd, once */
    for (int round = 0; round < 2; round++) {
        memset(dst, 0, (size_t)N * LEN);
        for (int n = 0; n < N; n++) {
            iov[n] = (kv_iov){ dst + (size_t)n * LEN, LEN };
            sh[n] = (kv_shard){ tu_id((uint64_t)n, 16), 0, &iov[n], 1 };
        }
        uint64_t r0 = kv__host_requests(a);
        kv_task t = 0;
        ck_assert_int_eq(kv_load(b, sh, N, &t), KV_OK);
        ck_assert_int_eq(kv_wait(b, t, 0), KV_OK);
        ck_assert_uint_eq(kv__host_requests(a) - r0, 1);
        for (int n = 0; n < N; n++)
            ck_assert(tu_check_fill(dst + (size_t)n * LEN, LEN, (uint64_t)n));
        ck_assert_uint_eq(stats(a).dram_blocks, N);
        if (round == 0) {
            /* The next request, whatever it is, ends them first. */
            uint8_t hit = 0;
            kv_block_id id = tu_id(0, 16);
            ck_assert_int_eq(kv_lookup(b, &id, 1, &hit), KV_OK);
            ck_assert_uint_eq(stats(a).host_pins, 0);
        } else {
            /* Quiet: the server ends them by itself. */
            uint64_t t0 = tu_now_ms();
            while (stats(a).host_pins && tu_now_ms() - t0 < 5000)
                usleep(2000);
            ck_assert_uint_eq(stats(a).host_pins, 0);
        }
    }
    /* Nothing pinned by the quiet client: new blocks evict the old ones. */
    for (uint64_t n = 1000; n < 1000 + 2 * (64 << 20) / LEN; n++)
        ck_assert_int_eq(dump_one(a, n, LEN), KV_OK);
    uint8_t hit[N];
    kv_block_id ids[N];
    for (int n = 0; n < N; n++)
        ids[n] = tu_id((uint64_t)n, 16);
    ck_assert_int_eq(kv_lookup(a, ids, N, hit), KV_OK);
    int left = 0;
    for (int n = 0; n < N; n++)
        left += hit[n];
    ck_assert_int_eq(left, 0);
    free(dst);
    kv_close(b);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* The directory's own contract, under racing writers: once kv__dir_retract
 * returns, no reader finds the shard (the DRAM tier frees its memory right
 * after). Two threads each publish and retract keys of their own, as the
 * table locks let two writers do, thousands of keys in a small table so
 * that their slots collide, and after each retract look the key up. (A
 * retract that gave up on a slot another writer was in left the key named
 * when that writer was retracting a key the slot no longer held.) */
struct dir_race {
    struct kv__dir *d;
    struct kv__dir_view v;
    const uint8_t *seg;
    uint64_t base, named_after;
};

static void *dir_racer(void *arg)
{
    struct dir_race *r = arg;
    uint8_t out[64];
    kv_iov iov = { out, sizeof out };
    uint64_t t0 = tu_now_ms();
    /* A window of 3000 live keys each: the 2048 slots stay full, so every
     * publish overwrites someone's slot while its owner may be retracting. */
    enum { WIN = 3000 };
    for (uint64_t n = 0; n < 4000000 && ((n & 4095) || tu_now_ms() - t0 < 1500); n++) {
        kv_block_id id = tu_id(r->base + n, 16);
        kv__dir_publish(r->d, &id, 0, (uint32_t)(n % 64), 64);
        if (n < WIN)
            continue;
        kv_block_id old = tu_id(r->base + n - WIN, 16);
        kv__dir_retract(r->d, &old, 0);
        if (kv__dir_copy(&r->v, r->seg, 64 * 64 + 64, &old, 0, &iov, 1, 64))
            r->named_after++;
        /* and one that lives a moment only, over someone's slot */
        kv_block_id brief = tu_id(r->base + (1ull << 39) + n, 16);
        kv__dir_publish(r->d, &brief, 0, 1, 64);
        kv__dir_retract(r->d, &brief, 0);
        if (kv__dir_copy(&r->v, r->seg, 64 * 64 + 64, &brief, 0, &iov, 1, 64))
            r->named_after++;
    }
    return NULL;
}

START_TEST(a_retracted_shard_is_never_named)
{
    struct kv__dir *d;
    ck_assert_int_eq(kv__dir_new(1 << 20, &d), KV_OK);   /* the smallest table */
    struct kv__dir_view v;
    ck_assert_int_eq(kv__dir_map(kv__dir_fd(d), kv__dir_len(d), &v), KV_OK);
    static uint8_t seg[64 * 64 + 64];
    struct dir_race r[2] = { { d, v, seg, 0, 0 }, { d, v, seg, 1ull << 40, 0 } };
    /* the contract first, alone */
    uint8_t out[64];
    kv_iov iov = { out, sizeof out };
    kv_block_id id = tu_id(7, 16);
    memset(seg + 64, 0x5a, 64);
    kv__dir_publish(d, &id, 0, 1, 64);
    ck_assert(kv__dir_copy(&v, seg, sizeof seg, &id, 0, &iov, 1, 64));
    ck_assert_int_eq(out[0], 0x5a);
    ck_assert(!kv__dir_copy(&v, seg, sizeof seg, &id, 0, &iov, 1, 63));   /* another length */
    kv__dir_retract(d, &id, 0);
    ck_assert(!kv__dir_copy(&v, seg, sizeof seg, &id, 0, &iov, 1, 64));
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, dir_racer, &r[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    ck_assert_uint_eq(r[0].named_after + r[1].named_after, 0);
    kv__dir_unmap(&v);
    kv__dir_free(d);
}
END_TEST

/* An attached load of shards the store holds in DRAM asks the server
 * nothing: it reads the segment's directory (net/dir.c) and copies each
 * shard straight out of the segment. The server still counts them as DRAM
 * hits, nothing is pinned, and what the directory does not name (a shard
 * never stored) is asked for in one request. (Before: one request per
 * load, and a pin per shard.) */
/* A load through e's connection to its server, with each shard's result. */
static int attached_load(kv_engine *e, const kv_shard *sh, size_t n, int *res)
{
    struct kv__shm_client *hc;
    int rc = kv__host_enter(e, &hc);
    if (rc != KV_OK)
        return rc;
    rc = hc ? kv__shm_load(hc, sh, n, res) : KV_EINVAL;
    kv__host_leave(e);
    return rc;
}

START_TEST(attached_loads_of_dram_shards_ask_nothing)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 64MiB, hugepages: off}\n"
                  "store: {name: direct, dir: \"%s/rv\"}\n"
                  "io: {threads: 2}\n");
    kv_engine *a = tu_open_yaml(w.yaml);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    enum { N = 16, LEN = 48 << 10 };
    for (uint64_t n = 0; n < N; n++)
        ck_assert_int_eq(dump_one(b, n, LEN), KV_OK);   /* through the server */
    uint8_t *dst = malloc((size_t)(N + 1) * LEN);
    kv_iov iov[N + 1];
    kv_shard sh[N + 1];
    int res[N + 1];
    for (int n = 0; n <= N; n++) {
        iov[n] = (kv_iov){ dst + (size_t)n * LEN, LEN };
        sh[n] = (kv_shard){ tu_id(n < N ? (uint64_t)n : 999, 16), 0, &iov[n], 1 };
    }
    uint64_t r0 = kv__host_requests(a), h0 = stats(a).hits_dram;
    memset(dst, 0, (size_t)(N + 1) * LEN);
    kv_task t = 0;
    ck_assert_int_eq(kv_load(b, sh, N, &t), KV_OK);
    ck_assert_int_eq(kv_wait(b, t, 0), KV_OK);
    ck_assert_uint_eq(kv__host_requests(a) - r0, 0);
    for (int n = 0; n < N; n++)
        ck_assert(tu_check_fill(dst + (size_t)n * LEN, LEN, (uint64_t)n));
    ck_assert_uint_eq(stats(a).host_pins, 0);
    ck_assert_uint_eq(stats(a).hits_dram - h0, N);
    /* With one shard nobody stored: one request, for that one alone. */
    memset(dst, 0, (size_t)(N + 1) * LEN);
    r0 = kv__host_requests(a);
    ck_assert_int_eq(attached_load(b, sh, N + 1, res), KV_OK);
    ck_assert_uint_eq(kv__host_requests(a) - r0, 1);
    for (int n = 0; n < N; n++) {
        ck_assert_int_eq(res[n], KV_OK);
        ck_assert(tu_check_fill(dst + (size_t)n * LEN, LEN, (uint64_t)n));
    }
    ck_assert_int_eq(res[N], KV_ENOTFOUND);
    /* A wrong length is the server's to answer (KV_EINVAL), as before. */
    kv_iov shortv = { dst, LEN - 64 };
    kv_shard one = { tu_id(3, 16), 0, &shortv, 1 };
    ck_assert_int_eq(attached_load(b, &one, 1, res), KV_OK);
    ck_assert_int_eq(res[0], KV_EINVAL);
    free(dst);
    kv_close(b);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* A direct load refreshes its block's recency, as a pinned load does, only a
 * little later (the server reads the clients' touch rings every 50 ms): of
 * two sets of blocks dumped one after the other, the older set A read
 * through the directory since, eviction takes the newer set B first.
 * (Before the rings: A was taken first, the direct loads having left its
 * stamps where its dumps put them.) */
START_TEST(a_direct_load_keeps_its_block_warm)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 16MiB, hugepages: off}\n"
                  "eviction: {lease_ttl_ms: 0}\n"
                  "store: {name: warm, dir: \"%s/rv\"}\n"
                  "io: {threads: 2}\n");
    kv_engine *a = tu_open_yaml(w.yaml);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    enum { LEN = 256 << 10, SET = 20 };
    for (uint64_t n = 0; n < 2 * SET; n++) {   /* A = 0..19, then B = 20..39 */
        ck_assert_int_eq(dump_one(a, n, LEN), KV_OK);
        usleep(1000);
    }
    uint64_t r0 = kv__host_requests(a);
    for (uint64_t n = 0; n < SET; n++)
        ck_assert_int_eq(load_one(b, n, LEN), 0);
    ck_assert_uint_eq(kv__host_requests(a) - r0, 0);   /* direct, all of them */
    usleep(300 * 1000);                                 /* the rings are read */
    uint64_t ev0 = stats(a).evictions;
    for (uint64_t n = 1000; n < 1000 + 30; n++)
        ck_assert_int_eq(dump_one(a, n, LEN), KV_OK);
    uint64_t ev = stats(a).evictions - ev0;
    ck_assert_uint_ge(ev, 10);
    int in_a = 0, in_b = 0;
    for (uint64_t n = 0; n < 2 * SET; n++) {
        uint8_t hit = 0;
        kv_block_id id = tu_id(n, 16);
        ck_assert_int_eq(kv_lookup(a, &id, 1, &hit), KV_OK);
        *(n < SET ? &in_a : &in_b) += hit;
    }
    ck_assert_msg(in_a >= SET - 2 && in_b <= SET - (int)ev + 2,
                  "A kept %d, B kept %d of %d, %llu evicted",
                  in_a, in_b, SET, (unsigned long long)ev);
    kv_close(b);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* A direct load never returns bytes the store reused: while the server
 * dumps new blocks as fast as it can into a small DRAM tier (every dump
 * evicts, and the freed memory is written again at once), another process
 * loads blocks near the eviction front, whose memory is the next to go.
 * Every load that says KV_OK has exactly its block's bytes; a shard freed
 * under a copy is asked of the server (a miss, by then). */
struct churn {
    _Atomic uint64_t cur;        /* blocks 0..cur-1 have been dumped */
    uint64_t fit;                /* blocks DRAM holds: the oldest of those go next */
    _Atomic int stop;
    _Atomic uint64_t loads, ok, bad;
};

enum { CHURN_LEN = 1 << 20, CHURN_WIN = 16 };

static int churn_child(void *arg, int k)
{
    struct world *w = ((void **)arg)[0];
    struct churn *c = ((void **)arg)[1];
    wait_byte(w->go[0]);
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (!e)
        return 10;
    uint64_t x = 88172645463325252ull;
    while (!atomic_load(&c->stop)) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* Any block DRAM holds: with so few, the oldest is the next to go,
         * and its memory is what the next dump writes. */
        uint64_t cur = atomic_load(&c->cur);
        uint64_t n = cur - 1 - x % c->fit;
        int r = load_one(e, n, CHURN_LEN);
        atomic_fetch_add(&c->loads, 1);
        if (r == 0)
            atomic_fetch_add(&c->ok, 1);
        else if (r == 99)
            atomic_fetch_add(&c->bad, 1);
        else if (r != KV_ENOTFOUND)
            return 11;
    }
    kv_close(e);
    return 0;
}

START_TEST(direct_loads_never_read_reused_memory)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 8MiB, hugepages: off}\n"
                  "eviction: {lease_ttl_ms: 0}\n"
                  "store: {name: churn, dir: \"%s/rv\"}\n"
                  "io: {threads: 2}\n");
    struct churn *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                           -1, 0);
    ck_assert_ptr_ne(c, MAP_FAILED);
    memset(c, 0, sizeof *c);
    void *arg[2] = { &w, c };
    pid_t p = child(churn_child, arg, 0);   /* before any thread of ours (TSan) */
    kv_engine *a = tu_open_yaml(w.yaml);
    for (uint64_t n = 0; n < CHURN_WIN; n++)
        ck_assert_int_eq(dump_one(a, n, CHURN_LEN), KV_OK);
    atomic_store(&c->cur, CHURN_WIN);
    c->fit = stats(a).dram_blocks;
    ck_assert_uint_gt(c->fit, 2);
    ck_assert_uint_lt(c->fit, CHURN_WIN);   /* evicting already */
    uint64_t r0 = kv__host_requests(a);
    send_bytes(w.go[1], 1);
    uint64_t t0 = tu_now_ms();
    for (uint64_t n = CHURN_WIN; n < 100000 && tu_now_ms() - t0 < 2500; n++) {
        ck_assert_int_eq(dump_one(a, n, CHURN_LEN), KV_OK);
        atomic_store(&c->cur, n + 1);
    }
    atomic_store(&c->stop, 1);
    int rc = reap(p);
    ck_assert_msg(rc == 0, "child exited %d", rc);
    uint64_t bad = atomic_load(&c->bad), ok = atomic_load(&c->ok);
    ck_assert_uint_eq(bad, 0);
    ck_assert_uint_gt(ok, 20);   /* thousands here, about a hundred under TSan */
    ck_assert_uint_gt(stats(a).evictions, 100);   /* churned (TSan: a few hundred) */
    /* Most loads asked nothing (the misses did). */
    ck_assert_uint_lt(kv__host_requests(a) - r0, atomic_load(&c->loads));
    munmap(c, sizeof *c);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* A client spoken by hand: connects to the store's socket, proves the
 * (empty) token and hands over its pin board; the socket, or -1. */
static int raw_client(const char *sock, uint8_t **board)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    uint64_t dl = tu_now_ms() + 5000;
    uint8_t hello[12], mine[52] = { 0 }, ans[16], dans[8];
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        kv__sock_xfer1(fd, hello, sizeof hello, 0, dl) != KV_OK || kv__auth_client(fd, "", dl))
        return -1;
    int b = open("/proc/sys/kernel/random/boot_id", O_RDONLY);
    ssize_t n = b >= 0 ? read(b, mine, 39) : -1;
    close(b);
    while (n > 0 && mine[n - 1] == '\n')
        mine[--n] = 0;
    kv__put32(mine + 40, sizeof(kv_stats));
    kv__put32(mine + 44, KV__SHM_MAGIC);
    kv__put32(mine + 48, KV__SHM_VERSION);
    int mfd = memfd_create("test-board", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    /* 8192 pin slots, counters, the touch ring (net/shm.h). */
    if (mfd < 0 || ftruncate(mfd, KV__SHM_BOARD_LEN) != 0 ||
        fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        return -1;
    *board = mmap(NULL, KV__SHM_BOARD_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } u;
    memset(&u, 0, sizeof u);
    struct iovec iov = { mine, sizeof mine };
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &mfd, sizeof mfd);
    if (*board == MAP_FAILED || sendmsg(fd, &m, 0) != (ssize_t)sizeof mine ||
        kv__sock_xfer1(fd, ans, sizeof ans, 0, dl) != KV_OK || kv__get32(ans) != KV_OK ||
        kv__sock_xfer1(fd, dans, sizeof dans, 0, dl) != KV_OK)
        return -1;
    close(mfd);
    return fd;   /* the segment's and the directory's descriptors came too: not needed here */
}

/* The safety half of the pin board: a pin whose byte the client has not
 * set is never ended while the connection lives, however long the client
 * takes (the server has looked at the board several times by then); once
 * set, the server ends it by itself, the client saying nothing more. */
START_TEST(a_pin_ends_only_once_its_copy_is_marked_done)
{
    struct world w;
    world_new(&w, NAME_YAML);
    kv_engine *e = tu_open_yaml(w.yaml);
    ck_assert_int_eq(dump_one(e, 5, BLK), KV_OK);
    char sock[512];
    snprintf(sock, sizeof sock, "%s/rv/host-test.sock", w.dir);
    uint8_t *board = NULL;
    int fd = raw_client(sock, &board);
    ck_assert_int_ge(fd, 0);
    /* LOAD of block 5: u32 n, then id, u32 index, u64 len, loc (13 bytes) */
    uint8_t req[8 + 4 + 41] = { 0 };
    kv__put32(req, 4 + 41);
    kv__put32(req + 4, 3);   /* OP_LOAD */
    kv__put32(req + 8, 1);
    kv_block_id id = tu_id(5, 16);
    memcpy(req + 12, id.bytes, 16);
    kv__put64(req + 32, BLK);
    req[40] = 1;             /* staging: where it would be copied, were it not pinned */
    uint64_t dl = tu_now_ms() + 5000;
    uint8_t h[8], a[17];
    ck_assert_int_eq(kv__sock_xfer1(fd, req, sizeof req, 1, dl), KV_OK);
    ck_assert_int_eq(kv__sock_xfer1(fd, h, 8, 0, dl), KV_OK);
    ck_assert_uint_eq(kv__get32(h), 17);
    ck_assert_int_eq(kv__sock_xfer1(fd, a, 17, 0, dl), KV_OK);
    ck_assert_int_eq((int)kv__get32(a), KV_OK);
    ck_assert_uint_eq(a[4], 1);   /* pinned */
    uint32_t slot = kv__get32(a + 13);
    ck_assert_uint_lt(slot, 8192);
    ck_assert_uint_eq(stats(e).host_pins, 1);
    usleep(300000);   /* the server has looked at the board at 10, 20, 40, 80, 160 ms */
    ck_assert_uint_eq(stats(e).host_pins, 1);
    __atomic_store_n(&board[slot], 1, __ATOMIC_RELEASE);
    uint64_t t0 = tu_now_ms();
    while (stats(e).host_pins && tu_now_ms() - t0 < 5000)
        usleep(2000);
    ck_assert_uint_eq(stats(e).host_pins, 0);
    ck_assert_uint_eq(board[slot], 0);   /* cleared for the slot's next pin */
    close(fd);
    munmap(board, 8192);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* Whether object v has member key. */
static bool jhas(const struct jv *v, const char *key)
{
    for (size_t i = 0; v->t == J_OBJ && i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0)
            return true;
    return false;
}

/* kvctl bench attached, with --compare dram: a last phase, write_kvbuf,
 * dumps new objects from kv_buffer_alloc memory, alternated batch by batch
 * with the same dumps into an in-process engine (kvbuf_inproc), and the
 * comparison gives write_kvbuf over kvbuf_inproc, printed and in the JSON;
 * the in-process run has no such phase. (Before: no such figure; then one
 * over the in-process run's write, a phase run seconds later.)
 * Each attached phase also has the serving process's CPU time (this one
 * serves: it copied every dump in), printed as "server cpu"; the
 * in-process run's phases have none. (Before: no server figure at all.) */
START_TEST(attached_bench_compares_kv_buffer_dumps)
{
    struct world w;
    world_new(&w, NAME_YAML);
    kv_engine *e = tu_open_yaml(w.yaml);
    char *json = NULL, *sdir = NULL;
    ck_assert(asprintf(&json, "%s/summary.json", w.dir) > 0);
    ck_assert(asprintf(&sdir, "store.dir=%s/rv", w.dir) > 0);
    struct out r = run_kvctl(w.dir, 60, "--set", "store.name=host-test", "--set", sdir,
                             "--set", "log.level=warn", "bench", "--nr-objects", "16",
                             "--value-size", "64KiB", "--verify", "--compare", "dram",
                             "--summary-json", json, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "write_kvbuf/write");
    CK_HAS(r.out, "alternated batch by batch");
    char *text = slurp(json);
    struct jv *v = jparse(text);
    ck_assert_msg(v != NULL, "summary is not JSON:\n%s", text);
    const struct jv *ph = jget(v, "phases", J_ARR);
    ck_assert_uint_eq(ph->n, 5);
    ck_assert_str_eq(jget(ph->items[3], "name", J_STR)->str, "write_kvbuf");
    ck_assert(jnum_of(ph->items[3], "ops") == 16 && jnum_of(ph->items[3], "errors") == 0);
    ck_assert(jnum_of(ph->items[3], "mib_s") > 0);
    ck_assert_str_eq(jget(ph->items[4], "name", J_STR)->str, "kvbuf_inproc");
    ck_assert(jnum_of(ph->items[4], "ops") == 16 && jnum_of(ph->items[4], "errors") == 0);
    ck_assert(jnum_of(ph->items[4], "mib_s") > 0);
    const struct jv *cmp = jget(v, "comparisons", J_ARR);
    ck_assert_uint_eq(cmp->n, 1);
    ck_assert_uint_eq(jget(cmp->items[0], "phases", J_ARR)->n, 3);   /* in process: none */
    const struct jv *ratio = jget(jget(cmp->items[0], "ratios", J_OBJ), "write_kvbuf/write", J_OBJ);
    ck_assert(jnum_of(ratio, "mib_s") > 0 && jnum_of(ratio, "p50") > 0);
    ck_assert_str_eq(jget(ratio, "against", J_STR)->str, "kvbuf_inproc");
    CK_HAS(r.out, "server cpu");
    /* Every attached phase says what the server spent; the writes (0, 3)
     * cost it something, the read (2) of blocks in DRAM may cost it
     * nothing at all (direct loads); kvbuf_inproc (4) is not its. */
    ck_assert(!jhas(ph->items[4], "server_cpu_s"));
    for (size_t i = 0; i < 4; i++) {
        ck_assert(jhas(ph->items[i], "server_cpu_s"));
        double cpu = jnum_of(ph->items[i], "server_cpu_s");
        ck_assert_msg(i == 2 ? cpu >= 0 : cpu > 0, "phase %zu: server_cpu_s %g", i, cpu);
    }
    const struct jv *cph = jget(cmp->items[0], "phases", J_ARR);
    for (size_t i = 0; i < cph->n; i++)
        ck_assert(!jhas(cph->items[i], "server_cpu_s"));
    /* the 16 new objects are in the store, beside the 16 of the other phases */
    ck_assert_uint_eq(stats(e).dram_blocks, 32);
    jfree(v);
    free(text);
    free(json);
    free(sdir);
    out_free(&r);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* ---- another protocol version ------------------------------------------------- */

/* A server of another version: says its hello, then waits for the client
 * to hang up. */
struct fake_server {
    int lfd;
    uint32_t version;
};

static void *fake_server_main(void *arg)
{
    struct fake_server *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    uint8_t hello[12];
    kv__put32(hello, KV__SHM_MAGIC);
    kv__put32(hello + 4, f->version);
    kv__put32(hello + 8, KV_OK);
    if (write(fd, hello, sizeof hello) == (ssize_t)sizeof hello) {
        char c;
        while (read(fd, &c, 1) > 0) {
        }
    }
    close(fd);
    return NULL;
}

/* Both sides refuse a peer of another version at the hello, and say both
 * versions: the client in its error, the server in its log. */
START_TEST(a_peer_of_another_version_is_refused)
{
    struct world w;
    world_new(&w, NAME_YAML);
    char path[512];
    snprintf(path, sizeof path, "%s/other.sock", w.dir);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    ck_assert_uint_lt(strlen(path), sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct fake_server f = { socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), KV__SHM_VERSION + 1 };
    ck_assert_int_ge(f.lfd, 0);
    ck_assert_int_eq(bind(f.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(f.lfd, 4), 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, fake_server_main, &f), 0);
    struct kv__shm_client *cli = NULL;
    char err[512] = "", want[64];
    ck_assert_int_eq(kv__shm_connect(path, "", 2000, NULL, &cli, err, sizeof err), KV_EPROTO);
    ck_assert_ptr_null(cli);
    pthread_join(th, NULL);
    close(f.lfd);
    snprintf(want, sizeof want, "version %u,", KV__SHM_VERSION + 1);
    ck_assert_msg(strstr(err, want), "error: %s", err);
    snprintf(want, sizeof want, "library version %u", KV__SHM_VERSION);
    ck_assert_msg(strstr(err, want), "error: %s", err);

    /* The other way: a real server, a client that says another version. */
    kv_engine *e = tu_open_yaml(w.yaml);
    snprintf(path, sizeof path, "%s/rv/host-test.sock", w.dir);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    uint64_t dl = tu_now_ms() + 5000;
    uint8_t hello[12];
    ck_assert_int_eq(kv__sock_xfer1(fd, hello, sizeof hello, 0, dl), KV_OK);
    ck_assert_uint_eq(kv__get32(hello), KV__SHM_MAGIC);
    ck_assert_uint_eq(kv__get32(hello + 4), KV__SHM_VERSION);
    ck_assert_int_eq(kv__auth_client(fd, "", dl), KV_OK);
    uint8_t mine[40 + 12] = { 0 };   /* boot id, sizeof(kv_stats), magic, version */
    kv__put32(mine + 40, sizeof(kv_stats));
    kv__put32(mine + 44, KV__SHM_MAGIC);
    kv__put32(mine + 48, 1);
    ck_assert_int_eq(kv__sock_xfer1(fd, mine, sizeof mine, 1, dl), KV_OK);
    uint8_t ans[16];
    ck_assert_int_eq(kv__sock_xfer1(fd, ans, sizeof ans, 0, dl), KV_OK);
    ck_assert_int_eq((int)kv__get32(ans), KV_EPROTO);
    close(fd);
    snprintf(want, sizeof want, "client of protocol version 1 (this server speaks version %u)",
             KV__SHM_VERSION);
    ck_assert_msg(tu_capture_has(want), "the server did not log: %s", want);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* ---- the server killed --------------------------------------------------------- */

static int server_child(void *arg, int k)
{
    struct world *w = arg;
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (!e)
        return 10;
    for (uint64_t n = 0; n < 40; n++)
        if (dump_one(e, n, BLK) != KV_OK)
            return 11;
    send_bytes(w->done[1], 1);
    for (;;)
        pause();
}

/* 0 once block n loads right; retries while the store is being taken over. */
static int load_recovering(kv_engine *e, uint64_t n, uint64_t until_ms)
{
    int rc;
    while ((rc = load_one(e, n, BLK)) == KV_ENET && tu_now_ms() < until_ms)
        usleep(20000);
    return rc;
}

static int other_attached(void *arg, int k)
{
    struct world *w = arg;
    wait_byte(w->go[0]);
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (!e)
        return 10;
    if (load_one(e, 3, BLK) != 0)
        return 11;
    send_bytes(w->done[1], 1);
    wait_byte(w->go2[0]);   /* the server is dead */
    uint64_t until = tu_now_ms() + 10000;
    for (uint64_t n = 0; n < 40; n++)
        if (load_recovering(e, n, until) != 0)
            return 12;
    kv_close(e);
    return 0;
}

START_TEST(a_killed_server_is_taken_over)
{
    struct world w;
    world_new(&w, "pipeline: dram|ssd\n"
                  "dram: {capacity: 32MiB, hugepages: off}\n"
                  "ssd: {path: \"%s/ssd\", write_through: true, compression: none}\n"
                  "store: {dir: \"%s/rv\"}\n"
                  "io: {threads: 2, timeout_ms: 2000}\n");
    pid_t srv = child(server_child, &w, 0);
    wait_byte(w.done[0]);
    pid_t other = child(other_attached, &w, 1);
    send_bytes(w.go[1], 1);
    wait_byte(w.done[0]);
    kv_engine *e = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(e).host_attached, 1);
    ck_assert_int_eq(load_one(e, 5, BLK), 0);
    kill(srv, SIGKILL);
    ck_assert_int_eq(reap(srv), 128 + SIGKILL);
    send_bytes(w.go2[1], 1);
    /* Every acknowledged (written-through) block loads byte for byte, from
     * whichever of us took the store over. */
    uint64_t t0 = tu_now_ms();
    for (uint64_t n = 0; n < 40; n++) {
        int rc = load_recovering(e, n, t0 + 10000);
        ck_assert_msg(rc == 0, "block %llu: %d", (unsigned long long)n, rc);
    }
    ck_assert_uint_lt(tu_now_ms() - t0, 10000);
    int rc = reap(other);
    ck_assert_msg(rc == 0, "the other attached process exited %d", rc);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* The one "<id>.sock" in dir (a store's socket, or what took its place). */
static void sock_path_in(const char *dir, char *out, size_t len)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    out[0] = '\0';
    while ((de = readdir(d)))
        if (strlen(de->d_name) > 5 && strcmp(de->d_name + strlen(de->d_name) - 5, ".sock") == 0)
            snprintf(out, len, "%s/%s", dir, de->d_name);
    closedir(d);
    ck_assert_msg(out[0], "no socket in %s", dir);
}

/* A takeover that opens the tiers but then cannot serve them (here: its
 * socket's path is taken by a directory; in life, descriptors running out)
 * gives the store back whole: it closes the tiers again, so that the next
 * call, its own or another process's, can take the store over. It used to
 * keep them open, SSD tier and all: every later takeover then failed on the
 * SSD tier's lock, held by the process that had let the store lock go. */
START_TEST(a_takeover_that_cannot_serve_closes_the_tiers_again)
{
    struct world w;
    world_new(&w, "pipeline: dram|ssd\n"
                  "dram: {capacity: 32MiB, hugepages: off}\n"
                  "ssd: {path: \"%s/ssd\", write_through: true, compression: none}\n"
                  "store: {dir: \"%s/rv\"}\n"
                  "io: {threads: 2, timeout_ms: 1000}\n");
    pid_t srv = child(server_child, &w, 0);
    wait_byte(w.done[0]);
    kv_engine *e = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(e).host_attached, 1);
    ck_assert_int_eq(load_one(e, 5, BLK), 0);
    char rv[1100], sock[1400];
    snprintf(rv, sizeof rv, "%s/rv", w.dir);
    sock_path_in(rv, sock, sizeof sock);
    kill(srv, SIGKILL);
    ck_assert_int_eq(reap(srv), 128 + SIGKILL);
    ck_assert_int_eq(unlink(sock), 0);
    ck_assert_int_eq(mkdir(sock, 0700), 0);
    /* The first call finds the server gone; the next takes the store, opens
     * it and cannot bind: both fail. */
    ck_assert_int_ne(load_one(e, 5, BLK), 0);
    ck_assert_int_ne(load_one(e, 5, BLK), 0);
    /* The path is free again: the next call takes the store over, and every
     * written-through block is there. */
    ck_assert_int_eq(rmdir(sock), 0);
    uint64_t t0 = tu_now_ms();
    for (uint64_t n = 0; n < 40; n++) {
        int rc = load_recovering(e, n, t0 + 10000);
        ck_assert_msg(rc == 0, "block %llu: %s", (unsigned long long)n, kv_err_name(rc));
    }
    ck_assert_uint_eq(stats(e).host_attached, 0);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* A child forked by the server AFTER its kv_open (multiprocessing's fork)
 * holds none of its descriptors: once the server is killed, the child's
 * own kv_open takes the store over instead of waiting on a lock it holds
 * itself (or connecting to a socket its copy keeps open). It answers on
 * done: 0 when it serves the store and the dead server's DRAM-only blocks
 * are misses. (With an SSD tier the child could not: RocksDB's table of
 * the files this process has locked is copied by fork; processes that
 * were not forked from the server take an SSD store over.) */
static int forking_server(void *arg, int k)
{
    struct world *w = arg;
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (!e)
        return 10;
    for (uint64_t n = 0; n < 40; n++)
        if (dump_one(e, n, BLK) != KV_OK)
            return 11;
    pid_t c = fork();
    if (c == 0) {
        wait_byte(w->go2[0]);   /* the server is dead now */
        kv_engine *mine = open_cfg(w->yaml, &rc);
        char res = mine ? 0 : 1;
        for (uint64_t n = 0; mine && res == 0 && n < 40; n++)
            if (load_one(mine, n, BLK) != KV_ENOTFOUND)
                res = 2;
        if (mine && res == 0 && (dump_one(mine, 1, BLK) != KV_OK || load_one(mine, 1, BLK) != 0))
            res = 4;
        if (mine) {
            kv_stats st;
            if (kv_stats_get(mine, &st) != KV_OK || st.host_attached)
                res = 3;
            kv_close(mine);
        }
        if (write(w->done[1], &res, 1) != 1)
            _exit(1);
        _exit(0);
    }
    send_bytes(w->done[1], 1);
    for (;;)
        pause();
}

START_TEST(a_child_forked_after_open_takes_over)
{
    struct world w;
    world_new(&w, NAME_YAML);
    pid_t srv = child(forking_server, &w, 0);
    wait_byte(w.done[0]);
    kill(srv, SIGKILL);
    ck_assert_int_eq(reap(srv), 128 + SIGKILL);
    send_bytes(w.go2[1], 1);
    char res = 9;
    ck_assert_int_eq(read(w.done[0], &res, 1), 1);
    ck_assert_int_eq(res, 0);
    world_free(&w);
}
END_TEST

/* DRAM-only blocks of a dead server are misses after the takeover, never
 * wrong bytes. */
START_TEST(dram_only_blocks_of_a_dead_server_are_misses)
{
    struct world w;
    world_new(&w, NAME_YAML);
    pid_t srv = child(server_child, &w, 0);
    wait_byte(w.done[0]);
    kv_engine *e = tu_open_yaml(w.yaml);
    ck_assert_int_eq(load_one(e, 2, BLK), 0);
    kill(srv, SIGKILL);
    ck_assert_int_eq(reap(srv), 128 + SIGKILL);
    uint64_t until = tu_now_ms() + 10000;
    int rc = load_recovering(e, 2, until);
    ck_assert_int_eq(rc, KV_ENOTFOUND);
    ck_assert_uint_eq(stats(e).host_attached, 0);   /* we serve it now */
    ck_assert_int_eq(dump_one(e, 2, BLK), KV_OK);
    ck_assert_int_eq(load_one(e, 2, BLK), 0);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* A failed call is prompt: no hang past io.timeout_ms when the server
 * stops answering (SIGSTOP), and no SIGPIPE when it is gone. A load of a
 * block the stopped server holds in DRAM still reads right: it asks the
 * server nothing (the directory, net/dir.c); one it does not hold asks,
 * and fails in time. */
START_TEST(a_stopped_server_fails_calls_promptly)
{
    struct world w;
    world_new(&w, "pipeline: dram\n"
                  "dram: {capacity: 32MiB, hugepages: off}\n"
                  "store: {name: stopped, dir: \"%s/rv\"}\n"
                  "io: {threads: 2, timeout_ms: 500}\n");
    pid_t srv = child(server_child, &w, 0);
    wait_byte(w.done[0]);
    kv_engine *e = tu_open_yaml(w.yaml);
    ck_assert_int_eq(load_one(e, 1, BLK), 0);
    tu_stop(srv);
    ck_assert_int_eq(load_one(e, 1, BLK), 0);
    uint64_t t0 = tu_now_ms();
    int rc = load_one(e, 1000, BLK);
    ck_assert_int_ne(rc, KV_OK);
    ck_assert_uint_lt(tu_now_ms() - t0, 3000);
    t0 = tu_now_ms();
    ck_assert_int_ne(dump_one(e, 1001, BLK), KV_OK);
    ck_assert_uint_lt(tu_now_ms() - t0, 3000);
    kill(srv, SIGKILL);
    reap(srv);
    signal(SIGPIPE, SIG_DFL);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* ---- who may attach, and what a client may touch ----------------------------------- */

static int nobody_child(void *arg, int k)
{
    struct world *w = arg;
    wait_byte(w->go[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0)
        return 10;
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (e)
        return 11;
    return rc == KV_EPERM ? 0 : 12;
}

START_TEST(another_uid_cannot_attach)
{
    struct world w;
    world_new(&w, NAME_YAML);
    ck_assert_int_eq(chmod(w.dir, 0755), 0);   /* so only the rendezvous dir keeps it out */
    pid_t p = child(nobody_child, &w, 0);
    kv_engine *e = tu_open_yaml(w.yaml);
    send_bytes(w.go[1], 1);
    int rc = reap(p);
    ck_assert_msg(rc == 0, "child exited %d", rc);
    ck_assert_uint_eq(stats(e).host_clients, 0);
    kv_close(e);
    world_free(&w);
}
END_TEST

/* The mapping of memfd NAME in this process, from /proc/self/maps. */
static int find_memfd(const char *name, uintptr_t *lo, uintptr_t *hi)
{
    char want[64];
    snprintf(want, sizeof want, "memfd:%s ", name);
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        if (strstr(line, want) && sscanf(line, "%lx-%lx", lo, hi) == 2)
            found = 1;
    if (f)
        fclose(f);
    return found;
}

static int find_segment(uintptr_t *lo, uintptr_t *hi)
{
    return find_memfd("kvengine-segment", lo, hi);
}

/* 0 when no way this process has of writing [lo, hi) works; else which. */
static int try_writes(uintptr_t lo, uintptr_t hi)
{
    size_t len = hi - lo;
    /* 1: the mapping cannot be made writable */
    if (mprotect((void *)lo, len, PROT_READ | PROT_WRITE) == 0)
        return 3;
    /* 2: nor written through /proc/self/mem (FOLL_FORCE) */
    int mem = open("/proc/self/mem", O_RDWR);
    if (mem >= 0) {
        uint8_t x = 0x5a;
        for (size_t off = 0; off < len; off += 4096)
            if (pwrite(mem, &x, 1, (off_t)(lo + off)) == 1)
                return 4;
        close(mem);
    }
    /* 3: nor through the file behind it, even reopened writable (root
     * may open map_files): the seals refuse a writable mapping and write() */
    char p[128];
    snprintf(p, sizeof p, "/proc/self/map_files/%lx-%lx", (unsigned long)lo, (unsigned long)hi);
    int fd = open(p, O_RDWR);
    if (fd < 0)
        fd = open(p, O_RDONLY);
    if (fd >= 0) {
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED)
            return 5;
        uint8_t x = 0x5a;
        if (pwrite(fd, &x, 1, 0) == 1)
            return 6;
        if (ftruncate(fd, 0) == 0)
            return 7;
        close(fd);
    }
    return 0;
}

/* The segment (10 + which write worked) and its directory (20 + which):
 * what a client reads, it cannot write. */
static int writer_child(void *arg, int k)
{
    struct world *w = arg;
    wait_byte(w->go[0]);
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (!e)
        return 10;
    if (load_one(e, 1, BLK) != 0)
        return 11;
    uintptr_t lo, hi;
    if (!find_segment(&lo, &hi))
        return 12;
    if ((rc = try_writes(lo, hi)) != 0)
        return 10 + rc;
    if (!find_memfd("kvengine-dir", &lo, &hi))
        return 20;
    if ((rc = try_writes(lo, hi)) != 0)
        return 20 + rc;
    kv_close(e);
    return 0;
}

START_TEST(a_client_cannot_write_the_segment)
{
    struct world w;
    world_new(&w, NAME_YAML);
    pid_t p = child(writer_child, &w, 0);
    kv_engine *e = tu_open_yaml(w.yaml);
    /* fill the whole segment's first pages with a known block */
    ck_assert_int_eq(dump_one(e, 1, BLK), KV_OK);
    send_bytes(w.go[1], 1);
    int rc = reap(p);
    ck_assert_msg(rc == 0, "child exited %d", rc);
    ck_assert_int_eq(load_one(e, 1, BLK), 0);   /* unchanged */
    kv_close(e);
    world_free(&w);
}
END_TEST

/* ---- the SSD tier's admin calls, attached --------------------------------------- */

#define WT_YAML                                                                 \
    "pipeline: dram|ssd\n"                                                       \
    "dram: {capacity: 64MiB, hugepages: off}\n"                                  \
    "ssd: {path: \"%s/ssd\", compression: none, write_through: true}\n"          \
    "store: {dir: \"%s/rv\"}\n"                                                  \
    "io: {threads: 2}\n"

struct ssd_count {
    pthread_t caller;
    uint64_t n, stop_at, blocks, bad;
    bool other_thread;
    kv_engine *nested;       /* looked up in from the cb, as a caller may */
    uint64_t nested_hits;
};

static int ssd_count_cb(void *ctx, const kv_ssd_entry *ent)
{
    struct ssd_count *c = ctx;
    c->other_thread |= !pthread_equal(pthread_self(), c->caller);
    uint8_t hit = 0;
    if (c->nested && ent->ns == KV_SSD_NS_BLOCK && c->n % 100 == 0 &&
        kv_lookup(c->nested, &ent->id, 1, &hit) == KV_OK)
        c->nested_hits += hit;
    c->n++;
    c->blocks += ent->ns == KV_SSD_NS_BLOCK;
    c->bad += ent->status != KV_OK;
    return c->stop_at && c->n == c->stop_at;
}

/* Sends frame (op, body) on a hand-spoken connection and reads the header
 * of its answer: the rc, and the body's length in *len. */
static int raw_rpc(int fd, uint32_t op, const void *body, uint32_t blen, uint32_t *len)
{
    uint8_t h[8];
    uint64_t dl = tu_now_ms() + 5000;
    kv__put32(h, blen);
    kv__put32(h + 4, op);
    if (kv__sock_xfer1(fd, h, 8, 1, dl) != KV_OK ||
        (blen && kv__sock_xfer1(fd, (void *)body, blen, 1, dl) != KV_OK) ||
        kv__sock_xfer1(fd, h, 8, 0, dl) != KV_OK)
        return KV_ENET;
    *len = kv__get32(h);
    return (int)kv__get32(h + 4);
}

#define WTN_YAML                                                                \
    "pipeline: dram|ssd\n"                                                       \
    "dram: {capacity: 64MiB, hugepages: off}\n"                                  \
    "ssd: {path: \"%s/ssd\", compression: none, write_through: true}\n"          \
    "store: {name: \"host-test\", dir: \"%s/rv\"}\n"                             \
    "io: {threads: 2}\n"

/* A client's pins end while its walk waits on it: the server, waiting for
 * the SSD_NEXT of a scan, still ends the pins the client marks done on its
 * board, as a quiet connection does. Spoken by hand: LOAD of a block in
 * DRAM (pinned), then SSD_SCAN on the same connection, its first batch
 * read and left unanswered; the pin's byte set only then. Before: the pin
 * stayed until the walk ended (host_pins 1 after 5 s). */
START_TEST(a_walk_ends_the_pins_copied_meanwhile)
{
    struct world w;
    world_new(&w, WTN_YAML);
    kv_engine *e = tu_open_yaml(w.yaml);
    enum { N = 1100 };   /* more than one batch of the scan */
    for (uint64_t n = 0; n < N; n++)
        ck_assert_int_eq(dump_one(e, n, n == 5 ? BLK : 64), KV_OK);
    char sock[512];
    snprintf(sock, sizeof sock, "%s/rv/host-test.sock", w.dir);
    uint8_t *board = NULL;
    int fd = raw_client(sock, &board);
    ck_assert_int_ge(fd, 0);
    /* LOAD of block 5: u32 n, then id, u32 index, u64 len, loc (13 bytes) */
    uint8_t req[4 + 41] = { 0 };
    kv__put32(req, 1);
    kv_block_id id = tu_id(5, 16);
    memcpy(req + 4, id.bytes, 16);
    kv__put64(req + 24, BLK);
    req[32] = 1;   /* staging, were it not pinned */
    uint32_t len = 0;
    ck_assert_int_eq(raw_rpc(fd, 3 /* OP_LOAD */, req, sizeof req, &len), KV_OK);
    ck_assert_uint_eq(len, 17);
    uint8_t a[17];
    ck_assert_int_eq(kv__sock_xfer1(fd, a, 17, 0, tu_now_ms() + 5000), KV_OK);
    ck_assert_int_eq((int)kv__get32(a), KV_OK);
    ck_assert_uint_eq(a[4], 1);   /* pinned */
    uint32_t slot = kv__get32(a + 13);
    ck_assert_uint_lt(slot, 8192);
    /* The scan's first batch: rc MORE, u32 n = 1024, its entries. */
    ck_assert_int_eq(raw_rpc(fd, 17 /* OP_SSD_SCAN */, NULL, 0, &len), 1);
    uint8_t *batch = malloc(len);
    ck_assert_int_eq(kv__sock_xfer1(fd, batch, len, 0, tu_now_ms() + 5000), KV_OK);
    ck_assert_uint_eq(kv__get32(batch), 1024);
    ck_assert_uint_eq(stats(e).host_pins, 1);
    /* Copied now, the walk waiting on us: the server ends it by itself. */
    __atomic_store_n(&board[slot], 1, __ATOMIC_RELEASE);
    uint64_t t0 = tu_now_ms();
    while (stats(e).host_pins && tu_now_ms() - t0 < 5000)
        usleep(2000);
    ck_assert_uint_eq(stats(e).host_pins, 0);
    ck_assert_uint_eq(board[slot], 0);
    /* The walk still answers: stop it, and its last frame comes. */
    uint8_t stop = 1;
    ck_assert_int_eq(raw_rpc(fd, 19 /* OP_SSD_NEXT */, &stop, 1, &len), KV_OK);
    ck_assert_uint_eq(len, 4 + 16);   /* no more entries, then the counts */
    free(batch);
    close(fd);
    munmap(board, 8192);
    kv_close(e);
    world_free(&w);
}
END_TEST

struct scrub_seen {
    kv_block_id bad[8];
    size_t nbad;
    uint64_t n;
};

static int scrub_seen_cb(void *ctx, const kv_ssd_entry *ent)
{
    struct scrub_seen *s = ctx;
    s->n++;
    if (ent->status != KV_OK && s->nbad < KV__ARRAY_LEN(s->bad))
        s->bad[s->nbad++] = ent->id;
    return 0;
}

static bool id_in(const kv_block_id *ids, size_t n, const kv_block_id *id)
{
    for (size_t i = 0; i < n; i++)
        if (!memcmp(ids[i].bytes, id->bytes, KV_BLOCK_ID_LEN))
            return true;
    return false;
}

/* An attached scrub of a damaged value log: payload bytes flipped in three
 * records behind the serving engine (the file written under it, as a bad
 * disk would), then a client's kv_ssd_scrub reports exactly those three
 * blocks as corrupt and every other value as good, as the serving engine's
 * own scrub does; without repair nothing is dropped. (New: no test had an
 * attached scrub find anything.) */
START_TEST(an_attached_scrub_reports_exactly_the_damaged_values)
{
    struct world w;
    world_new(&w, WTN_YAML);
    kv_engine *a = tu_open_yaml(w.yaml);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    enum { N = 40, LEN = 32768 };   /* records of 32 KiB start on 4 KiB: a fixed span */
    for (uint64_t n = 0; n < N; n++)
        ck_assert_int_eq(dump_one(a, n, LEN), KV_OK);
    /* The value log file, and the blocks of records 3, 11 and 19 in it,
     * read from their headers (magic, then the key: ns, id, index). */
    char vdir[1200], path[1500] = "";
    snprintf(vdir, sizeof vdir, "%s/ssd/vlog", w.dir);
    DIR *d = opendir(vdir);
    ck_assert(d != NULL);
    off_t biggest = -1;   /* the one the records went to (a fresh file may follow it) */
    for (struct dirent *de; (de = readdir(d));) {
        char p[1500];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", vdir, de->d_name);
        if (strstr(de->d_name, ".vlog") && stat(p, &st) == 0 && st.st_size > biggest) {
            biggest = st.st_size;
            memcpy(path, p, sizeof path);
        }
    }
    closedir(d);
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    const off_t span = (off_t)kv__vlog_span(LEN), base = 4096;
    const int rec[] = { 3, 11, 19 };
    kv_block_id hurt[3];
    for (size_t k = 0; k < KV__ARRAY_LEN(rec); k++) {
        uint8_t h[KV__VLOG_HDR], x;
        off_t at = base + rec[k] * span;
        ck_assert_int_eq(pread(fd, h, sizeof h, at), (ssize_t)sizeof h);
        ck_assert(!memcmp(h, "KVV3", 4));
        ck_assert_uint_eq(kv__get32(h + 4), LEN);
        memcpy(hurt[k].bytes, h + 14, KV_BLOCK_ID_LEN);
        at += KV__VLOG_HDR + 1000 + 7000 * (off_t)k;   /* a payload byte */
        ck_assert_int_eq(pread(fd, &x, 1, at), 1);
        x ^= 0xff;
        ck_assert_int_eq(pwrite(fd, &x, 1, at), 1);
    }
    close(fd);
    struct scrub_seen there = { .n = 0 }, here = { .n = 0 };
    uint64_t checked = 0, bad = 0;
    ck_assert_int_eq(kv_ssd_scrub(b, 0, scrub_seen_cb, &there, &checked, &bad), KV_OK);
    ck_assert_uint_eq(checked, N);
    ck_assert_uint_eq(there.n, N);
    ck_assert_uint_eq(bad, 3);
    ck_assert_uint_eq(there.nbad, 3);
    for (size_t k = 0; k < 3; k++)
        ck_assert_msg(id_in(hurt, 3, &there.bad[k]), "entry %zu reported corrupt was not damaged", k);
    /* The server's own scrub says the same. */
    ck_assert_int_eq(kv_ssd_scrub(a, 0, scrub_seen_cb, &here, &checked, &bad), KV_OK);
    ck_assert_uint_eq(bad, 3);
    ck_assert_uint_eq(here.nbad, 3);
    for (size_t k = 0; k < 3; k++)
        ck_assert(id_in(there.bad, 3, &here.bad[k]));
    /* Without repair nothing was dropped: a second attached scrub again. */
    memset(&there, 0, sizeof there);
    ck_assert_int_eq(kv_ssd_scrub(b, 0, scrub_seen_cb, &there, &checked, &bad), KV_OK);
    ck_assert_uint_eq(checked, N);
    ck_assert_uint_eq(bad, 3);
    kv_close(b);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* kv_ssd_scan / _scrub / _compact / _remove of an attached engine run on
 * the server's tier: the entries stream back in batches, cb runs on the
 * caller's thread, and a stop ends the stream cleanly (the connection goes
 * on serving). Before: KV_ENOTSUP, for every one of them. */
START_TEST(attached_ssd_calls_run_on_the_server)
{
    struct world w;
    world_new(&w, WT_YAML);
    kv_engine *a = tu_open_yaml(w.yaml);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    enum { N = 2500 };
    for (uint64_t i = 0; i < N; i++)
        ck_assert_int_eq(dump_one(a, i, 100 + i % 50), KV_OK);
    struct ssd_count here = { .caller = pthread_self() };
    ck_assert_int_eq(kv_ssd_scan(a, ssd_count_cb, &here), KV_OK);
    ck_assert_uint_eq(here.blocks, N);
    /* the whole scan, in batches: more than one request, one per batch */
    struct ssd_count there = { .caller = pthread_self() };
    uint64_t r0 = kv__host_requests(a);
    ck_assert_int_eq(kv_ssd_scan(b, ssd_count_cb, &there), KV_OK);
    ck_assert_uint_eq(there.n, here.n);
    ck_assert_uint_eq(there.blocks, N);
    ck_assert(!there.other_thread);
    ck_assert_uint_ge(kv__host_requests(a) - r0, 1 + here.n / 1024);
    /* stopped mid-batch: exactly that many calls, and the next call works */
    struct ssd_count part = { .caller = pthread_self(), .stop_at = 1500, .nested = b };
    ck_assert_int_eq(kv_ssd_scan(b, ssd_count_cb, &part), KV_OK);
    ck_assert_uint_eq(part.n, 1500);
    ck_assert_uint_ge(part.nested_hits, 1);   /* the engine answers from inside the cb */
    ck_assert_int_eq(load_one(b, 3, 103), 0);
    /* scrub: the counts with and without a cb, and when stopped */
    uint64_t checked = 0, bad = 9;
    struct ssd_count sc = { .caller = pthread_self() };
    ck_assert_int_eq(kv_ssd_scrub(b, 0, ssd_count_cb, &sc, &checked, &bad), KV_OK);
    ck_assert_uint_eq(checked, here.n);
    ck_assert_uint_eq(bad, 0);
    ck_assert_uint_eq(sc.n, here.n);
    ck_assert(!sc.other_thread);
    checked = 0;
    ck_assert_int_eq(kv_ssd_scrub(b, 1, NULL, NULL, &checked, NULL), KV_OK);
    ck_assert_uint_eq(checked, here.n);
    struct ssd_count sstop = { .caller = pthread_self(), .stop_at = 10 };
    ck_assert_int_eq(kv_ssd_scrub(b, 0, ssd_count_cb, &sstop, &checked, &bad), KV_OK);
    ck_assert_uint_eq(sstop.n, 10);
    ck_assert_uint_eq(checked, 10);   /* what the caller saw, as in process */
    /* compact, and remove: a block goes from the SSD tier, once */
    ck_assert_int_eq(kv_ssd_compact(b), KV_OK);
    kv_block_id id = tu_id(7, 16);
    ck_assert_int_eq(kv_ssd_remove(b, &id), KV_OK);
    ck_assert_int_eq(kv_ssd_remove(b, &id), KV_ENOTFOUND);
    struct ssd_count after = { .caller = pthread_self() };
    ck_assert_int_eq(kv_ssd_scan(b, ssd_count_cb, &after), KV_OK);
    ck_assert_uint_eq(after.blocks, N - 1);
    ck_assert_int_eq(kv_ssd_scan(b, NULL, NULL), KV_EINVAL);
    kv_close(b);
    kv_close(a);
    world_free(&w);

    /* a store without an SSD tier says so through the socket too */
    world_new(&w, NAME_YAML);
    a = tu_open_yaml(w.yaml);
    b = tu_open_yaml(w.yaml);
    ck_assert_int_eq(kv_ssd_scan(b, ssd_count_cb, &after), KV_ENOTSUP);
    ck_assert_int_eq(kv_ssd_scrub(b, 0, NULL, NULL, NULL, NULL), KV_ENOTSUP);
    ck_assert_int_eq(kv_ssd_compact(b), KV_ENOTSUP);
    ck_assert_int_eq(kv_ssd_remove(b, &id), KV_ENOTSUP);
    ck_assert_int_eq(load_one(b, 1, 10), KV_ENOTFOUND);   /* and serves on */
    kv_close(b);
    kv_close(a);
    world_free(&w);
}
END_TEST

/* The server of the walk below: 3000 blocks on SSD, then it waits to die. */
static int walk_server_child(void *arg, int k)
{
    struct world *w = arg;
    (void)k;
    int rc;
    kv_engine *e = open_cfg(w->yaml, &rc);
    if (!e)
        return 10;
    for (uint64_t i = 0; i < 3000; i++)
        if (dump_one(e, i, 64) != KV_OK)
            return 11;
    send_bytes(w->done[1], 1);
    for (;;)
        pause();
}

struct killer {
    pid_t server;
    kv_engine *e;
    uint64_t n;
    int nested;
};

static int kill_cb(void *ctx, const kv_ssd_entry *ent)
{
    struct killer *k = ctx;
    if (++k->n == 1) {
        kill(k->server, SIGKILL);
        reap(k->server);
    }
    /* from inside the cb, with the server gone: an error, not a hang */
    if (k->n == 2 || k->n == 3) {   /* the first finds it gone, the second finds it broken */
        uint8_t hit;
        int rc = kv_lookup(k->e, &ent->id, 1, &hit);
        k->nested = k->n == 2 || rc != KV_OK ? rc : k->nested;
    }
    return 0;
}

/* The server SIGKILLed in the middle of a scan: the walk fails promptly
 * (the next batch never comes), a call the cb makes meanwhile fails rather
 * than waiting for itself, and the next call takes the store over, its SSD
 * blocks intact. */
START_TEST(a_walk_survives_its_server_dying)
{
    struct world w;
    world_new(&w, WT_YAML);
    pid_t p = child(walk_server_child, &w, 0);
    wait_byte(w.done[0]);
    kv_engine *b = tu_open_yaml(w.yaml);
    ck_assert_uint_eq(stats(b).host_attached, 1);
    struct killer k = { .server = p, .e = b };
    int rc = kv_ssd_scan(b, kill_cb, &k);
    ck_assert_msg(rc == KV_ENET || rc == KV_ETIMEDOUT, "%s", kv_err_name(rc));
    ck_assert_uint_le(k.n, 1024);   /* the first batch, no more */
    ck_assert_msg(k.nested == KV_ENET || k.nested == KV_ETIMEDOUT, "%s", kv_err_name(k.nested));
    ck_assert_int_eq(load_one(b, 2999, 64), 0);   /* taken over: serves itself now */
    ck_assert_uint_eq(stats(b).host_attached, 0);
    struct ssd_count all = { .caller = pthread_self() };
    ck_assert_int_eq(kv_ssd_scan(b, ssd_count_cb, &all), KV_OK);
    ck_assert_uint_eq(all.blocks, 3000);
    kv_close(b);
    world_free(&w);
}
END_TEST

static kv_config *cfg_of(const char *yaml)
{
    kv_config *cfg = NULL;
    char err[512] = "";
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    ck_assert_msg(kv_config_parse(cfg, yaml, strlen(yaml), err, sizeof err) == KV_OK, "%s", err);
    return cfg;
}

/* kv_ssd_recover is offline: beside the process serving the store it
 * refuses, naming that process, and changes nothing; once it is gone it
 * runs. Before: RocksDB's "in use" from deep inside the tier. */
START_TEST(recover_refuses_a_served_store)
{
    struct world w;
    world_new(&w, WT_YAML);
    kv_engine *a = tu_open_yaml(w.yaml);
    for (uint64_t i = 0; i < 20; i++)
        ck_assert_int_eq(dump_one(a, i, 3000), KV_OK);
    kv_config *cfg = cfg_of(w.yaml);
    char err[512] = "", want[64];
    uint64_t n = 99;
    ck_assert_int_eq(kv_ssd_recover(cfg, &n, err, sizeof err), KV_EBUSY);
    ck_assert_uint_eq(n, 0);
    snprintf(want, sizeof want, "served by pid %ld", (long)getpid());
    ck_assert_msg(strstr(err, want) && strstr(err, "stop it first"), "%s", err);
    for (uint64_t i = 0; i < 20; i++)
        ck_assert_int_eq(load_one(a, i, 3000), 0);   /* untouched, still served */
    kv_close(a);
    ck_assert_msg(kv_ssd_recover(cfg, &n, err, sizeof err) == KV_OK, "%s", err);
    ck_assert_uint_eq(n, 20);
    a = tu_open_yaml(w.yaml);   /* the lock was given back: it serves again */
    ck_assert_uint_eq(stats(a).host_attached, 0);
    ck_assert_int_eq(load_one(a, 5, 3000), 0);
    kv_close(a);
    kv_config_free(cfg);
    world_free(&w);
}
END_TEST

/* kvctl ssd ls | scrub | compact and rm --block beside a kvnode serving the
 * store: they attach and run on it; ssd recover refuses, naming kvnode. */
START_TEST(kvctl_ssd_beside_a_kvnode)
{
    char *dir = tu_mkdtemp();
    char s_path[1200], s_dir[1200], bin[1200], log[1200], sock[1200];
    snprintf(s_path, sizeof s_path, "ssd.path=%s/ssd", dir);
    snprintf(s_dir, sizeof s_dir, "store.dir=%s/rv", dir);
    snprintf(bin, sizeof bin, "%s/kvnode", tu_build_dir());
    snprintf(log, sizeof log, "%s/kvnode.log", dir);
    snprintf(sock, sizeof sock, "%s/rv/kvh.sock", dir);
    pid_t node = fork();
    ck_assert_int_ge(node, 0);
    if (node == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(bin, bin, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path,
              "--set", "pipeline=dram|ssd", "--set", "dram.capacity=32MiB",
              "--set", "dram.hugepages=off", "--set", "ssd.write_through=true", (char *)NULL);
        _exit(127);
    }
    uint64_t t0 = tu_now_ms();
    while (access(sock, F_OK) != 0 && tu_now_ms() - t0 < 20000)
        usleep(20000);
    ck_assert_msg(access(sock, F_OK) == 0, "kvnode never served; its log:\n%s", slurp(log));
    char *data = write_file(dir, "value", "the bytes of a block\n");
    const char *blk = "00112233445566778899aabbccddeeff";
    struct out r = run_kvctl(dir, 20, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path,
                             "put", "--block", blk, data, NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    r = run_kvctl(dir, 20, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path, "ssd",
                  "ls", "--json", NULL);
    CK_STATUS(r, 0);
    struct jv *v = jparse(r.out);
    ck_assert_msg(v != NULL, "not JSON:\n%s", r.out);
    ck_assert_int_eq((int)jnum_of(v, "count"), 1);
    jfree(v);
    CK_HAS(r.out, blk);
    out_free(&r);
    r = run_kvctl(dir, 20, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path, "ssd",
                  "scrub", "--json", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "\"checked\":1,");
    out_free(&r);
    r = run_kvctl(dir, 20, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path, "ssd",
                  "compact", NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    r = run_kvctl(dir, 20, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path, "rm",
                  "--block", blk, NULL);
    CK_STATUS(r, 0);
    out_free(&r);
    r = run_kvctl(dir, 20, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path, "ssd",
                  "ls", "--json", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "\"count\":0");
    out_free(&r);
    char want[64];
    snprintf(want, sizeof want, "served by pid %ld", (long)node);
    r = run_kvctl(dir, 20, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path, "ssd",
                  "recover", NULL);
    CK_STATUS(r, 1);
    CK_HAS(r.err, want);
    CK_HAS(r.err, "stop it first");
    out_free(&r);
    kill(node, SIGTERM);
    ck_assert_int_eq(reap(node), 0);
    /* with kvnode gone, recover runs */
    r = run_kvctl(dir, 60, "--set", "store.name=kvh", "--set", s_dir, "--set", s_path, "ssd",
                  "recover", "--json", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "\"recovered\":0");
    out_free(&r);
    free(data);
    tu_rmdir(dir);
}
END_TEST

Suite *host_suite(void)
{
    Suite *s = suite_create("host");
    TCase *tc = tcase_create("share");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, two_processes_share_by_ssd_path);
    tcase_add_test(tc, two_processes_share_by_store_name);
    tcase_add_test(tc, eight_processes_share_by_ssd_path);
    tcase_add_test(tc, eight_processes_share_by_store_name);
    tcase_add_test(tc, second_engine_in_a_process_attaches);
    tcase_add_test(tc, many_calls_are_one_round_trip_per_chunk);
    tcase_add_test(tc, a_dump_from_shared_buffers_is_one_request);
    tcase_add_test(tc, a_second_host_of_one_ssd_path_is_busy);
    tcase_add_test(tc, an_unsafe_store_dir_is_refused);
    tcase_add_test(tc, an_opening_holder_is_waited_for);
    tcase_add_test(tc, an_opening_holder_is_waited_for_past_a_dead_servers_socket);
    tcase_add_test(tc, the_dram_budget_is_counted_once);
    tcase_add_test(tc, a_shared_segment_gets_huge_pages_without_shmem_thp);
    tcase_add_test(tc, a_shared_segment_is_collapsed_after_open);
    tcase_add_test(tc, pins_end_without_a_message_of_their_own);
    tcase_add_test(tc, a_retracted_shard_is_never_named);
    tcase_add_test(tc, attached_loads_of_dram_shards_ask_nothing);
    tcase_add_test(tc, direct_loads_never_read_reused_memory);
    tcase_add_test(tc, a_direct_load_keeps_its_block_warm);
    tcase_add_test(tc, a_peer_of_another_version_is_refused);
    tcase_add_test(tc, attached_bench_compares_kv_buffer_dumps);
    tcase_add_test(tc, a_pin_ends_only_once_its_copy_is_marked_done);
    suite_add_tcase(s, tc);
    tc = tcase_create("death");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, killed_clients_leave_nothing_behind);
    tcase_add_test(tc, a_killed_server_is_taken_over);
    tcase_add_test(tc, a_takeover_that_cannot_serve_closes_the_tiers_again);
    /* ThreadSanitizer cannot run a child that starts threads after a
     * multi-threaded fork (it dies: "starting new threads after
     * multi-threaded fork is not supported"), which is this test. */
#ifndef __SANITIZE_THREAD__
    tcase_add_test(tc, a_child_forked_after_open_takes_over);
#else
    (void)a_child_forked_after_open_takes_over;
#endif
    tcase_add_test(tc, dram_only_blocks_of_a_dead_server_are_misses);
    tcase_add_test(tc, a_stopped_server_fails_calls_promptly);
    suite_add_tcase(s, tc);
    tc = tcase_create("safety");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, another_uid_cannot_attach);
    tcase_add_test(tc, a_client_cannot_write_the_segment);
    suite_add_tcase(s, tc);
    tc = tcase_create("ssd");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, attached_ssd_calls_run_on_the_server);
    tcase_add_test(tc, a_walk_survives_its_server_dying);
    tcase_add_test(tc, recover_refuses_a_served_store);
    tcase_add_test(tc, kvctl_ssd_beside_a_kvnode);
    tcase_add_test(tc, a_walk_ends_the_pins_copied_meanwhile);
    tcase_add_test(tc, an_attached_scrub_reports_exactly_the_damaged_values);
    suite_add_tcase(s, tc);
    return s;
}
