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
 * it writes. Anything wrong with a frame — bad magic/version/type, a body
 * or data length off, a first frame that is not HELLO, a wrong token —
 * closes that connection only.
 *
 * Client: a kv__conn is one socket used by one thread at a time; every
 * wait is a poll() bounded by the call's deadline (struct dl: no progress
 * for opts.timeout_ms, or the whole call past timeout + bytes at 10 MiB/s).
 */
#include <errno.h>
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

#include "proto.h"
#include "transport.h"

#define TCP_LOOPS_MAX 8
#define DISCARD_LEN (64u << 10)

struct tcp;

enum sstate { S_HDR, S_BODY, S_DATA, S_WRITE };

struct sconn {
    struct sconn *prev, *next;      /* the loop's list (under loop.lock) */
    struct loop *lp;
    int fd;
    int state;
    int authed, close_after;
    uint64_t progress_ms;           /* last time a frame moved (see reap_stalled) */
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
    kv__resv resv;
    int resv_ok;
    void *inbounce;                 /* dump bytes for backend->dump */
    /* the response being written */
    uint8_t *obuf;
    struct iovec *oiov;
    size_t oiovcnt, oidx;
    kv__pin *pins;
    size_t npins;
    void **bounce;
    size_t nbounce;
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
    int lfd;
    int nloops;
    struct loop loops[TCP_LOOPS_MAX];
    _Atomic unsigned rr;
    _Atomic int stopping;
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
    struct kv__backend *be = sc->lp->t->be;
    for (size_t i = 0; i < sc->npins; i++)
        be->unpin(be->ctx, &sc->pins[i]);
    for (size_t i = 0; i < sc->nbounce; i++)
        free(sc->bounce[i]);
    free(sc->pins);
    free(sc->bounce);
    free(sc->obuf);
    free(sc->oiov);
    free(sc->req);
    free(sc->resp);
    free(sc->body);
    sc->pins = NULL;
    sc->bounce = NULL;
    sc->obuf = NULL;
    sc->oiov = NULL;
    sc->req = NULL;
    sc->resp = NULL;
    sc->body = NULL;
    sc->npins = sc->nbounce = sc->oiovcnt = sc->oidx = sc->n = 0;
}

static void sconn_close(struct sconn *sc)
{
    struct loop *lp = sc->lp;
    epoll_ctl(lp->epfd, EPOLL_CTL_DEL, sc->fd, NULL);
    close(sc->fd);
    if (sc->cur_started && sc->resv_ok)
        lp->t->be->abort(lp->t->be->ctx, &sc->resv);
    free(sc->inbounce);
    release_response(sc);
    pthread_mutex_lock(&lp->lock);
    if (sc->prev)
        sc->prev->next = sc->next;
    else
        lp->conns = sc->next;
    if (sc->next)
        sc->next->prev = sc->prev;
    pthread_mutex_unlock(&lp->lock);
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
    while (sc->oidx < sc->oiovcnt) {
        size_t cnt = sc->oiovcnt - sc->oidx;
        if (cnt > IOV_MAX)
            cnt = IOV_MAX;
        ssize_t w = send_iov(sc->fd, sc->oiov + sc->oidx, cnt);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                set_events(sc, EPOLLOUT);
                return 0;
            }
            sconn_close(sc);
            return 1;
        }
        size_t left = (size_t)w;
        sc->progress_ms = kv__now_ms();
        while (left && sc->oidx < sc->oiovcnt) {
            struct iovec *v = &sc->oiov[sc->oidx];
            if (left >= v->iov_len) {
                left -= v->iov_len;
                sc->oidx++;
            } else {
                v->iov_base = (uint8_t *)v->iov_base + left;
                v->iov_len -= left;
                left = 0;
            }
        }
        while (sc->oidx < sc->oiovcnt && sc->oiov[sc->oidx].iov_len == 0)
            sc->oidx++;
    }
    release_response(sc);
    if (sc->close_after) {
        sconn_close(sc);
        return 1;
    }
    sc->state = S_HDR;
    sc->got = 0;
    set_events(sc, EPOLLIN);
    return 0;
}

