/*
 * fuzz_vlog.c — libFuzzer harness for the SSD tier's value-log record
 * reader and its open-time recovery, through the public API.
 *
 * Each input is the contents of a value-log file. It is written as
 * ssd.path/vlog/00000001.vlog of a fresh store that has no RocksDB files,
 * so kv_open (pipeline ssd) must rebuild the index from the log alone
 * (persist/ssd.c, open_db; persist/vlog.c, kv__vlog_settle). Then:
 *   - what the tier lists (kv_ssd_scan) must be exactly the keys of the
 *     intact live records this harness finds with its own reading of the
 *     format (rec_walk below, written from vlog.c's header comment), each
 *     with the value of its newest copy (highest stamp);
 *   - every listed value loads (kv_load for blocks, the local load for
 *     plain keys, whose names the log does not hold) with those bytes, and
 *     a scrub finds nothing bad;
 *   - a second open (now with RocksDB's index) lists the same entries.
 *
 * Key design choice: a checksum- and MAC-aware mutator. Every record
 * carries an XXH3 checksum of its value and a MAC of its header (HMAC-SHA256
 * under the file's key, which the file header holds, over the header, the
 * file's number and the record's offset), so nearly every random mutation
 * would only produce a record the store must not believe.
 * LLVMFuzzerCustomMutator lets libFuzzer mutate, then rewrites the file
 * header (magic, version, number 1, checksum), walks the records the way
 * the open scan does and recomputes each checksum (decompressing lz4 values
 * first) and MAC, so mutations of lengths, flags, keys, stamps and values
 * reach the code behind them. Set KV_FUZZ_VLOG_RAW=1 to fuzz without it
 * (then forged and torn records are the point: none may be believed).
 *
 * The format followed here (vlog.c's header comment): an 80-byte file
 * header — 0 magic "KVLF", 4 version 1, 8 store id (16 bytes), 24 the
 * file's number, 32 its key (32 bytes), 64 XXH3-64 of bytes 0..63 — then
 * records: a 64-byte header — 0 magic "KVV3", 4 value length u32, 8 stored
 * length u32, 12 flags u8 (bit 0 lz4), 13 the 21-byte key (ns, id, shard
 * index), 34 a 48-bit write stamp, 40 XXH3-64 of the value seeded with XXH3
 * of header bytes 4..39, 48 the first 8 bytes of HMAC-SHA256(file key,
 * header bytes 4..47 | u32 file number | u64 offset), 56 zero — then the
 * stored bytes. "KVX3" is a killed record (stepped over whole). A record of
 * 32 KiB or more (header included) starts and ends on a 4 KiB boundary,
 * smaller ones on 16 bytes. A file whose header does not read makes a store
 * that has nothing else unopenable (an earlier kvengine's, for all it
 * knows): kv_open must refuse it. Keep rec_parse, fix_sums and the file
 * header in step with vlog.c when the format changes.
 */
#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/engine.h"
#include "engine/internal.h"
#include "fuzzutil.h"

#define FHDR 80
#define HDR 64
#define KEY_LEN 21
#define MAGIC_FILE 0x464c564bu
#define MAGIC_V3 0x3356564bu
#define DEAD_V3 0x3358564bu
#define BIG_REC (32u << 10)
#define MAX_FOUND 4096

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

/* ---- the record format, as vlog.c documents it ---------------------------- */

struct rec {
    int dead;
    uint32_t flags, len, slen;
    uint64_t stamp, seed;
    const uint8_t *key;
};

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

static uint64_t span_of(uint32_t slen)
{
    uint64_t raw = HDR + (uint64_t)slen;
    return align_up(raw, raw >= BIG_REC ? 4096 : 16);
}

