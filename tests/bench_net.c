/*
 * bench_net.c — what a connection's set-up and a loaded value cost on the
 * tcp transport: connect latency (the challenge-response) and 1 MiB load
 * throughput (with the end-to-end checksum), over loopback against a heap
 * store (tests/testutil_memstore.c), so only the transport is measured.
 *
 * Not part of the test runner; built by hand against a tree's library, so
 * the same source measures two trees in one run:
 *   make -j2 all build/tests/check_kvengine && \
 *   cc -O2 -D_GNU_SOURCE -Iinclude -I. -Itests tests/bench_net.c \
 *      build/obj/tests/testutil_memstore.o build/libkvengine.a -o build/bench_net \
 *      -lrocksdb -lyaml -llz4 -lxxhash -lmicrohttpd -libverbs -lcurl -ljson-c -lcrypto \
 *      -lpthread -lm
 *   build/bench_net [connects] [loads]      (defaults 2000 and 2000)
 * Prints: connects, median and p99 connect+close latency in us; loads of
 * 1 MiB (8 per batch) and MiB/s over the best of three passes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/transport.h"

struct kv__backend *kv__memstore_new(uint64_t cap_bytes);
void kv__memstore_free(struct kv__backend *b);

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int nconn = argc > 1 ? atoi(argv[1]) : 2000, nload = argc > 2 ? atoi(argv[2]) : 2000;
    const struct kv__transport_ops *T = &kv__tcp_transport;
    enum { SHARDS = 64, BATCH = 8 };
    const size_t len = 1u << 20;
    struct kv__backend *be = kv__memstore_new((uint64_t)(SHARDS + 8) * len);
    struct kv__net_opts o;
    memset(&o, 0, sizeof o);
    snprintf(o.token, sizeof o.token, "bench-token");
    o.timeout_ms = 5000;
    o.threads = 2;
    struct kv__transport *srv = NULL, *cli = NULL;
    char addr[64], err[256];
    if (T->create(&o, be, &srv, err, sizeof err) || T->listen(srv, "127.0.0.1:0", addr,
                                                              sizeof addr, err, sizeof err) ||
        T->create(&o, NULL, &cli, err, sizeof err)) {
        fprintf(stderr, "bench_net: %s\n", err);
        return 1;
    }
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1%s", strrchr(addr, ':'));
    double *lat = malloc((size_t)nconn * sizeof *lat);
    for (int i = 0; i < nconn; i++) {
        struct kv__conn *c;
        double t0 = now_us();
        if (T->connect(cli, a, &c)) {
            fprintf(stderr, "bench_net: connect failed\n");
            return 1;
        }
        T->close(c);
        lat[i] = now_us() - t0;
    }
    qsort(lat, (size_t)nconn, sizeof *lat, cmp);
    printf("connect+close: %d connects, p50 %.1f us, p99 %.1f us\n", nconn, lat[nconn / 2],
           lat[nconn * 99 / 100]);
    free(lat);

    struct kv__conn *c;
    if (T->connect(cli, a, &c))
        return 1;
    uint8_t *src = malloc(len * SHARDS), *dst = malloc(len * BATCH);
    for (size_t i = 0; i < len * SHARDS; i++)
        src[i] = (uint8_t)(i * 2654435761u >> 13);
    kv_iov iv[SHARDS];
    struct kv__op ops[SHARDS];
    for (int i = 0; i < SHARDS; i++) {
        iv[i] = (kv_iov){ src + (size_t)i * len, len };
        ops[i] = (struct kv__op){ .kind = KV_OP_DUMP, .ns = KV_NS_BLOCK, .index = (uint32_t)i,
                                  .iov = &iv[i], .iovcnt = 1 };
    }
    if (T->batch(c, ops, SHARDS))
        return 1;
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = now_us();
        int done = 0;
        while (done < nload) {
            kv_iov dv[BATCH];
            struct kv__op l[BATCH];
            for (int k = 0; k < BATCH; k++) {
                int s = (done + k) % SHARDS;
                dv[k] = (kv_iov){ dst + (size_t)k * len, len };
                l[k] = (struct kv__op){ .kind = KV_OP_LOAD, .ns = KV_NS_BLOCK,
                                        .index = (uint32_t)s, .iov = &dv[k], .iovcnt = 1 };
            }
            if (T->batch(c, l, BATCH))
                return 1;
            for (int k = 0; k < BATCH; k++)
                if (l[k].result != KV_OK) {
                    fprintf(stderr, "bench_net: load failed: %d\n", l[k].result);
                    return 1;
                }
            done += BATCH;
        }
        double mib_s = (double)done * (double)len / (1 << 20) / ((now_us() - t0) / 1e6);
        best = mib_s > best ? mib_s : best;
    }
    printf("load 1 MiB x %d (batches of %d): %.0f MiB/s (best of 3)\n", nload, BATCH, best);
    T->close(c);
    T->destroy(cli);
    T->destroy(srv);
    kv__memstore_free(be);
    free(src);
    free(dst);
    return 0;
}
