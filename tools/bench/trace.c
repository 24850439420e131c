/*
 * trace.c — `kvctl bench --scenario trace`: reading a serving request
 * trace (Mooncake's JSONL format, ../shared/traces/README.md), the two cache
 * models it is measured against (an infinite cache and an exact LRU), and
 * its replay against a backend the way a UCM connector drives a store.
 *
 * Key design choices:
 * - The reader is a small strict JSON parser written for this one shape (an
 *   object per line with "timestamp", "input_length", "hash_ids", other keys
 *   parsed and skipped), so a hostile line costs a clear "FILE:LINE: column
 *   C: why" and never a crash: every number is range-checked before it is
 *   converted, nesting is bounded, a line is bounded, strings are checked to
 *   be UTF-8. No JSON library is linked.
 * - Trace ids are remapped once to dense numbers 0..distinct-1 while
 *   reading, so both models are flat arrays (a bitmap for the infinite
 *   cache, prev/next arrays for the LRU list) and run over the whole trace
 *   in milliseconds, in the same process as the replay.
 * - Both models follow the connector's semantics exactly: a request's hits
 *   are the leading run of its blocks found (lookup_prefix), those are
 *   touched in order, and the blocks after the run are dumped, which adds
 *   the absent ones and leaves present ones untouched (a dump of a present
 *   shard is skipped, DESIGN.md).
 * - The replay's jobs take the next request from one shared counter, so the
 *   trace runs in arrival order overall and in arrival order within every
 *   job. Per request: kv_lookup_prefix, one load task for the leading hits
 *   (each destination's header is wiped first, so a shard that was not
 *   copied fails verification), one dump task for every block from the
 *   first one not loaded. Figures are kept per request in arrays indexed by
 *   the request's number, which only the job replaying it writes.
 * - A value names its block and shard in its first 64 bytes (block id,
 *   trace id, shard index); the rest is fixed pseudo-random bytes shared
 *   read-only by all jobs, so any job verifies any value, and a dump is two
 *   iovs per shard with no per-value buffer.
 */
#include "bench.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HDR 64u                         /* bytes of a value naming it */
#define MAX_LINE (64u << 20)            /* longest line read */
#define MAX_DEPTH 64                    /* nesting of a skipped value */
#define MAX_IDS_PER_REQ (1u << 20)      /* hash_ids of one request */
#define MAX_REFS (1ull << 31)           /* block references, all requests */
#define MAX_ID ((1ull << 53) - 1)       /* what any JSON reader gets exactly */
#define MAX_TS_MS 1e15                  /* ~31,000 years of trace */
#define MAX_LENGTH 0xffffffffull        /* input_length, output_length */

/* ---- reading ------------------------------------------------------------- */

/* One line being parsed. */
struct lp {
    const char *s, *p, *end;            /* the line, the cursor, its end */
    const char *file;
    uint64_t line;
    bool failed;
};

/* ids as read, and the map from trace id to dense number. */
struct idmap {
    uint64_t *key;                      /* trace id + 1; 0 = empty slot */
    uint32_t *val;
    size_t cap, n;
};

struct reader {
    struct kvctl_trace *t;
    struct idmap map;
    uint32_t *last_req;                 /* per dense id: last request + 1 */
    size_t refs_cap, dense_cap, req_cap, last_cap;
};