/* Whether h holds a consistent header (live or killed); its MAC aside. */
static int rec_parse(const uint8_t *h, struct rec *r)
{
    uint32_t magic = kv__get32(h);
    memset(r, 0, sizeof *r);
    if (magic != MAGIC_V3 && magic != DEAD_V3)
        return 0;
    r->dead = magic == DEAD_V3;
    r->len = kv__get32(h + 4);
    r->slen = kv__get32(h + 8);
    r->flags = h[12];
    r->key = h + 13;
    for (int i = 0; i < 6; i++)
        r->stamp |= (uint64_t)h[34 + i] << (8 * i);
    r->seed = XXH3_64bits(h + 4, 36);
    if ((r->flags & ~1u) || r->len > KV_VALUE_MAX || r->key[0] >= KV_NS_COUNT ||
        kv__get64(h + 56) != 0)
        return 0;
    return r->flags & 1 ? r->slen < r->len : r->slen == r->len;
}

/* The file header of buf: whether it reads (file number 1); *key its key. */
static int file_ok(const uint8_t *buf, size_t size, const uint8_t **key)
{
    if (size < FHDR || kv__get32(buf) != MAGIC_FILE || kv__get32(buf + 4) != 1 ||
        kv__get32(buf + 24) != 1 || kv__get64(buf + 64) != XXH3_64bits(buf, 64))
        return 0;
    *key = buf + 32;
    return 1;
}

/* The MAC of the header at off under the file key. */
static uint64_t rec_mac(const uint8_t *fkey, const uint8_t *h, uint64_t off)
{
    uint8_t msg[56], out[EVP_MAX_MD_SIZE];
    unsigned olen = 0;
    memcpy(msg, h + 4, 44);
    kv__put32(msg + 44, 1);
    kv__put64(msg + 48, off);
    FZ_CHECK(HMAC(EVP_sha256(), fkey, 32, msg, sizeof msg, out, &olen) && olen >= 8);
    return kv__get64(out);
}

/* The value of r whose stored bytes are at p: malloc'd (len bytes, at
 * least 1), or NULL when lz4 bytes do not decompress to len. */
static uint8_t *rec_value(const struct rec *r, const uint8_t *p)
{
    if ((r->flags & 1) && ((uint64_t)r->len > (uint64_t)r->slen * 255 + 16 ||
                           r->len > (uint32_t)LZ4_MAX_INPUT_SIZE))
        return NULL;
    uint8_t *v = malloc(r->len ? r->len : 1);
    FZ_CHECK(v);
    if (!(r->flags & 1)) {
        memcpy(v, p, r->len);
        return v;
    }
    if (LZ4_decompress_safe((const char *)p, (char *)v, (int)r->slen, (int)r->len) !=
        (int)r->len) {
        free(v);
        return NULL;
    }
    return v;
}

/* Calls fn for every record the open scan would look at in buf[0..size):
 * 16-aligned candidates past the file header whose first word is not zero;
 * a consistent header whose MAC verifies (or, with fix, any consistent
 * header: the mutator is about to make its MAC right) is a record, stepped
 * over whole (killed ones, and those whose stored bytes do not fit, are not
 * offered to fn); anything else moves on 16 bytes. */
static void rec_walk(uint8_t *buf, size_t size, const uint8_t *fkey, int fix,
                     void (*fn)(void *ctx, uint8_t *at, const struct rec *r), void *ctx)
{
    uint64_t pos = FHDR;
    while (pos + HDR <= size) {
        struct rec r;
        if (kv__get32(buf + pos) == 0 || !rec_parse(buf + pos, &r)) {
            pos += 16;
            continue;
        }
        if (!fix && kv__get64(buf + pos + 48) != rec_mac(fkey, buf + pos, pos)) {
            pos += 16;
            continue;
        }
        if (!r.dead && pos + HDR + r.slen <= size)
            fn(ctx, buf + pos, &r);
        if (fix)   /* over the checksum fn wrote */
            kv__put64(buf + pos + 48, rec_mac(fkey, buf + pos, pos));
        pos += span_of(r.slen);
    }
}

/* ---- the checksum-aware mutator ------------------------------------------- */

static void fix_one(void *ctx, uint8_t *at, const struct rec *r)
{
    (void)ctx;
    uint8_t *v = rec_value(r, at + HDR);
    if (!v)
        return;   /* lz4 that does not decompress stays torn */
    kv__put64(at + 40, XXH3_64bits_withSeed(v, r->len, r->seed));
    free(v);
}

