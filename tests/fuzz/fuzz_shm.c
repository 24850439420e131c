/*
 * fuzz_shm.c — libFuzzer harness for the host store's request decoder
 * (net/shm.c, the server side): every op's body parser, the MANY items,
 * the locs and the regions, the SSD walks' streams, with a real engine
 * behind them.
 *
 * Key design choice: the frames go through the server's own connection
 * code, not a copy of it. Once per process an engine is opened that serves
 * a host store (store.name; `dram|ssd` with a small DRAM tier and
 * write-through, so loads pin DRAM shards or copy SSD ones into client
 * memory, and the SSD walks have entries); each input is one connection to
 * its socket that has passed the real handshake (kv__shm_fuzz_dial, the
 * client's own code), served by the server's own connection thread, while
 * a peer thread writes the input's frames (with the descriptors they carry)
 * and reads every answer until the server closes. Then:
 *   - every answer is a well-formed frame (length within the frame limit, a
 *     status the library defines), and the answers to LOOKUP, LOAD and DUMP
 *     have their op's exact length; a LOAD's pinned shard lies inside the
 *     segment;
 *   - the connection's end leaves no pin and no connection behind;
 *   - a canary block written at start-up still loads byte for byte (no
 *     frame changes stored bytes it did not write);
 *   - the engine still answers a lookup.
 *
 * Input: records of [u8 fd kind][frame], where a frame is what a client
 * writes (u32 body length, u32 op, body) and runs to the next record (or
 * the input's end when its length says more). fd kind % 5: 0 none, 1 a
 * sealed memfd of the size the STAGING / REGION body names (at most
 * 256 MiB), 2 the same unsealed, 3 sealed but half that size, 4 a pipe.
 * Seeds (KV_FUZZ_MKCORPUS) are recorded from the real client
 * (kv__shm_connect and its calls) through a relay that keeps what it sends.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/dram.h"
#include "engine/engine.h"
#include "engine/store.h"   /* the engine's DRAM tier: the segment pinned loads point into */
#include "net/proto.h"
#include "net/shm.h"
#include "fuzzutil.h"

/* The wire, as net/shm.c's opening comment describes it. The op numbers
 * must be net/shm.c's: writing the seeds (make fuzz-corpus) checks that
 * each seed's recorded frames carry the ops named here for it. */
enum { OP_LOOKUP = 1, OP_PREFETCH, OP_LOAD, OP_RELEASE, OP_DUMP, OP_PUT, OP_GET, OP_EXISTS,
       OP_REMOVE, OP_REMOVE_ALL, OP_STATS, OP_STAGING, OP_REGION, OP_UNREGION, OP_MANY,
       OP_REMOVE_PREFIX, OP_SSD_SCAN, OP_SSD_SCRUB, OP_SSD_NEXT, OP_SSD_COMPACT, OP_SSD_REMOVE };
#define FRAME_MAX    (8u << 20)
#define LOAD_ANS_LEN 17u
#define SHM_MORE     1
#define MAP_CAP      (256ull << 20)
#define CANARY_LEN   5000u

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct {
    char *dir;
    kv_engine *e;
    char sock[4200];
    const uint8_t *seg;
    size_t seg_len;
    kv_block_id canary;
    uint8_t canary_bytes[CANARY_LEN];
} S;

static void teardown(void)
{
    kv_close(S.e);
    if (S.dir)
        fz_rmtree(S.dir);
    free(S.dir);
}

static void canary_put(void)
{
    kv_iov v = { S.canary_bytes, CANARY_LEN };
    kv_shard sh = { S.canary, 0, &v, 1 };
    kv_task t;
    FZ_CHECK(kv_dump(S.e, &sh, 1, &t) == KV_OK && kv_wait(S.e, t, 0) == KV_OK);
}

