/*
 * kvctl_http.c — the smallest HTTP/1.0 GET client that reads a kvnode's or
 * kvmaster's /metrics, and a parser for the Prometheus text it returns.
 *
 * Key design choice: HTTP/1.0 with "Connection: close", so the body is
 * simply everything after the headers until the server closes: no chunked
 * decoding, no keep-alive, no library. Every step has one deadline, so a
 * node that accepts and then says nothing cannot hang the tool.
 */
#include "kvctl.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int wait_fd(int fd, short ev, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvctl_now_ns();
        if (now >= deadline_ns)
            return KV_ETIMEDOUT;
        struct pollfd pf = { .fd = fd, .events = ev };
        int k = poll(&pf, 1, (int)((deadline_ns - now) / 1000000 + 1));
        if (k > 0)
            return KV_OK;
        if (k < 0 && errno != EINTR)
            return KV_ENET;
    }
}

int kvctl_http_get(const char *hostport, const char *path, const char *token,
                   unsigned timeout_ms, char **body, size_t *len, int *status, char *why,
                   size_t whylen)
{
    *body = NULL;
    *len = 0;
    *status = 0;
    const char *colon = strrchr(hostport, ':');
    char host[256];
    if (!colon || colon == hostport || !colon[1] || (size_t)(colon - hostport) >= sizeof host) {
        snprintf(why, whylen, "'%s' is not HOST:PORT", hostport);
        return KV_EINVAL;
    }
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
    int g = getaddrinfo(host, colon + 1, &hints, &res);
    if (g != 0 || !res) {
        snprintf(why, whylen, "cannot resolve %s: %s", hostport, gai_strerror(g));
        return KV_EINVAL;
    }
    uint64_t deadline = kvctl_now_ns() + (uint64_t)timeout_ms * 1000000u;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = fd < 0 ? KV_ENET : KV_OK;
    if (rc == KV_OK && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            rc = KV_ENET;
        } else if ((rc = wait_fd(fd, POLLOUT, deadline)) == KV_OK) {
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr) {
                errno = soerr;
                rc = KV_ENET;
            }
        }
    }
    freeaddrinfo(res);
    if (rc != KV_OK) {
        snprintf(why, whylen, "%s does not answer: %s", hostport,
                 rc == KV_ETIMEDOUT ? "timed out" : strerror(errno));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    /* The token (metrics.token) goes only to the address the user named. */
    char req[1024];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n"
                      "%s%s%s\r\n", path, hostport, token && *token ? "Authorization: Bearer " : "",
                      token && *token ? token : "", token && *token ? "\r\n" : "");
    if (rl < 0 || (size_t)rl >= sizeof req)
        rc = KV_EINVAL;
    for (int off = 0; off < rl && rc == KV_OK;) {
        ssize_t w = send(fd, req + off, (size_t)(rl - off), MSG_NOSIGNAL);
        if (w > 0)
            off += (int)w;
        else if (w < 0 && (errno == EAGAIN || errno == EINTR))
            rc = wait_fd(fd, POLLOUT, deadline);
        else
            rc = KV_ENET;
    }
    size_t cap = 65536, n = 0;
    char *buf = rc == KV_OK ? malloc(cap) : NULL;
    if (rc == KV_OK && !buf)
        rc = KV_ENOMEM;
    while (rc == KV_OK) {
        if (cap - n < 4096) {
            char *nb = cap > (64u << 20) ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                rc = KV_ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r > 0)
            n += (size_t)r;
        else if (r == 0)
            break;
        else if (errno == EAGAIN || errno == EINTR)
            rc = wait_fd(fd, POLLIN, deadline);
        else
            rc = KV_ENET;
    }
    close(fd);
    if (rc != KV_OK) {
        snprintf(why, whylen, "%s: %s", hostport,
                 rc == KV_ETIMEDOUT ? "no answer in time" : "connection failed mid-answer");
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    char *sep = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) != 0 || !sep || sscanf(buf + 8, " %d", status) != 1) {
        snprintf(why, whylen, "%s did not answer HTTP (is it the metrics.listen address?)",
                 hostport);
        free(buf);
        return KV_EPROTO;
    }
    size_t hl = (size_t)(sep + 4 - buf);
    memmove(buf, buf + hl, n - hl + 1);
    *body = buf;
    *len = n - hl;
    return KV_OK;
}
