/*
 * tcp.c — the tcp transport: epoll event loops serving a backend, and
 * blocking-with-deadline client connections.
 *
 * Key design choice: value bytes are never copied through a staging buffer.
 * A server reads a dump's bytes straight into memory reserved in the segment
 * (backend->reserve, then commit) and writes a load's bytes straight from
 * the segment (backend->pin, sendmsg, unpin once the bytes are on the wire);
 * only shards that are not DRAM-resident go through a bounce buffer. A
 * client sendmsg()s dumps from the caller's iovecs and readv()s loads into
 * them. Frames are read exactly (header, then body, then data), so the
 * parser never holds value bytes.
 *
 * Server: `threads` loops, each an epoll set of nonblocking connections,
 * level-triggered; loop 0 also accepts and deals connections round robin.
 * A connection is a small state machine (HDR -> BODY -> DATA -> WRITE ->
 * HDR) owned by one loop thread. One request is in flight per connection
 * (the client waits for each response), so a connection never reads while
 * it writes. A connection opens with auth.h's challenge-response (the
 * server proves the token first, the client second; the token never
 * crosses the wire), run here by the same state machine before the first
 * frame: until it is done the server reads only the exchange's fixed-size
 * messages. Anything wrong — bad magic/version/type, a body or data length
 * off, a peer that cannot prove the token — closes that connection only. So
 * does
 * a peer that does not authenticate within the timeout, or moves a frame
 * slower than serve.h's floor rate; unauthenticated connections are capped
 * (the oldest make room), all connections too, and at EMFILE a spare
 * descriptor takes the waiting peer off the listening socket.
 *
 * Client: a kv__conn is one socket used by one thread at a time; every
 * wait is a poll() bounded by the call's deadline (struct dl: no progress
 * for opts.timeout_ms, or the whole call past timeout + bytes at 10 MiB/s).
 * A batch is a small state machine too (struct call: SEND -> REPLY -> DATA
 * per frame) that moves as far as its socket allows without waiting,
 * so one thread can drive batches on several conns with one poll()
 * (batch_many, what the cluster uses for a batch spanning several owners);
 * batch() is the case of one conn.
 *
 * Integrity: a response ends with one XXH3-64 per OK load, computed by the
 * server over the bytes it sends as it sends them (from pinned DRAM, or
 * from the bounce buffer an SSD read filled after that record's own
 * checksum passed), and the client checks each over what landed in the
 * caller's memory: a mismatch fails that item with KV_ECORRUPT (counted in
 * checksum_failures), never KV_OK.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "auth.h"
#include "proto.h"
#include "serve.h"
#include "sock.h"
#include "transport.h"

#define TCP_LOOPS_MAX 8
#define DISCARD_LEN (64u << 10)

/* Connections a server holds at once. Each pooled client keeps a few per
 * node, so thousands are normal; past this, new ones are closed at once
 * rather than let the process run out of descriptors for its own files. */
#define KV__TCP_CONNS_MAX 8192
/* Connections that have not authenticated yet. A real one authenticates in a
 * round trip, so 256 (a few hundred clients starting at once) fill up only
 * under a flood; then the oldest is closed to let the newest in, and idle
 * ones cannot lock real clients out. */
#define KV__TCP_UNAUTH_MAX 256

struct tcp;

enum sstate { S_HDR, S_BODY, S_DATA, S_WRITE };

struct sconn {
    struct sconn *prev, *next;      /* the loop's list (under loop.lock) */
    struct loop *lp;
    int fd;
    int state;
    int authed, close_after;
    int astage;                     /* before authed: 0 awaits the hello, 1 the proof */
    struct kv__auth_state auth;
    uint8_t abuf[KV__AUTH_REPLY_LEN];
    int out_armed;                  /* epoll waits for EPOLLOUT, not EPOLLIN */
    int evicted;                    /* shut down by the acceptor (under loop.lock) */
    uint64_t born_ms;               /* accepted at */
    uint64_t progress_ms;           /* last time a frame moved (see reap_stalled) */
    uint64_t frame_ms, frame_bytes; /* the frame in flight began at, and its bytes */
    uint8_t hdrbuf[KV_PROTO_HDR_LEN];
    size_t got;
    struct kv__hdr h;
    uint8_t *body;
    /* the batch being served */
    size_t n;
    struct kv__wire_req *req;
    struct kv__wire_resp *resp;
    size_t cur;                     /* dump item receiving data */
    int cur_started;
    uint64_t cur_got;
    struct kv__serve_dump dump;     /* where that item's bytes go */
    /* the response being written: out.iov[0] is obuf */
    uint8_t *obuf;
    struct kv__serve_out out;
    size_t oidx;
    size_t sum_at, sum_next;        /* the sums' iov in out; the next value to sum */
    uint8_t *sums;
};

struct loop {
    struct tcp *t;
    int epfd, evfd;
    pthread_t th;
    int started;
    pthread_mutex_t lock;
    struct sconn *conns;
    uint8_t *discard;
};

struct tcp {
    struct kv__transport_base base;
    struct kv__net_opts o;
    struct kv__backend *be;
    struct kv__serve serve;         /* the policy, and the node's budgets */
    int lfd;
    int nloops;
    struct loop loops[TCP_LOOPS_MAX];
    _Atomic unsigned rr;
    _Atomic int stopping;
    _Atomic int nconns, nunauth;    /* open; not authenticated nor evicted */
    int spare_fd;                   /* given up to refuse a peer at EMFILE */
    uint64_t emfile_warned_ms;
    char id[64];
};

struct tcp_conn {
    struct tcp *t;
    int fd;
    uint64_t next_id;
};

/* writev that never raises SIGPIPE: the engine lives inside inference
 * servers that do not ignore it, and a peer may die mid-write. */
static ssize_t send_iov(int fd, struct iovec *iov, size_t cnt)
{
    struct msghdr m = { .msg_iov = iov, .msg_iovlen = cnt };
    return sendmsg(fd, &m, MSG_NOSIGNAL);
}

