/*
 * vlog.c — the SSD tier's value log: where the bytes of every stored value
 * live. RocksDB (ssd.c) keeps only a 40-byte pointer per value.
 *
 * Key design choice: values are appended to large files (ssd.path/vlog/
 * NNNNNNNN.vlog, a new one every tune.vlog_file_size bytes) with one
 * pwritev(2) each, header and caller's memory together: one copy, into the
 * page cache, and no per-value file to create, rename or look up. That is
 * what beats both UCM's file per block (a create, a rename and a directory
 * entry per block) and RocksDB's BlobDB (the value copied into the batch,
 * the WAL, the memtable and the blob file, CRC'd in software at each step);
 * the measurements are in doc/ssd-tier.md.
 *
 * A file opens with an 80-byte file header (u32/u64 little-endian):
 *   0 magic "KVLF"   4 version (1)   8 the store id (16 bytes, ssd.c)
 *   24 the file's number   28 zero   32 the file's key (32 random bytes)
 *   64 XXH3-64 of bytes 0..63   72 zero.
 * Then records, each a 64-byte header and the stored bytes:
 *   0 magic "KVV3"   4 value length   8 stored length   12 flags (u8, bit 0:
 *   lz4)   13 the 21-byte key   34 write stamp (48 bits)   40 XXH3-64 of the
 *   value, seeded with XXH3 of header bytes 4..39   48 the header's MAC:
 *   the first 8 bytes of HMAC-SHA256 under the file's key of header bytes
 *   4..47, the file's number (u32) and the record's offset (u64)   56 zero.
 * WHY A MAC. A record found by a scan (kv__vlog_settle) is believed only
 * when its MAC verifies, and only the store knows the file's key: a value
 * whose bytes hold a perfect copy of a record (a client can put any bytes)
 * is not a record, wherever a scan looks at it, and neither is a record
 * copied from another place or another file (the MAC covers its number
 * and offset). A header whose MAC verifies was written by this store
 * exactly there, so its lengths can be trusted: a scan steps over such a
 * record by its span even when its value is torn, and resyncs 16 bytes on
 * only past a header that is not ours (where any bytes may lie).
 * The stamp is the tier's logical clock at the write (the pointer carries
 * the same one): of two copies of one key, the higher stamp is the newer
 * write. The store id binds the file to its store (ssd.c, "identity"):
 * a file of another store, or one whose header does not read, is never
 * served, written or removed (kv__vlog_bind). Files of earlier kvengines
 * (records "KVV1"/"KVV2", no file header) are not read: ssd.c refuses such
 * a store with a message.
 * Records of 32 KiB or more start and end on a 4 KiB boundary, so deleting
 * one punches a hole (fallocate PUNCH_HOLE) that gives all of its space
 * back at once; smaller ones are 16-byte aligned and their space comes back
 * when their file dies or is compacted (ssd.c, compact_file). A file
 * whose live bytes drop to zero is unlinked (never one being appended to).
 * The header makes every record self-describing: a read checks magic,
 * key and length before the checksum, so a pointer to the wrong place is
 * caught, not just a flipped bit.
 *
 * THE LOG IS THE SOURCE OF TRUTH. RocksDB's pointers only say where values
 * are; a lost or damaged RocksDB must not lose a value the log holds
 * intact. So a deleted record is killed in place before its deletion is
 * acknowledged: its hole is punched (large records) or its magic turned
 * into "KVX3" (small ones, which share file system blocks; the
 * lengths and the MAC stay readable, so a scan steps over it). Then every record that
 * still reads as live is one the store may hold, and kv__vlog_settle can
 * re-index a record no pointer leads to (a WAL that lost its tail, a
 * RocksDB rebuilt from nothing) instead of giving its space away.
 *
 * Threading: appends reserve their range under amu (a short critical
 * section: an offset bump); the writes themselves run in parallel. Files
 * are reference-counted, so a reader or writer never loses its descriptor
 * to an unlink; the file table is under a rwlock held only for a lookup.
 */
#define XXH_STATIC_LINKING_ONLY
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lz4.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "ssd_int.h"

#define MAGIC_FILE 0x464c564bu    /* "KVLF" little-endian: a file header */
#define FILE_VERSION 1u
#define MAGIC_V3 0x3356564bu      /* "KVV3": a record */
#define DEAD_V3 0x3358564bu       /* "KVX3": a deleted record, lengths and MAC intact */
#define FLAG_LZ4 1u
#define BIG_REC (32u << 10)
#define FS_BLOCK 4096u

struct kv__vfile {
    uint32_t no;
    int fd;
    uint8_t id[KV__STORE_ID_LEN];  /* the store it belongs to (its header's) */
    uint8_t key[KV__VLOG_KEY_LEN]; /* its records' MAC key */
    EVP_MD_CTX *mac_in, *mac_out;  /* HMAC-SHA256's two pads under key, hashed
                                      once (see hdr_mac) */
    _Atomic int refs;            /* the table's, plus one per user */
    _Atomic uint64_t live;       /* span bytes of records still pointed to */
};


static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

/* Bytes a record occupies in its file, and the alignment of its start. */
static uint64_t rec_align(uint32_t slen)
{
    return KV__VLOG_HDR + (uint64_t)slen >= BIG_REC ? FS_BLOCK : 16;
}
uint64_t kv__vlog_span(uint32_t slen)
{
    return align_up(KV__VLOG_HDR + (uint64_t)slen, rec_align(slen));
}

static uint64_t checksum(uint64_t seed, const kv_iov *iov, uint32_t iovcnt)
{
    /* Zeroed first: xxhash 0.8.1's reset reads the seed already in the
     * state (valgrind saw an uninitialised read). */
    XXH3_state_t st;
    memset(&st, 0, sizeof st);
    XXH3_64bits_reset_withSeed(&st, seed);
    for (uint32_t i = 0; i < iovcnt; i++)
        if (iov[i].len)
            XXH3_64bits_update(&st, iov[i].base, iov[i].len);
    return XXH3_64bits_digest(&st);
}

/* ---- the record header ------------------------------------------------------ */

struct rec_hdr {
    bool dead;               /* killed: lengths and MAC valid, contents not */
    uint32_t flags, len, slen;
    uint64_t stamp, sum, seed;
    const uint8_t *key;      /* into the header bytes */
};

