/*
 * chaos_worker.c — the C worker of tests/chaos/host_chaos.py: one process
 * that opens the host store through the public API alone and runs a
 * random mix of dumps, loads, lookups and plain-key calls against it until
 * its driver says stop, checking every byte it reads.
 *
 *   chaos_worker --dir WORK --slot N --inc N --seed S --shape dram|ssd
 *                --shard BYTES --timeout-ms MS --slack-ms MS [--set K=V]...
 *
 * What it checks (each failure is one line "V <kind> <detail>" on stdout;
 * host_chaos.py reads the lines, this program only reports them):
 *   - every value read is the one written under its name and version
 *     (tests/chaos/README: the value format), and a load that fails leaves
 *     each destination either untouched or exactly right;
 *   - a block acknowledged by any worker (a line in WORK/journal) hits and
 *     loads byte for byte on the ssd shape (write-through), where nothing
 *     acknowledged may be lost; on the dram shape a miss is allowed;
 *   - an id never dumped never hits;
 *   - a plain key never reads older than its last acknowledged write, nor
 *     comes back after an acknowledged remove;
 *   - no call returns an error outside the documented set, and none takes
 *     longer than io.timeout_ms + the slack (a watchdog thread says so while
 *     the call is still blocked, with the call's name).
 *
 * Key design choice: every value is a function of its name and version
 * only, so that any process can verify any value without coordination,
 * and a byte from another value, another version or a torn copy is caught.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvengine.h"

#define SHARDS      2          /* store.block_shards: the driver sets it for everyone */
#define KEYS        48         /* plain keys this worker owns */
#define SENTINEL    0xE7
#define THREADS     2          /* threads calling the engine at once, each with its own state */

static const char *g_dir, *g_shape;
static unsigned g_slot, g_inc, g_timeout_ms, g_slack_ms;
static size_t g_shard;
static __thread uint64_t g_rng;
static __thread unsigned t_id;   /* this thread's number, 0..THREADS-1 */
static kv_engine *g_e;
static bool g_ssd;

/* ---- the value format (the same in host_chaos.py) ------------------------- */

static uint64_t fnv64(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Line i (32 bytes) of the value of name at version ver, len bytes long:
 * le64 fnv64(name), le64 ver, le64 i, le64 len; the value is its lines back
 * to back, cut at len. */
static void gen(const void *name, size_t nlen, uint64_t ver, uint8_t *out, size_t len)
{
    uint64_t h = fnv64(name, nlen), line[4] = { h, ver, 0, len };
    for (size_t off = 0, i = 0; off < len; off += 32, i++) {
        line[2] = i;
        size_t m = len - off < 32 ? len - off : 32;
        memcpy(out + off, line, m);
    }
}

/* 1 when buf is exactly the value of name at some version (*ver, read
 * from the value itself), 0 when not. */
static int verify(const void *name, size_t nlen, const uint8_t *buf, size_t len, uint64_t *ver)
{
    if (len < 16)
        return 0;
    uint64_t h, v;
    memcpy(&h, buf, 8);
    memcpy(&v, buf + 8, 8);
    if (h != fnv64(name, nlen))
        return 0;
    uint8_t *want = malloc(len);
    if (!want)
        abort();
    gen(name, nlen, v, want, len);
    int ok = memcmp(want, buf, len) == 0;
    free(want);
    *ver = v;
    return ok;
}

static bool all_sentinel(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != SENTINEL)
            return false;
    return true;
}

/* ---- reporting and the watchdog --------------------------------------------- */

static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&out_mu);
    if (fmt[0] == 'V' || fmt[0] == 'L' || fmt[0] == 'H') {   /* "V <wall clock> ...": host_chaos.py lines them up with its events */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        fprintf(stdout, "%c %ld.%03ld", fmt[0], (long)ts.tv_sec, ts.tv_nsec / 1000000);
        fmt++;
    }
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    fflush(stdout);
    pthread_mutex_unlock(&out_mu);
    va_end(ap);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Each thread's call in progress: its name and start, read by the watchdog. */
