/*
 * alloc.h — the size-class allocator that carves values from the segment.
 */
#ifndef KV_ENGINE_ALLOC_H
#define KV_ENGINE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

struct kv__alloc;

/* Creates a jemalloc arena whose extents all come from [base, base+len). */
int  kv__alloc_new(struct kv__alloc **out, void *base, size_t len, char *err, size_t errlen);
void kv__alloc_free_all(struct kv__alloc *a);   /* destroys the arena */

/* The bytes an allocation of len really takes (its size class). */
size_t kv__alloc_size(const struct kv__alloc *a, size_t len);
/* 64-byte aligned memory inside the segment, or NULL when there is no room. */
void *kv__alloc(struct kv__alloc *a, size_t len);
void  kv__free(struct kv__alloc *a, void *p, size_t len);

/* Bytes of the segment jemalloc has taken for extents so far. */
size_t kv__alloc_mapped(const struct kv__alloc *a);

#endif