/* ---- server ------------------------------------------------------------- */

static void release_response(struct sconn *sc)
{
    kv__serve_out_free(&sc->lp->t->serve, &sc->out);
    free(sc->obuf);
    free(sc->req);
    free(sc->resp);
    free(sc->body);
    free(sc->sums);
    sc->sums = NULL;
    sc->sum_at = sc->sum_next = 0;
    sc->obuf = NULL;
    sc->req = NULL;
    sc->resp = NULL;
    sc->body = NULL;
    sc->oidx = sc->n = 0;
}

/* Takes sc off its loop's list of connections. */
static void conn_unlink(struct loop *lp, struct sconn *sc)
{
    pthread_mutex_lock(&lp->lock);
    if (sc->prev)
        sc->prev->next = sc->next;
    else
        lp->conns = sc->next;
    if (sc->next)
        sc->next->prev = sc->prev;
    pthread_mutex_unlock(&lp->lock);
}

static void sconn_close(struct sconn *sc)
{
    struct loop *lp = sc->lp;
    struct tcp *t = lp->t;
    epoll_ctl(lp->epfd, EPOLL_CTL_DEL, sc->fd, NULL);
    /* Off the list before the descriptor goes: the acceptor may shut down
     * any listed connection's descriptor (evict_unauth). */
    conn_unlink(lp, sc);
    if (!sc->authed && !sc->evicted)
        atomic_fetch_sub(&t->nunauth, 1);
    atomic_fetch_sub(&t->nconns, 1);
    close(sc->fd);
    if (sc->cur_started)
        kv__serve_dump_abort(&t->serve, &sc->dump);
    release_response(sc);
    free(sc);
}

static void set_events(struct sconn *sc, uint32_t ev)
{
    struct epoll_event e = { .events = ev, .data.ptr = sc };
    epoll_ctl(sc->lp->epfd, EPOLL_CTL_MOD, sc->fd, &e);
}

/* Writes what it can of the response; 1 when the connection was closed. */
static int try_write(struct sconn *sc)
{
    struct kv__serve_out *out = &sc->out;
    while (sc->oidx < out->cnt) {
        size_t cnt;
        if (kv__serve_out_ready(&sc->lp->t->serve, sc->req, out, sc->oidx, &cnt)) {
            KV_WARN("tcp: a value went away while its response was being sent; closing");
            sconn_close(sc);
            return 1;
        }
        if (cnt > IOV_MAX)
            cnt = IOV_MAX;
        /* Each value's sum just before its first byte goes (a copied one is
         * in the buffer only from now on). */
        for (size_t j = sc->sum_next; j < sc->oidx + cnt && j < sc->sum_at; j++, sc->sum_next++)
            kv__put64(sc->sums + (j - 1) * KV_PROTO_SUM_LEN,
                      kv__sum(out->iov[j].iov_base, out->iov[j].iov_len));
        ssize_t w = send_iov(sc->fd, out->iov + sc->oidx, cnt);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                set_events(sc, EPOLLOUT);
                sc->out_armed = 1;
                return 0;
            }
            sconn_close(sc);
            return 1;
        }
        size_t left = (size_t)w;
        sc->progress_ms = kv__now_ms();
        while (left && sc->oidx < out->cnt) {
            struct iovec *v = &out->iov[sc->oidx];
            if (left >= v->iov_len) {
                left -= v->iov_len;
                sc->oidx++;
            } else {
                v->iov_base = (uint8_t *)v->iov_base + left;
                v->iov_len -= left;
                left = 0;
            }
        }
        while (sc->oidx < out->cnt && out->iov[sc->oidx].iov_len == 0 &&
               !out->item[sc->oidx])
            sc->oidx++;
    }
    release_response(sc);
    if (sc->close_after) {
        sconn_close(sc);
        return 1;
    }
    sc->state = S_HDR;
    sc->got = 0;
    /* Most responses go out in one sendmsg: the set still waits for input
     * then, and an epoll_ctl per request would be a syscall for nothing. */
    if (sc->out_armed) {
        set_events(sc, EPOLLIN);
        sc->out_armed = 0;
    }
    return 0;
}

/* Queues raw bytes (an auth message) and starts writing them. */
static int respond_raw(struct sconn *sc, const void *p, size_t len)
{
    sc->obuf = malloc(len);
    sc->out.iov = malloc(sizeof *sc->out.iov);
    sc->out.item = calloc(1, sizeof *sc->out.item);
    if (!sc->obuf || !sc->out.iov || !sc->out.item) {
        sconn_close(sc);
        return 1;
    }
    memcpy(sc->obuf, p, len);
    sc->out.iov[0] = (struct iovec){ sc->obuf, len };
    sc->out.cnt = 1;
    sc->oidx = 0;
    sc->state = S_WRITE;
    return try_write(sc);
}

static const char *peer_name(int fd, char *buf, size_t cap)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    char ip[INET_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0)
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(buf, cap, "%s:%u", ip, sl == sizeof sa ? (unsigned)ntohs(sa.sin_port) : 0u);
    return buf;
}

/* One message of the challenge-response is in abuf: answers it. */
static int on_auth(struct sconn *sc)
{
    const char *token = sc->lp->t->o.token;
    if (sc->astage == 0) {
        uint8_t reply[KV__AUTH_REPLY_LEN];
        if (kv__auth_reply(token, sc->abuf, &sc->auth, reply) != KV_OK) {
            KV_WARN("tcp: a peer did not open with the challenge-response; closing");
            sconn_close(sc);
            return 1;
        }
        sc->astage = 1;
        return respond_raw(sc, reply, sizeof reply);
    }
    uint8_t verdict = (uint8_t)kv__auth_proof_ok(token, &sc->auth, sc->abuf);
    if (!verdict) {
        char who[64];
        KV_WARN("tcp: refused a connection from %s: it did not prove the cluster token",
                peer_name(sc->fd, who, sizeof who));
        sc->close_after = 1;
        return respond_raw(sc, &verdict, 1);
    }
    pthread_mutex_lock(&sc->lp->lock);
    if (!sc->evicted)
        atomic_fetch_sub(&sc->lp->t->nunauth, 1);
    sc->authed = 1;
    pthread_mutex_unlock(&sc->lp->lock);
    return respond_raw(sc, &verdict, 1);
}

