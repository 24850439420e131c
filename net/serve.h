/*
 * serve.h — what a node does with the items a peer sends it: the one
 * serving policy behind every transport (tcp.c, rdma.c) and behind the
 * cluster's own share of a batch (cluster.c's run_local).
 *
 * Policy, written once here:
 *   lookup, size  answered from the backend.
 *   load          pin the value where it lies (DRAM) and send it from there;
 *                 else (on SSD) copy it through a bounce buffer. Copies are
 *                 streamed: a response holds one bounce buffer, filled with
 *                 each copied value only when the writer reaches it.
 *   dump          a shard already stored is skipped (a success, its bytes
 *                 drained); else room is reserved and the bytes land in it;
 *                 else, on a node without a segment (SSD only), they land
 *                 in a bounce buffer handed to backend->dump; else they are
 *                 drained and the item refused. A plain key's copy from a
 *                 member (an internal batch with a stamp) is stored through
 *                 backend->store_copy, which may refuse it (tomb.h).
 *   remove, clear backend->removing hears of them first (tombstones).
 *
 * Limits a hostile or broken peer meets, all here or in the transports
 * with these constants:
 *   - bounce memory: a response holds at most one buffer (its largest copied
 *     value) and a dump one value at a time; all of a node's buffers come
 *     from one budget (KV__SERVE_BOUNCE_NODE). What does not fit is refused
 *     with KV_EBUSY for that item, and nothing else fails.
 *   - pins: one request pins one block at most KV__SERVE_PINS_PER_BLOCK
 *     times; its excess loads of that block are refused (KV_EBUSY), so the
 *     block's pin count never saturates and other clients still load it.
 *   - time: a frame must move at KV__NET_FLOOR_BYTES_PER_MS over its whole
 *     transfer, on top of the transport's timeout (both transports and the
 *     client's deadline use this one constant).
 *   - tokens are compared in constant time (kv__token_eq).
 *   - connections (in the transports and kvmaster, with their own caps):
 *     one that has not authenticated is closed after the timeout, and the
 *     oldest such makes room past a cap; a listener out of descriptors
 *     refuses the waiting peer through a spare one (kv__net_refuse_one).
 *   - exposure: a member that listens beyond loopback needs a token or
 *     cluster.insecure (kv__net_check_exposure).
 *
 * Threading: a struct kv__serve is shared by every server thread of one
 * transport; its budget is an atomic. Everything else here works on the
 * caller's per-connection state.
 */
#ifndef KV_NET_SERVE_H
#define KV_NET_SERVE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "proto.h"
#include "transport.h"

/* The slowest transfer rate a peer may hold a frame at: 10 MiB/s. A frame of
 * B bytes gets the transport's timeout plus B / this many ms, on both ends.
 * Far below any healthy link, and high enough that a trickling peer cannot
 * hold a reservation or a task for long. */
#define KV__NET_FLOOR_BYTES_PER_MS 10240u

static inline uint64_t kv__net_floor_ms(uint64_t bytes)
{
    return bytes / KV__NET_FLOOR_BYTES_PER_MS;
}

/* Bounce memory one node may hold at once, over all connections: 512 MiB.
 * Twice KV_NET_BOUNCE_MAX so the largest dump always fits beside others,
 * and 32 concurrent copies of 16 MiB values; a node's own memory is sized
 * by dram.capacity, and this is what serving SSD values may add to it. */
#define KV__SERVE_BOUNCE_NODE (512ull << 20)

/* Pins one request may take on one block. A block's pin count saturates at
 * 0x7FFF (engine/index.h); 1,024 leaves room for 31 more such requests,
 * and no real request loads a thousand shards of one block. */
#define KV__SERVE_PINS_PER_BLOCK 1024u

struct kv__serve {
    struct kv__backend *be;
    _Atomic uint64_t bounce_used;   /* bytes of bounce buffers out now */
    uint64_t bounce_cap;            /* KV__SERVE_BOUNCE_NODE */
};

void kv__serve_init(struct kv__serve *s, struct kv__backend *be);

/* Constant-time token check: the time depends on want's length only, never
 * on where given first differs. 1 when equal. */
int kv__token_eq(const char *given, const char *want);

/* A bounce buffer of len bytes from the node's budget; NULL when the budget
 * (or malloc) cannot give it. kv__serve_bounce_put gives it back. */
void *kv__serve_bounce_get(struct kv__serve *s, uint64_t len);
void kv__serve_bounce_put(struct kv__serve *s, void *p, uint64_t len);

/* ---- a batch's non-dump items and the data of its response ------------- */

/* A lookup or size item, answered into r. */
void kv__serve_query(struct kv__serve *s, const struct kv__wire_req *q, struct kv__wire_resp *r);

