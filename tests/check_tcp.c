/*
 * check_tcp.c — the tcp transport against a heap-backed store, in one
 * process: round trips through the zero-copy paths, refusals that close one
 * connection while the server keeps serving, and deadlines.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/auth.h"
#include "net/proto.h"
#include "net/serve.h"
#include "net/sock.h"
#include "testutil.h"
#include "testutil_int.h"
#include "net/transport.h"

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

/* A raw connection that has run the challenge-response with the right
 * token. */
static int raw_hello(void)
{
    int fd = raw_connect();
    ck_assert_int_eq(kv__auth_client(fd, "tok", kv__now_ms() + 3000), KV_OK);
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

/* A peer that authenticates and then says nothing: it accepts one
 * connection on lfd, runs the challenge-response and holds it silently (the test closes fd). With
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
    if (kv__auth_server(m->fd, "tok", kv__now_ms() + 3000) != KV_OK)
        return NULL;
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

/* ---- hostile peers (issue 10, items 6-9) -------------------------------- */

/* Replaces the fixture's server with one on b (NULL: the fixture's store)
 * and the given timeout. */
static void restart_server(struct kv__backend *b, unsigned timeout_ms)
{
    T->destroy(srv);
    struct kv__net_opts o = { .timeout_ms = timeout_ms, .threads = 1 };
    snprintf(o.token, sizeof o.token, "tok");
    ck_assert_int_eq(T->create(&o, b ? b : be, &srv, NULL, 0), KV_OK);
    ck_assert_int_eq(T->listen(srv, "127.0.0.1:0", addr, sizeof addr, NULL, 0), KV_OK);
}

/* Milliseconds until the server closes fd (which must stay silent), at most
 * limit_ms; limit_ms + 1 when it did not. */
static uint64_t ms_until_closed(int fd, uint64_t limit_ms)
{
    uint64_t t0 = tu_now_ms();
    struct pollfd p = { .fd = fd, .events = POLLIN };
    while (tu_now_ms() - t0 <= limit_ms) {
        if (poll(&p, 1, 20) > 0) {
            uint8_t b[64];
            ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
            if (r <= 0)
                return tu_now_ms() - t0;
        }
    }
    return limit_ms + 1;
}

/* A connection that never says HELLO is closed after the server's timeout:
 * idle pooled connections are kept only once they are authenticated. */
START_TEST(unauthenticated_idle_closed)
{
    restart_server(NULL, 300);
    int fd = raw_connect();
    uint64_t dt = ms_until_closed(fd, 2000);
    close(fd);
    ck_assert_msg(dt >= 200 && dt <= 1500, "an idle unauthenticated connection lived %llu ms",
                  (unsigned long long)dt);
    /* an authenticated idle one stays */
    fd = raw_hello();
    ck_assert_uint_gt(ms_until_closed(fd, 1000), 1000);
    close(fd);
    assert_serving();
}
END_TEST

/* A peer that opens with a frame (version 1's HELLO announcing 1 MiB of
 * body) instead of the challenge-response is closed as soon as the
 * exchange's first message is in, before anything is buffered. */
START_TEST(hello_body_capped)
{
    int fd = raw_connect();
    uint8_t b[KV_PROTO_HDR_LEN + 8] = { 0 };
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = 1u << 20, .req_id = 1 };
    kv__hdr_encode(&h, b);
    b[5] = 1;
    raw_send(fd, b, sizeof b);
    uint64_t dt = ms_until_closed(fd, 1500);
    close(fd);
    ck_assert_msg(dt < 500, "a 1 MiB HELLO was kept %llu ms", (unsigned long long)dt);
    assert_serving();
}
END_TEST

/* A fake server (a forged address in the view) that answers the client's
 * hello with its own nonce and a MAC it made up, or with garbage: the
 * client refuses it before proving anything, and all the fake ever reads
 * is the 36-byte hello, which holds no token (issue 17, 1a: before, the
 * first frame was a HELLO carrying the token in clear). */
struct capture {
    int lfd;
    int garbage;
    uint8_t got[4096];
    size_t n;
    pthread_t th;
};

