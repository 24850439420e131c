/*
 * fuzz_proto.c — libFuzzer harness for every decoder of net/proto.c.
 *
 * Key design choice: each decoder is checked by a round trip, not only for
 * crashes. The first input byte picks a decoder; what it accepts is encoded
 * again and decoded again, and both decodings must agree field by field.
 * Where the wire form has no free bytes (header, BATCH, JOIN, VIEW)
 * the encoding must also equal the input byte for byte; BATCH_R items have
 * pad bytes the decoder ignores, so only the other bytes are compared. A
 * decoded member's MAC is checked as a reader checks it: it verifies under
 * the token exactly when it is kv__member_sign's over the decoded fields.
 */
#include <string.h>

#include "net/proto.h"
#include "fuzzutil.h"

enum { SEL_HDR, SEL_BATCH, SEL_BATCH_R, SEL_MEMBER_MAC, SEL_JOIN, SEL_VIEW, SEL_COUNT,
       SEL_JOIN_SECRET, SEL_VIEW_SECRET, SEL_N };

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void hdr_case(const uint8_t *in, size_t n)
{
    if (n < KV_PROTO_HDR_LEN)
        return;
    /* The data cap the caller passes comes from the input too, so the
     * refusal of an oversized data_len is exercised. */
    uint64_t max_data = n > KV_PROTO_HDR_LEN + 8 ? kv__get64(in + KV_PROTO_HDR_LEN) : UINT64_MAX;
    struct kv__hdr h, h2;
    if (kv__hdr_decode(in, max_data, &h) != KV_OK)
        return;
    FZ_CHECK(h.body_len <= KV_PROTO_BODY_MAX);
    FZ_CHECK(h.data_len <= max_data);
    FZ_CHECK(h.data_len == 0 || h.type == KV_MSG_BATCH || h.type == KV_MSG_BATCH_R);
    uint8_t out[KV_PROTO_HDR_LEN];
    kv__hdr_encode(&h, out);
    FZ_CHECK(memcmp(out, in, KV_PROTO_HDR_LEN) == 0);
    FZ_CHECK(kv__hdr_decode(out, max_data, &h2) == KV_OK);
    FZ_CHECK(h.version == h2.version && h.type == h2.type && h.flags == h2.flags &&
             h.body_len == h2.body_len && h.status == h2.status && h.req_id == h2.req_id &&
             h.data_len == h2.data_len);
}

static int req_equal(const struct kv__wire_req *a, const struct kv__wire_req *b)
{
    return a->kind == b->kind && a->ns == b->ns && a->flags == b->flags && a->index == b->index &&
           memcmp(a->id.bytes, b->id.bytes, KV_BLOCK_ID_LEN) == 0 && a->len == b->len &&
           a->view == b->view && a->bflags == b->bflags && a->stamp == b->stamp;
}

static int resp_equal(const struct kv__wire_resp *a, const struct kv__wire_resp *b)
{
    return a->status == b->status && a->hit == b->hit && a->len == b->len &&
           a->addr == b->addr && a->rkey == b->rkey && a->handle == b->handle &&
           a->sum == b->sum;
}

/* Input and re-encoding agree outside the item's pad bytes [p0, p1) and
 * [q0, q1) (offsets within each item; q0 == q1 when there is one run). */
static int same_but_pad(const uint8_t *a, const uint8_t *b, size_t cnt, size_t item,
                        size_t p0, size_t p1, size_t q0, size_t q1)
{
    if (memcmp(a, b, 4) != 0)
        return 0;
    for (size_t i = 0; i < cnt; i++)
        for (size_t j = 0; j < item; j++) {
            if ((j >= p0 && j < p1) || (j >= q0 && j < q1))
                continue;
            if (a[4 + i * item + j] != b[4 + i * item + j])
                return 0;
        }
    return 1;
}

