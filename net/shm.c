/*
 * shm.c — the host store's shared-memory transport: the server that hands
 * its engine to the other processes of its user on its host, and the
 * client those processes' engines route every call through.
 *
 * Key design choice: bytes never cross the socket on the block path. The
 * store's segment is a sealed memfd that each client maps READ-ONLY (a
 * descriptor reopened O_RDONLY, passed with SCM_RIGHTS), and so is the
 * segment's directory (net/dir.c): a load first copies every shard the
 * directory names straight from the segment into the caller's buffer,
 * each copy checked against the directory afterwards, and sends the
 * server only the rest (blocks()). Those the server pins where DRAM holds
 * them (net/serve.c's policy) and answers their offsets, the client
 * copies each straight from the segment, then marks the pin's slot on its
 * pin board (below). What is not in DRAM
 * (SSD, a remote owner) the server copies into memory the client shares
 * with it: a kvengine shared buffer (kv_buffer_alloc) when the destination
 * lies in one, else the connection's staging memfd. A dump is copied into
 * the staging memfd by the client (none from a shared buffer) and into the
 * segment by the server: no client ever holds a writable view of stored
 * bytes.
 *
 * The socket carries small frames of our own (below), every one
 * bounds-checked by the server before anything is allocated or touched:
 * a request names memory only as (region, offset, length) inside mappings
 * this connection handed over, each sealed against shrinking (a client
 * cannot truncate a mapping under the server: no SIGBUS).
 *
 *   hello    server: u32 magic, u32 version, i32 same-user status; the
 *            token's challenge-response (auth.h); client: boot id[40],
 *            u32 sizeof(kv_stats), u32 magic, u32 version + its pin board
 *            (a memfd of BOARD_LEN bytes); server: i32 status, u32 has-
 *            segment, u64 segment length + the segment (read-only memfd);
 *            then u64 directory length (0: none) + the directory (a memfd
 *            sealed against writes, net/dir.c).
 *            Each side refuses another version (SHM_VERSION), naming both.
 *   frame    u32 body length, u32 op (request) or rc (response), body
 *   loc      u8 kind (0 inline, 1 staging, 2 region), u32 region, u64 offset
 *   LOOKUP   u32 n, n ids             -> n hit bytes
 *   PREFETCH u32 n, n ids             -> rc
 *   LOAD     u32 n, n x (id, u32 index, u64 len, loc)
 *                                     -> n x (i32 status, u8 how, u64 seg offset, u32 pin)
 *   (op 4, RELEASE, is retired since version 2: pins end on the board)
 *   DUMP     u32 n, n x (id, u32 index, u64 len, loc)  -> n x i32 status
 *   PUT      u8 klen, key, loc, u64 vlen [, value]     -> rc
 *   GET      u8 klen, key, loc, u64 cap   -> u64 vlen [, value when inline]
 *   EXISTS, REMOVE  u8 klen, key          -> rc
 *   REMOVE_ALL                            -> u64 removed
 *   STATS                                 -> struct kv_stats
 *   STAGING  u64 size + a memfd           -> rc (replaces the last one)
 *   REGION   u32 id, u64 size + a memfd   -> rc
 *   UNREGION u32 id                       -> rc
 *   MANY     u8 what (0 put, 1 get, 2 exists), u32 n,
 *            n x (u8 klen, key, u64 len [, len value bytes for a put])
 *                                     -> n x (i32 status, u64 vlen), then the
 *                                        values of the gets that found one
 *   REMOVE_PREFIX  u8 len (1..250), prefix  -> u64 removed
 *   SSD_SCAN                             -> a stream (below)
 *   SSD_SCRUB u8 repair, u8 entries      -> a stream (entries 0: counts only)
 *   SSD_NEXT  u8 stop                    the client's word after each batch
 *   SSD_COMPACT                          -> rc, after keepalives (rc MORE, no body)
 *   SSD_REMOVE id                        -> rc
 *   stream   frames of rc MORE: u32 n, n x entry, each answered by SSD_NEXT;
 *            then the last (rc the call's): u32 n, n x entry, u64 checked, u64 bad
 *   entry    u8 ns, id, u32 index, u64 size, u64 seq, u64 total, i32 status
 *
 * The board, after its PINS_MAX pin bytes: u64 the loads this client read
 * straight from the segment (its count, which the server adds to hits_dram),
 * u64 the ids it has written to its touch ring, then that ring of TOUCH_N
 * block ids (touch_all). The server trusts none of it with anything more.
 * Pins end without a message: the client sets byte `pin` of its board once
 * it has copied that shard, and the server ends the marked pins before it
 * serves the connection's next request (any op), or after HOLD_MS of quiet
 * (board_reap). A load is one round trip, and at most PINS_MAX pins per
 * connection are out at once, as before.
 *
 * Lifecycle: a connection is one server thread with its pins, pin board,
 * staging mapping and region mappings; when the peer goes (closed,
 * SIGKILLed) the thread drops them all. A client that loses its server
 * fails the call (KV_ENET, every wait bounded by the timeout, MSG_NOSIGNAL)
 * and marks itself broken; engine/host.c then reconnects or takes the
 * store over.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "dir.h"
#include "serve.h"
#include "shm.h"
#include "sock.h"

#define SHM_MAGIC      KV__SHM_MAGIC
#define SHM_VERSION    KV__SHM_VERSION
#define FRAME_MAX      (8u << 20)    /* request or response body */
#define ITEMS_MAX      4096u         /* shards or ids in one request */
#define INLINE_MAX     (1u << 20)    /* plain-key values carried in the frame */
#define STAGE_MIN      (64ull << 20) /* sparse: only what is written is memory */
#define PINS_MAX       8192u         /* per connection; past it loads are copied */
#define BOARD_HITS     PINS_MAX      /* u64: the loads the client read directly */
#define BOARD_HEAD     (PINS_MAX + 8) /* u64: block ids it has written to the touch ring */
#define BOARD_RING     (PINS_MAX + 64) /* the touch ring: TOUCH_N block ids */
#define TOUCH_N        1024u
#define BOARD_LEN      KV__SHM_BOARD_LEN
#define TOUCH_MS       50u           /* how often the server reads the touch rings */
#define TOUCH_ROUNDS   16            /* at most TOUCH_ROUNDS * TOUCH_N ids a tick */
_Static_assert(BOARD_LEN == BOARD_RING + TOUCH_N * KV_BLOCK_ID_LEN, "the board's layout");
#define HOLD_MS        10u           /* a quiet connection's copied pins end this soon */
#define HOLD_MAX_MS    1000u         /* the wait doubles up to this while none are done */
#define REGIONS_MAX    256u          /* mappings one connection may hand over */
#define MAP_MAX        (64ull << 30) /* the largest client memfd the server maps */
#define CONNS_MAX      256u
#define LOC_LEN        13u
#define ITEM_LEN       (KV_BLOCK_ID_LEN + 4 + 8 + LOC_LEN)
#define LOAD_ANS_LEN   17u
#define BOOTID_LEN     40u
#define HELLO_IN_LEN   (BOOTID_LEN + 12) /* boot id, u32 sizeof(kv_stats), u32 magic, u32 version */
#define MANY_BYTES     (4u << 20)    /* a MANY request's values, or its answer's */
#define MANY_ANS_LEN   12u
#define SSD_BATCH      1024u         /* entries in one frame of a scan or scrub */
#define SSD_ENT_LEN    49u
#define SHM_MORE       1             /* the rc of a frame more frames follow */

enum { OP_LOOKUP = 1, OP_PREFETCH, OP_LOAD, OP_RELEASE, OP_DUMP, OP_PUT, OP_GET, OP_EXISTS,
       OP_REMOVE, OP_REMOVE_ALL, OP_STATS, OP_STAGING, OP_REGION, OP_UNREGION, OP_MANY,
       OP_REMOVE_PREFIX,
       OP_SSD_SCAN, OP_SSD_SCRUB, OP_SSD_NEXT, OP_SSD_COMPACT, OP_SSD_REMOVE };
enum { LOC_INLINE = 0, LOC_STAGE = 1, LOC_REGION = 2 };
enum { HOW_NONE = 0, HOW_PINNED = 1, HOW_COPIED = 2 };

/* close() of a listed descriptor. */
static void close_listed(int fd)
{
    if (fd < 0)
        return;
    kv__fork_close(fd, false);
    close(fd);
}

/* ---- small helpers -------------------------------------------------------- */

static uint64_t deadline_for(unsigned timeout_ms, uint64_t bytes)
{
    return kv__now_ms() + timeout_ms + kv__net_floor_ms(bytes);
}

/* The host's boot id, NUL-padded to BOOTID_LEN; KV_EIO. */
static int boot_id(char out[BOOTID_LEN])
{
    memset(out, 0, BOOTID_LEN);
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return KV_EIO;
    ssize_t n = read(fd, out, BOOTID_LEN - 1);
    close(fd);
    if (n <= 0)
        return KV_EIO;
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\0'))
        out[--n] = '\0';
    return KV_OK;
}

/* Sends all of p with one descriptor riding on its first byte (fd < 0:
 * none). MSG_NOSIGNAL: a gone peer is an error, not a SIGPIPE. */
static int send_with_fd(int sock, const void *p, size_t len, int fd, uint64_t deadline)
{
    if (fd < 0)
        return kv__sock_xfer1(sock, (void *)p, len, 1, deadline);
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } u;
    memset(&u, 0, sizeof u);
    struct iovec iov = { (void *)p, len };
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    for (;;) {
        ssize_t n = sendmsg(sock, &m, MSG_NOSIGNAL);
        if (n > 0) {
            if ((size_t)n == len)
                return KV_OK;
            return kv__sock_xfer1(sock, (uint8_t *)p + n, len - (size_t)n, 1, deadline);
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = kv__sock_wait(sock, POLLOUT, deadline);
            if (rc != KV_OK)
                return rc;
            continue;
        }
        return KV_ENET;
    }
}

/* Receives exactly len bytes, and the descriptor riding on them in *fd (-1
 * when none came; any extra descriptors are closed). */
static int recv_with_fd(int sock, void *p, size_t len, int *fd, uint64_t deadline)
{
    *fd = -1;
    union { struct cmsghdr h; char buf[CMSG_SPACE(4 * sizeof(int))]; } u;
    struct iovec iov = { p, len };
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf };
    ssize_t n;
    for (;;) {
        n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        if (n > 0)
            break;
        if (n == 0)
            return KV_ENET;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = kv__sock_wait(sock, POLLIN, deadline);
            if (rc != KV_OK)
                return rc;
            continue;
        }
        return KV_ENET;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
            if (*fd < 0)
                *fd = got;
            else
                close(got);
        }
    }
    if ((size_t)n < len)
        return kv__sock_xfer1(sock, (uint8_t *)p + n, len - (size_t)n, 0, deadline);
    return KV_OK;
}

/* The peer's uid must be ours: KV_EPERM. */
static int same_user(int fd)
{
    struct ucred cr;
    socklen_t l = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0)
        return KV_ENET;
    return cr.uid == geteuid() ? KV_OK : KV_EPERM;
}

static void put_loc(uint8_t *p, int kind, uint32_t region, uint64_t off)
{
    p[0] = (uint8_t)kind;
    kv__put32(p + 1, region);
    kv__put64(p + 5, off);
}

/* ---- shared buffers -------------------------------------------------------- */

struct region {
    uint32_t id;
    uint8_t *base;
    size_t len;
    int fd;                 /* -1: anonymous memory (no server to share it with) */
};

struct kv__shm_regions {
    pthread_mutex_t mu;
    struct region *r;
    size_t n, cap;
    uint32_t next_id;
    _Atomic uint64_t gen;   /* bumped by every free: connections drop their stale ones */
};

int kv__shm_regions_new(struct kv__shm_regions **out)
{
    struct kv__shm_regions *r = calloc(1, sizeof *r);
    if (!r)
        return KV_ENOMEM;
    pthread_mutex_init(&r->mu, NULL);
    r->next_id = 1;
    *out = r;
    return KV_OK;
}

void kv__shm_regions_free(struct kv__shm_regions *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        munmap(r->r[i].base, r->r[i].len);
        if (r->r[i].fd >= 0)
            close(r->r[i].fd);
    }
    free(r->r);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