/* Serves the non-dump items once all dump data is in, then responds. */
static int finish_batch(struct sconn *sc)
{
    size_t n = sc->n, blen = kv__batch_r_body_len(n);
    sc->obuf = malloc(KV_PROTO_HDR_LEN + blen);
    if (!sc->obuf ||
        kv__serve_items(&sc->lp->t->serve, sc->req, sc->resp, n, &sc->out) != KV_OK) {
        sconn_close(sc);
        return 1;
    }
    /* The sums go last, as one more iov after the values. */
    size_t nv = sc->out.cnt - 1;
    struct iovec *iov = realloc(sc->out.iov, (sc->out.cnt + 1) * sizeof *iov);
    if (iov)
        sc->out.iov = iov;
    uint32_t *item = iov ? realloc(sc->out.item, (sc->out.cnt + 1) * sizeof *item) : NULL;
    if (item)
        sc->out.item = item;
    sc->sums = malloc(nv ? nv * KV_PROTO_SUM_LEN : 1);
    if (!iov || !item || !sc->sums) {
        sconn_close(sc);
        return 1;
    }
    sc->sum_at = sc->out.cnt;
    sc->sum_next = 1;
    sc->out.item[sc->out.cnt] = 0;
    sc->out.iov[sc->out.cnt++] = (struct iovec){ sc->sums, nv * KV_PROTO_SUM_LEN };
    struct kv__hdr h = { .type = KV_MSG_BATCH_R, .req_id = sc->h.req_id,
                         .body_len = (uint32_t)blen,
                         .data_len = sc->out.data + nv * KV_PROTO_SUM_LEN };
    kv__hdr_encode(&h, sc->obuf);
    kv__batch_r_encode(sc->resp, n, sc->obuf + KV_PROTO_HDR_LEN, blen);
    sc->out.iov[0] = (struct iovec){ sc->obuf, KV_PROTO_HDR_LEN + blen };
    sc->oidx = 0;
    sc->state = S_WRITE;
    /* The response is a transfer of its own, held to the same floor. */
    sc->frame_ms = kv__now_ms();
    sc->frame_bytes = KV_PROTO_HDR_LEN + blen + sc->out.data + nv * KV_PROTO_SUM_LEN;
    return try_write(sc);
}

static void next_dump(struct sconn *sc)
{
    while (sc->cur < sc->n && sc->req[sc->cur].kind != KV_OP_DUMP)
        sc->cur++;
    sc->cur_started = 0;
    sc->cur_got = 0;
}

static int on_batch(struct sconn *sc)
{
    size_t n;
    if (kv__batch_count(sc->body, sc->h.body_len, KV_PROTO_REQ_ITEM, &n)) {
        sconn_close(sc);
        return 1;
    }
    sc->req = malloc((n ? n : 1) * sizeof *sc->req);
    sc->resp = calloc(n ? n : 1, sizeof *sc->resp);
    if (!sc->req || !sc->resp || kv__batch_decode(sc->body, sc->h.body_len, sc->req, &n)) {
        sconn_close(sc);
        return 1;
    }
    sc->n = n;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        if (sc->req[i].kind == KV_OP_DUMP)
            sum += sc->req[i].len;
    /* The data must be exactly the dumps' bytes: no more, no less. */
    if (sum != sc->h.data_len) {
        KV_WARN("tcp: batch data length %llu != items' %llu; closing",
                (unsigned long long)sc->h.data_len, (unsigned long long)sum);
        sconn_close(sc);
        return 1;
    }
    sc->cur = 0;
    next_dump(sc);
    sc->state = S_DATA;
    return 0;
}

/* Reads what the socket has, up to want (> 0) bytes, into p: the bytes
 * read; 0 when it would block; -1 when the peer is gone (the connection is
 * closed then). Every server-side read goes through here. */
static ssize_t sconn_read(struct sconn *sc, void *p, size_t want)
{
    for (;;) {
        ssize_t r = read(sc->fd, p, want);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r <= 0) {
            sconn_close(sc);
            return -1;
        }
        sc->progress_ms = kv__now_ms();
        return r;
    }
}

/* Receives dump data; returns 1 when closed, 0 when it should wait for more
 * input, 2 when the batch moved on to writing. */
static int on_data(struct sconn *sc)
{
    struct kv__serve *sv = &sc->lp->t->serve;
    for (;;) {
        if (sc->cur >= sc->n)
            return finish_batch(sc) ? 1 : 2;
        struct kv__wire_req *q = &sc->req[sc->cur];
        if (!sc->cur_started) {
            kv__serve_dump_begin(sv, q, 1, &sc->dump);
            sc->cur_started = 1;
        }
        while (sc->cur_got < q->len) {
            uint64_t left = q->len - sc->cur_got;
            void *dst = kv__serve_dump_dst(&sc->dump, sc->cur_got);
            if (!dst) {
                dst = sc->lp->discard;
                if (left > DISCARD_LEN)
                    left = DISCARD_LEN;
            }
            if (left > (1u << 30))
                left = 1u << 30;
            ssize_t r = sconn_read(sc, dst, (size_t)left);
            if (r <= 0)
                return r == 0 ? 0 : 1;
            sc->cur_got += (uint64_t)r;
        }
        sc->resp[sc->cur].status = kv__serve_dump_end(sv, q, &sc->dump);
        sc->cur++;
        next_dump(sc);
    }
}

