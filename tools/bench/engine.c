/*
 * engine.c — the benchmark's "kvengine" backend: the public API, one
 * task per batch.
 *
 * Key design choice: a batch is one kv_dump or kv_load task waited for at
 * once, exactly as a connector issues them, so the latency the benchmark
 * records is the task's. A failed load says only that some shard failed; to
 * tell misses from errors the backend asks kv_lookup about that batch,
 * outside the happy path.
 *
 * Attached to a host store, the backend also reads the serving process's
 * CPU time (server_cpu_s), found through the pid its lock file names: on a
 * busy host an attached phase's MiB/s says as much about who the scheduler
 * ran as about the data path, and client plus server CPU per GiB says what
 * the path itself cost.
 */
#include "bench.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* st: the engine, and the pid serving its store when attached (0: none). */
struct eng {
    kv_engine *e;
    pid_t server;
};
#define ENG(st) (((struct eng *)(st))->e)

/* The pid that serves store.name's host store, from <store.dir>/<name>.lock
 * (engine/host.c writes its pid there); 0 when unknown. A store named by
 * ssd.path alone has a hashed id: not looked for. */
static pid_t server_pid(const kv_config *cfg)
{
    char name[256] = "", dir[4096] = "", path[4400];
    if (kv_config_get(cfg, "store.name", name, sizeof name) != KV_OK || !name[0])
        return 0;
    if (kv_config_get(cfg, "store.dir", dir, sizeof dir) != KV_OK || !dir[0]) {
        const char *xdg = getenv("XDG_RUNTIME_DIR");   /* engine/host.c's default */
        if (xdg && xdg[0])
            snprintf(dir, sizeof dir, "%s/kvengine", xdg);
        else
            snprintf(dir, sizeof dir, "/tmp/kvengine-%u", (unsigned)geteuid());
    }
    snprintf(path, sizeof path, "%s/%s.lock", dir, name);
    FILE *f = fopen(path, "r");
    long pid = 0;
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    return pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) == 0 ? (pid_t)pid : 0;
}

static int engine_open(const struct kvctl_open_args *a, void **st)
{
    *st = NULL;
    struct eng *g = calloc(1, sizeof *g);
    if (!g)
        return KV_ENOMEM;
    int rc = kv_open(a->cfg, &g->e);
    if (rc != KV_OK) {
        free(g);
        return rc;
    }
    kv_stats s;
    if (kv_stats_get(g->e, &s) == KV_OK && s.host_attached)
        g->server = server_pid(a->cfg);
    *st = g;
    return KV_OK;
}

static void engine_close(void *st)
{
    kv_close(ENG(st));   /* frees what engine_buffer gave */
    free(st);
}

/* The server's CPU seconds: every thread's run time from schedstat (ns,
 * where /proc/PID/stat counts 10 ms ticks: too coarse for a 0.1 s phase). */
static double engine_server_cpu_s(void *st)
{
    pid_t pid = ((struct eng *)st)->server;
    if (pid <= 0)
        return -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/task", (long)pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    unsigned long long sum = 0;
    bool any = false;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        char sp[128];
        snprintf(sp, sizeof sp, "/proc/%ld/task/%.20s/schedstat", (long)pid, de->d_name);
        FILE *f = fopen(sp, "r");
        unsigned long long ns;
        if (f && fscanf(f, "%llu", &ns) == 1) {
            sum += ns;
            any = true;
        }
        if (f)
            fclose(f);
    }
    closedir(d);
    return any ? (double)sum / 1e9 : -1;
}

static void *engine_buffer(void *st, size_t len)
{
    void *p = NULL;
    return kv_buffer_alloc(ENG(st), len, &p) == KV_OK ? p : NULL;
}

static void fill(int *res, size_t n, int v)
{
    for (size_t i = 0; i < n; i++)
        res[i] = v;
}

static int engine_put(void *st, const kv_shard *s, size_t n, int *res)
{
    kv_task t = 0;
    int rc = kv_dump(ENG(st), s, n, &t);
    if (rc == KV_OK)
        rc = kv_wait(ENG(st), t, 0);
    /* A failed task does not say which shard failed: count them all. */
    fill(res, n, rc);
    return rc;
}

static int engine_get(void *st, const kv_shard *s, size_t n, int *res)
{
    kv_task t = 0;
    int rc = kv_load(ENG(st), s, n, &t);
    if (rc == KV_OK)
        rc = kv_wait(ENG(st), t, 0);
    fill(res, n, rc);
    if (rc != KV_ENOTFOUND)
        return rc;
    /* Some shard was missing: the others were still copied. Ask which. */
    kv_block_id ids[64];
    uint8_t hit[64];
    for (size_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? n - i : 64;
        for (size_t j = 0; j < m; j++)
            ids[j] = s[i + j].block;
        if (kv_lookup(ENG(st), ids, m, hit) != KV_OK)
            return rc;
        for (size_t j = 0; j < m; j++)
            res[i + j] = hit[j] ? KV_OK : KV_ENOTFOUND;
    }
    return KV_OK;
}

static int engine_lookup(void *st, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    return kv_lookup(ENG(st), ids, n, hit);
}

static ssize_t engine_lookup_prefix(void *st, const kv_block_id *ids, size_t n)
{
    return kv_lookup_prefix(ENG(st), ids, n);
}

static void engine_info(void *st, struct kvctl_backend_info *out)
{
    kv_stats s;
    *out = (struct kvctl_backend_info){ 0 };
    if (kv_stats_get(ENG(st), &s) != KV_OK)
        return;
    out->open_ns = s.open_ns;
    out->index_bytes = s.dram_index_bytes;
    out->shards = s.dram_shards;
    out->dram_used = s.dram_used;
    out->hits_dram = s.hits_dram;
    out->hits_ssd = s.hits_ssd;
    out->spill_drops = s.spill_drops;
    out->attached = s.host_attached != 0;
}

const struct kvctl_backend kvctl_backend_kvengine = {
    .name = "kvengine",
    .open = engine_open,
    .close = engine_close,
    .put = engine_put,
    .get = engine_get,
    .lookup = engine_lookup,
    .info = engine_info,
    .lookup_prefix = engine_lookup_prefix,
    .buffer = engine_buffer,
    .server_cpu_s = engine_server_cpu_s,
};