static void fail_at(struct lp *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail_at(struct lp *l, const char *fmt, ...)
{
    if (l->failed)
        return;
    l->failed = true;
    fprintf(stderr, "kvctl bench: %s:%" PRIu64 ": column %zu: ", l->file, l->line,
            (size_t)(l->p - l->s) + 1);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void ws(struct lp *l)
{
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\r' || *l->p == '\n'))
        l->p++;
}

static bool at(struct lp *l, char c)
{
    ws(l);
    return l->p < l->end && *l->p == c;
}

/* What is at the cursor, for messages. */
static const char *seen(const struct lp *l)
{
    return l->p >= l->end ? "the end of the line" : "something else";
}

static bool expect(struct lp *l, char c, const char *what)
{
    if (at(l, c)) {
        l->p++;
        return true;
    }
    fail_at(l, "expected %s, found %s", what, seen(l));
    return false;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Length of the well-formed UTF-8 sequence at p (1..4), 0 when it is not
 * one (overlong forms, surrogates and code points past U+10FFFF are not). */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    size_t n;
    unsigned cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, cp = c & 0x07;
    else
        return 0;
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return n;
}

/* A JSON string at the cursor. Its first cap - 1 decoded bytes go to out
 * (NUL-terminated) when out is given; an escaped character outside ASCII
 * decodes to 0xff, which no key this reader knows contains. */
static bool string(struct lp *l, char *out, size_t cap)
{
    size_t n = 0;
    if (!expect(l, '"', "a string"))
        return false;
    for (;;) {
        if (l->p >= l->end) {
            fail_at(l, "unterminated string");
            return false;
        }
        unsigned char c = (unsigned char)*l->p;
        if (c == '"') {
            l->p++;
            break;
        }
        if (c < 0x20) {
            fail_at(l, "control character 0x%02x in a string", c);
            return false;
        }
        if (c == '\\') {
            if (l->p + 1 >= l->end) {
                fail_at(l, "unterminated string");
                return false;
            }
            char e = l->p[1];
            const char *esc = strchr("\"\\/bfnrt", e);
            if (e && esc) {
                static const char dec[] = "\"\\/\b\f\n\r\t";
                c = (unsigned char)dec[esc - "\"\\/bfnrt"];
                l->p += 2;
            } else if (e == 'u') {
                int v = 0;
                for (int i = 0; i < 4; i++) {
                    int h = l->p + 2 + i < l->end ? hexval(l->p[2 + i]) : -1;
                    if (h < 0) {
                        fail_at(l, "bad \\u escape (want four hex digits)");
                        return false;
                    }
                    v = v * 16 + h;
                }
                c = v < 0x80 ? (unsigned char)v : 0xff;
                l->p += 6;
            } else {
                fail_at(l, "bad escape '\\%c' in a string", e >= 0x20 && e < 0x7f ? e : '?');
                return false;
            }
        } else {
            size_t k = utf8_len((const unsigned char *)l->p, (const unsigned char *)l->end);
            if (k == 0) {
                fail_at(l, "a string that is not UTF-8");
                return false;
            }
            if (k > 1) {
                c = 0xff;
                l->p += k - 1;
            }
            l->p++;
        }
        if (out && n + 1 < cap)
            out[n++] = (char)c;
    }
    if (out && cap)
        out[n] = '\0';
    return true;
}

/* A JSON number at the cursor, checked against the grammar
 * -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?; *whole says it had neither
 * sign, fraction nor exponent. The text is [*from, cursor). */
static bool number(struct lp *l, const char **from, bool *whole)
{
    ws(l);
    const char *p = l->p, *e = l->end;
    *from = p;
    *whole = true;
    if (p < e && *p == '-')
        p++, *whole = false;
    if (p >= e || *p < '0' || *p > '9') {
        fail_at(l, "expected a number, found %s", seen(l));
        return false;
    }
    if (*p == '0' && p + 1 < e && p[1] >= '0' && p[1] <= '9') {
        l->p = p;
        fail_at(l, "a number with a leading zero");
        return false;
    }
    while (p < e && *p >= '0' && *p <= '9')
        p++;
    if (p < e && *p == '.') {
        *whole = false;
        if (++p >= e || *p < '0' || *p > '9') {
            l->p = p;
            fail_at(l, "a number with no digit after its '.'");
            return false;
        }
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        *whole = false;
        if (++p < e && (*p == '+' || *p == '-'))
            p++;
        if (p >= e || *p < '0' || *p > '9') {
            l->p = p;
            fail_at(l, "a number with no digit in its exponent");
            return false;
        }
        while (p < e && *p >= '0' && *p <= '9')
            p++;
    }
    l->p = p;
    return true;
}

/* A whole number in [0, max]; what names it in messages. */
static bool whole_number(struct lp *l, uint64_t max, const char *what, uint64_t *out)
{
    const char *from;
    bool whole;
    if (!number(l, &from, &whole))
        return false;
    const char *end = l->p;
    if (!whole) {
        l->p = from;
        fail_at(l, "%s: want a whole number >= 0, got '%.*s'", what,
                (int)(end - from < 40 ? end - from : 40), from);
        return false;
    }
    uint64_t v = 0;
    for (const char *p = from; p < end; p++) {
        if (v > (max - (uint64_t)(*p - '0')) / 10) {
            l->p = from;
            fail_at(l, "%s: number out of range (at most %" PRIu64 "), got '%.*s%s'", what, max,
                    (int)(end - from < 40 ? end - from : 40), from, end - from > 40 ? "..." : "");
            return false;
        }
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return true;
}

static bool skip_value(struct lp *l, int depth);

static bool skip_container(struct lp *l, int depth, bool obj)
{
    if (depth >= MAX_DEPTH) {
        fail_at(l, "nested deeper than %d levels", MAX_DEPTH);
        return false;
    }
    l->p++;
    if (at(l, obj ? '}' : ']')) {
        l->p++;
        return true;
    }
    for (;;) {
        if (obj && (!string(l, NULL, 0) || !expect(l, ':', "':'")))
            return false;
        if (!skip_value(l, depth + 1))
            return false;
        if (at(l, ',')) {
            l->p++;
            continue;
        }
        return expect(l, obj ? '}' : ']', obj ? "',' or '}'" : "',' or ']'");
    }
}

/* Any JSON value, checked and thrown away (a key this reader does not use). */
static bool skip_value(struct lp *l, int depth)
{
    ws(l);
    if (l->p >= l->end) {
        fail_at(l, "expected a value, found the end of the line");
        return false;
    }
    char c = *l->p;
    if (c == '{' || c == '[')
        return skip_container(l, depth, c == '{');
    if (c == '"')
        return string(l, NULL, 0);
    static const char *const words[] = { "true", "false", "null" };
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(l->end - l->p) >= n && memcmp(l->p, words[i], n) == 0) {
            l->p += n;
            return true;
        }
    }
    const char *from;
    bool whole;
    return number(l, &from, &whole);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int map_grow(struct idmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *key = calloc(cap, sizeof *key);
    uint32_t *val = malloc(cap * sizeof *val);
    if (!key || !val) {
        free(key);
        free(val);
        return KV_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->key[i])
            continue;
        size_t j = mix(m->key[i]) & (cap - 1);
        while (key[j])
            j = (j + 1) & (cap - 1);
        key[j] = m->key[i];
        val[j] = m->val[i];
    }
    free(m->key);
    free(m->val);
    m->key = key;
    m->val = val;
    m->cap = cap;
    return KV_OK;
}

/* The dense number of trace id `id`, given the next one when it is new. */
static int map_get(struct idmap *m, uint64_t id, uint32_t *out, bool *fresh)
{
    if ((m->n + 1) * 2 > m->cap && map_grow(m) != KV_OK)
        return KV_ENOMEM;
    uint64_t k = id + 1;
    size_t j = mix(k) & (m->cap - 1);
    while (m->key[j] && m->key[j] != k)
        j = (j + 1) & (m->cap - 1);
    *fresh = !m->key[j];
    if (*fresh) {
        m->key[j] = k;
        m->val[j] = (uint32_t)m->n++;
    }
    *out = m->val[j];
    return KV_OK;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *n = realloc(p, c * elem);
    if (n)
        *cap = c;
    return n;
}

/* Appends one trace id of request `req` to the trace. */
static bool add_id(struct reader *rd, struct lp *l, uint64_t id, size_t req)
{
    struct kvctl_trace *t = rd->t;
    if (t->nrefs >= MAX_REFS) {
        fail_at(l, "more than %llu block references in the trace", (unsigned long long)MAX_REFS);
        return false;
    }
    uint64_t *h = grow(t->hash, &rd->refs_cap, t->nrefs + 1, sizeof *h);
    if (h)
        t->hash = h;
    uint32_t *d = h ? grow(t->dense, &rd->dense_cap, t->nrefs + 1, sizeof *d) : NULL;
    if (!h || !d) {
        fail_at(l, "out of memory");
        return false;
    }
    t->dense = d;
    uint32_t dense;
    bool fresh;
    if (map_get(&rd->map, id, &dense, &fresh) != KV_OK) {
        fail_at(l, "out of memory");
        return false;
    }
    uint32_t *lr = grow(rd->last_req, &rd->last_cap, (size_t)dense + 1, sizeof *lr);
    if (!lr) {
        fail_at(l, "out of memory");
        return false;
    }
    rd->last_req = lr;
    if (fresh)
        lr[dense] = 0;
    if (lr[dense] == req + 1) {
        fail_at(l, "hash id %" PRIu64 " appears twice in one request", id);
        return false;
    }
    lr[dense] = (uint32_t)(req + 1);
    t->hash[t->nrefs] = id;
    t->dense[t->nrefs++] = dense;
    return true;
}

static bool hash_ids(struct reader *rd, struct lp *l, size_t req, uint32_t *n)
{
    if (!expect(l, '[', "'[' (hash_ids is an array of whole numbers)"))
        return false;
    *n = 0;
    if (at(l, ']')) {
        l->p++;
        return true;
    }
    for (;;) {
        uint64_t id;
        if (!whole_number(l, MAX_ID, "hash_ids", &id))
            return false;
        if (*n >= MAX_IDS_PER_REQ) {
            fail_at(l, "more than %u hash_ids in one request", MAX_IDS_PER_REQ);
            return false;
        }
        if (!add_id(rd, l, id, req))
            return false;
        (*n)++;
        if (at(l, ',')) {
            l->p++;
            continue;
        }
        return expect(l, ']', "',' or ']' in hash_ids");
    }
}

/* Parses one request line into rd->t->req[req]. */
static bool parse_line(struct reader *rd, struct lp *l, size_t req)
{
    struct kvctl_trace_req *r = &rd->t->req[req];
    enum { K_TS, K_IN, K_OUT, K_IDS, K_N };
    static const char *const names[K_N] = { "timestamp", "input_length", "output_length",
                                            "hash_ids" };
    bool have[K_N] = { false };
    *r = (struct kvctl_trace_req){ .first = (uint32_t)rd->t->nrefs };
    if (!expect(l, '{', "'{' (a request is a JSON object)"))
        return false;
    if (at(l, '}')) {
        l->p++;
    } else {
        for (;;) {
            ws(l);
            const char *kat = l->p;
            char key[32];
            if (!string(l, key, sizeof key) || !expect(l, ':', "':'"))
                return false;
            int k = 0;
            while (k < K_N && strcmp(key, names[k]) != 0)
                k++;
            if (k < K_N && have[k]) {
                l->p = kat;
                fail_at(l, "\"%s\" given twice", names[k]);
                return false;
            }
            if (k < K_N)
                have[k] = true;
            bool ok = true;
            if (k == K_TS) {
                const char *from;
                bool whole;
                ok = number(l, &from, &whole);
                if (ok) {
                    char buf[64];
                    size_t len = (size_t)(l->p - from);
                    double v = len < sizeof buf ? (memcpy(buf, from, len), buf[len] = '\0',
                                                  strtod(buf, NULL))
                                                : INFINITY;
                    if (!(v >= 0) || !(v <= MAX_TS_MS)) {
                        l->p = from;
                        fail_at(l, "timestamp: want milliseconds from 0 to 1e15, got '%.*s%s'",
                                (int)(len < 40 ? len : 40), from, len > 40 ? "..." : "");
                        return false;
                    }
                    r->ts_ms = v;
                }
            } else if (k == K_IN) {
                ok = whole_number(l, MAX_LENGTH, "input_length", &r->input_length);
            } else if (k == K_OUT) {
                uint64_t out;
                ok = whole_number(l, MAX_LENGTH, "output_length", &out);
            } else if (k == K_IDS) {
                ok = hash_ids(rd, l, req, &r->n);
            } else {
                ok = skip_value(l, 1);
            }
            if (!ok)
                return false;
            if (at(l, ',')) {
                l->p++;
                continue;
            }
            if (!expect(l, '}', "',' or '}'"))
                return false;
            break;
        }
    }
    ws(l);
    if (l->p < l->end) {
        fail_at(l, "text after the request's object");
        return false;
    }
    for (int k = 0; k < K_N; k++) {
        if (!have[k] && k != K_OUT) {
            l->p = l->s;
            fail_at(l, "missing \"%s\"", names[k]);
            return false;
        }
    }
    return true;
}

/* Reads one line (without its '\n') into *buf; 1 read, 0 at the end, -1 on
 * a line longer than MAX_LINE or a read error (errno set). */
static int read_line(FILE *f, char **buf, size_t *cap, size_t *len)
{
    *len = 0;
    if (!*buf) {                        /* even an empty line has a buffer */
        *buf = malloc(4096);
        if (!*buf)
            return -1;
        *cap = 4096;
    }
    int c;
    while ((c = getc_unlocked(f)) != EOF && c != '\n') {
        if (*len + 1 >= *cap) {
            if (*cap >= MAX_LINE) {
                errno = E2BIG;
                return -1;
            }
            size_t nc = *cap ? *cap * 2 : 4096;
            char *n = realloc(*buf, nc);
            if (!n)
                return -1;
            *buf = n;
            *cap = nc;
        }
        (*buf)[(*len)++] = (char)c;
    }
    if (ferror(f))
        return -1;
    if (c == EOF && *len == 0)
        return 0;
    return 1;
}

void kvctl_trace_free(struct kvctl_trace *t)
{
    if (!t)
        return;
    free(t->path);
    free(t->req);
    free(t->hash);
    free(t->dense);
    free(t);
}

int kvctl_trace_load(const char *path, uint64_t limit, struct kvctl_trace **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "kvctl bench: --trace %s: %s\n", path, strerror(errno));
        return KV_EIO;
    }
    struct reader rd = { 0 };
    struct kvctl_trace *t = rd.t = calloc(1, sizeof *t);
    char *line = NULL;
    size_t cap = 0, len = 0;
    int rc = KV_ENOMEM;
    if (!t || !(t->path = strdup(path)))
        goto fail;
    rc = KV_EINVAL;
    struct lp l = { .file = path };
    for (;;) {
        if (limit && t->nreq >= limit)
            break;
        int got = read_line(f, &line, &cap, &len);
        l.line++;
        if (got < 0) {
            fprintf(stderr, "kvctl bench: %s:%" PRIu64 ": %s\n", path, l.line,
                    errno == E2BIG ? "line longer than 64 MiB" : strerror(errno));
            rc = errno == E2BIG ? KV_EINVAL : KV_EIO;
            goto fail;
        }
        if (got == 0)
            break;
        l.s = l.p = line;
        l.end = line + len;
        if (memchr(line, '\0', len)) {
            l.p = memchr(line, '\0', len);
            fail_at(&l, "a NUL byte");
            goto fail;
        }
        ws(&l);
        if (l.p == l.end)
            continue;                   /* a blank line */
        struct kvctl_trace_req *rq = grow(t->req, &rd.req_cap, t->nreq + 1, sizeof *rq);
        if (!rq) {
            fail_at(&l, "out of memory");
            goto fail;
        }
        t->req = rq;
        if (!parse_line(&rd, &l, t->nreq))
            goto fail;
        const struct kvctl_trace_req *r = &t->req[t->nreq++];
        if (r->n > t->max_blocks)
            t->max_blocks = r->n;
        t->prompt_tokens += r->input_length;
    }
    if (t->nreq == 0) {
        fprintf(stderr, "kvctl bench: %s:1: empty trace: no requests\n", path);
        goto fail;
    }
    t->ndistinct = rd.map.n;
    rc = KV_OK;
    *out = t;
    t = NULL;