static void setup(void)
{
    kv_config *cfg;
    char path[4200];
    S.dir = fz_tmpdir("shm");
    FZ_CHECK(kv_config_new(&cfg) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "pipeline", "dram|ssd") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "dram.capacity", "8MiB") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "dram.hugepages", "off") == KV_OK);
    snprintf(path, sizeof path, "%s/ssd", S.dir);
    FZ_CHECK(kv_config_set(cfg, "ssd.path", path) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "ssd.capacity", "64MiB") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "ssd.write_through", "true") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "store.name", "fuzz") == KV_OK);
    snprintf(path, sizeof path, "%s/rv", S.dir);
    FZ_CHECK(kv_config_set(cfg, "store.dir", path) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "io.threads", "2") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "io.timeout_ms", "3000") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "log.level", "error") == KV_OK);
    int rc = kv_open(cfg, &S.e);
    kv_config_free(cfg);
    FZ_CHECK(rc == KV_OK);
    snprintf(S.sock, sizeof S.sock, "%s/rv/fuzz.sock", S.dir);
    kv_stats st;
    FZ_CHECK(kv_stats_get(S.e, &st) == KV_OK && st.host_attached == 0);   /* alone, it serves */
    void *base;
    kv__dram_segment(S.e->dram, &base, &S.seg_len);
    S.seg = base;
    for (size_t i = 0; i < KV_BLOCK_ID_LEN; i++)
        S.canary.bytes[i] = (uint8_t)(0xc3 ^ (i * 37));
    for (size_t i = 0; i < CANARY_LEN; i++)
        S.canary_bytes[i] = (uint8_t)(i * 7 + 1);
    canary_put();
    atexit(teardown);
}

/* ---- one input: frames, their descriptors, the peer that sends them ---------- */

struct frame {
    const uint8_t *p;
    size_t len;              /* bytes of the input (header included) */
    uint32_t op, body;       /* the header's; body may exceed what the input holds */
    int fd;
};

struct peer {
    int sock;
    struct frame *f;
    size_t nf;
    uint8_t *ans;
    size_t nans, capans;
};

static void ans_put(struct peer *p, const uint8_t *b, size_t n)
{
    if (p->nans + n > p->capans) {
        p->capans = (p->nans + n) * 2;
        p->ans = realloc(p->ans, p->capans);
        FZ_CHECK(p->ans);
    }
    memcpy(p->ans + p->nans, b, n);
    p->nans += n;
}

static bool drain(struct peer *p)
{
    static __thread uint8_t buf[1 << 16];
    for (;;) {
        ssize_t r = read(p->sock, buf, sizeof buf);
        if (r > 0) {
            ans_put(p, buf, (size_t)r);
            continue;
        }
        return r == 0 || (errno != EAGAIN && errno != EINTR);   /* true: the server closed */
    }
}

/* Sends f's bytes from off, its descriptor with the first; returns the bytes sent or -1. */
static ssize_t send_part(int sock, const struct frame *f, size_t off)
{
    if (off > 0 || f->fd < 0)
        return send(sock, f->p + off, f->len - off, MSG_NOSIGNAL);
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } u;
    memset(&u, 0, sizeof u);
    struct iovec iov = { (void *)f->p, f->len };
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &f->fd, sizeof f->fd);
    return sendmsg(sock, &m, MSG_NOSIGNAL);
}

static void *peer_main(void *arg)
{
    struct peer *p = arg;
    size_t i = 0, off = 0;
    bool wr = true;
    for (;;) {
        if (wr && i == p->nf) {
            shutdown(p->sock, SHUT_WR);
            wr = false;
        }
        struct pollfd pf = { p->sock, POLLIN | (wr ? POLLOUT : 0), 0 };
        if (poll(&pf, 1, 1000) <= 0)
            continue;   /* the server's own timeouts bound this loop */
        if ((pf.revents & (POLLIN | POLLHUP | POLLERR)) && drain(p))
            return NULL;
        if (wr && (pf.revents & POLLOUT)) {
            if (p->f[i].len == 0) {
                i++;
                continue;
            }
            ssize_t w = send_part(p->sock, &p->f[i], off);
            if (w > 0 && (off += (size_t)w) == p->f[i].len) {
                i++;
                off = 0;
            } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                wr = false;   /* the server closed on us: only read now */
            }
        }
    }
}

