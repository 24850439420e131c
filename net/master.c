/*
 * master.c — kvmaster's membership service and the node-side client.
 *
 * Key design choice: one thread, poll(), and tiny state. Membership traffic
 * is a heartbeat per node per interval, so the master keeps every member in
 * an array and answers each JOIN with the whole view; there is nothing to
 * shard or cache. Frames are read nonblocking and bounded (bodies at most
 * MASTER_BODY_MAX); answers are small and written with a short deadline,
 * and a peer too slow to take one is dropped rather than waited for.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "master.h"

#define MASTER_BODY_MAX (64u << 10)
#define MASTER_CONNS_MAX 1024
#define MASTER_SEND_MS 1000

unsigned kv__master_heartbeat_ms(uint64_t ttl)
{
    uint64_t hb = ttl / 4;
    return hb < 20 ? 20 : hb > 1000 ? 1000 : (unsigned)hb;
}

/* ---- small blocking-with-deadline helpers on nonblocking sockets -------- */

static int send_frame(int fd, uint8_t type, int status, uint64_t req_id, const uint8_t *body,
                      size_t blen, uint64_t deadline)
{
    uint8_t h[KV_PROTO_HDR_LEN];
    struct kv__hdr hd = { .type = type, .status = status, .req_id = req_id,
                          .body_len = (uint32_t)blen };
    kv__hdr_encode(&hd, h);
    int rc = kv__sock_xfer1(fd, h, sizeof h, 1, deadline);
    if (rc == KV_OK && blen)
        rc = kv__sock_xfer1(fd, (void *)body, blen, 1, deadline);
    return rc;
}

/* ---- the service -------------------------------------------------------- */

struct mentry {
    struct kv__member m;
    uint64_t last_ms;
};

struct mconn {
    int fd;
    uint8_t hdr[KV_PROTO_HDR_LEN];
    size_t got;
    struct kv__hdr h;
    int in_body;
    uint8_t *body;
};

struct master {
    const struct kv_config *cfg;
    struct mentry *mem;
    size_t n, cap;
    uint64_t version;
    struct mconn conns[MASTER_CONNS_MAX];
    size_t nconns;
};

static void mconn_drop(struct master *ms, size_t i)
{
    close(ms->conns[i].fd);
    free(ms->conns[i].body);
    ms->conns[i] = ms->conns[--ms->nconns];
}

static ssize_t find_member(struct master *ms, const char *id)
{
    for (size_t i = 0; i < ms->n; i++)
        if (strcmp(ms->mem[i].m.id, id) == 0)
            return (ssize_t)i;
    return -1;
}

static int same_record(const struct kv__member *a, const struct kv__member *b)
{
    return strcmp(a->addr, b->addr) == 0 && a->flags == b->flags && a->nseg == b->nseg &&
           memcmp(a->seg, b->seg, a->nseg * sizeof a->seg[0]) == 0;
}

static int send_view(struct master *ms, int fd, uint64_t req_id)
{
    size_t need = 12;
    for (size_t i = 0; i < ms->n; i++)
        need += kv__member_wire_len(&ms->mem[i].m);
    uint8_t *b = malloc(need);
    if (!b)
        return KV_ENOMEM;
    struct kv__member *list = malloc((ms->n ? ms->n : 1) * sizeof *list);
    if (!list) {
        free(b);
        return KV_ENOMEM;
    }
    for (size_t i = 0; i < ms->n; i++)
        list[i] = ms->mem[i].m;
    int len = kv__view_encode(ms->version, list, ms->n, b, need);
    free(list);
    int rc = len < 0 ? len
                     : send_frame(fd, KV_MSG_VIEW, KV_OK, req_id, b, (size_t)len,
                                  kv__now_ms() + MASTER_SEND_MS);
    free(b);
    return rc;
}

