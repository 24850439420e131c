/*
 * ssd_int.h — what the files of persist/ share: the tier's state, the
 * in-memory key index (index.c), the store (ssd.c), the value log
 * (vlog.c) and the spill queue (spill.c). Only persist/ includes this header, and only persist/ sees
 * RocksDB's types.
 *
 * LOCK ORDER inside persist/ (outside it, the engine never calls us holding
 * one of its table-shard locks, see engine/internal.h):
 *
 *   gc_mu  >  spill queue lock (qmu)  >  index shard lock
 *   gc_mu  >  maintenance lock (mmu)
 *   gc_mu  >  database handle lock (dblk)  >  index shard lock
 *   compaction lock (cmu)  >  dblk, amu, index shard lock
 *   clock ceiling lock (ceil_mu)  >  dblk
 *   value log: active files (amu)  >  file table (lk)
 *
 * - An index shard lock is a leaf: held only for a probe, an insert or a
 *   delete in one shard's table, never across I/O.
 * - qmu is held while victims are queued, while a reader copies a queued
 *   victim's bytes, and while the writer retires a written batch. Never
 *   across a RocksDB call.
 * - gc_mu serialises capacity GC (which writes deletions to RocksDB).
 * - dblk (a writer-preferring rwlock) is read-held around every call that
 *   uses the RocksDB handle, and write-held only to close and reopen it
 *   after RocksDB stopped on a full disk (see recover() in ssd.c). Never
 *   read-held twice by one thread (a waiting writer would deadlock it), and
 *   never held while taking qmu or gc_mu.
 * - amu and lk (vlog.c) are held for an offset bump, a table lookup or
 *   edit, never across I/O other than creating or unlinking a file.
 * - ceil_mu serialises raising the clock ceiling (ssd.c, "identity"): held
 *   across one RocksDB write, once per 2^20 stamps.
 * - cmu serialises value log compactions (the maintenance thread's and
 *   kv__ssd_compact's); held across I/O, taken with no other lock held.
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
/* STORED: on disk at loc. PENDING: queued for spill, its bytes still in
 * DRAM. The others are claims in progress (see "Claims" below). */
enum {
    KV__ENT_EMPTY = 0, KV__ENT_STORED = 1, KV__ENT_PENDING = 2, KV__ENT_WRITING = 3,
    KV__ENT_DELETING = 4, KV__ENT_CANCELLED = 5, KV__ENT_MOVING = 6
};