int kv__shm_region_alloc(struct kv__shm_regions *r, size_t len, bool shared, void **out)
{
    *out = NULL;
    long page = sysconf(_SC_PAGESIZE);
    size_t rounded = (len + (size_t)page - 1) & ~((size_t)page - 1);
    if (len == 0 || rounded < len)
        return KV_EINVAL;
    int fd = -1;
    void *p;
    if (shared) {
        fd = memfd_create("kvengine-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
            return kv__err_from_errno(errno);
        if (ftruncate(fd, (off_t)rounded) != 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
            close(fd);
            return KV_ENOMEM;
        }
        p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    } else {
        p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (p == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        return KV_ENOMEM;
    }
    pthread_mutex_lock(&r->mu);
    if (r->n == r->cap) {
        size_t nc = r->cap ? 2 * r->cap : 16;
        struct region *nr = realloc(r->r, nc * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&r->mu);
            munmap(p, rounded);
            if (fd >= 0)
                close(fd);
            return KV_ENOMEM;
        }
        r->r = nr;
        r->cap = nc;
    }
    r->r[r->n++] = (struct region){ r->next_id++, p, rounded, fd };
    pthread_mutex_unlock(&r->mu);
    *out = p;
    return KV_OK;
}

int kv__shm_region_free(struct kv__shm_regions *r, void *addr)
{
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n; i++)
        if (r->r[i].base == addr) {
            struct region g = r->r[i];
            r->r[i] = r->r[--r->n];
            atomic_fetch_add(&r->gen, 1);
            pthread_mutex_unlock(&r->mu);
            munmap(g.base, g.len);
            if (g.fd >= 0)
                close(g.fd);
            return KV_OK;
        }
    pthread_mutex_unlock(&r->mu);
    return KV_ENOTFOUND;
}

/* The shared region of r that holds all of [p, p+len), or NULL (r->mu
 * held). */
static const struct region *region_at(const struct kv__shm_regions *r, const void *p, size_t len)
{
    for (size_t i = 0; i < r->n; i++) {
        const struct region *g = &r->r[i];
        if (g->fd >= 0 && (const uint8_t *)p >= g->base &&
            (const uint8_t *)p - g->base <= (ptrdiff_t)g->len &&
            len <= g->len - (size_t)((const uint8_t *)p - g->base))
            return g;
    }
    return NULL;
}

/* The shared region [p, p+len) lies in, with its id and descriptor; false
 * when none holds all of it. */
static bool region_find(struct kv__shm_regions *r, const void *p, size_t len, uint32_t *id,
                        uint64_t *off, int *fd, size_t *rlen)
{
    pthread_mutex_lock(&r->mu);
    const struct region *g = region_at(r, p, len);
    if (g) {
        *id = g->id;
        *off = (uint64_t)((const uint8_t *)p - g->base);
        *fd = g->fd;
        *rlen = g->len;
    }
    pthread_mutex_unlock(&r->mu);
    return g != NULL;
}

bool kv__shm_regions_hold(struct kv__shm_regions *r, const kv_shard *sh, size_t n)
{
    bool all = true;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; all && i < n; i++)
        all = !kv__iov_len(sh[i].iov, sh[i].iovcnt) ||
              (sh[i].iovcnt == 1 && region_at(r, sh[i].iov[0].base, sh[i].iov[0].len));
    pthread_mutex_unlock(&r->mu);
    return all;
}

static bool region_alive(struct kv__shm_regions *r, uint32_t id)
{
    bool alive = false;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n; i++)
        alive |= r->r[i].id == id;
    pthread_mutex_unlock(&r->mu);
    return alive;
}

/* ============================== the server ================================ */

struct smap {                /* a client's memory this connection maps */
    uint32_t id;
    uint8_t *base;
    size_t len;
};

struct sconn {
    struct kv__shm_server *srv;
    int fd;
    pthread_t th;
    _Atomic bool done;
    struct sconn *next;
    struct smap stage;
    struct smap regions[REGIONS_MAX];
    size_t nregions;
    kv__pin *pins;           /* PINS_MAX slots */
    uint8_t *pin_used;
    uint32_t *pin_free;      /* stack of free slots */
    uint32_t nfree;
    struct smap board;       /* the client's pin board (BOARD_LEN bytes) */
    uint32_t *held;          /* slots answered to the client and not yet ended */
    bool board_live;         /* under mu: kv__shm_server_stats may read the board */
    uint64_t touch_tail;     /* the ring's entries read so far (under mu) */
    uint32_t nheld;
    unsigned hold_ms;        /* the next quiet wait before looking at the board */
    uint8_t *rbuf, *wbuf;
    size_t rcap, wcap;
};

struct kv__shm_server {
    struct kv__shm_host host;
    char path[108];
    char token[KV_CFG_STR];
    unsigned timeout_ms;
    int lfd;
    int stop_pipe[2];
    int ro_fd;               /* the segment, reopened read-only: what clients get */
    pthread_t accept_th;
    pthread_mutex_t mu;      /* conns */
    struct sconn *conns;
    _Atomic uint64_t nconns, npins, requests;
    uint64_t direct_gone;    /* direct reads of connections that ended (under mu) */
    _Atomic bool stopping;
};

static void smap_drop(struct smap *m)
{
    if (m->base)
        munmap(m->base, m->len);
    memset(m, 0, sizeof *m);
}

/* Maps a client's memfd read-write after checking it cannot shrink under
 * us (F_SEAL_SHRINK) and really is size bytes. */
static int smap_take(int fd, uint64_t size, struct smap *m)
{
    int seals = fcntl(fd, F_GET_SEALS);
    struct stat st;
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &st) != 0 || size == 0 ||
        (uint64_t)st.st_size < size || size > MAP_MAX)
        return KV_EPERM;
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return KV_EPERM;
    m->base = p;
    m->len = (size_t)size;
    return KV_OK;
}

/* Resolves a loc of len bytes to memory this connection maps; NULL when it
 * is not wholly inside one. */
static uint8_t *sconn_loc(struct sconn *c, const uint8_t *loc, uint64_t len)
{
    int kind = loc[0];
    uint32_t id = kv__get32(loc + 1);
    uint64_t off = kv__get64(loc + 5);
    const struct smap *m = NULL;
    if (kind == LOC_STAGE)
        m = &c->stage;
    else if (kind == LOC_REGION)
        for (size_t i = 0; i < c->nregions && !m; i++)
            if (c->regions[i].id == id)
                m = &c->regions[i];
    if (!m || !m->base || off > m->len || len > m->len - off)
        return NULL;
    return m->base + off;
}

static void sconn_release(struct sconn *c, uint32_t slot)
{
    if (slot >= PINS_MAX || !c->pin_used[slot])
        return;
    c->srv->host.unpin(c->srv->host.ctx, &c->pins[slot]);
    c->pin_used[slot] = 0;
    c->pin_free[c->nfree++] = slot;
    atomic_fetch_sub(&c->srv->npins, 1);
}

/*
 * Ends the pins whose copy the client has finished. The client marks a
 * slot's byte on its pin board (its own memory, shared with us) once it has
 * copied that shard out of the segment; we end every marked pin of ours and
 * clear its byte, before serving each request and when the connection has
 * been quiet for hold_ms. So a pin costs no message of its own, a streaming
 * client's pins end with its next request, and an idle client's within
 * HOLD_MS: eviction is not held up by a client that stopped asking. A pin
 * whose copy is still running (its byte not yet set) is never ended here,
 * so a reader preempted mid-copy never sees its bytes reused. A client
 * that sets bytes early or wrongly can only cut its own copies short: we
 * read nothing else from the board, and the slots are ours.
 */
static bool board_reap(struct sconn *c)
{
    bool ended = false;
    _Atomic uint8_t *b = (_Atomic uint8_t *)c->board.base;
    for (uint32_t i = 0; b && i < c->nheld;) {
        uint32_t slot = c->held[i];
        if (!atomic_load_explicit(&b[slot], memory_order_acquire)) {
            i++;
            continue;
        }
        atomic_store_explicit(&b[slot], 0, memory_order_relaxed);
        sconn_release(c, slot);
        c->held[i] = c->held[--c->nheld];
        ended = true;
    }
    return ended;
}

/* A quiet connection with pins out: end those copied, and wait longer
 * (up to HOLD_MAX_MS) while none are. */
static void quiet_reap(struct sconn *c)
{
    c->hold_ms = board_reap(c) ? HOLD_MS
               : c->hold_ms * 2 > HOLD_MAX_MS ? HOLD_MAX_MS : c->hold_ms * 2;
}

/* The loads the client says it read straight from the segment (its board's
 * tail): a figure for kv_stats, nothing more, so a client that writes
 * nonsense there misleads only the counters. */
static uint64_t board_direct(const struct sconn *c)
{
    if (!c->board.base || c->board.len < BOARD_LEN)
        return 0;
    return atomic_load_explicit((_Atomic uint64_t *)(c->board.base + BOARD_HITS),
                                memory_order_relaxed);
}

static void sconn_free(struct sconn *c)
{
    for (uint32_t i = 0; c->pins && i < PINS_MAX; i++)
        sconn_release(c, i);
    smap_drop(&c->stage);
    smap_drop(&c->board);
    for (size_t i = 0; i < c->nregions; i++)
        smap_drop(&c->regions[i]);
    c->nregions = 0;
    /* A connection's thread closed its socket already, under the server's
     * lock (sconn_main): writing fd again here, outside it, raced with
     * kv__shm_stop reading it under the lock (ThreadSanitizer). */
    if (c->fd >= 0) {
        close_listed(c->fd);
        c->fd = -1;
    }
    free(c->pins);
    free(c->pin_used);
    free(c->pin_free);
    free(c->held);
    c->held = NULL;
    c->nheld = 0;
    free(c->rbuf);
    free(c->wbuf);
    c->pins = NULL;
    c->rbuf = c->wbuf = NULL;
}

static int wbuf_need(struct sconn *c, size_t n)
{
    if (n <= c->wcap)
        return KV_OK;
    uint8_t *p = realloc(c->wbuf, n);
    if (!p)
        return KV_ENOMEM;
    c->wbuf = p;
    c->wcap = n;
    return KV_OK;
}

static int reply(struct sconn *c, int rc, size_t len)
{
    uint8_t h[8];
    kv__put32(h, (uint32_t)len);
    kv__put32(h + 4, (uint32_t)rc);
    struct iovec iov[2] = { { h, 8 }, { c->wbuf, len } };
    return kv__sock_xfer(c->fd, iov, len ? 2 : 1, 1, deadline_for(c->srv->timeout_ms, len));
}

/* A LOAD or DUMP body: count u32, then count items of ITEM_LEN bytes, no
 * more and no fewer than len says; 1..ITEMS_MAX of them. */
static int item_count(const uint8_t *b, size_t len, uint32_t *n)
{
    if (len < 4)
        return KV_EPROTO;
    *n = kv__get32(b);
    return *n == 0 || *n > ITEMS_MAX || len != 4 + (size_t)*n * ITEM_LEN ? KV_EPROTO : KV_OK;
}

/* LOAD: pin what DRAM holds, copy the rest into the client's memory. */
static int do_load(struct sconn *c, const uint8_t *b, size_t len)
{
    const struct kv__shm_host *h = &c->srv->host;
    uint32_t n;
    if (item_count(b, len, &n) != KV_OK)
        return KV_EPROTO;
    int rc = wbuf_need(c, (size_t)n * LOAD_ANS_LEN);
    if (rc != KV_OK)
        return rc;
    kv_shard sh[64];
    kv_iov iov[64];
    uint32_t at[64];
    int res[64];
    size_t m = 0;
    for (uint32_t i = 0; i <= n; i++) {
        if (i == n || m == 64) {   /* the copies so far, in one call */
            if (m) {
                rc = h->load(h->ctx, sh, m, res);
                for (size_t k = 0; k < m; k++) {
                    uint8_t *a = c->wbuf + (size_t)at[k] * LOAD_ANS_LEN;
                    int r = rc != KV_OK ? rc : res[k];
                    kv__put32(a, (uint32_t)r);
                    a[4] = r == KV_OK ? HOW_COPIED : HOW_NONE;
                }
            }
            m = 0;
            if (i == n)
                break;
        }
        const uint8_t *it = b + 4 + (size_t)i * ITEM_LEN;
        uint8_t *a = c->wbuf + (size_t)i * LOAD_ANS_LEN;
        kv_block_id id;
        memcpy(id.bytes, it, KV_BLOCK_ID_LEN);
        uint32_t index = kv__get32(it + 16);
        uint64_t want = kv__get64(it + 20);
        memset(a, 0, LOAD_ANS_LEN);
        const void *data;
        uint64_t got;
        if (h->seg_base && c->held && c->nfree > 0 &&
            h->pin(h->ctx, &id, index, &data, &got, &c->pins[c->pin_free[c->nfree - 1]]) == KV_OK) {
            uint32_t slot = c->pin_free[c->nfree - 1];
            if (got != want) {
                h->unpin(h->ctx, &c->pins[slot]);
                kv__put32(a, (uint32_t)KV_EINVAL);
                continue;
            }
            c->nfree--;
            c->pin_used[slot] = 1;
            c->held[c->nheld++] = slot;   /* ends when the client marks it done */
            atomic_fetch_add(&c->srv->npins, 1);
            kv__put32(a, KV_OK);
            a[4] = HOW_PINNED;
            kv__put64(a + 5, (uint64_t)((const uint8_t *)data - (const uint8_t *)h->seg_base));
            kv__put32(a + 13, slot);
            continue;
        }
        uint8_t *dst = want ? sconn_loc(c, it + 28, want) : c->wbuf;   /* 0 bytes: anywhere */
        if (!dst) {
            kv__put32(a, (uint32_t)KV_EINVAL);
            continue;
        }
        iov[m] = (kv_iov){ dst, want };
        sh[m] = (kv_shard){ id, index, &iov[m], 1 };
        at[m++] = i;
    }
    return reply(c, KV_OK, (size_t)n * LOAD_ANS_LEN);
}

