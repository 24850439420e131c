/*
 * auth.c — the token's challenge-response (auth.h), on OpenSSL's libcrypto:
 * RAND_bytes for nonces, HMAC-SHA256, CRYPTO_memcmp for constant time.
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "engine/config.h"
#include "engine/internal.h"
#include "proto.h"
#include "sock.h"

/* The first bytes of the exchange: tells a client of this protocol from a
 * stray one, and would let a later version say so. */
static const uint8_t magic[KV__AUTH_MAGIC_LEN] = { 'K', 'V', 'A', '1' };

static const char *const labels[] = { [KV__AUTH_SERVER] = "kvengine/server",
                                      [KV__AUTH_CLIENT] = "kvengine/client" };

int kv__auth_nonce(uint8_t nonce[KV__AUTH_NONCE])
{
    return RAND_bytes(nonce, KV__AUTH_NONCE) == 1 ? KV_OK : KV_EIO;
}

int kv__auth_eq(const void *a, const void *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}

static int hmac(const char *token, const void *a, size_t alen, const void *b, size_t blen,
                const void *c, size_t clen, uint8_t mac[KV__AUTH_MAC])
{
    uint8_t msg[256];
    if (alen + blen + clen > sizeof msg)
        return KV_EINVAL;
    memcpy(msg, a, alen);
    memcpy(msg + alen, b, blen);
    memcpy(msg + alen + blen, c, clen);
    unsigned out = 0;
    /* A zero-length key is a valid HMAC key; libcrypto wants a non-NULL
     * pointer for it. */
    uint8_t *r = HMAC(EVP_sha256(), token, (int)strlen(token), msg, alen + blen + clen, mac, &out);
    OPENSSL_cleanse(msg, sizeof msg);
    return r && out == KV__AUTH_MAC ? KV_OK : KV_EIO;
}

int kv__auth_mac(const char *token, int role, const uint8_t nc[KV__AUTH_NONCE],
                 const uint8_t ns[KV__AUTH_NONCE], uint8_t mac[KV__AUTH_MAC])
{
    const char *l = labels[role == KV__AUTH_CLIENT];
    return hmac(token, l, strlen(l) + 1, nc, KV__AUTH_NONCE, ns, KV__AUTH_NONCE, mac);
}

int kv__auth_verify(const char *token, int role, const uint8_t nc[KV__AUTH_NONCE],
                    const uint8_t ns[KV__AUTH_NONCE], const uint8_t mac[KV__AUTH_MAC])
{
    uint8_t want[KV__AUTH_MAC];
    return kv__auth_mac(token, role, nc, ns, want) == KV_OK && kv__auth_eq(want, mac, sizeof want);
}

int kv__auth_sign(const char *token, const char *label, const void *msg, size_t len,
                  uint8_t mac[KV__AUTH_MAC])
{
    /* Records may be long: HMAC over label | NUL | msg, gathered once. */
    size_t ll = strlen(label) + 1;
    uint8_t *buf = malloc(ll + len);
    if (!buf)
        return KV_ENOMEM;
    memcpy(buf, label, ll);
    if (len)
        memcpy(buf + ll, msg, len);
    unsigned out = 0;
    uint8_t *r = HMAC(EVP_sha256(), token, (int)strlen(token), buf, ll + len, mac, &out);
    free(buf);
    return r && out == KV__AUTH_MAC ? KV_OK : KV_EIO;
}

int kv__auth_check(const char *token, const char *label, const void *msg, size_t len,
                   const uint8_t mac[KV__AUTH_MAC])
{
    uint8_t want[KV__AUTH_MAC];
    return kv__auth_sign(token, label, msg, len, want) == KV_OK &&
           kv__auth_eq(want, mac, sizeof want);
}

/* ---- the exchange on a stream --------------------------------------------- */

int kv__auth_client(int fd, const char *token, uint64_t deadline)
{
    uint8_t hello[sizeof magic + KV__AUTH_NONCE], reply[sizeof magic + KV__AUTH_NONCE + KV__AUTH_MAC];
    uint8_t *nc = hello + sizeof magic, *ns = reply + sizeof magic, *ms = ns + KV__AUTH_NONCE;
    memcpy(hello, magic, sizeof magic);
    int rc = kv__auth_nonce(nc);
    if (rc == KV_OK)
        rc = kv__sock_xfer1(fd, hello, sizeof hello, 1, deadline);
    if (rc == KV_OK)
        rc = kv__sock_xfer1(fd, reply, sizeof reply, 0, deadline);
    if (rc != KV_OK)
        return rc;
    if (memcmp(reply, magic, sizeof magic) != 0)
        return KV_EPROTO;
    if (!kv__auth_verify(token, KV__AUTH_SERVER, nc, ns, ms))
        return KV_EPERM;   /* an impostor, or another cluster: prove nothing to it */
    uint8_t mc[KV__AUTH_MAC], verdict = 0;
    if ((rc = kv__auth_mac(token, KV__AUTH_CLIENT, nc, ns, mc)) != KV_OK ||
        (rc = kv__sock_xfer1(fd, mc, sizeof mc, 1, deadline)) != KV_OK ||
        (rc = kv__sock_xfer1(fd, &verdict, 1, 0, deadline)) != KV_OK)
        return rc;
    return verdict == 1 ? KV_OK : KV_EPERM;
}

