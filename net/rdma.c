/*
 * rdma.c — the rdma transport: libibverbs RC queue pairs, one-sided RDMA
 * READ / WRITE against the server's registered segment, and small RPCs on
 * a TCP side channel.
 *
 * Key design choice: the TCP connection that carries the RPCs also sets the
 * queue pair up (an out-of-band handshake swapping QPN, LID, GID, PSN and
 * MTU, then the server's memory-region table). librdmacm is not used: it
 * would add a second connection manager for what is one request and one
 * answer here, and it binds libibverbs symbols a test stand-in need not
 * have. A batch then goes:
 *
 *   PREP      one RPC: the server pins each load's value (backend->pin) and
 *             reserves room for each dump (backend->reserve) and answers
 *             (status, addr, len, handle) per item; lookups and sizes are
 *             answered on the spot.
 *   transfer  the client checks every (addr, len) against the server's
 *             region table, cuts it at region boundaries and RDMA READs
 *             loads into / WRITEs dumps from the caller's memory: directly
 *             when it lies in a buffer registered with register_buffer,
 *             else through a per-connection registered bounce buffer.
 *   RELEASE   (loads, no answer) unpins; COMMIT (dumps) commits each
 *             reservation that was written, aborts the rest.
 *
 * Values the server cannot hand out by address (not DRAM-resident, i.e. on
 * SSD, or held outside the registered segment) are answered "fall back",
 * and those items travel in a plain BATCH frame on the same channel, with
 * the bytes inline, exactly as on tcp.
 *
 * Failures: an error completion fails the items whose bytes it carried
 * (KV_EIO); the queue pair is then in the error state, so the client sets
 * up a fresh pair over the same channel and re-posts the work requests
 * that were only flushed. A dead channel, a timeout or a malformed frame
 * is a connection error (the caller closes the conn); the server releases
 * every pin and reservation a connection held when it goes.
 *
 * Deadlines: a batch has io.timeout_ms plus its bytes at the floor rate of
 * serve.h; the server gives each frame the same to arrive and be answered,
 * and drops a connection that sits on pins or reservations for twice the
 * timeout, or holds any one of them past its lifetime (twice the timeout
 * plus its bytes at the floor), whatever other frames it sends meanwhile.
 *
 * Integrity: a value is READ only while the server holds it pinned (from
 * PREP to RELEASE), and values are never rewritten in place; on top of
 * that, PREP's answer carries the XXH3-64 of the pinned bytes, and the
 * client checks it over what the READs landed, so a torn, recycled or
 * misplaced read fails its item (KV_ECORRUPT, counted in
 * checksum_failures) instead of returning other bytes. A BATCH's inline
 * loads end with their sums as on tcp (proto.h). A WRITE lands in a
 * reservation nobody else can see until COMMIT.
 *
 * The side channel opens with auth.h's challenge-response (the server
 * proves the token first; the token never crosses the wire).
 *
 * Exposure: the segment is registered once with remote read and write
 * access, as Mooncake does, so a peer that passed the token check could
 * RDMA anywhere in it; bounds are enforced by the device against the
 * region, not per value. Memory windows per reservation would narrow that.
 *
 * No device: ibv_get_device_list returns NULL (ENOSYS when no RDMA driver
 * is loaded). probe() says 0 and create() returns KV_ENOTSUP, each with a
 * log line, so protocol auto falls back to tcp.
 *
 * Threads: the server runs an accept thread and one thread per connection
 * (a connection is busy only while its client waits on it). Client conns
 * are used by one thread at a time; registered buffers are shared under a
 * read-write lock, held by a batch for as long as it uses them.
 *
 * Environment: KV_RDMA_GID_INDEX picks the GID table entry (default 0; on
 * RoCE v2 fabrics the IPv4-mapped entry is often 1 or 3).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "auth.h"
#include "proto.h"
#include "serve.h"
#include "sock.h"
#include "transport.h"

/* RDMA message types (proto.h leaves 32..63 to this file). None carries
 * data: value bytes go by RDMA, or inline in a plain BATCH frame. */
enum {
    MSG_QP = KV_MSG_RDMA_FIRST,  /* qp info                              c->s */
    MSG_QP_R,                    /* qp info, nseg u32, nseg x seg        s->c */
    MSG_PREP,                    /* BATCH body                           c->s */
    MSG_PREP_R,                  /* BATCH_R body                         s->c */
    MSG_RELEASE,                 /* count u32, count x handle u64 (no answer) */
    MSG_COMMIT,                  /* count u32, count x (handle u64, action u8, pad[7]) */
    MSG_COMMIT_R,                /* BATCH_R body: status per item        s->c */
};

#define QPINFO_LEN   28          /* qpn u32 psn u32 lid u16 mtu u8 pad u8 gid[16] */
#define SEG_WIRE_LEN 20          /* base u64 len u64 rkey u32 */
#define COMMIT_ITEM  16
#define SEG_MAX      65536       /* regions a client accepts from a server */
#define CHUNK_ITEMS  1024        /* items per PREP */
#define HANDLES_MAX  (4 * CHUNK_ITEMS)   /* outstanding per connection */
#define WAVE_MAX     64          /* work requests in flight */
#define BOUNCE_LEN   (4u << 20)
#define BOUNCE_PIECE (1u << 20)
#define PIECE_MAX    (1u << 30)
#define DISCARD_LEN  (64u << 10)
/* Connections (each a thread) a server holds: a pooled client keeps a few
 * per node, so this is far above a healthy cluster's need. */
#define KV__RDMA_CONNS_MAX 1024

enum { ACT_COMMIT = 1, ACT_ABORT = 2 };

struct seg { uint64_t base, len; uint32_t rkey; };

struct qpinfo {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t mtu;
    uint8_t gid[16];
};

/* A client buffer registered with register_buffer (split like the segment). */
struct cbuf {
    struct cbuf *next;
    uint8_t *addr;
    size_t len, chunk;
    int nmr;
    struct ibv_mr **mr;
};

struct sconn;

struct rdma {
    struct kv__transport_base base;
    struct kv__net_opts o;
    struct kv__backend *be;
    struct kv__serve serve;     /* the policy, and the node's budgets */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_device_attr dev;
    struct ibv_port_attr port;
    union ibv_gid gid;
    int gid_index;
    /* server: the backend's segment, registered in chunks */
    int nseg;
    struct seg *seg;
    struct ibv_mr **segmr;
    /* client: registered caller buffers */
    pthread_rwlock_t buf_lock;
    struct cbuf *bufs;
    /* server threads */
    int lfd;
    int spare_fd;           /* given up to refuse a peer at EMFILE */
    pthread_t accept_th;
    int accepting;
    pthread_mutex_t lock;
    pthread_cond_t gone;
    struct sconn *conns;
    int nconns;
    _Atomic int stopping;
    char id[64];
};

struct handle {
    uint32_t gen;           /* odd while in use */
    uint8_t kind;           /* KV_OP_LOAD: a pin; KV_OP_DUMP: a reservation */
    struct kv__wire_req q;  /* the item it was made for (a commit's) */
    uint64_t expires_ms;    /* given back (with the connection) after this */
    kv__pin pin;
    kv__resv resv;
};

struct sconn {
    struct sconn *prev, *next;
    struct rdma *r;
    int fd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct handle *h;
    uint32_t nh, live;      /* slots, and pins + reservations held */
    uint64_t deadline;      /* for the frame being served */
    uint8_t *discard;
};

struct cconn {
    struct rdma *r;
    int fd;
    uint64_t next_id;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    int qp_ok;
    struct seg *seg;        /* the server's regions, sorted, disjoint */
    uint32_t nseg;
    uint8_t *bounce;
    struct ibv_mr *bmr;
    uint32_t blen, bpiece;  /* bounce size, and the most one piece takes */
};

/* Extra time for bytes moved, at the floor rate of serve.h, so that a large
 * batch on a slow path is not cut off while a dead peer still fails in one
 * timeout. */
static uint64_t bytes_ms(uint64_t bytes) { return kv__net_floor_ms(bytes); }

/* Sends a header and a body in one write. */
static int send_frame(int fd, uint8_t type, uint64_t req_id, int status, const void *body,
                      size_t blen, uint64_t data_len, uint64_t deadline)
{
    uint8_t hb[KV_PROTO_HDR_LEN];
    struct kv__hdr h = { .type = type, .req_id = req_id, .status = status,
                         .body_len = (uint32_t)blen, .data_len = data_len };
    kv__hdr_encode(&h, hb);
    struct iovec v[2] = { { hb, sizeof hb }, { (void *)body, blen } };
    return kv__sock_xfer(fd, v, 2, 1, deadline);
}

