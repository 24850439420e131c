/*
 * bench_etcd.c — what a view change costs a member whose membership lives
 * in etcd: the CPU a kvnode spends while fresh ids join and leave a view
 * of many records (issue 17, item 4: each watch event made every member
 * read the whole prefix again).
 *
 * It starts Debian's etcd on loopback (ports 22600-22601, data in a fresh
 * temporary directory), puts RECORDS signed members of the largest record
 * (64 segments, 127-byte ids, about 7 KiB as etcd answers them), starts the
 * kvnode it is given (any tree's build: the same bench measures two trees
 * in one run) as one more member, and then, ROUNDS times, puts FRESH new
 * members one by one and deletes them one by one, waiting after each half
 * until the kvnode's view shows it (the owners its log line counts). The
 * kvnode's CPU comes from /proc/PID/stat (user + system, clock ticks); an
 * idle stretch of 5 s first gives its heartbeats' own rate, which is
 * subtracted for the "events" column.
 *
 * Not part of the test runner; built by hand against a tree's library:
 *   make -j2 all && \
 *   cc -O2 -D_GNU_SOURCE -Iinclude -I. tests/bench_etcd.c build/libkvengine.a \
 *      -o build/bench_etcd -lrocksdb -lyaml -llz4 -lxxhash -lmicrohttpd -libverbs \
 *      -lcurl -ljson-c -lcrypto -lpthread -lm
 *   build/bench_etcd KVNODE [records] [rounds] [fresh]   (defaults 500 8 25)
 * Prints, per round, the kvnode's ticks and ms of CPU for its 2*FRESH view
 * changes, and the totals: CPU per view change, raw and less the idle rate.
 */
#include <curl/curl.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "net/proto.h"

#define TOKEN "bench-token"
#define PREFIX "/kvbench"
#define ETCD_CPORT 22600
#define ETCD_PPORT 22601
#define NODE_PORT 22602

static char tmpdir[256] = "/tmp/kvbench-etcd.XXXXXX";
static pid_t etcd_pid, node_pid;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct buf {
    char *p;
    size_t len;
};

static size_t sink(char *d, size_t sz, size_t nm, void *u)
{
    struct buf *b = u;
    size_t n = sz * nm;
    char *p = realloc(b->p, b->len + n + 1);
    if (!p)
        return 0;
    b->p = p;
    memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
    return n;
}

/* GET (body NULL) or POST body to url; the answer (caller frees) or NULL. */
static char *http(const char *url, const char *body)
{
    struct buf b = { NULL, 0 };
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (body)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    if (cc != CURLE_OK) {
        free(b.p);
        return NULL;
    }
    return b.p ? b.p : strdup("");
}

static char *etcd_call(const char *path, const char *body)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", ETCD_CPORT, path);
    return http(url, body);
}