fail:
    fclose(f);
    free(line);
    free(rd.map.key);
    free(rd.map.val);
    free(rd.last_req);
    kvctl_trace_free(t);
    return rc;
}

/* ---- the models ---------------------------------------------------------- */

uint64_t kvctl_trace_ideal(const struct kvctl_trace *t, uint32_t *req_hits)
{
    uint8_t *seen = calloc(t->ndistinct ? t->ndistinct : 1, 1);
    if (!seen)
        return UINT64_MAX;
    uint64_t hits = 0;
    for (size_t i = 0; i < t->nreq; i++) {
        const uint32_t *d = t->dense + t->req[i].first;
        uint32_t n = t->req[i].n, h = 0;
        while (h < n && seen[d[h]])
            h++;
        for (uint32_t k = h; k < n; k++)
            seen[d[k]] = 1;
        hits += h;
        if (req_hits)
            req_hits[i] = h;
    }
    free(seen);
    return hits;
}

#define NIL UINT32_MAX

/* An LRU list over dense ids: head is the most recently used. */
struct lru {
    uint32_t *prev, *next;
    uint8_t *in;
    uint32_t head, tail;
    uint64_t n, cap;
};

static void lru_unlink(struct lru *c, uint32_t x)
{
    if (c->prev[x] != NIL)
        c->next[c->prev[x]] = c->next[x];
    else
        c->head = c->next[x];
    if (c->next[x] != NIL)
        c->prev[c->next[x]] = c->prev[x];
    else
        c->tail = c->prev[x];
}

