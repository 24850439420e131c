/*
 * bench_cluster.c — a small driver for the distributed DRAM tier on
 * loopback: kvmaster + N kvnodes (child processes) and a pure-client engine
 * in this process; J jobs (threads) dump then load values of a given size.
 * Reports MiB/s for dump and load, per-op p50/p99, and the raw loopback TCP
 * bandwidth measured in the same run. A measurement, not a test: built by
 * hand (see the report), not part of the runner.
 *
 *   bench_cluster BUILD_DIR VALUE_BYTES JOBS VALUES_PER_JOB SECONDS NODES
 *   (env REPLICAS=N sets cluster.replica_num)
 *
 * Build (after make BUILD=B):
 *   cc -O2 -Iinclude -D_GNU_SOURCE -pthread -o B/bench_cluster tests/bench_cluster.c \
 *      B/libkvengine.a -lrocksdb -lyaml -llz4 -lxxhash -ljemalloc -lmicrohttpd \
 *      -libverbs -lpthread -lm
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvengine.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    close(fd);
    return ntohs(sa.sin_port);
}

static pid_t spawn(char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* ---- raw loopback TCP ---------------------------------------------------- */
static int raw_lfd;
static size_t raw_total = 2048ull << 20;

static void *raw_reader(void *arg)
{
    (void)arg;
    int fd = accept(raw_lfd, NULL, NULL);
    char *b = malloc(1 << 20);
    size_t got = 0;
    while (got < raw_total) {
        ssize_t r = read(fd, b, 1 << 20);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    free(b);
    close(fd);
    return NULL;
}

static double raw_tcp_mib_s(void)
{
    raw_lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    bind(raw_lfd, (struct sockaddr *)&sa, sizeof sa);
    listen(raw_lfd, 1);
    socklen_t sl = sizeof sa;
    getsockname(raw_lfd, (struct sockaddr *)&sa, &sl);
    pthread_t th;
    pthread_create(&th, NULL, raw_reader, NULL);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    connect(fd, (struct sockaddr *)&sa, sizeof sa);
    char *b = malloc(1 << 20);
    memset(b, 7, 1 << 20);
    double t0 = now_s();
    for (size_t sent = 0; sent < raw_total;) {
        ssize_t w = write(fd, b, 1 << 20);
        if (w <= 0)
            break;
        sent += (size_t)w;
    }
    close(fd);
    pthread_join(th, NULL);
    double dt = now_s() - t0;
    free(b);
    close(raw_lfd);
    return raw_total / 1048576.0 / dt;
}

/* ---- the engine ---------------------------------------------------------- */
static kv_engine *eng;
static size_t vlen, per_job;
static double seconds;
static int phase_load;

struct job {
    int id;
    uint8_t *buf;
    double *lat;
    size_t nlat, cap;
    size_t ops, errors;
};

static kv_block_id bid(int job, size_t i)
{
    kv_block_id id;
    memset(&id, 0, sizeof id);
    memcpy(id.bytes, &job, sizeof job);
    memcpy(id.bytes + 8, &i, sizeof i);
    id.bytes[15] = 0x5a;
    return id;
}

static void *job_main(void *arg)
{
    struct job *j = arg;
    double t_end = now_s() + seconds;
    for (size_t k = 0; ; k++) {
        size_t i = k % per_job;
        if (!phase_load && k == per_job)
            break;
        if (phase_load && now_s() > t_end)
            break;
        kv_iov iov = { j->buf, vlen };
        kv_shard s = { .block = bid(j->id, i), .index = 0, .iov = &iov, .iovcnt = 1 };
        kv_task t;
        double t0 = now_s();
        int rc = phase_load ? kv_load(eng, &s, 1, &t) : kv_dump(eng, &s, 1, &t);
        if (rc == KV_OK)
            rc = kv_wait(eng, t, 0);
        double dt = now_s() - t0;
        if (rc != KV_OK && j->errors++ == 0)
            fprintf(stderr, "job %d: %s\n", j->id, kv_strerror(rc));
        j->ops++;
        if (j->nlat == j->cap) {
            j->cap = j->cap ? j->cap * 2 : 1024;
            j->lat = realloc(j->lat, j->cap * sizeof *j->lat);
        }
        j->lat[j->nlat++] = dt;
    }
    return NULL;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_phase(const char *name, int jobs)
{
    struct job *js = calloc((size_t)jobs, sizeof *js);
    pthread_t *th = calloc((size_t)jobs, sizeof *th);
    for (int i = 0; i < jobs; i++) {
        js[i].id = i;
        js[i].buf = malloc(vlen);
        memset(js[i].buf, i + 1, vlen);
    }
    double t0 = now_s();
    for (int i = 0; i < jobs; i++)
        pthread_create(&th[i], NULL, job_main, &js[i]);
    size_t ops = 0, errors = 0, nlat = 0;
    for (int i = 0; i < jobs; i++) {
        pthread_join(th[i], NULL);
        ops += js[i].ops;
        errors += js[i].errors;
        nlat += js[i].nlat;
    }
    double dt = now_s() - t0;
    double *all = malloc(nlat * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < jobs; i++) {
        memcpy(all + k, js[i].lat, js[i].nlat * sizeof *all);
        k += js[i].nlat;
        free(js[i].lat);
        free(js[i].buf);
    }
    qsort(all, nlat, sizeof *all, cmpd);
    printf("%-5s value=%zuKiB jobs=%d ops=%zu errors=%zu  %.1f MiB/s  %.0f ops/s  "
           "p50=%.0fus p99=%.0fus\n",
           name, vlen >> 10, jobs, ops, errors, ops * (double)vlen / 1048576.0 / dt, ops / dt,
           all[nlat / 2] * 1e6, all[(size_t)(nlat * 0.99)] * 1e6);
    free(all);
    free(js);
    free(th);
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: %s BUILD VALUE_BYTES JOBS VALUES_PER_JOB SECONDS NODES\n", argv[0]);
        return 2;
    }
    const char *build = argv[1];
    vlen = strtoull(argv[2], NULL, 0);
    int jobs = atoi(argv[3]);
    per_job = strtoull(argv[4], NULL, 0);
    seconds = atof(argv[5]);
    int nodes = atoi(argv[6]);
    signal(SIGPIPE, SIG_IGN);
    printf("raw loopback TCP (1 stream, 1 MiB writes): %.0f MiB/s\n", raw_tcp_mib_s());

    char master[64], bin[512], a[8][160];
    snprintf(master, sizeof master, "127.0.0.1:%u", free_port());
    snprintf(bin, sizeof bin, "%s/kvmaster", build);
    snprintf(a[0], sizeof a[0], "cluster.master=%s", master);
    char *margv[] = { bin, "--set", a[0], "--set", "log.level=warn", NULL };
    pid_t pids[9];
    int np = 0;
    pids[np++] = spawn(margv);
    usleep(200000);
    size_t replicas = getenv("REPLICAS") ? strtoull(getenv("REPLICAS"), NULL, 0) : 1;
    size_t need = vlen * per_job * (size_t)jobs * (replicas ? replicas : 1) / (size_t)nodes;
    char cap[64];
    snprintf(cap, sizeof cap, "%zuMiB", (need * 2 >> 20) + 64);
    for (int i = 0; i < nodes; i++) {
        char nbin[512], l[160], c[160];
        snprintf(nbin, sizeof nbin, "%s/kvnode", build);
        snprintf(l, sizeof l, "cluster.listen=127.0.0.1:%u", free_port());
        snprintf(c, sizeof c, "dram.capacity=%s", cap);
        char *nargv[] = { nbin, "--set", a[0], "--set", l, "--set", c, "--set", "pipeline=dram",
                          "--set", "log.level=warn", "--set", "io.threads=4", NULL };
        pids[np++] = spawn(nargv);
    }
    usleep(1500000);   /* nodes fault their segments in and join */
    kv_config *cfg;
    kv_config_new(&cfg);
    kv_config_set(cfg, "pipeline", "dram");
    kv_config_set(cfg, "dram.capacity", "0");
    kv_config_set(cfg, "cluster.enabled", "true");
    kv_config_set(cfg, "cluster.master", master);
    kv_config_set(cfg, "cluster.protocol", "tcp");
    kv_config_set(cfg, "io.threads", "8");
    if (getenv("REPLICAS"))   /* e.g. REPLICAS=2: every dump goes to two nodes */
        kv_config_set(cfg, "cluster.replica_num", getenv("REPLICAS"));
    kv_config_set(cfg, "log.level", "warn");
    int rc = kv_open(cfg, &eng);
    kv_config_free(cfg);
    if (rc == KV_OK) {
        /* Wait until every node is in the client's view: a probe block
         * must land on each (its owner is one node; try a few ids). */
        static uint8_t probe[4096];
        kv_iov iov = { probe, sizeof probe };
        double t0 = now_s();
        int ok = 0;
        while (ok < 16 && now_s() - t0 < 30) {
            kv_shard s = { .block = bid(1000 + ok, 0), .iov = &iov, .iovcnt = 1 };
            kv_task t;
            if (kv_dump(eng, &s, 1, &t) == KV_OK && kv_wait(eng, t, 0) == KV_OK)
                ok++;
            else
                usleep(100000);
        }
        usleep(1200000);   /* one more heartbeat: the last node's join */
    }
    if (rc != KV_OK) {
        fprintf(stderr, "kv_open: %s\n", kv_strerror(rc));
    } else {
        phase_load = 0;
        run_phase("dump", jobs);
        phase_load = 1;
        run_phase("load", jobs);
        kv_close(eng);
    }
    for (int i = np - 1; i >= 0; i--) {
        kill(pids[i], SIGTERM);
        waitpid(pids[i], NULL, 0);
    }
    return rc == KV_OK ? 0 : 1;
}
