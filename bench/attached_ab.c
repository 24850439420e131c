/*
 * attached_ab.c — attached dumps against in-process dumps, batch by batch
 * in one process: a measurement to read, not a test.
 *
 *   attached_ab STORE_NAME STORE_DIR [VALUE_BYTES [BATCH [BATCHES [own]]]]
 *
 * Opens an engine attached to the host store STORE_NAME (a kvnode serving
 * it, pipeline dram, in STORE_DIR) and an in-process DRAM engine, then
 * dumps BATCHES batches of BATCH values of VALUE_BYTES to each, the two
 * alternated batch by batch (ABBA), from kv_buffer_alloc memory of each
 * engine (or, with "own", from the program's own buffers). kvctl bench
 * --compare runs the two as phases one after the other; on a shared VM the
 * memory bandwidth drifts by 2x between them, and so did the ratio. Here
 * both see the same drift, batch by batch. Prints the median batch time of
 * each, their ratio, and the ratios of the 25th and 75th percentiles.
 * The in-process engine's dram.capacity is sized to hold every batch (no
 * eviction on either side: give the kvnode as much).
 *
 *   cc -O2 -Iinclude bench/attached_ab.c -o build/attached_ab -Lbuild -lkvengine
 *   (bench/attached_dumps.sh AB=1 builds and runs it beside a kvnode)
 */
#include <kvengine.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_d);
    return v[(size_t)(p * (double)(n - 1))];
}

static kv_engine *open_engine(const char *name, const char *dir, uint64_t cap)
{
    kv_config *cfg;
    kv_engine *e = NULL;
    char c[32];
    snprintf(c, sizeof c, "%llu", (unsigned long long)cap);
    if (kv_config_new(&cfg) != KV_OK)
        return NULL;
    int rc = kv_config_set(cfg, "pipeline", "dram");
    rc = rc ? rc : kv_config_set(cfg, "dram.capacity", c);
    rc = rc ? rc : kv_config_set(cfg, "log.level", "warn");
    if (name) {
        rc = rc ? rc : kv_config_set(cfg, "store.name", name);
        rc = rc ? rc : kv_config_set(cfg, "store.dir", dir);
    }
    if (rc == KV_OK && kv_open(cfg, &e) != KV_OK)
        e = NULL;
    kv_config_free(cfg);
    return e;
}

/* One batch of m values from buf as blocks [first, first + m); its
 * microseconds, or a negative number when it failed. */
