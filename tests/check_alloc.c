/*
 * check_alloc.c — the segment allocator and the segment itself.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/alloc.h"
#include "engine/internal.h"
#include "engine/segment.h"
#include "testutil.h"

static struct kv__segment seg;
static struct kv__alloc *al;

static void make(size_t mib)
{
    char err[256];
    ck_assert_int_eq(kv__segment_map(&seg, mib << 20, KV_HUGE_AUTO, err, sizeof err), KV_OK);
    ck_assert_int_eq(kv__alloc_new(&al, seg.base, seg.len, err, sizeof err), KV_OK);
}

static void unmake(void)
{
    kv__alloc_free_all(al);
    kv__segment_unmap(&seg);
}

/* Fills the segment with values of one size; returns how many fit. */
static size_t fill(size_t len, void **out, size_t max)
{
    size_t n = 0;
    while (n < max && (out[n] = kv__alloc(al, len)) != NULL) {
        uint8_t *p = out[n];
        ck_assert(p >= seg.base);
        ck_assert(p + len <= seg.base + seg.len);
        ck_assert_uint_eq((uintptr_t)p % 64, 0);
        n++;
    }
    return n;
}

START_TEST(equal_values_use_the_whole_segment)
{
    static void *p[70000];
    /* The sizes KV caches use, and a few awkward ones. */
    size_t sizes[] = { 1000, 4096, 65536, (1 << 20) - 4096, 1 << 20, 4 << 20, 3000, 40000 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        make(64);
        size_t n = fill(sizes[i], p, 70000);
        double used = (double)n * (double)kv__alloc_size(al, sizes[i]) / (double)seg.len;
        ck_assert_msg(used >= 0.98, "size %zu: %zu values use %.1f%% of the segment",
                      sizes[i], n, used * 100);
        if (sizes[i] >= 65536)                 /* page runs: not one page lost */
            ck_assert_uint_eq(n, seg.len / kv__alloc_size(al, sizes[i]));
        /* The class wastes at most a fifth of a small value, under a page
         * of a large one. */
        ck_assert_uint_le(kv__alloc_size(al, sizes[i]), sizes[i] + sizes[i] / 4 + 65536);
        unmake();
    }
}
END_TEST

START_TEST(freed_memory_is_reused_by_other_sizes)
{
    static void *p[70000], *q[70000];
    make(16);
    size_t n = fill(1000, p, 70000);
    ck_assert_uint_gt(n, 0);
    ck_assert_ptr_null(kv__alloc(al, 1 << 20));       /* full */
    for (size_t i = 0; i < n; i++)
        kv__free(al, p[i], 1000);
    ck_assert_uint_eq(kv__alloc_mapped(al), 0);       /* every page back */
    size_t m = fill(1 << 20, q, 70000);
    ck_assert_uint_eq(m, 16);                         /* small pages became large runs */
    for (size_t i = 0; i < m; i++)
        kv__free(al, q[i], 1 << 20);
    ck_assert_uint_eq(kv__alloc_mapped(al), 0);
    unmake();
}
END_TEST

START_TEST(values_do_not_overlap)
{
    static void *p[4096];
    static size_t len[4096];
    make(32);
    unsigned r = 1;
    size_t n = 0;
    for (; n < 4096; n++) {
        r = r * 1103515245u + 12345u;
        len[n] = 1 + (r >> 8) % 200000;
        p[n] = kv__alloc(al, len[n]);
        if (!p[n])
            break;
        memset(p[n], (int)(n & 0xff), len[n]);
        if (n % 3 == 2) {                              /* free some as we go */
            kv__free(al, p[n - 1], len[n - 1]);
            p[n - 1] = NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!p[i])
            continue;
        const uint8_t *b = p[i];
        for (size_t k = 0; k < len[i]; k += 997)
            ck_assert_uint_eq(b[k], i & 0xff);
    }
    unmake();
}
END_TEST

START_TEST(segment_of_zero_maps_nothing_and_huge_off_works)
{
    char err[256];
    struct kv__segment s;
    ck_assert_int_eq(kv__segment_map(&s, 0, KV_HUGE_AUTO, err, sizeof err), KV_OK);
    ck_assert_ptr_null(s.base);
    kv__segment_unmap(&s);
    ck_assert_int_eq(kv__segment_map(&s, 4 << 20, KV_HUGE_OFF, err, sizeof err), KV_OK);
    ck_assert_str_eq(s.pages, "4k");
    ck_assert_uint_eq((uintptr_t)s.base % (2 << 20), 0);
    memset(s.base, 1, s.len);
    kv__segment_unmap(&s);
}
END_TEST

START_TEST(a_segment_larger_than_memory_is_refused)
{
    char err[256] = "";
    struct kv__segment s;
    ck_assert_int_eq(kv__segment_map(&s, (size_t)255 << 30, KV_HUGE_AUTO, err, sizeof err), KV_ENOMEM);
    ck_assert_msg(strstr(err, "dram.capacity") && strstr(err, "available"), "%s", err);
    kv_config *cfg;
    kv_engine *e = (kv_engine *)1;
    ck_assert_int_eq(kv_config_new(&cfg), KV_OK);
    ck_assert_int_eq(kv_config_set(cfg, "pipeline", "dram"), KV_OK);
    ck_assert_int_eq(kv_config_set(cfg, "dram.capacity", "255GiB"), KV_OK);
    ck_assert_int_eq(kv_open(cfg, &e), KV_ENOMEM);
    ck_assert_ptr_null(e);
    kv_config_free(cfg);
}
END_TEST

/* kv__copy copies exactly what memcpy does, on both of its paths: every
 * length around the 4 KiB switch and the 64-byte pieces, at every relative
 * offset of the slow window and around it, never writing past the end. */
START_TEST(copy_equals_memcpy_at_every_offset)
{
    const size_t cap = 72 << 10;         /* a multiple of the alignment, as aligned_alloc requires */
    uint8_t *src = aligned_alloc(4096, cap), *dst = aligned_alloc(4096, cap),
            *ref = aligned_alloc(4096, cap);
    ck_assert(src && dst && ref);
    for (size_t i = 0; i < cap; i++)
        src[i] = (uint8_t)(i * 131 + 7);
    const size_t lens[] = { 0, 1, 63, 64, 65, 4095, 4096, 4097, 4160, 65536, 65536 + 21, 70000 };
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
        for (size_t off = 0; off <= 70; off++) {
            size_t n = lens[l];
            memset(dst, 0xee, cap);
            memset(ref, 0xee, cap);
            memcpy(ref + off, src + 3, n);
            kv__copy(dst + off, src + 3, n);
            ck_assert_msg(memcmp(dst, ref, cap) == 0, "len %zu off %zu", n, off);
        }
    free(src);
    free(dst);
    free(ref);
}
END_TEST

Suite *alloc_suite(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("alloc");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, equal_values_use_the_whole_segment);
    tcase_add_test(tc, copy_equals_memcpy_at_every_offset);
    tcase_add_test(tc, freed_memory_is_reused_by_other_sizes);
    tcase_add_test(tc, values_do_not_overlap);
    tcase_add_test(tc, segment_of_zero_maps_nothing_and_huge_off_works);
    tcase_add_test(tc, a_segment_larger_than_memory_is_refused);
    suite_add_tcase(s, tc);
    return s;
}