static char *b64(const char *in)
{
    static const char T[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strlen(in);
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    const unsigned char *p = (const unsigned char *)in;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *o++ = T[v >> 18 & 63];
        *o++ = T[v >> 12 & 63];
        *o++ = i + 1 < n ? T[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? T[v & 63] : '=';
    }
    *o = 0;
    return out;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_etcd: %s (logs in %s)\n", what, tmpdir);
    if (node_pid > 0)
        kill(node_pid, SIGKILL);
    if (etcd_pid > 0)
        kill(etcd_pid, SIGKILL);
    exit(1);
}

static pid_t spawn(char **argv, const char *log)
{
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *f = fopen(log, "w");
        if (f) {
            dup2(fileno(f), 1);
            dup2(fileno(f), 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return p;
}

/* The record of member i (or of fresh member i when fresh), signed on lease,
 * as a put's JSON body. */
static char *put_body(int i, int fresh, unsigned long long lease)
{
    struct kv__member m;
    memset(&m, 0, sizeof m);
    snprintf(m.id, sizeof m.id, "%s%05d-", fresh ? "f" : "n", i);
    memset(m.id + strlen(m.id), 'x', 120);
    snprintf(m.addr, sizeof m.addr, "127.0.0.1:%d", 30000 + i % 30000);
    m.flags = KV_MEMBER_OWNER;
    m.nseg = KV_PROTO_SEG_MAX;
    for (uint32_t s = 0; s < m.nseg; s++)
        m.seg[s] = (struct kv__segdesc){ .base = UINT64_MAX / 2 - s, .len = UINT64_MAX / 2 - s,
                                         .rkey = UINT32_MAX - s };
    m.lease = lease;
    if (kv__member_sign(TOKEN, &m) != KV_OK)
        die("kv__member_sign");
    char mac[65], lid[32], key[300], t[32];
    for (int b = 0; b < 32; b++)
        snprintf(mac + 2 * b, 3, "%02x", m.mac[b]);
    snprintf(lid, sizeof lid, "%llu", lease);
    json_object *rec = json_object_new_object(), *segs = json_object_new_array();
    json_object_object_add(rec, "id", json_object_new_string(m.id));
    json_object_object_add(rec, "addr", json_object_new_string(m.addr));
    json_object_object_add(rec, "flags", json_object_new_int64(m.flags));
    for (uint32_t s = 0; s < m.nseg; s++) {
        json_object *sg = json_object_new_object();
        snprintf(t, sizeof t, "%llu", (unsigned long long)m.seg[s].base);
        json_object_object_add(sg, "base", json_object_new_string(t));
        snprintf(t, sizeof t, "%llu", (unsigned long long)m.seg[s].len);
        json_object_object_add(sg, "len", json_object_new_string(t));
        json_object_object_add(sg, "rkey", json_object_new_int64(m.seg[s].rkey));
        json_object_array_add(segs, sg);
    }
    json_object_object_add(rec, "segs", segs);
    json_object_object_add(rec, "lease", json_object_new_string(lid));
    json_object_object_add(rec, "mac", json_object_new_string(mac));
    snprintf(key, sizeof key, PREFIX "/members/%s", m.id);
    char *k64 = b64(key), *v64 = b64(json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PLAIN));
    json_object_put(rec);
    size_t cap = strlen(k64) + strlen(v64) + 128;
    char *body = malloc(cap);
    snprintf(body, cap, "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%s\"}", k64, v64, lid);
    free(k64);
    free(v64);
    return body;
}

static void put_member(int i, int fresh, unsigned long long lease)
{
    char *body = put_body(i, fresh, lease);
    free(etcd_call("/v3/kv/put", body) ?: (die("etcd put"), NULL));
    free(body);
}

static void del_member(int i)
{
    char key[300], id[160], body[600];
    snprintf(id, sizeof id, "f%05d-", i);
    memset(id + strlen(id), 'x', 120);
    id[7 + 120] = 0;
    snprintf(key, sizeof key, PREFIX "/members/%s", id);
    char *k64 = b64(key);
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", k64);
    free(k64);
    free(etcd_call("/v3/kv/deleterange", body) ?: (die("etcd delete"), NULL));
}

/* The owners in the kvnode's view as it last logged it ("cluster: serving
 * ..., view V (O owners)" for the first, "cluster: view V: M members, O
 * owners" at every change), -1 before the first. Its log, not its
 * /metrics: a scrape costs the node work of its own (its health asks etcd
 * for the whole view), which would be counted as the changes'. */
static char node_log[300];

static int node_owners(void)
{
    FILE *f = fopen(node_log, "r");
    char line[1024];
    int n = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "cluster: view ");
        const char *o = p ? strstr(p, " members, ") : NULL;
        const char *first = strstr(line, "cluster: serving ");   /* the first view */
        if (o)
            n = atoi(o + strlen(" members, "));
        else if (first && (first = strstr(first, " (")))
            n = atoi(first + 2);
    }
    if (f)
        fclose(f);
    return n;
}

static void wait_owners(int want)
{
    double t0 = now_s();
    while (node_owners() != want) {
        if (now_s() - t0 > 60)
            die("the kvnode's view did not reach the owners wanted");
        usleep(5000);
    }
}

