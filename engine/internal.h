/*
 * internal.h — what the parts of libkvengine share and users never see.
 *
 * Internal non-static names carry the kv__ prefix. Only include/kvengine.h
 * is public.
 *
 * LOCK ORDER (the one place it is written down)
 *
 *   evict_lock  >  table-shard lock  >  allocator (size class, page map)
 *   task stripe lock  >  a task's own mutex
 *
 * - A table-shard lock (struct kv__tshard.lock) is held only for index
 *   work: find, insert, unlink, pin, touch, sample. Never across a copy of
 *   value bytes, never across an SSD or network call, and never two at
 *   once (the evictor too takes them one at a time).
 * - Eviction runs on the thread that needs room, under evict_lock; it takes
 *   table-shard locks one at a time and hands victims to the sink with no
 *   table-shard lock held. A thread holding a table-shard lock never
 *   evicts. The sink is the next tier's: the SSD tier's only queues the
 *   victim (its own qmu), a tier without a sink of its own is written to
 *   under evict_lock (engine/store.c, spill_accept), so evict_lock comes
 *   before any lock of a tier below.
 * - The node-local store (store.c) has no lock of its own: DRAM's calls
 *   (dram.c) take and drop their table-shard lock inside, and the tiers
 *   below are called with no engine lock held.
 * - Values are freed to the allocator with no table-shard lock held.
 * - A task stripe lock is never held while taking any other lock except a
 *   task's own mutex.
 */
#ifndef KV_ENGINE_INTERNAL_H
#define KV_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "kvengine.h"

#define KV__EXPORT KV_EXPORT
#define KV__UNUSED __attribute__((unused))
#define KV__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- time ---------------------------------------------------------------- */

static inline uint64_t kv__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kv__now_ms(void) { return kv__now_ns() / 1000000u; }

/* Wall-clock ms since 1970: for what another host compares (a copy's
 * stamp, net/tomb.h), never for a timeout. */
static inline uint64_t kv__wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- logging (log.c) -------------------------------------------------------
 * One level per process: KV_LOG_LEVEL (environment, read once) when set,
 * else the log.level of the engine opened last. Lines go to stderr as
 * "[kvengine][I] message".
 */
extern _Atomic int kv__log_level;
void kv__log_set_level(int level);
void kv__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int  kv__log_parse_level(const char *s);   /* -1 when unknown */
#define KV__LOG(lvl, ...)                                                     \
    do {                                                                      \
        if ((lvl) <= atomic_load_explicit(&kv__log_level, memory_order_relaxed)) \
            kv__log((lvl), __VA_ARGS__);                                      \
    } while (0)
#define KV_ERROR(...) KV__LOG(KV_LOG_ERROR, __VA_ARGS__)
#define KV_WARN(...)  KV__LOG(KV_LOG_WARN, __VA_ARGS__)
#define KV_INFO(...)  KV__LOG(KV_LOG_INFO, __VA_ARGS__)
#define KV_DEBUG(...) KV__LOG(KV_LOG_DEBUG, __VA_ARGS__)

/* Translates an errno value into a KV_E* code (the edge with the OS). */
int kv__err_from_errno(int errnum);

/* Lists fd (add) among the descriptors a fork()ed child closes at once, or
 * takes it off the list (just before closing it): locks and sockets of the
 * host store and the SSD tier, which a child must not keep after its
 * parent dies (errors.c). */
void kv__fork_close(int fd, bool add);

/* Writes "fmt..." into err (errlen bytes, NUL-terminated) when err != NULL. */
void kv__errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- little-endian fields (wire frames, records on disk) ------------------ */
static inline void kv__put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void kv__put32(uint8_t *p, uint32_t v)
{ for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void kv__put64(uint8_t *p, uint64_t v)
{ for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t kv__get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t kv__get32(const uint8_t *p)
{ uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static inline uint64_t kv__get64(const uint8_t *p)
{ uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

/* ---- iovec helpers ------------------------------------------------------- */

/* Total bytes of an iovec list; KV_EINVAL (as -1 in *ok) for NULL bases. */
static inline uint64_t kv__iov_len(const kv_iov *iov, uint32_t cnt)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < cnt; i++)
        n += iov[i].len;
    return n;
}
/*
 * memcpy, except where glibc's is twenty times slower than it should be.
 * Above a few KiB glibc copies with `rep movsb`, and on AMD Zen that runs
 * at ~2 GB/s instead of ~40 when the destination is 1..31 bytes past the
 * source modulo 4 KiB (bench/copy.c prints the table). That is exactly a
 * plain key's value, which sits after its [klen][key] header, put from
 * page-aligned memory: a Mooncake BufferPool lease, a registered buffer, an
 * aligned tensor. Such spans go in 64-byte pieces, which the compiler
 * turns into vector moves; everything else is memcpy.
 */
static inline void kv__copy(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (n < 4096 || (((uintptr_t)d - (uintptr_t)s) & 4095u) - 1u >= 31u) {
        memcpy(d, s, n);
        return;
    }
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        memcpy(d + i, s + i, 64);
    memcpy(d + i, s + i, n - i);
}
/* Copies an iovec list into one flat buffer. */
static inline void kv__iov_gather(void *dst, const kv_iov *iov, uint32_t cnt)
{
    uint8_t *p = dst;
    for (uint32_t i = 0; i < cnt; i++) {
        if (iov[i].len)
            kv__copy(p, iov[i].base, iov[i].len);
        p += iov[i].len;
    }
}
/* Copies one flat buffer out into an iovec list of the same total length. */
static inline void kv__iov_scatter(const kv_iov *iov, uint32_t cnt, const void *src)
{
    const uint8_t *p = src;
    for (uint32_t i = 0; i < cnt; i++) {
        if (iov[i].len)
            kv__copy(iov[i].base, p, iov[i].len);
        p += iov[i].len;
    }
}

/* Namespaces: block shards and plain keys never meet. */
enum kv__ns { KV_NS_BLOCK = 0, KV_NS_KEY = 1, KV_NS_COUNT = 2 };

/* ---- victims: how evicted blocks leave the DRAM tier ---------------------
 * The evictor unlinks a block from the index and hands it, whole, to the
 * engine's sink as a kv__victim. The victim's shard bytes stay in the
 * segment, untouched and not reused, until the sink calls release(): that
 * is what lets the SSD tier write evicted blocks back before their DRAM is
 * reused. A sink that drops blocks calls release() at once.
 */
struct kv__victim_shard {
    uint32_t index;
    uint32_t len;
    const void *data;      /* in the DRAM segment */
};
struct kv__victim {
    int ns;                /* enum kv__ns */
    kv_block_id id;
    uint32_t last_use_ms;  /* coldness stamp: last use, ms since the engine opened */
    uint32_t nshards;
    struct kv__victim_shard *shards;
    void (*release)(struct kv__victim *v);
    void *priv;            /* the engine's, for release */
};

/* The receiver of victims (the SSD tier in dram|ssd; NULL drops them). */
struct kv__sink {
    void *ctx;
    /* Takes ownership of v; must call v->release(v) exactly once. */
    void (*accept)(void *ctx, struct kv__victim *v);
    /* Waits up to ms for accepted victims to be released; returns the
     * number of bytes still held. Lets a dump that finds no room wait for
     * write-back progress instead of failing while memory is in flight. */
    uint64_t (*drain)(void *ctx, unsigned ms);
};

#endif
