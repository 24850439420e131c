/*
 * transport.h — the one seam every cluster transport implements (tcp.c,
 * rdma.c), after Redis's ConnectionType: an ops table chosen by name.
 *
 * Key design choice: a transport moves *batches of shard operations*, not
 * bytes. The cluster layer (cluster.c) hands a transport a batch of
 * lookup / size / load / dump items for one peer, each carrying the caller's
 * iovecs; the transport decides how the bytes travel. tcp sends them in the
 * request frame (writev straight from the caller's iovecs) and reads loads
 * straight into them (readv). rdma may instead do, per batch:
 *     load = one RPC returning (addr, rkey, len, handle) per item, pinned on
 *            the server (backend->pin), + one-sided RDMA READs into the
 *            caller's iovecs + a release RPC (backend->unpin);
 *     dump = one RPC reserving space (backend->reserve) returning
 *            (addr, rkey, handle) per item, + RDMA WRITEs from the caller's
 *            iovecs + a commit RPC (backend->commit / abort).
 * Both speak the frames of proto.h for their RPCs.
 *
 * The server side never calls the engine directly: it serves a
 * struct kv__backend (the engine's is engine/backend.c; the tests serve a
 * heap store, tests/testutil_memstore.c), which is what lets transports be
 * tested without an engine.
 *
 * Threading: a transport object is shared by all threads. A kv__conn is used
 * by one thread at a time (cluster.c keeps a pool per peer); batch() is
 * synchronous and never blocks past its deadline. A transport may also run
 * batches on several conns at once from one thread (batch_many), which is
 * how cluster.c drives a batch spanning several owners without handing
 * owners to other threads.
 */
#ifndef KV_NET_TRANSPORT_H
#define KV_NET_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* Remote calls without io.timeout_ms (0) get this deadline: a dead peer must
 * never hang a task, and 5 s is far above any healthy batch on a LAN. */
#define KV_NET_DEFAULT_TIMEOUT_MS 5000u

/* ---- what a server serves ------------------------------------------------
 * Same contracts as the kv__local_* calls of engine.h (see there); every
 * call may come from any transport thread at once. pin/unpin and
 * reserve/commit/abort are the zero-copy paths; load is the fallback for
 * shards that are not DRAM-resident (SSD), copied through a bounce buffer.
 */
