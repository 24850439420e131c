/*
 * tomb.h — what a member remembers of the plain keys removed here, so
 * that a copy read before a remove is not stored after it.
 *
 * Re-replication and a leave's hand-off read a plain key's value on one
 * member (the source) and send it to another (the target) as an internal
 * copy. A remove that runs between the read and the store would be undone
 * by it: the copy brings back a value the caller was told is gone. So
 * every remove served here leaves a tombstone with this member's wall
 * clock (one key, every key, or a prefix), every copy carries the wall
 * clock of its source when it read the value (its stamp: one per batch,
 * the earliest read in it), and a copy of a key whose tombstone is not
 * older than the stamp, within KV__TOMB_SKEW_MS, is refused (KV_EBUSY).
 * Refusing is always safe: the source keeps its value when a copy fails,
 * and tries again with a fresh read (net/cluster.c).
 *
 * Why that orders them: cluster.c's removes run a second round whenever
 * a copy may be in flight (an owner says so: transport.h, copying), and
 * it starts after every owner answered the first. A source that read
 * the value read it before its own removal (after it, there is nothing to
 * read), so before the second round reaches the target: the target's
 * tombstone is newer than the stamp, and a copy that lands after it is
 * refused; one that landed before is removed by it. Wall clocks of two
 * members may differ by KV__TOMB_SKEW_MS: within that, a copy read just
 * after a remove is refused too (a replica fewer for a while, never a
 * resurrection).
 *
 * Bounded: tombstones of single keys are kept for ttl_ms and at most cap
 * of them, prefixes at most KV__TOMB_PREFIXES, and one for "every key".
 * What is forgotten (expired or pushed out) moves the horizon: the table
 * knows every remove served here since its horizon, which starts at the
 * table's creation (a member that restarts has forgotten the removes of
 * its previous life). A copy whose stamp is not newer than the horizon
 * by the margin is refused, whatever the tombstones say.
 *
 * A client's write of a key (not a copy) drops that key's tombstone once
 * it is stored: the value there is the writer's, and a copy is then
 * skipped as already present (or replaces nothing newer).
 *
 * Threading: one mutex. The public calls take it; kv__tomb_lock / unlock
 * and the do_ call let a caller judge a copy and store it with no remove
 * in between (cluster.c, sv_store_copy): a remove leaves its tombstone
 * before it drops anything, so a copy judged before the tombstone was
 * stored before the drop, and the drop takes it.
 */
#ifndef KV_NET_TOMB_H
#define KV_NET_TOMB_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* The most two members' wall clocks may differ by (NTP keeps them within
 * milliseconds); doc/cluster.md says what a larger skew costs. */
#define KV__TOMB_SKEW_MS 1000u
/* A member says "copying" (transport.h) while a copy it read is in flight
 * and this long after the last one ended; a remove whose first round
 * lasts longer runs its second round whatever the answers say
 * (cluster.c, the fence). */
#define KV__COPY_QUIET_MS 2000u
/* Tombstones of single keys kept at most (72 bytes each; older ones make
 * room), and of prefixes. */
#define KV__TOMB_KEYS (1u << 17)
#define KV__TOMB_PREFIXES 256u

struct kv__tomb;

/* A table that knows nothing before now_ms (its horizon), keeping single
 * keys' tombstones for ttl_ms, at most cap (rounded up to a power of two,
 * at least 16). KV_OK, KV_ENOMEM (*out NULL). */
int  kv__tomb_new(size_t cap, uint64_t ttl_ms, uint64_t now_ms, struct kv__tomb **out);
void kv__tomb_free(struct kv__tomb *t);

/* A remove served here at now_ms: of plain key id (kv_remove), or of
 * every plain key (plen 0, hash ignored: kv_remove_all), or of those
 * whose first plen bytes have XXH3-128 hash (kv_remove_prefix). Called
 * before anything is dropped. */
void kv__tomb_remove(struct kv__tomb *t, const kv_block_id *id, uint64_t now_ms);
void kv__tomb_clear(struct kv__tomb *t, uint32_t plen, const kv_block_id *hash, uint64_t now_ms);

/* A client's write of plain key id was stored here: its tombstone goes. */
void kv__tomb_put(struct kv__tomb *t, const kv_block_id *id);

/* Whether a copy of plain key id read at stamp_ms (the source's clock)
 * may be stored here at now_ms: KV_OK, or KV_EBUSY when a tombstone of it
 * (its own, every key's, or a prefix's that match says is its) or the
 * horizon is not older than the stamp by KV__TOMB_SKEW_MS. match(arg,
 * plen, hash) says whether the copy's key begins with the prefix (1), or
 * not (0), or cannot tell (< 0: refused); NULL refuses for every such
 * prefix. kv__tomb_admit takes the lock; kv__tomb_do_admit wants it held. */
typedef int (*kv__tomb_match_fn)(void *arg, uint32_t plen, const kv_block_id *hash);
int  kv__tomb_admit(struct kv__tomb *t, const kv_block_id *id, uint64_t stamp_ms,
                    kv__tomb_match_fn match, void *arg, uint64_t now_ms);
void kv__tomb_lock(struct kv__tomb *t);
void kv__tomb_unlock(struct kv__tomb *t);
int  kv__tomb_do_admit(struct kv__tomb *t, const kv_block_id *id, uint64_t stamp_ms,
                       kv__tomb_match_fn match, void *arg, uint64_t now_ms);

/* For tests and counters: single keys' tombstones held, prefixes held,
 * whether "every key" has one, and the horizon (ms). */
struct kv__tomb_stats {
    uint64_t keys, prefixes, all, horizon_ms;
};
void kv__tomb_stats(struct kv__tomb *t, uint64_t now_ms, struct kv__tomb_stats *out);

#endif
