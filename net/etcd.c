/*
 * etcd.c — cluster membership kept in etcd (v3), spoken over etcd's JSON
 * gateway (POST /v3/...) with libcurl and json-c.
 *
 * Each member puts its record (membership.h's kv__member as JSON) at
 * PREFIX/members/ID, attached to a lease of cluster.node_ttl_ms (rounded up
 * to whole seconds: etcd's unit) that its heartbeats keep alive; a member
 * that stops heartbeating loses its lease, and etcd deletes its record.
 * The view is every record under PREFIX/members/, and its version is the
 * etcd revision at which the set of records last changed. Each heartbeat
 * also puts the member's record with its current figures (kvctl members)
 * at PREFIX/figures/ID on the same lease: outside the watched range, so
 * figures that change every second bring no member an event; only a
 * read-only view (kv_members) reads them, and believes one only when it
 * verifies like a member record and names the same place as the member's.
 *
 * Key design choice: the watch is a log, and each entry is checked as a
 * read of the whole view checks a record. The view is read whole (a
 * range, in pages of VIEW_PAGE records at one revision, at most
 * VIEW_READ_MAX in all) at the start; then a thread keeps a watch stream
 * open on the prefix from the revision after the view's and applies each
 * event's own record: a PUT passes the very function a record of a whole
 * read passes (kvrec_member, and stands_in for a live member's key
 * overwritten), a DELETE drops its member. So an event costs one record's
 * decode and MAC, not the whole view's. The view is read whole again only
 * when events may be lost or cannot be applied alone: the watch was
 * cancelled (etcd compacted past the revision it resumed from), an answer
 * was dropped (WATCH_ANSWER_MAX) or did not parse, an event did not parse
 * or came out of order, a change would cross the view's bound
 * (KV_PROTO_VIEW_MAX: its cut is made in key order), a member stands in
 * past its time, and every VIEW_RESYNC_MS. A stream cut off otherwise (an
 * endpoint died, calls moved to another) resumes from the next revision
 * and catches up by events. While no stream is up, the heartbeat keeps
 * the view right: a keepalive's answer carries etcd's current revision,
 * and when it is newer than the view's the heartbeat reads it whole.
 *
 * Trust: anyone who can write to etcd can write a record, so a record is
 * believed only when it proves itself. Each carries the lease it lives on
 * and a MAC by its member under the cluster token over every field
 * (kv__member_sign); a record is a member only when its MAC verifies, its
 * id is its key's last part (so two records cannot claim one id: keys are
 * unique), and the lease it names is the one etcd keeps it on. Members
 * check their own record at every read of the view and every event on
 * their key, and rewrite it at the next heartbeat when it was changed or
 * removed. Records that do not verify are never counted, so they cannot
 * push real members out of a view. The token itself is checked at join
 * against PREFIX/token, a salt and its HMAC under the token that the first
 * member writes (create-only): a member with another token is refused
 * (KV_EPERM) before it puts a record.
 *
 * Endpoints are tried in turn, starting from the one that answered last;
 * an endpoint that cannot be reached or has no leader ("unavailable")
 * sends the call to the next. Unary calls share one libcurl handle (and its
 * kept-alive connection) under call_lock; the watch has its own handle in a
 * multi handle, so that close can wake it (curl_multi_wakeup).
 */
#include <curl/curl.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "membership.h"

#define EP_MAX 16
#define ANSWER_MAX (16u << 20)          /* a bigger answer is refused */
#define WATCH_BACKOFF_MAX_MS 1000u
/* etcd's writes (a lease grant, a put) are raft commits with a WAL fsync
 * behind them; membership is not on the data path, so its calls are not
 * held to the data path's short deadlines. */
#define ETCD_TIMEOUT_MIN_MS 2000u

struct etcd {
    struct kv__membership base;
    char ep[EP_MAX][KV_CFG_STR];
    int nep;
    _Atomic int cur;                    /* the endpoint that answered last */
    char key_prefix[KV_CFG_STR + 16];   /* "PREFIX/members/" */
    char fig_prefix[KV_CFG_STR + 16];   /* "PREFIX/figures/" */
    char user[KV_CFG_STR], password[KV_CFG_STR];
    char token[KV_CFG_STR];             /* cluster.token: signs and checks records */
    char cacert[KV_CFG_STR], cert[KV_CFG_STR], key[KV_CFG_STR];   /* https when cacert */
    char token_key[KV_CFG_STR + 16];    /* "PREFIX/token" */
    unsigned timeout_ms;
    int64_t ttl_s;
    void (*notify)(void *);
    void *arg;

    pthread_mutex_t call_lock;          /* h, auth, lease, self, local_ip */
    CURL *h;
    char auth[512];                     /* etcd's auth token; "" = none yet */
    int64_t lease;                      /* 0 = none */
    struct kv__member self;
    int joined;
    int self_ok;                        /* our record read back as we wrote it */
    char local_ip[64];

    pthread_mutex_t view_lock;          /* the view below */
    uint64_t version;                   /* revision the records last changed at */
    uint64_t seen_rev;                  /* revision the view is current at */
    uint64_t read_rev;                  /* revision of the last read of the whole view */
    struct kv__member *members;         /* sorted by id: etcd's key order */
    uint64_t *bad_ms;                   /* 0, or since when the member stands in */
    size_t n, mcap;
    int have_view;

    pthread_t watcher;
    int watching;
    pthread_mutex_t wlock;
    pthread_cond_t wcond;
    int stop;
    CURLM *multi;

    _Atomic int watch_up;               /* a watch stream is created: events flow */
    _Atomic int resync;                 /* events may be lost: read the view whole */
    _Atomic uint64_t read_ms;           /* when the view was last read whole */
    _Atomic uint64_t full_reads;        /* kv__etcd_counts */
    _Atomic uint64_t events;
};

/* etcd over https (cluster.etcd_cacert set): the server is verified
 * against that CA (peer and host name), and the client shows its own
 * certificate when one is configured. */
static void tls_setup(struct etcd *e, CURL *h)
{
    if (!e->cacert[0])
        return;
    curl_easy_setopt(h, CURLOPT_CAINFO, e->cacert);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    if (e->cert[0]) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, e->cert);
        curl_easy_setopt(h, CURLOPT_SSLKEY, e->key);
    }
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- base64 (etcd's keys and values travel so in JSON) ------------------ */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const void *src, size_t n)
{
    const uint8_t *s = src;
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        *o++ = B64[v >> 18 & 63];
        *o++ = B64[v >> 12 & 63];
        *o++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? B64[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

/* Decodes s into a malloc'd NUL-terminated buffer (*len bytes before the
 * NUL); NULL for text that is not base64. */
static char *b64_decode(const char *s, size_t *len)
{
    size_t n = strlen(s);
    if (n % 4)
        return NULL;
    char *out = malloc(n / 4 * 3 + 1);
    size_t k = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            const char *p = s[i + j] == '=' ? NULL : strchr(B64, s[i + j]);
            if (s[i + j] == '=' && i + 4 == n && j >= 2) {
                pad++;
            } else if (!p || !s[i + j] || pad) {
                free(out);
                return NULL;
            }
            v = v << 6 | (p ? (uint32_t)(p - B64) : 0);
        }
        out[k++] = (char)(v >> 16);
        if (pad < 2)
            out[k++] = (char)(v >> 8);
        if (pad < 1)
            out[k++] = (char)v;
    }
    out[k] = '\0';
    *len = k;
    return out;
}

/* ---- JSON helpers ------------------------------------------------------- */

static json_object *jget(json_object *o, const char *key)
{
    json_object *v = NULL;
    return o && json_object_object_get_ex(o, key, &v) ? v : NULL;
}

/* etcd's int64 fields come as JSON strings ("revision":"12"); json-c
 * parses either form. Absent = 0. */
static int64_t jint(json_object *o, const char *key)
{
    json_object *v = jget(o, key);
    return v ? json_object_get_int64(v) : 0;
}

static const char *jstr(json_object *o, const char *key)
{
    json_object *v = jget(o, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static void jadd_b64(json_object *o, const char *key, const char *s)
{
    char *b = b64_encode(s, strlen(s));
    json_object_object_add(o, key, json_object_new_string(b ? b : ""));
    free(b);
}

static void jadd_int(json_object *o, const char *key, int64_t v)
{
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)v);
    json_object_object_add(o, key, json_object_new_string(t));
}

/* ---- records ------------------------------------------------------------ */

static void hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", p[i]);
}