/* Makes the file header read (number 1) and every record's sums right. */
static void fix_sums(uint8_t *data, size_t size)
{
    if (size < FHDR)
        return;
    kv__put32(data, MAGIC_FILE);
    kv__put32(data + 4, 1);
    kv__put32(data + 24, 1);
    kv__put32(data + 28, 0);
    kv__put64(data + 64, XXH3_64bits(data, 64));
    kv__put64(data + 72, 0);
    rec_walk(data, size, data + 32, 1, fix_one, NULL);
}

static int raw_mode(void)
{
    const char *s = getenv("KV_FUZZ_VLOG_RAW");
    return s && *s && strcmp(s, "0") != 0;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    (void)seed;
    size = LLVMFuzzerMutate(data, size, max_size);
    if (!raw_mode())
        fix_sums(data, size);
    return size;
}

/* ---- what the log holds, by this harness's reading ------------------------ */

struct found {
    uint8_t key[KEY_LEN];
    uint64_t stamp;
    uint8_t *val;
    uint32_t len;
    int newest;     /* 1: the only copy with its key's highest stamp;
                       2: that stamp is shared (either may win) */
};

struct expect {
    struct found f[MAX_FOUND];
    size_t n;
    int overflow;
};

static void take(void *ctx, uint8_t *at, const struct rec *r)
{
    struct expect *x = ctx;
    uint8_t *v = rec_value(r, at + HDR);
    if (!v || XXH3_64bits_withSeed(v, r->len, r->seed) != kv__get64(at + 40)) {
        free(v);
        return;
    }
    if (x->n == MAX_FOUND) {
        x->overflow = 1;
        free(v);
        return;
    }
    struct found *f = &x->f[x->n++];
    memcpy(f->key, r->key, KEY_LEN);
    f->stamp = r->stamp;
    f->val = v;
    f->len = r->len;
}

/* Marks each key's newest copies. */
static void mark_newest(struct expect *x)
{
    for (size_t i = 0; i < x->n; i++) {
        int best = 1;
        size_t ties = 0;
        for (size_t j = 0; j < x->n; j++) {
            if (memcmp(x->f[i].key, x->f[j].key, KEY_LEN) != 0)
                continue;
            if (x->f[j].stamp > x->f[i].stamp)
                best = 0;
            else if (j != i && x->f[j].stamp == x->f[i].stamp)
                ties++;
        }
        x->f[i].newest = best ? (ties ? 2 : 1) : 0;
    }
}

/* ---- the store ------------------------------------------------------------ */

struct listed {
    kv_ssd_entry e[MAX_FOUND];
    size_t n;
};

static int list_cb(void *ctx, const kv_ssd_entry *ent)
{
    struct listed *l = ctx;
    FZ_CHECK(l->n < MAX_FOUND);
    l->e[l->n++] = *ent;
    return 0;
}

static void key_of(const kv_ssd_entry *e, uint8_t *k)
{
    k[0] = (uint8_t)e->ns;
    memcpy(k + 1, e->id.bytes, KV_BLOCK_ID_LEN);
    k[17] = (uint8_t)(e->index >> 24);
    k[18] = (uint8_t)(e->index >> 16);
    k[19] = (uint8_t)(e->index >> 8);
    k[20] = (uint8_t)e->index;
}

/* The store at path, or NULL when the open is refused (only allowed where
 * must is 0). */
static kv_engine *open_store(const char *path, int must)
{
    kv_config *cfg;
    kv_engine *e = NULL;
    FZ_CHECK(kv_config_new(&cfg) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "pipeline", "ssd") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "ssd.path", path) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "ssd.capacity", "4GiB") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "io.threads", "1") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "log.level", "error") == KV_OK);
    int rc = kv_open(cfg, &e);
    kv_config_free(cfg);
    if (rc != KV_OK && must)
        fprintf(stderr, "fuzz_vlog: kv_open of a store with only a value log: %s\n",
                kv_strerror(rc));
    FZ_CHECK(must ? rc == KV_OK && e : (rc == KV_OK) == (e != NULL));
    return e;
}

