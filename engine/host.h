/*
 * host.h — one store per host (engine/host.c): which process serves a
 * shared store, and how every other engine that opens it is routed there.
 *
 * An engine whose config names a shared store (store.name, or a pipeline
 * with an SSD tier: realpath(ssd.path)) either holds the store's lock and
 * serves it (it opens its tiers as any engine does, then net/shm.c serves
 * them to the others), or is ATTACHED: it opens no tier and routes every
 * public call to the holder. The switch from attached to serving (a
 * takeover, when the holder died) happens under e->host's rwlock, in
 * kv__host_enter, and nowhere else.
 */
#ifndef KV_ENGINE_HOST_H
#define KV_ENGINE_HOST_H

#include "store.h"

struct kv__host;
struct kv__shm_client;

/* Decides at kv_open: e->host stays NULL for a store nobody shares; else
 * *serve says whether this engine took the lock (open the tiers, then
 * kv__host_serve) or is attached (open nothing). KV_EPERM / KV_ECONFIG for
 * an unsafe store.dir, KV_EPERM when the server refuses us, KV_EBUSY when
 * the lock is held and nobody answers on the socket, all with err. */
int  kv__host_open(kv_engine *e, bool *serve, char *err, size_t errlen);
/* Starts serving the open store on the socket (the lock is held). */
int  kv__host_serve(kv_engine *e, char *err, size_t errlen);
/* Stops serving (first thing at close: attached calls fail promptly). */
void kv__host_stop(kv_engine *e);
/* Frees e->host: disconnects, or gives the lock up (last thing at close). */
void kv__host_close(kv_engine *e);

/* Routes a public call. KV_OK with *c NULL: run it here (nothing shared,
 * or this engine serves). KV_OK with *c set: send it through *c, then
 * kv__host_leave(e). An error: the store could not be reached (nothing is
 * held). A client found broken is replaced first: reconnected, or the store
 * taken over (this engine opens its tiers and serves from then on). */
int  kv__host_enter(kv_engine *e, struct kv__shm_client **c);
void kv__host_leave(kv_engine *e);
/* True while e is attached to another process's store (a hint: a takeover
 * may make it false at any time). */
bool kv__host_attached(kv_engine *e);

/* Connections served, pins held for them, attached or not (kv_stats). */
void kv__host_stats(kv_engine *e, kv_stats *out);
/* Requests this engine's server has answered (0 when it serves nothing):
 * the round trips attached engines made, for tests and benchmarks. */
uint64_t kv__host_requests(kv_engine *e);

/* Offline work on cfg's store (kv_ssd_recover): takes the store's lock so
 * that nobody serves it meanwhile, *fd the lock's (-1 when the store is not
 * shared: nothing to take). KV_EBUSY when a process serves it, err naming
 * its pid ("stop it first"). kv__host_unlock_offline gives it back. */
int  kv__host_lock_offline(const struct kv_config *cfg, int *fd, char *err, size_t errlen);
void kv__host_unlock_offline(const struct kv_config *cfg, int fd);

/* A public call's routing (kv.c, ssd_calls.c): runs call through the host
 * store's server when e is attached (hc names the connection), returning
 * its result; falls through when the call runs here. */
#define KV__HOST_ROUTE(e, call)                                               \
    do {                                                                      \
        struct kv__shm_client *hc;                                            \
        int route_rc_ = kv__host_enter((e), &hc);                             \
        if (route_rc_ != KV_OK)                                               \
            return route_rc_;                                                 \
        if (hc) {                                                             \
            route_rc_ = (call);                                               \
            kv__host_leave(e);                                                \
            return route_rc_;                                                 \
        }                                                                     \
    } while (0)

/* engine.c: what kv_open opens for a store of its own (tiers, cluster), so
 * that a takeover opens the same, and closes it again when it cannot serve
 * it; and n (at most 64) shards of a task run synchronously here (the
 * cluster's owners, or the store). */
int  kv__engine_open_local(kv_engine *e, char *err, size_t errlen);
void kv__engine_close_local(kv_engine *e);
int  kv__engine_run_shards(kv_engine *e, bool dump, const kv_shard *sh, size_t n, int *results);
/* A dump an attached engine sent, spread over e's workers and waited for. */
int  kv__engine_dump_served(kv_engine *e, const kv_shard *sh, size_t n, int *results);

#endif
