/*
 * membership.h — the store a cluster member keeps its record in and reads
 * the view from, behind one ops table: kvmaster (master.c's client) or etcd
 * (etcd.c), chosen by cluster.metadata.
 *
 * Key design choice: the seam is the heartbeat, not the store's model. A
 * member joins with its whole record, then calls heartbeat every
 * kv__membership_heartbeat_ms and gets the current view back from either
 * store; what a heartbeat does underneath (a kvmaster JOIN, an etcd lease
 * keepalive plus a view kept current by a watch) is the store's business.
 * A store that learns of a change between heartbeats (etcd's watch) calls
 * the notify function given to open, and the caller then asks for the
 * view at once instead of at its next heartbeat.
 *
 * Errors: KV_ENET / KV_ETIMEDOUT when the store cannot be reached (the next
 * call tries again; members keep serving on the last view), KV_EPERM when it
 * refuses our credentials, KV_EPROTO for an answer that makes no sense.
 *
 * Threading: the calls of one handle may come from several threads; each
 * implementation serializes what it must.
 */
#ifndef KV_NET_MEMBERSHIP_H
#define KV_NET_MEMBERSHIP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/config.h"
#include "proto.h"

struct kv__membership;

struct kv__membership_ops {
    const char *name;                   /* "kvmaster", "etcd" */
    /* Never touches the network. notify (NULL = none) may be called from
     * the store's own thread, with arg, when the view may have changed. */
    int  (*open)(const struct kv_config *cfg, unsigned timeout_ms, void (*notify)(void *),
                 void *arg, struct kv__membership **out, char *err, size_t errlen);
    void (*close)(struct kv__membership *m);
    /* The local IPv4 address this host reaches the store from: what a
     * member listening on 0.0.0.0 advertises. Reaches the store when it
     * has not yet. */
    int  (*local_ip)(struct kv__membership *m, char *ip, size_t cap);
    /* Registers self's record and returns the view (*members: free()). */
    int  (*join)(struct kv__membership *m, const struct kv__member *self, uint64_t *version,
                 struct kv__member **members, size_t *n);
    /* Keeps self's record alive (registering it again when the store lost
     * it) and returns the current view. */
    int  (*heartbeat)(struct kv__membership *m, const struct kv__member *self,
                      uint64_t *version, struct kv__member **members, size_t *n);
    /* The view, read-only, without joining (kvctl members, tests). */
    int  (*view)(struct kv__membership *m, uint64_t *version, struct kv__member **members,
                 size_t *n);
    /* Removes self's record at once (best effort). */
    int  (*leave)(struct kv__membership *m, const struct kv__member *self);
};

/* Every handle starts with this, so the calls below can dispatch. */
struct kv__membership {
    const struct kv__membership_ops *ops;
};

extern const struct kv__membership_ops kv__kvmaster_membership;
extern const struct kv__membership_ops kv__etcd_membership;
/* What an etcd handle (kv__etcd_membership's) did since open to keep its
 * view: full reads of PREFIX/members/ (every page of one read counts once)
 * and watch events applied one by one. Tests check with them that a
 * change costs an event, not a read of the whole view. */
void kv__etcd_counts(struct kv__membership *m, uint64_t *full_reads, uint64_t *events);

/* The ops of cfg's cluster.metadata, and the place it is at, for messages
 * ("kvmaster at 10.0.0.1:50088", "etcd at 10.0.0.1:2379,..."). */
const struct kv__membership_ops *kv__membership_pick(const struct kv_config *cfg);
void kv__membership_where(const struct kv_config *cfg, char *buf, size_t cap);

/* How often a member heartbeats: a quarter of node_ttl_ms, within
 * [20 ms, 1 s]. */
unsigned kv__membership_heartbeat_ms(uint64_t node_ttl_ms);

static inline int kv__membership_open(const struct kv_config *cfg, unsigned timeout_ms,
                                      void (*notify)(void *), void *arg,
                                      struct kv__membership **out, char *err, size_t errlen)
{
    return kv__membership_pick(cfg)->open(cfg, timeout_ms, notify, arg, out, err, errlen);
}
static inline void kv__membership_close(struct kv__membership *m)
{
    if (m)
        m->ops->close(m);
}

#endif
