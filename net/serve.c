/*
 * serve.c — the serving policy of serve.h: one place that decides how a
 * node answers lookups, sizes, loads and dumps, for every transport and for
 * the cluster's own share of a batch.
 *
 * Key design choice: the policy works on decoded items (struct kv__wire_req)
 * and hands the transports only what they cannot share — where bytes go
 * (kv__serve_dump_dst), what to send (struct kv__serve_out) — so tcp's
 * nonblocking state machine and rdma's blocking threads move bytes their
 * own way over the same decisions.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve.h"
#include "sock.h"

void kv__serve_init(struct kv__serve *s, struct kv__backend *be)
{
    s->be = be;
    atomic_store(&s->bounce_used, 0);
    s->bounce_cap = KV__SERVE_BOUNCE_NODE;
}

int kv__token_eq(const char *given, const char *want)
{
    size_t lg = strlen(given), lw = strlen(want);
    /* Every byte of want is read and compared whatever the mismatches: the
     * accumulator, not a branch, carries the result. */
    volatile unsigned char diff = lg != lw;
    for (size_t i = 0; i < lw; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < lg ? given[i] : 0);
    return diff == 0;
}

void *kv__serve_bounce_get(struct kv__serve *s, uint64_t len)
{
    uint64_t want = len ? len : 1;
    uint64_t used = atomic_fetch_add(&s->bounce_used, want);
    void *p = used + want <= s->bounce_cap ? malloc(want) : NULL;
    if (!p)
        atomic_fetch_sub(&s->bounce_used, want);
    return p;
}

void kv__serve_bounce_put(struct kv__serve *s, void *p, uint64_t len)
{
    if (!p)
        return;
    free(p);
    atomic_fetch_sub(&s->bounce_used, len ? len : 1);
}

static int present(struct kv__backend *be, int ns, const kv_block_id *id, uint32_t index)
{
    uint64_t have;
    return be->size(be->ctx, ns, id, index, &have) == KV_OK;
}

/* A plain key's value dropped, for a remove or a replacing dump. Blocks
 * are not removed by peers: a block's shards leave together, by eviction. */
static int remove_key(struct kv__backend *be, int ns, const kv_block_id *id, uint32_t index)
{
    if (ns != KV_NS_KEY || index != 0)
        return KV_EINVAL;
    return be->remove ? be->remove(be->ctx, ns, id, index) : KV_ENOTSUP;
}

struct idlist {
    kv_block_id *v;
    size_t n, cap;
    int oom;
};

static int collect(void *arg, const kv_block_id *id, uint32_t index, uint64_t len, uint64_t used)
{
    struct idlist *l = arg;
    (void)len;
    (void)used;
    if (index != 0)
        return 0;
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 1024;
        kv_block_id *p = realloc(l->v, nc * sizeof *p);
        if (!p) {
            l->oom = 1;
            return 1;   /* stops the scan */
        }
        l->v = p;
        l->cap = nc;
    }
    l->v[l->n++] = *id;
    return 0;
}

/* Every plain key this node holds dropped (the ids listed first: nothing
 * is removed under the scan's locks); *count says how many were. With plen
 * > 0 (a prefix clear: the op's index), only the keys whose first plen
 * bytes hash to match (the op's id), as the engine judges them (be->match:
 * it alone knows how a key is stored). */
static int clear_keys(struct kv__backend *be, int ns, uint32_t plen, const kv_block_id *match,
                      uint64_t *count)
{
    *count = 0;
    if (ns != KV_NS_KEY)
        return KV_EINVAL;
    if (!be->scan || !be->remove || (plen && !be->match))
        return KV_ENOTSUP;
    struct idlist l = { 0 };
    int rc = be->scan(be->ctx, ns, collect, &l);
    if (rc == KV_OK && l.oom)
        rc = KV_ENOMEM;   /* those listed are still dropped */
    for (size_t i = 0; i < l.n; i++) {
        int r = plen ? be->match(be->ctx, &l.v[i], plen, match) : 1;
        if (r < 0 && r != KV_ENOTFOUND && rc == KV_OK)
            rc = r;   /* its key could not be read: kept, and said so */
        if (r != 1)
            continue;
        r = be->remove(be->ctx, ns, &l.v[i], 0);
        if (r == KV_OK)
            (*count)++;
        else if (r != KV_ENOTFOUND && rc == KV_OK)
            rc = r;   /* the rest are still tried */
    }
    free(l.v);
    return rc;
}

/* ---- loads, lookups, sizes, removes ------------------------------------ */