/* Serves one complete frame; nonzero means drop the connection. */
static int master_serve(struct master *ms, struct mconn *c)
{
    char token[KV_PROTO_ID_MAX + 1];
    struct kv__member m;
    memset(&m, 0, sizeof m);
    if ((c->h.type != KV_MSG_JOIN && c->h.type != KV_MSG_LEAVE) ||
        kv__join_decode(c->body, c->h.body_len, token, sizeof token, &m)) {
        KV_WARN("kvmaster: malformed frame (type %u); closing", c->h.type);
        return 1;
    }
    if (strcmp(token, ms->cfg->cluster.token) != 0) {
        KV_WARN("kvmaster: refused '%s': wrong cluster token", m.id);
        send_frame(c->fd, KV_MSG_VIEW, KV_EPERM, c->h.req_id, NULL, 0,
                   kv__now_ms() + MASTER_SEND_MS);
        return 1;
    }
    ssize_t at = find_member(ms, m.id);
    /* A LEAVE for an id not in the view changes nothing and is answered
     * with the view like any other: kv_members (net/admin.c) reads the
     * view that way without joining. Keep it so. */
    if (c->h.type == KV_MSG_LEAVE) {
        if (at >= 0) {
            ms->mem[at] = ms->mem[--ms->n];
            ms->version++;
            KV_INFO("kvmaster: %s left (view %llu, %zu members)", m.id,
                    (unsigned long long)ms->version, ms->n);
        }
    } else if (at >= 0) {
        if (!same_record(&ms->mem[at].m, &m)) {
            ms->mem[at].m = m;
            ms->version++;
        }
        ms->mem[at].last_ms = kv__now_ms();
    } else {
        if (ms->n >= KV_PROTO_VIEW_MAX)
            return 1;
        if (ms->n == ms->cap) {
            size_t nc = ms->cap ? ms->cap * 2 : 16;
            struct mentry *p = realloc(ms->mem, nc * sizeof *p);
            if (!p)
                return 1;
            ms->mem = p;
            ms->cap = nc;
        }
        ms->mem[ms->n].m = m;
        ms->mem[ms->n].last_ms = kv__now_ms();
        ms->n++;
        ms->version++;
        KV_INFO("kvmaster: %s joined at %s%s (view %llu, %zu members)", m.id, m.addr,
                (m.flags & KV_MEMBER_OWNER) ? "" : " as a client",
                (unsigned long long)ms->version, ms->n);
    }
    return send_view(ms, c->fd, c->h.req_id) != KV_OK;
}

/* Reads what is there; nonzero means drop the connection. */
static int master_read(struct master *ms, struct mconn *c)
{
    for (;;) {
        if (!c->in_body) {
            ssize_t r = recv(c->fd, c->hdr + c->got, KV_PROTO_HDR_LEN - c->got, 0);
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return 1;
            c->got += (size_t)r;
            if (c->got < KV_PROTO_HDR_LEN)
                continue;
            if (kv__hdr_decode(c->hdr, 0, &c->h) || c->h.body_len > MASTER_BODY_MAX) {
                KV_WARN("kvmaster: bad frame header; closing");
                return 1;
            }
            c->body = malloc(c->h.body_len ? c->h.body_len : 1);
            if (!c->body)
                return 1;
            c->got = 0;
            c->in_body = 1;
        }
        while (c->got < c->h.body_len) {
            ssize_t r = recv(c->fd, c->body + c->got, c->h.body_len - c->got, 0);
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return 1;
            c->got += (size_t)r;
        }
        int rc = master_serve(ms, c);
        free(c->body);
        c->body = NULL;
        c->got = 0;
        c->in_body = 0;
        if (rc)
            return 1;
    }
}

static void master_expire(struct master *ms)
{
    uint64_t now = kv__now_ms();
    for (size_t i = 0; i < ms->n;) {
        if (now - ms->mem[i].last_ms > ms->cfg->cluster.node_ttl_ms) {
            KV_INFO("kvmaster: %s silent for %llu ms, dropped (view %llu, %zu members)",
                    ms->mem[i].m.id, (unsigned long long)(now - ms->mem[i].last_ms),
                    (unsigned long long)ms->version + 1, ms->n - 1);
            ms->mem[i] = ms->mem[--ms->n];
            ms->version++;
        } else {
            i++;
        }
    }
}

