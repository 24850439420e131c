/*
 * alloc.c — carves values out of the segment: size-class slabs for small
 * values, runs of 4 KiB units for large ones.
 *
 * Key design choice, by measurement. DESIGN.md prefers a jemalloc arena
 * with extent hooks over the segment, and that was built first (see git
 * history). Debian's jemalloc 5.3 is compiled cache-oblivious: every large
 * allocation carries one extra page, so a 1 MiB value takes 1 MiB + 4 KiB
 * and the power-of-two extents jemalloc grows by hold one value fewer than
 * they should. Filling a segment with equal values, the arena reached
 * 81% of a 64 MiB segment for 1 MiB values, 81% of 256 MiB for 4 MiB
 * values, 91% of 64 MiB for 64 KiB values, and 50% of an 8 MiB segment;
 * the option that would fix it is compile-time only. This allocator fills
 * 100% of the segment on the same fills (tests/check_alloc.c asserts every
 * unit is used for 64 KiB .. 4 MiB values), which for a cache is 20% more
 * blocks kept. KV-cache values come in a few fixed sizes
 * (a model's block size), which is the case a slab allocator is best at.
 *
 * Why 4 KiB runs. Runs used to be whole 64 KiB pages. A block is stored
 * bare, but a plain key's record is [klen][key][value], so a power-of-two
 * object (Mooncake's 64 KiB, 128 KiB ...) is a few bytes over and took a
 * whole page more: 128 KiB for a 64 KiB object, half the DRAM tier lost
 * (issue 18). With 4 KiB units it takes 68 KiB. bench/alloc.c, the two
 * builds side by side on a 256 MiB segment: 64 KiB + 41 B objects fill
 * 94.2% instead of 50.0%, 256 KiB + 41 B 98.5% instead of 80.0%; bare
 * 64 KiB .. 4 MiB values still fill 100%; under a cache's churn of mixed
 * sizes 4 KiB .. 4 MiB the segment holds 95% when an allocation fails,
 * freeing the oldest (86-87% before), 78-81% freeing at random (74-77%),
 * and allocations got faster (the bitmap is walked a word at a time,
 * where the page bitmap was walked a bit at a time). 4 KiB is the
 * smallest grain that meets 68 KiB and keeps every run page-aligned
 * (below); a finer one would only add bitmap.
 *
 * How it works. A value over 32 KiB takes a run of whole units, first fit
 * from a rotating cursor in a bitmap of free units; the waste is under one
 * unit per value, at most 12.5% (32 KiB + 1) and 6% at 64 KiB + 41 B.
 * Smaller values go to size classes (multiples of 64 up to 512 bytes, then
 * four classes per doubling, so at most 20% internal waste) in 64 KiB slab
 * pages: a page is 16 free units on a 64 KiB boundary (one 16-bit field of
 * a bitmap word, so the page of any slot is its offset >> 16 and a free
 * page is found a word at a time). Each class fills pages of its own,
 * keeps a list of pages with free slots, and gives a page back to the free
 * units when it empties, so memory moves between classes, and between
 * slabs and runs, as the mix of sizes changes.
 *
 * Slab pages are taken from the top of the segment down (the highest free
 * one), runs next-fit from the bottom. A slab page lives as long as its
 * youngest slot and so pins its 64 KiB among runs that eviction frees in
 * age order; taking them from the cursor like runs (measured first) left
 * such pins all over the segment. Kept apart, the oldest runs free into
 * holes that join: under the churn below the segment held 95.3% when an
 * allocation failed instead of 88.6%, and a 16 MiB value put into a full
 * 64 MiB tier of 1 KiB .. 100 KiB values evicted 29% of them instead of
 * 86% (64 KiB runs: all of them but one; tests/check_alloc.c).
 *
 * Alignment, which callers rely on: every value is 64-byte aligned (the
 * index stores offsets in 64-byte units, engine/index.h); every run is
 * 4 KiB aligned, so a value dumped from page-aligned memory keeps the
 * source's offset modulo 4 KiB and memcpy runs at full speed (kv__copy,
 * engine/internal.h). No caller needs more: RDMA reads any byte range of
 * the registered segment, and the SSD tier copies values into its own
 * buffers (no O_DIRECT from the segment).
 *
 * Values never move, and all of this state lives in ordinary memory of the
 * serving process, outside the segment, except the free-slot links threaded
 * through free slab slots: attached clients (net/shm.c) and RDMA peers see
 * only stored bytes at the offsets the index hands out.
 *
 * Locking: one mutex for the unit bitmap, one per size class. A run
 * allocation is a short bitmap scan next to a copy of at least 32 KiB.
 */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "internal.h"

