/*
 * kvnode — a standalone kvengine storage node.
 *
 * Opens an engine from the same YAML as everything else with
 * cluster.enabled forced true, so it joins the view and contributes its
 * DRAM (and SSD) tier to the pool; serves until SIGTERM/SIGINT, then closes
 * the engine (which leaves the view). Waits for an unreachable master
 * (retrying each second) instead of exiting. Uses only the public header.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvengine.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *f, const kv_config *cfg)
{
    static const char *keys[] = { "cluster.master", "cluster.listen", "cluster.protocol",
                                  "cluster.replica_num", "dram.capacity", "pipeline",
                                  "ssd.path", "metrics.listen", "log.level" };
    fprintf(f,
            "usage: kvnode [--config FILE] [--set KEY=VALUE]...\n"
            "\n"
            "Runs a storage node of a kvengine cluster (cluster.enabled is forced true)\n"
            "until SIGTERM/SIGINT.\n"
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
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "set", required_argument, NULL, 's' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    kv_config *cfg = NULL;
    char err[512] = "";
    if (kv_config_new(&cfg) != KV_OK) {
        fprintf(stderr, "kvnode: out of memory\n");
        return 1;
    }
    int c, rc;
    while ((c = getopt_long(argc, argv, "c:s:h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout, cfg);
            kv_config_free(cfg);
            return 0;
        }
        if (c == 'c' && (rc = kv_config_load(cfg, optarg, err, sizeof err)) != KV_OK) {
            fprintf(stderr, "kvnode: %s\n", err[0] ? err : kv_strerror(rc));
            kv_config_free(cfg);
            return 2;
        }
        if (c == '?') {
            usage(stderr, cfg);
            kv_config_free(cfg);
            return 2;
        }
    }
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:h", opts, NULL)) != -1) {
        if (c != 's')
            continue;
        char *eq = strchr(optarg, '=');
        if (!eq) {
            fprintf(stderr, "kvnode: --set wants KEY=VALUE, got '%s'\n", optarg);
            kv_config_free(cfg);
            return 2;
        }
        *eq = 0;
        if ((rc = kv_config_set(cfg, optarg, eq + 1)) != KV_OK) {
            fprintf(stderr, "kvnode: --set %s=%s: %s\n", optarg, eq + 1, kv_strerror(rc));
            kv_config_free(cfg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvnode: unexpected argument '%s'\n", argv[optind]);
        kv_config_free(cfg);
        return 2;
    }
    if ((rc = kv_config_set(cfg, "cluster.enabled", "true")) != KV_OK) {
        fprintf(stderr, "kvnode: cannot enable the cluster: %s\n", kv_strerror(rc));
        kv_config_free(cfg);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
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
        rc = kv_members(cfg, &version, &m, &n);
        free(m);
        if (rc != KV_ENET && rc != KV_ETIMEDOUT &&
            ((rc = kv_open(cfg, &e)) != KV_ENET && rc != KV_ETIMEDOUT))
            break;
        if (tries++ == 0)
            fprintf(stderr, "kvnode: the master is not reachable yet; retrying every second\n");
        for (int i = 0; i < 50 && !stop_flag; i++)
            usleep(20000);
        if (stop_flag) {
            kv_config_free(cfg);
            return 0;
        }
    }
    kv_config_free(cfg);
    if (rc != KV_OK) {
        fprintf(stderr, "kvnode: kv_open: %s (details in the log above)\n", kv_strerror(rc));
        return 1;
    }
    /* The engine's threads do the work; this one only waits for a signal. */
    while (!stop_flag)
        usleep(20000);
    kv_close(e);
    return 0;
}