/* Reads a header and its body (malloc'd into *body, at most max_body). */
static int recv_frame(int fd, uint64_t max_data, size_t max_body, struct kv__hdr *h,
                      uint8_t **body, uint64_t deadline)
{
    uint8_t hb[KV_PROTO_HDR_LEN];
    *body = NULL;
    int rc = kv__sock_xfer1(fd, hb, sizeof hb, 0, deadline);
    if (rc)
        return rc;
    if (kv__hdr_decode(hb, max_data, h) || h->body_len > max_body)
        return KV_EPROTO;
    *body = malloc(h->body_len ? h->body_len : 1);
    if (!*body)
        return KV_ENOMEM;
    if ((rc = kv__sock_xfer1(fd, *body, h->body_len, 0, deadline))) {
        free(*body);
        *body = NULL;
    }
    return rc;
}

/* ---- device and queue pairs ------------------------------------------- */

/* The device named name ("" = the first), from a list the caller frees. */
static struct ibv_device *find_device(struct ibv_device **l, const char *name)
{
    for (int i = 0; l && l[i]; i++)
        if (!name[0] || strcmp(ibv_get_device_name(l[i]), name) == 0)
            return l[i];
    return NULL;
}

static int rdma_probe(const struct kv__net_opts *o)
{
    static _Atomic int said;
    int n = 0;
    errno = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    if (!l) {
        if (!atomic_exchange(&said, 1))
            KV_INFO("rdma: no RDMA device (ibv_get_device_list: %s%s)", strerror(errno),
                    errno == ENOSYS ? ": no RDMA driver in this kernel" : "");
        return 0;
    }
    int found = find_device(l, o->device_name) != NULL;
    if (!found && !atomic_exchange(&said, 1))
        KV_INFO("rdma: %s", o->device_name[0] ? "cluster.device_name not found"
                                               : "no RDMA device");
    ibv_free_device_list(l);
    return found;
}

static enum ibv_mtu mtu_min(enum ibv_mtu a, enum ibv_mtu b) { return a < b ? a : b; }

static void qp_destroy(struct ibv_qp **qp, struct ibv_cq **cq)
{
    if (*qp)
        ibv_destroy_qp(*qp);
    if (*cq)
        ibv_destroy_cq(*cq);
    *qp = NULL;
    *cq = NULL;
}

/* A CQ and an RC QP, moved to INIT with the given remote access. */
static int qp_create(struct rdma *r, int depth, unsigned access, struct ibv_cq **cq,
                     struct ibv_qp **qp)
{
    *qp = NULL;
    *cq = ibv_create_cq(r->ctx, depth, NULL, NULL, 0);
    if (!*cq)
        goto fail;
    struct ibv_qp_init_attr ia = {
        .send_cq = *cq, .recv_cq = *cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = (uint32_t)depth, .max_recv_wr = 1,
                 .max_send_sge = 1, .max_recv_sge = 1 },
    };
    *qp = ibv_create_qp(r->pd, &ia);
    if (!*qp)
        goto fail;
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
                             .qp_access_flags = access };
    if (ibv_modify_qp(*qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                               IBV_QP_ACCESS_FLAGS))
        goto fail;
    return KV_OK;
fail:
    KV_WARN("rdma: cannot create a queue pair: %s", strerror(errno));
    qp_destroy(qp, cq);
    return KV_ENOMEM;
}

static void qpinfo_local(struct rdma *r, struct ibv_qp *qp, struct qpinfo *q)
{
    memset(q, 0, sizeof *q);
    q->qpn = qp->qp_num;
    q->psn = (uint32_t)((kv__now_ns() ^ ((uint64_t)qp->qp_num << 8)) & 0xffffff);
    q->lid = r->port.lid;
    q->mtu = (uint8_t)r->port.active_mtu;
    memcpy(q->gid, r->gid.raw, 16);
}

static void qpinfo_encode(const struct qpinfo *q, uint8_t *p)
{
    kv__put32(p, q->qpn);
    kv__put32(p + 4, q->psn);
    kv__put16(p + 8, q->lid);
    p[10] = q->mtu;
    p[11] = 0;
    memcpy(p + 12, q->gid, 16);
}

static int qpinfo_decode(const uint8_t *p, struct qpinfo *q)
{
    q->qpn = kv__get32(p);
    q->psn = kv__get32(p + 4);
    q->lid = kv__get16(p + 8);
    q->mtu = p[10];
    memcpy(q->gid, p + 12, 16);
    if (q->qpn > 0xffffff || q->psn > 0xffffff || q->mtu < IBV_MTU_256 || q->mtu > IBV_MTU_4096)
        return KV_EPROTO;
    return KV_OK;
}

/* INIT -> RTR -> RTS towards the peer. */
static int qp_connect(struct rdma *r, struct ibv_qp *qp, uint32_t my_psn, const struct qpinfo *peer)
{
    /* READs in flight: as responder (rd) and as initiator (ird). */
    int rd = r->dev.max_qp_rd_atom < 1 ? 1 : r->dev.max_qp_rd_atom > 16 ? 16 : r->dev.max_qp_rd_atom;
    int ird = r->dev.max_qp_init_rd_atom < 1 ? 1 : r->dev.max_qp_init_rd_atom > 16
                                                   ? 16 : r->dev.max_qp_init_rd_atom;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu_min(r->port.active_mtu, (enum ibv_mtu)peer->mtu),
        .dest_qp_num = peer->qpn, .rq_psn = peer->psn,
        .max_dest_rd_atomic = (uint8_t)rd, .min_rnr_timer = 12,
        .ah_attr = { .dlid = peer->lid, .port_num = 1 },
    };
    /* RoCE (and any peer without a LID) is reached by GID, through a GRH. */
    if (r->port.link_layer == IBV_LINK_LAYER_ETHERNET || peer->lid == 0) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)r->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (!e) {
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = my_psn;
        a.max_rd_atomic = (uint8_t)ird;
        e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    }
    if (e) {
        KV_WARN("rdma: cannot connect a queue pair: %s", strerror(e));
        return KV_ENET;
    }
    return KV_OK;
}

/* Registers [addr, addr+len) as ceil(len / chunk) regions. */
static int reg_chunks(struct rdma *r, void *addr, size_t len, unsigned access,
                      struct ibv_mr ***out, int *nout, size_t *chunk_out)
{
    size_t chunk = r->dev.max_mr_size ? (size_t)r->dev.max_mr_size : len;
    long pg = sysconf(_SC_PAGESIZE);
    if (chunk < len)
        chunk -= chunk % (size_t)pg;
    if (chunk == 0 || chunk > len)
        chunk = len;
    int n = (int)((len + chunk - 1) / chunk);
    struct ibv_mr **mr = calloc((size_t)n, sizeof *mr);
    if (!mr)
        return KV_ENOMEM;
    for (int i = 0; i < n; i++) {
        size_t off = (size_t)i * chunk, l = len - off < chunk ? len - off : chunk;
        mr[i] = ibv_reg_mr(r->pd, (uint8_t *)addr + off, l, (int)access);
        if (!mr[i]) {
            KV_ERROR("rdma: ibv_reg_mr(%zu bytes): %s", l, strerror(errno));
            while (i--)
                ibv_dereg_mr(mr[i]);
            free(mr);
            return KV_ENOMEM;
        }
    }
    *out = mr;
    *nout = n;
    *chunk_out = chunk;
    return KV_OK;
}

/* ---- server ------------------------------------------------------------ */

static int in_segment(struct rdma *r, const void *p, uint64_t len)
{
    if (!r->nseg || !p)
        return 0;
    uint64_t a = (uintptr_t)p, base = r->seg[0].base, end = r->seg[r->nseg - 1].base +
                                                           r->seg[r->nseg - 1].len;
    return a >= base && len <= end - a && a <= end;
}

static uint64_t handle_new(struct sconn *sc, uint8_t kind, const struct kv__wire_req *q)
{
    uint32_t slot = UINT32_MAX;
    for (uint32_t i = 0; i < sc->nh && slot == UINT32_MAX; i++)
        if (!(sc->h[i].gen & 1))
            slot = i;
    if (slot == UINT32_MAX) {
        if (sc->nh >= HANDLES_MAX)
            return 0;
        uint32_t n = sc->nh ? sc->nh * 2 : 64;
        struct handle *h = realloc(sc->h, n * sizeof *h);
        if (!h)
            return 0;
        memset(h + sc->nh, 0, (n - sc->nh) * sizeof *h);
        sc->h = h;
        slot = sc->nh;
        sc->nh = n;
    }
    struct handle *h = &sc->h[slot];
    h->gen++;
    sc->live++;
    h->kind = kind;
    h->q = *q;
    /* A pin or reservation lives as long as an honest client needs to
     * move its bytes and say RELEASE / COMMIT: the quiet limit plus the
     * bytes at the floor rate. Other frames in between (a no-op PREP) do
     * not extend it. */
    h->expires_ms = kv__now_ms() + 2ull * sc->r->o.timeout_ms + kv__net_floor_ms(q->len);
    return (uint64_t)h->gen << 32 | slot;
}

