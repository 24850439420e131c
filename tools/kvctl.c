/*
 * kvctl.c — the admin tool's entry point: global options, the command
 * table, and the config commands.
 *
 *     kvctl [--config FILE] [--set KEY=VALUE]... COMMAND [ARGS]
 *
 * Key design choice: --config and --set mean the same thing before and after
 * the command (they collect into one struct kvctl_common, applied in order:
 * defaults, file, sets), so `kvctl bench --set dram.capacity=2GiB` and
 * `kvctl --set dram.capacity=2GiB bench` are one command line. The top-level
 * parse stops at the first non-option ("+" in the optstring) so every
 * command parses its own options with getopt_long.
 */
#include "kvctl.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvctl [--config FILE] [--set KEY=VALUE]... COMMAND [ARGS]\n"
            "\n"
            "The admin tool and benchmark of kvengine (libkvengine %s).\n"
            "\n"
            "Commands:\n"
            "  config check FILE   validate a YAML config (opens nothing) and print\n"
            "                      the effective config it gives, as YAML\n"
            "  config show         print the effective config (defaults, then --config,\n"
            "                      then --set)\n"
            "  stats               figures of a store (offline) or of a running node\n"
            "                      (--node HOST:PORT, its /metrics)\n"
            "  members             the cluster view kept by kvmaster\n"
            "  lookup ID|KEY...    whether block ids (hex) or plain keys are stored\n"
            "  put ID|KEY [FILE]   store a file (or stdin) under a key or block id\n"
            "  get ID|KEY          print a value (or -o FILE)\n"
            "  rm ID|KEY...        remove plain keys, or blocks from the SSD tier\n"
            "  ssd ls|scrub|compact  list, verify or compact the SSD tier\n"
            "  bench               run the embedded benchmark (kvctl bench --help)\n"
            "  version             print the library version\n"
            "  help [COMMAND]      show this help, or a command's\n"
            "\n"
            "Every command takes --help. Commands that open a store open the one the\n"
            "config describes, offline (see kvctl stats --help).\n"
            "\n"
            "Options (also accepted after the command):\n"
            "%s  -V, --version          print the library version\n"
            "\n%s",
            kv_version(), kvctl_common_help, kvctl_exit_help);
}

static void config_usage(FILE *f)
{
    fprintf(f,
            "usage: kvctl [--set KEY=VALUE]... config check FILE\n"
            "       kvctl [--config FILE] [--set KEY=VALUE]... config show\n"
            "\n"
            "check: loads FILE over the defaults (then applies --set), opens nothing,\n"
            "       and prints the effective config as YAML to stdout. An error names\n"
            "       the file, the line and the key, on stderr.\n"
            "show:  prints the effective config from the defaults, --config and --set.\n"
            "\n"
            "Options:\n%s\n%s",
            kvctl_common_help, kvctl_exit_help);
}

/* Prints the effective config as YAML to stdout. */
static int print_config(const kv_config *cfg)
{
    int need = kv_config_dump(cfg, NULL, 0);
    if (need < 0) {
        fprintf(stderr, "kvctl: config dump: %s\n", kv_strerror(need));
        return KVCTL_EXIT_FAIL;
    }
    char *buf = malloc((size_t)need + 1);
    if (!buf) {
        fprintf(stderr, "kvctl: out of memory\n");
        return KVCTL_EXIT_FAIL;
    }
    int got = kv_config_dump(cfg, buf, (size_t)need + 1);
    if (got < 0 || got > need) {
        fprintf(stderr, "kvctl: config dump: %s\n", got < 0 ? kv_strerror(got) : "size changed");
        free(buf);
        return KVCTL_EXIT_FAIL;
    }
    fwrite(buf, 1, (size_t)got, stdout);
    if (got > 0 && buf[got - 1] != '\n')
        fputc('\n', stdout);
    free(buf);
    return fflush(stdout) == 0 ? KVCTL_EXIT_OK : KVCTL_EXIT_FAIL;
}

