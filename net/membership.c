/*
 * membership.c — picking the membership store, and kvmaster's client
 * (master.c) behind the ops table of membership.h.
 *
 * Key design choice: the kvmaster adapter adds nothing to the client. A
 * kvmaster JOIN is already register-and-heartbeat-and-fetch in one
 * idempotent message, so join and heartbeat are the same call, and a
 * read-only view is the LEAVE-for-a-stranger query the master has always
 * answered. kvmaster never notifies: views change at heartbeats.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "master.h"
#include "membership.h"

unsigned kv__membership_heartbeat_ms(uint64_t node_ttl_ms)
{
    return kv__master_heartbeat_ms(node_ttl_ms);
}

const struct kv__membership_ops *kv__membership_pick(const struct kv_config *cfg)
{
    return cfg->cluster.metadata == KV_META_ETCD ? &kv__etcd_membership
                                                 : &kv__kvmaster_membership;
}

void kv__membership_where(const struct kv_config *cfg, char *buf, size_t cap)
{
    if (cfg->cluster.metadata == KV_META_ETCD)
        snprintf(buf, cap, "etcd at %s (cluster.etcd_endpoints)", cfg->cluster.etcd_endpoints);
    else
        snprintf(buf, cap, "kvmaster at %s (cluster.master)", cfg->cluster.master);
}

/* ---- kvmaster ------------------------------------------------------------ */

struct kvm {
    struct kv__membership base;
    struct kv__mclient *mc;
};

static int kvm_open(const struct kv_config *cfg, unsigned timeout_ms, void (*notify)(void *),
                    void *arg, struct kv__membership **out, char *err, size_t errlen)
{
    (void)notify;
    (void)arg;
    *out = NULL;
    struct kvm *k = calloc(1, sizeof *k);
    if (!k)
        return KV_ENOMEM;
    k->base.ops = &kv__kvmaster_membership;
    if (kv__mclient_open(cfg->cluster.master, cfg->cluster.token, timeout_ms, &k->mc)) {
        kv__errf(err, errlen, "cluster.master: bad address '%s'", cfg->cluster.master);
        free(k);
        return KV_ECONFIG;
    }
    *out = &k->base;
    return KV_OK;
}

static void kvm_close(struct kv__membership *m)
{
    struct kvm *k = (struct kvm *)m;
    kv__mclient_close(k->mc);
    free(k);
}

static int kvm_local_ip(struct kv__membership *m, char *ip, size_t cap)
{
    return kv__mclient_local_ip(((struct kvm *)m)->mc, ip, cap);
}

static int kvm_join(struct kv__membership *m, const struct kv__member *self, uint64_t *version,
                    struct kv__member **members, size_t *n)
{
    return kv__mclient_join(((struct kvm *)m)->mc, self, version, members, n);
}

static int kvm_view(struct kv__membership *m, uint64_t *version, struct kv__member **members,
                    size_t *n)
{
    /* An id no member uses: members name themselves by address or
     * "client-...". */
    struct kv__member q;
    memset(&q, 0, sizeof q);
    snprintf(q.id, sizeof q.id, "view-query-%ld-%llu", (long)getpid(),
             (unsigned long long)kv__now_ns());
    return kv__mclient_view(((struct kvm *)m)->mc, &q, version, members, n);
}

static int kvm_leave(struct kv__membership *m, const struct kv__member *self)
{
    return kv__mclient_leave(((struct kvm *)m)->mc, self);
}

const struct kv__membership_ops kv__kvmaster_membership = {
    .name = "kvmaster",
    .open = kvm_open,
    .close = kvm_close,
    .local_ip = kvm_local_ip,
    .join = kvm_join,
    .heartbeat = kvm_join,
    .view = kvm_view,
    .leave = kvm_leave,
};
