/*
 * auth.c — the token's challenge-response (auth.h), on OpenSSL's libcrypto:
 * RAND_bytes for nonces, HMAC-SHA256, CRYPTO_memcmp for constant time.
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "engine/internal.h"
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
