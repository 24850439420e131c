/* engine.c — placeholder until the engine core lands (being written). */
#include "engine.h"
#define NS KV_ENOTSUP
KV__EXPORT int kv_open(const kv_config *c, kv_engine **o) { (void)c; *o = NULL; return NS; }
KV__EXPORT void kv_close(kv_engine *e) { (void)e; }
KV__EXPORT int kv_lookup(kv_engine *e, const kv_block_id *i, size_t n, uint8_t *h) { (void)e; (void)i; (void)n; (void)h; return NS; }
KV__EXPORT ssize_t kv_lookup_prefix(kv_engine *e, const kv_block_id *i, size_t n) { (void)e; (void)i; (void)n; return NS; }
KV__EXPORT int kv_prefetch(kv_engine *e, const kv_block_id *i, size_t n) { (void)e; (void)i; (void)n; return NS; }
KV__EXPORT int kv_dump(kv_engine *e, const kv_shard *s, size_t n, kv_task *t) { (void)e; (void)s; (void)n; (void)t; return NS; }
KV__EXPORT int kv_load(kv_engine *e, const kv_shard *s, size_t n, kv_task *t) { (void)e; (void)s; (void)n; (void)t; return NS; }
KV__EXPORT int kv_check(kv_engine *e, kv_task t, int *d) { (void)e; (void)t; (void)d; return NS; }
KV__EXPORT int kv_wait(kv_engine *e, kv_task t, unsigned ms) { (void)e; (void)t; (void)ms; return NS; }
KV__EXPORT int kv_put(kv_engine *e, const void *k, size_t kl, const void *v, size_t vl) { (void)e; (void)k; (void)kl; (void)v; (void)vl; return NS; }
KV__EXPORT int kv_get(kv_engine *e, const void *k, size_t kl, void *b, size_t c, size_t *vl) { (void)e; (void)k; (void)kl; (void)b; (void)c; (void)vl; return NS; }
KV__EXPORT int kv_exists(kv_engine *e, const void *k, size_t kl) { (void)e; (void)k; (void)kl; return NS; }
KV__EXPORT int kv_remove(kv_engine *e, const void *k, size_t kl) { (void)e; (void)k; (void)kl; return NS; }
KV__EXPORT int kv_register_buffer(kv_engine *e, void *a, size_t l) { (void)e; (void)a; (void)l; return NS; }
KV__EXPORT int kv_unregister_buffer(kv_engine *e, void *a) { (void)e; (void)a; return NS; }
KV__EXPORT int kv_stats_get(kv_engine *e, kv_stats *o) { (void)e; (void)o; return NS; }
void kv__engine_segment(kv_engine *e, void **b, size_t *l) { (void)e; *b = NULL; *l = 0; }
const struct kv_config *kv__engine_config(kv_engine *e) { (void)e; return NULL; }
int kv__local_lookup(kv_engine *e, int ns, const kv_block_id *i, size_t n, uint8_t *h) { (void)e; (void)ns; (void)i; (void)n; (void)h; return NS; }
int kv__local_dump(kv_engine *e, int ns, const kv_block_id *id, uint32_t x, const kv_iov *v, uint32_t c) { (void)e; (void)ns; (void)id; (void)x; (void)v; (void)c; return NS; }
int kv__local_load(kv_engine *e, int ns, const kv_block_id *id, uint32_t x, const kv_iov *v, uint32_t c) { (void)e; (void)ns; (void)id; (void)x; (void)v; (void)c; return NS; }
int kv__local_size(kv_engine *e, int ns, const kv_block_id *id, uint32_t x, uint64_t *l) { (void)e; (void)ns; (void)id; (void)x; (void)l; return NS; }
int kv__local_pin(kv_engine *e, int ns, const kv_block_id *id, uint32_t x, const void **d, uint64_t *l, kv__pin *p) { (void)e; (void)ns; (void)id; (void)x; (void)d; (void)l; (void)p; return NS; }
void kv__local_unpin(kv_engine *e, kv__pin *p) { (void)e; (void)p; }
int kv__local_reserve(kv_engine *e, uint64_t l, kv__resv *r) { (void)e; (void)l; (void)r; return NS; }
int kv__local_commit(kv_engine *e, kv__resv *r, int ns, const kv_block_id *id, uint32_t x) { (void)e; (void)r; (void)ns; (void)id; (void)x; return NS; }
void kv__local_abort(kv_engine *e, kv__resv *r) { (void)e; (void)r; }