struct kv__sent {
    uint8_t id[KV_BLOCK_ID_LEN];
    uint32_t index;
    uint32_t size;           /* value bytes (KV_VALUE_MAX fits) */
    uint64_t stamp : 48;     /* coldness: the tier's logical clock at last use */
    uint64_t ns : 8;
    uint64_t state : 8;      /* KV__ENT_* */
    uint64_t loc;            /* value log file and offset (STORED only) */
    uint32_t slen;           /* bytes stored there (less than size when lz4 paid) */
    uint32_t sum32;          /* STORED: the low half of the record's checksum, as
                                its pointer has it; a read compares the record */
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
/*
 * Claims. Only the holder of an entry's claim writes or deletes its key in
 * RocksDB, so two writers, or a writer and a remove, never race on one key:
 * PENDING (the spill writer's), WRITING (a synchronous writer's) and
 * DELETING (a remove's, GC's or a bad read's) entries carry the holder's
 * token in loc (bit 63 set, never a real loc); whoever finds another's
 * claim backs off (a writer retries, a remove leaves a WRITING entry to the
 * write it raced). CANCELLED is a PENDING entry removed while the spill
 * writer had it in flight: the writer deletes what it wrote.
 */
#define KV__TOKEN_BIT (1ull << 63)
/* Marks the entry in state 'from' holding 'token' STORED, with e's size,
 * stamp, loc, slen and sum32; false when it is no longer so. */
bool kv__sidx_store(struct kv__sindex *x, const struct kv__sent *e, int from, uint64_t token);
/* Moves the entry from (state 'from', loc 'at' or UINT64_MAX for any) to
 * (state 'to', loc 'token'); *old gets it as it was. */
bool kv__sidx_swap(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, int from,
                   uint64_t at, int to, uint64_t token, struct kv__sent *old);
/* Deletes the entry only while it is in 'state' at 'at' (a claim's token,
 * or a STORED value's loc). */
bool kv__sidx_del_at(struct kv__sindex *x, int ns, const uint8_t *id, uint32_t index, int state,
                     uint64_t at);
/* The shard indexes of (ns, id) whose state is in mask, at most cap of them
 * into idx; returns how many there are (may exceed cap). Scans the block's
 * lock shard only. */
size_t kv__sidx_block_shards(struct kv__sindex *x, int ns, const uint8_t *id, unsigned mask,
                             uint32_t *idx, size_t cap);
/* A copy of every entry in mask (malloc'd into *out); count or KV_ENOMEM. */
ssize_t kv__sidx_snapshot(struct kv__sindex *x, unsigned mask, struct kv__sent **out);
/* Bytes the index holds (tables and shard headers). */
uint64_t kv__sidx_mem(struct kv__sindex *x);

/* ---- the value log (vlog.c) ------------------------------------------------
 * Where values' bytes live; RocksDB holds a pointer (loc) per value. A loc
 * is a file number (24 bits, from 1) and a byte offset (40 bits). */
#define KV__VLOG_HDR 64            /* a record's header */
#define KV__VLOG_FHDR 80           /* a file's header: records start past it */
#define KV__VLOG_KEY_LEN 32        /* a file's MAC key */
#define KV__STORE_ID_LEN 16        /* a store's id (ssd.c, "identity") */
#define KV__VLOG_MAX_FILE (1u << 23)   /* keeps bit 63 of a loc clear */
#define KV__VLOG_SYNC_MAX 8
/* Files appended to at once: ext4 serialises buffered writes to one inode
 * (i_rwsem), so writer threads each take a stripe (measured: one file,
 * 4 io threads, 20% of CPU spinning in rwsem_spin_on_owner). */
#define KV__VLOG_STRIPES 4
#define KV__LOC_NONE 0ull
#define KV__LOC_FILE(l) ((uint32_t)((l) >> 40))
#define KV__LOC_OFF(l) ((l) & ((1ull << 40) - 1))
static inline uint64_t kv__loc(uint32_t file, uint64_t off) { return ((uint64_t)file << 40) | off; }

struct kv__vfile;
struct kv__vlog {
    char dir[KV_CFG_STR + 16];
    pthread_rwlock_t lk;             /* files[]: held only to look up or edit */
    struct kv__vfile **files;        /* sorted by number */
    size_t n, cap;
    pthread_mutex_t amu;             /* the active files and their tails; a leaf */
    struct kv__vfile *active[KV__VLOG_STRIPES];
    uint64_t tail[KV__VLOG_STRIPES];
    _Atomic unsigned next_stripe;
    uint32_t next_no;
    uint8_t id[KV__STORE_ID_LEN];    /* the store's: new files carry it */
    uint32_t unreadable, foreign;    /* files left out at open: no header of
                                        this format / another store's */
    uint64_t file_size;
    bool compress;
    _Atomic bool punch;              /* false once the file system refused */
    gid_t gid;                       /* ssd.group's, or (gid_t)-1 (modes.c) */
};

/* One value to append: key, bytes in; where it went (loc, slen), its
 * checksum and the outcome out. */
struct kv__vrec {
    uint8_t key[KV__SSD_KEY_LEN];
    const kv_iov *iov;
    uint32_t iovcnt;
    uint64_t len, stamp;
    uint64_t loc, sum;
    uint32_t slen;
    int rc;
};
struct kv__vext { uint64_t loc; uint32_t slen; };

/* Opens the files of dir (created 0700 if missing) whose header reads;
 * those that do not are counted in v->unreadable and left alone, and a
 * symbolic link or anything but a regular file refuses the open
 * (KV_EPERM). No file is appended to before kv__vlog_bind. KV_OK, KV_EIO,
 * KV_EPERM with a message. */
int  kv__vlog_open(struct kv__vlog *v, const char *dir, uint64_t file_size, bool compress,
                   gid_t gid, char *err, size_t errlen);
/* The distinct store ids the open files carry (up to cap into ids); how
 * many there are. */
size_t kv__vlog_ids(struct kv__vlog *v, uint8_t (*ids)[KV__STORE_ID_LEN], size_t cap);
/* Binds the log to store id: files of another store are closed and never
 * served nor touched (v->foreign); new files carry id. How many dropped. */
size_t kv__vlog_bind(struct kv__vlog *v, const uint8_t *id);
void kv__vlog_close(struct kv__vlog *v);
/* Appends n values (r[i].rc each); with sync, fdatasyncs what it wrote
 * before returning. KV_OK when all of them landed. */
int  kv__vlog_append(struct kv__vlog *v, struct kv__vrec *r, size_t n, bool sync);
/* Reads the value at loc into iov (lengths adding up to len), checking the
 * record's header (MAC, key, length, and the low half of its checksum
 * against sum32, the pointer's) and checksum: KV_OK; KV_ECORRUPT with
 * *why; KV_EIO. On failure iov is zeroed. */
int  kv__vlog_read(struct kv__vlog *v, const uint8_t *key, uint64_t loc, uint64_t len,
                   uint32_t sum32, const kv_iov *iov, uint32_t iovcnt, const char **why);
/* The *why of a read that found a record of this store, whole and MAC'd
 * for its place, but not the pointer's (another key, length or checksum):
 * the pointer is wrong, not the record, which must not be killed for it. */
extern const char kv__vlog_not_its_record[];
/* Kills a record and gives its space back (hole punched or magic killed,
 * see vlog.c; the file unlinked when it was its last live record). With a
 * key, only when the record there is that key's (its header read and its
 * MAC checked): otherwise only the space's count is given back. KV_OK,
 * or KV_EIO when the record could not be killed: it may then be found
 * again by a scan. */
int  kv__vlog_free(struct kv__vlog *v, uint64_t loc, uint32_t slen, const uint8_t *key);

/* A record kv__vlog_settle found intact where no pointer leads. */
struct kv__vfound {
    const uint8_t *key;      /* KV__SSD_KEY_LEN bytes */
    uint64_t loc, stamp;
    uint64_t sum;            /* its checksum, as a pointer carries it */
    uint32_t len, slen;
};
/* Decides a found record's fate: true keeps it (the caller now points to
 * it), false kills it (an older copy of a key that has a newer one). */
typedef bool (*kv__vfound_fn)(void *ctx, const struct kv__vfound *r);
/* What settle saw, for the open's log line. */
struct kv__vsettle {
    uint64_t found, kept, killed;    /* intact records no pointer led to */
    uint64_t torn;                   /* records of ours cut short or damaged */
    uint64_t files_removed;
};
/*
 * After the open scan of the pointers (ext: the records they lead to):
 * every stretch of every file that no pointer covers is scanned for intact
 * records (MAC and checksum verified), and each is offered to found(); what
 * is not kept (garbage, torn or refused records) is punched; files left
 * with nothing live are unlinked; then the first files to append to are
 * started. KV_OK, or KV_EIO / KV_ENOMEM with a message.
 */
int  kv__vlog_settle(struct kv__vlog *v, struct kv__vext *ext, size_t n, kv__vfound_fn found,
                     void *ctx, struct kv__vsettle *st, char *err, size_t errlen);
/* A file worth compacting: not appended to, at least min_dead bytes on
 * disk beyond its live records, which are under half of it. Its number,
 * or 0. */
uint32_t kv__vlog_sparse(struct kv__vlog *v, uint64_t min_dead);
/* fdatasync of every file (the wal mode's once-a-second sync). */
int  kv__vlog_sync(struct kv__vlog *v);
uint64_t kv__vlog_disk_bytes(struct kv__vlog *v);
uint64_t kv__vlog_span(uint32_t slen);
/* The path of log file number no. */
void kv__vlog_file_name(const struct kv__vlog *v, uint32_t no, char *buf, size_t cap);

/* ---- the spill queue (spill.c) --------------------------------------------- */
struct kv__sq_item {
    struct kv__sq_item *next;
    struct kv__victim *v;
    uint64_t bytes;          /* DRAM bytes it holds until released */
    uint64_t stamp;          /* coldness stamp given at accept */
    uint64_t token;          /* the claim its PENDING entries carry */
    uint8_t *skip;           /* per shard: SKIP_* (spill.c) */
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