struct kv__backend {
    void *ctx;
    int  (*lookup)(void *ctx, int ns, const kv_block_id *ids, size_t n, uint8_t *hit);
    int  (*size)(void *ctx, int ns, const kv_block_id *id, uint32_t index, uint64_t *len);
    int  (*load)(void *ctx, int ns, const kv_block_id *id, uint32_t index,
                 const kv_iov *iov, uint32_t iovcnt);
    int  (*pin)(void *ctx, int ns, const kv_block_id *id, uint32_t index,
                const void **data, uint64_t *len, kv__pin *pin);
    void (*unpin)(void *ctx, kv__pin *pin);
    int  (*reserve)(void *ctx, uint64_t len, kv__resv *r);
    int  (*commit)(void *ctx, kv__resv *r, int ns, const kv_block_id *id, uint32_t index);
    void (*abort)(void *ctx, kv__resv *r);
    /* The memory pin/reserve hand out lies in [seg_base, seg_base+seg_len)
     * (for RDMA registration; NULL/0 when there is none). */
    void *seg_base;
    size_t seg_len;
    /* Copies one shard in (kv__local_dump). Used where there is no segment
     * to reserve in (an SSD-only node: reserve says KV_ENOSPC), through a
     * bounce buffer of at most KV_NET_BOUNCE_MAX bytes. NULL = none. */
    int  (*dump)(void *ctx, int ns, const kv_block_id *id, uint32_t index,
                 const kv_iov *iov, uint32_t iovcnt);
    /* Visits the shards held in ns with their length and last use
     * (kv__local_scan's contract), for re-replication. NULL = none. */
    int  (*scan)(void *ctx, int ns, kv__scan_cb cb, void *arg);
    /* Deletes a plain key's value (kv__local_remove): KV_ENOTFOUND when
     * absent. NULL = KV_ENOTSUP. Blocks are never removed over the wire
     * (their shards leave together, by eviction). */
    int  (*remove)(void *ctx, int ns, const kv_block_id *id, uint32_t index);
    /* 1 when the plain key stored under id begins with the plen bytes
     * whose XXH3-128 is hash (kv_remove_prefix's test), 0 when it does
     * not, KV_ENOTFOUND when none is stored. NULL = KV_ENOTSUP. */
    int  (*match)(void *ctx, const kv_block_id *id, uint32_t plen, const kv_block_id *hash);
    /* The store's figures (tiers' capacity, used bytes, blocks, plain keys)
     * into out, zeroed first, for the member's record. NULL = none. */
    void (*stats)(void *ctx, kv_stats *out);
    /* May a dump of id sent by a caller that routed by view version view
     * (0: none; flags KV_BATCH_* of proto.h) be stored here? KV_OK, or the
     * item's refusal (cluster.c: KV_ECLOSED, not an owner in a newer view).
     * Asked before anything is stored or replaced. NULL = always. */
    int  (*admit)(void *ctx, int ns, const kv_block_id *id, uint64_t view, uint32_t flags);
    /* A plain key's copy from a member (an item of a KV_BATCH_INTERNAL
     * batch with a stamp: re-replication or a leave's hand-off, whose
     * sender read the value at stamp, its wall clock in ms) is stored
     * through this instead of commit / dump: r (reserved, its bytes in) is
     * committed or aborted, or, r NULL, iov is copied in; replace: a value
     * stored here is dropped first (a hand-off's). KV_OK, or the item's
     * refusal, with nothing stored or dropped: KV_EBUSY when this member
     * served a remove of the key that is not older than the stamp
     * (cluster.c, net/tomb.h). NULL = commit / dump, as for a write. */
    int  (*store_copy)(void *ctx, int ns, const kv_block_id *id, uint32_t index, int replace,
                       uint64_t stamp, kv__resv *r, const kv_iov *iov, uint32_t iovcnt);
    /* Plain keys are about to be removed here at a peer's request (before
     * anything is dropped): kind KV_OP_REMOVE, of key id; or KV_OP_CLEAR,
     * of every key (plen 0) or of those whose first plen bytes have XXH3-128
     * id. NULL = nobody is told. */
    void (*removing)(void *ctx, int kind, uint32_t plen, const kv_block_id *id);
    /* 1 when copies of plain keys this member read (re-replication, a
     * hand-off) may still land somewhere: one is in flight, or one ended
     * within KV__COPY_QUIET_MS. Asked after a remove of plain keys is
     * served, and sent back as its answer's hit: the remover then runs
     * its second round (cluster.c, the fence). NULL = never. */
    int  (*copying)(void *ctx);
    /* 1 when the plain key inside rec[0..len), a value as this store keeps
     * plain keys (engine/kv.c's record), begins with the plen bytes whose
     * XXH3-128 is hash; 0 when it does not; KV_EINVAL when rec is no such
     * record. For a copy that has not been stored yet (match's question,
     * asked of bytes). NULL = KV_ENOTSUP. */
    int  (*rec_match)(void *ctx, const void *rec, uint64_t len, uint32_t plen,
                      const kv_block_id *hash);
};
#define KV_NET_BOUNCE_MAX (256ull << 20)


/* ---- one item of a batch ------------------------------------------------ */
enum kv__op_kind {
    KV_OP_LOOKUP = 1,   /* out: hit */
    KV_OP_SIZE   = 2,   /* out: len */
    KV_OP_LOAD   = 3,   /* in: iov (destination; its total is the expected
                         * length: a stored length that differs is
                         * KV_EINVAL and the iov is untouched) */
    KV_OP_DUMP   = 4,   /* in: iov (source); with replace, any stored value
                         * is dropped first (a plain key's put) */
    KV_OP_REMOVE = 5,   /* plain keys only */
    KV_OP_CLEAR  = 6,   /* plain keys only: drop every one held (id ignored);
                         * out: len = how many were dropped. With index > 0,
                         * only the keys whose first index bytes hash to id
                         * (kv_remove_prefix; on the wire KV_WIRE_PREFIX) */
};

/* Ops answered from the index alone, by kv__serve_query (no bytes move). */
static inline int kv__op_is_query(int kind)
{
    return kind == KV_OP_LOOKUP || kind == KV_OP_SIZE || kind == KV_OP_REMOVE ||
           kind == KV_OP_CLEAR;
}

/* Ops whose answer carries a length (op->len). */
static inline int kv__op_answers_len(int kind)
{
    return kind == KV_OP_SIZE || kind == KV_OP_CLEAR;
}

struct kv__op {
    uint8_t kind;               /* enum kv__op_kind */
    uint8_t ns;                 /* enum kv__ns */
    uint32_t index;             /* shard index (lookup: ignored) */
    kv_block_id id;
    const kv_iov *iov;          /* load / dump only; owned by the caller */
    uint32_t iovcnt;
    uint8_t replace;            /* dump: replace, not skip, a stored value */
    /* The batch's (proto.h BATCH): the view version the caller routed by
     * (0: none), whether this is a member's own copy (internal), and, for
     * copies of values this member read (re-replication, hand-off), its
     * wall clock in ms when it read the first of them (stamp; 0 for every
     * other op, a leaver's forwarding of a write among them). */
    uint64_t view;
    uint8_t internal;
    uint64_t stamp;
    /* results, written by batch() */
    int result;                 /* KV_OK or KV_E* for this item */
    uint8_t hit;                /* lookup; remove / clear of plain keys: a copy
                                 * the owner read may still land (copying) */
    uint64_t len;               /* size */
};