static void on_readable(struct sconn *sc)
{
    for (;;) {
        if (sc->state == S_HDR && !sc->authed) {
            size_t want = sc->astage == 0 ? KV__AUTH_HELLO_LEN : KV__AUTH_PROOF_LEN;
            ssize_t r = sconn_read(sc, sc->abuf + sc->got, want - sc->got);
            if (r <= 0)
                return;
            if (sc->got == 0) {
                sc->frame_ms = sc->progress_ms;
                sc->frame_bytes = want;
            }
            sc->got += (size_t)r;
            if (sc->got < want)
                continue;
            sc->got = 0;
            if (on_auth(sc) || sc->state == S_WRITE)
                return;
            continue;
        }
        if (sc->state == S_HDR) {
            ssize_t r = sconn_read(sc, sc->hdrbuf + sc->got, KV_PROTO_HDR_LEN - sc->got);
            if (r <= 0)
                return;
            if (sc->got == 0) {
                sc->frame_ms = sc->progress_ms;
                sc->frame_bytes = KV_PROTO_HDR_LEN;
            }
            sc->got += (size_t)r;
            if (sc->got < KV_PROTO_HDR_LEN)
                continue;
            if (kv__hdr_decode(sc->hdrbuf, UINT64_MAX, &sc->h) != KV_OK ||
                sc->h.type != KV_MSG_BATCH) {
                KV_WARN("tcp: bad frame (type %u) from a peer; closing", sc->hdrbuf[5]);
                sconn_close(sc);
                return;
            }
            sc->frame_bytes += sc->h.body_len + sc->h.data_len;
            sc->body = malloc(sc->h.body_len ? sc->h.body_len : 1);
            if (!sc->body) {
                sconn_close(sc);
                return;
            }
            sc->got = 0;
            sc->state = S_BODY;
        }
        if (sc->state == S_BODY) {
            while (sc->got < sc->h.body_len) {
                ssize_t r = sconn_read(sc, sc->body + sc->got, sc->h.body_len - sc->got);
                if (r <= 0)
                    return;
                sc->got += (size_t)r;
            }
            if (on_batch(sc))
                return;
            if (sc->state == S_WRITE)
                return;
        }
        if (sc->state == S_DATA) {
            int rc = on_data(sc);
            if (rc == 1 || rc == 0)
                return;
            /* Answered (rc 2): the client sends its next request only
             * after reading this response, so a read now would find
             * nothing; level-triggered epoll says when there is more. */
            return;
        }
        if (sc->state == S_WRITE)
            return;
    }
}

/*
 * Makes room for a new unauthenticated connection when KV__TCP_UNAUTH_MAX
 * are open: the oldest one that has not authenticated is shut down. Its own
 * loop thread sees the end of the stream and closes it; shutting down is
 * all another thread may do to a connection it does not own, and the
 * descriptor is still open because a connection leaves its list (under
 * the lock held here) before its descriptor is closed. Returns 1 when one
 * was evicted.
 */
static int evict_unauth(struct tcp *t)
{
    struct sconn *old = NULL;
    for (int i = 0; i < t->nloops; i++)
        pthread_mutex_lock(&t->loops[i].lock);
    for (int i = 0; i < t->nloops; i++)
        for (struct sconn *sc = t->loops[i].conns; sc; sc = sc->next)
            if (!sc->authed && !sc->evicted && (!old || sc->born_ms < old->born_ms))
                old = sc;
    if (old) {
        old->evicted = 1;
        atomic_fetch_sub(&t->nunauth, 1);
        shutdown(old->fd, SHUT_RDWR);
    }
    for (int i = t->nloops - 1; i >= 0; i--)
        pthread_mutex_unlock(&t->loops[i].lock);
    return old != NULL;
}

/* Out of descriptors with peers waiting: the listening socket stays
 * readable, so the loop would spin. The spare descriptor is given up to
 * accept the newest peer and close it at once (it retries), and the oldest
 * unauthenticated connection is shut down to make room for the next. */
static void refuse_one(struct tcp *t)
{
    uint64_t now = kv__now_ms();
    if (now - t->emfile_warned_ms > 10000) {
        t->emfile_warned_ms = now;
        KV_WARN("tcp: out of file descriptors (%d connections); refusing peers",
                atomic_load(&t->nconns));
    }
    evict_unauth(t);
    kv__net_refuse_one(t->lfd, &t->spare_fd);
}

static void accept_all(struct tcp *t)
{
    for (;;) {
        int fd = kv__sock_accept(t->lfd);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                refuse_one(t);
            return;
        }
        if (atomic_load(&t->nconns) >= KV__TCP_CONNS_MAX) {
            close(fd);
            continue;
        }
        if (atomic_load(&t->nunauth) >= KV__TCP_UNAUTH_MAX)
            evict_unauth(t);
        struct sconn *sc = calloc(1, sizeof *sc);
        if (!sc) {
            close(fd);
            continue;
        }
        struct loop *lp = &t->loops[atomic_fetch_add(&t->rr, 1) % (unsigned)t->nloops];
        sc->fd = fd;
        sc->lp = lp;
        sc->state = S_HDR;
        sc->born_ms = sc->progress_ms = kv__now_ms();
        atomic_fetch_add(&t->nconns, 1);
        atomic_fetch_add(&t->nunauth, 1);
        pthread_mutex_lock(&lp->lock);
        sc->next = lp->conns;
        if (lp->conns)
            lp->conns->prev = sc;
        lp->conns = sc;
        pthread_mutex_unlock(&lp->lock);
        struct epoll_event e = { .events = EPOLLIN, .data.ptr = sc };
        if (epoll_ctl(lp->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
            /* Not in any epoll set yet: only this thread knows it. */
            conn_unlink(lp, sc);
            atomic_fetch_sub(&t->nconns, 1);
            if (!sc->evicted)
                atomic_fetch_sub(&t->nunauth, 1);
            close(fd);
            free(sc);
        }
    }
}

