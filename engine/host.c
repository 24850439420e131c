/*
 * host.c — one store per host: the rendezvous (a directory with a lock and
 * a socket per store), the choice between serving and attaching, the host
 * ops the shared-memory server (net/shm.c) serves the engine through, and
 * the takeover when a server dies.
 *
 * Key design choice: the lock decides, as in SQLite. <dir>/<id>.lock is
 * flock'ed by the one process that serves <id>; it binds <dir>/<id>.sock
 * once its tiers are open. Everyone else connects to the socket. A process
 * that finds neither an answer nor a free lock waits: while the holder is
 * alive and has not bound its socket (it is still opening: faulting in its
 * DRAM, opening RocksDB) for up to HOLDER_OPEN_MS, else up to the timeout;
 * then it says KV_EBUSY. The kernel drops the lock
 * of a dead holder, so whoever tries next becomes the server: a restarted
 * daemon, or an attached engine whose call found its server gone (it opens
 * the tiers itself: SSD blocks survive, DRAM-only ones are misses).
 *
 * Identity is the name (store.name) or "ssd-" + a hash of realpath(ssd.path);
 * the socket is reachable only through a 0700 directory of our own, and the
 * server checks the peer's uid, the token and the boot id on top.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "net/dir.h"
#include "dram.h"
#include "host.h"
#include "net/shm.h"
#include "net/transport.h"

struct kv__host {
    pthread_rwlock_t lk;             /* the attached/serving switch: readers route, the writer switches */
    _Atomic bool serving;            /* once true, never false again */
    char id[KV_CFG_STR];
    char lock_path[2 * KV_CFG_STR + 64];
    char sock_path[2 * KV_CFG_STR + 64];
    int lock_fd;                     /* held while serving */
    struct kv__shm_server *srv;      /* serving */
    struct kv__shm_client *cli;      /* attached; NULL after a failed reconnect */
    unsigned timeout_ms;
    _Atomic unsigned dumping;        /* served dumps being copied now (h_dump) */
};

/* ---- the rendezvous directory --------------------------------------------- */

/* A directory of ours nobody else can enter: created 0700 when missing;
 * refused when a symlink, another user's, or open to group or others. */
static int check_dir(const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        kv__errf(err, errlen, "store.dir: cannot create %s: %s", dir, strerror(errno));
        return KV_ECONFIG;
    }
    struct stat st;
    if (lstat(dir, &st) != 0) {
        kv__errf(err, errlen, "store.dir: %s: %s", dir, strerror(errno));
        return KV_ECONFIG;
    }
    if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
        kv__errf(err, errlen, "store.dir: %s is %s, not a directory of ours", dir,
                 S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory");
        return KV_EPERM;
    }
    if (st.st_uid != geteuid()) {
        kv__errf(err, errlen, "store.dir: %s belongs to uid %u, not to us (uid %u)", dir,
                 (unsigned)st.st_uid, (unsigned)geteuid());
        return KV_EPERM;
    }
    if (st.st_mode & 077) {
        kv__errf(err, errlen, "store.dir: %s is open to group or others (mode %03o); it must be 0700",
                 dir, (unsigned)(st.st_mode & 0777));
        return KV_EPERM;
    }
    return KV_OK;
}