static void batch_case(const uint8_t *in, size_t n)
{
    size_t cnt;
    if (kv__batch_count(in, n, KV_PROTO_REQ_ITEM, &cnt) != KV_OK)
        return;
    FZ_CHECK(cnt <= KV_PROTO_BATCH_MAX && n == kv__batch_body_len(cnt));
    struct kv__wire_req *a = calloc(cnt + 1, sizeof *a), *b = calloc(cnt + 1, sizeof *b);
    uint8_t *out = malloc(n);
    FZ_CHECK(a && b && out);
    size_t got = cnt;
    if (kv__batch_decode(in, n, a, &got) == KV_OK) {
        FZ_CHECK(got == cnt);
        for (size_t i = 0; i < cnt; i++) {
            FZ_CHECK(a[i].kind >= KV_OP_LOOKUP && a[i].kind <= KV_OP_CLEAR);
            FZ_CHECK(a[i].ns < KV_NS_COUNT);
            /* REPLACE on a dump; PREFIX on a CLEAR, exactly when it names a
             * prefix length (index) */
            FZ_CHECK(a[i].flags == 0 ||
                     (a[i].flags == KV_WIRE_REPLACE && a[i].kind == KV_OP_DUMP) ||
                     (a[i].flags == KV_WIRE_PREFIX && a[i].kind == KV_OP_CLEAR));
            FZ_CHECK(a[i].kind != KV_OP_CLEAR || (a[i].flags == KV_WIRE_PREFIX) == (a[i].index != 0));
            FZ_CHECK((a[i].kind != KV_OP_LOAD && a[i].kind != KV_OP_DUMP) ||
                     a[i].len <= KV_VALUE_MAX);
            /* the batch's view, flags and stamp, in every item; no
             * unknown flag, and a stamp only on a member's copies */
            FZ_CHECK(a[i].view == kv__get64(in + 8) && a[i].bflags == kv__get32(in + 4) &&
                     a[i].stamp == kv__get64(in + 16) &&
                     !(a[i].bflags & ~KV_BATCH_INTERNAL));
            FZ_CHECK(!a[i].stamp || (a[i].bflags & KV_BATCH_INTERNAL));
        }
        /* One slot short of the count must be refused, not overrun. */
        if (cnt) {
            size_t small = cnt - 1;
            FZ_CHECK(kv__batch_decode(in, n, b, &small) == KV_EPROTO);
        }
        if (n > 4)
            FZ_CHECK(kv__batch_encode(a, cnt, out, n - 1) == KV_ENOBUFS);
        FZ_CHECK(kv__batch_encode(a, cnt, out, n) == (int)n);
        /* no free bytes since the flags; an empty batch has no item to
         * carry its view and flags back (the encoder writes 0s) */
        FZ_CHECK(memcmp(in, out, cnt ? n : 4) == 0);
        size_t got2 = cnt;
        FZ_CHECK(kv__batch_decode(out, n, b, &got2) == KV_OK && got2 == cnt);
        for (size_t i = 0; i < cnt; i++)
            FZ_CHECK(req_equal(&a[i], &b[i]));
    }
    free(a);
    free(b);
    free(out);
}

static void batch_r_case(const uint8_t *in, size_t n)
{
    size_t cnt;
    if (kv__batch_count(in, n, KV_PROTO_RESP_ITEM, &cnt) != KV_OK)
        return;
    struct kv__wire_resp *a = calloc(cnt + 1, sizeof *a), *b = calloc(cnt + 1, sizeof *b);
    uint8_t *out = malloc(n);
    FZ_CHECK(a && b && out);
    size_t got = cnt;
    if (kv__batch_r_decode(in, n, a, &got) == KV_OK) {
        FZ_CHECK(got == cnt);
        for (size_t i = 0; i < cnt; i++)
            FZ_CHECK(kv__status_valid(a[i].status) && a[i].hit <= 1 &&
                     a[i].len <= KV_VALUE_MAX);
        if (cnt) {
            size_t small = cnt - 1;
            FZ_CHECK(kv__batch_r_decode(in, n, b, &small) == KV_EPROTO);
        }
        FZ_CHECK(kv__batch_r_encode(a, cnt, out, n) == (int)n);
        FZ_CHECK(same_but_pad(in, out, cnt, KV_PROTO_RESP_ITEM, 5, 8, 28, 32));
        size_t got2 = cnt;
        FZ_CHECK(kv__batch_r_decode(out, n, b, &got2) == KV_OK && got2 == cnt);
        for (size_t i = 0; i < cnt; i++)
            FZ_CHECK(resp_equal(&a[i], &b[i]));
    }
    free(a);
    free(b);
    free(out);
}

static int member_equal(const struct kv__member *a, const struct kv__member *b)
{
    if (strcmp(a->id, b->id) || strcmp(a->addr, b->addr) || a->flags != b->flags ||
        a->nseg != b->nseg || a->lease != b->lease || memcmp(a->mac, b->mac, sizeof a->mac))
        return 0;
    for (uint32_t i = 0; i < a->nseg; i++)
        if (a->seg[i].base != b->seg[i].base || a->seg[i].len != b->seg[i].len ||
            a->seg[i].rkey != b->seg[i].rkey)
            return 0;
    return 1;
}

