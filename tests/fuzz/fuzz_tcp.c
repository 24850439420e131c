/*
 * fuzz_tcp.c — libFuzzer harness for the tcp transport's server state
 * machine (net/tcp.c), with a real engine behind it.
 *
 * Key design choice: the server is driven the way a hostile peer would,
 * over a real loopback connection to an in-process listener (tcp.c has no
 * entry point that takes a ready socket, and this keeps the harness on the
 * transport's ops table, which survives changes inside tcp.c). Once per
 * process an engine is opened (`dram|ssd` with a small DRAM tier, so dumps
 * evict and spill and loads of spilled values take the SSD bounce path)
 * and a tcp server started on 127.0.0.1:0. Each input is one connection:
 * the bytes are written while responses are read, then the write side is
 * shut; the server must then close the connection within a bound (a hang
 * is reported as a crash), and afterwards a well-behaved client must still
 * be served (a lookup through the transport's own client).
 *
 * Input: byte 0 is flags (bit 0: run the challenge-response with the
 * server's token first, so the fuzzer starts past authentication; without
 * it the stream meets the exchange itself); the rest is the byte stream.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/config.h"
#include "net/auth.h"
#include "net/proto.h"
#include "net/sock.h"
#include "fuzzutil.h"

#define TOKEN "fuzz-token"
#define CLOSE_BOUND_MS 10000

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct {
    char *dir;
    kv_engine *e;
    struct kv__backend be;
    struct kv__transport *t;
    char bound[64];
    struct sockaddr_in sa;
    struct kv__conn *client;
} S;

static void teardown(void)
{
    if (S.client)
        kv__tcp_transport.close(S.client);
    if (S.t)
        kv__tcp_transport.destroy(S.t);
    kv_close(S.e);
    if (S.dir)
        fz_rmtree(S.dir);
    free(S.dir);
}

static void setup(void)
{
    char err[256];
    kv_config *cfg;
    S.dir = fz_tmpdir("tcp");
    FZ_CHECK(kv_config_new(&cfg) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "pipeline", "dram|ssd") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "dram.capacity", "8MiB") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "ssd.path", S.dir) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "ssd.capacity", "256MiB") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "io.threads", "2") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "log.level", "error") == KV_OK);
    int rc = kv_open(cfg, &S.e);
    kv_config_free(cfg);
    FZ_CHECK(rc == KV_OK);
    kv__backend_engine(S.e, &S.be);
    struct kv__net_opts o = { .timeout_ms = 2000, .threads = 1 };
    snprintf(o.token, sizeof o.token, "%s", TOKEN);
    FZ_CHECK(kv__tcp_transport.create(&o, &S.be, &S.t, err, sizeof err) == KV_OK);
    rc = kv__tcp_transport.listen(S.t, "127.0.0.1:0", S.bound, sizeof S.bound, err, sizeof err);
    if (rc)
        fprintf(stderr, "fuzz_tcp: listen: %s\n", err);
    FZ_CHECK(rc == KV_OK);
    FZ_CHECK(kv__net_parse_addr(S.bound, &S.sa) == KV_OK);
    /* libcrypto registers its own exit cleanup when first used; use it
     * before ours is registered, so it runs after the teardown has joined
     * the server's threads (whose random state it would otherwise find
     * already torn down, and LeakSanitizer report). */
    uint8_t nonce[KV__AUTH_NONCE];
    FZ_CHECK(kv__auth_nonce(nonce) == KV_OK);
    atexit(teardown);
}

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    FZ_CHECK(fd >= 0);
    if (connect(fd, (struct sockaddr *)&S.sa, sizeof S.sa) != 0) {
        FZ_CHECK(errno == EINPROGRESS);
        struct pollfd p = { .fd = fd, .events = POLLOUT };
        FZ_CHECK(poll(&p, 1, CLOSE_BOUND_MS) == 1);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr)
            fprintf(stderr, "fuzz_tcp: connect %s: %s\n", S.bound, strerror(soerr));
        FZ_CHECK(soerr == 0);
    }
    return fd;
}

/* Writes out[0..len) while draining what the server sends; shuts the write
 * side when done, and returns once the server has closed. */
