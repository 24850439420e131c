/*
 * proto.c — encoders and decoders for the frames of proto.h.
 *
 * Every decoder checks each length against what is left of its input, and
 * each field's range, before it writes a byte of output or allocates: a
 * peer's frame is untrusted input. Anything off is KV_EPROTO.
 */
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
/* The end-to-end sum runs over every loaded byte on both ends: libxxhash's
 * dispatching entry points pick AVX2 (or AVX-512) where the CPU has it,
 * 2-3x the SSE2 build's speed; the sums are the same bytes either way. */
#include <xxh_x86dispatch.h>
#endif

#include "auth.h"
#include "proto.h"

void kv__hdr_encode(const struct kv__hdr *h, uint8_t *out)
{
    kv__put32(out, KV_PROTO_MAGIC);
    out[4] = KV_PROTO_VERSION;
    out[5] = h->type;
    kv__put16(out + 6, h->flags);
    kv__put32(out + 8, h->body_len);
    kv__put32(out + 12, (uint32_t)h->status);
    kv__put64(out + 16, h->req_id);
    kv__put64(out + 24, h->data_len);
}

static int known_type(uint8_t t)
{
    return (t >= KV_MSG_BATCH && t <= KV_MSG_LEAVE) ||
           (t >= KV_MSG_RDMA_FIRST && t <= KV_MSG_RDMA_LAST);
}

int kv__hdr_decode(const uint8_t *in, uint64_t max_data, struct kv__hdr *h)
{
    if (kv__get32(in) != KV_PROTO_MAGIC || in[4] != KV_PROTO_VERSION || !known_type(in[5]))
        return KV_EPROTO;
    uint32_t body = kv__get32(in + 8);
    uint64_t data = kv__get64(in + 24);
    if (body > KV_PROTO_BODY_MAX)
        return KV_EPROTO;
    /* Only batches carry values; everything else is all descriptor. */
    if (data && in[5] != KV_MSG_BATCH && in[5] != KV_MSG_BATCH_R)
        return KV_EPROTO;
    if (data > max_data)
        return KV_EPROTO;
    h->version = in[4];
    h->type = in[5];
    h->flags = kv__get16(in + 6);
    h->body_len = body;
    h->status = (int32_t)kv__get32(in + 12);
    h->req_id = kv__get64(in + 16);
    h->data_len = data;
    return KV_OK;
}

size_t kv__batch_body_len(size_t n) { return KV_PROTO_BATCH_HDR + n * KV_PROTO_REQ_ITEM; }
size_t kv__batch_r_body_len(size_t n) { return 4 + n * KV_PROTO_RESP_ITEM; }

int kv__batch_count(const uint8_t *body, size_t len, size_t item_len, size_t *n)
{
    if (len < 4)
        return KV_EPROTO;
    size_t hdr = item_len == KV_PROTO_REQ_ITEM ? KV_PROTO_BATCH_HDR : 4;
    if (len < hdr)
        return KV_EPROTO;
    uint32_t cnt = kv__get32(body);
    if (cnt > KV_PROTO_BATCH_MAX || len != hdr + (size_t)cnt * item_len)
        return KV_EPROTO;
    *n = cnt;
    return KV_OK;
}

void kv__wire_from_ops(const struct kv__op *ops, size_t n, struct kv__wire_req *out)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = (struct kv__wire_req){ .kind = ops[i].kind, .ns = ops[i].ns,
                                        .flags = ops[i].replace ? KV_WIRE_REPLACE
                                               : ops[i].kind == KV_OP_CLEAR && ops[i].index
                                               ? KV_WIRE_PREFIX : 0,
                                        .index = ops[i].index, .id = ops[i].id,
                                        .view = ops[0].view,
                                        .bflags = ops[0].internal ? KV_BATCH_INTERNAL : 0,
                                        .stamp = ops[0].internal ? ops[0].stamp : 0 };
        if (ops[i].kind == KV_OP_DUMP || ops[i].kind == KV_OP_LOAD)
            out[i].len = kv__iov_len(ops[i].iov, ops[i].iovcnt);
    }
}

