/*
 * alloc.c — values are carved from the segment by a jemalloc arena.
 *
 * Key design choice: instead of a hand-written slab, we create a private
 * jemalloc arena (arenas.create) with custom extent hooks whose only source
 * of memory is the segment. jemalloc then does what it is good at — size
 * classes, slabs for small values, page-run extents for large ones,
 * coalescing, low fragmentation — while every byte it hands out lies in the
 * one RDMA-registered range.
 *
 * How the hooks work: alloc() bumps through the segment; memory once given
 * to jemalloc is never given back (dalloc() refuses, so jemalloc keeps the
 * extent "retained" and reuses it), never decommitted and never purged (the
 * segment is faulted in once at open and must stay resident and registered),
 * and split()/merge() always succeed because the whole segment is one
 * mapping. Allocations use MALLOCX_TCACHE_NONE so freed memory is reusable
 * at once by any thread (a thread cache would hide it from the evictor's
 * accounting) and MALLOCX_ALIGN(64) so the index can store offsets in 64-byte
 * units.
 *
 * ThreadSanitizer cannot see jemalloc's internal locks (jemalloc is not
 * instrumented), so under TSan one mutex stands in for them: without it,
 * memory freed by one thread and reused by another looks like a race.
 */
#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "internal.h"

#if defined(__SANITIZE_THREAD__)
#define KV_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KV_TSAN 1
#endif
#endif

struct kv__alloc {
    extent_hooks_t hooks;        /* first: the hooks get a pointer to it */
    uint8_t *base;
    size_t len;
    size_t bump;                 /* under grow_lock */
    pthread_mutex_t grow_lock;
    unsigned arena;
    int flags;
#ifdef KV_TSAN
    pthread_mutex_t tsan_lock;
#endif
};

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
                        bool *zero, bool *commit, unsigned arena_ind)
{
    (void)arena_ind;
    struct kv__alloc *a = (struct kv__alloc *)h;
    void *ret = NULL;
    pthread_mutex_lock(&a->grow_lock);
    size_t off = (a->bump + alignment - 1) & ~(alignment - 1);
    if (off + size <= a->len && off >= a->bump &&
        (new_addr == NULL || new_addr == a->base + off)) {
        ret = a->base + off;
        a->bump = off + size;
    }
    pthread_mutex_unlock(&a->grow_lock);
    if (ret) {
        /* Fresh segment memory is zero: it was faulted in and never used. */
        *zero = true;
        *commit = true;
    }
    return ret;
}

static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed,
                        unsigned arena_ind)
{
    (void)h; (void)addr; (void)size; (void)committed; (void)arena_ind;
    return true;   /* opt out: jemalloc retains the extent and reuses it */
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed,
                         unsigned arena_ind)
{
    (void)h; (void)addr; (void)size; (void)committed; (void)arena_ind;
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t offset,
                        size_t length, unsigned arena_ind)
{
    (void)h; (void)addr; (void)size; (void)offset; (void)length; (void)arena_ind;
    return false;  /* always committed */
}

static bool hook_decommit(extent_hooks_t *h, void *addr, size_t size, size_t offset,
                          size_t length, unsigned arena_ind)
{
    (void)h; (void)addr; (void)size; (void)offset; (void)length; (void)arena_ind;
    return true;   /* refuse: the segment stays resident */
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a,
                       size_t size_b, bool committed, unsigned arena_ind)
{
    (void)h; (void)addr; (void)size; (void)size_a; (void)size_b; (void)committed;
    (void)arena_ind;
    return false;
}

static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b,
                       size_t size_b, bool committed, unsigned arena_ind)
{
    (void)h; (void)addr_a; (void)size_a; (void)addr_b; (void)size_b; (void)committed;
    (void)arena_ind;
    return false;
}

int kv__alloc_new(struct kv__alloc **out, void *base, size_t len, char *err, size_t errlen)
{
    *out = NULL;
    struct kv__alloc *a = calloc(1, sizeof *a);
    if (!a)
        return KV_ENOMEM;
    a->hooks = (extent_hooks_t){
        .alloc = hook_alloc, .dalloc = hook_dalloc, .destroy = hook_destroy,
        .commit = hook_commit, .decommit = hook_decommit,
        .purge_lazy = NULL, .purge_forced = NULL,
        .split = hook_split, .merge = hook_merge,
    };
    a->base = base;
    a->len = len;
    pthread_mutex_init(&a->grow_lock, NULL);
#ifdef KV_TSAN
    pthread_mutex_init(&a->tsan_lock, NULL);
#endif
    extent_hooks_t *hp = &a->hooks;
    size_t sz = sizeof a->arena;
    int rc = mallctl("arenas.create", &a->arena, &sz, &hp, sizeof hp);
    if (rc != 0) {
        kv__errf(err, errlen, "jemalloc arenas.create failed: %s", strerror(rc));
        pthread_mutex_destroy(&a->grow_lock);
        free(a);
        return KV_ENOMEM;
    }
    /* Never decay dirty pages: purging would only be refused anyway. */
    char name[64];
    ssize_t never = -1;
    snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", a->arena);
    mallctl(name, NULL, NULL, &never, sizeof never);
    snprintf(name, sizeof name, "arena.%u.muzzy_decay_ms", a->arena);
    mallctl(name, NULL, NULL, &never, sizeof never);
    a->flags = MALLOCX_ARENA(a->arena) | MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(64);
    *out = a;
    return KV_OK;
}

void kv__alloc_free_all(struct kv__alloc *a)
{
    if (!a)
        return;
    char name[64];
    snprintf(name, sizeof name, "arena.%u.destroy", a->arena);
    mallctl(name, NULL, NULL, NULL, 0);
    pthread_mutex_destroy(&a->grow_lock);
#ifdef KV_TSAN
    pthread_mutex_destroy(&a->tsan_lock);
#endif
    free(a);
}

size_t kv__alloc_size(const struct kv__alloc *a, size_t len)
{
    return nallocx(len ? len : 1, a->flags);
}

void *kv__alloc(struct kv__alloc *a, size_t len)
{
#ifdef KV_TSAN
    pthread_mutex_lock(&a->tsan_lock);
#endif
    void *p = mallocx(len ? len : 1, a->flags);
#ifdef KV_TSAN
    pthread_mutex_unlock(&a->tsan_lock);
#endif
    return p;
}

void kv__free(struct kv__alloc *a, void *p, size_t len)
{
    if (!p)
        return;
#ifdef KV_TSAN
    pthread_mutex_lock(&a->tsan_lock);
#endif
    sdallocx(p, len ? len : 1, a->flags);
#ifdef KV_TSAN
    pthread_mutex_unlock(&a->tsan_lock);
#endif
}

size_t kv__alloc_mapped(const struct kv__alloc *a)
{
    struct kv__alloc *m = (struct kv__alloc *)a;
    pthread_mutex_lock(&m->grow_lock);
    size_t n = m->bump;
    pthread_mutex_unlock(&m->grow_lock);
    return n;
}
