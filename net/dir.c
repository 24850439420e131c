/*
 * dir.c — the host store's directory: the DRAM index's read-only mirror for
 * attached processes (written by engine/dram.c, read by net/shm.c's clients).
 *
 * Key design choice: a lossy hint table, checked like a seqlock. The
 * server's index (index.c) stays the truth and stays private; beside it,
 * in a sealed memfd every attached process maps read-only, each linked
 * block shard is written into one of the two slots of its bucket: id,
 * shard index, segment offset, length. A client that finds its shard
 * there copies it straight out of the segment and then reads the slot's
 * sequence number again: unchanged, the copy is good, because the server
 * retracts a slot (bumping its sequence) before the shard's memory can be
 * freed, and the bytes of a linked shard never change. A slot found
 * changed, busy or holding something else is not an error: the client
 * asks the server as before (net/shm.c), which is also where every load
 * of a shard not in DRAM goes. So a full bucket simply overwrites a slot,
 * two writers racing for one slot let one of them lose, and nothing ever
 * waits on a reader.
 *
 * Layout: a 64-byte header (magic, version, buckets), then buckets of two
 * 32-byte slots (a cache line each):
 *   u32 seq (odd while a writer is in it), u32 index, u32 off64, u32 len
 *   (0: empty), u8 id[16]
 * Writers: seq to odd by compare-and-swap (a writer that loses skips: the
 * slot is someone else's now), a release fence, the fields, seq to even
 * with release. Readers: seq with acquire (odd: skip), the fields, the
 * copy, an acquire fence, seq again.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "dir.h"
#include "engine/internal.h"

#define DIR_MAGIC   0x5244564bu   /* "KVDR" */
#define DIR_VERSION 1u
#define DIR_HDR     64u
#define MIN_BUCKETS 1024u
#define MAX_BUCKETS (1u << 22)    /* 256 MiB of directory at most */
#define SEG_PER_BUCKET (16u << 10) /* a bucket (two slots) per 16 KiB of segment */

/* The seqlock's fences. ThreadSanitizer models no fences (GCC refuses
 * atomic_thread_fence under it), so its builds keep the compiler barrier
 * only, which on x86 is all an acquire or release fence compiles to. */
#if defined(__SANITIZE_THREAD__)
#define DIR_FENCE(mo) atomic_signal_fence(mo)
#else
#define DIR_FENCE(mo) atomic_thread_fence(mo)
#endif

struct slot {
    _Atomic uint32_t seq;
    _Atomic uint32_t index;
    _Atomic uint32_t off64;
    _Atomic uint32_t len;
    _Atomic uint32_t id[4];
};
_Static_assert(sizeof(struct slot) == 32, "two slots to a cache line");

struct kv__dir {
    int fd;
    uint8_t *base;
    size_t len;
    uint32_t mask;
};

static uint64_t slot_hash(const kv_block_id *id, uint32_t index)
{
    return XXH3_64bits_withSeed(id->bytes, KV_BLOCK_ID_LEN, index);
}

static struct slot *bucket(const void *base, uint32_t mask, uint64_t h)
{
    return (struct slot *)((uint8_t *)base + DIR_HDR) + 2 * (size_t)(h & mask);
}

static bool slot_is(struct slot *s, const kv_block_id *id, uint32_t index)
{
    uint32_t w[4];
    memcpy(w, id->bytes, sizeof w);
    for (int i = 0; i < 4; i++)
        if (atomic_load_explicit(&s->id[i], memory_order_relaxed) != w[i])
            return false;
    return atomic_load_explicit(&s->index, memory_order_relaxed) == index &&
           atomic_load_explicit(&s->len, memory_order_relaxed) != 0;
}

