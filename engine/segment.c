/*
 * segment.c — maps the DRAM tier's segment and faults it in, once.
 *
 * The whole capacity is one anonymous mapping so that it can be registered
 * for RDMA once and handed to the allocator as one range. Faulting fresh
 * memory is very slow here (about 14 µs per 4 KiB page), so it is paid at
 * kv_open and never on the copy path: with huge pages a fault covers 2 MiB.
 * We try, in order, reserved huge pages (MAP_HUGETLB), transparent huge
 * pages (MADV_HUGEPAGE on a 2 MiB aligned range), then plain pages, and
 * prefault with MADV_POPULATE_WRITE (one system call, no per-page trap),
 * falling back to touching a byte per page on kernels without it.
 *
 * A shared store's segment (KV__SEG_MEMFD) is a memfd instead, so that it
 * can be passed to attached processes over a Unix socket: huge pages from
 * MFD_HUGETLB when reserved ones exist, else shmem pages (transparent huge
 * ones where shmem_enabled allows MADV_HUGEPAGE, or made huge by
 * MADV_COLLAPSE where it does not: collapse(), on a thread of its own after
 * the open, collapse_main()). It is sealed once mapped (kv__segment_seal),
 * so that a descriptor for it can only ever give a read-only mapping of a
 * fixed size.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "segment.h"

static bool shmem_thp(void);
static bool collapse(uint8_t *p, size_t len);

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25   /* Linux 6.1; an older kernel says EINVAL */
#endif

#define HUGE_SZ (2u << 20)

/* 0, or an errno when the memory cannot be had (ENOMEM): better to fail
 * kv_open than to be killed by the OOM killer later on the copy path. */
static int prefault(uint8_t *p, size_t len)
{
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0)
        return 0;
    if (errno != EINVAL)
        return errno;
#endif
    long page = sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < len; off += (size_t)page)
        ((volatile uint8_t *)p)[off] = 0;
    return 0;
}

