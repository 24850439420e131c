/*
 * kvctl_util.c — kvctl's plumbing: the common --config/--set options, the
 * effective config, number and size parsing, RSS, temporary directories,
 * JSON strings and numbers, the progress line.
 *
 * Key design choice: kvctl never peeks inside a kv_config. To learn whether
 * the user chose a key in the file (so the benchmark may size it itself when
 * not), it loads the file twice over two different starting values of that
 * key: the file set the key exactly when both loads end with the same value.
 */
#include "kvctl.h"

#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char kvctl_common_help[] =
    "  -c, --config FILE      YAML config file (default: none, built-in defaults)\n"
    "  -s, --set KEY=VALUE    set a dotted config key (e.g. dram.capacity=2GiB),\n"
    "                         applied after the file; repeatable\n"
    "  -h, --help             show this help\n";

const char kvctl_exit_help[] =
    "Exit status:\n"
    "  0  success\n"
    "  1  runtime failure (engine error, failed operations, verify failures)\n"
    "  2  usage or configuration error\n"
    "  3  not found (get or rm of an absent key; lookup with a miss)\n";

/* ---- common options ------------------------------------------------------ */

/* Handles -c/-s; returns 1 when handled, 0 when opt is not common, or
 * -(exit status) after printing why. */
static int common_opt(struct kvctl_common *c, int opt, const char *arg)
{
    if (opt == 'c') {
        c->config = arg;
        return 1;
    }
    if (opt != 's')
        return 0;
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg) {
        fprintf(stderr, "kvctl: --set wants KEY=VALUE, got '%s'\n", arg);
        return -KVCTL_EXIT_USAGE;
    }
    char **n = realloc(c->sets, (c->nsets + 1) * sizeof *n);
    char *dup = strdup(arg);
    if (!n || !dup) {
        free(dup);
        if (n)
            c->sets = n;
        fprintf(stderr, "kvctl: out of memory\n");
        return -KVCTL_EXIT_FAIL;
    }
    c->sets = n;
    c->sets[c->nsets++] = dup;
    return 1;
}

int kvctl_getopt(struct kvctl_common *c, int argc, char **argv, const char *optstring,
                 const struct option *longopts, int *rc)
{
    int opt;
    *rc = -1;
    while ((opt = getopt_long(argc, argv, optstring, longopts, NULL)) != -1) {
        int r = common_opt(c, opt, optarg);
        if (r == 0)
            return opt;
        if (r < 0) {
            *rc = -r;
            return -1;
        }
    }
    return -1;
}

void kvctl_common_free(struct kvctl_common *c)
{
    for (size_t i = 0; i < c->nsets; i++)
        free(c->sets[i]);
    free(c->sets);
    c->sets = NULL;
    c->nsets = 0;
}

/*
 * kv_config_set reports only a code. For a useful message, feed the same
 * key and value to the YAML parser as a nested document: its error names
 * the key and says what is wrong with the value.
 */
static void explain_set(const char *key, const char *value)
{
    char doc[1024];
    size_t len = 0;
    int depth = 0;
    const char *p = key;
    while (len < sizeof doc - 1) {
        const char *dot = strchr(p, '.');
        int seg = dot ? (int)(dot - p) : (int)strlen(p);
        int w = snprintf(doc + len, sizeof doc - len, "%*s%.*s:%s", depth * 2, "", seg, p,
                         dot ? "\n" : " ");
        if (w < 0 || (size_t)w >= sizeof doc - len)
            break;
        len += (size_t)w;
        if (!dot) {
            snprintf(doc + len, sizeof doc - len, "%s\n", value);
            len = strlen(doc);
            break;
        }
        p = dot + 1;
        depth++;
    }
    kv_config *scratch = NULL;
    char err[512] = "";
    if (kv_config_new(&scratch) == KV_OK &&
        kv_config_parse(scratch, doc, len, err, sizeof err) != KV_OK && err[0]) {
        /* "<string>:2: key: why" -> "key: why" */
        const char *msg = strstr(err, ": ");
        fprintf(stderr, "kvctl: --set %s=%s: %s\n", key, value, msg ? msg + 2 : err);
    } else {
        fprintf(stderr, "kvctl: --set %s=%s: unknown key or invalid value\n", key, value);
    }
    kv_config_free(scratch);
}

