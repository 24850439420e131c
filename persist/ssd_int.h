/*
 * ssd_int.h — what the files of persist/ share: the tier's state, the
 * in-memory key index (index.c), the store (rocks.c) and the spill queue
 * (spill.c). Only persist/ includes this header, and only persist/ sees
 * RocksDB's types.
 *
 * LOCK ORDER inside persist/ (outside it, the engine never calls us holding
 * one of its table-shard locks, see engine/internal.h):
 *
 *   gc_mu  >  spill queue lock (qmu)  >  index shard lock
 *   gc_mu  >  maintenance lock (mmu)
 *   gc_mu  >  database handle lock (dblk)  >  index shard lock
 *
 * - An index shard lock is a leaf: held only for a probe, an insert or a
 *   delete in one shard's table, never across I/O.
 * - qmu is held while victims are queued, while a reader copies a queued
 *   victim's bytes, and while the writer retires a written batch. Never
 *   across a RocksDB call.
 * - gc_mu serialises capacity GC (which writes deletions to RocksDB).
 * - dblk (a writer-preferring rwlock) is read-held around every call that
 *   uses the RocksDB handle, and write-held only to close and reopen it
 *   after RocksDB stopped on a full disk (see recover() in rocks.c). Never
 *   read-held twice by one thread (a waiting writer would deadlock it), and
 *   never held while taking qmu or gc_mu.
 */
#ifndef KV_PERSIST_SSD_INT_H
#define KV_PERSIST_SSD_INT_H

#include <pthread.h>
#include <rocksdb/c.h>
#include <stdatomic.h>

#include "ssd.h"

/* ---- keys ------------------------------------------------------------------
 * A data key is ns byte + 16-byte id + 4-byte big-endian shard index, so a
 * block's shards sort next to each other. Its meta key is the same with the
 * top bit of the first byte set: all meta keys sort after all data keys, in
 * one contiguous range the open scan walks without touching a data value.
 */
#define KV__SSD_KEY_LEN 21
#define KV__SSD_META_BIT 0x80u

static inline void kv__ssd_key(uint8_t *k, int ns, const uint8_t *id, uint32_t index, bool meta)
{
    k[0] = (uint8_t)ns | (meta ? KV__SSD_META_BIT : 0);
    memcpy(k + 1, id, KV_BLOCK_ID_LEN);
    k[17] = (uint8_t)(index >> 24);
    k[18] = (uint8_t)(index >> 16);
    k[19] = (uint8_t)(index >> 8);
    k[20] = (uint8_t)index;
}

/* ---- the key index (index.c) ----------------------------------------------
 * A sharded open-addressing hash table (linear probing, backward-shift
 * deletion, no tombstones). A block's shards land in one index shard (the
 * shard is picked from (ns, id) alone), so "every shard of a block" is a scan
 * of one shard, not of the whole table. 32 bytes a slot.
 */
enum { KV__ENT_EMPTY = 0, KV__ENT_STORED = 1, KV__ENT_PENDING = 2 };

struct kv__sent {
    uint8_t id[KV_BLOCK_ID_LEN];
    uint32_t index;
    uint32_t size;           /* value bytes (KV_VALUE_MAX fits) */
    uint64_t stamp : 48;     /* coldness: the tier's logical clock at last use */
    uint64_t ns : 8;
    uint64_t state : 8;      /* KV__ENT_* */
};

struct kv__sishard {
    pthread_mutex_t mu;
    struct kv__sent *tab;
    uint32_t cap;            /* a power of two, or 0 */
    uint32_t n;
} __attribute__((aligned(64)));

struct kv__sindex {
    struct kv__sishard *sh;
    uint32_t nshards;        /* a power of two */
    _Atomic uint64_t entries, blocks, bytes;   /* blocks: KV_NS_BLOCK entries with index 0 */
};

int  kv__sidx_init(struct kv__sindex *x, uint32_t nshards);
void kv__sidx_destroy(struct kv__sindex *x);
/* 1 inserted, 0 already present (left as it was; *old filled when non-NULL),
 * KV_ENOMEM. */
int  kv__sidx_insert(struct kv__sindex *x, const struct kv__sent *e, struct kv__sent *old);
/* Copies the entry out; false when absent. */
bool kv__sidx_get(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, struct kv__sent *out);
/* Sets the stamp of a present entry (a read made it warm). */
void kv__sidx_touch(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, uint64_t stamp);
/* Changes state from 'from' to 'to'; true when the entry was in 'from'. */
bool kv__sidx_transition(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, int from, int to);
/* Deletes an entry when its state is in the mask (1 << KV__ENT_*); true when
 * deleted, *old filled when non-NULL. */
bool kv__sidx_del(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, unsigned mask,
                  struct kv__sent *old);
/* Every entry of block (ns, id) whose state is in mask, deleted and copied
 * into out (at most cap; the count found is returned, deleted or not). */
size_t kv__sidx_del_block(struct kv__sindex *x, int ns, const uint8_t *id, unsigned mask,
                          struct kv__sent *out, size_t cap);
