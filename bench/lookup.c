/*
 * lookup.c — kv_lookup throughput and CPU per id, many passes in one run,
 * for comparing builds on a shared, noisy machine. A measurement to read,
 * not a test. bench/member_lookup.sh builds and runs it.
 *
 *   lookup IDS BATCH PASSES [KEY=VALUE ...]
 *
 * The settings are kv_config_set keys (pipeline=dram, store.name=X ...),
 * so the same program measures an in-process engine, an attached one, or
 * one attached through a cluster member. It dumps IDS one-shard blocks of
 * 64 bytes, then makes PASSES passes, each looking every id up once in a
 * fresh random order, BATCH ids a call, and prints per pass the wall ids/s
 * and the CPU it cost per id: this thread's, plus that of the processes
 * whose pids are in KV_BENCH_PIDS (the serving kvnodes), read from
 * /proc/PID/stat. Wall figures suffer when other work preempts us; CPU
 * per id does not (cache contention still shows in both), which is why
 * both are printed, and the medians last. Every lookup must hit: a miss is
 * counted and fails the run.
 */
#include <kvengine.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* utime + stime of the pids listed in KV_BENCH_PIDS, in seconds. */
static double others_cpu_s(void)
{
    const char *env = getenv("KV_BENCH_PIDS");
    if (!env)
        return 0;
    char list[512];
    snprintf(list, sizeof list, "%s", env);
    double s = 0;
    long hz = sysconf(_SC_CLK_TCK);
    for (char *save = NULL, *p = strtok_r(list, " ,", &save); p; p = strtok_r(NULL, " ,", &save)) {
        char path[64], buf[1024];
        snprintf(path, sizeof path, "/proc/%s/stat", p);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *q = strrchr(buf, ')');
        unsigned long ut = 0, st = 0;
        /* after "pid (comm)": state, then fields 4..13, utime is 14, stime 15 */
        if (q && sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
            s += (double)(ut + st) / (double)hz;
    }
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: lookup IDS BATCH PASSES [KEY=VALUE ...]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);   /* a pass's line as it ends (perf can follow) */
    size_t nids = strtoul(argv[1], NULL, 0), batch = strtoul(argv[2], NULL, 0);
    int passes = atoi(argv[3]);
    if (!nids || !batch || passes < 1 || passes > 1000)
        return 2;
    kv_config *cfg;
    kv_config_new(&cfg);
    for (int i = 4; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq)
            return 2;
        *eq = 0;
        int rc = kv_config_set(cfg, argv[i], eq + 1);
        if (rc != KV_OK) {
            fprintf(stderr, "lookup: %s: %s\n", argv[i], kv_strerror(rc));
            return 2;
        }
    }
    kv_engine *e;
    int rc = kv_open(cfg, &e);
    kv_config_free(cfg);
    if (rc != KV_OK) {
        fprintf(stderr, "lookup: kv_open: %s\n", kv_strerror(rc));
        return 1;
    }
    kv_block_id *ids = malloc(nids * sizeof *ids), *req = malloc(batch * sizeof *req);
    size_t *perm = malloc(nids * sizeof *perm);
    uint8_t *hit = malloc(batch), val[64];
    double *wall = malloc((size_t)passes * sizeof *wall), *cpu = malloc((size_t)passes * sizeof *cpu);
    if (!ids || !req || !perm || !hit || !wall || !cpu)
        return 1;
    srand48((long)getpid());
    memset(val, 0xa5, sizeof val);
    for (size_t i = 0; i < nids; i++) {
        for (int b = 0; b < KV_BLOCK_ID_LEN; b++)
            ids[i].bytes[b] = (uint8_t)lrand48();
        perm[i] = i;
    }
    kv_iov iov = { val, sizeof val };
    for (size_t i = 0; i < nids && rc == KV_OK; i += 1024) {
        size_t m = nids - i < 1024 ? nids - i : 1024;
        kv_shard sh[1024];
        for (size_t j = 0; j < m; j++)
            sh[j] = (kv_shard){ .block = ids[i + j], .index = 0, .iov = &iov, .iovcnt = 1 };
        kv_task t;
        rc = kv_dump(e, sh, m, &t);
        if (rc == KV_OK)
            rc = kv_wait(e, t, 0);
    }
    if (rc != KV_OK) {
        fprintf(stderr, "lookup: dump: %s\n", kv_strerror(rc));
        return 1;
    }
    uint64_t misses = 0;
    for (int p = 0; p < passes; p++) {
        for (size_t i = nids - 1; i > 0; i--) {
            size_t j = (size_t)lrand48() % (i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_THREAD_CPUTIME_ID);
        double o0 = others_cpu_s();
        for (size_t i = 0; i < nids; i += batch) {
            size_t m = nids - i < batch ? nids - i : batch;
            for (size_t j = 0; j < m; j++)
                req[j] = ids[perm[i + j]];
            if ((rc = kv_lookup(e, req, m, hit)) != KV_OK) {
                fprintf(stderr, "lookup: kv_lookup: %s\n", kv_strerror(rc));
                return 1;
            }
            for (size_t j = 0; j < m; j++)
                misses += !hit[j];
        }
        double w = now_s(CLOCK_MONOTONIC) - w0;
        double c = now_s(CLOCK_THREAD_CPUTIME_ID) - c0 + others_cpu_s() - o0;
        wall[p] = (double)nids / w;
        cpu[p] = c / (double)nids * 1e9;
        printf("pass %d: %.2f M ids/s, %.0f ns CPU per id\n", p + 1, wall[p] / 1e6, cpu[p]);
    }
    printf("median of %d passes: %.2f M ids/s, %.0f ns CPU per id; %llu misses\n", passes,
           median(wall, passes) / 1e6, median(cpu, passes), (unsigned long long)misses);
    kv_close(e);
    return misses ? 1 : 0;
}