/*
 * A request's lookups go to the backend as one call per run of lookups in
 * one namespace, not one call per id: the engine's lookup prefetches the
 * index buckets of the ids ahead of the one it probes, and each probe of a
 * cold bucket is a cache miss (per id, kv__blk_find was a fifth of a
 * kvnode's CPU under lookups). The ids are gathered into ids[] (KV__SERVE_LK
 * at a time); id(i) and put(i, status, hit) are the request's or the op
 * list's. The answer is the same per id; only a failed call fails its run.
 */
#define KV__SERVE_LK 256

#define SERVE_LOOKUPS(be, n, is_lookup, ns_of, id_of, put)                            \
    do {                                                                             \
        kv_block_id ids_[KV__SERVE_LK];                                              \
        uint8_t hit_[KV__SERVE_LK];                                                  \
        for (size_t i_ = 0; i_ < (n);) {                                             \
            if (!(is_lookup(i_))) {                                                  \
                i_++;                                                                \
                continue;                                                            \
            }                                                                        \
            int ns_ = ns_of(i_);                                                     \
            size_t m_ = 0;                                                           \
            while (i_ + m_ < (n) && m_ < KV__SERVE_LK && is_lookup(i_ + m_) &&       \
                   ns_of(i_ + m_) == ns_)                                            \
                ids_[m_] = id_of(i_ + m_), m_++;                                     \
            int rc_ = (be)->lookup((be)->ctx, ns_, ids_, m_, hit_);                  \
            for (size_t j_ = 0; j_ < m_; j_++)                                       \
                put(i_ + j_, rc_, rc_ == KV_OK ? hit_[j_] : 0);                      \
            i_ += m_;                                                                \
        }                                                                            \
    } while (0)

void kv__serve_query(struct kv__serve *s, const struct kv__wire_req *q, struct kv__wire_resp *r)
{
    struct kv__backend *be = s->be;
    /* A remove leaves its tombstone before anything is dropped (tomb.h). */
    if (be->removing && q->ns == KV_NS_KEY &&
        ((q->kind == KV_OP_REMOVE && q->index == 0) || q->kind == KV_OP_CLEAR))
        be->removing(be->ctx, q->kind, q->kind == KV_OP_CLEAR ? q->index : 0, &q->id);
    if (q->kind == KV_OP_LOOKUP)
        r->status = be->lookup(be->ctx, q->ns, &q->id, 1, &r->hit);
    else if (q->kind == KV_OP_REMOVE)
        r->status = remove_key(be, q->ns, &q->id, q->index);
    else if (q->kind == KV_OP_CLEAR)
        r->status = clear_keys(be, q->ns, q->index, &q->id, &r->len);
    else
        r->status = be->size(be->ctx, q->ns, &q->id, q->index, &r->len);
    /* After the remove: a copy this member read before it is in flight or
     * has just landed, or none can be (transport.h, copying). */
    if (q->kind == KV_OP_REMOVE || q->kind == KV_OP_CLEAR)
        r->hit = q->ns == KV_NS_KEY && be->copying && be->copying(be->ctx);
}

int kv__serve_pin(struct kv__serve *s, const struct kv__wire_req *q, const void **d,
                  uint64_t *len, kv__pin *pin)
{
    struct kv__backend *be = s->be;
    int rc = be->pin ? be->pin(be->ctx, q->ns, &q->id, q->index, d, len, pin) : KV_ENOTFOUND;
    if (rc == KV_OK && *len != q->len) {
        be->unpin(be->ctx, pin);
        return KV_EINVAL;
    }
    if (rc != KV_ENOTFOUND)
        return rc;
    /* Not in DRAM: maybe on SSD, to be copied. */
    rc = be->size(be->ctx, q->ns, &q->id, q->index, len);
    if (rc == KV_OK && *len != q->len)
        return KV_EINVAL;
    return rc == KV_OK ? KV__SERVE_COPY : rc;
}

/*
 * Pins a request holds per block, counted only when the request has more
 * loads than KV__SERVE_PINS_PER_BLOCK (else no block can reach the cap): an
 * open-addressing table of (namespace, block id) -> pins, sized to twice
 * the loads so probes stay short.
 */
struct pincount {
    uint8_t used, ns;
    kv_block_id id;
    uint32_t n;
};

struct pintab {
    struct pincount *t;
    size_t mask;
};