/* Queues a header-and-body-only response and starts writing it. */
static int respond_simple(struct sconn *sc, uint8_t type, int status)
{
    struct kv__hdr h = { .type = type, .status = status, .req_id = sc->h.req_id };
    sc->obuf = malloc(KV_PROTO_HDR_LEN);
    sc->oiov = malloc(sizeof *sc->oiov);
    if (!sc->obuf || !sc->oiov) {
        sconn_close(sc);
        return 1;
    }
    kv__hdr_encode(&h, sc->obuf);
    sc->oiov[0] = (struct iovec){ sc->obuf, KV_PROTO_HDR_LEN };
    sc->oiovcnt = 1;
    sc->oidx = 0;
    sc->state = S_WRITE;
    return try_write(sc);
}

static int on_hello(struct sconn *sc)
{
    char token[KV_PROTO_ID_MAX + 1], id[KV_PROTO_ID_MAX + 1];
    if (kv__hello_decode(sc->body, sc->h.body_len, token, sizeof token, id, sizeof id)) {
        sconn_close(sc);
        return 1;
    }
    free(sc->body);
    sc->body = NULL;
    if (strcmp(token, sc->lp->t->o.token) != 0) {
        KV_WARN("tcp: refused a connection from '%s': wrong cluster token", id);
        sc->close_after = 1;
        return respond_simple(sc, KV_MSG_HELLO_OK, KV_EPERM);
    }
    sc->authed = 1;
    return respond_simple(sc, KV_MSG_HELLO_OK, KV_OK);
}