#define UNIT_SHIFT 12
#define UNIT ((size_t)1 << UNIT_SHIFT)  /* the grain of a run */
#define PAGE_SHIFT 16
#define PAGE ((size_t)1 << PAGE_SHIFT)  /* a slab page */
#define UPP (PAGE / UNIT)               /* units per slab page: 16, one 16-bit field of a word */
#define SMALL_MAX (PAGE / 2)            /* larger values take runs */
#define NCLASS_MAX 64

/* A slab page's state (runs need none: kv__free is told the length). */
struct page {
    uint8_t cls;                       /* the size class */
    uint16_t nfree;                    /* free slots */
    uint32_t free_head;                /* first free slot's offset + 1 (0 = none) */
    int32_t prev, next;                /* the class's list of pages with room */
};

struct sclass {
    pthread_mutex_t lock;
    uint32_t size;
    uint32_t per_page;
    int32_t partial;                   /* first page with free slots, -1 none */
} __attribute__((aligned(64)));

struct kv__alloc {
    uint8_t *base;
    size_t nunits;                     /* whole units in the segment */
    size_t npages;                     /* whole slab pages (64 KiB aligned) */
    struct page *pages;
    uint64_t *bitmap;                  /* 1 = unit in use; the bits past nunits are set */
    size_t cursor;                     /* next-fit start, in units */
    size_t units_used;
    size_t slab_hint;                  /* no free slab page above this one */
    pthread_mutex_t lock;              /* bitmap, cursor, units_used */
    int nclass;
    struct sclass cls[NCLASS_MAX];
};

/* The first unit in [i, hi) whose bit is `used`, or hi. Word at a time. */
static size_t next_bit(const uint64_t *bm, size_t i, size_t hi, bool used)
{
    while (i < hi) {
        uint64_t w = bm[i >> 6] ^ (used ? 0 : ~0ull);
        w &= ~0ull << (i & 63);
        if (w) {
            size_t j = (i & ~(size_t)63) + (size_t)__builtin_ctzll(w);
            return j < hi ? j : hi;
        }
        i = (i | 63) + 1;
    }
    return hi;
}

static void set_bits(uint64_t *bm, size_t from, size_t n, bool on)
{
    while (n) {
        size_t sh = from & 63, k = 64 - sh < n ? 64 - sh : n;
        uint64_t m = (k == 64 ? ~0ull : ((1ull << k) - 1)) << sh;
        if (on)
            bm[from >> 6] |= m;
        else
            bm[from >> 6] &= ~m;
        from += k;
        n -= k;
    }
}

/* First fit of n free units in [lo, hi); the start or SIZE_MAX. Costs a
 * word per 64 units passed plus one step per hole too small. */
static size_t find_run(const struct kv__alloc *a, size_t lo, size_t hi, size_t n)
{
    for (size_t i = lo;;) {
        i = next_bit(a->bitmap, i, hi, false);
        if (i >= hi || n > hi - i)
            return SIZE_MAX;
        size_t u = next_bit(a->bitmap, i, i + n, true);
        if (u == i + n)
            return i;
        i = u;
    }
}

static void took(struct kv__alloc *a, size_t at, size_t n)
{
    set_bits(a->bitmap, at, n, true);
    a->units_used += n;
    a->cursor = at + n < a->nunits ? at + n : 0;
}

/* Takes n contiguous units; the unit index or SIZE_MAX when none. */
static size_t take_units(struct kv__alloc *a, size_t n)
{
    pthread_mutex_lock(&a->lock);
    size_t at = find_run(a, a->cursor, a->nunits, n);
    if (at == SIZE_MAX)
        at = find_run(a, 0, a->cursor + n < a->nunits ? a->cursor + n : a->nunits, n);
    if (at != SIZE_MAX)
        took(a, at, n);
    pthread_mutex_unlock(&a->lock);
    return at;
}

