/*
 * check_tomb.c — the tombstones a member keeps of the plain keys removed
 * there (net/tomb.c): which copies they refuse, what a write clears, how
 * they expire, and that the memory they take is bounded without ever
 * admitting a copy the table can no longer judge.
 *
 * Times are given, never read: T0 is the table's creation, M the margin.
 */
#include <stdlib.h>
#include <string.h>

#include "net/tomb.h"
#include "testutil.h"

#define T0 1000000u
#define M KV__TOMB_SKEW_MS
#define TTL 30000u

static struct kv__tomb *fresh(size_t cap)
{
    struct kv__tomb *t;
    ck_assert_int_eq(kv__tomb_new(cap, TTL, T0, &t), KV_OK);
    return t;
}

static int admit(struct kv__tomb *t, uint64_t key, uint64_t stamp, uint64_t now)
{
    kv_block_id id = tu_id(key, 71);
    return kv__tomb_admit(t, &id, stamp, NULL, NULL, now);
}

static void rm(struct kv__tomb *t, uint64_t key, uint64_t now)
{
    kv_block_id id = tu_id(key, 71);
    kv__tomb_remove(t, &id, now);
}

/* A table knows no remove before its creation: a copy read before it (or
 * within the margin after) is refused, a later one admitted, and a copy
 * with no stamp (0) never. */
START_TEST(copies_older_than_the_table_are_refused)
{
    struct kv__tomb *t = fresh(64);
    ck_assert_int_eq(admit(t, 1, T0 - 5000, T0 + 10), KV_EBUSY);
    ck_assert_int_eq(admit(t, 1, T0 + M, T0 + 10), KV_EBUSY);
    ck_assert_int_eq(admit(t, 1, T0 + M + 1, T0 + M + 2), KV_OK);
    ck_assert_int_eq(admit(t, 1, 0, T0 + M + 2), KV_EBUSY);
    struct kv__tomb_stats st;
    kv__tomb_stats(t, T0 + 1, &st);
    ck_assert_uint_eq(st.horizon_ms, T0);
    ck_assert_uint_eq(st.keys + st.prefixes + st.all, 0);
    kv__tomb_free(t);
}
END_TEST

/* A removed key refuses the copies read before its tombstone (and up to
 * the margin after); other keys, and copies read later, are admitted. */
START_TEST(a_remove_refuses_older_copies_of_its_key)
{
    struct kv__tomb *t = fresh(64);
    uint64_t at = T0 + 10000;
    rm(t, 7, at);
    ck_assert_int_eq(admit(t, 7, at - 3000, at + 5), KV_EBUSY);   /* read before */
    ck_assert_int_eq(admit(t, 7, at + M, at + 5), KV_EBUSY);      /* skew: maybe before */
    ck_assert_int_eq(admit(t, 7, at + M + 1, at + M + 5), KV_OK); /* read after */
    ck_assert_int_eq(admit(t, 8, at - 3000, at + 5), KV_OK);      /* another key */
    /* removed again later: the later tombstone counts */
    rm(t, 7, at + 4000);
    ck_assert_int_eq(admit(t, 7, at + 3000, at + 4001), KV_EBUSY);
    struct kv__tomb_stats st;
    kv__tomb_stats(t, at + 4001, &st);
    ck_assert_uint_eq(st.keys, 1);
    kv__tomb_free(t);
}
END_TEST

/* A client's write of a removed key clears its tombstone: copies are
 * judged by the horizon alone again; the other keys' stay. */
START_TEST(a_write_clears_the_tombstone)
{
    struct kv__tomb *t = fresh(64);
    uint64_t at = T0 + 10000;
    rm(t, 7, at);
    rm(t, 9, at);
    kv_block_id id = tu_id(7, 71);
    kv__tomb_put(t, &id);
    ck_assert_int_eq(admit(t, 7, at - 3000, at + 5), KV_OK);
    ck_assert_int_eq(admit(t, 9, at - 3000, at + 5), KV_EBUSY);
    kv__tomb_put(t, &id);   /* twice, or a key never removed: nothing */
    id = tu_id(100, 71);
    kv__tomb_put(t, &id);
    struct kv__tomb_stats st;
    kv__tomb_stats(t, at + 5, &st);
    ck_assert_uint_eq(st.keys, 1);
    /* its old ring entry, forgotten later, finds nothing to drop */
    kv__tomb_stats(t, at + TTL, &st);
    ck_assert_uint_eq(st.keys, 0);
    ck_assert_uint_eq(st.horizon_ms, at);
    kv__tomb_free(t);
}
END_TEST

/* After ttl a tombstone is forgotten, and the horizon passes it: a copy
 * read before it is still refused (the table cannot say), a newer one is
 * admitted. */
START_TEST(tombstones_expire_and_move_the_horizon)
{
    struct kv__tomb *t = fresh(64);
    uint64_t at = T0 + 10000;
    rm(t, 7, at);
    rm(t, 8, at + 1000);
    struct kv__tomb_stats st;
    kv__tomb_stats(t, at + TTL - 1, &st);
    ck_assert_uint_eq(st.keys, 2);
    ck_assert_uint_eq(st.horizon_ms, T0);
    kv__tomb_stats(t, at + TTL, &st);
    ck_assert_uint_eq(st.keys, 1);
    ck_assert_uint_eq(st.horizon_ms, at);
    uint64_t now = at + TTL + 500;
    ck_assert_int_eq(admit(t, 7, at - 1, now), KV_EBUSY);
    ck_assert_int_eq(admit(t, 99, at + M, now), KV_EBUSY);   /* any key: the horizon */
    ck_assert_int_eq(admit(t, 7, at + M + 1, now), KV_OK);
    ck_assert_int_eq(admit(t, 8, at + M + 1, now), KV_EBUSY);
    kv__tomb_stats(t, at + TTL + 1000, &st);
    ck_assert_uint_eq(st.keys, 0);
    ck_assert_uint_eq(st.horizon_ms, at + 1000);
    kv__tomb_free(t);
}
END_TEST