/* n bytes from exactly 2n hex digits; -1 otherwise. */
static int unhex(const char *s, uint8_t *out, size_t n)
{
    if (!s || strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (!strchr("0123456789abcdef", s[2 * i]) || !strchr("0123456789abcdef", s[2 * i + 1]) ||
            sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* The record's figures, in kv__member's order (JSON numbers). */
static const char *const figure_names[] = { "dram_capacity", "dram_used", "ssd_capacity",
                                            "ssd_used", "dram_blocks", "ssd_blocks", "keys",
                                            "stamp_ms" };

static char *record_encode(const struct kv__member *m)
{
    json_object *o = json_object_new_object(), *segs = json_object_new_array();
    char mac[2 * sizeof m->mac + 1];
    hex(m->mac, sizeof m->mac, mac);
    json_object_object_add(o, "id", json_object_new_string(m->id));
    json_object_object_add(o, "addr", json_object_new_string(m->addr));
    json_object_object_add(o, "flags", json_object_new_int64(m->flags));
    for (uint32_t i = 0; i < m->nseg && i < KV_PROTO_SEG_MAX; i++) {
        json_object *s = json_object_new_object();
        jadd_int(s, "base", (int64_t)m->seg[i].base);
        jadd_int(s, "len", (int64_t)m->seg[i].len);
        json_object_object_add(s, "rkey", json_object_new_int64(m->seg[i].rkey));
        json_object_array_add(segs, s);
    }
    json_object_object_add(o, "segs", segs);
    jadd_int(o, "lease", (int64_t)m->lease);
    const uint64_t fig[] = { m->dram_capacity, m->dram_used, m->ssd_capacity, m->ssd_used,
                             m->dram_blocks, m->ssd_blocks, m->keys, m->stamp_ms };
    for (size_t i = 0; i < KV__ARRAY_LEN(fig); i++)
        jadd_int(o, figure_names[i], (int64_t)fig[i]);
    json_object_object_add(o, "version", json_object_new_string(m->version));
    json_object_object_add(o, "mac", json_object_new_string(mac));
    char *out = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return out;
}

/* A record as stored; nonzero for one that is not ours to read (it is
 * skipped with a warning, not allowed to empty the view). */
static int record_decode(const char *text, struct kv__member *m)
{
    json_object *o = json_tokener_parse(text);
    const char *id = jstr(o, "id"), *addr = jstr(o, "addr");
    json_object *segs = jget(o, "segs");
    int rc = -1;
    memset(m, 0, sizeof *m);
    if (id && addr && *id && strlen(id) <= KV_PROTO_ID_MAX && strlen(addr) <= KV_PROTO_ID_MAX &&
        (!segs || (json_object_is_type(segs, json_type_array) &&
                   json_object_array_length(segs) <= KV_PROTO_SEG_MAX))) {
        snprintf(m->id, sizeof m->id, "%s", id);
        snprintf(m->addr, sizeof m->addr, "%s", addr);
        m->flags = (uint32_t)jint(o, "flags");
        m->nseg = segs ? (uint32_t)json_object_array_length(segs) : 0;
        for (uint32_t i = 0; i < m->nseg; i++) {
            json_object *s = json_object_array_get_idx(segs, i);
            m->seg[i].base = (uint64_t)jint(s, "base");
            m->seg[i].len = (uint64_t)jint(s, "len");
            m->seg[i].rkey = (uint32_t)jint(s, "rkey");
        }
        m->lease = (uint64_t)jint(o, "lease");
        uint64_t *fig[] = { &m->dram_capacity, &m->dram_used, &m->ssd_capacity, &m->ssd_used,
                            &m->dram_blocks, &m->ssd_blocks, &m->keys, &m->stamp_ms };
        for (size_t i = 0; i < KV__ARRAY_LEN(fig); i++)
            *fig[i] = (uint64_t)jint(o, figure_names[i]);
        const char *ver = jstr(o, "version");
        snprintf(m->version, sizeof m->version, "%s", ver && strlen(ver) <= KV_PROTO_VER_MAX
                                                          ? ver : "");
        rc = unhex(jstr(o, "mac"), m->mac, sizeof m->mac);
    }
    json_object_put(o);
    return rc;
}

static int same_member(const struct kv__member *a, const struct kv__member *b)
{
    if (strcmp(a->id, b->id) || strcmp(a->addr, b->addr) || a->flags != b->flags ||
        a->nseg != b->nseg || a->lease != b->lease || memcmp(a->mac, b->mac, sizeof a->mac))
        return 0;
    for (uint32_t i = 0; i < a->nseg; i++)
        if (a->seg[i].base != b->seg[i].base || a->seg[i].len != b->seg[i].len ||
            a->seg[i].rkey != b->seg[i].rkey)
            return 0;
    return 1;
}

/* ---- one call ----------------------------------------------------------- */

struct answer {
    char *p;
    size_t len, cap;
    int over;                           /* passed ANSWER_MAX: cut off */
};

static size_t on_answer(char *d, size_t sz, size_t nm, void *u)
{
    struct answer *a = u;
    size_t n = sz * nm;
    if (a->len + n > ANSWER_MAX) {
        a->over = 1;
        return 0;
    }
    /* Grown by doubling: a page of the view is megabytes in 16 KiB
     * pieces, and growing by each piece copied it over and over (under
     * ThreadSanitizer's allocator a 16 MiB answer took longer than the
     * call's deadline). */
    if (a->len + n + 1 > a->cap) {
        size_t c = a->cap ? a->cap : 4096;
        while (c < a->len + n + 1)
            c *= 2;
        char *p = realloc(a->p, c);
        if (!p)
            return 0;
        a->p = p;
        a->cap = c;
    }
    memcpy(a->p + a->len, d, n);
    a->len += n;
    a->p[a->len] = '\0';
    return n;
}

static struct curl_slist *headers(struct etcd *e)
{
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    if (e->auth[0]) {
        char t[sizeof e->auth + 32];
        snprintf(t, sizeof t, "Authorization: %s", e->auth);
        hd = curl_slist_append(hd, t);
    }
    return hd;
}

/* gRPC codes that mean "this endpoint cannot serve now; another may". */
static int unavailable(int http, int64_t code)
{
    return http == 503 || http == 502 || http == 504 || code == 14 || code == 4;
}

/*
 * POSTs body to endpoint k within ms; *out the parsed answer. KV_ENET /
 * KV_ETIMEDOUT for an endpoint that cannot serve (try the next), KV_EPERM
 * for refused credentials (*unauth set when etcd said "unauthenticated",
 * worth one fresh token), KV_ENOTFOUND for etcd's NotFound (a lease that
 * is gone), KV_EPROTO for anything else etcd refused.
 */
static int post_one(struct etcd *e, int k, const char *path, const char *body, uint64_t ms,
                    json_object **out, int *unauth)
{
    char url[KV_CFG_STR + 64];
    snprintf(url, sizeof url, "%s://%s%s", e->cacert[0] ? "https" : "http", e->ep[k], path);
    struct answer a = { 0 };
    struct curl_slist *hd = headers(e);
    CURL *h = e->h;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_answer);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(ms ? ms : 1));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(ms ? ms : 1));
    CURLcode cc = curl_easy_perform(h);
    curl_slist_free_all(hd);
    long http = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
    int rc = KV_OK;
    json_object *o = NULL;
    if (cc == CURLE_WRITE_ERROR && a.over) {
        /* Not the endpoint's fault: every endpoint holds the same data. */
        KV_WARN("etcd %s%s: the answer passed %u MiB, the bound on one answer", e->ep[k], path,
                ANSWER_MAX >> 20);
        rc = KV_ENOBUFS;
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
        rc = KV_ETIMEDOUT;
    } else if (cc != CURLE_OK) {
        rc = KV_ENET;
    } else if (!(o = a.p ? json_tokener_parse(a.p) : NULL)) {
        KV_WARN("etcd %s%s: answer is not JSON (HTTP %ld)", e->ep[k], path, http);
        rc = http == 200 ? KV_EPROTO : KV_ENET;
    } else {
        /* A streamed method (lease keepalive) wraps its answer in
         * "result", or its error in "error". */
        json_object *err = http == 200 ? jget(o, "error") : o;
        int64_t code = jint(err, "code") ? jint(err, "code") : jint(err, "grpc_code");
        const char *msg = jstr(err, "message") ? jstr(err, "message") : jstr(err, "error");
        if (http == 200 && !err) {
            char *ip = NULL;
            if (curl_easy_getinfo(h, CURLINFO_LOCAL_IP, &ip) == CURLE_OK && ip)
                snprintf(e->local_ip, sizeof e->local_ip, "%s", ip);
        } else if (unavailable((int)http, code)) {
            rc = KV_ENET;
        } else if (http == 401 || code == 16 ||
                   (msg && strstr(msg, "user name is empty"))) {
            /* (the last: auth is on and we sent no token) */
            *unauth = 1;
            rc = KV_EPERM;
        } else if (http == 403 || code == 7) {
            rc = KV_EPERM;
        } else if (http == 404 && code == 5) {
            rc = KV_ENOTFOUND;
        } else {
            rc = KV_EPROTO;
        }
        if (rc != KV_OK && rc != KV_ENOTFOUND)
            KV_WARN("etcd %s%s: %s (HTTP %ld, code %lld)", e->ep[k], path,
                    msg ? msg : "refused", http, (long long)code);
    }
    free(a.p);
    if (rc == KV_OK && jget(o, "result"))
        *out = json_object_get(jget(o, "result"));
    else if (rc == KV_OK)
        *out = json_object_get(o);
    json_object_put(o);
    return rc;
}