/*
 * A peer that stops halfway through a frame, or trickles it (it died
 * without a FIN, or it is hostile), must not hold a reservation, pins or a
 * buffer for long: a frame in flight with no progress for the transport's
 * timeout, or slower over its whole transfer than the floor of serve.h
 * allows (timeout + its bytes at KV__NET_FLOOR_BYTES_PER_MS), is closed.
 * A connection that has not authenticated within the timeout is closed
 * too; authenticated idle ones between frames are left alone (the pool
 * keeps them open on purpose).
 */
static void reap_stalled(struct loop *lp)
{
    uint64_t now = kv__now_ms(), limit = lp->t->o.timeout_ms;
    for (;;) {
        struct sconn *victim = NULL;
        const char *why = NULL;
        pthread_mutex_lock(&lp->lock);
        for (struct sconn *sc = lp->conns; sc && !victim; sc = sc->next) {
            int mid = sc->state != S_HDR || sc->got > 0;
            victim = sc;
            if (mid && now - sc->progress_ms > limit)
                why = "stalled mid-frame";
            else if (mid && now - sc->frame_ms > limit + kv__net_floor_ms(sc->frame_bytes))
                why = "sent a frame below the floor rate";
            else if (!sc->authed && now - sc->born_ms > limit)
                why = "did not authenticate";
            else
                victim = NULL;
        }
        pthread_mutex_unlock(&lp->lock);
        if (!victim)
            return;
        KV_WARN("tcp: a peer %s within %llu ms; closing", why, (unsigned long long)limit);
        sconn_close(victim);
    }
}

static void *loop_main(void *arg)
{
    struct loop *lp = arg;
    struct tcp *t = lp->t;
    struct epoll_event ev[64];
    uint64_t last_reap = kv__now_ms();
    while (!atomic_load(&t->stopping)) {
        /* Before the wait, never between it and its events: a reaped
         * connection must not be in ev[]. */
        uint64_t now = kv__now_ms();
        if (now - last_reap >= 250) {
            last_reap = now;
            reap_stalled(lp);
        }
        int k = epoll_wait(lp->epfd, ev, 64, 250);
        for (int i = 0; i < k; i++) {
            void *p = ev[i].data.ptr;
            if (p == lp) {          /* the eventfd: stop */
                continue;
            } else if (p == t) {    /* the listening socket */
                accept_all(t);
            } else {
                struct sconn *sc = p;
                if (sc->state == S_WRITE) {
                    if (ev[i].events & (EPOLLERR | EPOLLHUP))
                        sconn_close(sc);
                    else
                        try_write(sc);
                } else {
                    on_readable(sc);
                }
            }
            if (atomic_load(&t->stopping))
                break;
        }
    }
    return NULL;
}

static void tcp_destroy(struct kv__transport *tp)
{
    struct tcp *t = (struct tcp *)tp;
    if (!t)
        return;
    atomic_store(&t->stopping, 1);
    for (int i = 0; i < t->nloops; i++) {
        uint64_t one = 1;
        if (write(t->loops[i].evfd, &one, sizeof one) < 0) {
            /* the loop still wakes within its epoll timeout */
        }
    }
    for (int i = 0; i < t->nloops; i++)
        if (t->loops[i].started)
            pthread_join(t->loops[i].th, NULL);
    for (int i = 0; i < t->nloops; i++) {
        struct loop *lp = &t->loops[i];
        while (lp->conns)
            sconn_close(lp->conns);
        close(lp->epfd);
        close(lp->evfd);
        free(lp->discard);
        pthread_mutex_destroy(&lp->lock);
    }
    if (t->lfd >= 0)
        close(t->lfd);
    if (t->spare_fd >= 0)
        close(t->spare_fd);
    free(t);
}

static int tcp_create(const struct kv__net_opts *o, struct kv__backend *be,
                      struct kv__transport **out, char *err, size_t errlen)
{
    *out = NULL;
    struct tcp *t = calloc(1, sizeof *t);
    if (!t)
        return KV_ENOMEM;
    t->base.ops = &kv__tcp_transport;
    t->o = *o;
    if (!t->o.timeout_ms)
        t->o.timeout_ms = KV_NET_DEFAULT_TIMEOUT_MS;
    t->be = be;
    kv__serve_init(&t->serve, be);
    t->lfd = -1;
    t->spare_fd = -1;
    snprintf(t->id, sizeof t->id, "pid-%ld", (long)getpid());
    *out = (struct kv__transport *)t;
    return KV_OK;
}

static int tcp_listen(struct kv__transport *tp, const char *addr, char *bound, size_t boundlen,
                      char *err, size_t errlen)
{
    struct tcp *t = (struct tcp *)tp;
    if (!t->be || t->lfd >= 0) {
        kv__errf(err, errlen, "tcp: nothing to serve or already listening");
        return KV_EINVAL;
    }
    int fd, rc = kv__sock_listen("cluster.listen", addr, 512, &fd, bound, boundlen, err, errlen);
    if (rc != KV_OK)
        return rc;
    t->lfd = fd;
    t->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    t->nloops = t->o.threads < 1 ? 1 : t->o.threads > TCP_LOOPS_MAX ? TCP_LOOPS_MAX
                                                                     : (int)t->o.threads;
    for (int i = 0; i < t->nloops; i++) {
        struct loop *lp = &t->loops[i];
        lp->t = t;
        pthread_mutex_init(&lp->lock, NULL);
        lp->epfd = epoll_create1(EPOLL_CLOEXEC);
        lp->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        lp->discard = malloc(DISCARD_LEN);
        if (lp->epfd < 0 || lp->evfd < 0 || !lp->discard) {
            kv__errf(err, errlen, "tcp: cannot set up event loop");
            t->nloops = i + 1;
            return KV_ENOMEM;
        }
        struct epoll_event e = { .events = EPOLLIN, .data.ptr = lp };
        epoll_ctl(lp->epfd, EPOLL_CTL_ADD, lp->evfd, &e);
    }
    struct epoll_event e = { .events = EPOLLIN, .data.ptr = t };
    epoll_ctl(t->loops[0].epfd, EPOLL_CTL_ADD, fd, &e);
    for (int i = 0; i < t->nloops; i++) {
        if (pthread_create(&t->loops[i].th, NULL, loop_main, &t->loops[i]) != 0) {
            kv__errf(err, errlen, "tcp: cannot start event loop thread");
            return KV_ENOMEM;
        }
        t->loops[i].started = 1;
    }
    return KV_OK;
}