/* A load's first step: KV_OK with the value pinned (*d, *len == q->len,
 * *pin to give to backend->unpin); KV__SERVE_COPY when it is not in DRAM
 * but stored with the expected length (copy it: backend->load); else the
 * item's error (KV_ENOTFOUND, KV_EINVAL for another length). */
#define KV__SERVE_COPY 1
int kv__serve_pin(struct kv__serve *s, const struct kv__wire_req *q, const void **d,
                  uint64_t *len, kv__pin *pin);

/* The data a response sends after its header and body: iov[1..cnt) are the
 * OK loads in item order; iov[0] is left to the caller (header + body). A
 * pinned value is sent from where it lies; a copied one (item[i] != 0,
 * item[i] - 1 its index in the request) is loaded into buf when the writer
 * reaches it (kv__serve_out_ready). */
struct kv__serve_out {
    struct iovec *iov;
    size_t cnt;
    uint32_t *item;
    kv__pin *pins;
    size_t npins;
    void *buf;              /* the one bounce buffer, of buflen bytes */
    uint64_t buflen;
    uint64_t data;          /* bytes in iov[1..cnt) */
};

/* Serves every lookup, size and load of req[0..n) into resp (dumps are left
 * as they are) and plans the response's data in *out. KV_ENOMEM when the
 * plan itself cannot be allocated (a connection error); item errors are in
 * resp. */
int kv__serve_items(struct kv__serve *s, const struct kv__wire_req *req,
                    struct kv__wire_resp *resp, size_t n, struct kv__serve_out *out);

/* Before sending from iov[at]: loads a copied value into the buffer when
 * iov[at] is one, and says in *cnt how many iovs from at are ready to go
 * (at least 1). KV_OK, or an error when a value promised in the response
 * can no longer be read (removed since): the connection must be closed. */
int kv__serve_out_ready(struct kv__serve *s, const struct kv__wire_req *req,
                        struct kv__serve_out *out, size_t at, size_t *cnt);

/* Unpins and frees everything the response held; *out is zeroed. */
void kv__serve_out_free(struct kv__serve *s, struct kv__serve_out *out);

/* ---- a dump whose bytes arrive from the wire -------------------------- */

enum { KV__DUMP_DRAIN, KV__DUMP_SKIP, KV__DUMP_RESV, KV__DUMP_BOUNCE };

struct kv__serve_dump {
    int how;                /* KV__DUMP_* */
    int status;             /* the item's status so far */
    kv__resv resv;
    void *buf;              /* KV__DUMP_BOUNCE: len bytes from the budget */
    uint64_t len;
};

/* Decides where a dump's bytes go (the policy above). bounce_ok 0: never
 * through a bounce buffer (rdma's PREP, whose fallback is a BATCH). */
void kv__serve_dump_begin(struct kv__serve *s, const struct kv__wire_req *q, int bounce_ok,
                          struct kv__serve_dump *d);
/* Where the bytes from offset got on go; NULL = drain them. */
void *kv__serve_dump_dst(const struct kv__serve_dump *d, uint64_t got);
/* A reservation whose bytes are in, stored for item q: committed, or, for
 * a plain key's copy from a member, judged and stored by the backend's
 * store_copy (which commits or aborts r). Returns the item's status. */
int kv__serve_commit(struct kv__serve *s, const struct kv__wire_req *q, kv__resv *r);
/* All bytes are in: commits or hands them on; returns the item's status. */
int kv__serve_dump_end(struct kv__serve *s, const struct kv__wire_req *q,
                       struct kv__serve_dump *d);
/* The bytes will not all come: gives back what begin took. */
void kv__serve_dump_abort(struct kv__serve *s, struct kv__serve_dump *d);

/* ---- items whose bytes are in this process (cluster.c's own share) ---- */

/* Serves ops[0..n) on be: loads straight into their iovecs, dumps from
 * theirs (backend->dump when there is one, else reserve, copy, commit). */
void kv__serve_ops(struct kv__backend *be, struct kv__op *ops, size_t n);

/* ---- listeners -------------------------------------------------------- */

/* Out of descriptors with peers waiting, a listening socket stays readable
 * and an accept loop would spin: gives up the spare descriptor (*spare, an
 * open /dev/null) to accept the newest peer and close it at once (it will
 * retry), then takes the spare back. */
void kv__net_refuse_one(int lfd, int *spare);

/* ---- exposure --------------------------------------------------------- */

/* A member listening on addr beyond 127.0.0.0/8 with an empty token serves
 * anyone who can reach it: KV_ECONFIG (err says why) unless insecure, when
 * it is logged as a warning and allowed. what names the setting ("
 * cluster.listen"). */
int kv__net_check_exposure(const char *what, const char *addr, const char *token, int insecure,
                           char *err, size_t errlen);

#endif
