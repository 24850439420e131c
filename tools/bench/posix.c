/*
 * posix.c — the benchmark's "posix" backend: UCM's Posix store layout,
 * one file per block, for comparison with kvengine. It exists only here.
 *
 * The layout, reproduced exactly: block id -> 32 lowercase hex characters;
 * the file is {root}/{first 3 hex}/{32 hex} (so 4096 possible directories,
 * made on first use); a block is written as {root}/{dir}/{hex}.tmp (here
 * .tmp.{writer's thread id}, so that concurrent dumps of one block do not
 * share a file) and rename()d to its final name when its last shard has
 * landed; lookup is
 * access(); a read is open + read; no fsync, no checksum.
 *
 * Key design choice: calls are synchronous on the job thread that makes
 * them, like UCM's Posix store worker doing one block at a time; concurrency
 * comes from --numjobs. Shard i of a block lives at offset i * value_size
 * of the block's file; the shards of one block that arrive together in a
 * batch (the trace replay's --shards K) are written into one temporary
 * file renamed once, and a single-shard block is one file per write.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

struct posix_store {
    char *root;
    uint64_t value_size;
    uint64_t open_ns;
};

/* "{root}/{3 hex}/{32 hex}{suffix}" */
static void block_path(const struct posix_store *p, const kv_block_id *id, const char *suffix,
                       char *buf, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    char h[2 * KV_BLOCK_ID_LEN + 1];
    for (int i = 0; i < KV_BLOCK_ID_LEN; i++) {
        h[2 * i] = hex[id->bytes[i] >> 4];
        h[2 * i + 1] = hex[id->bytes[i] & 15];
    }
    h[2 * KV_BLOCK_ID_LEN] = '\0';
    snprintf(buf, cap, "%s/%.3s/%s%s", p->root, h, h, suffix);
}

static int err_from_errno(int e)
{
    switch (e) {
    case ENOENT: return KV_ENOTFOUND;
    case ENOSPC: case EDQUOT: return KV_ENOSPC;
    case ENOMEM: return KV_ENOMEM;
    case EACCES: case EPERM: case EROFS: return KV_EPERM;
    default: return KV_EIO;
    }
}

static int posix_open(const struct kvctl_open_args *a, void **st)
{
    uint64_t t0 = kvctl_now_ns();
    *st = NULL;
    if (!a->dir)
        return KV_EINVAL;
    struct posix_store *p = calloc(1, sizeof *p);
    if (!p || !(p->root = strdup(a->dir))) {
        free(p);
        return KV_ENOMEM;
    }
    if (mkdir(p->root, 0755) != 0 && errno != EEXIST) {
        int rc = err_from_errno(errno);
        free(p->root);
        free(p);
        return rc;
    }
    p->value_size = a->value_size;
    p->open_ns = kvctl_now_ns() - t0;
    *st = p;
    return KV_OK;
}

static void posix_close(void *st)
{
    struct posix_store *p = st;
    if (!p)
        return;
    free(p->root);
    free(p);
}

/* Writes all of iov at off: one pwritev (one syscall per block, like UCM's
 * single write of a contiguous block), then plain writes for any rest. */
