/*
 * cluster.h — the distributed DRAM tier as the engine sees it.
 *
 * The engine calls only these. A cluster joins the membership view kept by
 * kvmaster or etcd (cluster.metadata; membership.h), serves this node's local store to peers over the transport of
 * cluster.protocol (unless dram.capacity is 0: a pure client serves
 * nothing and owns no blocks), and routes every shard to its owners:
 * rendezvous (HRW) hashing of the block id over the live owners of the view
 * picks cluster.replica_num of them (placement.h).
 *
 * Rules (each is tested in tests/check_cluster.c):
 * - dump writes every owner. A shard succeeds when at least one owner stored
 *   it and every reachable owner was attempted; when none stored it, its
 *   result is the most telling owner error (KV_ENOSPC over KV_ENET).
 * - load reads the first live owner in HRW order (this node first when it
 *   is an owner) and fails over to the next on any error but KV_EINVAL
 *   (a size mismatch is the caller's, not the owner's).
 * - lookup asks each owner once per batch; a block hits when any owner has
 *   it.
 * - For a minute after a view change, a shard that misses on every owner is
 *   also looked for on its owners in the previous view (still live); a load
 *   that finds it there copies it to its current owners (read repair). So a
 *   node joining does not turn 1/n of the cache into misses at once.
 * - After the owners change, each owner copies the blocks it holds whose
 *   owner set gained members to those members, in the background, at most
 *   cluster.rereplicate_mib_s, newest first (one holder per block does it;
 *   see cluster.c's re-replication section).
 * - This node serves its own blocks through kv__local_* without the network.
 * - Every remote call has a deadline. Let T be half of io.timeout_ms (the
 *   engine's task timeout: half leaves a hung owner's shards time to fail
 *   over within it; at least 50 ms), or KV_NET_DEFAULT_TIMEOUT_MS (5 s)
 *   when io.timeout_ms is 0 (no task timeout): a call fails with
 *   KV_ETIMEDOUT when no byte moves for T, or when it has run for T plus
 *   its bytes at the floor rate of serve.h (KV__NET_FLOOR_BYTES_PER_MS,
 *   10 MiB/s: about 100 ms per MiB), whichever comes first; the
 *   shard then fails over like any other network error. A server closes a
 *   connection stalled mid-frame for T.
 * - A caller behind the view: an item whose owner failed with a network
 *   error (KV_ENET, KV_ETIMEDOUT) or answered KV_ECLOSED (a member that has
 *   left) makes the caller fetch the view, and when it is another one the
 *   failed items run once more on it (dump, put, load, remove, sizes,
 *   size, clear; not lookups). Only while the call is younger than T, the
 *   fetch waiting at most the rest of T.
 *
 * Threading: every call but start/stop is safe from many threads at once.
 */
#ifndef KV_NET_CLUSTER_H
#define KV_NET_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

struct kv__cluster;
struct kv__backend;

/* Joins the view via kvmaster (cluster.master) or etcd
 * (cluster.etcd_endpoints) and starts serving be, the engine's local store
 * (engine/backend.c; copied), on cluster.listen (unless dram.capacity is 0
 * without an SSD-only pipeline: a pure client serves nothing). KV_ENET when
 * the store cannot be reached, KV_EPERM when it refuses the token (or etcd
 * user), KV_ENOTSUP when protocol rdma is asked for and not available.
 * *out NULL on failure. */
int  kv__cluster_start(const struct kv__backend *be, const struct kv_config *cfg,
                       struct kv__cluster **out, char *err, size_t errlen);
/* The same over any backend (be NULL = pure client); what tests use. */
int  kv__cluster_start_backend(struct kv__backend *be, const struct kv_config *cfg,
                               struct kv__cluster **out, char *err, size_t errlen);
/* Leaves the view, stops serving and closes every connection. NULL ok.
 * An owner leaves gracefully first (cluster.c, "a graceful leave"): it
 * flags its record as leaving, hands what it owns to the owners of the
 * view without it and without the owners flagged before it (at most
 * io.timeout_ms, 5 s without one), leaves the view while it still serves,
 * forwarding the writes it serves to those owners, and serves two
 * heartbeat periods more (kv__membership_heartbeat_ms), then refuses
 * writes with KV_ECLOSED until it stops. */
void kv__cluster_stop(struct kv__cluster *c);

/* results[i] / hit[i] per item; the return value is KV_OK when the batch ran
 * (items may have failed) or KV_EINVAL for bad arguments. */
