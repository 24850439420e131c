/*
 * master.c — kvmaster's membership service and the node-side client.
 *
 * Key design choice: one thread, poll(), and tiny state. Membership traffic
 * is a heartbeat per node per interval, so the master keeps every member in
 * an array and answers each JOIN with the whole view; there is nothing to
 * shard or cache. Frames are read nonblocking and bounded (bodies at most
 * MASTER_BODY_MAX); answers are small and written with a short deadline,
 * and a peer too slow to take one is dropped rather than waited for.
 *
 * Trust: every connection first runs auth.h's challenge-response (in the
 * poll loop, a step per message, so a slow peer holds nothing but its
 * slot); a JOIN's record must carry its member's own MAC under the token
 * (kv__member_sign), which the master keeps and hands on in the VIEW, and
 * the client checks every record of a VIEW before it believes it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "master.h"
#include "serve.h"
#include "sock.h"

#define MASTER_BODY_MAX (64u << 10)
#define MASTER_SEND_MS 1000
/* Connections that have not yet proved the token. A node runs the
 * challenge-response as soon as it connects, so 64 fill up only under a flood; then the
 * oldest is closed to let the newest in, and idle connections cannot lock
 * nodes (or kvctl members) out. */
#define KV__MASTER_UNAUTH_MAX 64
/* How long a connection may take to authenticate, and a frame to arrive
 * once begun: a JOIN is one small frame right after connecting, so 2 s is
 * far above any LAN round trip, and short enough that a flood cycles. */
#define KV__MASTER_FRAME_MS 2000
/* Every member of the largest view keeps one connection, plus room for
 * unauthenticated ones and view queries. */
#define MASTER_CONNS_MAX (KV_PROTO_VIEW_MAX + KV__MASTER_UNAUTH_MAX + 64)

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
    uint8_t secret[KV_PROTO_SECRET_LEN];    /* its creator's: see proto.h */
    int owned;                  /* 0: created by a client without secrets */
    uint32_t ip;                /* the host that created it */
};

/* Records one host may create. The token is shared, so a token holder is
 * known by its host: one that JOINs fresh ids in a loop fills at most this
 * much of the view (a quarter), and the other hosts' members still join,
 * heartbeat and read the view. A host runs a kvnode and its inference
 * processes, far fewer than this. */
#define KV__MASTER_PER_HOST 1024

struct mconn {
    int fd;
    int authed;                 /* has proved the token */
    uint32_t ip;                /* the peer's IPv4 address (network order) */
    int astage;                 /* before authed: 0 awaits the hello, 1 the proof */
    struct kv__auth_state auth;
    uint8_t abuf[KV__AUTH_HELLO_LEN];
    uint64_t born_ms, frame_ms; /* accepted at; the frame in flight began at */
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
    size_t nconns, nunauth;
    int spare_fd;               /* given up to refuse a peer at EMFILE */
    /* The VIEW body as last encoded, for version vver: every heartbeat is
     * answered with it, so it is encoded again only when the view changed,
     * and a JOIN that only appends a record appends its bytes (a view of
     * thousands of members would otherwise be copied and encoded whole at
     * every JOIN). */
    uint8_t *vbuf;
    size_t vlen, vcap;
    uint64_t vver;
    int vvalid;
};

static void mconn_drop(struct master *ms, size_t i)
{
    if (!ms->conns[i].authed)
        ms->nunauth--;
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
           memcmp(a->seg, b->seg, a->nseg * sizeof a->seg[0]) == 0 && a->lease == b->lease &&
           memcmp(a->mac, b->mac, sizeof a->mac) == 0;
}

/* Makes ms->vbuf hold the encoded view of this version (room after it for
 * a secret). */