static int authenticate(struct etcd *e, int k, uint64_t ms);

/* POSTs body to path on the endpoints in turn, from the one that answered
 * last, within timeout_ms in all. Caller holds call_lock. */
static int post(struct etcd *e, const char *path, json_object *req, json_object **out)
{
    const char *body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    uint64_t deadline = kv__now_ms() + e->timeout_ms;
    int start = atomic_load(&e->cur), rc = KV_ENET, reauthed = 0;
    *out = NULL;
    for (int i = 0; i < e->nep; i++) {
        int k = (start + i) % e->nep;
        uint64_t now = kv__now_ms();
        if (now >= deadline)
            return KV_ETIMEDOUT;
        /* An endpoint that hangs must leave the others some time. */
        uint64_t ms = (deadline - now) / (uint64_t)(e->nep - i);
        int unauth = 0;
        if (e->user[0] && !e->auth[0] && (rc = authenticate(e, k, ms)) != KV_OK) {
            if (rc == KV_ENET || rc == KV_ETIMEDOUT)
                continue;
            return rc;
        }
        rc = post_one(e, k, path, body, ms, out, &unauth);
        if (rc == KV_EPERM && unauth && e->user[0] && !reauthed) {
            /* The token expired (etcd's simple tokens do): a fresh one,
             * once, on the same endpoint. */
            reauthed = 1;
            e->auth[0] = '\0';
            i--;
            continue;
        }
        if (rc != KV_ENET && rc != KV_ETIMEDOUT) {
            atomic_store(&e->cur, k);
            return rc;
        }
    }
    return rc;
}

/* Puts key = val on this member's lease (its record, its figures). */
static int put_leased(struct etcd *e, const char *key, const char *val)
{
    json_object *req = json_object_new_object(), *ans = NULL;
    jadd_b64(req, "key", key);
    jadd_b64(req, "value", val);
    jadd_int(req, "lease", e->lease);
    int rc = post(e, "/v3/kv/put", req, &ans);
    json_object_put(req);
    json_object_put(ans);
    return rc;
}

static int authenticate(struct etcd *e, int k, uint64_t ms)
{
    json_object *req = json_object_new_object(), *ans = NULL;
    json_object_object_add(req, "name", json_object_new_string(e->user));
    json_object_object_add(req, "password", json_object_new_string(e->password));
    int unauth = 0;
    int rc = post_one(e, k, "/v3/auth/authenticate",
                      json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN), ms, &ans,
                      &unauth);
    json_object_put(req);
    const char *tok = jstr(ans, "token");
    if (rc == KV_OK && !tok)
        rc = KV_EPROTO;
    if (rc == KV_OK) {
        snprintf(e->auth, sizeof e->auth, "%s", tok);
    } else if (rc != KV_ENET && rc != KV_ETIMEDOUT) {
        /* etcd says "invalid argument" for a wrong password: a refusal. */
        KV_ERROR("etcd %s: user '%s' refused (cluster.etcd_user / etcd_password)", e->ep[k],
                 e->user);
        rc = KV_EPERM;
    }
    json_object_put(ans);
    return rc;
}

/* ---- the view ----------------------------------------------------------- */

static void prefix_end(const char *p, char *out, size_t cap)
{
    snprintf(out, cap, "%s", p);
    out[strlen(out) - 1]++;   /* "PREFIX/members/" -> "PREFIX/members0" */
}

/* The view is read in pages of at most this many records (etcd's range
 * limit, continued from the last key): a valid record's answer is a few
 * KiB, so a page stays far below ANSWER_MAX; a page that still passes it
 * (records someone filled with junk) is asked again with an eighth of the
 * limit. */
#define VIEW_PAGE 256
/* The most one read of the view takes in all, key and value bytes of every
 * record under the prefix, verified or not: 4096 members of the largest
 * record are under 32 MiB, so beyond this the prefix holds records that
 * are not members, and the read stops with KV_ENOSPC and a line naming
 * the bound rather than growing without one. */
#define VIEW_READ_MAX (64u << 20)
/* The base64 of the largest record (64 segments, 128-byte id and address)
 * is under 10 KiB. */
#define VIEW_RECORD_B64_MAX (32u << 10)
/* A member reads the view whole this often even while its watch is up:
 * events are applied one by one, and this bounds how long any divergence
 * the watch cannot see could last. */
#define VIEW_RESYNC_MS (5u * 60 * 1000)

/* One key-value from etcd, as a range's answer and a watch event both
 * carry it (mvccpb.KeyValue: key and value in base64, the lease it is on),
 * decoded: key / val NULL when absent or not base64, val also when its
 * base64 passes VIEW_RECORD_B64_MAX (not even decoded: no member's record
 * is that big); id the key's last part when the key is under
 * PREFIX/members/ and has one. */
struct kvrec {
    char *key, *val;
    size_t kl, vl;
    const char *id;
    uint64_t lease;
};

static void kvrec_decode(struct etcd *e, json_object *kv, struct kvrec *r)
{
    const char *v64 = jstr(kv, "value"), *k64 = jstr(kv, "key");
    size_t pl = strlen(e->key_prefix);
    memset(r, 0, sizeof *r);
    r->val = v64 && strlen(v64) <= VIEW_RECORD_B64_MAX ? b64_decode(v64, &r->vl) : NULL;
    r->key = k64 ? b64_decode(k64, &r->kl) : NULL;
    r->lease = (uint64_t)jint(kv, "lease");
    if (r->key && strlen(r->key) == r->kl && r->kl > pl &&
        strncmp(r->key, e->key_prefix, pl) == 0)
        r->id = r->key + pl;
}

static void kvrec_free(struct kvrec *r)
{
    free(r->key);
    free(r->val);
}

/*
 * The one check a record passes to be a member, whether it came in a read
 * of the whole view or in a watch event: 1, with *m, when it proves itself
 * (its MAC under the token, its id its key's last part, the lease it names
 * the one etcd keeps it on, an id and address a member can have; see the
 * top), else 0. Because the id is the key's, two records can never claim
 * one id: keys are unique in etcd, and the view holds one entry per key.
 * Our own key must hold exactly what we wrote; anything else there (an
 * older record of ours replayed) is not believed: *own is set, for our own
 * key only, to whether it holds our record. Caller holds call_lock.
 */
static int kvrec_member(struct etcd *e, const struct kvrec *r, struct kv__member *m, int *own)
{
    int ok = r->val && r->id && strlen(r->val) == r->vl && record_decode(r->val, m) == 0 &&
             strcmp(r->id, m->id) == 0 && m->lease == r->lease && kv__member_sane(m) &&
             kv__member_verify(e->token, m);
    if (e->joined && r->id && strcmp(r->id, e->self.id) == 0) {
        ok = ok && same_member(m, &e->self);
        *own = ok;
    }
    return ok;
}

