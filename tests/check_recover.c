/*
 * check_recover.c — the SSD tier survives damage below it: RocksDB's own
 * files lost or corrupt, a bit flipped in its WAL, a full file system at
 * open, and a full disk under a replacing put. The value log is the source
 * of truth (persist/vlog.c): every test here damages what lies beside it
 * and checks that no value the log holds is lost and no acknowledged
 * write is rolled back.
 *
 * Tests that need a small file system mount a tmpfs (root); they are
 * skipped, saying so, where that is refused.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/config.h"
#include "persist/ssd_int.h"
#include "testutil.h"

static kv_config *cfg_for(const char *dir, const char *pipeline)
{
    kv_config *c;
    char err[256];
    ck_assert_int_eq(kv_config_new(&c), KV_OK);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "pipeline: \"%s\"\ndram: { capacity: 32MiB, shards: 4 }\n"
             "ssd: { path: \"%s\", capacity: 1GiB }\nio: { threads: 2 }\n", pipeline, dir);
    ck_assert_msg(kv_config_parse(c, yaml, strlen(yaml), err, sizeof err) == KV_OK, "%s", err);
    return c;
}

static struct kv__ssd *open_tier(const kv_config *c)
{
    struct kv__ssd *s = NULL;
    char err[512] = "";
    ck_assert_msg(kv__ssd_open(c, &s, err, sizeof err) == KV_OK, "open: %s", err);
    return s;
}

static int put(struct kv__ssd *s, uint64_t n, size_t len)
{
    void *b = malloc(len);
    tu_fill(b, len, n);
    kv_block_id id = tu_id(n, 7);
    kv_iov iov = { b, len };
    int rc = kv__ssd_write(s, KV_NS_BLOCK, &id, 0, &iov, 1);
    free(b);
    return rc;
}

/* KV_OK with the right bytes, or the read's error; a wrong byte fails. */
static int get(struct kv__ssd *s, uint64_t n, size_t len)
{
    void *b = malloc(len);
    kv_block_id id = tu_id(n, 7);
    kv_iov iov = { b, len };
    int rc = kv__ssd_read(s, KV_NS_BLOCK, &id, 0, &iov, 1);
    if (rc == KV_OK)
        ck_assert_msg(tu_check_fill(b, len, n), "value %llu came back wrong", (unsigned long long)n);
    free(b);
    return rc;
}

static uint64_t recovered(struct kv__ssd *s)
{
    struct kv__ssd_info inf;
    kv__ssd_info(s, &inf);
    return inf.recovered;
}

/* Bytes the value log's files take on disk. */
static uint64_t vlog_bytes(const char *dir)
{
    char vdir[1024];
    snprintf(vdir, sizeof vdir, "%s/vlog", dir);
    DIR *d = opendir(vdir);
    uint64_t total = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[2048];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", vdir, de->d_name);
        if (de->d_name[0] != '.' && stat(p, &st) == 0)
            total += (uint64_t)st.st_blocks * 512;
    }
    if (d)
        closedir(d);
    return total;
}

/* The first file in dir whose name ends with suffix. */
static bool find_suffix(const char *dir, const char *suffix, char *out, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    bool found = false;
    while (d && !found && (de = readdir(d))) {
        size_t n = strlen(de->d_name), k = strlen(suffix);
        if (n > k && strcmp(de->d_name + n - k, suffix) == 0) {
            snprintf(out, len, "%s/%s", dir, de->d_name);
            found = true;
        }
    }
    if (d)
        closedir(d);
    return found;
}

/* Removes every RocksDB file (what a lost disk partition or a careless
 * operator leaves): everything but the value log and the lock. */
static void remove_rocksdb(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.' || strcmp(de->d_name, "vlog") == 0 ||
            strcmp(de->d_name, "KVENGINE.LOCK") == 0)
            continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISREG(st.st_mode))
            ck_assert_int_eq(unlink(p), 0);
    }
    if (d)
        closedir(d);
}

/* Issue 10, item 1: CURRENT lost, then opened twice (a supervisor's restart
 * loop). Before: the first open failed and left a new empty CURRENT, the
 * second opened empty and removed every value log file. */