static int do_dump(struct sconn *c, const uint8_t *b, size_t len)
{
    const struct kv__shm_host *h = &c->srv->host;
    uint32_t n;
    if (item_count(b, len, &n) != KV_OK)
        return KV_EPROTO;
    int rc = wbuf_need(c, (size_t)n * 4);
    if (rc != KV_OK)
        return rc;
    kv_shard sh[64];
    kv_iov iov[64];
    uint32_t at[64];
    int res[64];
    size_t m = 0;
    for (uint32_t i = 0; i <= n; i++) {
        if (i == n || m == 64) {
            if (m) {
                rc = h->dump(h->ctx, sh, m, res);
                for (size_t k = 0; k < m; k++)
                    kv__put32(c->wbuf + 4 * at[k], (uint32_t)(rc != KV_OK ? rc : res[k]));
            }
            m = 0;
            if (i == n)
                break;
        }
        const uint8_t *it = b + 4 + (size_t)i * ITEM_LEN;
        kv_block_id id;
        memcpy(id.bytes, it, KV_BLOCK_ID_LEN);
        uint64_t slen = kv__get64(it + 20);
        uint8_t *src = slen ? sconn_loc(c, it + 28, slen) : c->wbuf;
        if (!src || slen > KV_VALUE_MAX) {
            kv__put32(c->wbuf + 4 * i, (uint32_t)KV_EINVAL);
            continue;
        }
        iov[m] = (kv_iov){ src, slen };
        sh[m] = (kv_shard){ id, kv__get32(it + 16), &iov[m], 1 };
        at[m++] = i;
    }
    return reply(c, KV_OK, (size_t)n * 4);
}

/* A key at b: u8 klen, key; its end in *used. */
static int take_key(const uint8_t *b, size_t len, size_t *used)
{
    if (len < 1 || b[0] == 0 || b[0] > KV_KEY_MAX || len < 1u + b[0])
        return KV_EPROTO;
    *used = 1u + b[0];
    return KV_OK;
}

static int do_keys(struct sconn *c, uint32_t op, const uint8_t *b, size_t len)
{
    const struct kv__shm_host *h = &c->srv->host;
    size_t k;
    if (take_key(b, len, &k) != KV_OK)
        return KV_EPROTO;
    const uint8_t *key = b + 1;
    size_t klen = b[0];
    if (op == OP_EXISTS)
        return len == k ? reply(c, h->exists(h->ctx, key, klen), 0) : KV_EPROTO;
    if (op == OP_REMOVE)
        return len == k ? reply(c, h->remove(h->ctx, key, klen), 0) : KV_EPROTO;
    if (len < k + LOC_LEN + 8)
        return KV_EPROTO;
    const uint8_t *loc = b + k;
    uint64_t vlen = kv__get64(b + k + LOC_LEN);
    size_t rest = len - k - LOC_LEN - 8;
    if (op == OP_PUT) {
        const uint8_t *val;
        if (loc[0] == LOC_INLINE) {
            if (rest != vlen)
                return KV_EPROTO;
            val = b + k + LOC_LEN + 8;
        } else {
            if (rest != 0)
                return KV_EPROTO;
            val = vlen ? sconn_loc(c, loc, vlen) : b;
            if (!val)
                return reply(c, KV_EINVAL, 0);
        }
        return reply(c, h->put(h->ctx, key, klen, val, (size_t)vlen), 0);
    }
    /* GET: vlen is the caller's capacity. */
    if (rest != 0)
        return KV_EPROTO;
    uint64_t cap = vlen;
    uint8_t *dst;
    int rc;
    if (loc[0] == LOC_INLINE) {
        if (cap > INLINE_MAX)
            return KV_EPROTO;
        if ((rc = wbuf_need(c, 8 + (size_t)cap)) != KV_OK)
            return rc;
        dst = c->wbuf + 8;
    } else {
        dst = cap ? sconn_loc(c, loc, cap) : c->wbuf;
        if (!dst)
            return reply(c, KV_EINVAL, 0);
        if ((rc = wbuf_need(c, 8)) != KV_OK)
            return rc;
    }
    size_t got = 0;
    rc = h->get(h->ctx, key, klen, dst, (size_t)cap, &got);
    kv__put64(c->wbuf, got);
    size_t out = 8 + (rc == KV_OK && loc[0] == LOC_INLINE ? got : 0);
    return reply(c, rc, out);
}

/* MANY: a batch of plain-key calls in one frame, values inline both ways
 * (the client sends a value larger than MANY_BYTES by itself instead). */
static int do_many(struct sconn *c, const uint8_t *b, size_t len)
{
    const struct kv__shm_host *h = &c->srv->host;
    if (len < 5 || b[0] > 2)
        return KV_EPROTO;
    int what = b[0];
    uint32_t n = kv__get32(b + 1);
    if (n == 0 || n > ITEMS_MAX)
        return KV_EPROTO;
    kv_pair *items = malloc((size_t)n * sizeof *items);
    int *res = malloc((size_t)n * sizeof *res);
    uint64_t *cap = malloc((size_t)n * sizeof *cap);
    int rc = items && res && cap ? KV_OK : KV_ENOMEM;
    size_t at = 5;
    uint64_t caps = 0;
    for (uint32_t i = 0; rc == KV_OK && i < n; i++) {
        size_t k;
        if (take_key(b + at, len - at, &k) != KV_OK || len - at - k < 8) {
            rc = KV_EPROTO;
            break;
        }
        uint64_t vl = kv__get64(b + at + k);
        items[i] = (kv_pair){ b + at + 1, b[at], NULL, (size_t)vl };
        at += k + 8;
        if (what == 0) {
            if (vl > len - at) {
                rc = KV_EPROTO;
                break;
            }
            items[i].val = (void *)(b + at);
            at += (size_t)vl;
        } else if (what == 1) {
            cap[i] = vl;
            caps += vl;
            if (vl > MANY_BYTES || caps > MANY_BYTES)
                rc = KV_EPROTO;   /* the client keeps its answers within a frame */
        }
    }
    if (rc == KV_OK && at != len)
        rc = KV_EPROTO;
    if (rc == KV_OK)
        rc = wbuf_need(c, (size_t)n * MANY_ANS_LEN + (size_t)caps);
    if (rc == KV_OK && what == 1) {   /* each value read in place, packed below */
        uint64_t off = (uint64_t)n * MANY_ANS_LEN;
        for (uint32_t i = 0; i < n; i++) {
            items[i].val = c->wbuf + off;
            off += cap[i];
        }
    }
    int call = rc == KV_OK ? h->many(h->ctx, what, items, n, res) : rc;
    size_t out = 0;
    if (rc == KV_OK && call == KV_OK) {
        out = (size_t)n * MANY_ANS_LEN;
        for (uint32_t i = 0; i < n; i++) {
            uint8_t *a = c->wbuf + (size_t)i * MANY_ANS_LEN;
            uint64_t vl = what == 1 && (res[i] == KV_OK || res[i] == KV_ENOBUFS) ? items[i].len : 0;
            kv__put32(a, (uint32_t)res[i]);
            kv__put64(a + 4, vl);
            if (what == 1 && res[i] == KV_OK && vl <= cap[i]) {
                memmove(c->wbuf + out, items[i].val, (size_t)vl);   /* never forward */
                out += (size_t)vl;
            }
        }
    }
    free(items);
    free(res);
    free(cap);
    if (rc == KV_EPROTO)
        return rc;
    return reply(c, rc != KV_OK ? rc : call, out);
}

/* STAGING / REGION: a client memfd to map (fd came with the frame). */
static int do_map(struct sconn *c, uint32_t op, const uint8_t *b, size_t len, int fd)
{
    if (op == OP_UNREGION) {
        if (len != 4)
            return KV_EPROTO;
        uint32_t id = kv__get32(b);
        for (size_t i = 0; i < c->nregions; i++)
            if (c->regions[i].id == id) {
                smap_drop(&c->regions[i]);
                c->regions[i] = c->regions[--c->nregions];
                return reply(c, KV_OK, 0);
            }
        return reply(c, KV_ENOTFOUND, 0);
    }
    if (fd < 0 || len != (op == OP_STAGING ? 8u : 12u))
        return KV_EPROTO;
    struct smap m = { 0 };
    int rc;
    if (op == OP_STAGING) {
        rc = smap_take(fd, kv__get64(b), &m);
        if (rc == KV_OK) {
            smap_drop(&c->stage);
            c->stage = m;
        }
    } else {
        uint32_t id = kv__get32(b);
        rc = c->nregions < REGIONS_MAX ? smap_take(fd, kv__get64(b + 4), &m) : KV_ENOSPC;
        for (size_t i = 0; rc == KV_OK && i < c->nregions; i++)
            if (c->regions[i].id == id)
                rc = KV_EBUSY;
        if (rc == KV_OK) {
            m.id = id;
            c->regions[c->nregions++] = m;
        } else {
            smap_drop(&m);
        }
    }
    return reply(c, rc, 0);
}

/* ---- the SSD tier's admin calls ---------------------------------------------- */

/* Blocks until c->fd has a frame to read (or its end): KV_OK; KV_ECLOSED
 * when the server stops first. No deadline: an idle client is no fault.
 * While it waits it ends the pins the client marks done, as the quiet
 * connection loop does (sconn_main): a walk waits on its client's cb for
 * as long as that takes, and the client's copies made before it must not
 * hold their blocks all that time. */
static int wait_request(struct sconn *c)
{
    for (;;) {
        struct pollfd p[2] = { { c->fd, POLLIN, 0 }, { c->srv->stop_pipe[0], POLLIN, 0 } };
        int k = poll(p, 2, c->nheld ? (int)c->hold_ms : -1);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return KV_ENET;
        }
        if (k == 0) {
            quiet_reap(c);
            continue;
        }
        c->hold_ms = HOLD_MS;
        if (p[1].revents || atomic_load(&c->srv->stopping))
            return KV_ECLOSED;
        return KV_OK;
    }
}

/* A scan or scrub streamed to the client: entries go out SSD_BATCH at a
 * time (sooner when a scrub's reads take a third of the timeout, so the
 * client's wait never runs out), and after each batch the walk waits for
 * the client's SSD_NEXT: its cb runs on its own thread, and its "stop"
 * stops the walk here. Memory is one batch, whatever the store holds. */
struct swalk {
    struct sconn *c;
    bool entries;            /* false: a scrub without a cb, counts only */
    uint32_t n;              /* entries in c->wbuf + 4 */
    uint64_t seen, sent_ms;
    int err;                 /* the connection failed: the walk stopped, the connection ends */
};

static void put_entry(uint8_t *p, const kv_ssd_entry *e)
{
    p[0] = (uint8_t)e->ns;
    memcpy(p + 1, e->id.bytes, KV_BLOCK_ID_LEN);
    kv__put32(p + 17, e->index);
    kv__put64(p + 21, e->size);
    kv__put64(p + 29, e->seq);
    kv__put64(p + 37, e->total);
    kv__put32(p + 45, (uint32_t)e->status);
}

/* Sends the batch, then reads the client's SSD_NEXT: 0 go on, 1 stop. */
static int walk_flush(struct swalk *w)
{
    struct sconn *c = w->c;
    kv__put32(c->wbuf, w->n);
    int rc = reply(c, SHM_MORE, 4 + (size_t)w->n * SSD_ENT_LEN);
    w->n = 0;
    w->sent_ms = kv__now_ms();
    if (rc == KV_OK)
        rc = wait_request(c);
    uint8_t h[9];
    int fd = -1;
    if (rc == KV_OK)
        rc = recv_with_fd(c->fd, h, sizeof h, &fd, deadline_for(c->srv->timeout_ms, 0));
    if (fd >= 0)
        close(fd);
    if (rc == KV_OK && (kv__get32(h) != 1 || kv__get32(h + 4) != OP_SSD_NEXT || h[8] > 1))
        rc = KV_EPROTO;
    if (rc == KV_OK) {
        atomic_fetch_add(&c->srv->requests, 1);   /* a round trip, as any request */
        if (c->nheld)
            board_reap(c);   /* and, as before any request, the copies marked done end */
    }
    if (rc != KV_OK) {
        w->err = rc;
        return 1;
    }
    return h[8];
}