static void converse(int fd, const uint8_t *out, size_t len)
{
    static uint8_t sink[1 << 16];
    size_t sent = 0;
    int wr_open = 1;
    uint64_t start = kv__now_ms();
    for (;;) {
        if (wr_open && sent == len) {
            shutdown(fd, SHUT_WR);
            wr_open = 0;
        }
        struct pollfd p = { .fd = fd, .events = POLLIN | (wr_open ? POLLOUT : 0) };
        uint64_t now = kv__now_ms();
        if (now - start > CLOSE_BOUND_MS) {
            fprintf(stderr, "fuzz_tcp: the server neither finished nor closed a connection "
                    "within %d ms after its peer stopped sending\n", CLOSE_BOUND_MS);
            abort();
        }
        if (poll(&p, 1, 100) <= 0)
            continue;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = read(fd, sink, sizeof sink);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                return;     /* closed (or reset) by the server */
        }
        if (wr_open && (p.revents & POLLOUT)) {
            ssize_t w = send(fd, out + sent, len - sent, MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                wr_open = 0;    /* the server closed on us: only read now */
        }
    }
}

/* A well-behaved client is still served. Its connection is kept from one
 * input to the next, as a pool keeps it; one the server has since closed
 * (an idle limit, say) is replaced once before a failure counts. */
static void still_serving(void)
{
    int rc = KV_ENET;
    struct kv__op op = { .kind = KV_OP_LOOKUP, .ns = KV_NS_BLOCK };
    for (int attempt = 0; attempt < 2 && rc != KV_OK; attempt++) {
        if (attempt > 0 && S.client) {
            kv__tcp_transport.close(S.client);
            S.client = NULL;
        }
        if (!S.client) {
            rc = kv__tcp_transport.connect(S.t, S.bound, &S.client);
            if (rc)
                fprintf(stderr, "fuzz_tcp: a valid client cannot connect: %s\n",
                        kv_strerror(rc));
            FZ_CHECK(rc == KV_OK);
        }
        op.result = 0;
        rc = kv__tcp_transport.batch(S.client, &op, 1);
    }
    if (rc || op.result) {
        fprintf(stderr, "fuzz_tcp: a valid lookup failed: %s / %s\n", kv_strerror(rc),
                kv_strerror(op.result));
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!S.e)
        setup();
    if (size < 1)
        return 0;
    int fd = dial();
    if (data[0] & 1) {
        int rc = kv__auth_client(fd, TOKEN, kv__now_ms() + CLOSE_BOUND_MS);
        if (rc)
            fprintf(stderr, "fuzz_tcp: the challenge-response failed: %s\n", kv_strerror(rc));
        FZ_CHECK(rc == KV_OK);
    }
    converse(fd, data + 1, size - 1);
    close(fd);
    still_serving();
    return 0;
}

/* ---- seeds: real request streams ---------------------------------------- */

struct sbuf {
    uint8_t *p;
    size_t len, cap;
};

