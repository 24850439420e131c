/*
 * testutil.c — fixtures shared by the Check suites.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

char *tu_mkdtemp(void)
{
    const char *tmp = getenv("TMPDIR");
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/kvtest.XXXXXX", tmp && *tmp ? tmp : "/tmp") > 0);
    ck_assert_ptr_nonnull(mkdtemp(path));
    return path;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

void tu_rmdir(char *path)
{
    if (!path)
        return;
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(path);
}

kv_engine *tu_open_yaml(const char *yaml)
{
    kv_config *cfg = NULL;
    char err[512] = "";
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    int rc = kv_config_parse(cfg, yaml, strlen(yaml), err, sizeof err);
    ck_assert_msg(rc == KV_OK, "config: %s", err);
    kv_engine *e = NULL;
    rc = kv_open(cfg, &e);
    kv_config_free(cfg);
    ck_assert_msg(rc == KV_OK, "kv_open: %s", kv_strerror(rc));
    ck_assert_ptr_nonnull(e);
    return e;
}

kv_engine *tu_open_yamlf(const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return tu_open_yaml(buf);
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

kv_block_id tu_id(uint64_t n, uint64_t salt)
{
    kv_block_id id;
    uint64_t a = mix64(n ^ (salt << 32) ^ 0x1234), b = mix64(a + n);
    memcpy(id.bytes, &a, 8);
    memcpy(id.bytes + 8, &b, 8);
    return id;
}

void tu_fill(void *buf, size_t len, uint64_t seed)
{
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = mix64(seed * 0x9e3779b97f4a7c15ull + i);
        memcpy(p + i, &v, 8);
    }
    uint64_t v = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    memcpy(p + i, &v, len - i);
}

int tu_check_fill(const void *buf, size_t len, uint64_t seed)
{
    const uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = mix64(seed * 0x9e3779b97f4a7c15ull + i);
        if (memcmp(p + i, &v, 8) != 0)
            return 0;
    }
    uint64_t v = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    return memcmp(p + i, &v, len - i) == 0;
}

int tu_dump1(kv_engine *e, kv_block_id id, uint32_t index, const void *buf, size_t len)
{
    kv_iov iov = { (void *)buf, len };
    kv_shard s = { .block = id, .index = index, .iov = &iov, .iovcnt = 1 };
    kv_task t = 0;
    int rc = kv_dump(e, &s, 1, &t);
    if (rc != KV_OK)
        return rc;
    return kv_wait(e, t, 0);
}

int tu_load1(kv_engine *e, kv_block_id id, uint32_t index, void *buf, size_t len)
{
    kv_iov iov = { buf, len };
    kv_shard s = { .block = id, .index = index, .iov = &iov, .iovcnt = 1 };
    kv_task t = 0;
    int rc = kv_load(e, &s, 1, &t);
    if (rc != KV_OK)
        return rc;
    return kv_wait(e, t, 0);
}

const char *tu_build_dir(void)
{
    const char *b = getenv("KV_BUILD");
    return b && *b ? b : "build";
}

uint64_t tu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Whether every thread of pid is stopped ('T' in its stat). */
static bool all_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool all = true;
    int threads = 0;
    for (struct dirent *e; all && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char p[96], buf[512];
        snprintf(p, sizeof p, "/proc/%d/task/%.16s/stat", (int)pid, e->d_name);
        FILE *f = fopen(p, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *c = strrchr(buf, ')');
        /* a thread gone since readdir is no longer running either */
        all = !f || (c && c[1] == ' ' && (c[2] == 'T' || c[2] == 't'));
        threads++;
    }
    closedir(d);
    return all && threads > 0;
}

void tu_stop(pid_t pid)
{
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    uint64_t t0 = tu_now_ms();
    while (!all_stopped(pid) && tu_now_ms() - t0 < 5000)
        usleep(1000);
    ck_assert_msg(all_stopped(pid), "process %d did not stop within 5 s", (int)pid);
}

/* A port below the ephemeral range (32768 up), which the kernel never
 * hands out for an outgoing connection or a bind to port 0, free when
 * asked. Each process walks its own stretch of 10000..20999 (the offset from
 * its pid; Check forks each test) and never returns a port twice. Before,
 * this bound port 0 and returned what the kernel chose: the kernel may
 * choose the port it just freed again, and two kvnodes of one test got
 * 127.0.0.1:37135 (rdmatest: "view has 2 owners, want 3", one node failing
 * "Address already in use" for 15 s). */
unsigned tu_free_port(void)
{
    enum { LO = 10000, SPAN = 11000 };
    static unsigned next;
    if (next == 0)
        next = ((unsigned)getpid() * 7919u) % SPAN;
    for (unsigned tries = 0; tries < SPAN; tries++) {
        unsigned port = LO + next;
        next = (next + 1) % SPAN;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(fd, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (ok)
            return port;
    }
    ck_abort_msg("no free port in %d..%d", LO, LO + SPAN - 1);
    return 0;
}

pid_t tu_spawn(char *const argv[], const char *log)
{
    /* The capture names the child's log, so a failed test shows it too. */
    fprintf(stderr, "tu_spawn: %s log %s\n", argv[0], log);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

struct tu_set tu_set_new(size_t n, size_t len, uint64_t salt)
{
    struct tu_set s = { .n = n, .len = len };
    s.src = malloc(n * len);
    s.dst = malloc(n * len);
    s.siov = calloc(n * 2, sizeof *s.siov);
    s.diov = calloc(n * 2, sizeof *s.diov);
    s.dump = calloc(n, sizeof *s.dump);
    s.load = calloc(n, sizeof *s.load);
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = s.src + i * len, *q = s.dst + i * len;
        tu_fill(p, len, salt * 1000 + i);
        /* two iovecs per shard: the copy paths must handle scatter/gather */
        s.siov[2 * i] = (kv_iov){ p, len / 3 };
        s.siov[2 * i + 1] = (kv_iov){ p + len / 3, len - len / 3 };
        s.diov[2 * i] = (kv_iov){ q, len / 2 };
        s.diov[2 * i + 1] = (kv_iov){ q + len / 2, len - len / 2 };
        kv_block_id id = tu_id(i / 2, salt);
        s.dump[i] = (kv_shard){ .block = id, .index = (uint32_t)(i % 2), .iov = &s.siov[2 * i],
                                .iovcnt = 2 };
        s.load[i] = (kv_shard){ .block = id, .index = (uint32_t)(i % 2), .iov = &s.diov[2 * i],
                                .iovcnt = 2 };
    }
    return s;
}

void tu_set_free(struct tu_set *s)
{
    free(s->src);
    free(s->dst);
    free(s->siov);
    free(s->diov);
    free(s->dump);
    free(s->load);
}

int tu_task(kv_engine *e, int dump, const kv_shard *sh, size_t n)
{
    kv_task t = 0;
    int rc = dump ? kv_dump(e, sh, n, &t) : kv_load(e, sh, n, &t);
    return rc ? rc : kv_wait(e, t, 10000);
}
