/*
 * etcd_fixture.h — Debian's etcd (package etcd-server) started by the tests
 * themselves on loopback: one member, or a cluster of up to three.
 *
 * Key design choice: static inline, in a header, so that the cluster suite
 * (run with KV_TEST_METADATA=etcd) and the etcd suite share it without a
 * new object in the test runner's link. Members run with a 25 ms heartbeat
 * and a 250 ms election timeout, which makes etcd's smallest lease TTL one
 * second (it is 1.5 election timeouts, rounded up to seconds) and a new
 * leader come within about half a second of the old one's death. Data
 * directories live under the test's temporary directory, so a member
 * restarted with tu_etcd_start_member finds its data again; every member
 * is spawned with tu_spawn (PR_SET_PDEATHSIG) and killed and reaped by
 * tu_etcd_stop.
 */
#ifndef KV_TESTS_ETCD_FIXTURE_H
#define KV_TESTS_ETCD_FIXTURE_H

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/membership.h"
#include "testutil.h"

#define TU_ETCD_MAX 3

struct tu_etcd {
    int n;
    pid_t pid[TU_ETCD_MAX];
    unsigned cport[TU_ETCD_MAX], pport[TU_ETCD_MAX];
    char dir[400];
    char endpoints[200];                /* "127.0.0.1:C0,127.0.0.1:C1,..." */
};

static inline const char *tu_etcd_bin(void)
{
    const char *b = getenv("KV_ETCD");
    return b && *b ? b : "/usr/bin/etcd";
}

static inline int tu_etcd_available(void)
{
    return access(tu_etcd_bin(), X_OK) == 0;
}

/* (Re)starts member i with its ports and data directory. */
static inline void tu_etcd_start_member(struct tu_etcd *c, int i)
{
    char name[16], data[512], curl[64], purl[64], cluster[256] = "", log[512];
    snprintf(name, sizeof name, "m%d", i);
    snprintf(data, sizeof data, "%s/etcd-%d", c->dir, i);
    snprintf(curl, sizeof curl, "http://127.0.0.1:%u", c->cport[i]);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%u", c->pport[i]);
    for (int j = 0; j < c->n; j++) {
        size_t len = strlen(cluster);
        snprintf(cluster + len, sizeof cluster - len, "%sm%d=http://127.0.0.1:%u", j ? "," : "",
                 j, c->pport[j]);
    }
    snprintf(log, sizeof log, "%s/etcd-%d.log", c->dir, i);
    char bin[256];
    snprintf(bin, sizeof bin, "%s", tu_etcd_bin());
    char *argv[] = { bin, "--name", name, "--data-dir", data,
                     "--listen-client-urls", curl, "--advertise-client-urls", curl,
                     "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                     "--initial-cluster", cluster, "--initial-cluster-state", "new",
                     "--initial-cluster-token", "kvengine-test",
                     "--heartbeat-interval", "25", "--election-timeout", "250", NULL };
    c->pid[i] = tu_spawn(argv, log);
}

/* Waits (at most ms) until the endpoints answer a linearizable read (so a
 * leader is elected); KV_OK or the last error. */
static inline int tu_etcd_wait_ready(const struct tu_etcd *c, const char *endpoints,
                                     unsigned ms)
{
    struct kv_config cfg;
    kv__config_defaults(&cfg);
    cfg.cluster.metadata = KV_META_ETCD;
    snprintf(cfg.cluster.etcd_endpoints, sizeof cfg.cluster.etcd_endpoints, "%s",
             endpoints ? endpoints : c->endpoints);
    struct kv__membership *m;
    int rc = kv__membership_open(&cfg, 500, NULL, NULL, &m, NULL, 0);
    if (rc)
        return rc;
    uint64_t t0 = tu_now_ms();
    do {
        uint64_t v;
        struct kv__member *list = NULL;
        size_t n = 0;
        rc = m->ops->view(m, &v, &list, &n);
        free(list);
        if (rc)
            usleep(20000);
    } while (rc && tu_now_ms() - t0 < ms);
    kv__membership_close(m);
    return rc;
}

/* n members (1..TU_ETCD_MAX) on fresh loopback ports, data under dir;
 * fails the test unless they serve within 10 s. */
static inline void tu_etcd_start(struct tu_etcd *c, const char *dir, int n)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    for (int i = 0; i < n; i++) {
        c->cport[i] = tu_free_port();
        c->pport[i] = tu_free_port();
        size_t len = strlen(c->endpoints);
        snprintf(c->endpoints + len, sizeof c->endpoints - len, "%s127.0.0.1:%u", i ? "," : "",
                 c->cport[i]);
    }
    for (int i = 0; i < n; i++)
        tu_etcd_start_member(c, i);
    int rc = tu_etcd_wait_ready(c, NULL, 10000);
    ck_assert_msg(rc == KV_OK, "etcd did not come up: %s (logs in %s)", kv_strerror(rc), dir);
}

static inline void tu_etcd_kill(struct tu_etcd *c, int i)
{
    if (c->pid[i] > 0) {
        kill(c->pid[i], SIGKILL);
        waitpid(c->pid[i], NULL, 0);
    }
    c->pid[i] = 0;
}

static inline void tu_etcd_stop(struct tu_etcd *c)
{
    for (int i = 0; i < c->n; i++)
        tu_etcd_kill(c, i);
}

#endif
