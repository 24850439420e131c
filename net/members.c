/*
 * members.c — kv_members: the cluster view as kvmaster holds it, for kvctl
 * members and for kvmaster's own /metrics.
 *
 * Key design choice: the query is a LEAVE for an id that is not a member.
 * The master answers every JOIN and LEAVE with its current view, and a
 * LEAVE for an unknown id changes nothing (no version bump, no log line),
 * so a read-only query needs no new message type and no change to the
 * master. The connection proves the token by challenge-response, as every
 * one does, so a master with another token refuses it (KV_EPERM), and
 * only records their members signed are shown.
 * With cluster.metadata etcd the view is read from etcd instead
 * (membership.h), the same records the members read.
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "engine/config.h"
#include "membership.h"
#include "proto.h"
#include "sock.h"

#define QUERY_TIMEOUT_MS 2000u

static void to_info(const struct kv__member *m, kv_member_info *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", m->id);
    snprintf(out->addr, sizeof out->addr, "%s", m->addr);
    out->owner = (m->flags & KV_MEMBER_OWNER) != 0;
    out->segments = m->nseg;
    for (uint32_t i = 0; i < m->nseg && i < KV_PROTO_SEG_MAX; i++)
        out->segment_bytes += m->seg[i].len;
    out->dram_capacity = m->dram_capacity;
    out->dram_used = m->dram_used;
    out->ssd_capacity = m->ssd_capacity;
    out->ssd_used = m->ssd_used;
    out->dram_blocks = m->dram_blocks;
    out->ssd_blocks = m->ssd_blocks;
    out->keys = m->keys;
    snprintf(out->version, sizeof out->version, "%s", m->version);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    out->heartbeat_age_ms = !m->stamp_ms ? -1 : now > m->stamp_ms ? (int64_t)(now - m->stamp_ms)
                                                                  : 0;
}

static int members_from_store(const kv_config *cfg, uint64_t *version,
                              kv_member_info **members, size_t *n)
{
    struct kv__membership *ms;
    unsigned ms_timeout = cfg->io.timeout_ms ? (unsigned)cfg->io.timeout_ms : QUERY_TIMEOUT_MS;
    int rc = kv__membership_open(cfg, ms_timeout, NULL, NULL, &ms, NULL, 0);
    if (rc != KV_OK)
        return rc;
    struct kv__member *list = NULL;
    size_t cnt = 0;
    uint64_t ver = 0;
    rc = ms->ops->view(ms, &ver, &list, &cnt);
    kv__membership_close(ms);
    kv_member_info *out = NULL;
    if (rc == KV_OK && cnt && !(out = calloc(cnt, sizeof *out)))
        rc = KV_ENOMEM;
    for (size_t i = 0; rc == KV_OK && i < cnt; i++)
        to_info(&list[i], &out[i]);
    free(list);
    if (rc != KV_OK)
        return rc;
    *members = out;
    *n = cnt;
    if (version)
        *version = ver;
    return KV_OK;
}

static int members_query(const kv_config *cfg, uint64_t *version, kv_member_info **members,
                         size_t *n);

KV__EXPORT int kv_members(const kv_config *cfg, uint64_t *version, kv_member_info **members,
                          size_t *n)
{
    if (members)
        *members = NULL;
    if (n)
        *n = 0;
    if (version)
        *version = 0;
    if (!cfg || !members || !n)
        return KV_EINVAL;
    /* The token in effect (its file, the environment), in our own copy. */
    struct kv_config *own = malloc(sizeof *own);
    if (!own)
        return KV_ENOMEM;
    *own = *cfg;
    int rc = kv__auth_token(cfg, own->cluster.token, NULL, 0);
    if (rc == KV_OK)
        rc = members_query(own, version, members, n);
    free(own);
    return rc;
}

static int members_query(const kv_config *cfg, uint64_t *version, kv_member_info **members,
                         size_t *n)
{
    if (cfg->cluster.metadata == KV_META_ETCD)
        return members_from_store(cfg, version, members, n);
    struct sockaddr_in sa;
    if (kv__net_parse_addr(cfg->cluster.master, &sa) != KV_OK)
        return KV_ECONFIG;
    uint64_t deadline = kv__now_ms() + (cfg->io.timeout_ms ? cfg->io.timeout_ms : QUERY_TIMEOUT_MS);

    /* An id no node uses: nodes name themselves by address. */
    struct kv__member q;
    memset(&q, 0, sizeof q);
    snprintf(q.id, sizeof q.id, "kv_members-query-%ld-%llu", (long)getpid(),
             (unsigned long long)kv__now_ns());
    uint8_t body[2 * (KV_PROTO_ID_MAX + 2) + 64 + KV_CFG_STR];
    int blen = kv__member_sign(cfg->cluster.token, &q);
    if (blen == KV_OK)
        blen = kv__join_encode(&q, body, sizeof body);
    if (blen < 0)
        return blen;

    int fd = -1;
    int rc = kv__sock_connect(&sa, deadline, &fd);
    if (rc != KV_OK)
        return rc;
    /* The master proves the token before we prove ours (auth.h). */
    if ((rc = kv__auth_client(fd, cfg->cluster.token, deadline)) != KV_OK) {
        close(fd);
        return rc;
    }
    uint8_t h[KV_PROTO_HDR_LEN];
    struct kv__hdr hd = { .type = KV_MSG_LEAVE, .req_id = 1, .body_len = (uint32_t)blen };
    kv__hdr_encode(&hd, h);
    rc = kv__sock_xfer1(fd, h, sizeof h, 1, deadline);
    if (rc == KV_OK)
        rc = kv__sock_xfer1(fd, body, (size_t)blen, 1, deadline);
    if (rc == KV_OK)
        rc = kv__sock_xfer1(fd, h, sizeof h, 0, deadline);
    uint8_t *vb = NULL;
    if (rc == KV_OK && (kv__hdr_decode(h, 0, &hd) != KV_OK || hd.type != KV_MSG_VIEW))
        rc = KV_EPROTO;
    if (rc == KV_OK && hd.status != KV_OK)
        rc = kv__status_valid(hd.status) ? hd.status : KV_EPROTO;
    if (rc == KV_OK && !(vb = malloc(hd.body_len ? hd.body_len : 1)))
        rc = KV_ENOMEM;
    if (rc == KV_OK)
        rc = kv__sock_xfer1(fd, vb, hd.body_len, 0, deadline);
    close(fd);
    struct kv__member *list = NULL;
    size_t cnt = 0;
    uint64_t ver = 0;
    if (rc == KV_OK && kv__view_decode(vb, hd.body_len, &ver, &list, &cnt) != KV_OK)
        rc = KV_EPROTO;
    free(vb);
    if (rc != KV_OK)
        return rc;
    size_t keep = 0;    /* only records their members signed */
    for (size_t i = 0; i < cnt; i++)
        if (kv__member_verify(cfg->cluster.token, &list[i]))
            list[keep++] = list[i];
    cnt = keep;
    kv_member_info *out = NULL;
    if (cnt && !(out = calloc(cnt, sizeof *out))) {
        free(list);
        return KV_ENOMEM;
    }
    for (size_t i = 0; i < cnt; i++)
        to_info(&list[i], &out[i]);
    free(list);
    *members = out;
    *n = cnt;
    if (version)
        *version = ver;
    return KV_OK;
}
