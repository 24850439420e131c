/*
 * transport.c — choosing a transport, addresses, and the engine backend.
 *
 * protocol: auto asks rdma's probe (a device present, per ibv_get_device_list
 * in net/rdma.c) and falls back to tcp; the choice is logged once per
 * process so that a cluster that silently runs on tcp is visible.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "transport.h"

int kv__transport_pick(int protocol, const struct kv__net_opts *o,
                       const struct kv__transport_ops **out)
{
    static _Atomic int said;
    const struct kv__transport_ops *rdma = &kv__rdma_transport ? &kv__rdma_transport : NULL;
    int rdma_ok = rdma && (!rdma->probe || rdma->probe(o) > 0);
    *out = NULL;
    switch (protocol) {
    case KV_PROTO_TCP:
        *out = &kv__tcp_transport;
        return KV_OK;
    case KV_PROTO_RDMA:
        if (!rdma_ok) {
            KV_ERROR("cluster.protocol rdma: %s", rdma ? "no RDMA device found"
                                                       : "not built with RDMA");
            return KV_ENOTSUP;
        }
        *out = rdma;
        return KV_OK;
    default:
        *out = rdma_ok ? rdma : &kv__tcp_transport;
        if (!atomic_exchange(&said, 1))
            KV_INFO("cluster.protocol auto: using %s%s", (*out)->name,
                    rdma_ok ? "" : rdma ? " (no RDMA device found)" : " (built without rdma)");
        return KV_OK;
    }
}

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