static _Atomic(const char *) cur_op[THREADS];
static _Atomic uint64_t cur_t0[THREADS], cur_seq[THREADS];

enum { OPS = 12 };
static const char *const op_names[OPS] = { "open", "dump", "wait_dump", "load", "wait_load",
                                           "lookup", "lookup_prefix", "put", "get", "exists",
                                           "remove", "many" };
static uint64_t op_count[THREADS][OPS], op_max_ms[THREADS][OPS];
static uint64_t err_count[THREADS][32];   /* by -rc - 100 */
static uint64_t partial_dests[THREADS];   /* destinations of loads that failed KV_ENET, written in part */

static void begin(int op)
{
    atomic_store(&cur_t0[t_id], now_ms());
    atomic_fetch_add(&cur_seq[t_id], 1);
    atomic_store(&cur_op[t_id], op_names[op]);
}

/* Every call past io.timeout_ms is reported (end time, name, ms, result):
 * host_chaos.py judges it against the server deaths it caused. kv_open
 * waits for a holder that is still opening (up to a minute): not timed. */
static void end(int op, int rc)
{
    uint64_t ms = now_ms() - atomic_load(&cur_t0[t_id]);
    atomic_store(&cur_op[t_id], NULL);
    op_count[t_id][op]++;
    if (ms > op_max_ms[t_id][op])
        op_max_ms[t_id][op] = ms;
    if (op != 0 && ms > g_timeout_ms)
        say("L %s %" PRIu64 " ms %s", op_names[op], ms, rc < 0 ? kv_err_name(rc) : "ok");
}

/* A call still blocked is reported every io.timeout_ms + slack ("H <wall
 * clock> <call> <ms so far>"): host_chaos.py judges it as a late call, so
 * that a call that never returns is seen too. */
static void *watchdog(void *arg)
{
    (void)arg;
    uint64_t told[THREADS] = { 0 }, times[THREADS] = { 0 }, step = g_timeout_ms + g_slack_ms;
    for (;;) {
        usleep(100000);
        for (int t = 0; t < THREADS; t++) {
            uint64_t seq = atomic_load(&cur_seq[t]), t0 = atomic_load(&cur_t0[t]);
            const char *op = atomic_load(&cur_op[t]);
            if (!op || strcmp(op, "open") == 0 || seq != atomic_load(&cur_seq[t]))
                continue;
            if (seq != told[t])
                told[t] = seq, times[t] = 0;
            uint64_t ms = now_ms() - t0;
            if (ms > (times[t] + 1) * step) {
                times[t] = ms / step;
                say("H %s %" PRIu64, op, ms);
            }
        }
    }
    return NULL;
}

/* A result outside what the call may return under chaos is a finding. */
static void note_rc(const char *what, int rc, bool miss_ok)
{
    if (rc >= 0)
        return;
    if (-rc >= 100 && -rc < 132)
        err_count[t_id][-rc - 100]++;
    if (rc == KV_ENET || rc == KV_ETIMEDOUT || rc == KV_ENOSPC || rc == KV_EBUSY ||
        (miss_ok && rc == KV_ENOTFOUND))
        return;
    say("V error %s returned %s (%d)", what, kv_err_name(rc), rc);
}

/* ---- randomness ------------------------------------------------------------- */

static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static unsigned rndn(unsigned n) { return (unsigned)(rnd() % n); }

/* ---- block ids and the journal of acknowledged dumps -------------------------- */

/* "CHAO", u16 slot, u16 incarnation, u64 sequence. Slot 0xffff is never a
 * worker's: its ids are never dumped (phantoms). */
static kv_block_id make_id(unsigned slot, unsigned inc, uint64_t seq)
{
    kv_block_id id;
    memcpy(id.bytes, "CHAO", 4);
    id.bytes[4] = (uint8_t)slot;
    id.bytes[5] = (uint8_t)(slot >> 8);
    id.bytes[6] = (uint8_t)inc;
    id.bytes[7] = (uint8_t)(inc >> 8);
    memcpy(id.bytes + 8, &seq, 8);
    return id;
}

