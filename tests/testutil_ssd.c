/*
 * testutil_ssd.c — a fault the SSD tier's tests inject: a silent bit flip in
 * a stored value. It reaches inside persist/ (ssd_int.h), which is why it is
 * built into the test runner only, never into the library.
 */
#include <fcntl.h>
#include <unistd.h>

#include "persist/ssd_int.h"
#include "testutil_int.h"

int kv__ssd_write_corrupt(struct kv__ssd *s, int ns, const kv_block_id *id, uint32_t index,
                          const void *data, uint32_t len, uint32_t flip)
{
    if (!s || !id || ns < 0 || ns >= KV_NS_COUNT || flip >= len)
        return KV_EINVAL;
    kv_iov one = { (void *)data, len };
    int rc = kv__ssd_write(s, ns, id, index, &one, 1);
    struct kv__sent e;
    if (rc != KV_OK || !kv__sidx_get(&s->idx, ns, id->bytes, index, &e))
        return rc != KV_OK ? rc : KV_EIO;
    /* A silent bit flip in the stored bytes, after the checksum. */
    char path[KV_CFG_STR + 64];
    kv__vlog_file_name(&s->vlog, KV__LOC_FILE(e.loc), path, sizeof path);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    uint8_t b;
    off_t at = (off_t)(KV__LOC_OFF(e.loc) + KV__VLOG_HDR + (flip < e.slen ? flip : 0));
    if (fd < 0 || pread(fd, &b, 1, at) != 1 || (b ^= 0x5a, pwrite(fd, &b, 1, at) != 1))
        rc = KV_EIO;
    if (fd >= 0)
        close(fd);
    return rc;
}