/* A live member's key overwritten by someone else: its last verified
 * record stands in until the member rewrites it (a heartbeat), for at
 * most two TTLs from when its key stopped holding it, so the forgery
 * cannot take it out of the view either. 1 when member j of the view may
 * still stand in at now; *since, from when it has. */
static int stands_in(const struct etcd *e, size_t j, uint64_t now, uint64_t *since)
{
    *since = e->bad_ms[j] ? e->bad_ms[j] : now;
    return now - *since <= 2000ull * (uint64_t)e->ttl_s;
}

/* The index of the member with id in the view, -1 when there is none;
 * *at, where it is or would go. The view is sorted by id, which is etcd's
 * key order (the keys are PREFIX/members/ID, compared bytewise, as strcmp
 * does). Caller holds call_lock or view_lock. */
static ssize_t view_find(const struct etcd *e, const char *id, size_t *at)
{
    size_t lo = 0, hi = e->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(e->members[mid].id, id);
        if (c == 0) {
            *at = mid;
            return (ssize_t)mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *at = lo;
    return -1;
}

/* One record of a read of the whole view, in key order: appended to list
 * at n when it proves itself, else the member its key held may stand in
 * (above); the new n. */
static size_t view_take(struct etcd *e, struct kv__member *list, uint64_t *bad_ms, size_t n,
                        uint64_t now, const struct kvrec *r, int *self_ok, size_t *bad)
{
    if (kvrec_member(e, r, &list[n], self_ok)) {
        bad_ms[n] = 0;
        return n + 1;
    }
    (*bad)++;
    size_t at;
    ssize_t j = r->id ? view_find(e, r->id, &at) : -1;
    if (j >= 0 && stands_in(e, (size_t)j, now, &bad_ms[n])) {
        list[n] = e->members[j];
        return n + 1;
    }
    return n;
}

/* Keys bytewise, as etcd orders them. */
static int key_cmp(const char *a, size_t al, const char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al > bl) - (al < bl);
}

/* Reads every record under the prefix, page by page at one revision;
 * installs them as the view when they differ from it (version = this
 * read's revision). *changed says whether they did. Caller holds
 * call_lock. */
static int refresh(struct etcd *e, int *changed)
{
    char end[sizeof e->key_prefix];
    prefix_end(e->key_prefix, end, sizeof end);
    *changed = 0;
    /* Only verified records count towards the bound, so records that sort
     * first cannot push real members out. */
    struct kv__member *list = calloc(KV_PROTO_VIEW_MAX, sizeof *list);
    uint64_t *bms = calloc(KV_PROTO_VIEW_MAX, sizeof *bms), now = kv__now_ms(), rev = 0;
    char *from = strdup(e->key_prefix), *prev = NULL;
    size_t n = 0, cnt = KV_PROTO_VIEW_MAX, read = 0, flen = strlen(e->key_prefix), prevl = 0;
    int self_ok = 0, more = 1, rc = KV_OK;
    int64_t limit = VIEW_PAGE;
    size_t bad = 0;
    atomic_fetch_add(&e->full_reads, 1);
    /* A resync asked for from now on (the watch lost events that may be
     * newer than this read) asks for the next read. */
    int resync = atomic_exchange(&e->resync, 0);
    if (!list || !bms || !from) {
        free(list);
        free(bms);
        free(from);
        if (resync)
            atomic_store(&e->resync, 1);
        return KV_ENOMEM;
    }
    while (more && rc == KV_OK) {
        json_object *req = json_object_new_object(), *ans = NULL;
        char *k64 = b64_encode(from, flen);
        json_object_object_add(req, "key", json_object_new_string(k64 ? k64 : ""));
        free(k64);
        jadd_b64(req, "range_end", end);
        jadd_int(req, "limit", limit);
        if (rev)
            jadd_int(req, "revision", (int64_t)rev);   /* every page at the first's */
        rc = post(e, "/v3/kv/range", req, &ans);
        json_object_put(req);
        if (rc == KV_ENOBUFS && limit > 1) {
            limit = limit > 8 ? limit / 8 : 1;  /* each try read 16 MiB first */
            rc = KV_OK;
            continue;
        }
        if (rc != KV_OK)
            break;
        if (!rev)
            rev = (uint64_t)jint(jget(ans, "header"), "revision");
        json_object *kvs = jget(ans, "kvs"), *mo = jget(ans, "more");
        size_t total = kvs && json_object_is_type(kvs, json_type_array)
                           ? json_object_array_length(kvs) : 0;
        more = total > 0 && mo && json_object_get_boolean(mo);
        for (size_t i = 0; i < total && rc == KV_OK; i++) {
            json_object *kv = json_object_array_get_idx(kvs, i);
            const char *v64 = jstr(kv, "value"), *k64s = jstr(kv, "key");
            read += (v64 ? strlen(v64) : 0) + (k64s ? strlen(k64s) : 0);
            struct kvrec r;
            kvrec_decode(e, kv, &r);
            /* The view is kept in key order (view_find): an answer out of
             * it is no etcd's. */
            if (r.key && prev && key_cmp(r.key, r.kl, prev, prevl) <= 0) {
                KV_WARN("etcd: the records under %s came out of key order; the view is not "
                        "read", e->key_prefix);
                rc = KV_EPROTO;
            } else if (n < cnt) {
                n = view_take(e, list, bms, n, now, &r, &self_ok, &bad);
            }
            if (r.key) {
                free(prev);
                prev = r.key;
                prevl = r.kl;
                r.key = NULL;
            } else if (i + 1 == total) {
                more = 0;
            }
            kvrec_free(&r);
        }
        if (rc == KV_OK && more) {
            /* the next page starts just after the last key */
            char *nf = malloc(prevl + 1);
            if (nf) {
                memcpy(nf, prev, prevl);
                nf[prevl] = 0;
                free(from);
                from = nf;
                flen = prevl + 1;
            } else {
                rc = KV_ENOMEM;
            }
        }
        json_object_put(ans);
        if (rc == KV_OK && more && read > VIEW_READ_MAX) {
            KV_WARN("etcd: the records under %s pass %u MiB in all, the bound on one read of "
                    "the view: it holds keys that are not members (remove them); the view is "
                    "not read", e->key_prefix, VIEW_READ_MAX >> 20);
            rc = KV_ENOSPC;
        }
    }
    free(from);
    free(prev);
    if (rc != KV_OK) {
        free(list);
        free(bms);
        if (resync)
            atomic_store(&e->resync, 1);
        return rc;
    }
    /* Kept as the view: only as big as it is (watch events grow it). */
    struct kv__member *fit = realloc(list, (n ? n : 1) * sizeof *list);
    uint64_t *bfit = realloc(bms, (n ? n : 1) * sizeof *bms);
    list = fit ? fit : list;
    bms = bfit ? bfit : bms;
    if (bad)
        KV_WARN("etcd: %zu record(s) under %s do not verify (MAC, key or lease); ignored", bad,
                e->key_prefix);
    KV_DEBUG("etcd: read the view whole at revision %llu: %zu members",
             (unsigned long long)rev, n);
    e->self_ok = self_ok;
    atomic_store(&e->read_ms, now);
    pthread_mutex_lock(&e->view_lock);
    int same = e->have_view && e->n == n;
    for (size_t i = 0; same && i < n; i++)
        same = same_member(&e->members[i], &list[i]);
    if (!same) {
        free(e->members);
        e->members = list;
        e->n = e->mcap = n;
        free(e->bad_ms);
        e->bad_ms = bms;
        bms = NULL;
        e->version = rev;
        e->have_view = 1;
        list = NULL;
        *changed = 1;
    } else {
        memcpy(e->bad_ms, bms, n * sizeof *bms);
    }
    if (rev > e->seen_rev)
        e->seen_rev = rev;
    e->read_rev = rev;
    pthread_mutex_unlock(&e->view_lock);
    free(list);
    free(bms);
    return KV_OK;
}

static int view_copy(struct etcd *e, uint64_t *version, struct kv__member **members, size_t *n)
{
    pthread_mutex_lock(&e->view_lock);
    struct kv__member *m = malloc((e->n ? e->n : 1) * sizeof *m);
    if (m) {
        memcpy(m, e->members, e->n * sizeof *m);
        *members = m;
        *n = e->n;
        *version = e->version;
    }
    pthread_mutex_unlock(&e->view_lock);
    return m ? KV_OK : KV_ENOMEM;
}