static void lru_front(struct lru *c, uint32_t x)
{
    c->prev[x] = NIL;
    c->next[x] = c->head;
    if (c->head != NIL)
        c->prev[c->head] = x;
    c->head = x;
    if (c->tail == NIL)
        c->tail = x;
}

uint64_t kvctl_trace_lru(const struct kvctl_trace *t, uint64_t capacity, uint64_t low,
                         uint32_t *req_hits)
{
    size_t nd = t->ndistinct ? t->ndistinct : 1;
    struct lru c = { .prev = malloc(nd * sizeof *c.prev), .next = malloc(nd * sizeof *c.next),
                     .in = calloc(nd, 1), .head = NIL, .tail = NIL, .cap = capacity };
    uint64_t hits = UINT64_MAX;
    if (!c.prev || !c.next || !c.in)
        goto out;
    hits = 0;
    for (size_t i = 0; i < t->nreq; i++) {
        const uint32_t *d = t->dense + t->req[i].first;
        uint32_t n = t->req[i].n, h = 0;
        while (h < n && c.in[d[h]])
            h++;
        for (uint32_t k = 0; k < h; k++) {          /* the lookup touches its hits */
            lru_unlink(&c, d[k]);
            lru_front(&c, d[k]);
        }
        for (uint32_t k = h; k < n && c.cap > 0; k++) {
            if (c.in[d[k]])
                continue;                           /* a dump of a present block */
            /* Full: the least recently used go, down to `low` (the DRAM
             * tier frees eviction.ratio of its capacity at once). */
            if (c.n >= c.cap) {
                uint64_t keep = low < c.cap ? low : c.cap - 1;
                while (c.n > keep) {
                    uint32_t v = c.tail;
                    lru_unlink(&c, v);
                    c.in[v] = 0;
                    c.n--;
                }
            }
            lru_front(&c, d[k]);
            c.in[d[k]] = 1;
            c.n++;
        }
        hits += h;
        if (req_hits)
            req_hits[i] = h;
    }
out:
    free(c.prev);
    free(c.next);
    free(c.in);
    return hits;
}

