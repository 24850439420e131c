/* quickstart.c — the README's example: open, dump, lookup, load, close. */
#include <kvengine.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    const char *yaml = "pipeline: dram\ndram: { capacity: 64MiB }\n";
    char err[256], buf[4096] = "tensor bytes", out[4096];
    kv_config *cfg; kv_engine *e; kv_task t;
    kv_config_new(&cfg);
    if (kv_config_parse(cfg, yaml, strlen(yaml), err, sizeof err) || kv_open(cfg, &e))
        return 1;
    kv_config_free(cfg);
    kv_block_id id = { { 0x12, 0x34 } };                 /* md5 of the prefix */
    kv_iov in = { buf, sizeof buf }, back = { out, sizeof out };
    kv_shard s = { id, 0, &in, 1 }, l = { id, 0, &back, 1 };
    kv_dump(e, &s, 1, &t);  kv_wait(e, t, 0);             /* save */
    uint8_t hit;  kv_lookup(e, &id, 1, &hit);              /* hit == 1, leased */
    kv_load(e, &l, 1, &t);  int rc = kv_wait(e, t, 0);     /* and back */
    printf("hit=%d load=%s same=%d\n", hit, kv_strerror(rc), !memcmp(buf, out, sizeof buf));
    kv_close(e);
    return 0;
}
