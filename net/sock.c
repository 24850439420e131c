/*
 * sock.c — plain TCP sockets for net/ (sock.h): addresses, a listener, a
 * connection by a deadline, and blocking I/O with deadlines.
 *
 * Key design choice: every socket is nonblocking and every wait is a poll()
 * bounded by the caller's absolute deadline, so a blocking call made of
 * these never outlives it; EINTR is retried, never reported.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/internal.h"
#include "sock.h"

int kv__net_parse_addr(const char *addr, struct sockaddr_in *out)
{
    char host[KV_CFG_STR];
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || (size_t)(colon - addr) >= sizeof host)
        return KV_EINVAL;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 0 || port > 65535)
        return KV_EINVAL;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)port);
    if (!host[0] || strcmp(host, "*") == 0) {
        out->sin_addr.s_addr = htonl(INADDR_ANY);
        return KV_OK;
    }
    if (inet_pton(AF_INET, host, &out->sin_addr) == 1)
        return KV_OK;
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return KV_EINVAL;
    out->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return KV_OK;
}

int kv__sock_listen(const char *what, const char *addr, int backlog, int *fd, char *bound,
                    size_t boundlen, char *err, size_t errlen)
{
    struct sockaddr_in sa;
    *fd = -1;
    if (kv__net_parse_addr(addr, &sa)) {
        kv__errf(err, errlen, "%s: bad address '%s'", what, addr);
        return KV_ECONFIG;
    }
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (s < 0)
        return kv__err_from_errno(errno);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, backlog) != 0) {
        int e = errno;
        kv__errf(err, errlen, "%s %s: %s", what, addr, strerror(e));
        close(s);
        return KV_ENET;
    }
    if (bound) {
        socklen_t sl = sizeof sa;
        getsockname(s, (struct sockaddr *)&sa, &sl);
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        snprintf(bound, boundlen, "%s:%u", ip, ntohs(sa.sin_port));
    }
    *fd = s;
    return KV_OK;
}

int kv__sock_accept(int lfd)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

int kv__sock_connect(const struct sockaddr_in *sa, uint64_t deadline, int *fd)
{
    *fd = -1;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (s < 0)
        return kv__err_from_errno(errno);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(s, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        /* Nonblocking: the handshake goes on; SO_ERROR says how it ended. */
        int rc = errno == EINPROGRESS ? kv__sock_wait(s, POLLOUT, deadline) : KV_ENET;
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (rc == KV_OK && (getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr))
            rc = KV_ENET;
        if (rc != KV_OK) {
            close(s);
            return rc;
        }
    }
    *fd = s;
    return KV_OK;
}

/* ---- socket I/O with deadlines (UINT64_MAX: none) ---------------------- */

int kv__sock_wait(int fd, short ev, uint64_t deadline)
{
    for (;;) {
        int ms = -1;
        if (deadline != UINT64_MAX) {
            uint64_t now = kv__now_ms();
            if (now >= deadline)
                return KV_ETIMEDOUT;
            ms = deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
        }
        struct pollfd p = { .fd = fd, .events = ev };
        int k = poll(&p, 1, ms);
        if (k > 0)
            return KV_OK;
        if (k < 0 && errno != EINTR)
            return KV_ENET;
    }
}

int kv__sock_xfer(int fd, struct iovec *iov, size_t cnt, int wr, uint64_t deadline)
{
    size_t i = 0;
    while (i < cnt) {
        if (iov[i].iov_len == 0) {
            i++;
            continue;
        }
        size_t c = cnt - i > IOV_MAX ? IOV_MAX : cnt - i;
        /* sendmsg, not writev: a peer that has gone must not SIGPIPE us. */
        struct msghdr m = { .msg_iov = iov + i, .msg_iovlen = c };
        ssize_t n = wr ? sendmsg(fd, &m, MSG_NOSIGNAL) : readv(fd, iov + i, (int)c);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = kv__sock_wait(fd, wr ? POLLOUT : POLLIN, deadline);
                if (rc)
                    return rc;
                continue;
            }
            return KV_ENET;
        }
        if (n == 0 && !wr)
            return KV_ENET;
        size_t left = (size_t)n;
        while (i < cnt && left >= iov[i].iov_len)
            left -= iov[i++].iov_len;
        if (left) {
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
    }
    return KV_OK;
}

int kv__sock_xfer1(int fd, void *p, size_t len, int wr, uint64_t deadline)
{
    struct iovec v = { p, len };
    return kv__sock_xfer(fd, &v, 1, wr, deadline);
}
