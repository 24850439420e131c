/*
 * copy.c — what a plain key's put costs from page-aligned memory, next to
 * memcpy at the same relative alignment, in one run. A measurement to read,
 * not a test.
 *
 *   copy [VALUE_BYTES [KEYS [ROUNDS]]]
 *
 * A plain key's record is [klen][key][value], so a value put from memory
 * that starts on a page (a Mooncake BufferPool lease, a registered buffer,
 * an aligned tensor) lands 1 + klen bytes past that alignment. glibc's
 * memcpy (rep movsb above a few KiB) runs some twenty times slower on AMD
 * Zen in that case (engine/internal.h, kv__copy). This prints memcpy's
 * GB/s by relative offset, then kv_put and kv_get of KEYS values from a
 * page-aligned buffer into an in-process DRAM engine (best of ROUNDS).
 * Build against the library to measure:
 *   cc -O2 -Iinclude bench/copy.c -o build/bench_copy -Lbuild -lkvengine
 *   LD_LIBRARY_PATH=build build/bench_copy 65536 2000 5
 */
#include <kvengine.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t vlen = argc > 1 ? strtoull(argv[1], NULL, 0) : 65536;
    int keys = argc > 2 ? atoi(argv[2]) : 2000, rounds = argc > 3 ? atoi(argv[3]) : 5;
    if (vlen == 0 || keys <= 0 || rounds <= 0)
        return fprintf(stderr, "usage: copy [VALUE_BYTES [KEYS [ROUNDS]]]\n"), 2;
    size_t room = (vlen + 8192 + 4095) & ~(size_t)4095;   /* aligned_alloc wants a multiple */
    uint8_t *src = aligned_alloc(4096, room), *dst = aligned_alloc(4096, room);
    if (!src || !dst)
        return 1;
    memset(src, 0x5a, room);
    memset(dst, 0, room);
    printf("memcpy of %zu bytes, GB/s by (dst - src) mod 4096:", vlen);
    const int offs[] = { 0, 8, 21, 32, 64 };
    for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
        double best = 1e9;
        for (int r = 0; r < rounds; r++) {
            double t = now();
            for (int i = 0; i < 200; i++) {
                memcpy(dst + offs[k], src, vlen);
                __asm__ volatile("" : : "r"(dst) : "memory");
            }
            t = now() - t;
            best = t < best ? t : best;
        }
        printf("  %d: %.1f", offs[k], 200.0 * (double)vlen / best / 1e9);
    }
    printf("\n");
    kv_config *cfg;
    kv_engine *e;
    char cap[32];
    snprintf(cap, sizeof cap, "%zu", (vlen + 4096) * 2 * (size_t)keys + (64u << 20));
    if (kv_config_new(&cfg) || kv_config_set(cfg, "pipeline", "dram") ||
        kv_config_set(cfg, "dram.capacity", cap) || kv_open(cfg, &e))
        return fprintf(stderr, "kv_open failed\n"), 1;
    kv_config_free(cfg);
    double bput = 1e9, bget = 1e9;
    char key[32];
    for (int r = 0; r < rounds; r++) {
        double t = now();
        for (int i = 0; i < keys; i++) {
            snprintf(key, sizeof key, "object-key-%08d", i);   /* 19 bytes, like a hash key */
            if (kv_put(e, key, strlen(key), src, vlen) != KV_OK)
                return fprintf(stderr, "kv_put failed\n"), 1;
        }
        t = now() - t;
        bput = t < bput ? t : bput;
        t = now();
        for (int i = 0; i < keys; i++) {
            size_t got = 0;
            snprintf(key, sizeof key, "object-key-%08d", i);
            if (kv_get(e, key, strlen(key), dst, vlen, &got) != KV_OK || got != vlen)
                return fprintf(stderr, "kv_get failed\n"), 1;
        }
        t = now() - t;
        bget = t < bget ? t : bget;
    }
    printf("kv_put from page-aligned memory: %.2f GB/s, kv_get into it: %.2f GB/s (%d x %zu B, best of %d)\n",
           (double)keys * (double)vlen / bput / 1e9, (double)keys * (double)vlen / bget / 1e9, keys,
           vlen, rounds);
    kv_close(e);
    free(src);
    free(dst);
    return 0;
}