/* The descriptor a record's kind asks for, sized from the frame's body. */
static int make_fd(uint8_t kind, const struct frame *f)
{
    kind %= 5;
    if (kind == 0)
        return -1;
    if (kind == 4) {
        int pp[2];
        FZ_CHECK(pipe2(pp, O_CLOEXEC) == 0);
        close(pp[1]);
        return pp[0];
    }
    const uint8_t *b = f->p + 8;
    size_t have = f->len - 8;
    uint64_t size = 4096;
    if (f->op == OP_STAGING && have >= 8)
        size = kv__get64(b);
    else if (f->op == OP_REGION && have >= 12)
        size = kv__get64(b + 4);
    if (size == 0 || size > MAP_CAP)
        size = 4096;
    if (kind == 3)
        size /= 2;
    int fd = memfd_create("fuzz-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    FZ_CHECK(fd >= 0);
    FZ_CHECK(ftruncate(fd, (off_t)size) == 0);
    if (kind != 2)
        FZ_CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    return fd;
}

static size_t parse(const uint8_t *in, size_t n, struct frame **out)
{
    size_t cap = 16, nf = 0;
    struct frame *f = malloc(cap * sizeof *f);
    FZ_CHECK(f);
    for (size_t at = 0; at < n;) {
        uint8_t kind = in[at++];
        if (nf == cap) {
            f = realloc(f, (cap *= 2) * sizeof *f);
            FZ_CHECK(f);
        }
        struct frame *x = &f[nf++];
        x->p = in + at;
        x->op = x->body = 0;
        if (n - at < 8) {
            x->len = n - at;
        } else {
            x->body = kv__get32(in + at);
            x->op = kv__get32(in + at + 4);
            x->len = 8 + (x->body < n - at - 8 ? x->body : n - at - 8);
        }
        at += x->len;
        x->fd = x->len >= 8 ? make_fd(kind, x) : -1;
    }
    *out = f;
    return nf;
}

/* ---- the properties ---------------------------------------------------------- */

/* Walks the answers next to the requests that were served. A request the
 * server broke off on has no answer, and none follow it: the model stops
 * where the answers do. */
static void check_answers(const struct frame *f, size_t nf, const uint8_t *a, size_t na)
{
    size_t at = 0, i = 0;
    while (at < na) {
        FZ_CHECK(na - at >= 8);
        uint32_t len = kv__get32(a + at);
        int rc = (int)kv__get32(a + at + 4);
        FZ_CHECK(len <= FRAME_MAX && na - at - 8 >= len);
        FZ_CHECK(rc == KV_OK || rc == SHM_MORE || kv__status_valid(rc));
        const uint8_t *b = a + at + 8;
        at += 8 + len;
        /* The request it answers: the next one that is answered (RELEASE, op 4,
         * is retired: the server closes on it like any unknown op). */
        while (i < nf && f[i].op == OP_RELEASE)
            i++;
        if (i >= nf)
            continue;   /* the model has lost track (a NEXT outside a walk, ...): frames only */
        const struct frame *q = &f[i];
        const uint8_t *qb = q->p + 8;
        bool whole = q->len == 8 + (size_t)q->body;
        if (rc == SHM_MORE && q->op != OP_EXISTS) {   /* an EXISTS' 1 is "it does" */
            /* A walk's batch (answered by the next frame, a NEXT) or a
             * compaction's keepalive (nothing answers it). */
            if (q->op == OP_SSD_COMPACT) {
                FZ_CHECK(len == 0);
            } else {
                FZ_CHECK(q->op == OP_SSD_SCAN || q->op == OP_SSD_SCRUB || q->op == OP_SSD_NEXT);
                FZ_CHECK(len >= 4 && len == 4 + kv__get32(b) * 49u);
                i++;   /* the NEXT that answers it stands for the walk now */
            }
            continue;
        }
        if (rc == KV_OK && whole && q->body >= 4) {
            uint32_t n = kv__get32(qb);
            if (q->op == OP_LOOKUP)
                FZ_CHECK(len == n);
            else if (q->op == OP_DUMP)
                FZ_CHECK(len == 4 * n);
            else if (q->op == OP_LOAD) {
                FZ_CHECK(len == n * LOAD_ANS_LEN);
                for (uint32_t k = 0; k < n; k++) {
                    const uint8_t *x = b + k * LOAD_ANS_LEN;
                    const uint8_t *it = qb + 4 + (size_t)k * 41;
                    uint64_t want = kv__get64(it + 20);
                    FZ_CHECK(x[4] <= 2);
                    if (x[4] == 1)   /* pinned: inside the segment, as long as asked */
                        FZ_CHECK(kv__get32(x) == KV_OK && kv__get64(x + 5) <= S.seg_len &&
                                 want <= S.seg_len - kv__get64(x + 5));
                }
            }
        }
        i++;
    }
}

static void check_world(void)
{
    /* The server closed the socket; its thread then drops what the
     * connection held (a hang here is reported by -timeout). */
    kv_stats st;
    uint64_t clients, pins;
    for (;;) {
        FZ_CHECK(kv_stats_get(S.e, &st) == KV_OK);
        clients = st.host_clients;
        pins = st.host_pins;
        if (clients == 0)
            break;
        usleep(200);
    }
    if (clients || pins)
        fprintf(stderr, "fuzz_shm: the connection's end left %llu clients, %llu pins\n",
                (unsigned long long)clients, (unsigned long long)pins);
    FZ_CHECK(clients == 0 && pins == 0);
    static uint8_t back[CANARY_LEN];
    kv_iov v = { back, CANARY_LEN };
    kv_shard sh = { S.canary, 0, &v, 1 };
    kv_task t;
    FZ_CHECK(kv_load(S.e, &sh, 1, &t) == KV_OK);
    int rc = kv_wait(S.e, t, 0);
    if (rc == KV_ENOTFOUND) {   /* evicted and then dropped by capacity GC, or removed: put back */
        canary_put();
        return;
    }
    if (rc != KV_OK || memcmp(back, S.canary_bytes, CANARY_LEN) != 0)
        fprintf(stderr, "fuzz_shm: the canary block %s\n",
                rc != KV_OK ? kv_strerror(rc) : "changed under the server");
    FZ_CHECK(rc == KV_OK && memcmp(back, S.canary_bytes, CANARY_LEN) == 0);
    uint8_t hit = 0;   /* a shard the input added to the canary's block may make it incomplete */
    FZ_CHECK(kv_lookup(S.e, &S.canary, 1, &hit) == KV_OK);
}

/* A frame that removes the canary from the SSD tier and then writes it
 * anew is a legitimate change; such an input's canary is put back. */
static bool removes_canary(const struct frame *f, size_t nf)
{
    for (size_t i = 0; i < nf; i++)
        if (f[i].op == OP_SSD_REMOVE && f[i].len == 8 + KV_BLOCK_ID_LEN &&
            memcmp(f[i].p + 8, S.canary.bytes, KV_BLOCK_ID_LEN) == 0)
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!S.e)
        setup();
    struct frame *f;
    size_t nf = parse(data, size, &f);
    int fd = -1;
    int rc = kv__shm_fuzz_dial(S.sock, "", &fd);
    if (rc != KV_OK)
        fprintf(stderr, "fuzz_shm: cannot connect to the server: %s\n", kv_strerror(rc));
    FZ_CHECK(rc == KV_OK);
    struct peer p = { .sock = fd, .f = f, .nf = nf };
    peer_main(&p);   /* returns once the server has closed */
    close(fd);
    check_answers(f, nf, p.ans, p.nans);
    for (size_t i = 0; i < nf; i++)
        if (f[i].fd >= 0)
            close(f[i].fd);
    bool removed = removes_canary(f, nf);
    free(f);
    free(p.ans);
    if (removed) {
        kv_ssd_remove(S.e, &S.canary);
        canary_put();
    }
    check_world();
    return 0;
}