/* ---- client ------------------------------------------------------------- */

/*
 * A client call's deadline has two parts: no progress for `idle` ms (the
 * transport's timeout) fails it, so a dead peer is noticed in one timeout
 * however large the batch; and the whole call may take at most `end`, set
 * by the caller from the timeout plus the bytes it moves at a 10 MiB/s
 * floor, so a peer that trickles cannot hold a task forever either.
 */
struct dl {
    uint64_t end;
    unsigned idle;
};

static struct dl dl_make(unsigned timeout_ms, uint64_t bytes)
{
    return (struct dl){ .end = kv__now_ms() + timeout_ms + kv__net_floor_ms(bytes),
                        .idle = timeout_ms };
}

/* Moves what it can of iov[*at..cnt) (which it consumes) through fd
 * without waiting: KV_OK when all of it moved, MOVE_WAIT when fd would
 * block, or an error. *since is set to the time of the last byte moved. */
#define MOVE_WAIT 1

static int move_some(int fd, struct iovec *iov, size_t *at, size_t cnt, int wr,
                     uint64_t *since, size_t *moved)
{
    size_t i = *at;
    int rc = KV_OK;
    for (;;) {
        while (i < cnt && iov[i].iov_len == 0)
            i++;
        if (i == cnt)
            break;
        size_t c = cnt - i > IOV_MAX ? IOV_MAX : cnt - i;
        ssize_t r = wr ? send_iov(fd, iov + i, c) : readv(fd, iov + i, (int)c);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = errno == EAGAIN || errno == EWOULDBLOCK ? MOVE_WAIT : KV_ENET;
            break;
        }
        if (r == 0 && !wr) {
            rc = KV_ENET;       /* the peer closed */
            break;
        }
        *since = kv__now_ms();
        if (moved)
            *moved += (size_t)r;
        size_t left = (size_t)r;
        while (i < cnt && left >= iov[i].iov_len) {
            left -= iov[i].iov_len;
            i++;
        }
        if (left) {
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
    }
    *at = i;
    return rc;
}

static int tcp_connect(struct kv__transport *tp, const char *addr, struct kv__conn **out)
{
    struct tcp *t = (struct tcp *)tp;
    struct sockaddr_in sa;
    *out = NULL;
    if (kv__net_parse_addr(addr, &sa))
        return KV_EINVAL;
    struct dl d = dl_make(t->o.timeout_ms, 0), *deadline = &d;
    int fd, rc = kv__sock_connect(&sa, d.end, &fd);
    if (rc != KV_OK)
        return rc;
    /* The server proves the token before we do (auth.h): a forged
     * address learns nothing it could use elsewhere. */
    if ((rc = kv__auth_client(fd, t->o.token, deadline->end)) != KV_OK)
        goto fail;
    struct tcp_conn *c = calloc(1, sizeof *c);
    if (!c) {
        rc = KV_ENOMEM;
        goto fail;
    }
    c->t = t;
    c->fd = fd;
    c->next_id = 2;
    *out = (struct kv__conn *)c;
    return KV_OK;
fail:
    close(fd);
    return rc;
}

static void tcp_close(struct kv__conn *cp)
{
    struct tcp_conn *c = (struct tcp_conn *)cp;
    if (!c)
        return;
    close(c->fd);
    free(c);
}

/*
 * A batch in flight on one conn. It goes out in frames of at most
 * KV_PROTO_BATCH_MAX items, one after another; each frame is
 *     SEND  header, descriptors, then the dumps' bytes straight from the
 *           caller's iovecs
 *     REPLY the response header and the per-item results, in one read
 *           when they are there together; the header is checked against
 *           the request as soon as it is in (an error reply has no body)
 *     DATA  the OK loads' bytes, straight into the caller's iovecs
 * and every phase moves iov[at..cnt). step() takes a call as far as its
 * socket allows without waiting; whoever drives it polls the socket in
 * between. Each frame gets the deadline batch() always had.
 */
enum cstate { C_SEND, C_REPLY, C_DATA, C_DONE };

struct call {
    struct tcp_conn *c;
    struct kv__op *ops;         /* the current frame's items: ops[0..m) */
    size_t rest;                /* items from ops on, this frame's included */
    size_t m;
    int state;                  /* enum cstate */
    int rc;                     /* the call's result once C_DONE */
    int ready;                  /* worth a step: poll said so, or never polled */
    int hdr_ok;                 /* the reply's header is in and checked */
    struct dl dl;
    uint64_t since;             /* when a byte last moved */
    uint64_t id, load_bytes;
    size_t rlen, nload;
    struct kv__hdr h;
    uint8_t hdr[KV_PROTO_HDR_LEN];
    uint8_t *buf;               /* the request frame, then the response body */
    uint8_t *sums;              /* the OK loads' sums, after their bytes */
    /* Loads are summed as their bytes land (still in cache): the load
     * being summed (an op index), its iov and offset, and each one's sum. */
    void *sum_st;
    size_t sum_op;
    uint32_t sum_iov;
    size_t sum_off, sum_idx;
    uint64_t *got_sum;
    struct kv__wire_req *q;
    struct kv__wire_resp *r;
    struct iovec *iov;
    size_t at, cnt;
};

static void frame_free(struct call *k)
{
    free(k->buf);
    free(k->q);
    free(k->r);
    free(k->iov);
    free(k->sums);
    free(k->got_sum);
    k->sums = NULL;
    k->got_sum = NULL;
    k->buf = NULL;
    k->q = NULL;
    k->r = NULL;
    k->iov = NULL;
}