/* Parses 64 header bytes: true for a record (live or dead) whose fields are
 * consistent, false for anything else. Trusts nothing: a scan feeds it any
 * bytes a file holds, and even a true answer means nothing until the MAC
 * is checked (hdr_mac_ok). */
static bool parse_hdr(const uint8_t *h, struct rec_hdr *r)
{
    uint32_t magic = kv__get32(h);
    memset(r, 0, sizeof *r);
    if (magic != MAGIC_V3 && magic != DEAD_V3)
        return false;
    r->dead = magic == DEAD_V3;
    r->len = kv__get32(h + 4);
    r->slen = kv__get32(h + 8);
    r->flags = h[12];
    r->key = h + 13;
    for (int i = 0; i < 6; i++)
        r->stamp |= (uint64_t)h[34 + i] << (8 * i);
    r->sum = kv__get64(h + 40);
    r->seed = XXH3_64bits(h + 4, 36);
    if ((r->flags & ~FLAG_LZ4) || r->len > KV_VALUE_MAX || r->key[0] >= KV_NS_COUNT ||
        kv__get64(h + 56) != 0)
        return false;
    return r->flags & FLAG_LZ4 ? r->slen < r->len : r->slen == r->len;
}

/* Hashes HMAC-SHA256's inner and outer pads under f->key once per file, so
 * a record's MAC costs two SHA-256 blocks and no key setup (libcrypto's
 * one-shot HMAC() measured 3.9 us a call here, this 0.6 us: most of it was
 * fetching the digest and keying).
 * false when libcrypto cannot (out of memory). */
static bool mac_init(struct kv__vfile *f)
{
    uint8_t pad[64];
    f->mac_in = EVP_MD_CTX_new();
    f->mac_out = EVP_MD_CTX_new();
    bool ok = f->mac_in && f->mac_out;
    for (int k = 0; ok && k < 2; k++) {
        memset(pad, k ? 0x5c : 0x36, sizeof pad);
        for (size_t i = 0; i < sizeof f->key; i++)
            pad[i] ^= f->key[i];
        EVP_MD_CTX *c = k ? f->mac_out : f->mac_in;
        ok = EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(c, pad, sizeof pad) == 1;
    }
    return ok;
}

/* The MAC of header h (bytes 4..47) at offset off of file f: the first 8
 * bytes of HMAC-SHA256(f->key, h[4..48) | u32 file number | u64 offset). */
static uint64_t hdr_mac(const struct kv__vfile *f, const uint8_t *h, uint64_t off)
{
    uint8_t msg[44 + 12], in[EVP_MAX_MD_SIZE], out[EVP_MAX_MD_SIZE];
    unsigned ilen = 0, olen = 0;
    memcpy(msg, h + 4, 44);
    kv__put32(msg + 44, f->no);
    kv__put64(msg + 48, off);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    bool ok = c && EVP_MD_CTX_copy_ex(c, f->mac_in) == 1 &&
              EVP_DigestUpdate(c, msg, sizeof msg) == 1 && EVP_DigestFinal_ex(c, in, &ilen) == 1 &&
              EVP_MD_CTX_copy_ex(c, f->mac_out) == 1 && EVP_DigestUpdate(c, in, ilen) == 1 &&
              EVP_DigestFinal_ex(c, out, &olen) == 1 && olen >= 8;
    EVP_MD_CTX_free(c);
    /* Out of memory: a MAC no header holds, so nothing verifies and a
     * record written with it reads as torn (never as another's). */
    return ok ? kv__get64(out) : 0;
}

static bool hdr_mac_ok(const struct kv__vfile *f, const uint8_t *h, uint64_t off)
{
    uint8_t want[8];
    kv__put64(want, hdr_mac(f, h, off));
    return CRYPTO_memcmp(want, h + 48, 8) == 0;
}

/* A record header for r, but for the checksum and the MAC; returns the
 * seed the checksum takes. */
static uint64_t fill_hdr(uint8_t *h, const struct kv__vrec *r, bool lz4)
{
    memset(h, 0, KV__VLOG_HDR);
    kv__put32(h, MAGIC_V3);
    kv__put32(h + 4, (uint32_t)r->len);
    kv__put32(h + 8, r->slen);
    h[12] = lz4 ? FLAG_LZ4 : 0;
    memcpy(h + 13, r->key, KV__SSD_KEY_LEN);
    for (int i = 0; i < 6; i++)
        h[34 + i] = (uint8_t)(r->stamp >> (8 * i));
    return XXH3_64bits(h + 4, 36);
}

/* ---- the file header ---------------------------------------------------------- */

static void fill_fhdr(uint8_t *h, const struct kv__vfile *f)
{
    memset(h, 0, KV__VLOG_FHDR);
    kv__put32(h, MAGIC_FILE);
    kv__put32(h + 4, FILE_VERSION);
    memcpy(h + 8, f->id, KV__STORE_ID_LEN);
    kv__put32(h + 24, f->no);
    memcpy(h + 32, f->key, KV__VLOG_KEY_LEN);
    kv__put64(h + 64, XXH3_64bits(h, 64));
}

/* Reads f's header into f->id and f->key: true when it is whole and names
 * this file's number. */
static bool read_fhdr(struct kv__vfile *f)
{
    uint8_t h[KV__VLOG_FHDR];
    if (pread(f->fd, h, sizeof h, 0) != (ssize_t)sizeof h || kv__get32(h) != MAGIC_FILE ||
        kv__get32(h + 4) != FILE_VERSION || kv__get32(h + 24) != f->no ||
        kv__get64(h + 64) != XXH3_64bits(h, 64))
        return false;
    memcpy(f->id, h + 8, KV__STORE_ID_LEN);
    memcpy(f->key, h + 32, KV__VLOG_KEY_LEN);
    return true;
}

/* ---- the file table --------------------------------------------------------- */

static void vfile_put(struct kv__vfile *f)
{
    if (atomic_fetch_sub(&f->refs, 1) == 1) {
        close(f->fd);
        EVP_MD_CTX_free(f->mac_in);
        EVP_MD_CTX_free(f->mac_out);
        free(f);
    }
}

void kv__vlog_file_name(const struct kv__vlog *v, uint32_t no, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%08u.vlog", v->dir, no);
}