static int walk_cb(void *arg, const kv_ssd_entry *e)
{
    struct swalk *w = arg;
    w->seen++;
    if (w->entries)
        put_entry(w->c->wbuf + 4 + (size_t)w->n++ * SSD_ENT_LEN, e);
    if (w->n == SSD_BATCH || kv__now_ms() - w->sent_ms >= w->c->srv->timeout_ms / 3)
        return walk_flush(w);
    return 0;
}

static int do_walk(struct sconn *c, uint32_t op, const uint8_t *b, size_t len)
{
    const struct kv__shm_host *h = &c->srv->host;
    if (op == OP_SSD_SCAN ? len != 0 : len != 2 || b[0] > 1 || b[1] > 1)
        return KV_EPROTO;
    int rc = wbuf_need(c, 4 + (size_t)SSD_BATCH * SSD_ENT_LEN + 16);
    if (rc != KV_OK)
        return rc;
    struct swalk w = { .c = c, .entries = op == OP_SSD_SCAN || b[1], .sent_ms = kv__now_ms() };
    uint64_t checked = 0, bad = 0;
    int call = op == OP_SSD_SCAN ? h->ssd_scan(h->ctx, walk_cb, &w)
                                 : h->ssd_scrub(h->ctx, b[0], walk_cb, &w, &checked, &bad);
    if (w.err != KV_OK)
        return w.err;
    if (op == OP_SSD_SCAN)
        checked = w.seen;
    uint8_t *end = c->wbuf + 4 + (size_t)w.n * SSD_ENT_LEN;
    kv__put32(c->wbuf, w.n);
    kv__put64(end, checked);
    kv__put64(end + 8, bad);
    return reply(c, call, 4 + (size_t)w.n * SSD_ENT_LEN + 16);
}

/* A compaction takes as long as it takes (seconds on a large store): it
 * runs on a thread of its own while this one tells the client, every
 * third of the timeout, that the server still lives. */
struct compact_job {
    const struct kv__shm_host *h;
    int rc;
    bool done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *compact_main(void *arg)
{
    struct compact_job *j = arg;
    int rc = j->h->ssd_compact(j->h->ctx);
    pthread_mutex_lock(&j->mu);
    j->rc = rc;
    j->done = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static int do_compact(struct sconn *c, size_t len)
{
    if (len != 0)
        return KV_EPROTO;
    struct compact_job j = { .h = &c->srv->host };
    pthread_t th;
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    int sent = KV_OK;
    if (pthread_create(&th, NULL, compact_main, &j) != 0) {
        compact_main(&j);
    } else {
        pthread_mutex_lock(&j.mu);
        while (!j.done) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)(c->srv->timeout_ms / 3) * 1000000u;
            ts.tv_sec += (time_t)(ns / 1000000000u);
            ts.tv_nsec = (long)(ns % 1000000000u);
            if (pthread_cond_timedwait(&j.cv, &j.mu, &ts) != 0 && !j.done && sent == KV_OK) {
                pthread_mutex_unlock(&j.mu);
                sent = reply(c, SHM_MORE, 0);   /* a gone client: the job still ends first */
                pthread_mutex_lock(&j.mu);
            }
        }
        pthread_mutex_unlock(&j.mu);
        pthread_join(th, NULL);
    }
    pthread_cond_destroy(&j.cv);
    pthread_mutex_destroy(&j.mu);
    return sent != KV_OK ? sent : reply(c, j.rc, 0);
}

static int dispatch(struct sconn *c, uint32_t op, const uint8_t *b, size_t len, int fd)
{
    const struct kv__shm_host *h = &c->srv->host;
    int rc;
    switch (op) {
    case OP_LOOKUP:
    case OP_PREFETCH: {
        if (len < 4)
            return KV_EPROTO;
        uint32_t n = kv__get32(b);
        if (n > ITEMS_MAX * 4 || len != 4 + (size_t)n * KV_BLOCK_ID_LEN)
            return KV_EPROTO;
        kv_block_id *ids = malloc(n ? n * sizeof *ids : 1);   /* b + 4 is not aligned */
        if (!ids)
            return KV_ENOMEM;
        memcpy(ids, b + 4, (size_t)n * KV_BLOCK_ID_LEN);
        if (op == OP_PREFETCH) {
            rc = h->prefetch(h->ctx, ids, n);
            free(ids);
            return reply(c, rc, 0);
        }
        if ((rc = wbuf_need(c, n ? n : 1)) == KV_OK)
            rc = h->lookup(h->ctx, ids, n, c->wbuf);
        free(ids);
        return reply(c, rc, rc == KV_OK ? n : 0);
    }
    case OP_LOAD:
        return do_load(c, b, len);
    case OP_DUMP:
        return do_dump(c, b, len);
    case OP_PUT:
    case OP_GET:
    case OP_EXISTS:
    case OP_REMOVE:
        return do_keys(c, op, b, len);
    case OP_REMOVE_ALL: {
        uint64_t n = 0;
        if (len != 0 || (rc = wbuf_need(c, 8)) != KV_OK)
            return len ? KV_EPROTO : rc;
        rc = h->remove_all(h->ctx, &n);
        kv__put64(c->wbuf, n);
        return reply(c, rc, 8);
    }
    case OP_STATS: {
        if (len != 0 || (rc = wbuf_need(c, sizeof(kv_stats))) != KV_OK)
            return len ? KV_EPROTO : rc;
        kv_stats st;
        rc = h->stats(h->ctx, &st);
        memcpy(c->wbuf, &st, sizeof st);
        return reply(c, rc, sizeof st);
    }
    case OP_STAGING:
    case OP_REGION:
    case OP_UNREGION:
        return do_map(c, op, b, len, fd);
    case OP_MANY:
        return do_many(c, b, len);
    case OP_REMOVE_PREFIX: {
        uint64_t n = 0;
        if (len < 2 || len != 1 + (size_t)b[0] || b[0] > KV_KEY_MAX)
            return KV_EPROTO;
        if ((rc = wbuf_need(c, 8)) != KV_OK)
            return rc;
        rc = h->remove_prefix(h->ctx, b + 1, b[0], &n);
        kv__put64(c->wbuf, n);
        return reply(c, rc, 8);
    }
    case OP_SSD_SCAN:
    case OP_SSD_SCRUB:
        return do_walk(c, op, b, len);
    case OP_SSD_COMPACT:
        return do_compact(c, len);
    case OP_SSD_REMOVE: {
        kv_block_id id;
        if (len != KV_BLOCK_ID_LEN)
            return KV_EPROTO;
        memcpy(id.bytes, b, KV_BLOCK_ID_LEN);
        return reply(c, h->ssd_remove(h->ctx, &id), 0);
    }
    default:
        return KV_EPROTO;
    }
}

/* The handshake, server side: same user, our version (the client checks
 * it and refuses another; it says its own, which we check too), the token,
 * the same boot, then the client's pin board. */
static int server_hello(struct sconn *c)
{
    struct kv__shm_server *s = c->srv;
    uint64_t dl = kv__now_ms() + s->timeout_ms;
    uint8_t hello[12];
    int who = same_user(c->fd);
    kv__put32(hello, SHM_MAGIC);
    kv__put32(hello + 4, SHM_VERSION);
    kv__put32(hello + 8, (uint32_t)who);
    int rc = kv__sock_xfer1(c->fd, hello, sizeof hello, 1, dl);
    if (rc != KV_OK || who != KV_OK)
        return rc != KV_OK ? rc : who;
    if ((rc = kv__auth_server(c->fd, s->token, dl)) != KV_OK)
        return rc;
    uint8_t in[HELLO_IN_LEN];
    int bfd = -1;
    if ((rc = recv_with_fd(c->fd, in, sizeof in, &bfd, dl)) != KV_OK) {
        if (bfd >= 0)
            close(bfd);
        return rc;
    }
    char mine[BOOTID_LEN];
    int status = KV_OK;
    uint32_t theirs = kv__get32(in + BOOTID_LEN + 8);
    if (kv__get32(in + BOOTID_LEN + 4) != SHM_MAGIC || theirs != SHM_VERSION) {
        KV_WARN("host store %s: refused a client of protocol version %u (this server speaks "
                "version %u): run one kvengine build on a host", s->path, theirs, SHM_VERSION);
        status = KV_EPROTO;
    }
    if (status == KV_OK)
        status = boot_id(mine);
    if (status == KV_OK && memcmp(mine, in, BOOTID_LEN) != 0)
        status = KV_EPERM;   /* another host (or another boot): never the same memory */
    if (status == KV_OK && kv__get32(in + BOOTID_LEN) != sizeof(kv_stats))
        status = KV_EPROTO;
    /* The pin board: memory of the client's we read and clear (sealed
     * against shrinking, exactly BOARD_LEN bytes, like every mapping). */
    if (status == KV_OK && (bfd < 0 || smap_take(bfd, BOARD_LEN, &c->board) != KV_OK))
        status = KV_EPROTO;
    if (bfd >= 0)
        close(bfd);
    uint8_t out[16];
    kv__put32(out, (uint32_t)status);
    kv__put32(out + 4, s->ro_fd >= 0 && status == KV_OK);
    kv__put64(out + 8, s->host.seg_len);
    rc = send_with_fd(c->fd, out, sizeof out, status == KV_OK ? s->ro_fd : -1, dl);
    if (rc != KV_OK || status != KV_OK)
        return rc != KV_OK ? rc : status;
    /* The directory of the segment (net/dir.c), sealed: read-only to
     * the client whatever descriptor it holds. Length 0: none. */
    bool dir = s->ro_fd >= 0 && s->host.dir_fd >= 0;
    uint8_t dout[8];
    kv__put64(dout, dir ? s->host.dir_len : 0);
    return send_with_fd(c->fd, dout, sizeof dout, dir ? s->host.dir_fd : -1, dl);
}

static void *sconn_main(void *arg)
{
    struct sconn *c = arg;
    struct kv__shm_server *s = c->srv;
    int rc = server_hello(c);
    c->hold_ms = HOLD_MS;
    pthread_mutex_lock(&s->mu);
    c->board_live = rc == KV_OK;
    pthread_mutex_unlock(&s->mu);
    while (rc == KV_OK && !atomic_load(&s->stopping)) {
        struct pollfd p[2] = { { c->fd, POLLIN, 0 }, { s->stop_pipe[0], POLLIN, 0 } };
        int k = poll(p, 2, c->nheld ? (int)c->hold_ms : -1);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (k == 0) {
            quiet_reap(c);
            continue;
        }
        c->hold_ms = HOLD_MS;
        if (p[1].revents)
            break;
        uint8_t h[8];
        int fd = -1;
        if (recv_with_fd(c->fd, h, 8, &fd, deadline_for(s->timeout_ms, 0)) != KV_OK)
            break;
        uint32_t len = kv__get32(h), op = kv__get32(h + 4);
        if (len > FRAME_MAX) {
            if (fd >= 0)
                close(fd);
            break;
        }
        if (len > c->rcap) {
            uint8_t *nb = realloc(c->rbuf, len);
            if (!nb) {
                if (fd >= 0)
                    close(fd);
                break;
            }
            c->rbuf = nb;
            c->rcap = len;
        }
        if (len && kv__sock_xfer1(c->fd, c->rbuf, len, 0, deadline_for(s->timeout_ms, len)) != KV_OK) {
            if (fd >= 0)
                close(fd);
            break;
        }
        atomic_fetch_add(&s->requests, 1);   /* before the answer: a caller that has it sees it counted */
        if (c->nheld)
            board_reap(c);   /* any request: the copies of the last LOAD are done by now */
        rc = dispatch(c, op, c->rbuf, len, fd);
        if (fd >= 0)
            close(fd);
    }
    /* The socket is closed under the server's lock: kv__shm_stop shuts
     * down live connections' sockets under it, and must never use a number
     * closed here (another open may have it by then). */
    pthread_mutex_lock(&s->mu);
    close_listed(c->fd);
    c->fd = -1;
    if (c->board_live)
        s->direct_gone += board_direct(c);
    c->board_live = false;
    pthread_mutex_unlock(&s->mu);
    sconn_free(c);
    atomic_fetch_sub(&s->nconns, 1);
    atomic_store(&c->done, true);
    return NULL;
}