static int map_hugetlb(struct kv__segment *s, size_t len)
{
#ifdef MAP_HUGETLB
    size_t rounded = (len + HUGE_SZ - 1) & ~(size_t)(HUGE_SZ - 1);
    void *p = mmap(NULL, rounded, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    s->map_base = p;
    s->map_len = rounded;
    s->base = p;
    s->pages = "hugetlb";
    return 0;
#else
    (void)s; (void)len;
    return -1;
#endif
}

static int map_plain(struct kv__segment *s, size_t len, bool thp)
{
    /* Over-map by 2 MiB so that the range we use can be 2 MiB aligned:
     * THP only backs aligned 2 MiB extents. */
    size_t map_len = len + HUGE_SZ;
    uint8_t *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    uint8_t *base = (uint8_t *)(((uintptr_t)p + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
    s->map_base = p;
    s->map_len = map_len;
    s->base = base;
    s->pages = "4k";
    if (thp && madvise(base, len, MADV_HUGEPAGE) == 0)
        s->pages = "thp";
    else if (!thp)
        madvise(base, len, MADV_NOHUGEPAGE);
    return 0;
}

/* A memfd of len bytes mapped shared and writable: hugetlb first (when
 * allowed), then shmem. *later: the rest of it is to be collapsed into
 * 2 MiB pages after the open (collapse_main). */
static int map_memfd(struct kv__segment *s, size_t len, int hugepages, bool *later)
{
    *later = false;
#ifdef MFD_HUGETLB
    if (hugepages != KV_HUGE_OFF) {
        size_t rounded = (len + HUGE_SZ - 1) & ~(size_t)(HUGE_SZ - 1);
        int fd = memfd_create("kvengine-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
        if (fd >= 0 && ftruncate(fd, (off_t)rounded) == 0) {
            void *p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
            if (p != MAP_FAILED) {
                s->map_base = s->base = p;
                s->map_len = rounded;
                s->fd = fd;
                s->pages = "hugetlb";
                return 0;
            }
        }
        if (fd >= 0)
            close(fd);
    }
#endif
    int fd = memfd_create("kvengine-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    /* 2 MiB aligned, as map_plain: a huge page of the file can back only a
     * range whose address and offset agree modulo 2 MiB. */
    uint8_t *r = mmap(NULL, len + HUGE_SZ, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    uint8_t *base = (uint8_t *)(((uintptr_t)r + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
    void *p = r == MAP_FAILED ? MAP_FAILED
                              : mmap(base, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        if (r != MAP_FAILED)
            munmap(r, len + HUGE_SZ);
        close(fd);
        errno = e;
        return -1;
    }
    s->map_base = r;
    s->map_len = len + HUGE_SZ;
    s->base = p;
    s->fd = fd;
    s->pages = "shmem";
    if (hugepages != KV_HUGE_OFF && madvise(p, len, MADV_HUGEPAGE) == 0) {
        if (shmem_thp())
            s->pages = "shmem-thp";
        else if (collapse(p, len))
            s->pages = "shmem-thp", *later = len >= 2 * (size_t)HUGE_SZ;
    }
    return 0;
}

/*
 * Huge pages for a shmem segment where shmem_enabled does not give them
 * ("never", Debian's default: a host-wide setting we leave alone). With
 * 4 KiB pages every process that maps the store faults each page it reads
 * (16 per fault) and holds a page-table entry per page: an attached
 * process's one-pass load spent about a quarter of its time there
 * (doc/perf.md). MADV_COLLAPSE (Linux 6.1) builds 2 MiB pages of a range
 * on request whatever shmem_enabled says, short of "deny" (the operator's
 * off switch, which it obeys). Then the file's pages are huge, and every
 * mapping of it made 2 MiB aligned (the attached clients', net/shm.c) maps
 * a whole 2 MiB per fault. Where it fails (an older kernel, "deny", no free
 * huge pages) the segment keeps 4 KiB pages, as before.
 *
 * Only the first 2 MiB are collapsed here, inside the open: it says whether
 * the kernel will do it at all (the open log, and dram.hugepages: on, must
 * not claim huge pages the segment will not get). It needs a page present,
 * so one byte is written first (fresh memory: zeros either way). The rest
 * is collapsed by collapse_main after the open has faulted it in with
 * 4 KiB pages: a whole segment collapsed inside the open made a loaded host
 * wait for it (1 GiB at load average 14: 7.1 s, against 4.2-5.9 s for the
 * 4 KiB fill; the 2 MiB allocations compete with everyone's memory), and
 * the store serves just as well from 4 KiB pages meanwhile.
 */
static bool collapse(uint8_t *p, size_t len)
{
    if (len < HUGE_SZ)
        return false;
    ((volatile uint8_t *)p)[0] = 0;
    return madvise(p, HUGE_SZ, MADV_COLLAPSE) == 0;
}

/*
 * The background collapse: one 2 MiB extent per call, so that each holds
 * the kernel's locks on the file for one extent only (a reader or writer
 * that faults on it waits for that long, on the extent's folio lock; the
 * kernel unmaps the small pages before it copies them, so nobody sees a
 * half-copied extent), and kv__segment_unmap's stop is seen within one
 * extent. The extents are in use meanwhile: dumps land in them, attached
 * clients copy out of them; the collapse copies what they hold. An extent
 * that is busy (EAGAIN) is tried again twice, then left with 4 KiB pages;
 * any other failure (no free huge page, "deny" set meanwhile) ends the
 * thread: the rest keeps 4 KiB pages, which serve as well, only slower.
 * It runs at the default priority: a background thread at a lower one
 * would, on a host that is always busy, never finish.
 */
static void *collapse_main(void *arg)
{
    struct kv__segment *s = arg;
    size_t whole = s->len & ~(size_t)(HUGE_SZ - 1);
    for (size_t off = HUGE_SZ; off < whole && !atomic_load(&s->collapse_stop); off += HUGE_SZ) {
        int r = -1;
        for (int tries = 0; r != 0 && tries < 3; tries++)
            if ((r = madvise(s->base + off, HUGE_SZ, MADV_COLLAPSE)) != 0 && errno != EAGAIN)
                break;
        if (r != 0 && errno != EAGAIN)
            break;
    }
    return NULL;
}

/* Starts collapse_main; where no thread can be had the segment keeps its
 * 4 KiB pages (slower copies, nothing else). */
static void collapse_start(struct kv__segment *s)
{
    atomic_store(&s->collapse_stop, false);
    s->owner = getpid();
    s->collapsing = pthread_create(&s->collapse_th, NULL, collapse_main, s) == 0;
}

/* Whether shmem may get transparent huge pages here at all: the madvise
 * above succeeds even where shmem_enabled is never (this VM's), and the
 * open log must not claim huge pages the segment will not get. */
static bool shmem_thp(void)
{
    char buf[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *on = strchr(buf, '[');
    return on && (strncmp(on, "[always]", 8) == 0 || strncmp(on, "[within_size]", 13) == 0 ||
                  strncmp(on, "[advise]", 8) == 0 || strncmp(on, "[force]", 7) == 0);
}

int kv__segment_seal(struct kv__segment *s)
{
    if (s->fd < 0)
        return KV_ENOTSUP;
    if (fcntl(s->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE) != 0)
        return kv__err_from_errno(errno);
    return KV_OK;
}

/* MemAvailable from /proc/meminfo in bytes, or 0 when unknown. */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

int kv__segment_map(struct kv__segment *s, size_t len, int hugepages, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    bool memfd = (hugepages & KV__SEG_MEMFD) != 0;
    hugepages &= ~KV__SEG_MEMFD;
    if (len == 0) {
        s->pages = "none";
        return KV_OK;
    }
    /* Faulting in more than the machine has gets the process OOM-killed
     * instead of an error: refuse up front. */
    uint64_t avail = mem_available();
    if (avail && len > avail) {
        kv__errf(err, errlen, "dram.capacity: %zu bytes is more than the %llu bytes of memory available",
                 len, (unsigned long long)avail);
        return KV_ENOMEM;
    }
    uint64_t t0 = kv__now_ns();
    bool done = false, later = false;
    if (memfd) {
        if (map_memfd(s, len, hugepages, &later) != 0) {
            int e = errno;
            kv__errf(err, errlen, "dram.capacity: cannot map a %zu-byte memfd: %s", len, strerror(e));
            return KV_ENOMEM;
        }
        done = true;
    } else if (hugepages != KV_HUGE_OFF)
        done = map_hugetlb(s, len) == 0;
    if (!done && map_plain(s, len, hugepages != KV_HUGE_OFF) != 0) {
        int e = errno;
        kv__errf(err, errlen, "dram.capacity: cannot map %zu bytes: %s", len, strerror(e));
        return KV_ENOMEM;
    }
    s->len = len;
    if (hugepages == KV_HUGE_ON && (strcmp(s->pages, "4k") == 0 || strcmp(s->pages, "shmem") == 0)) {
        kv__errf(err, errlen, "dram.hugepages is on but neither reserved huge pages nor "
                 "transparent huge pages are available (set it to auto or off)");
        kv__segment_unmap(s);
        return KV_ENOTSUP;
    }
    int e = strcmp(s->pages, "hugetlb") != 0 ? prefault(s->base, len) : 0;
    if (e != 0) {
        kv__errf(err, errlen, "dram.capacity: cannot fault in %zu bytes: %s", len, strerror(e));
        kv__segment_unmap(s);
        return KV_ENOMEM;
    }
    s->fault_ns = kv__now_ns() - t0;
    if (later)
        collapse_start(s);
    return KV_OK;
}

void kv__segment_unmap(struct kv__segment *s)
{
    /* The collapse first: it works on the mapping. A forked child has a
     * copy of the flag but no thread to join. */
    if (s->collapsing && s->owner == getpid()) {
        atomic_store(&s->collapse_stop, true);
        pthread_join(s->collapse_th, NULL);
    }
    s->collapsing = false;
    if (s->map_base)
        munmap(s->map_base, s->map_len);
    if (s->fd >= 0)
        close(s->fd);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}