static void shard_name(const kv_block_id *id, uint32_t index, uint8_t name[20])
{
    memcpy(name, id->bytes, 16);
    memcpy(name + 16, &index, 4);
}

static int journal_fd = -1;
static __thread kv_block_id *acked;
static __thread size_t nacked, acked_cap;
static __thread uint64_t last_scan_ms;

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static int unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

static void journal_ack(const kv_block_id *id)
{
    char line[64];
    hex(id->bytes, 16, line + 2);
    line[0] = 'B';
    line[1] = ' ';
    line[34] = '\n';
    if (write(journal_fd, line, 35) != 35)
        say("V journal write failed: %s", strerror(errno));
}

/* Every block any worker acknowledged, from the journals (complete lines
 * only: a writer killed mid-line left a torn one). */
static void journal_scan(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/journal", g_dir);
    DIR *d = opendir(path);
    if (!d)
        return;
    nacked = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        char line[128];
        while (fgets(line, sizeof line, f)) {
            if (line[0] != 'B' || strlen(line) != 35 || line[34] != '\n')
                continue;
            kv_block_id id;
            if (unhex(line + 2, id.bytes, 16) != 0)
                continue;
            if (nacked == acked_cap) {
                acked_cap = acked_cap ? 2 * acked_cap : 4096;
                acked = realloc(acked, acked_cap * sizeof *acked);
                if (!acked)
                    abort();
            }
            acked[nacked++] = id;
        }
        fclose(f);
    }
    closedir(d);
    last_scan_ms = now_ms();
}

static bool pick_acked(kv_block_id *id)
{
    if (now_ms() - last_scan_ms > 1000)
        journal_scan();
    if (!nacked)
        return false;
    /* Half the time one of the most recent (most likely still in DRAM). */
    size_t i = rndn(2) ? rnd() % nacked : nacked - 1 - rnd() % (nacked < 64 ? nacked : 64);
    *id = acked[i];
    return true;
}

/* ---- buffers ------------------------------------------------------------------ */

/* A few kv_buffer_alloc buffers (memory the server maps too) and plain
 * ones; a call uses either. */
static __thread uint8_t *shared_buf[2 * SHARDS];
static __thread uint8_t *plain_buf[2 * SHARDS];

static uint8_t *buf_for(int i, bool shared)
{
    return shared && shared_buf[i] ? shared_buf[i] : plain_buf[i];
}

/* ---- the operations ----------------------------------------------------------- */

static __thread uint64_t next_seq;

static void op_dump(void)
{
    /* the thread in the top byte: ids unique across this worker's threads */
    kv_block_id id = make_id(g_slot, g_inc, ((uint64_t)t_id << 56) | ++next_seq);
    bool shared = rndn(2);
    kv_iov iov[SHARDS][2];
    kv_shard sh[SHARDS];
    for (uint32_t x = 0; x < SHARDS; x++) {
        uint8_t name[20], *b = buf_for((int)x, shared);
        shard_name(&id, x, name);
        gen(name, sizeof name, 0, b, g_shard);
        /* One iovec (a shared buffer is used in place then) or two. */
        if (rndn(2)) {
            iov[x][0] = (kv_iov){ b, g_shard };
            sh[x] = (kv_shard){ id, x, iov[x], 1 };
        } else {
            iov[x][0] = (kv_iov){ b, g_shard / 2 };
            iov[x][1] = (kv_iov){ b + g_shard / 2, g_shard - g_shard / 2 };
            sh[x] = (kv_shard){ id, x, iov[x], 2 };
        }
    }
    kv_task t;
    begin(1);
    int rc = kv_dump(g_e, sh, SHARDS, &t);
    end(1, rc);
    note_rc("kv_dump", rc, false);
    if (rc != KV_OK)
        return;
    begin(2);
    rc = kv_wait(g_e, t, g_timeout_ms * 2);
    end(2, rc);
    note_rc("kv_wait(dump)", rc, false);
    if (rc == KV_OK)
        journal_ack(&id);
}

