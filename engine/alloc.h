/*
 * alloc.h — the size-class allocator that carves values from the segment:
 * slabs of size classes for small values (64 KiB pages), runs of 4 KiB
 * units for large ones (alloc.c says why not a jemalloc arena: measured, it
 * kept 20% fewer blocks; and why 4 KiB).
 */
#ifndef KV_ENGINE_ALLOC_H
#define KV_ENGINE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

struct kv__alloc;

/* An allocator over [base, base+len) (the segment; it keeps its own
 * metadata outside it). KV_ENOMEM with a message. */
int  kv__alloc_new(struct kv__alloc **out, void *base, size_t len, char *err, size_t errlen);
void kv__alloc_free_all(struct kv__alloc *a);   /* frees the allocator, not the segment */

/* The bytes an allocation of len really takes (its size class). */
size_t kv__alloc_size(const struct kv__alloc *a, size_t len);
/* Memory inside the segment, or NULL when there is no room: 64-byte
 * aligned, and 4 KiB aligned when len is over 32 KiB (a run). */
void *kv__alloc(struct kv__alloc *a, size_t len);
void  kv__free(struct kv__alloc *a, void *p, size_t len);

/* Bytes of the segment handed out so far (units in runs, and size-class
 * slab pages whole). */
size_t kv__alloc_mapped(const struct kv__alloc *a);

#endif