/* Memory is bounded: past cap, the oldest tombstones make room, and the
 * horizon passes each one dropped; the newest cap are still judged by
 * key. The clock stepping back does not reorder them. */
START_TEST(tombstones_are_bounded)
{
    struct kv__tomb *t = fresh(16);
    uint64_t at = T0 + 10000;
    for (uint64_t i = 0; i < 1000; i++)
        rm(t, i, at + i);
    struct kv__tomb_stats st;
    kv__tomb_stats(t, at + 1000, &st);
    ck_assert_uint_eq(st.keys, 16);
    ck_assert_uint_eq(st.horizon_ms, at + 983);   /* the last one pushed out */
    /* key 990 is known (removed at at + 990); key 5 is not, the horizon
     * refuses its old copy and any other's */
    ck_assert_int_eq(admit(t, 990, at + 983 + M + 1, at + 1000), KV_EBUSY);
    ck_assert_int_eq(admit(t, 5, at + 983 + M + 1, at + 1000), KV_OK);
    ck_assert_int_eq(admit(t, 5, at + 983 + M, at + 1000), KV_EBUSY);
    ck_assert_int_eq(admit(t, 990, at + 990 + M + 1, at + 1000), KV_OK);
    /* a clock that steps back: the tombstone is dated the newest time */
    rm(t, 2000, at);
    ck_assert_int_eq(admit(t, 2000, at + 999 + M, at + 1000), KV_EBUSY);
    /* the same key removed over and over takes one slot, and its older
     * ring entries move the horizon only */
    for (uint64_t i = 0; i < 100; i++)
        rm(t, 3000, at + 2000 + i);
    kv__tomb_stats(t, at + 2100, &st);
    ck_assert_uint_le(st.keys, 16);
    ck_assert_int_eq(admit(t, 3000, at + 2099 + M, at + 2100), KV_EBUSY);
    kv__tomb_free(t);
}
END_TEST

static int match_even(void *arg, uint32_t plen, const kv_block_id *hash)
{
    (void)hash;
    *(int *)arg += 1;
    return plen % 2 == 0;
}

/* Every key's tombstone refuses every older copy; a prefix's refuses the
 * older copies whose key begins with it, as match says (a copy that
 * cannot say, NULL, is refused); prefixes are bounded like keys. */
START_TEST(clears_refuse_by_prefix)
{
    struct kv__tomb *t = fresh(64);
    uint64_t at = T0 + 10000;
    kv_block_id h = tu_id(1, 72), id = tu_id(5, 71);
    kv__tomb_clear(t, 3, &h, at);
    int asked = 0;
    ck_assert_int_eq(kv__tomb_admit(t, &id, at - 10, match_even, &asked, at + 1), KV_OK);
    ck_assert_int_eq(asked, 1);
    kv__tomb_clear(t, 4, &h, at);
    ck_assert_int_eq(kv__tomb_admit(t, &id, at - 10, match_even, &asked, at + 1), KV_EBUSY);
    ck_assert_int_eq(kv__tomb_admit(t, &id, at - 10, NULL, NULL, at + 1), KV_EBUSY);
    /* a copy read after them is not asked */
    asked = 0;
    ck_assert_int_eq(kv__tomb_admit(t, &id, at + M + 1, match_even, &asked, at + M + 2), KV_OK);
    ck_assert_int_eq(asked, 0);
    /* every key */
    kv__tomb_clear(t, 0, &h, at + 5000);
    ck_assert_int_eq(kv__tomb_admit(t, &id, at + 4000, match_even, &asked, at + 5001), KV_EBUSY);
    ck_assert_int_eq(kv__tomb_admit(t, &id, at + 5000 + M + 1, NULL, NULL, at + 7000), KV_OK);
    struct kv__tomb_stats st;
    kv__tomb_stats(t, at + 7000, &st);
    ck_assert_uint_eq(st.prefixes, 2);
    ck_assert_uint_eq(st.all, 1);
    /* the same prefix again takes no room; many others push the oldest out */
    kv__tomb_clear(t, 4, &h, at + 8000);
    for (uint64_t i = 0; i < KV__TOMB_PREFIXES + 10; i++) {
        kv_block_id p = tu_id(100 + i, 72);
        kv__tomb_clear(t, 5, &p, at + 9000 + i);
    }
    kv__tomb_stats(t, at + 20000, &st);
    ck_assert_uint_eq(st.prefixes, KV__TOMB_PREFIXES);
    ck_assert_uint_eq(st.horizon_ms, at + 9000 + 9);   /* 3, 4, then 100..109 went */
    /* and they expire, every key's too */
    kv__tomb_stats(t, at + 9000 + KV__TOMB_PREFIXES + 10 + TTL, &st);
    ck_assert_uint_eq(st.prefixes + st.all, 0);
    kv__tomb_free(t);
}
END_TEST

Suite *tomb_suite(void)
{
    Suite *s = suite_create("tomb");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, copies_older_than_the_table_are_refused);
    tcase_add_test(tc, a_remove_refuses_older_copies_of_its_key);
    tcase_add_test(tc, a_write_clears_the_tombstone);
    tcase_add_test(tc, tombstones_expire_and_move_the_horizon);
    tcase_add_test(tc, tombstones_are_bounded);
    tcase_add_test(tc, clears_refuse_by_prefix);
    suite_add_tcase(s, tc);
    return s;
}