/* Whether a member stands in past its two TTLs: only a read of the whole
 * view says what its key holds now, so the caller reads it. Caller holds
 * call_lock. */
static int standin_expired(const struct etcd *e, uint64_t now)
{
    for (size_t j = 0; j < e->n; j++)
        if (e->bad_ms[j] && now - e->bad_ms[j] > 2000ull * (uint64_t)e->ttl_s)
            return 1;
    return 0;
}

/* ---- the watch ---------------------------------------------------------- */

/* Puts m at index at of the view (sorted: the ones after move up). Caller
 * holds both locks and has checked the view's bound. */
static int view_insert(struct etcd *e, size_t at, const struct kv__member *m)
{
    if (e->n == e->mcap) {
        size_t c = e->mcap ? 2 * e->mcap : 16;
        struct kv__member *nm = realloc(e->members, c * sizeof *nm);
        if (!nm)
            return KV_ENOMEM;
        e->members = nm;
        uint64_t *nb = realloc(e->bad_ms, c * sizeof *nb);
        if (!nb)
            return KV_ENOMEM;   /* (members is bigger than mcap says: harmless) */
        e->bad_ms = nb;
        e->mcap = c;
    }
    memmove(&e->members[at + 1], &e->members[at], (e->n - at) * sizeof *e->members);
    memmove(&e->bad_ms[at + 1], &e->bad_ms[at], (e->n - at) * sizeof *e->bad_ms);
    e->members[at] = *m;
    e->bad_ms[at] = 0;
    e->n++;
    return KV_OK;
}

static void view_remove(struct etcd *e, size_t j)
{
    memmove(&e->members[j], &e->members[j + 1], (e->n - j - 1) * sizeof *e->members);
    memmove(&e->bad_ms[j], &e->bad_ms[j + 1], (e->n - j - 1) * sizeof *e->bad_ms);
    e->n--;
}

/*
 * Applies one watch event to the view, as a read of the whole view would
 * have taken its record (kvrec_member and stands_in: the same rules, the
 * same code). A PUT of a record that proves itself adds or replaces its
 * member; one that does not is refused (*bad counts it), and the member
 * its key held stands in or leaves; a DELETE drops the member. *changed is
 * set when the view changed (its version is then the event's revision).
 * KV_OK; KV_EPROTO for an event that does not parse or comes out of order;
 * KV_ENOSPC for a change the view at its bound cannot make by itself (its
 * cut is the first KV_PROTO_VIEW_MAX verified records in key order, and
 * the next one is not held); KV_ENOMEM. On an error the view is unchanged
 * and the caller reads it whole. Caller holds call_lock.
 */
static int apply_event(struct etcd *e, json_object *ev, uint64_t now, int *changed, size_t *bad)
{
    json_object *kv = jget(ev, "kv");
    const char *type = jstr(ev, "type");
    /* PUT is the default: etcd's gateway sends it without a type */
    int del = type && strcmp(type, "DELETE") == 0;
    int put = !jget(ev, "type") || (type && strcmp(type, "PUT") == 0);
    uint64_t rev = (uint64_t)jint(kv, "mod_revision");
    if (!kv || !json_object_is_type(kv, json_type_object) || !(put || del) || !rev)
        return KV_EPROTO;
    if (rev <= e->read_rev)
        return KV_OK;       /* the last read of the whole view has it */
    if (rev < e->seen_rev)
        return KV_EPROTO;   /* etcd sends events in revision order */
    struct kvrec r;
    kvrec_decode(e, kv, &r);
    if (!r.id) {
        kvrec_free(&r);
        return KV_EPROTO;   /* not a key of the view */
    }
    atomic_fetch_add(&e->events, 1);
    struct kv__member m;
    int own = -1, ok = !del && kvrec_member(e, &r, &m, &own), rc = KV_OK, ch = 0;
    if (del && e->joined && strcmp(r.id, e->self.id) == 0)
        own = 0;
    if (!del && !ok)
        (*bad)++;
    size_t at;
    uint64_t since;
    pthread_mutex_lock(&e->view_lock);
    ssize_t j = view_find(e, r.id, &at);
    if (ok && j >= 0) {
        if (!same_member(&e->members[j], &m)) {
            e->members[j] = m;
            ch = 1;
        }
        e->bad_ms[j] = 0;
    } else if (ok) {
        rc = e->n >= KV_PROTO_VIEW_MAX ? KV_ENOSPC : view_insert(e, at, &m);
        ch = rc == KV_OK;
    } else if (j >= 0 && !del && stands_in(e, (size_t)j, now, &since)) {
        e->bad_ms[j] = since;
    } else if (j >= 0) {
        rc = e->n >= KV_PROTO_VIEW_MAX ? KV_ENOSPC : KV_OK;
        if (rc == KV_OK)
            view_remove(e, (size_t)j);
        ch = rc == KV_OK;
    }
    if (rc == KV_OK) {
        e->seen_rev = rev;
        if (ch)
            e->version = rev;
    }
    pthread_mutex_unlock(&e->view_lock);
    if (rc == KV_OK && own >= 0)
        e->self_ok = own;
    *changed |= ch;
    kvrec_free(&r);
    return rc;
}

struct stream {
    struct etcd *e;
    json_tokener *tok;
    int created, failed, changed;
    size_t pending;                     /* bytes of the answer not yet whole */
};

/* The most one watch answer may take before it is whole: an answer this
 * big is dropped with its stream, which reconnects after a read of the
 * whole view (the events it held are lost), rather than held in memory
 * however long an endpoint keeps sending it. */
#define WATCH_ANSWER_MAX (4u << 20)

/* The watch is over for a reason that may have lost events: read the view
 * whole before watching on. */
static void need_resync(struct stream *s, const char *why)
{
    if (!atomic_exchange(&s->e->resync, 1))
        KV_INFO("etcd watch: %s; reading the view whole", why);
}

static void stream_events(struct stream *s, json_object *evs)
{
    struct etcd *e = s->e;
    size_t bad = 0;
    if (!json_object_is_type(evs, json_type_array)) {
        need_resync(s, "an answer whose events do not parse");
        return;
    }
    pthread_mutex_lock(&e->call_lock);
    uint64_t now = kv__now_ms();
    /* Once a read of the whole view is due it has these events too. */
    for (size_t i = 0; i < json_object_array_length(evs) && !atomic_load(&e->resync); i++) {
        int rc = apply_event(e, json_object_array_get_idx(evs, i), now, &s->changed, &bad);
        if (rc == KV_ENOSPC)
            need_resync(s, "a change to a view at its bound");
        else if (rc == KV_ENOMEM)
            need_resync(s, "no memory for an event");
        else if (rc != KV_OK)
            need_resync(s, "an event that does not parse");
    }
    pthread_mutex_unlock(&e->call_lock);
    if (bad)
        KV_WARN("etcd: %zu record(s) put under %s do not verify (MAC, key or lease); ignored",
                bad, e->key_prefix);
}

static void stream_object(struct stream *s, json_object *o)
{
    json_object *r = jget(o, "result");
    if (!r) {   /* {"error": ...}: the stream is over; the next resumes */
        const char *msg = jstr(jget(o, "error"), "message");
        KV_WARN("etcd watch: %s", msg ? msg : "error");
        s->failed = 1;
        return;
    }
    json_object *c = jget(r, "created"), *x = jget(r, "canceled"), *evs = jget(r, "events");
    if (c && json_object_get_boolean(c)) {
        s->created = 1;
        atomic_store(&s->e->watch_up, 1);
    }
    if (evs)
        stream_events(s, evs);
    if (x && json_object_get_boolean(x)) {
        /* etcd compacted past the revision we watch from (or refused the
         * watch): the events since are gone */
        char why[96];
        int64_t cr = jint(r, "compact_revision");
        if (cr)
            snprintf(why, sizeof why, "the watch was cancelled: etcd compacted past revision "
                     "%lld", (long long)cr);
        else
            snprintf(why, sizeof why, "the watch was cancelled");
        need_resync(s, why);
        s->failed = 1;
    }
}