static void op_load(void)
{
    kv_block_id id;
    if (!pick_acked(&id))
        return;
    bool shared = rndn(2);
    kv_iov iov[SHARDS];
    kv_shard sh[SHARDS];
    uint32_t first = rndn(SHARDS);   /* sometimes one shard, sometimes both */
    size_t n = rndn(2) ? SHARDS : 1;
    for (size_t x = 0; x < n; x++) {
        uint8_t *b = buf_for((int)(SHARDS + x), shared);
        memset(b, SENTINEL, g_shard);
        iov[x] = (kv_iov){ b, g_shard };
        sh[x] = (kv_shard){ id, (uint32_t)((first + x) % SHARDS), &iov[x], 1 };
    }
    kv_task t;
    begin(3);
    int rc = kv_load(g_e, sh, n, &t);
    end(3, rc);
    note_rc("kv_load", rc, false);
    if (rc != KV_OK)
        return;
    begin(4);
    rc = kv_wait(g_e, t, g_timeout_ms * 2);
    end(4, rc);
    note_rc("kv_wait(load)", rc, true);
    char idhex[33];
    hex(id.bytes, 16, idhex);
    for (size_t x = 0; x < n; x++) {
        uint8_t name[20], *b = iov[x].base;
        shard_name(&id, sh[x].index, name);
        uint64_t ver = 0;
        bool right = verify(name, sizeof name, b, g_shard, &ver) && ver == 0;
        bool untouched = all_sentinel(b, g_shard);
        if (rc == KV_OK && !right)
            say("V wrong-bytes load of %s shard %u succeeded with other bytes%s", idhex,
                sh[x].index, untouched ? " (untouched)" : "");
        else if ((rc == KV_ENET || rc == KV_ETIMEDOUT) && !right && !untouched)
            partial_dests[t_id]++;   /* a load cut off by its server's death: bytes unspecified */
        else if (rc != KV_OK && !right && !untouched)
            say("V torn-dest load of %s shard %u failed (%s) and left a destination neither "
                "untouched nor right", idhex, sh[x].index, kv_err_name(rc));
        else if (rc == KV_ENOTFOUND && n == 1 && !untouched)
            /* kv_load: "a missing shard ... leaves that shard's destination
             * untouched" (one shard: it is the missing one) */
            say("V touched-dest load of %s shard %u missed (KV_ENOTFOUND) and wrote its "
                "destination (%s bytes)", idhex, sh[x].index, right ? "the right" : "other");
    }
    if (rc == KV_ENOTFOUND && g_ssd)
        say("V lost load of acknowledged block %s missed on the ssd shape", idhex);
}

static void op_lookup(bool prefix)
{
    kv_block_id ids[6];
    size_t n = 0;
    for (int i = 0; i < 5; i++)
        if (pick_acked(&ids[n]))
            n++;
    size_t phantom = n;
    ids[n++] = make_id(0xffff, g_inc, rnd());
    if (prefix) {
        begin(6);
        ssize_t r = kv_lookup_prefix(g_e, ids, n);
        end(6, r < -1 ? (int)r : 0);
        if (r < -1)
            note_rc("kv_lookup_prefix", (int)r, false);
        else if (r >= (ssize_t)phantom)
            say("V phantom lookup_prefix ran through an id never dumped (%zd of %zu)", r, n);
        else if (g_ssd && phantom > 0 && r < (ssize_t)phantom - 1)
            say("V lost lookup_prefix %zd of %zu acknowledged blocks on the ssd shape", r + 1,
                phantom);
        return;
    }
    uint8_t hit[6];
    begin(5);
    int rc = kv_lookup(g_e, ids, n, hit);
    end(5, rc);
    note_rc("kv_lookup", rc, false);
    if (rc != KV_OK)
        return;
    if (hit[phantom])
        say("V phantom lookup hit an id never dumped");
    for (size_t i = 0; g_ssd && i < phantom; i++)
        if (!hit[i]) {
            char idhex[33];
            hex(ids[i].bytes, 16, idhex);
            say("V lost lookup missed acknowledged block %s on the ssd shape", idhex);
        }
}