static int pintab_init(struct pintab *p, size_t nload)
{
    p->t = NULL;
    p->mask = 0;
    if (nload <= KV__SERVE_PINS_PER_BLOCK)
        return KV_OK;
    size_t cap = 16;
    while (cap < 2 * nload)
        cap *= 2;
    p->t = calloc(cap, sizeof *p->t);
    p->mask = cap - 1;
    return p->t ? KV_OK : KV_ENOMEM;
}

/* The count for q's block (NULL when none are kept). */
static uint32_t *pintab_slot(struct pintab *p, const struct kv__wire_req *q)
{
    if (!p->t)
        return NULL;
    uint64_t h = 1469598103934665603ull ^ q->ns;
    for (int i = 0; i < KV_BLOCK_ID_LEN; i++)
        h = (h ^ q->id.bytes[i]) * 1099511628211ull;
    for (size_t i = (size_t)h & p->mask;; i = (i + 1) & p->mask) {
        struct pincount *e = &p->t[i];
        if (!e->used) {
            *e = (struct pincount){ .used = 1, .ns = q->ns, .id = q->id };
            return &e->n;
        }
        if (e->ns == q->ns && memcmp(&e->id, &q->id, sizeof e->id) == 0)
            return &e->n;
    }
}

int kv__serve_items(struct kv__serve *s, const struct kv__wire_req *req,
                    struct kv__wire_resp *resp, size_t n, struct kv__serve_out *out)
{
    size_t nload = 0;
    uint64_t copy_max = 0;
    struct pintab pt;
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n; i++)
        nload += req[i].kind == KV_OP_LOAD;
    out->iov = malloc((1 + nload) * sizeof *out->iov);
    out->item = calloc(1 + nload, sizeof *out->item);
    out->pins = nload ? malloc(nload * sizeof *out->pins) : NULL;
    if (!out->iov || !out->item || (nload && !out->pins) || pintab_init(&pt, nload))
        return KV_ENOMEM;
    out->cnt = 1;
#define RQ_LOOKUP(i) (req[i].kind == KV_OP_LOOKUP)
#define RQ_NS(i) (req[i].ns)
#define RQ_ID(i) (req[i].id)
#define RQ_PUT(i, rc, h) (resp[i].status = (rc), resp[i].hit = (h))
    SERVE_LOOKUPS(s->be, n, RQ_LOOKUP, RQ_NS, RQ_ID, RQ_PUT);
    for (size_t i = 0; i < n; i++) {
        const struct kv__wire_req *q = &req[i];
        struct kv__wire_resp *r = &resp[i];
        if (kv__op_is_query(q->kind) && q->kind != KV_OP_LOOKUP)
            kv__serve_query(s, q, r);
        if (q->kind != KV_OP_LOAD)
            continue;   /* dumps are served as their bytes arrive */
        const void *d = NULL;
        uint64_t len = 0;
        kv__pin pin;
        uint32_t *pins = pintab_slot(&pt, q);
        int rc = pins && *pins >= KV__SERVE_PINS_PER_BLOCK ? KV_EBUSY
                                                           : kv__serve_pin(s, q, &d, &len, &pin);
        if (rc == KV_OK) {
            out->pins[out->npins++] = pin;
            if (pins)
                ++*pins;
        } else if (rc == KV__SERVE_COPY) {
            /* Copied when the writer gets here (kv__serve_out_ready). */
            out->item[out->cnt] = (uint32_t)i + 1;
            copy_max = len > copy_max ? len : copy_max;
            rc = KV_OK;
        }
        r->status = rc;
        if (rc == KV_OK) {
            r->len = len;
            out->iov[out->cnt++] = (struct iovec){ (void *)d, len };
            out->data += len;
        }
    }
    free(pt.t);
    if (copy_max || out->cnt > 1 + out->npins) {
        out->buf = kv__serve_bounce_get(s, copy_max);
        out->buflen = copy_max;
    }
    if (out->cnt > 1 + out->npins && !out->buf) {
        /* The node's bounce budget is spent: every copy of this response
         * is refused, and the pinned values still go. */
        size_t k = 1;
        for (size_t j = 1; j < out->cnt; j++) {
            if (!out->item[j]) {
                out->iov[k] = out->iov[j];
                out->item[k++] = 0;
                continue;
            }
            resp[out->item[j] - 1].status = KV_EBUSY;
            resp[out->item[j] - 1].len = 0;
            out->data -= out->iov[j].iov_len;
        }
        out->cnt = k;
    }
    return KV_OK;
}