/* The file numbered no with a reference taken, or NULL. */
static struct kv__vfile *vfile_get(struct kv__vlog *v, uint32_t no)
{
    struct kv__vfile *f = NULL;
    pthread_rwlock_rdlock(&v->lk);
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v->files[mid]->no < no)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < v->n && v->files[lo]->no == no) {
        f = v->files[lo];
        atomic_fetch_add(&f->refs, 1);
    }
    pthread_rwlock_unlock(&v->lk);
    return f;
}

/* Adds f (numbers only grow, so at the end unless opening). lk write-held. */
static int table_add(struct kv__vlog *v, struct kv__vfile *f)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 16;
        struct kv__vfile **nf = realloc(v->files, cap * sizeof *nf);
        if (!nf)
            return KV_ENOMEM;
        v->files = nf;
        v->cap = cap;
    }
    size_t i = v->n;
    while (i > 0 && v->files[i - 1]->no > f->no) {
        v->files[i] = v->files[i - 1];
        i--;
    }
    v->files[i] = f;
    v->n++;
    return KV_OK;
}

/* Unlinks a file no longer appended to whose last live record went. */
static void retire(struct kv__vlog *v, struct kv__vfile *f)
{
    pthread_rwlock_wrlock(&v->lk);
    size_t i = 0;
    while (i < v->n && v->files[i] != f)
        i++;
    bool found = i < v->n && atomic_load(&f->live) == 0;
    if (found) {
        memmove(&v->files[i], &v->files[i + 1], (v->n - i - 1) * sizeof *v->files);
        v->n--;
    }
    pthread_rwlock_unlock(&v->lk);
    if (!found)
        return;
    char path[KV_CFG_STR + 64];
    kv__vlog_file_name(v, f->no, path, sizeof path);
    if (unlink(path) != 0)
        KV_WARN("ssd: cannot remove the empty value log %s: %s", path, strerror(errno));
    vfile_put(f);   /* the table's reference */
}

/* Opens log file number no: a new one (create: its key drawn, its header
 * written) or one on disk (its header read; *hdr_ok says whether it read).
 * Never follows a symbolic link, and takes nothing but a regular file:
 * ssd.path is ours, and a link in it is not (issue 17). */
static struct kv__vfile *vfile_open(struct kv__vlog *v, uint32_t no, bool create, bool *hdr_ok,
                                    char *err, size_t errlen)
{
    char path[KV_CFG_STR + 64];
    kv__vlog_file_name(v, no, path, sizeof path);
    mode_t mode = kv__ssd_file_mode(v->gid);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT | O_EXCL : 0), mode);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            kv__errf(err, errlen, "value log %s is a symbolic link; kvengine follows no link "
                     "under ssd.path (remove it)", path);
        else
            kv__errf(err, errlen, "value log %s: %s", path, strerror(e));
        errno = e;
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        kv__errf(err, errlen, "value log %s is not a regular file", path);
        close(fd);
        errno = EPERM;
        return NULL;
    }
    struct kv__vfile *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        kv__errf(err, errlen, "out of memory");
        errno = ENOMEM;
        return NULL;
    }
    f->no = no;
    f->fd = fd;
    atomic_init(&f->refs, 1);
    if (create) {
        /* The umask may have taken the group's read bit; the directory's
         * set-group-ID bit gave the group, but not if it was changed. */
        if (v->gid != (gid_t)-1 && st.st_gid != v->gid && fchown(fd, (uid_t)-1, v->gid) != 0)
            KV_WARN("ssd: value log %s: cannot give it to group %u: %s", path,
                    (unsigned)v->gid, strerror(errno));
        if ((st.st_mode & 07777) != mode)
            fchmod(fd, mode);
        uint8_t h[KV__VLOG_FHDR];
        memcpy(f->id, v->id, KV__STORE_ID_LEN);
        if (getrandom(f->key, sizeof f->key, 0) != (ssize_t)sizeof f->key) {
            kv__errf(err, errlen, "value log %s: no random bytes for its key: %s", path,
                     strerror(errno));
            goto undo;
        }
        fill_fhdr(h, f);
        if (pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
            kv__errf(err, errlen, "value log %s: writing its header: %s", path, strerror(errno));
            goto undo;
        }
    } else if (hdr_ok) {
        *hdr_ok = read_fhdr(f);
    }
    if (!mac_init(f)) {
        kv__errf(err, errlen, "value log %s: out of memory", path);
        errno = ENOMEM;
        if (create)
            goto undo;
        vfile_put(f);
        return NULL;
    }
    /* Reads are random, whole records, from several threads sharing this
     * descriptor (and its readahead state): no readahead, each read
     * fetches exactly its record. */
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    return f;
undo:;
    int e = errno;
    unlink(path);
    vfile_put(f);
    errno = e;
    return NULL;
}

/* A fresh file to append to for stripe k; the old one is retired if empty.
 * amu held. */
static int rotate(struct kv__vlog *v, int k)
{
    char err[256];
    struct kv__vfile *f = vfile_open(v, v->next_no, true, NULL, err, sizeof err);
    if (!f) {
        int e = errno;
        KV_WARN("ssd: cannot start a new %s", err);
        errno = e;
        return e == ENOSPC || e == EDQUOT ? KV_ENOSPC : KV_EIO;
    }
    pthread_rwlock_wrlock(&v->lk);
    int rc = table_add(v, f);
    pthread_rwlock_unlock(&v->lk);
    if (rc != KV_OK) {
        vfile_put(f);
        return rc;
    }
    v->next_no++;
    struct kv__vfile *old = v->active[k];
    v->active[k] = f;
    v->tail[k] = KV__VLOG_FHDR;
    if (old && atomic_load(&old->live) == 0)
        retire(v, old);
    return KV_OK;
}

/* Whether f is one of the active files in 'active' (v->active under amu,
 * or a copy of it). */
static bool is_active(struct kv__vfile *const *active, const struct kv__vfile *f)
{
    for (int k = 0; k < KV__VLOG_STRIPES; k++)
        if (active[k] == f)
            return true;
    return false;
}

/* The stripe this thread appends to: threads take stripes in turn. */
static int my_stripe(struct kv__vlog *v)
{
    static _Thread_local int stripe = -1;
    if (stripe < 0)
        stripe = (int)(atomic_fetch_add(&v->next_stripe, 1) % KV__VLOG_STRIPES);
    return stripe;
}