/* Plain keys: this worker's own, with what it knows of each. */
struct key_state {
    uint64_t acked;        /* last acknowledged put's version (0: none) */
    uint64_t attempted;    /* highest version a put was tried with */
    uint64_t removed_at;   /* the acked version an acknowledged remove removed, or 0 */
    bool removed;
};
static __thread struct key_state keys[KEYS];
static __thread uint64_t next_ver = 1;

static size_t key_name(unsigned k, char *out)
{
    return (size_t)sprintf(out, "c%ui%ut%uk%u", g_slot, g_inc, t_id, k);
}

static void check_got(unsigned k, const char *kname, size_t klen, const uint8_t *v, size_t vlen,
                      const char *how)
{
    uint64_t ver = 0;
    if (!verify(kname, klen, v, vlen, &ver)) {
        say("V wrong-bytes %s of %s returned bytes that are no version of it", how, kname);
        return;
    }
    struct key_state *s = &keys[k];
    if (ver > s->attempted)
        say("V wrong-bytes %s of %s returned version %" PRIu64 " never written", how, kname, ver);
    else if (s->removed && ver <= s->removed_at)
        say("V resurrected %s of %s returned version %" PRIu64 " after an acknowledged remove "
            "of version %" PRIu64, how, kname, ver, s->removed_at);
    else if (!s->removed && ver < s->acked)
        say("V stale %s of %s returned version %" PRIu64 " after version %" PRIu64
            " was acknowledged", how, kname, ver, s->acked);
}

static void op_key(void)
{
    unsigned k = rndn(KEYS);
    char kname[64];
    size_t klen = key_name(k, kname);
    struct key_state *s = &keys[k];
    unsigned what = rndn(10);
    if (what < 4) {
        size_t len = 32 + rndn(24 * 1024);
        uint8_t *v = malloc(len);
        uint64_t ver = next_ver++;
        gen(kname, klen, ver, v, len);
        s->attempted = ver;
        begin(7);
        int rc = kv_put(g_e, kname, klen, v, len);
        end(7, rc);
        note_rc("kv_put", rc, false);
        if (rc == KV_OK) {
            s->acked = ver;
            s->removed = false;
        }
        free(v);
    } else if (what < 8) {
        size_t cap = 32 * 1024, vlen = 0;
        uint8_t *v = malloc(cap);
        begin(8);
        int rc = kv_get(g_e, kname, klen, v, cap, &vlen);
        end(8, rc);
        note_rc("kv_get", rc, true);
        if (rc == KV_OK)
            check_got(k, kname, klen, v, vlen, "get");
        free(v);
    } else if (what < 9) {
        begin(9);
        int rc = kv_exists(g_e, kname, klen);
        end(9, rc);
        note_rc("kv_exists", rc, false);
    } else {
        begin(10);
        int rc = kv_remove(g_e, kname, klen);
        end(10, rc);
        note_rc("kv_remove", rc, true);
        if (rc == KV_OK || rc == KV_ENOTFOUND) {
            /* Gone: any version up to the last one tried. */
            s->removed = true;
            s->removed_at = s->attempted;
        }
    }
}

