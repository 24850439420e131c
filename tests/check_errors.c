/*
 * check_errors.c — error codes, names and descriptions.
 */
#include <stdio.h>
#include <string.h>

#include "testutil.h"

START_TEST(every_code_has_a_name_and_description)
{
    int codes[] = {
#define X(name, value, desc) KV_##name,
        KV_ERR_MAP(X)
#undef X
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        ck_assert_int_lt(codes[i], 0);
        ck_assert_str_ne(kv_err_name(codes[i]), "UNKNOWN");
        ck_assert_str_ne(kv_strerror(codes[i]), "unknown error");
        for (size_t j = 0; j < i; j++)
            ck_assert_int_ne(codes[i], codes[j]);
    }
    ck_assert_str_eq(kv_err_name(KV_ENOSPC), "ENOSPC");
    ck_assert_str_eq(kv_strerror(KV_OK), "success");
    ck_assert_str_eq(kv_strerror(12345), "unknown error");
}
END_TEST

START_TEST(version_matches_header)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", KV_VERSION_MAJOR, KV_VERSION_MINOR, KV_VERSION_PATCH);
    ck_assert_str_eq(kv_version(), want);
}
END_TEST

Suite *errors_suite(void)
{
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, every_code_has_a_name_and_description);
    tcase_add_test(tc, version_matches_header);
    suite_add_tcase(s, tc);
    return s;
}
