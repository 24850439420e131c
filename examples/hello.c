/*
 * hello.c — the smallest complete program against an installed libkvengine:
 * open an engine, dump a block, look it up, load it back, close. `make
 * installcheck` builds it with `pkg-config --cflags --libs kvengine` against
 * the shared library and runs it; it exits 0 only when every step worked.
 */
#include <kvengine.h>
#include <stdio.h>
#include <string.h>

#define FAIL(what, rc)                                                        \
    do {                                                                      \
        fprintf(stderr, "hello: %s: %s\n", what, kv_strerror(rc));            \
        return 1;                                                             \
    } while (0)

int main(void)
{
    static const char yaml[] = "pipeline: dram\ndram: { capacity: 32MiB }\nlog: { level: warn }\n";
    char err[256] = "", value[8192], back[8192];
    kv_config *cfg = NULL;
    kv_engine *e = NULL;
    kv_task t = 0;
    int rc;

    if ((rc = kv_config_new(&cfg)) != KV_OK)
        FAIL("kv_config_new", rc);
    if ((rc = kv_config_parse(cfg, yaml, sizeof yaml - 1, err, sizeof err)) != KV_OK) {
        fprintf(stderr, "hello: %s\n", err);
        return 1;
    }
    rc = kv_open(cfg, &e);
    kv_config_free(cfg);                 /* kv_open copied it */
    if (rc != KV_OK)
        FAIL("kv_open", rc);

    kv_block_id id;
    for (int i = 0; i < KV_BLOCK_ID_LEN; i++)
        id.bytes[i] = (unsigned char)(0xa0 + i);
    for (size_t i = 0; i < sizeof value; i++)
        value[i] = (char)(i * 31);
    kv_iov in = { value, sizeof value }, out = { back, sizeof back };
    kv_shard dump = { .block = id, .index = 0, .iov = &in, .iovcnt = 1 };
    kv_shard load = { .block = id, .index = 0, .iov = &out, .iovcnt = 1 };

    if ((rc = kv_dump(e, &dump, 1, &t)) != KV_OK || (rc = kv_wait(e, t, 0)) != KV_OK)
        FAIL("dump", rc);
    uint8_t hit = 0;
    if ((rc = kv_lookup(e, &id, 1, &hit)) != KV_OK || !hit)
        FAIL("lookup", rc ? rc : KV_ENOTFOUND);
    if ((rc = kv_load(e, &load, 1, &t)) != KV_OK || (rc = kv_wait(e, t, 0)) != KV_OK)
        FAIL("load", rc);
    if (memcmp(value, back, sizeof value) != 0) {
        fprintf(stderr, "hello: the block came back different\n");
        return 1;
    }
    kv_stats st;
    kv_stats_get(e, &st);
    printf("hello from libkvengine %s: dumped, looked up (hit), loaded %zu bytes back; "
           "%llu block(s) in DRAM\n",
           kv_version(), sizeof back, (unsigned long long)st.dram_blocks);
    kv_close(e);
    return 0;
}
