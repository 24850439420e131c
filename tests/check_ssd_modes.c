/*
 * check_ssd_modes.c — who may read a store: the modes and group of every
 * file and directory under ssd.path (persist/modes.c, ssd.group; issue 17,
 * "Low": data files were 0644, RocksDB's still were after the first round).
 *
 * Every check stats every entry under ssd.path, RocksDB's files included,
 * at the points where files appear: after writes (with memtables small
 * enough that RocksDB flushes and starts new WALs meanwhile), after a
 * compaction, after close and after a reopen. Without ssd.group:
 * directories 0700, files 0600. With it: 2750 and 0640 in the group, and a
 * process of another user in that group reads every file and writes none
 * (run as root only: it needs setuid).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/config.h"
#include "persist/ssd_int.h"
#include "testutil.h"

#define NOBODY 65534u

/* ssd.path under a fresh directory that any user may traverse (the
 * reader of the group test must reach it), with ssd.group set as given. */
static kv_config *modes_cfg(const char *dir, const char *group)
{
    kv_config *c;
    ck_assert_int_eq(kv_config_new(&c), KV_OK);
    ck_assert_int_eq(chmod(dir, 0711), 0);
    snprintf(c->ssd.path, sizeof c->ssd.path, "%.200s/store", dir);
    c->ssd.compression = KV_COMP_NONE;
    char err[256] = "";
    ck_assert_msg(kv__config_set(c, "ssd.group", group, err, sizeof err) == KV_OK, "%s", err);
    return c;
}

/* Small memtables and value log files: the writes below make RocksDB
 * flush and switch WALs, and the log start new files, while they run. */
static struct kv__ssd *open_small(const kv_config *c)
{
    struct kv__ssd_tuning t;
    kv__ssd_tuning_defaults(&t);
    t.vlog_file_size = 1u << 20;
    t.write_buffer = 64u << 10;
    t.sync_ms = 20;   /* the maintenance tick, which sweeps the modes */
    struct kv__ssd *s = NULL;
    char err[512] = "";
    ck_assert_msg(kv__ssd_open_tuned(c, &t, &s, err, sizeof err) == KV_OK, "open: %s", err);
    return s;
}

static void write_some(struct kv__ssd *s, uint64_t from, uint64_t n)
{
    static uint8_t buf[3000];
    for (uint64_t i = from; i < from + n; i++) {
        tu_fill(buf, sizeof buf, i);
        kv_block_id id = tu_id(i, 3);
        kv_iov iov = { buf, sizeof buf };
        ck_assert_int_eq(kv__ssd_write(s, KV_NS_BLOCK, &id, 0, &iov, 1), KV_OK);
    }
}

/* Every entry under dir (two levels, as the store has) whose mode or group
 * is not the store's, one "path mode gid inode" line each, into out. */
static void wrong_entries(const char *dir, mode_t dmode, mode_t fmode, gid_t gid, char *out,
                          size_t cap, int depth)
{
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "opendir %s: %s", dir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char p[1200];
        snprintf(p, sizeof p, "%.900s/%.250s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) != 0)
            continue;   /* RocksDB deleted it meanwhile */
        ck_assert_msg(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode), "%s: neither file nor dir", p);
        mode_t want = S_ISDIR(st.st_mode) ? dmode : fmode;
        if ((st.st_mode & 07777) != want || (gid != (gid_t)-1 && st.st_gid != gid)) {
            size_t l = strlen(out);
            snprintf(out + l, cap - l, "%s %04o gid %u ino %llu\n", p,
                     (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid,
                     (unsigned long long)st.st_ino);
        }
        if (S_ISDIR(st.st_mode) && depth < 2)
            wrong_entries(p, dmode, fmode, gid, out, cap, depth + 1);
    }
    closedir(d);
}

/* Right now, with nothing running that makes files: ssd.path itself and
 * everything under it has the store's modes. */