/* When the first of the connection's pins and reservations expires. */
static uint64_t handles_expire(const struct sconn *sc)
{
    uint64_t t = UINT64_MAX;
    for (uint32_t i = 0; sc->live && i < sc->nh; i++)
        if ((sc->h[i].gen & 1) && sc->h[i].expires_ms < t)
            t = sc->h[i].expires_ms;
    return t;
}

static struct handle *handle_get(struct sconn *sc, uint64_t hv, uint8_t kind)
{
    uint32_t slot = (uint32_t)hv, gen = (uint32_t)(hv >> 32);
    if (slot >= sc->nh || !(gen & 1) || sc->h[slot].gen != gen || sc->h[slot].kind != kind)
        return NULL;
    return &sc->h[slot];
}

static void handle_free(struct sconn *sc, struct handle *h)
{
    h->gen++;
    sc->live--;
}

/* Answers one PREP item: pin / reserve and hand out an address, or say
 * "fall back" (status OK, rkey 0, handle 0). */
static void prep_item(struct sconn *sc, const struct kv__wire_req *q, struct kv__wire_resp *o)
{
    struct rdma *r = sc->r;
    struct kv__backend *be = r->be;
    memset(o, 0, sizeof *o);
    switch (q->kind) {
    case KV_OP_LOOKUP:
    case KV_OP_SIZE:
    case KV_OP_REMOVE:
    case KV_OP_CLEAR:
        kv__serve_query(&r->serve, q, o);
        return;
    case KV_OP_LOAD: {
        const void *d;
        uint64_t len;
        kv__pin pin;
        int rc = kv__serve_pin(&r->serve, q, &d, &len, &pin);
        /* Not in DRAM (a value on SSD) or outside the registered segment:
         * fall back, and BATCH copies it. */
        if (rc == KV__SERVE_COPY || (rc == KV_OK && !in_segment(r, d, len))) {
            if (rc == KV_OK)
                be->unpin(be->ctx, &pin);
            return;
        }
        if (rc != KV_OK) {
            o->status = rc;
            return;
        }
        uint64_t hv = handle_new(sc, KV_OP_LOAD, q);
        if (!hv) {
            be->unpin(be->ctx, &pin);
            return;                     /* table full: fall back */
        }
        sc->h[(uint32_t)hv].pin = pin;
        *o = (struct kv__wire_resp){ .status = KV_OK, .len = len, .addr = (uintptr_t)d,
                                     .rkey = r->seg[0].rkey, .handle = hv,
                                     .sum = kv__sum(d, len) };
        return;
    }
    case KV_OP_DUMP: {
        if (!be->reserve || q->len == 0 || !r->nseg) {
            uint64_t len;
            o->hit = !(q->flags & KV_WIRE_REPLACE) &&
                     be->size(be->ctx, q->ns, &q->id, q->index, &len) == KV_OK;
            return;                     /* stored (hit), or fall back */
        }
        struct kv__serve_dump d;
        kv__serve_dump_begin(&r->serve, q, 0, &d);
        if (d.how == KV__DUMP_SKIP) {
            o->hit = 1;                 /* already stored: nothing to send */
            return;
        }
        if (d.how != KV__DUMP_RESV) {
            o->status = d.status;
            return;
        }
        uint64_t hv = in_segment(r, d.resv.data, d.resv.len) ? handle_new(sc, KV_OP_DUMP, q) : 0;
        if (!hv) {
            kv__serve_dump_abort(&r->serve, &d);
            return;
        }
        sc->h[(uint32_t)hv].resv = d.resv;
        *o = (struct kv__wire_resp){ .status = KV_OK, .len = q->len,
                                     .addr = (uintptr_t)d.resv.data,
                                     .rkey = r->seg[0].rkey, .handle = hv };
        return;
    }
    }
}

static int on_prep(struct sconn *sc, const struct kv__hdr *h, const uint8_t *body)
{
    size_t n;
    if (kv__batch_count(body, h->body_len, KV_PROTO_REQ_ITEM, &n) || n > CHUNK_ITEMS)
        return KV_EPROTO;
    struct kv__wire_req *q = malloc((n ? n : 1) * sizeof *q);
    struct kv__wire_resp *o = malloc((n ? n : 1) * sizeof *o);
    size_t blen = kv__batch_r_body_len(n);
    uint8_t *out = malloc(blen);
    int rc = KV_ENOMEM;
    if (q && o && out && (rc = kv__batch_decode(body, h->body_len, q, &n)) == KV_OK) {
        for (size_t i = 0; i < n; i++)
            prep_item(sc, &q[i], &o[i]);
        kv__batch_r_encode(o, n, out, blen);
        rc = send_frame(sc->fd, MSG_PREP_R, h->req_id, KV_OK, out, blen, 0, sc->deadline);
    }
    free(q);
    free(o);
    free(out);
    return rc;
}

static int on_release(struct sconn *sc, const struct kv__hdr *h, const uint8_t *body)
{
    size_t n;
    if (kv__batch_count(body, h->body_len, 8, &n))
        return KV_EPROTO;
    for (size_t i = 0; i < n; i++) {
        struct handle *e = handle_get(sc, kv__get64(body + 4 + 8 * i), KV_OP_LOAD);
        if (!e)
            return KV_EPROTO;
        sc->r->be->unpin(sc->r->be->ctx, &e->pin);
        handle_free(sc, e);
    }
    return KV_OK;
}

static int on_commit(struct sconn *sc, const struct kv__hdr *h, const uint8_t *body)
{
    size_t n;
    if (kv__batch_count(body, h->body_len, COMMIT_ITEM, &n))
        return KV_EPROTO;
    struct kv__backend *be = sc->r->be;
    struct kv__wire_resp *o = calloc(n ? n : 1, sizeof *o);
    size_t blen = kv__batch_r_body_len(n);
    uint8_t *out = malloc(blen);
    int rc = KV_ENOMEM;
    if (o && out) {
        rc = KV_OK;
        for (size_t i = 0; i < n && rc == KV_OK; i++) {
            const uint8_t *p = body + 4 + COMMIT_ITEM * i;
            struct handle *e = handle_get(sc, kv__get64(p), KV_OP_DUMP);
            if (!e || (p[8] != ACT_COMMIT && p[8] != ACT_ABORT)) {
                rc = KV_EPROTO;
                break;
            }
            if (p[8] == ACT_COMMIT) {
                o[i].status = kv__serve_commit(&sc->r->serve, &e->q, &e->resv);
            } else {
                be->abort(be->ctx, &e->resv);
                o[i].status = KV_EIO;
            }
            handle_free(sc, e);
        }
        if (rc == KV_OK) {
            kv__batch_r_encode(o, n, out, blen);
            rc = send_frame(sc->fd, MSG_COMMIT_R, h->req_id, KV_OK, out, blen, 0, sc->deadline);
        }
    }
    free(o);
    free(out);
    return rc;
}

/* A plain BATCH, as tcp serves it: dump bytes inline in the request, load
 * bytes inline in the answer. The fallback for what RDMA cannot reach. */