int kv__serve_out_ready(struct kv__serve *s, const struct kv__wire_req *req,
                        struct kv__serve_out *out, size_t at, size_t *cnt)
{
    if (out->item[at]) {
        /* The previous copy sat at an index before at: it has gone out, and
         * the buffer is free for this one. */
        const struct kv__wire_req *q = &req[out->item[at] - 1];
        kv_iov v = { out->buf, q->len };
        int rc = s->be->load(s->be->ctx, q->ns, &q->id, q->index, &v, 1);
        if (rc != KV_OK)
            return rc;
        out->iov[at].iov_base = out->buf;
        out->item[at] = 0;
    }
    size_t k = at + 1;
    while (k < out->cnt && !out->item[k])
        k++;
    *cnt = k - at;
    return KV_OK;
}

void kv__serve_out_free(struct kv__serve *s, struct kv__serve_out *out)
{
    struct kv__backend *be = s->be;
    for (size_t i = 0; i < out->npins; i++)
        be->unpin(be->ctx, &out->pins[i]);
    kv__serve_bounce_put(s, out->buf, out->buflen);
    free(out->pins);
    free(out->iov);
    free(out->item);
    memset(out, 0, sizeof *out);
}

/* ---- dumps from the wire ---------------------------------------------- */

/* A plain key's copy from a member, which the backend judges against the
 * removes it served (store_copy), rather than a write. */
static int is_copy(const struct kv__backend *be, const struct kv__wire_req *q)
{
    return be->store_copy && q->ns == KV_NS_KEY && (q->bflags & KV_BATCH_INTERNAL) && q->stamp;
}

int kv__serve_commit(struct kv__serve *s, const struct kv__wire_req *q, kv__resv *r)
{
    struct kv__backend *be = s->be;
    if (is_copy(be, q))
        return be->store_copy(be->ctx, q->ns, &q->id, q->index, q->flags & KV_WIRE_REPLACE,
                              q->stamp, r, NULL, 0);
    return be->commit(be->ctx, r, q->ns, &q->id, q->index);
}

void kv__serve_dump_begin(struct kv__serve *s, const struct kv__wire_req *q, int bounce_ok,
                          struct kv__serve_dump *d)
{
    struct kv__backend *be = s->be;
    memset(d, 0, sizeof *d);
    d->len = q->len;
    int rc = be->admit ? be->admit(be->ctx, q->ns, &q->id, q->view, q->bflags) : KV_OK;
    if (rc != KV_OK) {   /* not ours to store: nothing is, not even the removal */
        d->how = KV__DUMP_DRAIN;
        d->status = rc;
        return;
    }
    if ((q->flags & KV_WIRE_REPLACE) && !is_copy(be, q)) {
        /* A put: the old value goes first. A racing put may still land
         * between this and the commit; then one whole value wins. (A
         * copy's old value goes in store_copy, once the copy is judged.) */
        rc = remove_key(be, q->ns, &q->id, q->index);
        if (rc != KV_OK && rc != KV_ENOTFOUND) {
            d->how = KV__DUMP_DRAIN;
            d->status = rc;
            return;
        }
    } else if (!(q->flags & KV_WIRE_REPLACE) && present(be, q->ns, &q->id, q->index)) {
        /* A shard already stored is skipped (it counts as success): its
         * bytes are drained rather than given room, which could evict
         * other blocks for nothing. Commit still resolves races. */
        d->how = KV__DUMP_SKIP;
        return;
    }
    rc = be->reserve ? be->reserve(be->ctx, q->len, &d->resv) : KV_ENOSPC;
    if (rc == KV_OK) {
        d->how = KV__DUMP_RESV;
        return;
    }
    /* No segment (SSD only): copy in through a bounce buffer. */
    if (bounce_ok && be->dump && !be->seg_len && q->len <= KV_NET_BOUNCE_MAX) {
        if ((d->buf = kv__serve_bounce_get(s, q->len))) {
            d->how = KV__DUMP_BOUNCE;
            return;
        }
        rc = KV_EBUSY;      /* the node's bounce budget is spent for now */
    }
    d->how = KV__DUMP_DRAIN;
    d->status = rc == KV_ENOMEM || rc == KV_EBUSY ? rc : KV_ENOSPC;
}

void *kv__serve_dump_dst(const struct kv__serve_dump *d, uint64_t got)
{
    if (d->how == KV__DUMP_RESV)
        return (uint8_t *)d->resv.data + got;
    if (d->how == KV__DUMP_BOUNCE)
        return (uint8_t *)d->buf + got;
    return NULL;
}

