/*
 * kvnode — a standalone kvengine storage node, and the host store's daemon.
 *
 * Opens an engine from the same YAML as everything else with
 * cluster.enabled forced true, so it joins the view and contributes its
 * DRAM (and SSD) tier to the pool; serves until SIGTERM/SIGINT, then closes
 * the engine (which leaves the view). Waits for an unreachable master
 * (retrying each second) instead of exiting. Uses only the public header.
 *
 * With metrics.listen set, /health and /metrics are served from process
 * start by the node itself (kv_metrics_serve_config), not by the engine:
 * while it waits for its master or opens its tiers /health answers 503 and
 * says which, and once kv_open returned the server is retargeted at the
 * engine (kv_health, kv_metrics_render).
 *
 * The engine it opens is the host's store (store.name, or ssd.path): kvnode
 * takes its lock and serves it to the processes of the host that open the
 * same store, and they reach the cluster through it. With store.name set
 * and cluster.enabled false it serves the host store alone (no cluster).
 * A store some other process already serves is an error: kvnode would only
 * attach to it.
 */
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "kvengine.h"

static volatile sig_atomic_t stop_flag;

/* What the node is doing before its engine serves, for /health. */
static _Atomic int phase;   /* 0 waiting for the membership store, 1 opening */
static char where[300];

static int starting_health(void *ctx, char *why, size_t cap)
{
    (void)ctx;
    if (phase == 0)
        snprintf(why, cap, "joining: waiting for the membership store (%s)", where);
    else
        snprintf(why, cap, "joining: opening the tiers and joining the view");
    return KV_EBUSY;
}

static int engine_metrics(void *ctx, char **text, size_t *len)
{
    return kv_metrics_render(ctx, text, len);
}

static int engine_health(void *ctx, char *why, size_t cap)
{
    return kv_health(ctx, why, cap);
}

static void usage(FILE *f, const kv_config *cfg)
{
    static const char *keys[] = { "cluster.master", "cluster.listen", "cluster.protocol",
                                  "cluster.replica_num", "dram.capacity", "pipeline",
                                  "ssd.path", "store.name", "store.dir", "metrics.listen",
                                  "log.level" };
    fprintf(f,
            "usage: kvnode [--config FILE] [--set KEY=VALUE]...\n"
            "\n"
            "Runs a storage node of a kvengine cluster (cluster.enabled is forced true)\n"
            "until SIGTERM/SIGINT, serving the host store (store.name or ssd.path) to\n"
            "this host's processes that open it. With store.name set and\n"
            "cluster.enabled false: the host store's daemon alone, no cluster.\n"
            "\n"
            "  -c, --config FILE     YAML configuration\n"
            "  -s, --set KEY=VALUE   override one dotted key after the file (repeatable)\n"
            "  -h, --help            this help\n"
            "\n"
            "Main keys (defaults):\n");
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char v[256] = "?";
        kv_config_get(cfg, keys[i], v, sizeof v);
        fprintf(f, "  %-21s %s\n", keys[i], v);
    }
}

int main(int argc, char **argv)
{
    kv_config *cfg = NULL;
    int rc = kvtool_daemon_config("kvnode", argc, argv, usage, &cfg);
    if (rc >= 0)
        return rc;
    char name[256] = "", enabled[16] = "";
    kv_config_get(cfg, "store.name", name, sizeof name);
    kv_config_get(cfg, "cluster.enabled", enabled, sizeof enabled);
    bool host_only = name[0] && strcmp(enabled, "true") != 0;
    if (!host_only && (rc = kv_config_set(cfg, "cluster.enabled", "true")) != KV_OK) {
        fprintf(stderr, "kvnode: cannot enable the cluster: %s\n", kv_strerror(rc));
        kv_config_free(cfg);
        return 2;
    }
    kvtool_daemon_signals(&stop_flag);
    char meta[16] = "", listen[300] = "";
    kv_config_get(cfg, "cluster.metadata", meta, sizeof meta);
    kv_config_get(cfg, strcmp(meta, "etcd") == 0 ? "cluster.etcd_endpoints" : "cluster.master",
                  where, sizeof where);
    kv_config_get(cfg, "metrics.listen", listen, sizeof listen);
    kv_metrics_server *ms = NULL;
    if (listen[0]) {
        char err[512] = "";
        if ((rc = kv_metrics_serve_config(cfg, NULL, NULL, &ms, err, sizeof err)) != KV_OK) {
            fprintf(stderr, "kvnode: %s\n", err[0] ? err : kv_strerror(rc));
            kv_config_free(cfg);
            return rc == KV_ECONFIG ? 2 : 1;
        }
        kv_metrics_retarget(ms, NULL, NULL, starting_health, NULL);
        /* The engine must not listen there too: this server is the node's. */
        kv_config_set(cfg, "metrics.listen", "");
    }
    kv_engine *e = NULL;
    /* A node may well start before its master (a deployment brings both up
     * at once): while the master cannot be reached, try again every second
     * rather than exit. Anything else (a refused token, a bad config) is
     * final. */
    unsigned tries = 0;
    for (;;) {
        /* Ask first (kv_members is cheap); opening maps and faults in the
         * whole DRAM segment, which is not something to redo every second. */
        uint64_t version;
        kv_member_info *m = NULL;
        size_t n = 0;
        rc = host_only ? KV_OK : kv_members(cfg, &version, &m, &n);
        free(m);
        phase = rc == KV_ENET || rc == KV_ETIMEDOUT ? 0 : 1;
        if (rc != KV_ENET && rc != KV_ETIMEDOUT &&
            ((rc = kv_open(cfg, &e)) != KV_ENET && rc != KV_ETIMEDOUT))
            break;
        if (tries++ == 0)
            fprintf(stderr, "kvnode: the master is not reachable yet; retrying every second\n");
        for (int i = 0; i < 50 && !stop_flag; i++)
            usleep(20000);
        if (stop_flag) {
            kv_metrics_stop(ms);
            kv_config_free(cfg);
            return 0;
        }
    }
    kv_config_free(cfg);
    if (rc != KV_OK) {
        kv_metrics_stop(ms);
        fprintf(stderr, "kvnode: kv_open: %s (details in the log above)\n", kv_strerror(rc));
        return 1;
    }
    kv_stats st;
    if (kv_stats_get(e, &st) == KV_OK && st.host_attached) {
        fprintf(stderr, "kvnode: the store is already served by another process on this host "
                        "(store.dir); not starting a second one\n");
        kv_metrics_stop(ms);
        kv_close(e);
        return 1;
    }
    kv_metrics_retarget(ms, engine_metrics, e, engine_health, e);
    /* The engine's threads do the work; this one only waits for a signal. */
    while (!stop_flag)
        usleep(20000);
    /* Stop serving first: the server's callbacks read the engine. */
    kv_metrics_stop(ms);
    kv_close(e);
    return 0;
}
