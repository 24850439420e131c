/*
 * fuzz_auth.c — libFuzzer harness for the token's challenge-response
 * (net/auth.c): both sides fed whatever a hostile peer may send.
 *
 * Key design choice: the properties are the protocol's promises, not only
 * "no crash". A peer without the token (the fuzzer) never passes either
 * side, whatever it sends; the client never sends its proof to a server
 * that did not prove itself (all it writes is its 36-byte hello); nothing
 * either side writes contains the token. Byte 0 picks the case:
 *   0  the server's two steps (kv__auth_reply, kv__auth_proof_ok) on a
 *      hello and a proof from the input; the right proof still passes
 *   1  kv__auth_client over a socketpair, the input as the server's bytes
 *   2  kv__auth_server over a socketpair, the input as the client's bytes
 */
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/internal.h"
#include "net/auth.h"
#include "fuzzutil.h"

#define TOKEN "fuzz-token-7f3a"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void steps_case(const uint8_t *in, size_t n)
{
    if (n < KV__AUTH_HELLO_LEN + KV__AUTH_PROOF_LEN)
        return;
    struct kv__auth_state st;
    uint8_t reply[KV__AUTH_REPLY_LEN];
    int rc = kv__auth_reply(TOKEN, in, &st, reply);
    if (rc != KV_OK) {
        FZ_CHECK(rc == KV_EPROTO && memcmp(in, KV__AUTH_MAGIC, KV__AUTH_MAGIC_LEN) != 0);
        return;
    }
    /* The reply proves the server over the client's nonce and its own. */
    FZ_CHECK(memcmp(st.nc, in + KV__AUTH_MAGIC_LEN, KV__AUTH_NONCE) == 0);
    FZ_CHECK(kv__auth_verify(TOKEN, KV__AUTH_SERVER, st.nc, st.ns,
                             reply + KV__AUTH_MAGIC_LEN + KV__AUTH_NONCE));
    FZ_CHECK(!memmem(reply, sizeof reply, TOKEN, strlen(TOKEN)));
    /* Whatever proof the input holds fails: Ns was fresh. */
    FZ_CHECK(!kv__auth_proof_ok(TOKEN, &st, in + KV__AUTH_HELLO_LEN));
    /* Nor does a reflection of the server's own MAC pass as the client's. */
    FZ_CHECK(!kv__auth_proof_ok(TOKEN, &st, reply + KV__AUTH_MAGIC_LEN + KV__AUTH_NONCE));
    uint8_t mc[KV__AUTH_MAC];
    FZ_CHECK(kv__auth_mac(TOKEN, KV__AUTH_CLIENT, st.nc, st.ns, mc) == KV_OK);
    FZ_CHECK(kv__auth_proof_ok(TOKEN, &st, mc));
    FZ_CHECK(!kv__auth_proof_ok("another", &st, mc));
}

/* A socketpair whose peer end already holds in[0..n) and is then shut for
 * writing; the other end is nonblocking, as sock.h's I/O wants. */
static void pair(const uint8_t *in, size_t n, int *mine, int *peer)
{
    int sv[2];
    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    int big = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    if (n > 65536)
        n = 65536;
    FZ_CHECK(n == 0 || write(sv[1], in, n) == (ssize_t)n);
    shutdown(sv[1], SHUT_WR);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    *mine = sv[0];
    *peer = sv[1];
}

static size_t drain(int fd, uint8_t *buf, size_t cap)
{
    size_t got = 0;
    ssize_t r;
    while (got < cap && (r = read(fd, buf + got, cap - got)) > 0)
        got += (size_t)r;
    return got;
}

static void client_case(const uint8_t *in, size_t n)
{
    int fd, peer;
    pair(in, n, &fd, &peer);
    int rc = kv__auth_client(fd, TOKEN, kv__now_ms() + 2000);
    FZ_CHECK(rc != KV_OK);
    close(fd);
    static uint8_t sent[4096];
    size_t got = drain(peer, sent, sizeof sent);
    close(peer);
    /* The hello only: no proof to a server that did not prove itself. */
    FZ_CHECK(got == KV__AUTH_HELLO_LEN);
    FZ_CHECK(memcmp(sent, KV__AUTH_MAGIC, KV__AUTH_MAGIC_LEN) == 0);
    FZ_CHECK(!memmem(sent, got, TOKEN, strlen(TOKEN)));
}

static void server_case(const uint8_t *in, size_t n)
{
    int fd, peer;
    pair(in, n, &fd, &peer);
    int rc = kv__auth_server(fd, TOKEN, kv__now_ms() + 2000);
    FZ_CHECK(rc != KV_OK);
    close(fd);
    static uint8_t sent[4096];
    size_t got = drain(peer, sent, sizeof sent);
    close(peer);
    /* At most its reply and a refusal. */
    FZ_CHECK(got == 0 || got == KV__AUTH_REPLY_LEN || got == KV__AUTH_REPLY_LEN + 1);
    FZ_CHECK(got <= KV__AUTH_REPLY_LEN || sent[KV__AUTH_REPLY_LEN] == 0);
    FZ_CHECK(!memmem(sent, got, TOKEN, strlen(TOKEN)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t *in = malloc(size - 1 ? size - 1 : 1);
    FZ_CHECK(in);
    memcpy(in, data + 1, size - 1);
    switch (data[0] % 3) {
    case 0: steps_case(in, size - 1);  break;
    case 1: client_case(in, size - 1); break;
    case 2: server_case(in, size - 1); break;
    }
    free(in);
    return 0;
}

/* ---- seeds: the exchange's own messages ---------------------------------- */

static void seed(const char *dir, const char *name, int sel, const uint8_t *body, size_t len)
{
    uint8_t buf[512];
    FZ_CHECK(len + 1 <= sizeof buf);
    buf[0] = (uint8_t)sel;
    memcpy(buf + 1, body, len);
    fz_seed(dir, name, buf, len + 1);
}

static void write_seeds(const char *dir)
{
    uint8_t m[KV__AUTH_REPLY_LEN + KV__AUTH_MAC + 1];
    memcpy(m, KV__AUTH_MAGIC, KV__AUTH_MAGIC_LEN);
    FZ_CHECK(kv__auth_nonce(m + KV__AUTH_MAGIC_LEN) == KV_OK);
    FZ_CHECK(kv__auth_nonce(m + KV__AUTH_HELLO_LEN) == KV_OK);
    seed(dir, "hello-and-proof", 0, m, KV__AUTH_HELLO_LEN + KV__AUTH_PROOF_LEN);
    seed(dir, "server-hello", 2, m, KV__AUTH_HELLO_LEN + KV__AUTH_PROOF_LEN);
    /* A reply with a made-up MAC, and one followed by a verdict. */
    m[KV__AUTH_REPLY_LEN] = 1;
    seed(dir, "client-reply", 1, m, KV__AUTH_REPLY_LEN + 1);
    memcpy(m, "KVNE", 4);
    seed(dir, "client-frame", 1, m, KV__AUTH_REPLY_LEN);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    fz_mkcorpus(write_seeds);
    return 0;
}
