/*
 * proto.h — the wire format of kvengine's cluster: fixed 32-byte frame
 * headers, then a bounded descriptor body, then bulk value bytes.
 *
 * Key design choice: descriptors and values travel apart. The body (what a
 * decoder parses) is small and capped at KV_PROTO_BODY_MAX; value bytes
 * follow it as "data" whose size the header states and the body itemises,
 * so a receiver can check every length before it allocates or copies, and
 * can then read values straight into their final place (segment memory on
 * a server, the caller's iovecs on a client) instead of through the parser.
 *
 * Frame:
 *   header  magic u32 "KVNE" | version u8 | type u8 | flags u16 |
 *           body_len u32 | status i32 | req_id u64 | data_len u64
 *   body    body_len bytes, type-specific (below)
 *   data    data_len bytes of values, in item order
 * All integers little-endian.
 *
 * Before any frame, every connection (tcp, rdma's side channel, kvmaster,
 * view queries) runs auth.h's challenge-response, so the token itself never
 * crosses the wire; version 1's HELLO, which carried it, is gone (types 1
 * and 2 stay unused).
 *
 * Bodies:
 *   BATCH      count u32 | flags u32 | view u64 | stamp u64, then count
 *              items of 32 bytes:
 *              kind u8 | ns u8 | flags u16 | index u32 | id[16] | len u64
 *              (dump: value length, all in data; load: expected length)
 *              view: the version of the membership view the sender routed
 *              the batch by (0: none, a tool or a harness); flags:
 *              KV_BATCH_INTERNAL for a member's own copies (re-replication,
 *              hand-off, a leaver's forwarding), no other bit. A member
 *              that is no owner of a dump's id in its own view, newer than
 *              the sender's, refuses it with KV_ECLOSED and stores nothing
 *              (cluster.c, "writes for keys not ours"); internal ones are
 *              never refused so. stamp: on an internal batch of copies
 *              (re-replication, hand-off), the sender's wall clock (ms
 *              since 1970) when it read the first of their values; 0 on
 *              any other batch (a leaver's forwarding of a write is a
 *              write). A plain key's copy not newer than a tombstone the
 *              receiver keeps (net/tomb.h) is refused with KV_EBUSY and
 *              stores nothing. Version 3 added the 12 bytes after count,
 *              version 4 the stamp.
 *   BATCH_R    count u32, then count results of 48 bytes:
 *              status i32 | hit u8 pad[3] | len u64 | addr u64 | rkey u32 |
 *              pad u32 | handle u64 | sum u64
 *              (hit of a remove or clear of plain keys: a copy the member
 *              read may still land, so the remover runs its second round;
 *              net/cluster.c, the fence)
 *              (data: the values of the items that are OK loads, in order,
 *              then on tcp one sum u64 per OK load, the server's XXH3-64
 *              of the bytes it sent (KV_PROTO_SUM_LEN each), checked by the
 *              client over what landed; addr/rkey/handle are for RDMA RPCs,
 *              0 on tcp; sum is rdma's PREP's, 0 on tcp)
 *   JOIN       a member (below), the sender's own record      (node->master)
 *   VIEW       version u64, count u32, count members          (master->node)
 *   member     id_len u16, id, addr_len u16, addr, flags u32, nseg u32,
 *              nseg x (base u64, len u64, rkey u32), lease u64,
 *              figures: dram_capacity, dram_used, ssd_capacity, ssd_used,
 *              dram_blocks, ssd_blocks, keys, stamp_ms (u64 each),
 *              ver_len u16, ver, mac[32]
 *              (mac: kv__member_sign's, made by the member itself, so
 *              neither kvmaster nor etcd can make up or alter a record;
 *              it covers every field before it, the figures included)
 * The RDMA transport adds its own types from KV_MSG_RDMA_FIRST up, with
 * BATCH / BATCH_R bodies.
 */
#ifndef KV_NET_PROTO_H
#define KV_NET_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define KV_PROTO_MAGIC    0x454e564bu   /* "KVNE" little-endian */
#define KV_PROTO_VERSION  4           /* 2: challenge-response, signed members, sums;
                                         * 3: a BATCH carries its sender's view;
                                         * 4: and an internal one its copies' stamp */
