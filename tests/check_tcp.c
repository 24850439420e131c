/*
 * check_tcp.c — the tcp transport against a heap-backed store, in one
 * process: round trips through the zero-copy paths, refusals that close one
 * connection while the server keeps serving, and deadlines.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto.h"
#include "testutil.h"
#include "transport.h"

static struct kv__backend *be;
static struct kv__transport *srv, *cli;
static const struct kv__transport_ops *T = &kv__tcp_transport;
static char addr[128];

static void make_client(const char *token, unsigned timeout_ms)
{
    struct kv__net_opts o = { .timeout_ms = timeout_ms, .threads = 1 };
    snprintf(o.token, sizeof o.token, "%s", token);
    ck_assert_int_eq(T->create(&o, NULL, &cli, NULL, 0), KV_OK);
}

static void setup(void)
{
    be = kv__memstore_new(32u << 20);
    struct kv__net_opts o = { .timeout_ms = 2000, .threads = 2 };
    snprintf(o.token, sizeof o.token, "tok");
    char err[256] = "";
    ck_assert_int_eq(T->create(&o, be, &srv, err, sizeof err), KV_OK);
    ck_assert_msg(T->listen(srv, "127.0.0.1:0", addr, sizeof addr, err, sizeof err) == KV_OK,
                  "%s", err);
    make_client("tok", 2000);
}

static void teardown(void)
{
    T->destroy(cli);
    T->destroy(srv);
    kv__memstore_free(be);
}

static struct kv__op op(uint8_t kind, uint64_t n, uint32_t index, const kv_iov *iov, uint32_t cnt)
{
    return (struct kv__op){ .kind = kind, .ns = KV_NS_BLOCK, .index = index, .id = tu_id(n, 3),
                            .iov = iov, .iovcnt = cnt, .result = 12345 };
}

START_TEST(round_trip)
{
    struct kv__conn *c;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    enum { N = 6 };
    static uint8_t src[N][3][4096 + 17], dst[N][3][4096 + 17];
    kv_iov siov[N][3], diov[N][3];
    struct kv__op ops[2 * N];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 3; j++) {
            tu_fill(src[i][j], sizeof src[i][j], (uint64_t)(i * 3 + j));
            siov[i][j] = (kv_iov){ src[i][j], sizeof src[i][j] - (size_t)j };
            diov[i][j] = (kv_iov){ dst[i][j], sizeof dst[i][j] - (size_t)j };
        }
        ops[i] = op(KV_OP_DUMP, (uint64_t)i, 0, siov[i], 3);
        ops[N + i] = op(KV_OP_LOOKUP, (uint64_t)i, 0, NULL, 0);
    }
    /* dumps and lookups in one batch: dumps land first */
    ck_assert_int_eq(T->batch(c, ops, 2 * N), KV_OK);
    for (int i = 0; i < 2 * N; i++)
        ck_assert_int_eq(ops[i].result, KV_OK);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(ops[N + i].hit, 1);
    /* a second dump of the same shard succeeds and keeps one copy */
    ck_assert_int_eq(T->batch(c, ops, 1), KV_OK);
    ck_assert_int_eq(ops[0].result, KV_OK);
    /* size, then loads straight into iovecs */
    for (int i = 0; i < N; i++)
        ops[i] = op(KV_OP_SIZE, (uint64_t)i, 0, NULL, 0);
    ck_assert_int_eq(T->batch(c, ops, N), KV_OK);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(ops[i].result, KV_OK);
        ck_assert_uint_eq(ops[i].len, 3 * (4096 + 17) - 3);
        ops[i] = op(KV_OP_LOAD, (uint64_t)i, 0, diov[i], 3);
    }
    ck_assert_int_eq(T->batch(c, ops, N), KV_OK);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(ops[i].result, KV_OK);
        for (int j = 0; j < 3; j++)
            ck_assert(memcmp(src[i][j], dst[i][j], sizeof src[i][j] - (size_t)j) == 0);
    }
    /* misses, a wrong expected size, a missing shard index: per item, and the
     * destination of a failed item is untouched */
    memset(dst, 0xee, sizeof dst);
    kv_iov short_iov = { dst[0][0], 100 };
    ops[0] = op(KV_OP_LOAD, 999, 0, diov[0], 3);
    ops[1] = op(KV_OP_LOAD, 1, 0, &short_iov, 1);
    ops[2] = op(KV_OP_LOAD, 2, 7, diov[2], 3);
    ops[3] = op(KV_OP_LOOKUP, 999, 0, NULL, 0);
    ops[4] = op(KV_OP_LOAD, 3, 0, diov[3], 3);
    ck_assert_int_eq(T->batch(c, ops, 5), KV_OK);
    ck_assert_int_eq(ops[0].result, KV_ENOTFOUND);
    ck_assert_int_eq(ops[1].result, KV_EINVAL);
    ck_assert_int_eq(ops[2].result, KV_ENOTFOUND);
    ck_assert_int_eq(ops[3].result, KV_OK);
    ck_assert_int_eq(ops[3].hit, 0);
    ck_assert_int_eq(ops[4].result, KV_OK);
    ck_assert_uint_eq(dst[0][0][0], 0xee);
    ck_assert_uint_eq(dst[2][1][5], 0xee);
    ck_assert(memcmp(src[3][2], dst[3][2], 4096 + 15) == 0);
    T->close(c);
}
END_TEST