static int cmd_config(struct kvctl_common *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        KVCTL_COMMON_LONGOPTS,
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "c:s:h", longopts, NULL)) != -1) {
        int r = kvctl_common_opt(c, opt, optarg);
        if (r < 0)
            return -r;
        if (r > 0)
            continue;
        if (opt == 'h') {
            config_usage(stdout);
            return KVCTL_EXIT_OK;
        }
        config_usage(stderr);
        return KVCTL_EXIT_USAGE;
    }
    if (optind >= argc) {
        fprintf(stderr, "kvctl: config: missing subcommand (check or show)\n\n");
        config_usage(stderr);
        return KVCTL_EXIT_USAGE;
    }
    const char *sub = argv[optind++];
    if (strcmp(sub, "check") == 0) {
        if (optind != argc - 1) {
            fprintf(stderr, "kvctl: config check wants exactly one FILE\n\n");
            config_usage(stderr);
            return KVCTL_EXIT_USAGE;
        }
        c->config = argv[optind];
    } else if (strcmp(sub, "show") == 0) {
        if (optind != argc) {
            fprintf(stderr, "kvctl: config show takes no arguments\n\n");
            config_usage(stderr);
            return KVCTL_EXIT_USAGE;
        }
    } else {
        fprintf(stderr, "kvctl: config: unknown subcommand '%s'\n\n", sub);
        config_usage(stderr);
        return KVCTL_EXIT_USAGE;
    }
    kv_config *cfg = NULL;
    int rc = kvctl_build_config(c, &cfg);
    if (rc != KVCTL_EXIT_OK)
        return rc;
    rc = print_config(cfg);
    kv_config_free(cfg);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        KVCTL_COMMON_LONGOPTS,
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { NULL, 0, NULL, 0 },
    };
    struct kvctl_common common = { 0 };
    int opt, rc = KVCTL_EXIT_USAGE;
    while ((opt = getopt_long(argc, argv, "+c:s:hV", longopts, NULL)) != -1) {
        int r = kvctl_common_opt(&common, opt, optarg);
        if (r < 0) {
            rc = -r;
            goto out;
        }
        if (r > 0)
            continue;
        if (opt == 'h') {
            usage(stdout);
            rc = KVCTL_EXIT_OK;
        } else if (opt == 'V') {
            printf("kvctl (libkvengine %s)\n", kv_version());
            rc = KVCTL_EXIT_OK;
        } else {
            usage(stderr);
        }
        goto out;
    }
    if (optind >= argc) {
        fprintf(stderr, "kvctl: missing command\n\n");
        usage(stderr);
        goto out;
    }
    char **cargv = argv + optind;
    int cargc = argc - optind;
    const char *cmd = cargv[0];
    if (strcmp(cmd, "config") == 0) {
        rc = cmd_config(&common, cargc, cargv);
    } else if (strcmp(cmd, "bench") == 0) {
        rc = kvctl_bench_main(&common, cargc, cargv);
    } else if (strcmp(cmd, "stats") == 0) {
        rc = kvctl_stats_main(&common, cargc, cargv);
    } else if (strcmp(cmd, "members") == 0) {
        rc = kvctl_members_main(&common, cargc, cargv);
    } else if (strcmp(cmd, "lookup") == 0) {
        rc = kvctl_lookup_main(&common, cargc, cargv);
    } else if (strcmp(cmd, "put") == 0) {
        rc = kvctl_put_main(&common, cargc, cargv);
    } else if (strcmp(cmd, "get") == 0) {
        rc = kvctl_get_main(&common, cargc, cargv);
    } else if (strcmp(cmd, "rm") == 0) {
        rc = kvctl_rm_main(&common, cargc, cargv);
    } else if (strcmp(cmd, "ssd") == 0) {
        rc = kvctl_ssd_main(&common, cargc, cargv);
    } else if (strcmp(cmd, "version") == 0) {
        printf("kvctl (libkvengine %s)\n", kv_version());
        rc = KVCTL_EXIT_OK;
    } else if (strcmp(cmd, "help") == 0) {
        if (cargc > 1 && strcmp(cargv[1], "config") == 0) {
            config_usage(stdout);
            rc = KVCTL_EXIT_OK;
        } else if (cargc > 1 && strcmp(cargv[1], "bench") == 0) {
            char *hargv[] = { "bench", "--help", NULL };
            rc = kvctl_bench_main(&common, 2, hargv);
        } else if (cargc > 1 && kvctl_admin_usage(cargv[1], stdout)) {
            rc = KVCTL_EXIT_OK;
        } else if (cargc > 1) {
            fprintf(stderr, "kvctl: no command '%s'\n\n", cargv[1]);
            usage(stderr);
        } else {
            usage(stdout);
            rc = KVCTL_EXIT_OK;
        }
    } else {
        fprintf(stderr, "kvctl: unknown command '%s'\n\n", cmd);
        usage(stderr);
    }
out:
    kvctl_common_free(&common);
    return rc;
}