static int load(kv_engine *e, const kv_ssd_entry *ent, uint8_t *buf)
{
    kv_iov v = { buf, ent->size };
    if (ent->ns == KV_SSD_NS_KEY)
        return kv__local_load(e, KV_NS_KEY, &ent->id, ent->index, &v, 1);
    kv_shard sh = { .block = ent->id, .index = ent->index, .iov = &v, .iovcnt = 1 };
    kv_task t;
    int rc = kv_load(e, &sh, 1, &t);
    return rc == KV_OK ? kv_wait(e, t, 0) : rc;
}

static int cmp_entry(const void *a, const void *b)
{
    uint8_t ka[KEY_LEN], kb[KEY_LEN];
    key_of(a, ka);
    key_of(b, kb);
    return memcmp(ka, kb, KEY_LEN);
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FZ_CHECK(fd >= 0);
    FZ_CHECK(size == 0 || write(fd, data, size) == (ssize_t)size);
    close(fd);
}

/* Reopened, with RocksDB's index this time: the entries of l1 again. */
static void reopen_same(const char *ssd, struct listed *l1)
{
    static struct listed l2;
    kv_engine *e = open_store(ssd, 1);
    l2.n = 0;
    FZ_CHECK(kv_ssd_scan(e, list_cb, &l2) == KV_OK);
    kv_close(e);
    if (l2.n != l1->n)
        fprintf(stderr, "fuzz_vlog: %zu entries after the rebuild, %zu after a reopen\n",
                l1->n, l2.n);
    FZ_CHECK(l2.n == l1->n);
    qsort(l1->e, l1->n, sizeof l1->e[0], cmp_entry);
    qsort(l2.e, l2.n, sizeof l2.e[0], cmp_entry);
    for (size_t j = 0; j < l1->n; j++)
        FZ_CHECK(cmp_entry(&l1->e[j], &l2.e[j]) == 0 && l1->e[j].size == l2.e[j].size);
}

static char *work;      /* one scratch directory per process */

static void remove_work(void)
{
    fz_rmtree(work);
    free(work);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct expect x;
    static struct listed l1;
    char ssd[4096], vdir[4200], file[4300];
    if (!work) {
        work = fz_tmpdir("vlog");
        atexit(remove_work);
    }
    snprintf(ssd, sizeof ssd, "%s/ssd", work);
    snprintf(vdir, sizeof vdir, "%s/vlog", ssd);
    snprintf(file, sizeof file, "%s/00000001.vlog", vdir);
    fz_rmtree(ssd);
    FZ_CHECK(mkdir(ssd, 0700) == 0 && mkdir(vdir, 0700) == 0);
    write_file(file, data, size);

    x.n = 0;
    x.overflow = 0;
    const uint8_t *fkey = NULL;
    int readable = file_ok(data, size, &fkey);
    if (readable)
        rec_walk((uint8_t *)data, size, fkey, 0, take, &x);
    mark_newest(&x);

    /* A file that does not read is all the store has: refused, or (an
     * empty file: nothing in it) opened empty. */
    kv_engine *e = open_store(ssd, readable);
    if (!e) {
        FZ_CHECK(size > 0);
        return 0;
    }
    l1.n = 0;
    FZ_CHECK(kv_ssd_scan(e, list_cb, &l1) == KV_OK);
    /* Every key the log holds intact is listed once, and nothing else. */
    for (size_t i = 0; !x.overflow && i < x.n; i++) {
        size_t hits = 0;
        for (size_t j = 0; j < l1.n; j++) {
            uint8_t k[KEY_LEN];
            key_of(&l1.e[j], k);
            hits += memcmp(k, x.f[i].key, KEY_LEN) == 0;
        }
        if (hits != 1)
            fprintf(stderr, "fuzz_vlog: an intact record (ns %u, stamp %llu, %u bytes) is "
                    "listed %zu times after the rebuild\n", x.f[i].key[0],
                    (unsigned long long)x.f[i].stamp, x.f[i].len, hits);
        FZ_CHECK(hits == 1);
    }
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (size_t j = 0; j < l1.n; j++) {
        const kv_ssd_entry *ent = &l1.e[j];
        uint8_t k[KEY_LEN];
        key_of(ent, k);
        if (ent->size + 1 > cap) {
            cap = ent->size + 1;
            buf = realloc(buf, cap);
            FZ_CHECK(buf);
        }
        int rc = load(e, ent, buf);
        if (rc != KV_OK)
            fprintf(stderr, "fuzz_vlog: a recovered value (ns %d, %llu bytes) does not load: "
                    "%s\n", ent->ns, (unsigned long long)ent->size, kv_strerror(rc));
        FZ_CHECK(rc == KV_OK);
        if (x.overflow)
            continue;
        /* The value is the newest copy's (any of them on a tie). */
        int match = 0, known = 0;
        for (size_t i = 0; i < x.n; i++) {
            if (memcmp(k, x.f[i].key, KEY_LEN) != 0)
                continue;
            known = 1;
            if (x.f[i].newest && x.f[i].len == ent->size &&
                memcmp(x.f[i].val, buf, ent->size) == 0)
                match = 1;
        }
        if (!known || !match)
            fprintf(stderr, "fuzz_vlog: a recovered value (ns %d, %llu bytes) is %s\n", ent->ns,
                    (unsigned long long)ent->size,
                    known ? "not its key's newest copy" : "no intact record of the log");
        FZ_CHECK(known && match);
    }
    uint64_t checked = 0, bad = 0;
    FZ_CHECK(kv_ssd_scrub(e, 0, NULL, NULL, &checked, &bad) == KV_OK);
    FZ_CHECK(bad == 0 && checked == l1.n);
    kv_close(e);
    free(buf);
    /* An open is most of an input's time, so the reopen is checked for
     * half of the inputs, picked by their bytes (a reproducer reproduces). */
    if (!(XXH3_64bits(data, size) & 1))
        reopen_same(ssd, &l1);
    for (size_t i = 0; i < x.n; i++)
        free(x.f[i].val);
    return 0;
}

