/*
 * check_main.c — the one test runner.
 *
 * Each module's suite lives in tests/check_<module>.c and exports
 * Suite *<module>_suite(void), listed in TU_SUITES (testutil.h). They are
 * declared weak so that a suite
 * is run exactly when its file is built in. CK_RUN_SUITE / CK_RUN_CASE
 * (Check's own variables) select a part; CK_FORK=no runs in one process.
 * Tests run quiet: each one's stderr is captured (testutil_capture.c) and
 * printed after the summary only for the tests that failed.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

int main(void)
{
    const char *child = getenv("KV_TEST_MODES_CHILD");
    if (child && tu_ssd_modes_child)
        return tu_ssd_modes_child(child);
    SRunner *sr = srunner_create(NULL);
    int added = 0;
#define ADD(name)                                                             \
    if (name##_suite) {                                                       \
        srunner_add_suite(sr, name##_suite());                                \
        added++;                                                              \
    }
    TU_SUITES(ADD)
#undef ADD
    if (added == 0) {
        fprintf(stderr, "check_kvengine: no suites built in\n");
        srunner_free(sr);
        return EXIT_FAILURE;
    }
    tu_capture_begin();
    srunner_run_all(sr, CK_NORMAL);
    tu_capture_end(sr);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
