/*
 * metrics.h — the engine's side of metrics: task latency histograms and the
 * /metrics server started by kv_open when metrics.listen is set.
 *
 * The engine (engine.c) calls open after the workers start, one record per
 * finished dump or load task, and at teardown stop first (the server's
 * scrapes read the engine) and close once the workers are gone (they record
 * into the histograms until then).
 */
#ifndef KV_ENGINE_METRICS_H
#define KV_ENGINE_METRICS_H

#include "internal.h"

enum { KV__OP_DUMP = 0, KV__OP_LOAD = 1, KV__OP_COUNT = 2 };

struct kv__metrics;

/* Allocates the histograms and, when cfg->metrics.listen is set, starts
 * serving /metrics and /health there. KV_ENET when it cannot listen,
 * KV_ENOMEM. *out NULL on failure. */
int  kv__metrics_open(kv_engine *e, const struct kv_config *cfg, struct kv__metrics **out,
                      char *err, size_t errlen);
/* Stops the server, waiting for a scrape in progress. NULL ok. */
void kv__metrics_stop(struct kv__metrics *m);
/* Stops the server if still running, and frees. NULL ok. */
void kv__metrics_close(struct kv__metrics *m);
/* Records one finished task of op (KV__OP_*) that took ns from submit to
 * done. Lock-free: a few relaxed atomic adds. m NULL is a no-op. */
void kv__metrics_task(struct kv__metrics *m, int op, uint64_t ns, bool ok);

/* Lookup counters (kv_stats' lookup_* and prefix_*), striped: a thread
 * adds to its own stripe (picked once per thread, round robin) with relaxed
 * atomics, so threads looking up at once do not share a cache line; a
 * reader sums the stripes. A lookup call adds once per counter, not once
 * per id: its loop counts in registers. */
#define KV__LK_STRIPES 16
struct kv__lk_stripe {
    _Atomic uint64_t hits_dram, hits_ssd, misses, prefix_ids, prefix_hits;
} __attribute__((aligned(64)));
struct kv__lk_counters {
    struct kv__lk_stripe s[KV__LK_STRIPES];
};
/* Counts one lookup call's outcome: ids hit in DRAM, hit below, missed. */
void kv__metrics_lookups(struct kv__lk_counters *c, uint64_t dram, uint64_t ssd, uint64_t miss);
/* Counts one kv_lookup_prefix call: ids asked, ids in the leading run. */
void kv__metrics_prefix(struct kv__lk_counters *c, uint64_t ids, uint64_t hits);
/* Sums the stripes into out's lookup_* and prefix_* fields. */
void kv__metrics_lookup_sum(struct kv__lk_counters *c, kv_stats *out);

/* One exported metric, for the generated table (doc/metrics.md,
 * scripts/gendoc.c) and the naming test: the full name (kvengine_...), its
 * Prometheus type, its labels ("" or "tier", "op, result"...), which
 * programs export it, and its help line. */
struct kv__metric_doc {
    const char *name, *type, *labels, *who, *help;
};
/* Entry i of the table; KV_ENOTFOUND past the last. */
int kv__metrics_doc(size_t i, struct kv__metric_doc *out);

#endif