/* The highest free slab page at or below hi; SIZE_MAX. A page is 16 units
 * on a 64 KiB boundary, one 16-bit field of a bitmap word. */
static size_t find_page_down(const struct kv__alloc *a, size_t hi)
{
    for (size_t k = hi + 1; k-- > 0;) {
        uint64_t w = a->bitmap[k >> 2];
        if (w == ~0ull) {
            k &= ~(size_t)3;
            continue;
        }
        if (((w >> ((k & 3) * UPP)) & 0xffff) == 0)
            return k;
    }
    return SIZE_MAX;
}

/* Takes one slab page, the highest free one; its page index or SIZE_MAX. */
static size_t take_page(struct kv__alloc *a)
{
    pthread_mutex_lock(&a->lock);
    size_t pg = a->npages ? find_page_down(a, a->slab_hint) : SIZE_MAX;
    if (pg != SIZE_MAX) {
        set_bits(a->bitmap, pg * UPP, UPP, true);
        a->units_used += UPP;
        a->slab_hint = pg;
    } else {
        a->slab_hint = 0;
    }
    pthread_mutex_unlock(&a->lock);
    return pg;
}

static void give_units(struct kv__alloc *a, size_t at, size_t n)
{
    pthread_mutex_lock(&a->lock);
    set_bits(a->bitmap, at, n, false);
    a->units_used -= n;
    size_t top = (at + n - 1) / UPP;
    if (top < a->npages && top > a->slab_hint)
        a->slab_hint = top;
    if (a->units_used == 0)
        a->cursor = 0;               /* emptied (a remove_all): fill from the start again */
    pthread_mutex_unlock(&a->lock);
}

static int class_of(const struct kv__alloc *a, size_t len)
{
    int lo = 0, hi = a->nclass - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (a->cls[mid].size >= len)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int kv__alloc_new(struct kv__alloc **out, void *base, size_t len, char *err, size_t errlen)
{
    *out = NULL;
    struct kv__alloc *a = calloc(1, sizeof *a);
    if (!a)
        return KV_ENOMEM;
    a->base = base;
    a->nunits = len / UNIT;
    a->npages = len / PAGE;
    size_t words = a->nunits / 64 + 1;
    a->pages = calloc(a->npages ? a->npages : 1, sizeof *a->pages);
    a->bitmap = calloc(words, sizeof *a->bitmap);
    if (!a->pages || !a->bitmap) {
        kv__errf(err, errlen, "cannot allocate the page map of %zu pages", a->npages);
        kv__alloc_free_all(a);
        return KV_ENOMEM;
    }
    set_bits(a->bitmap, a->nunits, words * 64 - a->nunits, true);   /* past the end: never free */
    a->slab_hint = a->npages ? a->npages - 1 : 0;
    pthread_mutex_init(&a->lock, NULL);
    /* 64, 128 ... 512, then 640, 768, 896, 1024, 1280 ... up to SMALL_MAX. */
    uint32_t size = 64;
    while (size <= SMALL_MAX && a->nclass < NCLASS_MAX) {
        struct sclass *c = &a->cls[a->nclass++];
        pthread_mutex_init(&c->lock, NULL);
        c->size = size;
        c->per_page = (uint32_t)(PAGE / size);
        c->partial = -1;
        size += size < 512 ? 64 : ((uint32_t)1 << (31 - __builtin_clz(size))) / 4;
    }
    *out = a;
    return KV_OK;
}

void kv__alloc_free_all(struct kv__alloc *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->nclass; i++)
        pthread_mutex_destroy(&a->cls[i].lock);
    if (a->pages && a->bitmap)
        pthread_mutex_destroy(&a->lock);
    free(a->pages);
    free(a->bitmap);
    free(a);
}

/* Lengths past this are refused before any rounding can overflow. */
#define LEN_MAX ((size_t)1 << 62)