/* ---- seeds: files the store itself wrote, and hand-made records ---------- */

static const uint8_t seed_key[32] = { 0x6b, 0x76, 0x65, 0x6e, 0x67, 0x69, 0x6e, 0x65, 7, 7 };

/* A file header (number 1, seed_key) at the front of b. */
static size_t put_fhdr(uint8_t *b)
{
    memset(b, 0, FHDR);
    kv__put32(b, MAGIC_FILE);
    kv__put32(b + 4, 1);
    memset(b + 8, 0x5d, 16);
    kv__put32(b + 24, 1);
    memcpy(b + 32, seed_key, sizeof seed_key);
    kv__put64(b + 64, XXH3_64bits(b, 64));
    return FHDR;
}

/* Appends a record of val to b at its alignment, its MAC under seed_key. */
static size_t put_rec(uint8_t *b, size_t at, const uint8_t *key, uint64_t stamp,
                      const uint8_t *val, uint32_t len, int lz4)
{
    uint8_t z[8192];
    uint32_t slen = len;
    const uint8_t *stored = val;
    if (lz4) {
        int got = LZ4_compress_default((const char *)val, (char *)z, (int)len, sizeof z);
        FZ_CHECK(got > 0 && (uint32_t)got < len);
        slen = (uint32_t)got;
        stored = z;
    }
    at = align_up(at, HDR + (uint64_t)slen >= BIG_REC ? 4096 : 16);
    uint8_t *h = b + at;
    memset(h, 0, HDR);
    kv__put32(h, MAGIC_V3);
    kv__put32(h + 4, len);
    kv__put32(h + 8, slen);
    h[12] = (uint8_t)lz4;
    memcpy(h + 13, key, KEY_LEN);
    for (int i = 0; i < 6; i++)
        h[34 + i] = (uint8_t)(stamp >> (8 * i));
    memcpy(h + HDR, stored, slen);
    struct rec r;
    FZ_CHECK(rec_parse(h, &r));
    kv__put64(h + 40, XXH3_64bits_withSeed(val, len, r.seed));
    kv__put64(h + 48, rec_mac(seed_key, h, at));
    return at + span_of(slen);
}