/* ---- the replay ---------------------------------------------------------- */

#define NONE UINT64_MAX                 /* no sample for this request */

/* What one job counted. */
struct tcount {
    uint64_t refs, hits, lookup_hits, broken, verr;
    uint64_t lk_ns, ld_ns, dp_ns;       /* time inside each kind of call */
    uint64_t lk_err, ld_shards, ld_bytes, ld_miss, ld_err, dp_shards, dp_bytes, dp_err;
    uint64_t dp_refused;                /* shards a full cache said no to */
    int lk_first, ld_first, dp_first;
};

struct tjob {
    struct replay *rp;
    pthread_t th;
    kv_block_id *ids;                   /* max_blocks */
    kv_shard *sh;                       /* max_blocks * shards */
    kv_iov *wiov;                       /* 2 per shard */
    kv_iov *riov;                       /* 1 per shard */
    uint8_t *hdr;                       /* HDR per shard: a dump's headers */
    uint8_t *rbuf;                      /* value_size per shard: load destinations */
    int *res;
    struct tcount c;
    uint64_t end_ns;
};

struct replay {
    const struct kvctl_trace *t;
    const struct kvctl_trace_opts *o;
    const struct kvctl_backend *be;
    void *st;
    uint8_t *payload;                   /* value_size: what every value shares */
    struct tjob *job;
    pthread_barrier_t go;
    uint64_t t0;
    _Atomic uint64_t next, done;
    _Atomic unsigned finished;
    /* per request, written only by the job replaying it */
    uint32_t *req_hits;
    uint64_t *lat_req, *lat_lk, *lat_ld, *lat_dp;
};

static void value_header(const struct replay *rp, const kv_block_id *id, uint64_t h,
                         uint32_t shard, uint8_t *out)
{
    memcpy(out, rp->payload, HDR);
    memcpy(out, id->bytes, KV_BLOCK_ID_LEN);
    memcpy(out + KV_BLOCK_ID_LEN, &h, sizeof h);
    memcpy(out + KV_BLOCK_ID_LEN + sizeof h, &shard, sizeof shard);
}

static bool verify(const struct replay *rp, const kv_block_id *id, uint64_t h, uint32_t shard,
                   const uint8_t *v)
{
    uint8_t want[HDR];
    value_header(rp, id, h, shard, want);
    return memcmp(v, want, HDR) == 0 &&
           memcmp(v + HDR, rp->payload + HDR, rp->o->value_size - HDR) == 0;
}

static void first_error(uint64_t *count, int *first, int rc, uint64_t n)
{
    if (*count == 0)
        *first = rc;
    *count += n;
}

static ssize_t lookup_prefix(struct tjob *jb, uint32_t n)
{
    struct replay *rp = jb->rp;
    if (rp->be->lookup_prefix)
        return rp->be->lookup_prefix(rp->st, jb->ids, n);
    /* A backend with only a mask lookup: the run is read off the mask. */
    uint8_t *hit = (uint8_t *)jb->res;
    int rc = rp->be->lookup(rp->st, jb->ids, n, hit);
    if (rc != KV_OK)
        return rc;
    ssize_t i = 0;
    while ((uint32_t)i < n && hit[i])
        i++;
    return i - 1;
}

/* Whether the first HDR bytes of v are still the zeros load() wrote. */
static bool untouched(const uint8_t *v)
{
    static const uint8_t zero[HDR];
    return memcmp(v, zero, HDR) == 0;
}

/*
 * Loads the first `hits` blocks of request r; returns how many of them, in
 * a leading run, came back whole and verified.
 *
 * A shard that did not come back breaks the lookup's promise. That is a
 * failed result, or one that says KV_OK over a destination the load never
 * wrote: the kvengine backend tells misses apart after a failed task by
 * asking kv_lookup, which looks at shard 0 only, so a shard the task could
 * not find while its block's shard 0 was there reads as OK. The header
 * wiped before the load tells the two apart; bytes that did land and are
 * wrong are verify failures.
 */