#define KV_PROTO_HDR_LEN  32
#define KV_PROTO_BODY_MAX (4u << 20)    /* descriptors, never values */
#define KV_PROTO_BATCH_MAX 65536u       /* items per batch frame */
#define KV_PROTO_REQ_ITEM 32
#define KV_PROTO_BATCH_HDR 24           /* a BATCH body before its items */
#define KV_PROTO_RESP_ITEM 48
#define KV_PROTO_ID_MAX   128           /* node id / address / token bytes */
#define KV_PROTO_SUM_LEN  8             /* a load's checksum on tcp */
#define KV_PROTO_SEG_MAX  64            /* segment descriptors per member */
#define KV_PROTO_VIEW_MAX 4096          /* members per view */
#define KV_PROTO_VER_MAX  32            /* a member's version string */

enum kv__msg {
    /* 1, 2: version 1's HELLO / HELLO_OK, retired */
    KV_MSG_BATCH = 3,
    KV_MSG_BATCH_R = 4,
    KV_MSG_JOIN = 5,
    KV_MSG_VIEW = 6,
    KV_MSG_LEAVE = 7,           /* body: a member; answered by VIEW */
    KV_MSG_RDMA_FIRST = 32,     /* 32..63: net/rdma*.c */
    KV_MSG_RDMA_LAST = 63,
};

/* Member flags. */
#define KV_MEMBER_OWNER 1u      /* stores blocks (dram.capacity > 0) */
#define KV_MEMBER_LEAVING 2u    /* an owner handing its data on before it leaves (cluster.c) */

struct kv__hdr {
    uint8_t version, type;
    uint16_t flags;
    uint32_t body_len;
    int32_t status;
    uint64_t req_id;
    uint64_t data_len;
};

/* Encodes h into out[KV_PROTO_HDR_LEN] (magic and version are filled in). */
void kv__hdr_encode(const struct kv__hdr *h, uint8_t *out);
/* Decodes and checks: magic, version, a known type, body_len within
 * KV_PROTO_BODY_MAX, data_len only on types that carry data and at most
 * max_data. KV_EPROTO otherwise. */
int  kv__hdr_decode(const uint8_t *in, uint64_t max_data, struct kv__hdr *h);

/* A request item as on the wire, decoded. */
/* Request item flags (the u16 after kind and ns). */
#define KV_WIRE_REPLACE 1u      /* a dump that replaces (plain keys' put) */
#define KV_WIRE_PREFIX  2u      /* a CLEAR by prefix (index > 0): a peer that
                                 * does not know it refuses the frame rather
                                 * than clearing every key */

/* BATCH flags (the u32 after count). */
#define KV_BATCH_INTERNAL 1u    /* a member's own copy: never refused as "not owner" */

struct kv__wire_req {
    uint8_t kind, ns;
    uint16_t flags;             /* KV_WIRE_*; only a dump carries one */
    uint32_t index;
    kv_block_id id;
    uint64_t len;
    /* The batch's own fields, the same in each of its items: encoded from
     * the first item, decoded into every one. */
    uint64_t view;              /* the sender's view version; 0: none */
    uint32_t bflags;            /* KV_BATCH_* */
    uint64_t stamp;             /* an internal batch's copies' stamp; 0: none */
};
struct kv__wire_resp {
    int32_t status;
    uint8_t hit;
    uint64_t len, addr, handle;
    uint32_t rkey;
    uint64_t sum;               /* rdma PREP: XXH3-64 of the pinned value */
};

/* Batch bodies. The encoders return bytes written or KV_ENOBUFS; the
 * decoders check count against the body length and KV_PROTO_BATCH_MAX,
 * and each field's range (kind, ns, status), before writing anything:
 * KV_EPROTO. *n is in: capacity of out, out: the count. */
size_t kv__batch_body_len(size_t n);
size_t kv__batch_r_body_len(size_t n);
/* The wire requests for ops[0..n): kind, namespace, shard, id, the byte
 * count of a dump or load, and the batch's view, flags and stamp (from
 * ops[0]: cluster.c builds each batch from one call's view, and a batch
 * of copies from one read). */
void kv__wire_from_ops(const struct kv__op *ops, size_t n, struct kv__wire_req *out);
int kv__batch_encode(const struct kv__wire_req *items, size_t n, uint8_t *out, size_t cap);
int kv__batch_decode(const uint8_t *body, size_t len, struct kv__wire_req *out, size_t *n);
int kv__batch_r_encode(const struct kv__wire_resp *items, size_t n, uint8_t *out, size_t cap);
int kv__batch_r_decode(const uint8_t *body, size_t len, struct kv__wire_resp *out, size_t *n);
/* The count of a batch body, checked against its length; KV_EPROTO. A
 * body of request items (item_len KV_PROTO_REQ_ITEM) has the BATCH header
 * of KV_PROTO_BATCH_HDR bytes before them, the others a u32 count. */