size_t kv__alloc_size(const struct kv__alloc *a, size_t len)
{
    if (len < 1)
        len = 1;
    if (len > LEN_MAX)
        return SIZE_MAX;
    if (len > SMALL_MAX)
        return (len + UNIT - 1) & ~(UNIT - 1);
    return a->cls[class_of(a, len)].size;
}

static void list_remove(struct kv__alloc *a, struct sclass *c, int32_t pg)
{
    struct page *p = &a->pages[pg];
    if (p->prev >= 0)
        a->pages[p->prev].next = p->next;
    else
        c->partial = p->next;
    if (p->next >= 0)
        a->pages[p->next].prev = p->prev;
    p->prev = p->next = -1;
}

static void list_push(struct kv__alloc *a, struct sclass *c, int32_t pg)
{
    struct page *p = &a->pages[pg];
    p->prev = -1;
    p->next = c->partial;
    if (c->partial >= 0)
        a->pages[c->partial].prev = pg;
    c->partial = pg;
}

static void *slab_alloc(struct kv__alloc *a, int ci)
{
    struct sclass *c = &a->cls[ci];
    pthread_mutex_lock(&c->lock);
    if (c->partial < 0) {
        size_t pg = take_page(a);
        if (pg == SIZE_MAX) {
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        /* Thread the free list through the fresh page's slots. */
        struct page *p = &a->pages[pg];
        p->cls = (uint8_t)ci;
        p->nfree = (uint16_t)c->per_page;
        p->free_head = 1;
        uint8_t *mem = a->base + pg * PAGE;
        for (uint32_t k = 0; k < c->per_page; k++) {
            uint32_t next = k + 1 < c->per_page ? (k + 1) * c->size + 1 : 0;
            memcpy(mem + (size_t)k * c->size, &next, sizeof next);
        }
        list_push(a, c, (int32_t)pg);
    }
    int32_t pg = c->partial;
    struct page *p = &a->pages[pg];
    uint8_t *obj = a->base + (size_t)pg * PAGE + (p->free_head - 1);
    memcpy(&p->free_head, obj, sizeof p->free_head);
    if (--p->nfree == 0)
        list_remove(a, c, pg);
    pthread_mutex_unlock(&c->lock);
    return obj;
}

static void slab_free(struct kv__alloc *a, size_t pg, uint8_t *obj)
{
    struct page *p = &a->pages[pg];
    struct sclass *c = &a->cls[p->cls];
    pthread_mutex_lock(&c->lock);
    memcpy(obj, &p->free_head, sizeof p->free_head);
    p->free_head = (uint32_t)(obj - (a->base + pg * PAGE)) + 1;
    if (p->nfree++ == 0)
        list_push(a, c, (int32_t)pg);
    bool empty = p->nfree == c->per_page;
    if (empty)
        list_remove(a, c, (int32_t)pg);
    pthread_mutex_unlock(&c->lock);
    if (empty)
        give_units(a, pg * UPP, UPP);
}

void *kv__alloc(struct kv__alloc *a, size_t len)
{
    if (len < 1)
        len = 1;
    if (len > LEN_MAX)
        return NULL;
    if (len <= SMALL_MAX)
        return slab_alloc(a, class_of(a, len));
    size_t at = take_units(a, (len + UNIT - 1) >> UNIT_SHIFT);
    return at == SIZE_MAX ? NULL : a->base + (at << UNIT_SHIFT);
}

void kv__free(struct kv__alloc *a, void *ptr, size_t len)
{
    if (!ptr)
        return;
    uint8_t *obj = ptr;
    size_t off = (size_t)(obj - a->base);
    if (len < 1)
        len = 1;
    if (len <= SMALL_MAX)
        slab_free(a, off >> PAGE_SHIFT, obj);
    else
        give_units(a, off >> UNIT_SHIFT, (len + UNIT - 1) >> UNIT_SHIFT);
}

size_t kv__alloc_mapped(const struct kv__alloc *a)
{
    struct kv__alloc *m = (struct kv__alloc *)a;
    pthread_mutex_lock(&m->lock);
    size_t n = m->units_used << UNIT_SHIFT;
    pthread_mutex_unlock(&m->lock);
    return n;
}
