/*
 * modes.c — who may read a store: the modes and group of everything under
 * ssd.path (ssd.group).
 *
 * Without ssd.group a store is its owner's alone: directories 0700, files
 * 0600. With it, directories are 2750 and files 0640 in that group, so a
 * member of the group can read the store (a backup, an inspection) and
 * nobody but the owner can write it; the set-group-ID bit makes every new
 * file and directory inherit the group without a chown.
 *
 * Key design choice: our own files are created with the right mode, but
 * RocksDB's are created by RocksDB (PosixFileSystem opens them 0644, and
 * the C API has no option for that), so a sweep sets them right after the
 * fact: at open, on every maintenance tick, after a compaction, and after
 * close. A umask held around our RocksDB calls was the alternative, and it
 * is not safe here: the umask is the process's, so it would also change
 * the modes of files the application's own threads create meanwhile, and
 * RocksDB creates most of its files (SSTs, WALs, the MANIFEST, its LOG) on
 * its background threads, outside any call of ours. Between its creation
 * and the next sweep (one tick, tune.sync_ms) a new RocksDB file is 0644,
 * and that costs nothing: it lies inside ssd.path, which nobody outside
 * the owner and the group can enter (0700/2750), and the group may read it
 * anyway. Only RocksDB makes files behind our back, all of them at the top
 * of ssd.path, so the tick's sweep looks there alone; the deep one (open,
 * compaction, close) also walks vlog/ and the damaged-* folders, which
 * hold only files we made or moved (a store of 1,000 log files: 4-11 ms
 * deep, 0.1-0.3 ms for the tick's, measured at load average 15 on two
 * cores with an ad-hoc loop (not kept) over kv__ssd_fix_modes on a
 * tree of 0600 files). The sweep never opens a file (closing a
 * descriptor of RocksDB's LOCK file would drop RocksDB's fcntl lock on
 * it) and follows no link: fstatat with AT_SYMLINK_NOFOLLOW, then
 * fchmodat/fchownat by name, in directories only the owner can write.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ssd_int.h"

#define NO_GROUP ((gid_t)-1)

mode_t kv__ssd_dir_mode(gid_t gid) { return gid == NO_GROUP ? 0700 : 02750; }
mode_t kv__ssd_file_mode(gid_t gid) { return gid == NO_GROUP ? 0600 : 0640; }

/* Whether this process may hand its files to gid: its effective group or
 * one of its supplementary groups (as chown(2) asks of an unprivileged
 * user; the same is asked of root, so a config means the same everywhere). */
static bool member_of(gid_t gid)
{
    if (gid == getegid())
        return true;
    int n = getgroups(0, NULL);
    if (n <= 0)
        return false;
    gid_t *g = malloc((size_t)n * sizeof *g);
    bool in = false;
    if (g && (n = getgroups(n, g)) > 0)
        for (int i = 0; i < n && !in; i++)
            in = g[i] == gid;
    free(g);
    return in;
}

/* getgrnam_r / getgrgid_r with a buffer that grows as they ask; *found
 * false when there is no such group. Returns 0 or the errno. */
static int lookup(const char *name, gid_t gid, bool by_name, struct group *gr, char **buf,
                  bool *found)
{
    size_t cap = 1024;
    for (;;) {
        char *nb = realloc(*buf, cap);
        if (!nb)
            return ENOMEM;
        *buf = nb;
        struct group *res = NULL;
        int e = by_name ? getgrnam_r(name, gr, *buf, cap, &res)
                        : getgrgid_r(gid, gr, *buf, cap, &res);
        if (e == ERANGE && cap < (1u << 20)) {
            cap *= 2;
            continue;
        }
        *found = res != NULL;
        return e == ENOENT || e == ESRCH ? 0 : e;
    }
}

int kv__ssd_group(const char *group, gid_t *gid, char *err, size_t errlen)
{
    *gid = NO_GROUP;
    if (!group || !group[0])
        return KV_OK;
    bool numeric = strspn(group, "0123456789") == strlen(group);
    struct group gr;
    char *buf = NULL;
    bool found = false;
    gid_t g = NO_GROUP;
    if (numeric) {
        errno = 0;
        unsigned long v = strtoul(group, NULL, 10);
        if (errno || v >= (unsigned long)NO_GROUP) {
            kv__errf(err, errlen, "ssd.group '%s': not a group id", group);
            return KV_ECONFIG;
        }
        g = (gid_t)v;
        /* A gid with no name is still a group the kernel knows. */
        lookup(NULL, g, false, &gr, &buf, &found);
    } else {
        int e = lookup(group, 0, true, &gr, &buf, &found);
        if (e != 0 || !found) {
            kv__errf(err, errlen, "ssd.group '%s': %s", group,
                     e ? strerror(e) : "no such group (give a group name or a gid)");
            free(buf);
            return KV_ECONFIG;
        }
        g = gr.gr_gid;
    }
    char name[64];
    snprintf(name, sizeof name, "%s", found ? gr.gr_name : group);
    free(buf);
    if (!member_of(g)) {
        kv__errf(err, errlen, "ssd.group '%s' (gid %u): this engine's user (uid %u) is not a "
                 "member of it, so the store cannot be given to that group; add the user to it "
                 "(usermod -aG %s USER, then log in again) or leave ssd.group empty", group,
                 (unsigned)g, (unsigned)geteuid(), name);
        return KV_EPERM;
    }
    *gid = g;
    return KV_OK;
}

/* One entry's owner group and mode, by name under dfd; returns 1 when
 * something was changed. Entries of other users are left alone (we could
 * not change them, and ssd.path refuses to be writable by anyone else). */
static int fix_one(int dfd, const char *name, const struct stat *st, mode_t want, gid_t gid)
{
    if (st->st_uid != geteuid())
        return 0;
    int changed = 0;
    if (gid != NO_GROUP && st->st_gid != gid &&
        fchownat(dfd, name, (uid_t)-1, gid, AT_SYMLINK_NOFOLLOW) == 0)
        changed = 1;
    /* After the chown, which may clear the set-group-ID bit. */
    if ((changed || (st->st_mode & 07777) != want) && fchmodat(dfd, name, want, 0) == 0)
        changed = 1;
    return changed;
}

static size_t fix_dir(int dfd, gid_t gid, int depth, int max)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    size_t changed = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;   /* gone meanwhile (RocksDB deletes obsolete files) */
        if (S_ISREG(st.st_mode)) {
            changed += (size_t)fix_one(dirfd(d), de->d_name, &st, kv__ssd_file_mode(gid), gid);
        } else if (S_ISDIR(st.st_mode)) {
            changed += (size_t)fix_one(dirfd(d), de->d_name, &st, kv__ssd_dir_mode(gid), gid);
            int sub = depth < max ? openat(dirfd(d), de->d_name,
                                           O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
            if (sub >= 0)
                changed += fix_dir(sub, gid, depth + 1, max);
        }
    }
    closedir(d);
    return changed;
}

size_t kv__ssd_fix_modes(const char *path, gid_t gid, bool deep)
{
    /* ssd.path itself is make_dirs' (ssd.c): checked there, not here. */
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    size_t n = fix_dir(dfd, gid, 0, deep ? 1 : 0);
    if (n)
        KV_DEBUG("ssd: set the mode of %zu files under '%s' to %03o", n, path,
                 (unsigned)kv__ssd_file_mode(gid));
    return n;
}