static uint32_t load(struct tjob *jb, const struct kvctl_trace_req *r, uint32_t hits, size_t ri)
{
    struct replay *rp = jb->rp;
    const uint32_t K = rp->o->shards;
    const uint64_t vs = rp->o->value_size;
    size_t m = (size_t)hits * K;
    for (uint32_t b = 0; b < hits; b++) {
        for (uint32_t s = 0; s < K; s++) {
            size_t i = (size_t)b * K + s;
            uint8_t *dst = jb->rbuf + i * vs;
            memset(dst, 0, HDR);
            jb->riov[i] = (kv_iov){ dst, vs };
            jb->sh[i] = (kv_shard){ .block = jb->ids[b], .index = s, .iov = &jb->riov[i],
                                    .iovcnt = 1 };
        }
    }
    uint64_t t = kvctl_now_ns();
    rp->be->get(rp->st, jb->sh, m, jb->res);
    uint64_t el = kvctl_now_ns() - t;
    jb->c.ld_ns += el;
    rp->lat_ld[ri] = el;
    jb->c.ld_shards += m;
    uint32_t run = 0;
    bool whole_run = true;
    for (uint32_t b = 0; b < hits; b++) {
        bool ok = true, broken = false;
        for (uint32_t s = 0; s < K; s++) {
            size_t i = (size_t)b * K + s;
            const uint8_t *v = jb->rbuf + i * vs;
            int rc = jb->res[i];
            if (rc == KV_OK && untouched(v))
                rc = KV_ENOTFOUND;
            if (rc == KV_OK) {
                jb->c.ld_bytes += vs;
                if (!verify(rp, &jb->ids[b], rp->t->hash[r->first + b], s, v)) {
                    jb->c.verr++;
                    ok = false;
                }
                continue;
            }
            ok = false;
            broken = true;
            if (rc == KV_ENOTFOUND)
                jb->c.ld_miss++;
            else
                first_error(&jb->c.ld_err, &jb->c.ld_first, rc, 1);
        }
        jb->c.broken += broken;
        if (ok && whole_run)
            run++;
        else
            whole_run = false;
    }
    return run;
}

/* Dumps blocks [from, n) of request r. */
static void dump(struct tjob *jb, const struct kvctl_trace_req *r, uint32_t from, size_t ri)
{
    struct replay *rp = jb->rp;
    const uint32_t K = rp->o->shards;
    const uint64_t vs = rp->o->value_size;
    size_t m = 0;
    for (uint32_t b = from; b < r->n; b++) {
        for (uint32_t s = 0; s < K; s++, m++) {
            uint8_t *h = jb->hdr + m * HDR;
            value_header(rp, &jb->ids[b], rp->t->hash[r->first + b], s, h);
            jb->wiov[2 * m] = (kv_iov){ h, HDR };
            jb->wiov[2 * m + 1] = (kv_iov){ rp->payload + HDR, vs - HDR };
            jb->sh[m] = (kv_shard){ .block = jb->ids[b], .index = s, .iov = &jb->wiov[2 * m],
                                    .iovcnt = vs > HDR ? 2 : 1 };
        }
    }
    uint64_t t = kvctl_now_ns();
    rp->be->put(rp->st, jb->sh, m, jb->res);
    uint64_t el = kvctl_now_ns() - t;
    jb->c.dp_ns += el;
    rp->lat_dp[ri] = el;
    jb->c.dp_shards += m;
    /* A cache may refuse a dump when it has no room that is not leased,
     * pinned or still being written back (KV_ENOSPC, DESIGN.md): the block
     * is then not cached, which costs hits, not correctness. */
    for (size_t i = 0; i < m; i++) {
        if (jb->res[i] == KV_OK)
            jb->c.dp_bytes += vs;
        else if (jb->res[i] == KV_ENOSPC)
            jb->c.dp_refused++;
        else
            first_error(&jb->c.dp_err, &jb->c.dp_first, jb->res[i], 1);
    }
}

static void replay_one(struct tjob *jb, size_t ri)
{
    struct replay *rp = jb->rp;
    const struct kvctl_trace_req *r = &rp->t->req[ri];
    if (rp->o->speed > 0) {
        uint64_t due = rp->t0 + (uint64_t)(r->ts_ms * 1e6 / rp->o->speed);
        struct timespec ts = { (time_t)(due / 1000000000u), (long)(due % 1000000000u) };
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    for (uint32_t b = 0; b < r->n; b++)
        jb->ids[b] = kvctl_object_id(rp->o->salt, rp->t->hash[r->first + b]);
    jb->c.refs += r->n;
    uint64_t t = kvctl_now_ns();
    ssize_t p = r->n ? lookup_prefix(jb, r->n) : -1;
    uint64_t el = kvctl_now_ns() - t;
    jb->c.lk_ns += el;
    rp->lat_lk[ri] = el;
    if (p < -1) {
        first_error(&jb->c.lk_err, &jb->c.lk_first, (int)p, 1);
        p = -1;                         /* the connector treats it as a miss */
    }
    if (p >= (ssize_t)r->n)
        p = (ssize_t)r->n - 1;
    uint32_t hits = (uint32_t)(p + 1), loaded = 0;
    jb->c.lookup_hits += hits;
    if (hits > 0)
        loaded = load(jb, r, hits, ri);
    rp->lat_req[ri] = kvctl_now_ns() - t;
    jb->c.hits += loaded;
    rp->req_hits[ri] = loaded;
    if (loaded < r->n)
        dump(jb, r, loaded, ri);
}

static void *job_main(void *arg)
{
    struct tjob *jb = arg;
    struct replay *rp = jb->rp;
    pthread_barrier_wait(&rp->go);
    for (;;) {
        uint64_t i = atomic_fetch_add(&rp->next, 1);
        if (i >= rp->t->nreq)
            break;
        replay_one(jb, (size_t)i);
        atomic_fetch_add_explicit(&rp->done, 1, memory_order_relaxed);
    }
    jb->end_ns = kvctl_now_ns();
    atomic_fetch_add(&rp->finished, 1);
    return NULL;
}

static void *alloc_touch(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n ? n : 1) != 0)
        return NULL;
    memset(p, 0, n ? n : 1);
    return p;
}

