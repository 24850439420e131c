/*
 * check_tools.c — suite "tools": kvctl, run as the real binary.
 *
 * Each test runs $KV_BUILD/kvctl (tu_build_dir) with fork/exec, its stdout
 * and stderr going to files in a fresh temporary directory, and checks the
 * exit status and what it printed. A child that outlives its deadline is
 * killed and reaped. The summary JSON is checked with a small parser kept
 * here (a strict one: it rejects anything that is not JSON), so "parses"
 * means parses.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* ---- running kvctl ------------------------------------------------------- */

struct out {
    int status;         /* exit code, or 128 + signal */
    char *out, *err;
};

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "open %s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

/* Runs kvctl with the NULL-terminated arguments; a deadline of secs. */
static struct out run_kvctl(const char *dir, int secs, ...)
{
    char *argv[64];
    int argc = 0;
    char *prog = NULL;
    ck_assert(asprintf(&prog, "%s/kvctl", tu_build_dir()) > 0);
    argv[argc++] = prog;
    va_list ap;
    va_start(ap, secs);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && argc < 63)
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;

    char *opath = NULL, *epath = NULL;
    ck_assert(asprintf(&opath, "%s/stdout", dir) > 0);
    ck_assert(asprintf(&epath, "%s/stderr", dir) > 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int o = open(opath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(epath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        execv(prog, argv);
        _exit(127);
    }
    struct out r = { .status = -1 };
    uint64_t deadline = tu_now_ms() + (uint64_t)secs * 1000;
    int st = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (tu_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(5000);
    }
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = slurp(opath);
    r.err = slurp(epath);
    free(opath);
    free(epath);
    free(prog);
    return r;
}

static void out_free(struct out *r)
{
    free(r->out);
    free(r->err);
}

#define CK_STATUS(r, want)                                                    \
    ck_assert_msg((r).status == (want), "exit %d, want %d\nstdout:\n%s\nstderr:\n%s", \
                  (r).status, (want), (r).out, (r).err)
#define CK_HAS(text, needle)                                                  \
    ck_assert_msg(strstr((text), (needle)) != NULL, "'%s' not in:\n%s", (needle), (text))

static char *write_file(const char *dir, const char *name, const char *text)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/%s", dir, name) > 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

/* ---- a strict little JSON parser ----------------------------------------- */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
struct jv {
    enum jtype t;
    double num;
    char *str;              /* J_STR */
    struct jv **items;      /* J_ARR values, J_OBJ values */
    char **keys;            /* J_OBJ */
    size_t n;
};

static void jfree(struct jv *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++) {
        jfree(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

static void jws(const char **p)
{
    while (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r')
        (*p)++;
}

static struct jv *jparse_value(const char **p, int depth);

static char *jparse_string(const char **p)
{
    if (**p != '"')
        return NULL;
    (*p)++;
    size_t cap = 16, len = 0;
    char *s = malloc(cap);
    while (**p != '"') {
        unsigned char c = (unsigned char)**p;
        if (c < 0x20) {
            free(s);
            return NULL;
        }
        if (c == '\\') {
            (*p)++;
            char e = **p;
            if (e == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!isxdigit((unsigned char)(*p)[i])) {
                        free(s);
                        return NULL;
                    }
                *p += 4;
                c = '?';
            } else if (strchr("\"\\/bfnrt", e) && e) {
                c = (unsigned char)(e == 'n' ? '\n' : e == 't' ? '\t' : e);
            } else {
                free(s);
                return NULL;
            }
        }
        if (len + 2 > cap)
            s = realloc(s, cap *= 2);
        s[len++] = (char)c;
        (*p)++;
    }
    (*p)++;
    s[len] = '\0';
    return s;
}

static struct jv *jnew(enum jtype t)
{
    struct jv *v = calloc(1, sizeof *v);
    v->t = t;
    return v;
}

static void jpush(struct jv *v, char *key, struct jv *item)
{
    v->items = realloc(v->items, (v->n + 1) * sizeof *v->items);
    if (v->t == J_OBJ) {
        v->keys = realloc(v->keys, (v->n + 1) * sizeof *v->keys);
        v->keys[v->n] = key;
    }
    v->items[v->n++] = item;
}

static struct jv *jparse_container(const char **p, int depth, bool obj)
{
    struct jv *v = jnew(obj ? J_OBJ : J_ARR);
    (*p)++;
    jws(p);
    if (**p == (obj ? '}' : ']')) {
        (*p)++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        jws(p);
        if (obj) {
            if (!(key = jparse_string(p)))
                goto fail;
            jws(p);
            if (*(*p)++ != ':') {
                free(key);
                goto fail;
            }
        }
        struct jv *item = jparse_value(p, depth + 1);
        if (!item) {
            free(key);
            goto fail;
        }
        jpush(v, key, item);
        jws(p);
        if (**p == ',') {
            (*p)++;
            continue;
        }
        if (*(*p)++ == (obj ? '}' : ']'))
            return v;
        goto fail;
    }
fail:
    jfree(v);
    return NULL;
}

static struct jv *jparse_value(const char **p, int depth)
{
    jws(p);
    if (depth > 32)
        return NULL;
    if (**p == '{' || **p == '[')
        return jparse_container(p, depth, **p == '{');
    if (**p == '"') {
        char *s = jparse_string(p);
        if (!s)
            return NULL;
        struct jv *v = jnew(J_STR);
        v->str = s;
        return v;
    }
    static const char *words[] = { "true", "false", "null" };
    for (int i = 0; i < 3; i++) {
        if (strncmp(*p, words[i], strlen(words[i])) == 0) {
            *p += strlen(words[i]);
            struct jv *v = jnew(i == 2 ? J_NULL : J_BOOL);
            v->num = i == 0;
            return v;
        }
    }
    /* number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
    const char *s = *p;
    if (*s == '-')
        s++;
    if (!isdigit((unsigned char)*s) || (*s == '0' && isdigit((unsigned char)s[1])))
        return NULL;
    while (isdigit((unsigned char)*s))
        s++;
    if (*s == '.') {
        if (!isdigit((unsigned char)*++s))
            return NULL;
        while (isdigit((unsigned char)*s))
            s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!isdigit((unsigned char)*s))
            return NULL;
        while (isdigit((unsigned char)*s))
            s++;
    }
    struct jv *v = jnew(J_NUM);
    v->num = strtod(*p, NULL);
    *p = s;
    return v;
}

static struct jv *jparse(const char *text)
{
    const char *p = text;
    struct jv *v = jparse_value(&p, 0);
    jws(&p);
    if (v && *p != '\0') {
        jfree(v);
        return NULL;
    }
    return v;
}

/* The member key of object v, of type t; fails the test when absent. */
static struct jv *jget(const struct jv *v, const char *key, enum jtype t)
{
    ck_assert_int_eq(v->t, J_OBJ);
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0) {
            ck_assert_msg(v->items[i]->t == t, "%s: type %d, want %d", key, v->items[i]->t, t);
            return v->items[i];
        }
    ck_abort_msg("no key '%s' in the summary", key);
    return NULL;
}

/* Checks one phases array: DESIGN's fields, and names/ops/verify. */
static void check_phases(const struct jv *phases, const char *const *names, size_t n,
                         double ops)
{
    ck_assert_int_eq(phases->t, J_ARR);
    ck_assert_uint_eq(phases->n, n);
    for (size_t i = 0; i < n; i++) {
        const struct jv *p = phases->items[i];
        ck_assert_str_eq(jget(p, "name", J_STR)->str, names[i]);
        ck_assert_double_eq(jget(p, "ops", J_NUM)->num, ops);
        jget(p, "bytes", J_NUM);
        ck_assert(jget(p, "seconds", J_NUM)->num >= 0);
        jget(p, "mib_s", J_NUM);
        ck_assert(jget(p, "kvs_s", J_NUM)->num > 0);
        const struct jv *lat = jget(p, "lat_us", J_OBJ);
        double p50 = jget(lat, "p50", J_NUM)->num, p99 = jget(lat, "p99", J_NUM)->num;
        ck_assert(p50 > 0 && p50 <= jget(lat, "p95", J_NUM)->num && p50 <= p99);
        ck_assert_double_eq(jget(p, "misses", J_NUM)->num, 0);
        ck_assert_double_eq(jget(p, "verify_failures", J_NUM)->num, 0);
        ck_assert_double_eq(jget(p, "errors", J_NUM)->num, 0);
    }
}

/* ---- tests --------------------------------------------------------------- */

START_TEST(help_lists_commands_and_exit_codes)
{
    char *dir = tu_mkdtemp();
    struct out r = run_kvctl(dir, 10, "--help", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "config check FILE");
    CK_HAS(r.out, "config show");
    CK_HAS(r.out, "bench");
    CK_HAS(r.out, "--set KEY=VALUE");
    CK_HAS(r.out, "Exit status");
    CK_HAS(r.out, "2  usage or configuration error");
    out_free(&r);

    r = run_kvctl(dir, 10, "bench", "--help", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "--scenario NAME");
    CK_HAS(r.out, "default: read_perf");
    CK_HAS(r.out, "mixed_rw");
    CK_HAS(r.out, "--compare BACKEND");
    out_free(&r);

    r = run_kvctl(dir, 10, "config", "--help", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "config check FILE");
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(config_check_prints_effective_config)
{
    char *dir = tu_mkdtemp();
    char *cfg = write_file(dir, "good.yaml",
                           "pipeline: dram\n"
                           "dram:\n"
                           "  capacity: 512MiB\n");
    struct out r = run_kvctl(dir, 10, "--set", "eviction.ratio=0.25", "config", "check", cfg,
                             NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "pipeline: dram\n");
    CK_HAS(r.out, "capacity: 512MiB");
    CK_HAS(r.out, "ratio: 0.25");
    CK_HAS(r.out, "lease_ttl_ms: 60000");   /* a default it did not name */
    out_free(&r);

    /* show: the same from --config and --set, either side of the command */
    r = run_kvctl(dir, 10, "config", "show", "--config", cfg, "--set", "io.threads=3", NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "capacity: 512MiB");
    CK_HAS(r.out, "threads: 3");
    out_free(&r);
    free(cfg);
    tu_rmdir(dir);
}
END_TEST

START_TEST(config_check_bad_file_names_line_and_key)
{
    char *dir = tu_mkdtemp();
    char *cfg = write_file(dir, "bad.yaml",
                           "dram:\n"
                           "  capacity: 1GiB\n"
                           "eviction:\n"
                           "  ratio: 1.5\n");
    struct out r = run_kvctl(dir, 10, "config", "check", cfg, NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "bad.yaml:4");
    CK_HAS(r.err, "eviction.ratio");
    ck_assert_str_eq(r.out, "");
    out_free(&r);

    char *unknown = write_file(dir, "unknown.yaml", "dram:\n  capacty: 1GiB\n");
    r = run_kvctl(dir, 10, "config", "check", unknown, NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "unknown.yaml:2");
    CK_HAS(r.err, "dram.capacty");
    out_free(&r);

    r = run_kvctl(dir, 10, "config", "check", "/nonexistent/kv.yaml", NULL);
    CK_STATUS(r, 2);
    CK_HAS(r.err, "/nonexistent/kv.yaml");
    out_free(&r);
    free(cfg);
    free(unknown);
    tu_rmdir(dir);
}
END_TEST

START_TEST(bad_usage_exits_2)
{
    char *dir = tu_mkdtemp();
    static const char *const cases[][4] = {
        { "--bogus", NULL },
        { "frobnicate", NULL },
        { NULL },
        { "--set", "noequals", "config", "show" },
        { "--set", "dram.capacity=lots", "config", "show" },
        { "--set", "no.such.key=1", "config", "show" },
        { "config", "check", NULL },
        { "bench", "--value-size", "abc" },
        { "bench", "--scenario", "nope" },
        { "bench", "--numjobs", "0" },
        { "bench", "--compare", "ramfs" },
        { "bench", "--scenario", "mixed_rw", "--runtime" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct out r = run_kvctl(dir, 10, cases[i][0], cases[i][1], cases[i][2], cases[i][3],
                                 NULL);
        ck_assert_msg(r.status == 2, "case %zu (%s %s): exit %d\n%s", i,
                      cases[i][0] ? cases[i][0] : "", cases[i][1] ? cases[i][1] : "", r.status,
                      r.err);
        ck_assert_msg(r.err[0] != '\0', "case %zu: nothing on stderr", i);
        out_free(&r);
    }
    /* a bad --set value is explained: the key, and why */
    struct out r = run_kvctl(dir, 10, "--set", "dram.capacity=lots", "config", "show", NULL);
    CK_HAS(r.err, "dram.capacity");
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(tiny_verify_write_summary_json)
{
    char *dir = tu_mkdtemp();
    char *json = NULL;
    ck_assert(asprintf(&json, "%s/summary.json", dir) > 0);
    struct out r = run_kvctl(dir, 60, "bench", "--scenario", "verify_write", "--nr-objects", "16",
                             "--value-size", "64KiB", "--summary-json", json, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "verify_write");
    CK_HAS(r.out, "[kvengine]");
    ck_assert_msg(strchr(r.err, '\r') == NULL, "progress written to a pipe");
    char *text = slurp(json);
    struct jv *v = jparse(text);
    ck_assert_msg(v != NULL, "summary is not JSON:\n%s", text);
    ck_assert_str_eq(jget(v, "scenario", J_STR)->str, "verify_write");
    ck_assert(jget(v, "memcpy_mib_s", J_NUM)->num > 0);
    static const char *const names[] = { "write", "read" };
    check_phases(jget(v, "phases", J_ARR), names, 2, 16);
    ck_assert_double_eq(jget(jget(v, "phases", J_ARR)->items[1], "bytes", J_NUM)->num,
                        16.0 * 65536);
    ck_assert_double_eq(jget(v, "value_size", J_NUM)->num, 65536);
    ck_assert_str_eq(jget(v, "pipeline", J_STR)->str, "dram");
    ck_assert(jget(v, "ok", J_BOOL)->num == 1);
    ck_assert(jget(v, "index_bytes_per_shard", J_NUM)->num > 0);
    ck_assert(jget(v, "rss_mib", J_NUM)->num > 0);
    jfree(v);
    free(text);
    free(json);
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

static size_t count_entries(const char *path)
{
    DIR *d = opendir(path);
    ck_assert_ptr_nonnull(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

START_TEST(compare_posix_runs_both)
{
    char *dir = tu_mkdtemp();
    char *json = NULL, *pdir = NULL;
    ck_assert(asprintf(&json, "%s/summary.json", dir) > 0);
    ck_assert(asprintf(&pdir, "%s/posix", dir) > 0);
    ck_assert_int_eq(mkdir(pdir, 0755), 0);
    struct out r = run_kvctl(dir, 60, "bench", "--scenario", "read_perf", "--nr-objects", "16",
                             "--value-size", "64KiB", "--verify", "--compare", "posix",
                             "--posix-dir", pdir, "--summary-json", json, NULL);
    CK_STATUS(r, 0);
    CK_HAS(r.out, "[kvengine]");
    CK_HAS(r.out, "[posix]");
    CK_HAS(r.out, "kvengine / posix");
    /* the posix backend's files are gone */
    ck_assert_uint_eq(count_entries(pdir), 0);
    char *text = slurp(json);
    struct jv *v = jparse(text);
    ck_assert_msg(v != NULL, "summary is not JSON:\n%s", text);
    static const char *const names[] = { "write", "lookup", "read" };
    check_phases(jget(v, "phases", J_ARR), names, 3, 16);
    const struct jv *cmp = jget(v, "comparisons", J_ARR);
    ck_assert_uint_eq(cmp->n, 1);
    const struct jv *px = cmp->items[0];
    ck_assert_str_eq(jget(px, "backend", J_STR)->str, "posix");
    check_phases(jget(px, "phases", J_ARR), names, 3, 16);
    const struct jv *ratios = jget(px, "ratios", J_OBJ);
    ck_assert(jget(jget(ratios, "read", J_OBJ), "kvs_s", J_NUM)->num > 0);
    ck_assert(jget(jget(ratios, "read", J_OBJ), "mib_s", J_NUM)->num > 0);
    ck_assert(jget(jget(ratios, "lookup", J_OBJ), "ids_s", J_NUM)->num > 0);
    jfree(v);
    free(text);
    free(json);
    free(pdir);
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(mixed_rw_is_time_based)
{
    char *dir = tu_mkdtemp();
    uint64_t t0 = tu_now_ms();
    struct out r = run_kvctl(dir, 60, "bench", "--scenario", "mixed_rw", "--nr-objects", "32",
                             "--value-size", "64KiB", "--runtime", "0.3", "--rwmixread", "50",
                             "--verify", "--summary-json", "-", NULL);
    CK_STATUS(r, 0);
    ck_assert_uint_ge(tu_now_ms() - t0, 300);
    /* --summary-json - puts the JSON on stdout after the table */
    char *brace = strstr(r.out, "\n{\"scenario\"");
    ck_assert_msg(brace != NULL, "no JSON on stdout:\n%s", r.out);
    struct jv *v = jparse(brace + 1);
    ck_assert_ptr_nonnull(v);
    const struct jv *ph = jget(v, "phases", J_ARR);
    ck_assert_uint_eq(ph->n, 3);
    ck_assert_str_eq(jget(ph->items[1], "name", J_STR)->str, "mixed_read");
    ck_assert_str_eq(jget(ph->items[2], "name", J_STR)->str, "mixed_write");
    ck_assert(jget(ph->items[1], "ops", J_NUM)->num > 0);
    ck_assert(jget(ph->items[2], "ops", J_NUM)->num > 0);
    ck_assert(jget(ph->items[1], "seconds", J_NUM)->num >= 0.29);
    ck_assert_double_eq(jget(ph->items[1], "verify_failures", J_NUM)->num, 0);
    jfree(v);
    out_free(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(ssd_pipeline_gets_a_temporary_path)
{
    char *dir = tu_mkdtemp();
    char *env = NULL;
    /* The bench puts its temporary ssd.path under $TMPDIR: point that at
     * our directory to see it made and removed. */
    ck_assert(asprintf(&env, "%s", dir) > 0);
    setenv("TMPDIR", env, 1);
    struct out r = run_kvctl(dir, 60, "--set", "pipeline=dram|ssd", "bench", "--scenario",
                             "verify_write", "--nr-objects", "8", "--value-size", "64KiB", NULL);
    unsetenv("TMPDIR");
    CK_STATUS(r, 0);
    CK_HAS(r.out, "pipeline dram|ssd");
    /* only our stdout and stderr files remain */
    ck_assert_uint_eq(count_entries(dir), 2);
    out_free(&r);
    free(env);
    tu_rmdir(dir);
}
END_TEST

Suite *tools_suite(void)
{
    Suite *s = suite_create("tools");
    TCase *tc = tcase_create("kvctl");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, help_lists_commands_and_exit_codes);
    tcase_add_test(tc, config_check_prints_effective_config);
    tcase_add_test(tc, config_check_bad_file_names_line_and_key);
    tcase_add_test(tc, bad_usage_exits_2);
    tcase_add_test(tc, tiny_verify_write_summary_json);
    tcase_add_test(tc, compare_posix_runs_both);
    tcase_add_test(tc, mixed_rw_is_time_based);
    tcase_add_test(tc, ssd_pipeline_gets_a_temporary_path);
    suite_add_tcase(s, tc);
    return s;
}