/* The store's id, or "" when it is not shared. */
static int store_id(const struct kv_config *cfg, char *id, size_t len, char *err, size_t errlen)
{
    id[0] = '\0';
    if (cfg->store.name[0]) {
        snprintf(id, len, "%s", cfg->store.name);
        return KV_OK;
    }
    /* No SSD tier, or a pure cluster client (it opens none): nothing to share by path. */
    if (!KV_PIPE_HAS_SSD(cfg->pipeline) ||
        (cfg->cluster.enabled && cfg->dram.capacity == 0 && KV_PIPE_HAS_DRAM(cfg->pipeline)))
        return KV_OK;
    /* The tier would create it anyway; realpath needs it to exist. */
    if (mkdir(cfg->ssd.path, 0755) != 0 && errno != EEXIST) {
        kv__errf(err, errlen, "ssd.path: cannot create %s: %s", cfg->ssd.path, strerror(errno));
        return KV_EIO;
    }
    char *real = realpath(cfg->ssd.path, NULL);
    if (!real) {
        kv__errf(err, errlen, "ssd.path: %s: %s", cfg->ssd.path, strerror(errno));
        return KV_EIO;
    }
    snprintf(id, len, "ssd-%016llx", (unsigned long long)XXH3_64bits(real, strlen(real)));
    free(real);
    return KV_OK;
}

/* The rendezvous directory of cfg's store. */
static void store_dir(const struct kv_config *cfg, char *dir, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (cfg->store.dir[0])
        snprintf(dir, len, "%s", cfg->store.dir);
    else if (xdg && xdg[0] == '/')
        snprintf(dir, len, "%s/kvengine", xdg);
    else
        snprintf(dir, len, "/tmp/kvengine-%u", (unsigned)geteuid());
}

/* flock the lock file, making sure the file locked is still the one at the
 * path (a closing holder unlinks it). 1 when held, 0 when another process
 * holds it, < 0 on error. */
static int take_lock(struct kv__host *h)
{
    for (int tries = 0; tries < 8; tries++) {
        int fd = open(h->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
            return kv__err_from_errno(errno);
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            return e == EWOULDBLOCK ? 0 : kv__err_from_errno(e);
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(h->lock_path, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev) {
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) == 0 && write(fd, pid, (size_t)n) != n) {
                /* the pid is for people reading the file; the lock is what counts */
            }
            h->lock_fd = fd;
            kv__fork_close(fd, true);   /* a forked child must not hold our lock */
            return 1;
        }
        close(fd);
    }
    return KV_EBUSY;
}

/* The pid the lock's holder wrote into it (take_lock), 0 when none yet. */
static long lock_holder_pid(const char *lock_path)
{
    long pid = 0;
    FILE *f = fopen(lock_path, "r");
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    return pid;
}

/* How long a holder that is still opening is waited for. Opening a large
 * DRAM tier on a loaded host takes longer than io.timeout_ms (a UCM worker
 * gave up after 5 s while its scheduler was building the store, then the
 * scheduler waited 580 s for it). */
#define HOLDER_OPEN_MS 60000u

/* The lock's holder is alive and has not bound the socket yet: it is still
 * opening. A socket bound since it took the lock that does not answer is a
 * stalled server; one bound before (older than the pid it wrote into the
 * lock) is a SIGKILLed server's, left behind: the holder has not bound its
 * own yet. A holder that is gone left the lock free for take_lock. An
 * unwritten pid (it has just taken the lock) counts as alive. */