static int apply_set(kv_config *cfg, const char *kv, bool quiet)
{
    const char *eq = strchr(kv, '=');
    char key[256];
    size_t klen = (size_t)(eq - kv);
    if (klen >= sizeof key) {
        if (!quiet)
            fprintf(stderr, "kvctl: --set %s: key too long\n", kv);
        return KV_ECONFIG;
    }
    memcpy(key, kv, klen);
    key[klen] = '\0';
    int rc = kv_config_set(cfg, key, eq + 1);
    if (rc != KV_OK && !quiet) {
        if (rc == KV_ECONFIG)
            explain_set(key, eq + 1);
        else
            fprintf(stderr, "kvctl: --set %s: %s\n", kv, kv_strerror(rc));
    }
    return rc;
}

int kvctl_build_config(const struct kvctl_common *c, kv_config **out)
{
    kv_config *cfg = NULL;
    *out = NULL;
    int rc = kv_config_new(&cfg);
    if (rc != KV_OK) {
        fprintf(stderr, "kvctl: %s\n", kv_strerror(rc));
        return KVCTL_EXIT_FAIL;
    }
    if (c->config) {
        char err[1024] = "";
        rc = kv_config_load(cfg, c->config, err, sizeof err);
        if (rc != KV_OK) {
            fprintf(stderr, "kvctl: %s\n", err[0] ? err : kv_strerror(rc));
            kv_config_free(cfg);
            return KVCTL_EXIT_USAGE;
        }
    }
    for (size_t i = 0; i < c->nsets; i++) {
        if (apply_set(cfg, c->sets[i], false) != KV_OK) {
            kv_config_free(cfg);
            return KVCTL_EXIT_USAGE;
        }
    }
    *out = cfg;
    return KVCTL_EXIT_OK;
}

/* The value key ends with after loading the file over a start of `start`;
 * false when any step fails. */
static bool value_after_file(const char *file, const char *key, const char *start,
                             char *buf, size_t cap)
{
    kv_config *cfg = NULL;
    bool ok = kv_config_new(&cfg) == KV_OK && kv_config_set(cfg, key, start) == KV_OK &&
              kv_config_load(cfg, file, NULL, 0) == KV_OK &&
              kv_config_get(cfg, key, buf, cap) == KV_OK;
    kv_config_free(cfg);
    return ok;
}

/* Two valid, different starting values for the keys the bench may size. */
static const struct { const char *key, *a, *b; } probes[] = {
    { "pipeline", "dram", "ssd" },
    { "dram.capacity", "3GiB", "5GiB" },
    { "ssd.path", "/kvctl-probe-a", "/kvctl-probe-b" },
    { "log.level", "error", "debug" },
    { "ssd.write_through", "false", "true" },
};

bool kvctl_user_set(const struct kvctl_common *c, const char *key)
{
    size_t klen = strlen(key);
    for (size_t i = 0; i < c->nsets; i++)
        if (strncmp(c->sets[i], key, klen) == 0 && c->sets[i][klen] == '=')
            return true;
    if (!c->config)
        return false;
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        if (strcmp(probes[i].key, key) != 0)
            continue;
        char va[512], vb[512];
        if (!value_after_file(c->config, key, probes[i].a, va, sizeof va) ||
            !value_after_file(c->config, key, probes[i].b, vb, sizeof vb))
            return false;
        return strcmp(va, vb) == 0;
    }
    return false;
}

/* ---- numbers ------------------------------------------------------------- */

uint64_t kvctl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The config's own size syntax (one parser for the whole tree). */
int kvctl_parse_size(const char *s, uint64_t *out)
{
    return kv_parse_size(s, out);
}

int kvctl_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (!s || !*s || *s == '-')
        return KV_EINVAL;
    unsigned long long v = strtoull(s, &end, 10);   /* "010" is ten, not octal eight */
    if (errno || *end != '\0' || v < lo || v > hi)
        return KV_EINVAL;
    *out = v;
    return KV_OK;
}

int kvctl_parse_seconds(const char *s, double *out)
{
    char *end = NULL;
    errno = 0;
    if (!s || !*s)
        return KV_EINVAL;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || v > 1e7)
        return KV_EINVAL;
    if (strcmp(end, "ms") == 0)
        v /= 1000.0;
    else if (*end != '\0' && strcmp(end, "s") != 0)
        return KV_EINVAL;
    *out = v;
    return KV_OK;
}