static void op_many(void)
{
    enum { M = 8 };
    kv_pair items[M];
    unsigned ks[M];
    char names[M][64];
    uint8_t *vals[M];
    int res[M];
    bool put = rndn(2);
    for (int i = 0; i < M; i++) {
        ks[i] = rndn(KEYS);
        for (int j = 0; j < i; j++)
            if (ks[j] == ks[i])
                ks[i] = (ks[i] + 1) % KEYS, j = -1;   /* distinct keys in one call */
        size_t klen = key_name(ks[i], names[i]);
        size_t len = put ? 32 + rndn(4096) : 32 * 1024;
        vals[i] = malloc(len);
        if (put) {
            uint64_t ver = next_ver++;
            gen(names[i], klen, ver, vals[i], len);
            keys[ks[i]].attempted = ver;
            items[i] = (kv_pair){ names[i], klen, vals[i], len };
        } else {
            items[i] = (kv_pair){ names[i], klen, vals[i], len };
        }
    }
    begin(11);
    int rc = put ? kv_put_many(g_e, items, M, res) : kv_get_many(g_e, items, M, res);
    end(11, rc);
    note_rc(put ? "kv_put_many" : "kv_get_many", rc, false);
    for (int i = 0; i < M; i++) {
        if (rc == KV_OK) {
            note_rc(put ? "kv_put_many item" : "kv_get_many item", res[i], !put);
            if (put && res[i] == KV_OK) {
                uint64_t ver;
                memcpy(&ver, vals[i] + 8, 8);
                keys[ks[i]].acked = ver;
                keys[ks[i]].removed = false;
            } else if (!put && res[i] == KV_OK) {
                check_got(ks[i], names[i], strlen(names[i]), vals[i], items[i].len, "get_many");
            }
        }
        free(vals[i]);
    }
}

static void summary(const char *why)
{
    char line[2048];
    int o = snprintf(line, sizeof line, "S %s", why);
    /* Sums over the threads, read while they run: a figure for the report. */
    uint64_t pd = 0;
    for (int t = 0; t < THREADS; t++)
        pd += partial_dests[t];
    for (int i = 0; i < OPS; i++) {
        uint64_t n = 0, mx = 0;
        for (int t = 0; t < THREADS; t++) {
            n += op_count[t][i];
            mx = op_max_ms[t][i] > mx ? op_max_ms[t][i] : mx;
        }
        o += snprintf(line + o, sizeof line - (size_t)o, " %s=%" PRIu64 "/%" PRIu64 "ms",
                      op_names[i], n, mx);
    }
    if (pd)
        o += snprintf(line + o, sizeof line - (size_t)o, " partial_dest=%" PRIu64, pd);
    for (int i = 0; i < 32; i++) {
        uint64_t n = 0;
        for (int t = 0; t < THREADS; t++)
            n += err_count[t][i];
        if (n)
            o += snprintf(line + o, sizeof line - (size_t)o, " %s=%" PRIu64,
                          kv_err_name(-100 - i), n);
    }
    say("%s", line);
}

/* Open descriptors of this process. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 3;   /* ".", "..", and the one opendir holds */
}

static bool exists_file(const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return access(p, F_OK) == 0;
}

struct thread_arg {
    unsigned id;
    uint64_t seed;
};

/* One thread's loop of calls, with its own buffers, ids, keys and dice,
 * until the driver says quiesce. */