int kv__dir_new(size_t seg_len, struct kv__dir **out)
{
    *out = NULL;
    uint32_t n = MIN_BUCKETS;
    while (n < MAX_BUCKETS && (uint64_t)n * SEG_PER_BUCKET < seg_len)
        n <<= 1;
    struct kv__dir *d = calloc(1, sizeof *d);
    if (!d)
        return KV_ENOMEM;
    d->len = DIR_HDR + (size_t)n * 2 * sizeof(struct slot);
    d->mask = n - 1;
    d->fd = memfd_create("kvengine-dir", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *p = MAP_FAILED;
    if (d->fd >= 0 && ftruncate(d->fd, (off_t)d->len) == 0)
        p = mmap(NULL, d->len, PROT_READ | PROT_WRITE, MAP_SHARED, d->fd, 0);
    if (p == MAP_FAILED ||
        fcntl(d->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE) != 0) {
        int rc = kv__err_from_errno(errno);
        if (p != MAP_FAILED)
            munmap(p, d->len);
        if (d->fd >= 0)
            close(d->fd);
        free(d);
        return rc;
    }
    d->base = p;
#ifdef MADV_POPULATE_WRITE
    /* Faulted in now (8 MiB for 2 GiB of segment), not one page at a time
     * under the table locks of the first dumps. Best effort. */
    (void)madvise(p, d->len, MADV_POPULATE_WRITE);
#endif
    uint32_t hdr[3] = { DIR_MAGIC, DIR_VERSION, n };
    memcpy(d->base, hdr, sizeof hdr);
    kv__fork_close(d->fd, true);   /* as the segment's: a child keeps no dead server's map */
    *out = d;
    return KV_OK;
}

void kv__dir_free(struct kv__dir *d)
{
    if (!d)
        return;
    munmap(d->base, d->len);
    kv__fork_close(d->fd, false);
    close(d->fd);
    free(d);
}

int kv__dir_fd(const struct kv__dir *d) { return d->fd; }
size_t kv__dir_len(const struct kv__dir *d) { return d->len; }

/* Takes slot s for writing (seq to odd); false when another writer has it. */
static bool slot_begin(struct slot *s, uint32_t *seq)
{
    uint32_t v = atomic_load_explicit(&s->seq, memory_order_relaxed);
    if ((v & 1) || !atomic_compare_exchange_strong_explicit(&s->seq, &v, v + 1,
                                                            memory_order_relaxed,
                                                            memory_order_relaxed))
        return false;
    DIR_FENCE(memory_order_release);   /* seq odd before any field changes */
    *seq = v;
    return true;
}

static void slot_end(struct slot *s, uint32_t seq)
{
    atomic_store_explicit(&s->seq, seq + 2, memory_order_release);
}

void kv__dir_publish(struct kv__dir *d, const kv_block_id *id, uint32_t index, uint32_t off64,
                     uint32_t len)
{
    if (!d || len == 0)
        return;
    uint64_t h = slot_hash(id, index);
    struct slot *b = bucket(d->base, d->mask, h);
    /* The slot it has already, else an empty one, else one chosen by the
     * hash (a hint table: the one overwritten is asked of the server). */
    int k = slot_is(&b[0], id, index) ? 0 : slot_is(&b[1], id, index) ? 1 : -1;
    for (int i = 0; i < 2 && k < 0; i++)
        if (atomic_load_explicit(&b[i].len, memory_order_relaxed) == 0)
            k = i;
    if (k < 0)
        k = (int)(h >> 63);
    struct slot *s = &b[k];
    uint32_t seq;
    if (!slot_begin(s, &seq))
        return;
    uint32_t w[4];
    memcpy(w, id->bytes, sizeof w);
    for (int i = 0; i < 4; i++)
        atomic_store_explicit(&s->id[i], w[i], memory_order_relaxed);
    atomic_store_explicit(&s->index, index, memory_order_relaxed);
    atomic_store_explicit(&s->off64, off64, memory_order_relaxed);
    atomic_store_explicit(&s->len, len, memory_order_relaxed);
    slot_end(s, seq);
}

/*
 * Retracting must not give up while another writer is in the slot: that
 * writer may be retracting another shard that the slot held when it looked
 * (and it then leaves ours there), so we wait for it to leave, which takes
 * a few stores (writers never block in a slot), and look again. Returns
 * once neither slot names the shard.
 */
void kv__dir_retract(struct kv__dir *d, const kv_block_id *id, uint32_t index)
{
    if (!d)
        return;
    struct slot *b = bucket(d->base, d->mask, slot_hash(id, index));
    for (int k = 0; k < 2; k++) {
        struct slot *s = &b[k];
        for (unsigned spins = 0;; spins++) {
            uint32_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
            if (seq & 1) {
                if (spins > 64)
                    sched_yield();   /* the writer was preempted in it */
                continue;
            }
            if (!slot_is(s, id, index))
                break;
            if (!atomic_compare_exchange_strong_explicit(&s->seq, &seq, seq + 1,
                                                         memory_order_relaxed,
                                                         memory_order_relaxed))
                continue;   /* another writer came first: look again */
            DIR_FENCE(memory_order_release);
            if (slot_is(s, id, index))
                atomic_store_explicit(&s->len, 0, memory_order_relaxed);
            slot_end(s, seq);
            break;
        }
    }
}

int kv__dir_map(int fd, size_t len, struct kv__dir_view *v)
{
    memset(v, 0, sizeof *v);
    struct stat st;
    if (len < DIR_HDR + 2 * sizeof(struct slot) || fstat(fd, &st) != 0 ||
        (uint64_t)st.st_size < len)
        return KV_EPROTO;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return kv__err_from_errno(errno);
    uint32_t hdr[3];
    memcpy(hdr, p, sizeof hdr);
    uint32_t n = hdr[2];
    if (hdr[0] != DIR_MAGIC || hdr[1] != DIR_VERSION || n < 1 || n > MAX_BUCKETS ||
        (n & (n - 1)) || DIR_HDR + (size_t)n * 2 * sizeof(struct slot) != len) {
        munmap(p, len);
        return KV_EPROTO;
    }
    v->base = p;
    v->len = len;
    v->mask = n - 1;
    return KV_OK;
}

void kv__dir_unmap(struct kv__dir_view *v)
{
    if (v->base)
        munmap((void *)v->base, v->len);
    memset(v, 0, sizeof *v);
}

bool kv__dir_copy(const struct kv__dir_view *v, const uint8_t *seg, size_t seg_len,
                  const kv_block_id *id, uint32_t index, const kv_iov *iov, uint32_t iovcnt,
                  uint64_t len)
{
    if (!v->base || !seg || len == 0)
        return false;
    struct slot *b = bucket(v->base, v->mask, slot_hash(id, index));
    for (int k = 0; k < 2; k++) {
        struct slot *s = &b[k];
        uint32_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        if ((seq & 1) || !slot_is(s, id, index))
            continue;
        uint64_t off = (uint64_t)atomic_load_explicit(&s->off64, memory_order_relaxed) * 64;
        if (atomic_load_explicit(&s->len, memory_order_relaxed) != len || off > seg_len ||
            len > seg_len - off)
            return false;
        kv__iov_scatter(iov, iovcnt, seg + off);
        DIR_FENCE(memory_order_acquire);   /* the copy's reads before seq's */
        return atomic_load_explicit(&s->seq, memory_order_relaxed) == seq;
    }
    return false;
}
