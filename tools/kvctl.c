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

static int cmd_config(struct kvctl_common *c, int argc, char **argv);
static int cmd_version(struct kvctl_common *c, int argc, char **argv);
static int cmd_help(struct kvctl_common *c, int argc, char **argv);

/*
 * The commands: name, what the usage says of it (its lines, aligned), and
 * its handler, which parses its own options (every one takes --help). A
 * command is one line here; main() only looks names up.
 */
static const struct command {
    const char *name;
    const char *usage;
    int (*run)(struct kvctl_common *c, int argc, char **argv);
} commands[] = {
    { "config",
      "  config check FILE   validate a YAML config (opens nothing) and print\n"
      "                      the effective config it gives, as YAML\n"
      "  config show         print the effective config (defaults, then --config,\n"
      "                      then --set)\n", cmd_config },
    { "stats",
      "  stats               figures of a store (offline) or of a running node\n"
      "                      (--node HOST:PORT, its /metrics)\n", kvctl_admin_main },
    { "members",
      "  members             the cluster view kept by kvmaster\n", kvctl_admin_main },
    { "lookup",
      "  lookup ID|KEY...    whether block ids (hex) or plain keys are stored\n", kvctl_admin_main },
    { "put",
      "  put ID|KEY [FILE]   store a file (or stdin) under a key or block id\n", kvctl_admin_main },
    { "get",
      "  get ID|KEY          print a value (or -o FILE)\n", kvctl_admin_main },
    { "rm",
      "  rm ID|KEY...        remove plain keys, or blocks from the SSD tier\n", kvctl_admin_main },
    { "ssd",
      "  ssd ls|scrub|compact|recover\n"
      "                      list, verify, compact or rebuild the SSD tier\n", kvctl_admin_main },
    { "bench",
      "  bench               run the embedded benchmark (kvctl bench --help)\n", kvctl_bench_main },
    { "version",
      "  version             print the library version\n", cmd_version },
    { "help",
      "  help [COMMAND]      show this help, or a command's\n", cmd_help },
};

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvctl [--config FILE] [--set KEY=VALUE]... COMMAND [ARGS]\n"
            "\n"
            "The admin tool and benchmark of kvengine (libkvengine %s).\n"
            "\n"
            "Commands:\n", kv_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fputs(commands[i].usage, f);
    fprintf(f,
            "\n"
            "Every command takes --help. Commands that open a store open the one the\n"
            "config describes, offline (see kvctl stats --help).\n"
            "\n"
            "Options (also accepted after the command):\n"
            "%s  -V, --version          print the library version\n"
            "\n%s",
            kvctl_common_help, kvctl_exit_help);
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
    int opt, rc;
    optind = 0;
    while ((opt = kvctl_getopt(c, argc, argv, "c:s:h", longopts, &rc)) != -1) {
        if (opt == 'h') {
            config_usage(stdout);
            return KVCTL_EXIT_OK;
        }
        config_usage(stderr);
        return KVCTL_EXIT_USAGE;
    }
    if (rc >= 0)
        return rc;
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
    rc = kvctl_build_config(c, &cfg);
    if (rc != KVCTL_EXIT_OK)
        return rc;
    rc = print_config(cfg);
    kv_config_free(cfg);
    return rc;
}

static int cmd_version(struct kvctl_common *c, int argc, char **argv)
{
    printf("kvctl (libkvengine %s)\n", kv_version());
    return KVCTL_EXIT_OK;
}

/* help COMMAND is COMMAND --help. */
static int cmd_help(struct kvctl_common *c, int argc, char **argv)
{
    if (argc < 2) {
        usage(stdout);
        return KVCTL_EXIT_OK;
    }
    const struct command *cmd = find_command(argv[1]);
    if (!cmd || cmd->run == cmd_help || cmd->run == cmd_version) {
        if (cmd) {
            usage(stdout);
            return KVCTL_EXIT_OK;
        }
        fprintf(stderr, "kvctl: no command '%s'\n\n", argv[1]);
        usage(stderr);
        return KVCTL_EXIT_USAGE;
    }
    char *hargv[] = { argv[1], "--help", NULL };
    return cmd->run(c, 2, hargv);
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
    int opt, rc;
    while ((opt = kvctl_getopt(&common, argc, argv, "+c:s:hV", longopts, &rc)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            rc = KVCTL_EXIT_OK;
        } else if (opt == 'V') {
            printf("kvctl (libkvengine %s)\n", kv_version());
            rc = KVCTL_EXIT_OK;
        } else {
            usage(stderr);
            rc = KVCTL_EXIT_USAGE;
        }
        goto out;
    }
    if (rc >= 0)
        goto out;
    rc = KVCTL_EXIT_USAGE;
    if (optind >= argc) {
        fprintf(stderr, "kvctl: missing command\n\n");
        usage(stderr);
        goto out;
    }
    const struct command *cmd = find_command(argv[optind]);
    if (cmd) {
        rc = cmd->run(&common, argc - optind, argv + optind);
    } else {
        fprintf(stderr, "kvctl: unknown command '%s'\n\n", argv[optind]);
        usage(stderr);
    }
out:
    kvctl_common_free(&common);
    return rc;
}
