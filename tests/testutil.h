/*
 * testutil.h — fixtures shared by the Check suites.
 *
 * Every suite makes a fresh world per test: a temporary directory and an
 * engine opened from a YAML string, torn down again in the test.
 */
#ifndef KV_TESTUTIL_H
#define KV_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvengine.h"

/* Every suite, one per module: tests/check_<name>.c exports <name>_suite().
 * Declared weak so the runner runs exactly the suites that are built in. */
#define TU_SUITES(X) X(errors) X(config) X(alloc) X(index) X(engine) X(evict)  \
    X(kv) X(concurrency) X(persist) X(spill) X(crash) X(proto) X(tcp) X(rdma) \
    X(master) X(cluster) X(tools) X(etcd) X(trace) X(recover) X(auth) \
    X(ops) \
    X(host) \
    X(ssd_modes) X(tomb)
#define TU_DECLARE_SUITE(name) Suite *name##_suite(void) __attribute__((weak));
TU_SUITES(TU_DECLARE_SUITE)
/* check_ssd_modes' other-user process (KV_TEST_MODES_CHILD): the runner
 * runs it instead of the suites when that is set. */
int tu_ssd_modes_child(const char *spec) __attribute__((weak));

/* A fresh directory under $TMPDIR (or /tmp); removed by tu_rmdir. */
char *tu_mkdtemp(void);
/* rm -rf path, then free(path). */
void tu_rmdir(char *path);

/* Opens an engine from a YAML string; fails the test on error. */
kv_engine *tu_open_yaml(const char *yaml);
/* Same, with printf-style formatting of the YAML. */
kv_engine *tu_open_yamlf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A deterministic block id from a number (and a salt). */
kv_block_id tu_id(uint64_t n, uint64_t salt);
/* Fills buf with bytes derived from (seed, offset); tu_check_fill verifies. */
void tu_fill(void *buf, size_t len, uint64_t seed);
int  tu_check_fill(const void *buf, size_t len, uint64_t seed);

/* Dumps/loads one single-iov shard and waits; returns the task's result. */
int tu_dump1(kv_engine *e, kv_block_id id, uint32_t index, const void *buf, size_t len);
int tu_load1(kv_engine *e, kv_block_id id, uint32_t index, void *buf, size_t len);

/* Directory holding the built programs ($KV_BUILD, else "build"). */
const char *tu_build_dir(void);

/* Milliseconds on the monotonic clock. */
uint64_t tu_now_ms(void);

/* A loopback TCP port free just now (bind 0, read it back, close). */
unsigned tu_free_port(void);

/* Starts argv[0] with stdout and stderr appended to log; the child is
 * killed by the kernel should the test process die first
 * (PR_SET_PDEATHSIG). The caller stops it (kill + waitpid). */
pid_t tu_spawn(char *const argv[], const char *log);

/* SIGSTOP to pid, returning once every one of its threads has stopped
 * (fails the test after 5 s). kill() only queues the signal: the process
 * stops when the thread it went to next runs, and until then its other
 * threads go on serving (a node "hung" this way answered the test's
 * lookups in time, about one run in ten on a loaded 2-core machine). */
void tu_stop(pid_t pid);

/* n shards of len bytes for dump/load round trips: blocks 0..n/2 (salt),
 * shard index i % 2, each shard two iovecs on the source side and two
 * differently cut on the destination side (the copy paths must handle
 * scatter/gather). src and dst are n * len bytes. */
struct tu_set {
    size_t n, len;
    uint8_t *src, *dst;
    kv_iov *siov, *diov;
    kv_shard *dump, *load;
};
struct tu_set tu_set_new(size_t n, size_t len, uint64_t salt);
void tu_set_free(struct tu_set *s);
/* Dumps (dump nonzero) or loads sh[0..n) as one task and waits (10 s). */
int tu_task(kv_engine *e, int dump, const kv_shard *sh, size_t n);

/* Quiet tests (testutil_capture.c): every TCase gets, first, a checked
 * fixture that sends the test's stderr (the engine's log, the children that
 * inherit it) to a file of its own; the runner prints the files of the
 * tests that failed, and KV_TEST_LOUD=1 turns the capture off. */
#include <stdbool.h>
TCase *tu_tcase_create(const char *name);
#define tcase_create(name) tu_tcase_create(name)
void tu_capture_begin(void);          /* the runner, before it runs */
void tu_capture_end(SRunner *sr);     /* the runner, after: prints failures' logs */
/* What this test has written to stderr so far (malloc'd, NUL-terminated),
 * so a test asserts on a warning it expects instead of printing it. */
char *tu_capture_text(void);
/* Whether the capture holds needle (true when not capturing). */
bool tu_capture_has(const char *needle);

#endif
