/*
 * errors.c — error names and descriptions, generated from KV_ERR_MAP, and
 * the translation of OS errors at the edge.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

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