int kv__batch_encode(const struct kv__wire_req *it, size_t n, uint8_t *out, size_t cap)
{
    if (n > KV_PROTO_BATCH_MAX || cap < kv__batch_body_len(n))
        return KV_ENOBUFS;
    kv__put32(out, (uint32_t)n);
    kv__put32(out + 4, n ? it[0].bflags : 0);
    kv__put64(out + 8, n ? it[0].view : 0);
    kv__put64(out + 16, n ? it[0].stamp : 0);
    uint8_t *p = out + KV_PROTO_BATCH_HDR;
    for (size_t i = 0; i < n; i++, p += KV_PROTO_REQ_ITEM) {
        p[0] = it[i].kind;
        p[1] = it[i].ns;
        kv__put16(p + 2, it[i].flags);
        kv__put32(p + 4, it[i].index);
        memcpy(p + 8, it[i].id.bytes, KV_BLOCK_ID_LEN);
        kv__put64(p + 24, it[i].len);
    }
    return (int)kv__batch_body_len(n);
}

int kv__batch_decode(const uint8_t *body, size_t len, struct kv__wire_req *out, size_t *n)
{
    size_t cnt;
    if (kv__batch_count(body, len, KV_PROTO_REQ_ITEM, &cnt) != KV_OK || cnt > *n)
        return KV_EPROTO;
    uint32_t bflags = kv__get32(body + 4);
    uint64_t view = kv__get64(body + 8), stamp = kv__get64(body + 16);
    if ((bflags & ~KV_BATCH_INTERNAL) || (stamp && !(bflags & KV_BATCH_INTERNAL)))
        return KV_EPROTO;   /* only a member's copies carry a stamp */
    const uint8_t *p = body + KV_PROTO_BATCH_HDR;
    for (size_t i = 0; i < cnt; i++, p += KV_PROTO_REQ_ITEM) {
        if (p[0] < KV_OP_LOOKUP || p[0] > KV_OP_CLEAR || p[1] >= KV_NS_COUNT)
            return KV_EPROTO;
        uint16_t fl = kv__get16(p + 2);
        if ((fl & ~KV_WIRE_REPLACE) || (fl && p[0] != KV_OP_DUMP))
            if (p[0] != KV_OP_CLEAR || fl != KV_WIRE_PREFIX)
                return KV_EPROTO;
        if (p[0] == KV_OP_CLEAR && (fl == KV_WIRE_PREFIX) != (kv__get32(p + 4) != 0))
            return KV_EPROTO;   /* a prefix clear says so, both ways */
        if (p[0] == KV_OP_DUMP || p[0] == KV_OP_LOAD) {
            if (kv__get64(p + 24) > KV_VALUE_MAX)
                return KV_EPROTO;
        }
    }
    p = body + KV_PROTO_BATCH_HDR;
    for (size_t i = 0; i < cnt; i++, p += KV_PROTO_REQ_ITEM) {
        out[i].kind = p[0];
        out[i].ns = p[1];
        out[i].flags = kv__get16(p + 2);
        out[i].index = kv__get32(p + 4);
        memcpy(out[i].id.bytes, p + 8, KV_BLOCK_ID_LEN);
        out[i].len = kv__get64(p + 24);
        out[i].view = view;
        out[i].bflags = bflags;
        out[i].stamp = stamp;
    }
    *n = cnt;
    return KV_OK;
}

int kv__batch_r_encode(const struct kv__wire_resp *it, size_t n, uint8_t *out, size_t cap)
{
    if (n > KV_PROTO_BATCH_MAX || cap < kv__batch_r_body_len(n))
        return KV_ENOBUFS;
    kv__put32(out, (uint32_t)n);
    uint8_t *p = out + 4;
    for (size_t i = 0; i < n; i++, p += KV_PROTO_RESP_ITEM) {
        memset(p, 0, KV_PROTO_RESP_ITEM);
        kv__put32(p, (uint32_t)it[i].status);
        p[4] = it[i].hit;
        kv__put64(p + 8, it[i].len);
        kv__put64(p + 16, it[i].addr);
        kv__put32(p + 24, it[i].rkey);
        kv__put64(p + 32, it[i].handle);
        kv__put64(p + 40, it[i].sum);
    }
    return (int)kv__batch_r_body_len(n);
}

