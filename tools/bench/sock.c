/*
 * sock.c — the benchmark's client sockets for the network peers
 * (redis, memcached): connections with bounded timeouts, a small read
 * buffer for reply lines, values read straight into the job's buffers, a
 * pool of connections (one per job), and the raw loopback TCP baseline.
 *
 * Key design choices:
 * - Plain blocking sockets with SO_SNDTIMEO/SO_RCVTIMEO (which on Linux
 *   also bound connect()): a job thread does one thing at a time, so
 *   blocking calls are the simplest correct client, and the timeouts turn a
 *   hung server into KV_ETIMEDOUT instead of a hung benchmark.
 * - Reply lines go through a 16 KiB buffer; a value's bytes do not: after
 *   what is already buffered, readv() lands them in the caller's iovecs,
 *   with the buffer as the last element so that the value's CRLF and the
 *   next reply's line come in with its last bytes (one syscall less per
 *   value, and never a copy of more than the buffer's size).
 * - A connection that fails mid-reply is closed (its stream can no longer
 *   be trusted) and redialed on next use.
 */
#include "bench.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_IOV 64

int kvctl_split_hostport(const char *hp, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon = strrchr(hp, ':');
    const char *h = hp;
    size_t hlen = colon ? (size_t)(colon - hp) : 0;
    if (!colon || hlen == 0 || !colon[1])
        return KV_EINVAL;
    if (h[0] == '[' && hlen >= 2 && h[hlen - 1] == ']') {   /* [::1]:6379 */
        h++;
        hlen -= 2;
    }
    for (const char *p = colon + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return KV_EINVAL;
    if (hlen >= hcap || strlen(colon + 1) >= pcap || atoi(colon + 1) < 1 ||
        atoi(colon + 1) > 65535)
        return KV_EINVAL;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    snprintf(port, pcap, "%s", colon + 1);
    return KV_OK;
}

static void set_timeouts(int fd, unsigned ms)
{
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static int err_of(int e)
{
    return e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS || e == ETIMEDOUT
               ? KV_ETIMEDOUT : KV_ENET;
}

int kvctl_dial(const char *hostport, unsigned timeout_ms, int *fd_out, char *why, size_t whylen)
{
    char host[256], port[16];
    *fd_out = -1;
    if (kvctl_split_hostport(hostport, host, sizeof host, port, sizeof port) != KV_OK) {
        snprintf(why, whylen, "'%s' is not HOST:PORT", hostport);
        return KV_EINVAL;
    }
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g != 0) {
        snprintf(why, whylen, "%s: %s", hostport, gai_strerror(g));
        return KV_ENET;
    }
    int rc = KV_ENET, e = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            e = errno;
            continue;
        }
        set_timeouts(fd, timeout_ms);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *fd_out = fd;
            rc = KV_OK;
            break;
        }
        e = errno;
        close(fd);
    }
    freeaddrinfo(ai);
    if (rc != KV_OK) {
        rc = err_of(e);
        snprintf(why, whylen, "cannot connect to %s: %s", hostport,
                 rc == KV_ETIMEDOUT ? "no answer (timed out)" : strerror(e));
    }
    return rc;
}

/* ---- connections --------------------------------------------------------- */

int kvctl_conn_open(struct kvctl_conn *c, const char *hostport, unsigned timeout_ms, char *why,
                    size_t whylen)
{
    c->rpos = c->rlen = 0;
    c->timeout_ms = timeout_ms;
    snprintf(c->peer, sizeof c->peer, "%s", hostport);
    return kvctl_dial(hostport, timeout_ms, &c->fd, why, whylen);
}

void kvctl_conn_close(struct kvctl_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->rpos = c->rlen = 0;
}

