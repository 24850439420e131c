/*
 * ssd.h — the SSD tier as the engine sees it.
 *
 * The engine (engine/engine.c) calls only these functions; everything about
 * RocksDB stays behind them, in persist/. Keys are (namespace, block id,
 * shard index); plain keys reach here as their 16-byte hash with KV_NS_KEY
 * (their value carries the key itself, which the engine checks).
 *
 * Threading: every function may be called from many threads at once.
 */
#ifndef KV_PERSIST_SSD_H
#define KV_PERSIST_SSD_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

struct kv__ssd;

/* Opens (creating if needed) the store at cfg->ssd.path and rebuilds the
 * in-memory key index from a keys-only scan. KV_EBUSY when another engine
 * (in this or another process) holds the path; KV_EIO with a message naming
 * the cause for a path that cannot be created or a corrupt store. *out is
 * NULL on failure. */
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

/* Deletes every stored shard of (ns, id) (index UINT32_MAX) or one shard. */
int kv__ssd_remove(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t index);

/* The sink the engine hands evicted blocks to in the dram|ssd pipeline:
 * write-back through a bounded queue (ssd.spill_queue bytes); a victim that
 * does not fit is dropped and counted in spill_drops. */
struct kv__sink kv__ssd_sink(struct kv__ssd *s);

/* Adds the tier's figures to out: ssd_capacity, ssd_used, ssd_blocks,
 * spills, spill_drops, checksum_failures. */
void kv__ssd_stats(struct kv__ssd *s, kv_stats *out);

#endif