static unsigned long long node_ticks(void)
{
    char path[64], line[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)node_pid);
    FILE *f = fopen(path, "r");
    if (!f || !fgets(line, sizeof line, f))
        die("reading the kvnode's /proc stat");
    fclose(f);
    /* fields after the command's closing parenthesis: state is field 3,
     * utime 14 and stime 15 */
    const char *p = strrchr(line, ')');
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                     &st) != 2)
        die("parsing the kvnode's /proc stat");
    return ut + st;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s KVNODE [records=500] [rounds=8] [fresh=25]\n", argv[0]);
        return 2;
    }
    int records = argc > 2 ? atoi(argv[2]) : 500, rounds = argc > 3 ? atoi(argv[3]) : 8;
    int fresh = argc > 4 ? atoi(argv[4]) : 25;
    double hz = (double)sysconf(_SC_CLK_TCK);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!mkdtemp(tmpdir))
        die("mkdtemp");
    char data[300], log[300], curl_url[64], purl[64], cluster[96];
    snprintf(data, sizeof data, "%s/etcd", tmpdir);
    snprintf(log, sizeof log, "%s/etcd.log", tmpdir);
    snprintf(curl_url, sizeof curl_url, "http://127.0.0.1:%u", ETCD_CPORT);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%u", ETCD_PPORT);
    snprintf(cluster, sizeof cluster, "b0=%s", purl);
    char *eargv[] = { "/usr/bin/etcd", "--name", "b0", "--data-dir", data,
                      "--listen-client-urls", curl_url, "--advertise-client-urls", curl_url,
                      "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                      "--initial-cluster", cluster, NULL };
    etcd_pid = spawn(eargv, log);
    double t0 = now_s();
    char *st = NULL;
    while (!(st = etcd_call("/v3/kv/range", "{\"key\":\"AA==\"}")) || !strstr(st, "header")) {
        free(st);
        st = NULL;
        if (now_s() - t0 > 20)
            die("etcd did not come up");
        usleep(50000);
    }
    free(st);
    char *g = etcd_call("/v3/lease/grant", "{\"TTL\":3600}");
    const char *idp = g ? strstr(g, "\"ID\":\"") : NULL;
    unsigned long long lease = idp ? strtoull(idp + 6, NULL, 10) : 0;
    free(g);
    if (!lease)
        die("lease grant");
    for (int i = 0; i < records; i++)
        put_member(i, 0, lease);
    char bin[512], s[8][300];
    snprintf(bin, sizeof bin, "%s", argv[1]);
    snprintf(node_log, sizeof node_log, "%s/kvnode.log", tmpdir);
    snprintf(s[0], sizeof s[0], "cluster.etcd_endpoints=127.0.0.1:%u", ETCD_CPORT);
    snprintf(s[1], sizeof s[1], "cluster.listen=127.0.0.1:%u", NODE_PORT);
    snprintf(s[2], sizeof s[2], "log.level=info");
    snprintf(s[3], sizeof s[3], "ssd.path=%s/node", tmpdir);
    snprintf(s[4], sizeof s[4], "cluster.etcd_prefix=%s", PREFIX);
    char *nargv[] = { bin, "--set", "cluster.enabled=true", "--set", "cluster.metadata=etcd",
                      "--set", s[0], "--set", s[1], "--set", s[2], "--set", s[3],
                      "--set", s[4], "--set", "cluster.token=" TOKEN,
                      "--set", "cluster.protocol=tcp", "--set", "cluster.node_ttl_ms=10000",
                      "--set", "dram.capacity=32MiB", "--set", "pipeline=dram",
                      "--set", "io.threads=2", NULL };
    node_pid = spawn(nargv, node_log);
    wait_owners(records + 1);
    /* its heartbeats alone, for 5 s */
    unsigned long long i0 = node_ticks();
    double w0 = now_s();
    sleep(5);
    double idle_rate = (double)(node_ticks() - i0) / (now_s() - w0);   /* ticks per second */
    printf("view of %d records + the kvnode; %d rounds of %d fresh ids joining, then leaving\n",
           records, rounds, fresh);
    printf("idle: %.2f ticks/s (its heartbeats)\n", idle_rate);
    printf("%-6s %8s %8s %10s\n", "round", "ticks", "cpu_ms", "wall_ms");
    unsigned long long total = 0;
    double wall = 0;
    for (int r = 0; r < rounds; r++) {
        unsigned long long c0 = node_ticks();
        double r0 = now_s();
        for (int i = 0; i < fresh; i++)
            put_member(r * fresh + i, 1, lease);
        wait_owners(records + 1 + fresh);
        for (int i = 0; i < fresh; i++)
            del_member(r * fresh + i);
        wait_owners(records + 1);
        unsigned long long d = node_ticks() - c0;
        double rw = now_s() - r0;
        total += d;
        wall += rw;
        printf("%-6d %8llu %8.0f %10.0f\n", r, d, (double)d * 1000 / hz, rw * 1000);
    }
    int changes = rounds * fresh * 2;
    double ev = (double)total - idle_rate * wall;
    printf("total: %llu ticks (%.0f ms of CPU) over %.1f s for %d view changes: "
           "%.2f ms per change, %.2f ms less the idle rate\n",
           total, (double)total * 1000 / hz, wall, changes, (double)total * 1000 / hz / changes,
           (ev > 0 ? ev : 0) * 1000 / hz / changes);
    kill(node_pid, SIGTERM);
    waitpid(node_pid, NULL, 0);
    kill(etcd_pid, SIGKILL);
    waitpid(etcd_pid, NULL, 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_etcd: could not remove %s\n", tmpdir);
    return 0;
}
