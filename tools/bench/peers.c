/*
 * peers.c — the benchmark's network peers: "redis" (RESP: SET, GET,
 * EXISTS) and "memcached" (text protocol: set, get, and the meta command
 * mg for lookup), so `kvctl bench --compare redis=HOST:PORT` measures a
 * server beside kvengine with the same blocks, jobs and buffers.
 *
 * Key design choices:
 * - One connection per job (a pool of --numjobs connections opened, and
 *   greeted with PING / version, at open: a server that is not there, or
 *   is not what it was named, fails the open with a message that says so).
 * - A batch is pipelined: all its requests go out in one writev (the
 *   job's value iovecs themselves, no copy), then the replies are read in
 *   order, each value straight into the job's buffers (sock.c). The
 *   latency recorded is the batch's, to the last byte of its last reply,
 *   as for kvengine's tasks. Requests go out in windows of WINDOW shards so
 *   a huge --batch-size cannot fill both socket buffers and deadlock.
 * - Both protocols behind one small table (struct wire): the batching,
 *   error handling and connection recovery are written once.
 * - A key is "kv:<32 hex of the block id>:<shard index>": printable, so it
 *   is also a valid memcached key.
 */
#include "bench.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define WINDOW 64               /* shards per writev, replies read after it */
#define HDR_CAP 128             /* one request's text */
#define TIMEOUT_MS 10000        /* no byte moving this long: KV_ETIMEDOUT */

char kvctl_net_open_why[256];

static int shard_key(const kv_block_id *id, uint32_t index, char *out)
{
    static const char hex[] = "0123456789abcdef";
    char h[2 * KV_BLOCK_ID_LEN + 1];
    for (int i = 0; i < KV_BLOCK_ID_LEN; i++) {
        h[2 * i] = hex[id->bytes[i] >> 4];
        h[2 * i + 1] = hex[id->bytes[i] & 15];
    }
    h[2 * KV_BLOCK_ID_LEN] = '\0';
    return sprintf(out, "kv:%s:%" PRIu32, h, index);
}

static uint64_t shard_len(const kv_shard *s)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->iovcnt; i++)
        n += s->iov[i].len;
    return n;
}

/* One protocol. Request formatters return the text's length; reply readers
 * return a stream-level error (the connection is then dropped) or KV_OK
 * with the shard's own result in *res / *hit. */
struct wire {
    const char *name;
    int (*hello)(struct kvctl_conn *c, char *why, size_t whylen);
    int (*set_req)(char *buf, const char *key, int klen, uint64_t len);
    int (*set_reply)(struct kvctl_conn *c, int *res);
    int (*get_req)(char *buf, const char *key, int klen);
    int (*get_reply)(struct kvctl_conn *c, const kv_shard *s, int *res);
    int (*exists_req)(char *buf, const char *key, int klen);
    int (*exists_reply)(struct kvctl_conn *c, uint8_t *hit);
};

/* A value of the wrong size goes nowhere (the destination stays untouched)
 * and is KV_EINVAL, like kvengine's load into a buffer of another size. */
static int read_value(struct kvctl_conn *c, const kv_shard *s, uint64_t len, int *res)
{
    int rc;
    if (len == shard_len(s)) {
        rc = kvctl_conn_read_value(c, s->iov, s->iovcnt, len);
        *res = KV_OK;
    } else {
        rc = kvctl_conn_discard(c, len);
        *res = KV_EINVAL;
    }
    return rc == KV_OK ? kvctl_conn_expect_crlf(c) : rc;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return false;
    *out = strtoull(s, &end, 10);
    return *end == '\0';
}

/* ---- redis (RESP2) ------------------------------------------------------- */

static int redis_hello(struct kvctl_conn *c, char *why, size_t whylen)
{
    static const char ping[] = "*1\r\n$4\r\nPING\r\n";
    struct iovec v = { (void *)ping, sizeof ping - 1 };
    char line[256];
    int rc = kvctl_conn_writev(c, &v, 1);
    if (rc == KV_OK)
        rc = kvctl_conn_line(c, line, sizeof line);
    if (rc != KV_OK) {
        snprintf(why, whylen, "%s: no answer to PING: %s", c->peer, kv_strerror(rc));
        return rc;
    }
    if (strcmp(line, "+PONG") != 0) {
        snprintf(why, whylen, "%s: not a usable Redis server (PING answered '%.80s')",
                 c->peer, line);
        return KV_EPROTO;
    }
    return KV_OK;
}