static void *capture_main(void *arg)
{
    struct capture *k = arg;
    int fd = accept(k->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    struct timeval tv = { .tv_usec = 300000 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t r = recv(fd, k->got, KV__AUTH_HELLO_LEN, MSG_WAITALL);
    if (r > 0)
        k->n = (size_t)r;
    uint8_t reply[KV__AUTH_REPLY_LEN];
    for (size_t i = 0; i < sizeof reply; i++)
        reply[i] = (uint8_t)(i * 37 + 11);
    if (!k->garbage)
        memcpy(reply, KV__AUTH_MAGIC, KV__AUTH_MAGIC_LEN);
    send(fd, reply, sizeof reply, MSG_NOSIGNAL);
    while ((r = recv(fd, k->got + k->n, sizeof k->got - k->n, 0)) > 0)
        k->n += (size_t)r;
    close(fd);
    return NULL;
}

START_TEST(fake_server_learns_nothing)
{
    for (int garbage = 0; garbage < 2; garbage++) {
        struct capture k = { .lfd = socket(AF_INET, SOCK_STREAM, 0), .garbage = garbage };
        struct sockaddr_in sa = { .sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        ck_assert_int_eq(bind(k.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
        ck_assert_int_eq(listen(k.lfd, 4), 0);
        socklen_t sl = sizeof sa;
        getsockname(k.lfd, (struct sockaddr *)&sa, &sl);
        char fa[64];
        snprintf(fa, sizeof fa, "127.0.0.1:%u", ntohs(sa.sin_port));
        pthread_create(&k.th, NULL, capture_main, &k);
        struct kv__conn *c = NULL;
        int rc = T->connect(cli, fa, &c);
        ck_assert_int_eq(rc, garbage ? KV_EPROTO : KV_EPERM);
        ck_assert_ptr_null(c);
        pthread_join(k.th, NULL);
        close(k.lfd);
        ck_assert_uint_eq(k.n, KV__AUTH_HELLO_LEN);   /* the hello, and no proof */
        ck_assert(!memmem(k.got, k.n, "tok", 3));
    }
}
END_TEST

/* A peer that proves the token (a member gone bad, or bytes hurt on the way)
 * answers loads with bytes other than those its sums cover: each such item
 * fails with KV_ECORRUPT and is counted, and an item whose sum matches is
 * still KV_OK (issue 17, 1c: before, tcp loads carried no sum and other
 * bytes came back with KV_OK). */
struct liar {
    int lfd;
    pthread_t th;
};

static void *liar_main(void *arg)
{
    struct liar *l = arg;
    int fd = accept(l->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    if (kv__auth_server(fd, "tok", kv__now_ms() + 3000) != KV_OK) {
        close(fd);
        return NULL;
    }
    uint8_t b[KV_PROTO_HDR_LEN + 4096];
    struct kv__hdr h;
    struct kv__wire_req q[4];
    size_t n = 4;
    if (recv(fd, b, KV_PROTO_HDR_LEN, MSG_WAITALL) != KV_PROTO_HDR_LEN ||
        kv__hdr_decode(b, 0, &h) || h.body_len > 4096 ||
        recv(fd, b, h.body_len, MSG_WAITALL) != (ssize_t)h.body_len ||
        kv__batch_decode(b, h.body_len, q, &n) || n != 2) {
        close(fd);
        return NULL;
    }
    static uint8_t val[2][1000];
    struct kv__wire_resp r[2];
    uint8_t sums[16];
    for (int i = 0; i < 2; i++) {
        memset(val[i], 0x5a + i, sizeof val[i]);
        r[i] = (struct kv__wire_resp){ .status = KV_OK, .len = q[i].len };
        kv__put64(sums + 8 * i, kv__sum(val[i], q[i].len));
    }
    val[1][500] ^= 1;   /* item 1: one byte off what its sum says */
    size_t blen = kv__batch_r_body_len(2);
    h = (struct kv__hdr){ .type = KV_MSG_BATCH_R, .req_id = h.req_id, .body_len = (uint32_t)blen,
                          .data_len = q[0].len + q[1].len + 16 };
    kv__hdr_encode(&h, b);
    kv__batch_r_encode(r, 2, b + KV_PROTO_HDR_LEN, blen);
    send(fd, b, KV_PROTO_HDR_LEN + blen, MSG_NOSIGNAL);
    send(fd, val[0], q[0].len, MSG_NOSIGNAL);
    send(fd, val[1], q[1].len, MSG_NOSIGNAL);
    send(fd, sums, 16, MSG_NOSIGNAL);
    while (recv(fd, b, sizeof b, 0) > 0)
        ;
    close(fd);
    return NULL;
}

START_TEST(other_bytes_fail)
{
    struct liar l = { .lfd = socket(AF_INET, SOCK_STREAM, 0) };
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_eq(bind(l.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(l.lfd, 4), 0);
    socklen_t sl = sizeof sa;
    getsockname(l.lfd, (struct sockaddr *)&sa, &sl);
    char la[64];
    snprintf(la, sizeof la, "127.0.0.1:%u", ntohs(sa.sin_port));
    pthread_create(&l.th, NULL, liar_main, &l);
    struct kv__conn *c = NULL;
    ck_assert_int_eq(T->connect(cli, la, &c), KV_OK);
    uint8_t w[2][1000];
    kv_iov wi[2] = { { w[0], 1000 }, { w[1], 600 } };
    struct kv__op ops[2] = { op(KV_OP_LOAD, 1, 0, &wi[0], 1), op(KV_OP_LOAD, 2, 0, &wi[1], 1) };
    uint64_t bad0 = atomic_load(&((struct kv__transport_base *)cli)->checksum_failures);
    ck_assert_int_eq(T->batch(c, ops, 2), KV_OK);
    ck_assert_int_eq(ops[0].result, KV_OK);
    ck_assert_int_eq(ops[1].result, KV_ECORRUPT);
    ck_assert_uint_eq(atomic_load(&((struct kv__transport_base *)cli)->checksum_failures),
                      bad0 + 1);
    T->close(c);
    pthread_join(l.th, NULL);
    close(l.lfd);
}
END_TEST

/* A server holding another token: the client refuses it (KV_EPERM) from
 * the server's proof, and a client with another token is refused by the
 * server; the server still serves a proper client after both. */
START_TEST(wrong_token_server)
{
    struct kv__net_opts so;
    memset(&so, 0, sizeof so);
    snprintf(so.token, sizeof so.token, "other");
    so.timeout_ms = 2000;
    so.threads = 1;
    struct kv__backend *b2 = kv__memstore_new(1 << 20);
    struct kv__transport *s2 = NULL;
    ck_assert_int_eq(T->create(&so, b2, &s2, NULL, 0), KV_OK);
    char a2[64];
    ck_assert_int_eq(T->listen(s2, "127.0.0.1:0", a2, sizeof a2, NULL, 0), KV_OK);
    const char *colon = strrchr(a2, ':');
    char a3[64];
    snprintf(a3, sizeof a3, "127.0.0.1%s", colon);
    struct kv__conn *c = NULL;
    ck_assert_int_eq(T->connect(cli, a3, &c), KV_EPERM);
    ck_assert_ptr_null(c);
    T->destroy(s2);
    kv__memstore_free(b2);
    assert_serving();
}
END_TEST

/* Past the cap of unauthenticated connections, the oldest ones go, so idle
 * connections cannot pile up; a real client still gets in. */
START_TEST(unauthenticated_capped)
{
    enum { N = 400, CAP = 256 };   /* KV__TCP_UNAUTH_MAX */
    int fd[N];
    for (int i = 0; i < N; i++)
        fd[i] = raw_connect();
    usleep(300000);
    int closed = 0;
    for (int i = 0; i < N; i++) {
        uint8_t b[8];
        ssize_t r = recv(fd[i], b, sizeof b, MSG_DONTWAIT);
        closed += r == 0 || (r < 0 && errno == ECONNRESET);
    }
    for (int i = 0; i < N; i++)
        close(fd[i]);
    ck_assert_msg(closed >= N - CAP, "only %d of %d unauthenticated connections closed", closed,
                  N);
    assert_serving();
}
END_TEST

/* The server of emfile_no_spin, in a child limited to a few descriptors. */
static int emfile_child(int wfd, int rfd)
{
    /* Nothing but stdio and the pipes open, then room for the listener,
     * its loop and about 40 connections. */
    int fds[256], nfds = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *de; d && (de = readdir(d)) && nfds < 256;) {
        int fd = atoi(de->d_name);
        if (fd > 2 && fd != wfd && fd != rfd && fd != dirfd(d))
            fds[nfds++] = fd;
    }
    if (d)
        closedir(d);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    struct rlimit rl = { 48, 48 };   /* some to spare for sanitizer runtimes */
    if (setrlimit(RLIMIT_NOFILE, &rl))
        return 30;
    struct kv__backend *b = kv__memstore_new(1u << 20);
    struct kv__net_opts o = { .timeout_ms = 5000, .threads = 1 };
    snprintf(o.token, sizeof o.token, "tok");
    struct kv__transport *t = NULL;
    char bound[64] = "";
    int rc = T->create(&o, b, &t, NULL, 0);
    if (rc == KV_OK)
        rc = T->listen(t, "127.0.0.1:0", bound, sizeof bound, NULL, 0);
    if (write(wfd, bound, sizeof bound) != (ssize_t)sizeof bound)
        return 31;
    char c;
    while (read(rfd, &c, 1) > 0)
        ;
    T->destroy(t);
    kv__memstore_free(b);
    return rc == KV_OK ? 0 : 32;
}

static uint64_t cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* fields 14 and 15 (utime, stime), counted after the command name */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return ut + st;
}

/* Out of descriptors, the server neither spins on its readable listening
 * socket nor stops serving: it makes room by closing unauthenticated
 * connections. */
START_TEST(emfile_no_spin)
{
    /* The fixture's server goes first: a child forked from a process with
     * threads may not start its own under TSan. */
    T->destroy(srv);
    srv = NULL;
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(up[0]);
        close(down[1]);
        _exit(emfile_child(up[1], down[0]));
    }
    close(up[1]);
    close(down[0]);
    char bound[64] = "";
    ssize_t got = read(up[0], bound, sizeof bound);
    close(up[0]);
    int ok = got == (ssize_t)sizeof bound && bound[0];
    enum { N = 90 };
    int fd[N], nfd = 0;
    uint64_t spent = 0;
    int served = 0;
    if (ok) {
        snprintf(addr, sizeof addr, "%s", bound);
        for (; nfd < N; nfd++)
            fd[nfd] = raw_connect();
        usleep(200000);
        uint64_t t0 = cpu_ticks(pid);
        usleep(1000000);
        spent = cpu_ticks(pid) - t0;
        struct kv__conn *c = NULL;
        if (T->connect(cli, addr, &c) == KV_OK) {
            struct kv__op o = op(KV_OP_LOOKUP, 1, 0, NULL, 0);
            served = T->batch(c, &o, 1) == KV_OK && o.result == KV_OK;
            T->close(c);
        }
    }
    for (int i = 0; i < nfd; i++)
        close(fd[i]);
    close(down[1]);
    int st = 0;
    uint64_t t0 = tu_now_ms();
    while (waitpid(pid, &st, WNOHANG) == 0 && tu_now_ms() - t0 < 3000)
        usleep(10000);
    if (waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    ck_assert_msg(ok, "the child server did not start");
    long hz = sysconf(_SC_CLK_TCK);
    ck_assert_msg(spent * 100 < (uint64_t)hz * 10, "the server burnt %llu of %ld ticks in 1 s "
                  "out of descriptors", (unsigned long long)spent, hz);
    ck_assert_msg(served, "a real client was not served while descriptors ran out");
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
END_TEST

/* A dump trickled a byte at a time makes progress but not at the floor
 * rate: it is cut off after its whole-transfer deadline, and its
 * reservation given back. */
START_TEST(trickled_dump_cut_off)
{
    restart_server(NULL, 300);
    int fd = raw_hello();
    uint8_t b[KV_PROTO_HDR_LEN + 64];
    struct kv__wire_req q = { .kind = KV_OP_DUMP, .id = tu_id(9, 9), .len = 4u << 20 };
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = (uint32_t)kv__batch_body_len(1),
                         .req_id = 2, .data_len = q.len };
    kv__hdr_encode(&h, b);
    kv__batch_encode(&q, 1, b + KV_PROTO_HDR_LEN, sizeof b - KV_PROTO_HDR_LEN);
    raw_send(fd, b, KV_PROTO_HDR_LEN + h.body_len);
    /* 300 ms + 4 MiB at 10 MiB/s = about 710 ms allowed in all */
    uint64_t t0 = tu_now_ms(), dt = 0;
    int closed = 0;
    while (!closed && (dt = tu_now_ms() - t0) < 3000) {
        closed = send(fd, b, 1, MSG_NOSIGNAL) != 1;
        uint8_t r[8];
        closed |= recv(fd, r, sizeof r, MSG_DONTWAIT) == 0;
        usleep(50000);
    }
    close(fd);
    ck_assert_msg(closed && dt < 2000, "a trickled dump held its connection %llu ms",
                  (unsigned long long)dt);
    /* the 4 MiB reservation is back: 30 MiB fit in the 32 MiB store */
    struct kv__conn *c;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    size_t big = 30u << 20;
    uint8_t *g = calloc(1, big);
    kv_iov gi = { g, big };
    struct kv__op d = op(KV_OP_DUMP, 10, 0, &gi, 1);
    ck_assert_int_eq(T->batch(c, &d, 1), KV_OK);
    ck_assert_int_eq(d.result, KV_OK);
    free(g);
    T->close(c);
}
END_TEST

/* A store whose values are never pinned (all "on SSD"), which notes the
 * process's peak resident memory whenever a value is copied out. */
static struct kv__backend ssd_like;
static _Atomic uint64_t peak_rss;

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static int ssd_like_load(void *ctx, int ns, const kv_block_id *id, uint32_t index,
                         const kv_iov *iov, uint32_t iovcnt)
{
    uint64_t r = rss_bytes();
    if (r > atomic_load(&peak_rss))
        atomic_store(&peak_rss, r);
    return be->load(ctx, ns, id, index, iov, iovcnt);
}

/* Loads of values that are not in DRAM are streamed through one bounce
 * buffer per response: 24 loads of one 16 MiB value do not cost 24 copies. */
START_TEST(bounce_streamed)
{
    ssd_like = *be;
    ssd_like.pin = NULL;
    ssd_like.load = ssd_like_load;
    restart_server(&ssd_like, 2000);
    size_t len = 16u << 20;
    uint8_t *v = malloc(len), *w = malloc(len);
    ck_assert(v && w);
    tu_fill(v, len, 77);
    memset(w, 0, len);
    struct kv__conn *c;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    kv_iov vi = { v, len }, wi = { w, len };
    struct kv__op d = op(KV_OP_DUMP, 60, 0, &vi, 1);
    ck_assert_int_eq(T->batch(c, &d, 1), KV_OK);
    ck_assert_int_eq(d.result, KV_OK);
    enum { N = 24 };
    struct kv__op l[N];
    for (int i = 0; i < N; i++)
        l[i] = op(KV_OP_LOAD, 60, 0, &wi, 1);   /* every load into the same buffer */
    uint64_t base = rss_bytes();
    atomic_store(&peak_rss, base);
    ck_assert_int_eq(T->batch(c, l, N), KV_OK);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(l[i].result, KV_OK);
    ck_assert(memcmp(v, w, len) == 0);
    uint64_t grew = atomic_load(&peak_rss) - base;
    ck_assert_msg(grew < (96ull << 20), "serving %d loads of a 16 MiB value grew RSS by %llu MiB",
                  N, (unsigned long long)(grew >> 20));
    T->close(c);
    free(v);
    free(w);
}
END_TEST

/* The node's bounce budget: what does not fit is refused, and comes back. */
START_TEST(bounce_budget)
{
    struct kv__serve s;
    kv__serve_init(&s, be);
    ck_assert_uint_eq(s.bounce_cap, KV__SERVE_BOUNCE_NODE);
    s.bounce_cap = 100;
    void *a = kv__serve_bounce_get(&s, 60);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_null(kv__serve_bounce_get(&s, 60));
    kv__serve_bounce_put(&s, a, 60);
    a = kv__serve_bounce_get(&s, 100);
    ck_assert_ptr_nonnull(a);
    kv__serve_bounce_put(&s, a, 100);
    ck_assert_uint_eq(atomic_load(&s.bounce_used), 0);
}
END_TEST

/* One request loading one block 32,768 times takes at most
 * KV__SERVE_PINS_PER_BLOCK pins on it; its excess is refused, and another
 * client still loads the block while that response is pending. */
START_TEST(pins_capped_per_request)
{
    kv_engine *e = tu_open_yaml("pipeline: dram\ndram: { capacity: 8MiB, shards: 4 }\n"
                                "io: { threads: 1 }\n");
    ck_assert_ptr_nonnull(e);
    struct kv__backend ebe;
    kv__backend_engine(e, &ebe);
    restart_server(&ebe, 3000);
    uint8_t v[1024], w[1024];
    tu_fill(v, sizeof v, 5);
    kv_iov vi = { v, sizeof v }, wi = { w, sizeof w };
    struct kv__conn *c;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    struct kv__op d = op(KV_OP_DUMP, 70, 0, &vi, 1);
    ck_assert_int_eq(T->batch(c, &d, 1), KV_OK);
    ck_assert_int_eq(d.result, KV_OK);
    /* the hog: 32,768 loads of that shard, and it never reads its answer */
    enum { N = 32768 };
    size_t blen = kv__batch_body_len(N);
    uint8_t *req = malloc(KV_PROTO_HDR_LEN + blen);
    struct kv__wire_req *q = calloc(N, sizeof *q);
    ck_assert(req && q);
    for (int i = 0; i < N; i++)
        q[i] = (struct kv__wire_req){ .kind = KV_OP_LOAD, .ns = KV_NS_BLOCK, .id = tu_id(70, 3),
                                      .len = sizeof v };
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = (uint32_t)blen, .req_id = 2 };
    kv__hdr_encode(&h, req);
    kv__batch_encode(q, N, req + KV_PROTO_HDR_LEN, blen);
    int hog = raw_hello();
    raw_send(hog, req, KV_PROTO_HDR_LEN + blen);
    usleep(300000);
    /* another client's load of the block */
    struct kv__op l = op(KV_OP_LOAD, 70, 0, &wi, 1);
    ck_assert_int_eq(T->batch(c, &l, 1), KV_OK);
    int rc = l.result;
    /* the hog's answer: the excess refused with KV_EBUSY, the rest served */
    uint8_t rh[KV_PROTO_HDR_LEN];
    ck_assert_int_eq(recv(hog, rh, sizeof rh, MSG_WAITALL), (ssize_t)sizeof rh);
    struct kv__hdr ah;
    ck_assert_int_eq(kv__hdr_decode(rh, UINT64_MAX, &ah), KV_OK);
    uint8_t *body = malloc(ah.body_len);
    ck_assert_int_eq(recv(hog, body, ah.body_len, MSG_WAITALL), (ssize_t)ah.body_len);
    struct kv__wire_resp *r = calloc(N, sizeof *r);
    size_t n = N;
    ck_assert_int_eq(kv__batch_r_decode(body, ah.body_len, r, &n), KV_OK);
    size_t ok = 0, busy = 0;
    for (size_t i = 0; i < n; i++) {
        ok += r[i].status == KV_OK;
        busy += r[i].status == KV_EBUSY;
    }
    close(hog);
    T->close(c);
    free(r);
    free(body);
    free(q);
    free(req);
    T->destroy(srv);
    srv = NULL;
    kv_close(e);
    restart_server(NULL, 2000);
    ck_assert_msg(rc == KV_OK, "another client's load failed: %s", kv_strerror(rc));
    ck_assert(memcmp(v, w, sizeof v) == 0);
    ck_assert_uint_eq(ok, KV__SERVE_PINS_PER_BLOCK);
    ck_assert_uint_eq(busy, N - KV__SERVE_PINS_PER_BLOCK);
}
END_TEST

/* A request's lookups reach the backend as one call per run of lookups in
 * one namespace (at most KV__SERVE_LK ids each), not one per id, and every
 * item keeps its own answer: runs broken by a size, by the other namespace
 * and by the run's cap, present and absent ids mixed. Before the change the
 * backend saw 700 calls for this request. */
static struct kv__backend *lk_inner;
static _Atomic int lk_calls;

static int lk_counting(void *ctx, int ns, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    atomic_fetch_add(&lk_calls, 1);
    return lk_inner->lookup(lk_inner->ctx, ns, ids, n, hit);
}

START_TEST(lookups_batched_per_run)
{
    struct kv__backend wrap = *be;
    lk_inner = be;
    wrap.lookup = lk_counting;
    restart_server(&wrap, 2000);
    struct kv__conn *c;
    ck_assert_int_eq(T->connect(cli, addr, &c), KV_OK);
    static uint8_t v[64];
    kv_iov vi = { v, sizeof v };
    enum { N = 700 };
    static struct kv__op ops[N];
    /* even numbers stored as blocks, multiples of 3 as plain keys */
    int k = 0;
    for (int i = 0; i < N; i += 2)
        ops[k++] = op(KV_OP_DUMP, (uint64_t)i, 0, &vi, 1);
    for (int i = 0; i < N; i += 3) {
        ops[k] = op(KV_OP_DUMP, (uint64_t)i, 0, &vi, 1);
        ops[k++].ns = KV_NS_KEY;
    }
    ck_assert_int_eq(T->batch(c, ops, (size_t)k), KV_OK);
    for (int i = 0; i < k; i++)
        ck_assert_int_eq(ops[i].result, KV_OK);
    /* 300 block lookups (two runs: the cap), a size, 100 key lookups, 300
     * block lookups (two more runs) */
    for (int i = 0; i < N; i++) {
        ops[i] = op(KV_OP_LOOKUP, (uint64_t)i, 0, NULL, 0);
        if (i >= 301 && i < 401)
            ops[i].ns = KV_NS_KEY;
    }
    ops[300] = op(KV_OP_SIZE, 300, 0, NULL, 0);
    atomic_store(&lk_calls, 0);
    ck_assert_int_eq(T->batch(c, ops, N), KV_OK);
    int calls = atomic_load(&lk_calls);
    for (int i = 0; i < N; i++) {
        ck_assert_msg(ops[i].result == KV_OK, "item %d: %s", i, kv_strerror(ops[i].result));
        if (i == 300) {
            ck_assert_uint_eq(ops[i].len, sizeof v);
            continue;
        }
        int want = ops[i].ns == KV_NS_KEY ? i % 3 == 0 : i % 2 == 0;
        ck_assert_msg(ops[i].hit == want, "item %d: hit %d", i, ops[i].hit);
    }
    ck_assert_int_eq(calls, 5);
    T->close(c);
    restart_server(NULL, 2000);
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
    tcase_add_test(tc, fake_server_learns_nothing);
    tcase_add_test(tc, wrong_token_server);
    tcase_add_test(tc, other_bytes_fail);
    tcase_add_test(tc, malformed_frames);
    tcase_add_test(tc, deadline);
    tcase_add_test(tc, stalled_peer_reaped);
    tcase_add_test(tc, concurrent_clients);
    tcase_add_test(tc, batch_many);
    tcase_add_test(tc, error_reply);
    tcase_add_test(tc, transport_pick);
    tcase_add_test(tc, lookups_batched_per_run);
    suite_add_tcase(s, tc);
    TCase *th = tcase_create("hostile");
    tcase_add_checked_fixture(th, setup, teardown);
    tcase_set_timeout(th, 20);
    tcase_add_test(th, unauthenticated_idle_closed);
    tcase_add_test(th, hello_body_capped);
    tcase_add_test(th, unauthenticated_capped);
    tcase_add_test(th, emfile_no_spin);
    tcase_add_test(th, trickled_dump_cut_off);
    tcase_add_test(th, bounce_streamed);
    tcase_add_test(th, bounce_budget);
    tcase_add_test(th, pins_capped_per_request);
    suite_add_tcase(s, th);
    return s;
}
