/*
 * check_proto.c — the wire format (net/proto.c) and placement.
 *
 * Every decoder is fed round trips, then every truncation, oversized
 * lengths, and unknown versions, types, kinds and statuses: all must be
 * refused with KV_EPROTO and nothing written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/placement.h"
#include "net/proto.h"
#include "testutil.h"

static void hdr_bytes(uint8_t *b, uint8_t type, uint32_t body, uint64_t data)
{
    struct kv__hdr h = { .type = type, .flags = 7, .body_len = body, .status = KV_ENOSPC,
                         .req_id = 0x1122334455667788ull, .data_len = data };
    kv__hdr_encode(&h, b);
}

START_TEST(hdr_round_trip)
{
    uint8_t b[KV_PROTO_HDR_LEN];
    struct kv__hdr h;
    hdr_bytes(b, KV_MSG_BATCH, 100, 1 << 20);
    ck_assert_int_eq(kv__hdr_decode(b, 1 << 20, &h), KV_OK);
    ck_assert_int_eq(h.type, KV_MSG_BATCH);
    ck_assert_int_eq(h.version, KV_PROTO_VERSION);
    ck_assert_int_eq(h.flags, 7);
    ck_assert_uint_eq(h.body_len, 100);
    ck_assert_int_eq(h.status, KV_ENOSPC);
    ck_assert_uint_eq(h.req_id, 0x1122334455667788ull);
    ck_assert_uint_eq(h.data_len, 1 << 20);
}
END_TEST

START_TEST(hdr_refusals)
{
    uint8_t b[KV_PROTO_HDR_LEN];
    struct kv__hdr h;
    memset(&h, 0xab, sizeof h);
    struct kv__hdr before = h;

    hdr_bytes(b, KV_MSG_BATCH, KV_PROTO_BODY_MAX + 1, 0);      /* oversized body */
    ck_assert_int_eq(kv__hdr_decode(b, UINT64_MAX, &h), KV_EPROTO);
    hdr_bytes(b, KV_MSG_BATCH, 0, 1001);                       /* data over the cap */
    ck_assert_int_eq(kv__hdr_decode(b, 1000, &h), KV_EPROTO);
    hdr_bytes(b, KV_MSG_JOIN, 10, 1);                          /* data where none goes */
    ck_assert_int_eq(kv__hdr_decode(b, UINT64_MAX, &h), KV_EPROTO);
    hdr_bytes(b, KV_MSG_JOIN, 10, 0);
    b[4] = KV_PROTO_VERSION + 1;                               /* unknown version */
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_EPROTO);
    hdr_bytes(b, 0, 0, 0);                                     /* unknown types */
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_EPROTO);
    hdr_bytes(b, 99, 0, 0);
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_EPROTO);
    hdr_bytes(b, 1, 0, 0);                                     /* version 1's HELLO */
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_EPROTO);
    hdr_bytes(b, 2, 0, 0);
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_EPROTO);
    hdr_bytes(b, KV_MSG_LEAVE + 1, 0, 0);
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_EPROTO);
    hdr_bytes(b, KV_MSG_JOIN, 0, 0);
    b[0] ^= 1;                                                 /* bad magic */
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_EPROTO);
    ck_assert(memcmp(&h, &before, sizeof h) == 0);             /* untouched */
    /* the RDMA range is accepted */
    hdr_bytes(b, KV_MSG_RDMA_FIRST, 0, 0);
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_OK);
}
END_TEST

static void some_reqs(struct kv__wire_req *q, size_t n)
{
    for (size_t i = 0; i < n; i++)
        q[i] = (struct kv__wire_req){ .kind = (uint8_t)(KV_OP_LOOKUP + i % 5),
                                      .ns = (uint8_t)(i % 2), .index = (uint32_t)i * 3,
                                      .id = tu_id(i, 1), .len = i * 1000,
                                      .flags = i % 5 == KV_OP_DUMP - 1 && i % 2 ? KV_WIRE_REPLACE : 0 };
}