/* The shard indexes of (ns, id) whose state is in mask, at most cap of them
 * into idx; returns how many there are (may exceed cap). Scans the block's
 * lock shard, like kv__sidx_del_block. */
size_t kv__sidx_block_shards(struct kv__sindex *x, int ns, const uint8_t *id, unsigned mask,
                             uint32_t *idx, size_t cap);
/* A copy of every entry in mask (malloc'd into *out); count or KV_ENOMEM. */
ssize_t kv__sidx_snapshot(struct kv__sindex *x, unsigned mask, struct kv__sent **out);
/* Bytes the index holds (tables and shard headers). */
uint64_t kv__sidx_mem(struct kv__sindex *x);

/* ---- the spill queue (spill.c) --------------------------------------------- */
struct kv__sq_item {
    struct kv__sq_item *next;
    struct kv__victim *v;
    uint64_t bytes;          /* DRAM bytes it holds until released */
    uint64_t stamp;          /* coldness stamp given at accept */
    uint8_t *skip;           /* per shard: 1 = not to be written (present, removed) */
    bool inflight;           /* taken by the writer, being written */
};

/* ---- the tier ------------------------------------------------------------- */
struct kv__ssd {
    char path[KV_CFG_STR];
    int lockfd;
    int sync;                        /* enum kv__sync */
    uint64_t capacity;               /* 0 = unbounded */
    uint64_t gc_trigger, gc_bytes;   /* bytes */
    struct kv__ssd_tuning tune;

    rocksdb_t *db;                   /* under dblk; NULL after a failed reopen */
    pthread_rwlock_t dblk;
    _Atomic bool db_broken;          /* RocksDB stopped on a write error (full disk) */
    uint64_t reopen_fail_ns;         /* under dblk (write): last failed reopen */
    _Atomic uint64_t reopens;
    rocksdb_options_t *opts;
    rocksdb_writeoptions_t *wo;
    rocksdb_readoptions_t *ro;

    struct kv__sindex idx;
    _Atomic uint64_t clock;          /* logical time for coldness stamps */

    _Atomic uint64_t spills, spill_drops, checksum_failures;
    _Atomic uint64_t gc_runs, gc_blocks, enospc;
    _Atomic bool compact_wanted;

    pthread_mutex_t gc_mu;

    /* The maintenance thread: runs the compaction that reclaims space after
     * a GC round, off the write paths (it can take seconds). mmu is a leaf. */
    pthread_mutex_t mmu;
    pthread_cond_t mcv;
    bool mstop, mrunning;
    pthread_t mthread;

    /* spill queue, all under qmu */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;              /* the writer waits here for work */
    pthread_cond_t dcv;              /* drain waits here for progress */
    struct kv__sq_item *qhead, *qtail;   /* FIFO; in-flight items stay in it */
    uint64_t qbytes, qcap;
    bool closing, writer_running;
    pthread_t writer;
};

/* rocks.c, for spill.c and admin.c */
/* The RocksDB handle, with dblk read-held until kv__ssd_db_leave; NULL (the
 * lock still held) while the store is down after a failed reopen. Every use
 * of s->db outside rocks.c goes between these two, with no other persist/
 * lock taken in between and no nested enter. */
rocksdb_t *kv__ssd_db_enter(struct kv__ssd *s);
void kv__ssd_db_leave(struct kv__ssd *s);
/* Builds a write batch's entries for one value (data + meta). */
void kv__ssd_batch_put(rocksdb_writebatch_t *wb, int ns, const uint8_t *id, uint32_t index,
                       const kv_iov *iov, uint32_t iovcnt, uint64_t len, uint64_t stamp);
/* Writes a batch with the tier's write options; KV_OK or a KV_E*. */
int  kv__ssd_batch_write(struct kv__ssd *s, rocksdb_writebatch_t *wb);
/* Deletes one value's data and meta keys (a batch of its own). */
int  kv__ssd_delete_keys(struct kv__ssd *s, const struct kv__sent *ents, size_t n);
/* Capacity: makes room for 'extra' bytes not yet counted in the index, then
 * checks the disk has room for 'disk' bytes; KV_OK or KV_ENOSPC. */
int  kv__ssd_make_room(struct kv__ssd *s, uint64_t extra, uint64_t disk);

/* spill.c, for rocks.c */
int  kv__spill_start(struct kv__ssd *s);
void kv__spill_stop(struct kv__ssd *s);
/* Copies a queued victim's shard into iov: KV_OK, or KV_ENOTFOUND when it
 * is no longer queued (it is then on disk). */
int  kv__spill_read(struct kv__ssd *s, int ns, const uint8_t *id, uint32_t index,
                    const kv_iov *iov, uint32_t iovcnt);
/* Marks queued shards of (ns, id, index | UINT32_MAX) not to be written and
 * drops them from the index; returns how many. */
size_t kv__spill_cancel(struct kv__ssd *s, int ns, const uint8_t *id, uint32_t index);

#endif