static void join_case(const uint8_t *in, size_t n)
{
    static struct kv__member m, m2;
    if (kv__join_decode(in, n, &m) != KV_OK)
        return;
    FZ_CHECK(m.id[0] && m.nseg <= KV_PROTO_SEG_MAX);
    FZ_CHECK(kv__member_wire_len(&m) == n);
    uint8_t *out = malloc(n);
    FZ_CHECK(out);
    int len = kv__join_encode(&m, out, n);
    FZ_CHECK(len == (int)n && memcmp(out, in, n) == 0);
    FZ_CHECK(kv__join_decode(out, n, &m2) == KV_OK);
    FZ_CHECK(member_equal(&m, &m2));
    FZ_CHECK(kv__join_encode(&m, out, n - 1) < 0);
    free(out);
}

/* A record as a reader gets it (a JOIN body): it verifies under the token
 * exactly when its MAC is the one kv__member_sign makes over its fields;
 * after signing, it verifies, and under another token it does not. */
static void member_mac_case(const uint8_t *in, size_t n)
{
    static const char *const tokens[] = { "", "fuzz-token" };
    static struct kv__member m, s;
    if (kv__join_decode(in, n, &m) != KV_OK)
        return;
    for (int t = 0; t < 2; t++) {
        s = m;
        FZ_CHECK(kv__member_sign(tokens[t], &s) == KV_OK);
        int same = memcmp(s.mac, m.mac, sizeof m.mac) == 0;
        FZ_CHECK(kv__member_verify(tokens[t], &m) == same);
        FZ_CHECK(kv__member_verify(tokens[t], &s));
        FZ_CHECK(!kv__member_verify(tokens[!t], &s));
    }
}

static void view_case(const uint8_t *in, size_t n)
{
    uint64_t ver, ver2;
    struct kv__member *m, *m2;
    size_t cnt, cnt2;
    if (kv__view_decode(in, n, &ver, &m, &cnt) != KV_OK) {
        FZ_CHECK(m == NULL && cnt == 0);
        return;
    }
    FZ_CHECK(cnt <= KV_PROTO_VIEW_MAX);
    size_t want = 12;
    for (size_t i = 0; i < cnt; i++)
        want += kv__member_wire_len(&m[i]);
    FZ_CHECK(want == n);
    uint8_t *out = malloc(n);
    FZ_CHECK(out);
    int len = kv__view_encode(ver, m, cnt, out, n);
    FZ_CHECK(len == (int)n && memcmp(out, in, n) == 0);
    FZ_CHECK(kv__view_decode(out, n, &ver2, &m2, &cnt2) == KV_OK);
    FZ_CHECK(ver == ver2 && cnt == cnt2);
    for (size_t i = 0; i < cnt; i++)
        FZ_CHECK(member_equal(&m[i], &m2[i]));
    free(m);
    free(m2);
    free(out);
}

/* JOIN / VIEW bodies that may end in a member's secret: the fields are
 * re-encoded, the secret appended, and the whole must equal the input; the
 * decoders that take no secret accept exactly the bodies without one. */
static void join_secret_case(const uint8_t *in, size_t n)
{
    static struct kv__member m, m2;
    uint8_t sec[KV_PROTO_SECRET_LEN], sec2[KV_PROTO_SECRET_LEN];
    int has = -1, has2 = -1;
    if (kv__join_decode_secret(in, n, &m, sec, &has) != KV_OK) {
        FZ_CHECK(kv__join_decode(in, n, &m2) == KV_EPROTO);
        return;
    }
    FZ_CHECK(has == 0 || has == 1);
    FZ_CHECK((kv__join_decode(in, n, &m2) == KV_OK) == !has);
    uint8_t *out = malloc(n);
    FZ_CHECK(out);
    size_t flen = n - (has ? KV_PROTO_SECRET_LEN : 0);
    FZ_CHECK(kv__join_encode(&m, out, flen) == (int)flen);
    if (has)
        memcpy(out + flen, sec, KV_PROTO_SECRET_LEN);
    FZ_CHECK(memcmp(out, in, n) == 0);
    FZ_CHECK(kv__join_decode_secret(out, n, &m2, sec2, &has2) == KV_OK);
    FZ_CHECK(has2 == has && member_equal(&m, &m2) &&
             (!has || memcmp(sec, sec2, KV_PROTO_SECRET_LEN) == 0));
    free(out);
}

