/*
 * kvctl.h — what the parts of kvctl share: exit codes, the common
 * --config/--set options, small utilities (numbers, sizes, the progress
 * line, JSON strings), the HTTP client, and the commands' entry points.
 * The benchmark harness (tools/bench/) has its own header, bench.h.
 *
 * Key design choice: kvctl uses only the public header, like any other
 * user of the library.
 */
#ifndef KVCTL_H
#define KVCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "kvengine.h"

/* Exit status of every command (documented in kvctl --help). */
enum {
    KVCTL_EXIT_OK = 0,      /* success */
    KVCTL_EXIT_FAIL = 1,    /* runtime failure, including verify failures */
    KVCTL_EXIT_USAGE = 2,   /* bad usage or configuration */
    KVCTL_EXIT_NOTFOUND = 3,/* get/rm of an absent key, lookup with a miss */
};

/* ---- common options (kvctl.c, kvctl_util.c) ------------------------------ */

/* --config FILE and every --set KEY=VALUE, in the order given. */
struct kvctl_common {
    const char *config;     /* NULL: built-in defaults only */
    char **sets;            /* "KEY=VALUE", as given */
    size_t nsets;
};

/* Long options every command accepts, and their handling. */
#define KVCTL_COMMON_LONGOPTS                                                  \
    { "config", required_argument, NULL, 'c' },                               \
    { "set", required_argument, NULL, 's' }
struct option;
/* getopt_long(argc, argv, optstring, longopts) that handles -c/-s itself:
 * the next option that is not one of them, or -1 at the end with *rc = -1,
 * or -1 with *rc the exit status after a bad one (printed). The caller sets
 * optind (0 for a fresh parse). */
int  kvctl_getopt(struct kvctl_common *c, int argc, char **argv, const char *optstring,
                  const struct option *longopts, int *rc);
void kvctl_common_free(struct kvctl_common *c);

/* The effective config: defaults, then the file, then every --set. On
 * failure prints the reason (file, line, key) to stderr, leaves *out NULL
 * and returns KVCTL_EXIT_USAGE. */
int  kvctl_build_config(const struct kvctl_common *c, kv_config **out);
/* Whether the user chose key, in the file or with --set (not the default). */
bool kvctl_user_set(const struct kvctl_common *c, const char *key);

/* Text lines shared by every usage message. */
extern const char kvctl_common_help[];
extern const char kvctl_exit_help[];

/* ---- utilities (kvctl_util.c) -------------------------------------------- */

uint64_t kvctl_now_ns(void);
/* "64KiB", "1MiB", "4096", "2G" (binary units, optional "iB"/"B"). */
int  kvctl_parse_size(const char *s, uint64_t *out);
/* A whole number in [lo, hi]. */
int  kvctl_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* A non-negative number of seconds, "10", "2.5", "500ms", "3s". */
int  kvctl_parse_seconds(const char *s, double *out);
/* "1.0 MiB", "64 KiB", "4096 B". */
const char *kvctl_fmt_size(uint64_t v, char *buf, size_t cap);
/* VmRSS and VmHWM of this process in bytes (0 when unknown). */
void kvctl_rss(uint64_t *rss, uint64_t *peak);
/* Starts a new peak: VmHWM becomes the current RSS. */
void kvctl_rss_reset_peak(void);
/* A fresh directory "<parent or $TMPDIR or /tmp>/<prefix>.XXXXXX"; NULL on
 * failure (errno set). Free with kvctl_rmtree. */
char *kvctl_mktemp_dir(const char *parent, const char *prefix);
/* rm -rf path (never follows symlinks), then free(path). NULL is allowed. */
void kvctl_rmtree(char *path);
/* A one-line progress display on stderr, only when stderr is a terminal
 * (the bench's phases, ssd scrub). */
struct kvctl_progress {
    bool on;
    const char *phase;
    uint64_t t0, last, total;   /* total items, 0 when time-based */
    double runtime;             /* seconds, for time-based phases */
    uint64_t value_size;        /* 0 for lookups: show ids/s */
    const char *unit;           /* with value_size 0: what the items are
                                   ("values"); NULL: "ids" */
};
void kvctl_progress_start(struct kvctl_progress *p, const char *phase, uint64_t total,
                          double runtime, uint64_t value_size);
void kvctl_progress_tick(struct kvctl_progress *p, uint64_t done);
void kvctl_progress_end(struct kvctl_progress *p);

/* JSON output: a string with escapes, a number (null when not finite). */
void kvctl_jstr(FILE *f, const char *s);
void kvctl_jnum(FILE *f, double v);

/* ---- HTTP (kvctl_http.c) -------------------------------------------------- */

/* GET http://HOSTPORT/PATH (HTTP/1.0). *body is malloc'd (NUL-terminated,
 * free() it), *status the HTTP status. On failure why says what happened in
 * words (an address that is not HOST:PORT, a node that does not answer...):
 * KV_EINVAL, KV_ENET (refused), KV_ETIMEDOUT, KV_EPROTO (not HTTP). */
/* token, when non-empty, is sent as "Authorization: Bearer TOKEN". */
int kvctl_http_get(const char *hostport, const char *path, const char *token,
                   unsigned timeout_ms, char **body, size_t *len, int *status, char *why,
                   size_t whylen);

/* ---- commands ------------------------------------------------------------ */

/* kvctl bench (bench/bench.c): argv[0] is "bench". Returns an exit code. */
int kvctl_bench_main(struct kvctl_common *c, int argc, char **argv);

/* The admin commands, stats, members, lookup, put, get, rm and ssd
 * (kvctl_admin.c): argv[0] is the command's name. Returns an exit code. */
int  kvctl_admin_main(struct kvctl_common *c, int argc, char **argv);

#endif