START_TEST(batch_round_trip)
{
    enum { N = 37 };
    struct kv__wire_req q[N], q2[N];
    some_reqs(q, N);
    size_t len = kv__batch_body_len(N);
    uint8_t *b = malloc(len);
    ck_assert_int_eq(kv__batch_encode(q, N, b, len), (int)len);
    ck_assert_int_eq(kv__batch_encode(q, N, b, len - 1), KV_ENOBUFS);
    size_t n = N;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_OK);
    ck_assert_uint_eq(n, N);
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(q2[i].kind, q[i].kind);
        ck_assert_int_eq(q2[i].ns, q[i].ns);
        ck_assert_int_eq(q2[i].flags, q[i].flags);
        ck_assert_uint_eq(q2[i].index, q[i].index);
        ck_assert_uint_eq(q2[i].len, q[i].len);
        ck_assert(memcmp(&q2[i].id, &q[i].id, sizeof q[i].id) == 0);
        ck_assert_uint_eq(q2[i].view, 0);
        ck_assert_uint_eq(q2[i].bflags, 0);
    }
    /* every truncation, and one byte too many, is refused */
    for (size_t cut = 0; cut < len; cut++) {
        n = N;
        ck_assert_int_eq(kv__batch_decode(b, cut, q2, &n), KV_EPROTO);
    }
    uint8_t *b2 = calloc(1, len + 1);
    memcpy(b2, b, len);
    n = N;
    ck_assert_int_eq(kv__batch_decode(b2, len + 1, q2, &n), KV_EPROTO);
    /* room for fewer items than the body holds */
    n = N - 1;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    /* unknown kind, unknown namespace, a value larger than KV_VALUE_MAX */
    uint8_t *item = b + KV_PROTO_BATCH_HDR + 5 * KV_PROTO_REQ_ITEM;
    uint8_t save = item[0];
    item[0] = 9;
    n = N;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    item[0] = KV_OP_CLEAR + 1;   /* the first kind past the last */
    n = N;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    item[0] = KV_OP_CLEAR;
    uint32_t save_index = kv__get32(item + 4);
    kv__put32(item + 4, 0);
    n = N;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_OK);
    /* a prefix clear (index = the prefix's length) says so with its flag,
     * and the flag means nothing on a clear of everything or another kind */
    kv__put32(item + 4, 7);
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    kv__put16(item + 2, KV_WIRE_PREFIX);
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_OK);
    kv__put32(item + 4, 0);
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    item[0] = KV_OP_REMOVE;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    kv__put16(item + 2, 0);
    kv__put32(item + 4, save_index);
    struct kv__op cop = { .kind = KV_OP_CLEAR, .index = 7 };
    struct kv__wire_req cq;
    kv__wire_from_ops(&cop, 1, &cq);
    ck_assert_uint_eq(cq.flags, KV_WIRE_PREFIX);
    cop.index = 0;
    kv__wire_from_ops(&cop, 1, &cq);
    ck_assert_uint_eq(cq.flags, 0);
    item[0] = save;
    item[1] = KV_NS_COUNT;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    item[1] = 0;
    /* flags: unknown bits, and replace on anything but a dump */
    item[0] = KV_OP_DUMP;
    kv__put16(item + 2, 2);
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    item[0] = KV_OP_REMOVE;
    kv__put16(item + 2, KV_WIRE_REPLACE);
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    kv__put16(item + 2, 0);
    item[0] = KV_OP_DUMP;
    kv__put64(item + 24, (uint64_t)KV_VALUE_MAX + 1);
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    /* a count beyond the batch limit */
    kv__put32(b, KV_PROTO_BATCH_MAX + 1);
    ck_assert_int_eq(kv__batch_count(b, len, KV_PROTO_REQ_ITEM, &n), KV_EPROTO);
    free(b);
    free(b2);
}
END_TEST

/* Versions 3 and 4: a BATCH says which view its sender routed by, whether
 * it is a member's own copy, and for copies when their values were read
 * (the stamp); the first item's fields stand for the batch, and every
 * item decodes them. Unknown batch flags, and a stamp on a batch that is
 * no member's copy, are refused; a frame of versions 2 and 3 is not read
 * at all. */