static int write_all(int fd, const kv_iov *iov, uint32_t cnt, off_t off)
{
    struct iovec v[16];
    uint32_t nv = cnt < 16 ? cnt : 16;
    size_t want = 0;
    for (uint32_t i = 0; i < nv; i++) {
        v[i].iov_base = iov[i].base;
        v[i].iov_len = iov[i].len;
        want += iov[i].len;
    }
    ssize_t w;
    do
        w = pwritev(fd, v, (int)nv, off);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        return err_from_errno(errno);
    size_t skip = (size_t)w;
    off += w;
    if ((size_t)w == want && nv == cnt)
        return KV_OK;
    for (uint32_t i = 0; i < cnt; i++) {
        if (skip >= iov[i].len) {
            skip -= iov[i].len;
            continue;
        }
        const char *b = (const char *)iov[i].base + skip;
        size_t left = iov[i].len - skip;
        skip = 0;
        while (left > 0) {
            w = pwrite(fd, b, left, off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return err_from_errno(w < 0 ? errno : EIO);
            b += w;
            left -= (size_t)w;
            off += w;
        }
    }
    return KV_OK;
}

/* Writes shards s[0..n) of one block into its temporary file, each at
 * index * value_size, and renames the file into place after the last: a
 * block appears whole or not at all, as in UCM's Posix store. */
static int put_block(struct posix_store *p, const kv_shard *s, size_t n)
{
    char tmp[4096], dst[4096], suffix[32];
    /* The writer's thread id in the temporary name: two jobs dumping the
     * same block at once (two requests that missed on the same prefix)
     * must not write into one file; each renames a whole copy into place. */
    snprintf(suffix, sizeof suffix, ".tmp.%ld", (long)gettid());
    block_path(p, &s->block, suffix, tmp, sizeof tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {
        /* First block in this directory: make it ({root}/{3 hex}). */
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(tmp, '/') - tmp), tmp);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return err_from_errno(errno);
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    if (fd < 0)
        return err_from_errno(errno);
    int rc = KV_OK;
    for (size_t i = 0; i < n && rc == KV_OK; i++)
        rc = write_all(fd, s[i].iov, s[i].iovcnt, (off_t)s[i].index * (off_t)p->value_size);
    if (close(fd) != 0 && rc == KV_OK)
        rc = err_from_errno(errno);
    if (rc == KV_OK) {
        block_path(p, &s->block, "", dst, sizeof dst);
        if (rename(tmp, dst) != 0)
            rc = err_from_errno(errno);
    }
    if (rc != KV_OK)
        unlink(tmp);
    return rc;
}

/* A batch's consecutive shards of one block (the trace replay dumps every
 * shard of a block together) go into one file; a block's shards spread
 * over several batches would each replace the file. */
static int posix_put(void *st, const kv_shard *s, size_t n, int *res)
{
    for (size_t i = 0; i < n;) {
        size_t k = i + 1;
        while (k < n && memcmp(&s[k].block, &s[i].block, sizeof s[i].block) == 0)
            k++;
        int rc = put_block(st, &s[i], k - i);
        for (; i < k; i++)
            res[i] = rc;
    }
    return KV_OK;
}

static int get_one(struct posix_store *p, const kv_shard *s)
{
    char path[4096];
    block_path(p, &s->block, "", path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_from_errno(errno);
    off_t off = (off_t)s->index * (off_t)p->value_size;
    int rc = KV_OK;
    for (uint32_t i = 0; i < s->iovcnt && rc == KV_OK; i++) {
        char *b = s->iov[i].base;
        size_t left = s->iov[i].len;
        while (left > 0) {
            ssize_t r = pread(fd, b, left, off);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                /* A short file is a torn block: UCM would hand it out; we
                 * at least say so. */
                rc = r < 0 ? err_from_errno(errno) : KV_ECORRUPT;
                break;
            }
            b += r;
            left -= (size_t)r;
            off += r;
        }
    }
    close(fd);
    return rc;
}

static int posix_get(void *st, const kv_shard *s, size_t n, int *res)
{
    for (size_t i = 0; i < n; i++)
        res[i] = get_one(st, &s[i]);
    return KV_OK;
}

static int posix_lookup(void *st, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    char path[4096];
    for (size_t i = 0; i < n; i++) {
        block_path(st, &ids[i], "", path, sizeof path);
        hit[i] = access(path, F_OK) == 0;
    }
    return KV_OK;
}

/* UCM's lookup_on_prefix over files: access() block by block, stopping at
 * the first miss. */
static ssize_t posix_lookup_prefix(void *st, const kv_block_id *ids, size_t n)
{
    char path[4096];
    for (size_t i = 0; i < n; i++) {
        block_path(st, &ids[i], "", path, sizeof path);
        if (access(path, F_OK) != 0)
            return (ssize_t)i - 1;
    }
    return (ssize_t)n - 1;
}

static void posix_info(void *st, struct kvctl_backend_info *out)
{
    struct posix_store *p = st;
    *out = (struct kvctl_backend_info){ .open_ns = p->open_ns };
}

const struct kvctl_backend kvctl_backend_posix = {
    .name = "posix",
    .open = posix_open,
    .close = posix_close,
    .put = posix_put,
    .get = posix_get,
    .lookup = posix_lookup,
    .info = posix_info,
    .lookup_prefix = posix_lookup_prefix,
};