/* Joins the connections that have ended (all of them when all). */
static void reap(struct kv__shm_server *s, bool all)
{
    pthread_mutex_lock(&s->mu);
    struct sconn **pp = &s->conns;
    while (*pp) {
        struct sconn *c = *pp;
        if (all || atomic_load(&c->done)) {
            *pp = c->next;
            pthread_mutex_unlock(&s->mu);
            pthread_join(c->th, NULL);
            free(c);
            pthread_mutex_lock(&s->mu);
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* Entry i of a touch ring, and setting it: two 8-byte words each, read and
 * written whole (the two sides run at once by design). */
static void ring_get(const uint8_t *board, uint64_t i, kv_block_id *id)
{
    _Atomic uint64_t *w = (_Atomic uint64_t *)(board + BOARD_RING) + 2 * (i % TOUCH_N);
    uint64_t v[2] = { atomic_load_explicit(&w[0], memory_order_relaxed),
                      atomic_load_explicit(&w[1], memory_order_relaxed) };
    memcpy(id->bytes, v, sizeof v);
}

static void ring_set(_Atomic uint8_t *board, uint64_t i, const kv_block_id *id)
{
    _Atomic uint64_t *w = (_Atomic uint64_t *)((uint8_t *)board + BOARD_RING) + 2 * (i % TOUCH_N);
    uint64_t v[2];
    memcpy(v, id->bytes, sizeof v);
    atomic_store_explicit(&w[0], v[0], memory_order_relaxed);
    atomic_store_explicit(&w[1], v[1], memory_order_relaxed);
}

/*
 * Direct loads refresh their blocks' recency here, a little late: a client
 * writes the id of each shard it read straight from the segment into the
 * touch ring of its board (BOARD_RING, TOUCH_N ids, BOARD_HEAD counting
 * them), and every TOUCH_MS the accept thread reads each live ring's new
 * entries and touches those blocks, as a pinned load would have. The ring
 * is the client's memory: an id it overwrites before we read it is lost (a
 * block not refreshed, as before), one torn by a concurrent write touches
 * a block nobody read, and a head that runs past TOUCH_N ids at once is
 * cut to the last TOUCH_N. Nothing else is read from it, and one tick
 * reads at most TOUCH_ROUNDS rings' worth, whatever clients write meanwhile.
 */
static void touch_all(struct kv__shm_server *s, kv_block_id *buf)
{
    for (int round = 0, more = 1; more && round < TOUCH_ROUNDS; round++) {
        more = 0;
        size_t n = 0;
        pthread_mutex_lock(&s->mu);
        for (struct sconn *c = s->conns; c && n < TOUCH_N; c = c->next) {
            if (!c->board_live)
                continue;
            const uint8_t *b = c->board.base;
            uint64_t head = atomic_load_explicit((_Atomic uint64_t *)(b + BOARD_HEAD),
                                                 memory_order_acquire);
            if (head - c->touch_tail > TOUCH_N)
                c->touch_tail = head - TOUCH_N;
            for (; c->touch_tail != head && n < TOUCH_N; c->touch_tail++)
                ring_get(b, c->touch_tail, &buf[n++]);
            more |= c->touch_tail != head;   /* n is full: the rest next round */
        }
        pthread_mutex_unlock(&s->mu);
        if (n && s->host.touch)
            s->host.touch(s->host.ctx, buf, n);
    }
}

static void *accept_main(void *arg)
{
    struct kv__shm_server *s = arg;
    kv_block_id *touch = malloc(TOUCH_N * sizeof *touch);
    uint64_t touched_ms = kv__now_ms();
    while (!atomic_load(&s->stopping)) {
        struct pollfd p[2] = { { s->lfd, POLLIN, 0 }, { s->stop_pipe[0], POLLIN, 0 } };
        if (poll(p, 2, (int)TOUCH_MS) < 0 && errno != EINTR)
            break;
        if (touch && kv__now_ms() - touched_ms >= TOUCH_MS) {
            touch_all(s, touch);
            touched_ms = kv__now_ms();
        }
        reap(s, false);
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                usleep(10000);
            continue;
        }
        kv__fork_close(fd, true);
        struct sconn *c = calloc(1, sizeof *c);
        if (c) {
            c->pins = calloc(PINS_MAX, sizeof *c->pins);
            c->pin_used = calloc(PINS_MAX, 1);
            c->pin_free = malloc(PINS_MAX * sizeof *c->pin_free);
            c->held = malloc(PINS_MAX * sizeof *c->held);
        }
        if (!c || !c->pins || !c->pin_used || !c->pin_free || !c->held ||
            atomic_load(&s->nconns) >= CONNS_MAX) {
            if (c) {
                c->fd = fd;
                sconn_free(c);
                free(c);
            } else {
                close(fd);
            }
            continue;
        }
        for (uint32_t i = 0; i < PINS_MAX; i++)
            c->pin_free[i] = PINS_MAX - 1 - i;
        c->nfree = PINS_MAX;
        c->srv = s;
        c->fd = fd;
        atomic_fetch_add(&s->nconns, 1);
        pthread_mutex_lock(&s->mu);
        if (pthread_create(&c->th, NULL, sconn_main, c) != 0) {
            pthread_mutex_unlock(&s->mu);
            atomic_fetch_sub(&s->nconns, 1);
            sconn_free(c);
            free(c);
            continue;
        }
        c->next = s->conns;
        s->conns = c;
        pthread_mutex_unlock(&s->mu);
    }
    free(touch);
    return NULL;
}

int kv__shm_serve(const char *path, const char *token, unsigned timeout_ms,
                  const struct kv__shm_host *host, struct kv__shm_server **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof sa.sun_path) {
        kv__errf(err, errlen, "store.dir: the socket path %s is too long", path);
        return KV_ECONFIG;
    }
    struct kv__shm_server *s = calloc(1, sizeof *s);
    if (!s)
        return KV_ENOMEM;
    s->host = *host;
    snprintf(s->path, sizeof s->path, "%s", path);
    snprintf(s->token, sizeof s->token, "%s", token);
    s->timeout_ms = timeout_ms ? timeout_ms : KV_NET_DEFAULT_TIMEOUT_MS;
    s->lfd = s->ro_fd = s->stop_pipe[0] = s->stop_pipe[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    int rc = KV_ENET;
    if (host->seg_fd >= 0) {
        char p[64];
        snprintf(p, sizeof p, "/proc/self/fd/%d", host->seg_fd);
        if ((s->ro_fd = open(p, O_RDONLY | O_CLOEXEC)) < 0) {
            kv__errf(err, errlen, "cannot reopen the segment read-only: %s", strerror(errno));
            goto fail;
        }
    }
    if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        goto fail;
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0)
        goto fail;
    kv__fork_close(s->lfd, true);
    kv__fork_close(s->ro_fd, true);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    unlink(path);   /* a dead holder's; we hold the lock, so nobody else's */
    if (bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || chmod(path, 0600) != 0 ||
        listen(s->lfd, 128) != 0) {
        kv__errf(err, errlen, "cannot serve the host store on %s: %s", path, strerror(errno));
        goto fail;
    }
    if (pthread_create(&s->accept_th, NULL, accept_main, s) != 0)
        goto fail;
    *out = s;
    return KV_OK;
fail:
    if (s->lfd >= 0) {
        close_listed(s->lfd);
        unlink(path);
    }
    close_listed(s->ro_fd);
    if (s->stop_pipe[0] >= 0) {
        close(s->stop_pipe[0]);
        close(s->stop_pipe[1]);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
}

void kv__shm_stop(struct kv__shm_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    if (write(s->stop_pipe[1], "x", 1) < 0) {
        /* the pipe is empty and ours: cannot fail; the flag is set anyway */
    }
    pthread_join(s->accept_th, NULL);
    /* Unlink first: a client that reconnects from here on finds nobody and
     * goes for the lock. */
    unlink(s->path);
    close_listed(s->lfd);
    pthread_mutex_lock(&s->mu);
    for (struct sconn *c = s->conns; c; c = c->next)
        if (!atomic_load(&c->done) && c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    reap(s, true);
    close_listed(s->ro_fd);
    close(s->stop_pipe[0]);
    close(s->stop_pipe[1]);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void kv__shm_server_stats(struct kv__shm_server *s, uint64_t *clients, uint64_t *pins,
                          uint64_t *direct)
{
    *clients = s ? atomic_load(&s->nconns) : 0;
    *pins = s ? atomic_load(&s->npins) : 0;
    *direct = 0;
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    *direct = s->direct_gone;
    for (struct sconn *c = s->conns; c; c = c->next)
        if (c->board_live)
            *direct += board_direct(c);
    pthread_mutex_unlock(&s->mu);
}

uint64_t kv__shm_server_requests(struct kv__shm_server *s)
{
    return s ? atomic_load(&s->requests) : 0;
}

/* ============================== the client ================================ */

struct cconn {
    int fd;
    _Atomic uint8_t *board;  /* BOARD_LEN bytes the server reads: a pin's slot set when copied */
    int stage_fd;
    uint8_t *stage;
    size_t stage_len;
    uint32_t *sent;          /* region ids handed to this connection */
    size_t nsent, capsent;
    uint64_t regions_gen;
    uint8_t *buf;            /* requests and responses */
    size_t cap;
};

struct kv__shm_client {
    char path[108];
    char token[KV_CFG_STR];
    unsigned timeout_ms;
    struct kv__shm_regions *regions;
    const uint8_t *seg;      /* the store's segment, read-only */
    size_t seg_len;
    dev_t seg_dev;
    ino_t seg_ino;
    struct kv__dir_view dir; /* the segment's directory, read-only (net/dir.c) */
    _Atomic bool direct;     /* loads try the directory first */
    pthread_mutex_t mu;      /* idle */
    struct cconn **idle;
    size_t nidle, capidle;
    _Atomic bool broken;
};

static void cconn_close(struct cconn *k)
{
    if (!k)
        return;
    close_listed(k->fd);
    if (k->board)
        munmap((void *)k->board, BOARD_LEN);
    if (k->stage)
        munmap(k->stage, k->stage_len);
    if (k->stage_fd >= 0)
        close(k->stage_fd);
    free(k->sent);
    free(k->buf);
    free(k);
}

static int cbuf_need(struct cconn *k, size_t n)
{
    if (n <= k->cap)
        return KV_OK;
    size_t nc = n < 4096 ? 4096 : n;
    uint8_t *p = realloc(k->buf, nc);
    if (!p)
        return KV_ENOMEM;
    k->buf = p;
    k->cap = nc;
    return KV_OK;
}

/* One answer on k: its header by deadline dl, its body into k->buf (its
 * length in *rlen); the server's rc in *src. rpc's second half, and each
 * further answer of a request answered by several frames. */
static int rpc_answer(struct kv__shm_client *c, struct cconn *k, uint64_t dl, int *src,
                      size_t *rlen)
{
    uint8_t h[8];
    int rc = kv__sock_xfer1(k->fd, h, 8, 0, dl);
    if (rc != KV_OK)
        return rc;
    uint32_t n = kv__get32(h);
    if (n > FRAME_MAX)
        return KV_EPROTO;
    if ((rc = cbuf_need(k, n)) != KV_OK)
        return rc;
    if (n && (rc = kv__sock_xfer1(k->fd, k->buf, n, 0, deadline_for(c->timeout_ms, n))) != KV_OK)
        return rc;
    *src = (int)kv__get32(h + 4);
    *rlen = n;
    return KV_OK;
}

/*
 * The one answer of a request answered by one frame, in as few system
 * calls as it allows: one read of its header and as much body as k->buf
 * holds (after a wait when it is not there yet), then the rest, if any.
 * rpc_answer reads the header, then the body: a round trip cost one read
 * more, every time. The server sends nothing we did not ask for, so
 * anything past the frame is a broken server: KV_EPROTO, and the
 * connection goes.
 */
static int rpc_answer1(struct kv__shm_client *c, struct cconn *k, uint64_t dl, int *src,
                       size_t *rlen)
{
    uint8_t h[8];
    size_t got = 0;
    for (;;) {
        struct iovec v[2] = { { h, 8 }, { k->buf, k->cap } };
        ssize_t r = readv(k->fd, v, 2);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = kv__sock_wait(k->fd, POLLIN, dl);
            if (rc != KV_OK)
                return rc;
            continue;
        }
        if (r <= 0)
            return KV_ENET;
        got = (size_t)r;
        break;
    }
    int rc;
    if (got < 8) {   /* a header cut short: the rest of it, then the body as ever */
        if ((rc = kv__sock_xfer1(k->fd, h + got, 8 - got, 0, dl)) != KV_OK)
            return rc;
        got = 8;
    }
    uint32_t n = kv__get32(h);
    got -= 8;   /* body bytes in k->buf */
    if (n > FRAME_MAX || got > n)
        return KV_EPROTO;
    if ((rc = cbuf_need(k, n)) != KV_OK)   /* realloc keeps what came */
        return rc;
    if (n > got &&
        (rc = kv__sock_xfer1(k->fd, k->buf + got, n - got, 0, deadline_for(c->timeout_ms, n))) != KV_OK)
        return rc;
    *src = (int)kv__get32(h + 4);
    *rlen = n;
    return KV_OK;
}

/* One exchange: the request in k->buf[8 .. 8+len) (the header is filled
 * here), with fd riding on it; the response body into k->buf (its length
 * in *rlen, at most rmax). Returns the server's rc in *src. A compaction's
 * answer may follow keepalives (frames the server sends unasked), so it is
 * read frame by frame. */
static int rpc(struct kv__shm_client *c, struct cconn *k, uint32_t op, size_t len, int fd,
               uint64_t data_bytes, int *src, size_t *rlen)
{
    kv__put32(k->buf, (uint32_t)len);
    kv__put32(k->buf + 4, op);
    uint64_t dl = deadline_for(c->timeout_ms, data_bytes + len);
    int rc = send_with_fd(k->fd, k->buf, 8 + len, fd, dl);
    if (rc != KV_OK)
        return rc;
    size_t n;
    rc = op == OP_SSD_COMPACT ? rpc_answer(c, k, dl, src, &n) : rpc_answer1(c, k, dl, src, &n);
    if (rc == KV_OK && rlen)
        *rlen = n;
    return rc;
}

/* The store's segment, read-only, at a 2 MiB aligned address: where the
 * server made its pages huge (engine/segment.c, collapse) a fault then maps
 * a whole 2 MiB page with one entry instead of 16 small ones, which only an
 * address that agrees with the file offset modulo 2 MiB allows. Our RSS
 * still grows only by what we read, 2 MiB at a time. MAP_FAILED on error. */
static void *map_segment(int fd, size_t len)
{
    const size_t huge = (size_t)2 << 20;
    uint8_t *r = mmap(NULL, len + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
        return MAP_FAILED;
    uint8_t *at = (uint8_t *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
    void *p = mmap(at, len, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        munmap(r, len + huge);
        return MAP_FAILED;
    }
    if (at > r)
        munmap(r, (size_t)(at - r));   /* the slack around it: only [at, at+len) stays */
    if (r + len + huge > at + len)
        munmap(at + len, (size_t)(r + len + huge - (at + len)));
    return p;
}

/* Connects one more connection and runs the handshake; the first one
 * (c->seg NULL) maps the segment. */
static int cconn_open(struct kv__shm_client *c, struct cconn **out, char *err, size_t errlen)
{
    *out = NULL;
    struct cconn *k = calloc(1, sizeof *k);
    if (!k)
        return KV_ENOMEM;
    k->stage_fd = -1;
    uint64_t dl = kv__now_ms() + c->timeout_ms;
    int rc = KV_ENET;
    k->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    kv__fork_close(k->fd, true);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    memcpy(sa.sun_path, c->path, strlen(c->path) + 1);
    if (k->fd < 0 || connect(k->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        rc = e == EACCES || e == EPERM ? KV_EPERM : KV_ENET;
        kv__errf(err, errlen, "nobody serves %s: %s", c->path, strerror(e));
        goto fail;
    }
    if ((rc = same_user(k->fd)) != KV_OK) {
        kv__errf(err, errlen, "%s is served by another user", c->path);
        goto fail;
    }
    uint8_t hello[12];
    if ((rc = kv__sock_xfer1(k->fd, hello, sizeof hello, 0, dl)) != KV_OK) {
        kv__errf(err, errlen, "%s: no hello from the server (%s)", c->path, kv_err_name(rc));
        goto fail;
    }
    if (kv__get32(hello) != SHM_MAGIC) {
        rc = KV_EPROTO;
        kv__errf(err, errlen, "%s: not a kvengine host store", c->path);
        goto fail;
    }
    if (kv__get32(hello + 4) != SHM_VERSION) {
        rc = KV_EPROTO;
        kv__errf(err, errlen, "%s: the server speaks host-store protocol version %u, this "
                 "library version %u: run one kvengine build on a host", c->path,
                 kv__get32(hello + 4), SHM_VERSION);
        goto fail;
    }
    if ((rc = (int)kv__get32(hello + 8)) != KV_OK) {
        kv__errf(err, errlen, "%s: the server refused us (%s)", c->path, kv_err_name(rc));
        goto fail;
    }
    if ((rc = kv__auth_client(k->fd, c->token, dl)) != KV_OK) {
        kv__errf(err, errlen, "%s: the token was not proved (%s)", c->path, kv_err_name(rc));
        goto fail;
    }
    uint8_t mine[HELLO_IN_LEN];
    if ((rc = boot_id((char *)mine)) != KV_OK)
        goto fail;
    kv__put32(mine + BOOTID_LEN, sizeof(kv_stats));
    kv__put32(mine + BOOTID_LEN + 4, SHM_MAGIC);
    kv__put32(mine + BOOTID_LEN + 8, SHM_VERSION);
    /* The pin board rides on it: the server maps it and reads what we copied. */
    int bfd = memfd_create("kvengine-pins", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *bp = MAP_FAILED;
    if (bfd >= 0 && ftruncate(bfd, BOARD_LEN) == 0 &&
        fcntl(bfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0)
        bp = mmap(NULL, BOARD_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0);
    if (bp == MAP_FAILED) {
        if (bfd >= 0)
            close(bfd);
        rc = KV_ENOMEM;
        kv__errf(err, errlen, "%s: cannot make the pin board: %s", c->path, strerror(errno));
        goto fail;
    }
    k->board = bp;
    rc = send_with_fd(k->fd, mine, sizeof mine, bfd, dl);
    close(bfd);
    if (rc != KV_OK)
        goto fail;
    uint8_t ans[16];
    int sfd = -1;
    if ((rc = recv_with_fd(k->fd, ans, sizeof ans, &sfd, dl)) != KV_OK)
        goto fail;
    rc = (int)kv__get32(ans);
    uint64_t seg_len = kv__get64(ans + 8);
    bool hasfd = kv__get32(ans + 4) != 0;
    if (rc == KV_OK && hasfd != (sfd >= 0))
        rc = KV_EPROTO;
    if (rc != KV_OK) {
        if (sfd >= 0)
            close(sfd);
        kv__errf(err, errlen, "%s: handshake refused (%s)", c->path, kv_err_name(rc));
        goto fail;
    }
    bool first = !c->seg;   /* kv__shm_connect's own connection: nobody else sees c yet */
    if (sfd >= 0) {
        struct stat st;
        if (fstat(sfd, &st) != 0 || (uint64_t)st.st_size < seg_len) {
            close(sfd);
            rc = KV_EPROTO;
            goto fail;
        }
        if (!c->seg) {
            void *p = map_segment(sfd, (size_t)seg_len);
            if (p == MAP_FAILED) {
                close(sfd);
                rc = KV_ENOMEM;
                kv__errf(err, errlen, "cannot map the store's segment: %s", strerror(errno));
                goto fail;
            }
            /* Our unmap (kv_close, a reconnect) then leaves the store's
             * pages where they are on the LRU: without it, tearing down
             * the entries of a segment we read marks each page accessed
             * (folio_mark_accessed, under the LRU lock), a fifth of an
             * attached load's samples and ~0.1 s per 512 MiB read at
             * close (doc/perf.md). Nothing else reads the hint: shmem
             * faults do no readahead, and fault-around ignores it. */
            madvise(p, (size_t)seg_len, MADV_RANDOM);
            c->seg = p;
            c->seg_len = (size_t)seg_len;
            c->seg_dev = st.st_dev;
            c->seg_ino = st.st_ino;
        } else if (st.st_dev != c->seg_dev || st.st_ino != c->seg_ino) {
            rc = KV_ENET;   /* another server since: reconnect from scratch */
        }
        close(sfd);
        if (rc != KV_OK)
            goto fail;
    }
    /* The directory: mapped with the first connection, as the segment is
     * (later ones are the same server's: the segment's identity was
     * checked). One that does not map is no directory, and loads ask the
     * server. */
    uint8_t dans[8];
    int dfd = -1;
    if ((rc = recv_with_fd(k->fd, dans, sizeof dans, &dfd, dl)) != KV_OK)
        goto fail;
    uint64_t dir_len = kv__get64(dans);
    if (first && dfd >= 0 && dir_len && c->seg && dir_len < MAP_MAX &&
        kv__dir_map(dfd, (size_t)dir_len, &c->dir) != KV_OK)
        KV_WARN("host store %s: its directory does not map: every load asks the server", c->path);
    if (dfd >= 0)
        close(dfd);
    *out = k;
    return KV_OK;
fail:
    cconn_close(k);
    return rc;
}

static int cconn_get(struct kv__shm_client *c, struct cconn **out)
{
    if (atomic_load(&c->broken))
        return KV_ENET;
    pthread_mutex_lock(&c->mu);
    if (c->nidle) {
        *out = c->idle[--c->nidle];
        pthread_mutex_unlock(&c->mu);
        return KV_OK;
    }
    pthread_mutex_unlock(&c->mu);
    int rc = cconn_open(c, out, NULL, 0);
    if (rc != KV_OK)
        atomic_store(&c->broken, true);
    return rc;
}

/* Back to the idle list after a good exchange; closed (and the client
 * broken) after a bad one. */
static void cconn_put(struct kv__shm_client *c, struct cconn *k, int rc)
{
    if (rc == KV_ENET || rc == KV_ETIMEDOUT || rc == KV_EPROTO || rc == KV_ENOMEM) {
        cconn_close(k);
        if (rc != KV_ENOMEM)
            atomic_store(&c->broken, true);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (c->nidle == c->capidle) {
        size_t nc = c->capidle ? 2 * c->capidle : 8;
        struct cconn **p = realloc(c->idle, nc * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&c->mu);
            cconn_close(k);
            return;
        }
        c->idle = p;
        c->capidle = nc;
    }
    c->idle[c->nidle++] = k;
    pthread_mutex_unlock(&c->mu);
}

int kv__shm_connect(const char *path, const char *token, unsigned timeout_ms,
                    struct kv__shm_regions *regions, struct kv__shm_client **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    struct kv__shm_client *c = calloc(1, sizeof *c);
    if (!c)
        return KV_ENOMEM;
    if (strlen(path) >= sizeof c->path) {
        free(c);
        return KV_ECONFIG;
    }
    snprintf(c->path, sizeof c->path, "%s", path);
    snprintf(c->token, sizeof c->token, "%s", token);
    c->timeout_ms = timeout_ms ? timeout_ms : KV_NET_DEFAULT_TIMEOUT_MS;
    c->regions = regions;
    pthread_mutex_init(&c->mu, NULL);
    struct cconn *k;
    int rc = cconn_open(c, &k, err, errlen);
    if (rc != KV_OK) {
        kv__shm_disconnect(c);
        return rc;
    }
    cconn_put(c, k, KV_OK);
    *out = c;
    return KV_OK;
}

void kv__shm_disconnect(struct kv__shm_client *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nidle; i++)
        cconn_close(c->idle[i]);
    free(c->idle);
    if (c->seg)
        munmap((void *)c->seg, c->seg_len);
    kv__dir_unmap(&c->dir);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void kv__shm_set_direct(struct kv__shm_client *c, bool on)
{
    atomic_store(&c->direct, on);
}

bool kv__shm_broken(struct kv__shm_client *c)
{
    return atomic_load(&c->broken);
}

/* A staging memfd of at least need bytes on k (a new one replaces a
 * smaller one, and the server is told). */
static int stage_need(struct kv__shm_client *c, struct cconn *k, size_t need, bool populate)
{
    if (need <= k->stage_len)
        return KV_OK;
    size_t len = need < STAGE_MIN ? STAGE_MIN : (need + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    int fd = memfd_create("kvengine-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return KV_ENOMEM;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0)
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return KV_ENOMEM;
    }
#ifdef MADV_POPULATE_WRITE
    /* Faulting fresh pages is slow here (engine/segment.c): what this
     * request needs is faulted in now, in one call, not page by page in
     * the copy; the rest of the (sparse) memfd only when used. */
    if (populate)
        madvise(p, need < len ? (need + 4095) & ~(size_t)4095 : len, MADV_POPULATE_WRITE);
#endif
    int rc = cbuf_need(k, 16), src = KV_OK;
    if (rc == KV_OK) {
        kv__put64(k->buf + 8, len);
        rc = rpc(c, k, OP_STAGING, 8, fd, 0, &src, NULL);
    }
    if (rc != KV_OK || src != KV_OK) {
        munmap(p, len);
        close(fd);
        return rc != KV_OK ? rc : src;
    }
    if (k->stage)
        munmap(k->stage, k->stage_len);
    if (k->stage_fd >= 0)
        close(k->stage_fd);
    k->stage = p;
    k->stage_len = len;
    k->stage_fd = fd;
    return KV_OK;
}

/* Drops the regions freed since, then hands over the one [p, p+len) lies
 * in (when it is a shared buffer) and writes its loc; else false. */
static int region_loc(struct kv__shm_client *c, struct cconn *k, const void *p, size_t len,
                      uint8_t *loc, bool *found)
{
    *found = false;
    if (!c->regions)
        return KV_OK;
    uint64_t gen = atomic_load(&c->regions->gen);
    int rc, src;
    if (gen != k->regions_gen) {
        for (size_t i = 0; i < k->nsent;) {
            if (region_alive(c->regions, k->sent[i])) {
                i++;
                continue;
            }
            if ((rc = cbuf_need(k, 12)) != KV_OK)
                return rc;
            kv__put32(k->buf + 8, k->sent[i]);
            if ((rc = rpc(c, k, OP_UNREGION, 4, -1, 0, &src, NULL)) != KV_OK)
                return rc;
            k->sent[i] = k->sent[--k->nsent];
        }
        k->regions_gen = gen;
    }
    uint32_t id;
    uint64_t off;
    int fd;
    size_t rlen;
    if (!region_find(c->regions, p, len, &id, &off, &fd, &rlen))
        return KV_OK;
    bool sent = false;
    for (size_t i = 0; i < k->nsent && !sent; i++)
        sent = k->sent[i] == id;
    if (!sent) {
        if (k->nsent == REGIONS_MAX)
            return KV_OK;   /* the server maps no more: staged instead */
        if (k->nsent == k->capsent) {
            size_t nc = k->capsent ? 2 * k->capsent : 8;
            uint32_t *ns = realloc(k->sent, nc * sizeof *ns);
            if (!ns)
                return KV_ENOMEM;
            k->sent = ns;
            k->capsent = nc;
        }
        if ((rc = cbuf_need(k, 20)) != KV_OK)
            return rc;
        kv__put32(k->buf + 8, id);
        kv__put64(k->buf + 12, rlen);
        if ((rc = rpc(c, k, OP_REGION, 12, fd, 0, &src, NULL)) != KV_OK)
            return rc;
        if (src != KV_OK)
            return KV_OK;   /* refused: staged instead */
        k->sent[k->nsent++] = id;
    }
    put_loc(loc, LOC_REGION, id, off);
    *found = true;
    return KV_OK;
}

int kv__shm_lookup(struct kv__shm_client *c, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    for (size_t i = 0; rc == KV_OK && i < n;) {
        size_t m = n - i < ITEMS_MAX ? n - i : ITEMS_MAX;
        size_t got = 0;
        if ((rc = cbuf_need(k, 12 + m * KV_BLOCK_ID_LEN)) != KV_OK)
            break;
        kv__put32(k->buf + 8, (uint32_t)m);
        memcpy(k->buf + 12, &ids[i], m * KV_BLOCK_ID_LEN);
        rc = rpc(c, k, OP_LOOKUP, 4 + m * KV_BLOCK_ID_LEN, -1, 0, &src, &got);
        if (rc == KV_OK && src == KV_OK && got != m)
            rc = KV_EPROTO;
        if (rc != KV_OK || src != KV_OK)
            break;
        memcpy(hit + i, k->buf, m);
        i += m;
    }
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

int kv__shm_prefetch(struct kv__shm_client *c, const kv_block_id *ids, size_t n)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    for (size_t i = 0; rc == KV_OK && src == KV_OK && i < n;) {
        size_t m = n - i < ITEMS_MAX ? n - i : ITEMS_MAX;
        if ((rc = cbuf_need(k, 12 + m * KV_BLOCK_ID_LEN)) != KV_OK)
            break;
        kv__put32(k->buf + 8, (uint32_t)m);
        memcpy(k->buf + 12, &ids[i], m * KV_BLOCK_ID_LEN);
        rc = rpc(c, k, OP_PREFETCH, 4 + m * KV_BLOCK_ID_LEN, -1, 0, &src, NULL);
        i += m;
    }
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

/* The one iovec of a shard when it has exactly one (a shared buffer can
 * only be used directly then). */
static const kv_iov *single_iov(const kv_shard *s)
{
    return s->iovcnt == 1 ? &s->iov[0] : NULL;
}

/*
 * A load or dump of shards [0, n) asked of the server on k, in requests of
 * at most ITEMS_MAX shards whose staged bytes fit the staging memfd: each
 * shard's bytes go to (or come from) a shared buffer when its one iovec
 * lies in one, else a slot of the staging memfd.
 */
static int blocks_rpc(struct kv__shm_client *c, struct cconn *k, bool load, const kv_shard *sh,
                      size_t n, int *results)
{
    int rc = KV_OK;
    uint8_t (*loc)[LOC_LEN] = malloc((n < ITEMS_MAX ? n : ITEMS_MAX) * LOC_LEN);
    if (!loc)
        return KV_ENOMEM;
    for (size_t i = 0; rc == KV_OK && i < n;) {
        /* This request: shards [i, j), staging bytes laid out as we go. */
        size_t j = i;
        uint64_t staged = 0, bytes = 0;
        for (; j < n && j - i < ITEMS_MAX; j++) {
            uint64_t len = kv__iov_len(sh[j].iov, sh[j].iovcnt);
            const kv_iov *one = single_iov(&sh[j]);
            bool inreg = false;
            if (one && len && (rc = region_loc(c, k, one->base, one->len, loc[j - i], &inreg)) != KV_OK)
                break;
            if (!inreg) {
                uint64_t at = (staged + 63) & ~(uint64_t)63;
                if (j > i && at + len > (k->stage_len > STAGE_MIN ? k->stage_len : STAGE_MIN))
                    break;   /* the next request */
                put_loc(loc[j - i], LOC_STAGE, 0, at);
                staged = at + len;
            }
            bytes += len;
        }
        if (rc != KV_OK)
            break;
        if ((rc = stage_need(c, k, staged, !load)) != KV_OK)
            break;
        size_t m = j - i;
        if ((rc = cbuf_need(k, 12 + m * ITEM_LEN)) != KV_OK)
            break;
        uint8_t *b = k->buf + 8;
        kv__put32(b, (uint32_t)m);
        for (size_t x = 0; x < m; x++) {
            const kv_shard *s = &sh[i + x];
            uint8_t *it = b + 4 + x * ITEM_LEN;
            uint64_t len = kv__iov_len(s->iov, s->iovcnt);
            memcpy(it, s->block.bytes, KV_BLOCK_ID_LEN);
            kv__put32(it + 16, s->index);
            kv__put64(it + 20, len);
            memcpy(it + 28, loc[x], LOC_LEN);
            if (!load && loc[x][0] == LOC_STAGE && len)
                kv__iov_gather(k->stage + kv__get64(loc[x] + 5), s->iov, s->iovcnt);
        }
        int src = KV_OK;
        size_t got = 0;
        rc = rpc(c, k, load ? OP_LOAD : OP_DUMP, 4 + m * ITEM_LEN, -1, bytes, &src, &got);
        if (rc == KV_OK && (src != KV_OK || got != m * (load ? LOAD_ANS_LEN : 4)))
            rc = src != KV_OK ? src : KV_EPROTO;
        if (rc != KV_OK)
            break;
        for (size_t x = 0; x < m; x++) {
            const kv_shard *s = &sh[i + x];
            if (!load) {
                results[i + x] = (int)kv__get32(k->buf + 4 * x);
                continue;
            }
            const uint8_t *a = k->buf + x * LOAD_ANS_LEN;
            int r = (int)kv__get32(a);
            uint64_t len = kv__iov_len(s->iov, s->iovcnt);
            if (r == KV_OK && a[4] == HOW_PINNED) {
                uint64_t off = kv__get64(a + 5);
                uint32_t slot = kv__get32(a + 13);
                if (!c->seg || off > c->seg_len || len > c->seg_len - off || slot >= PINS_MAX)
                    r = KV_EPROTO;   /* a server that points outside its segment */
                else if (len)
                    kv__iov_scatter(s->iov, s->iovcnt, c->seg + off);
                /* Copied: the pin may end. No message; the server looks at
                 * the board with our next request, or when we go quiet. The
                 * release orders the copy's reads before the mark. */
                if (slot < PINS_MAX)
                    atomic_store_explicit(&k->board[slot], 1, memory_order_release);
            } else if (r == KV_OK && a[4] == HOW_COPIED) {
                if (loc[x][0] == LOC_STAGE && len)
                    kv__iov_scatter(s->iov, s->iovcnt, k->stage + kv__get64(loc[x] + 5));
            } else if (r == KV_OK) {
                r = KV_EPROTO;
            }
            results[i + x] = r;
        }
        i = j;
    }
    free(loc);
    return rc;
}

/*
 * A load first copies what the server's directory names straight out of
 * the segment (net/dir.c: each copy checked against the slot's
 * sequence afterwards, so a shard moved or freed meanwhile is asked for
 * instead, never read wrong) and asks the server only for the rest: a load
 * of shards in DRAM is one copy each and no round trip. Only while the
 * server is there: a connection with anything to read (its close, or a
 * frame nobody asked for) sends the whole load to the server, which finds
 * out what happened. A direct read takes no pin; it refreshes its blocks'
 * recency through the touch ring (touch_all), a little late.
 */
static int blocks(struct kv__shm_client *c, bool load, const kv_shard *sh, size_t n, int *results)
{
    struct cconn *k;
    int rc = cconn_get(c, &k);
    if (rc != KV_OK)
        return rc;
    size_t left = n;
    uint8_t *done = NULL;
    struct pollfd p = { k->fd, POLLIN, 0 };
    if (load && c->dir.base && atomic_load_explicit(&c->direct, memory_order_relaxed) &&
        poll(&p, 1, 0) == 0 && (done = calloc(n, 1))) {
        uint64_t hits = 0, head = atomic_load_explicit((_Atomic uint64_t *)(k->board + BOARD_HEAD),
                                                       memory_order_relaxed);
        for (size_t i = 0; i < n; i++) {
            uint64_t len = kv__iov_len(sh[i].iov, sh[i].iovcnt);
            if (kv__dir_copy(&c->dir, c->seg, c->seg_len, &sh[i].block, sh[i].index, sh[i].iov,
                             sh[i].iovcnt, len)) {
                results[i] = KV_OK;
                done[i] = 1;
                hits++;
                if (i == 0 || memcmp(&sh[i].block, &sh[i - 1].block, KV_BLOCK_ID_LEN) != 0)
                    ring_set(k->board, head++, &sh[i].block);
            }
        }
        left -= hits;
        atomic_fetch_add_explicit((_Atomic uint64_t *)(k->board + BOARD_HITS), hits,
                                  memory_order_relaxed);
        /* The ids before the head that counts them (touch_all). */
        atomic_store_explicit((_Atomic uint64_t *)(k->board + BOARD_HEAD), head,
                              memory_order_release);
    }
    if (left == n) {
        rc = blocks_rpc(c, k, load, sh, n, results);
    } else if (left) {
        /* The rest, in order, as one load of its own. */
        kv_shard *rest = malloc(left * sizeof *rest);
        int *res = malloc(left * sizeof *res);
        rc = rest && res ? KV_OK : KV_ENOMEM;
        for (size_t i = 0, j = 0; rc == KV_OK && i < n; i++)
            if (!done[i])
                rest[j++] = sh[i];
        if (rc == KV_OK)
            rc = blocks_rpc(c, k, load, rest, left, res);
        for (size_t i = 0, j = 0; rc == KV_OK && i < n; i++)
            if (!done[i])
                results[i] = res[j++];
        free(rest);
        free(res);
    }
    free(done);
    cconn_put(c, k, rc);
    return rc;
}

int kv__shm_load(struct kv__shm_client *c, const kv_shard *sh, size_t n, int *results)
{
    return blocks(c, true, sh, n, results);
}

int kv__shm_dump(struct kv__shm_client *c, const kv_shard *sh, size_t n, int *results)
{
    return blocks(c, false, sh, n, results);
}

/* A key request: u8 klen, key at k->buf + 8; its length. */
static size_t put_key(struct cconn *k, const void *key, size_t klen)
{
    k->buf[8] = (uint8_t)klen;
    memcpy(k->buf + 9, key, klen);
    return 1 + klen;
}

int kv__shm_put(struct kv__shm_client *c, const void *key, size_t klen, const void *val,
                size_t vlen)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    bool inline_val = vlen <= INLINE_MAX;
    if ((rc = cbuf_need(k, 8 + 1 + klen + LOC_LEN + 8 + (inline_val ? vlen : 0))) != KV_OK)
        goto out;
    uint8_t loc[LOC_LEN];
    bool inreg = false;
    if (!inline_val && (rc = region_loc(c, k, val, vlen, loc, &inreg)) != KV_OK)
        goto out;
    if (!inline_val && !inreg) {
        if ((rc = stage_need(c, k, vlen, true)) != KV_OK)
            goto out;
        kv__copy(k->stage, val, vlen);
        put_loc(loc, LOC_STAGE, 0, 0);
    } else if (inline_val) {
        put_loc(loc, LOC_INLINE, 0, 0);
    }
    size_t len = put_key(k, key, klen);
    memcpy(k->buf + 8 + len, loc, LOC_LEN);
    kv__put64(k->buf + 8 + len + LOC_LEN, vlen);
    len += LOC_LEN + 8;
    if (inline_val && vlen) {
        memcpy(k->buf + 8 + len, val, vlen);
        len += vlen;
    }
    rc = rpc(c, k, OP_PUT, len, -1, vlen, &src, NULL);
out:
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

int kv__shm_get(struct kv__shm_client *c, const void *key, size_t klen, void *buf, size_t cap,
                size_t *vlen)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    uint8_t loc[LOC_LEN];
    bool inreg = false, inline_val = cap <= INLINE_MAX;
    if ((rc = cbuf_need(k, 8 + 1 + klen + LOC_LEN + 8 + 8 + (inline_val ? cap : 0))) != KV_OK)
        goto out;
    if (!inline_val && (rc = region_loc(c, k, buf, cap, loc, &inreg)) != KV_OK)
        goto out;
    if (inline_val) {
        put_loc(loc, LOC_INLINE, 0, 0);
    } else if (!inreg) {
        if ((rc = stage_need(c, k, cap, false)) != KV_OK)
            goto out;
        put_loc(loc, LOC_STAGE, 0, 0);
    }
    size_t len = put_key(k, key, klen);
    memcpy(k->buf + 8 + len, loc, LOC_LEN);
    kv__put64(k->buf + 8 + len + LOC_LEN, cap);
    len += LOC_LEN + 8;
    size_t got = 0;
    if ((rc = rpc(c, k, OP_GET, len, -1, cap, &src, &got)) != KV_OK)
        goto out;
    if (got < 8) {
        rc = KV_EPROTO;
        goto out;
    }
    uint64_t v = kv__get64(k->buf);
    if (src == KV_OK || src == KV_ENOBUFS)
        *vlen = (size_t)v;
    if (src == KV_OK) {
        if (v > cap || (inline_val && got != 8 + v)) {
            rc = KV_EPROTO;
            goto out;
        }
        if (inline_val && v)
            memcpy(buf, k->buf + 8, v);
        else if (!inline_val && !inreg && v)
            kv__copy(buf, k->stage, v);
    }
out:
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

static int key_call(struct kv__shm_client *c, uint32_t op, const void *key, size_t klen)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    if ((rc = cbuf_need(k, 8 + 1 + klen)) == KV_OK)
        rc = rpc(c, k, op, put_key(k, key, klen), -1, 0, &src, NULL);
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

int kv__shm_exists(struct kv__shm_client *c, const void *key, size_t klen)
{
    return key_call(c, OP_EXISTS, key, klen);
}

int kv__shm_remove(struct kv__shm_client *c, const void *key, size_t klen)
{
    return key_call(c, OP_REMOVE, key, klen);
}

int kv__shm_remove_all(struct kv__shm_client *c, uint64_t *removed)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    size_t got = 0;
    if ((rc = cbuf_need(k, 16)) == KV_OK)
        rc = rpc(c, k, OP_REMOVE_ALL, 0, -1, 0, &src, &got);
    if (rc == KV_OK && got != 8)
        rc = KV_EPROTO;
    if (rc == KV_OK && removed)
        *removed = kv__get64(k->buf);
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

int kv__shm_remove_prefix(struct kv__shm_client *c, const void *prefix, size_t len,
                          uint64_t *removed)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    size_t got = 0;
    if ((rc = cbuf_need(k, 16 + 1 + len)) == KV_OK)
        rc = rpc(c, k, OP_REMOVE_PREFIX, put_key(k, prefix, len), -1, 0, &src, &got);
    if (rc == KV_OK && got != 8)
        rc = KV_EPROTO;
    if (rc == KV_OK && removed)
        *removed = kv__get64(k->buf);
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

int kv__shm_stats(struct kv__shm_client *c, kv_stats *out)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    size_t got = 0;
    if ((rc = cbuf_need(k, 8 + sizeof *out)) == KV_OK)
        rc = rpc(c, k, OP_STATS, 0, -1, 0, &src, &got);
    if (rc == KV_OK && got != sizeof *out)
        rc = KV_EPROTO;
    if (rc == KV_OK)
        memcpy(out, k->buf, sizeof *out);
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

/* An item a MANY request carries (its value, or its capacity for a get,
 * fits a frame); the rest go through the single calls. */
static bool many_fits(int what, const kv_pair *it)
{
    return what == 2 || it->len <= MANY_BYTES;
}

/*
 * A batch: requests of at most ITEMS_MAX items whose values (puts) or
 * capacities (gets) add up to at most MANY_BYTES, one round trip each;
 * then the items too large for a frame, one call each (staged).
 */
int kv__shm_many(struct kv__shm_client *c, int what, kv_pair *items, size_t n, int *results)
{
    struct cconn *k;
    int rc = cconn_get(c, &k);
    if (rc != KV_OK)
        return rc;
    size_t i = 0;
    while (rc == KV_OK && i < n) {
        while (i < n && !many_fits(what, &items[i]))
            i++;
        size_t req = 5, bytes = 0, m = 0, j = i;
        for (; j < n && m < ITEMS_MAX; j++) {
            const kv_pair *it = &items[j];
            if (!many_fits(what, it))
                continue;
            size_t v = what == 2 ? 0 : it->len;
            if (m && bytes + v > MANY_BYTES)
                break;
            bytes += v;
            req += 1 + it->klen + 8 + (what == 0 ? v : 0);
            m++;
        }
        if (m == 0)
            break;
        if ((rc = cbuf_need(k, 8 + req)) != KV_OK)
            break;
        uint8_t *b = k->buf + 8;
        b[0] = (uint8_t)what;
        kv__put32(b + 1, (uint32_t)m);
        size_t at = 5;
        for (size_t x = i; x < j; x++) {
            const kv_pair *it = &items[x];
            if (!many_fits(what, it))
                continue;
            b[at] = (uint8_t)it->klen;
            memcpy(b + at + 1, it->key, it->klen);
            at += 1 + it->klen;
            kv__put64(b + at, it->len);
            at += 8;
            if (what == 0 && it->len) {
                kv__copy(b + at, it->val, it->len);
                at += it->len;
            }
        }
        int src = KV_OK;
        size_t got = 0;
        if ((rc = rpc(c, k, OP_MANY, req, -1, bytes, &src, &got)) != KV_OK)
            break;
        if (src != KV_OK) {   /* the call as a whole failed there */
            for (size_t x = i; x < j; x++)
                if (many_fits(what, &items[x]))
                    results[x] = src;
            i = j;
            continue;
        }
        if (got < m * MANY_ANS_LEN) {
            rc = KV_EPROTO;
            break;
        }
        size_t y = 0, vals = m * MANY_ANS_LEN;
        for (size_t x = i; rc == KV_OK && x < j; x++) {
            kv_pair *it = &items[x];
            if (!many_fits(what, it))
                continue;
            const uint8_t *a = k->buf + y++ * MANY_ANS_LEN;
            int r = (int)kv__get32(a);
            uint64_t vl = kv__get64(a + 4);
            if (what == 1 && r == KV_OK) {
                if (vl > it->len || vl > got - vals) {
                    rc = KV_EPROTO;   /* more than was asked, or than came */
                    break;
                }
                if (vl)
                    memcpy(it->val, k->buf + vals, (size_t)vl);
                vals += (size_t)vl;
            }
            if (what == 1 && (r == KV_OK || r == KV_ENOBUFS))
                it->len = (size_t)vl;
            results[x] = r;
        }
        i = j;
    }
    cconn_put(c, k, rc);
    /* The values a frame cannot hold, each in a call of its own. */
    for (size_t x = 0; rc == KV_OK && x < n; x++) {
        kv_pair *it = &items[x];
        if (many_fits(what, it))
            continue;
        size_t vl = 0;
        int r = what == 0 ? kv__shm_put(c, it->key, it->klen, it->val, it->len)
                          : kv__shm_get(c, it->key, it->klen, it->val, it->len, &vl);
        if (r == KV_ENET || r == KV_ETIMEDOUT || r == KV_EPROTO)
            return r;
        if (what == 1 && (r == KV_OK || r == KV_ENOBUFS))
            it->len = vl;
        results[x] = r;
    }
    return rc;
}

/* ---- the SSD tier's admin calls, client side ------------------------------ */


static void get_entry(const uint8_t *p, kv_ssd_entry *e)
{
    memset(e, 0, sizeof *e);
    e->ns = p[0];
    memcpy(e->id.bytes, p + 1, KV_BLOCK_ID_LEN);
    e->index = kv__get32(p + 17);
    e->size = kv__get64(p + 21);
    e->seq = kv__get64(p + 29);
    e->total = kv__get64(p + 37);
    e->status = (int)kv__get32(p + 45);
}

/* A scan or scrub: the request, then each batch handed to cb here and
 * answered with SSD_NEXT (stop once cb said so), until the last frame. */
static int ssd_walk(struct kv__shm_client *c, uint32_t op, int repair, kv_ssd_cb cb, void *ctx,
                    uint64_t *checked, uint64_t *bad)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    bool stopped = false;
    uint64_t seen = 0, nbad = 0;
    size_t got = 0, len = op == OP_SSD_SCRUB ? 2 : 0;
    if ((rc = cbuf_need(k, 16)) == KV_OK) {
        k->buf[8] = repair != 0;
        k->buf[9] = cb != NULL;
        rc = rpc(c, k, op, len, -1, 0, &src, &got);
    }
    while (rc == KV_OK) {
        if (src != KV_OK && src != SHM_MORE)
            break;   /* the call failed there (no SSD tier, ...) */
        bool last = src != SHM_MORE;
        uint32_t n = got >= 4 ? kv__get32(k->buf) : 0;
        if (got < 4 || n > SSD_BATCH || got != 4 + (size_t)n * SSD_ENT_LEN + (last ? 16 : 0) ||
            (n && !cb)) {
            rc = KV_EPROTO;
            break;
        }
        for (uint32_t i = 0; i < n && !stopped; i++) {
            kv_ssd_entry e;
            get_entry(k->buf + 4 + (size_t)i * SSD_ENT_LEN, &e);
            if (e.ns != KV_SSD_NS_BLOCK && e.ns != KV_SSD_NS_KEY) {
                rc = KV_EPROTO;
                break;
            }
            seen++;
            nbad += e.status != KV_OK;
            stopped = cb(ctx, &e) != 0;
        }
        if (rc != KV_OK)
            break;
        if (last) {
            /* Stopped by cb: what it saw is what was counted, as in process
             * (the server's walk went on to the end of the batch). */
            const uint8_t *end = k->buf + 4 + (size_t)n * SSD_ENT_LEN;
            if (checked)
                *checked = stopped ? seen : kv__get64(end);
            if (bad)
                *bad = stopped ? nbad : kv__get64(end + 8);
            break;
        }
        k->buf[8] = stopped;
        rc = rpc(c, k, OP_SSD_NEXT, 1, -1, 0, &src, &got);
    }
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

int kv__shm_ssd_scan(struct kv__shm_client *c, kv_ssd_cb cb, void *ctx)
{
    return ssd_walk(c, OP_SSD_SCAN, 0, cb, ctx, NULL, NULL);
}

int kv__shm_ssd_scrub(struct kv__shm_client *c, int repair, kv_ssd_cb cb, void *ctx,
                      uint64_t *checked, uint64_t *bad)
{
    return ssd_walk(c, OP_SSD_SCRUB, repair, cb, ctx, checked, bad);
}

int kv__shm_ssd_compact(struct kv__shm_client *c)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    size_t got = 0;
    if ((rc = cbuf_need(k, 8)) == KV_OK)
        rc = rpc(c, k, OP_SSD_COMPACT, 0, -1, 0, &src, &got);
    /* Keepalives until the answer; each wait is bounded by the timeout. */
    while (rc == KV_OK && src == SHM_MORE && got == 0)
        rc = rpc_answer(c, k, deadline_for(c->timeout_ms, 0), &src, &got);
    if (rc == KV_OK && (got != 0 || src == SHM_MORE))
        rc = KV_EPROTO;
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

int kv__shm_ssd_remove(struct kv__shm_client *c, const kv_block_id *id)
{
    struct cconn *k;
    int rc = cconn_get(c, &k), src = KV_OK;
    if (rc != KV_OK)
        return rc;
    if ((rc = cbuf_need(k, 8 + KV_BLOCK_ID_LEN)) == KV_OK) {
        memcpy(k->buf + 8, id->bytes, KV_BLOCK_ID_LEN);
        rc = rpc(c, k, OP_SSD_REMOVE, KV_BLOCK_ID_LEN, -1, 0, &src, NULL);
    }
    cconn_put(c, k, rc);
    return rc != KV_OK ? rc : src;
}

/* ---- the fuzz harness's way in ----------------------------------------------- */

int kv__shm_fuzz_dial(const char *path, const char *token, int *fd)
{
    *fd = -1;
    struct kv__shm_client *c;
    int rc = kv__shm_connect(path, token, 0, NULL, &c, NULL, 0);
    if (rc != KV_OK)
        return rc;
    /* The connection the handshake made, taken out of the client. */
    struct cconn *k = c->idle[--c->nidle];
    *fd = k->fd;
    kv__fork_close(k->fd, false);
    k->fd = -1;
    cconn_close(k);
    kv__shm_disconnect(c);
    return KV_OK;
}