static int view_encode_cached(struct master *ms)
{
    if (ms->vvalid && ms->vver == ms->version)
        return KV_OK;
    size_t need = 12 + KV_PROTO_SECRET_LEN;
    for (size_t i = 0; i < ms->n; i++)
        need += kv__member_wire_len(&ms->mem[i].m);
    if (need > ms->vcap) {
        uint8_t *b = realloc(ms->vbuf, need);
        if (!b)
            return KV_ENOMEM;
        ms->vbuf = b;
        ms->vcap = need;
    }
    kv__put64(ms->vbuf, ms->version);
    kv__put32(ms->vbuf + 8, (uint32_t)ms->n);
    size_t len = 12;
    for (size_t i = 0; i < ms->n; i++) {
        /* one record at a time, after a 12-byte header it writes and the
         * bytes before it are saved from */
        uint8_t save[12];
        memcpy(save, ms->vbuf + len - 12, 12);
        int k = kv__view_encode(0, &ms->mem[i].m, 1, ms->vbuf + len - 12, need - len + 12);
        memcpy(ms->vbuf + len - 12, save, 12);
        if (k < 12) {
            ms->vvalid = 0;
            return k < 0 ? k : KV_EPROTO;
        }
        len += (size_t)k - 12;
    }
    ms->vlen = len;
    ms->vver = ms->version;
    ms->vvalid = 1;
    return KV_OK;
}

/* The record just appended as mem[n - 1] (and the version bumped once for
 * it): appends its bytes to a cache that was the view before it. */
static void view_append_cached(struct master *ms)
{
    if (!ms->vvalid || ms->vver + 1 != ms->version || ms->n == 0)
        return;
    const struct kv__member *m = &ms->mem[ms->n - 1].m;
    size_t need = ms->vlen + kv__member_wire_len(m) + KV_PROTO_SECRET_LEN;
    if (need > ms->vcap) {
        uint8_t *b = realloc(ms->vbuf, need);
        if (!b) {
            ms->vvalid = 0;
            return;
        }
        ms->vbuf = b;
        ms->vcap = need;
    }
    uint8_t save[12];
    memcpy(save, ms->vbuf + ms->vlen - 12, 12);
    int k = kv__view_encode(0, m, 1, ms->vbuf + ms->vlen - 12, need - ms->vlen + 12);
    memcpy(ms->vbuf + ms->vlen - 12, save, 12);
    if (k < 12) {
        ms->vvalid = 0;
        return;
    }
    ms->vlen += (size_t)k - 12;
    kv__put64(ms->vbuf, ms->version);
    kv__put32(ms->vbuf + 8, (uint32_t)ms->n);
    ms->vver = ms->version;
}

/* Sends the view; with secret, appends it (the answer to the JOIN that
 * created or took over a record). */
static int send_view(struct master *ms, int fd, uint64_t req_id, const uint8_t *secret)
{
    int rc = view_encode_cached(ms);
    if (rc != KV_OK)
        return rc;
    size_t len = ms->vlen;
    if (secret) {
        memcpy(ms->vbuf + len, secret, KV_PROTO_SECRET_LEN);   /* vcap has room */
        len += KV_PROTO_SECRET_LEN;
    }
    return send_frame(fd, KV_MSG_VIEW, KV_OK, req_id, ms->vbuf, len,
                      kv__now_ms() + MASTER_SEND_MS);
}

/* The VIEW must fit one frame however records grow: a JOIN that would push
 * the encoded view past this is refused (KV_ENOSPC, "the view is full"), so
 * the members already in it keep their heartbeats, and kv_open and
 * kvctl members keep working. */
#define MASTER_VIEW_BYTES (KV_PROTO_BODY_MAX - 12 - KV_PROTO_SECRET_LEN)

/* The encoded view's size with record at (or a new one, at < 0) replaced
 * by m. */
static size_t view_bytes_with(const struct master *ms, ssize_t at, const struct kv__member *m)
{
    size_t b = kv__member_wire_len(m);
    for (size_t i = 0; i < ms->n; i++)
        if ((ssize_t)i != at)
            b += kv__member_wire_len(&ms->mem[i].m);
    return b;
}

