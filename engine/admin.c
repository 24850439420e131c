/*
 * admin.c — the public ADMIN calls on an engine's SSD tier (kv_ssd_scan,
 * kv_ssd_scrub, kv_ssd_compact, kv_ssd_recover): argument checks, then
 * persist/.
 *
 * Key design choice: the engine only forwards; the walks live beside the
 * store they walk (persist/), so that RocksDB's types never leave persist/.
 */
#include "cluster.h"
#include "ssd.h"
#include "store.h"

KV__EXPORT int kv_ssd_scan(kv_engine *e, kv_ssd_cb cb, void *ctx)
{
    if (!e || !cb)
        return KV_EINVAL;
    if (!e->ssd)
        return KV_ENOTSUP;
    return kv__ssd_scan(e->ssd, cb, ctx);
}

KV__EXPORT int kv_ssd_scrub(kv_engine *e, int repair, kv_ssd_cb cb, void *ctx,
                            uint64_t *checked, uint64_t *bad)
{
    if (checked)
        *checked = 0;
    if (bad)
        *bad = 0;
    if (!e)
        return KV_EINVAL;
    if (!e->ssd)
        return KV_ENOTSUP;
    return kv__ssd_scrub(e->ssd, repair != 0, cb, ctx, checked, bad);
}

KV__EXPORT int kv_ssd_compact(kv_engine *e)
{
    if (!e)
        return KV_EINVAL;
    if (!e->ssd)
        return KV_ENOTSUP;
    return kv__ssd_compact(e->ssd);
}

KV__EXPORT int kv_ssd_recover(const kv_config *cfg, uint64_t *recovered, char *err,
                              size_t errlen)
{
    if (recovered)
        *recovered = 0;
    if (!cfg)
        return KV_EINVAL;
    if (!KV_PIPE_HAS_SSD(cfg->pipeline)) {
        kv__errf(err, errlen, "the config has no SSD tier (pipeline dram)");
        return KV_ENOTSUP;
    }
    return kv__ssd_recover(cfg, recovered, err, errlen);
}

KV__EXPORT int kv_shard_size(kv_engine *e, const kv_block_id *id, uint32_t index, uint64_t *len)
{
    if (len)
        *len = 0;
    if (!e || !id || !len)
        return KV_EINVAL;
    if (e->cluster)
        return kv__cluster_size(e->cluster, KV_NS_BLOCK, id, index, len);
    return kv__local_size(e, KV_NS_BLOCK, id, index, len);
}

KV__EXPORT int kv_ssd_remove(kv_engine *e, const kv_block_id *id)
{
    if (!e || !id)
        return KV_EINVAL;
    if (!e->ssd)
        return KV_ENOTSUP;
    return kv__ssd_remove(e->ssd, KV_NS_BLOCK, id, UINT32_MAX);
}
