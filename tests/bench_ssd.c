/*
 * bench_ssd.c — measures the SSD tier against UCM's file-per-block layout.
 *
 * Not part of the test runner; built by hand:
 *   make BUILD=build/ssd lib && cc -O2 -D_GNU_SOURCE -Iinclude -Iengine -Ipersist \
 *     tests/bench_ssd.c build/ssd/obj/persist/{index,rocks,spill,vlog}.o \
 *     build/ssd/obj/engine/{errors,log,config}.o \
 *     -o build/ssd/bench_ssd -lrocksdb -lxxhash -llz4 -lyaml -lpthread
 * (only the SSD tier's objects: the bench needs nothing else, and so does
 * not wait on the rest of the library to link).
 *
 * Modes (first argument):
 *   rocks   writes N blocks through kv__ssd_write (or --spill: through the
 *           spill sink in batches), closes (which flushes), reports blocks/s
 *           acknowledged and including the close, and bytes written to disk
 *           per byte stored (/proc/self/io write_bytes).
 *   files   the Posix layout: 4096 hashed directories, temp file + rename,
 *           no fsync (--fsync to fsync each file), same data.
 *   open    fills N small blocks, then times reopen (index rebuild) and
 *           reports index bytes per value.
 *   ratio   lz4 compression ratio on random and half-compressible blocks.
 * Options: --dir D --blocks N --size BYTES --sync none|wal|fsync
 *          --wbuf MiB --bg N --batch KiB --spill --comp none|lz4
 *          --half (half-compressible data) --wbn N (memtables)
 *          --vlogfile MiB (value log file size)
 */
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "persist/ssd.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static unsigned long long io_written(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    unsigned long long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "write_bytes: %llu", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t xs(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static size_t g_size = 256 << 10;
static int g_half;
static uint8_t *pool;
static size_t pool_len;

/* Random bytes (incompressible), or with --half, every other 4 KiB zeroed. */
static void make_pool(void)
{
    pool_len = 64u << 20;
    pool = malloc(pool_len + g_size);
    for (size_t i = 0; i + 8 <= pool_len + g_size; i += 8) {
        uint64_t v = xs();
        memcpy(pool + i, &v, 8);
    }
    if (g_half)
        for (size_t i = 0; i < pool_len + g_size; i += 8192)
            memset(pool + i, 0, 4096 < pool_len + g_size - i ? 4096 : pool_len + g_size - i);
}
static const uint8_t *block_data(uint64_t n) { return pool + (n * 4099 * 64) % pool_len; }

static kv_block_id bid(uint64_t n)
{
    kv_block_id id;
    uint64_t a = n * 0x9e3779b97f4a7c15ull, b = ~n * 0xbf58476d1ce4e5b9ull;
    memcpy(id.bytes, &a, 8);
    memcpy(id.bytes + 8, &b, 8);
    return id;
}

/* The engine's iovec helpers, here so the bench links without engine.o. */
void kv__iov_gather(void *dst, const kv_iov *iov, uint32_t cnt)
{
    uint8_t *d = dst;
    for (uint32_t i = 0; i < cnt; i++) {
        memcpy(d, iov[i].base, iov[i].len);
        d += iov[i].len;
    }
}
void kv__iov_scatter(const kv_iov *iov, uint32_t cnt, const void *src)
{
    const uint8_t *p = src;
    for (uint32_t i = 0; i < cnt; i++) {
        memcpy(iov[i].base, p, iov[i].len);
        p += iov[i].len;
    }
}

struct fake_victim {
    struct kv__victim v;
    struct kv__victim_shard sh;
};
static void fv_release(struct kv__victim *v) { free(v); }