static int redis_set_req(char *buf, const char *key, int klen, uint64_t len)
{
    return sprintf(buf, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%" PRIu64 "\r\n", klen, key, len);
}

static int redis_status(const char *line, int *res)
{
    if (line[0] == '+') {
        *res = KV_OK;
        return KV_OK;
    }
    if (line[0] == '-') {
        *res = strncmp(line, "-OOM", 4) == 0 ? KV_ENOSPC : KV_EIO;
        return KV_OK;
    }
    return KV_EPROTO;
}

static int redis_set_reply(struct kvctl_conn *c, int *res)
{
    char line[512];
    int rc = kvctl_conn_line(c, line, sizeof line);
    return rc == KV_OK ? redis_status(line, res) : rc;
}

static int redis_get_req(char *buf, const char *key, int klen)
{
    return sprintf(buf, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", klen, key);
}

static int redis_get_reply(struct kvctl_conn *c, const kv_shard *s, int *res)
{
    char line[512];
    uint64_t len;
    int rc = kvctl_conn_line(c, line, sizeof line);
    if (rc != KV_OK)
        return rc;
    if (strcmp(line, "$-1") == 0) {
        *res = KV_ENOTFOUND;
        return KV_OK;
    }
    if (line[0] == '$' && parse_u64(line + 1, &len))
        return read_value(c, s, len, res);
    return redis_status(line, res) == KV_OK && *res != KV_OK ? KV_OK : KV_EPROTO;
}

static int redis_exists_req(char *buf, const char *key, int klen)
{
    return sprintf(buf, "*2\r\n$6\r\nEXISTS\r\n$%d\r\n%s\r\n", klen, key);
}

static int redis_exists_reply(struct kvctl_conn *c, uint8_t *hit)
{
    char line[512];
    int rc = kvctl_conn_line(c, line, sizeof line);
    if (rc != KV_OK)
        return rc;
    if (strcmp(line, ":1") != 0 && strcmp(line, ":0") != 0)
        return KV_EPROTO;
    *hit = line[1] == '1';
    return KV_OK;
}

static const struct wire wire_redis = {
    "redis", redis_hello, redis_set_req, redis_set_reply, redis_get_req, redis_get_reply,
    redis_exists_req, redis_exists_reply,
};

/* ---- memcached (text protocol, meta get for lookup) ---------------------- */

static int mc_hello(struct kvctl_conn *c, char *why, size_t whylen)
{
    static const char version[] = "version\r\n";
    struct iovec v = { (void *)version, sizeof version - 1 };
    char line[256];
    int rc = kvctl_conn_writev(c, &v, 1);
    if (rc == KV_OK)
        rc = kvctl_conn_line(c, line, sizeof line);
    if (rc != KV_OK) {
        snprintf(why, whylen, "%s: no answer to 'version': %s", c->peer, kv_strerror(rc));
        return rc;
    }
    if (strncmp(line, "VERSION ", 8) != 0) {
        snprintf(why, whylen, "%s: not a memcached server ('version' answered '%.80s')",
                 c->peer, line);
        return KV_EPROTO;
    }
    return KV_OK;
}

static int mc_set_req(char *buf, const char *key, int klen, uint64_t len)
{
    (void)klen;
    return sprintf(buf, "set %s 0 0 %" PRIu64 "\r\n", key, len);
}

/* Errors that are the item's, not the stream's ("SERVER_ERROR object too
 * large for cache", "SERVER_ERROR out of memory storing object"). */
static int mc_status(const char *line, int *res)
{
    if (strncmp(line, "SERVER_ERROR", 12) == 0) {
        *res = strstr(line, "memory") || strstr(line, "too large") ? KV_ENOSPC : KV_EIO;
        return KV_OK;
    }
    return KV_EPROTO;
}

static int mc_set_reply(struct kvctl_conn *c, int *res)
{
    char line[512];
    int rc = kvctl_conn_line(c, line, sizeof line);
    if (rc != KV_OK)
        return rc;
    if (strcmp(line, "STORED") == 0) {
        *res = KV_OK;
        return KV_OK;
    }
    if (strcmp(line, "NOT_STORED") == 0) {
        *res = KV_EIO;
        return KV_OK;
    }
    return mc_status(line, res);
}

static int mc_get_req(char *buf, const char *key, int klen)
{
    (void)klen;
    return sprintf(buf, "get %s\r\n", key);
}

static int mc_get_reply(struct kvctl_conn *c, const kv_shard *s, int *res)
{
    char line[512];
    int rc = kvctl_conn_line(c, line, sizeof line);
    if (rc != KV_OK)
        return rc;
    if (strcmp(line, "END") == 0) {
        *res = KV_ENOTFOUND;
        return KV_OK;
    }
    /* VALUE <key> <flags> <bytes> */
    char *sp = strrchr(line, ' ');
    uint64_t len;
    if (strncmp(line, "VALUE ", 6) != 0 || !sp || !parse_u64(sp + 1, &len))
        return mc_status(line, res);
    rc = read_value(c, s, len, res);
    if (rc == KV_OK)
        rc = kvctl_conn_line(c, line, sizeof line);
    return rc == KV_OK && strcmp(line, "END") != 0 ? KV_EPROTO : rc;
}

/* Meta get with no flags: "HD" when the item exists, "EN" when not, and no
 * value on the wire (memcached >= 1.6.10). */
static int mc_exists_req(char *buf, const char *key, int klen)
{
    (void)klen;
    return sprintf(buf, "mg %s\r\n", key);
}

static int mc_exists_reply(struct kvctl_conn *c, uint8_t *hit)
{
    char line[512];
    int rc = kvctl_conn_line(c, line, sizeof line);
    if (rc != KV_OK)
        return rc;
    if (strcmp(line, "HD") != 0 && strcmp(line, "EN") != 0)
        return KV_EPROTO;
    *hit = line[0] == 'H';
    return KV_OK;
}

static const struct wire wire_memcached = {
    "memcached", mc_hello, mc_set_req, mc_set_reply, mc_get_req, mc_get_reply,
    mc_exists_req, mc_exists_reply,
};

/* ---- the backends -------------------------------------------------------- */

struct peer {
    const struct wire *w;
    struct kvctl_pool *pool;
    uint64_t open_ns;
    atomic_bool told;               /* the first lost connection was reported */
};

static int peer_open(const struct wire *w, const struct kvctl_open_args *a, void **st)
{
    uint64_t t0 = kvctl_now_ns();
    *st = NULL;
    kvctl_net_open_why[0] = '\0';
    if (!a->addr) {
        snprintf(kvctl_net_open_why, sizeof kvctl_net_open_why, "no address");
        return KV_EINVAL;
    }
    struct peer *p = calloc(1, sizeof *p);
    if (!p)
        return KV_ENOMEM;
    p->w = w;
    int rc = kvctl_pool_new(a->numjobs ? a->numjobs : 1, a->addr, TIMEOUT_MS, w->hello, &p->pool,
                            kvctl_net_open_why, sizeof kvctl_net_open_why);
    if (rc != KV_OK) {
        free(p);
        return rc;
    }
    p->open_ns = kvctl_now_ns() - t0;
    *st = p;
    return KV_OK;
}

static int redis_open(const struct kvctl_open_args *a, void **st)
{
    return peer_open(&wire_redis, a, st);
}

static int mc_open(const struct kvctl_open_args *a, void **st)
{
    return peer_open(&wire_memcached, a, st);
}

static void peer_close(void *st)
{
    struct peer *p = st;
    if (!p)
        return;
    kvctl_pool_free(p->pool);
    free(p);
}

enum op { OP_SET, OP_GET, OP_EXISTS };

/* Sends shards/ids [0, m) of one window and reads their replies. */
static int window(struct peer *p, struct kvctl_conn *c, enum op op, const kv_shard *s,
                  const kv_block_id *ids, size_t m, int *res, uint8_t *hit)
{
    static const char crlf[] = "\r\n";
    char hdr[WINDOW][HDR_CAP], key[64];
    struct iovec stackv[WINDOW * 4], *v = stackv;
    size_t need = 0;
    for (size_t i = 0; i < m; i++)
        need += op == OP_SET ? 2 + s[i].iovcnt : 1;
    if (need > sizeof stackv / sizeof stackv[0] && !(v = malloc(need * sizeof *v)))
        return KV_ENOMEM;
    int nv = 0;
    for (size_t i = 0; i < m; i++) {
        int klen = op == OP_EXISTS ? shard_key(&ids[i], 0, key)
                                   : shard_key(&s[i].block, s[i].index, key);
        int hl = op == OP_SET   ? p->w->set_req(hdr[i], key, klen, shard_len(&s[i]))
                 : op == OP_GET ? p->w->get_req(hdr[i], key, klen)
                                : p->w->exists_req(hdr[i], key, klen);
        v[nv++] = (struct iovec){ hdr[i], (size_t)hl };
        if (op == OP_SET) {
            for (uint32_t k = 0; k < s[i].iovcnt; k++)
                v[nv++] = (struct iovec){ s[i].iov[k].base, s[i].iov[k].len };
            v[nv++] = (struct iovec){ (void *)crlf, 2 };
        }
    }
    int rc = kvctl_conn_writev(c, v, nv);
    if (v != stackv)
        free(v);
    for (size_t i = 0; i < m && rc == KV_OK; i++)
        rc = op == OP_SET   ? p->w->set_reply(c, &res[i])
             : op == OP_GET ? p->w->get_reply(c, &s[i], &res[i])
                            : p->w->exists_reply(c, &hit[i]);
    return rc;
}

static int batch(struct peer *p, enum op op, const kv_shard *s, const kv_block_id *ids,
                 size_t n, int *res, uint8_t *hit)
{
    struct kvctl_conn *c = kvctl_pool_get(p->pool);
    int rc = c ? KV_OK : KV_ENET;
    size_t i = 0;
    for (; i < n && rc == KV_OK; i += WINDOW) {
        size_t m = n - i < WINDOW ? n - i : WINDOW;
        rc = window(p, c, op, s ? s + i : NULL, ids ? ids + i : NULL, m, res ? res + i : NULL,
                    hit ? hit + i : NULL);
        if (rc != KV_OK)
            break;
    }
    if (rc != KV_OK) {
        /* The stream is out of step (or gone): drop it, fail the rest. */
        if (!atomic_exchange(&p->told, true))
            fprintf(stderr, "kvctl bench: %s %s: %s; reconnecting\n", p->w->name,
                    c ? c->peer : "", kv_strerror(rc));
        if (c)
            kvctl_conn_close(c);
        for (size_t k = i; res && k < n; k++)
            res[k] = rc;
    }
    if (c)
        kvctl_pool_put(p->pool, c);
    return rc;
}

static int peer_put(void *st, const kv_shard *s, size_t n, int *res)
{
    return batch(st, OP_SET, s, NULL, n, res, NULL);
}

static int peer_get(void *st, const kv_shard *s, size_t n, int *res)
{
    return batch(st, OP_GET, s, NULL, n, res, NULL);
}

static int peer_lookup(void *st, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    return batch(st, OP_EXISTS, NULL, ids, n, NULL, hit);
}

static void peer_info(void *st, struct kvctl_backend_info *out)
{
    struct peer *p = st;
    *out = (struct kvctl_backend_info){ .open_ns = p->open_ns };
}

const struct kvctl_backend kvctl_backend_redis = {
    .name = "redis",
    .open = redis_open,
    .close = peer_close,
    .put = peer_put,
    .get = peer_get,
    .lookup = peer_lookup,
    .info = peer_info,
};

const struct kvctl_backend kvctl_backend_memcached = {
    .name = "memcached",
    .open = mc_open,
    .close = peer_close,
    .put = peer_put,
    .get = peer_get,
    .lookup = peer_lookup,
    .info = peer_info,
};
