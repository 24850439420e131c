/*
 * errors.c — error names and descriptions, generated from KV_ERR_MAP, and
 * the translation of OS errors at the edge (and, at the same edge, the
 * descriptors a fork()ed child must close).
 */
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "internal.h"

KV__EXPORT const char *kv_strerror(int err)
{
    switch (err) {
    case KV_OK:
        return "success";
#define KV__ERR_DESC(name, value, desc) case KV_##name: return desc;
        KV_ERR_MAP(KV__ERR_DESC)
#undef KV__ERR_DESC
    }
    return "unknown error";
}

KV__EXPORT const char *kv_err_name(int err)
{
    switch (err) {
    case KV_OK:
        return "OK";
#define KV__ERR_NAME(name, value, desc) case KV_##name: return #name;
        KV_ERR_MAP(KV__ERR_NAME)
#undef KV__ERR_NAME
    }
    return "UNKNOWN";
}

#define KV__STR2(x) #x
#define KV__STR(x) KV__STR2(x)
KV__EXPORT const char *kv_version(void)
{
    return KV__STR(KV_VERSION_MAJOR) "." KV__STR(KV_VERSION_MINOR) "." KV__STR(KV_VERSION_PATCH);
}

int kv__err_from_errno(int errnum)
{
    switch (errnum) {
    case 0:
        return KV_OK;
    case EINVAL: case EFAULT: case ENAMETOOLONG:
        return KV_EINVAL;
    case ENOMEM:
        return KV_ENOMEM;
    case ENOSPC: case EDQUOT: case EFBIG:
        return KV_ENOSPC;
    case ENOENT:
        return KV_ENOTFOUND;
    case ETIMEDOUT:
        return KV_ETIMEDOUT;
    case EACCES: case EPERM: case EROFS:
        return KV_EPERM;
    case EBUSY: case EAGAIN:
        return KV_EBUSY;
    case ECONNREFUSED: case ECONNRESET: case EPIPE: case EHOSTUNREACH:
    case ENETUNREACH: case ENOTCONN: case ECONNABORTED:
        return KV_ENET;
    case ENOSYS: case EOPNOTSUPP:
        return KV_ENOTSUP;
    default:
        return KV_EIO;
    }
}

void kv__errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- descriptors a forked child must not keep ------------------------------
 * Serving processes fork (multiprocessing, a server's workers). A child
 * holding copies of the host store's descriptors would keep a dead
 * server's lock held and its socket open (connects would queue, unanswered,
 * instead of failing), and keep connections of its parent half-open. So
 * every such descriptor is listed here (the host store's lock, socket,
 * connections and segment: net/shm.c, engine/host.c; the SSD tier's lock:
 * persist/ssd.c), and a fork's child closes its copies (the parent's stay as they were: a flock lives while any copy of
 * its descriptor does).
 */
#define FORK_FDS_MAX 4096
static pthread_mutex_t fork_mu = PTHREAD_MUTEX_INITIALIZER;
static int fork_fds[FORK_FDS_MAX];
static size_t fork_nfds;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) { pthread_mutex_lock(&fork_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&fork_mu); }
static void fork_child(void)
{
    for (size_t i = 0; i < fork_nfds; i++)
        close(fork_fds[i]);
    fork_nfds = 0;
    pthread_mutex_unlock(&fork_mu);
}
static void fork_init(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

void kv__fork_close(int fd, bool add)
{
    if (fd < 0)
        return;
    pthread_once(&fork_once, fork_init);
    pthread_mutex_lock(&fork_mu);
    if (add && fork_nfds < FORK_FDS_MAX) {
        fork_fds[fork_nfds++] = fd;
    } else if (!add) {
        for (size_t i = 0; i < fork_nfds; i++)
            if (fork_fds[i] == fd) {
                fork_fds[i] = fork_fds[--fork_nfds];
                break;
            }
    }
    pthread_mutex_unlock(&fork_mu);
}
