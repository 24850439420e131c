/*
 * transport.c — the table of the transports built in, and the choice of
 * one for cluster.protocol.
 *
 * protocol: auto takes the first registered transport whose probe finds it
 * can run (rdma: a device present, per ibv_get_device_list in net/rdma.c;
 * tcp always); the choice is logged once per process so that a cluster
 * that silently runs on tcp is visible.
 */
#include <string.h>

#include "transport.h"

/*
 * The transports built in, by name, in the order protocol: auto prefers them
 * (Redis' connection types, connTypeRegister): a new transport is a file in
 * net/ and a line here (plus its name in engine/config.c's protocols).
 * rdma is weak (a build without net/rdma.c falls back); tcp is always there.
 */
static const struct kv__transport_ops *const transports[] = {
    &kv__rdma_transport,   /* weak: NULL when net/rdma.c is not linked */
    &kv__tcp_transport,
};

static int usable(const struct kv__transport_ops *t, const struct kv__net_opts *o)
{
    return t && (!t->probe || t->probe(o) > 0);
}

int kv__transport_pick(int protocol, const struct kv__net_opts *o,
                       const struct kv__transport_ops **out)
{
    static _Atomic int said;
    static const char *const names[] = { [KV_PROTO_TCP] = "tcp", [KV_PROTO_RDMA] = "rdma" };
    *out = NULL;
    if (protocol != KV_PROTO_AUTO) {
        const struct kv__transport_ops *t;
        const char *want = protocol > 0 && (size_t)protocol < KV__ARRAY_LEN(names) ? names[protocol] : "";
        bool built = false;
        for (size_t i = 0; i < KV__ARRAY_LEN(transports); i++) {
            if (!(t = transports[i]) || strcmp(t->name, want) != 0)
                continue;
            built = true;
            if (usable(t, o)) {
                *out = t;
                return KV_OK;
            }
        }
        KV_ERROR("cluster.protocol %s: %s", want, built ? "no device found" : "not built in");
        return KV_ENOTSUP;
    }
    for (size_t i = 0; i < KV__ARRAY_LEN(transports) && !*out; i++)
        if (usable(transports[i], o))
            *out = transports[i];
    if (!*out)
        return KV_ENOTSUP;
    if (!atomic_exchange(&said, 1))
        KV_INFO("cluster.protocol auto: using %s%s", (*out)->name,
                *out == &kv__tcp_transport ? " (no RDMA device found, or built without rdma)" : "");
    return KV_OK;
}