/* Builds the next frame's request and starts sending it. */
static int frame_start(struct call *k)
{
    size_t n = k->m = k->rest < KV_PROTO_BATCH_MAX ? k->rest : KV_PROTO_BATCH_MAX;
    struct kv__op *ops = k->ops;
    size_t blen = kv__batch_body_len(n);
    size_t niov = 1, nload_iov = 0;
    uint64_t dump_bytes = 0;
    k->rlen = kv__batch_r_body_len(n);
    k->load_bytes = 0;
    k->nload = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind == KV_OP_DUMP) {
            niov += ops[i].iovcnt;
            dump_bytes += kv__iov_len(ops[i].iov, ops[i].iovcnt);
        } else if (ops[i].kind == KV_OP_LOAD) {
            nload_iov += ops[i].iovcnt;
            k->nload++;
            k->load_bytes += kv__iov_len(ops[i].iov, ops[i].iovcnt);
        }
    }
    k->buf = malloc(KV_PROTO_HDR_LEN + (blen > k->rlen ? blen : k->rlen));
    k->q = malloc(n * sizeof *k->q);
    k->r = malloc(n * sizeof *k->r);
    k->iov = malloc(((niov > nload_iov ? niov : nload_iov) + 2) * sizeof *k->iov);
    k->sums = malloc(k->nload ? k->nload * KV_PROTO_SUM_LEN : 1);
    k->got_sum = malloc((k->nload ? k->nload : 1) * sizeof *k->got_sum);
    if (!k->sum_st)
        k->sum_st = kv__sum_state_new();
    if (!k->buf || !k->q || !k->r || !k->iov || !k->sums || !k->got_sum || !k->sum_st)
        return KV_ENOMEM;
    kv__wire_from_ops(ops, n, k->q);
    k->id = k->c->next_id++;
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = (uint32_t)blen, .req_id = k->id,
                         .data_len = dump_bytes };
    kv__hdr_encode(&h, k->buf);
    kv__batch_encode(k->q, n, k->buf + KV_PROTO_HDR_LEN, blen);
    k->iov[0] = (struct iovec){ k->buf, KV_PROTO_HDR_LEN + blen };
    size_t j = 1;
    for (size_t i = 0; i < n; i++)
        if (ops[i].kind == KV_OP_DUMP)
            for (uint32_t x = 0; x < ops[i].iovcnt; x++)
                k->iov[j++] = (struct iovec){ ops[i].iov[x].base, ops[i].iov[x].len };
    k->at = 0;
    k->cnt = j;
    k->state = C_SEND;
    k->dl = dl_make(k->c->t->o.timeout_ms, dump_bytes + k->load_bytes);
    k->since = kv__now_ms();
    return KV_OK;
}

/* Checks the reply's header once it is in; an error when it does not
 * announce exactly the body this request expects. */
static int reply_hdr(struct call *k)
{
    if (k->hdr_ok)
        return KV_OK;
    if (kv__hdr_decode(k->hdr, k->load_bytes + k->nload * KV_PROTO_SUM_LEN, &k->h) ||
        k->h.type != KV_MSG_BATCH_R ||
        k->h.req_id != k->id)
        return KV_EPROTO;
    if (k->h.status)
        return kv__status_valid(k->h.status) ? k->h.status : KV_EPROTO;
    if (k->h.body_len != k->rlen)
        return KV_EPROTO;
    k->hdr_ok = 1;
    return KV_OK;
}

/* The OK loads' bytes, in order, are the first of the data phase: feeds
 * the next `moved` of them to the sum (at most what remains of them; the
 * sums that follow are not summed), finishing each load's sum in
 * got_sum[] as its last byte lands. Zero-length loads finish at once. */
static void sum_landed(struct call *k, size_t moved)
{
    const struct kv__op *ops = k->ops;
    size_t n = k->m;
    while (k->sum_op < n) {
        const struct kv__op *op = &ops[k->sum_op];
        if (op->kind != KV_OP_LOAD || k->r[k->sum_op].status != KV_OK) {
            k->sum_op++;
            continue;
        }
        while (k->sum_iov < op->iovcnt) {
            const kv_iov *v = &op->iov[k->sum_iov];
            size_t take = v->len - k->sum_off < moved ? v->len - k->sum_off : moved;
            kv__sum_update(k->sum_st, (const uint8_t *)v->base + k->sum_off, take);
            k->sum_off += take;
            moved -= take;
            if (k->sum_off < v->len)
                return;     /* the rest of this iov has not landed yet */
            k->sum_iov++;
            k->sum_off = 0;
        }
        k->got_sum[k->sum_idx++] = kv__sum_digest(k->sum_st);
        kv__sum_reset(k->sum_st);
        k->sum_op++;
        k->sum_iov = 0;
    }
}

/* The current phase has moved all its bytes: checks them and sets up the
 * next phase. */