/* ---- open / close ------------------------------------------------------------ */

int kv__vlog_open(struct kv__vlog *v, const char *dir, uint64_t file_size, bool compress,
                  gid_t gid, char *err, size_t errlen)
{
    memset(v, 0, sizeof *v);
    v->gid = gid;
    snprintf(v->dir, sizeof v->dir, "%s", dir);
    v->file_size = file_size;
    v->compress = compress;
    v->punch = true;
    pthread_rwlock_init(&v->lk, NULL);
    pthread_mutex_init(&v->amu, NULL);
    int code = KV_EIO;
    if (mkdir(dir, kv__ssd_dir_mode(gid)) != 0 && errno != EEXIST) {
        kv__errf(err, errlen, "cannot create the value log directory '%s': %s", dir,
                 strerror(errno));
        goto fail;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        int e = errno;
        bool link = e == ELOOP || e == ENOTDIR;
        kv__errf(err, errlen, "cannot read the value log directory '%s': %s%s", dir, strerror(e),
                 link ? " (a symbolic link? kvengine follows no link under ssd.path)" : "");
        if (link)
            code = KV_EPERM;
        if (dfd >= 0)
            close(dfd);
        goto fail;
    }
    struct dirent *de;
    uint32_t maxno = 0;
    while ((de = readdir(d))) {
        unsigned no;
        char tail[8];
        if (sscanf(de->d_name, "%8u.vlo%1s", &no, tail) != 2 || strcmp(tail, "g") != 0 ||
            strlen(de->d_name) != 13 || no == 0 || no >= KV__VLOG_MAX_FILE)
            continue;
        if (no > maxno)
            maxno = no;   /* never reused, whatever the file turns out to be */
        bool ok = false;
        struct kv__vfile *f = vfile_open(v, no, false, &ok, err, errlen);
        if (!f) {
            code = errno == ELOOP || errno == EPERM ? KV_EPERM : KV_EIO;
            closedir(d);
            goto fail;
        }
        struct stat st;
        if (!ok && fstat(f->fd, &st) == 0 && st.st_size == 0) {
            /* Created and never written: a crash before its header. */
            char path[KV_CFG_STR + 64];
            kv__vlog_file_name(v, no, path, sizeof path);
            unlink(path);
            vfile_put(f);
            continue;
        }
        if (!ok) {
            v->unreadable++;
            KV_WARN("ssd: value log %s/%s has no file header of this format: not served, left "
                    "as it is", dir, de->d_name);
            vfile_put(f);
            continue;
        }
        if (table_add(v, f) != KV_OK) {
            vfile_put(f);
            closedir(d);
            kv__errf(err, errlen, "out of memory");
            goto fail;
        }
    }
    closedir(d);
    v->next_no = maxno + 1;   /* kv__vlog_settle starts the first file */
    return KV_OK;
fail:
    kv__vlog_close(v);
    return code;
}

size_t kv__vlog_ids(struct kv__vlog *v, uint8_t (*ids)[KV__STORE_ID_LEN], size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < v->n; i++) {
        size_t j = 0;
        while (j < n && j < cap && memcmp(ids[j], v->files[i]->id, KV__STORE_ID_LEN) != 0)
            j++;
        if (j < n)
            continue;
        if (n < cap)
            memcpy(ids[n], v->files[i]->id, KV__STORE_ID_LEN);
        n++;
    }
    return n;
}

size_t kv__vlog_bind(struct kv__vlog *v, const uint8_t *id)
{
    memcpy(v->id, id, KV__STORE_ID_LEN);
    size_t kept = 0, dropped = 0;
    for (size_t i = 0; i < v->n; i++) {
        struct kv__vfile *f = v->files[i];
        if (memcmp(f->id, id, KV__STORE_ID_LEN) == 0) {
            v->files[kept++] = f;
            continue;
        }
        char path[KV_CFG_STR + 64];
        kv__vlog_file_name(v, f->no, path, sizeof path);
        KV_WARN("ssd: value log %s belongs to another store: not served, left as it is", path);
        vfile_put(f);
        dropped++;
    }
    v->n = kept;
    v->foreign += dropped;
    return dropped;
}

void kv__vlog_close(struct kv__vlog *v)
{
    for (size_t i = 0; i < v->n; i++)
        vfile_put(v->files[i]);
    free(v->files);
    v->files = NULL;
    v->n = v->cap = 0;
    memset(v->active, 0, sizeof v->active);
    pthread_rwlock_destroy(&v->lk);
    pthread_mutex_destroy(&v->amu);
}

/* ---- space ------------------------------------------------------------------- */

/* Punches the whole file system blocks inside [off, off + span); true when
 * [off, off + span) begins on a block and its first block went. */
static bool punch(struct kv__vlog *v, struct kv__vfile *f, uint64_t off, uint64_t span)
{
    uint64_t a = align_up(off, FS_BLOCK), b = (off + span) & ~(uint64_t)(FS_BLOCK - 1);
    if (!v->punch || b <= a)
        return false;
    if (fallocate(f->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a, (off_t)(b - a)) != 0) {
        if (errno == EOPNOTSUPP || errno == ENOSYS) {
            v->punch = false;
            KV_WARN("ssd: the file system under %s cannot punch holes; space comes back per "
                    "value log file (%llu MiB) instead of per value", v->dir,
                    (unsigned long long)(v->file_size >> 20));
        } else {
            KV_WARN("ssd: punching a hole in value log %u: %s", f->no, strerror(errno));
        }
        return false;
    }
    return a == off;
}

/* Turns the live record at off into a dead one (its magic only: a scan
 * still steps over it by its lengths). Anything else there is left alone. */
static int kill_rec(struct kv__vfile *f, uint64_t off)
{
    uint8_t m[4];
    ssize_t r = pread(f->fd, m, sizeof m, (off_t)off);
    if (r != (ssize_t)sizeof m)
        return r < 0 ? KV_EIO : KV_OK;   /* short: nothing whole is there */
    if (kv__get32(m) != MAGIC_V3)
        return KV_OK;
    kv__put32(m, DEAD_V3);
    if (pwrite(f->fd, m, sizeof m, (off_t)off) != (ssize_t)sizeof m) {
        KV_WARN("ssd: cannot mark a deleted record dead in value log %u: %s", f->no,
                strerror(errno));
        return KV_EIO;
    }
    return KV_OK;
}