/* ---- seeds: the real client's frames, recorded ---------------------------------- */

/* A relay between a client and the server that keeps what the client sends
 * while rec is set, each descriptor noted at the offset it rode on. */
struct relay {
    int lfd;
    char server[128];
    _Atomic bool rec;
    pthread_mutex_t mu;
    uint8_t *buf;
    size_t len, cap;
    size_t fd_at[64];
    size_t nfd;
    pthread_t th;
};

static void rec_put(struct relay *r, const uint8_t *b, size_t n, bool fd)
{
    pthread_mutex_lock(&r->mu);
    if (fd && r->nfd < 64)
        r->fd_at[r->nfd++] = r->len;
    if (r->len + n > r->cap) {
        r->cap = (r->len + n) * 2;
        r->buf = realloc(r->buf, r->cap);
        FZ_CHECK(r->buf);
    }
    memcpy(r->buf + r->len, b, n);
    r->len += n;
    pthread_mutex_unlock(&r->mu);
}

/* Moves what is there from a to b, descriptors included; false at the end. */
static bool relay_move(struct relay *r, int a, int b, bool from_client)
{
    static __thread uint8_t buf[1 << 16];
    union { struct cmsghdr h; char c[CMSG_SPACE(sizeof(int))]; } u;
    struct iovec iov = { buf, sizeof buf };
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c,
                        .msg_controllen = sizeof u.c };
    ssize_t n = recvmsg(a, &m, MSG_CMSG_CLOEXEC);
    if (n <= 0)
        return false;
    int fd = -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c && c->cmsg_type == SCM_RIGHTS)
        memcpy(&fd, CMSG_DATA(c), sizeof fd);
    if (from_client && atomic_load(&r->rec))
        rec_put(r, buf, (size_t)n, fd >= 0);
    struct iovec out = { buf, (size_t)n };
    struct msghdr mo = { .msg_iov = &out, .msg_iovlen = 1 };
    if (fd >= 0) {
        mo.msg_control = u.c;
        mo.msg_controllen = sizeof u.c;
    }
    bool ok = sendmsg(b, &mo, MSG_NOSIGNAL) == n;   /* blocking sockets: all of it */
    if (fd >= 0)
        close(fd);
    return ok;
}

