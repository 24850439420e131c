/*
 * alloc.c — the DRAM segment allocator (engine/alloc.c) against another
 * build of it, in one run: how much of a segment equal values fill, how
 * full a segment stays under a cache's churn of mixed sizes, and what an
 * allocation costs next to the copy it precedes. A measurement to read,
 * not a test (tests/check_alloc.c asserts the guarantees).
 *
 *   alloc [--seg MIB] [--ops N] [--seed S] ALLOCATOR.so...
 *
 * Each ALLOCATOR.so is engine/alloc.c built on its own (any revision with
 * this alloc.h), loaded with dlopen, so two builds sit side by side and
 * meet the same sequence of sizes. `make bench-alloc` builds this tree's
 * and the one before 4 KiB runs (ALLOC_OLD, built in a scratch folder
 * from git) and runs this on both (BENCH_ALLOC_ARGS="--seg 1024" passes
 * options). By hand:
 *   cc -O2 -fPIC -shared -pthread -Iinclude -I. -D_GNU_SOURCE engine/alloc.c -o new.so
 *   cc -O2 -Iinclude bench/alloc.c -o bench_alloc -rdynamic -ldl -lm
 *   ./bench_alloc old.so new.so
 *
 * Fills: a fresh segment of --seg MiB filled with one size until the
 * allocator says no: the count, and the requested bytes over the segment.
 * Churn: a cache's life. Sizes are drawn (below), each allocated; when one
 * does not fit, live values are freed (the oldest: what LRU eviction does
 * to values nobody reads again; or one at random: a cache whose reads
 * touch everything) until it does. "fill" is the requested bytes live
 * over the segment, averaged over the moments an allocation failed (the
 * cache's steady state), "frees/miss" how many values one failed
 * allocation cost. allocs/s counts alloc + free pairs, the whole loop.
 * Cost: alloc + free of one size in steady state against memcpy of it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

struct kv__alloc;
struct ops {
    const char *name;
    int (*new_)(struct kv__alloc **, void *, size_t, char *, size_t);
    void (*free_all)(struct kv__alloc *);
    size_t (*size)(const struct kv__alloc *, size_t);
    void *(*alloc)(struct kv__alloc *, size_t);
    void (*free)(struct kv__alloc *, void *, size_t);
    size_t (*mapped)(const struct kv__alloc *);
};

/* engine/alloc.c reports its errors through this; the .so finds it here
 * (linked -rdynamic). */
__attribute__((visibility("default"))) void kv__errf(char *err, size_t errlen, const char *fmt, ...);
void kv__errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rng;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int load(const char *path, struct ops *o)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return fprintf(stderr, "%s\n", dlerror()), -1;
    o->name = path;
    *(void **)&o->new_ = dlsym(h, "kv__alloc_new");
    *(void **)&o->free_all = dlsym(h, "kv__alloc_free_all");
    *(void **)&o->size = dlsym(h, "kv__alloc_size");
    *(void **)&o->alloc = dlsym(h, "kv__alloc");
    *(void **)&o->free = dlsym(h, "kv__free");
    *(void **)&o->mapped = dlsym(h, "kv__alloc_mapped");
    if (!o->new_ || !o->free_all || !o->size || !o->alloc || !o->free || !o->mapped)
        return fprintf(stderr, "%s: not an allocator build (missing kv__alloc_*)\n", path), -1;
    return 0;
}

static uint8_t *seg;
static size_t seglen;

static struct kv__alloc *fresh(const struct ops *o)
{
    char err[256];
    struct kv__alloc *a;
    if (o->new_(&a, seg, seglen, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", o->name, err);
        exit(1);
    }
    return a;
}

/* ---- fills ----------------------------------------------------------------- */

static void fills(const struct ops *o, int nops)
{
    static const size_t sz[] = { 1000, 4096, 40000, 65536, 65536 + 41, 131072 + 41,
                                 262144 + 41, (1 << 20) - 4096, 1 << 20, (1 << 20) + 41,
                                 4 << 20, (4 << 20) + 41 };
    printf("  fill %zu MiB with one size:\n", seglen >> 20);
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) {
        struct kv__alloc *a = fresh(o);
        size_t n = 0;
        while (o->alloc(a, sz[i]))
            n++;
        printf("    %9zu B  %7zu values  cost %8zu B  fill %5.1f%%\n", sz[i], n, o->size(a, sz[i]),
               100.0 * (double)n * (double)sz[i] / (double)seglen);
        o->free_all(a);
    }
    (void)nops;
}

/* ---- churn ----------------------------------------------------------------- */

struct live { void *p; size_t len; };

enum { MIX_LOG, MIX_POW2 };
static size_t draw(int mix)
{
    if (mix == MIX_LOG) {                    /* log-uniform 4 KiB .. 4 MiB */
        double x = (double)(next() >> 11) / 9007199254740992.0;
        return (size_t)(4096.0 * __builtin_exp2(10.0 * x));
    }
    /* Mooncake's objects: a power of two 4 KiB .. 4 MiB, bare (a block) or
     * as a plain key's record (+ 1 + a 40-byte key), half and half. */
    size_t v = (size_t)4096 << (next() % 11);
    return next() & 1 ? v : v + 41;
}