/* Whether the record at off of f is key's live record of slen stored bytes
 * (its MAC verified): a pointer that names it may kill it. */
static bool rec_is(struct kv__vfile *f, uint64_t off, const uint8_t *key, uint32_t slen)
{
    uint8_t h[KV__VLOG_HDR];
    struct rec_hdr r;
    return pread(f->fd, h, sizeof h, (off_t)off) == (ssize_t)sizeof h && parse_hdr(h, &r) &&
           !r.dead && r.slen == slen && memcmp(r.key, key, KV__SSD_KEY_LEN) == 0 &&
           hdr_mac_ok(f, h, off);
}

int kv__vlog_free(struct kv__vlog *v, uint64_t loc, uint32_t slen, const uint8_t *key)
{
    if (loc == KV__LOC_NONE)
        return KV_OK;
    struct kv__vfile *f = vfile_get(v, KV__LOC_FILE(loc));
    if (!f)
        return KV_OK;   /* its file is gone, and the record with it */
    uint64_t span = kv__vlog_span(slen);
    int rc = KV_OK;
    /* A pointer that names another's record (stale, or not this store's)
     * gives back only its count: the bytes are someone else's. */
    if (!key || rec_is(f, KV__LOC_OFF(loc), key, slen))
        rc = punch(v, f, KV__LOC_OFF(loc), span) ? KV_OK : kill_rec(f, KV__LOC_OFF(loc));
    uint64_t was = atomic_fetch_sub(&f->live, span);
    if (was == span) {
        pthread_mutex_lock(&v->amu);
        bool active = is_active(v->active, f);
        pthread_mutex_unlock(&v->amu);
        if (!active)
            retire(v, f);
    }
    vfile_put(f);
    return rc;
}

static int cmp_ext(const void *a, const void *b)
{
    const struct kv__vext *x = a, *y = b;
    return x->loc < y->loc ? -1 : x->loc > y->loc;
}

uint32_t kv__vlog_sparse(struct kv__vlog *v, uint64_t min_dead)
{
    /* The active files, copied out: appends wait on amu, not on the fstats
     * below. A file no longer active is never active again, so a stale
     * copy can only make a file look active a tick longer. */
    struct kv__vfile *active[KV__VLOG_STRIPES];
    pthread_mutex_lock(&v->amu);
    memcpy(active, v->active, sizeof active);
    pthread_mutex_unlock(&v->amu);
    uint32_t best = 0;
    uint64_t best_dead = 0;
    pthread_rwlock_rdlock(&v->lk);
    for (size_t i = 0; i < v->n; i++) {
        struct kv__vfile *f = v->files[i];
        struct stat st;
        if (is_active(active, f) || fstat(f->fd, &st) != 0)
            continue;
        uint64_t disk = (uint64_t)st.st_blocks * 512, live = atomic_load(&f->live);
        if (disk > live && disk - live >= min_dead && live < disk / 2 && disk - live > best_dead) {
            best = f->no;
            best_dead = disk - live;
        }
    }
    pthread_rwlock_unlock(&v->lk);
    return best;
}

uint64_t kv__vlog_disk_bytes(struct kv__vlog *v)
{
    uint64_t total = 0;
    pthread_rwlock_rdlock(&v->lk);
    for (size_t i = 0; i < v->n; i++) {
        struct stat st;
        if (fstat(v->files[i]->fd, &st) == 0)
            total += (uint64_t)st.st_blocks * 512;
    }
    pthread_rwlock_unlock(&v->lk);
    return total;
}

/* ---- append -------------------------------------------------------------------- */

static int errno_code(int e)
{
    return e == ENOSPC || e == EDQUOT ? KV_ENOSPC : KV_EIO;
}

/* Drops the first n bytes from an iovec array (after a short transfer). */
static void consume(struct iovec **io, int *cnt, size_t n)
{
    while (*cnt > 0 && n >= (*io)->iov_len) {
        n -= (*io)->iov_len;
        (*io)++;
        (*cnt)--;
    }
    if (*cnt > 0) {
        (*io)->iov_base = (char *)(*io)->iov_base + n;
        (*io)->iov_len -= n;
    }
}

/* pwritev until all of it is written; KV_OK or a code from errno. */
static int write_all(int fd, struct iovec *io, int cnt, uint64_t off)
{
    while (cnt > 0) {
        ssize_t w = pwritev(fd, io, cnt > IOV_MAX ? IOV_MAX : cnt, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno_code(errno);
        }
        if (w == 0)
            return KV_EIO;
        off += (uint64_t)w;
        consume(&io, &cnt, (size_t)w);
    }
    return KV_OK;
}

/* The value compressed into *buf when lz4 saves at least 1/16 of it. */
static uint32_t try_lz4(const struct kv__vrec *r, uint8_t **buf)
{
    *buf = NULL;
    if (r->len < FS_BLOCK || r->len > (uint64_t)LZ4_MAX_INPUT_SIZE)
        return 0;
    const char *src = r->iov[0].base;
    uint8_t *flat = NULL;
    if (r->iovcnt != 1) {
        flat = malloc(r->len);
        if (!flat)
            return 0;
        kv__iov_gather(flat, r->iov, r->iovcnt);
        src = (const char *)flat;
    }
    int lim = (int)(r->len - r->len / 16);
    uint8_t *out = malloc((size_t)lim);
    int got = out ? LZ4_compress_default(src, (char *)out, (int)r->len, lim) : 0;
    free(flat);
    if (got <= 0) {
        free(out);
        return 0;
    }
    *buf = out;
    return (uint32_t)got;
}

