/*
 * index.h — the DRAM tier's hash table, split into locked shards.
 *
 * A table maps a block id to a block entry (struct kv__blk) holding the
 * block's stored shards. Each table shard has its own lock and bucket
 * array; recency is a stamp per block, not a list (see struct kv__blk). A
 * block id hashes to one table shard, so all shards of a block live
 * together and can be evicted together. The engine keeps two tables:
 * block shards and plain keys (namespaces never meet).
 *
 * Every function here expects the caller to hold the table shard's lock
 * (memcached's do_ convention, without the prefix: nothing here locks).
 */
#ifndef KV_ENGINE_INDEX_H
#define KV_ENGINE_INDEX_H

#include <stdint.h>

#include "internal.h"

/* One stored shard: where its bytes are in the segment. Offsets are in
 * 64-byte units (values are 64-byte aligned), so 32 bits reach 256 GiB. */
struct kv__sref {
    uint32_t off64;
    uint32_t len;
    uint32_t index;
};

struct kv__srefs {
    struct kv__sref *v;           /* sorted by index */
    uint32_t cap;
} __attribute__((packed, aligned(4)));

#define KV_BLK_DEAD 0x8000u       /* in pins: unlinked, freed at last unpin */

/*
 * A block entry is exactly 48 bytes (jemalloc's 48-byte class). A block with
 * one shard keeps it inline; more go to an array. With the bucket array (8
 * to 16 bytes per block at load factor 1/2..1) a single-shard block costs
 * 56-64 bytes of index, a four-shard block about 30 per shard.
 *
 * One stamp serves both recency and leases: it is the time of last use in
 * ns since the engine opened, and a lease moves it into the future
 * (now + lease_ttl). A block is evictable when its stamp is in the past and
 * nobody has it pinned. There is no LRU list: the evictor samples stamps
 * (see evict.c), which keeps entries small and makes a touch one store.
 */
struct kv__blk {
    struct kv__blk *hnext;        /* bucket chain */
    kv_block_id id;
    uint64_t stamp;               /* last use or lease end, ns since open */
    union {
        struct kv__sref one;      /* nshards == 1 */
        struct kv__srefs many;    /* nshards > 1 */
    } s;
    uint16_t pins;                /* readers copying out; | KV_BLK_DEAD */
    uint16_t nshards;
};

struct kv__tshard {
    pthread_mutex_t lock;
    struct kv__blk **buckets;
    uint32_t mask;                /* bucket count - 1 */
    uint32_t hand;                /* the evictor's clock hand, a bucket */
    uint64_t nblocks;
    uint64_t nshards;             /* stored shard values */
    uint64_t index_bytes;         /* entries + arrays + buckets */
} __attribute__((aligned(64)));

struct kv__table {
    uint32_t n;
    struct kv__tshard *sh;
};

int  kv__table_init(struct kv__table *t, uint32_t nshards);
/* Frees every entry; free_value(ctx, off64, len) is called for each shard. */
void kv__table_destroy(struct kv__table *t, void (*free_value)(void *ctx, uint32_t off64, uint32_t len),
                       void *ctx);

/* The hash of a block id; picks the table shard and the bucket. */
uint64_t kv__id_hash(const kv_block_id *id);
static inline struct kv__tshard *kv__table_shard(struct kv__table *t, uint64_t h)
{
    return &t->sh[(uint32_t)(h >> 32) % t->n];
}

struct kv__blk *kv__blk_find(struct kv__tshard *ts, uint64_t h, const kv_block_id *id);

/* Starts loading the bucket of h into the cache, without the lock: batch
 * lookups prefetch a few ids ahead so the misses overlap. buckets and mask
 * are written with atomic stores (under the lock) for this reader; a stale
 * pair only makes a useless prefetch, never a fault. */
static inline void kv__bucket_prefetch(struct kv__tshard *ts, uint64_t h)
{
    struct kv__blk **b = __atomic_load_n(&ts->buckets, __ATOMIC_RELAXED);
    uint32_t m = __atomic_load_n(&ts->mask, __ATOMIC_RELAXED);
    __builtin_prefetch(&b[h & m]);
}
struct kv__sref *kv__blk_sref(struct kv__blk *b, uint32_t index);
static inline struct kv__sref *kv__blk_srefs(struct kv__blk *b)
{
    return b->nshards == 1 ? &b->s.one : b->s.many.v;
}

/* Adds a shard to the block (creating the block entry when needed).
 * KV_ENOMEM when metadata cannot be allocated. The shard must be absent. */
int kv__blk_add(struct kv__tshard *ts, uint64_t h, const kv_block_id *id, uint32_t index,
                uint32_t off64, uint32_t len, uint64_t now,
                struct kv__blk **out);

/* Unlinks a block from its bucket; the entry stays allocated (victims and
 * dead entries still point at their shards). */
void kv__blk_unlink(struct kv__tshard *ts, uint64_t h, struct kv__blk *b);
/* Frees an unlinked block's metadata (not its values). */
void kv__blk_free(struct kv__blk *b);

/* Stamps a block used at `now` (a stamp already in the future, a lease, is
 * kept). */
static inline void kv__blk_touch(struct kv__blk *b, uint64_t now)
{
    if (b->stamp < now)
        b->stamp = now;
}

/* An eviction candidate found by sampling. */
struct kv__cand {
    uint64_t stamp;
    uint64_t hash;
    kv_block_id id;
};

/* Walks the shard from its clock hand, looking at up to `budget` entries
 * (never more than the shard holds), and keeps in out[0..k) the oldest
 * evictable ones (stamp <= now, not pinned), oldest first; advances the
 * hand. Returns how many it kept. */
size_t kv__tshard_sample(struct kv__tshard *ts, uint64_t now, unsigned budget,
                         struct kv__cand *out, size_t k);

#endif
