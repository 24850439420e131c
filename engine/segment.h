/*
 * segment.h — the DRAM tier's one memory segment.
 */
#ifndef KV_ENGINE_SEGMENT_H
#define KV_ENGINE_SEGMENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct kv__segment {
    uint8_t *base;         /* 2 MiB aligned; what the allocator carves */
    size_t len;
    void *map_base;        /* what mmap returned (may start below base) */
    size_t map_len;
    const char *pages;     /* "hugetlb", "thp" or "4k" */
    uint64_t fault_ns;     /* time spent faulting it in */
    int fd;                /* the memfd behind a shareable segment; -1 for anonymous memory */
    /* The background collapse of a memfd segment into 2 MiB pages (segment.c,
     * collapse_main): running from kv__segment_map's return until it is
     * done or kv__segment_unmap stops it. */
    pthread_t collapse_th;
    bool collapsing;       /* collapse_th was started (and is joined by its owner) */
    pid_t owner;           /* the process that started it: a forked child has no such thread */
    _Atomic bool collapse_stop;
};

/* ORed into kv__segment_map's hugepages: back the segment with a sealable
 * memfd instead of anonymous memory, so that a host store can hand it to
 * attached processes (engine/host.c). Only shared stores ask for it: shmem
 * gets transparent huge pages only where shmem_enabled allows, anonymous
 * memory wherever THP is on, so a store nobody attaches to keeps the
 * faster kind. */
#define KV__SEG_MEMFD 0x100

/* Maps len bytes and faults them in (hugepages: enum kv__hugepages). len 0
 * maps nothing and succeeds. KV_ENOMEM with a message on failure. A memfd
 * segment on a host whose shmem_enabled gives no huge pages returns with
 * 4 KiB pages (bar its first 2 MiB) and a thread that collapses the rest
 * into 2 MiB pages while the store serves (ShmemPmdMapped in
 * /proc/self/smaps_rollup shows how far it got); s must then stay where it
 * is until kv__segment_unmap. */
int  kv__segment_map(struct kv__segment *s, size_t len, int hugepages, char *err, size_t errlen);
void kv__segment_unmap(struct kv__segment *s);

/* Seals a memfd segment against resizing and against any new writable
 * mapping (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE), after its
 * one writable mapping is made: from then on only this process can write
 * it. KV_OK, or KV_ENOTSUP for a segment without a memfd. */
int  kv__segment_seal(struct kv__segment *s);

#endif