int  kv__cluster_dump(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n, int *results);
int  kv__cluster_load(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n, int *results);
int  kv__cluster_lookup(struct kv__cluster *c, int ns, const kv_block_id *ids, size_t n, uint8_t *hit);
int  kv__cluster_size(struct kv__cluster *c, int ns, const kv_block_id *id, uint32_t index, uint64_t *len);
/*
 * Plain keys across the cluster (engine/kv.c), placed like blocks.
 * put: a dump that replaces: every owner drops its value and stores the new
 *   one (atomically on each owner: a reader sees one whole value). A put
 *   succeeds only when every owner of the view did so; an owner that is
 *   down fails it until the view drops that owner (node_ttl_ms), because it
 *   would serve the older value again after a failover. Two racing puts of
 *   one key may leave its owners holding different (whole) values until the
 *   next put; reads go to the first live owner in HRW order, so every
 *   reader sees the same one while it lives.
 * remove: KV_OK when an owner had it and every owner was asked; KV_ENOTFOUND
 *   when none had it; an owner that could not be asked is an error (KV_ENET).
 * sizes: index's stored length per id from the first owner that has it, in
 *   one round to every owner; KV_ENOTFOUND per missing id.
 * clear: every owner in the view drops every plain key it holds; *removed
 *   is the copies dropped over the copies a key has (replica_num, or fewer
 *   owners): the keys, when the owners agreed. An owner that could not be
 *   asked is an error (KV_ENET), as for remove; the others are cleared.
 * remove and clear of plain keys run a second round, once every owner
 *   answered the first, when a member's copy may still land (an owner says
 *   so, one failed, or the first round took longer than
 *   KV__COPY_QUIET_MS), and each owner keeps a tombstone of what it
 *   removed: a copy
 *   of a plain key that a member read before the remove reached it
 *   (re-replication, a hand-off) is refused where it lands after that, so
 *   a removed key does not come back (cluster.c, "the fence"; tomb.h).
 *   The second round's finds are not counted; its failures are the call's.
 */
int  kv__cluster_put(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n, int *results);
int  kv__cluster_remove(struct kv__cluster *c, int ns, const kv_block_id *ids, size_t n, int *results);
int  kv__cluster_sizes(struct kv__cluster *c, int ns, const kv_block_id *ids, uint32_t index,
                       size_t n, uint64_t *lens, int *results);
int  kv__cluster_clear(struct kv__cluster *c, int ns, uint64_t *removed);
/* kv__cluster_clear of the keys beginning with plen bytes whose XXH3-128
 * is hash (kv_remove_prefix): the same one item to every owner, filtered
 * by each owner; plen 0 is kv__cluster_clear. */
int  kv__cluster_clear_prefix(struct kv__cluster *c, int ns, uint32_t plen,
                              const kv_block_id *hash, uint64_t *removed);
int  kv__cluster_register_buffer(struct kv__cluster *c, void *addr, size_t len);
int  kv__cluster_unregister_buffer(struct kv__cluster *c, void *addr);
/* Adds the cluster's counters to out (fields the cluster does not know are
 * left alone). */
void kv__cluster_stats(struct kv__cluster *c, kv_stats *out);

/* The cluster's own counters (since start), for kv_stats / metrics once
 * they grow fields for them. */
struct kv__cluster_counters {
    uint64_t remote_items;      /* items sent to other nodes */
    uint64_t remote_errors;     /* of those, failed by a connection error */
    uint64_t failovers;         /* load items retried on a next owner */
    uint64_t moved;             /* shards found on a previous owner only and
                                 * copied to their current owners */
    uint64_t view_version;
    uint64_t members, owners;   /* in the view last seen */
    /* re-replication (cluster.c): shards copied to new owners after owner
     * changes, their bytes (times the owners each went to), shards whose
     * copy failed, shards still to copy, jobs run to the end, and owner
     * changes seen whose job has not run to the end (0: all copied) */
    uint64_t rereplicated_shards, rereplicated_bytes, rereplicate_failed;
    uint64_t rereplicate_pending, rereplicate_jobs, rereplicate_behind;
    /* peers in the table: the live view's owners plus those of views still
     * in use (the previous view, a running job's); for tests */
    uint64_t peers;
    /* graceful leave (kv__cluster_stop): shards handed to their next
     * owners, and writes served while leaving that were forwarded there */
    uint64_t handed_off, forwarded;
    /* writes refused because this member owns the key in a view newer than
     * the sender's (the sender refreshes and retries on the owners) */
    uint64_t refused_not_owner;
    /* plain keys' copies from members refused here as read before a
     * remove served here (net/tomb.h; their senders read them again) */
    uint64_t refused_stale;
    /* removes of plain keys (kv_remove, kv_remove_prefix, kv_remove_all)
     * from here that ran their second round, a copy being in the way */
    uint64_t removes_fenced;
    /* block ids a lookup from here reported absent while an owner of
     * theirs could not be asked (failed, hung past the call's time, down):
     * maybe stored there */
    uint64_t lookups_unsure;
    /* where a graceful leave is: 0 not leaving, 1 forwarding writes to the
     * next owners, 2 left (writes refused); for tests */
    uint64_t leaving;
};
void kv__cluster_counters(struct kv__cluster *c, struct kv__cluster_counters *out);

/* For tests and tools: the address this node serves on ("" for a pure
 * client), and the view version and live member count it last saw. */
const char *kv__cluster_addr(struct kv__cluster *c);
void kv__cluster_view(struct kv__cluster *c, uint64_t *version, size_t *members, size_t *owners);

#endif