START_TEST(batch_carries_the_senders_view)
{
    enum { N = 5 };
    struct kv__op ops[N];
    memset(ops, 0, sizeof ops);
    for (size_t i = 0; i < N; i++) {
        ops[i].kind = KV_OP_REMOVE;
        ops[i].id = tu_id(i, 2);
    }
    ops[0].view = 0x0123456789abcdefull;
    ops[0].internal = 1;
    ops[0].stamp = 1767225600123ull;
    struct kv__wire_req q[N], q2[N];
    kv__wire_from_ops(ops, N, q);
    size_t len = kv__batch_body_len(N);
    ck_assert_uint_eq(len, KV_PROTO_BATCH_HDR + N * KV_PROTO_REQ_ITEM);
    uint8_t b[KV_PROTO_BATCH_HDR + N * KV_PROTO_REQ_ITEM];
    ck_assert_int_eq(kv__batch_encode(q, N, b, len), (int)len);
    ck_assert_uint_eq(kv__get32(b), N);
    ck_assert_uint_eq(kv__get32(b + 4), KV_BATCH_INTERNAL);
    ck_assert_uint_eq(kv__get64(b + 8), 0x0123456789abcdefull);
    ck_assert_uint_eq(kv__get64(b + 16), 1767225600123ull);
    size_t n = N, cnt = 0;
    ck_assert_int_eq(kv__batch_count(b, len, KV_PROTO_REQ_ITEM, &cnt), KV_OK);
    ck_assert_uint_eq(cnt, N);
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_OK);
    for (size_t i = 0; i < N; i++) {
        ck_assert_uint_eq(q2[i].view, 0x0123456789abcdefull);
        ck_assert_uint_eq(q2[i].bflags, KV_BATCH_INTERNAL);
        ck_assert_uint_eq(q2[i].stamp, 1767225600123ull);
    }
    /* a caller's write: its view, no flag, and no stamp whatever its op says */
    ops[0].internal = 0;
    kv__wire_from_ops(ops, N, q);
    ck_assert_int_eq(kv__batch_encode(q, N, b, len), (int)len);
    ck_assert_uint_eq(kv__get64(b + 16), 0);
    n = N;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_OK);
    ck_assert_uint_eq(q2[N - 1].bflags, 0);
    ck_assert_uint_eq(q2[N - 1].stamp, 0);
    /* a stamp without the flag is refused */
    kv__put64(b + 16, 5);
    n = N;
    ck_assert_int_eq(kv__batch_decode(b, len, q2, &n), KV_EPROTO);
    kv__put64(b + 16, 0);
    /* unknown batch flags */
    for (uint32_t bit = 1; bit; bit <<= 1) {
        kv__put32(b + 4, bit);
        n = N;
        ck_assert_int_eq(kv__batch_decode(b, len, q2, &n),
                         bit == KV_BATCH_INTERNAL ? KV_OK : KV_EPROTO);
    }
    /* an empty batch is its header alone, and neither a version-2 body
     * (the count right before the items) nor a version-3 one (12 bytes
     * after the count) parses as one */
    uint8_t e[KV_PROTO_BATCH_HDR];
    ck_assert_int_eq(kv__batch_encode(q, 0, e, sizeof e), KV_PROTO_BATCH_HDR);
    n = N;
    ck_assert_int_eq(kv__batch_decode(e, sizeof e, q2, &n), KV_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kv__batch_count(e, 4, KV_PROTO_REQ_ITEM, &cnt), KV_EPROTO);
    uint8_t v2[4 + KV_PROTO_REQ_ITEM] = { 1 };
    n = N;
    ck_assert_int_eq(kv__batch_decode(v2, sizeof v2, q2, &n), KV_EPROTO);
    uint8_t v3[16 + KV_PROTO_REQ_ITEM] = { 1 };
    n = N;
    ck_assert_int_eq(kv__batch_decode(v3, sizeof v3, q2, &n), KV_EPROTO);
    uint8_t h[KV_PROTO_HDR_LEN];
    struct kv__hdr hd = { .type = KV_MSG_BATCH };
    kv__hdr_encode(&hd, h);
    ck_assert_int_eq(h[4], 4);
    for (uint8_t old = 2; old <= 3; old++) {
        h[4] = old;
        ck_assert_int_eq(kv__hdr_decode(h, 0, &hd), KV_EPROTO);
    }
}
END_TEST