static void sb_put(struct sbuf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
        FZ_CHECK(b->p);
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

/* Appends a BATCH frame of items (dump data: byte pattern per item). */
static void sb_batch(struct sbuf *b, const struct kv__wire_req *it, size_t n, uint64_t req_id)
{
    size_t blen = kv__batch_body_len(n);
    uint8_t *body = malloc(blen);
    FZ_CHECK(body && kv__batch_encode(it, n, body, blen) == (int)blen);
    uint64_t data = 0;
    for (size_t i = 0; i < n; i++)
        if (it[i].kind == KV_OP_DUMP)
            data += it[i].len;
    uint8_t hdr[KV_PROTO_HDR_LEN];
    struct kv__hdr h = { .type = KV_MSG_BATCH, .body_len = (uint32_t)blen, .req_id = req_id,
                         .data_len = data };
    kv__hdr_encode(&h, hdr);
    sb_put(b, hdr, sizeof hdr);
    sb_put(b, body, blen);
    for (size_t i = 0; i < n; i++)
        for (uint64_t k = 0; it[i].kind == KV_OP_DUMP && k < it[i].len; k++) {
            uint8_t c = (uint8_t)(i * 31 + k);
            sb_put(b, &c, 1);
        }
    free(body);
}

static void sb_seed(const char *dir, const char *name, struct sbuf *b)
{
    fz_seed(dir, name, b->p, b->len);
    b->len = 0;
}

static void write_seeds(const char *dir)
{
    struct sbuf b = { 0 };
    uint8_t flag = 1, raw = 0, hello[KV__AUTH_HELLO_LEN + KV__AUTH_PROOF_LEN];
    memcpy(hello, KV__AUTH_MAGIC, KV__AUTH_MAGIC_LEN);
    for (size_t i = KV__AUTH_MAGIC_LEN; i < sizeof hello; i++)
        hello[i] = (uint8_t)(i * 13);
    struct kv__wire_req dump[3] = {
        { .kind = KV_OP_DUMP, .ns = KV_NS_BLOCK, .index = 0, .id.bytes = { 1 }, .len = 100 },
        { .kind = KV_OP_DUMP, .ns = KV_NS_BLOCK, .index = 1, .id.bytes = { 1 }, .len = 5000 },
        { .kind = KV_OP_DUMP, .ns = KV_NS_KEY, .index = 0, .id.bytes = { 2 }, .len = 7 },
    };
    struct kv__wire_req read[5] = {
        { .kind = KV_OP_LOOKUP, .ns = KV_NS_BLOCK, .id.bytes = { 1 } },
        { .kind = KV_OP_SIZE, .ns = KV_NS_BLOCK, .index = 1, .id.bytes = { 1 } },
        { .kind = KV_OP_LOAD, .ns = KV_NS_BLOCK, .index = 0, .id.bytes = { 1 }, .len = 100 },
        { .kind = KV_OP_LOAD, .ns = KV_NS_BLOCK, .index = 1, .id.bytes = { 1 }, .len = 5000 },
        { .kind = KV_OP_LOAD, .ns = KV_NS_KEY, .index = 0, .id.bytes = { 2 }, .len = 6 },
    };

    sb_put(&b, &flag, 1);
    sb_batch(&b, dump, 3, 2);
    sb_batch(&b, read, 5, 3);
    sb_seed(dir, "dump-then-load", &b);

    sb_put(&b, &flag, 1);
    sb_batch(&b, read, 5, 2);
    sb_seed(dir, "load", &b);

    /* Larger blocks, and loads of them: the 8 MiB DRAM tier fills over the
     * inputs (the engine lives as long as the process), then evicts and
     * spills, and loads of spilled blocks take the SSD path. Kept small: the
     * largest seed sets libFuzzer's input size limit. */
    struct kv__wire_req big[4];
    for (int i = 0; i < 4; i++)
        big[i] = (struct kv__wire_req){ .kind = KV_OP_DUMP, .ns = KV_NS_BLOCK,
                                        .id.bytes = { 9, (uint8_t)i }, .len = 12 << 10 };
    sb_put(&b, &flag, 1);
    sb_batch(&b, big, 4, 2);
    for (int i = 0; i < 4; i++)
        big[i].kind = KV_OP_LOAD;
    sb_batch(&b, big, 4, 3);
    sb_seed(dir, "big", &b);

    /* The exchange from the fuzzer's side: a hello, then a proof it cannot
     * have made, then a frame the server must never serve. */
    sb_put(&b, &raw, 1);
    sb_put(&b, hello, KV__AUTH_HELLO_LEN);
    sb_seed(dir, "hello-only", &b);

    sb_put(&b, &raw, 1);
    sb_put(&b, hello, sizeof hello);
    sb_batch(&b, read, 1, 2);
    sb_seed(dir, "forged-proof", &b);

    /* Plain keys as a cluster puts them: a replacing dump, a load, a
     * remove, a load that now misses. */
    struct kv__wire_req keys[4] = {
        { .kind = KV_OP_DUMP, .ns = KV_NS_KEY, .flags = KV_WIRE_REPLACE, .id.bytes = { 3 },
          .len = 11 },
        { .kind = KV_OP_LOAD, .ns = KV_NS_KEY, .id.bytes = { 3 }, .len = 11 },
        { .kind = KV_OP_REMOVE, .ns = KV_NS_KEY, .id.bytes = { 3 } },
        { .kind = KV_OP_LOAD, .ns = KV_NS_KEY, .id.bytes = { 3 }, .len = 11 },
    };
    sb_put(&b, &flag, 1);
    sb_batch(&b, keys, 1, 2);
    sb_batch(&b, keys + 1, 3, 3);
    sb_seed(dir, "keys-replace-remove", &b);

    /* A dump whose data stops short (the peer leaves mid-frame). */
    sb_put(&b, &flag, 1);
    sb_batch(&b, dump, 2, 2);
    b.len -= 1000;
    sb_seed(dir, "short-data", &b);
    free(b.p);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    fz_mkcorpus(write_seeds);
    return 0;
}
