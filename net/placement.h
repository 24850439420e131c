/*
 * placement.h — which nodes own a block: rendezvous (highest random weight)
 * hashing over the live owners of the view.
 */
#ifndef KV_NET_PLACEMENT_H
#define KV_NET_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "kvengine.h"

#define KV_PLACE_MAX 8   /* replica_num is clamped to this */

/* A node's hash seed, from its id (its advertised address). */
uint64_t kv__place_seed(const char *node_id);

/* Writes to out the indexes (into seeds[0..n)) of the min(r, n,
 * KV_PLACE_MAX) owners of id, best first; returns how many. */
size_t kv__place(const uint64_t *seeds, size_t n, const kv_block_id *id, unsigned r,
                 size_t *out);

#endif