static void expect_modes(const char *path, gid_t gid, const char *when)
{
    mode_t dmode = gid == (gid_t)-1 ? 0700 : 02750, fmode = gid == (gid_t)-1 ? 0600 : 0640;
    static char bad[16384];
    bad[0] = '\0';
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    if ((st.st_mode & 07777) != dmode || (gid != (gid_t)-1 && st.st_gid != gid))
        snprintf(bad, sizeof bad, "%s %04o gid %u (ssd.path)\n", path,
                 (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid);
    wrong_entries(path, dmode, fmode, gid, bad, sizeof bad, 0);
    ck_assert_msg(bad[0] == '\0', "%s, not %04o/%04o:\n%s", when, (unsigned)dmode,
                  (unsigned)fmode, bad);
}

/* While the store runs, RocksDB makes files at any moment (0644 until the
 * next sweep: modes.c says why that is harmless). What must hold is that
 * no file keeps a wrong mode across a whole sweep: one seen wrong, still
 * there (same inode) after a sweep that started after it was seen, is a
 * failure. */
static void expect_modes_live(struct kv__ssd *s, const char *path, gid_t gid, const char *when)
{
    mode_t dmode = gid == (gid_t)-1 ? 0700 : 02750, fmode = gid == (gid_t)-1 ? 0600 : 0640;
    static char before[16384], now[16384];
    before[0] = '\0';
    for (int round = 0; round < 50; round++) {
        uint64_t n = atomic_load(&s->mode_sweeps);
        /* Two more: the one running now may have passed a new file by. */
        for (int i = 0; i < 30000 && atomic_load(&s->mode_sweeps) < n + 2; i++)
            usleep(1000);
        ck_assert_msg(atomic_load(&s->mode_sweeps) >= n + 2, "the maintenance thread stopped");
        now[0] = '\0';
        wrong_entries(path, dmode, fmode, gid, now, sizeof now, 0);
        if (!now[0])
            return;
        for (char *l = now; *l; l = strchr(l, '\n') + 1) {
            char line[1400];
            size_t len = (size_t)(strchr(l, '\n') - l);
            snprintf(line, sizeof line, "%.*s\n", (int)len, l);
            ck_assert_msg(!strstr(before, line), "%s: kept a wrong mode across a sweep: %s",
                          when, line);
        }
        snprintf(before, sizeof before, "%s", now);
    }
    ck_abort_msg("%s: files kept appearing with wrong modes:\n%s", when, now);
}

/* The whole life of a store: writes, compaction, close, reopen. */
static void store_life(kv_config *c, gid_t gid)
{
    struct kv__ssd *s = open_small(c);
    expect_modes(c->ssd.path, gid, "after open");
    write_some(s, 0, 3000);   /* ~9 MiB: 9 log files; ~250 KiB of pointers */
    expect_modes_live(s, c->ssd.path, gid, "after writes");
    ck_assert_int_eq(kv__ssd_compact(s), KV_OK);   /* flushes the memtable, then compacts */
    expect_modes(c->ssd.path, gid, "after a compaction");
    write_some(s, 3000, 500);
    kv__ssd_close(s);
    expect_modes(c->ssd.path, gid, "after close");
    s = open_small(c);
    expect_modes(c->ssd.path, gid, "after a reopen");
    uint8_t buf[3000];
    kv_block_id id = tu_id(3100, 3);
    kv_iov iov = { buf, sizeof buf };
    ck_assert_int_eq(kv__ssd_read(s, KV_NS_BLOCK, &id, 0, &iov, 1), KV_OK);
    ck_assert(tu_check_fill(buf, sizeof buf, 3100));
    kv__ssd_close(s);
    expect_modes(c->ssd.path, gid, "after the second close");
}

/* Before: RocksDB's files (CURRENT, MANIFEST-*, *.sst, *.log, LOG, LOCK,
 * OPTIONS-*) were 0644. */
START_TEST(private_store_every_file_0600)
{
    char *dir = tu_mkdtemp();
    kv_config *c = modes_cfg(dir, "");
    store_life(c, (gid_t)-1);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* ssd.group set to a group this user is in (its own primary group, by
 * name): 2750 and 0640 in that group everywhere. */
START_TEST(group_store_every_file_0640)
{
    char *dir = tu_mkdtemp();
    struct group *gr = getgrgid(getegid());
    char name[64];
    snprintf(name, sizeof name, "%s", gr ? gr->gr_name : "0");
    kv_config *c = modes_cfg(dir, name);
    store_life(c, getegid());
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* A store made private, then opened with ssd.group (by gid), then without
 * it again: each open brings every existing file to its modes. */
START_TEST(group_added_and_removed)
{
    char *dir = tu_mkdtemp();
    kv_config *c = modes_cfg(dir, "");
    struct kv__ssd *s = open_small(c);
    write_some(s, 0, 200);
    kv__ssd_close(s);
    expect_modes(c->ssd.path, (gid_t)-1, "private");
    char gid[16];
    snprintf(gid, sizeof gid, "%u", (unsigned)getegid());
    ck_assert_int_eq(kv_config_set(c, "ssd.group", gid), KV_OK);
    s = open_small(c);
    kv__ssd_close(s);
    expect_modes(c->ssd.path, getegid(), "given to the group");
    ck_assert_int_eq(kv_config_set(c, "ssd.group", ""), KV_OK);
    s = open_small(c);
    kv__ssd_close(s);
    expect_modes(c->ssd.path, (gid_t)-1, "private again");
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* A group that does not exist, and one this user is not a member of, are
 * refused at open with a message that names them; nothing is created. */
START_TEST(group_refused)
{
    char *dir = tu_mkdtemp();
    kv_config *c = modes_cfg(dir, "kvengine-no-such-group");
    struct kv__ssd *s = NULL;
    char err[512] = "";
    ck_assert_int_eq(kv__ssd_open(c, &s, err, sizeof err), KV_ECONFIG);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(err, "kvengine-no-such-group") && strstr(err, "no such group"), "%s", err);

    /* A group we are not in: any from the group database. */
    gid_t mine[256];
    int n = getgroups(256, mine);
    struct group *gr;
    char other[64] = "";
    setgrent();
    while (!other[0] && (gr = getgrent())) {
        bool in = gr->gr_gid == getegid();
        for (int i = 0; i < n && !in; i++)
            in = mine[i] == gr->gr_gid;
        if (!in)
            snprintf(other, sizeof other, "%s", gr->gr_name);
    }
    endgrent();
    if (other[0]) {
        ck_assert_int_eq(kv_config_set(c, "ssd.group", other), KV_OK);
        err[0] = '\0';
        ck_assert_int_eq(kv__ssd_open(c, &s, err, sizeof err), KV_EPERM);
        ck_assert_ptr_null(s);
        ck_assert_msg(strstr(err, other) && strstr(err, "not a member"), "%s", err);
        struct stat st;
        ck_assert_msg(stat(c->ssd.path, &st) != 0, "the refused open created ssd.path");
        kv_engine *e = NULL;
        ck_assert_int_eq(kv_open(c, &e), KV_EPERM);
        ck_assert_ptr_null(e);
    }
    /* Names the config refuses outright. */
    ck_assert_int_eq(kv_config_set(c, "ssd.group", "a/b"), KV_ECONFIG);
    ck_assert_int_eq(kv_config_set(c, "ssd.group", "-x"), KV_ECONFIG);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

/* In a child running as another user: 0 when every file under path opens
 * for reading, none opens for writing and nothing can be created, with
 * 'member' (in the group), and opening the store says only its owner may;
 * when not a member, 0 when nothing opens at all. Exits with the number of
 * the first check that failed. */
/* What as_other_user's process checks, as that user: 0 when it may read
 * and not write (member) or not even list the store (outsider), else the
 * code of the first thing that went otherwise. */
static int other_user_checks(const kv_config *c, bool member)
{
    const char *path = c->ssd.path;
    char cmd[1200];
    /* Both levels: ssd.path's files and those in vlog/. */
    const char *subs[] = { "", "/vlog" };
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "%.1000s%s", path, subs[k]);
        DIR *d = opendir(cmd);
        if (!d)
            return member ? 91 : 0;
        if (!member) {
            closedir(d);
            return 92;   /* an outsider listed the store */
        }
        struct dirent *de;
        int files = 0;
        while ((de = readdir(d))) {
            char p[1400];
            snprintf(p, sizeof p, "%.1000s/%.250s", cmd, de->d_name);
            struct stat st;
            if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode))
                continue;
            files++;
            int fd = open(p, O_RDONLY | O_CLOEXEC);
            char b;
            int unreadable = fd < 0 || read(fd, &b, 1) < 0;
            if (fd >= 0)
                close(fd);
            int wfd = unreadable ? -1 : open(p, O_WRONLY | O_CLOEXEC);
            int writable = wfd >= 0 || (!unreadable && errno != EACCES);
            if (wfd >= 0)
                close(wfd);
            if (unreadable || writable) {
                closedir(d);
                return unreadable ? 93 : 94;
            }
        }
        closedir(d);
        if (files == 0)
            return 95;
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "/planted");
        int pfd = open(cmd, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (pfd >= 0 || errno != EACCES) {
            if (pfd >= 0)
                close(pfd);
            return 96;
        }
    }
    struct kv__ssd *s = NULL;
    char err[512] = "";
    if (kv__ssd_open(c, &s, err, sizeof err) != KV_EPERM || !strstr(err, "only the owner"))
        return 97;
    return 0;
}