static int phase_done(struct call *k)
{
    struct kv__op *ops = k->ops;
    size_t n = k->m;
    switch (k->state) {
    case C_SEND:
        k->iov[0] = (struct iovec){ k->hdr, sizeof k->hdr };
        k->iov[1] = (struct iovec){ k->buf, k->rlen };
        k->at = 0;
        k->cnt = 2;
        k->hdr_ok = 0;
        k->state = C_REPLY;
        return KV_OK;
    case C_REPLY: {
        int rc = reply_hdr(k);
        if (rc)
            return rc;
        size_t got = n;
        if (kv__batch_r_decode(k->buf, k->rlen, k->r, &got) || got != n)
            return KV_EPROTO;
        /* The data is exactly the OK loads' bytes, each its expected size:
         * check before any of it lands in the caller's memory. */
        uint64_t expect = 0;
        size_t j = 0, nok = 0;
        for (size_t i = 0; i < n; i++) {
            if (ops[i].kind != KV_OP_LOAD || k->r[i].status != KV_OK)
                continue;
            if (k->r[i].len != k->q[i].len)
                return KV_EPROTO;
            expect += k->r[i].len;
            nok++;
            for (uint32_t x = 0; x < ops[i].iovcnt; x++)
                k->iov[j++] = (struct iovec){ ops[i].iov[x].base, ops[i].iov[x].len };
        }
        if (expect + nok * KV_PROTO_SUM_LEN != k->h.data_len)
            return KV_EPROTO;
        k->iov[j++] = (struct iovec){ k->sums, nok * KV_PROTO_SUM_LEN };
        k->sum_op = 0;
        k->sum_iov = 0;
        k->sum_off = 0;
        k->sum_idx = 0;
        kv__sum_reset(k->sum_st);
        sum_landed(k, 0);
        k->at = 0;
        k->cnt = j;
        k->state = C_DATA;
        return KV_OK;
    }
    case C_DATA: {
        const uint8_t *sum = k->sums;
        for (size_t i = 0; i < n; i++) {
            ops[i].result = k->r[i].status;
            /* The bytes that landed must be the ones the server summed. */
            if (ops[i].kind == KV_OP_LOAD && k->r[i].status == KV_OK) {
                if (k->got_sum[(size_t)(sum - k->sums) / KV_PROTO_SUM_LEN] != kv__get64(sum)) {
                    ops[i].result = KV_ECORRUPT;
                    atomic_fetch_add(&k->c->t->base.checksum_failures, 1);
                    KV_WARN("tcp: a loaded value failed its checksum; dropped");
                }
                sum += KV_PROTO_SUM_LEN;
            }
            ops[i].hit = k->r[i].hit;
            if (kv__op_answers_len(ops[i].kind))
                ops[i].len = k->r[i].len;
        }
        frame_free(k);
        k->ops += n;
        k->rest -= n;
        if (k->rest)
            return frame_start(k);
        k->state = C_DONE;
        return KV_OK;
    }
    }
    return KV_EPROTO;
}

/* Moves k as far as its socket allows without waiting. */
static void step(struct call *k)
{
    while (k->state != C_DONE) {
        int sending = k->state == C_SEND;
        size_t moved = 0;
        int rc = move_some(k->c->fd, k->iov, &k->at, k->cnt, sending, &k->since, &moved);
        if (k->state == C_DATA && moved)
            sum_landed(k, moved);
        /* A reply's header is checked as soon as it is in: an error reply
         * has no body to wait for, and its peer may close right after it. */
        if (rc != KV_OK && k->state == C_REPLY && k->at > 0) {
            int hrc = reply_hdr(k);
            rc = hrc ? hrc : rc;
        }
        if (rc == MOVE_WAIT)
            return;
        if (rc == KV_OK)
            rc = phase_done(k);
        if (rc) {
            k->rc = rc;
            k->state = C_DONE;
            return;
        }
        /* A reply is a round trip away: wait for it in poll() rather than
         * try a read that would most likely find nothing yet. */
        if (sending)
            return;
    }
}

/*
 * Drives every call to the end on this thread: step each one that can
 * move, then one poll() over the sockets of those still waiting, bounded by
 * the earliest of their deadlines. A call that times out or fails is done
 * with its error; the others carry on.
 */
static void tcp_batch_many(struct kv__batch *b, size_t nb)
{
    struct call one;
    struct pollfd pf1;
    size_t at1;
    struct call *k = nb <= 1 ? &one : calloc(nb, sizeof *k);
    struct pollfd *pf = nb <= 1 ? &pf1 : calloc(nb, sizeof *pf);
    size_t *at = nb <= 1 ? &at1 : calloc(nb, sizeof *at);
    if (!k || !pf || !at) {
        for (size_t i = 0; i < nb; i++)
            b[i].rc = KV_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nb; i++) {
        k[i] = (struct call){ .c = (struct tcp_conn *)b[i].conn, .ops = b[i].ops,
                              .rest = b[i].n, .state = C_DONE, .ready = 1 };
        if (b[i].n && (k[i].rc = frame_start(&k[i])))
            k[i].state = C_DONE;
    }
    for (;;) {
        size_t np = 0;
        uint64_t wake = UINT64_MAX, now;
        for (size_t i = 0; i < nb; i++) {
            struct call *x = &k[i];
            if (x->state != C_DONE && x->ready)
                step(x);
            if (x->state == C_DONE)
                continue;
            uint64_t until = x->since + x->dl.idle < x->dl.end ? x->since + x->dl.idle
                                                                : x->dl.end;
            now = kv__now_ms();
            if (now >= until) {
                x->rc = KV_ETIMEDOUT;
                x->state = C_DONE;
                continue;
            }
            pf[np] = (struct pollfd){ .fd = x->c->fd,
                                      .events = x->state == C_SEND ? POLLOUT : POLLIN };
            at[np++] = i;
            wake = until < wake ? until : wake;
        }
        if (!np)
            break;
        now = kv__now_ms();
        int r = poll(pf, np, wake > now ? (int)(wake - now) : 0);
        if (r < 0 && errno != EINTR) {
            for (size_t j = 0; j < np; j++) {
                k[at[j]].rc = KV_ENET;
                k[at[j]].state = C_DONE;
            }
            break;
        }
        for (size_t j = 0; j < np; j++)
            k[at[j]].ready = r > 0 && pf[j].revents != 0;
    }
    for (size_t i = 0; i < nb; i++) {
        b[i].rc = k[i].rc;
        frame_free(&k[i]);
        kv__sum_state_free(k[i].sum_st);
    }
out:
    if (k != &one)
        free(k);
    if (pf != &pf1)
        free(pf);
    if (at != &at1)
        free(at);
}

static int tcp_batch(struct kv__conn *cp, struct kv__op *ops, size_t n)
{
    struct kv__batch b = { .conn = cp, .ops = ops, .n = n };
    tcp_batch_many(&b, 1);
    return b.rc;
}

const struct kv__transport_ops kv__tcp_transport = {
    .name = "tcp",
    .create = tcp_create,
    .destroy = tcp_destroy,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .close = tcp_close,
    .batch = tcp_batch,
    .batch_many = tcp_batch_many,
};