static void view_secret_case(const uint8_t *in, size_t n)
{
    uint64_t ver, ver2;
    struct kv__member *m, *m2;
    size_t cnt, cnt2;
    uint8_t sec[KV_PROTO_SECRET_LEN], sec2[KV_PROTO_SECRET_LEN];
    int has = -1, has2 = -1;
    if (kv__view_decode_secret(in, n, &ver, &m, &cnt, sec, &has) != KV_OK) {
        FZ_CHECK(m == NULL && cnt == 0);
        FZ_CHECK(kv__view_decode(in, n, &ver2, &m2, &cnt2) == KV_EPROTO && m2 == NULL);
        return;
    }
    FZ_CHECK(has == 0 || has == 1);
    int plain = kv__view_decode(in, n, &ver2, &m2, &cnt2);
    FZ_CHECK((plain == KV_OK) == !has);
    free(m2);
    uint8_t *out = malloc(n);
    FZ_CHECK(out);
    size_t flen = n - (has ? KV_PROTO_SECRET_LEN : 0);
    FZ_CHECK(kv__view_encode(ver, m, cnt, out, flen) == (int)flen);
    if (has)
        memcpy(out + flen, sec, KV_PROTO_SECRET_LEN);
    FZ_CHECK(memcmp(out, in, n) == 0);
    FZ_CHECK(kv__view_decode_secret(out, n, &ver2, &m2, &cnt2, sec2, &has2) == KV_OK);
    FZ_CHECK(ver == ver2 && cnt == cnt2 && has2 == has &&
             (!has || memcmp(sec, sec2, KV_PROTO_SECRET_LEN) == 0));
    for (size_t i = 0; i < cnt; i++)
        FZ_CHECK(member_equal(&m[i], &m2[i]));
    free(m);
    free(m2);
    free(out);
}