static double dump_batch(kv_engine *e, uint8_t *buf, size_t vs, size_t m, uint64_t salt,
                         uint64_t first, kv_shard *sh, kv_iov *iov)
{
    for (size_t k = 0; k < m; k++) {
        uint64_t n = first + k;
        memset(&sh[k], 0, sizeof sh[k]);
        memcpy(sh[k].block.bytes, &salt, 8);
        memcpy(sh[k].block.bytes + 8, &n, 8);
        memcpy(buf + k * vs, &n, 8);   /* each value its own */
        iov[k] = (kv_iov){ buf + k * vs, vs };
        sh[k].iov = &iov[k];
        sh[k].iovcnt = 1;
    }
    double t = now_us();
    kv_task task = 0;
    if (kv_dump(e, sh, m, &task) != KV_OK || kv_wait(e, task, 0) != KV_OK)
        return -1;
    return now_us() - t;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return fprintf(stderr, "usage: attached_ab STORE_NAME STORE_DIR [VALUE_BYTES [BATCH "
                               "[BATCHES [own]]]]\n"), 2;
    size_t vs = argc > 3 ? strtoull(argv[3], NULL, 0) : 1u << 20;
    size_t m = argc > 4 ? strtoull(argv[4], NULL, 0) : 16;
    size_t batches = argc > 5 ? strtoull(argv[5], NULL, 0) : 60;
    int own = argc > 6 && strcmp(argv[6], "own") == 0;
    if (vs < 8 || m == 0 || batches == 0)
        return fprintf(stderr, "attached_ab: VALUE_BYTES >= 8, BATCH and BATCHES > 0\n"), 2;
    uint64_t cap = (uint64_t)vs * m * batches * 5 / 4 + (256ull << 20);
    kv_engine *att = open_engine(argv[1], argv[2], 1ull << 30);
    kv_engine *loc = open_engine(NULL, NULL, cap);
    if (!att || !loc)
        return fprintf(stderr, "attached_ab: cannot open the engines\n"), 1;
    kv_stats st;
    if (kv_stats_get(att, &st) != KV_OK || !st.host_attached)
        return fprintf(stderr, "attached_ab: nobody serves %s in %s\n", argv[1], argv[2]), 1;
    void *ba = NULL, *bl = NULL;
    if (own) {
        ba = aligned_alloc(4096, (vs * m + 4095) & ~(size_t)4095);
        bl = aligned_alloc(4096, (vs * m + 4095) & ~(size_t)4095);
    } else if (kv_buffer_alloc(att, vs * m, &ba) != KV_OK || kv_buffer_alloc(loc, vs * m, &bl) != KV_OK) {
        ba = bl = NULL;
    }
    kv_shard *sh = calloc(m, sizeof *sh);
    kv_iov *iov = calloc(m, sizeof *iov);
    double *ta = calloc(batches, sizeof *ta), *tl = calloc(batches, sizeof *tl);
    if (!ba || !bl || !sh || !iov || !ta || !tl)
        return fprintf(stderr, "attached_ab: out of memory\n"), 1;
    memset(ba, 0x5a, vs * m);
    memset(bl, 0x5a, vs * m);
    uint64_t salt = (uint64_t)now_us();
    /* one warm-up batch each: the buffer's mapping on the server, the pool */
    if (dump_batch(att, ba, vs, m, salt, 1ull << 40, sh, iov) < 0 ||
        dump_batch(loc, bl, vs, m, salt, 1ull << 40, sh, iov) < 0)
        return fprintf(stderr, "attached_ab: a dump failed\n"), 1;
    for (size_t i = 0; i < batches; i++) {
        uint64_t first = (uint64_t)i * m;
        for (int j = 0; j < 2; j++) {
            bool a = (j == 0) == (i % 2 == 0);   /* ABBA */
            double t = a ? dump_batch(att, ba, vs, m, salt, first, sh, iov)
                         : dump_batch(loc, bl, vs, m, salt, first, sh, iov);
            if (t < 0)
                return fprintf(stderr, "attached_ab: a dump failed\n"), 1;
            (a ? ta : tl)[i] = t;
        }
    }
    double mib = (double)(vs * m) / (1 << 20);
    double a50 = pct(ta, batches, 0.5), l50 = pct(tl, batches, 0.5);
    double a25 = pct(ta, batches, 0.25), l25 = pct(tl, batches, 0.25);
    double a75 = pct(ta, batches, 0.75), l75 = pct(tl, batches, 0.75);
    printf("%s dumps of %zu x %zu B, %zu batches each, alternated:\n",
           own ? "own-buffer" : "kv_buffer_alloc", m, vs, batches);
    printf("  attached    p50 %8.1f us (%6.0f MiB/s)  p25 %8.1f  p75 %8.1f\n", a50,
           mib / a50 * 1e6, a25, a75);
    printf("  in process  p50 %8.1f us (%6.0f MiB/s)  p25 %8.1f  p75 %8.1f\n", l50,
           mib / l50 * 1e6, l25, l75);
    printf("  attached / in process: %.2fx (p50)  %.2fx (p25)  %.2fx (p75)\n", l50 / a50,
           l25 / a25, l75 / a75);
    if (!own) {
        kv_buffer_free(att, ba);
        kv_buffer_free(loc, bl);
    } else {
        free(ba);
        free(bl);
    }
    free(sh);
    free(iov);
    free(ta);
    free(tl);
    kv_close(att);
    kv_close(loc);
    return 0;
}