int kv__batch_count(const uint8_t *body, size_t len, size_t item_len, size_t *n);

/* A member of the view. */
struct kv__member {
    char id[KV_PROTO_ID_MAX + 1];
    char addr[KV_PROTO_ID_MAX + 1];
    uint32_t flags;
    uint32_t nseg;
    struct kv__segdesc seg[KV_PROTO_SEG_MAX];
    uint64_t lease;             /* etcd: the lease the record lives on; 0 with kvmaster */
    /* The member's figures as of its last heartbeat (kvctl members): its
     * store's kv_stats (bytes, blocks, plain keys), its wall clock then
     * (ms since 1970), and its library version. They say nothing about
     * placement: a record that differs from the last only here is the same
     * member in the same place (kv__member_same_place), no view change. */
    uint64_t dram_capacity, dram_used, ssd_capacity, ssd_used;
    uint64_t dram_blocks, ssd_blocks, keys;
    uint64_t stamp_ms;
    char version[KV_PROTO_VER_MAX + 1];
    uint8_t mac[32];            /* kv__member_sign's */
};
/* 1 when a and b are the same member in the same place: id, address,
 * flags, segments and lease (everything but the figures and the mac). */
int kv__member_same_place(const struct kv__member *a, const struct kv__member *b);
/* A member's record signed with the token: mac = HMAC-SHA256 under the
 * label "kvengine/member" of the member's wire form up to the mac (id,
 * addr, flags, segments, lease, figures, version). KV_OK, KV_EINVAL (too many segments),
 * KV_EIO. */
int kv__member_sign(const char *token, struct kv__member *m);
/* 1 when m's id and address are what a member can have: printable bytes
 * only (no CR, LF, space or control: they end up in logs and lines), and an
 * address of the form host:port (host of letters, digits, '.', '-', '_';
 * port 1..65535; a client that is no owner may have none); else 0. Readers of the view drop records that are not. */
int kv__member_sane(const struct kv__member *m);
/* 1 when m's mac is the token's over its fields (constant time), else 0. */
int kv__member_verify(const char *token, const struct kv__member *m);
/* JOIN / LEAVE bodies: one member (signed; the token itself is proved by
 * the connection's challenge-response, never sent). */
int kv__join_encode(const struct kv__member *m, uint8_t *out, size_t cap);
int kv__join_decode(const uint8_t *body, size_t len, struct kv__member *m);
/* A member's secret: kvmaster hands one out in the VIEW answering the JOIN
 * that creates a record (appended to the VIEW body), and only a JOIN or
 * LEAVE carrying it (appended to the JOIN / LEAVE body) may change or drop
 * that record. The decoders below take a body with or without it: the
 * fields before it say where they end, so the two cannot be confused.
 * has is set to whether it was there. */
#define KV_PROTO_SECRET_LEN 16
/* Header flag of a JOIN from a client that keeps the secret: only it is
 * given one, so a client built before secrets (which refuses bytes after
 * the VIEW's members) still reads the VIEW; its records stay unowned. */
#define KV_HDR_SECRET 1u
int kv__join_decode_secret(const uint8_t *body, size_t len, struct kv__member *m,
                           uint8_t *secret, int *has);
int kv__view_decode_secret(const uint8_t *body, size_t len, uint64_t *version,
                           struct kv__member **members, size_t *n, uint8_t *secret, int *has);
/* VIEW body. kv__view_decode allocates *members (count entries; free()). */
int kv__view_encode(uint64_t version, const struct kv__member *m, size_t n,
                    uint8_t *out, size_t cap);
int kv__view_decode(const uint8_t *body, size_t len, uint64_t *version,
                    struct kv__member **members, size_t *n);
size_t kv__member_wire_len(const struct kv__member *m);

/* The end-to-end checksum of a load's bytes (XXH3-64), over a buffer or
 * the caller's iovecs. */
uint64_t kv__sum(const void *p, size_t len);
uint64_t kv__sum_iov(const kv_iov *iov, uint32_t cnt);
/* The same sum fed piece by piece (a receiver sums bytes as they land,
 * while they are still in cache): new (NULL when out of memory), reset
 * before each value, update, digest; free. */
void *kv__sum_state_new(void);
void kv__sum_reset(void *st);
void kv__sum_update(void *st, const void *p, size_t len);
uint64_t kv__sum_digest(void *st);
void kv__sum_state_free(void *st);

/* A status on the wire is KV_OK or one of the KV_E* codes. */
static inline int kv__status_valid(int32_t s)
{
    return s == KV_OK || (s <= KV_EINVAL && s >= KV_ENOTSUP);
}

#endif
