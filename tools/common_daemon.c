/*
 * common_daemon.c — the command line and signals kvmaster and kvnode share.
 */
#include <getopt.h>
#include <string.h>

#include "common.h"

int kvtool_daemon_config(const char *prog, int argc, char **argv, kvtool_usage_fn usage,
                         kv_config **out)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "set", required_argument, NULL, 's' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    kv_config *cfg = NULL;
    char err[512] = "";
    int c, rc, status = -1;
    *out = NULL;
    if (kv_config_new(&cfg) != KV_OK) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 1;
    }
    /* --config first wherever it appears, then every --set in order. */
    while (status < 0 && (c = getopt_long(argc, argv, "c:s:h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout, cfg);
            status = 0;
        } else if (c == 'c' && (rc = kv_config_load(cfg, optarg, err, sizeof err)) != KV_OK) {
            fprintf(stderr, "%s: %s\n", prog, err[0] ? err : kv_strerror(rc));
            status = 2;
        } else if (c == '?') {
            usage(stderr, cfg);
            status = 2;
        }
    }
    optind = 1;
    while (status < 0 && (c = getopt_long(argc, argv, "c:s:h", opts, NULL)) != -1) {
        if (c != 's')
            continue;
        char *eq = strchr(optarg, '=');
        if (!eq) {
            fprintf(stderr, "%s: --set wants KEY=VALUE, got '%s'\n", prog, optarg);
            status = 2;
            break;
        }
        *eq = 0;
        if ((rc = kv_config_set(cfg, optarg, eq + 1)) != KV_OK) {
            fprintf(stderr, "%s: --set %s=%s: %s\n", prog, optarg, eq + 1, kv_strerror(rc));
            status = 2;
        }
        *eq = '=';
    }
    if (status < 0 && optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        status = 2;
    }
    if (status >= 0) {
        kv_config_free(cfg);
        return status;
    }
    *out = cfg;
    return -1;
}

static volatile sig_atomic_t *stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    *stop_flag = 1;
}

void kvtool_daemon_signals(volatile sig_atomic_t *flag)
{
    stop_flag = flag;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}
