/*
 * exists.c — batch existence checks of plain keys (kv_exists_many, what
 * Mooncake's batch_is_exist calls) against a kvengine cluster, beside
 * Redis (EXISTS) and memcached (mg), the same keys, threads and batches in
 * one run. bench/peers.sh builds and runs it; a measurement to read, not a
 * test.
 *
 *   exists MASTER REDIS MEMCACHED [JOBS [BATCH [SECONDS [KEYS]]]]
 *   (HOST:PORT each; defaults 8 jobs, 8 keys a batch, 2 s, 65536 keys)
 *
 * Key design choice: the peers get what kvctl bench gives them (one
 * connection per job, each batch pipelined: all its requests in one
 * write, then the replies read in order), so the figure compares the
 * stores, not the clients. Every key is written first; a check that says a
 * key is absent is counted as a miss and printed. Uses only the public API
 * for kvengine.
 */
#include <kvengine.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define KEY_MAX 32
#define BATCH_MAX 1024

enum backend { B_KVENGINE, B_REDIS, B_MEMCACHED };
static const char *names[] = { "kvengine", "redis", "memcached" };

static kv_engine *eng;
static char (*keys)[KEY_MAX];
static int nkeys = 65536, jobs = 8, batch = 8;
static double seconds = 2;
static const char *peer_addr[3];
static volatile int stop;

struct job {
    enum backend b;
    int fd;
    unsigned seed;
    unsigned long long ids, misses, errors;
    double lat_sum;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int dial(const char *hostport)
{
    char host[64];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host)
        return -1;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
        connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads one reply line (without CRLF) into line; a tiny buffer per job is
 * enough because every reply here is one short line. */
struct rd {
    int fd;
    char buf[16384];
    size_t at, len;
};

static int read_line(struct rd *r, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        if (r->at == r->len) {
            ssize_t got = recv(r->fd, r->buf, sizeof r->buf, 0);
            if (got <= 0)
                return -1;
            r->at = 0;
            r->len = (size_t)got;
        }
        char ch = r->buf[r->at++];
        if (ch == '\n') {
            if (n && line[n - 1] == '\r')
                n--;
            line[n] = '\0';
            return 0;
        }
        if (n + 1 < cap)
            line[n++] = ch;
    }
}

/* One pipelined batch to a peer: each key's request, then each reply.
 * set: write the keys (64-byte values); else: check them. */
static int peer_batch(enum backend b, struct rd *r, const int *which, int n, int set,
                      unsigned long long *misses)
{
    static const char value[65] =
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    char out[BATCH_MAX * 160], line[256];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        const char *k = keys[which[i]];
        size_t kl = strlen(k);
        if (b == B_REDIS && set)
            len += (size_t)sprintf(out + len, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$64\r\n%s\r\n", kl,
                                   k, value);
        else if (b == B_REDIS)
            len += (size_t)sprintf(out + len, "*2\r\n$6\r\nEXISTS\r\n$%zu\r\n%s\r\n", kl, k);
        else if (set)
            len += (size_t)sprintf(out + len, "set %s 0 0 64\r\n%s\r\n", k, value);
        else
            len += (size_t)sprintf(out + len, "mg %s\r\n", k);
    }
    if (send_all(r->fd, out, len))
        return -1;
    for (int i = 0; i < n; i++) {
        if (read_line(r, line, sizeof line))
            return -1;
        int hit = b == B_REDIS ? (set ? line[0] == '+' : strcmp(line, ":1") == 0)
                               : (set ? strcmp(line, "STORED") == 0 : strcmp(line, "HD") == 0);
        if (!hit && !set && (b == B_REDIS ? line[0] != ':' : strcmp(line, "EN") != 0))
            return -1;  /* neither answer: a protocol error */
        if (!hit && set)
            return -1;
        *misses += !hit;
    }
    return 0;
}

static void *job_main(void *arg)
{
    struct job *j = arg;
    struct rd *r = j->b == B_KVENGINE ? NULL : calloc(1, sizeof *r);
    if (r)
        r->fd = j->fd;
    int which[BATCH_MAX], res[BATCH_MAX];
    kv_pair items[BATCH_MAX];
    while (!stop) {
        for (int i = 0; i < batch; i++)
            which[i] = (int)(rand_r(&j->seed) % (unsigned)nkeys);
        double t0 = now_s();
        int rc = 0;
        if (j->b == B_KVENGINE) {
            for (int i = 0; i < batch; i++)
                items[i] = (kv_pair){ .key = keys[which[i]], .klen = strlen(keys[which[i]]) };
            rc = kv_exists_many(eng, items, (size_t)batch, res);
            for (int i = 0; rc == KV_OK && i < batch; i++) {
                j->misses += res[i] == 0;
                j->errors += res[i] < 0;
            }
        } else {
            rc = peer_batch(j->b, r, which, batch, 0, &j->misses);
        }
        if (rc) {
            j->errors++;
            break;
        }
        j->lat_sum += now_s() - t0;
        j->ids += (unsigned long long)batch;
    }
    free(r);
    return NULL;
}

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec +
           ((double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_usec) / 1e6;
}

