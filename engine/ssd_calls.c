/*
 * ssd_calls.c — the public ADMIN calls on an engine's SSD tier (kv_ssd_scan,
 * kv_ssd_scrub, kv_ssd_compact, kv_ssd_recover, kv_ssd_remove) and
 * kv_shard_size: argument checks, then the tier's ops.
 *
 * Key design choice: the engine only forwards: an attached engine to the
 * process serving its store (engine/host.c, net/shm.c), any other through
 * the tier interface (the tier named "ssd", and its optional admin ops);
 * the walks live beside the store they walk (persist/), so that RocksDB's
 * types never leave it.
 */
#include "host.h"
#include "net/cluster.h"
#include "net/shm.h"
#include "store.h"

/* The open tier the kv_ssd_* calls act on; NULL when the pipeline has none. */
static const struct kv__tier *ssd_tier(kv_engine *e)
{
    return kv__store_tier(e, "ssd");
}

KV__EXPORT int kv_ssd_scan(kv_engine *e, kv_ssd_cb cb, void *ctx)
{
    if (!e || !cb)
        return KV_EINVAL;
    KV__HOST_ROUTE(e, kv__shm_ssd_scan(hc, cb, ctx));   /* attached: the server's tier */
    const struct kv__tier *t = ssd_tier(e);
    if (!t || !t->ops->scan)
        return KV_ENOTSUP;
    return t->ops->scan(t->ctx, cb, ctx);
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
    KV__HOST_ROUTE(e, kv__shm_ssd_scrub(hc, repair, cb, ctx, checked, bad));
    const struct kv__tier *t = ssd_tier(e);
    if (!t || !t->ops->scrub)
        return KV_ENOTSUP;
    return t->ops->scrub(t->ctx, repair != 0, cb, ctx, checked, bad);
}

KV__EXPORT int kv_ssd_compact(kv_engine *e)
{
    if (!e)
        return KV_EINVAL;
    KV__HOST_ROUTE(e, kv__shm_ssd_compact(hc));
    const struct kv__tier *t = ssd_tier(e);
    if (!t || !t->ops->compact)
        return KV_ENOTSUP;
    return t->ops->compact(t->ctx);
}

KV__EXPORT int kv_ssd_recover(const kv_config *cfg, uint64_t *recovered, char *err,
                              size_t errlen)
{
    if (recovered)
        *recovered = 0;
    if (!cfg)
        return KV_EINVAL;
    const struct kv__tier_ops *ops = kv__tier_find("ssd");
    if (!ops || !(cfg->pipeline & ops->pipe) || !ops->recover) {
        kv__errf(err, errlen, "the config has no SSD tier (pipeline dram)");
        return KV_ENOTSUP;
    }
    /* Offline by contract: never beside the process serving the store (its
     * lock, held meanwhile, also keeps a new server out until we are done). */
    int lock = -1;
    int rc = kv__host_lock_offline(cfg, &lock, err, errlen);
    if (rc != KV_OK)
        return rc;
    rc = ops->recover(cfg, recovered, err, errlen);
    kv__host_unlock_offline(cfg, lock);
    return rc;
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
    KV__HOST_ROUTE(e, kv__shm_ssd_remove(hc, id));
    const struct kv__tier *t = ssd_tier(e);
    if (!t)
        return KV_ENOTSUP;
    return t->ops->remove(t->ctx, KV_NS_BLOCK, id, UINT32_MAX);
}
