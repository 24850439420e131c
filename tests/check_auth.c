/*
 * check_auth.c — the token's challenge-response (net/auth.c): both sides
 * prove the token over fresh nonces, a wrong token on either side is
 * refused, and no frame carries the token.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/config.h"
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

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ck_assert_int_eq(chmod(path, mode), 0);
}

static int resolve(const char *token, const char *file, char *out, char *err, size_t errlen)
{
    struct kv_config cfg;
    kv__config_defaults(&cfg);
    snprintf(cfg.cluster.token, sizeof cfg.cluster.token, "%s", token);
    snprintf(cfg.cluster.token_file, sizeof cfg.cluster.token_file, "%.200s", file);
    return kv__auth_token(&cfg, out, err, errlen);
}

/* cluster.token_file and KVENGINE_TOKEN / KV_TOKEN, so the token need not
 * be on a command line (issue 17, 7): the file must be a regular file of
 * ours, mode 0600 or 0400, no symlink; one trailing newline is dropped. */
START_TEST(token_from_file_and_environment)
{
    char *dir = tu_mkdtemp(), f[200], l[200], d[200], out[KV_CFG_STR], err[256];
    snprintf(f, sizeof f, "%s/token", dir);
    snprintf(l, sizeof l, "%s/link", dir);
    snprintf(d, sizeof d, "%s/sub", dir);
    unsetenv("KVENGINE_TOKEN");
    unsetenv("KV_TOKEN");
    write_file(f, "s3cret\n", 0600);
    ck_assert_int_eq(resolve("", f, out, err, sizeof err), KV_OK);
    ck_assert_str_eq(out, "s3cret");
    ck_assert_int_eq(chmod(f, 0400), 0);
    ck_assert_int_eq(resolve("", f, out, err, sizeof err), KV_OK);
    ck_assert_str_eq(out, "s3cret");
    static const mode_t bad[] = { 0640, 0604, 0644, 0660 };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(chmod(f, bad[i]), 0);
        err[0] = 0;
        ck_assert_int_eq(resolve("", f, out, err, sizeof err), KV_ECONFIG);
        ck_assert_msg(strstr(err, "0600 or 0400"), "said: %s", err);
    }
    ck_assert_int_eq(chmod(f, 0600), 0);
    ck_assert_int_eq(symlink(f, l), 0);
    ck_assert_int_eq(resolve("", l, out, err, sizeof err), KV_ECONFIG);
    ck_assert_int_eq(mkdir(d, 0700), 0);
    ck_assert_int_eq(resolve("", d, out, err, sizeof err), KV_ECONFIG);
    ck_assert_int_ne(resolve("", "/nonexistent/kv-token", out, err, sizeof err), KV_OK);
    ck_assert_int_eq(resolve("x", f, out, err, sizeof err), KV_ECONFIG);   /* both set */
    write_file(f, "", 0600);
    ck_assert_int_eq(resolve("", f, out, err, sizeof err), KV_ECONFIG);    /* empty */
    write_file(f, "a\nb", 0600);
    ck_assert_int_eq(resolve("", f, out, err, sizeof err), KV_ECONFIG);    /* a control */
    char big[200];
    memset(big, 'k', sizeof big - 1);
    big[sizeof big - 1] = 0;
    write_file(f, big, 0600);
    ck_assert_int_eq(resolve("", f, out, err, sizeof err), KV_ECONFIG);    /* too long */
    /* the environment, when neither key is set; the config wins over it */
    setenv("KV_TOKEN", "from-kv", 1);
    ck_assert_int_eq(resolve("", "", out, err, sizeof err), KV_OK);
    ck_assert_str_eq(out, "from-kv");
    setenv("KVENGINE_TOKEN", "from-kvengine", 1);
    ck_assert_int_eq(resolve("", "", out, err, sizeof err), KV_OK);
    ck_assert_str_eq(out, "from-kvengine");
    ck_assert_int_eq(resolve("given", "", out, err, sizeof err), KV_OK);
    ck_assert_str_eq(out, "given");
    unsetenv("KVENGINE_TOKEN");
    unsetenv("KV_TOKEN");
    ck_assert_int_eq(resolve("", "", out, err, sizeof err), KV_OK);
    ck_assert_str_eq(out, "");
    tu_rmdir(dir);
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
    tcase_add_test(tc, token_from_file_and_environment);
    suite_add_tcase(s, tc);
    return s;
}