/* Writes every key, then runs jobs for seconds: ids/s (0 on a failure). */
static double run(enum backend b)
{
    struct job *js = calloc((size_t)jobs, sizeof *js);
    pthread_t *th = calloc((size_t)jobs, sizeof *th);
    if (!js || !th)
        return 0;
    for (int i = 0; i < jobs; i++) {
        js[i] = (struct job){ .b = b, .fd = -1, .seed = 7919u * (unsigned)(i + 1) };
        if (b != B_KVENGINE && (js[i].fd = dial(peer_addr[b])) < 0) {
            fprintf(stderr, "exists: %s at %s: cannot connect\n", names[b], peer_addr[b]);
            return 0;
        }
    }
    /* the keys, in batches, from the first job's connection */
    for (int at = 0; at < nkeys; at += BATCH_MAX) {
        int n = nkeys - at < BATCH_MAX ? nkeys - at : BATCH_MAX, which[BATCH_MAX];
        for (int i = 0; i < n; i++)
            which[i] = at + i;
        int rc;
        if (b == B_KVENGINE) {
            static kv_pair items[BATCH_MAX];
            static int res[BATCH_MAX];
            static const char v[64] = "value";
            for (int i = 0; i < n; i++)
                items[i] = (kv_pair){ .key = keys[at + i], .klen = strlen(keys[at + i]),
                                      .val = (void *)v, .len = sizeof v };
            rc = kv_put_many(eng, items, (size_t)n, res);
            for (int i = 0; rc == KV_OK && i < n; i++)
                rc = res[i];
        } else {
            struct rd r = { .fd = js[0].fd };
            unsigned long long m = 0;
            rc = peer_batch(b, &r, which, n, 1, &m);
        }
        if (rc) {
            fprintf(stderr, "exists: writing the keys to %s failed\n", names[b]);
            return 0;
        }
    }
    stop = 0;
    double c0 = cpu_s(), t0 = now_s();
    for (int i = 0; i < jobs; i++)
        pthread_create(&th[i], NULL, job_main, &js[i]);
    struct timespec ts = { (time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9) };
    nanosleep(&ts, NULL);
    stop = 1;
    unsigned long long ids = 0, misses = 0, errors = 0;
    double lat = 0;
    for (int i = 0; i < jobs; i++) {
        pthread_join(th[i], NULL);
        ids += js[i].ids;
        misses += js[i].misses;
        errors += js[i].errors;
        lat += js[i].lat_sum;
        if (js[i].fd >= 0)
            close(js[i].fd);
    }
    double dt = now_s() - t0, cpu = cpu_s() - c0, rate = (double)ids / dt;
    printf("%-10s %10.0f ids/s %9.1f us/batch %7.2f s/M cpu %6llu misses %4llu errors\n",
           names[b], rate, ids ? lat / (double)(ids / (unsigned long long)batch) * 1e6 : 0,
           ids ? cpu / ((double)ids / 1e6) : 0, misses, errors);
    free(js);
    free(th);
    return errors ? 0 : rate;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: exists MASTER REDIS MEMCACHED [JOBS [BATCH [SECONDS [KEYS]]]]\n");
        return 2;
    }
    peer_addr[B_REDIS] = argv[2];
    peer_addr[B_MEMCACHED] = argv[3];
    if (argc > 4)
        jobs = atoi(argv[4]);
    if (argc > 5)
        batch = atoi(argv[5]);
    if (argc > 6)
        seconds = atof(argv[6]);
    if (argc > 7)
        nkeys = atoi(argv[7]);
    if (jobs < 1 || jobs > 256 || batch < 1 || batch > BATCH_MAX || nkeys < 1 || seconds <= 0) {
        fprintf(stderr, "exists: jobs 1..256, batch 1..%d, keys >= 1, seconds > 0\n", BATCH_MAX);
        return 2;
    }
    keys = calloc((size_t)nkeys, sizeof *keys);
    if (!keys)
        return 1;
    for (int i = 0; i < nkeys; i++)
        snprintf(keys[i], KEY_MAX, "exists:%d:%d", (int)getpid(), i);
    kv_config *cfg;
    if (kv_config_new(&cfg) != KV_OK)
        return 1;
    const char *set[][2] = { { "cluster.enabled", "true" }, { "cluster.master", argv[1] },
                             { "cluster.protocol", "tcp" }, { "dram.capacity", "0" },
                             { "log.level", "warn" } };
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        if (kv_config_set(cfg, set[i][0], set[i][1]) != KV_OK)
            return 2;
    int rc = kv_open(cfg, &eng);
    kv_config_free(cfg);
    if (rc != KV_OK) {
        fprintf(stderr, "exists: kv_open: %s\n", kv_strerror(rc));
        return 1;
    }
    printf("batch exists: %d jobs, %d keys a batch, %.1f s each, %d keys\n", jobs, batch, seconds,
           nkeys);
    double r[3];
    for (int b = 0; b < 3; b++)
        r[b] = run((enum backend)b);
    kv_close(eng);
    if (r[1] > 0 && r[2] > 0)
        printf("kvengine / redis %.2fx, kvengine / memcached %.2fx (ids/s)\n", r[0] / r[1],
               r[0] / r[2]);
    return r[0] > 0 && r[1] > 0 && r[2] > 0 ? 0 : 1;
}