static int on_batch(struct sconn *sc, const struct kv__hdr *h, const uint8_t *body)
{
    struct kv__serve *sv = &sc->r->serve;
    struct kv__serve_out out = { 0 };
    size_t n;
    if (kv__batch_count(body, h->body_len, KV_PROTO_REQ_ITEM, &n))
        return KV_EPROTO;
    struct kv__wire_req *q = malloc((n ? n : 1) * sizeof *q);
    struct kv__wire_resp *o = calloc(n ? n : 1, sizeof *o);
    uint8_t *hb = malloc(KV_PROTO_HDR_LEN + kv__batch_r_body_len(n)), *sums = NULL;
    uint64_t sum = 0;
    int rc = KV_ENOMEM;
    if (!q || !o || !hb)
        goto out;
    if ((rc = kv__batch_decode(body, h->body_len, q, &n)))
        goto out;
    for (size_t i = 0; i < n; i++)
        sum += q[i].kind == KV_OP_DUMP ? q[i].len : 0;
    if (sum != h->data_len) {
        rc = KV_EPROTO;
        goto out;
    }
    /* Dumps first: their bytes follow the body, in item order. */
    for (size_t i = 0; i < n; i++) {
        if (q[i].kind != KV_OP_DUMP)
            continue;
        struct kv__serve_dump d;
        kv__serve_dump_begin(sv, &q[i], 1, &d);
        for (uint64_t got = 0; got < q[i].len;) {
            uint64_t l = q[i].len - got;
            void *dst = kv__serve_dump_dst(&d, got);
            if (!dst) {
                dst = sc->discard;
                l = l > DISCARD_LEN ? DISCARD_LEN : l;
            }
            if ((rc = kv__sock_xfer1(sc->fd, dst, (size_t)l, 0, sc->deadline))) {
                kv__serve_dump_abort(sv, &d);
                goto out;
            }
            got += l;
        }
        o[i].status = kv__serve_dump_end(sv, &q[i], &d);
    }
    if ((rc = kv__serve_items(sv, q, o, n, &out)))
        goto out;
    /* The OK loads' sums follow their bytes (proto.h). */
    size_t nv = out.cnt - 1;
    rc = KV_ENOMEM;
    if (!(sums = malloc(nv ? nv * KV_PROTO_SUM_LEN : 1)))
        goto out;
    rc = KV_OK;
    size_t blen = kv__batch_r_body_len(n);
    struct kv__hdr rh = { .type = KV_MSG_BATCH_R, .req_id = h->req_id,
                          .body_len = (uint32_t)blen,
                          .data_len = out.data + nv * KV_PROTO_SUM_LEN };
    kv__hdr_encode(&rh, hb);
    kv__batch_r_encode(o, n, hb + KV_PROTO_HDR_LEN, blen);
    out.iov[0] = (struct iovec){ hb, KV_PROTO_HDR_LEN + blen };
    sc->deadline += bytes_ms(out.data);
    for (size_t at = 0, cnt; rc == KV_OK && at < out.cnt; at += cnt) {
        if ((rc = kv__serve_out_ready(sv, q, &out, at, &cnt))) {
            KV_WARN("rdma: a value went away while its response was being sent; closing");
            break;
        }
        for (size_t j = at ? at : 1; j < at + cnt; j++)
            kv__put64(sums + (j - 1) * KV_PROTO_SUM_LEN,
                      kv__sum(out.iov[j].iov_base, out.iov[j].iov_len));
        rc = kv__sock_xfer(sc->fd, out.iov + at, cnt, 1, sc->deadline);
    }
    if (rc == KV_OK)
        rc = kv__sock_xfer1(sc->fd, sums, nv * KV_PROTO_SUM_LEN, 1, sc->deadline);
out:
    free(sums);
    kv__serve_out_free(sv, &out);
    free(q);
    free(o);
    free(hb);
    return rc;
}

/* (Re)creates the connection's queue pair towards the client's. */
static int on_qp(struct sconn *sc, const struct kv__hdr *h, const uint8_t *body)
{
    struct rdma *r = sc->r;
    struct qpinfo peer, mine;
    if (h->body_len != QPINFO_LEN || qpinfo_decode(body, &peer))
        return KV_EPROTO;
    qp_destroy(&sc->qp, &sc->cq);
    int rc = qp_create(r, 4, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                             IBV_ACCESS_REMOTE_WRITE, &sc->cq, &sc->qp);
    if (rc == KV_OK) {
        qpinfo_local(r, sc->qp, &mine);
        rc = qp_connect(r, sc->qp, mine.psn, &peer);
    }
    if (rc != KV_OK) {
        qp_destroy(&sc->qp, &sc->cq);
        return send_frame(sc->fd, MSG_QP_R, h->req_id, rc, NULL, 0, 0, sc->deadline);
    }
    size_t blen = QPINFO_LEN + 4 + (size_t)r->nseg * SEG_WIRE_LEN;
    uint8_t *out = malloc(blen);
    if (!out)
        return KV_ENOMEM;
    qpinfo_encode(&mine, out);
    kv__put32(out + QPINFO_LEN, (uint32_t)r->nseg);
    for (int i = 0; i < r->nseg; i++) {
        uint8_t *p = out + QPINFO_LEN + 4 + (size_t)i * SEG_WIRE_LEN;
        kv__put64(p, r->seg[i].base);
        kv__put64(p + 8, r->seg[i].len);
        kv__put32(p + 16, r->seg[i].rkey);
    }
    rc = send_frame(sc->fd, MSG_QP_R, h->req_id, KV_OK, out, blen, 0, sc->deadline);
    free(out);
    return rc;
}

static void sconn_free(struct sconn *sc)
{
    struct kv__backend *be = sc->r->be;
    /* A client that goes away gives back everything it held. */
    for (uint32_t i = 0; i < sc->nh; i++) {
        if (!(sc->h[i].gen & 1))
            continue;
        if (sc->h[i].kind == KV_OP_LOAD)
            be->unpin(be->ctx, &sc->h[i].pin);
        else
            be->abort(be->ctx, &sc->h[i].resv);
    }
    qp_destroy(&sc->qp, &sc->cq);
    close(sc->fd);
    free(sc->h);
    free(sc->discard);
    free(sc);
}

static void *sconn_main(void *arg)
{
    struct sconn *sc = arg;
    struct rdma *r = sc->r;
    struct kv__hdr h;
    uint8_t *body = NULL;
    /* A frame, once begun, must arrive and be answered within the timeout:
     * a stalled peer is dropped and what it held is given back. */
    sc->deadline = kv__now_ms() + r->o.timeout_ms;
    char id[64] = "?";
    struct sockaddr_in pa;
    socklen_t pl = sizeof pa;
    if (getpeername(sc->fd, (struct sockaddr *)&pa, &pl) == 0 && pl == sizeof pa) {
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &pa.sin_addr, ip, sizeof ip);
        snprintf(id, sizeof id, "%s:%u", ip, (unsigned)ntohs(pa.sin_port));
    }
    int rc = kv__auth_server(sc->fd, r->o.token, sc->deadline);
    if (rc == KV_EPERM)
        KV_WARN("rdma: refused a connection from %s: it did not prove the cluster token", id);
    while (rc == KV_OK && !atomic_load(&r->stopping)) {
        /* An idle pooled connection may wait for ever; one holding pins or
         * reservations must finish its batch (RELEASE / COMMIT) in time:
         * it may go quiet for twice the timeout, and each pin or
         * reservation lives no longer than its handle says. */
        uint64_t quiet = sc->live ? kv__now_ms() + 2ull * r->o.timeout_ms : UINT64_MAX;
        uint64_t expire = handles_expire(sc);
        rc = kv__sock_wait(sc->fd, POLLIN, quiet < expire ? quiet : expire);
        if (rc == KV_ETIMEDOUT)
            KV_WARN("rdma: '%s' %s holding %u pins/reservations; closing", id,
                    expire <= quiet ? "outlived their lifetime" : "went quiet", sc->live);
        if (rc)
            break;
        sc->deadline = kv__now_ms() + r->o.timeout_ms;
        rc = recv_frame(sc->fd, UINT64_MAX, KV_PROTO_BODY_MAX, &h, &body, sc->deadline);
        if (rc)
            break;
        sc->deadline += bytes_ms(h.data_len);
        switch (h.type) {
        case MSG_QP:        rc = on_qp(sc, &h, body); break;
        case MSG_PREP:      rc = on_prep(sc, &h, body); break;
        case MSG_RELEASE:   rc = on_release(sc, &h, body); break;
        case MSG_COMMIT:    rc = on_commit(sc, &h, body); break;
        case KV_MSG_BATCH:  rc = on_batch(sc, &h, body); break;
        default:            rc = KV_EPROTO; break;
        }
        free(body);
        body = NULL;
    }
    if (rc == KV_EPROTO)
        KV_WARN("rdma: bad frame from '%s'; closing that connection", id);
    pthread_mutex_lock(&r->lock);
    if (sc->prev)
        sc->prev->next = sc->next;
    else
        r->conns = sc->next;
    if (sc->next)
        sc->next->prev = sc->prev;
    pthread_mutex_unlock(&r->lock);
    sconn_free(sc);
    pthread_mutex_lock(&r->lock);
    if (--r->nconns == 0)
        pthread_cond_broadcast(&r->gone);
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct rdma *r = arg;
    while (!atomic_load(&r->stopping)) {
        if (kv__sock_wait(r->lfd, POLLIN, kv__now_ms() + 200) != KV_OK)
            continue;
        int fd = kv__sock_accept(r->lfd);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                kv__net_refuse_one(r->lfd, &r->spare_fd);
            continue;
        }
        /* A thread per connection: past the cap, refuse rather than let a
         * flood of connections (each waits up to the timeout for its
         * HELLO) take the process's threads. */
        pthread_mutex_lock(&r->lock);
        int full = r->nconns >= KV__RDMA_CONNS_MAX;
        pthread_mutex_unlock(&r->lock);
        if (full) {
            close(fd);
            continue;
        }
        struct sconn *sc = calloc(1, sizeof *sc);
        if (sc)
            sc->discard = malloc(DISCARD_LEN);
        if (!sc || !sc->discard) {
            if (sc)
                free(sc);
            close(fd);
            continue;
        }
        sc->r = r;
        sc->fd = fd;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_t th;
        pthread_mutex_lock(&r->lock);
        if (atomic_load(&r->stopping) || pthread_create(&th, &at, sconn_main, sc) != 0) {
            pthread_mutex_unlock(&r->lock);
            pthread_attr_destroy(&at);
            free(sc->discard);
            free(sc);
            close(fd);
            continue;
        }
        sc->next = r->conns;
        if (r->conns)
            r->conns->prev = sc;
        r->conns = sc;
        r->nconns++;
        pthread_mutex_unlock(&r->lock);
        pthread_attr_destroy(&at);
    }
    return NULL;
}