static void replay_free(struct replay *rp)
{
    for (unsigned i = 0; rp->job && i < rp->o->numjobs; i++) {
        struct tjob *jb = &rp->job[i];
        void *bufs[] = { jb->ids, jb->sh, jb->wiov, jb->riov, jb->hdr, jb->rbuf, jb->res };
        for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
            free(bufs[b]);
    }
    free(rp->job);
    free(rp->payload);
    free(rp->lat_req);
    free(rp->lat_lk);
    free(rp->lat_ld);
    free(rp->lat_dp);
}

static int replay_new(struct replay *rp)
{
    const struct kvctl_trace *t = rp->t;
    size_t nb = t->max_blocks ? t->max_blocks : 1, ns = nb * rp->o->shards;
    uint64_t vs = rp->o->value_size;
    if (ns > SIZE_MAX / vs / rp->o->numjobs) {
        fprintf(stderr, "kvctl bench: a request of %zu blocks x %u shards x %" PRIu64
                        " B cannot be buffered\n", nb, rp->o->shards, vs);
        return KV_ENOMEM;
    }
    size_t nr = t->nreq;
    rp->payload = alloc_touch(vs);
    rp->job = calloc(rp->o->numjobs, sizeof *rp->job);
    rp->lat_req = malloc(nr * sizeof *rp->lat_req);
    rp->lat_lk = malloc(nr * sizeof *rp->lat_lk);
    rp->lat_ld = malloc(nr * sizeof *rp->lat_ld);
    rp->lat_dp = malloc(nr * sizeof *rp->lat_dp);
    if (!rp->payload || !rp->job || !rp->lat_req || !rp->lat_lk || !rp->lat_ld || !rp->lat_dp)
        goto nomem;
    kvctl_fill_payload(rp->payload, vs, -1);
    for (size_t i = 0; i < nr; i++)
        rp->lat_req[i] = rp->lat_lk[i] = rp->lat_ld[i] = rp->lat_dp[i] = NONE;
    for (unsigned i = 0; i < rp->o->numjobs; i++) {
        struct tjob *jb = &rp->job[i];
        jb->rp = rp;
        jb->ids = calloc(nb, sizeof *jb->ids);
        jb->sh = calloc(ns, sizeof *jb->sh);
        jb->wiov = calloc(2 * ns, sizeof *jb->wiov);
        jb->riov = calloc(ns, sizeof *jb->riov);
        jb->hdr = alloc_touch(ns * HDR);
        jb->res = calloc(ns > nb ? ns : nb, sizeof *jb->res);  /* doubles as a hit mask */
        /* Faulted in now: first touch must not land in a timed load. */
        jb->rbuf = alloc_touch(ns * vs);
        if (!jb->ids || !jb->sh || !jb->wiov || !jb->riov || !jb->hdr || !jb->res || !jb->rbuf)
            goto nomem;
    }
    return KV_OK;
nomem:
    {
        char b[32];
        fprintf(stderr, "kvctl bench: cannot allocate the replay's buffers (%s of load "
                        "destinations per job, for the trace's longest request)\n",
                kvctl_fmt_size((uint64_t)ns * vs, b, sizeof b));
    }
    return KV_ENOMEM;
}

/* Percentiles of the samples of v that are not NONE, into p. */
static void latency(struct kvctl_phase *p, const uint64_t *v, size_t n)
{
    uint64_t *s = malloc((n ? n : 1) * sizeof *s);
    if (!s)
        return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] != NONE)
            s[k++] = v[i];
    kvctl_phase_latency(p, s, k);
    free(s);
}