/* The process as_other_user starts: a fresh exec of this runner, so that
 * nothing of the parent's threads comes with it. A fork of the test's own
 * process (RocksDB's threads running) hung in CI under ASan: the child
 * mallocs, and a lock another thread held at the fork is never released
 * there. KV_TEST_MODES_CHILD is "gid:member:group:path". */
int tu_ssd_modes_child(const char *spec)
{
    unsigned member = 0;
    unsigned long gid = 0;
    int at = 0;
    if (sscanf(spec, "%lu:%u:%n", &gid, &member, &at) != 2 || at == 0)
        return 80;
    const char *group = spec + at, *sep = strchr(group, ':');
    if (!sep)
        return 81;
    char grp[64];
    snprintf(grp, sizeof grp, "%.*s", (int)(sep - group), group);
    kv_config *c;
    char err[256] = "";
    if (kv_config_new(&c) != KV_OK)
        return 82;
    snprintf(c->ssd.path, sizeof c->ssd.path, "%s", sep + 1);
    c->ssd.compression = KV_COMP_NONE;
    if (kv__config_set(c, "ssd.group", grp, err, sizeof err) != KV_OK)
        return 83;
    gid_t g = member ? (gid_t)gid : NOBODY;
    if (setgroups(member ? 1 : 0, &g) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        return 90;
    int rc = other_user_checks(c, member != 0);
    kv_config_free(c);
    return rc;
}

static int as_other_user(const kv_config *c, gid_t gid, bool member)
{
    char spec[1400];
    snprintf(spec, sizeof spec, "%lu:%u:%s:%s", (unsigned long)gid, member ? 1u : 0u,
             c->ssd.group, c->ssd.path);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("KV_TEST_MODES_CHILD", spec, 1);
        char *argv[] = { (char *)"check_kvengine", NULL };
        execv("/proc/self/exe", argv);
        _exit(98);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

/* What the modes are for: another user in the group reads every file
 * (what a backup or an inspection needs) and writes none; a user outside
 * it cannot even list the store. Root only (setuid to nobody). */
START_TEST(group_member_reads_outsider_does_not)
{
    if (geteuid() != 0)
        return;   /* needs setuid; the modes themselves are checked above */
    char *dir = tu_mkdtemp();
    /* A group root is not in would be refused: root's own, gid 0. */
    kv_config *c = modes_cfg(dir, "0");
    struct kv__ssd *s = open_small(c);
    write_some(s, 0, 300);
    ck_assert_int_eq(kv__ssd_compact(s), KV_OK);
    ck_assert_int_eq(as_other_user(c, 0, true), 0);
    ck_assert_int_eq(as_other_user(c, 0, false), 0);
    kv__ssd_close(s);
    ck_assert_int_eq(as_other_user(c, 0, true), 0);
    /* And without ssd.group, the member of that group is an outsider. */
    ck_assert_int_eq(kv_config_set(c, "ssd.group", ""), KV_OK);
    s = open_small(c);
    kv__ssd_close(s);
    ck_assert_int_eq(as_other_user(c, 0, true), 91);
    kv_config_free(c);
    tu_rmdir(dir);
}
END_TEST

Suite *ssd_modes_suite(void)
{
    Suite *s = suite_create("ssd_modes");
    TCase *t = tcase_create("modes");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, private_store_every_file_0600);
    tcase_add_test(t, group_store_every_file_0640);
    tcase_add_test(t, group_added_and_removed);
    tcase_add_test(t, group_refused);
    tcase_add_test(t, group_member_reads_outsider_does_not);
    suite_add_tcase(s, t);
    return s;
}