/* Serves the non-dump items once all dump data is in, then responds. */
static int finish_batch(struct sconn *sc)
{
    struct kv__backend *be = sc->lp->t->be;
    size_t n = sc->n, nload = 0;
    for (size_t i = 0; i < n; i++)
        nload += sc->req[i].kind == KV_OP_LOAD;
    size_t blen = kv__batch_r_body_len(n);
    sc->obuf = malloc(KV_PROTO_HDR_LEN + blen);
    sc->oiov = malloc((1 + nload) * sizeof *sc->oiov);
    sc->pins = nload ? malloc(nload * sizeof *sc->pins) : NULL;
    sc->bounce = nload ? malloc(nload * sizeof *sc->bounce) : NULL;
    if (!sc->obuf || !sc->oiov || (nload && (!sc->pins || !sc->bounce))) {
        sconn_close(sc);
        return 1;
    }
    size_t oc = 1;
    uint64_t data = 0;
    for (size_t i = 0; i < n; i++) {
        struct kv__wire_req *q = &sc->req[i];
        struct kv__wire_resp *r = &sc->resp[i];
        switch (q->kind) {
        case KV_OP_LOOKUP:
            r->status = be->lookup(be->ctx, q->ns, &q->id, 1, &r->hit);
            break;
        case KV_OP_SIZE:
            r->status = be->size(be->ctx, q->ns, &q->id, q->index, &r->len);
            break;
        case KV_OP_LOAD: {
            const void *d = NULL;
            uint64_t len = 0;
            kv__pin pin;
            int rc = be->pin ? be->pin(be->ctx, q->ns, &q->id, q->index, &d, &len, &pin)
                             : KV_ENOTFOUND;
            if (rc == KV_OK) {
                if (len != q->len) {
                    be->unpin(be->ctx, &pin);
                    rc = KV_EINVAL;
                } else {
                    sc->pins[sc->npins++] = pin;
                }
            } else if (rc == KV_ENOTFOUND) {
                /* Not in DRAM: maybe on SSD; copy through a bounce buffer. */
                rc = be->size(be->ctx, q->ns, &q->id, q->index, &len);
                if (rc == KV_OK && len != q->len)
                    rc = KV_EINVAL;
                void *b = NULL;
                if (rc == KV_OK && !(b = malloc(len ? len : 1)))
                    rc = KV_ENOMEM;
                if (rc == KV_OK) {
                    kv_iov v = { b, len };
                    rc = be->load(be->ctx, q->ns, &q->id, q->index, &v, 1);
                    sc->bounce[sc->nbounce++] = b;
                    d = b;
                }
            }
            r->status = rc;
            if (rc == KV_OK) {
                r->len = len;
                sc->oiov[oc++] = (struct iovec){ (void *)d, len };
                data += len;
            }
            break;
        }
        default:
            break;   /* dumps were served while their data arrived */
        }
    }
    struct kv__hdr h = { .type = KV_MSG_BATCH_R, .req_id = sc->h.req_id,
                         .body_len = (uint32_t)blen, .data_len = data };
    kv__hdr_encode(&h, sc->obuf);
    kv__batch_r_encode(sc->resp, n, sc->obuf + KV_PROTO_HDR_LEN, blen);
    sc->oiov[0] = (struct iovec){ sc->obuf, KV_PROTO_HDR_LEN + blen };
    sc->oiovcnt = oc;
    sc->oidx = 0;
    sc->state = S_WRITE;
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

/* Receives dump data; returns 1 when closed, 0 when it should wait for more
 * input, 2 when the batch moved on to writing. */
static int on_data(struct sconn *sc)
{
    struct kv__backend *be = sc->lp->t->be;
    for (;;) {
        if (sc->cur >= sc->n)
            return finish_batch(sc) ? 1 : 2;
        struct kv__wire_req *q = &sc->req[sc->cur];
        if (!sc->cur_started) {
            /* A shard already stored is skipped (it counts as success):
             * drain its bytes rather than reserve room, which could evict
             * other blocks for nothing. Commit still resolves races. */
            uint64_t have;
            if (be->size(be->ctx, q->ns, &q->id, q->index, &have) == KV_OK) {
                sc->resv_ok = 0;
                sc->resp[sc->cur].status = KV_OK;
            } else {
                int rc = be->reserve(be->ctx, q->len, &sc->resv);
                sc->resv_ok = rc == KV_OK;
                /* No segment (SSD only): copy in through a bounce buffer. */
                if (rc != KV_OK && be->dump && !be->seg_len && q->len <= KV_NET_BOUNCE_MAX &&
                    (sc->inbounce = malloc(q->len ? q->len : 1)))
                    rc = KV_OK;
                sc->resp[sc->cur].status = rc == KV_OK ? KV_OK : rc == KV_ENOMEM ? KV_ENOMEM
                                                                                 : KV_ENOSPC;
            }
            sc->cur_started = 1;
        }
        while (sc->cur_got < q->len) {
            uint64_t left = q->len - sc->cur_got;
            void *dst;
            if (sc->resv_ok) {
                dst = (uint8_t *)sc->resv.data + sc->cur_got;
            } else if (sc->inbounce) {
                dst = (uint8_t *)sc->inbounce + sc->cur_got;
            } else {
                dst = sc->lp->discard;
                if (left > DISCARD_LEN)
                    left = DISCARD_LEN;
            }
            if (left > (1u << 30))
                left = 1u << 30;
            ssize_t r = read(sc->fd, dst, (size_t)left);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (r <= 0) {
                sconn_close(sc);
                return 1;
            }
            sc->cur_got += (uint64_t)r;
            sc->progress_ms = kv__now_ms();
        }
        if (sc->resv_ok) {
            sc->resv_ok = 0;
            sc->resp[sc->cur].status =
                be->commit(be->ctx, &sc->resv, q->ns, &q->id, q->index);
        } else if (sc->inbounce) {
            kv_iov v = { sc->inbounce, q->len };
            sc->resp[sc->cur].status = be->dump(be->ctx, q->ns, &q->id, q->index, &v, 1);
            free(sc->inbounce);
            sc->inbounce = NULL;
        }
        sc->cur++;
        next_dump(sc);
    }
}

static void on_readable(struct sconn *sc)
{
    for (;;) {
        if (sc->state == S_HDR) {
            ssize_t r = read(sc->fd, sc->hdrbuf + sc->got, KV_PROTO_HDR_LEN - sc->got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
            if (r <= 0) {
                sconn_close(sc);
                return;
            }
            sc->got += (size_t)r;
            sc->progress_ms = kv__now_ms();
            if (sc->got < KV_PROTO_HDR_LEN)
                continue;
            if (kv__hdr_decode(sc->hdrbuf, UINT64_MAX, &sc->h) != KV_OK ||
                sc->h.type != (sc->authed ? KV_MSG_BATCH : KV_MSG_HELLO)) {
                KV_WARN("tcp: bad frame (type %u) from a peer; closing", sc->hdrbuf[5]);
                sconn_close(sc);
                return;
            }
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
                ssize_t r = read(sc->fd, sc->body + sc->got, sc->h.body_len - sc->got);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    return;
                if (r <= 0) {
                    sconn_close(sc);
                    return;
                }
                sc->got += (size_t)r;
                sc->progress_ms = kv__now_ms();
            }
            int rc = sc->h.type == KV_MSG_HELLO ? on_hello(sc) : on_batch(sc);
            if (rc)
                return;
            if (sc->state == S_WRITE)
                return;
        }
        if (sc->state == S_DATA) {
            int rc = on_data(sc);
            if (rc == 1 || rc == 0)
                return;
            if (sc->state == S_WRITE)
                return;
            continue;
        }
        if (sc->state == S_WRITE)
            return;
    }
}

static void accept_all(struct tcp *t)
{
    for (;;) {
        int fd = accept4(t->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct sconn *sc = calloc(1, sizeof *sc);
        if (!sc) {
            close(fd);
            continue;
        }
        struct loop *lp = &t->loops[atomic_fetch_add(&t->rr, 1) % (unsigned)t->nloops];
        sc->fd = fd;
        sc->lp = lp;
        sc->state = S_HDR;
        sc->progress_ms = kv__now_ms();
        pthread_mutex_lock(&lp->lock);
        sc->next = lp->conns;
        if (lp->conns)
            lp->conns->prev = sc;
        lp->conns = sc;
        pthread_mutex_unlock(&lp->lock);
        struct epoll_event e = { .events = EPOLLIN, .data.ptr = sc };
        if (epoll_ctl(lp->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
            /* Not in any epoll set yet: only this thread knows it. */
            pthread_mutex_lock(&lp->lock);
            if (sc->prev)
                sc->prev->next = sc->next;
            else
                lp->conns = sc->next;
            if (sc->next)
                sc->next->prev = sc->prev;
            pthread_mutex_unlock(&lp->lock);
            close(fd);
            free(sc);
        }
    }
}

/*
 * A peer that stops halfway through a frame (it died without a FIN, or it
 * is hostile) must not hold a reservation, pins or a buffer forever: a
 * connection with a frame in flight and no progress for the transport's
 * timeout is closed. Idle connections between frames are left alone (the
 * pool keeps them open on purpose).
 */
static void reap_stalled(struct loop *lp)
{
    uint64_t now = kv__now_ms(), limit = lp->t->o.timeout_ms;
    for (;;) {
        struct sconn *victim = NULL;
        pthread_mutex_lock(&lp->lock);
        for (struct sconn *sc = lp->conns; sc; sc = sc->next) {
            int mid = sc->state != S_HDR || sc->got > 0;
            if (mid && now - sc->progress_ms > limit) {
                victim = sc;
                break;
            }
        }
        pthread_mutex_unlock(&lp->lock);
        if (!victim)
            return;
        KV_WARN("tcp: a peer stalled mid-frame for over %llu ms; closing",
                (unsigned long long)limit);
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
    t->lfd = -1;
    snprintf(t->id, sizeof t->id, "pid-%ld", (long)getpid());
    *out = (struct kv__transport *)t;
    return KV_OK;
}

static int tcp_listen(struct kv__transport *tp, const char *addr, char *bound, size_t boundlen,
                      char *err, size_t errlen)
{
    struct tcp *t = (struct tcp *)tp;
    struct sockaddr_in sa;
    if (!t->be || t->lfd >= 0) {
        kv__errf(err, errlen, "tcp: nothing to serve or already listening");
        return KV_EINVAL;
    }
    if (kv__net_parse_addr(addr, &sa)) {
        kv__errf(err, errlen, "cluster.listen: bad address '%s'", addr);
        return KV_ECONFIG;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0)
        return kv__err_from_errno(errno);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 512) != 0) {
        int e = errno;
        kv__errf(err, errlen, "cluster.listen %s: %s", addr, strerror(e));
        close(fd);
        return KV_ENET;
    }
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    if (bound) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        snprintf(bound, boundlen, "%s:%u", ip, ntohs(sa.sin_port));
    }
    t->lfd = fd;
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

#define DL_FLOOR_BYTES_PER_MS (10u << 10)   /* 10 MiB/s */

static struct dl dl_make(unsigned timeout_ms, uint64_t bytes)
{
    return (struct dl){ .end = kv__now_ms() + timeout_ms + bytes / DL_FLOOR_BYTES_PER_MS,
                        .idle = timeout_ms };
}

/* Waits for ev on fd; since is when the call last made progress. */
static int wait_fd(int fd, short ev, const struct dl *d, uint64_t since)
{
    uint64_t until = since + d->idle < d->end ? since + d->idle : d->end;
    for (;;) {
        uint64_t now = kv__now_ms();
        if (now >= until)
            return KV_ETIMEDOUT;
        struct pollfd p = { .fd = fd, .events = ev };
        int k = poll(&p, 1, (int)(until - now));
        if (k > 0)
            return KV_OK;
        if (k < 0 && errno != EINTR)
            return KV_ENET;
    }
}

/* Moves all of iov[0..cnt) (which it consumes) through fd. */
static int xfer(int fd, struct iovec *iov, size_t cnt, int wr, const struct dl *deadline)
{
    size_t i = 0;
    uint64_t since = kv__now_ms();
    while (i < cnt && iov[i].iov_len == 0)
        i++;
    while (i < cnt) {
        size_t c = cnt - i > IOV_MAX ? IOV_MAX : cnt - i;
        ssize_t r = wr ? send_iov(fd, iov + i, c) : readv(fd, iov + i, (int)c);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_fd(fd, wr ? POLLOUT : POLLIN, deadline, since);
                if (rc)
                    return rc;
                continue;
            }
            return KV_ENET;
        }
        if (r == 0 && !wr)
            return KV_ENET;     /* the peer closed */
        since = kv__now_ms();
        size_t left = (size_t)r;
        while (i < cnt && left >= iov[i].iov_len) {
            left -= iov[i].iov_len;
            i++;
        }
        if (left) {
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
        while (i < cnt && iov[i].iov_len == 0)
            i++;
    }
    return KV_OK;
}

static int xfer1(int fd, void *p, size_t len, int wr, const struct dl *deadline)
{
    struct iovec v = { p, len };
    return xfer(fd, &v, 1, wr, deadline);
}

/* Reads a response header and checks it answers req_id with type. */
static int read_hdr(int fd, uint8_t type, uint64_t req_id, uint64_t max_data,
                    struct kv__hdr *h, const struct dl *deadline)
{
    uint8_t b[KV_PROTO_HDR_LEN];
    int rc = xfer1(fd, b, sizeof b, 0, deadline);
    if (rc)
        return rc;
    if (kv__hdr_decode(b, max_data, h) || h->type != type || h->req_id != req_id)
        return KV_EPROTO;
    return KV_OK;
}

static int tcp_connect(struct kv__transport *tp, const char *addr, struct kv__conn **out)
{
    struct tcp *t = (struct tcp *)tp;
    struct sockaddr_in sa;
    *out = NULL;
    if (kv__net_parse_addr(addr, &sa))
        return KV_EINVAL;
    struct dl d = dl_make(t->o.timeout_ms, 0), *deadline = &d;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kv__err_from_errno(errno);
    int one = 1, rc = KV_OK;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (errno != EINPROGRESS) {
            rc = KV_ENET;
            goto fail;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if ((rc = wait_fd(fd, POLLOUT, deadline, kv__now_ms())))
            goto fail;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            rc = KV_ENET;
            goto fail;
        }
    }
    uint8_t buf[KV_PROTO_HDR_LEN + 2 * (KV_PROTO_ID_MAX + 2)];
    int blen = kv__hello_encode(t->o.token, t->id, buf + KV_PROTO_HDR_LEN,
                                sizeof buf - KV_PROTO_HDR_LEN);
    if (blen < 0) {
        rc = KV_EINVAL;
        goto fail;
    }
    struct kv__hdr h = { .type = KV_MSG_HELLO, .body_len = (uint32_t)blen, .req_id = 1 };
    kv__hdr_encode(&h, buf);
    if ((rc = xfer1(fd, buf, KV_PROTO_HDR_LEN + (size_t)blen, 1, deadline)))
        goto fail;
    if ((rc = read_hdr(fd, KV_MSG_HELLO_OK, 1, 0, &h, deadline)))
        goto fail;
    if (h.body_len) {
        rc = KV_EPROTO;
        goto fail;
    }
    if (h.status) {
        rc = h.status == KV_EPERM ? KV_EPERM : KV_EPROTO;
        goto fail;
    }
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

/* One frame's worth of a batch (n <= KV_PROTO_BATCH_MAX). */
static int batch_chunk(struct tcp_conn *c, struct kv__op *ops, size_t n)
{
    size_t blen = kv__batch_body_len(n), rlen = kv__batch_r_body_len(n);
    size_t niov = 1, nload_iov = 0;
    uint64_t dump_bytes = 0, load_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind == KV_OP_DUMP) {
            niov += ops[i].iovcnt;
            dump_bytes += kv__iov_len(ops[i].iov, ops[i].iovcnt);
        } else if (ops[i].kind == KV_OP_LOAD) {
            nload_iov += ops[i].iovcnt;
            load_bytes += kv__iov_len(ops[i].iov, ops[i].iovcnt);
        }
    }
    struct dl d = dl_make(c->t->o.timeout_ms, dump_bytes + load_bytes), *deadline = &d;
    size_t bufsz = KV_PROTO_HDR_LEN + (blen > rlen ? blen : rlen);
    uint8_t *buf = malloc(bufsz);
    struct kv__wire_req *q = malloc(n * sizeof *q);
    struct kv__wire_resp *r = malloc(n * sizeof *r);
    struct iovec *iov = malloc((niov > nload_iov ? niov : nload_iov + 1) * sizeof *iov);
    int rc = KV_ENOMEM;
    if (!buf || !q || !r || !iov)
        goto out;
    for (size_t i = 0; i < n; i++) {
        q[i] = (struct kv__wire_req){ .kind = ops[i].kind, .ns = ops[i].ns,
                                      .index = ops[i].index, .id = ops[i].id };
        if (ops[i].kind == KV_OP_DUMP || ops[i].kind == KV_OP_LOAD)
            q[i].len = kv__iov_len(ops[i].iov, ops[i].iovcnt);
    }
    uint64_t id = c->next_id++;
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = (uint32_t)blen, .req_id = id,
                         .data_len = dump_bytes };
    kv__hdr_encode(&h, buf);
    kv__batch_encode(q, n, buf + KV_PROTO_HDR_LEN, blen);
    /* Header, descriptors, then the dumps' bytes straight from the caller. */
    iov[0] = (struct iovec){ buf, KV_PROTO_HDR_LEN + blen };
    size_t k = 1;
    for (size_t i = 0; i < n; i++)
        if (ops[i].kind == KV_OP_DUMP)
            for (uint32_t j = 0; j < ops[i].iovcnt; j++)
                iov[k++] = (struct iovec){ ops[i].iov[j].base, ops[i].iov[j].len };
    if ((rc = xfer(c->fd, iov, k, 1, deadline)))
        goto out;
    if ((rc = read_hdr(c->fd, KV_MSG_BATCH_R, id, load_bytes, &h, deadline)))
        goto out;
    if (h.status) {
        rc = kv__status_valid(h.status) ? h.status : KV_EPROTO;
        goto out;
    }
    if (h.body_len != rlen) {
        rc = KV_EPROTO;
        goto out;
    }
    if ((rc = xfer1(c->fd, buf, rlen, 0, deadline)))
        goto out;
    size_t got = n;
    if ((rc = kv__batch_r_decode(buf, rlen, r, &got)) || got != n) {
        rc = KV_EPROTO;
        goto out;
    }
    /* The data is exactly the OK loads' bytes, each its expected size:
     * check before any of it lands in the caller's memory. */
    uint64_t expect = 0;
    k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind != KV_OP_LOAD || r[i].status != KV_OK)
            continue;
        if (r[i].len != q[i].len) {
            rc = KV_EPROTO;
            goto out;
        }
        expect += r[i].len;
        for (uint32_t j = 0; j < ops[i].iovcnt; j++)
            iov[k++] = (struct iovec){ ops[i].iov[j].base, ops[i].iov[j].len };
    }
    if (expect != h.data_len) {
        rc = KV_EPROTO;
        goto out;
    }
    if ((rc = xfer(c->fd, iov, k, 0, deadline)))
        goto out;
    for (size_t i = 0; i < n; i++) {
        ops[i].result = r[i].status;
        ops[i].hit = r[i].hit;
        if (ops[i].kind == KV_OP_SIZE)
            ops[i].len = r[i].len;
    }
out:
    free(buf);
    free(q);
    free(r);
    free(iov);
    return rc;
}

static int tcp_batch(struct kv__conn *cp, struct kv__op *ops, size_t n)
{
    struct tcp_conn *c = (struct tcp_conn *)cp;
    for (size_t i = 0; i < n; i += KV_PROTO_BATCH_MAX) {
        size_t m = n - i > KV_PROTO_BATCH_MAX ? KV_PROTO_BATCH_MAX : n - i;
        int rc = batch_chunk(c, ops + i, m);
        if (rc)
            return rc;
    }
    return KV_OK;
}

const struct kv__transport_ops kv__tcp_transport = {
    .name = "tcp",
    .create = tcp_create,
    .destroy = tcp_destroy,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .close = tcp_close,
    .batch = tcp_batch,
};