/* ---- transport life ---------------------------------------------------- */

static void rdma_destroy(struct kv__transport *tp)
{
    struct rdma *r = (struct rdma *)tp;
    if (!r)
        return;
    atomic_store(&r->stopping, 1);
    if (r->accepting)
        pthread_join(r->accept_th, NULL);
    /* Wake every connection thread and wait for the last to leave. */
    pthread_mutex_lock(&r->lock);
    for (struct sconn *sc = r->conns; sc; sc = sc->next)
        shutdown(sc->fd, SHUT_RDWR);
    while (r->nconns > 0)
        pthread_cond_wait(&r->gone, &r->lock);
    pthread_mutex_unlock(&r->lock);
    if (r->lfd >= 0)
        close(r->lfd);
    if (r->spare_fd >= 0)
        close(r->spare_fd);
    while (r->bufs) {
        struct cbuf *b = r->bufs;
        r->bufs = b->next;
        for (int i = 0; i < b->nmr; i++)
            ibv_dereg_mr(b->mr[i]);
        free(b->mr);
        free(b);
    }
    for (int i = 0; i < r->nseg; i++)
        ibv_dereg_mr(r->segmr[i]);
    free(r->segmr);
    free(r->seg);
    if (r->pd)
        ibv_dealloc_pd(r->pd);
    if (r->ctx)
        ibv_close_device(r->ctx);
    pthread_rwlock_destroy(&r->buf_lock);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->gone);
    free(r);
}

static int rdma_create(const struct kv__net_opts *o, struct kv__backend *be,
                       struct kv__transport **out, char *err, size_t errlen)
{
    *out = NULL;
    struct rdma *r = calloc(1, sizeof *r);
    if (!r)
        return KV_ENOMEM;
    r->base.ops = &kv__rdma_transport;
    r->o = *o;
    if (!r->o.timeout_ms)
        r->o.timeout_ms = KV_NET_DEFAULT_TIMEOUT_MS;
    r->be = be;
    kv__serve_init(&r->serve, be);
    r->lfd = -1;
    r->spare_fd = -1;
    pthread_rwlock_init(&r->buf_lock, NULL);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->gone, NULL);
    snprintf(r->id, sizeof r->id, "pid-%ld", (long)getpid());
    const char *gi = getenv("KV_RDMA_GID_INDEX");
    r->gid_index = gi && *gi ? atoi(gi) : 0;

    int rc = KV_ENOTSUP;
    errno = 0;
    struct ibv_device **l = ibv_get_device_list(NULL);
    struct ibv_device *dev = find_device(l, o->device_name);
    if (!dev) {
        char msg[KV_CFG_STR + 96];
        if (!l)
            snprintf(msg, sizeof msg, "rdma: no RDMA device (ibv_get_device_list: %s)",
                     strerror(errno));
        else
            snprintf(msg, sizeof msg, "rdma: no RDMA device named '%s'", o->device_name);
        kv__errf(err, errlen, "%s", msg);
        KV_WARN("%s", msg);
        if (l)
            ibv_free_device_list(l);
        goto fail;
    }
    r->ctx = ibv_open_device(dev);
    ibv_free_device_list(l);
    if (!r->ctx || ibv_query_device(r->ctx, &r->dev) || ibv_query_port(r->ctx, 1, &r->port) ||
        ibv_query_gid(r->ctx, 1, r->gid_index, &r->gid) || !(r->pd = ibv_alloc_pd(r->ctx))) {
        kv__errf(err, errlen, "rdma: cannot open the device: %s", strerror(errno ? errno : EIO));
        KV_WARN("rdma: cannot open the device: %s", strerror(errno ? errno : EIO));
        goto fail;
    }
    if (r->port.state != IBV_PORT_ACTIVE) {
        kv__errf(err, errlen, "rdma: port 1 is not active (%s)", ibv_port_state_str(r->port.state));
        KV_WARN("rdma: port 1 is not active (%s)", ibv_port_state_str(r->port.state));
        goto fail;
    }
    if (be && be->seg_base && be->seg_len) {
        size_t chunk;
        rc = reg_chunks(r, be->seg_base, be->seg_len, IBV_ACCESS_LOCAL_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, &r->segmr, &r->nseg, &chunk);
        if (rc == KV_OK && !(r->seg = calloc((size_t)r->nseg, sizeof *r->seg)))
            rc = KV_ENOMEM;
        if (rc != KV_OK) {
            kv__errf(err, errlen, "rdma: cannot register the segment (%zu bytes)", be->seg_len);
            goto fail;
        }
        for (int i = 0; i < r->nseg; i++)
            r->seg[i] = (struct seg){ (uintptr_t)r->segmr[i]->addr, r->segmr[i]->length,
                                      r->segmr[i]->rkey };
        KV_INFO("rdma: %s: segment of %zu bytes registered as %d region(s)",
                ibv_get_device_name(r->ctx->device), be->seg_len, r->nseg);
    }
    *out = (struct kv__transport *)r;
    return KV_OK;
fail:
    rdma_destroy((struct kv__transport *)r);
    return rc;
}

static int rdma_listen(struct kv__transport *tp, const char *addr, char *bound, size_t boundlen,
                       char *err, size_t errlen)
{
    struct rdma *r = (struct rdma *)tp;
    if (!r->be || r->lfd >= 0) {
        kv__errf(err, errlen, "rdma: nothing to serve or already listening");
        return KV_EINVAL;
    }
    int fd, rc = kv__sock_listen("cluster.listen", addr, 512, &fd, bound, boundlen, err, errlen);
    if (rc != KV_OK)
        return rc;
    r->lfd = fd;
    r->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (pthread_create(&r->accept_th, NULL, accept_main, r) != 0) {
        kv__errf(err, errlen, "rdma: cannot start the accept thread");
        return KV_ENOMEM;
    }
    r->accepting = 1;
    return KV_OK;
}

static int rdma_segments(struct kv__transport *tp, struct kv__segdesc *out, int cap)
{
    struct rdma *r = (struct rdma *)tp;
    int n = r->nseg < cap ? r->nseg : cap;
    for (int i = 0; i < n; i++)
        out[i] = (struct kv__segdesc){ r->seg[i].base, r->seg[i].len, r->seg[i].rkey };
    return n;
}

/* ---- client buffers ------------------------------------------------------ */

static int rdma_register_buffer(struct kv__transport *tp, void *addr, size_t len)
{
    struct rdma *r = (struct rdma *)tp;
    if (!addr || !len)
        return KV_EINVAL;
    struct cbuf *b = calloc(1, sizeof *b);
    if (!b)
        return KV_ENOMEM;
    b->addr = addr;
    b->len = len;
    pthread_rwlock_wrlock(&r->buf_lock);
    for (struct cbuf *x = r->bufs; x; x = x->next) {
        if ((uint8_t *)addr < x->addr + x->len && x->addr < (uint8_t *)addr + len) {
            pthread_rwlock_unlock(&r->buf_lock);
            free(b);
            return KV_EBUSY;
        }
    }
    int rc = reg_chunks(r, addr, len, IBV_ACCESS_LOCAL_WRITE, &b->mr, &b->nmr, &b->chunk);
    if (rc == KV_OK) {
        b->next = r->bufs;
        r->bufs = b;
    } else {
        free(b);
    }
    pthread_rwlock_unlock(&r->buf_lock);
    return rc;
}