START_TEST(large_values)
{
    struct kv__conn *c;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    size_t len = 8u << 20;
    uint8_t *a = malloc(len), *b = malloc(len);
    tu_fill(a, len, 77);
    kv_iov ai = { a, len }, bi = { b, len };
    struct kv__op o = op(KV_OP_DUMP, 1, 0, &ai, 1);
    ck_assert_int_eq(T->batch(c, &o, 1), KV_OK);
    ck_assert_int_eq(o.result, KV_OK);
    o = op(KV_OP_LOAD, 1, 0, &bi, 1);
    ck_assert_int_eq(T->batch(c, &o, 1), KV_OK);
    ck_assert_int_eq(o.result, KV_OK);
    ck_assert(tu_check_fill(b, len, 77));
    /* larger than the whole store: refused for that item only */
    size_t big = 40u << 20;
    uint8_t *g = calloc(1, big);
    kv_iov gi = { g, big };
    struct kv__op two[2] = { op(KV_OP_DUMP, 2, 0, &gi, 1), op(KV_OP_LOOKUP, 1, 0, NULL, 0) };
    ck_assert_int_eq(T->batch(c, two, 2), KV_OK);
    ck_assert_int_eq(two[0].result, KV_ENOSPC);
    ck_assert_int_eq(two[1].result, KV_OK);
    ck_assert_int_eq(two[1].hit, 1);
    free(a);
    free(b);
    free(g);
    T->close(c);
}
END_TEST

START_TEST(wrong_token)
{
    T->destroy(cli);
    make_client("nope", 2000);
    struct kv__conn *c = NULL;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_EPERM);
    ck_assert_ptr_null(c);
    T->destroy(cli);
    make_client("", 2000);
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_EPERM);
    T->destroy(cli);
    make_client("tok", 2000);
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    struct kv__op o = op(KV_OP_LOOKUP, 1, 0, NULL, 0);
    ck_assert_int_eq(T->batch(c, &o, 1), KV_OK);
    T->close(c);
}
END_TEST

/* ---- raw frames --------------------------------------------------------- */

