/*
 * master.h — membership: the kvmaster service (kv_master_run, public) and
 * the client a node uses to join it and fetch the view.
 *
 * The master is not on the data path: nodes JOIN (register or heartbeat,
 * the same idempotent message carrying the node's whole record) every
 * heartbeat interval and get the current view back; a node silent for
 * cluster.node_ttl_ms is dropped from the view; LEAVE drops it at once.
 * The view's version grows by one on every change of membership or of a
 * member's record.
 */
#ifndef KV_NET_MASTER_H
#define KV_NET_MASTER_H

#include "proto.h"

/* How often a node re-JOINs: a quarter of the TTL, within [20 ms, 1 s]. */
unsigned kv__master_heartbeat_ms(uint64_t node_ttl_ms);

struct kv__mclient;

/* Connects lazily: open never touches the network. */
int  kv__mclient_open(const char *addr, const char *token, unsigned timeout_ms,
                      struct kv__mclient **out);
void kv__mclient_close(struct kv__mclient *m);
/* JOINs with self's record and returns the view (*members: free()).
 * KV_EPERM when the token is refused; KV_EBUSY when the id is a live
 * member's that this client did not create (asked again for up to 2.5 s
 * first: a node restarted on its address waits out its old record);
 * KV_ENET / KV_ETIMEDOUT when the master is unreachable (the next call
 * reconnects). A LEAVE of another client's record is KV_EPERM. */
int  kv__mclient_join(struct kv__mclient *m, const struct kv__member *self, uint64_t *version,
                      struct kv__member **members, size_t *n);
int  kv__mclient_leave(struct kv__mclient *m, const struct kv__member *self);
/* The view without joining it: a LEAVE for an id that is no member's
 * (self's id must be one no member uses), which the master answers with
 * its view and otherwise ignores. */
int  kv__mclient_view(struct kv__mclient *m, const struct kv__member *self, uint64_t *version,
                      struct kv__member **members, size_t *n);
/* The local IPv4 address of the connection to the master: what a node
 * listening on 0.0.0.0 advertises. Connects when not connected. */
int  kv__mclient_local_ip(struct kv__mclient *m, char *ip, size_t cap);

#endif
