/*
 * check_main.c — the one test runner.
 *
 * Each module's suite lives in tests/check_<module>.c and exports
 * Suite *<module>_suite(void). They are declared weak here so that a suite
 * is run exactly when its file is built in. CK_RUN_SUITE / CK_RUN_CASE
 * (Check's own variables) select a part; CK_FORK=no runs in one process.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#define SUITES(X) X(errors) X(config) X(segment) X(alloc) X(index) X(engine) \
    X(task) X(evict) X(kv) X(concurrency) X(persist) X(spill) X(crash)    \
    X(proto) X(tcp) X(rdma) X(cluster) X(tools)

#define DECLARE(name) Suite *name##_suite(void) __attribute__((weak));
SUITES(DECLARE)
#undef DECLARE

int main(void)
{
    SRunner *sr = srunner_create(NULL);
    int added = 0;
#define ADD(name)                                                             \
    if (name##_suite) {                                                       \
        srunner_add_suite(sr, name##_suite());                                \
        added++;                                                              \
    }
    SUITES(ADD)
#undef ADD
    if (added == 0) {
        fprintf(stderr, "check_kvengine: no suites built in\n");
        srunner_free(sr);
        return EXIT_FAILURE;
    }
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