static void churn(const struct ops *o, int mix, bool oldest, int nops, uint64_t seed)
{
    struct kv__alloc *a = fresh(o);
    size_t cap = seglen / 4096 + 16;
    struct live *l = malloc(cap * sizeof *l);    /* a ring when oldest, a bag when random */
    size_t head = 0, n = 0, bytes = 0, misses = 0, frees = 0;
    double fill_sum = 0;
    rng = seed;
    double t0 = now();
    for (int i = 0; i < nops; i++) {
        size_t len = draw(mix);
        void *p;
        bool missed = false;
        while (!(p = o->alloc(a, len))) {
            if (!missed) {
                missed = true;
                misses++;
                fill_sum += (double)bytes / (double)seglen;
            }
            if (!n)
                break;
            /* Free at least len before asking again, as the engine evicts
             * in rounds: a failed allocation scans the whole segment. */
            for (size_t freed = 0; n && freed < len; frees++) {
                size_t k = oldest ? head : (head + next() % n) % cap;
                struct live v = l[k];
                l[k] = l[head];                  /* random: the head fills the gap */
                head = (head + 1) % cap;
                n--;
                o->free(a, v.p, v.len);
                bytes -= v.len;
                freed += v.len;
            }
        }
        if (!p)
            continue;
        l[(head + n) % cap] = (struct live){ p, len };
        n++;
        bytes += len;
    }
    double t = now() - t0;
    printf("    %-22s fill %5.1f%%  frees/miss %5.2f  %6.2f M allocs/s\n",
           mix == MIX_LOG ? (oldest ? "log 4K-4M, oldest" : "log 4K-4M, random")
                          : (oldest ? "pow2(+41), oldest" : "pow2(+41), random"),
           misses ? 100.0 * fill_sum / (double)misses : 0.0,
           misses ? (double)frees / (double)misses : 0.0, (double)nops / t / 1e6);
    while (n) {
        o->free(a, l[head].p, l[head].len);
        head = (head + 1) % cap;
        n--;
    }
    if (o->mapped(a) != 0)
        printf("    (!) %zu bytes still mapped after every free\n", o->mapped(a));
    free(l);
    o->free_all(a);
}

/* ---- cost next to the copy ------------------------------------------------- */

static void cost(const struct ops *o, int nops)
{
    static const size_t sz[] = { 65536, 65536 + 41, 262144, 1 << 20 };
    static uint8_t *src;
    if (!src) {
        src = aligned_alloc(4096, 1 << 20);
        memset(src, 7, 1 << 20);
    }
    printf("  one value in steady state (half the segment held, the oldest freed):\n");
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) {
        struct kv__alloc *a = fresh(o);
        size_t keep = seglen / 2 / o->size(a, sz[i]), head = 0;
        void **ring = calloc(keep, sizeof *ring);
        for (size_t k = 0; k < keep; k++)
            ring[k] = o->alloc(a, sz[i]);
        int reps = nops / 4;
        double t0 = now();
        for (int r = 0; r < reps; r++) {
            o->free(a, ring[head], sz[i]);
            ring[head] = o->alloc(a, sz[i]);
            head = (head + 1) % keep;
        }
        double ta = (now() - t0) / reps;
        /* The copy a dump makes of it, into the same kind of memory. */
        int creps = 2000;
        t0 = now();
        for (int r = 0; r < creps; r++)
            memcpy(ring[(size_t)r % keep], src, sz[i] < (1u << 20) ? sz[i] : 1u << 20);
        double tc = (now() - t0) / creps;
        printf("    %8zu B  alloc+free %7.0f ns  memcpy %8.0f ns  (%.2f%%)\n", sz[i], ta * 1e9,
               tc * 1e9, 100.0 * ta / tc);
        for (size_t k = 0; k < keep; k++)
            o->free(a, ring[k], sz[i]);
        free(ring);
        o->free_all(a);
    }
}

int main(int argc, char **argv)
{
    size_t mib = 256;
    int nops = 400000;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        if (!strcmp(argv[i], "--seg"))
            mib = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--ops"))
            nops = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[i + 1], NULL, 0);
        else
            break;
    }
    if (i >= argc || mib == 0 || nops <= 0)
        return fprintf(stderr, "usage: alloc [--seg MIB] [--ops N] [--seed S] ALLOCATOR.so...\n"), 2;
    seglen = mib << 20;
    /* Faulted in (the allocator writes slab free lists into it; the cost
     * figures copy into it); 2 MiB aligned as engine/segment.c maps it. */
    uint8_t *m = mmap(NULL, seglen + (2 << 20), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED)
        return perror("mmap"), 1;
    seg = (uint8_t *)(((uintptr_t)m + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
    for (; i < argc; i++) {
        struct ops o;
        if (load(argv[i], &o) != 0)
            return 1;
        printf("%s\n", o.name);
        fills(&o, nops);
        printf("  churn, %d allocations, %zu MiB:\n", nops, mib);
        for (int mix = MIX_LOG; mix <= MIX_POW2; mix++)
            for (int old = 1; old >= 0; old--)
                churn(&o, mix, old, nops, seed);
        cost(&o, nops);
    }
    return 0;
}