static void count_case(const uint8_t *in, size_t n)
{
    static const size_t items[] = { KV_PROTO_REQ_ITEM, KV_PROTO_RESP_ITEM, 1, 20 };
    for (size_t k = 0; k < sizeof items / sizeof items[0]; k++) {
        size_t cnt = (size_t)-1;
        if (kv__batch_count(in, n, items[k], &cnt) == KV_OK)
            FZ_CHECK(cnt <= KV_PROTO_BATCH_MAX &&
                     n == (items[k] == KV_PROTO_REQ_ITEM ? KV_PROTO_BATCH_HDR : 4) +
                              cnt * items[k] &&
                     cnt == kv__get32(in));
        else
            FZ_CHECK(cnt == (size_t)-1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    /* An exact-size copy, so ASan sees a read one past the frame. */
    uint8_t *in = malloc(size - 1 ? size - 1 : 1);
    FZ_CHECK(in);
    memcpy(in, data + 1, size - 1);
    switch (data[0] % SEL_N) {
    case SEL_HDR:     hdr_case(in, size - 1);     break;
    case SEL_BATCH:   batch_case(in, size - 1);   break;
    case SEL_BATCH_R: batch_r_case(in, size - 1); break;
    case SEL_MEMBER_MAC: member_mac_case(in, size - 1); break;
    case SEL_JOIN:    join_case(in, size - 1);    break;
    case SEL_VIEW:    view_case(in, size - 1);    break;
    case SEL_COUNT:   count_case(in, size - 1);   break;
    case SEL_JOIN_SECRET: join_secret_case(in, size - 1); break;
    case SEL_VIEW_SECRET: view_secret_case(in, size - 1); break;
    }
    free(in);
    return 0;
}

/* ---- seeds: frames from the encoders ------------------------------------ */

static void seed(const char *dir, const char *name, int sel, const uint8_t *body, size_t len)
{
    uint8_t *buf = malloc(len + 1);
    FZ_CHECK(buf);
    buf[0] = (uint8_t)sel;
    memcpy(buf + 1, body, len);
    fz_seed(dir, name, buf, len + 1);
    free(buf);
}

static void sample_member(struct kv__member *m, int i)
{
    memset(m, 0, sizeof *m);
    snprintf(m->id, sizeof m->id, "node-%d", i);
    snprintf(m->addr, sizeof m->addr, "127.0.0.1:%d", 40000 + i);
    m->flags = KV_MEMBER_OWNER;
    m->nseg = (uint32_t)i;
    m->lease = 0x694d0000ull + (uint64_t)i;
    for (int s = 0; s < i; s++)
        m->seg[s] = (struct kv__segdesc){ 0x7f0000000000ull + (uint64_t)s * 4096, 1u << 20,
                                          0x1000u + (uint32_t)s };
}

static void write_seeds(const char *dir)
{
    uint8_t buf[4096];
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = 68, .req_id = 7, .data_len = 4096 };
    kv__hdr_encode(&h, buf);
    seed(dir, "hdr-batch", SEL_HDR, buf, KV_PROTO_HDR_LEN);
    h = (struct kv__hdr){ .type = KV_MSG_VIEW, .status = KV_EPERM, .req_id = 1 };
    kv__hdr_encode(&h, buf);
    seed(dir, "hdr-view-eperm", SEL_HDR, buf, KV_PROTO_HDR_LEN);

    struct kv__wire_req rq[3] = {
        { .kind = KV_OP_LOOKUP, .ns = 0, .id.bytes = { 1, 2, 3 } },
        { .kind = KV_OP_DUMP, .ns = 0, .index = 1, .id.bytes = { 4 }, .len = 4096 },
        { .kind = KV_OP_LOAD, .ns = 1, .index = 2, .id.bytes = { 5 }, .len = 100 },
    };
    seed(dir, "batch", SEL_BATCH, buf, (size_t)kv__batch_encode(rq, 3, buf, sizeof buf));
    struct kv__wire_req kq[3] = {
        { .kind = KV_OP_DUMP, .ns = 1, .flags = KV_WIRE_REPLACE, .id.bytes = { 6 }, .len = 9 },
        { .kind = KV_OP_REMOVE, .ns = 1, .id.bytes = { 6 } },
        { .kind = KV_OP_CLEAR, .ns = 1 },
    };
    seed(dir, "batch-keys", SEL_BATCH, buf, (size_t)kv__batch_encode(kq, 3, buf, sizeof buf));
    seed(dir, "batch-empty", SEL_BATCH, buf, (size_t)kv__batch_encode(rq, 0, buf, sizeof buf));
    /* a member's own copies, routed by view 0x1234 and read at a stamp
     * (version 4's header) */
    for (int i = 0; i < 3; i++) {
        kq[i].view = 0x1234;
        kq[i].bflags = KV_BATCH_INTERNAL;
        kq[i].stamp = 1767225600123ull;
    }
    seed(dir, "batch-view", SEL_BATCH, buf, (size_t)kv__batch_encode(kq, 3, buf, sizeof buf));
    struct kv__wire_resp rs[2] = {
        { .status = KV_OK, .hit = 1, .len = 4096, .addr = 0x7f00, .rkey = 9, .handle = 3,
          .sum = 0x1122334455667788ull },
        { .status = KV_ENOTFOUND },
    };
    seed(dir, "batch-r", SEL_BATCH_R, buf, (size_t)kv__batch_r_encode(rs, 2, buf, sizeof buf));
    struct kv__member ms[3];
    for (int i = 0; i < 3; i++)
        sample_member(&ms[i], i);
    seed(dir, "join", SEL_JOIN, buf, (size_t)kv__join_encode(&ms[2], buf, sizeof buf));
    seed(dir, "member-unsigned", SEL_MEMBER_MAC, buf,
         (size_t)kv__join_encode(&ms[1], buf, sizeof buf));
    kv__member_sign("fuzz-token", &ms[2]);
    seed(dir, "member-signed", SEL_MEMBER_MAC, buf,
         (size_t)kv__join_encode(&ms[2], buf, sizeof buf));
    seed(dir, "view", SEL_VIEW, buf, (size_t)kv__view_encode(42, ms, 3, buf, sizeof buf));
    seed(dir, "view-empty", SEL_VIEW, buf, (size_t)kv__view_encode(1, ms, 0, buf, sizeof buf));
    kv__put32(buf, 2);
    seed(dir, "count", SEL_COUNT, buf, 4 + 2 * KV_PROTO_RESP_ITEM);
    /* The bodies with a member's secret appended, as kvmaster and its
     * members send them. */
    int jl = kv__join_encode(&ms[1], buf, sizeof buf);
    memset(buf + jl, 0x5e, KV_PROTO_SECRET_LEN);
    seed(dir, "join-secret", SEL_JOIN_SECRET, buf, (size_t)jl + KV_PROTO_SECRET_LEN);
    int vl = kv__view_encode(43, ms, 2, buf, sizeof buf);
    memset(buf + vl, 0xa7, KV_PROTO_SECRET_LEN);
    seed(dir, "view-secret", SEL_VIEW_SECRET, buf, (size_t)vl + KV_PROTO_SECRET_LEN);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    fz_mkcorpus(write_seeds);
    return 0;
}