/* ---- options every transport gets --------------------------------------- */
struct kv__net_opts {
    char token[KV_CFG_STR];     /* cluster.token; "" = none required */
    char device_name[KV_CFG_STR];   /* cluster.device_name (rdma) */
    unsigned timeout_ms;        /* per remote call; never 0 (see above) */
    unsigned threads;           /* server event loops */
};

/* A registered memory region as the master records it (RDMA: rkey). */
struct kv__segdesc {
    uint64_t base, len;
    uint32_t rkey;
};

struct kv__transport;   /* one per engine: the server and the client side */
struct kv__conn;        /* one client connection to one peer */

/* One conn's share of a batch_many call: in conn, ops, n; out rc (what
 * batch(conn, ops, n) would have returned). */
struct kv__batch {
    struct kv__conn *conn;
    struct kv__op *ops;
    size_t n;
    int rc;
};

struct kv__transport_ops {
    const char *name;   /* "tcp", "rdma" */

    /* > 0 when the transport can run here (rdma: a device is found, named
     * device_name when not ""), 0 when not; never fails hard. NULL = 1. */
    int (*probe)(const struct kv__net_opts *o);

    /* be may be NULL: a pure client that serves nothing. */
    int  (*create)(const struct kv__net_opts *o, struct kv__backend *be,
                   struct kv__transport **out, char *err, size_t errlen);
    /* Stops serving, closes every connection; all kv__conns of this
     * transport must have been closed. */
    void (*destroy)(struct kv__transport *t);

    /* Starts serving be on addr ("host:port"; port 0 picks one). The bound
     * address is written to bound (e.g. "0.0.0.0:41234"). Once. */
    int  (*listen)(struct kv__transport *t, const char *addr, char *bound, size_t boundlen,
                   char *err, size_t errlen);

    /* Connects to a peer's listen address and authenticates with the token
     * (KV_EPERM when refused, KV_ENET / KV_ETIMEDOUT when unreachable). */
    int  (*connect)(struct kv__transport *t, const char *addr, struct kv__conn **out);
    void (*close)(struct kv__conn *c);

    /* Runs ops[0..n) on the peer; fills each op's result. Returns KV_OK
     * when the exchange happened (items may still have failed), or an error
     * for the connection (KV_ENET, KV_ETIMEDOUT, KV_EPROTO): then no
     * op's result is meaningful and the conn must be closed. A load's
     * destination may have been partly written when the exchange fails. */
    int  (*batch)(struct kv__conn *c, struct kv__op *ops, size_t n);

    /* Optional (NULL: the cluster gives each conn's batch its own thread).
     * Runs batch(b[i].conn, b[i].ops, b[i].n) for every i < nb at once on
     * the calling thread: every request is started before any reply is
     * waited for, then each conn moves as its socket allows, with its own
     * deadlines, so a hung peer fails only its own batch. The conns must
     * be distinct. */
    void (*batch_many)(struct kv__batch *b, size_t nb);

    /* Caller memory that loads land in and dumps come from (RDMA: register
     * it once). NULL = no-op success. KV_EBUSY on overlap; KV_ENOTFOUND when
     * addr does not start a registered range. */
    int  (*register_buffer)(struct kv__transport *t, void *addr, size_t len);
    int  (*unregister_buffer)(struct kv__transport *t, void *addr);

    /* The server's registered segments, for the master's view; returns the
     * count written (at most cap). NULL = none. */
    int  (*segments)(struct kv__transport *t, struct kv__segdesc *out, int cap);
};

/* The transports built in. kv__rdma_transport is defined by net/rdma.c and
 * weak here, so a build without it falls back to tcp. */
extern const struct kv__transport_ops kv__tcp_transport;
extern const struct kv__transport_ops kv__rdma_transport __attribute__((weak));

/* Picks the ops for cluster.protocol (enum kv__protocol). auto: rdma when
 * its probe finds a device, else tcp, said once at info level. KV_ENOTSUP
 * when rdma is asked for and not available. */
int kv__transport_pick(int protocol, const struct kv__net_opts *o,
                       const struct kv__transport_ops **out);

/* Every transport object starts with this, so generic code can reach the
 * ops from a kv__transport pointer. */
struct kv__transport_base {
    const struct kv__transport_ops *ops;
    /* Loads this client refused because the bytes that landed failed the
     * sum the server sent with them (each item KV_ECORRUPT). */
    _Atomic uint64_t checksum_failures;
};

#endif
