/*
 * transport.c — choosing a transport from the table of those built in,
 * addresses, and sockets with deadlines.
 *
 * protocol: auto takes the first registered transport whose probe finds it
 * can run (rdma: a device present, per ibv_get_device_list in net/rdma.c;
 * tcp always); the choice is logged once per process so that a cluster
 * that silently runs on tcp is visible.
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

/*
 * The transports built in, by name, in the order protocol: auto prefers them
 * (Redis' connection types, connTypeRegister): a new transport is a file in
 * net/ and a line here (plus its name in engine/config.c's protocols).
 * rdma is weak (a build without net/rdma.c falls back); tcp is always there.
 */
static const struct kv__transport_ops *const transports[] = {
    &kv__rdma_transport,   /* weak: NULL when net/rdma.c is not linked */
    &kv__tcp_transport,
};

static int usable(const struct kv__transport_ops *t, const struct kv__net_opts *o)
{
    return t && (!t->probe || t->probe(o) > 0);
}

int kv__transport_pick(int protocol, const struct kv__net_opts *o,
                       const struct kv__transport_ops **out)
{
    static _Atomic int said;
    static const char *const names[] = { [KV_PROTO_TCP] = "tcp", [KV_PROTO_RDMA] = "rdma" };
    *out = NULL;
    if (protocol != KV_PROTO_AUTO) {
        const struct kv__transport_ops *t;
        const char *want = protocol > 0 && (size_t)protocol < KV__ARRAY_LEN(names) ? names[protocol] : "";
        bool built = false;
        for (size_t i = 0; i < KV__ARRAY_LEN(transports); i++) {
            if (!(t = transports[i]) || strcmp(t->name, want) != 0)
                continue;
            built = true;
            if (usable(t, o)) {
                *out = t;
                return KV_OK;
            }
        }
        KV_ERROR("cluster.protocol %s: %s", want, built ? "no device found" : "not built in");
        return KV_ENOTSUP;
    }
    for (size_t i = 0; i < KV__ARRAY_LEN(transports) && !*out; i++)
        if (usable(transports[i], o))
            *out = transports[i];
    if (!*out)
        return KV_ENOTSUP;
    if (!atomic_exchange(&said, 1))
        KV_INFO("cluster.protocol auto: using %s%s", (*out)->name,
                *out == &kv__tcp_transport ? " (no RDMA device found, or built without rdma)" : "");
    return KV_OK;
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