static size_t on_stream(char *d, size_t sz, size_t nm, void *u)
{
    struct stream *s = u;
    size_t n = sz * nm, pos = 0;
    /* Answers are JSON objects one after the other; the tokener keeps
     * the state of one cut between two writes. */
    while (pos < n && !s->failed) {
        json_object *o = json_tokener_parse_ex(s->tok, d + pos, (int)(n - pos));
        enum json_tokener_error je = json_tokener_get_error(s->tok);
        if (je == json_tokener_continue) {
            s->pending += n - pos;
            if (s->pending > WATCH_ANSWER_MAX) {
                KV_WARN("etcd watch: an answer passed %u bytes; reconnecting",
                        (unsigned)WATCH_ANSWER_MAX);
                need_resync(s, "an answer was dropped");
                s->failed = 1;
            }
            break;
        }
        if (je != json_tokener_success) {
            KV_WARN("etcd watch: unreadable answer (%s)", json_tokener_error_desc(je));
            need_resync(s, "an answer did not parse");
            s->failed = 1;
            break;
        }
        pos += json_tokener_get_parse_end(s->tok);
        s->pending = 0;
        json_tokener_reset(s->tok);
        stream_object(s, o);
        json_object_put(o);
    }
    return s->failed ? 0 : n;
}

static int stopping(struct etcd *e)
{
    pthread_mutex_lock(&e->wlock);
    int s = e->stop;
    pthread_mutex_unlock(&e->wlock);
    return s;
}

static void refresh_and_notify(struct etcd *e)
{
    int changed = 0;
    pthread_mutex_lock(&e->call_lock);
    refresh(e, &changed);
    pthread_mutex_unlock(&e->call_lock);
    if (changed && e->notify)
        e->notify(e->arg);
}

/* Watches the prefix on endpoint k from revision from until the stream
 * ends, the thread is stopped, or calls moved to another endpoint. Each
 * event is applied to the view as it comes; the view is read whole when an
 * event cannot be applied, and every VIEW_RESYNC_MS. Returns whether the
 * stream was up. */