KV__EXPORT int kv_master_run(const kv_config *cfg, volatile int *stop, char *err, size_t errlen)
{
    struct sockaddr_in sa;
    if (!cfg || !stop)
        return KV_EINVAL;
    kv__log_set_level(cfg->log.level);
    if (kv__net_parse_addr(cfg->cluster.master, &sa)) {
        kv__errf(err, errlen, "cluster.master: bad address '%s'", cfg->cluster.master);
        return KV_ECONFIG;
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        return kv__err_from_errno(errno);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 128)) {
        kv__errf(err, errlen, "cluster.master %s: %s", cfg->cluster.master, strerror(errno));
        close(lfd);
        return KV_ENET;
    }
    struct master *ms = calloc(1, sizeof *ms);
    if (!ms) {
        close(lfd);
        return KV_ENOMEM;
    }
    ms->cfg = cfg;
    /* Versions start from the wall clock, so a restarted master's views
     * still read as newer than any its members saw before. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ms->version = ((uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000) << 10;
    KV_INFO("kvmaster: listening on %s, node_ttl_ms %llu%s", cfg->cluster.master,
            (unsigned long long)cfg->cluster.node_ttl_ms,
            cfg->cluster.token[0] ? ", token required" : "");
    struct pollfd *pf = malloc((MASTER_CONNS_MAX + 1) * sizeof *pf);
    if (!pf) {
        free(ms);
        close(lfd);
        return KV_ENOMEM;
    }
    while (!*stop) {
        pf[0] = (struct pollfd){ .fd = lfd, .events = POLLIN };
        for (size_t i = 0; i < ms->nconns; i++)
            pf[i + 1] = (struct pollfd){ .fd = ms->conns[i].fd, .events = POLLIN };
        size_t npf = ms->nconns + 1;
        int k = poll(pf, npf, 20);
        if (k > 0) {
            /* Walk backwards: dropping swaps the last connection in. */
            for (size_t i = npf - 1; i >= 1; i--)
                if (pf[i].revents && master_read(ms, &ms->conns[i - 1]))
                    mconn_drop(ms, i - 1);
            if (pf[0].revents & POLLIN) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    if (ms->nconns >= MASTER_CONNS_MAX) {
                        close(fd);
                        continue;
                    }
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    ms->conns[ms->nconns++] = (struct mconn){ .fd = fd };
                }
            }
        }
        master_expire(ms);
    }
    while (ms->nconns)
        mconn_drop(ms, 0);
    free(pf);
    free(ms->mem);
    free(ms);
    close(lfd);
    KV_INFO("kvmaster: stopped");
    return KV_OK;
}

/* ---- the client --------------------------------------------------------- */

struct kv__mclient {
    pthread_mutex_t lock;
    char addr[KV_CFG_STR];
    char token[KV_CFG_STR];
    unsigned timeout_ms;
    int fd;
    uint64_t next_id;
};

int kv__mclient_open(const char *addr, const char *token, unsigned timeout_ms,
                     struct kv__mclient **out)
{
    struct sockaddr_in sa;
    *out = NULL;
    if (kv__net_parse_addr(addr, &sa) || strlen(token) > KV_PROTO_ID_MAX)
        return KV_EINVAL;
    struct kv__mclient *m = calloc(1, sizeof *m);
    if (!m)
        return KV_ENOMEM;
    pthread_mutex_init(&m->lock, NULL);
    snprintf(m->addr, sizeof m->addr, "%s", addr);
    snprintf(m->token, sizeof m->token, "%s", token);
    m->timeout_ms = timeout_ms ? timeout_ms : KV_NET_DEFAULT_TIMEOUT_MS;
    m->fd = -1;
    m->next_id = 1;
    *out = m;
    return KV_OK;
}

void kv__mclient_close(struct kv__mclient *m)
{
    if (!m)
        return;
    if (m->fd >= 0)
        close(m->fd);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static int mc_connect(struct kv__mclient *m, uint64_t deadline)
{
    struct sockaddr_in sa;
    kv__net_parse_addr(m->addr, &sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kv__err_from_errno(errno);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (errno != EINPROGRESS) {
            close(fd);
            return KV_ENET;
        }
        struct pollfd pf = { .fd = fd, .events = POLLOUT };
        uint64_t now = kv__now_ms();
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (now >= deadline || poll(&pf, 1, (int)(deadline - now)) <= 0) {
            close(fd);
            return KV_ETIMEDOUT;
        }
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            close(fd);
            return KV_ENET;
        }
    }
    m->fd = fd;
    return KV_OK;
}

