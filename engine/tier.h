/*
 * tier.h — the interface every storage tier below DRAM implements, and the
 * table of those built in (engine/tier.c).
 *
 * Key design choice: a tier is an ops table and a context, nothing more
 * (Redis' connection types): the node-local store (engine/store.c) walks
 * DRAM and then the open tiers in pipeline order, and is the only code that
 * decides what goes where (write-through, promotion, spill, replace). A
 * tier only stores, finds and deletes values by (namespace, block id, shard
 * index), so adding one (a shared file system, an object store, a second
 * SSD class) is a file that fills these ops and one line in tier.c's table.
 *
 * Keys and contracts are those of the SSD tier (persist/ssd.h), the first
 * implementation: plain keys arrive as their 16-byte hash in KV_NS_KEY, a
 * value's iovecs must add up to its stored length on read (KV_EINVAL), a
 * write of a value already present leaves it and returns KV_OK. Every op
 * may be called from many threads at once, never with an engine lock held.
 */
#ifndef KV_ENGINE_TIER_H
#define KV_ENGINE_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

struct kv__tier_ops;

/* An open tier as the store holds it. */
struct kv__tier {
    const struct kv__tier_ops *ops;
    void *ctx;
    /* Set by open from the tier's own settings: */
    bool write_through;   /* a value stored in DRAM is written here too, before the ack */
    bool promote;         /* a read served here is copied up into DRAM */
};

struct kv__tier_ops {
    const char *name;      /* as in the pipeline setting and log lines: "ssd" */
    unsigned pipe;         /* the pipeline bit (KV_PIPE_*) that opens it */

    /* Opens the tier for cfg: fills t->ctx and its policy flags. A message
     * in err on failure, t->ctx NULL. */
    int  (*open)(const struct kv_config *cfg, struct kv__tier *t, char *err, size_t errlen);
    /* Flushes what the tier still holds of DRAM's (victims queued for
     * write-back are written or dropped, and released), then closes. */
    void (*close)(void *ctx);

    bool (*contains)(void *ctx, int ns, const kv_block_id *id, uint32_t index);
    int  (*size)(void *ctx, int ns, const kv_block_id *id, uint32_t index, uint64_t *len);
    int  (*read)(void *ctx, int ns, const kv_block_id *id, uint32_t index, const kv_iov *iov,
                 uint32_t iovcnt);
    int  (*write)(void *ctx, int ns, const kv_block_id *id, uint32_t index, const kv_iov *iov,
                  uint32_t iovcnt);
    /* Optional: up to 64 writes at once, results[i] each (NULL: the store
     * writes them one at a time). */
    int  (*write_many)(void *ctx, int ns, const kv_shard *shards, size_t n, int *results);
    /* Deletes one shard, or every shard of the block (index UINT32_MAX):
     * KV_OK, KV_ENOTFOUND, or the reason the value could not be deleted. */
    int  (*remove)(void *ctx, int ns, const kv_block_id *id, uint32_t index);
    /* The shard indexes held for a block, at most cap into idx; returns how
     * many it holds. */
    size_t (*block_shards)(void *ctx, int ns, const kv_block_id *id, uint32_t *idx, size_t cap);
    /* Adds the tier's figures to out (the ssd_* fields, spills ...). */
    void (*stats)(void *ctx, kv_stats *out);
    /* Optional: the receiver of DRAM's eviction victims when this tier is
     * next below DRAM (write-back, asynchronous). NULL: the store writes
     * each victim through write() on the evicting thread. */
    struct kv__sink (*sink)(void *ctx);

    /* Optional, for the public kv_ssd_* calls on a tier named "ssd". */
    int (*scan)(void *ctx, kv_ssd_cb cb, void *arg);
    int (*scrub)(void *ctx, bool repair, kv_ssd_cb cb, void *arg, uint64_t *checked,
                 uint64_t *bad);
    int (*compact)(void *ctx);
    int (*recover)(const struct kv_config *cfg, uint64_t *recovered, char *err, size_t errlen);
};

/* The tiers built in (each defined by its own file, listed in tier.c). */
extern const struct kv__tier_ops kv__ssd_tier;      /* persist/ssd.c */

/* The tiers built in, in pipeline order (the order the store walks them
 * below DRAM); NULL past the last. */
const struct kv__tier_ops *kv__tier_at(size_t i);
/* A built-in tier by name; NULL when there is none. */
const struct kv__tier_ops *kv__tier_find(const char *name);

#endif