static void *op_thread(void *arg)
{
    struct thread_arg *ta = arg;
    t_id = ta->id;
    g_rng = ta->seed;
    free(ta);
    for (int i = 0; i < 2 * SHARDS; i++) {
        plain_buf[i] = malloc(g_shard);
        void *p = NULL;
        if (kv_buffer_alloc(g_e, g_shard, &p) == KV_OK)
            shared_buf[i] = p;
    }
    while (!exists_file("quiesce")) {
        unsigned r = rndn(100);
        if (r < 28)
            op_dump();
        else if (r < 58)
            op_load();
        else if (r < 66)
            op_lookup(false);
        else if (r < 70)
            op_lookup(true);
        else if (r < 95)
            op_key();
        else
            op_many();
    }
    for (int i = 0; i < 2 * SHARDS; i++) {
        if (shared_buf[i])
            kv_buffer_free(g_e, shared_buf[i]);
        free(plain_buf[i]);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "dir", 1, 0, 'd' }, { "slot", 1, 0, 'n' }, { "inc", 1, 0, 'i' },
        { "seed", 1, 0, 'r' }, { "shape", 1, 0, 'p' }, { "shard", 1, 0, 'b' },
        { "timeout-ms", 1, 0, 't' }, { "slack-ms", 1, 0, 'k' }, { "set", 1, 0, 's' },
        { 0, 0, 0, 0 } };
    kv_config *cfg;
    if (kv_config_new(&cfg) != KV_OK)
        return 2;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd': g_dir = optarg; break;
        case 'n': g_slot = (unsigned)atoi(optarg); break;
        case 'i': g_inc = (unsigned)atoi(optarg); break;
        case 'r': g_rng = strtoull(optarg, NULL, 0); break;
        case 'p': g_shape = optarg; break;
        case 'b': g_shard = (size_t)strtoull(optarg, NULL, 0); break;
        case 't': g_timeout_ms = (unsigned)atoi(optarg); break;
        case 'k': g_slack_ms = (unsigned)atoi(optarg); break;
        case 's': {
            char *eq = strchr(optarg, '=');
            if (!eq)
                return 2;
            *eq = '\0';
            int rc = kv_config_set(cfg, optarg, eq + 1);
            if (rc != KV_OK) {
                fprintf(stderr, "chaos_worker: --set %s: %s\n", optarg, kv_strerror(rc));
                return 2;
            }
            break;
        }
        default:
            fprintf(stderr, "usage: chaos_worker --dir WORK --slot N --inc N --seed S "
                            "--shape dram|ssd --shard BYTES --timeout-ms MS --slack-ms MS "
                            "[--set KEY=VALUE]...\n");
            return 2;
        }
    }
    if (!g_dir || !g_shape || g_shard < 64)
        return 2;
    g_ssd = strcmp(g_shape, "ssd") == 0;
    char jpath[4096];
    snprintf(jpath, sizeof jpath, "%s/journal/c%u-%u.j", g_dir, g_slot, g_inc);
    journal_fd = open(jpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (journal_fd < 0)
        return 2;
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    /* UCM's stores and Mooncake's dummy clients keep asking while the
     * store's holder is still opening it (EBUSY): so does this one. */
    int rc;
    uint64_t t0 = now_ms();
    for (;;) {
        begin(0);
        rc = kv_open(cfg, &g_e);
        end(0, rc);
        if (rc != KV_EBUSY || now_ms() - t0 > 60000)
            break;
        usleep(200000);
    }
    kv_config_free(cfg);
    if (rc != KV_OK) {
        say("V error kv_open returned %s", kv_err_name(rc));
        return 1;
    }
    say("R ready pid %ld", (long)getpid());
    uint64_t seed = g_rng;
    pthread_t th[THREADS];
    for (unsigned t = 1; t < THREADS; t++) {
        struct thread_arg *ta = malloc(sizeof *ta);
        *ta = (struct thread_arg){ t, seed + t * 0x9e3779b97f4a7c15ull };
        pthread_create(&th[t], NULL, op_thread, ta);
    }
    int fds0 = -1;
    kv_stats st;
    uint64_t told = now_ms();
    struct thread_arg *ta0 = malloc(sizeof *ta0);
    *ta0 = (struct thread_arg){ 0, seed };
    void *res = NULL;
    pthread_create(&th[0], NULL, op_thread, ta0);
    /* This one says how things go every 2 s. */
    while (!exists_file("quiesce")) {
        usleep(50000);
        if (now_ms() - told > 2000) {
            told = now_ms();
            summary("so-far");
            /* Its descriptors once its connections are made (the first
             * summary), against the same at the end: a client that
             * reconnects again and again must not pile them up. */
            if (fds0 < 0 && kv_stats_get(g_e, &st) == KV_OK && st.host_attached)
                fds0 = count_fds();
        }
    }
    for (unsigned t = 0; t < THREADS; t++)
        pthread_join(th[t], &res);
    summary("quiesced");
    if (kv_stats_get(g_e, &st) == KV_OK && st.host_attached && fds0 >= 0)
        say("F %d %d", fds0, count_fds());
    /* The process serving the store stays until the driver has looked at
     * it (WORK/finish); the others close and go. */
    if (kv_stats_get(g_e, &st) == KV_OK && !st.host_attached) {
        say("R serving pid %ld", (long)getpid());
        while (!exists_file("finish"))
            usleep(20000);
    }
    kv_close(g_e);
    say("R closed");
    return 0;
}
