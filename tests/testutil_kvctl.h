/*
 * testutil_kvctl.h — running kvctl from a test and reading its output
 * (tests/testutil_kvctl.c).
 */
#ifndef KV_TESTUTIL_KVCTL_H
#define KV_TESTUTIL_KVCTL_H

#include <stddef.h>

struct out {
    int status;         /* exit code, or 128 + signal */
    char *out, *err;
};

/* Runs build/kvctl with the arguments (NULL-terminated) in dir, for at most
 * secs seconds (then SIGKILL); stdin is dir/stdin when the test wrote one,
 * else /dev/null. */
struct out run_kvctl(const char *dir, int secs, ...);
struct out run_argv(const char *dir, int secs, char **args);
void out_free(struct out *r);
/* A whole file, NUL-terminated (malloc'd); fails the test when unreadable. */
char *slurp(const char *path);
/* dir/name with text (or len bytes of data); its path, malloc'd. */
char *write_file(const char *dir, const char *name, const char *text);
char *write_data(const char *dir, const char *name, const void *data, size_t len);

/* The text is cut at 2000 bytes in the message: Check's messages are bounded. */
#define CK_STATUS(r, want)                                                    \
    ck_assert_msg((r).status == (want), "exit %d, want %d\nstdout:\n%.2000s\nstderr:\n%.2000s", \
                  (r).status, (want), (r).out, (r).err)
#define CK_HAS(text, needle)                                                  \
    ck_assert_msg(strstr((text), (needle)) != NULL, "'%s' not in:\n%.2000s", (needle), (text))

/* A strict little JSON parser: NULL for anything that is not one JSON
 * value, wholly. */
enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
struct jv {
    enum jtype t;
    double num;
    char *str;              /* J_STR */
    struct jv **items;      /* J_ARR values, J_OBJ values */
    char **keys;            /* J_OBJ */
    size_t n;
};
void jfree(struct jv *v);
struct jv *jparse(const char *text);
/* The member key of object v, of type t; fails the test when absent. */
struct jv *jget(const struct jv *v, const char *key, enum jtype t);
double jnum_of(const struct jv *v, const char *key);

#endif
