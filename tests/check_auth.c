/*
 * check_auth.c — the token's challenge-response (net/auth.c): both sides
 * prove the token over fresh nonces, a wrong token on either side is
 * refused, and no frame carries the token.
 */
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/auth.h"
#include "engine/internal.h"
#include "testutil.h"

struct side {
    int fd;
    const char *token;
    int rc;
};

static void *serve(void *arg)
{
    struct side *s = arg;
    s->rc = kv__auth_server(s->fd, s->token, kv__now_ms() + 5000);
    return NULL;
}

/* Runs one exchange over a socketpair; returns the client's result and
 * puts the server's in *server_rc. */
static int exchange(const char *client_token, const char *server_token, int *server_rc)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    struct side srv = { sv[1], server_token, 0 };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, serve, &srv), 0);
    int rc = kv__auth_client(sv[0], client_token, kv__now_ms() + 5000);
    if (rc != KV_OK)
        shutdown(sv[0], SHUT_RDWR);   /* a client that gives up closes: the server sees it */
    pthread_join(th, NULL);
    close(sv[0]);
    close(sv[1]);
    *server_rc = srv.rc;
    return rc;
}

START_TEST(same_token_both_sides_pass)
{
    int srv;
    ck_assert_int_eq(exchange("s3cret", "s3cret", &srv), KV_OK);
    ck_assert_int_eq(srv, KV_OK);
    ck_assert_int_eq(exchange("", "", &srv), KV_OK);   /* no token: the same exchange */
    ck_assert_int_eq(srv, KV_OK);
}
END_TEST

START_TEST(wrong_token_is_refused_by_the_client_first)
{
    int srv;
    /* The server cannot prove "s3cret": the client stops before it sends a
     * proof of its own, and the server never sees one. */
    ck_assert_int_eq(exchange("s3cret", "guess", &srv), KV_EPERM);
    ck_assert_int_ne(srv, KV_OK);
    ck_assert_int_eq(exchange("", "s3cret", &srv), KV_EPERM);
    ck_assert_int_ne(srv, KV_OK);
}
END_TEST

START_TEST(macs_depend_on_role_nonces_and_token)
{
    uint8_t nc[KV__AUTH_NONCE], ns[KV__AUTH_NONCE], a[KV__AUTH_MAC], b[KV__AUTH_MAC];
    ck_assert_int_eq(kv__auth_nonce(nc), KV_OK);
    ck_assert_int_eq(kv__auth_nonce(ns), KV_OK);
    ck_assert_int_ne(memcmp(nc, ns, sizeof nc), 0);
    ck_assert_int_eq(kv__auth_mac("t", KV__AUTH_SERVER, nc, ns, a), KV_OK);
    ck_assert(kv__auth_verify("t", KV__AUTH_SERVER, nc, ns, a));
    ck_assert(!kv__auth_verify("t", KV__AUTH_CLIENT, nc, ns, a));   /* no reflection */
    ck_assert(!kv__auth_verify("u", KV__AUTH_SERVER, nc, ns, a));
    ck_assert(!kv__auth_verify("t", KV__AUTH_SERVER, ns, nc, a));
    ck_assert_int_eq(kv__auth_mac("t", KV__AUTH_CLIENT, nc, ns, b), KV_OK);
    ck_assert_int_ne(memcmp(a, b, sizeof a), 0);
    ck_assert_int_eq(kv__auth_sign("t", "rec", "abc", 3, a), KV_OK);
    ck_assert(kv__auth_check("t", "rec", "abc", 3, a));
    ck_assert(!kv__auth_check("t", "rec", "abd", 3, a));
    ck_assert(!kv__auth_check("t", "other", "abc", 3, a));
}
END_TEST

static void *client(void *arg)
{
    struct side *s = arg;
    s->rc = kv__auth_client(s->fd, s->token, kv__now_ms() + 5000);
    return NULL;
}

/* What crosses the wire, read by a relay between the two sides, never
 * holds the token, and is exactly the four messages of auth.h. */
START_TEST(token_never_on_the_wire)
{
    const char *token = "a-token-that-must-stay-home";
    enum { WIRE = 4 + 32 + 4 + 32 + 32 + 32 + 1 };
    int c[2], s[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, c), 0);
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, s), 0);
    struct side srv = { s[1], token, 1 }, cli = { c[0], token, 1 };
    pthread_t ts, tc;
    ck_assert_int_eq(pthread_create(&ts, NULL, serve, &srv), 0);
    ck_assert_int_eq(pthread_create(&tc, NULL, client, &cli), 0);
    uint8_t seen[4096];
    size_t nseen = 0;
    for (uint64_t end = kv__now_ms() + 5000; nseen < WIRE && kv__now_ms() < end;) {
        uint8_t buf[512];
        int from[2] = { c[1], s[0] }, to[2] = { s[0], c[1] };
        for (int k = 0; k < 2; k++) {
            ssize_t n = read(from[k], buf, sizeof buf);
            if (n <= 0)
                continue;
            ck_assert(nseen + (size_t)n <= sizeof seen);
            memcpy(seen + nseen, buf, (size_t)n);
            nseen += (size_t)n;
            ck_assert_int_eq(write(to[k], buf, (size_t)n), n);
        }
        usleep(200);
    }
    pthread_join(ts, NULL);
    pthread_join(tc, NULL);
    ck_assert_int_eq(cli.rc, KV_OK);
    ck_assert_int_eq(srv.rc, KV_OK);
    ck_assert_uint_eq(nseen, WIRE);
    ck_assert_ptr_null(memmem(seen, nseen, token, strlen(token)));
    close(c[0]), close(c[1]), close(s[0]), close(s[1]);
}
END_TEST

Suite *auth_suite(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, same_token_both_sides_pass);
    tcase_add_test(tc, wrong_token_is_refused_by_the_client_first);
    tcase_add_test(tc, macs_depend_on_role_nonces_and_token);
    tcase_add_test(tc, token_never_on_the_wire);
    suite_add_tcase(s, tc);
    return s;
}
