/*
 * testutil_int.h — fixtures that reach inside the library (its internal
 * headers), built into the test runner only: what used to be test hooks in
 * the library itself.
 */
#ifndef KV_TESTUTIL_INT_H
#define KV_TESTUTIL_INT_H

#include <stdint.h>

#include "kvengine.h"

struct kv__backend;
struct kv__ssd;

/* A heap-backed kv__backend (tests/testutil_memstore.c): the store the
 * transport and cluster tests serve, and a reference for the backend
 * contract. cap_bytes 0 = unbounded. */
struct kv__backend *kv__memstore_new(uint64_t cap_bytes);
void kv__memstore_free(struct kv__backend *b);

/* Stores data as (ns, id, index) with a correct header and checksum, then
 * flips byte 'flip' of the stored copy, as a silent disk error would
 * (tests/testutil_ssd.c). */
int kv__ssd_write_corrupt(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t index,
                          const void *data, uint32_t len, uint32_t flip);

#endif