static void *relay_main(void *arg)
{
    struct relay *r = arg;
    for (;;) {
        int cfd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0)
            return NULL;   /* the listener was shut: done */
        int sfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", r->server);
        FZ_CHECK(sfd >= 0 && connect(sfd, (struct sockaddr *)&sa, sizeof sa) == 0);
        for (;;) {
            struct pollfd p[2] = { { cfd, POLLIN, 0 }, { sfd, POLLIN, 0 } };
            if (poll(p, 2, -1) < 0)
                continue;
            if (p[0].revents && !relay_move(r, cfd, sfd, true))
                break;
            if (p[1].revents && !relay_move(r, sfd, cfd, false))
                break;
        }
        close(cfd);
        close(sfd);
    }
}

/* The recording, as the harness reads it: a kind byte before each frame
 * (1 where a descriptor rode on it). */
static uint64_t relay_seed(struct relay *r, const char *dir, const char *name)
{
    uint64_t ops = 0;
    pthread_mutex_lock(&r->mu);
    uint8_t *out = malloc(r->len + r->len / 8 + 64);
    size_t n = 0, d = 0;
    FZ_CHECK(out);
    for (size_t at = 0; at + 8 <= r->len;) {
        size_t flen = 8 + (size_t)kv__get32(r->buf + at);
        if (flen > r->len - at)
            break;
        bool fd = false;
        while (d < r->nfd && r->fd_at[d] < at + flen)
            fd |= r->fd_at[d++] >= at;
        out[n++] = fd ? 1 : 0;
        uint32_t op = kv__get32(r->buf + at + 4);
        ops |= op < 64 ? 1ull << op : 0;
        memcpy(out + n, r->buf + at, flen);
        n += flen;
        at += flen;
    }
    r->len = r->nfd = 0;
    pthread_mutex_unlock(&r->mu);
    fz_seed(dir, name, out, n);
    free(out);
    return ops;
}

static int stop_after_one(void *ctx, const kv_ssd_entry *e)
{
    (void)e;
    return ++*(int *)ctx >= 1;
}

static int count_all(void *ctx, const kv_ssd_entry *e)
{
    (void)e;
    ++*(int *)ctx;
    return 0;
}