START_TEST(batch_r_round_trip)
{
    enum { N = 9 };
    struct kv__wire_resp r[N], r2[N];
    for (size_t i = 0; i < N; i++)
        r[i] = (struct kv__wire_resp){ .status = i % 3 ? KV_OK : KV_ENOTFOUND, .hit = i & 1,
                                       .len = i * 77, .addr = 0xdead0000 + i,
                                       .rkey = (uint32_t)i + 5, .handle = i << 40,
                                       .sum = 0x1234567890abcdefull ^ i };
    size_t len = kv__batch_r_body_len(N);
    uint8_t b[4 + N * KV_PROTO_RESP_ITEM];
    ck_assert_int_eq(kv__batch_r_encode(r, N, b, sizeof b), (int)len);
    size_t n = N;
    ck_assert_int_eq(kv__batch_r_decode(b, len, r2, &n), KV_OK);
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(r2[i].status, r[i].status);
        ck_assert_int_eq(r2[i].hit, r[i].hit);
        ck_assert_uint_eq(r2[i].len, r[i].len);
        ck_assert_uint_eq(r2[i].addr, r[i].addr);
        ck_assert_uint_eq(r2[i].rkey, r[i].rkey);
        ck_assert_uint_eq(r2[i].handle, r[i].handle);
        ck_assert_uint_eq(r2[i].sum, r[i].sum);
    }
    for (size_t cut = 0; cut < len; cut++) {
        n = N;
        ck_assert_int_eq(kv__batch_r_decode(b, cut, r2, &n), KV_EPROTO);
    }
    kv__put32(b + 4, 5);   /* a positive status is not a KV_E* code */
    n = N;
    ck_assert_int_eq(kv__batch_r_decode(b, len, r2, &n), KV_EPROTO);
    kv__put32(b + 4, (uint32_t)-1);   /* nor is a code outside the map */
    ck_assert_int_eq(kv__batch_r_decode(b, len, r2, &n), KV_EPROTO);
}
END_TEST

static struct kv__member member(int i)
{
    struct kv__member m;
    memset(&m, 0, sizeof m);
    snprintf(m.id, sizeof m.id, "node-%d", i);
    snprintf(m.addr, sizeof m.addr, "127.0.0.1:%d", 40000 + i);
    m.flags = i % 2 ? KV_MEMBER_OWNER : 0;
    m.nseg = (uint32_t)i % 3;
    for (uint32_t s = 0; s < m.nseg; s++)
        m.seg[s] = (struct kv__segdesc){ .base = 0x7f0000000000ull + s, .len = 1 << 30,
                                         .rkey = 42 + s };
    m.dram_capacity = 1ull << 33;
    m.dram_used = 1000u + (unsigned)i;
    m.ssd_capacity = 1ull << 36;
    m.ssd_used = 2000u + (unsigned)i;
    m.dram_blocks = 3u + (unsigned)i;
    m.ssd_blocks = 4u + (unsigned)i;
    m.keys = 5u + (unsigned)i;
    m.stamp_ms = 1764600000000ull + (unsigned)i;
    snprintf(m.version, sizeof m.version, "0.%d.0", i);
    return m;
}

