/*
 * engine.c — the benchmark's "kvengine" backend: the public API, one
 * task per batch.
 *
 * Key design choice: a batch is one kv_dump or kv_load task waited for at
 * once, exactly as a connector issues them, so the latency the benchmark
 * records is the task's. A failed load says only that some shard failed; to
 * tell misses from errors the backend asks kv_lookup about that batch,
 * outside the happy path.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>

static int engine_open(const struct kvctl_open_args *a, void **st)
{
    kv_engine *e = NULL;
    *st = NULL;
    int rc = kv_open(a->cfg, &e);
    if (rc != KV_OK)
        return rc;
    *st = e;
    return KV_OK;
}

static void engine_close(void *st)
{
    kv_close(st);   /* frees what engine_buffer gave */
}

static void *engine_buffer(void *st, size_t len)
{
    void *p = NULL;
    return kv_buffer_alloc(st, len, &p) == KV_OK ? p : NULL;
}

static void fill(int *res, size_t n, int v)
{
    for (size_t i = 0; i < n; i++)
        res[i] = v;
}

static int engine_put(void *st, const kv_shard *s, size_t n, int *res)
{
    kv_task t = 0;
    int rc = kv_dump(st, s, n, &t);
    if (rc == KV_OK)
        rc = kv_wait(st, t, 0);
    /* A failed task does not say which shard failed: count them all. */
    fill(res, n, rc);
    return rc;
}

static int engine_get(void *st, const kv_shard *s, size_t n, int *res)
{
    kv_task t = 0;
    int rc = kv_load(st, s, n, &t);
    if (rc == KV_OK)
        rc = kv_wait(st, t, 0);
    fill(res, n, rc);
    if (rc != KV_ENOTFOUND)
        return rc;
    /* Some shard was missing: the others were still copied. Ask which. */
    kv_block_id ids[64];
    uint8_t hit[64];
    for (size_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? n - i : 64;
        for (size_t j = 0; j < m; j++)
            ids[j] = s[i + j].block;
        if (kv_lookup(st, ids, m, hit) != KV_OK)
            return rc;
        for (size_t j = 0; j < m; j++)
            res[i + j] = hit[j] ? KV_OK : KV_ENOTFOUND;
    }
    return KV_OK;
}

static int engine_lookup(void *st, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    return kv_lookup(st, ids, n, hit);
}

static ssize_t engine_lookup_prefix(void *st, const kv_block_id *ids, size_t n)
{
    return kv_lookup_prefix(st, ids, n);
}

static void engine_info(void *st, struct kvctl_backend_info *out)
{
    kv_stats s;
    *out = (struct kvctl_backend_info){ 0 };
    if (kv_stats_get(st, &s) != KV_OK)
        return;
    out->open_ns = s.open_ns;
    out->index_bytes = s.dram_index_bytes;
    out->shards = s.dram_shards;
    out->dram_used = s.dram_used;
    out->hits_dram = s.hits_dram;
    out->hits_ssd = s.hits_ssd;
    out->spill_drops = s.spill_drops;
    out->attached = s.host_attached != 0;
}

const struct kvctl_backend kvctl_backend_kvengine = {
    .name = "kvengine",
    .open = engine_open,
    .close = engine_close,
    .put = engine_put,
    .get = engine_get,
    .lookup = engine_lookup,
    .info = engine_info,
    .lookup_prefix = engine_lookup_prefix,
    .buffer = engine_buffer,
};