static void seed_store(const char *dir)
{
    /* A store written through the API: plain keys, a replaced key, a large
     * block shard and a compressible one, then closed. Its log files are
     * the seeds (each stripe's own file). */
    char *tmp = fz_tmpdir("vlog-seed"), path[4096], vdir[4200];
    snprintf(path, sizeof path, "%s/ssd", tmp);
    kv_config *cfg;
    kv_engine *e;
    FZ_CHECK(kv_config_new(&cfg) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "pipeline", "ssd") == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "ssd.path", path) == KV_OK);
    FZ_CHECK(kv_config_set(cfg, "ssd.compression", "lz4") == KV_OK);
    FZ_CHECK(kv_open(cfg, &e) == KV_OK);
    kv_config_free(cfg);
    uint8_t small[100], text[6000], big[40000];
    for (size_t i = 0; i < sizeof small; i++)
        small[i] = (uint8_t)(i * 37 + 11);
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (uint8_t)"kvengine value log "[i % 19];
    uint64_t x = 88172645463325252ull;   /* xorshift: incompressible, so stored as is */
    for (size_t i = 0; i < sizeof big; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        big[i] = (uint8_t)x;
    }
    FZ_CHECK(kv_put(e, "alpha", 5, small, sizeof small) == KV_OK);
    FZ_CHECK(kv_put(e, "beta", 4, text, sizeof text) == KV_OK);
    FZ_CHECK(kv_put(e, "alpha", 5, small, 60) == KV_OK);
    kv_iov v0 = { big, sizeof big }, v1 = { text, 500 };
    kv_shard sh[2] = { { .block.bytes = { 0xb1 }, .index = 0, .iov = &v0, .iovcnt = 1 },
                       { .block.bytes = { 0xb1 }, .index = 1, .iov = &v1, .iovcnt = 1 } };
    kv_task t;
    FZ_CHECK(kv_dump(e, sh, 2, &t) == KV_OK && kv_wait(e, t, 0) == KV_OK);
    kv_close(e);
    snprintf(vdir, sizeof vdir, "%s/vlog", path);
    for (int no = 1; no < 16; no++) {
        char f[4300], name[32];
        snprintf(f, sizeof f, "%s/%08d.vlog", vdir, no);
        FILE *fp = fopen(f, "rb");
        if (!fp)
            continue;
        static uint8_t buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, fp);
        fclose(fp);
        if (n == 0)
            continue;
        snprintf(name, sizeof name, "store-%02d", no);
        fz_seed(dir, name, buf, n);
    }
    fz_rmtree(tmp);
    free(tmp);
}

static void write_seeds(const char *dir)
{
    seed_store(dir);
    static uint8_t b[1 << 16];
    uint8_t key[KEY_LEN] = { 0 }, val[5000];
    for (size_t i = 0; i < sizeof val; i++)
        val[i] = (uint8_t)(i % 7 == 0 ? i : 'a');
    size_t n;

    /* Two copies of one key: the higher stamp wins, wherever it lies. */
    memset(b, 0, sizeof b);
    key[1] = 0x42;
    n = put_fhdr(b);
    n = put_rec(b, n, key, 9, val, 300, 0);
    n = put_rec(b, n, key, 5, val + 1, 300, 0);
    key[0] = 1;
    n = put_rec(b, n, key, 7, val, 5000, 1);
    fz_seed(dir, "stamps", b, n);

    /* A killed record, a value holding a perfect copy of a record (its MAC
     * right for where the copy was made, not where it lies), and a torn
     * tail. */
    memset(b, 0, sizeof b);
    key[0] = 0;
    key[20] = 3;
    n = put_fhdr(b);
    size_t dead = n;
    n = put_rec(b, n, key, 4, val, 64, 0);
    kv__put32(b + dead, DEAD_V3);
    uint8_t inner[600];
    memset(inner, 0, sizeof inner);
    key[20] = 5;
    put_rec(inner, 0, key, 1000, val, 200, 0);
    key[20] = 6;
    n = put_rec(b, n, key, 8, inner, sizeof inner, 0);
    key[20] = 4;
    n = put_rec(b, n, key, 6, val, 1000, 0);
    fz_seed(dir, "dead-forged-torn", b, n - 500);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    fz_mkcorpus(write_seeds);
    return 0;
}