static int watch_stream(struct etcd *e, int k, uint64_t from)
{
    char url[KV_CFG_STR + 32], end[sizeof e->key_prefix];
    snprintf(url, sizeof url, "%s://%s/v3/watch", e->cacert[0] ? "https" : "http", e->ep[k]);
    prefix_end(e->key_prefix, end, sizeof end);
    json_object *req = json_object_new_object(), *cr = json_object_new_object();
    jadd_b64(cr, "key", e->key_prefix);
    jadd_b64(cr, "range_end", end);
    jadd_int(cr, "start_revision", (int64_t)from);
    json_object_object_add(req, "create_request", cr);
    pthread_mutex_lock(&e->call_lock);
    struct curl_slist *hd = headers(e);
    pthread_mutex_unlock(&e->call_lock);
    struct stream s = { .e = e, .tok = json_tokener_new() };
    CURL *h = curl_easy_init();
    if (!h || !s.tok) {
        curl_easy_cleanup(h);
        json_tokener_free(s.tok);
        curl_slist_free_all(hd);
        json_object_put(req);
        return 0;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    tls_setup(e, h);
    curl_easy_setopt(h, CURLOPT_COPYPOSTFIELDS,
                     json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
    json_object_put(req);
    curl_multi_add_handle(e->multi, h);
    for (;;) {
        int running = 0;
        CURLMcode mc = curl_multi_perform(e->multi, &running);
        if (s.changed) {
            s.changed = 0;
            if (e->notify)
                e->notify(e->arg);
        }
        if (mc != CURLM_OK || !running || s.failed || stopping(e) || atomic_load(&e->cur) != k)
            break;
        /* The stream goes on: events after the read's revision still
         * apply, the earlier ones are skipped. */
        if (atomic_load(&e->resync) || kv__now_ms() - atomic_load(&e->read_ms) >= VIEW_RESYNC_MS)
            refresh_and_notify(e);
        curl_multi_poll(e->multi, NULL, 0, 1000, NULL);
    }
    atomic_store(&e->watch_up, 0);
    curl_multi_remove_handle(e->multi, h);
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    json_tokener_free(s.tok);
    return s.created;
}

/* Keeps a watch on the prefix. The view is read whole at the start and
 * whenever events may have been lost (resync: a cancelled watch, an
 * answer dropped or unreadable, an event the view could not take);
 * otherwise a new stream resumes from the revision after the last one the
 * view holds, so a watch that was cut off (an endpoint died, calls moved
 * to another) catches up by events. */
static void *watch_main(void *arg)
{
    struct etcd *e = arg;
    unsigned backoff = 20;
    while (!stopping(e)) {
        int changed = 0, rc = KV_OK;
        pthread_mutex_lock(&e->call_lock);
        if (!e->have_view || atomic_load(&e->resync))
            rc = refresh(e, &changed);
        int k = atomic_load(&e->cur);
        pthread_mutex_lock(&e->view_lock);
        uint64_t from = e->seen_rev + 1;
        pthread_mutex_unlock(&e->view_lock);
        pthread_mutex_unlock(&e->call_lock);
        if (changed && e->notify)
            e->notify(e->arg);
        if (rc == KV_OK && watch_stream(e, k, from))
            backoff = 20;
        /* Down, or refused: wait a little (longer each time, up to a
         * second), then read and watch again. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)backoff * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_mutex_lock(&e->wlock);
        if (!e->stop)
            pthread_cond_timedwait(&e->wcond, &e->wlock, &ts);
        pthread_mutex_unlock(&e->wlock);
        backoff = backoff * 2 > WATCH_BACKOFF_MAX_MS ? WATCH_BACKOFF_MAX_MS : backoff * 2;
    }
    return NULL;
}

/* ---- registration ------------------------------------------------------- */

static int grant(struct etcd *e)
{
    json_object *req = json_object_new_object(), *ans = NULL;
    jadd_int(req, "TTL", e->ttl_s);
    int rc = post(e, "/v3/lease/grant", req, &ans);
    json_object_put(req);
    if (rc == KV_OK && !(e->lease = jint(ans, "ID")))
        rc = KV_EPROTO;
    json_object_put(ans);
    return rc;
}

/* Puts self's record on a lease (a new one when there is none, or when the
 * one we had is gone). Caller holds call_lock. */
static int put_record(struct etcd *e)
{
    char key[sizeof e->key_prefix + KV_PROTO_ID_MAX + 1];
    snprintf(key, sizeof key, "%s%s", e->key_prefix, e->self.id);
    char *val = NULL;
    int rc = KV_OK;
    for (int tries = 0; tries < 2; tries++) {
        if (!e->lease && (rc = grant(e)))
            break;
        /* Signed with the lease it goes on: readers check both. */
        e->self.lease = (uint64_t)e->lease;
        free(val);
        val = NULL;
        if ((rc = kv__member_sign(e->token, &e->self)) != KV_OK)
            break;
        if (!(val = record_encode(&e->self))) {
            rc = KV_ENOMEM;
            break;
        }
        rc = put_leased(e, key, val);
        if (rc != KV_ENOTFOUND)
            break;
        e->lease = 0;   /* expired between grant and put: once more */
    }
    free(val);
    if (rc == KV_OK)
        e->self_ok = 1;
    return rc == KV_ENOTFOUND ? KV_ENET : rc;
}

/* The cluster token's check value at PREFIX/token: "v1:" salt ":" HMAC
 * under the token of the salt, both hex. Written once by the first member
 * (a create-only transaction); every later one must match it: KV_EPERM when
 * it does not (another cluster's token). Caller holds call_lock. */
static const char token_label[] = "kvengine/etcd-token";

static int token_value(const char *token, const uint8_t salt[16], char *out, size_t cap)
{
    uint8_t mac[KV__AUTH_MAC];
    int rc = kv__auth_sign(token, token_label, salt, 16, mac);
    if (rc != KV_OK)
        return rc;
    char hs[33], hm[2 * KV__AUTH_MAC + 1];
    hex(salt, 16, hs);
    hex(mac, sizeof mac, hm);
    snprintf(out, cap, "v1:%s:%s", hs, hm);
    return KV_OK;
}

static int check_token(struct etcd *e)
{
    uint8_t salt[KV__AUTH_NONCE];   /* its first 16 bytes */
    char mine[128];
    int rc = kv__auth_nonce(salt);
    if (rc == KV_OK)
        rc = token_value(e->token, salt, mine, sizeof mine);
    if (rc != KV_OK)
        return rc;
    json_object *req = json_object_new_object(), *ans = NULL;
    json_object *cmp = json_object_new_object(), *cmps = json_object_new_array();
    jadd_b64(cmp, "key", e->token_key);
    json_object_object_add(cmp, "target", json_object_new_string("CREATE"));
    json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
    jadd_int(cmp, "create_revision", 0);
    json_object_array_add(cmps, cmp);
    json_object_object_add(req, "compare", cmps);
    json_object *put = json_object_new_object(), *rp = json_object_new_object();
    jadd_b64(put, "key", e->token_key);
    jadd_b64(put, "value", mine);
    json_object_object_add(rp, "request_put", put);
    json_object *succ = json_object_new_array();
    json_object_array_add(succ, rp);
    json_object_object_add(req, "success", succ);
    json_object *rg = json_object_new_object(), *rr = json_object_new_object();
    jadd_b64(rg, "key", e->token_key);
    json_object_object_add(rr, "request_range", rg);
    json_object *fail = json_object_new_array();
    json_object_array_add(fail, rr);
    json_object_object_add(req, "failure", fail);
    rc = post(e, "/v3/kv/txn", req, &ans);
    json_object_put(req);
    if (rc != KV_OK) {
        json_object_put(ans);
        return rc;
    }
    json_object *ok = jget(ans, "succeeded");
    if (ok && json_object_get_boolean(ok)) {
        json_object_put(ans);
        return KV_OK;       /* we are the first: ours is the check value */
    }
    json_object *resp = jget(ans, "responses");
    json_object *r0 = resp && json_object_is_type(resp, json_type_array)
                          ? json_object_array_get_idx(resp, 0) : NULL;
    json_object *kvs = jget(jget(r0, "response_range"), "kvs");
    json_object *kv = kvs && json_object_is_type(kvs, json_type_array)
                          ? json_object_array_get_idx(kvs, 0) : NULL;
    const char *v64 = jstr(kv, "value");
    size_t vl = 0;
    char *val = v64 ? b64_decode(v64, &vl) : NULL, want[128];
    uint8_t theirs[16];
    rc = KV_EPERM;
    if (val && strlen(val) == vl && strncmp(val, "v1:", 3) == 0 && strlen(val) > 36 &&
        val[35] == ':') {
        char hs[33];
        memcpy(hs, val + 3, 32);
        hs[32] = 0;
        if (unhex(hs, theirs, sizeof theirs) == 0 &&
            token_value(e->token, theirs, want, sizeof want) == KV_OK &&
            strlen(want) == vl && kv__auth_eq(want, val, vl))
            rc = KV_OK;
    }
    if (rc != KV_OK)
        KV_ERROR("etcd: cluster.token does not match this cluster's (the check value at %s); "
                 "refusing to join", e->token_key);
    free(val);
    json_object_put(ans);
    return rc;
}

static int start_watch(struct etcd *e)
{
    if (e->watching)
        return KV_OK;
    if (!e->multi && !(e->multi = curl_multi_init()))
        return KV_ENOMEM;
    if (pthread_create(&e->watcher, NULL, watch_main, e) != 0)
        return KV_ENOMEM;
    e->watching = 1;
    return KV_OK;
}

/* ---- the ops ------------------------------------------------------------ */

static int etcd_open(const struct kv_config *cfg, unsigned timeout_ms, void (*notify)(void *),
                     void *arg, struct kv__membership **out, char *err, size_t errlen)
{
    *out = NULL;
    pthread_once(&curl_once, curl_init_once);
    struct etcd *e = calloc(1, sizeof *e);
    if (!e)
        return KV_ENOMEM;
    e->base.ops = &kv__etcd_membership;
    for (const char *p = cfg->cluster.etcd_endpoints; *p && e->nep < EP_MAX;) {
        size_t len = strcspn(p, ",");
        if (len)
            snprintf(e->ep[e->nep++], KV_CFG_STR, "%.*s", (int)len, p);
        p += len + (p[len] == ',');
    }
    const char *pre = cfg->cluster.etcd_prefix;
    if (!e->nep || pre[0] != '/') {
        kv__errf(err, errlen, "%s", !e->nep ? "cluster.etcd_endpoints: empty"
                                            : "cluster.etcd_prefix: must start with '/'");
        free(e);
        return KV_ECONFIG;
    }
    snprintf(e->key_prefix, sizeof e->key_prefix, "%s/members/", pre);
    snprintf(e->fig_prefix, sizeof e->fig_prefix, "%s/figures/", pre);
    snprintf(e->token_key, sizeof e->token_key, "%s/token", pre);
    snprintf(e->token, sizeof e->token, "%s", cfg->cluster.token);
    snprintf(e->cacert, sizeof e->cacert, "%s", cfg->cluster.etcd_cacert);
    snprintf(e->cert, sizeof e->cert, "%s", cfg->cluster.etcd_cert);
    snprintf(e->key, sizeof e->key, "%s", cfg->cluster.etcd_key);
    if ((e->cert[0] || e->key[0]) && (!e->cacert[0] || !e->cert[0] || !e->key[0])) {
        kv__errf(err, errlen, "cluster.etcd_cert / etcd_key: set both, with cluster.etcd_cacert");
        free(e);
        return KV_ECONFIG;
    }
    snprintf(e->user, sizeof e->user, "%s", cfg->cluster.etcd_user);
    snprintf(e->password, sizeof e->password, "%s", cfg->cluster.etcd_password);
    e->timeout_ms = timeout_ms > ETCD_TIMEOUT_MIN_MS ? timeout_ms : ETCD_TIMEOUT_MIN_MS;
    e->ttl_s = (int64_t)((cfg->cluster.node_ttl_ms + 999) / 1000);
    if (e->ttl_s < 1)
        e->ttl_s = 1;
    e->notify = notify;
    e->arg = arg;
    pthread_mutex_init(&e->call_lock, NULL);
    pthread_mutex_init(&e->view_lock, NULL);
    pthread_mutex_init(&e->wlock, NULL);
    pthread_cond_init(&e->wcond, NULL);
    if (!(e->h = curl_easy_init())) {
        free(e);
        return KV_ENOMEM;
    }
    curl_easy_setopt(e->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e->h, CURLOPT_TCP_NODELAY, 1L);
    tls_setup(e, e->h);
    *out = &e->base;
    return KV_OK;
}

static void etcd_close(struct kv__membership *m)
{
    struct etcd *e = (struct etcd *)m;
    if (e->watching) {
        pthread_mutex_lock(&e->wlock);
        e->stop = 1;
        pthread_cond_signal(&e->wcond);
        pthread_mutex_unlock(&e->wlock);
        curl_multi_wakeup(e->multi);
        pthread_join(e->watcher, NULL);
    }
    if (e->multi)
        curl_multi_cleanup(e->multi);
    curl_easy_cleanup(e->h);
    free(e->members);
    free(e->bad_ms);
    pthread_mutex_destroy(&e->call_lock);
    pthread_mutex_destroy(&e->view_lock);
    pthread_mutex_destroy(&e->wlock);
    pthread_cond_destroy(&e->wcond);
    free(e);
}

static int etcd_local_ip(struct kv__membership *m, char *ip, size_t cap)
{
    struct etcd *e = (struct etcd *)m;
    int rc = KV_OK, changed;
    pthread_mutex_lock(&e->call_lock);
    if (!e->local_ip[0])
        rc = refresh(e, &changed);
    if (rc == KV_OK && !e->local_ip[0])
        rc = KV_ENET;
    if (rc == KV_OK)
        snprintf(ip, cap, "%s", e->local_ip);
    pthread_mutex_unlock(&e->call_lock);
    return rc;
}

static int etcd_join(struct kv__membership *m, const struct kv__member *self, uint64_t *version,
                     struct kv__member **members, size_t *n)
{
    struct etcd *e = (struct etcd *)m;
    int changed;
    pthread_mutex_lock(&e->call_lock);
    e->self = *self;
    int rc = check_token(e);
    if (rc == KV_OK) {
        e->joined = 1;
        rc = put_record(e);
    }
    if (rc == KV_OK)
        rc = refresh(e, &changed);
    if (rc == KV_OK)
        rc = start_watch(e);
    pthread_mutex_unlock(&e->call_lock);
    return rc ? rc : view_copy(e, version, members, n);
}

/* Puts self, with its figures as they are now, at PREFIX/figures/ID on our
 * lease (see the top). Caller holds call_lock and has a lease. */
static int put_figures(struct etcd *e, const struct kv__member *self)
{
    struct kv__member f = *self;
    f.lease = (uint64_t)e->lease;
    int rc = kv__member_sign(e->token, &f);
    char *val = rc == KV_OK ? record_encode(&f) : NULL;
    if (!val)
        return rc == KV_OK ? KV_ENOMEM : rc;
    char key[sizeof e->fig_prefix + KV_PROTO_ID_MAX + 1];
    snprintf(key, sizeof key, "%s%s", e->fig_prefix, f.id);
    rc = put_leased(e, key, val);
    free(val);
    return rc;
}

/* For a read-only view: replaces each member's record by its figures
 * record when that one proves itself (its MAC, its key, its lease) and is
 * the same member in the same place; else the member keeps the figures it
 * joined with. Caller holds call_lock. */
static void merge_figures(struct etcd *e, struct kv__member *list, size_t n)
{
    char end[sizeof e->fig_prefix];
    prefix_end(e->fig_prefix, end, sizeof end);
    json_object *req = json_object_new_object(), *ans = NULL;
    jadd_b64(req, "key", e->fig_prefix);
    jadd_b64(req, "range_end", end);
    int rc = post(e, "/v3/kv/range", req, &ans);
    json_object_put(req);
    json_object *kvs = rc == KV_OK ? jget(ans, "kvs") : NULL;
    size_t total = kvs && json_object_is_type(kvs, json_type_array)
                       ? json_object_array_length(kvs) : 0;
    size_t pl = strlen(e->fig_prefix);
    for (size_t i = 0; i < total; i++) {
        json_object *kv = json_object_array_get_idx(kvs, i);
        size_t vl = 0, kl = 0;
        const char *v64 = jstr(kv, "value"), *k64 = jstr(kv, "key");
        char *val = v64 ? b64_decode(v64, &vl) : NULL, *key = k64 ? b64_decode(k64, &kl) : NULL;
        struct kv__member f;
        if (val && key && strlen(key) == kl && strlen(val) == vl && kl > pl &&
            record_decode(val, &f) == 0 && strcmp(key + pl, f.id) == 0 &&
            f.lease == (uint64_t)jint(kv, "lease") && kv__member_verify(e->token, &f))
            for (size_t j = 0; j < n; j++)
                if (kv__member_same_place(&list[j], &f)) {
                    list[j] = f;
                    break;
                }
        free(val);
        free(key);
    }
    json_object_put(ans);
}

/* After a put of our own record: a watch that is up brings it, with
 * anything else that changed, as an event; else the view is read. Caller
 * holds call_lock. */
static int view_after_put(struct etcd *e)
{
    int changed;
    return atomic_load(&e->watch_up) ? KV_OK : refresh(e, &changed);
}

static int etcd_heartbeat(struct kv__membership *m, const struct kv__member *self,
                          uint64_t *version, struct kv__member **members, size_t *n)
{
    struct etcd *e = (struct etcd *)m;
    int rc = KV_OK, changed;
    pthread_mutex_lock(&e->call_lock);
    /* The record as signed keeps its lease and MAC until it is rewritten. */
    uint64_t lease = e->self.lease;
    uint8_t mac[sizeof e->self.mac];
    memcpy(mac, e->self.mac, sizeof mac);
    e->self = *self;
    e->self.lease = lease;
    memcpy(e->self.mac, mac, sizeof mac);
    if (e->lease) {
        json_object *req = json_object_new_object(), *ans = NULL;
        jadd_int(req, "ID", e->lease);
        rc = post(e, "/v3/lease/keepalive", req, &ans);
        json_object_put(req);
        if (rc == KV_OK && jint(ans, "TTL") <= 0) {
            /* etcd let the lease go (we were cut off longer than the TTL):
             * our record went with it. Register again. */
            KV_WARN("etcd: lease of %s expired; registering again", e->self.id);
            e->lease = 0;
        }
        uint64_t rev = (uint64_t)jint(jget(ans, "header"), "revision");
        json_object_put(ans);
        pthread_mutex_lock(&e->view_lock);
        int stale = rc == KV_OK && rev > e->seen_rev;
        pthread_mutex_unlock(&e->view_lock);
        /* Something changed in etcd since the view was current, and no
         * watch stream is up to bring it (it is reconnecting). While one
         * is, the revision says nothing: every member's figures move it
         * at every heartbeat, outside the watched range. A member standing
         * in past its time needs a read too (stands_in). */
        if (rc == KV_OK && e->lease &&
            ((stale && !atomic_load(&e->watch_up)) || standin_expired(e, kv__now_ms())))
            rc = refresh(e, &changed);
    }
    /* Our record changed or vanished under its live lease (someone with
     * write access to etcd): put it back now. */
    if (rc == KV_OK && e->lease && !e->self_ok) {
        KV_WARN("etcd: the record of %s was changed or removed by someone else; rewriting it",
                e->self.id);
        if ((rc = put_record(e)) == KV_OK)
            rc = view_after_put(e);
    }
    if (rc == KV_OK && !e->lease && (rc = put_record(e)) == KV_OK)
        rc = view_after_put(e);
    if (rc == KV_OK && e->lease)
        put_figures(e, self);   /* best effort: the figures are not membership */
    if (rc == KV_OK)
        rc = start_watch(e);
    pthread_mutex_unlock(&e->call_lock);
    return rc ? rc : view_copy(e, version, members, n);
}

static int etcd_view(struct kv__membership *m, uint64_t *version, struct kv__member **members,
                     size_t *n)
{
    struct etcd *e = (struct etcd *)m;
    int rc = KV_OK, changed;
    pthread_mutex_lock(&e->call_lock);
    /* With a watch running the cached view is current; else read it. */
    if (!e->watching || !e->have_view)
        rc = refresh(e, &changed);
    if (rc == KV_OK)
        rc = view_copy(e, version, members, n);
    /* A reader that is no member (kv_members) shows the latest figures. */
    if (rc == KV_OK && !e->joined)
        merge_figures(e, *members, *n);
    pthread_mutex_unlock(&e->call_lock);
    return rc;
}

static int etcd_leave(struct kv__membership *m, const struct kv__member *self)
{
    struct etcd *e = (struct etcd *)m;
    char key[sizeof e->key_prefix + KV_PROTO_ID_MAX + 1];
    snprintf(key, sizeof key, "%s%s", e->key_prefix, self->id);
    pthread_mutex_lock(&e->call_lock);
    json_object *req = json_object_new_object(), *ans = NULL;
    jadd_b64(req, "key", key);
    int rc = post(e, "/v3/kv/deleterange", req, &ans);
    json_object_put(req);
    json_object_put(ans);
    snprintf(key, sizeof key, "%s%s", e->fig_prefix, self->id);
    req = json_object_new_object();
    jadd_b64(req, "key", key);
    post(e, "/v3/kv/deleterange", req, &ans);   /* its lease would take it too */
    json_object_put(req);
    json_object_put(ans);
    if (e->lease) {   /* and the lease, so that nothing of ours lingers */
        req = json_object_new_object();
        jadd_int(req, "ID", e->lease);
        post(e, "/v3/lease/revoke", req, &ans);
        json_object_put(req);
        json_object_put(ans);
        e->lease = 0;
    }
    e->joined = 0;
    pthread_mutex_unlock(&e->call_lock);
    return rc;
}

void kv__etcd_counts(struct kv__membership *m, uint64_t *full_reads, uint64_t *events)
{
    struct etcd *e = (struct etcd *)m;
    *full_reads = atomic_load(&e->full_reads);
    *events = atomic_load(&e->events);
}

const struct kv__membership_ops kv__etcd_membership = {
    .name = "etcd",
    .open = etcd_open,
    .close = etcd_close,
    .local_ip = etcd_local_ip,
    .join = etcd_join,
    .heartbeat = etcd_heartbeat,
    .view = etcd_view,
    .leave = etcd_leave,
};
