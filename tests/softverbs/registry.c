/*
 * registry.c — the shared table that lets softverbs processes find each
 * other's memory regions and queue pairs.
 *
 * The file is $SOFTVERBS_REGISTRY, else /dev/shm/softverbs-<uid>. It is
 * created on the first ibv_open_device and unlinked by the last
 * ibv_close_device of a run (no live context left). A process that opened
 * the file just before it was unlinked sees a link count of 0 once it holds
 * the lock and opens it again, so two processes never end up in different
 * registries. Entries of processes that died are reclaimed lazily.
 *
 * Locking: fcntl record locks exclude processes but not threads of one
 * process, so a process mutex is taken first.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "softverbs.h"

#define SV_MAGIC 0x31627673766f73ull   /* "sovsvb1" */

struct sv_registry *sv_reg;
static int reg_fd = -1;
static int reg_refs;
static char reg_path[256];
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;

static void file_lock(short type)
{
    struct flock fl = { .l_type = type, .l_whence = SEEK_SET };
    while (fcntl(reg_fd, F_SETLKW, &fl) < 0 && errno == EINTR)
        ;
}

void sv_lock(void)
{
    pthread_mutex_lock(&reg_mu);
    file_lock(F_WRLCK);
}

void sv_unlock(void)
{
    file_lock(F_UNLCK);
    pthread_mutex_unlock(&reg_mu);
}

int sv_pid_alive(int32_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
}

/* Drops every entry of processes that no longer exist. */
static void sweep(void)
{
    for (int i = 0; i < SV_MAX_CTX; i++)
        if (sv_reg->ctx[i].pid && !sv_pid_alive(sv_reg->ctx[i].pid))
            memset(&sv_reg->ctx[i], 0, sizeof sv_reg->ctx[i]);
    for (int i = 0; i < SV_MAX_MR; i++)
        if (sv_reg->mr[i].pid && !sv_pid_alive(sv_reg->mr[i].pid))
            memset(&sv_reg->mr[i], 0, sizeof sv_reg->mr[i]);
    for (int i = 0; i < SV_MAX_QP; i++)
        if (sv_reg->qp[i].pid && !sv_pid_alive(sv_reg->qp[i].pid))
            memset(&sv_reg->qp[i], 0, sizeof sv_reg->qp[i]);
}

static int open_registry(void)
{
    for (int tries = 0; tries < 100; tries++) {
        reg_fd = open(reg_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (reg_fd < 0)
            return errno;
        file_lock(F_WRLCK);
        struct stat st;
        if (fstat(reg_fd, &st) < 0 || st.st_nlink == 0) {
            close(reg_fd);          /* unlinked under us: the lock went with it */
            reg_fd = -1;
            continue;
        }
        if (st.st_size == 0 && ftruncate(reg_fd, sizeof *sv_reg) < 0)
            goto fail;
        if (st.st_size != 0 && st.st_size != (off_t)sizeof *sv_reg) {
            errno = EINVAL;         /* another version's file: do not touch it */
            goto fail;
        }
        sv_reg = mmap(NULL, sizeof *sv_reg, PROT_READ | PROT_WRITE, MAP_SHARED, reg_fd, 0);
        if (sv_reg == MAP_FAILED) {
            sv_reg = NULL;
            goto fail;
        }
        if (sv_reg->magic == 0)
            sv_reg->magic = SV_MAGIC;
        if (sv_reg->magic != SV_MAGIC) {
            munmap(sv_reg, sizeof *sv_reg);
            sv_reg = NULL;
            errno = EINVAL;
            goto fail;
        }
        return 0;     /* still holding the file lock */
fail:;
        int err = errno;
        fprintf(stderr, "softverbs: registry %s: %s\n", reg_path, strerror(err));
        close(reg_fd);
        reg_fd = -1;
        return err;
    }
    return EAGAIN;
}

int sv_attach(uint32_t ctx)
{
    pthread_mutex_lock(&reg_mu);
    if (reg_refs == 0) {
        const char *p = getenv("SOFTVERBS_REGISTRY");
        if (p && *p)
            snprintf(reg_path, sizeof reg_path, "%s", p);
        else
            snprintf(reg_path, sizeof reg_path, "/dev/shm/softverbs-%u", (unsigned)getuid());
        int err = open_registry();
        if (err) {
            pthread_mutex_unlock(&reg_mu);
            return err;
        }
    } else {
        file_lock(F_WRLCK);
    }
    sweep();
    int slot = -1;
    for (int i = 0; i < SV_MAX_CTX && slot < 0; i++)
        if (sv_reg->ctx[i].pid == 0)
            slot = i;
    if (slot < 0) {
        file_lock(F_UNLCK);
        pthread_mutex_unlock(&reg_mu);
        return ENOMEM;
    }
    sv_reg->ctx[slot].pid = getpid();
    sv_reg->ctx[slot].ctx = ctx;
    reg_refs++;
    sv_unlock();
    return 0;
}

void sv_detach(uint32_t ctx)
{
    int32_t me = getpid();
    sv_lock();
    /* A context closed with objects still open takes them with it. */
    for (int i = 0; i < SV_MAX_CTX; i++)
        if (sv_reg->ctx[i].pid == me && sv_reg->ctx[i].ctx == ctx)
            memset(&sv_reg->ctx[i], 0, sizeof sv_reg->ctx[i]);
    for (int i = 0; i < SV_MAX_MR; i++)
        if (sv_reg->mr[i].pid == me && sv_reg->mr[i].ctx == ctx)
            memset(&sv_reg->mr[i], 0, sizeof sv_reg->mr[i]);
    for (int i = 0; i < SV_MAX_QP; i++)
        if (sv_reg->qp[i].pid == me && sv_reg->qp[i].ctx == ctx)
            memset(&sv_reg->qp[i], 0, sizeof sv_reg->qp[i]);
    sweep();
    int live = 0;
    for (int i = 0; i < SV_MAX_CTX; i++)
        live += sv_reg->ctx[i].pid != 0;
    if (live == 0)
        unlink(reg_path);
    file_lock(F_UNLCK);
    if (--reg_refs == 0) {
        munmap(sv_reg, sizeof *sv_reg);
        sv_reg = NULL;
        close(reg_fd);
        reg_fd = -1;
    }
    pthread_mutex_unlock(&reg_mu);
}

int sv_free_mr_slot(void)
{
    for (int i = 0; i < SV_MAX_MR; i++)
        if (!sv_pid_alive(sv_reg->mr[i].pid))
            return i;
    return -1;
}

int sv_free_qp_slot(void)
{
    for (int i = 0; i < SV_MAX_QP; i++)
        if (!sv_pid_alive(sv_reg->qp[i].pid))
            return i;
    return -1;
}

uint32_t sv_next_gen(void)
{
    return ++sv_reg->gen;
}

/* Keys are (slot + 1) << 8 | generation byte, as real rkeys are an index
 * and a tag: a stale or made-up key names a slot whose key differs. */
struct sv_mr_ent *sv_find_mr(uint32_t key)
{
    uint32_t slot = (key >> 8) - 1;
    if ((key >> 8) == 0 || slot >= SV_MAX_MR)
        return NULL;
    struct sv_mr_ent *m = &sv_reg->mr[slot];
    return m->pid && m->key == key ? m : NULL;
}

/* QPNs are generation << 10 | slot, 24 bits, never 0 or 1. */
struct sv_qp_ent *sv_find_qp(uint32_t qpn)
{
    uint32_t slot = qpn & (SV_MAX_QP - 1);
    struct sv_qp_ent *q = &sv_reg->qp[slot];
    return q->pid && q->qpn == qpn ? q : NULL;
}
