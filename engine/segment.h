/*
 * segment.h — the DRAM tier's one memory segment.
 */
#ifndef KV_ENGINE_SEGMENT_H
#define KV_ENGINE_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

struct kv__segment {
    uint8_t *base;         /* 2 MiB aligned; what the allocator carves */
    size_t len;
    void *map_base;        /* what mmap returned (may start below base) */
    size_t map_len;
    const char *pages;     /* "hugetlb", "thp" or "4k" */
    uint64_t fault_ns;     /* time spent faulting it in */
};

/* Maps len bytes and faults them in (hugepages: enum kv__hugepages). len 0
 * maps nothing and succeeds. KV_ENOMEM with a message on failure. */
int  kv__segment_map(struct kv__segment *s, size_t len, int hugepages, char *err, size_t errlen);
void kv__segment_unmap(struct kv__segment *s);

#endif