/* Keeps the least DRAM per stored shard seen (what sizes the LRU model). */
static void note_shard_bytes(struct kvctl_trace_stats *ts, const struct kvctl_backend_info *in)
{
    if (!in->shards)
        return;
    double b = (double)in->dram_used / (double)in->shards;
    if (ts->shard_bytes == 0 || b < ts->shard_bytes)
        ts->shard_bytes = b;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int kvctl_trace_replay(const struct kvctl_trace *t, const struct kvctl_trace_opts *o,
                       const struct kvctl_backend *be, void *st, struct kvctl_run *run)
{
    struct kvctl_trace_stats *ts = &run->trace;
    struct replay rp = { .t = t, .o = o, .be = be, .st = st };
    ts->req_hits = calloc(t->nreq, sizeof *ts->req_hits);
    rp.req_hits = ts->req_hits;
    if (!ts->req_hits || replay_new(&rp) != KV_OK) {
        replay_free(&rp);
        return KV_ENOMEM;
    }
    struct kvctl_backend_info before = { 0 }, after = { 0 };
    be->info(st, &before);
    struct kvctl_progress prog;
    kvctl_progress_start(&prog, "trace", t->nreq, 0, 0);
    prog.unit = "requests";
    pthread_barrier_init(&rp.go, NULL, o->numjobs + 1);
    unsigned started = 0;
    for (; started < o->numjobs; started++)
        if (pthread_create(&rp.job[started].th, NULL, job_main, &rp.job[started]) != 0)
            break;
    if (started < o->numjobs) {
        fprintf(stderr, "kvctl: cannot start job threads\n");
        exit(KVCTL_EXIT_FAIL);
    }
    double cpu0 = cpu_now();
    rp.t0 = kvctl_now_ns();
    pthread_barrier_wait(&rp.go);
    ts->shard_bytes = 0;
    while (atomic_load(&rp.finished) < o->numjobs) {
        usleep(10000);
        kvctl_progress_tick(&prog, atomic_load_explicit(&rp.done, memory_order_relaxed));
        /* Every tick: the first ones see the tier before write-back starts.
         * Only a reading taken twice alike counts: bytes and shards are read
         * one after the other, and a store or an eviction between the two
         * (common on a loaded machine) gives a per-shard size that no shard
         * has. */
        if (o->tiers == KVCTL_TIERS_ENGINE) {
            struct kvctl_backend_info now, again;
            be->info(st, &now);
            be->info(st, &again);
            if (now.dram_used == again.dram_used && now.shards == again.shards)
                note_shard_bytes(ts, &now);
        }
    }
    for (unsigned i = 0; i < o->numjobs; i++)
        pthread_join(rp.job[i].th, NULL);
    kvctl_progress_end(&prog);
    pthread_barrier_destroy(&rp.go);
    double cpu = cpu_now() - cpu0;
    be->info(st, &after);

    uint64_t end = rp.t0;
    struct tcount c = { 0 };
    for (unsigned i = 0; i < o->numjobs; i++) {
        const struct tcount *j = &rp.job[i].c;
        if (rp.job[i].end_ns > end)
            end = rp.job[i].end_ns;
#define SUM(f) c.f += j->f
        SUM(refs); SUM(hits); SUM(lookup_hits); SUM(broken); SUM(verr);
        SUM(lk_ns); SUM(ld_ns); SUM(dp_ns); SUM(ld_shards); SUM(ld_bytes); SUM(ld_miss);
        SUM(dp_shards); SUM(dp_bytes); SUM(dp_refused);
#undef SUM
        if (j->lk_err && !c.lk_err)
            c.lk_first = j->lk_first;
        if (j->ld_err && !c.ld_err)
            c.ld_first = j->ld_first;
        if (j->dp_err && !c.dp_err)
            c.dp_first = j->dp_first;
        c.lk_err += j->lk_err;
        c.ld_err += j->ld_err;
        c.dp_err += j->dp_err;
    }
    /* A phase's seconds are the time its calls took, summed over the jobs
     * and divided by their number: with one job, exactly the time spent in
     * that kind of call; its rate is then what the jobs moved together. */
    double J = (double)o->numjobs;
    struct kvctl_phase *lk = &run->phases[0], *ld = &run->phases[1], *dp = &run->phases[2];
    *lk = (struct kvctl_phase){ .name = "lookup", .lookup = true, .ops = c.refs,
                                .misses = c.refs - c.lookup_hits, .errors = c.lk_err,
                                .first_error = c.lk_first, .seconds = (double)c.lk_ns / 1e9 / J };
    *ld = (struct kvctl_phase){ .name = "load", .ops = c.ld_shards, .bytes = c.ld_bytes,
                                .misses = c.ld_miss, .verify_failures = c.verr,
                                .errors = c.ld_err, .first_error = c.ld_first,
                                .seconds = (double)c.ld_ns / 1e9 / J };
    *dp = (struct kvctl_phase){ .name = "dump", .ops = c.dp_shards, .bytes = c.dp_bytes,
                                .errors = c.dp_err, .first_error = c.dp_first,
                                .seconds = (double)c.dp_ns / 1e9 / J };
    latency(lk, rp.lat_lk, t->nreq);
    latency(ld, rp.lat_ld, t->nreq);
    latency(dp, rp.lat_dp, t->nreq);
    run->nphases = 3;

    struct kvctl_phase req = { 0 };
    latency(&req, rp.lat_req, t->nreq);
    ts->on = true;
    ts->requests = t->nreq;
    ts->block_refs = c.refs;
    ts->hits = c.hits;
    ts->lookup_hits = c.lookup_hits;
    ts->broken_promises = c.broken;
    ts->verify_failures = c.verr;
    ts->dumps_refused = c.dp_refused;
    ts->seconds = (double)(end - rp.t0) / 1e9;
    ts->cpu_s = cpu;            /* the phases interleave: only the whole has one */
    ts->p50_us = req.p50_us;
    ts->p99_us = req.p99_us;
    double refs = c.refs ? (double)c.refs : NAN;
    ts->prefix_hit_ratio = (double)c.hits / refs;
    ts->hit_ratio_dram = ts->hit_ratio_ssd = NAN;
    if (o->tiers == KVCTL_TIERS_ENGINE) {
        ts->hit_ratio_dram = (double)(after.hits_dram - before.hits_dram) / o->shards / refs;
        ts->hit_ratio_ssd = (double)(after.hits_ssd - before.hits_ssd) / o->shards / refs;
    } else if (o->tiers == KVCTL_TIERS_FILES) {
        ts->hit_ratio_dram = 0;
        ts->hit_ratio_ssd = ts->prefix_hit_ratio;
    }
    ts->prompt_tokens = 0;
    ts->tokens_skipped = 0;
    for (size_t i = 0; i < t->nreq; i++) {
        uint64_t in = t->req[i].input_length, sk = (uint64_t)ts->req_hits[i] * KVCTL_BLOCK_TOKENS;
        ts->prompt_tokens += in;
        ts->tokens_skipped += sk < in ? sk : in;
    }
    ts->spill_drops = after.spill_drops - before.spill_drops;
    note_shard_bytes(ts, &after);
    replay_free(&rp);
    return KV_OK;
}
