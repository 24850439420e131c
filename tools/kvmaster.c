/*
 * kvmaster — the cluster membership daemon.
 *
 * Keeps the view of a kvengine cluster: nodes register and heartbeat, a node
 * silent past cluster.node_ttl_ms leaves. Not on the data path. Uses only
 * the public header (kv_master_run).
 *
 * With metrics.listen set it also serves Prometheus text at /metrics (the
 * members in the view, by role, and the view's version) and /health. A
 * scrape asks the master for its view over its own protocol (kv_members),
 * exactly as kvctl members does, so the figures are the ones nodes get.
 */
#include <getopt.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common.h"
#include "kvengine.h"

static volatile sig_atomic_t stop_flag;

/* Renders the master's figures for /metrics (kv_metrics_fn). */
static int render(void *ctx, char **text, size_t *len)
{
    const kv_config *cfg = ctx;
    uint64_t version = 0;
    kv_member_info *m = NULL;
    size_t n = 0, owners = 0;
    int rc = kv_members(cfg, &version, &m, &n);
    for (size_t i = 0; i < n; i++)
        owners += m[i].owner != 0;
    free(m);
    *len = 0;
    int w = asprintf(text,
                     "# HELP kvengine_master_up Whether the master answered its own view query.\n"
                     "# TYPE kvengine_master_up gauge\n"
                     "kvengine_master_up %d\n"
                     "# HELP kvengine_members Members in the view kvmaster keeps, by role.\n"
                     "# TYPE kvengine_members gauge\n"
                     "kvengine_members{role=\"owner\"} %zu\n"
                     "kvengine_members{role=\"client\"} %zu\n"
                     "# HELP kvengine_view_version Version of the view (grows on every change).\n"
                     "# TYPE kvengine_view_version gauge\n"
                     "kvengine_view_version %" PRIu64 "\n",
                     rc == KV_OK, owners, n - owners, version);
    if (w < 0) {
        *text = NULL;
        return KV_ENOMEM;
    }
    *len = (size_t)w;
    return KV_OK;
}

static void usage(FILE *f, const kv_config *cfg)
{
    char master[256] = "?", ttl[64] = "?", level[32] = "?";
    kv_config_get(cfg, "cluster.master", master, sizeof master);
    kv_config_get(cfg, "cluster.node_ttl_ms", ttl, sizeof ttl);
    kv_config_get(cfg, "log.level", level, sizeof level);
    fprintf(f,
            "usage: kvmaster [--config FILE] [--set KEY=VALUE]...\n"
            "\n"
            "Serves kvengine cluster membership on cluster.master until SIGTERM/SIGINT.\n"
            "\n"
            "  -c, --config FILE     YAML configuration (same file as the nodes)\n"
            "  -s, --set KEY=VALUE   override one dotted key after the file (repeatable)\n"
            "  -h, --help            this help\n"
            "\n"
            "Keys it uses (defaults):\n"
            "  cluster.master       %s\n"
            "  cluster.node_ttl_ms  %s\n"
            "  cluster.token        \"\" (members prove it by challenge-response)\n"
            "  cluster.token_file   \"\" (the token from a 0600 file; else KVENGINE_TOKEN)\n"
            "  metrics.listen       \"\" (host:port: serve /metrics and /health there)\n"
            "  log.level            %s\n"
            "\n"
            "Exit status: 0 after SIGTERM/SIGINT, 1 when it cannot serve, 2 bad usage.\n",
            master, ttl, level);
}

int main(int argc, char **argv)
{
    kv_config *cfg = NULL;
    char err[512] = "";
    int rc = kvtool_daemon_config("kvmaster", argc, argv, usage, &cfg);
    if (rc >= 0)
        return rc;
    kvtool_daemon_signals(&stop_flag);
    char listen[256] = "";
    kv_metrics_server *ms = NULL;
    if (kv_config_get(cfg, "metrics.listen", listen, sizeof listen) == KV_OK && listen[0] &&
        (rc = kv_metrics_serve_config(cfg, render, cfg, &ms, err, sizeof err)) != KV_OK) {
        fprintf(stderr, "kvmaster: %s\n", err[0] ? err : kv_strerror(rc));
        kv_config_free(cfg);
        return 1;
    }
    /* Every member keeps a connection to the master: lift the soft limit on
     * descriptors to the hard one, or a default of 1,024 caps the view. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    rc = kv_master_run(cfg, &stop_flag, err, sizeof err);
    kv_metrics_stop(ms);
    if (rc != KV_OK)
        fprintf(stderr, "kvmaster: %s\n", err[0] ? err : kv_strerror(rc));
    kv_config_free(cfg);
    return rc == KV_OK ? 0 : 1;
}
