/*
 * testutil_kvctl.c — what the suites that run kvctl share (check_tools.c,
 * check_trace.c): running it as a child with a deadline and reading what it
 * printed, small files, and a strict little JSON parser for its
 * --summary-json and --json output.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "testutil_kvctl.h"

/* ---- running kvctl ------------------------------------------------------- */

char *slurp(const char *path)
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

struct out run_argv(const char *dir, int secs, char **args)
{
    char *argv[64];
    int argc = 0;
    char *prog = NULL;
    char *bdir = realpath(tu_build_dir(), NULL);
    ck_assert_ptr_nonnull(bdir);
    ck_assert(asprintf(&prog, "%s/kvctl", bdir) > 0);
    free(bdir);
    argv[argc++] = prog;
    for (; *args && argc < 63; args++)
        argv[argc++] = *args;
    argv[argc] = NULL;

    char *opath = NULL, *epath = NULL;
    ck_assert(asprintf(&opath, "%s/stdout", dir) > 0);
    ck_assert(asprintf(&epath, "%s/stderr", dir) > 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int o = open(opath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(epath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        /* In the test's directory: whatever kvctl makes by default (a
         * ./kvdata) lands there, never in the tree. */
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0 || chdir(dir) != 0)
            _exit(126);
        /* Standard input: the test's "stdin" file when it wrote one, else
         * nothing (never the runner's own). */
        int i = open("stdin", O_RDONLY);
        if (i < 0)
            i = open("/dev/null", O_RDONLY);
        if (i < 0 || dup2(i, 0) < 0)
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

struct out run_kvctl(const char *dir, int secs, ...)
{
    char *args[64];
    int n = 0;
    va_list ap;
    va_start(ap, secs);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 63)
        args[n++] = (char *)a;
    va_end(ap);
    args[n] = NULL;
    return run_argv(dir, secs, args);
}

void out_free(struct out *r)
{
    free(r->out);
    free(r->err);
}


char *write_data(const char *dir, const char *name, const void *data, size_t len)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/%s", dir, name) > 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

char *write_file(const char *dir, const char *name, const char *text)
{
    return write_data(dir, name, text, strlen(text));
}

/* ---- a strict little JSON parser ----------------------------------------- */


void jfree(struct jv *v)
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

struct jv *jparse(const char *text)
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
struct jv *jget(const struct jv *v, const char *key, enum jtype t)
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

/* The number member key of object v. */
double jnum_of(const struct jv *v, const char *key)
{
    return jget(v, key, J_NUM)->num;
}
