/*
 * alloc.c — carves values out of the segment: size-class slabs for small
 * values, runs of pages for large ones.
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
 * page is used for 64 KiB .. 4 MiB values), which for a cache is 20% more
 * blocks kept. KV-cache values come in a few fixed sizes
 * (a model's block size), which is the case a slab allocator is best at.
 *
 * How it works. The segment is cut into 64 KiB pages. A value of at least
 * half a page takes a run of whole pages (first fit from a rotating cursor
 * in a bitmap of free pages); the waste is under one page per value, 0.4%
 * for 1 MiB - 4 KiB. Smaller values go to size classes (multiples of 64
 * up to 512 bytes, then four classes per doubling, so at most 20% internal
 * waste); each class fills pages of its own, keeps a list of pages with
 * free slots, and gives a page back to the free pool when it empties, so
 * memory moves between classes as the mix of sizes changes.
 *
 * Locking: one mutex for the page bitmap, one per size class. A page run
 * allocation is a short bitmap scan next to a copy of at least 32 KiB.
 */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "internal.h"

#define PAGE_SHIFT 16
#define PAGE ((size_t)1 << PAGE_SHIFT)
#define SMALL_MAX (PAGE / 2)           /* larger values take page runs */
#define NCLASS_MAX 64

enum { PG_FREE = 0, PG_RUN = 1, PG_SLAB = 2 };

struct page {
    uint8_t kind;
    uint8_t cls;                       /* PG_SLAB: the size class */
    uint16_t nfree;                    /* PG_SLAB: free slots */
    uint32_t run;                      /* PG_RUN head: pages in the run */
    uint32_t free_head;                /* PG_SLAB: first free slot's offset + 1 (0 = none) */
    int32_t prev, next;                /* PG_SLAB: the class's list of pages with room */
};

struct sclass {
    pthread_mutex_t lock;
    uint32_t size;
    uint32_t per_page;
    int32_t partial;                   /* first page with free slots, -1 none */
} __attribute__((aligned(64)));

struct kv__alloc {
    uint8_t *base;
    size_t npages;
    struct page *pages;
    uint64_t *bitmap;                  /* 1 = page in use */
    size_t cursor;                     /* next-fit start, in pages */
    size_t pages_used;
    pthread_mutex_t lock;              /* bitmap, cursor, pages_used, page kinds */
    int nclass;
    struct sclass cls[NCLASS_MAX];
};

static bool bit(const uint64_t *bm, size_t i) { return (bm[i >> 6] >> (i & 63)) & 1; }

static void set_bits(uint64_t *bm, size_t from, size_t n, bool on)
{
    for (size_t i = from; i < from + n; i++) {
        if (on)
            bm[i >> 6] |= 1ull << (i & 63);
        else
            bm[i >> 6] &= ~(1ull << (i & 63));
    }
}

/* First fit of n free pages in [lo, hi); returns the start or SIZE_MAX. */
static size_t find_run(const struct kv__alloc *a, size_t lo, size_t hi, size_t n)
{
    size_t i = lo;
    while (i + n <= hi) {
        /* Skip whole words that are full. */
        if ((i & 63) == 0 && a->bitmap[i >> 6] == ~0ull) {
            i += 64;
            continue;
        }
        if (bit(a->bitmap, i)) {
            i++;
            continue;
        }
        size_t len = 1;
        while (len < n && !bit(a->bitmap, i + len))
            len++;
        if (len == n)
            return i;
        i += len + 1;
    }
    return SIZE_MAX;
}

/* Takes n contiguous pages; the page index or SIZE_MAX when none. */
static size_t take_pages(struct kv__alloc *a, size_t n, uint8_t kind)
{
    pthread_mutex_lock(&a->lock);
    size_t at = find_run(a, a->cursor, a->npages, n);
    if (at == SIZE_MAX)
        at = find_run(a, 0, a->cursor + n < a->npages ? a->cursor + n : a->npages, n);
    if (at != SIZE_MAX) {
        set_bits(a->bitmap, at, n, true);
        a->pages_used += n;
        a->cursor = at + n < a->npages ? at + n : 0;
        a->pages[at].kind = kind;
        a->pages[at].run = (uint32_t)n;
    }
    pthread_mutex_unlock(&a->lock);
    return at;
}

static void give_pages(struct kv__alloc *a, size_t at, size_t n)
{
    pthread_mutex_lock(&a->lock);
    set_bits(a->bitmap, at, n, false);
    a->pages_used -= n;
    a->pages[at].kind = PG_FREE;
    a->pages[at].run = 0;
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
    a->npages = len / PAGE;
    a->pages = calloc(a->npages ? a->npages : 1, sizeof *a->pages);
    a->bitmap = calloc((a->npages + 63) / 64 + 1, sizeof *a->bitmap);
    if (!a->pages || !a->bitmap) {
        kv__errf(err, errlen, "cannot allocate the page map of %zu pages", a->npages);
        kv__alloc_free_all(a);
        return KV_ENOMEM;
    }
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
    if (a->pages)
        pthread_mutex_destroy(&a->lock);
    free(a->pages);
    free(a->bitmap);
    free(a);
}

size_t kv__alloc_size(const struct kv__alloc *a, size_t len)
{
    if (len < 1)
        len = 1;
    if (len > SMALL_MAX)
        return (len + PAGE - 1) & ~(PAGE - 1);
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
        size_t pg = take_pages(a, 1, PG_SLAB);
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
        give_pages(a, pg, 1);
}

void *kv__alloc(struct kv__alloc *a, size_t len)
{
    if (len < 1)
        len = 1;
    if (len <= SMALL_MAX)
        return slab_alloc(a, class_of(a, len));
    size_t n = (len + PAGE - 1) >> PAGE_SHIFT;
    size_t at = take_pages(a, n, PG_RUN);
    return at == SIZE_MAX ? NULL : a->base + (at << PAGE_SHIFT);
}

void kv__free(struct kv__alloc *a, void *ptr, size_t len)
{
    if (!ptr)
        return;
    uint8_t *obj = ptr;
    size_t pg = (size_t)(obj - a->base) >> PAGE_SHIFT;
    if (len < 1)
        len = 1;
    if (len <= SMALL_MAX)
        slab_free(a, pg, obj);
    else
        give_pages(a, pg, (len + PAGE - 1) >> PAGE_SHIFT);
}

size_t kv__alloc_mapped(const struct kv__alloc *a)
{
    struct kv__alloc *m = (struct kv__alloc *)a;
    pthread_mutex_lock(&m->lock);
    size_t n = m->pages_used << PAGE_SHIFT;
    pthread_mutex_unlock(&m->lock);
    return n;
}