START_TEST(current_lost_opened_twice)
{
    char *dir = tu_mkdtemp();
    kv_config *c = cfg_for(dir, "ssd");
    struct kv__ssd *s = open_tier(c);
    enum { N = 2000, LEN = 3000 };
    for (uint64_t i = 0; i < N; i++)
        ck_assert_int_eq(put(s, i, LEN), KV_OK);
    kv__ssd_close(s);
    s = open_tier(c);   /* the pointers move from the WAL into an SST */
    kv__ssd_close(s);
    uint64_t before = vlog_bytes(dir);
    char p[1024];
    snprintf(p, sizeof p, "%s/CURRENT", dir);
    ck_assert_int_eq(unlink(p), 0);
    for (int round = 0; round < 2; round++) {
        s = open_tier(c);
        for (uint64_t i = 0; i < N; i++)
            ck_assert_int_eq(get(s, i, LEN), KV_OK);
        ck_assert_uint_eq(recovered(s), round == 0 ? N : 0);
        kv__ssd_close(s);
    }
    ck_assert_uint_ge(vlog_bytes(dir), before * 9 / 10);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* RocksDB's files all gone: the log alone rebuilds the index. Deleted and
 * replaced values must not come back from it: a remove kills the record
 * in place (small records share file system blocks and cannot be punched). */
START_TEST(rocksdb_gone_deleted_stay_deleted)
{
    char *dir = tu_mkdtemp();
    kv_config *c = cfg_for(dir, "ssd");
    kv_engine *e = NULL;
    ck_assert_int_eq(kv_open(c, &e), KV_OK);
    char key[32], val[3000], out[3000];
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        memset(val, 'a' + i % 26, sizeof val);
        ck_assert_int_eq(kv_put(e, key, strlen(key), val, sizeof val), KV_OK);
    }
    for (int i = 0; i < 300; i += 3) {   /* a third replaced, a third removed */
        snprintf(key, sizeof key, "key-%d", i);
        memset(val, 'A' + i % 26, sizeof val);
        ck_assert_int_eq(kv_put(e, key, strlen(key), val, sizeof val), KV_OK);
        snprintf(key, sizeof key, "key-%d", i + 1);
        ck_assert_int_eq(kv_remove(e, key, strlen(key)), KV_OK);
    }
    kv_close(e);
    remove_rocksdb(dir);
    ck_assert_int_eq(kv_open(c, &e), KV_OK);
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        size_t vl = 0;
        int rc = kv_get(e, key, strlen(key), out, sizeof out, &vl);
        if (i % 3 == 1) {
            ck_assert_msg(rc == KV_ENOTFOUND, "removed key %d is back (%s)", i, kv_strerror(rc));
            continue;
        }
        ck_assert_msg(rc == KV_OK, "key %d: %s", i, kv_strerror(rc));
        memset(val, (i % 3 == 0 ? 'A' : 'a') + i % 26, sizeof val);
        ck_assert_msg(vl == sizeof val && memcmp(out, val, vl) == 0, "key %d: older value", i);
    }
    kv_close(e);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* Issue 10, item 4: one flipped bit in RocksDB's WAL. RocksDB drops the
 * records after it without a word; the log still holds their values. */