/* 1 when addr ("a.b.c.d:port") names the IPv4 host ip (network order):
 * the JOIN came from the host its record says it listens on. A host name
 * is never matched (the master resolves nothing). */
static int addr_is_from(const char *addr, uint32_t ip)
{
    char host[64];
    const char *colon = strrchr(addr, ':');
    struct in_addr a;
    if (!colon || ip == 0 || (size_t)(colon - addr) >= sizeof host)
        return 0;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    return inet_pton(AF_INET, host, &a) == 1 && a.s_addr == ip;
}

/* Constant time, as tokens are (kv__token_eq). */
static int secret_eq(const uint8_t *a, const uint8_t *b)
{
    volatile uint8_t d = 0;
    for (int i = 0; i < KV_PROTO_SECRET_LEN; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

/* Answers status (KV_EPERM: refused; KV_EBUSY: the record is a live
 * member's, try again once it is quiet) and drops the connection. */
static int refuse(struct master *ms, struct mconn *c, int status, const char *what,
                  const char *id)
{
    KV_WARN("kvmaster: refused %s for '%s': %s", c->h.type == KV_MSG_LEAVE ? "a LEAVE" : "a JOIN",
            id, what);
    send_frame(c->fd, KV_MSG_VIEW, status, c->h.req_id, NULL, 0,
               kv__now_ms() + MASTER_SEND_MS);
    return 1;
}

/*
 * Serves one complete frame; nonzero means drop the connection.
 *
 * Ownership: the JOIN that creates a record gets a fresh random secret in
 * its answer, and from then on only a JOIN or LEAVE carrying it changes or
 * drops the record, so one token holder cannot rewrite another's address.
 * A JOIN without it, for a record still live (its owner heard from within
 * cluster.node_ttl_ms), is refused (KV_EBUSY) unless it is the owner
 * restarted: the same address, from that address's own host (a restarted
 * node listens where it did, and its old process, which held that port,
 * is gone). Anyone else, from another host or naming another address,
 * waits for the TTL like everybody, so a token holder cannot take a live
 * member's id during a short silence and keep it. A JOIN without it that
 * repeats the record exactly is still answered, without refreshing it.
 *
 * Why the address's host and not an instance nonce in the record: the
 * VIEW hands every record to every member, so a nonce in it is public and
 * any token holder could copy it; the secret above is what proves an
 * instance, and a restarted process has lost it. What a restart cannot
 * fake from another host is the connection's source address. (On the
 * owner's own host a token holder can claim the id, but only with the
 * owner's address in it: the traffic still goes to the owner.)
 */
static int master_serve(struct master *ms, struct mconn *c)
{
    struct kv__member m;
    uint8_t secret[KV_PROTO_SECRET_LEN], fresh[KV_PROTO_SECRET_LEN];
    int has = 0;
    memset(&m, 0, sizeof m);
    if ((c->h.type != KV_MSG_JOIN && c->h.type != KV_MSG_LEAVE) ||
        kv__join_decode_secret(c->body, c->h.body_len, &m, secret, &has)) {
        KV_WARN("kvmaster: malformed frame (type %u); closing", c->h.type);
        return 1;
    }
    /* Only a record its member signed is kept and handed on: the VIEW's
     * readers check the same MAC. */
    if (!kv__member_verify(ms->cfg->cluster.token, &m))
        return refuse(ms, c, KV_EPERM, "its record's MAC does not verify", m.id);
    if (c->h.type == KV_MSG_JOIN && !kv__member_sane(&m))
        return refuse(ms, c, KV_EINVAL, "its id or address is not host:port-like", m.id);
    uint64_t now = kv__now_ms();
    ssize_t at = find_member(ms, m.id);
    struct mentry *e = at >= 0 ? &ms->mem[at] : NULL;
    int owner = e && ((has && secret_eq(e->secret, secret)) || !e->owned);
    int stale = e && now - e->last_ms > ms->cfg->cluster.node_ttl_ms;
    int restart = e && !owner && !stale && c->h.type == KV_MSG_JOIN &&
                  (m.flags & KV_MEMBER_OWNER) && strcmp(e->m.addr, m.addr) == 0 &&
                  addr_is_from(m.addr, c->ip);
    const uint8_t *give = NULL;
    /* A LEAVE for an id not in the view changes nothing and is answered
     * with the view like any other: kv_members (net/members.c) reads the
     * view that way without joining. Keep it so. */
    if (c->h.type == KV_MSG_LEAVE) {
        if (e && !owner)
            return refuse(ms, c, KV_EPERM, "not the member's own (no or wrong secret)", m.id);
        if (e) {
            ms->mem[at] = ms->mem[--ms->n];
            ms->version++;
            KV_INFO("kvmaster: %s left (view %llu, %zu members)", m.id,
                    (unsigned long long)ms->version, ms->n);
        }
    } else if (e && !owner && !stale && !restart) {
        if (!kv__member_same_place(&e->m, &m))
            return refuse(ms, c, KV_EBUSY, "the record is a live member's, changed only by it",
                          m.id);
        /* answered, not refreshed: the record still ages as its owner's */
    } else if (e && owner) {
        if (!same_record(&e->m, &m) && view_bytes_with(ms, at, &m) > MASTER_VIEW_BYTES)
            return refuse(ms, c, KV_ENOSPC, "the view is full (its VIEW would pass 4 MiB)",
                          m.id);
        /* Every heartbeat brings the member's figures (kvctl members):
         * kept, but only a change of place is a new view. */
        if (!same_record(&e->m, &m)) {
            if (!kv__member_same_place(&e->m, &m))
                ms->version++;
            e->m = m;
            ms->vvalid = 0;   /* the cached VIEW holds the old figures */
        }
        e->last_ms = now;
    } else {
        if (getrandom(fresh, sizeof fresh, 0) != (ssize_t)sizeof fresh) {
            KV_WARN("kvmaster: no random bytes for a member secret: %s", strerror(errno));
            return 1;
        }
        give = c->h.flags & KV_HDR_SECRET ? fresh : NULL;
        if (e) {
            KV_INFO("kvmaster: %s claimed afresh at %s (%s, its owner silent %llu ms)", m.id,
                    m.addr, restart ? "restarted on its own address" : "its TTL passed",
                    (unsigned long long)(now - e->last_ms));
            if (!kv__member_same_place(&e->m, &m))
                ms->version++;
        } else {
            if (ms->n >= KV_PROTO_VIEW_MAX || view_bytes_with(ms, -1, &m) > MASTER_VIEW_BYTES)
                return refuse(ms, c, KV_ENOSPC, "the view is full (4096 records or 4 MiB)", m.id);
            size_t mine = 0;
            for (size_t i = 0; i < ms->n; i++)
                mine += ms->mem[i].ip == c->ip;
            if (mine >= KV__MASTER_PER_HOST)
                return refuse(ms, c, KV_ENOSPC, "its host has created 1024 records", m.id);
            if (ms->n == ms->cap) {
                size_t nc = ms->cap ? ms->cap * 2 : 16;
                struct mentry *p = realloc(ms->mem, nc * sizeof *p);
                if (!p)
                    return 1;
                ms->mem = p;
                ms->cap = nc;
            }
            e = &ms->mem[ms->n++];
            e->m = m;
            ms->version++;
            view_append_cached(ms);
            KV_INFO("kvmaster: %s joined at %s%s (view %llu, %zu members)", m.id, m.addr,
                    (m.flags & KV_MEMBER_OWNER) ? "" : " as a client",
                    (unsigned long long)ms->version, ms->n);
        }
        e->m = m;
        e->last_ms = now;
        e->owned = give != NULL;
        e->ip = c->ip;
        memcpy(e->secret, fresh, sizeof fresh);
    }
    return send_view(ms, c->fd, c->h.req_id, give) != KV_OK;
}

/* Reads into p[*got..want) what fd has: 1 once all of it is there, 0 when
 * fd would block first, -1 when the peer is gone or the read failed. */
static int recv_some(int fd, uint8_t *p, size_t want, size_t *got)
{
    while (*got < want) {
        ssize_t r = recv(fd, p + *got, want - *got, 0);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        *got += (size_t)r;
    }
    return 1;
}

/* One message of the challenge-response is in abuf: answers it; nonzero
 * means drop the connection. The answers are a few bytes, which a fresh
 * socket's buffer always takes. */
static int master_auth(struct master *ms, struct mconn *c)
{
    const char *token = ms->cfg->cluster.token;
    uint64_t dl = kv__now_ms() + MASTER_SEND_MS;
    if (c->astage == 0) {
        uint8_t reply[KV__AUTH_REPLY_LEN];
        if (kv__auth_reply(token, c->abuf, &c->auth, reply) != KV_OK) {
            KV_WARN("kvmaster: a peer did not open with the challenge-response; closing");
            return 1;
        }
        c->astage = 1;
        return kv__sock_xfer1(c->fd, reply, sizeof reply, 1, dl) != KV_OK;
    }
    uint8_t verdict = (uint8_t)kv__auth_proof_ok(token, &c->auth, c->abuf);
    if (kv__sock_xfer1(c->fd, &verdict, 1, 1, dl) != KV_OK)
        return 1;
    if (!verdict) {
        KV_WARN("kvmaster: refused a connection: it did not prove the cluster token");
        return 1;
    }
    c->authed = 1;
    ms->nunauth--;
    return 0;
}

/* Reads what is there; nonzero means drop the connection. */
static int master_read(struct master *ms, struct mconn *c)
{
    for (;;) {
        if (!c->authed) {
            size_t had = c->got;
            size_t want = c->astage == 0 ? KV__AUTH_HELLO_LEN : KV__AUTH_PROOF_LEN;
            int r = recv_some(c->fd, c->abuf, want, &c->got);
            if (had == 0 && c->got > 0)
                c->frame_ms = kv__now_ms();
            if (r <= 0)
                return r < 0;
            c->got = 0;
            if (master_auth(ms, c))
                return 1;
            continue;
        }
        if (!c->in_body) {
            size_t had = c->got;
            int r = recv_some(c->fd, c->hdr, KV_PROTO_HDR_LEN, &c->got);
            /* A frame's clock starts at its first byte. */
            if (had == 0 && c->got > 0)
                c->frame_ms = kv__now_ms();
            if (r <= 0)
                return r < 0;
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
        int r = recv_some(c->fd, c->body, c->h.body_len, &c->got);
        if (r <= 0)
            return r < 0;
        int rc = master_serve(ms, c);
        free(c->body);
        c->body = NULL;
        c->got = 0;
        c->in_body = 0;
        if (rc)
            return 1;
    }
}

/* Drops connections that have not authenticated within KV__MASTER_FRAME_MS
 * of connecting, or sit on half a frame for as long. */
static void master_reap(struct master *ms)
{
    uint64_t now = kv__now_ms();
    for (size_t i = ms->nconns; i-- > 0;) {
        struct mconn *c = &ms->conns[i];
        int mid = c->got > 0 || c->in_body;
        if ((!c->authed && now - c->born_ms > KV__MASTER_FRAME_MS) ||
            (mid && now - c->frame_ms > KV__MASTER_FRAME_MS))
            mconn_drop(ms, i);
    }
}

/* Closes the oldest connection that has not authenticated; 1 if any. */
static int evict_unauth(struct master *ms)
{
    size_t old = SIZE_MAX;
    for (size_t i = 0; i < ms->nconns; i++)
        if (!ms->conns[i].authed && (old == SIZE_MAX ||
                                     ms->conns[i].born_ms < ms->conns[old].born_ms))
            old = i;
    if (old != SIZE_MAX)
        mconn_drop(ms, old);
    return old != SIZE_MAX;
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

static int master_run(const kv_config *cfg, volatile int *stop, char *err, size_t errlen)
{

    /* The exposure check passes a bad address on to the listener, which
     * names it. */
    int lfd, rc = kv__net_check_exposure("cluster.master", cfg->cluster.master,
                                         cfg->cluster.token, cfg->cluster.insecure, err, errlen);
    if (rc != KV_OK)
        return rc;
    if ((rc = kv__sock_listen("cluster.master", cfg->cluster.master, 128, &lfd, NULL, 0, err,
                              errlen)) != KV_OK)
        return rc;
    struct master *ms = calloc(1, sizeof *ms);
    if (!ms) {
        close(lfd);
        return KV_ENOMEM;
    }
    ms->cfg = cfg;
    ms->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
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
        if (ms->spare_fd >= 0)
            close(ms->spare_fd);
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
                while ((fd = kv__sock_accept(lfd)) >= 0) {
                    if (ms->nunauth >= KV__MASTER_UNAUTH_MAX ||
                        ms->nconns >= MASTER_CONNS_MAX)
                        evict_unauth(ms);
                    if (ms->nconns >= MASTER_CONNS_MAX) {
                        close(fd);
                        continue;
                    }
                    struct sockaddr_in pa;
                    socklen_t pl = sizeof pa;
                    uint32_t ip = getpeername(fd, (struct sockaddr *)&pa, &pl) == 0 &&
                                          pl == sizeof pa ? pa.sin_addr.s_addr : 0;
                    ms->conns[ms->nconns++] = (struct mconn){ .fd = fd, .ip = ip,
                                                              .born_ms = kv__now_ms() };
                    ms->nunauth++;
                }
                /* Out of descriptors: make room, and take the waiting peer
                 * off the listening socket so poll() does not spin on it. */
                if (errno == EMFILE || errno == ENFILE) {
                    evict_unauth(ms);
                    kv__net_refuse_one(lfd, &ms->spare_fd);
                }
            }
        }
        master_reap(ms);
        master_expire(ms);
    }
    while (ms->nconns)
        mconn_drop(ms, 0);
    if (ms->spare_fd >= 0)
        close(ms->spare_fd);
    free(pf);
    free(ms->mem);
    free(ms->vbuf);
    free(ms);
    close(lfd);
    KV_INFO("kvmaster: stopped");
    return KV_OK;
}

KV__EXPORT int kv_master_run(const kv_config *cfg, volatile int *stop, char *err, size_t errlen)
{
    if (!cfg || !stop)
        return KV_EINVAL;
    kv__log_set_level(cfg->log.level);
    /* Our own copy, with the token in effect (its file, the environment). */
    struct kv_config *own = malloc(sizeof *own);
    if (!own)
        return KV_ENOMEM;
    *own = *cfg;
    int rc = kv__auth_token(cfg, own->cluster.token, err, errlen);
    if (rc == KV_OK)
        rc = master_run(own, stop, err, errlen);
    memset(own->cluster.token, 0, sizeof own->cluster.token);
    free(own);
    return rc;
}

/* ---- the client --------------------------------------------------------- */

struct kv__mclient {
    pthread_mutex_t lock;
    char addr[KV_CFG_STR];
    char token[KV_CFG_STR];
    unsigned timeout_ms;
    int fd;
    uint64_t next_id;
    /* The secret of the record this client created (master.c's ownership
     * rule), for the id it was given to. */
    char secret_id[KV_PROTO_ID_MAX + 1];
    uint8_t secret[KV_PROTO_SECRET_LEN];
    int has_secret;
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

/* Connects and runs the challenge-response: the master proves the token
 * first (KV_EPERM when it cannot, or when it refuses our proof). */
static int mc_connect(struct kv__mclient *m, uint64_t deadline)
{
    struct sockaddr_in sa;
    kv__net_parse_addr(m->addr, &sa);   /* checked when m was made */
    int rc = kv__sock_connect(&sa, deadline, &m->fd);
    if (rc == KV_OK && (rc = kv__auth_client(m->fd, m->token, deadline)) != KV_OK) {
        close(m->fd);
        m->fd = -1;
    }
    return rc;
}

static int mc_call(struct kv__mclient *m, uint8_t type, const struct kv__member *self,
                   uint64_t *version, struct kv__member **members, size_t *n)
{
    uint8_t buf[KV_PROTO_HDR_LEN + 2 + KV_PROTO_ID_MAX + sizeof(struct kv__member) + 64 +
                KV_PROTO_SECRET_LEN];
    struct kv__member me = *self;
    me.lease = 0;
    if (kv__member_sign(m->token, &me) != KV_OK)
        return KV_EINVAL;
    int blen = kv__join_encode(&me, buf + KV_PROTO_HDR_LEN,
                               sizeof buf - KV_PROTO_HDR_LEN - KV_PROTO_SECRET_LEN);
    if (blen < 0)
        return KV_EINVAL;
    int mine = m->has_secret && strcmp(m->secret_id, self->id) == 0;
    if (mine) {
        memcpy(buf + KV_PROTO_HDR_LEN + blen, m->secret, KV_PROTO_SECRET_LEN);
        blen += KV_PROTO_SECRET_LEN;
    }
    uint64_t deadline = kv__now_ms() + m->timeout_ms;
    int rc = KV_OK;
    if (m->fd < 0 && (rc = mc_connect(m, deadline)))
        return rc;
    uint64_t id = m->next_id++;
    struct kv__hdr h = { .type = type, .body_len = (uint32_t)blen, .req_id = id,
                         .flags = KV_HDR_SECRET };
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
        rc = h.status == KV_EPERM || h.status == KV_EBUSY || h.status == KV_ENOSPC ||
                     h.status == KV_EINVAL ? h.status : KV_EPROTO;
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
    uint8_t secret[KV_PROTO_SECRET_LEN];
    int has = 0;
    if ((rc = kv__view_decode_secret(body, h.body_len, &v, &list, &cnt, secret, &has)))
        goto fail;
    free(body);
    /* Only records their members signed (the master cannot make one up). */
    size_t keep = 0;
    for (size_t i = 0; i < cnt; i++) {
        if (kv__member_verify(m->token, &list[i]) && kv__member_sane(&list[i]))
            list[keep++] = list[i];
        else
            KV_WARN("kvmaster client: a record for '%s' in the view fails its MAC; ignored",
                    list[i].id);
    }
    cnt = keep;
    if (has && type == KV_MSG_JOIN) {
        snprintf(m->secret_id, sizeof m->secret_id, "%s", self->id);
        memcpy(m->secret, secret, sizeof secret);
        m->has_secret = 1;
    } else if (mine && type == KV_MSG_LEAVE) {
        m->has_secret = 0;      /* the record is gone */
    }
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

/* How long a JOIN keeps asking while the master says the record is a live
 * member's (KV_EBUSY): a node restarted on its old address gets its id
 * back at once (master_serve), so this only rides out a short TTL (tests,
 * small node_ttl_ms); a second live node using the id is refused. */
#define MC_BUSY_RETRY_MS 2500

int kv__mclient_join(struct kv__mclient *m, const struct kv__member *self, uint64_t *version,
                     struct kv__member **members, size_t *n)
{
    uint64_t t0 = kv__now_ms();
    pthread_mutex_lock(&m->lock);
    int rc;
    while ((rc = mc_call(m, KV_MSG_JOIN, self, version, members, n)) == KV_EBUSY &&
           kv__now_ms() - t0 < MC_BUSY_RETRY_MS)
        usleep(50000);
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