static int rdma_unregister_buffer(struct kv__transport *tp, void *addr)
{
    struct rdma *r = (struct rdma *)tp;
    pthread_rwlock_wrlock(&r->buf_lock);
    struct cbuf **pp = &r->bufs;
    while (*pp && (*pp)->addr != addr)
        pp = &(*pp)->next;
    struct cbuf *b = *pp;
    if (b)
        *pp = b->next;
    pthread_rwlock_unlock(&r->buf_lock);
    if (!b)
        return KV_ENOTFOUND;
    for (int i = 0; i < b->nmr; i++)
        ibv_dereg_mr(b->mr[i]);
    free(b->mr);
    free(b);
    return KV_OK;
}

/* The lkey and the bytes left in its region for local memory p, or 0 when
 * p is in no registered buffer. Called under buf_lock (read). */
static uint32_t local_key(struct rdma *r, const uint8_t *p, uint64_t *left)
{
    for (struct cbuf *b = r->bufs; b; b = b->next) {
        if (p < b->addr || p >= b->addr + b->len)
            continue;
        size_t off = (size_t)(p - b->addr), i = off / b->chunk;
        struct ibv_mr *mr = b->mr[i];
        *left = (uint64_t)((uint8_t *)mr->addr + mr->length - p);
        return mr->lkey;
    }
    return 0;
}

/* ---- client connection ---------------------------------------------------- */

/* Sets up (again) the queue pair to the server over the channel. */
static int qp_setup(struct cconn *c, uint64_t deadline)
{
    struct rdma *r = c->r;
    c->qp_ok = 0;
    qp_destroy(&c->qp, &c->cq);
    int rc = qp_create(r, WAVE_MAX, 0, &c->cq, &c->qp);
    if (rc)
        return rc;
    struct qpinfo mine, peer;
    uint8_t b[QPINFO_LEN];
    qpinfo_local(r, c->qp, &mine);
    qpinfo_encode(&mine, b);
    uint64_t id = c->next_id++;
    if ((rc = send_frame(c->fd, MSG_QP, id, KV_OK, b, sizeof b, 0, deadline)))
        return rc;
    struct kv__hdr h;
    uint8_t *body;
    if ((rc = recv_frame(c->fd, 0, QPINFO_LEN + 4 + (size_t)SEG_MAX * SEG_WIRE_LEN, &h, &body,
                         deadline)))
        return rc;
    size_t nseg = 0;
    if (h.type != MSG_QP_R || h.req_id != id)
        rc = KV_EPROTO;
    else if (h.status)
        rc = h.status < 0 && h.status >= KV_ENOTSUP ? h.status : KV_EPROTO;
    else if (h.body_len < QPINFO_LEN + 4 || qpinfo_decode(body, &peer))
        rc = KV_EPROTO;
    else if ((nseg = kv__get32(body + QPINFO_LEN)) > SEG_MAX ||
             h.body_len != QPINFO_LEN + 4 + nseg * SEG_WIRE_LEN)
        rc = KV_EPROTO;
    struct seg *seg = NULL;
    if (rc == KV_OK && nseg && !(seg = malloc(nseg * sizeof *seg)))
        rc = KV_ENOMEM;
    for (size_t i = 0; rc == KV_OK && i < nseg; i++) {
        const uint8_t *p = body + QPINFO_LEN + 4 + i * SEG_WIRE_LEN;
        seg[i] = (struct seg){ kv__get64(p), kv__get64(p + 8), kv__get32(p + 16) };
        /* Regions must be non-empty, sorted and disjoint: the address checks
         * of every transfer rely on it. */
        if (!seg[i].len || seg[i].base + seg[i].len < seg[i].base ||
            (i && seg[i].base < seg[i - 1].base + seg[i - 1].len))
            rc = KV_EPROTO;
    }
    free(body);
    if (rc == KV_OK)
        rc = qp_connect(r, c->qp, mine.psn, &peer);
    if (rc) {
        free(seg);
        return rc;
    }
    free(c->seg);
    c->seg = seg;
    c->nseg = (uint32_t)nseg;
    c->qp_ok = 1;
    return KV_OK;
}

static void rdma_close(struct kv__conn *cp)
{
    struct cconn *c = (struct cconn *)cp;
    if (!c)
        return;
    qp_destroy(&c->qp, &c->cq);
    if (c->bmr)
        ibv_dereg_mr(c->bmr);
    free(c->bounce);
    free(c->seg);
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

static int rdma_connect(struct kv__transport *tp, const char *addr, struct kv__conn **out)
{
    struct rdma *r = (struct rdma *)tp;
    struct sockaddr_in sa;
    *out = NULL;
    if (kv__net_parse_addr(addr, &sa))
        return KV_EINVAL;
    uint64_t deadline = kv__now_ms() + r->o.timeout_ms;
    struct cconn *c = calloc(1, sizeof *c);
    if (!c)
        return KV_ENOMEM;
    c->r = r;
    c->next_id = 1;
    /* A socket that cannot be made is a network failure here, as a
     * connection that cannot be made is. */
    int rc = kv__sock_connect(&sa, deadline, &c->fd);
    if (rc != KV_OK && rc != KV_ETIMEDOUT)
        rc = KV_ENET;
    if (rc != KV_OK)
        goto fail;
    /* The server proves the token before we do (auth.h). */
    if ((rc = kv__auth_client(c->fd, r->o.token, deadline)) != KV_OK)
        goto fail;
    if ((rc = qp_setup(c, deadline)))
        goto fail;
    /* One region, so no larger than the device allows. */
    c->blen = BOUNCE_LEN;
    if (r->dev.max_mr_size && r->dev.max_mr_size < c->blen)
        c->blen = (uint32_t)r->dev.max_mr_size & ~4095u;
    c->bpiece = c->blen < BOUNCE_PIECE ? c->blen : BOUNCE_PIECE;
    rc = KV_ENOMEM;
    if (!c->blen || !(c->bounce = malloc(c->blen)) ||
        !(c->bmr = ibv_reg_mr(r->pd, c->bounce, c->blen, IBV_ACCESS_LOCAL_WRITE)))
        goto fail;
    *out = (struct kv__conn *)c;
    return KV_OK;
fail:
    rdma_close((struct kv__conn *)c);
    return rc;
}

/* ---- client transfers ------------------------------------------------------ */

/* One work request: a piece of an item that lies in one server region and
 * one local region (a registered buffer or the bounce buffer). */
struct piece {
    size_t item;
    uint64_t raddr;
    uint32_t rkey, lkey;    /* lkey 0: through the bounce buffer */
    uint32_t len;
    uint8_t *local;
    uint8_t read, state, tries;
    uint32_t boff;
};
enum { P_PENDING, P_POSTED, P_DONE, P_FAILED };

/* The server region holding addr, or NULL. */
static const struct seg *find_seg(const struct cconn *c, uint64_t addr)
{
    size_t lo = 0, hi = c->nseg;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (addr < c->seg[mid].base)
            hi = mid;
        else if (addr - c->seg[mid].base >= c->seg[mid].len)
            lo = mid + 1;
        else
            return &c->seg[mid];
    }
    return NULL;
}

/* Whether [addr, addr+len) lies wholly in the server's regions. */
static int covered(const struct cconn *c, uint64_t addr, uint64_t len)
{
    if (addr + len < addr)
        return 0;
    while (len) {
        const struct seg *s = find_seg(c, addr);
        if (!s)
            return 0;
        uint64_t left = s->base + s->len - addr, l = left < len ? left : len;
        addr += l;
        len -= l;
    }
    return 1;
}

/* Cuts one item's transfer into pieces, appending to *pv. */
static int cut_item(struct cconn *c, size_t item, const struct kv__op *op, uint64_t raddr,
                    int is_read, struct piece **pv, size_t *np, size_t *cap)
{
    uint64_t total = kv__iov_len(op->iov, op->iovcnt), done = 0;
    uint32_t vi = 0;
    uint64_t voff = 0;
    while (done < total) {
        while (voff == op->iov[vi].len) {
            vi++;
            voff = 0;
        }
        const struct seg *s = find_seg(c, raddr + done);
        if (!s)
            return KV_EPROTO;
        uint8_t *local = (uint8_t *)op->iov[vi].base + voff;
        uint64_t len = total - done, lleft = 0, t;
        if ((t = s->base + s->len - (raddr + done)) < len)
            len = t;
        if ((t = op->iov[vi].len - voff) < len)
            len = t;
        uint32_t lkey = local_key(c->r, local, &lleft);
        if (lkey && lleft < len)
            len = lleft;
        if (!lkey && len > c->bpiece)
            len = c->bpiece;
        if (len > PIECE_MAX)
            len = PIECE_MAX;
        if (*np == *cap) {
            size_t ncap = *cap ? *cap * 2 : 64;
            struct piece *x = realloc(*pv, ncap * sizeof *x);
            if (!x)
                return KV_ENOMEM;
            *pv = x;
            *cap = ncap;
        }
        (*pv)[(*np)++] = (struct piece){ .item = item, .raddr = raddr + done, .rkey = s->rkey,
                                         .lkey = lkey, .len = (uint32_t)len, .local = local,
                                         .read = (uint8_t)is_read };
        done += len;
        voff += len;
    }
    return KV_OK;
}