START_TEST(view_round_trip)
{
    struct kv__member in[5];
    for (int i = 0; i < 5; i++)
        in[i] = member(i);
    uint8_t b[4096];
    int len = kv__view_encode(77, in, 5, b, sizeof b);
    ck_assert_int_gt(len, 0);
    uint64_t v = 0;
    struct kv__member *out = NULL;
    size_t n = 0;
    ck_assert_int_eq(kv__view_decode(b, (size_t)len, &v, &out, &n), KV_OK);
    ck_assert_uint_eq(v, 77);
    ck_assert_uint_eq(n, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_str_eq(out[i].id, in[i].id);
        ck_assert_str_eq(out[i].addr, in[i].addr);
        ck_assert_uint_eq(out[i].flags, in[i].flags);
        ck_assert_uint_eq(out[i].nseg, in[i].nseg);
        for (uint32_t s = 0; s < in[i].nseg; s++) {
            ck_assert_uint_eq(out[i].seg[s].base, in[i].seg[s].base);
            ck_assert_uint_eq(out[i].seg[s].rkey, in[i].seg[s].rkey);
        }
        /* the figures (issue 19) */
        ck_assert_uint_eq(out[i].dram_capacity, in[i].dram_capacity);
        ck_assert_uint_eq(out[i].dram_used, in[i].dram_used);
        ck_assert_uint_eq(out[i].ssd_capacity, in[i].ssd_capacity);
        ck_assert_uint_eq(out[i].ssd_used, in[i].ssd_used);
        ck_assert_uint_eq(out[i].dram_blocks, in[i].dram_blocks);
        ck_assert_uint_eq(out[i].ssd_blocks, in[i].ssd_blocks);
        ck_assert_uint_eq(out[i].keys, in[i].keys);
        ck_assert_uint_eq(out[i].stamp_ms, in[i].stamp_ms);
        ck_assert_str_eq(out[i].version, in[i].version);
        ck_assert_uint_eq(kv__member_wire_len(&in[i]),
                          (size_t)kv__join_encode(&in[i], (uint8_t[1024]){ 0 }, 1024));
        ck_assert(kv__member_same_place(&out[i], &in[i]));
    }
    /* the figures are not the place; the address is */
    struct kv__member moved = in[1];
    moved.dram_used++;
    ck_assert(kv__member_same_place(&moved, &in[1]));
    snprintf(moved.addr, sizeof moved.addr, "127.0.0.1:1");
    ck_assert(!kv__member_same_place(&moved, &in[1]));
    free(out);
    for (int cut = 0; cut < len; cut++) {
        out = (void *)1;
        ck_assert_int_eq(kv__view_decode(b, (size_t)cut, &v, &out, &n), KV_EPROTO);
        ck_assert_ptr_null(out);
    }
    /* a member count the body cannot hold is refused before allocating */
    kv__put32(b + 8, 0xffffffffu);
    ck_assert_int_eq(kv__view_decode(b, (size_t)len, &v, &out, &n), KV_EPROTO);
    kv__put32(b + 8, 1000);
    ck_assert_int_eq(kv__view_decode(b, (size_t)len, &v, &out, &n), KV_EPROTO);

    /* join: a member, no token; too many segments refused */
    struct kv__member m = member(4), m2;
    m.lease = 0x1122334455667788ull;
    ck_assert_int_eq(kv__member_sign("t", &m), KV_OK);
    len = kv__join_encode(&m, b, sizeof b);
    ck_assert_int_gt(len, 0);
    ck_assert(!memmem(b, (size_t)len, "\x01\x00t", 3));
    ck_assert_int_eq(kv__join_decode(b, (size_t)len, &m2), KV_OK);
    ck_assert_str_eq(m2.addr, m.addr);
    ck_assert_uint_eq(m2.lease, m.lease);
    ck_assert(memcmp(m2.mac, m.mac, sizeof m.mac) == 0);
    ck_assert(kv__member_verify("t", &m2));
    ck_assert_int_eq(kv__join_decode(b, (size_t)len - 1, &m2), KV_EPROTO);
    size_t segat = 2 + strlen(m.id) + 2 + strlen(m.addr) + 4;
    kv__put32(b + segat, KV_PROTO_SEG_MAX + 1);
    ck_assert_int_eq(kv__join_decode(b, (size_t)len, &m2), KV_EPROTO);
}
END_TEST

/* Ids and addresses read from etcd or kvmaster: printable, host:port
 * (issue 17, 4: a CRLF or a malformed address read from etcd was used). */
START_TEST(member_sanity)
{
    struct kv__member m = member(1);
    ck_assert(kv__member_sane(&m));
    static const char *const bad_addr[] = { "10.0.0.1", ":80", "10.0.0.1:", "10.0.0.1:0",
                                            "10.0.0.1:65536", "10.0.0.1:12a", "a b:1",
                                            "host\r\n:1", "10.0.0.1:123456" };
    for (size_t i = 0; i < sizeof bad_addr / sizeof bad_addr[0]; i++) {
        struct kv__member x = m;
        snprintf(x.addr, sizeof x.addr, "%s", bad_addr[i]);
        ck_assert_msg(!kv__member_sane(&x), "%s accepted", bad_addr[i]);
    }
    static const char *const good_addr[] = { "127.0.0.1:1", "node-7.example_net:65535" };
    for (size_t i = 0; i < 2; i++) {
        struct kv__member x = m;
        snprintf(x.addr, sizeof x.addr, "%s", good_addr[i]);
        ck_assert(kv__member_sane(&x));
    }
    struct kv__member x = m;
    snprintf(x.id, sizeof x.id, "node\r\nX-Injected: 1");
    ck_assert(!kv__member_sane(&x));
    x.id[0] = 0;
    ck_assert(!kv__member_sane(&x));
    /* a pure client has no address; an owner must have one */
    x = m;
    x.addr[0] = 0;
    x.flags = 0;
    ck_assert(kv__member_sane(&x));
    x.flags = KV_MEMBER_OWNER;
    ck_assert(!kv__member_sane(&x));
}
END_TEST

/* A member's MAC covers every field: any change, or another token, and it
 * no longer verifies (issue 17, 1b: before, records carried no MAC and a
 * forged record for a live id was believed). */