static void write_seeds(const char *dir)
{
    setup();
    struct relay r = { .lfd = -1 };
    pthread_mutex_init(&r.mu, NULL);
    snprintf(r.server, sizeof r.server, "%s/rv/fuzz.sock", S.dir);
    char via[256];
    snprintf(via, sizeof via, "%s/relay.sock", S.dir);
    r.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", via);
    FZ_CHECK(r.lfd >= 0 && bind(r.lfd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
             listen(r.lfd, 4) == 0);
    FZ_CHECK(pthread_create(&r.th, NULL, relay_main, &r) == 0);
    struct kv__shm_regions *regs;
    FZ_CHECK(kv__shm_regions_new(&regs) == KV_OK);
    char err[256] = "";
    enum { NB = 6, BIG = 3u << 20 };
    static uint8_t small[NB][3000], back[NB][3000];
    kv_iov in[NB], outv[NB];
    kv_shard dsh[NB], lsh[NB];
    kv_block_id ids[NB];
    for (int i = 0; i < NB; i++) {
        memset(ids[i].bytes, 0, KV_BLOCK_ID_LEN);
        ids[i].bytes[0] = (uint8_t)(0x10 + i);
        memset(small[i], 'a' + i, sizeof small[i]);
        in[i] = (kv_iov){ small[i], 1000 + 300 * (size_t)i };
        outv[i] = (kv_iov){ back[i], in[i].len };
        dsh[i] = (kv_shard){ ids[i], (uint32_t)(i % 2), &in[i], 1 };
        lsh[i] = (kv_shard){ ids[i], (uint32_t)(i % 2), &outv[i], 1 };
    }
    int res[NB];
    uint8_t hit[NB];
    uint8_t *big = calloc(1, BIG);
    FZ_CHECK(big);
    struct kv__shm_client *c;
#define BIT(op) (1ull << (op))
#define SEED(name, want, ...)                                                      \
    do {                                                                            \
        FZ_CHECK(kv__shm_connect(via, "", 3000, regs, &c, err, sizeof err) == KV_OK); \
        atomic_store(&r.rec, true);                                                 \
        __VA_ARGS__;                                                                \
        kv_stats st_;                                                               \
        FZ_CHECK(kv__shm_stats(c, &st_) == KV_OK);   /* the pins marked on the board end */ \
        atomic_store(&r.rec, false);                                                \
        uint64_t got_ = relay_seed(&r, dir, name);                                  \
        if ((got_ & (want)) != (want))                                              \
            fprintf(stderr, "fuzz_shm: seed %s: ops 0x%llx, want 0x%llx: this file's op " \
                    "numbers are not net/shm.c's\n", name, (unsigned long long)got_, \
                    (unsigned long long)(want));                                    \
        FZ_CHECK((got_ & (want)) == (want));                                        \
        kv__shm_disconnect(c);                                                      \
    } while (0)

    /* blocks: dump (staged), lookup, prefetch, load (pinned; the pins end by
     * the board, no message), a miss */
    SEED("blocks", BIT(OP_STAGING) | BIT(OP_DUMP) | BIT(OP_LOOKUP) | BIT(OP_PREFETCH) |
                         BIT(OP_LOAD) | BIT(OP_STATS), {
        FZ_CHECK(kv__shm_dump(c, dsh, NB, res) == KV_OK);
        FZ_CHECK(kv__shm_lookup(c, ids, NB, hit) == KV_OK);
        FZ_CHECK(kv__shm_prefetch(c, ids, NB) == KV_OK);
        FZ_CHECK(kv__shm_load(c, lsh, NB, res) == KV_OK);
        kv_shard miss = lsh[0];
        miss.index = 7;
        kv__shm_load(c, &miss, 1, res);
    });
    /* more shards than the server's inner batch (64), so its flush in the
     * middle of a request is reached; every other one misses */
    SEED("blocks-70", BIT(OP_DUMP) | BIT(OP_LOAD), {
        enum { M = 70 };
        static uint8_t one[M][256];
        static kv_iov v[M];
        static kv_shard s[M];
        static int mres[M];
        for (int i = 0; i < M; i++) {
            kv_block_id id = { { 0x70, (uint8_t)i } };
            v[i] = (kv_iov){ one[i], 64 + (size_t)i };
            s[i] = (kv_shard){ id, 0, &v[i], 1 };
        }
        FZ_CHECK(kv__shm_dump(c, s, M / 2, mres) == KV_OK);
        FZ_CHECK(kv__shm_load(c, s, M, mres) == KV_OK);
    });
    /* shared buffers: REGION, a dump from and a load into one, UNREGION */
    SEED("region", BIT(OP_REGION) | BIT(OP_UNREGION), {
        void *buf = NULL;
        FZ_CHECK(kv__shm_region_alloc(regs, 8192, true, &buf) == KV_OK);
        memset(buf, 'r', 8192);
        kv_iov v = { buf, 8192 };
        kv_shard s = { ids[0], 5, &v, 1 };
        FZ_CHECK(kv__shm_dump(c, &s, 1, res) == KV_OK);
        FZ_CHECK(kv__shm_load(c, &s, 1, res) == KV_OK);
        FZ_CHECK(kv__shm_region_free(regs, buf) == KV_OK);
        FZ_CHECK(kv__shm_dump(c, dsh, 1, res) == KV_OK);   /* says UNREGION first */
    });
    /* spilled: more than DRAM holds (copied loads), one value too big to inline */
    SEED("spilled", BIT(OP_DUMP) | BIT(OP_LOAD), {
        kv_iov v = { big, BIG };
        for (int i = 0; i < 4; i++) {
            kv_block_id id = { { 0x40, (uint8_t)i } };
            kv_shard s = { id, 0, &v, 1 };
            FZ_CHECK(kv__shm_dump(c, &s, 1, res) == KV_OK);
        }
        for (int i = 0; i < 4; i++) {
            kv_block_id id = { { 0x40, (uint8_t)i } };
            kv_shard s = { id, 0, &v, 1 };
            FZ_CHECK(kv__shm_load(c, &s, 1, res) == KV_OK);
        }
    });
    /* plain keys: inline and staged puts and gets, too small, exists, removes */
    SEED("keys", BIT(OP_PUT) | BIT(OP_GET) | BIT(OP_EXISTS) | BIT(OP_REMOVE) |
                       BIT(OP_REMOVE_ALL) | BIT(OP_REMOVE_PREFIX), {
        size_t vl = 0;
        char kb[64];
        FZ_CHECK(kv__shm_put(c, "k1", 2, "value-one", 9) == KV_OK);
        FZ_CHECK(kv__shm_put(c, "k-big", 5, big, (1u << 20) + 100) == KV_OK);
        FZ_CHECK(kv__shm_get(c, "k1", 2, kb, sizeof kb, &vl) == KV_OK);
        kv__shm_get(c, "k1", 2, kb, 3, &vl);
        FZ_CHECK(kv__shm_get(c, "k-big", 5, big, (1u << 20) + 200, &vl) == KV_OK);
        kv__shm_exists(c, "k1", 2);
        kv__shm_remove(c, "k1", 2);
        kv__shm_remove(c, "k1", 2);
        uint64_t removed;
        FZ_CHECK(kv__shm_put(c, "pfx-a", 5, "1", 1) == KV_OK);
        kv__shm_remove_prefix(c, "pfx-", 4, &removed);
        kv__shm_remove_all(c, &removed);
    });
    /* many: puts, gets (found, missing, too small), exists */
    SEED("many", BIT(OP_MANY), {
        char g[3][16];
        kv_pair puts[3] = { { "m1", 2, "one", 3 }, { "m2", 2, "two!", 4 }, { "m3", 2, "", 0 } };
        kv_pair gets[3] = { { "m1", 2, g[0], 16 }, { "zz", 2, g[1], 16 }, { "m2", 2, g[2], 1 } };
        int mr[3];
        FZ_CHECK(kv__shm_many(c, 0, puts, 3, mr) == KV_OK);
        FZ_CHECK(kv__shm_many(c, 1, gets, 3, mr) == KV_OK);
        FZ_CHECK(kv__shm_many(c, 2, puts, 3, mr) == KV_OK);
    });
    /* the SSD tier: a scan of more than a batch, one stopped at once, a
     * scrub with and without entries, a compaction, a remove */
    for (int i = 0; i < 1100; i++) {
        char k[16];
        snprintf(k, sizeof k, "fill-%d", i);
        FZ_CHECK(kv_put(S.e, k, strlen(k), "x", 1) == KV_OK);
    }
    SEED("ssd-scan", BIT(OP_SSD_SCAN) | BIT(OP_SSD_NEXT), {
        int n = 0;
        FZ_CHECK(kv__shm_ssd_scan(c, count_all, &n) == KV_OK);
        FZ_CHECK(n > 1024);
    });
    SEED("ssd-stop", BIT(OP_SSD_SCAN) | BIT(OP_SSD_NEXT), {
        int n = 0;
        FZ_CHECK(kv__shm_ssd_scan(c, stop_after_one, &n) == KV_OK && n == 1);
    });
    SEED("ssd-scrub", BIT(OP_SSD_SCRUB), {
        uint64_t checked, bad;
        int n = 0;
        FZ_CHECK(kv__shm_ssd_scrub(c, 1, count_all, &n, &checked, &bad) == KV_OK);
        FZ_CHECK(kv__shm_ssd_scrub(c, 0, NULL, NULL, &checked, &bad) == KV_OK);
    });
    SEED("ssd-compact-remove", BIT(OP_SSD_COMPACT) | BIT(OP_SSD_REMOVE), {
        FZ_CHECK(kv__shm_ssd_compact(c) == KV_OK);
        FZ_CHECK(kv__shm_ssd_remove(c, &ids[1]) == KV_OK);
        kv__shm_ssd_remove(c, &ids[1]);
    });
    SEED("stats", BIT(OP_STATS), {});
#undef SEED
#undef BIT
    shutdown(r.lfd, SHUT_RDWR);
    close(r.lfd);
    pthread_join(r.th, NULL);
    kv__shm_regions_free(regs);
    free(big);
    free(r.buf);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    fz_mkcorpus(write_seeds);
    return 0;
}
