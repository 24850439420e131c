/*
 * backend.c — the engine's local store as a kv__backend: what the network
 * layer (net/serve.c) serves peers from, handed to net/ as an ops table.
 *
 * Key design choice: it lives with the engine, not in net/, so that net/
 * calls the engine only through function pointers it was given. The link
 * graph then has no cycle: engine -> net -> (errors, log), never back up
 * (scripts/layers.sh checks it on every make test).
 */
#include "store.h"
#include "net/transport.h"

static int e_lookup(void *c, int ns, const kv_block_id *ids, size_t n, uint8_t *hit)
{ return kv__local_lookup(c, ns, ids, n, hit); }
static int e_size(void *c, int ns, const kv_block_id *id, uint32_t x, uint64_t *len)
{ return kv__local_size(c, ns, id, x, len); }
static int e_load(void *c, int ns, const kv_block_id *id, uint32_t x, const kv_iov *v, uint32_t n)
{ return kv__local_load(c, ns, id, x, v, n); }
static int e_dump(void *c, int ns, const kv_block_id *id, uint32_t x, const kv_iov *v, uint32_t n)
{ return kv__local_dump(c, ns, id, x, v, n); }
static int e_pin(void *c, int ns, const kv_block_id *id, uint32_t x, const void **d,
                 uint64_t *len, kv__pin *p)
{ return kv__local_pin(c, ns, id, x, d, len, p); }
static void e_unpin(void *c, kv__pin *p) { kv__local_unpin(c, p); }
static int e_reserve(void *c, uint64_t len, kv__resv *r) { return kv__local_reserve(c, len, r); }
static int e_commit(void *c, kv__resv *r, int ns, const kv_block_id *id, uint32_t x)
{ return kv__local_commit(c, r, ns, id, x); }
static void e_abort(void *c, kv__resv *r) { kv__local_abort(c, r); }
static int e_scan(void *c, int ns, kv__scan_cb cb, void *arg) { return kv__local_scan(c, ns, cb, arg); }
static int e_remove(void *c, int ns, const kv_block_id *id, uint32_t x)
{ return kv__local_remove(c, ns, id, x); }
static int e_match(void *c, const kv_block_id *id, uint32_t plen, const kv_block_id *hash)
{ return kv__key_match(c, id, plen, hash); }
static int e_rec_match(void *c, const void *rec, uint64_t len, uint32_t plen,
                       const kv_block_id *hash)
{ (void)c; return kv__key_rec_match(rec, len, plen, hash); }
static void e_stats(void *c, kv_stats *out)
{
    memset(out, 0, sizeof *out);
    kv__store_stats(c, out);
}

void kv__backend_engine(kv_engine *e, struct kv__backend *out)
{
    memset(out, 0, sizeof *out);
    out->ctx = e;
    out->lookup = e_lookup;
    out->size = e_size;
    out->load = e_load;
    out->pin = e_pin;
    out->unpin = e_unpin;
    out->reserve = e_reserve;
    out->commit = e_commit;
    out->abort = e_abort;
    out->dump = e_dump;
    out->scan = e_scan;
    out->remove = e_remove;
    out->match = e_match;
    out->rec_match = e_rec_match;
    out->stats = e_stats;
    kv__engine_segment(e, &out->seg_base, &out->seg_len);
}