static int mc_call(struct kv__mclient *m, uint8_t type, const struct kv__member *self,
                   uint64_t *version, struct kv__member **members, size_t *n)
{
    uint8_t buf[KV_PROTO_HDR_LEN + 2 + KV_PROTO_ID_MAX + sizeof(struct kv__member) + 64];
    int blen = kv__join_encode(m->token, self, buf + KV_PROTO_HDR_LEN,
                               sizeof buf - KV_PROTO_HDR_LEN);
    if (blen < 0)
        return KV_EINVAL;
    uint64_t deadline = kv__now_ms() + m->timeout_ms;
    int rc = KV_OK;
    if (m->fd < 0 && (rc = mc_connect(m, deadline)))
        return rc;
    uint64_t id = m->next_id++;
    struct kv__hdr h = { .type = type, .body_len = (uint32_t)blen, .req_id = id };
    kv__hdr_encode(&h, buf);
    uint8_t hb[KV_PROTO_HDR_LEN], *body = NULL;
    if ((rc = kv__sock_xfer1(m->fd, buf, KV_PROTO_HDR_LEN + (size_t)blen, 1, deadline)))
        goto fail;
    if ((rc = kv__sock_xfer1(m->fd, hb, sizeof hb, 0, deadline)))
        goto fail;
    if (kv__hdr_decode(hb, 0, &h) || h.type != KV_MSG_VIEW || h.req_id != id) {
        rc = KV_EPROTO;
        goto fail;
    }
    if (h.status) {
        rc = h.status == KV_EPERM ? KV_EPERM : KV_EPROTO;
        goto fail;
    }
    body = malloc(h.body_len ? h.body_len : 1);
    if (!body) {
        rc = KV_ENOMEM;
        goto fail;
    }
    if ((rc = kv__sock_xfer1(m->fd, body, h.body_len, 0, deadline)))
        goto fail;
    uint64_t v;
    struct kv__member *list;
    size_t cnt;
    if ((rc = kv__view_decode(body, h.body_len, &v, &list, &cnt)))
        goto fail;
    free(body);
    if (members) {
        *version = v;
        *members = list;
        *n = cnt;
    } else {
        free(list);
    }
    return KV_OK;
fail:
    free(body);
    close(m->fd);
    m->fd = -1;
    return rc;
}

int kv__mclient_join(struct kv__mclient *m, const struct kv__member *self, uint64_t *version,
                     struct kv__member **members, size_t *n)
{
    pthread_mutex_lock(&m->lock);
    int rc = mc_call(m, KV_MSG_JOIN, self, version, members, n);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int kv__mclient_leave(struct kv__mclient *m, const struct kv__member *self)
{
    pthread_mutex_lock(&m->lock);
    int rc = mc_call(m, KV_MSG_LEAVE, self, NULL, NULL, NULL);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int kv__mclient_view(struct kv__mclient *m, const struct kv__member *self, uint64_t *version,
                     struct kv__member **members, size_t *n)
{
    pthread_mutex_lock(&m->lock);
    int rc = mc_call(m, KV_MSG_LEAVE, self, version, members, n);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int kv__mclient_local_ip(struct kv__mclient *m, char *ip, size_t cap)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    pthread_mutex_lock(&m->lock);
    int rc = m->fd >= 0 ? KV_OK : mc_connect(m, kv__now_ms() + m->timeout_ms);
    if (rc == KV_OK && getsockname(m->fd, (struct sockaddr *)&sa, &sl) != 0)
        rc = KV_ENET;
    pthread_mutex_unlock(&m->lock);
    if (rc == KV_OK && !inet_ntop(AF_INET, &sa.sin_addr, ip, (socklen_t)cap))
        rc = KV_EINVAL;
    return rc;
}