int kv__auth_server(int fd, const char *token, uint64_t deadline)
{
    uint8_t hello[sizeof magic + KV__AUTH_NONCE], reply[sizeof magic + KV__AUTH_NONCE + KV__AUTH_MAC];
    uint8_t *nc = hello + sizeof magic, *ns = reply + sizeof magic, *ms = ns + KV__AUTH_NONCE;
    int rc = kv__sock_xfer1(fd, hello, sizeof hello, 0, deadline);
    if (rc != KV_OK)
        return rc;
    if (memcmp(hello, magic, sizeof magic) != 0)
        return KV_EPROTO;
    memcpy(reply, magic, sizeof magic);
    uint8_t mc[KV__AUTH_MAC];
    if ((rc = kv__auth_nonce(ns)) != KV_OK ||
        (rc = kv__auth_mac(token, KV__AUTH_SERVER, nc, ns, ms)) != KV_OK ||
        (rc = kv__sock_xfer1(fd, reply, sizeof reply, 1, deadline)) != KV_OK ||
        (rc = kv__sock_xfer1(fd, mc, sizeof mc, 0, deadline)) != KV_OK)
        return rc;
    uint8_t verdict = (uint8_t)kv__auth_verify(token, KV__AUTH_CLIENT, nc, ns, mc);
    rc = kv__sock_xfer1(fd, &verdict, 1, 1, deadline);
    return rc != KV_OK ? rc : verdict ? KV_OK : KV_EPERM;
}

int kv__auth_reply(const char *token, const uint8_t *hello, struct kv__auth_state *st,
                   uint8_t *reply)
{
    if (memcmp(hello, magic, sizeof magic) != 0)
        return KV_EPROTO;
    memcpy(st->nc, hello + sizeof magic, KV__AUTH_NONCE);
    memcpy(reply, magic, sizeof magic);
    int rc = kv__auth_nonce(st->ns);
    if (rc == KV_OK)
        memcpy(reply + sizeof magic, st->ns, KV__AUTH_NONCE);
    return rc == KV_OK ? kv__auth_mac(token, KV__AUTH_SERVER, st->nc, st->ns,
                                      reply + sizeof magic + KV__AUTH_NONCE)
                       : rc;
}

int kv__auth_proof_ok(const char *token, const struct kv__auth_state *st, const uint8_t *proof)
{
    return kv__auth_verify(token, KV__AUTH_CLIENT, st->nc, st->ns, proof);
}

/* ---- where the token comes from ------------------------------------------ */

static int token_ok(const char *t, size_t len, const char *what, char *err, size_t errlen)
{
    if (len > KV_PROTO_ID_MAX) {
        kv__errf(err, errlen, "%s: the token is longer than %d bytes", what, KV_PROTO_ID_MAX);
        return KV_ECONFIG;
    }
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)t[i] < 0x20 || t[i] == 0x7f) {
            kv__errf(err, errlen, "%s: the token holds a control character or NUL", what);
            return KV_ECONFIG;
        }
    return KV_OK;
}

static int token_from_file(const char *path, char *out, char *err, size_t errlen)
{
    /* No symlink, and checked on the descriptor that is read: the file
     * cannot be swapped between the check and the read. */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        kv__errf(err, errlen, "cluster.token_file: %s: %s", path, strerror(errno));
        return errno == ELOOP ? KV_ECONFIG : KV_EIO;
    }
    struct stat st;
    char buf[KV_PROTO_ID_MAX + 3];
    int rc = KV_OK;
    if (fstat(fd, &st) != 0) {
        kv__errf(err, errlen, "cluster.token_file: %s: %s", path, strerror(errno));
        rc = KV_EIO;
    } else if (!S_ISREG(st.st_mode)) {
        kv__errf(err, errlen, "cluster.token_file: %s is not a regular file", path);
        rc = KV_ECONFIG;
    } else if (st.st_uid != geteuid()) {
        kv__errf(err, errlen, "cluster.token_file: %s is not owned by this user (uid %u)", path,
                 (unsigned)geteuid());
        rc = KV_ECONFIG;
    } else if (st.st_mode & 077) {
        kv__errf(err, errlen, "cluster.token_file: %s has mode %04o; it must be 0600 or 0400",
                 path, (unsigned)(st.st_mode & 07777));
        rc = KV_ECONFIG;
    }
    ssize_t n = 0;
    while (rc == KV_OK) {
        ssize_t r = read(fd, buf + n, sizeof buf - (size_t)n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            kv__errf(err, errlen, "cluster.token_file: %s: %s", path, strerror(errno));
            rc = KV_EIO;
        }
        if (r <= 0)
            break;
        n += r;
        if ((size_t)n == sizeof buf)
            break;
    }
    close(fd);
    if (rc == KV_OK) {
        size_t len = (size_t)n;
        if (len && buf[len - 1] == '\n')
            len--;
        if (len && buf[len - 1] == '\r')
            len--;
        if (!len) {
            kv__errf(err, errlen, "cluster.token_file: %s is empty", path);
            rc = KV_ECONFIG;
        } else if ((rc = token_ok(buf, len, "cluster.token_file", err, errlen)) == KV_OK) {
            memcpy(out, buf, len);
            out[len] = 0;
        }
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return rc;
}

int kv__auth_token(const struct kv_config *cfg, char *out, char *err, size_t errlen)
{
    const char *tok = cfg->cluster.token, *file = cfg->cluster.token_file;
    if (tok[0] && file[0]) {
        kv__errf(err, errlen, "cluster.token_file: set it or cluster.token, not both");
        return KV_ECONFIG;
    }
    if (file[0])
        return token_from_file(file, out, err, errlen);
    const char *what = "cluster.token";
    if (!tok[0]) {
        const char *env = getenv("KVENGINE_TOKEN");
        what = "KVENGINE_TOKEN";
        if (!env || !env[0]) {
            env = getenv("KV_TOKEN");
            what = "KV_TOKEN";
        }
        tok = env ? env : "";
    }
    int rc = token_ok(tok, strlen(tok), what, err, errlen);
    if (rc == KV_OK && out != tok)
        snprintf(out, KV_CFG_STR, "%s", tok);
    return rc;
}
