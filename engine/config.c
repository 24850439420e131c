/* config.c — placeholder until the YAML configuration lands (being written). */
#include <stdlib.h>
#include "internal.h"

void kv__config_defaults(struct kv_config *c)
{
    memset(c, 0, sizeof *c);
    c->pipeline = KV_PIPE_DRAM;
    c->dram.capacity = 64ull << 20;
    c->dram.shards = 64;
    c->eviction.high_watermark_ratio = 0.9;
    c->eviction.ratio = 0.1;
    c->eviction.lease_ttl_ms = 60000;
    c->io.threads = 4;
    c->log.level = KV_LOG_INFO;
}
KV__EXPORT int kv_config_new(kv_config **out)
{
    *out = malloc(sizeof **out);
    if (!*out) return KV_ENOMEM;
    kv__config_defaults(*out);
    return KV_OK;
}
KV__EXPORT int kv_config_load(kv_config *c, const char *p, char *e, size_t n) { (void)c; (void)p; (void)e; (void)n; return KV_ENOTSUP; }
KV__EXPORT int kv_config_parse(kv_config *c, const char *y, size_t l, char *e, size_t n) { (void)c; (void)y; (void)l; (void)e; (void)n; return KV_OK; }
KV__EXPORT int kv_config_set(kv_config *c, const char *k, const char *v) { (void)c; (void)k; (void)v; return KV_ENOTSUP; }
KV__EXPORT int kv_config_get(const kv_config *c, const char *k, char *b, size_t n) { (void)c; (void)k; (void)b; (void)n; return KV_ENOTSUP; }
KV__EXPORT int kv_config_dump(const kv_config *c, char *b, size_t n) { (void)c; (void)b; (void)n; return KV_ENOTSUP; }
KV__EXPORT void kv_config_free(kv_config *c) { free(c); }
int kv__config_validate(const struct kv_config *c, char *e, size_t n) { (void)c; (void)e; (void)n; return KV_OK; }