int kv__serve_dump_end(struct kv__serve *s, const struct kv__wire_req *q,
                       struct kv__serve_dump *d)
{
    struct kv__backend *be = s->be;
    if (d->how == KV__DUMP_RESV) {
        d->status = kv__serve_commit(s, q, &d->resv);
    } else if (d->how == KV__DUMP_BOUNCE) {
        kv_iov v = { d->buf, q->len };
        d->status = is_copy(be, q)
                    ? be->store_copy(be->ctx, q->ns, &q->id, q->index,
                                     q->flags & KV_WIRE_REPLACE, q->stamp, NULL, &v, 1)
                    : be->dump(be->ctx, q->ns, &q->id, q->index, &v, 1);
        kv__serve_bounce_put(s, d->buf, q->len);
        d->buf = NULL;
    }
    d->how = KV__DUMP_DRAIN;
    return d->status;
}

void kv__serve_dump_abort(struct kv__serve *s, struct kv__serve_dump *d)
{
    if (d->how == KV__DUMP_RESV)
        s->be->abort(s->be->ctx, &d->resv);
    kv__serve_bounce_put(s, d->buf, d->len);
    d->buf = NULL;
    d->how = KV__DUMP_DRAIN;
}

/* ---- items whose bytes are in this process ---------------------------- */

void kv__serve_ops(struct kv__backend *be, struct kv__op *ops, size_t n)
{
#define OP_LOOKUP(i) (ops[i].kind == KV_OP_LOOKUP)
#define OP_NS(i) (ops[i].ns)
#define OP_ID(i) (ops[i].id)
#define OP_PUT(i, rc, h) (ops[i].result = (rc), ops[i].hit = (h))
    SERVE_LOOKUPS(be, n, OP_LOOKUP, OP_NS, OP_ID, OP_PUT);
    for (size_t i = 0; i < n; i++) {
        struct kv__op *o = &ops[i];
        switch (o->kind) {
        case KV_OP_LOOKUP:
            break;      /* above */
        case KV_OP_SIZE:
            o->result = be->size(be->ctx, o->ns, &o->id, o->index, &o->len);
            break;
        case KV_OP_LOAD:
            o->result = be->load(be->ctx, o->ns, &o->id, o->index, o->iov, o->iovcnt);
            break;
        case KV_OP_REMOVE:
            o->result = remove_key(be, o->ns, &o->id, o->index);
            break;
        case KV_OP_CLEAR:
            o->result = clear_keys(be, o->ns, o->index, &o->id, &o->len);
            break;
        case KV_OP_DUMP: {
            if (o->replace) {
                o->result = remove_key(be, o->ns, &o->id, o->index);
                if (o->result != KV_OK && o->result != KV_ENOTFOUND)
                    break;
            } else if (present(be, o->ns, &o->id, o->index)) {
                o->result = KV_OK;   /* already stored: skipped, a success */
                break;
            }
            if (be->dump) {   /* one copy either way; no reservation */
                o->result = be->dump(be->ctx, o->ns, &o->id, o->index, o->iov, o->iovcnt);
                break;
            }
            kv__resv r;
            o->result = be->reserve(be->ctx, kv__iov_len(o->iov, o->iovcnt), &r);
            if (o->result == KV_OK) {
                uint8_t *d = r.data;
                for (uint32_t j = 0; j < o->iovcnt; j++) {
                    memcpy(d, o->iov[j].base, o->iov[j].len);
                    d += o->iov[j].len;
                }
                o->result = be->commit(be->ctx, &r, o->ns, &o->id, o->index);
            }
            break;
        }
        }
    }
}

/* ---- listeners -------------------------------------------------------- */

void kv__net_refuse_one(int lfd, int *spare)
{
    if (*spare < 0)
        return;
    close(*spare);
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0)
        close(fd);
    *spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* ---- exposure --------------------------------------------------------- */

int kv__net_check_exposure(const char *what, const char *addr, const char *token, int insecure,
                           char *err, size_t errlen)
{
    struct sockaddr_in sa;
    if (token[0] || kv__net_parse_addr(addr, &sa) != KV_OK)
        return KV_OK;   /* a bad address is the listener's to report */
    if ((ntohl(sa.sin_addr.s_addr) >> 24) == 127)
        return KV_OK;
    if (insecure) {
        KV_WARN("%s %s: serving without cluster.token beyond loopback "
                "(cluster.insecure: true): anyone who reaches it can read and write",
                what, addr);
        return KV_OK;
    }
    kv__errf(err, errlen, "%s %s listens beyond loopback without cluster.token: set a "
             "token, listen on 127.0.0.1, or set cluster.insecure: true", what, addr);
    return KV_ECONFIG;
}
