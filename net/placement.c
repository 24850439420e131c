/*
 * placement.c — rendezvous hashing.
 *
 * How it works: every (node, block) pair gets a score, XXH3 of the block id
 * seeded with the node's own hash; a block's owners are the r nodes with
 * the highest scores. Every client computes the same answer from the same
 * member list, without asking anyone, and when a node leaves only the
 * blocks it owned move (each to its next-best node, which for replica_num
 * > 1 already holds a copy). Ties (astronomically rare) break by index so
 * the order is total. Cost is O(n) per block, fine for the tens of nodes a
 * KV-cache pool has.
 *
 * The score ignores the shard index on purpose: all shards of a block live
 * on the same owners, so a block is evicted and found whole.
 */
#include <string.h>
#include <xxhash.h>

#include "placement.h"

uint64_t kv__place_seed(const char *node_id)
{
    return XXH3_64bits(node_id, strlen(node_id));
}

size_t kv__place(const uint64_t *seeds, size_t n, const kv_block_id *id, unsigned r,
                 size_t *out)
{
    uint64_t best[KV_PLACE_MAX];
    size_t k = 0;
    if (r > KV_PLACE_MAX)
        r = KV_PLACE_MAX;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = XXH3_64bits_withSeed(id->bytes, KV_BLOCK_ID_LEN, seeds[i]);
        size_t pos = k;
        while (pos > 0 && best[pos - 1] < s)
            pos--;
        if (pos >= r)
            continue;
        size_t end = k < r ? k : r - 1;
        memmove(best + pos + 1, best + pos, (end - pos) * sizeof *best);
        memmove(out + pos + 1, out + pos, (end - pos) * sizeof *out);
        best[pos] = s;
        out[pos] = i;
        if (k < r)
            k++;
    }
    return k;
}