START_TEST(member_mac)
{
    struct kv__member m = member(2);
    m.lease = 77;
    ck_assert_int_eq(kv__member_sign("sesame", &m), KV_OK);
    ck_assert(kv__member_verify("sesame", &m));
    ck_assert(!kv__member_verify("sesamE", &m));
    ck_assert(!kv__member_verify("", &m));
    for (int f = 0; f < 16; f++) {
        struct kv__member x = m;
        switch (f) {
        case 7: x.dram_capacity++; break;
        case 8: x.dram_used++; break;
        case 9: x.ssd_capacity++; break;
        case 10: x.ssd_used++; break;
        case 11: x.dram_blocks++; break;
        case 12: x.ssd_blocks++; break;
        case 13: x.keys++; break;
        case 14: x.stamp_ms++; break;
        case 15: x.version[0] ^= 1; break;
        case 0: x.id[0] ^= 1; break;
        case 1: snprintf(x.addr, sizeof x.addr, "10.0.0.9:1"); break;
        case 2: x.flags ^= KV_MEMBER_OWNER; break;
        case 3: x.nseg--; break;
        case 4: x.seg[0].rkey++; break;
        case 5: x.lease++; break;
        case 6: x.mac[31] ^= 0x80; break;
        }
        ck_assert_msg(!kv__member_verify("sesame", &x), "field %d not covered", f);
    }
    /* an unsigned record does not verify even under the empty token */
    struct kv__member u = member(1);
    ck_assert(!kv__member_verify("", &u));
    ck_assert_int_eq(kv__member_sign("", &u), KV_OK);
    ck_assert(kv__member_verify("", &u));
}
END_TEST

START_TEST(placement_rendezvous)
{
    enum { NODES = 5, BLOCKS = 4000 };
    uint64_t seeds[NODES];
    char id[32];
    for (int i = 0; i < NODES; i++) {
        snprintf(id, sizeof id, "10.0.0.%d:50071", i);
        seeds[i] = kv__place_seed(id);
    }
    size_t count[NODES] = { 0 }, moved = 0, owned_by_3 = 0;
    for (int b = 0; b < BLOCKS; b++) {
        kv_block_id bid = tu_id((uint64_t)b, 9);
        size_t o[KV_PLACE_MAX], o2[KV_PLACE_MAX];
        ck_assert_uint_eq(kv__place(seeds, NODES, &bid, 3, o), 3);
        ck_assert(o[0] != o[1] && o[1] != o[2] && o[0] != o[2]);
        ck_assert_uint_eq(kv__place(seeds, NODES, &bid, 3, o2), 3);
        ck_assert(memcmp(o, o2, sizeof(size_t) * 3) == 0);   /* deterministic */
        count[o[0]]++;
        /* drop node 3: blocks it did not own keep their first owner */
        uint64_t less[NODES - 1];
        size_t map[NODES - 1], k = 0;
        for (int i = 0; i < NODES; i++)
            if (i != 3) {
                less[k] = seeds[i];
                map[k++] = (size_t)i;
            }
        kv__place(less, NODES - 1, &bid, 1, o2);
        if (o[0] == 3) {
            owned_by_3++;
            ck_assert_uint_eq(map[o2[0]], o[1]);   /* the next best takes over */
        } else if (map[o2[0]] != o[0]) {
            moved++;
        }
    }
    ck_assert_uint_eq(moved, 0);
    ck_assert_uint_gt(owned_by_3, 0);
    for (int i = 0; i < NODES; i++)   /* roughly balanced: within 25% of fair */
        ck_assert_msg(count[i] > BLOCKS / NODES * 3 / 4 && count[i] < BLOCKS / NODES * 5 / 4,
                      "node %d owns %zu of %d", i, count[i], BLOCKS);
    /* more replicas than nodes: every node, once */
    size_t o[KV_PLACE_MAX];
    kv_block_id bid = tu_id(1, 1);
    ck_assert_uint_eq(kv__place(seeds, 2, &bid, 4, o), 2);
    ck_assert(o[0] != o[1]);
    ck_assert_uint_eq(kv__place(seeds, 0, &bid, 2, o), 0);
}
END_TEST

Suite *proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("frames");
    tcase_add_test(tc, hdr_round_trip);
    tcase_add_test(tc, hdr_refusals);
    tcase_add_test(tc, batch_round_trip);
    tcase_add_test(tc, batch_carries_the_senders_view);
    tcase_add_test(tc, batch_r_round_trip);
    tcase_add_test(tc, member_mac);
    tcase_add_test(tc, member_sanity);
    tcase_add_test(tc, view_round_trip);
    tcase_add_test(tc, placement_rendezvous);
    suite_add_tcase(s, tc);
    return s;
}