int kv__batch_r_decode(const uint8_t *body, size_t len, struct kv__wire_resp *out, size_t *n)
{
    size_t cnt;
    if (kv__batch_count(body, len, KV_PROTO_RESP_ITEM, &cnt) != KV_OK || cnt > *n)
        return KV_EPROTO;
    const uint8_t *p = body + 4;
    for (size_t i = 0; i < cnt; i++, p += KV_PROTO_RESP_ITEM)
        if (!kv__status_valid((int32_t)kv__get32(p)) || p[4] > 1 ||
            kv__get64(p + 8) > KV_VALUE_MAX)
            return KV_EPROTO;
    p = body + 4;
    for (size_t i = 0; i < cnt; i++, p += KV_PROTO_RESP_ITEM) {
        out[i].status = (int32_t)kv__get32(p);
        out[i].hit = p[4];
        out[i].len = kv__get64(p + 8);
        out[i].addr = kv__get64(p + 16);
        out[i].rkey = kv__get32(p + 24);
        out[i].handle = kv__get64(p + 32);
        out[i].sum = kv__get64(p + 40);
    }
    *n = cnt;
    return KV_OK;
}

/* ---- strings: u16 length + bytes, at most KV_PROTO_ID_MAX --------------- */

static int put_str(uint8_t **p, uint8_t *end, const char *s)
{
    size_t l = strlen(s);
    if (l > KV_PROTO_ID_MAX || (size_t)(end - *p) < 2 + l)
        return KV_ENOBUFS;
    kv__put16(*p, (uint16_t)l);
    memcpy(*p + 2, s, l);
    *p += 2 + l;
    return KV_OK;
}

static int get_str(const uint8_t **p, const uint8_t *end, char *out, size_t cap)
{
    if (end - *p < 2)
        return KV_EPROTO;
    size_t l = kv__get16(*p);
    if (l > KV_PROTO_ID_MAX || l + 1 > cap || (size_t)(end - *p - 2) < l ||
        memchr(*p + 2, 0, l))
        return KV_EPROTO;
    memcpy(out, *p + 2, l);
    out[l] = 0;
    *p += 2 + l;
    return KV_OK;
}

#define MEMBER_FIGURES (8 * 8)   /* the eight u64 figures after the lease */

size_t kv__member_wire_len(const struct kv__member *m)
{
    return 2 + strlen(m->id) + 2 + strlen(m->addr) + 8 + (size_t)m->nseg * 20 + 8 +
           MEMBER_FIGURES + 2 + strlen(m->version) + sizeof m->mac;
}

int kv__member_same_place(const struct kv__member *a, const struct kv__member *b)
{
    return strcmp(a->id, b->id) == 0 && strcmp(a->addr, b->addr) == 0 && a->flags == b->flags &&
           a->nseg == b->nseg && a->lease == b->lease &&
           memcmp(a->seg, b->seg, a->nseg * sizeof a->seg[0]) == 0;
}

/* The member's fields up to its mac (what kv__member_sign covers). */
static int put_fields(uint8_t **p, uint8_t *end, const struct kv__member *m)
{
    if (m->nseg > KV_PROTO_SEG_MAX)
        return KV_EINVAL;
    if (put_str(p, end, m->id) || put_str(p, end, m->addr))
        return KV_ENOBUFS;
    if ((size_t)(end - *p) < 8 + (size_t)m->nseg * 20)
        return KV_ENOBUFS;
    kv__put32(*p, m->flags);
    kv__put32(*p + 4, m->nseg);
    *p += 8;
    for (uint32_t i = 0; i < m->nseg; i++, *p += 20) {
        kv__put64(*p, m->seg[i].base);
        kv__put64(*p + 8, m->seg[i].len);
        kv__put32(*p + 16, m->seg[i].rkey);
    }
    if ((size_t)(end - *p) < 8 + MEMBER_FIGURES)
        return KV_ENOBUFS;
    const uint64_t fig[] = { m->lease, m->dram_capacity, m->dram_used, m->ssd_capacity,
                             m->ssd_used, m->dram_blocks, m->ssd_blocks, m->keys, m->stamp_ms };
    for (size_t i = 0; i < KV__ARRAY_LEN(fig); i++, *p += 8)
        kv__put64(*p, fig[i]);
    if (memchr(m->version, 0, sizeof m->version) == NULL)
        return KV_EINVAL;
    return put_str(p, end, m->version) ? KV_ENOBUFS : KV_OK;
}