/* Takes the QP out of service so that nothing lands after we return. */
static void qp_kill(struct cconn *c)
{
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
    if (c->qp)
        ibv_modify_qp(c->qp, &a, IBV_QP_STATE);
    struct ibv_wc wc[16];
    uint64_t until = kv__now_ms() + 100;
    while (kv__now_ms() < until && ibv_poll_cq(c->cq, 16, wc) > 0)
        ;
    c->qp_ok = 0;
}

/*
 * Runs the pieces in waves of at most WAVE_MAX work requests and the
 * bounce buffer's worth of bounced bytes, every one signaled. A failed completion fails
 * its item (item_rc = KV_EIO); the QP is then in error and its remaining
 * requests come back flushed: the QP is rebuilt and the flushed pieces are
 * posted again (twice at most). Returns a connection error only.
 */
static int run_pieces(struct cconn *c, struct piece *p, size_t np, int *item_rc, uint64_t deadline)
{
    size_t first = 0;
    for (;;) {
        while (first < np && p[first].state != P_PENDING)
            first++;
        struct ibv_send_wr wr[WAVE_MAX];
        struct ibv_sge sge[WAVE_MAX];
        size_t idx[WAVE_MAX], nw = 0;
        uint32_t bused = 0;
        for (size_t i = first; i < np && nw < WAVE_MAX; i++) {
            struct piece *q = &p[i];
            if (q->state != P_PENDING)
                continue;
            if (item_rc[q->item] != KV_OK) {
                q->state = P_FAILED;
                continue;
            }
            if (!q->lkey && bused + q->len > c->blen)
                break;
            uint8_t *local = q->local;
            uint32_t lkey = q->lkey;
            if (!lkey) {
                q->boff = bused;
                bused += q->len;
                local = c->bounce + q->boff;
                lkey = c->bmr->lkey;
                if (!q->read)
                    memcpy(local, q->local, q->len);
            }
            uint32_t rkey = q->rkey;
            sge[nw] = (struct ibv_sge){ .addr = (uintptr_t)local, .length = q->len, .lkey = lkey };
            wr[nw] = (struct ibv_send_wr){ .wr_id = i, .sg_list = &sge[nw], .num_sge = 1,
                                           .opcode = q->read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
                                           .send_flags = IBV_SEND_SIGNALED };
            wr[nw].wr.rdma.remote_addr = q->raddr;
            wr[nw].wr.rdma.rkey = rkey;
            if (nw)
                wr[nw - 1].next = &wr[nw];
            idx[nw++] = i;
            q->state = P_POSTED;
        }
        if (nw == 0)
            return KV_OK;
        struct ibv_send_wr *bad = NULL;
        int e = ibv_post_send(c->qp, wr, &bad);
        size_t posted = e ? (size_t)(bad - wr) : nw;
        for (size_t k = posted; k < nw; k++)
            p[idx[k]].state = P_PENDING;    /* never reached the QP */
        if (e && posted < nw && ++p[idx[posted]].tries >= 3) {
            KV_WARN("rdma: ibv_post_send: %s", strerror(e));
            p[idx[posted]].state = P_FAILED;
            item_rc[p[idx[posted]].item] = KV_EIO;
        }
        int qp_broken = e != 0, spins = 0;
        size_t got = 0;
        while (got < posted) {
            struct ibv_wc wc[16];
            int k = ibv_poll_cq(c->cq, 16, wc);
            if (k < 0) {
                qp_kill(c);
                return KV_EIO;
            }
            if (k == 0) {
                if (kv__now_ms() >= deadline) {
                    qp_kill(c);
                    return KV_ETIMEDOUT;
                }
                if (++spins > 1000)
                    usleep(50);
                continue;
            }
            for (int j = 0; j < k; j++) {
                if (wc[j].wr_id >= np)
                    continue;
                struct piece *q = &p[wc[j].wr_id];
                got++;
                if (wc[j].status == IBV_WC_SUCCESS) {
                    if (q->read && !q->lkey)
                        memcpy(q->local, c->bounce + q->boff, q->len);
                    q->state = P_DONE;
                } else if (wc[j].status == IBV_WC_WR_FLUSH_ERR && ++q->tries < 3) {
                    q->state = P_PENDING;
                    qp_broken = 1;
                } else {
                    KV_WARN("rdma: RDMA %s of %u bytes failed: %s", q->read ? "READ" : "WRITE",
                            q->len, ibv_wc_status_str(wc[j].status));
                    q->state = P_FAILED;
                    item_rc[q->item] = KV_EIO;
                    qp_broken = 1;
                }
            }
        }
        if (qp_broken) {
            int rc = qp_setup(c, deadline);
            if (rc)
                return rc;
        }
    }
}

/* A load whose landed bytes failed their sum: counted, and its item's
 * status. */
static int sum_failed(struct rdma *r)
{
    atomic_fetch_add(&r->base.checksum_failures, 1);
    KV_WARN("rdma: a loaded value failed its checksum; dropped");
    return KV_ECORRUPT;
}

/* Items that RDMA cannot serve, as a plain BATCH with inline bytes. */
static int plain_batch(struct cconn *c, struct kv__op *ops, size_t n, uint64_t deadline)
{
    size_t blen = kv__batch_body_len(n), rlen = kv__batch_r_body_len(n), niov = 1, nload = 0;
    uint64_t dump_bytes = 0, load_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        niov += ops[i].iovcnt;
        if (ops[i].kind == KV_OP_DUMP)
            dump_bytes += kv__iov_len(ops[i].iov, ops[i].iovcnt);
        else if (ops[i].kind == KV_OP_LOAD) {
            load_bytes += kv__iov_len(ops[i].iov, ops[i].iovcnt);
            nload++;
        }
    }
    niov++;     /* the sums */
    uint8_t *buf = malloc(KV_PROTO_HDR_LEN + (blen > rlen ? blen : rlen));
    uint8_t *sums = malloc(nload ? nload * KV_PROTO_SUM_LEN : 1);
    struct kv__wire_req *q = malloc(n * sizeof *q);
    struct kv__wire_resp *o = malloc(n * sizeof *o);
    struct iovec *iov = malloc(niov * sizeof *iov);
    int rc = KV_ENOMEM;
    if (!buf || !q || !o || !iov || !sums)
        goto out;
    kv__wire_from_ops(ops, n, q);
    uint64_t id = c->next_id++;
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = (uint32_t)blen, .req_id = id,
                         .data_len = dump_bytes };
    kv__hdr_encode(&h, buf);
    kv__batch_encode(q, n, buf + KV_PROTO_HDR_LEN, blen);
    iov[0] = (struct iovec){ buf, KV_PROTO_HDR_LEN + blen };
    size_t k = 1;
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; ops[i].kind == KV_OP_DUMP && j < ops[i].iovcnt; j++)
            iov[k++] = (struct iovec){ ops[i].iov[j].base, ops[i].iov[j].len };
    if ((rc = kv__sock_xfer(c->fd, iov, k, 1, deadline)))
        goto out;
    uint8_t hb[KV_PROTO_HDR_LEN];
    if ((rc = kv__sock_xfer1(c->fd, hb, sizeof hb, 0, deadline)))
        goto out;
    if (kv__hdr_decode(hb, load_bytes + nload * KV_PROTO_SUM_LEN, &h) ||
        h.type != KV_MSG_BATCH_R || h.req_id != id ||
        h.status || h.body_len != rlen) {
        rc = KV_EPROTO;
        goto out;
    }
    if ((rc = kv__sock_xfer1(c->fd, buf, rlen, 0, deadline)))
        goto out;
    size_t got = n;
    if (kv__batch_r_decode(buf, rlen, o, &got) || got != n) {
        rc = KV_EPROTO;
        goto out;
    }
    uint64_t expect = 0;
    size_t nok = 0;
    k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind != KV_OP_LOAD || o[i].status != KV_OK)
            continue;
        if (o[i].len != q[i].len) {
            rc = KV_EPROTO;
            goto out;
        }
        expect += o[i].len;
        nok++;
        for (uint32_t j = 0; j < ops[i].iovcnt; j++)
            iov[k++] = (struct iovec){ ops[i].iov[j].base, ops[i].iov[j].len };
    }
    if (expect + nok * KV_PROTO_SUM_LEN != h.data_len) {
        rc = KV_EPROTO;
        goto out;
    }
    iov[k++] = (struct iovec){ sums, nok * KV_PROTO_SUM_LEN };
    if ((rc = kv__sock_xfer(c->fd, iov, k, 0, deadline)))
        goto out;
    const uint8_t *sp = sums;
    for (size_t i = 0; i < n; i++) {
        ops[i].result = o[i].status;
        if (ops[i].kind == KV_OP_LOAD && o[i].status == KV_OK) {
            if (kv__sum_iov(ops[i].iov, ops[i].iovcnt) != kv__get64(sp))
                ops[i].result = sum_failed(c->r);
            sp += KV_PROTO_SUM_LEN;
        }
        ops[i].hit = o[i].hit;
        if (kv__op_answers_len(ops[i].kind))
            ops[i].len = o[i].len;
    }
