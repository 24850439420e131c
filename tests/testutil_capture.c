/*
 * testutil_capture.c — quiet tests: every test's stderr goes to a file of
 * its own, and the runner prints the file of each test that failed.
 *
 * Key design choice: the capture is made by the test harness, not by the
 * library. The engine logs to stderr like any library would; a checked
 * fixture that every TCase gets first (testutil.h maps tcase_create onto
 * tu_tcase_create) points fd 2 at a fresh file before each test, so the
 * engine's lines, the test's own prints and every child the test starts
 * without a log of its own (they inherit fd 2) land there. Check runs each
 * test in a forked child, and the parent has no per-test hook, so tests are
 * matched to their files by order: a counter in a MAP_SHARED page, bumped
 * by each test's setup, numbers the files, and srunner_results() lists the
 * results in the order the tests ran. Should the two counts differ (a test
 * that never reached its setup), a failure prints every file instead, so
 * nothing is hidden.
 *
 * A child started with tu_spawn writes to a log file of the test's own;
 * tu_spawn notes the path in the capture ("tu_spawn: ... log PATH") and the
 * report prints those files too, still there after a failure because a
 * failed test does not reach its teardown.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#undef tcase_create

static char *cap_dir;                /* the run's capture directory */
static _Atomic unsigned *cap_seq;    /* shared with every forked test */
static int cap_saved_fd = -1;        /* the runner's own stderr */
static char cap_path[4096];          /* this test's file (in the test's process) */

static void cap_setup(void)
{
    if (!cap_dir || !cap_seq)
        return;
    unsigned n = atomic_fetch_add(cap_seq, 1);
    snprintf(cap_path, sizeof cap_path, "%s/%08u", cap_dir, n);
    fflush(stderr);
    int fd = open(cap_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return;   /* the test runs loud rather than not at all */
    dup2(fd, 2);
    close(fd);
}

static void cap_teardown(void)
{
    fflush(stderr);
}

TCase *tu_tcase_create(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, cap_setup, cap_teardown);
    return tc;
}

void tu_capture_begin(void)
{
    if (getenv("KV_TEST_LOUD"))
        return;      /* everything to the terminal, as before */
    const char *t = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/kvtest-capture.XXXXXX", t && *t ? t : "/tmp");
    void *page = mmap(NULL, sizeof *cap_seq, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
    if (page == MAP_FAILED || !mkdtemp(tmpl)) {
        fprintf(stderr, "check_kvengine: no capture (%s): tests print their logs\n",
                strerror(errno));
        if (page != MAP_FAILED)
            munmap(page, sizeof *cap_seq);
        return;
    }
    cap_seq = page;
    cap_dir = strdup(tmpl);
    cap_saved_fd = dup(2);
}

/* Copies the file at path to the runner's stderr. */
static void cap_print_file(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    dprintf(cap_saved_fd, "---- %s (%s) ----\n", what, path);
    char buf[65536];
    size_t n;
    bool nl = true;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (write(cap_saved_fd, buf, n) < 0)
            break;
        nl = buf[n - 1] == '\n';
    }
    fclose(f);
    dprintf(cap_saved_fd, "%s---- end of %s ----\n", nl ? "" : "\n", what);
}

/* Prints the capture at path, then the log files of the children it
 * names (tu_spawn's notes). */
static void cap_print_test(const char *path, const char *what)
{
    cap_print_file(path, what);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[4096];
    static const char mark[] = "tu_spawn: ";
    while (fgets(line, sizeof line, f)) {
        const char *log = strncmp(line, mark, sizeof mark - 1) == 0 ? strstr(line, " log ") : NULL;
        if (!log)
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s", log + 5);
        p[strcspn(p, "\n")] = '\0';
        cap_print_file(p, "log of a child it started");
    }
    fclose(f);
}

static int cap_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void tu_capture_end(SRunner *sr)
{
    if (!cap_dir)
        return;
    fflush(stderr);
    dup2(cap_saved_fd, 2);
    DIR *d = opendir(cap_dir);
    char **names = NULL;
    size_t nn = 0, cap = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        if (nn == cap) {
            cap = cap ? cap * 2 : 256;
            names = realloc(names, cap * sizeof *names);
        }
        names[nn++] = strdup(de->d_name);
    }
    if (d)
        closedir(d);
    if (nn)
        qsort(names, nn, sizeof *names, cap_cmp);
    TestResult **res = srunner_results(sr);
    size_t nres = (size_t)srunner_ntests_run(sr);
    /* Check's summary is on stdout and may lack its last newline yet. */
    fflush(stdout);
    if (srunner_ntests_failed(sr))
        dprintf(cap_saved_fd, "\n");
    for (size_t i = 0; res && i < nres; i++) {
        if (tr_rtype(res[i]) == CK_PASS)
            continue;
        char what[512], path[8192];
        snprintf(what, sizeof what, "log of the test that failed at %s:%d (%s)", tr_lfile(res[i]),
                 tr_lno(res[i]), tr_tcname(res[i]));
        for (size_t j = 0; j < nn; j++)
            if (nn == nres ? j == i : true) {
                snprintf(path, sizeof path, "%s/%s", cap_dir, names[j]);
                cap_print_test(path, what);
            }
    }
    /* The logs above can be long (a cluster test prints every node's), and
     * CI shows only the tail of a run: the failures once more, last. */
    for (size_t i = 0; res && i < nres; i++)
        if (tr_rtype(res[i]) != CK_PASS)
            dprintf(cap_saved_fd, "check_kvengine: FAILED at %s:%d (case %s): %s\n", tr_lfile(res[i]),
                    tr_lno(res[i]), tr_tcname(res[i]), tr_msg(res[i]));
    free(res);
    for (size_t j = 0; j < nn; j++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", cap_dir, names[j]);
        unlink(path);
        free(names[j]);
    }
    free(names);
    rmdir(cap_dir);
    free(cap_dir);
    cap_dir = NULL;
    munmap((void *)cap_seq, sizeof *cap_seq);
    cap_seq = NULL;
    close(cap_saved_fd);
    cap_saved_fd = -1;
}

char *tu_capture_text(void)
{
    fflush(stderr);
    FILE *f = cap_path[0] ? fopen(cap_path, "r") : NULL;
    char *text = NULL;
    size_t len = 0;
    if (f) {
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
            char *t = realloc(text, len + n + 1);
            ck_assert_ptr_nonnull(t);
            text = t;
            memcpy(text + len, buf, n);
            len += n;
        }
        fclose(f);
    }
    if (!text)
        text = calloc(1, 1);
    text[len] = '\0';
    return text;
}

bool tu_capture_has(const char *needle)
{
    if (!cap_path[0])
        return true;   /* not capturing (KV_TEST_LOUD): nothing to look in */
    char *t = tu_capture_text();
    bool has = strstr(t, needle) != NULL;
    free(t);
    return has;
}