    struct kv__vlog vlog;
    struct kv__sindex idx;
    _Atomic uint64_t clock;          /* logical time for coldness stamps */
    _Atomic uint64_t ceiling;        /* no record carries a stamp at or above
                                        it: persisted in RocksDB first */
    bool ceiling_known;              /* at open: RocksDB's, not a rebuilt one's */
    pthread_mutex_t ceil_mu;
    _Atomic uint64_t tokens;         /* claim tokens (see "Claims") */

    _Atomic uint64_t spills, spill_drops, checksum_failures;
    _Atomic uint64_t gc_runs, gc_blocks, enospc;

    pthread_mutex_t gc_mu;
    pthread_mutex_t cmu;             /* one value log compaction at a time */
    _Atomic uint64_t moved_bytes;    /* by compaction */
    _Atomic uint64_t recovered;      /* values re-indexed from the log at open */

    /* The maintenance thread: with ssd.sync: wal, syncs the value log and
     * the WAL every tune.sync_ms. mmu is a leaf. */
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

    gid_t gid;                       /* ssd.group's, or (gid_t)-1 (modes.c) */
    _Atomic uint64_t mode_sweeps;    /* kv__ssd_fix_modes runs finished */
};

/* ssd.c, for spill.c and walk.c (only ssd.c touches s->db) */
uint64_t kv__ssd_token(struct kv__ssd *s);

/* One value to store, for kv__ssd_put: the caller holds its claim. */
struct kv__sput {
    int ns;
    const uint8_t *id;
    uint32_t index;
    const kv_iov *iov;
    uint32_t iovcnt;
    uint64_t len, stamp;
    uint64_t loc;                    /* out: where it went */
    uint32_t slen;                   /* out: bytes stored */
    uint64_t sum;                    /* out: the record's checksum */
    int rc;                          /* out */
};
/* Stores n claimed values: appended to the value log, then their pointers
 * in one WriteBatch, durable as ssd.sync says. p[i].rc each (a value whose
 * pointer could not be written has its log space given back); KV_OK when
 * every one landed. */
int  kv__ssd_put(struct kv__ssd *s, struct kv__sput *p, size_t n);
/* The index entry for a value kv__ssd_put stored (state left 0). */
void kv__ssd_put_entry(const struct kv__sput *p, struct kv__sent *e);
/* Deletes the pointers of claimed entries (DELETING or CANCELLED, or
 * WRITING being undone), then kills their records and gives their log
 * space back; loc/slen in each entry say where (KV__LOC_NONE: nothing
 * written). When the pointers could not be deleted, the records are left
 * as they are (the values are still stored: the caller's delete failed)
 * unless force: then they are killed all the same, so that a pointer left
 * behind leads to a dead record (a miss), never to the old value. */
int  kv__ssd_unput(struct kv__ssd *s, const struct kv__sent *ents, size_t n, bool force);
/* Reads and checks a STORED value at e->loc into iov: KV_OK, KV_ECORRUPT
 * (*why says how), KV_EIO. No index change. */
int  kv__ssd_fetch(struct kv__ssd *s, const struct kv__sent *e, const kv_iov *iov, uint32_t iovcnt,
                   const char **why);
/* A value that failed its check: deleted (if it is still the one at
 * e->loc) and counted. True when this call deleted it. */
bool kv__ssd_drop_bad(struct kv__ssd *s, const struct kv__sent *e, const char *why);
/* Capacity: makes room for 'extra' bytes not yet counted in the index, then
 * checks the disk has room for 'disk' bytes; KV_OK or KV_ENOSPC. */
int  kv__ssd_make_room(struct kv__ssd *s, uint64_t extra, uint64_t disk);

/* spill.c, for ssd.c */
int  kv__spill_start(struct kv__ssd *s);
void kv__spill_stop(struct kv__ssd *s);
/* Copies a queued victim's shard into iov: KV_OK, or KV_ENOTFOUND when it
 * is no longer queued (it is then on disk). */
int  kv__spill_read(struct kv__ssd *s, int ns, const uint8_t *id, uint32_t index,
                    const kv_iov *iov, uint32_t iovcnt);
/* Removes queued shards of (ns, id, index | UINT32_MAX): not to be written,
 * dropped from the index (or CANCELLED when in flight); returns how many. */
size_t kv__spill_cancel(struct kv__ssd *s, int ns, const uint8_t *id, uint32_t index);
/* Takes a PENDING shard over for a synchronous writer: its entry becomes
 * WRITING with 'token' and the spill writer will not write it (its bytes
 * stay readable from the queue). KV_OK; KV_EBUSY while the spill writer
 * has it in flight; KV_ENOTFOUND when it is not queued any more. */
int  kv__spill_steal(struct kv__ssd *s, int ns, const uint8_t *id, uint32_t index, uint64_t token);

/* modes.c: who may read the store (ssd.group). kv__ssd_group resolves a
 * group name or gid into *gid ((gid_t)-1 when empty): KV_OK, KV_ECONFIG
 * (no such group), KV_EPERM (this user is not a member), with a message.
 * Directories are kv__ssd_dir_mode (0700, or 2750 with a group), files
 * kv__ssd_file_mode (0600, or 0640). kv__ssd_fix_modes sets every file and
 * directory under path that this user owns to them (RocksDB creates its
 * files 0644), following no link, opening no file; deep: also inside its
 * subdirectories (vlog/, damaged-*), else path's own entries only (where
 * RocksDB's files are). Returns how many it changed. */
int    kv__ssd_group(const char *group, gid_t *gid, char *err, size_t errlen);
mode_t kv__ssd_dir_mode(gid_t gid);
mode_t kv__ssd_file_mode(gid_t gid);
size_t kv__ssd_fix_modes(const char *path, gid_t gid, bool deep);

#endif