int kvctl_conn_writev(struct kvctl_conn *c, struct iovec *v, int n)
{
    while (n > 0) {
        ssize_t w = writev(c->fd, v, n > IOV_MAX ? IOV_MAX : n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? err_of(errno) : KV_ENET;
        size_t left = (size_t)w;
        while (n > 0 && left >= v->iov_len) {
            left -= v->iov_len;
            v++;
            n--;
        }
        if (n > 0) {
            v->iov_base = (char *)v->iov_base + left;
            v->iov_len -= left;
        }
    }
    return KV_OK;
}

/* Reads more into the buffer (after moving what is left to its start). */
static int fill(struct kvctl_conn *c)
{
    if (c->rpos > 0) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    if (c->rlen == sizeof c->rbuf)
        return KV_EPROTO;
    for (;;) {
        ssize_t r = recv(c->fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen, 0);
        if (r > 0) {
            c->rlen += (size_t)r;
            return KV_OK;
        }
        if (r < 0 && errno == EINTR)
            continue;
        return r == 0 ? KV_ENET : err_of(errno);
    }
}

int kvctl_conn_line(struct kvctl_conn *c, char *out, size_t cap)
{
    for (;;) {
        char *s = c->rbuf + c->rpos;
        size_t avail = c->rlen - c->rpos;
        char *nl = avail ? memchr(s, '\n', avail) : NULL;
        if (nl) {
            size_t len = (size_t)(nl - s);
            if (len == 0 || s[len - 1] != '\r' || len > cap)
                return KV_EPROTO;
            memcpy(out, s, len - 1);
            out[len - 1] = '\0';
            c->rpos += len + 1;
            return KV_OK;
        }
        int rc = fill(c);
        if (rc != KV_OK)
            return rc;
    }
}

int kvctl_conn_discard(struct kvctl_conn *c, uint64_t n)
{
    while (n > 0) {
        if (c->rpos == c->rlen) {
            c->rpos = c->rlen = 0;
            int rc = fill(c);
            if (rc != KV_OK)
                return rc;
        }
        size_t take = c->rlen - c->rpos < n ? c->rlen - c->rpos : (size_t)n;
        c->rpos += take;
        n -= take;
    }
    return KV_OK;
}

int kvctl_conn_read_value(struct kvctl_conn *c, const kv_iov *iov, uint32_t cnt, uint64_t len)
{
    uint32_t i = 0;
    size_t off = 0;             /* into iov[i] */
    uint64_t left = len;
    /* What the buffer already holds. */
    while (left > 0 && c->rpos < c->rlen && i < cnt) {
        size_t room = iov[i].len - off, avail = c->rlen - c->rpos;
        size_t take = room < avail ? room : avail;
        take = take < left ? take : (size_t)left;
        memcpy((char *)iov[i].base + off, c->rbuf + c->rpos, take);
        c->rpos += take;
        off += take;
        left -= take;
        if (off == iov[i].len)
            i++, off = 0;
    }
    if (c->rpos == c->rlen)
        c->rpos = c->rlen = 0;
    while (left > 0) {
        struct iovec v[MAX_IOV + 1];
        int n = 0;
        uint64_t want = 0;
        for (uint32_t k = i; k < cnt && n < MAX_IOV && want < left; k++) {
            size_t l = iov[k].len - (k == i ? off : 0);
            if (l > left - want)
                l = (size_t)(left - want);
            v[n++] = (struct iovec){ (char *)iov[k].base + (k == i ? off : 0), l };
            want += l;
        }
        if (want == 0)
            return KV_EINVAL;           /* caller's iovecs hold less than len */
        /* The buffer takes what follows the value, only when these iovecs
         * finish it (and the buffer is empty here: it was drained above). */
        bool tail = want == left && c->rlen == 0;
        if (tail)
            v[n++] = (struct iovec){ c->rbuf, sizeof c->rbuf };
        ssize_t r = readv(c->fd, v, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r == 0 ? KV_ENET : err_of(errno);
        uint64_t got = (uint64_t)r;
        if (tail && got > left) {
            c->rlen = (size_t)(got - left);
            got = left;
        }
        left -= got;
        while (got > 0) {
            size_t room = iov[i].len - off;
            size_t take = room < got ? room : (size_t)got;
            off += take;
            got -= take;
            if (off == iov[i].len)
                i++, off = 0;
        }
    }
    return KV_OK;
}

int kvctl_conn_expect_crlf(struct kvctl_conn *c)
{
    while (c->rlen - c->rpos < 2) {
        int rc = fill(c);
        if (rc != KV_OK)
            return rc;
    }
    if (c->rbuf[c->rpos] != '\r' || c->rbuf[c->rpos + 1] != '\n')
        return KV_EPROTO;
    c->rpos += 2;
    return KV_OK;
}

/* ---- a pool: one connection per job -------------------------------------- */

struct kvctl_pool {
    pthread_mutex_t mu;
    struct kvctl_conn *conns;
    unsigned n, nfree;
    unsigned *free;                 /* stack of free indexes */
};

int kvctl_pool_new(unsigned n, const char *hostport, unsigned timeout_ms,
                   int (*hello)(struct kvctl_conn *c, char *why, size_t whylen),
                   struct kvctl_pool **out, char *why, size_t whylen)
{
    *out = NULL;
    struct kvctl_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->conns = calloc(n, sizeof *p->conns)) || !(p->free = calloc(n, sizeof *p->free))) {
        if (p)
            free(p->conns);
        free(p);
        snprintf(why, whylen, "out of memory");
        return KV_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    p->n = n;
    for (unsigned i = 0; i < n; i++)
        p->conns[i].fd = -1;
    int rc = KV_OK;
    for (unsigned i = 0; i < n && rc == KV_OK; i++) {
        rc = kvctl_conn_open(&p->conns[i], hostport, timeout_ms, why, whylen);
        if (rc == KV_OK && hello)
            rc = hello(&p->conns[i], why, whylen);
        p->free[p->nfree++] = n - 1 - i;
    }
    if (rc != KV_OK) {
        kvctl_pool_free(p);
        return rc;
    }
    *out = p;
    return KV_OK;
}

void kvctl_pool_free(struct kvctl_pool *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i < p->n; i++)
        kvctl_conn_close(&p->conns[i]);
    pthread_mutex_destroy(&p->mu);
    free(p->conns);
    free(p->free);
    free(p);
}

