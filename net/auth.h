/*
 * auth.h — proving the cluster token without sending it: a mutual
 * challenge-response that every connection runs before anything else (tcp,
 * rdma, kvmaster, the host store's socket).
 *
 * Key design choice: both sides pick a fresh 32-byte nonce and prove the
 * token with HMAC-SHA256 over both nonces, each side under its own label,
 * so a reply can be neither replayed (the peer's nonce is new) nor
 * reflected (the labels differ). The server proves itself first: a client
 * that reached a forged address finds out before it sends a proof of its
 * own, and what it does send (a MAC over nonces the forger chose) is worth
 * nothing on any other connection. The token never appears in a frame or
 * a log line. An empty token runs the same exchange with an empty key:
 * nothing is special-cased.
 *
 * The exchange, for a transport that frames it itself (tcp's HELLO):
 *   client -> server  Nc
 *   server -> client  Ns, Ms = HMAC(token, "kvengine/server" | Nc | Ns)
 *   client -> server  Mc = HMAC(token, "kvengine/client" | Nc | Ns)
 *   server -> client  accepted or refused
 * kv__auth_client / kv__auth_server run it on a blocking-with-deadline
 * stream (sock.h) for transports that have one; the primitives below are
 * for those with a state machine of their own.
 */
#ifndef KV_NET_AUTH_H
#define KV_NET_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define KV__AUTH_NONCE 32
#define KV__AUTH_MAC   32
/* The exchange's messages on a stream, for a server that runs it in a
 * state machine of its own (tcp.c, master.c): the client's hello (magic,
 * Nc), the server's reply (magic, Ns, Ms), the client's proof (Mc), the
 * server's verdict (one byte, 1 = accepted). */
#define KV__AUTH_MAGIC     "KVA1"
#define KV__AUTH_MAGIC_LEN 4
#define KV__AUTH_HELLO_LEN (KV__AUTH_MAGIC_LEN + KV__AUTH_NONCE)
#define KV__AUTH_REPLY_LEN (KV__AUTH_MAGIC_LEN + KV__AUTH_NONCE + KV__AUTH_MAC)
#define KV__AUTH_PROOF_LEN KV__AUTH_MAC

/* The server's side of one step, on a message that has arrived whole:
 * hello (KV__AUTH_HELLO_LEN bytes) -> *reply (KV__AUTH_REPLY_LEN), keeping
 * Nc and Ns in st; then proof (KV__AUTH_PROOF_LEN) -> 1 when the client
 * proved the token. kv__auth_reply: KV_OK, KV_EPROTO (not a hello), KV_EIO. */
struct kv__auth_state {
    uint8_t nc[KV__AUTH_NONCE], ns[KV__AUTH_NONCE];
};
int kv__auth_reply(const char *token, const uint8_t *hello, struct kv__auth_state *st,
                   uint8_t *reply);
int kv__auth_proof_ok(const char *token, const struct kv__auth_state *st, const uint8_t *proof);

enum kv__auth_role { KV__AUTH_SERVER = 0, KV__AUTH_CLIENT = 1 };

/* A fresh nonce from the kernel's random source: KV_OK or KV_EIO. */
int kv__auth_nonce(uint8_t nonce[KV__AUTH_NONCE]);

/* mac = HMAC-SHA256(token, label(role) | nc | ns). KV_OK or KV_EIO. */
int kv__auth_mac(const char *token, int role, const uint8_t nc[KV__AUTH_NONCE],
                 const uint8_t ns[KV__AUTH_NONCE], uint8_t mac[KV__AUTH_MAC]);

/* 1 when mac is role's proof of token over (nc, ns); constant time. */
int kv__auth_verify(const char *token, int role, const uint8_t nc[KV__AUTH_NONCE],
                    const uint8_t ns[KV__AUTH_NONCE], const uint8_t mac[KV__AUTH_MAC]);

/* HMAC-SHA256(token, msg) for records the token authenticates (membership
 * records, ...); label separates the uses. KV_OK or KV_EIO. */
int kv__auth_sign(const char *token, const char *label, const void *msg, size_t len,
                  uint8_t mac[KV__AUTH_MAC]);
/* 1 when mac is kv__auth_sign's for (token, label, msg); constant time. */
int kv__auth_check(const char *token, const char *label, const void *msg, size_t len,
                   const uint8_t mac[KV__AUTH_MAC]);

/* Constant-time equality of n bytes: 1 when equal. */
int kv__auth_eq(const void *a, const void *b, size_t n);

/* The whole exchange on a connected nonblocking stream socket (sock.h's
 * deadline I/O), by deadline (kv__now_ms() scale). KV_OK when both sides
 * proved the token; KV_EPERM when the peer did not prove it, or (client)
 * the server refused our proof; KV_ETIMEDOUT, KV_ENET, KV_EPROTO (not this
 * exchange). Nothing else is read or written. */
int kv__auth_client(int fd, const char *token, uint64_t deadline);
int kv__auth_server(int fd, const char *token, uint64_t deadline);

/* The cluster token in effect for cfg, into out (KV_CFG_STR bytes):
 * cluster.token; else the contents of cluster.token_file (one trailing
 * newline dropped), which must be a regular file of ours with mode 0600 or
 * 0400 (no symlink); else KVENGINE_TOKEN or KV_TOKEN from the environment;
 * else "". KV_ECONFIG with err saying why (both token and token_file set, a
 * file that is not ours or readable by others, too long, controls in it),
 * KV_EIO when the file cannot be read. */
struct kv_config;
int kv__auth_token(const struct kv_config *cfg, char *out, char *err, size_t errlen);

#endif