static int put_member(uint8_t **p, uint8_t *end, const struct kv__member *m)
{
    int rc = put_fields(p, end, m);
    if (rc)
        return rc;
    if ((size_t)(end - *p) < sizeof m->mac)
        return KV_ENOBUFS;
    memcpy(*p, m->mac, sizeof m->mac);
    *p += sizeof m->mac;
    return KV_OK;
}

int kv__member_sane(const struct kv__member *m)
{
    if (!m->id[0])
        return 0;
    for (const char *p = m->id; *p; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
            return 0;
    if (!m->addr[0] && !(m->flags & KV_MEMBER_OWNER))
        return 1;   /* a pure client serves nothing: no address */
    const char *colon = strrchr(m->addr, ':');
    if (!colon || colon == m->addr || !colon[1] || strlen(colon + 1) > 5)
        return 0;
    for (const char *p = m->addr; p < colon; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            return 0;
    unsigned port = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        port = port * 10 + (unsigned)(*p - '0');
    }
    return port >= 1 && port <= 65535;
}

static const char member_label[] = "kvengine/member";

/* The signed bytes of m: its wire form up to the mac. */
static int member_fields(const struct kv__member *m, uint8_t *buf, size_t cap, size_t *len)
{
    uint8_t *p = buf;
    int rc = put_fields(&p, buf + cap, m);
    *len = (size_t)(p - buf);
    return rc;
}

int kv__member_sign(const char *token, struct kv__member *m)
{
    uint8_t buf[sizeof(struct kv__member) + 64];
    size_t len;
    int rc = member_fields(m, buf, sizeof buf, &len);
    return rc ? rc : kv__auth_sign(token, member_label, buf, len, m->mac);
}

int kv__member_verify(const char *token, const struct kv__member *m)
{
    uint8_t buf[sizeof(struct kv__member) + 64];
    size_t len;
    return member_fields(m, buf, sizeof buf, &len) == KV_OK &&
           kv__auth_check(token, member_label, buf, len, m->mac);
}

static int get_member(const uint8_t **p, const uint8_t *end, struct kv__member *m)
{
    if (get_str(p, end, m->id, sizeof m->id) || get_str(p, end, m->addr, sizeof m->addr))
        return KV_EPROTO;
    if (end - *p < 8)
        return KV_EPROTO;
    m->flags = kv__get32(*p);
    m->nseg = kv__get32(*p + 4);
    *p += 8;
    if (m->nseg > KV_PROTO_SEG_MAX || (size_t)(end - *p) < (size_t)m->nseg * 20 || !m->id[0])
        return KV_EPROTO;
    for (uint32_t i = 0; i < m->nseg; i++, *p += 20) {
        m->seg[i].base = kv__get64(*p);
        m->seg[i].len = kv__get64(*p + 8);
        m->seg[i].rkey = kv__get32(*p + 16);
    }
    if ((size_t)(end - *p) < 8 + MEMBER_FIGURES)
        return KV_EPROTO;
    uint64_t *fig[] = { &m->lease, &m->dram_capacity, &m->dram_used, &m->ssd_capacity,
                        &m->ssd_used, &m->dram_blocks, &m->ssd_blocks, &m->keys, &m->stamp_ms };
    for (size_t i = 0; i < KV__ARRAY_LEN(fig); i++, *p += 8)
        *fig[i] = kv__get64(*p);
    if (get_str(p, end, m->version, sizeof m->version) || (size_t)(end - *p) < sizeof m->mac)
        return KV_EPROTO;
    memcpy(m->mac, *p, sizeof m->mac);
    *p += sizeof m->mac;
    return KV_OK;
}

int kv__join_encode(const struct kv__member *m, uint8_t *out, size_t cap)
{
    uint8_t *p = out, *end = out + cap;
    int rc = put_member(&p, end, m);
    return rc < 0 ? rc : (int)(p - out);
}

/* After the fields: nothing, or (secret non-NULL) exactly a secret. */
static int get_secret(const uint8_t *p, const uint8_t *end, uint8_t *secret, int *has)
{
    if (has)
        *has = 0;
    if (p == end)
        return KV_OK;
    if (!secret || end - p != KV_PROTO_SECRET_LEN)
        return KV_EPROTO;
    memcpy(secret, p, KV_PROTO_SECRET_LEN);
    *has = 1;
    return KV_OK;
}

int kv__join_decode_secret(const uint8_t *body, size_t len, struct kv__member *m,
                           uint8_t *secret, int *has)
{
    const uint8_t *p = body, *end = body + len;
    if (get_member(&p, end, m) ||
        get_secret(p, end, secret, has))
        return KV_EPROTO;
    return KV_OK;
}

int kv__join_decode(const uint8_t *body, size_t len, struct kv__member *m)
{
    return kv__join_decode_secret(body, len, m, NULL, NULL);
}

int kv__view_encode(uint64_t version, const struct kv__member *m, size_t n,
                    uint8_t *out, size_t cap)
{
    if (n > KV_PROTO_VIEW_MAX || cap < 12)
        return KV_ENOBUFS;
    kv__put64(out, version);
    kv__put32(out + 8, (uint32_t)n);
    uint8_t *p = out + 12, *end = out + cap;
    for (size_t i = 0; i < n; i++) {
        int rc = put_member(&p, end, &m[i]);
        if (rc)
            return rc;
    }
    return (int)(p - out);
}

int kv__view_decode(const uint8_t *body, size_t len, uint64_t *version,
                    struct kv__member **members, size_t *n)
{
    return kv__view_decode_secret(body, len, version, members, n, NULL, NULL);
}

int kv__view_decode_secret(const uint8_t *body, size_t len, uint64_t *version,
                           struct kv__member **members, size_t *n, uint8_t *secret, int *has)
{
    *members = NULL;
    *n = 0;
    if (len < 12)
        return KV_EPROTO;
    uint32_t cnt = kv__get32(body + 8);
    /* Each member takes at least 118 bytes: refuse counts the body cannot
     * hold before allocating for them. */
    if (cnt > KV_PROTO_VIEW_MAX || (size_t)cnt * (52 + MEMBER_FIGURES + 2) > len - 12)
        return KV_EPROTO;
    struct kv__member *m = calloc(cnt ? cnt : 1, sizeof *m);
    if (!m)
        return KV_ENOMEM;
    const uint8_t *p = body + 12, *end = body + len;
    for (uint32_t i = 0; i < cnt; i++)
        if (get_member(&p, end, &m[i])) {
            free(m);
            return KV_EPROTO;
        }
    if (get_secret(p, end, secret, has)) {
        free(m);
        return KV_EPROTO;
    }
    *version = kv__get64(body);
    *members = m;
    *n = cnt;
    return KV_OK;
}

uint64_t kv__sum(const void *p, size_t len)
{
    return XXH3_64bits(p, len);
}

uint64_t kv__sum_iov(const kv_iov *iov, uint32_t cnt)
{
    if (cnt == 1)
        return XXH3_64bits(iov[0].base, iov[0].len);
    /* Zeroed first: xxhash 0.8.1's reset reads the state it resets. */
    XXH3_state_t st;
    memset(&st, 0, sizeof st);
    XXH3_64bits_reset(&st);
    for (uint32_t i = 0; i < cnt; i++)
        if (iov[i].len)
            XXH3_64bits_update(&st, iov[i].base, iov[i].len);
    return XXH3_64bits_digest(&st);
}

void *kv__sum_state_new(void)
{
    return XXH3_createState();
}

void kv__sum_reset(void *st)
{
    XXH3_64bits_reset(st);
}

void kv__sum_update(void *st, const void *p, size_t len)
{
    if (len)
        XXH3_64bits_update(st, p, len);
}

uint64_t kv__sum_digest(void *st)
{
    return XXH3_64bits_digest(st);
}

void kv__sum_state_free(void *st)
{
    XXH3_freeState(st);
}