static int raw_connect(void)
{
    struct sockaddr_in sa;
    ck_assert_int_eq(kv__net_parse_addr(addr, &sa), KV_OK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = { .tv_sec = 3 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void raw_send(int fd, const void *p, size_t len)
{
    ck_assert_int_eq(send(fd, p, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* A raw connection that has said HELLO with the right token. */
static int raw_hello(void)
{
    int fd = raw_connect();
    uint8_t b[256];
    int blen = kv__hello_encode("tok", "raw", b + KV_PROTO_HDR_LEN, sizeof b - KV_PROTO_HDR_LEN);
    struct kv__hdr h = { .type = KV_MSG_HELLO, .body_len = (uint32_t)blen, .req_id = 1 };
    kv__hdr_encode(&h, b);
    raw_send(fd, b, KV_PROTO_HDR_LEN + (size_t)blen);
    ck_assert_int_eq(recv(fd, b, KV_PROTO_HDR_LEN, MSG_WAITALL), KV_PROTO_HDR_LEN);
    ck_assert_int_eq(kv__hdr_decode(b, 0, &h), KV_OK);
    ck_assert_int_eq(h.status, KV_OK);
    return fd;
}

/* The server closed fd (EOF, or a reset), without answering. */
static void assert_closed(int fd)
{
    uint8_t b[64];
    ssize_t r = recv(fd, b, sizeof b, 0);
    ck_assert_msg(r <= 0, "server answered %zd bytes instead of closing", r);
    ck_assert_msg(r == 0 || errno == ECONNRESET, "recv: %s", strerror(errno));
    close(fd);
}

/* The server still serves a proper client. */
static void assert_serving(void)
{
    struct kv__conn *c;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    uint8_t v[100] = { 1, 2, 3 }, w[100];
    kv_iov vi = { v, sizeof v }, wi = { w, sizeof w };
    struct kv__op o[2] = { op(KV_OP_DUMP, 50, 0, &vi, 1), op(KV_OP_LOAD, 50, 0, &wi, 1) };
    ck_assert_int_eq(T->batch(c, o, 2), KV_OK);
    ck_assert_int_eq(o[0].result, KV_OK);
    ck_assert_int_eq(o[1].result, KV_OK);
    ck_assert(memcmp(v, w, sizeof v) == 0);
    T->close(c);
}

START_TEST(malformed_frames)
{
    uint8_t b[KV_PROTO_HDR_LEN + 64];
    struct kv__hdr h = { .type = KV_MSG_BATCH, .req_id = 2 };
    int fd;

    /* 1. a batch before HELLO */
    fd = raw_connect();
    h.body_len = 4;
    kv__hdr_encode(&h, b);
    kv__put32(b + KV_PROTO_HDR_LEN, 0);
    raw_send(fd, b, KV_PROTO_HDR_LEN + 4);
    assert_closed(fd);
    /* 2. unknown version */
    fd = raw_hello();
    kv__hdr_encode(&h, b);
    b[4] = 9;
    raw_send(fd, b, KV_PROTO_HDR_LEN + 4);
    assert_closed(fd);
    /* 3. unknown type */
    fd = raw_hello();
    kv__hdr_encode(&h, b);
    b[5] = 200;
    raw_send(fd, b, KV_PROTO_HDR_LEN + 4);
    assert_closed(fd);
    /* 4. oversized body length: refused from the header, nothing allocated */
    fd = raw_hello();
    h.body_len = 0xffffffffu;
    kv__hdr_encode(&h, b);
    raw_send(fd, b, KV_PROTO_HDR_LEN);
    assert_closed(fd);
    /* 5. a body whose count disagrees with its length */
    fd = raw_hello();
    h.body_len = 4 + KV_PROTO_REQ_ITEM;
    kv__hdr_encode(&h, b);
    memset(b + KV_PROTO_HDR_LEN, 0, 4 + KV_PROTO_REQ_ITEM);
    kv__put32(b + KV_PROTO_HDR_LEN, 2);
    raw_send(fd, b, KV_PROTO_HDR_LEN + 4 + KV_PROTO_REQ_ITEM);
    assert_closed(fd);
    /* 6. data length that is not the dumps' total (a write past the item) */
    fd = raw_hello();
    struct kv__wire_req q = { .kind = KV_OP_DUMP, .id = tu_id(1, 1), .len = 10 };
    h.body_len = (uint32_t)kv__batch_body_len(1);
    h.data_len = 1000;
    kv__hdr_encode(&h, b);
    kv__batch_encode(&q, 1, b + KV_PROTO_HDR_LEN, sizeof b - KV_PROTO_HDR_LEN);
    raw_send(fd, b, KV_PROTO_HDR_LEN + h.body_len);
    assert_closed(fd);
    /* 7. a load asking for more than KV_VALUE_MAX (an out-of-bounds read) */
    fd = raw_hello();
    q = (struct kv__wire_req){ .kind = KV_OP_LOAD, .id = tu_id(50, 3), .len = 1ull << 40 };
    h.data_len = 0;
    kv__hdr_encode(&h, b);
    kv__batch_encode(&q, 1, b + KV_PROTO_HDR_LEN, sizeof b - KV_PROTO_HDR_LEN);
    raw_send(fd, b, KV_PROTO_HDR_LEN + h.body_len);
    assert_closed(fd);
    /* 8. a truncated frame, then the peer goes away */
    fd = raw_hello();
    raw_send(fd, b, 10);
    close(fd);
    assert_serving();
}
END_TEST

/* A server that accepts and never answers: a batch gives up at its deadline. */
START_TEST(deadline)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    socklen_t sl = sizeof sa;
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%u", ntohs(sa.sin_port));
    T->destroy(cli);
    make_client("tok", 300);
    struct kv__conn *c = NULL;
    uint64_t t0 = tu_now_ms();
    ck_assert_int_eq(T->connect(cli, a, &c), KV_ETIMEDOUT);
    uint64_t dt = tu_now_ms() - t0;
    ck_assert_msg(dt >= 250 && dt < 1500, "took %llu ms", (unsigned long long)dt);
    /* nothing listening: refused at once */
    close(lfd);
    t0 = tu_now_ms();
    ck_assert_int_eq(T->connect(cli, a, &c), KV_ENET);
    ck_assert_uint_lt(tu_now_ms() - t0, 250);
}
END_TEST

/* A peer that stops mid-frame loses its connection and its reservation
 * after the server's timeout; the server goes on serving. */
START_TEST(stalled_peer_reaped)
{
    T->destroy(srv);
    struct kv__net_opts o = { .timeout_ms = 300, .threads = 1 };
    snprintf(o.token, sizeof o.token, "tok");
    ck_assert_int_eq(T->create(&o, be, &srv, NULL, 0), KV_OK);
    ck_assert_int_eq(T->listen(srv, "127.0.0.1:0", addr, sizeof addr, NULL, 0), KV_OK);
    int fd = raw_hello();
    uint8_t b[KV_PROTO_HDR_LEN + 64];
    struct kv__wire_req q = { .kind = KV_OP_DUMP, .id = tu_id(7, 7), .len = 20u << 20 };
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = (uint32_t)kv__batch_body_len(1),
                         .req_id = 2, .data_len = q.len };
    kv__hdr_encode(&h, b);
    kv__batch_encode(&q, 1, b + KV_PROTO_HDR_LEN, sizeof b - KV_PROTO_HDR_LEN);
    raw_send(fd, b, KV_PROTO_HDR_LEN + h.body_len);
    raw_send(fd, b, 40);   /* 40 of the 20 MiB, then silence */
    uint64_t t0 = tu_now_ms();
    assert_closed(fd);
    uint64_t dt = tu_now_ms() - t0;
    ck_assert_msg(dt >= 250 && dt < 1500, "closed after %llu ms", (unsigned long long)dt);
    /* the 20 MiB reservation was given back: 30 MiB fit in the 32 MiB store */
    struct kv__conn *c;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    size_t big = 30u << 20;
    uint8_t *g = calloc(1, big);
    kv_iov gi = { g, big };
    struct kv__op d = op(KV_OP_DUMP, 8, 0, &gi, 1);
    ck_assert_int_eq(T->batch(c, &d, 1), KV_OK);
    ck_assert_int_eq(d.result, KV_OK);
    free(g);
    T->close(c);
}
END_TEST

/* protocol: tcp is tcp; auto is rdma exactly when rdma's probe finds a
 * device (the stand-in under CI), else tcp; rdma without one is refused. */
START_TEST(transport_pick)
{
    struct kv__net_opts o = { .timeout_ms = 100 };
    const struct kv__transport_ops *ops = NULL;
    ck_assert_int_eq(kv__transport_pick(KV_PROTO_TCP, &o, &ops), KV_OK);
    ck_assert_ptr_eq(ops, &kv__tcp_transport);
    const struct kv__transport_ops *rdma = &kv__rdma_transport;
    int have = rdma && (!rdma->probe || rdma->probe(&o) > 0);
    ck_assert_int_eq(kv__transport_pick(KV_PROTO_AUTO, &o, &ops), KV_OK);
    ck_assert_ptr_eq(ops, have ? rdma : &kv__tcp_transport);
    int rc = kv__transport_pick(KV_PROTO_RDMA, &o, &ops);
    ck_assert_int_eq(rc, have ? KV_OK : KV_ENOTSUP);
    if (!have)
        ck_assert_ptr_null(ops);
}
END_TEST

/* A peer that says HELLO_OK and then nothing: it accepts one connection on
 * lfd, answers its HELLO and holds it silently (the test closes fd). With
 * status set, it first answers one batch with that status and no body. */
struct mute {
    int lfd, fd;
    int32_t status;
    pthread_t th;
};

static void *mute_main(void *arg)
{
    struct mute *m = arg;
    m->fd = accept(m->lfd, NULL, NULL);
    if (m->fd < 0)
        return NULL;
    uint8_t b[KV_PROTO_HDR_LEN + 512];
    struct kv__hdr h;
    if (recv(m->fd, b, KV_PROTO_HDR_LEN, MSG_WAITALL) != KV_PROTO_HDR_LEN ||
        kv__hdr_decode(b, 0, &h) || h.body_len > sizeof b - KV_PROTO_HDR_LEN ||
        recv(m->fd, b, h.body_len, MSG_WAITALL) != (ssize_t)h.body_len)
        return NULL;
    h = (struct kv__hdr){ .type = KV_MSG_HELLO_OK, .req_id = 1 };
    kv__hdr_encode(&h, b);
    send(m->fd, b, KV_PROTO_HDR_LEN, MSG_NOSIGNAL);
    if (!m->status)
        return NULL;
    if (recv(m->fd, b, KV_PROTO_HDR_LEN, MSG_WAITALL) != KV_PROTO_HDR_LEN ||
        kv__hdr_decode(b, 0, &h) || h.body_len > sizeof b - KV_PROTO_HDR_LEN ||
        recv(m->fd, b, h.body_len, MSG_WAITALL) != (ssize_t)h.body_len)
        return NULL;
    h = (struct kv__hdr){ .type = KV_MSG_BATCH_R, .req_id = h.req_id, .status = m->status };
    kv__hdr_encode(&h, b);
    send(m->fd, b, KV_PROTO_HDR_LEN, MSG_NOSIGNAL);
    return NULL;
}

/* Starts a mute peer on a free loopback port; its address goes to a. */
static void mute_start(struct mute *m, int32_t status, char *a, size_t alen)
{
    *m = (struct mute){ .lfd = socket(AF_INET, SOCK_STREAM, 0), .fd = -1, .status = status };
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_eq(bind(m->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(m->lfd, 4), 0);
    socklen_t sl = sizeof sa;
    getsockname(m->lfd, (struct sockaddr *)&sa, &sl);
    snprintf(a, alen, "127.0.0.1:%u", ntohs(sa.sin_port));
    pthread_create(&m->th, NULL, mute_main, m);
}

/* A reply that carries an error status and no body is that error at once,
 * not a wait for the body until the deadline. */
START_TEST(error_reply)
{
    T->destroy(cli);
    make_client("tok", 300);
    struct mute m;
    char ma[64];
    mute_start(&m, KV_ENOMEM, ma, sizeof ma);
    struct kv__conn *mc = NULL;
    ck_assert_int_eq(T->connect(cli, ma, &mc), KV_OK);
    struct kv__op o = op(KV_OP_LOOKUP, 1, 0, NULL, 0);
    uint64_t t0 = tu_now_ms();
    int rc = T->batch(mc, &o, 1);
    uint64_t dt = tu_now_ms() - t0;
    pthread_join(m.th, NULL);
    ck_assert_int_eq(rc, KV_ENOMEM);
    ck_assert_msg(dt < 250, "took %llu ms", (unsigned long long)dt);
    T->close(mc);
    close(m.fd);
    close(m.lfd);
}
END_TEST

/* batch_many: three conns driven by one thread. Two to the server run a
 * mix of loads, dumps and lookups (values large enough to take many reads
 * each); one to a peer that never answers times out on its own, at its
 * own deadline, and the others' results are unaffected. */
START_TEST(batch_many)
{
    T->destroy(cli);
    make_client("tok", 300);
    enum { N = 4, V = 1u << 20 };
    uint8_t *src = malloc((size_t)N * V), *dst = calloc(N, V);
    kv_iov si[N], di[N];
    struct kv__op put[N], a_ops[2], b_ops[3], m_ops[1];
    for (int i = 0; i < N; i++) {
        tu_fill(src + (size_t)i * V, V, 100 + (uint64_t)i);
        si[i] = (kv_iov){ src + (size_t)i * V, V };
        di[i] = (kv_iov){ dst + (size_t)i * V, V };
        put[i] = op(KV_OP_DUMP, 100 + (uint64_t)i, 0, &si[i], 1);
    }
    struct kv__conn *a, *b, *mc;
    ck_assert_int_eq(T->connect(cli, addr, &a), KV_OK);
    ck_assert_int_eq(T->connect(cli, addr, &b), KV_OK);
    ck_assert_int_eq(T->batch(a, put, 2), KV_OK);   /* 0 and 1 stored first */

    struct mute m;
    char ma[64];
    mute_start(&m, 0, ma, sizeof ma);
    int rc = T->connect(cli, ma, &mc);
    pthread_join(m.th, NULL);
    ck_assert_int_eq(rc, KV_OK);

    a_ops[0] = op(KV_OP_LOAD, 100, 0, &di[0], 1);
    a_ops[1] = op(KV_OP_LOAD, 101, 0, &di[1], 1);
    b_ops[0] = op(KV_OP_DUMP, 102, 0, &si[2], 1);
    b_ops[1] = op(KV_OP_DUMP, 103, 0, &si[3], 1);
    b_ops[2] = op(KV_OP_LOOKUP, 100, 0, NULL, 0);
    m_ops[0] = op(KV_OP_LOAD, 100, 0, &di[3], 1);
    struct kv__batch many[3] = {
        { .conn = a, .ops = a_ops, .n = 2, .rc = 12345 },
        { .conn = mc, .ops = m_ops, .n = 1, .rc = 12345 },
        { .conn = b, .ops = b_ops, .n = 3, .rc = 12345 },
    };
    uint64_t t0 = tu_now_ms();
    T->batch_many(many, 3);
    uint64_t dt = tu_now_ms() - t0;
    ck_assert_int_eq(many[0].rc, KV_OK);
    ck_assert_int_eq(many[1].rc, KV_ETIMEDOUT);
    ck_assert_int_eq(many[2].rc, KV_OK);
    ck_assert_msg(dt >= 250 && dt < 1500, "took %llu ms", (unsigned long long)dt);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(a_ops[i].result, KV_OK);
        ck_assert(tu_check_fill(dst + (size_t)i * V, V, 100 + (uint64_t)i));
    }
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(b_ops[i].result, KV_OK);
    ck_assert_int_eq(b_ops[2].hit, 1);
    T->close(mc);
    close(m.fd);
    close(m.lfd);

    /* the dumps landed: both conns read them back in one call */
    memset(dst, 0, (size_t)N * V);
    a_ops[0] = op(KV_OP_LOAD, 102, 0, &di[2], 1);
    b_ops[0] = op(KV_OP_LOAD, 103, 0, &di[3], 1);
    b_ops[1] = op(KV_OP_LOAD, 999, 0, &di[0], 1);
    many[0] = (struct kv__batch){ .conn = a, .ops = a_ops, .n = 1 };
    many[1] = (struct kv__batch){ .conn = b, .ops = b_ops, .n = 2 };
    T->batch_many(many, 2);
    ck_assert_int_eq(many[0].rc, KV_OK);
    ck_assert_int_eq(many[1].rc, KV_OK);
    ck_assert_int_eq(a_ops[0].result, KV_OK);
    ck_assert_int_eq(b_ops[0].result, KV_OK);
    ck_assert_int_eq(b_ops[1].result, KV_ENOTFOUND);
    ck_assert(tu_check_fill(dst + 2 * (size_t)V, V, 102));
    ck_assert(tu_check_fill(dst + 3 * (size_t)V, V, 103));
    T->close(a);
    T->close(b);
    free(src);
    free(dst);
}
END_TEST

struct worker { int id, failures; };

static void *hammer(void *arg)
{
    struct worker *w = arg;
    struct kv__conn *c;
    if (T->connect(cli, addr, &c) != KV_OK) {
        w->failures++;
        return NULL;
    }
    uint8_t v[3000], r[3000];
    for (int i = 0; i < 200; i++) {
        uint64_t n = (uint64_t)w->id * 1000 + (uint64_t)i;
        tu_fill(v, sizeof v, n);
        kv_iov vi = { v, sizeof v }, ri = { r, sizeof r };
        struct kv__op o[2] = { op(KV_OP_DUMP, n, 1, &vi, 1), op(KV_OP_LOAD, n, 1, &ri, 1) };
        if (T->batch(c, o, 2) || o[0].result || o[1].result || !tu_check_fill(r, sizeof r, n))
            w->failures++;
    }
    T->close(c);
    return NULL;
}

START_TEST(concurrent_clients)
{
    pthread_t th[6];
    struct worker w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (struct worker){ .id = i };
        pthread_create(&th[i], NULL, hammer, &w[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(w[i].failures, 0);
    }
}
END_TEST

Suite *tcp_suite(void)
{
    Suite *s = suite_create("tcp");
    TCase *tc = tcase_create("loopback");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, large_values);
    tcase_add_test(tc, wrong_token);
    tcase_add_test(tc, malformed_frames);
    tcase_add_test(tc, deadline);
    tcase_add_test(tc, stalled_peer_reaped);
    tcase_add_test(tc, concurrent_clients);
    tcase_add_test(tc, batch_many);
    tcase_add_test(tc, error_reply);
    tcase_add_test(tc, transport_pick);
    suite_add_tcase(s, tc);
    return s;
}