static bool holder_opening(const struct kv__host *h)
{
    struct stat sk, lk;
    if (stat(h->sock_path, &sk) == 0 &&
        (stat(h->lock_path, &lk) != 0 || sk.st_mtim.tv_sec > lk.st_mtim.tv_sec ||
         (sk.st_mtim.tv_sec == lk.st_mtim.tv_sec && sk.st_mtim.tv_nsec >= lk.st_mtim.tv_nsec)))
        return false;
    long pid = lock_holder_pid(h->lock_path);
    return pid <= 0 || kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

static void give_lock(struct kv__host *h)
{
    if (h->lock_fd < 0)
        return;
    unlink(h->lock_path);   /* while still holding it: see take_lock */
    kv__fork_close(h->lock_fd, false);
    close(h->lock_fd);
    h->lock_fd = -1;
}

/* Finds the store's server or becomes it, by deadline: 1 serving (lock
 * held), 0 attached (h->cli), or an error with err. */
static int rendezvous(kv_engine *e, struct kv__host *h, char *err, size_t errlen)
{
    uint64_t t0 = kv__now_ms(), deadline = t0 + h->timeout_ms;
    uint64_t open_deadline = t0 + (h->timeout_ms > HOLDER_OPEN_MS ? h->timeout_ms : HOLDER_OPEN_MS);
    char why[256] = "";
    for (;;) {
        int rc = kv__shm_connect(h->sock_path, e->cfg.cluster.token, h->timeout_ms, e->buffers,
                                 &h->cli, why, sizeof why);
        if (rc == KV_OK) {
            kv__shm_set_direct(h->cli, e->cfg.store.direct_reads);
            return 0;
        }
        if (rc != KV_ENET) {
            kv__errf(err, errlen, "cannot attach to the host store %s: %s", h->id, why);
            return rc;
        }
        int got = take_lock(h);
        if (got == 1)
            return 1;
        if (got < 0) {
            kv__errf(err, errlen, "store %s: cannot take %s: %s", h->id, h->lock_path,
                     kv_strerror(got));
            return got;
        }
        uint64_t now = kv__now_ms();
        bool opening = now >= deadline && holder_opening(h);
        if (now >= deadline && (!opening || now >= open_deadline)) {
            if (opening)
                kv__errf(err, errlen, "store %s: its holder (pid %ld, %s) has been opening it for "
                         "%u s and does not serve %s yet", h->id, lock_holder_pid(h->lock_path),
                         h->lock_path, HOLDER_OPEN_MS / 1000, h->sock_path);
            else
                kv__errf(err, errlen, "store %s is held by another process (%s) that does not "
                         "answer on %s: %s", h->id, h->lock_path, h->sock_path, why);
            return KV_EBUSY;
        }
        usleep(10000);
    }
}

int kv__host_open(kv_engine *e, bool *serve, char *err, size_t errlen)
{
    *serve = false;
    char id[KV_CFG_STR];
    int rc = store_id(&e->cfg, id, sizeof id, err, errlen);
    if (rc != KV_OK || !id[0])
        return rc;
    char dir[KV_CFG_STR + 32];
    store_dir(&e->cfg, dir, sizeof dir);
    if ((rc = check_dir(dir, err, errlen)) != KV_OK)
        return rc;
    struct kv__host *h = calloc(1, sizeof *h);
    if (!h)
        return KV_ENOMEM;
    pthread_rwlock_init(&h->lk, NULL);
    h->lock_fd = -1;
    h->timeout_ms = e->cfg.io.timeout_ms ? (unsigned)e->cfg.io.timeout_ms : KV_NET_DEFAULT_TIMEOUT_MS;
    snprintf(h->id, sizeof h->id, "%s", id);
    snprintf(h->lock_path, sizeof h->lock_path, "%s/%s.lock", dir, id);
    snprintf(h->sock_path, sizeof h->sock_path, "%s/%s.sock", dir, id);
    if (strlen(h->sock_path) >= 108) {
        kv__errf(err, errlen, "store.dir: the socket path %s is longer than a Unix socket allows",
                 h->sock_path);
        free(h);
        return KV_ECONFIG;
    }
    e->host = h;
    rc = rendezvous(e, h, err, errlen);
    if (rc < 0)
        return rc;   /* kv__host_close frees h */
    *serve = rc == 1;
    if (!*serve)
        KV_INFO("store %s: attached to the process serving it (%s)", h->id, h->sock_path);
    return KV_OK;
}

/* ---- what the server serves: the engine as a whole ------------------------- */

static int h_lookup(void *c, const kv_block_id *ids, size_t n, uint8_t *hit)
{ return kv_lookup(c, ids, n, hit); }
static int h_prefetch(void *c, const kv_block_id *ids, size_t n) { return kv_prefetch(c, ids, n); }
static int h_pin(void *c, const kv_block_id *id, uint32_t x, const void **d, uint64_t *len,
                 kv__pin *p)
{
    kv_engine *e = c;
    int rc = kv__local_pin(e, KV_NS_BLOCK, id, x, d, len, p);
    if (rc == KV_OK)
        atomic_fetch_add(&e->ct.hits_dram, 1);
    return rc;
}
static void h_unpin(void *c, kv__pin *p) { kv__local_unpin(c, p); }
static int h_load(void *c, const kv_shard *sh, size_t n, int *res)
{ return kv__engine_run_shards(c, false, sh, n, res); }
/* A dump served alone is spread over this engine's workers, as kv_dump in
 * process is (an attached client sends a dump from its shared buffers
 * whole); while other clients' dumps are being copied, they are the
 * parallelism, and each is copied on its connection's thread. */
static int h_dump(void *c, const kv_shard *sh, size_t n, int *res)
{
    kv_engine *e = c;
    bool alone = atomic_fetch_add(&e->host->dumping, 1) == 0;
    int rc = alone ? kv__engine_dump_served(e, sh, n, res) : kv__engine_run_shards(e, true, sh, n, res);
    atomic_fetch_sub(&e->host->dumping, 1);
    return rc;
}
static int h_put(void *c, const void *k, size_t kl, const void *v, size_t vl)
{ return kv_put(c, k, kl, v, vl); }
static int h_get(void *c, const void *k, size_t kl, void *b, size_t cap, size_t *vl)
{ return kv_get(c, k, kl, b, cap, vl); }
static int h_exists(void *c, const void *k, size_t kl) { return kv_exists(c, k, kl); }
static int h_remove(void *c, const void *k, size_t kl) { return kv_remove(c, k, kl); }
static int h_remove_all(void *c, uint64_t *n) { return kv_remove_all(c, n); }
static int h_stats(void *c, kv_stats *out) { return kv_stats_get(c, out); }
static int h_remove_prefix(void *c, const void *p, size_t len, uint64_t *n)
{ return kv_remove_prefix(c, p, len, n); }
static void h_touch(void *c, const kv_block_id *ids, size_t n)
{
    kv_engine *e = c;
    if (e->dram)
        kv__dram_touch(e->dram, KV_NS_BLOCK, ids, n);
}
static int h_many(void *c, int what, kv_pair *items, size_t n, int *res)
{
    return what == 0 ? kv_put_many(c, items, n, res)
         : what == 1 ? kv_get_many(c, items, n, res) : kv_exists_many(c, items, n, res);
}

/* The SSD tier's admin calls, served as the serving engine runs them. */
static int h_ssd_scan(void *c, kv_ssd_cb cb, void *arg) { return kv_ssd_scan(c, cb, arg); }
static int h_ssd_scrub(void *c, int repair, kv_ssd_cb cb, void *arg, uint64_t *checked,
                       uint64_t *bad)
{ return kv_ssd_scrub(c, repair, cb, arg, checked, bad); }
static int h_ssd_compact(void *c) { return kv_ssd_compact(c); }
static int h_ssd_remove(void *c, const kv_block_id *id) { return kv_ssd_remove(c, id); }

int kv__host_serve(kv_engine *e, char *err, size_t errlen)
{
    struct kv__host *h = e->host;
    struct kv__shm_host sh = {
        .ctx = e, .lookup = h_lookup, .prefetch = h_prefetch, .pin = h_pin, .unpin = h_unpin,
        .load = h_load, .dump = h_dump, .put = h_put, .get = h_get, .exists = h_exists,
        .remove = h_remove, .remove_all = h_remove_all, .stats = h_stats, .many = h_many,
        .seg_fd = -1, .dir_fd = -1, .remove_prefix = h_remove_prefix, .touch = h_touch,
    };
    sh.ssd_scan = h_ssd_scan;
    sh.ssd_scrub = h_ssd_scrub;
    sh.ssd_compact = h_ssd_compact;
    sh.ssd_remove = h_ssd_remove;
    if (e->dram && e->dram->seg.fd >= 0) {
        int rc = kv__segment_seal(&e->dram->seg);
        if (rc != KV_OK) {
            kv__errf(err, errlen, "cannot seal the DRAM segment: %s", kv_strerror(rc));
            return rc;
        }
        sh.seg_base = e->dram->seg.base;
        sh.seg_len = e->dram->seg.len;
        sh.seg_fd = e->dram->seg.fd;
        kv__fork_close(sh.seg_fd, true);   /* a child must not keep a dead server's DRAM */
        /* The segment's directory: the DRAM tier mirrors every block shard
         * it links from now on, and clients load those without asking. */
        struct kv__dir *dir;
        rc = kv__dir_new(sh.seg_len, &dir);
        if (rc == KV_OK) {
            kv__dram_set_dir(e->dram, dir);
            sh.dir_fd = kv__dir_fd(dir);
            sh.dir_len = kv__dir_len(dir);
        } else {
            KV_WARN("store %s: no directory for direct loads (%s): every attached load is a "
                    "round trip", h->id, kv_strerror(rc));
        }
    }
    int rc = kv__shm_serve(h->sock_path, e->cfg.cluster.token, h->timeout_ms, &sh, &h->srv, err,
                           errlen);
    if (rc != KV_OK) {
        kv__fork_close(sh.seg_fd, false);   /* the store closes it, and the number is reused */
        return rc;
    }
    atomic_store(&h->serving, true);
    KV_INFO("store %s: serving it to this host's processes on %s", h->id, h->sock_path);
    return KV_OK;
}

void kv__host_stop(kv_engine *e)
{
    if (e->host && e->host->srv) {
        kv__shm_stop(e->host->srv);
        e->host->srv = NULL;
        if (e->dram)
            kv__fork_close(e->dram->seg.fd, false);
    }
}

void kv__host_close(kv_engine *e)
{
    struct kv__host *h = e->host;
    if (!h)
        return;
    kv__host_stop(e);
    kv__shm_disconnect(h->cli);
    give_lock(h);
    pthread_rwlock_destroy(&h->lk);
    free(h);
    e->host = NULL;
}

/* ---- routing and takeover -------------------------------------------------- */

/* Under the write lock: replaces a broken client by a new connection, or
 * takes the store over. */
static int recover(kv_engine *e, struct kv__host *h)
{
    kv__shm_disconnect(h->cli);
    h->cli = NULL;
    char err[512] = "";
    int rc = rendezvous(e, h, err, sizeof err);
    if (rc == 0) {
        KV_INFO("store %s: reattached to its server", h->id);
        return KV_OK;
    }
    if (rc < 0) {
        KV_WARN("store %s: %s", h->id, err);
        return rc == KV_EBUSY ? KV_ENET : rc;
    }
    /* The lock is ours: open the store here and serve it. */
    KV_WARN("store %s: its server is gone; taking it over", h->id);
    rc = kv__engine_open_local(e, err, sizeof err);
    if (rc == KV_OK && (rc = kv__host_serve(e, err, sizeof err)) != KV_OK)
        kv__engine_close_local(e);   /* whole, SSD tier's lock and all, before the store's */
    if (rc != KV_OK) {
        KV_ERROR("store %s: cannot take it over: %s (%s)", h->id, err, kv_err_name(rc));
        give_lock(h);
        return rc;
    }
    return KV_OK;
}

/* Routed calls this thread is inside (a kv_ssd_scan's cb may call the
 * engine again): such a thread holds the read lock already, so it must not
 * wait for the write lock a recovery takes (it would wait for itself). */
static __thread unsigned routed_depth;

int kv__host_enter(kv_engine *e, struct kv__shm_client **c)
{
    *c = NULL;
    struct kv__host *h = e->host;
    if (!h || atomic_load(&h->serving))
        return KV_OK;
    for (;;) {
        pthread_rwlock_rdlock(&h->lk);
        if (atomic_load(&h->serving)) {
            pthread_rwlock_unlock(&h->lk);
            return KV_OK;
        }
        if (h->cli && !kv__shm_broken(h->cli)) {
            *c = h->cli;
            routed_depth++;
            return KV_OK;   /* held until kv__host_leave */
        }
        pthread_rwlock_unlock(&h->lk);
        if (routed_depth > 0)
            return KV_ENET;   /* the outer call fails too; the next one recovers */
        pthread_rwlock_wrlock(&h->lk);
        int rc = KV_OK;
        if (!atomic_load(&h->serving) && (!h->cli || kv__shm_broken(h->cli)))
            rc = recover(e, h);
        pthread_rwlock_unlock(&h->lk);
        if (rc != KV_OK)
            return rc;
    }
}

bool kv__host_attached(kv_engine *e)
{
    return e->host && !atomic_load(&e->host->serving);
}

void kv__host_leave(kv_engine *e)
{
    routed_depth--;
    pthread_rwlock_unlock(&e->host->lk);
}

uint64_t kv__host_requests(kv_engine *e)
{
    return e->host ? kv__shm_server_requests(e->host->srv) : 0;
}

void kv__host_stats(kv_engine *e, kv_stats *out)
{
    struct kv__host *h = e->host;
    if (!h)
        return;
    if (h->srv) {
        uint64_t direct;
        kv__shm_server_stats(h->srv, &out->host_clients, &out->host_pins, &direct);
        out->hits_dram += direct;   /* the clients' loads that never reached us */
    }
    out->host_attached = !atomic_load(&h->serving);
}

/* ---- offline work on a store (kv_ssd_recover) ------------------------------- */

int kv__host_lock_offline(const struct kv_config *cfg, int *fd, char *err, size_t errlen)
{
    *fd = -1;
    char id[KV_CFG_STR];
    int rc = store_id(cfg, id, sizeof id, err, errlen);
    if (rc != KV_OK || !id[0])
        return rc;
    struct kv__host h = { .lock_fd = -1 };
    snprintf(h.id, sizeof h.id, "%s", id);
    char dir[KV_CFG_STR + 32];
    store_dir(cfg, dir, sizeof dir);
    if ((rc = check_dir(dir, err, errlen)) != KV_OK)
        return rc;
    snprintf(h.lock_path, sizeof h.lock_path, "%s/%s.lock", dir, id);
    int got = take_lock(&h);
    if (got == 1) {
        *fd = h.lock_fd;
        return KV_OK;
    }
    if (got < 0 && got != KV_EBUSY) {
        kv__errf(err, errlen, "store %s: cannot take %s: %s", id, h.lock_path, kv_strerror(got));
        return got;
    }
    /* Held: the holder wrote its pid there when it took it. */
    long pid = lock_holder_pid(h.lock_path);
    if (pid > 0)
        kv__errf(err, errlen, "store %s is served by pid %ld (%s); stop it first", id, pid,
                 h.lock_path);
    else
        kv__errf(err, errlen, "store %s is served by another process (%s holds its lock); "
                 "stop it first", id, h.lock_path);
    return KV_EBUSY;
}

void kv__host_unlock_offline(const struct kv_config *cfg, int fd)
{
    if (fd < 0)
        return;
    struct kv__host h = { .lock_fd = fd };
    char id[KV_CFG_STR], dir[KV_CFG_STR + 32];
    if (store_id(cfg, id, sizeof id, NULL, 0) == KV_OK && id[0]) {
        store_dir(cfg, dir, sizeof dir);
        snprintf(h.lock_path, sizeof h.lock_path, "%s/%s.lock", dir, id);
        give_lock(&h);   /* unlinks it while still held, as a closing server does */
        return;
    }
    kv__fork_close(fd, false);
    close(fd);
}