START_TEST(wal_bit_flip_recovers_from_the_log)
{
    char *dir = tu_mkdtemp();
    kv_config *c = cfg_for(dir, "ssd");
    struct kv__ssd *s = open_tier(c);
    enum { N = 400, LEN = 5000 };
    for (uint64_t i = 0; i < N; i++)
        ck_assert_int_eq(put(s, i, LEN), KV_OK);
    kv__ssd_close(s);   /* with the WAL on, closing does not flush it */
    char wal[1024];
    ck_assert(find_suffix(dir, ".log", wal, sizeof wal));
    int fd = open(wal, O_RDWR);
    ck_assert_int_ge(fd, 0);
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    ck_assert_int_gt(st.st_size, 4096);
    off_t at = st.st_size / 3;
    uint8_t b;
    ck_assert_int_eq(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
    close(fd);
    s = open_tier(c);
    for (uint64_t i = 0; i < N; i++)
        ck_assert_msg(get(s, i, LEN) == KV_OK, "value %llu lost", (unsigned long long)i);
    ck_assert_uint_gt(recovered(s), 0);
    ck_assert_uint_lt(recovered(s), N);
    kv__ssd_close(s);
    /* The pointers re-written: the next open has nothing to recover. */
    s = open_tier(c);
    ck_assert_uint_eq(recovered(s), 0);
    for (uint64_t i = 0; i < N; i++)
        ck_assert_int_eq(get(s, i, LEN), KV_OK);
    kv__ssd_close(s);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* A write whose pointer never reached RocksDB (a crash between the two)
 * is found at the next open; of two copies of one key, the newer wins. */
START_TEST(newer_copy_wins)
{
    char *dir = tu_mkdtemp();
    kv_config *c = cfg_for(dir, "ssd");
    kv_engine *e = NULL;
    ck_assert_int_eq(kv_open(c, &e), KV_OK);
    char v1[4000], v2[4000], out[4000];
    memset(v1, '1', sizeof v1);
    memset(v2, '2', sizeof v2);
    ck_assert_int_eq(kv_put(e, "k", 1, v1, sizeof v1), KV_OK);
    kv_close(e);
    /* Keep the RocksDB holding v1's pointer, write v2, then put the old
     * RocksDB back: its pointer leads to v1's record, which v2's put
     * killed, and v2's record has no pointer. */
    char saved[1100], cmd[4200];
    snprintf(saved, sizeof saved, "%s.saved", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cd '%s' && for f in *; do "
             "[ \"$f\" = vlog ] || [ \"$f\" = KVENGINE.LOCK ] || cp -a \"$f\" '%s'/; done",
             saved, dir, saved);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(kv_open(c, &e), KV_OK);
    ck_assert_int_eq(kv_put(e, "k", 1, v2, sizeof v2), KV_OK);
    kv_close(e);
    remove_rocksdb(dir);
    snprintf(cmd, sizeof cmd, "cp -a '%s'/. '%s'/ && rm -rf '%s'", saved, dir, saved);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(kv_open(c, &e), KV_OK);
    size_t vl = 0;
    ck_assert_int_eq(kv_get(e, "k", 1, out, sizeof out, &vl), KV_OK);
    ck_assert_msg(vl == sizeof v2 && memcmp(out, v2, vl) == 0, "the older value came back");
    kv_close(e);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* kv_ssd_recover (kvctl ssd recover): RocksDB set aside, the index rebuilt
 * from the log, the old files kept. */
START_TEST(recover_call_and_kvctl)
{
    char *dir = tu_mkdtemp();
    kv_config *c = cfg_for(dir, "ssd");
    struct kv__ssd *s = open_tier(c);
    for (uint64_t i = 0; i < 50; i++)
        ck_assert_int_eq(put(s, i, 70000), KV_OK);
    kv__ssd_close(s);
    uint64_t n = 99;
    char err[512] = "";
    ck_assert_msg(kv_ssd_recover(c, &n, err, sizeof err) == KV_OK, "%s", err);
    ck_assert_uint_eq(n, 50);
    /* Busy while open; no SSD tier in a dram config. */
    s = open_tier(c);
    ck_assert_int_eq(kv_ssd_recover(c, &n, err, sizeof err), KV_EBUSY);
    ck_assert_msg(strstr(err, "in use"), "%s", err);
    for (uint64_t i = 0; i < 50; i++)
        ck_assert_int_eq(get(s, i, 70000), KV_OK);
    kv__ssd_close(s);
    kv_config *d = cfg_for(dir, "dram");
    ck_assert_int_eq(kv_ssd_recover(d, &n, err, sizeof err), KV_ENOTSUP);
    ck_assert_int_eq(kv_ssd_recover(NULL, &n, err, sizeof err), KV_EINVAL);
    kv_config_free(d);

    char cmd[4400], out[1100];
    snprintf(out, sizeof out, "%s.out", dir);
    snprintf(cmd, sizeof cmd, "%s/kvctl --set pipeline=ssd --set ssd.path='%s' ssd recover --json > '%s'",
             tu_build_dir(), dir, out);
    ck_assert_int_eq(system(cmd), 0);
    FILE *f = fopen(out, "r");
    ck_assert_ptr_nonnull(f);
    char line[256] = "";
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    fclose(f);
    unlink(out);
    ck_assert_msg(strstr(line, "\"recovered\":50"), "%s", line);
    int sets = 0;
    DIR *dd = opendir(dir);
    struct dirent *de;
    while (dd && (de = readdir(dd)))
        sets += strncmp(de->d_name, "damaged-", 8) == 0;
    closedir(dd);
    ck_assert_int_eq(sets, 2);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* ---- full file systems (tmpfs) ------------------------------------------ */

static bool mount_small(const char *dir, const char *size)
{
    char opt[64];
    snprintf(opt, sizeof opt, "size=%s", size);
    if (mount("tmpfs", dir, "tmpfs", 0, opt) != 0) {
        fprintf(stderr, "recover: full-disk test skipped (mount tmpfs: %s)\n", strerror(errno));
        return false;
    }
    return true;
}

/* Writes a file until the file system is full. */
static void fill(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    static char mib[1 << 16];
    while (write(fd, mib, sizeof mib) > 0)
        ;
    while (write(fd, mib, 512) > 0)
        ;
    close(fd);
}

/* Issue 10, item 3: kv_open on a full file system. Before: RocksDB's LOG
 * writer asserted and the process died (exit 134). Run in a child so that
 * an abort is seen as one. */
START_TEST(open_on_a_full_file_system)
{
    char *dir = tu_mkdtemp();
    if (!mount_small(dir, "16m")) {
        tu_rmdir(dir);
        return;
    }
    char store[1100], fresh[1100], ballast[1100];
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(fresh, sizeof fresh, "%s/fresh", dir);
    snprintf(ballast, sizeof ballast, "%s/ballast", dir);
    kv_config *c = cfg_for(store, "ssd");
    kv_engine *e = NULL;
    ck_assert_int_eq(kv_open(c, &e), KV_OK);
    ck_assert_int_eq(kv_put(e, "k", 1, "v", 1), KV_OK);
    kv_close(e);
    fill(ballast);
    pid_t pid = fork();
    if (pid == 0) {
        kv_engine *ce = NULL;
        int a = kv_open(c, &ce);
        kv_config *f = cfg_for(fresh, "ssd");
        int b = kv_open(f, &ce);
        _exit(a == KV_ENOSPC && b == KV_ENOSPC && ce == NULL ? 0 : 1);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "kv_open on a full file system: %s %d", WIFEXITED(status) ? "exit" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    /* And once there is room again, the store opens with its value. */
    unlink(ballast);
    ck_assert_int_eq(kv_open(c, &e), KV_OK);
    char out[8];
    size_t vl = 0;
    ck_assert_int_eq(kv_get(e, "k", 1, out, sizeof out, &vl), KV_OK);
    ck_assert(vl == 1 && out[0] == 'v');
    kv_close(e);
    kv_config_free(c);
    umount2(dir, MNT_DETACH);
    tu_rmdir(dir);
}
END_TEST

/* Issue 10, item 2: a put that returned OK is never rolled back. Puts of v2
 * over v1 on a full disk, through the DRAM tier; then the disk freed and the
 * store reopened SSD-only. Before: every put said OK and v1 came back. */
START_TEST(acknowledged_put_never_rolls_back)
{
    char *dir = tu_mkdtemp();
    if (!mount_small(dir, "16m")) {
        tu_rmdir(dir);
        return;
    }
    char store[1100], ballast[1100];
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(ballast, sizeof ballast, "%s/ballast", dir);
    enum { N = 2000, V = 3000 };
    char key[32], val[V], out[V];
    kv_config *ssd = cfg_for(store, "ssd"), *both = cfg_for(store, "dram|ssd");
    kv_engine *e = NULL;
    ck_assert_int_eq(kv_open(ssd, &e), KV_OK);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        memset(val, '1', sizeof val);
        ck_assert_int_eq(kv_put(e, key, strlen(key), val, sizeof val), KV_OK);
    }
    kv_close(e);
    ck_assert_int_eq(kv_open(both, &e), KV_OK);
    fill(ballast);
    bool acked[N / 2];
    int nacked = 0;
    for (int i = 0; i < N / 2; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        memset(val, '2', sizeof val);
        acked[i] = kv_put(e, key, strlen(key), val, sizeof val) == KV_OK;
        nacked += acked[i];
    }
    kv_close(e);
    unlink(ballast);
    ck_assert_int_eq(kv_open(ssd, &e), KV_OK);
    int misses = 0;
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        size_t vl = 0;
        int rc = kv_get(e, key, strlen(key), out, sizeof out, &vl);
        if (i < N / 2 && acked[i]) {
            /* v2 was in DRAM only: a miss is allowed, v1 is not. */
            ck_assert_msg(rc == KV_ENOTFOUND || (rc == KV_OK && out[0] == '2'),
                          "key %d: put acknowledged, then read back %s %c", i, kv_strerror(rc),
                          rc == KV_OK ? out[0] : '-');
            misses += rc == KV_ENOTFOUND;
        } else {
            ck_assert_msg(rc == KV_OK && vl == V && out[0] == '1' && out[V - 1] == '1',
                          "key %d: its value was lost (%s)", i, kv_strerror(rc));
        }
    }
    fprintf(stderr, "recover: %d of %d puts on a full disk acknowledged, %d of them read as a miss "
            "after reopening SSD-only\n", nacked, N / 2, misses);
    kv_close(e);
    kv_config_free(ssd);
    kv_config_free(both);
    umount2(dir, MNT_DETACH);
    tu_rmdir(dir);
}
END_TEST

Suite *recover_suite(void)
{
    Suite *s = suite_create("recover");
    TCase *t = tcase_create("rocksdb_damage");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, current_lost_opened_twice);
    tcase_add_test(t, rocksdb_gone_deleted_stay_deleted);
    tcase_add_test(t, wal_bit_flip_recovers_from_the_log);
    tcase_add_test(t, newer_copy_wins);
    tcase_add_test(t, recover_call_and_kvctl);
    suite_add_tcase(s, t);
    t = tcase_create("full_disk");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, open_on_a_full_file_system);
    tcase_add_test(t, acknowledged_put_never_rolls_back);
    suite_add_tcase(s, t);
    return s;
}