const char *kvctl_fmt_size(uint64_t v, char *buf, size_t cap)
{
    static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int u = 0;
    double d = (double)v;
    while (d >= 1024 && u < 4) {
        d /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%" PRIu64 " B", v);
    else if (d == (double)(uint64_t)d)
        snprintf(buf, cap, "%.0f %s", d, units[u]);
    else
        snprintf(buf, cap, "%.1f %s", d, units[u]);
    return buf;
}

void kvctl_rss(uint64_t *rss, uint64_t *peak)
{
    *rss = *peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
            *rss = kb * 1024;
        else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            *peak = kb * 1024;
    }
    fclose(f);
}

void kvctl_rss_reset_peak(void)
{
    /* "5" resets VmHWM to the current RSS (Linux >= 4.0), so that each
     * backend's peak is its own; harmless where unsupported. */
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return;
    fputs("5", f);
    fclose(f);
}

/* ---- temporary directories ----------------------------------------------- */

char *kvctl_mktemp_dir(const char *parent, const char *prefix)
{
    if (!parent || !*parent)
        parent = getenv("TMPDIR");
    if (!parent || !*parent)
        parent = "/tmp";
    char *path = NULL;
    if (asprintf(&path, "%s/%s.XXXXXX", parent, prefix) < 0)
        return NULL;
    if (!mkdtemp(path)) {
        int e = errno;
        free(path);
        errno = e;
        return NULL;
    }
    return path;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    remove(p);
    return 0;   /* keep going: remove as much as we can */
}

void kvctl_rmtree(char *path)
{
    if (!path)
        return;
    nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS);
    free(path);
}

/* ---- JSON ---------------------------------------------------------------- */

void kvctl_jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void kvctl_jnum(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* ---- progress ------------------------------------------------------------ */

void kvctl_progress_start(struct kvctl_progress *p, const char *phase, uint64_t total,
                          double runtime, uint64_t value_size)
{
    p->on = isatty(STDERR_FILENO);
    p->phase = phase;
    p->t0 = p->last = kvctl_now_ns();
    p->total = total;
    p->runtime = runtime;
    p->value_size = value_size;
    p->unit = NULL;
}

void kvctl_progress_tick(struct kvctl_progress *p, uint64_t done)
{
    uint64_t now = kvctl_now_ns();
    if (!p->on || now - p->last < 200000000u)
        return;
    p->last = now;
    double el = (double)(now - p->t0) / 1e9;
    double rate = el > 0 ? (double)done / el : 0;
    double eta = p->total ? (rate > 0 ? (double)(p->total - (done < p->total ? done : p->total)) / rate : 0)
                          : p->runtime - el;
    char line[200], bar[24];
    /* A 20-cell bar of the share done (of the items, or of the runtime). */
    double frac = p->total ? (double)done / (double)p->total : p->runtime > 0 ? el / p->runtime : 0;
    int cells = (int)(frac * 20 + 0.5);
    cells = cells < 0 ? 0 : cells > 20 ? 20 : cells;
    for (int i = 0; i < 20; i++)
        bar[i] = i < cells ? '#' : '.';
    bar[20] = '\0';
    int n = snprintf(line, sizeof line, "\r[%s] [%s] %" PRIu64, p->phase, bar, done);
    if (p->total)
        n += snprintf(line + n, sizeof line - (size_t)n, "/%" PRIu64, p->total);
    if (p->value_size)
        n += snprintf(line + n, sizeof line - (size_t)n, "  %.1f MiB/s",
                      rate * (double)p->value_size / (1024.0 * 1024.0));
    else
        n += snprintf(line + n, sizeof line - (size_t)n, "  %.0f %s/s", rate,
                      p->unit ? p->unit : "ids");
    snprintf(line + n, sizeof line - (size_t)n, "  ETA %.1fs \033[K", eta > 0 ? eta : 0);
    fputs(line, stderr);
    fflush(stderr);
}

void kvctl_progress_end(struct kvctl_progress *p)
{
    if (p->on && p->last != p->t0)
        fputs("\r\033[K", stderr);
    p->on = false;
}