static int append_one(struct kv__vlog *v, struct kv__vrec *r, struct kv__vfile **used)
{
    uint8_t *zbuf = NULL;
    uint32_t zlen = v->compress ? try_lz4(r, &zbuf) : 0;
    r->slen = zlen ? zlen : (uint32_t)r->len;
    uint8_t hdr[KV__VLOG_HDR];
    r->sum = checksum(fill_hdr(hdr, r, zlen != 0), r->iov, r->iovcnt);
    kv__put64(hdr + 40, r->sum);
    uint64_t span = kv__vlog_span(r->slen);

    int k = my_stripe(v);
    pthread_mutex_lock(&v->amu);
    int rc = KV_OK;
    uint64_t off = align_up(v->tail[k], rec_align(r->slen));
    if (v->tail[k] > KV__VLOG_FHDR && off + span > v->file_size) {
        rc = rotate(v, k);
        off = align_up(KV__VLOG_FHDR, rec_align(r->slen));
    }
    struct kv__vfile *f = v->active[k];
    if (rc == KV_OK) {
        v->tail[k] = off + span;
        atomic_fetch_add(&f->live, span);   /* before any rotation can see 0 */
        atomic_fetch_add(&f->refs, 1);
    }
    pthread_mutex_unlock(&v->amu);
    if (rc != KV_OK) {
        free(zbuf);
        return rc;
    }
    /* Where it goes is known now: the MAC binds the header to it. */
    kv__put64(hdr + 48, hdr_mac(f, hdr, off));

    struct iovec stack[17], *io = stack;
    int cnt = zlen ? 2 : (int)r->iovcnt + 1;
    if ((size_t)cnt > KV__ARRAY_LEN(stack) && !(io = malloc((size_t)cnt * sizeof *io)))
        rc = KV_ENOMEM;
    if (rc == KV_OK) {
        io[0] = (struct iovec){ hdr, sizeof hdr };
        if (zlen)
            io[1] = (struct iovec){ zbuf, zlen };
        else
            for (uint32_t i = 0; i < r->iovcnt; i++)
                io[i + 1] = (struct iovec){ r->iov[i].base, r->iov[i].len };
        rc = write_all(f->fd, io, cnt, off);
    }
    if (io != stack)
        free(io);
    free(zbuf);
    r->loc = kv__loc(f->no, off);
    if (rc != KV_OK) {
        KV_WARN("ssd: writing %llu bytes to value log %u: %s", (unsigned long long)span, f->no,
                kv_strerror(rc));
        kv__vlog_free(v, r->loc, r->slen, NULL);
        r->loc = KV__LOC_NONE;
        vfile_put(f);
        return rc;
    }
    /* Remember the file for a sync; keep one reference per distinct file. */
    for (int i = 0; i < KV__VLOG_SYNC_MAX; i++) {
        if (used[i] == f) {
            vfile_put(f);
            return KV_OK;
        }
        if (!used[i]) {
            used[i] = f;
            return KV_OK;
        }
    }
    vfile_put(f);   /* more files than a batch can span: synced by fdatasync below */
    return KV_OK;
}

int kv__vlog_append(struct kv__vlog *v, struct kv__vrec *r, size_t n, bool sync)
{
    struct kv__vfile *used[KV__VLOG_SYNC_MAX] = { 0 };
    bool overflow = false;
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        r[i].rc = append_one(v, &r[i], used);
        ok += r[i].rc == KV_OK;
    }
    overflow = used[KV__VLOG_SYNC_MAX - 1] != NULL;
    int src = KV_OK;
    for (int i = 0; i < KV__VLOG_SYNC_MAX && used[i]; i++) {
        if (sync && fdatasync(used[i]->fd) != 0 && src == KV_OK) {
            src = errno_code(errno);
            KV_WARN("ssd: syncing value log %u: %s", used[i]->no, strerror(errno));
        }
        vfile_put(used[i]);
    }
    if (sync && overflow && kv__vlog_sync(v) != KV_OK && src == KV_OK)
        src = KV_EIO;
    if (src != KV_OK)
        for (size_t i = 0; i < n; i++)
            if (r[i].rc == KV_OK) {
                kv__vlog_free(v, r[i].loc, r[i].slen, NULL);
                r[i].loc = KV__LOC_NONE;
                r[i].rc = src;
            }
    return src == KV_OK && ok == n ? KV_OK : (src != KV_OK ? src : KV_EIO);
}

int kv__vlog_sync(struct kv__vlog *v)
{
    int rc = KV_OK;
    pthread_rwlock_rdlock(&v->lk);
    size_t n = v->n;
    struct kv__vfile **fs = malloc((n ? n : 1) * sizeof *fs);
    for (size_t i = 0; fs && i < n; i++) {
        fs[i] = v->files[i];
        atomic_fetch_add(&fs[i]->refs, 1);
    }
    pthread_rwlock_unlock(&v->lk);
    if (!fs)
        return KV_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        /* A file with nothing dirty returns at once. */
        if (fdatasync(fs[i]->fd) != 0 && rc == KV_OK)
            rc = errno_code(errno);
        vfile_put(fs[i]);
    }
    free(fs);
    return rc;
}

/* ---- read ---------------------------------------------------------------------- */

/* Copies the first n bytes held by iov into dst. */
static void gather_prefix(uint8_t *dst, const kv_iov *iov, uint32_t iovcnt, uint64_t n)
{
    for (uint32_t i = 0; i < iovcnt && n > 0; i++) {
        uint64_t k = iov[i].len < n ? iov[i].len : n;
        memcpy(dst, iov[i].base, k);
        dst += k;
        n -= k;
    }
}

