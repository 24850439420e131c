/*
 * ssd.h — the SSD tier (persist/ssd.c and the files of persist/).
 *
 * The engine reaches it only through its ops table, kv__ssd_tier (ssd.c,
 * the interface of engine/tier.h, registered in engine/tier.c); the kv__ssd_*
 * calls below are what that table wraps, and what the tests, tools and
 * benchmarks call by name. Everything about RocksDB stays behind them.
 * Keys are (namespace, block id, shard index); plain keys reach here as
 * their 16-byte hash with KV_NS_KEY (their value carries the key itself,
 * which the engine checks).
 *
 * Threading: every function may be called from many threads at once.
 */
#ifndef KV_PERSIST_SSD_H
#define KV_PERSIST_SSD_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/internal.h"

struct kv__ssd;

/* Opens (creating if needed) the store at cfg->ssd.path and rebuilds the
 * in-memory key index from a scan of the pointers, re-indexing what the
 * value log holds beyond them; RocksDB files that are missing or cannot be
 * opened are set aside and the index rebuilt from the log (ssd.c,
 * open_db); so is a RocksDB of another store (ssd.c, "identity").
 * KV_EBUSY when another engine (in this or another process) holds the
 * path; KV_ENOSPC on a full file system; KV_EPERM for an ssd.path another
 * user owns or others may write, or a symbolic link where a store file
 * should be; KV_EIO with a message naming the cause for a path that cannot
 * be created, or a store of an earlier kvengine. *out is NULL on
 * failure. */
int kv__ssd_open(const struct kv_config *cfg, struct kv__ssd **out, char *err, size_t errlen);

/* Flushes the spill queue (every accepted victim is written or dropped, and
 * released), then closes. NULL is allowed. */
void kv__ssd_close(struct kv__ssd *s);

/* Answers from the in-memory index, never does I/O. */
bool kv__ssd_contains(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t index);
/* The stored length of a value; KV_ENOTFOUND when absent. No I/O. */
int kv__ssd_size(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t index, uint64_t *len);

/* Reads a value, verifies its checksum and scatters it into iov, whose
 * lengths must add up to the stored length (KV_EINVAL otherwise, nothing
 * written). KV_ENOTFOUND when absent or when the checksum fails (the value
 * is then deleted and counted in checksum_failures). */
int kv__ssd_read(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t index,
                 const kv_iov *iov, uint32_t iovcnt);

/* Writes a value synchronously, durable as ssd.sync says, before returning
 * (write-through and the ssd pipeline). A value already present is left as
 * it is and KV_OK returned. KV_ENOSPC when the disk or ssd.capacity is full
 * and no room can be made. */
int kv__ssd_write(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t index,
                  const kv_iov *iov, uint32_t iovcnt);

/* The shard indexes the tier holds for block (ns, id), at most cap of them
 * into idx (in no particular order); returns how many it holds. No I/O. */
size_t kv__ssd_block_shards(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t *idx,
                            size_t cap);

/* kv__ssd_write for up to 64 shards at once (one sync and one WriteBatch
 * for them all); results[i] gets each shard's outcome and the return value
 * is KV_OK unless the arguments are bad. */
int kv__ssd_write_many(struct kv__ssd *s, int ns, const kv_shard *shards, size_t n, int *results);

/* Deletes every stored shard of (ns, id) (index UINT32_MAX) or one shard. */
int kv__ssd_remove(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t index);

/* The sink the engine hands evicted blocks to in the dram|ssd pipeline:
 * write-back through a bounded queue (ssd.spill_queue bytes); a victim that
 * does not fit is dropped and counted in spill_drops. */
struct kv__sink kv__ssd_sink(struct kv__ssd *s);

/* Adds the tier's figures to out: ssd_capacity, ssd_used, ssd_blocks,
 * spills, spill_drops, checksum_failures. */
void kv__ssd_stats(struct kv__ssd *s, kv_stats *out);

/* ---- added for tests, benchmarks and tools (not needed by the engine) ----- */

/* The knobs chosen by measurement (see doc/ssd-tier.md).
 * kv__ssd_open uses kv__ssd_tuning_defaults; benchmarks vary them. */
struct kv__ssd_tuning {
    uint64_t vlog_file_size;    /* value log files are rotated at this size */
    uint64_t write_buffer;      /* RocksDB memtable bytes (pointers only) */
    int write_buffers;          /* memtables, filling or waiting for their flush */
    int bg_jobs;                /* RocksDB background flushes + compactions */
    uint64_t batch_bytes;       /* spill writer: bytes per batch, at most */
    unsigned sync_ms;           /* maintenance tick: wal's sync, log compaction */
    uint64_t compact_min;       /* dead bytes a log file needs to be compacted */
    bool no_disk_precheck;      /* tests: let the writes themselves hit ENOSPC */
    bool rebuild;               /* kv__ssd_recover: set RocksDB's files aside and
                                   re-index the whole value log */
};
void kv__ssd_tuning_defaults(struct kv__ssd_tuning *t);
int  kv__ssd_open_tuned(const struct kv_config *cfg, const struct kv__ssd_tuning *t,
                        struct kv__ssd **out, char *err, size_t errlen);

/* Figures beyond kv_stats: memory of the key index, GC rounds and blocks
 * deleted by capacity GC, writes refused for lack of room, bytes the value
 * log's files take on disk (allocated blocks) and RocksDB's SST bytes. */
struct kv__ssd_info {
    uint64_t index_bytes, entries, blocks, used;
    uint64_t gc_runs, gc_blocks, enospc;
    uint64_t vlog_bytes, sst_bytes;
    uint64_t queued_bytes;
    uint64_t reopens;           /* recoveries after RocksDB stopped on a full disk */
    uint64_t moved_bytes;       /* copied by value log compaction */
    uint64_t recovered;         /* values re-indexed from the value log at open */
};
void kv__ssd_info(struct kv__ssd *s, struct kv__ssd_info *out);

/* Runs capacity GC now (as if past the trigger), then what kv__ssd_compact
 * does; for the tests. */
int  kv__ssd_gc_now(struct kv__ssd *s);

/* ---- admin (persist/walk.c): what kvctl ssd ls | scrub | compact run ----
 * Same contracts as kv_ssd_scan / kv_ssd_scrub / kv_ssd_compact in
 * kvengine.h, on the tier itself. */
int kv__ssd_scan(struct kv__ssd *s, kv_ssd_cb cb, void *ctx);
int kv__ssd_scrub(struct kv__ssd *s, bool repair, kv_ssd_cb cb, void *ctx, uint64_t *checked,
                  uint64_t *bad);
int kv__ssd_compact(struct kv__ssd *s);
/* kv_ssd_recover's work: opens the store with tune.rebuild, counts, closes. */
int kv__ssd_recover(const struct kv_config *cfg, uint64_t *recovered, char *err, size_t errlen);

#endif
