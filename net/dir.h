/*
 * dir.h — the host store's directory: the DRAM index's read-only mirror for
 * attached processes, where each block shard lies in the shared segment, so
 * that an attached load of a shard in DRAM is one copy and no round trip
 * (net/shm.c). engine/dram.c writes it; net/ owns it, as the transport's.
 */
#ifndef KV_NET_DIR_H
#define KV_NET_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvengine.h"

struct kv__dir;

/* A directory for a segment of seg_len bytes, in a sealed memfd (*fd, which
 * stays the directory's: it closes it). KV_ENOMEM / an errno's code. */
int  kv__dir_new(size_t seg_len, struct kv__dir **out);
void kv__dir_free(struct kv__dir *d);
int  kv__dir_fd(const struct kv__dir *d);
size_t kv__dir_len(const struct kv__dir *d);

/* The server's side, called under the shard's table lock: the shard is
 * linked at segment offset off64 * 64 (publish), or is about to stop being
 * there (retract, before its memory can be freed). NULL d: nothing. */
void kv__dir_publish(struct kv__dir *d, const kv_block_id *id, uint32_t index, uint32_t off64,
                     uint32_t len);
void kv__dir_retract(struct kv__dir *d, const kv_block_id *id, uint32_t index);

/* A client's read-only mapping of a server's directory. */
struct kv__dir_view {
    const void *base;
    size_t len;
    uint32_t mask;            /* buckets - 1 */
};

/* Maps a directory passed by a server: checks its header against len.
 * KV_EPROTO for anything that is not one. */
int  kv__dir_map(int fd, size_t len, struct kv__dir_view *v);
void kv__dir_unmap(struct kv__dir_view *v);

/* Copies shard (id, index), len bytes, from seg into iov when the directory
 * names it there and still names it once the copy is done: true. False
 * when it does not (absent, being moved, or another length): iov's bytes
 * are then unspecified and the caller asks the server. */
bool kv__dir_copy(const struct kv__dir_view *v, const uint8_t *seg, size_t seg_len,
                  const kv_block_id *id, uint32_t index, const kv_iov *iov, uint32_t iovcnt,
                  uint64_t len);

#endif