out:
    free(buf);
    free(sums);
    free(q);
    free(o);
    free(iov);
    return rc;
}

/* One PREP's worth of a batch (n <= CHUNK_ITEMS). */
static int batch_chunk(struct cconn *c, struct kv__op *ops, size_t n, uint64_t deadline)
{
    size_t blen = kv__batch_body_len(n), rlen = kv__batch_r_body_len(n);
    struct kv__wire_req *q = malloc(n * sizeof *q);
    struct kv__wire_resp *o = malloc(n * sizeof *o);
    uint8_t *buf = malloc(blen > rlen ? blen : rlen);
    uint8_t *rel = malloc(4 + 8 * n), *com = malloc(4 + COMMIT_ITEM * n);
    int *item_rc = calloc(n, sizeof *item_rc);
    size_t *idx = malloc(n * sizeof *idx);
    struct kv__op *fb = malloc(n * sizeof *fb);
    struct piece *pv = NULL;
    size_t np = 0, pcap = 0, nrel = 0, ncom = 0, nfb = 0;
    uint8_t *body = NULL;
    int rc = KV_ENOMEM, locked = 0;
    if (!q || !o || !buf || !rel || !com || !item_rc || !idx || !fb)
        goto out;
    kv__wire_from_ops(ops, n, q);
    kv__batch_encode(q, n, buf, blen);
    uint64_t id = c->next_id++;
    struct kv__hdr h;
    if ((rc = send_frame(c->fd, MSG_PREP, id, KV_OK, buf, blen, 0, deadline)) ||
        (rc = recv_frame(c->fd, 0, rlen, &h, &body, deadline)))
        goto out;
    size_t got = n;
    if (h.type != MSG_PREP_R || h.req_id != id || h.status || h.body_len != rlen ||
        kv__batch_r_decode(body, rlen, o, &got) || got != n) {
        rc = KV_EPROTO;
        goto out;
    }
    pthread_rwlock_rdlock(&c->r->buf_lock);
    locked = 1;
    for (size_t i = 0; i < n; i++) {
        struct kv__op *op = &ops[i];
        op->result = o[i].status;
        op->hit = o[i].hit;
        if (kv__op_answers_len(op->kind))
            op->len = o[i].len;
        if ((op->kind != KV_OP_LOAD && op->kind != KV_OP_DUMP) || o[i].status != KV_OK)
            continue;
        if (op->kind == KV_OP_DUMP && o[i].hit) {
            op->hit = 0;
            continue;                   /* already stored there */
        }
        if (!o[i].handle) {
            idx[nfb] = i;               /* the server says: send it inline */
            fb[nfb++] = *op;
            continue;
        }
        /* The server's address must be exactly the item's size and lie in
         * its advertised regions before a byte moves. */
        int bad = o[i].len != q[i].len || !o[i].rkey || !covered(c, o[i].addr, o[i].len);
        if (bad) {
            KV_WARN("rdma: the server answered an address outside its regions; item refused");
            item_rc[i] = KV_EPROTO;
        }
        else if ((rc = cut_item(c, i, op, o[i].addr, op->kind == KV_OP_LOAD, &pv, &np, &pcap)))
            item_rc[i] = rc;
        if (op->kind == KV_OP_LOAD) {
            kv__put64(rel + 4 + 8 * nrel++, o[i].handle);
        } else {
            uint8_t *p = com + 4 + COMMIT_ITEM * ncom++;
            memset(p, 0, COMMIT_ITEM);
            kv__put64(p, o[i].handle);
            idx[n - ncom] = i;          /* commits fill idx from the end */
        }
    }
    rc = run_pieces(c, pv, np, item_rc, deadline);
    pthread_rwlock_unlock(&c->r->buf_lock);
    locked = 0;
    if (rc)
        goto out;
    /* What the READs landed must be the bytes the server pinned and summed. */
    for (size_t i = 0; i < n; i++)
        if (ops[i].kind == KV_OP_LOAD && o[i].status == KV_OK && o[i].handle && !item_rc[i] &&
            kv__sum_iov(ops[i].iov, ops[i].iovcnt) != o[i].sum)
            item_rc[i] = sum_failed(c->r);
    for (size_t i = 0; i < n; i++)
        if (item_rc[i] && (ops[i].kind == KV_OP_LOAD || ops[i].kind == KV_OP_DUMP))
            ops[i].result = item_rc[i];
    if (nrel) {
        kv__put32(rel, (uint32_t)nrel);
        if ((rc = send_frame(c->fd, MSG_RELEASE, c->next_id++, KV_OK, rel, 4 + 8 * nrel, 0,
                             deadline)))
            goto out;
    }
    if (ncom) {
        kv__put32(com, (uint32_t)ncom);
        for (size_t k = 0; k < ncom; k++)
            com[4 + COMMIT_ITEM * k + 8] = item_rc[idx[n - 1 - k]] ? ACT_ABORT : ACT_COMMIT;
        id = c->next_id++;
        free(body);
        body = NULL;
        if ((rc = send_frame(c->fd, MSG_COMMIT, id, KV_OK, com, 4 + COMMIT_ITEM * ncom, 0,
                             deadline)) ||
            (rc = recv_frame(c->fd, 0, kv__batch_r_body_len(ncom), &h, &body, deadline)))
            goto out;
        got = ncom;
        if (h.type != MSG_COMMIT_R || h.req_id != id || h.status ||
            kv__batch_r_decode(body, h.body_len, o, &got) || got != ncom) {
            rc = KV_EPROTO;
            goto out;
        }
        for (size_t k = 0; k < ncom; k++) {
            size_t i = idx[n - 1 - k];
            if (!item_rc[i])
                ops[i].result = o[k].status;
        }
    }
    if (nfb) {
        if ((rc = plain_batch(c, fb, nfb, deadline)))
            goto out;
        for (size_t k = 0; k < nfb; k++) {
            ops[idx[k]].result = fb[k].result;
            ops[idx[k]].hit = fb[k].hit;
        }
    }
    rc = KV_OK;
out:
    if (locked)
        pthread_rwlock_unlock(&c->r->buf_lock);
    free(q);
    free(o);
    free(buf);
    free(rel);
    free(com);
    free(item_rc);
    free(idx);
    free(fb);
    free(pv);
    free(body);
    return rc;
}

static int rdma_batch(struct kv__conn *cp, struct kv__op *ops, size_t n)
{
    struct cconn *c = (struct cconn *)cp;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (ops[i].kind == KV_OP_LOAD || ops[i].kind == KV_OP_DUMP)
            bytes += kv__iov_len(ops[i].iov, ops[i].iovcnt);
    uint64_t deadline = kv__now_ms() + c->r->o.timeout_ms + bytes_ms(bytes);
    int rc = KV_OK;
    if (!c->qp_ok && (rc = qp_setup(c, deadline)))
        return rc;
    for (size_t i = 0; i < n && rc == KV_OK; i += CHUNK_ITEMS) {
        size_t m = n - i > CHUNK_ITEMS ? CHUNK_ITEMS : n - i;
        int rdma = 0;
        for (size_t k = 0; k < m && !rdma; k++)
            rdma = ops[i + k].kind == KV_OP_LOAD || ops[i + k].kind == KV_OP_DUMP;
        /* Nothing for RDMA to move, or nowhere to move it: one plain frame. */
        rc = rdma && c->nseg ? batch_chunk(c, ops + i, m, deadline)
                             : plain_batch(c, ops + i, m, deadline);
    }
    return rc;
}

const struct kv__transport_ops kv__rdma_transport = {
    .name = "rdma",
    .probe = rdma_probe,
    .create = rdma_create,
    .destroy = rdma_destroy,
    .listen = rdma_listen,
    .connect = rdma_connect,
    .close = rdma_close,
    .batch = rdma_batch,
    .register_buffer = rdma_register_buffer,
    .unregister_buffer = rdma_unregister_buffer,
    .segments = rdma_segments,
};