int main(int argc, char **argv)
{
    const char *dir = "/tmp/kvbench", *mode = argc > 1 ? argv[1] : "rocks";
    uint64_t n = 10000;
    int sync = KV_SYNC_NONE, spill = 0, comp = KV_COMP_NONE, fsync_files = 0;
    struct kv__ssd_tuning t;
    kv__ssd_tuning_defaults(&t);
    static const struct option lo[] = {
        { "dir", 1, 0, 'd' }, { "blocks", 1, 0, 'n' }, { "size", 1, 0, 's' },
        { "sync", 1, 0, 'y' }, { "wbuf", 1, 0, 'b' },
        { "bg", 1, 0, 'g' }, { "batch", 1, 0, 'B' }, { "spill", 0, 0, 'S' },
        { "comp", 1, 0, 'c' }, { "half", 0, 0, 'h' }, { "fsync", 0, 0, 'f' },
        { "vlogfile", 1, 0, 'F' }, { "wbn", 1, 0, 'W' }, { 0, 0, 0, 0 } };
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'd': dir = optarg; break;
        case 'n': n = strtoull(optarg, 0, 10); break;
        case 's': g_size = strtoull(optarg, 0, 10); break;
        case 'y': sync = !strcmp(optarg, "wal") ? KV_SYNC_WAL : !strcmp(optarg, "fsync") ? KV_SYNC_FSYNC : KV_SYNC_NONE; break;
        case 'b': t.write_buffer = strtoull(optarg, 0, 10) << 20; break;
        case 'g': t.bg_jobs = atoi(optarg); break;
        case 'B': t.batch_bytes = strtoull(optarg, 0, 10) << 10; break;
        case 'S': spill = 1; break;
        case 'c': comp = !strcmp(optarg, "lz4") ? KV_COMP_LZ4 : KV_COMP_NONE; break;
        case 'h': g_half = 1; break;
        case 'f': fsync_files = 1; break;
        case 'F': t.vlog_file_size = strtoull(optarg, 0, 10) << 20; break;
        case 'W': t.write_buffers = atoi(optarg); break;
        default: fprintf(stderr, "see the comment at the top of tests/bench_ssd.c\n"); return 2;
        }
    }
    make_pool();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    kv_config *cfg = NULL;
    kv_config_new(&cfg);
    snprintf(cfg->ssd.path, sizeof cfg->ssd.path, "%s", dir);
    cfg->ssd.sync = sync;
    cfg->ssd.compression = comp;
    cfg->ssd.capacity = 0;
    cfg->ssd.spill_queue = 256ull << 20;
    char err[512] = "";
    double bytes = (double)n * (double)g_size;

    if (!strcmp(mode, "files")) {
        mkdir(dir, 0755);
        char p[600], tmp[600];
        for (int i = 0; i < 4096; i++) {
            snprintf(p, sizeof p, "%s/%03x", dir, i);
            mkdir(p, 0755);
        }
        unsigned long long w0 = io_written();
        double t0 = now_s();
        for (uint64_t i = 0; i < n; i++) {
            kv_block_id id = bid(i);
            char hex[33];
            for (int k = 0; k < 16; k++)
                sprintf(hex + 2 * k, "%02x", id.bytes[k]);
            snprintf(p, sizeof p, "%s/%.3s/%s", dir, hex, hex);
            if (access(p, F_OK) == 0)
                continue;
            snprintf(tmp, sizeof tmp, "%.580s.tmp", p);
            int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0 || write(fd, block_data(i), g_size) != (ssize_t)g_size)
                return 1;
            if (fsync_files)
                fsync(fd);
            close(fd);
            rename(tmp, p);
        }
        double t1 = now_s();
        printf("files size=%zu n=%llu fsync=%d: %.0f blocks/s, %.1f MiB/s, wamp(at end)=%.2f\n", g_size,
               (unsigned long long)n, fsync_files, n / (t1 - t0), bytes / (t1 - t0) / 1048576,
               (double)(io_written() - w0) / bytes);
        sync_file_range(0, 0, 0, 0);
        if (system("sync") != 0)
            return 1;
        printf("files wamp(after sync)=%.2f\n", (double)(io_written() - w0) / bytes);
    } else if (!strcmp(mode, "rocks") || !strcmp(mode, "ratio")) {
        struct kv__ssd *s = NULL;
        if (kv__ssd_open_tuned(cfg, &t, &s, err, sizeof err) != KV_OK) {
            fprintf(stderr, "open: %s\n", err);
            return 1;
        }
        unsigned long long w0 = io_written();
        double t0 = now_s();
        if (!spill) {
            for (uint64_t i = 0; i < n; i++) {
                kv_block_id id = bid(i);
                kv_iov iov = { (void *)block_data(i), g_size };
                int rc = kv__ssd_write(s, KV_NS_BLOCK, &id, 0, &iov, 1);
                if (rc) {
                    fprintf(stderr, "write %llu: %s\n", (unsigned long long)i, kv_strerror(rc));
                    return 1;
                }
            }
        } else {
            struct kv__sink k = kv__ssd_sink(s);
            for (uint64_t i = 0; i < n; i++) {
                struct fake_victim *fv = calloc(1, sizeof *fv);
                fv->v.ns = KV_NS_BLOCK;
                fv->v.id = bid(i);
                fv->v.nshards = 1;
                fv->v.shards = &fv->sh;
                fv->sh.index = 0;
                fv->sh.len = (uint32_t)g_size;
                fv->sh.data = block_data(i);
                fv->v.release = fv_release;
                /* Like an evictor that waits for write-back when the queue
                 * is full, so nothing is dropped. */
                struct kv__ssd_info in;
                for (kv__ssd_info(s, &in); in.queued_bytes + g_size > cfg->ssd.spill_queue;
                     kv__ssd_info(s, &in))
                    k.drain(k.ctx, 5);
                k.accept(k.ctx, &fv->v);
            }
            while (k.drain(k.ctx, 1000) > 0)
                ;
        }
        double t1 = now_s();
        kv_stats st;
        memset(&st, 0, sizeof st);
        kv__ssd_stats(s, &st);
        kv__ssd_close(s);
        double t2 = now_s();
        unsigned long long w = io_written() - w0;
        if (system("sync") != 0)
            return 1;
        w = io_written() - w0;
        printf("rocks size=%zu n=%llu sync=%d wbuf=%lluMiB bg=%d batch=%lluKiB spill=%d drops=%llu: "
               "%.0f blocks/s acked, %.0f blocks/s incl. close, %.1f MiB/s, wamp(after sync)=%.2f\n",
               g_size, (unsigned long long)n, sync, (unsigned long long)(t.write_buffer >> 20),
               t.bg_jobs, (unsigned long long)(t.batch_bytes >> 10), spill, (unsigned long long)st.spill_drops,
               n / (t1 - t0), n / (t2 - t0), bytes / (t2 - t0) / 1048576, (double)w / bytes);
        if (!strcmp(mode, "ratio")) {
            kv__ssd_open_tuned(cfg, &t, &s, err, sizeof err);
            struct kv__ssd_info in;
            kv__ssd_info(s, &in);
            printf("ratio comp=%d half=%d: value log %llu bytes on disk for %.0f stored: %.3f of stored\n",
                   comp, g_half, (unsigned long long)in.vlog_bytes, bytes, (double)in.vlog_bytes / bytes);
            kv__ssd_close(s);
        }
    } else if (!strcmp(mode, "open")) {
        struct kv__ssd *s = NULL;
        if (kv__ssd_open_tuned(cfg, &t, &s, err, sizeof err) != KV_OK) {
            fprintf(stderr, "open: %s\n", err);
            return 1;
        }
        struct kv__sink k = kv__ssd_sink(s);
        for (uint64_t i = 0; i < n; i++) {
            struct fake_victim *fv = calloc(1, sizeof *fv);
            fv->v.ns = KV_NS_BLOCK;
            fv->v.id = bid(i);
            fv->v.nshards = 1;
            fv->v.shards = &fv->sh;
            fv->sh.len = (uint32_t)g_size;
            fv->sh.data = block_data(i);
            fv->v.release = fv_release;
            struct kv__ssd_info in;
            for (kv__ssd_info(s, &in); in.queued_bytes + g_size > cfg->ssd.spill_queue; kv__ssd_info(s, &in))
                k.drain(k.ctx, 5);
            k.accept(k.ctx, &fv->v);
        }
        while (k.drain(k.ctx, 1000) > 0)
            ;
        kv_stats st;
        memset(&st, 0, sizeof st);
        kv__ssd_stats(s, &st);
        printf("open: filled %llu blocks (%llu dropped)\n", (unsigned long long)st.spills,
               (unsigned long long)st.spill_drops);
        kv__ssd_close(s);
        if (system("sync") != 0)
            return 1;
        snprintf(cmd, sizeof cmd, "echo 3 > /proc/sys/vm/drop_caches 2>/dev/null");
        int cold = system(cmd) == 0;
        double t0 = now_s();
        if (kv__ssd_open_tuned(cfg, &t, &s, err, sizeof err) != KV_OK) {
            fprintf(stderr, "reopen: %s\n", err);
            return 1;
        }
        double t1 = now_s();
        struct kv__ssd_info in;
        kv__ssd_info(s, &in);
        printf("open n=%llu size=%zu cold_cache=%d: %.3f s, %llu entries, index %.1f bytes/value\n",
               (unsigned long long)n, g_size, cold, t1 - t0, (unsigned long long)in.entries,
               (double)in.index_bytes / (double)in.entries);
        kv__ssd_close(s);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    kv_config_free(cfg);
    return 0;
}