/* preadv until want bytes or the end of the file; the count read or -errno. */
static int64_t read_all(int fd, struct iovec *io, int cnt, uint64_t off, uint64_t want)
{
    uint64_t got = 0;
    while (got < want && cnt > 0) {
        ssize_t r = preadv(fd, io, cnt > IOV_MAX ? IOV_MAX : cnt, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        got += (uint64_t)r;
        consume(&io, &cnt, (size_t)r);
    }
    return (int64_t)got;
}

const char kv__vlog_not_its_record[] = "the record there is not the one its pointer names";

/* Checks a record's header against what the pointer promised. No MAC
 * here: a pointer only ever names a place where this store wrote a header
 * (the log is append-only, file numbers and offsets are never reused, and
 * a found record's MAC was checked by the scan), and the record must be
 * the pointer's (key, length, the pointer's checksum). The MAC is for what
 * a scan or a kill finds without a pointer, and it costs 0.6 us a record
 * (see doc/ssd-tier.md). */
static const char *check_hdr(const uint8_t *hdr, uint64_t got, const uint8_t *key, uint64_t len,
                             uint32_t sum32, struct rec_hdr *r)
{
    if (got < KV__VLOG_HDR || !parse_hdr(hdr, r) || r->dead)
        return "bad record header";
    if (memcmp(r->key, key, KV__SSD_KEY_LEN) != 0)
        return kv__vlog_not_its_record;   /* another key's, ours: see ssd_int.h */
    if (r->len != len)
        return kv__vlog_not_its_record;
    if ((uint32_t)r->sum != sum32)
        return kv__vlog_not_its_record;
    if (got < KV__VLOG_HDR + (uint64_t)r->slen)
        return "record cut short";
    return NULL;
}

/* Decompresses the lz4 bytes that the read left at the front of iov. */
static int unpack_lz4(const kv_iov *iov, uint32_t iovcnt, uint32_t slen, uint64_t len)
{
    uint8_t *z = malloc(slen), *plain = iovcnt == 1 ? NULL : malloc(len);
    if (!z || (iovcnt != 1 && !plain)) {
        free(z);
        free(plain);
        return KV_ENOMEM;
    }
    gather_prefix(z, iov, iovcnt, slen);
    char *dst = plain ? (char *)plain : iov[0].base;
    int d = LZ4_decompress_safe((const char *)z, dst, (int)slen, (int)len);
    if (d == (int)len && plain)
        kv__iov_scatter(iov, iovcnt, plain);
    free(z);
    free(plain);
    return d == (int)len ? KV_OK : KV_ECORRUPT;
}

/* The value a read left in iov (stored bytes at the front): decompressed
 * in place when it was stored with lz4, then checked against the header's
 * checksum. KV_OK, KV_ECORRUPT with *why, KV_ENOMEM. */
static int check_value(const struct rec_hdr *r, const kv_iov *iov, uint32_t iovcnt,
                       const char **why)
{
    if (r->flags & FLAG_LZ4) {
        int rc = unpack_lz4(iov, iovcnt, r->slen, r->len);
        if (rc != KV_OK) {
            *why = rc == KV_ECORRUPT ? "lz4 data does not decompress" : NULL;
            return rc;
        }
    }
    if (checksum(r->seed, iov, iovcnt) != r->sum) {
        *why = "checksum mismatch";
        return KV_ECORRUPT;
    }
    return KV_OK;
}

static int read_rec(struct kv__vlog *v, const uint8_t *key, uint64_t loc, uint64_t len,
                    uint32_t sum32, const kv_iov *iov, uint32_t iovcnt, const char **why)
{
    *why = NULL;
    struct kv__vfile *f = vfile_get(v, KV__LOC_FILE(loc));
    if (!f) {
        *why = "its value log file is missing";
        return KV_ECORRUPT;
    }
    uint8_t hdr[KV__VLOG_HDR];
    struct iovec stack[17], *io = stack;
    int cnt = (int)iovcnt + 1;
    if ((size_t)cnt > KV__ARRAY_LEN(stack) && !(io = malloc((size_t)cnt * sizeof *io))) {
        vfile_put(f);
        return KV_ENOMEM;
    }
    io[0] = (struct iovec){ hdr, sizeof hdr };
    for (uint32_t i = 0; i < iovcnt; i++)
        io[i + 1] = (struct iovec){ iov[i].base, iov[i].len };
    /* Header and value straight into the caller's memory: one read. A
     * compressed value is shorter than len; the read may run past it. */
    int64_t got = read_all(f->fd, io, cnt, KV__LOC_OFF(loc), KV__VLOG_HDR + len);
    if (io != stack)
        free(io);
    if (got < 0) {
        KV_WARN("ssd: reading value log %u: %s", f->no, strerror((int)-got));
        vfile_put(f);
        return KV_EIO;
    }
    struct rec_hdr r;
    vfile_put(f);
    *why = check_hdr(hdr, (uint64_t)got, key, len, sum32, &r);
    if (*why)
        return KV_ECORRUPT;
    return check_value(&r, iov, iovcnt, why);
}

int kv__vlog_read(struct kv__vlog *v, const uint8_t *key, uint64_t loc, uint64_t len,
                  uint32_t sum32, const kv_iov *iov, uint32_t iovcnt, const char **why)
{
    int rc = read_rec(v, key, loc, len, sum32, iov, iovcnt, why);
    /* The bytes went straight into the caller's memory: a value that fails
     * its checks must not be left there to be mistaken for data. */
    if (rc != KV_OK)
        for (uint32_t i = 0; i < iovcnt; i++)
            if (iov[i].len)
                memset(iov[i].base, 0, iov[i].len);
    return rc;
}

/* ---- the open-time scan -------------------------------------------------------- */

struct scan {
    struct kv__vlog *v;
    struct kv__vfile *f;
    kv__vfound_fn found;
    void *ctx;
    struct kv__vsettle *st;
    uint64_t live;           /* span bytes kept in f */
    uint8_t *buf;            /* a found record's value */
    size_t cap;
};

/* The first 16-aligned offset in [pos, end) where a header could start (a
 * nonzero word); holes are skipped with SEEK_DATA. end when there is none. */
static uint64_t next_candidate(int fd, uint64_t pos, uint64_t end)
{
    uint8_t blk[FS_BLOCK];
    while (pos + KV__VLOG_HDR <= end) {
        off_t d = lseek(fd, (off_t)pos, SEEK_DATA);
        if (d < 0 && errno == ENXIO)
            return end;   /* nothing but a hole from pos on */
        if (d > (off_t)pos)
            pos = align_up((uint64_t)d, 16);
        if (pos + KV__VLOG_HDR > end)
            break;
        size_t want = end - pos < sizeof blk ? (size_t)(end - pos) : sizeof blk;
        ssize_t got = pread(fd, blk, want, (off_t)pos);
        if (got < 16)
            break;
        for (size_t i = 0; i + 16 <= (size_t)got; i += 16)
            if (kv__get32(blk + i) != 0)
                return pos + i;
        pos += (uint64_t)got & ~(uint64_t)15;
    }
    return end;
}

/* Reads and checks the record r at off, all of whose stored bytes lie
 * before end: KV_OK when intact, with its value in sc->buf. */
static int verify_found(struct scan *sc, const struct rec_hdr *r, uint64_t off)
{
    /* A header is only as good as its checksum: bound what it may make us
     * allocate (lz4 expands at most 255-fold) before reading. */
    if ((r->flags & FLAG_LZ4) && (r->len > (uint64_t)r->slen * 255 + 16 ||
                                  r->len > (uint64_t)LZ4_MAX_INPUT_SIZE))
        return KV_ECORRUPT;
    if (r->len > sc->cap) {
        uint8_t *nb = realloc(sc->buf, r->len);
        if (!nb)
            return KV_ENOMEM;
        sc->buf = nb;
        sc->cap = r->len;
    }
    struct iovec io = { sc->buf, r->slen };
    if (read_all(sc->f->fd, &io, 1, off + KV__VLOG_HDR, r->slen) != (int64_t)r->slen)
        return KV_EIO;
    kv_iov iov = { sc->buf, r->len };
    const char *why;
    return check_value(r, &iov, 1, &why);
}

/*
 * Scans [pos, end) of sc->f, a stretch no pointer covers: each intact
 * record found is offered to sc->found and counted live when kept; what is
 * not kept is punched, up to punch_to (end, or past a torn tail).
 */
static void scan_range(struct scan *sc, uint64_t pos, uint64_t end, uint64_t punch_to)
{
    struct kv__vfile *f = sc->f;
    uint64_t garbage = pos;   /* the stretch since the last record kept */
    while ((pos = next_candidate(f->fd, pos, end)) + KV__VLOG_HDR <= end) {
        uint8_t h[KV__VLOG_HDR];
        struct rec_hdr r;
        if (pread(f->fd, h, sizeof h, (off_t)pos) != (ssize_t)sizeof h || !parse_hdr(h, &r) ||
            !hdr_mac_ok(f, h, pos)) {
            /* Not a header this store wrote here: any bytes may lie
             * here (a torn value's, a value's copy of a record), and the
             * next header of ours is 16-aligned. */
            pos += 16;
            continue;
        }
        /* Ours, written exactly here: its lengths hold, so it is stepped
         * over whole whatever its value holds. */
        uint64_t span = kv__vlog_span(r.slen);
        if (r.dead) {
            pos += span;
            continue;
        }
        int vrc = pos + KV__VLOG_HDR + r.slen > end ? KV_ECORRUPT : verify_found(sc, &r, pos);
        if (vrc == KV_ENOMEM || vrc == KV_EIO) {
            /* Not known to be torn: left as it is (and counted live, so its
             * file stays) for the next open to decide. */
            punch(sc->v, f, garbage, pos - garbage);
            sc->live += span;
            garbage = pos + span;
            pos += span;
            continue;
        }
        if (vrc != KV_OK) {
            sc->st->torn++;   /* cut short or damaged: its space is garbage */
            pos += span;
            continue;
        }
        sc->st->found++;
        struct kv__vfound fr = { .key = r.key, .loc = kv__loc(f->no, pos), .stamp = r.stamp,
                                 .sum = r.sum, .len = r.len, .slen = r.slen };
        if (sc->found(sc->ctx, &fr)) {
            punch(sc->v, f, garbage, pos - garbage);
            sc->live += span;
            sc->st->kept++;
            garbage = pos + span;
        } else {
            kill_rec(f, pos);
            sc->st->killed++;
        }
        pos += span;
    }
    if (punch_to > garbage)
        punch(sc->v, f, garbage, punch_to - garbage);
}

/*
 * After the open scan: counts each file's live bytes from the pointers
 * found, scans what lies between them (see kv__vlog_settle in ssd_int.h),
 * unlinks the files left with nothing live, and starts new files to append
 * to (the tail of the last one may be torn), numbered past every file on
 * disk and every file a pointer names, so a number is never reused. Sorts
 * ext.
 */
int kv__vlog_settle(struct kv__vlog *v, struct kv__vext *ext, size_t n, kv__vfound_fn found,
                    void *ctx, struct kv__vsettle *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    if (n)
        qsort(ext, n, sizeof *ext, cmp_ext);
    if (n && KV__LOC_FILE(ext[n - 1].loc) >= v->next_no)
        v->next_no = KV__LOC_FILE(ext[n - 1].loc) + 1;
    struct scan sc = { .v = v, .found = found, .ctx = ctx, .st = st };
    struct kv__vfile **dead = malloc((v->n ? v->n : 1) * sizeof *dead);
    if (!dead) {
        kv__errf(err, errlen, "out of memory settling the value log");
        return KV_ENOMEM;
    }
    size_t j = 0, ndead = 0;
    for (size_t i = 0; i < v->n; i++) {
        struct kv__vfile *f = v->files[i];
        if (is_active(v->active, f))
            continue;
        while (j < n && KV__LOC_FILE(ext[j].loc) < f->no)
            j++;
        struct stat st_;
        uint64_t size = fstat(f->fd, &st_) == 0 ? (uint64_t)st_.st_size : 0;
        uint64_t pos = KV__VLOG_FHDR, live = 0;
        sc.f = f;
        sc.live = 0;
        for (; j < n && KV__LOC_FILE(ext[j].loc) == f->no; j++) {
            uint64_t off = KV__LOC_OFF(ext[j].loc), span = kv__vlog_span(ext[j].slen);
            if (off > pos)
                scan_range(&sc, pos, off, off);
            live += span;
            if (off + span > pos)
                pos = off + span;
        }
        if (size > pos)
            scan_range(&sc, pos, size, align_up(size, FS_BLOCK));
        live += sc.live;
        atomic_store(&f->live, live);
        if (live == 0)
            dead[ndead++] = f;
    }
    free(sc.buf);
    for (size_t i = 0; i < ndead; i++)
        retire(v, dead[i]);
    st->files_removed = ndead;
    free(dead);
    if (v->next_no >= KV__VLOG_MAX_FILE) {
        kv__errf(err, errlen, "value log '%s': file numbers exhausted", v->dir);
        return KV_EIO;
    }
    for (int k = 0; k < KV__VLOG_STRIPES; k++)
        if (rotate(v, k) != KV_OK) {
            kv__errf(err, errlen, "cannot create a value log file in '%s': %s", v->dir,
                     strerror(errno));
            return errno == ENOSPC || errno == EDQUOT ? KV_ENOSPC : KV_EIO;
        }
    return KV_OK;
}