struct kvctl_conn *kvctl_pool_get(struct kvctl_pool *p)
{
    struct kvctl_conn *c = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->nfree > 0)
        c = &p->conns[p->free[--p->nfree]];
    pthread_mutex_unlock(&p->mu);
    if (c && c->fd < 0) {               /* broken earlier: redial once */
        char why[256], peer[sizeof c->peer];
        memcpy(peer, c->peer, sizeof peer);
        if (kvctl_conn_open(c, peer, c->timeout_ms, why, sizeof why) != KV_OK) {
            kvctl_pool_put(p, c);
            return NULL;
        }
    }
    return c;
}

void kvctl_pool_put(struct kvctl_pool *p, struct kvctl_conn *c)
{
    pthread_mutex_lock(&p->mu);
    p->free[p->nfree++] = (unsigned)(c - p->conns);
    pthread_mutex_unlock(&p->mu);
}

/* ---- the loopback TCP baseline ------------------------------------------- */

struct tcp_pair {
    int lfd, rfd, wfd;
    pthread_t rth, wth;
    uint64_t write_size, received;
    const uint64_t *deadline;
    char *buf;
};

static void *tcp_reader(void *arg)
{
    struct tcp_pair *p = arg;
    for (;;) {
        ssize_t r = recv(p->rfd, p->buf, p->write_size, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        p->received += (uint64_t)r;
    }
    return NULL;
}

static void *tcp_writer(void *arg)
{
    struct tcp_pair *p = arg;
    char *b = p->buf + p->write_size;
    while (kvctl_now_ns() < *p->deadline) {
        for (uint64_t off = 0; off < p->write_size;) {
            ssize_t w = send(p->wfd, b + off, p->write_size - off, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return NULL;
            off += (uint64_t)w;
        }
    }
    shutdown(p->wfd, SHUT_WR);
    return NULL;
}

/* One connected pair on 127.0.0.1 (blocking, TCP_NODELAY like the peers). */
static int tcp_pair_open(struct tcp_pair *p)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof sa;
    int one = 1;
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    p->wfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (p->lfd < 0 || p->wfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(p->lfd, 1) != 0 || getsockname(p->lfd, (struct sockaddr *)&sa, &sl) != 0)
        return KV_ENET;
    set_timeouts(p->wfd, 5000);
    if (connect(p->wfd, (struct sockaddr *)&sa, sizeof sa) != 0)
        return KV_ENET;
    p->rfd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (p->rfd < 0)
        return KV_ENET;
    set_timeouts(p->rfd, 5000);
    setsockopt(p->wfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(p->rfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return KV_OK;
}

double kvctl_tcp_baseline(unsigned streams, uint64_t write_size, double seconds)
{
    if (write_size > (64u << 20))
        write_size = 64u << 20;
    struct tcp_pair *ps = calloc(streams, sizeof *ps);
    if (!ps)
        return 0;
    uint64_t deadline = UINT64_MAX;
    unsigned opened = 0, started = 0;
    bool ok = true;
    for (; opened < streams && ok; opened++) {
        struct tcp_pair *p = &ps[opened];
        p->lfd = p->rfd = p->wfd = -1;
        p->write_size = write_size;
        p->deadline = &deadline;
        p->buf = malloc(2 * write_size);
        ok = p->buf && tcp_pair_open(p) == KV_OK;
        if (p->buf)
            memset(p->buf, 0x5a, 2 * write_size);   /* touched before the clock starts */
    }
    uint64_t t0 = kvctl_now_ns();
    deadline = t0 + (uint64_t)(seconds * 1e9);
    for (; ok && started < streams; started++) {
        struct tcp_pair *p = &ps[started];
        if (pthread_create(&p->rth, NULL, tcp_reader, p) != 0)
            break;
        if (pthread_create(&p->wth, NULL, tcp_writer, p) != 0) {
            shutdown(p->wfd, SHUT_RDWR);
            pthread_join(p->rth, NULL);
            break;
        }
    }
    uint64_t total = 0;
    for (unsigned i = 0; i < started; i++) {
        pthread_join(ps[i].wth, NULL);
        pthread_join(ps[i].rth, NULL);
        total += ps[i].received;
    }
    uint64_t t1 = kvctl_now_ns();
    for (unsigned i = 0; i < opened; i++) {
        struct tcp_pair *p = &ps[i];
        int fds[] = { p->lfd, p->rfd, p->wfd };
        for (int k = 0; k < 3; k++)
            if (fds[k] >= 0)
                close(fds[k]);
        free(p->buf);
    }
    free(ps);
    if (!ok || started < streams || t1 <= t0)
        return 0;
    return (double)total / (1024.0 * 1024.0) / ((double)(t1 - t0) / 1e9);
}
