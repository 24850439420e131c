/*
 * cluster.c — the distributed DRAM tier: membership, routing, failover.
 *
 * Key design choice: every routing decision is local. A heartbeat thread
 * keeps a refcounted snapshot of the membership view (the live owners and
 * their HRW seeds); a call takes a reference, computes each shard's owners
 * with placement.c, groups the items by owner, and sends one batch per
 * owner over a pooled connection. Owners are peers that outlive views, so
 * their connection pools survive view changes. A peer whose connection
 * fails is marked down for a short while (PEER_DOWN_MS) and tried last,
 * which is what makes a SIGKILLed replica cost one failed exchange instead
 * of one per call; the membership store (kvmaster or etcd, membership.h)
 * drops it from the view within node_ttl_ms.
 *
 * How a batch is driven (run_groups): all on the calling thread when it can
 * be. This node's own share runs first, in place (run_local). The remote
 * shares then go out together: when the transport has batch_many (tcp),
 * the calling thread starts every owner's request before it waits for any
 * reply, then moves requests and replies as they come, with one poll() over
 * the owners' sockets; each owner keeps its own deadlines, so a hung owner fails only
 * its own share. Handing an owner to another thread costs a wake-up there
 * and one back per batch, which on a busy client (64 KiB values, 2 cores)
 * was a quarter of its CPU per GiB read. Threads are still used where
 * waiting could hold up the others: an owner with no pooled connection (a
 * connect can take the whole timeout when its host is gone) goes to a fan
 * thread, and so does every owner but the first on a transport without
 * batch_many (rdma).
 *
 * Rules (dump success, load failover, lookup, timeouts) are in cluster.h.
 */
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "auth.h"
#include "cluster.h"
#include "membership.h"
#include "placement.h"
#include "proto.h"
#include "serve.h"
#include "tomb.h"
#include "transport.h"

#define POOL_MAX 16
#define PEER_DOWN_MS 1000
/* Fetches of the view that callers ask for (view_refresh) start at most
 * this often: while an owner fails every call, its callers share them
 * instead of each sending one to the membership store. */
#define REFRESH_GAP_MS 20
/* After a view change, a shard that misses on all its owners is looked for
 * on its owners in the previous view for this long (and copied to its new
 * owners when found there), so a node joining does not turn 1/n of the
 * cache into misses at once. */
#define MOVE_WINDOW_MS 60000

struct lk_call;

struct peer {
    struct peer *next;                  /* every peer a view holds (vlock) */
    int refs;                           /* views holding it (vlock) */
    char id[KV_PROTO_ID_MAX + 1];
    char addr[KV_PROTO_ID_MAX + 1];
    uint64_t seed;
    int self;
    pthread_mutex_t lock;               /* the pool */
    struct kv__conn *pool[POOL_MAX];
    int npool;
    _Atomic uint64_t down_until_ms;
    uint64_t mark;                      /* view_install's scratch (vlock) */
    uint8_t mark_leaving;               /* and whether the replaced view flagged it */
};

struct view {
    struct kv__cluster *c;
    _Atomic int refs;
    uint64_t version;
    size_t nmembers;
    size_t n;                           /* owners */
    struct peer **owners;
    uint64_t *seeds;
    uint8_t *leaving;                   /* owners flagged KV_MEMBER_LEAVING (may be NULL) */
    /* The owners not flagged leaving, when some are (else nstay is 0): as
     * indexes into owners, and their seeds (stay_candidates). */
    size_t nstay;
    size_t *stay;
    uint64_t *stay_seeds;
};

/*
 * Fan threads: the owners of a batch that this thread cannot drive itself
 * (see the top of this file) run on a few helper threads (FAN_THREADS), so
 * a batch costs the slowest owner, not their sum. They are not the engine's
 * task workers: those are the callers that wait here (a task's chunk calls
 * kv__cluster_load/dump), so legs queued behind them could deadlock the
 * pool, and a leg may block on a dead peer for a whole deadline
 * (doc/architecture.md, "Threads in net/").
 */
#define FAN_THREADS 4

struct fan_job {
    struct fan_job *next;
    struct kv__cluster *c;
    struct peer *p;
    struct kv__op *ops;
    size_t n;
    struct fan_latch *latch;
};

struct fan_latch {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t left;
};

struct kv__cluster {
    struct kv_config cfg;
    struct kv__backend engine_be;
    struct kv__backend *be;             /* NULL: pure client */
    const struct kv__transport_ops *ops;
    struct kv__transport *t;
    struct kv__membership *ms;          /* kvmaster or etcd (membership.h) */
    char where[KV_CFG_STR + 64];        /* the store, for messages */
    struct kv__member self;
    unsigned replicas;

    pthread_mutex_t vlock;
    uint64_t vmark;                     /* view_install's last mark (vlock) */
    struct view *view;
    _Atomic uint64_t view_ver;          /* view->version, read without vlock (sv_admit) */
    struct view *prev;                  /* the view before the last change */
    uint64_t prev_until_ms;             /* consulted for misses until then */
    struct peer *peers;

    pthread_t hb;
    int hb_started, hb_inited;
    pthread_mutex_t hblock;
    pthread_cond_t hbcond;
    int stopping;
    int view_dirty;                     /* the store said the view changed */
    /* Fetch rounds (view_refresh): a caller counts hb_asked up and waits
     * for hb_served to reach it, so its view comes from a fetch that began
     * after it asked, not from one already in flight. Asked-for rounds
     * start REFRESH_GAP_MS apart at most, and hb_began_ms is when the last
     * round that came back began: callers whose owner failed share them. */
    uint64_t hb_asked, hb_served;
    uint64_t hb_began_ms, hb_last_start_ms;
    unsigned call_ms;                   /* T, one remote call's deadline (cluster.h) */

    _Atomic uint64_t remote_ops, remote_errors, failovers, moved;
    /* Writes refused as not ours in a view newer than their sender's
     * (sv_admit), and the last view whose first refusal was logged. */
    _Atomic uint64_t refused_not_owner, refused_logged;
    /* The plain keys removed here (tomb.h; NULL on a pure client), and
     * the copies refused for being read before such a remove. */
    struct kv__tomb *tomb;
    _Atomic uint64_t refused_stale;
    /* Copies of values read here in flight (rr_copy's batches), when the
     * last one ended (kv__now_ms), and the removes that ran the fence
     * (kv__cluster_remove). */
    _Atomic int copying;
    _Atomic uint64_t copied_ms, removes_fenced, lookups_unsure;

    /* Re-replication (its section below): one job at a time, from the
     * view before an owner change to the view after it. */
    pthread_t rr;
    int rr_started, rr_stop;
    pthread_mutex_t rrlock;
    pthread_cond_t rrcond;
    struct view *rr_from, *rr_to;       /* the pending job (references) */
    uint64_t rr_gen;                    /* bumped per job: a running one yields */
    uint64_t rr_seq;                    /* the pending job's owner change */
    _Atomic uint64_t rr_shards, rr_bytes, rr_failed, rr_pending, rr_jobs;
    /* Owner changes seen (counted under vlock, as the view is installed)
     * and the last one whose job ran to the end: "behind" is the gap. */
    _Atomic uint64_t rr_wanted, rr_done;
    /* The plain keys a re-replication batch moves (copies, then drops
     * ours): a write of one served here meanwhile marks it (mv_hit), and
     * its drop is skipped (rr_copy). nmv is 0 outside such a batch. */
    pthread_mutex_t mvlock;
    _Atomic size_t nmv;
    kv_block_id *mv;
    uint8_t *mv_hit;

    /* Lookups waiting for the next round (kv__cluster_lookup's section). */
    pthread_mutex_t lklock;
    struct lk_call *lkq, *lklast;
    int lkbusy;                         /* a caller leads the rounds */
    unsigned lkround;                   /* the next round to be taken */
    _Atomic uint32_t lkword[2];         /* bumped when a round is done (futex) */

    /* Graceful leave (its section below): what the transport serves is
     * serve_be, c->be with every write forwarded to the next owners while
     * leaving is 1; lvlock orders those forwards against hand-off batches. */
    struct kv__backend serve_be;
    pthread_mutex_t lvlock;
    _Atomic int leaving;                /* 0, 1 forwarding, 2 done */
    int hb_stopped, left;
    _Atomic uint64_t handed_off, forwarded;
    /* Writes being stored with no forwarding (leaving was 0 when they
     * began): forwarding starts once they are in, so that the hand-off's
     * scan sees each of them. */
    _Atomic uint64_t wr_plain;
    /* Saying we leave (publish_leaving): 1 asked of the heartbeat thread,
     * 2 done, 3 given up (hblock). skip: the owners the answer already
     * showed leaving, whom our hand-off and forwards pass over. */
    int publish, publish_rc;
    char (*skip)[KV_PROTO_ID_MAX + 1];
    size_t nskip;

    pthread_mutex_t fanlock;
    pthread_cond_t fancond;
    struct fan_job *fanq, **fantail;
    int fanstop, nfan;
    pthread_t fan[FAN_THREADS];
};

static void *fan_main(void *arg);
static void rr_enqueue(struct kv__cluster *c, struct view *from, struct view *to, uint64_t seq);
static void *rr_main(void *arg);
static void serve_be_init(struct kv__cluster *c);

/* ---- views and peers ---------------------------------------------------- */

static struct view *view_get(struct kv__cluster *c)
{
    pthread_mutex_lock(&c->vlock);
    struct view *v = c->view;
    atomic_fetch_add(&v->refs, 1);
    pthread_mutex_unlock(&c->vlock);
    return v;
}

static void peer_drain(struct kv__cluster *c, struct peer *p);

/*
 * Drops a reference to v. The last one releases v's peers, and a peer that
 * no view holds any more is freed: it left the view, and nothing else can
 * reach it, since every call, leg, fan job, lookup queue and
 * re-replication job reaches peers through a view it holds a reference to
 * (lk_lead's scratch view lists peers of its caller's). So the peer table
 * is the live view plus the views still in use (the previous one for the
 * move window, a running job's), not every id ever seen (issue 17, item 4:
 * it was kept and scanned at every view change).
 */
static void view_put(struct view *v)
{
    if (!v || atomic_fetch_sub(&v->refs, 1) != 1)
        return;
    struct kv__cluster *c = v->c;
    struct peer *gone = NULL;
    if (c && v->n) {
        pthread_mutex_lock(&c->vlock);
        for (size_t i = 0; i < v->n; i++) {
            struct peer *p = v->owners[i];
            if (--p->refs > 0)
                continue;
            for (struct peer **pp = &c->peers; *pp; pp = &(*pp)->next)
                if (*pp == p) {
                    *pp = p->next;
                    break;
                }
            p->next = gone;
            gone = p;
        }
        pthread_mutex_unlock(&c->vlock);
    }
    /* Its connections are closed outside vlock: nobody can take them now. */
    for (struct peer *p = gone, *nx; p; p = nx) {
        nx = p->next;
        if (c->ops)
            peer_drain(c, p);
        pthread_mutex_destroy(&p->lock);
        free(p);
    }
    free(v->owners);
    free(v->seeds);
    free(v->leaving);
    free(v->stay);
    free(v->stay_seeds);
    free(v);
}

/* The previous view while it is still worth asking, else NULL. */
static struct view *prev_get(struct kv__cluster *c)
{
    pthread_mutex_lock(&c->vlock);
    struct view *p = c->prev && kv__now_ms() < c->prev_until_ms ? c->prev : NULL;
    if (p)
        atomic_fetch_add(&p->refs, 1);
    pthread_mutex_unlock(&c->vlock);
    return p;
}

static void peer_drain(struct kv__cluster *c, struct peer *p)
{
    pthread_mutex_lock(&p->lock);
    while (p->npool)
        c->ops->close(p->pool[--p->npool]);
    pthread_mutex_unlock(&p->lock);
}

/* Orders peers by id. */
static int peer_by_id(const void *a, const void *b)
{
    return strcmp((*(struct peer *const *)a)->id, (*(struct peer *const *)b)->id);
}

/* A member's place in its view, sorted by id (view_install). */
struct mref {
    const char *id;
    size_t i;
};

static int mref_by_id(const void *a, const void *b)
{
    const struct mref *x = a, *y = b;
    int d = strcmp(x->id, y->id);
    return d ? d : (x->i > y->i) - (x->i < y->i);   /* equal ids keep their order */
}

/* A member record for peer p, which has its id: a member that restarted
 * elsewhere gets its new address, and its old connections are closed.
 * Caller holds vlock. */
static void peer_update(struct kv__cluster *c, struct peer *p, const struct kv__member *m)
{
    pthread_mutex_lock(&p->lock);
    if (strcmp(p->addr, m->addr) != 0) {
        while (p->npool)
            c->ops->close(p->pool[--p->npool]);
        snprintf(p->addr, sizeof p->addr, "%s", m->addr);
        atomic_store(&p->down_until_ms, 0);
    }
    pthread_mutex_unlock(&p->lock);
}

/* The peer of member m: found in byid[0..np) (the peer table sorted by id)
 * and updated, or made and added to the table. Caller holds vlock. */
static struct peer *peer_find(struct kv__cluster *c, const struct kv__member *m,
                              struct peer **byid, size_t np)
{
    size_t lo = 0, hi = np;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int d = strcmp(byid[mid]->id, m->id);
        if (d == 0) {
            peer_update(c, byid[mid], m);
            return byid[mid];
        }
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    struct peer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    snprintf(p->id, sizeof p->id, "%s", m->id);
    snprintf(p->addr, sizeof p->addr, "%s", m->addr);
    p->seed = kv__place_seed(p->id);
    p->self = c->be && strcmp(m->id, c->self.id) == 0;
    pthread_mutex_init(&p->lock, NULL);
    p->next = c->peers;
    c->peers = p;
    return p;
}

/*
 * A member that joins a cluster owns, in its first view, ids that the
 * others stored before it came: until re-replication has copied them here
 * its own reads of them would miss (issue 18: a second Mooncake member's
 * reads just after setup() missed about half the keys the first had put).
 * So its first view gets, as the previous view, the same owners without
 * itself, with the move window a view change opens: misses ask those
 * owners too, as after any change of owners. Caller holds vlock; out of
 * memory, there is simply no window.
 */
static void join_window(struct kv__cluster *c, struct view *v)
{
    struct view *p = calloc(1, sizeof *p);
    if (!p)
        return;
    p->c = c;
    p->refs = 1;
    p->version = v->version;
    p->nmembers = v->nmembers;
    p->owners = calloc(v->n ? v->n : 1, sizeof *p->owners);
    p->seeds = calloc(v->n ? v->n : 1, sizeof *p->seeds);
    p->leaving = calloc(v->n ? v->n : 1, 1);
    if (!p->owners || !p->seeds || !p->leaving) {
        free(p->owners);
        free(p->seeds);
        free(p->leaving);
        free(p);
        return;
    }
    for (size_t i = 0; i < v->n; i++) {
        if (v->owners[i]->self)
            continue;
        v->owners[i]->refs++;
        p->owners[p->n] = v->owners[i];
        p->seeds[p->n] = v->seeds[i];
        p->leaving[p->n] = v->leaving[i];
        p->n++;
    }
    if (p->n == 0) {   /* the first owner: nothing was stored before it */
        free(p->owners);
        free(p->seeds);
        free(p->leaving);
        free(p);
        return;
    }
    c->prev = p;
    c->prev_until_ms = kv__now_ms() + MOVE_WINDOW_MS;
}

/*
 * Between staggered leaves (issue 18): a member that leaves while another
 * is leaving already passes the earlier one over, and hands its share to
 * the owners of the view without both. A reader whose view has lost the
 * later leaver and still shows the earlier one asks that one, which never
 * got those shards: they are on the owners without the leavers. So a view
 * with owners flagged leaving keeps those without them, and a read that
 * misses on its owners asks the owners there too (stay_candidates). Out
 * of memory, there are none (the reads miss, as before).
 */
static void view_stay(struct view *v)
{
    size_t k = 0;
    for (size_t i = 0; v->leaving && i < v->n; i++)
        k += !v->leaving[i];
    if (!v->leaving || k == v->n || !k)
        return;
    v->stay = malloc(k * sizeof *v->stay);
    v->stay_seeds = malloc(k * sizeof *v->stay_seeds);
    if (!v->stay || !v->stay_seeds) {
        free(v->stay);
        free(v->stay_seeds);
        v->stay = NULL;
        v->stay_seeds = NULL;
        return;
    }
    for (size_t i = 0; i < v->n; i++)
        if (!v->leaving[i]) {
            v->stay[v->nstay] = i;
            v->stay_seeds[v->nstay++] = v->seeds[i];
        }
}

/*
 * Installs the view of members m[0..n). A view change is O(n log n) in
 * members, not O(n^2): with thousands of members every join or leave of
 * any one of them (clients included) is a view change on every member, and
 * the per-member list walk plus the two owner-by-owner comparisons were
 * what grew (bench_etcd; doc/perf.md). How: the members are sorted by id
 * (an index array, so the view keeps their order) and the peer table is
 * sorted once, so each member finds its peer by binary search, and a
 * repeated id finds the one peer made for the first; the owners of the
 * view being replaced carry a fresh mark, so "did this peer stay" and "are
 * the owners the same" are one compare each.
 */
static int view_install(struct kv__cluster *c, uint64_t version, const struct kv__member *m,
                        size_t n)
{
    struct view *v = calloc(1, sizeof *v);
    if (!v)
        return KV_ENOMEM;
    v->c = c;
    v->refs = 1;
    v->version = version;
    v->nmembers = n;
    v->owners = calloc(n ? n : 1, sizeof *v->owners);
    v->seeds = calloc(n ? n : 1, sizeof *v->seeds);
    v->leaving = calloc(n ? n : 1, 1);
    struct mref *ord = malloc((n ? n : 1) * sizeof *ord);
    struct peer **of = calloc(n ? n : 1, sizeof *of);    /* each member's peer */
    if (!v->owners || !v->seeds || !v->leaving || !ord || !of) {
        free(ord);
        free(of);
        view_put(v);
        return KV_ENOMEM;
    }
    size_t no = 0;
    for (size_t i = 0; i < n; i++)
        if (m[i].flags & KV_MEMBER_OWNER)
            ord[no++] = (struct mref){ m[i].id, i };
    if (no)   /* outside vlock: routing takes it for every call */
        qsort(ord, no, sizeof *ord, mref_by_id);
    pthread_mutex_lock(&c->vlock);
    size_t np = 0;
    for (struct peer *p = c->peers; p; p = p->next)
        np++;
    struct peer **byid = malloc((np ? np : 1) * sizeof *byid);
    if (!byid) {
        pthread_mutex_unlock(&c->vlock);
        free(ord);
        free(of);
        view_put(v);
        return KV_ENOMEM;
    }
    np = 0;
    for (struct peer *p = c->peers; p; p = p->next)
        byid[np++] = p;
    if (np)
        qsort(byid, np, sizeof *byid, peer_by_id);
    for (size_t k = 0; k < no; k++) {
        size_t i = ord[k].i, h = k ? ord[k - 1].i : 0;
        if (k && of[h] && strcmp(m[h].id, m[i].id) == 0) {
            of[i] = of[h];
            peer_update(c, of[i], &m[i]);
        } else {
            of[i] = peer_find(c, &m[i], byid, np);
        }
    }
    uint64_t mark = ++c->vmark;
    for (size_t j = 0; c->view && j < c->view->n; j++) {
        c->view->owners[j]->mark = mark;
        c->view->owners[j]->mark_leaving = c->view->leaving && c->view->leaving[j];
    }
    for (size_t i = 0; i < n; i++) {
        struct peer *p = of[i];
        if (!p)
            continue;
        /* A peer (re)entering the view gets a clean slate; one that stays
         * keeps its down mark (views change for every client that joins). */
        if (p->mark != mark)
            atomic_store(&p->down_until_ms, 0);
        p->refs++;
        v->owners[v->n] = p;
        v->seeds[v->n] = p->seed;
        v->leaving[v->n] = (m[i].flags & KV_MEMBER_LEAVING) != 0;
        v->n++;
    }
    free(byid);
    free(ord);
    free(of);
    view_stay(v);
    struct view *old = c->view, *older = NULL;
    c->view = v;
    atomic_store(&c->view_ver, version);
    if (!old && c->be)
        join_window(c, v);
    /* The replaced view becomes the previous one (its reference moves) when
     * the owners changed; a change of clients only keeps the move window
     * of the last owner change going. */
    int same = old && old->n == v->n, flagged = 0;
    for (size_t i = 0; same && i < v->n; i++) {
        same = v->owners[i]->mark == mark;
        flagged |= v->leaving[i] != v->owners[i]->mark_leaving;
    }
    /* An owner newly flagged leaving restarts re-replication too, on the
     * view that says so: the running job's view does not, and would copy
     * plain keys to the leaver and drop ours (rr_decide). It is no owner
     * change: the move window stays the last one's. */
    int rerep = old && (!same || flagged) && c->rr_started;
    uint64_t seq = 0;
    if (rerep) {   /* references for the re-replication job */
        atomic_fetch_add(&old->refs, 1);
        atomic_fetch_add(&v->refs, 1);
        seq = atomic_fetch_add(&c->rr_wanted, 1) + 1;
    }
    if (old && !same) {
        older = c->prev;
        c->prev = old;
        c->prev_until_ms = kv__now_ms() + MOVE_WINDOW_MS;
    } else {
        older = old;
    }
    pthread_mutex_unlock(&c->vlock);
    if (old)
        KV_INFO("cluster: view %llu: %zu members, %zu owners", (unsigned long long)version,
                n, v->n);
    view_put(older);
    if (rerep)
        rr_enqueue(c, old, v, seq);
    return KV_OK;
}

/* One wait on cv (mu held) of at most ms: the condition variables here use
 * the default clock, CLOCK_REALTIME, so the deadline is built on it. */
static void cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    ts.tv_sec += (time_t)(ms / 1000) + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* The store's doorbell (etcd's watch): the heartbeat thread fetches the
 * view now instead of at its next beat. */
static void on_view_change(void *arg)
{
    struct kv__cluster *c = arg;
    pthread_mutex_lock(&c->hblock);
    c->view_dirty = 1;
    pthread_cond_broadcast(&c->hbcond);   /* view_refresh may wait on it too */
    pthread_mutex_unlock(&c->hblock);
}

/* Has the heartbeat thread fetch the view now and waits (at most
 * timeout_ms) until a fetch that began after this call has come back: a
 * member about to leave may not have seen the owners that joined since its
 * last beat, and a caller whose owner just failed wants the view as it is
 * now, not the one a fetch already in flight may bring. */
static void view_refresh(struct kv__cluster *c, unsigned timeout_ms)
{
    uint64_t until = kv__now_ms() + timeout_ms;
    pthread_mutex_lock(&c->hblock);
    uint64_t want = ++c->hb_asked;
    pthread_cond_broadcast(&c->hbcond);
    while (c->hb_served < want && !c->stopping) {
        uint64_t now = kv__now_ms();
        if (now >= until)
            break;
        cond_wait_ms(&c->hbcond, &c->hblock, until - now);
    }
    pthread_mutex_unlock(&c->hblock);
}

/* The figures this member's record carries (kvctl members), refreshed for
 * every heartbeat: its store's, through the backend, its wall clock (the
 * age kvctl shows is the reader's clock against it) and its version. */
static void self_figures(struct kv__cluster *c)
{
    struct kv__member *s = &c->self;
    if (c->be && c->be->stats) {
        kv_stats st;
        c->be->stats(c->be->ctx, &st);
        s->dram_capacity = st.dram_capacity;
        s->dram_used = st.dram_used;
        s->ssd_capacity = st.ssd_capacity;
        s->ssd_used = st.ssd_used;
        s->dram_blocks = st.dram_blocks;
        s->ssd_blocks = st.ssd_blocks;
        s->keys = st.keys;
    }
    s->stamp_ms = kv__wall_ms();
    snprintf(s->version, sizeof s->version, "%s", kv_version());
}

static size_t leavers_in(struct kv__cluster *c, const struct kv__member *m, size_t n,
                         char (**out)[KV_PROTO_ID_MAX + 1]);

static void *hb_main(void *arg)
{
    struct kv__cluster *c = arg;
    unsigned every = kv__membership_heartbeat_ms(c->cfg.cluster.node_ttl_ms);
    int failing = 0;
    uint64_t next = kv__now_ms() + every;
    pthread_mutex_lock(&c->hblock);
    while (!c->stopping) {
        uint64_t now = kv__now_ms();
        int pub = c->publish == 1;
        uint64_t gap = c->hb_last_start_ms + REFRESH_GAP_MS;
        int asked_for = c->hb_asked > c->hb_served;
        if (!c->view_dirty && now < next && !pub && !(asked_for && now >= gap)) {
            uint64_t until = asked_for && gap < next ? gap : next;
            cond_wait_ms(&c->hbcond, &c->hblock, until - now);
            continue;
        }
        int beat = now >= next;
        uint64_t asked = c->hb_asked;   /* what this round answers */
        c->view_dirty = 0;
        c->hb_last_start_ms = now;
        pthread_mutex_unlock(&c->hblock);
        uint64_t version;
        struct kv__member *m = NULL;
        size_t n = 0;
        int rc;
        if (pub) {
            /* Our record, flagged as leaving, and the view in one call
             * (a kvmaster JOIN; etcd puts the record, then reads): this
             * thread is the only writer of c->self. */
            next = now + every;
            c->self.flags |= KV_MEMBER_LEAVING;
            self_figures(c);
            rc = c->ms->ops->join(c->ms, &c->self, &version, &m, &n);
        } else if (beat) {
            next = now + every;
            self_figures(c);
            rc = c->ms->ops->heartbeat(c->ms, &c->self, &version, &m, &n);
        } else {
            rc = c->ms->ops->view(c->ms, &version, &m, &n);
        }
        if (rc == KV_OK) {
            if (failing)
                KV_INFO("cluster: %s reachable again", c->where);
            failing = 0;
            if (version != c->view->version)   /* only this thread writes it */
                view_install(c, version, m, n);
        } else if (beat && !failing++) {
            KV_WARN("cluster: heartbeat to %s failed: %s; keeping view %llu", c->where,
                    kv_strerror(rc), (unsigned long long)c->view->version);
        }
        char (*skip)[KV_PROTO_ID_MAX + 1] = NULL;
        size_t nskip = pub && rc == KV_OK ? leavers_in(c, m, n, &skip) : 0;
        free(m);
        pthread_mutex_lock(&c->hblock);
        /* A failed round answers too: the caller finds the view unchanged. */
        if (asked > c->hb_served)
            c->hb_served = asked;
        c->hb_began_ms = now;
        if (pub && c->publish == 1) {
            c->publish = 2;
            c->publish_rc = rc;
            c->skip = skip;
            c->nskip = nskip;
            skip = NULL;
        }
        free(skip);
        pthread_cond_broadcast(&c->hbcond);   /* view_refresh, publish_leaving */
    }
    pthread_mutex_unlock(&c->hblock);
    return NULL;
}

/* ---- start / stop ------------------------------------------------------- */

static int start(struct kv__cluster *c, char *err, size_t errlen)
{
    pthread_mutex_init(&c->rrlock, NULL);
    pthread_cond_init(&c->rrcond, NULL);
    /* Before the store is opened: its watch may ring from then on. */
    pthread_mutex_init(&c->hblock, NULL);
    pthread_cond_init(&c->hbcond, NULL);
    c->hb_inited = 1;
    /* Adaptive: lookups hold it for a few stores, and a sleep on it would
     * cost what combining them saves. */
    pthread_mutexattr_t lka;
    pthread_mutexattr_init(&lka);
    pthread_mutexattr_settype(&lka, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&c->lklock, &lka);
    pthread_mutexattr_destroy(&lka);
    pthread_mutex_init(&c->fanlock, NULL);
    pthread_cond_init(&c->fancond, NULL);
    c->fantail = &c->fanq;
    /* The token in effect (cluster.token, its file, or the environment),
     * into our copy of the config, which is what everything below reads. */
    int rc = kv__auth_token(&c->cfg, c->cfg.cluster.token, err, errlen);
    if (rc != KV_OK)
        return rc;
    const struct kv_config *cfg = &c->cfg;
    struct kv__net_opts o;
    memset(&o, 0, sizeof o);
    snprintf(o.token, sizeof o.token, "%s", cfg->cluster.token);
    snprintf(o.device_name, sizeof o.device_name, "%s", cfg->cluster.device_name);
    /* io.timeout_ms bounds a whole task; a remote call gets half of it so
     * that a shard whose first owner hangs still has time to fail over. */
    o.timeout_ms = !cfg->io.timeout_ms ? KV_NET_DEFAULT_TIMEOUT_MS
                   : cfg->io.timeout_ms / 2 < 50 ? 50
                   : (unsigned)(cfg->io.timeout_ms / 2);
    c->call_ms = o.timeout_ms;
    o.threads = cfg->io.threads ? cfg->io.threads : 1;
    c->replicas = cfg->cluster.replica_num < 1 ? 1
                  : cfg->cluster.replica_num > KV_PLACE_MAX ? KV_PLACE_MAX
                                                            : cfg->cluster.replica_num;
    if (strlen(cfg->cluster.token) > KV_PROTO_ID_MAX) {
        kv__errf(err, errlen, "cluster.token: at most %d bytes", KV_PROTO_ID_MAX);
        return KV_ECONFIG;
    }
    if (c->be && (rc = kv__net_check_exposure("cluster.listen", cfg->cluster.listen,
                                              cfg->cluster.token, cfg->cluster.insecure, err,
                                              errlen)))
        return rc;
    rc = kv__transport_pick(cfg->cluster.protocol, &o, &c->ops);
    if (rc) {
        kv__errf(err, errlen, "cluster.protocol: rdma is not available here");
        return rc;
    }
    /* Tombstones from before the first remove is served: a copy read
     * before now is refused (tomb.h: a restart forgets the removes before
     * it). Kept well past a copy's flight (a call's deadline plus 100 ms
     * per MiB of a batch): 30 s, or 4 T. */
    if (c->be && kv__tomb_new(KV__TOMB_KEYS, c->call_ms * 4u > 30000u ? c->call_ms * 4u : 30000u,
                              kv__wall_ms(), &c->tomb) != KV_OK) {
        kv__errf(err, errlen, "cluster: out of memory for the tombstones of removed keys");
        return KV_ENOMEM;
    }
    if (c->be)
        serve_be_init(c);
    if ((rc = c->ops->create(&o, c->be ? &c->serve_be : NULL, &c->t, err, errlen)))
        return rc;
    char bound[KV_CFG_STR] = "";
    if (c->be && (rc = c->ops->listen(c->t, cfg->cluster.listen, bound, sizeof bound, err,
                                      errlen)))
        return rc;
    kv__membership_where(cfg, c->where, sizeof c->where);
    if ((rc = kv__membership_open(cfg, o.timeout_ms, on_view_change, c, &c->ms, err, errlen)))
        return rc;
    /* A node bound to the wildcard advertises the address it reaches the
     * membership store from: the one its peers can most likely reach it
     * on too. */
    char ip[64] = "127.0.0.1";
    if ((rc = c->ms->ops->local_ip(c->ms, ip, sizeof ip))) {
        kv__errf(err, errlen, "%s: %s%s%s", c->where,
                 rc == KV_EPERM ? "refused us (cluster.etcd_user / etcd_password)"
                 : rc == KV_ENET || rc == KV_ETIMEDOUT ? "unreachable (" : "",
                 rc == KV_EPERM ? "" : kv_strerror(rc),
                 rc == KV_ENET || rc == KV_ETIMEDOUT ? ")" : "");
        return rc;
    }
    if (c->be) {
        const char *colon = strrchr(bound, ':');
        if (strncmp(bound, "0.0.0.0:", 8) == 0)
            snprintf(c->self.addr, sizeof c->self.addr, "%.63s%.16s", ip, colon);
        else
            snprintf(c->self.addr, sizeof c->self.addr, "%.128s", bound);
        snprintf(c->self.id, sizeof c->self.id, "%s", c->self.addr);
        c->self.flags = KV_MEMBER_OWNER;
        if (c->ops->segments) {
            int k = c->ops->segments(c->t, c->self.seg, KV_PROTO_SEG_MAX);
            c->self.nseg = k > 0 ? (uint32_t)k : 0;
        }
    } else {
        snprintf(c->self.id, sizeof c->self.id, "client-%s-%ld-%llx", ip, (long)getpid(),
                 (unsigned long long)(kv__now_ns() & 0xffffffffffull));
    }
    uint64_t version;
    struct kv__member *m = NULL;
    size_t n = 0;
    self_figures(c);
    if ((rc = c->ms->ops->join(c->ms, &c->self, &version, &m, &n))) {
        kv__errf(err, errlen, "%s: %s", c->where,
                 rc != KV_EPERM ? kv_strerror(rc)
                 : cfg->cluster.metadata == KV_META_ETCD
                     ? "refused us (cluster.token does not match the cluster's, or "
                       "cluster.etcd_user)"
                                                         : "refused our cluster.token");
        return rc;
    }
    rc = view_install(c, version, m, n);
    free(m);
    if (rc)
        return rc;
    if (pthread_create(&c->hb, NULL, hb_main, c) != 0) {
        kv__errf(err, errlen, "cluster: cannot start heartbeat thread");
        return KV_ENOMEM;
    }
    c->hb_started = 1;
    for (int i = 0; i < FAN_THREADS; i++) {
        if (pthread_create(&c->fan[i], NULL, fan_main, c) != 0)
            break;
        c->nfan++;
    }
    /* Owners copy blocks to new owners after view changes; a pure client
     * holds nothing to copy. */
    if (c->be && c->be->scan && cfg->cluster.rereplicate_mib_s > 0 &&
        pthread_create(&c->rr, NULL, rr_main, c) == 0) {
        pthread_mutex_lock(&c->vlock);   /* view_install reads it there */
        c->rr_started = 1;
        pthread_mutex_unlock(&c->vlock);
    }
    /* The heartbeat thread (woken by etcd's watch) may install a newer
     * view by now: read it with a reference. */
    struct view *v = view_get(c);
    KV_INFO("cluster: %s %s over %s, view %llu (%zu owners), replica_num %u",
            c->be ? "serving" : "joined as a pure client", c->be ? c->self.addr : c->self.id,
            c->ops->name, (unsigned long long)v->version, v->n, c->replicas);
    view_put(v);
    return KV_OK;
}

int kv__cluster_start_backend(struct kv__backend *be, const struct kv_config *cfg,
                              struct kv__cluster **out, char *err, size_t errlen)
{
    *out = NULL;
    struct kv__cluster *c = calloc(1, sizeof *c);
    if (!c)
        return KV_ENOMEM;
    c->cfg = *cfg;
    c->be = be;
    pthread_mutex_init(&c->vlock, NULL);
    pthread_mutex_init(&c->lvlock, NULL);
    pthread_mutex_init(&c->mvlock, NULL);
    int rc = start(c, err, errlen);
    if (rc) {
        KV_ERROR("cluster: %s", err && errlen ? err : kv_strerror(rc));
        kv__cluster_stop(c);
        return rc;
    }
    *out = c;
    return KV_OK;
}

int kv__cluster_start(const struct kv__backend *be, const struct kv_config *cfg,
                      struct kv__cluster **out, char *err, size_t errlen)
{
    /* A store of its own (DRAM, or SSD only) makes an owner; dram.capacity
     * 0 with a DRAM pipeline is a pure client. */
    int owner = cfg->dram.capacity > 0 || cfg->pipeline == KV_PIPE_SSD;
    *out = NULL;
    /* The backend lives in the cluster object; start it there. */
    struct kv__cluster *c = calloc(1, sizeof *c);
    if (!c)
        return KV_ENOMEM;
    c->cfg = *cfg;
    c->engine_be = *be;
    c->be = owner ? &c->engine_be : NULL;
    pthread_mutex_init(&c->vlock, NULL);
    pthread_mutex_init(&c->lvlock, NULL);
    pthread_mutex_init(&c->mvlock, NULL);
    int rc = start(c, err, errlen);
    if (rc) {
        kv__cluster_stop(c);
        return rc;
    }
    *out = c;
    return KV_OK;
}

static void hb_stop(struct kv__cluster *c)
{
    if (!c->hb_started || c->hb_stopped)
        return;
    pthread_mutex_lock(&c->hblock);
    c->stopping = 1;
    pthread_cond_broadcast(&c->hbcond);
    pthread_mutex_unlock(&c->hblock);
    pthread_join(c->hb, NULL);
    c->hb_stopped = 1;
}

static void leave_gracefully(struct kv__cluster *c);

void kv__cluster_stop(struct kv__cluster *c)
{
    if (!c)
        return;
    /* Re-replication first: it drives batches through the fan threads. */
    pthread_mutex_lock(&c->rrlock);
    c->rr_stop = 1;
    pthread_cond_signal(&c->rrcond);
    pthread_mutex_unlock(&c->rrlock);
    if (c->rr_started)
        pthread_join(c->rr, NULL);
    /* An owner hands its data on and leaves the view while it still
     * serves, with the fan threads it needs for that. */
    if (c->be && c->hb_started)
        leave_gracefully(c);
    if (c->nfan) {
        pthread_mutex_lock(&c->fanlock);
        c->fanstop = 1;
        pthread_cond_broadcast(&c->fancond);
        pthread_mutex_unlock(&c->fanlock);
        for (int i = 0; i < c->nfan; i++)
            pthread_join(c->fan[i], NULL);
    }
    pthread_mutex_destroy(&c->fanlock);
    pthread_mutex_destroy(&c->lklock);
    pthread_cond_destroy(&c->fancond);
    if (c->hb_started && !c->left) {
        hb_stop(c);
        /* Leave at once rather than after node_ttl_ms, so that peers stop
         * routing to us now. Best effort. */
        c->ms->ops->leave(c->ms, &c->self);
    }
    kv__membership_close(c->ms);   /* its watch thread ends here */
    if (c->hb_inited) {
        pthread_mutex_destroy(&c->hblock);
        pthread_cond_destroy(&c->hbcond);
    }
    /* The views release their peers (view_put); what is left in the table
     * was found and never installed (view_install out of memory). */
    view_put(c->view);
    view_put(c->prev);
    view_put(c->rr_from);   /* a job the heartbeat queued while we stopped */
    view_put(c->rr_to);
    for (struct peer *p = c->peers, *nx; p; p = nx) {
        nx = p->next;
        if (c->ops)
            peer_drain(c, p);
        pthread_mutex_destroy(&p->lock);
        free(p);
    }
    if (c->t)
        c->ops->destroy(c->t);
    pthread_mutex_destroy(&c->rrlock);
    pthread_cond_destroy(&c->rrcond);
    pthread_mutex_destroy(&c->vlock);
    pthread_mutex_destroy(&c->lvlock);
    pthread_mutex_destroy(&c->mvlock);
    kv__tomb_free(c->tomb);   /* the transport, which served removes, is gone */
    free(c->skip);
    if (c->hb_started)
        KV_INFO("cluster: stopped (%llu remote items, %llu errors, %llu failovers)",
                (unsigned long long)c->remote_ops, (unsigned long long)c->remote_errors,
                (unsigned long long)c->failovers);
    free(c);
}

/* ---- running a batch on one owner -------------------------------------- */

static int peer_is_down(struct peer *p)
{
    /* A peer that is not marked down costs no clock read: routing asks
     * this for every owner of every id (a lookup of 8 ids over 2 owners
     * read the clock ~50 times, 7% of a member's CPU under lookups). */
    uint64_t until = atomic_load(&p->down_until_ms);
    if (p->self || !until)
        return 0;
    if (until > kv__now_ms())
        return 1;
    /* Up again: back to the clock-free case (unless marked down anew). */
    atomic_compare_exchange_strong(&p->down_until_ms, &until, 0);
    return 0;
}

/* A remove of plain keys served here (a peer's, through the transport,
 * or this node's own share): its tombstone first (tomb.h). */
static void tomb_note(struct kv__cluster *c, int kind, uint32_t plen, const kv_block_id *id)
{
    if (kind == KV_OP_REMOVE)
        kv__tomb_remove(c->tomb, id, kv__wall_ms());
    else
        kv__tomb_clear(c->tomb, plen, id, kv__wall_ms());
}

static int sv_copying(void *ctx);

/* Serves ops on this node's own store: no network, no copies beyond the
 * one into or out of the segment (the policy is serve.c's). Removes leave
 * their tombstones first and a plain key's write clears its own once it
 * is in, as a peer's do (sv_removing, sv_commit). Copies (internal ops
 * with a stamp) never come here: a member copies to owners other than
 * itself. */
static void run_local(struct kv__cluster *c, struct kv__op *ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i].ns == KV_NS_KEY && (ops[i].kind == KV_OP_REMOVE || ops[i].kind == KV_OP_CLEAR))
            tomb_note(c, ops[i].kind, ops[i].kind == KV_OP_CLEAR ? ops[i].index : 0, &ops[i].id);
    kv__serve_ops(c->be, ops, n);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].ns == KV_NS_KEY && ops[i].kind == KV_OP_DUMP && ops[i].result == KV_OK)
            kv__tomb_put(c->tomb, &ops[i].id);
        if (ops[i].kind == KV_OP_REMOVE || ops[i].kind == KV_OP_CLEAR)   /* as a peer answers */
            ops[i].hit = ops[i].ns == KV_NS_KEY && sv_copying(c);
    }
}

/* One owner's share of a batch and the connection it runs on. */
struct leg {
    struct peer *p;
    struct kv__op *ops;
    size_t n;
    struct kv__conn *conn;
    int pooled;                         /* conn came from the pool */
    int fanned;                         /* handed to a fan thread */
    char addr[KV_PROTO_ID_MAX + 1];
};

/* Takes a pooled connection to leg->p when there is one. */
static void leg_take(struct kv__cluster *c, struct leg *l)
{
    struct peer *p = l->p;
    pthread_mutex_lock(&p->lock);   /* the address may change with the view */
    l->conn = p->npool ? p->pool[--p->npool] : NULL;
    l->pooled = l->conn != NULL;
    memcpy(l->addr, p->addr, sizeof l->addr);
    pthread_mutex_unlock(&p->lock);
}

/* After the leg's exchange returned rc: one fresh try when a pooled
 * connection turned out stale, then the connection back to the pool, or
 * the peer marked down and every op failed with rc. */
static void leg_finish(struct kv__cluster *c, struct leg *l, int rc)
{
    struct peer *p = l->p;
    atomic_fetch_add(&c->remote_ops, l->n);
    if (rc == KV_ENET && l->pooled) {
        /* A pooled connection may be stale (the peer restarted): one fresh
         * try before calling the peer down. Every op is idempotent. */
        c->ops->close(l->conn);
        l->conn = NULL;
        rc = c->ops->connect(c->t, l->addr, &l->conn);
        if (rc == KV_OK)
            rc = c->ops->batch(l->conn, l->ops, l->n);
    }
    if (rc == KV_OK) {
        pthread_mutex_lock(&p->lock);
        if (p->npool < POOL_MAX) {
            p->pool[p->npool++] = l->conn;
            l->conn = NULL;
        }
        pthread_mutex_unlock(&p->lock);
        if (l->conn)
            c->ops->close(l->conn);
        return;
    }
    if (l->conn)
        c->ops->close(l->conn);
    atomic_fetch_add(&c->remote_errors, l->n);
    if (rc != KV_EPERM && rc != KV_EINVAL) {
        /* Other pooled connections to it are likely dead too. */
        atomic_store(&p->down_until_ms, kv__now_ms() + PEER_DOWN_MS);
        peer_drain(c, p);
        KV_WARN("cluster: %s: %s; failing over", l->addr, kv_strerror(rc));
    }
    for (size_t i = 0; i < l->n; i++)
        l->ops[i].result = rc;
}

static void run_peer(struct kv__cluster *c, struct peer *p, struct kv__op *ops, size_t n)
{
    if (!n)
        return;
    if (p->self) {
        run_local(c, ops, n);
        return;
    }
    struct leg l = { .p = p, .ops = ops, .n = n };
    leg_take(c, &l);
    int rc = KV_OK;
    if (!l.conn)
        rc = c->ops->connect(c->t, l.addr, &l.conn);
    if (rc == KV_OK)
        rc = c->ops->batch(l.conn, ops, n);
    leg_finish(c, &l, rc);
}

static void *fan_main(void *arg)
{
    struct kv__cluster *c = arg;
    pthread_mutex_lock(&c->fanlock);
    for (;;) {
        while (!c->fanq && !c->fanstop)
            pthread_cond_wait(&c->fancond, &c->fanlock);
        if (!c->fanq)
            break;
        struct fan_job *j = c->fanq;
        c->fanq = j->next;
        if (!c->fanq)
            c->fantail = &c->fanq;
        pthread_mutex_unlock(&c->fanlock);
        run_peer(j->c, j->p, j->ops, j->n);
        struct fan_latch *l = j->latch;
        pthread_mutex_lock(&l->lock);
        if (--l->left == 0)
            pthread_cond_signal(&l->cond);
        pthread_mutex_unlock(&l->lock);
        pthread_mutex_lock(&c->fanlock);
    }
    pthread_mutex_unlock(&c->fanlock);
    return NULL;
}

/* Queues jobs[0..k) for the fan threads; fan_wait waits for them. */
static void fan_start(struct kv__cluster *c, struct fan_job *jobs, size_t k,
                      struct fan_latch *latch)
{
    pthread_mutex_init(&latch->lock, NULL);
    pthread_cond_init(&latch->cond, NULL);
    latch->left = k;
    if (!k)
        return;
    pthread_mutex_lock(&c->fanlock);
    for (size_t i = 0; i < k; i++) {
        jobs[i].latch = latch;
        *c->fantail = &jobs[i];
        c->fantail = &jobs[i].next;
    }
    pthread_cond_broadcast(&c->fancond);
    pthread_mutex_unlock(&c->fanlock);
}

static void fan_wait(struct fan_latch *latch)
{
    pthread_mutex_lock(&latch->lock);
    while (latch->left)
        pthread_cond_wait(&latch->cond, &latch->lock);
    pthread_mutex_unlock(&latch->lock);
    pthread_mutex_destroy(&latch->lock);
    pthread_cond_destroy(&latch->cond);
}

/* Runs each group g[start[p]..start[p+1]) on owner p, on this thread as
 * much as it can (see the top of this file). */
static void run_groups(struct kv__cluster *c, struct view *v, struct kv__op *g,
                       const size_t *start)
{
    int many = c->ops->batch_many != NULL;
    size_t remote = 0;
    for (size_t p = 0; p < v->n; p++)
        remote += start[p + 1] > start[p] && !v->owners[p]->self;
    struct leg *l = NULL;
    struct fan_job *jobs = NULL;
    struct kv__batch *b = NULL;
    if (remote >= 2 && (many || c->nfan)) {
        l = calloc(remote, sizeof *l);
        jobs = calloc(remote, sizeof *jobs);
        b = calloc(remote, sizeof *b);
    }
    if (!l || !jobs || !b) {   /* one owner after the other */
        free(l);
        free(jobs);
        free(b);
        for (size_t p = 0; p < v->n; p++)
            run_peer(c, v->owners[p], g + start[p], start[p + 1] - start[p]);
        return;
    }
    struct kv__op *mine = NULL;
    size_t nmine = 0, nl = 0, nj = 0, nb = 0;
    for (size_t p = 0; p < v->n; p++) {
        if (start[p + 1] == start[p])
            continue;
        if (v->owners[p]->self) {
            mine = g + start[p];
            nmine = start[p + 1] - start[p];
        } else {
            l[nl++] = (struct leg){ .p = v->owners[p], .ops = g + start[p],
                                    .n = start[p + 1] - start[p] };
        }
    }
    /* Who drives which leg: with batch_many, this thread every leg that has
     * a pooled connection and the fan threads those that must connect
     * first; without it, this thread the first leg and the fan threads the
     * others. The fan threads start first, so they overlap the local share. */
    for (size_t i = 0; i < nl; i++) {
        if (many)
            leg_take(c, &l[i]);
        if ((many ? l[i].conn != NULL : i == 0) || !c->nfan)
            continue;
        jobs[nj++] = (struct fan_job){ .c = c, .p = l[i].p, .ops = l[i].ops, .n = l[i].n };
        l[i].fanned = 1;
    }
    struct fan_latch latch;
    fan_start(c, jobs, nj, &latch);
    if (mine)
        run_local(c, mine, nmine);
    for (size_t i = 0; many && i < nl; i++)
        if (l[i].conn)
            b[nb++] = (struct kv__batch){ .conn = l[i].conn, .ops = l[i].ops, .n = l[i].n };
    if (nb)
        c->ops->batch_many(b, nb);
    for (size_t i = 0, j = 0; i < nl; i++) {
        if (l[i].conn)
            leg_finish(c, &l[i], b[j++].rc);
        else if (!l[i].fanned)
            run_peer(c, l[i].p, l[i].ops, l[i].n);
    }
    fan_wait(&latch);
    free(l);
    free(jobs);
    free(b);
}

/*
 * Groups ops by their peer (owner index in the view) and runs one batch per
 * peer. owner[i] is the view index of ops[i]'s target. The groups are built
 * in a scratch copy, then results copied back.
 */
static int run_grouped(struct kv__cluster *c, struct view *v, struct kv__op *ops,
                       size_t *owner, size_t n)
{
    if (!n)
        return KV_OK;
    size_t *start = calloc(v->n + 1, sizeof *start), *pos = malloc(n * sizeof *pos);
    struct kv__op *g = malloc(n * sizeof *g);
    if (!start || !pos || !g) {
        free(start);
        free(pos);
        free(g);
        return KV_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        start[owner[i] + 1]++;
    for (size_t p = 0; p < v->n; p++)
        start[p + 1] += start[p];
    size_t *fill = calloc(v->n ? v->n : 1, sizeof *fill);
    if (!fill) {
        free(start);
        free(pos);
        free(g);
        return KV_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        pos[i] = start[owner[i]] + fill[owner[i]]++;
        g[pos[i]] = ops[i];
    }
    run_groups(c, v, g, start);
    for (size_t i = 0; i < n; i++)
        ops[i] = g[pos[i]];
    free(fill);
    free(start);
    free(pos);
    free(g);
    return KV_OK;
}

/* A shard's candidate owners: HRW order, this node first when it is one,
 * peers marked down last. Returns the count. */
static size_t candidates(struct view *v, const kv_block_id *id, unsigned r, size_t *out)
{
    size_t k = kv__place(v->seeds, v->n, id, r, out), w = 0;
    size_t tmp[KV_PLACE_MAX];
    for (size_t i = 0; i < k; i++)
        if (v->owners[out[i]]->self)
            tmp[w++] = out[i];
    for (size_t i = 0; i < k; i++)
        if (!v->owners[out[i]]->self && !peer_is_down(v->owners[out[i]]))
            tmp[w++] = out[i];
    for (size_t i = 0; i < k; i++)
        if (peer_is_down(v->owners[out[i]]))
            tmp[w++] = out[i];
    memcpy(out, tmp, k * sizeof *out);
    return k;
}

/* A shard's owners in the previous view pv that are live owners now (as
 * indexes into v) and not among cur[0..ncur); at most KV_PLACE_MAX. */
static size_t prev_candidates(struct view *v, struct view *pv, const kv_block_id *id,
                              unsigned r, const size_t *cur, size_t ncur, size_t *out)
{
    size_t pc[KV_PLACE_MAX], k = 0;
    size_t m = kv__place(pv->seeds, pv->n, id, r, pc);
    for (size_t j = 0; j < m; j++) {
        size_t at = SIZE_MAX;
        for (size_t x = 0; x < v->n; x++)
            if (v->owners[x] == pv->owners[pc[j]]) {
                at = x;
                break;
            }
        int dup = at == SIZE_MAX;
        for (size_t x = 0; x < ncur && !dup; x++)
            dup = cur[x] == at;
        if (!dup)
            out[k++] = at;
    }
    return k;
}

/* A shard's owners in v without the members flagged leaving (view_stay),
 * as indexes into v, that are not among cur[0..ncur); at most
 * KV_PLACE_MAX, none when nobody is leaving. */
static size_t stay_candidates(struct view *v, const kv_block_id *id, unsigned r,
                              const size_t *cur, size_t ncur, size_t *out)
{
    if (!v->nstay)
        return 0;
    size_t o[KV_PLACE_MAX], k = 0;
    size_t m = kv__place(v->stay_seeds, v->nstay, id, r, o);
    for (size_t j = 0; j < m; j++) {
        size_t at = v->stay[o[j]];
        int dup = 0;
        for (size_t x = 0; x < ncur && !dup; x++)
            dup = cur[x] == at;
        if (!dup)
            out[k++] = at;
    }
    return k;
}

/* Which of two failures to report: the one that says most about the data. */
static int worse(int a, int b)
{
    static const int rank[] = { KV_ENOSPC, KV_EINVAL, KV_ENOTFOUND, KV_ENOMEM, KV_EPERM,
                                KV_EPROTO, KV_ETIMEDOUT, KV_ENET };
    if (a == KV_OK)
        return b;
    for (size_t i = 0; i < KV__ARRAY_LEN(rank); i++) {
        if (a == rank[i])
            return a;
        if (b == rank[i])
            return b;
    }
    return a;
}

/* ---- re-replication ------------------------------------------------------
 *
 * When the owners change, a block's owner set may gain members that do not
 * hold it: a new node, or the next-best owner of a block whose owner died.
 * One thread per owner copies what it holds to those new owners, in the
 * background and at most cluster.rereplicate_mib_s, newest blocks first
 * (the ones a serving engine is likeliest to ask for again).
 *
 * Who copies: for each block, exactly one holder, so that a block is sent
 * once per new owner however many copies survive. The holders are its
 * owners in the view before the change; the copier is the first of them
 * (in the new view's HRW order) that is still an owner of the block, else
 * the first of them still alive (a join moved the block away from it).
 * Everyone computes the same answer from the same two views. Nothing is
 * removed here but the copies of plain keys (below), so a block stays
 * readable throughout; copies of blocks left on a node that is no longer an
 * owner age out by eviction (a block's bytes never change, so an extra copy
 * is only memory).
 *
 * Plain keys move instead: a holder that is no longer one of a key's owners
 * copies it to the new owners itself (besides the copier: a second copy of
 * a dump is skipped by an owner that has it) and then drops its own, once
 * every new owner has it. A value can be replaced or removed, and a stale
 * copy left behind would be read again as soon as the owners changed back
 * (the newcomer leaving), long after the move window. Not to an owner
 * flagged leaving, and not dropped when a write of the key was served here
 * while its copy ran: a leaver forwards what it is sent to the owners
 * without it, which may be this node, and the drop would remove that.
 *
 * A remove may run while a plain key is being copied: every batch carries
 * when its values were read (its stamp), and a new owner that served a
 * remove of the key after that refuses it (tomb.h; sv_store_copy). The
 * key then stays here, neither copied nor dropped, and is read and sent
 * again a little later (rr_copy_retry): removed here too, it is gone.
 *
 * A newer owner change stops the running job; the next one starts from the
 * oldest view not fully handled, so nothing the first change needed is
 * skipped. Not the engine's task pool: a job is one long, mostly sleeping
 * walk, and a pool worker held by it would be one fewer for serving.
 */
#define RR_BATCH_BYTES (4u << 20)
#define RR_BATCH_SHARDS 256

struct rr_item {
    kv_block_id id;
    uint64_t used, len;
    uint32_t index;
    uint8_t ns, ntargets;
    uint8_t drop;                       /* a plain key this node no longer owns */
    uint8_t failed;                     /* its copy failed (a leave tries once more) */
    uint8_t refused;                    /* a target refused it as read before a remove
                                         * it served: read it again later (tomb.h) */
    uint8_t keep;                       /* a hand-off's plain key from an earlier view: it
                                         * does not replace what its new owner holds */
    uint8_t targets[KV_PLACE_MAX];      /* owner indexes in the new view */
};

struct rr_scan {
    struct kv__cluster *c;
    struct view *from, *to;
    int handoff;                        /* a leave's: every shard this node owns */
    /* A leave's earlier views (handoff): the oldest owner change whose
     * re-replication has not run to its end, and the one before the last
     * change; may be NULL. */
    struct view *olds[2];
    int ns;
    struct rr_item *v;
    size_t n, cap;
    int oom;
    /* the last block decided (a block's shards come one after another) */
    kv_block_id last;
    int have_last, last_copy, last_drop, last_keep;
    uint8_t last_targets[KV_PLACE_MAX], last_nt;
};

static size_t view_index(struct view *v, struct peer *p)
{
    for (size_t i = 0; i < v->n; i++)
        if (v->owners[i] == p)
            return i;
    return SIZE_MAX;
}

/* Whether this node copies block id, and to which owners of the new view;
 * *drop: it then drops its own copy (a plain key it no longer owns). */
static int rr_decide(struct rr_scan *s, const kv_block_id *id, uint8_t *targets, uint8_t *nt,
                     int *drop)
{
    size_t o[KV_PLACE_MAX], w[KV_PLACE_MAX];
    unsigned r = s->c->replicas;
    size_t no = kv__place(s->from->seeds, s->from->n, id, r, o);
    size_t nw = kv__place(s->to->seeds, s->to->n, id, r, w);
    int self_held = 0;
    for (size_t i = 0; i < no; i++)
        self_held |= s->from->owners[o[i]]->self;
    *drop = 0;
    if (!self_held)
        return 0;
    *nt = 0;
    struct peer *copier = NULL;
    int self_owns = 0;
    for (size_t i = 0; i < nw; i++) {
        struct peer *p = s->to->owners[w[i]];
        self_owns |= p->self;
        int held = 0;
        for (size_t j = 0; j < no && !held; j++)
            held = s->from->owners[o[j]] == p;
        if (!held)
            targets[(*nt)++] = (uint8_t)w[i];
        else if (!copier)
            copier = p;
    }
    for (size_t j = 0; j < no && !copier; j++)
        if (view_index(s->to, s->from->owners[o[j]]) != SIZE_MAX)
            copier = s->from->owners[o[j]];
    if (s->ns == KV_NS_KEY && !self_owns && s->c->be->remove) {
        /* Not to an owner that is leaving: it has handed off (or is handing
         * off) already, so what we copy to it comes back to us through its
         * forwarding, and our drop would then remove the only copy. Ours
         * stays; the view without the leaver makes us its owner again. */
        for (size_t i = 0; i < nw; i++)
            if (s->to->leaving && s->to->leaving[w[i]])
                return 0;
        *drop = 1;
        return 1;
    }
    return *nt && copier && copier->self;
}

/* Whether this node is among the no owners o[] of view v. */
static int owns_in(struct view *v, const size_t *o, size_t no)
{
    for (size_t i = 0; i < no; i++)
        if (v->owners[o[i]]->self)
            return 1;
    return 0;
}

/* A leaving node's rule (see handoff): a shard it owns in the view (from)
 * goes to its owners in the view without it (to) that are not owners now;
 * one it owned only in an earlier view whose re-replication has not run
 * (s->olds) goes to its owners in to that were not owners then, unless
 * one of those that were stays an owner (it holds the shard, and its own
 * re-replication copies it on), and it replaces nothing there (*keep). */
static int handoff_decide(struct rr_scan *s, const kv_block_id *id, uint8_t *targets,
                          uint8_t *nt, int *keep)
{
    size_t o[KV_PLACE_MAX], w[KV_PLACE_MAX];
    unsigned r = s->c->replicas;
    size_t nw = kv__place(s->to->seeds, s->to->n, id, r, w);
    size_t no = kv__place(s->from->seeds, s->from->n, id, r, o);
    struct view *held = owns_in(s->from, o, no) ? s->from : NULL;
    *keep = 0;
    *nt = 0;
    for (size_t k = 0; !held && k < KV__ARRAY_LEN(s->olds); k++) {
        struct view *ov = s->olds[k];
        if (!ov)
            continue;
        no = kv__place(ov->seeds, ov->n, id, r, o);
        if (owns_in(ov, o, no)) {
            held = ov;
            *keep = 1;
        }
    }
    for (size_t i = 0; held && i < nw; i++) {
        int had = 0;
        for (size_t j = 0; j < no && !had; j++)
            had = held->owners[o[j]] == s->to->owners[w[i]];
        if (had && *keep)
            return *nt = 0;
        if (!had)
            targets[(*nt)++] = (uint8_t)w[i];
    }
    return *nt > 0;
}

static int rr_visit(void *arg, const kv_block_id *id, uint32_t index, uint64_t len,
                    uint64_t used)
{
    struct rr_scan *s = arg;
    if (!s->have_last || memcmp(&s->last, id, sizeof *id) != 0) {
        s->last = *id;
        s->have_last = 1;
        s->last_keep = 0;
        s->last_copy = s->handoff ? handoff_decide(s, id, s->last_targets, &s->last_nt,
                                                   &s->last_keep)
                                  : rr_decide(s, id, s->last_targets, &s->last_nt, &s->last_drop);
        if (s->handoff)
            s->last_drop = 0;
    }
    if (!s->last_copy)
        return 0;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 1024;
        struct rr_item *p = realloc(s->v, nc * sizeof *p);
        if (!p) {
            s->oom = 1;
            return 1;
        }
        s->v = p;
        s->cap = nc;
    }
    struct rr_item *it = &s->v[s->n++];
    *it = (struct rr_item){ .id = *id, .used = used, .len = len, .index = index,
                            .ns = (uint8_t)s->ns, .ntargets = s->last_nt,
                            .drop = (uint8_t)s->last_drop, .keep = (uint8_t)s->last_keep };
    memcpy(it->targets, s->last_targets, sizeof it->targets);
    return 0;
}

static int rr_newest_first(const void *a, const void *b)
{
    const struct rr_item *x = a, *y = b;
    if (x->used != y->used)
        return x->used > y->used ? -1 : 1;
    int k = memcmp(&x->id, &y->id, sizeof x->id);
    return k ? k : x->index < y->index ? -1 : x->index > y->index;
}

/* Whether the job of generation gen should stop. */
static int rr_cancelled(struct kv__cluster *c, uint64_t gen)
{
    pthread_mutex_lock(&c->rrlock);
    int stop = c->rr_stop || c->rr_gen != gen;
    pthread_mutex_unlock(&c->rrlock);
    return stop;
}

/* Sleeps until kv__now_ms() reaches until, or the job is cancelled. */
static void rr_sleep_until(struct kv__cluster *c, uint64_t until, uint64_t gen)
{
    pthread_mutex_lock(&c->rrlock);
    while (!c->rr_stop && c->rr_gen == gen) {
        uint64_t now = kv__now_ms();
        if (now >= until)
            break;
        cond_wait_ms(&c->rrcond, &c->rrlock, until - now);
    }
    pthread_mutex_unlock(&c->rrlock);
}

/* How a copy runs: a re-replication job's generation and rate, or a
 * leave's hand-off (until a deadline, at full speed, each batch under
 * lvlock, plain keys replacing what their new owners hold). */
struct rr_how {
    uint64_t gen;
    int handoff;
    uint64_t deadline_ms;
};

static int rr_stopped(struct kv__cluster *c, const struct rr_how *h)
{
    return h->handoff ? kv__now_ms() >= h->deadline_ms : rr_cancelled(c, h->gen);
}

/* Copies items[0..n) to their targets, one batch at a time, within the
 * rate; returns the next item not done (n when all are). */
static size_t rr_copy(struct kv__cluster *c, struct view *to, struct rr_item *items, size_t n,
                      const struct rr_how *h)
{
    struct kv__backend *be = c->be;
    double bytes_per_ms = c->cfg.cluster.rereplicate_mib_s * 1048576.0 / 1000.0;
    uint64_t gen = h->gen;
    uint64_t t0 = kv__now_ms(), sent = 0;
    struct kv__op *ops = malloc(RR_BATCH_SHARDS * KV_PLACE_MAX * sizeof *ops);
    size_t *owner = malloc(RR_BATCH_SHARDS * KV_PLACE_MAX * sizeof *owner);
    uint8_t **buf = calloc(RR_BATCH_SHARDS, sizeof *buf);
    kv_iov *iov = malloc(RR_BATCH_SHARDS * sizeof *iov);
    size_t *of = malloc(RR_BATCH_SHARDS * KV_PLACE_MAX * sizeof *of);
    kv_block_id *mv = malloc(RR_BATCH_SHARDS * sizeof *mv);
    uint8_t *mv_hit = malloc(RR_BATCH_SHARDS);
    size_t *mvat = malloc(RR_BATCH_SHARDS * sizeof *mvat);   /* each item's place in mv */
    size_t i = 0;
    if (!ops || !owner || !buf || !iov || !of || !mv || !mv_hit || !mvat)
        goto out;
    while (i < n && !rr_stopped(c, h)) {
        size_t k = 0, nb = 0, nmv = 0;
        uint64_t bytes = 0;
        size_t first = i;
        /* The batch's stamp: before its first read, so no value in it was
         * read earlier (tomb.h). In flight from here until its answers are
         * in (sv_copying). */
        atomic_fetch_add(&c->copying, 1);
        uint64_t stamp = kv__wall_ms();
        /* A forwarded write (leave_forward) comes before or after a whole
         * batch, never between its read and its send. */
        if (h->handoff)
            pthread_mutex_lock(&c->lvlock);
        for (; i < n && nb < RR_BATCH_SHARDS && (nb == 0 || bytes < RR_BATCH_BYTES); i++) {
            struct rr_item *it = &items[i];
            if (!it->ntargets) {   /* every new owner had it: only the drop */
                be->remove(be->ctx, it->ns, &it->id, it->index);
                atomic_fetch_sub(&c->rr_pending, 1);
                continue;
            }
            uint8_t *b = malloc(it->len ? it->len : 1);
            if (!b)
                break;
            iov[nb] = (kv_iov){ b, it->len };
            /* Gone since the scan (evicted): nothing to copy. */
            if (be->load(be->ctx, it->ns, &it->id, it->index, &iov[nb], 1) != KV_OK) {
                free(b);
                atomic_fetch_sub(&c->rr_pending, 1);
                continue;
            }
            buf[nb] = b;
            mvat[nb] = SIZE_MAX;
            if (it->drop) {
                mvat[nb] = nmv;
                mv[nmv] = it->id;
                mv_hit[nmv++] = 0;
            }
            for (uint8_t t = 0; t < it->ntargets; t++) {
                ops[k] = (struct kv__op){ .kind = KV_OP_DUMP, .ns = it->ns, .index = it->index,
                                          .id = it->id, .iov = &iov[nb], .iovcnt = 1,
                                          .replace = h->handoff && it->ns == KV_NS_KEY &&
                                                     !it->keep,
                                          .view = to->version, .internal = 1,
                                          .stamp = stamp };
                owner[k] = it->targets[t];
                of[k] = i;
                k++;
                bytes += it->len;
            }
            nb++;
        }
        /* The keys it moves are watched while it runs: a write of one
         * served here meanwhile (above all a leaving new owner forwarding
         * our own copy back, which it stored) says our copy is not ours to
         * drop (sv_moved). */
        if (nmv) {
            pthread_mutex_lock(&c->mvlock);
            c->mv = mv;
            c->mv_hit = mv_hit;
            atomic_store(&c->nmv, nmv);
            pthread_mutex_unlock(&c->mvlock);
        }
        int grc = k ? run_grouped(c, to, ops, owner, k) : KV_OK;
        if (nmv) {
            pthread_mutex_lock(&c->mvlock);
            atomic_store(&c->nmv, 0);
            c->mv = NULL;
            c->mv_hit = NULL;
            pthread_mutex_unlock(&c->mvlock);
        }
        if (k && grc == KV_OK) {
            /* A shard counts once, failed when any of its targets failed;
             * refused, not failed, when one refused it as older than a
             * remove (rr_copy_retry reads it again). */
            for (size_t j = 0; j < k; j++) {
                int last = j + 1 == k || of[j + 1] != of[j];
                int ok = ops[j].result == KV_OK, refused = ops[j].result == KV_EBUSY;
                for (size_t x = j; x > 0 && of[x - 1] == of[j];) {
                    int r = ops[--x].result;
                    ok &= r == KV_OK;
                    refused |= r == KV_EBUSY;
                }
                if (!last)
                    continue;
                items[of[j]].failed = !ok;
                items[of[j]].refused = !ok && refused;
                if (ok || !refused)
                    atomic_fetch_add(!ok ? &c->rr_failed
                                     : h->handoff ? &c->handed_off : &c->rr_shards, 1);
                if (ok && !h->handoff)
                    atomic_fetch_add(&c->rr_bytes, items[of[j]].len * items[of[j]].ntargets);
                size_t b = (size_t)(ops[j].iov - iov);   /* its place in this batch */
                if (ok && items[of[j]].drop &&   /* its new owners have it now */
                    !(mvat[b] != SIZE_MAX && mv_hit[mvat[b]]))
                    be->remove(be->ctx, items[of[j]].ns, &items[of[j]].id, items[of[j]].index);
                atomic_fetch_sub(&c->rr_pending, 1);
            }
        } else if (k) {
            for (size_t j = 0; j < k; j++)
                items[of[j]].failed = 1;
            atomic_fetch_add(&c->rr_failed, nb);
            atomic_fetch_sub(&c->rr_pending, nb);
        }
        /* When it ended first, then no longer in flight (sv_copying reads
         * them the other way round). */
        atomic_store(&c->copied_ms, kv__now_ms());
        atomic_fetch_sub(&c->copying, 1);
        if (h->handoff)
            pthread_mutex_unlock(&c->lvlock);
        for (size_t j = 0; j < nb; j++) {
            free(buf[j]);
            buf[j] = NULL;
        }
        if (i == first)   /* out of memory for even one shard */
            break;
        sent += bytes;
        /* The rate: this much sent may not finish before t0 + sent / rate. */
        if (!h->handoff)
            rr_sleep_until(c, t0 + (uint64_t)((double)sent / bytes_per_ms), gen);
    }
out:
    free(ops);
    free(owner);
    free(buf);
    free(iov);
    free(of);
    free(mv);
    free(mv_hit);
    free(mvat);
    return i;
}

/* A copy refused as read before a remove its target served (tomb.h) is
 * read again after RR_RETRY_MS, and again, while the target's refusal can
 * last: a tombstone or a target's start refuses what was read up to the
 * clock margin after it, so a fresh read soon passes, or finds the key
 * removed here too (then there is nothing to copy). For at most
 * RR_REFUSED_MS (a leave: until its deadline); then it counts as failed. */
#define RR_RETRY_MS (KV__TOMB_SKEW_MS / 4)
#define RR_REFUSED_MS 30000

/* rr_copy, then its refused items again, as above; returns as rr_copy
 * does (stopped while items are refused: the first of them). */
static size_t rr_copy_retry(struct kv__cluster *c, struct view *to, struct rr_item *items,
                            size_t n, const struct rr_how *h)
{
    size_t at = rr_copy(c, to, items, n, h);
    uint64_t t0 = kv__now_ms(), until = h->handoff ? h->deadline_ms : t0 + RR_REFUSED_MS;
    struct rr_item *again = NULL;
    size_t *where = NULL, k;
    for (;;) {
        k = 0;
        for (size_t i = 0; i < at; i++)
            k += items[i].refused;
        if (!k || at < n)
            break;
        if (kv__now_ms() + RR_RETRY_MS >= until ||
            (!again && (!(again = malloc(k * sizeof *again)) ||
                        !(where = malloc(k * sizeof *where))))) {
            /* given up on (or no memory to try): failed */
            atomic_fetch_add(&c->rr_failed, k);
            KV_WARN("cluster: %zu plain keys' copies still refused after %.1f s (read before a "
                    "remove their new owner served); they stay here", k,
                    (double)(kv__now_ms() - t0) / 1000.0);
            for (size_t i = 0; i < n; i++)
                items[i].refused = 0;
            break;
        }
        if (h->handoff)
            usleep(RR_RETRY_MS * 1000u);
        else
            rr_sleep_until(c, kv__now_ms() + RR_RETRY_MS, h->gen);
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (items[i].refused) {
                where[m] = i;
                again[m] = items[i];
                again[m].failed = again[m].refused = 0;
                m++;
            }
        if (rr_stopped(c, h)) {   /* a newer job, or the deadline: not done */
            at = where[0];
            break;
        }
        atomic_fetch_add(&c->rr_pending, m);
        size_t got = rr_copy(c, to, again, m, h);
        for (size_t j = 0; j < got; j++) {
            items[where[j]].failed = again[j].failed;
            items[where[j]].refused = again[j].refused;
        }
        if (got < m)
            at = where[got];
    }
    free(again);
    free(where);
    return at;
}

/* One job: from the view before an owner change to the view after it.
 * Returns whether it ran to the end. */
static int rr_run(struct kv__cluster *c, struct view *from, struct view *to, uint64_t gen)
{
    struct rr_scan s = { .c = c, .from = from, .to = to };
    if (!c->be || !c->be->scan)
        return 1;
    for (int ns = 0; ns < KV_NS_COUNT && !s.oom; ns++) {
        s.ns = ns;
        s.have_last = 0;
        c->be->scan(c->be->ctx, ns, rr_visit, &s);
    }
    if (s.oom)
        KV_WARN("cluster: re-replication: out of memory listing blocks; copying %zu", s.n);
    uint64_t bytes = 0;
    size_t blocks = 0;
    if (s.n)   /* (qsort's array must not be NULL, even for none) */
        qsort(s.v, s.n, sizeof *s.v, rr_newest_first);
    for (size_t i = 0; i < s.n; i++) {
        bytes += s.v[i].len * s.v[i].ntargets;
        blocks += i == 0 || memcmp(&s.v[i].id, &s.v[i - 1].id, sizeof s.v[i].id) != 0 ||
                  s.v[i].ns != s.v[i - 1].ns;
    }
    KV_INFO("cluster: view %llu (owners %zu -> %zu): re-replicating %zu blocks (%zu shards, "
            "%.1f MiB) to their new owners, at most %u MiB/s",
            (unsigned long long)to->version, from->n, to->n, blocks, s.n,
            (double)bytes / 1048576.0, c->cfg.cluster.rereplicate_mib_s);
    atomic_store(&c->rr_pending, s.n);
    uint64_t t0 = kv__now_ms(), done0 = atomic_load(&c->rr_shards),
             failed0 = atomic_load(&c->rr_failed);
    struct rr_how how = { .gen = gen };
    size_t at = s.n ? rr_copy_retry(c, to, s.v, s.n, &how) : 0;
    int complete = at == s.n;
    KV_INFO("cluster: view %llu: re-replication %s: %llu shards copied, %llu failed, in %.2f s",
            (unsigned long long)to->version, complete ? "done" : "stopped (a newer view)",
            (unsigned long long)(atomic_load(&c->rr_shards) - done0),
            (unsigned long long)(atomic_load(&c->rr_failed) - failed0),
            (double)(kv__now_ms() - t0) / 1000.0);
    if (complete)
        atomic_fetch_add(&c->rr_jobs, 1);
    atomic_store(&c->rr_pending, 0);
    free(s.v);
    return complete;
}

static void *rr_main(void *arg)
{
    struct kv__cluster *c = arg;
    pthread_mutex_lock(&c->rrlock);
    for (;;) {
        while (!c->rr_from && !c->rr_stop)
            pthread_cond_wait(&c->rrcond, &c->rrlock);
        if (c->rr_stop)
            break;
        struct view *from = c->rr_from, *to = c->rr_to;
        uint64_t gen = c->rr_gen, seq = c->rr_seq;
        c->rr_from = c->rr_to = NULL;
        pthread_mutex_unlock(&c->rrlock);
        int complete = rr_run(c, from, to, gen);
        if (complete)
            atomic_store(&c->rr_done, seq);
        pthread_mutex_lock(&c->rrlock);
        if (!complete && c->rr_from) {
            /* The next job starts from where this one did. */
            view_put(c->rr_from);
            c->rr_from = from;
            from = NULL;
        } else if (!complete && c->rr_stop) {
            /* Stopped for a leave: its hand-off covers what this job had
             * still to copy (handoff reads rr_from). */
            c->rr_from = from;
            c->rr_to = to;
            from = to = NULL;
        }
        pthread_mutex_unlock(&c->rrlock);
        view_put(from);
        view_put(to);
        pthread_mutex_lock(&c->rrlock);
    }
    pthread_mutex_unlock(&c->rrlock);
    return NULL;
}

/* Takes over the references to from and to; seq numbers the change.
 * Once stopped, the job is still recorded (never run): a leave's hand-off
 * covers it, and kv__cluster_stop drops it. */
static void rr_enqueue(struct kv__cluster *c, struct view *from, struct view *to, uint64_t seq)
{
    pthread_mutex_lock(&c->rrlock);
    if (c->rr_from) {   /* one not started yet: keep its start, take the end */
        view_put(from);
        view_put(c->rr_to);
    } else {
        c->rr_from = from;
    }
    c->rr_to = to;
    c->rr_seq = seq;
    c->rr_gen++;
    pthread_cond_signal(&c->rrcond);
    pthread_mutex_unlock(&c->rrlock);
}

/* ---- a call whose owner failed ------------------------------------------
 *
 * A caller's view can be behind the store's: its heartbeat came late (the
 * process was stopped, the host was busy), so it still routes to a member
 * that has left since. That member fails the call with KV_ENET (it is
 * gone) or answers KV_ECLOSED (it has left and takes no more writes: "not
 * an owner"). Such an item does not fail at once: the caller has the view
 * fetched (view_refresh; one fetch serves every caller waiting then) and,
 * when that view is another one, runs the failed items once more on it.
 * Once, and only while the call is younger than T, the fetch waiting at
 * most the rest of T; the second try has its own T, so a call stays within
 * the 2 T a load's failover already takes (io.timeout_ms, the task's
 * deadline). A member that died without leaving is still in the fresh
 * view until node_ttl_ms: its items fail as before, after one fetch.
 */
static int owner_failed(int r)
{
    return r == KV_ENET || r == KV_ECLOSED || r == KV_ETIMEDOUT;
}

/* For a call begun at t0 on view version ver, one of whose items failed
 * as above: fetches the view and says whether it is another one now. */
static int view_moved_wait(struct kv__cluster *c, uint64_t t0, uint64_t ver, int closed);

static int view_moved(struct kv__cluster *c, uint64_t t0, uint64_t ver)
{
    return view_moved_wait(c, t0, ver, 0);
}

/* closed: an item was answered KV_ECLOSED. That member is alive and says
 * a newer view than ours exists (it left, or owns nothing of ours in its
 * view: sv_admit), so the view will move: the fetches go on, a round
 * REFRESH_GAP_MS apart at most, until it has or T is spent. Otherwise
 * (a network error: the member may simply be unreachable for a moment)
 * two rounds. One fetch is not enough where the view comes from a cache
 * (etcd's watch, whose events may land just after a fetch that read it). */
static int view_moved_wait(struct kv__cluster *c, uint64_t t0, uint64_t ver, int closed)
{
    for (int round = 0;; round++) {
        uint64_t spent = kv__now_ms() - t0;
        if (spent >= c->call_ms)
            return 0;
        /* A fetch begun since the call began is fresh enough: a member is
         * out of the view for two heartbeats before it stops serving (its
         * grace), and it answers KV_ECLOSED, not a closed port, until then. */
        pthread_mutex_lock(&c->hblock);
        int fresh = round == 0 && c->hb_began_ms >= t0, stopping = c->stopping;
        pthread_mutex_unlock(&c->hblock);
        if (stopping && round > 0)
            return 0;   /* no more fetches will come */
        if (!fresh)
            view_refresh(c, (unsigned)(c->call_ms - spent));
        struct view *v = view_get(c);
        int moved = v->version != ver;
        view_put(v);
        /* A network error gets one more round: with etcd the first fetch
         * may read the watch's cache a moment before the leave's event
         * lands (stale_view_retries_on_the_new_owner failed so in CI:
         * "2 calls failed after the member left (first: network error)") */
        if (moved || (!closed && round >= 1))
            return moved;
        /* the next view_refresh waits for a round begun after it asked:
         * rounds start REFRESH_GAP_MS apart at most, shared by callers */
    }
}

/* The items of results[0..n) to run once more (their indexes in *idx,
 * malloc'd); 0 when none failed as above or the view did not move. */
static size_t retry_pick(struct kv__cluster *c, uint64_t t0, uint64_t ver, const int *results,
                         size_t n, size_t **idx)
{
    size_t k = 0;
    int closed = 0;
    *idx = NULL;
    for (size_t i = 0; i < n; i++) {
        k += owner_failed(results[i]);
        closed |= results[i] == KV_ECLOSED;
    }
    if (!k || !view_moved_wait(c, t0, ver, closed) || !(*idx = malloc(k * sizeof **idx)))
        return 0;
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (owner_failed(results[i]))
            (*idx)[k++] = i;
    return k;
}

/* A call on shards (write_once, load_once): once, and once more for the
 * shards whose owner failed, as above. */
typedef int (*shards_once_fn)(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n,
                              int *results, bool replace, uint64_t *ver);

static int shards_retry(struct kv__cluster *c, shards_once_fn once, int ns,
                        const kv_shard *shards, size_t n, int *results, bool replace)
{
    uint64_t t0 = kv__now_ms(), ver = 0;
    size_t *idx;
    int rc = once(c, ns, shards, n, results, replace, &ver);
    size_t k = rc == KV_OK ? retry_pick(c, t0, ver, results, n, &idx) : 0;
    if (!k)
        return rc;
    kv_shard *sub = malloc(k * sizeof *sub);
    int *res = malloc(k * sizeof *res);
    if (sub && res) {
        for (size_t j = 0; j < k; j++)
            sub[j] = shards[idx[j]];
        if (once(c, ns, sub, k, res, replace, &ver) == KV_OK)
            for (size_t j = 0; j < k; j++)
                results[idx[j]] = res[j];
    }
    free(sub);
    free(res);
    free(idx);
    return rc;
}

/* ---- a graceful leave -----------------------------------------------------
 *
 * An owner that closes (kv_close, a garbage-collected Python store, SIGTERM
 * to kvnode) must not take its share of the data with it, nor fail the
 * writes that other members still route to it. kv__cluster_stop does, in
 * this order:
 *
 * 1. Say so: the heartbeat thread puts our record again flagged
 *    KV_MEMBER_LEAVING and reads the view in the same call (a kvmaster
 *    JOIN; etcd's put, then its read). The owners that answer shows
 *    flagged already are leaving too: they are passed over below (skip).
 * 2. Forwarding on: every write this node serves from now on (a dump, a
 *    put, a remove from a peer whose view still has us) also goes to the
 *    id's owners in the view without this node and the skipped ones,
 *    before it is answered. Writes already being stored unforwarded are
 *    waited for (wr_plain), so the scan below sees them.
 * 3. Hand-off: every shard this node owns (plain keys first: a block can
 *    be computed again, a value cannot; then newest first) is sent to the
 *    owners the view will have without it, at full speed, until
 *    io.timeout_ms (5 s without one) has passed. This is re-replication's
 *    copy (rr_copy), with a leave's rule (handoff_decide) and plain keys
 *    replacing what their next owner holds. lvlock orders each batch
 *    against forwarded writes: a batch reads and sends its values with no
 *    forward in between, so an older value never lands over a newer one.
 *    Shards whose copy failed (their next owner left meanwhile) go once
 *    more to their owners in a view fetched then.
 * 4. Leave: the heartbeat stops and the record is removed; the peers learn
 *    it at their next heartbeat (kvmaster), or at once by the watch (etcd).
 * 5. Grace: this node serves (and forwards) for two of its heartbeat
 *    periods more, by which time every member has fetched a view without
 *    it (members heartbeat at the same period when they share
 *    cluster.node_ttl_ms) and calls begun on the older view are done.
 *    Then it answers writes KV_ECLOSED (not an owner: the caller fetches
 *    the view and goes to the new owner) until the transport closes.
 *
 * So a survivor's puts to the keys this node owned succeed throughout: to
 * us with forwarding, then to their new owners, which already hold what we
 * had; a caller whose view is older still than the grace retries on its
 * fetched view (above). What the deadline in 3 cuts off is logged; blocks
 * then go the way of a node's death (a miss, unless replica_num kept a
 * copy).
 *
 * Several members leaving at once. Each batch of a hand-off, and each
 * forward, holds its sender's lvlock until the receiver has answered, and
 * a receiver that is leaving forwards under its own lvlock before it
 * answers: two leavers sending to each other would wait on each other
 * until the call deadline T (they did, before the flag). The flag orders
 * them: the membership store serializes the two puts-and-reads, so of two
 * leavers the later one's answer shows the earlier flagged, and the later
 * one skips it; only the earlier one may send to the later one, which
 * stores and forwards on to owners past both. Sends go from earlier to
 * later leavers only, so no cycle of waits can form. The earlier one keeps
 * sending to the later one (the skip list is fixed at step 1) so that both
 * of them hold the newest value of what passes through: a reader whose
 * view has the later leaver as the owner finds it there.
 */

/* The current view less the owners this node skips (leaving before it),
 * and less this node too when less_self: while leaving, where the data is
 * now and where it goes. The data is where it will be once the skipped
 * ones are gone: a shard an earlier leaver handed or forwarded to us is
 * ours to hand on, though the full view still names that leaver. */
static struct view *view_less(struct kv__cluster *c, int less_self)
{
    struct view *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->c = c;
    w->refs = 1;
    pthread_mutex_lock(&c->vlock);
    struct view *v = c->view;
    w->owners = calloc(v->n ? v->n : 1, sizeof *w->owners);
    w->seeds = calloc(v->n ? v->n : 1, sizeof *w->seeds);
    if (w->owners && w->seeds) {
        w->version = v->version;
        w->nmembers = v->nmembers;
        for (size_t i = 0; i < v->n; i++) {
            int skip = less_self && v->owners[i]->self;
            for (size_t j = 0; j < c->nskip && !skip; j++)
                skip = strcmp(c->skip[j], v->owners[i]->id) == 0;
            if (skip)
                continue;
            v->owners[i]->refs++;
            w->owners[w->n] = v->owners[i];
            w->seeds[w->n++] = v->owners[i]->seed;
        }
    }
    pthread_mutex_unlock(&c->vlock);
    if (!w->owners || !w->seeds) {
        view_put(w);
        return NULL;
    }
    return w;
}

/* The owners other than this one that m[0..n) flags as leaving, into
 * *out (malloc'd); returns the count. */
static size_t leavers_in(struct kv__cluster *c, const struct kv__member *m, size_t n,
                         char (**out)[KV_PROTO_ID_MAX + 1])
{
    size_t k = 0;
    *out = NULL;
    for (size_t i = 0; i < n; i++)
        k += (m[i].flags & KV_MEMBER_LEAVING) && strcmp(m[i].id, c->self.id) != 0;
    if (!k || !(*out = malloc(k * sizeof **out)))
        return 0;
    k = 0;
    for (size_t i = 0; i < n; i++)
        if ((m[i].flags & KV_MEMBER_LEAVING) && strcmp(m[i].id, c->self.id) != 0)
            snprintf((*out)[k++], sizeof **out, "%s", m[i].id);
    return k;
}

/* Step 1: has the heartbeat thread say we leave; waits at most timeout_ms.
 * c->skip holds the owners found leaving already once it returns KV_OK. */
static int publish_leaving(struct kv__cluster *c, unsigned timeout_ms)
{
    uint64_t until = kv__now_ms() + timeout_ms;
    pthread_mutex_lock(&c->hblock);
    c->publish = 1;
    pthread_cond_broadcast(&c->hbcond);
    while (c->publish == 1 && !c->stopping) {
        uint64_t now = kv__now_ms();
        if (now >= until)
            break;
        cond_wait_ms(&c->hbcond, &c->hblock, until - now);
    }
    int rc = c->publish == 2 ? c->publish_rc : KV_ETIMEDOUT;
    if (c->publish == 1)
        c->publish = 3;   /* a late answer is dropped, not read */
    pthread_mutex_unlock(&c->hblock);
    return rc;
}

/* Caller holds lvlock, leaving 1: op (a dump or a remove just served here)
 * goes to every owner of the id in the view for leaving. Not only to those
 * that are not its owners now: the writer may route by another view than
 * ours (a client behind, or one already past a leaver ours still shows),
 * so an owner in both views may never have had the writer's own copy, and
 * this one would go with us (an acknowledged put lost, two_members_leave_
 * at_once). A second copy to an owner that has it costs a replica's write.
 * Returns the first failure; for a remove KV_ENOTFOUND when no next owner
 * had it (or there is none). */
static int forward_once(struct kv__cluster *c, const struct kv__op *op, uint64_t *ver)
{
    struct view *to = view_less(c, 1);
    if (!to)
        return KV_ENOMEM;
    *ver = to->version;
    size_t own[KV_PLACE_MAX];
    size_t k = kv__place(to->seeds, to->n, &op->id, c->replicas, own);
    struct kv__op ops[KV_PLACE_MAX];
    for (size_t i = 0; i < k; i++) {
        ops[i] = *op;
        ops[i].view = to->version;
        ops[i].internal = 1;   /* the next owner takes it, whatever its view */
    }
    int rc = k ? run_grouped(c, to, ops, own, k) : KV_OK, found = 0;
    for (size_t j = 0; rc == KV_OK && j < k; j++) {
        found |= ops[j].result == KV_OK;
        if (ops[j].result != KV_OK && !(op->kind == KV_OP_REMOVE && ops[j].result == KV_ENOTFOUND))
            rc = ops[j].result;
    }
    if (k && rc == KV_OK)
        atomic_fetch_add(&c->forwarded, 1);
    if (rc == KV_OK && op->kind == KV_OP_REMOVE && !found)
        rc = KV_ENOTFOUND;
    view_put(to);
    return rc;
}

/* A forward whose next owner failed (it left meanwhile) goes once more, to
 * the owners of a view fetched then (see "a call whose owner failed"). */
static int leave_forward(struct kv__cluster *c, const struct kv__op *op)
{
    uint64_t t0 = kv__now_ms(), ver;
    int rc = forward_once(c, op, &ver);
    if (owner_failed(rc) && view_moved_wait(c, t0, ver, rc == KV_ECLOSED))
        rc = forward_once(c, op, &ver);
    return rc;
}

/* How a write served here goes in: counted in wr_plain (not leaving), or
 * under lvlock (leaving: forwarded first, or refused once left). */
struct sv_write {
    int locked, plain;
};

/* Caller stores the write when this returns KV_OK, then calls
 * sv_write_end. Not leaving: the write counts in wr_plain while it is
 * stored (the seq_cst pair below and in leave_gracefully: either the write
 * sees leaving set, or the leave sees the write counted and waits for it).
 * Leaving: lvlock is taken; once left (leaving 2) the write is refused with
 * KV_ECLOSED, this node being no owner any more. */
static int sv_write_begin(struct kv__cluster *c, struct sv_write *w)
{
    w->locked = w->plain = 0;
    if (atomic_load(&c->leaving) == 0) {
        atomic_fetch_add(&c->wr_plain, 1);
        if (atomic_load(&c->leaving) == 0) {
            w->plain = 1;
            return KV_OK;
        }
        atomic_fetch_sub(&c->wr_plain, 1);
    }
    pthread_mutex_lock(&c->lvlock);
    w->locked = 1;
    return atomic_load(&c->leaving) == 1 ? KV_OK : KV_ECLOSED;
}

static void sv_write_end(struct kv__cluster *c, struct sv_write *w)
{
    if (w->plain)
        atomic_fetch_sub(&c->wr_plain, 1);
    if (w->locked)
        pthread_mutex_unlock(&c->lvlock);
}

/* A write about to be stored here (dump, commit): forwarded first while
 * leaving. A copy (stamp, not 0: sv_store_copy) goes on as the copy it
 * is, judged there as here; a write as a write. */
static int leave_write(struct kv__cluster *c, int ns, const kv_block_id *id, uint32_t index,
                       const kv_iov *iov, uint32_t iovcnt, int replace, uint64_t stamp,
                       struct sv_write *w)
{
    int rc = sv_write_begin(c, w);
    if (rc != KV_OK || !w->locked)
        return rc;
    /* A plain key's value is a put (the serving side dropped the old one);
     * a block's shard is a dump its next owner skips when it has it. */
    struct kv__op op = { .kind = KV_OP_DUMP, .ns = (uint8_t)ns, .index = index, .id = *id,
                         .iov = iov, .iovcnt = iovcnt, .replace = (uint8_t)replace,
                         .stamp = stamp };
    return leave_forward(c, &op);
}

/* What the transport serves: c->be, with the writes forwarded (above). */
#define SV_BE(ctx) (((struct kv__cluster *)(ctx))->be)

static int sv_lookup(void *ctx, int ns, const kv_block_id *ids, size_t n, uint8_t *hit)
{
    return SV_BE(ctx)->lookup(SV_BE(ctx)->ctx, ns, ids, n, hit);
}

static int sv_size(void *ctx, int ns, const kv_block_id *id, uint32_t index, uint64_t *len)
{
    return SV_BE(ctx)->size(SV_BE(ctx)->ctx, ns, id, index, len);
}

static int sv_load(void *ctx, int ns, const kv_block_id *id, uint32_t index, const kv_iov *iov,
                   uint32_t iovcnt)
{
    return SV_BE(ctx)->load(SV_BE(ctx)->ctx, ns, id, index, iov, iovcnt);
}

static int sv_pin(void *ctx, int ns, const kv_block_id *id, uint32_t index, const void **data,
                  uint64_t *len, kv__pin *pin)
{
    return SV_BE(ctx)->pin(SV_BE(ctx)->ctx, ns, id, index, data, len, pin);
}

static void sv_unpin(void *ctx, kv__pin *pin)
{
    SV_BE(ctx)->unpin(SV_BE(ctx)->ctx, pin);
}

static int sv_reserve(void *ctx, uint64_t len, kv__resv *r)
{
    return SV_BE(ctx)->reserve(SV_BE(ctx)->ctx, len, r);
}

static void sv_abort(void *ctx, kv__resv *r)
{
    SV_BE(ctx)->abort(SV_BE(ctx)->ctx, r);
}

/* A write of plain key id is being stored here: if a re-replication batch
 * is moving it away (rr_copy), that batch must not drop it. Costs one
 * atomic load when none is. */
static void sv_moved(struct kv__cluster *c, int ns, const kv_block_id *id)
{
    if (ns != KV_NS_KEY || !atomic_load(&c->nmv))
        return;
    pthread_mutex_lock(&c->mvlock);
    size_t n = atomic_load(&c->nmv);
    for (size_t j = 0; j < n; j++)
        if (memcmp(&c->mv[j], id, sizeof *id) == 0)
            c->mv_hit[j] = 1;
    pthread_mutex_unlock(&c->mvlock);
}

/* Writes (a caller's, or a leaver's forwarding of one) of plain keys
 * clear their key's tombstone once stored: the value here is the
 * writer's now (tomb.h). */
static int sv_commit(void *ctx, kv__resv *r, int ns, const kv_block_id *id, uint32_t index)
{
    struct kv__cluster *c = ctx;
    kv_iov v = { r->data, r->len };
    struct sv_write w;
    int rc = leave_write(c, ns, id, index, &v, 1, ns == KV_NS_KEY, 0, &w);
    if (rc == KV_OK)
        sv_moved(c, ns, id);
    if (rc == KV_OK)
        rc = c->be->commit(c->be->ctx, r, ns, id, index);
    else
        c->be->abort(c->be->ctx, r);   /* not on the next owner: not stored */
    if (rc == KV_OK && ns == KV_NS_KEY)
        kv__tomb_put(c->tomb, id);
    sv_write_end(c, &w);
    return rc;
}

static int sv_dump(void *ctx, int ns, const kv_block_id *id, uint32_t index, const kv_iov *iov,
                   uint32_t iovcnt)
{
    struct kv__cluster *c = ctx;
    struct sv_write w;
    int rc = leave_write(c, ns, id, index, iov, iovcnt, ns == KV_NS_KEY, 0, &w);
    if (rc == KV_OK)
        sv_moved(c, ns, id);
    if (rc == KV_OK)
        rc = c->be->dump(c->be->ctx, ns, id, index, iov, iovcnt);
    if (rc == KV_OK && ns == KV_NS_KEY)
        kv__tomb_put(c->tomb, id);
    sv_write_end(c, &w);
    return rc;
}

/* The record a copy carries, for its prefix tombstones' question. */
struct copy_rec {
    struct kv__backend *be;
    const kv_iov *iov;
    uint32_t iovcnt;
};

static int copy_match(void *arg, uint32_t plen, const kv_block_id *hash)
{
    const struct copy_rec *cr = arg;
    if (!cr->be->rec_match)
        return KV_ENOTSUP;   /* cannot tell: the copy is refused */
    /* A record's key is in its first 1 + KV_KEY_MAX bytes. */
    uint8_t head[1 + KV_KEY_MAX];
    const void *rec = cr->iov[0].base;
    uint64_t len = cr->iov[0].len;
    if (cr->iovcnt > 1 && len < sizeof head) {
        len = 0;
        for (uint32_t i = 0; i < cr->iovcnt && len < sizeof head; i++) {
            size_t k = cr->iov[i].len < sizeof head - len ? cr->iov[i].len : sizeof head - len;
            memcpy(head + len, cr->iov[i].base, k);
            len += k;
        }
        rec = head;
    }
    return cr->be->rec_match(cr->be->ctx, rec, len, plen, hash);
}

/*
 * A plain key's copy from a member (re-replication, a leave's hand-off),
 * read by its sender at stamp. Judged against the removes served here
 * (tomb.h) and stored in one step under the tombstones' lock: a remove
 * leaves its tombstone (sv_removing, under that lock) before it drops
 * anything, so a copy either is stored before the tombstone, and the
 * remove then drops it, or sees the tombstone and is refused. A refused
 * copy stores and drops nothing (a hand-off's replace included), and its
 * sender keeps its own value and reads it again later (rr_copy_retry).
 * While leaving, a copy this member would refuse is not forwarded either:
 * its next owners may not have heard of the remove that refuses it (a
 * clear reaches them as the removes of the keys held here).
 */
static int sv_store_copy(void *ctx, int ns, const kv_block_id *id, uint32_t index, int replace,
                         uint64_t stamp, kv__resv *r, const kv_iov *iov, uint32_t iovcnt)
{
    struct kv__cluster *c = ctx;
    kv_iov v = { r ? r->data : NULL, r ? r->len : 0 };
    if (r) {
        iov = &v;
        iovcnt = 1;
    }
    struct copy_rec cr = { c->be, iov, iovcnt };
    struct sv_write w = { 0 };
    int rc = atomic_load(&c->leaving) == 1
             ? kv__tomb_admit(c->tomb, id, stamp, copy_match, &cr, kv__wall_ms()) : KV_OK;
    if (rc != KV_OK)
        atomic_fetch_add(&c->refused_stale, 1);
    else
        rc = leave_write(c, ns, id, index, iov, iovcnt, replace, stamp, &w);
    if (rc == KV_OK)
        sv_moved(c, ns, id);
    if (rc == KV_OK) {
        kv__tomb_lock(c->tomb);
        rc = kv__tomb_do_admit(c->tomb, id, stamp, copy_match, &cr, kv__wall_ms());
        if (rc != KV_OK)
            atomic_fetch_add(&c->refused_stale, 1);
        if (rc == KV_OK && replace) {
            rc = c->be->remove(c->be->ctx, ns, id, index);
            rc = rc == KV_ENOTFOUND ? KV_OK : rc;
        }
        if (rc == KV_OK && r) {
            rc = c->be->commit(c->be->ctx, r, ns, id, index);
            r = NULL;   /* the commit took it, stored or not */
        } else if (rc == KV_OK) {
            rc = c->be->dump(c->be->ctx, ns, id, index, iov, iovcnt);
        }
        kv__tomb_unlock(c->tomb);
    }
    if (r)
        c->be->abort(c->be->ctx, r);
    sv_write_end(c, &w);
    return rc;
}

static void sv_removing(void *ctx, int kind, uint32_t plen, const kv_block_id *id)
{
    tomb_note(ctx, kind, plen, id);
}

/* Whether a copy this member read may still land (transport.h): the
 * count first, then the end, as rr_copy writes them the other way round,
 * so that a batch ending in between is seen by one or the other. */
static int sv_copying(void *ctx)
{
    struct kv__cluster *c = ctx;
    if (atomic_load(&c->copying) > 0)
        return 1;
    uint64_t end = atomic_load(&c->copied_ms);
    return end && kv__now_ms() - end <= KV__COPY_QUIET_MS;
}

static int sv_scan(void *ctx, int ns, kv__scan_cb cb, void *arg)
{
    return SV_BE(ctx)->scan(SV_BE(ctx)->ctx, ns, cb, arg);
}

static int sv_remove(void *ctx, int ns, const kv_block_id *id, uint32_t index)
{
    struct kv__cluster *c = ctx;
    struct sv_write w;
    int rc = sv_write_begin(c, &w);
    if (rc == KV_OK)
        rc = c->be->remove(c->be->ctx, ns, id, index);
    if (w.locked && atomic_load(&c->leaving) == 1 && (rc == KV_OK || rc == KV_ENOTFOUND)) {
        struct kv__op op = { .kind = KV_OP_REMOVE, .ns = (uint8_t)ns, .index = index, .id = *id };
        int frc = leave_forward(c, &op);
        /* removed when either had it; a next owner not asked may keep it */
        if (frc != KV_OK && frc != KV_ENOTFOUND)
            rc = frc;
        else if (frc == KV_OK)
            rc = KV_OK;
    }
    sv_write_end(c, &w);
    return rc;
}

static int sv_match(void *ctx, const kv_block_id *id, uint32_t plen, const kv_block_id *hash)
{
    return SV_BE(ctx)->match(SV_BE(ctx)->ctx, id, plen, hash);
}

/*
 * Writes for keys not ours. A caller routes by the view it has, which may
 * be a heartbeat behind ours: after a join, it sends us a key that the
 * newcomer owns in our view. Stored here, that copy is a stray: a reader
 * with the current view asks the newcomer, and our re-replication never
 * visits it (we owned it in neither view it moves between), so the write
 * was acknowledged and reads as absent once the move window ends (issue
 * 18; 34 of 200 puts in the test). So a dump whose sender routed by an
 * older view than ours, of an id we do not own in ours, is refused with
 * KV_ECLOSED ("not an owner": what a leaver past its grace already says)
 * before anything is stored or replaced; the caller fetches the view and
 * runs it on the owners there (shards_retry), within its deadline.
 *
 * Only an older sender is refused. One with a newer view knows better: we
 * take the write, and become its owner when our view catches up; refusing
 * it would bounce the write between two members with different views
 * until the deadline. Internal copies (re-replication, hand-off, a
 * leaver's forwarding) go where their sender's plan says and are never
 * refused here (a plain key's copy may be, for a remove: sv_store_copy);
 * nor is anything while we leave (leave_write forwards it), nor a sender
 * with no view (0: a tool or a harness). Removes are not checked: a
 * caller's replace drops previous owners' copies on purpose.
 */
static int sv_admit(void *ctx, int ns, const kv_block_id *id, uint64_t sender, uint32_t flags)
{
    struct kv__cluster *c = ctx;
    (void)ns;
    if (!sender || (flags & KV_BATCH_INTERNAL) || atomic_load(&c->leaving))
        return KV_OK;
    /* A sender routing by our view or a newer one, the common case, needs
     * neither the view nor its lock: only an older sender's items are
     * placed (this runs once per dump item that arrives). Before the first
     * view, view_ver is 0 and everything is admitted, as below. */
    if (sender >= atomic_load(&c->view_ver))
        return KV_OK;
    /* Not view_get: the listener serves before the first view is in
     * (start), and a member with no view yet knows no better than its
     * sender (a kvnode restarted at its address crashed here). */
    pthread_mutex_lock(&c->vlock);
    struct view *v = c->view;
    if (v)
        atomic_fetch_add(&v->refs, 1);
    pthread_mutex_unlock(&c->vlock);
    if (!v)
        return KV_OK;
    uint64_t ver = v->version;
    int mine = 1;
    if (sender < ver) {
        size_t own[KV_PLACE_MAX];
        size_t k = kv__place(v->seeds, v->n, id, c->replicas, own);
        mine = 0;
        for (size_t i = 0; i < k && !mine; i++)
            mine = v->owners[own[i]]->self;
    }
    view_put(v);
    if (mine)
        return KV_OK;
    atomic_fetch_add(&c->refused_not_owner, 1);
    uint64_t seen = atomic_load(&c->refused_logged);
    if (seen < ver && atomic_compare_exchange_strong(&c->refused_logged, &seen, ver))
        KV_INFO("cluster: refusing writes routed by view %llu: not an owner in view %llu "
                "(KV_ECLOSED: the caller refreshes its view and retries on the owners)",
                (unsigned long long)sender, (unsigned long long)ver);
    return KV_ECLOSED;
}

static void serve_be_init(struct kv__cluster *c)
{
    const struct kv__backend *b = c->be;
    c->serve_be = (struct kv__backend){
        .ctx = c, .seg_base = b->seg_base, .seg_len = b->seg_len,
        .lookup = b->lookup ? sv_lookup : NULL, .size = b->size ? sv_size : NULL,
        .load = b->load ? sv_load : NULL, .pin = b->pin ? sv_pin : NULL,
        .unpin = b->unpin ? sv_unpin : NULL, .reserve = b->reserve ? sv_reserve : NULL,
        .commit = b->commit ? sv_commit : NULL, .abort = b->abort ? sv_abort : NULL,
        .dump = b->dump ? sv_dump : NULL, .scan = b->scan ? sv_scan : NULL,
        .remove = b->remove ? sv_remove : NULL,
        .match = b->match ? sv_match : NULL,
        .admit = sv_admit,
        .store_copy = b->commit && b->remove ? sv_store_copy : NULL,
        .removing = sv_removing,
        .copying = sv_copying,
    };
}

/* Plain keys first (a block can be computed again), then newest first. */
static int handoff_order(const void *a, const void *b)
{
    const struct rr_item *x = a, *y = b;
    if (x->ns != y->ns)
        return x->ns == KV_NS_KEY ? -1 : y->ns == KV_NS_KEY ? 1 : x->ns - y->ns;
    return rr_newest_first(a, b);
}

/* The shards of s whose copy failed, with their targets in the view for
 * leaving as it is now (t), moved to the front of s->v; returns how many
 * have a target still. */
static size_t handoff_again(struct rr_scan *s, struct view *from, struct view *to)
{
    struct rr_scan t = { .c = s->c, .from = from, .to = to, .handoff = 1,
                         .olds = { s->olds[0], s->olds[1] } };
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct rr_item it = s->v[i];
        int keep;
        if (!it.failed)
            continue;
        t.ns = it.ns;
        if (!handoff_decide(&t, &it.id, it.targets, &it.ntargets, &keep))
            continue;
        it.keep = (uint8_t)keep;
        it.failed = 0;
        s->v[k++] = it;
    }
    return k;
}

/*
 * Step 3: hands on what this member holds; returns the shards not handed
 * on (0: all were).
 *
 * What it covers. Every shard it owns in the view it leaves (from: the
 * full view less the members it found leaving before it), as before; and
 * every shard it owned in an earlier view whose re-replication has not
 * run to its end. Those are writes it took as an owner before the owners
 * last changed: a join moved them to the newcomer, whose copy was this
 * member's job to make, and the job was still waiting on its rate (or
 * queued, or the change came with the very fetch that published the
 * leave) when kv__cluster_stop stopped it. Owning none of them now, the
 * hand-off used to pass them over, and they were gone with this member
 * (issue 18: 1 in 6 of the keys and blocks a member had taken, in
 * leaver_hands_off_what_it_took_in_the_previous_view). The earlier views
 * are two the code keeps anyway: the start of the unfinished job
 * (rr_from: a job restarted by a newer change keeps the oldest start, and
 * a stopped one keeps it for this), and the view before the last owner
 * change (c->prev: the change in between, when the job was restarted
 * over it), asked only when re-replication is behind or off.
 *
 * Why this rule and not "everything held": what this member holds beyond
 * those is either copied on already (a job that ran to its end) or a
 * stray no view gave it (a block aging out), and sending every stray to
 * its owners would replace newer values and cost the deadline. Why no
 * probe of who holds what: the views say it. An earlier view's shard goes
 * to its owners in the view it leaves for that were not its owners then
 * (those that were hold it), and not at all when one of those stays an
 * owner: that member holds it and its own job copies it on, so nothing is
 * sent twice without need. Such a plain key replaces nothing (keep): a
 * value its new owner holds was written there later, by a writer that
 * knew the new view. The whole hand-off stays within the leave's deadline
 * (rr_copy stops there), plain keys first, then newest first.
 */
static size_t handoff(struct kv__cluster *c, uint64_t deadline_ms)
{
    struct view *from = view_less(c, 0), *to = view_less(c, 1);
    struct rr_scan s = { .c = c, .from = from, .to = to, .handoff = 1 };
    size_t left = 0, earlier = 0;
    pthread_mutex_lock(&c->rrlock);   /* the rr thread has stopped: a job left behind */
    if ((s.olds[0] = c->rr_from))
        atomic_fetch_add(&s.olds[0]->refs, 1);
    pthread_mutex_unlock(&c->rrlock);
    if (!c->rr_started || atomic_load(&c->rr_done) != atomic_load(&c->rr_wanted)) {
        pthread_mutex_lock(&c->vlock);
        if ((s.olds[1] = c->prev) && s.olds[1] != s.olds[0])
            atomic_fetch_add(&s.olds[1]->refs, 1);
        else
            s.olds[1] = NULL;
        pthread_mutex_unlock(&c->vlock);
    }
    if (from && to && to->n && c->be->scan) {
        for (int ns = 0; ns < KV_NS_COUNT && !s.oom; ns++) {
            s.ns = ns;
            s.have_last = 0;
            c->be->scan(c->be->ctx, ns, rr_visit, &s);
        }
        for (size_t i = 0; i < s.n; i++)
            earlier += s.v[i].keep;
        if (s.n)
            qsort(s.v, s.n, sizeof *s.v, handoff_order);
        uint64_t t0 = kv__now_ms(), ok0 = atomic_load(&c->handed_off);
        atomic_store(&c->rr_pending, s.n);
        struct rr_how how = { .handoff = 1, .deadline_ms = deadline_ms };
        size_t at = s.n ? rr_copy_retry(c, to, s.v, s.n, &how) : 0, total = s.n;
        uint64_t now = kv__now_ms();
        if (at == s.n && atomic_load(&c->handed_off) - ok0 < s.n && now < deadline_ms) {
            /* Some next owner failed: most likely it left (it was leaving
             * too, later than us). Its shards go where the view says now. */
            uint64_t wait = deadline_ms - now;
            view_refresh(c, (unsigned)(wait < c->call_ms ? wait : c->call_ms));
            struct view *f2 = view_less(c, 0), *t2 = view_less(c, 1);
            size_t k = f2 && t2 && f2->version != from->version ? handoff_again(&s, f2, t2) : 0;
            if (k) {
                atomic_store(&c->rr_pending, k);
                at = rr_copy_retry(c, t2, s.v, k, &how) + (s.n - k);
            }
            view_put(f2);
            view_put(t2);
        }
        atomic_store(&c->rr_pending, 0);
        uint64_t ok = atomic_load(&c->handed_off) - ok0;
        left = total - ok;
        if (total)
            KV_INFO("cluster: leaving: handed %llu of %zu shards (%zu owned in an earlier view "
                    "not yet re-replicated) to their next owners in %.2f s%s",
                    (unsigned long long)ok, total, earlier, (double)(kv__now_ms() - t0) / 1000.0,
                    at < total ? " (stopped at the deadline)" : "");
        if (s.oom)
            KV_WARN("cluster: leaving: out of memory listing shards; some were not handed on");
    }
    free(s.v);
    view_put(s.olds[0]);
    view_put(s.olds[1]);
    view_put(to);
    view_put(from);
    return left;
}

static void leave_gracefully(struct kv__cluster *c)
{
    /* Step 1, or at least the freshest view: a member about to leave may
     * not have seen the owners that joined since its last beat. */
    if (publish_leaving(c, c->call_ms) != KV_OK)
        view_refresh(c, c->call_ms);
    struct view *v = view_get(c), *w = view_less(c, 1);
    int owner = 0;
    for (size_t i = 0; i < v->n; i++)
        owner |= v->owners[i]->self;
    size_t next = owner && w ? w->n : 0;
    view_put(w);
    view_put(v);
    /* No other owner staying: nothing to hand to, and a write served while
     * leaving would be lost with us anyway; the plain leave will do. */
    if (!next)
        return;
    uint64_t bound = c->cfg.io.timeout_ms ? c->cfg.io.timeout_ms : KV_NET_DEFAULT_TIMEOUT_MS;
    atomic_store(&c->leaving, 1);
    /* Step 2: the writes that began before are stored before the scan. */
    while (atomic_load(&c->wr_plain))
        usleep(200);
    size_t left = handoff(c, kv__now_ms() + bound);
    hb_stop(c);
    c->ms->ops->leave(c->ms, &c->self);
    c->left = 1;
    unsigned every = kv__membership_heartbeat_ms(c->cfg.cluster.node_ttl_ms);
    usleep((useconds_t)(2 * every + 50) * 1000);
    pthread_mutex_lock(&c->lvlock);
    atomic_store(&c->leaving, 2);
    pthread_mutex_unlock(&c->lvlock);
    if (left)
        KV_WARN("cluster: left the view with %zu shards not handed on", left);
    KV_INFO("cluster: left the view (%llu writes forwarded while leaving)",
            (unsigned long long)atomic_load(&c->forwarded));
}

/* ---- the seam ----------------------------------------------------------- */

/*
 * Items fanned out to every live owner of each id: one op per (id, owner)
 * in ops, owner[] and item[] saying whose. What dump, put, remove and the
 * batched sizes share; each then reads the owners' results its own way.
 */
struct fan {
    struct view *v;
    struct view *pv;         /* the previous view, for fan_add_prev */
    struct kv__op *ops;
    size_t *owner, *item;
    size_t k;
    bool skipped_down;       /* an owner was left out as unreachable */
};

/* with_prev: room for fan_add_prev too, during a move window, and for
 * fan_add_stay while owners leave. */
static int fan_init(struct kv__cluster *c, struct fan *f, size_t n, bool with_prev)
{
    memset(f, 0, sizeof *f);
    f->v = view_get(c);
    f->pv = with_prev ? prev_get(c) : NULL;
    size_t cap = n * c->replicas * (1 + (f->pv ? 1 : 0) + (with_prev && f->v->nstay ? 1 : 0));
    f->ops = malloc((cap ? cap : 1) * sizeof *f->ops);
    f->owner = malloc((cap ? cap : 1) * sizeof *f->owner);
    f->item = malloc((cap ? cap : 1) * sizeof *f->item);
    if (!f->ops || !f->owner || !f->item) {
        free(f->ops);
        free(f->owner);
        free(f->item);
        view_put(f->pv);
        view_put(f->v);
        return KV_ENOMEM;
    }
    return KV_OK;
}

static void fan_free(struct fan *f)
{
    free(f->ops);
    free(f->owner);
    free(f->item);
    view_put(f->v);
    view_put(f->pv);
}

/* Adds op (its id) once per live owner; returns how many owners it has. */
static size_t fan_add(struct kv__cluster *c, struct fan *f, size_t i, const struct kv__op *op)
{
    size_t cand[KV_PLACE_MAX];
    size_t m = candidates(f->v, &op->id, c->replicas, cand);
    for (size_t j = 0; j < m; j++) {
        if (peer_is_down(f->v->owners[cand[j]])) {
            f->skipped_down = true;
            continue;   /* unreachable just now: not attempted */
        }
        f->ops[f->k] = *op;
        f->owner[f->k] = cand[j];
        f->item[f->k++] = i;
    }
    return m;
}

/*
 * Adds op once for each of its id's previous owners (during a move window)
 * that is still a live member but no longer an owner. A plain key's
 * previous owner keeps its copy after an owner change: it is asked on a
 * miss while the window lasts (lookup), and it is an owner again if the
 * newcomer leaves, so a remove or a replace must drop that copy too, or it
 * would be read again.
 */
static void fan_add_prev(struct kv__cluster *c, struct fan *f, size_t i, const struct kv__op *op)
{
    if (!f->pv)
        return;
    size_t cur[KV_PLACE_MAX], prev[KV_PLACE_MAX];
    size_t m = candidates(f->v, &op->id, c->replicas, cur);
    size_t e = prev_candidates(f->v, f->pv, &op->id, c->replicas, cur, m, prev);
    for (size_t j = 0; j < e; j++) {
        if (peer_is_down(f->v->owners[prev[j]]))
            continue;
        f->ops[f->k] = *op;
        f->owner[f->k] = prev[j];
        f->item[f->k++] = i;
    }
}

/* Adds a read op once for each of its id's owners in the view without the
 * members flagged leaving that is not an owner now (view_stay). Reads
 * only: a write to a leaving owner is forwarded there by the leaver. */
static void fan_add_stay(struct kv__cluster *c, struct fan *f, size_t i, const struct kv__op *op)
{
    if (!f->v->nstay)
        return;
    size_t cur[KV_PLACE_MAX], st[KV_PLACE_MAX];
    size_t m = candidates(f->v, &op->id, c->replicas, cur);
    size_t e = stay_candidates(f->v, &op->id, c->replicas, cur, m, st);
    for (size_t j = 0; j < e; j++) {
        if (peer_is_down(f->v->owners[st[j]]))
            continue;
        f->ops[f->k] = *op;
        f->owner[f->k] = st[j];
        f->item[f->k++] = i;
    }
}

/* dump (replace false) and put (true): every live owner is written. A dump
 * succeeds when any owner stored it; a put only when every owner of the
 * view replaced its value (an owner left with the old one would serve it
 * again after a failover), and every previous owner still in a move window
 * dropped its copy (fan_add_prev). */
static int write_once(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n,
                      int *results, bool replace, uint64_t *ver)
{
    if (!c || (n && (!shards || !results)) || ns < 0 || ns >= KV_NS_COUNT)
        return KV_EINVAL;
    struct fan f;
    if (fan_init(c, &f, n, replace) != KV_OK)
        return KV_ENOMEM;
    *ver = f.v->version;
    int *best = malloc((n ? n : 1) * sizeof *best);
    int rc = best ? KV_OK : KV_ENOMEM;
    for (size_t i = 0; rc == KV_OK && i < n; i++) {
        struct kv__op op = { .kind = KV_OP_DUMP, .ns = (uint8_t)ns, .index = shards[i].index,
                             .id = shards[i].block, .iov = shards[i].iov,
                             .iovcnt = shards[i].iovcnt, .replace = replace,
                             .view = f.v->version };
        size_t before = f.k, m = fan_add(c, &f, i, &op);
        results[i] = m ? KV_ENET : KV_ENOSPC;   /* no owner at all: no room */
        best[i] = replace && f.k - before < m ? KV_ENET : 1;   /* 1: nothing seen yet */
        if (replace)   /* previous owners drop the old value */
            fan_add_prev(c, &f, i, &(struct kv__op){ .kind = KV_OP_REMOVE, .ns = op.ns,
                                                       .id = op.id });
    }
    if (rc == KV_OK)
        rc = run_grouped(c, f.v, f.ops, f.owner, f.k);
    if (rc == KV_OK) {
        for (size_t j = 0; j < f.k; j++) {
            size_t i = f.item[j];
            int r = f.ops[j].result;
            if (f.ops[j].kind == KV_OP_REMOVE)   /* a previous owner's copy */
                r = r == KV_ENOTFOUND ? KV_OK : r;
            if (replace)   /* all must: the worst result stands */
                best[i] = best[i] == 1 ? r : r == KV_OK ? best[i] : worse(best[i], r);
            else if (r == KV_OK)
                best[i] = KV_OK;
            else if (best[i] != KV_OK)
                best[i] = best[i] == 1 ? r : worse(best[i], r);
        }
        for (size_t i = 0; i < n; i++)
            if (best[i] != 1)
                results[i] = best[i];
    }
    free(best);
    fan_free(&f);
    return rc;
}

/* write_once, and once more for the shards whose owner failed (see "a
 * call whose owner failed"). */
static int write_owners(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n,
                        int *results, bool replace)
{
    return shards_retry(c, write_once, ns, shards, n, results, replace);
}

int kv__cluster_dump(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n,
                     int *results)
{
    return write_owners(c, ns, shards, n, results, false);
}

int kv__cluster_put(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n,
                    int *results)
{
    return write_owners(c, ns, shards, n, results, true);
}

/*
 * A remove of plain keys runs twice (the fence). A member that read a
 * key's value to copy it (re-replication, hand-off) read it before the
 * remove reached that member, and the copy may land on another owner
 * after the remove reached that one: the remove would be undone. The
 * copy carries when it was read (its stamp) and the owner refuses it when
 * it keeps a tombstone of the key that is not older (tomb.h). With one
 * round, the two owners are reached in any order, as far apart as the
 * call lasts (a retry round after a view change: up to 3 T), and the
 * clock margin would have to cover that. The second round starts once
 * every owner has answered the first, so each owner's second tombstone
 * is newer than any read the first round came after, by a clock's skew
 * at most (KV__TOMB_SKEW_MS): a copy that lands after it is refused, one
 * that landed before is removed by it. Its counts are not the caller's:
 * what it finds is what the first round removed, landed again.
 *
 * Only when a copy can be in the way: every owner answers a remove with
 * whether a copy it read may still land (sv_copying: one in flight, or
 * one ended within KV__COPY_QUIET_MS), asked after its remove. A source
 * that read the value read it before its own remove, so then says so;
 * a copy that landed before the source was asked ended at most the first
 * round's length before (it landed after the target's remove, or that
 * remove took it), and a first round longer than KV__COPY_QUIET_MS runs
 * the second whatever the answers. So the second round runs when an owner
 * says "copying", when one could not be asked or failed, or when the
 * first round took longer than that; with no owner change in sight, a
 * remove is one round.
 */

/* Whether a remove that began at t0 runs its second round: an owner said
 * a copy of its may land or failed (said), or the first round outlasted
 * the quiet time; counted when it does. */
static bool fence_needed(struct kv__cluster *c, bool said, uint64_t t0)
{
    if (!said && kv__now_ms() - t0 <= KV__COPY_QUIET_MS)
        return false;
    atomic_fetch_add(&c->removes_fenced, 1);
    return true;
}

/* found[i]: an owner had ids[i] and removed it; *fence: the second round
 * is needed (an owner says a copy of its may land, or one failed). */
static int remove_once(struct kv__cluster *c, int ns, const kv_block_id *ids, size_t n,
                       int *results, uint8_t *found, uint64_t *ver, bool *fence)
{
    if (!c || (n && (!ids || !results)) || ns < 0 || ns >= KV_NS_COUNT)
        return KV_EINVAL;
    struct fan f;
    if (fan_init(c, &f, n, true) != KV_OK)
        return KV_ENOMEM;
    *ver = f.v->version;
    bool *down = calloc(n ? n : 1, sizeof *down);
    int rc = down ? KV_OK : KV_ENOMEM;
    for (size_t i = 0; rc == KV_OK && i < n; i++) {
        struct kv__op op = { .kind = KV_OP_REMOVE, .ns = (uint8_t)ns, .id = ids[i] };
        size_t before = f.k, m = fan_add(c, &f, i, &op);
        results[i] = KV_ENOTFOUND;
        down[i] = f.k - before < m;
        fan_add_prev(c, &f, i, &op);
    }
    if (rc == KV_OK)
        rc = run_grouped(c, f.v, f.ops, f.owner, f.k);
    if (rc == KV_OK) {
        /* Removed where any owner had it; but an owner that could not be
         * asked may still hold it, and that is an error, not a success. */
        int *err = calloc(n ? n : 1, sizeof *err);
        for (size_t j = 0; err && j < f.k; j++) {
            int r = f.ops[j].result;
            size_t i = f.item[j];
            *fence |= f.ops[j].hit;
            if (r == KV_OK)
                results[i] = KV_OK, found[i] = 1;
            else if (r != KV_ENOTFOUND)
                err[i] = err[i] ? worse(err[i], r) : r;
        }
        for (size_t i = 0; err && i < n; i++)
            if (err[i] || down[i])
                results[i] = err[i] ? err[i] : KV_ENET, *fence = true;
        rc = err ? KV_OK : KV_ENOMEM;
        free(err);
    }
    free(down);
    fan_free(&f);
    return rc;
}

int kv__cluster_remove(struct kv__cluster *c, int ns, const kv_block_id *ids, size_t n,
                       int *results)
{
    uint64_t t0 = kv__now_ms(), ver = 0;
    size_t *idx, k = 0;
    bool fence = false;
    uint8_t *found = calloc(n ? n : 1, 1);
    int rc = found ? remove_once(c, ns, ids, n, results, found, &ver, &fence) : KV_ENOMEM;
    if (rc == KV_OK)
        k = retry_pick(c, t0, ver, results, n, &idx);
    kv_block_id *sub = k ? malloc(k * sizeof *sub) : NULL;
    int *res = k ? malloc(k * sizeof *res) : NULL;
    uint8_t *f2 = k ? calloc(k, 1) : NULL;
    if (sub && res && f2) {
        for (size_t j = 0; j < k; j++)
            sub[j] = ids[idx[j]];
        /* Removed by either round: a copy the first round dropped is no
         * copy the second finds. */
        if (remove_once(c, ns, sub, k, res, f2, &ver, &fence) == KV_OK)
            for (size_t j = 0; j < k; j++)
                results[idx[j]] = res[j] == KV_ENOTFOUND && found[idx[j]] ? KV_OK : res[j];
    }
    if (k)
        free(idx);
    free(sub);
    free(res);
    free(f2);
    /* The fence (above): a copy found now was the key, landed again; an
     * owner that cannot be asked may hold one, as in the first round. */
    int *fres = rc == KV_OK && ns == KV_NS_KEY && n && fence_needed(c, fence, t0)
                ? malloc(n * sizeof *fres) : NULL;
    if (fres && remove_once(c, ns, ids, n, fres, found, &ver, &fence) == KV_OK)
        for (size_t i = 0; i < n; i++) {
            if (fres[i] == KV_OK && results[i] == KV_ENOTFOUND)
                results[i] = KV_OK;
            else if (fres[i] != KV_OK && fres[i] != KV_ENOTFOUND && results[i] == KV_OK)
                results[i] = fres[i];
        }
    free(fres);
    free(found);
    return rc;
}

/* *fence as remove_once's: a member says a copy of its may land. */
static int clear_once(struct kv__cluster *c, int ns, uint32_t plen, const kv_block_id *hash,
                      uint64_t *removed, uint64_t *ver, bool *fence)
{
    if (!c || !removed || !hash || ns != KV_NS_KEY)
        return KV_EINVAL;
    *removed = 0;
    struct view *v = view_get(c);
    *ver = v->version;
    struct kv__op *ops = calloc(v->n ? v->n : 1, sizeof *ops);
    size_t *owner = malloc((v->n ? v->n : 1) * sizeof *owner);
    size_t k = 0;
    int rc = ops && owner ? KV_OK : KV_ENOMEM, res = KV_OK;
    for (size_t i = 0; rc == KV_OK && i < v->n; i++) {
        if (peer_is_down(v->owners[i])) {
            res = KV_ENET;   /* it may still hold keys */
            continue;
        }
        ops[k] = (struct kv__op){ .kind = KV_OP_CLEAR, .ns = (uint8_t)ns, .index = plen,
                                  .id = *hash };
        owner[k++] = i;
    }
    if (rc == KV_OK && k)
        rc = run_grouped(c, v, ops, owner, k);
    uint64_t copies = 0;
    for (size_t j = 0; rc == KV_OK && j < k; j++) {
        *fence |= ops[j].hit;
        if (ops[j].result == KV_OK)
            copies += ops[j].len;
        else
            res = worse(res, ops[j].result);
    }
    size_t per_key = v->n < c->replicas ? v->n : c->replicas;
    if (per_key)
        *removed = (copies + per_key - 1) / per_key;
    free(ops);
    free(owner);
    view_put(v);
    return rc ? rc : res;
}

int kv__cluster_clear_prefix(struct kv__cluster *c, int ns, uint32_t plen,
                             const kv_block_id *hash, uint64_t *removed)
{
    if (!c || !removed || !hash || ns != KV_NS_KEY)
        return KV_EINVAL;
    uint64_t t0 = kv__now_ms(), ver = 0, more = 0;
    bool fence = false;
    int rc = clear_once(c, ns, plen, hash, removed, &ver, &fence);
    if (owner_failed(rc) && view_moved(c, t0, ver)) {
        rc = clear_once(c, ns, plen, hash, &more, &ver, &fence);
        *removed += more;
    }
    /* The fence (see kv__cluster_remove), when a copy can be in the way;
     * what it finds is not counted. */
    if (rc == KV_OK && fence_needed(c, fence, t0))
        rc = clear_once(c, ns, plen, hash, &more, &ver, &fence);
    return rc;
}

int kv__cluster_clear(struct kv__cluster *c, int ns, uint64_t *removed)
{
    return kv__cluster_clear_prefix(c, ns, 0, &(kv_block_id){ { 0 } }, removed);
}

static int sizes_once(struct kv__cluster *c, int ns, const kv_block_id *ids, uint32_t index,
                      size_t n, uint64_t *lens, int *results, uint64_t *ver)
{
    if (!c || (n && (!ids || !lens || !results)) || ns < 0 || ns >= KV_NS_COUNT)
        return KV_EINVAL;
    struct fan f;
    if (fan_init(c, &f, n, true) != KV_OK)
        return KV_ENOMEM;
    *ver = f.v->version;
    for (size_t i = 0; i < n; i++) {
        struct kv__op op = { .kind = KV_OP_SIZE, .ns = (uint8_t)ns, .index = index, .id = ids[i] };
        results[i] = fan_add(c, &f, i, &op) ? KV_ENET : KV_ENOTFOUND;
        /* During a move window the previous owners are asked too, after
         * the current ones (a load reads them in that order): a value that
         * has not been copied to its new owner yet is found (issue 18: a
         * member's kv_get just after it joined missed what the others
         * had stored before). And while owners leave, their owners
         * without the leavers (fan_add_stay). */
        fan_add_prev(c, &f, i, &op);
        fan_add_stay(c, &f, i, &op);
        lens[i] = 0;
    }
    int rc = run_grouped(c, f.v, f.ops, f.owner, f.k);
    /* The first owner in HRW order that has it answers, as a load would
     * read it; a miss on every owner it reached is a miss. */
    for (size_t j = 0; rc == KV_OK && j < f.k; j++) {
        size_t i = f.item[j];
        int r = f.ops[j].result;
        if (results[i] == KV_OK)
            continue;
        if (r == KV_OK) {
            results[i] = KV_OK;
            lens[i] = f.ops[j].len;
        } else if (r == KV_ENOTFOUND || results[i] == KV_ENOTFOUND) {
            results[i] = KV_ENOTFOUND;
        } else {
            results[i] = worse(results[i], r);
        }
    }
    fan_free(&f);
    return rc;
}

int kv__cluster_sizes(struct kv__cluster *c, int ns, const kv_block_id *ids, uint32_t index,
                      size_t n, uint64_t *lens, int *results)
{
    uint64_t t0 = kv__now_ms(), ver = 0;
    size_t *idx;
    int rc = sizes_once(c, ns, ids, index, n, lens, results, &ver);
    size_t k = rc == KV_OK ? retry_pick(c, t0, ver, results, n, &idx) : 0;
    if (!k)
        return rc;
    kv_block_id *sub = malloc(k * sizeof *sub);
    uint64_t *len = malloc(k * sizeof *len);
    int *res = malloc(k * sizeof *res);
    if (sub && len && res) {
        for (size_t j = 0; j < k; j++)
            sub[j] = ids[idx[j]];
        if (sizes_once(c, ns, sub, index, k, len, res, &ver) == KV_OK)
            for (size_t j = 0; j < k; j++) {
                results[idx[j]] = res[j];
                lens[idx[j]] = len[j];
            }
    }
    free(sub);
    free(len);
    free(res);
    free(idx);
    return rc;
}

static int load_once(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n,
                     int *results, bool replace, uint64_t *ver)
{
    (void)replace;   /* shards_once_fn's: a load replaces nothing */
    if (!c || (n && (!shards || !results)) || ns < 0 || ns >= KV_NS_COUNT)
        return KV_EINVAL;
    struct view *v = view_get(c), *pv = prev_get(c);
    *ver = v->version;
    size_t (*cand)[3 * KV_PLACE_MAX] = malloc((n ? n : 1) * sizeof *cand);
    size_t *ncand = malloc((n ? n : 1) * sizeof *ncand), *ncur = malloc((n ? n : 1) * sizeof *ncur);
    uint8_t *via = calloc(n ? n : 1, 1);   /* 1: found on a previous owner only */
    uint8_t *nst = calloc(n ? n : 1, 1);   /* its owners without the leavers, after ncur */
    struct kv__op *ops = malloc((n ? n : 1) * c->replicas * sizeof *ops);
    size_t *owner = malloc((n ? n : 1) * c->replicas * sizeof *owner);
    size_t *shard = malloc((n ? n : 1) * sizeof *shard);
    int rc = KV_OK;
    size_t rounds = 0, nmoved = 0;
    if (!cand || !ncand || !ncur || !via || !nst || !ops || !owner || !shard) {
        rc = KV_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ncur[i] = ncand[i] = candidates(v, &shards[i].block, c->replicas, cand[i]);
        /* then, while owners leave, its owners without them (view_stay);
         * then, during a move window, its previous owners (each asked
         * only if every candidate before failed) */
        nst[i] = (uint8_t)stay_candidates(v, &shards[i].block, c->replicas, cand[i], ncur[i],
                                          cand[i] + ncur[i]);
        ncand[i] += nst[i];
        if (pv)
            ncand[i] += prev_candidates(v, pv, &shards[i].block, c->replicas, cand[i],
                                        ncand[i], cand[i] + ncand[i]);
        rounds = ncand[i] > rounds ? ncand[i] : rounds;
        results[i] = 1;   /* pending */
    }
    /* Round r asks each still-pending shard's r-th candidate. */
    for (size_t r = 0; r < rounds; r++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (results[i] != 1 && (results[i] == KV_OK || results[i] == KV_EINVAL))
                continue;
            if (r >= ncand[i])
                continue;
            if (r > 0)
                atomic_fetch_add(&c->failovers, 1);
            ops[k] = (struct kv__op){ .kind = KV_OP_LOAD, .ns = (uint8_t)ns,
                                      .index = shards[i].index, .id = shards[i].block,
                                      .iov = shards[i].iov, .iovcnt = shards[i].iovcnt };
            owner[k] = cand[i][r];
            shard[k] = i;
            k++;
        }
        if (!k)
            break;
        if ((rc = run_grouped(c, v, ops, owner, k)))
            goto out;
        for (size_t j = 0; j < k; j++) {
            size_t i = shard[j];
            int res = ops[j].result;
            if (res == KV_OK && r >= ncur[i] + nst[i]) {   /* not where it goes next */
                via[i] = 1;
                nmoved++;
            }
            if (res == KV_OK || res == KV_EINVAL || results[i] == 1)
                results[i] = res;
            else if (results[i] == KV_ENOTFOUND || res == KV_ENOTFOUND)
                results[i] = KV_ENOTFOUND;   /* a live owner said it is not there */
            else
                results[i] = res;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (results[i] == 1)
            results[i] = ncand[i] ? KV_ENET : KV_ENOTFOUND;
    if (nmoved) {
        /* Read repair: what only a previous owner had goes to the current
         * owners now, from the bytes just loaded. Best effort. */
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (!via[i] || results[i] != KV_OK)
                continue;
            for (size_t j = 0; j < ncur[i]; j++) {
                if (peer_is_down(v->owners[cand[i][j]]))
                    continue;
                /* routed by our view: an owner in a newer one refuses a
                 * copy that would be a stray there (sv_admit) */
                ops[k] = (struct kv__op){ .kind = KV_OP_DUMP, .ns = (uint8_t)ns,
                                          .index = shards[i].index, .id = shards[i].block,
                                          .iov = shards[i].iov, .iovcnt = shards[i].iovcnt,
                                          .view = v->version };
                owner[k++] = cand[i][j];
            }
        }
        if (run_grouped(c, v, ops, owner, k) == KV_OK)
            atomic_fetch_add(&c->moved, nmoved);
    }
out:
    free(cand);
    free(ncand);
    free(ncur);
    free(via);
    free(nst);
    free(ops);
    free(owner);
    free(shard);
    view_put(pv);
    view_put(v);
    return rc;
}

int kv__cluster_load(struct kv__cluster *c, int ns, const kv_shard *shards, size_t n,
                     int *results)
{
    return shards_retry(c, load_once, ns, shards, n, results, false);
}

/*
 * A hit promises a complete block (store.block_shards shards: see
 * kv__local_lookup), and an owner answers KV_OP_LOOKUP with its own config,
 * which may count one shard. So each hit's other shards are asked for by
 * KV_OP_SIZE, one batch per owner as the lookup itself: a shard counts when
 * any current owner holds it. (The wire stays as it is; the move window's
 * previous owners are not asked for them, so a block mid-move may miss.)
 */
static int complete_blocks(struct kv__cluster *c, int ns, const kv_block_id *ids, size_t n,
                           uint8_t *hit)
{
    uint32_t rest = c->cfg.store.block_shards - 1;
    size_t nhit = 0;
    for (size_t i = 0; i < n; i++)
        nhit += hit[i] != 0;
    if (!nhit)
        return KV_OK;
    size_t *at = malloc(nhit * sizeof *at);
    uint8_t *got = calloc(nhit * rest, 1);
    struct fan f;
    int rc = at && got ? fan_init(c, &f, nhit * rest, false) : KV_ENOMEM;
    if (rc != KV_OK) {
        free(at);
        free(got);
        return rc;
    }
    for (size_t i = 0, h = 0; i < n; i++) {
        if (!hit[i])
            continue;
        at[h] = i;
        for (uint32_t s = 0; s < rest; s++)
            fan_add(c, &f, h * rest + s, &(struct kv__op){ .kind = KV_OP_SIZE, .ns = (uint8_t)ns,
                                                           .index = s + 1, .id = ids[i] });
        h++;
    }
    rc = run_grouped(c, f.v, f.ops, f.owner, f.k);
    for (size_t j = 0; rc == KV_OK && j < f.k; j++)
        if (f.ops[j].result == KV_OK)
            got[f.item[j]] = 1;
    for (size_t h = 0; rc == KV_OK && h < nhit; h++)
        for (uint32_t s = 0; s < rest; s++)
            if (!got[h * rest + s])
                hit[at[h]] = 0;
    fan_free(&f);
    free(at);
    free(got);
    return rc;
}

/*
 * Lookups are combined. A lookup costs its owner one round trip of small
 * frames, and on loopback or a LAN nearly all of that is the two kernels'
 * per-message work and the thread wake-ups around it: a message per caller
 * per owner was what made lookups slower than Redis' one pipelined message
 * per batch. So while one round of lookup frames is in flight, other
 * callers' lookups queue up, and the next round sends the whole queue as
 * one frame per owner (group commit). Each id is still looked up (and
 * leased) by its owner; only the frames are shared.
 *
 * How it works. One queue of calls per cluster (c->lkq, under c->lklock)
 * and one lead: the caller that finds no round running leads. A leader
 * takes the whole queue as round r, runs it as one batch per owner over
 * every owner the queued calls reach (all at once, run_groups: one poll()
 * for all of them), writes each call's results back, marks it done and
 * wakes round r's callers together. Then, while the queue has refilled, it
 * leads the next round itself, up to LK_ROUNDS rounds, before it hands the
 * lead to the oldest queued call (or leaves the queue idle).
 *
 * Why this shape (doc/perf.md has the figures): on a busy 2-vCPU client
 * half the CPU of a lookup was context switches and wake-ups, not frames.
 *   - One lead for every owner, not one per owner: a caller whose ids span
 *     two owners is in one round and woken once (with a leader per owner it
 *     was woken by each, and mostly went back to sleep).
 *   - A round's callers are woken by one futex wake on that round's word
 *     (c->lkword[r & 1]): a call knows its round when it queues (the next
 *     one taken), and a round is taken only after the one before it is
 *     done, so round r's word has no other sleepers but the calls of round
 *     r + 2, which cannot have queued yet. A wake per caller, each under a
 *     lock, preempted the leader once per caller (the woken thread runs
 *     first), and the woken blocked on that lock in turn.
 *   - A leader that stays for the next round sends it at once, without a
 *     successor to wake and wait for. LK_ROUNDS bounds what this adds to
 *     the leader's own call, which returns once it hands the lead on; the
 *     hand-off wakes the successor's round word (its round-mates wake for
 *     nothing once every LK_ROUNDS rounds).
 * A waiter reads its round's word before its state and a waker changes the
 * state before the word, so no wake is lost. A thread that holds the lead
 * never waits before running it, so no cycle of waits can form. A round
 * waits for its slowest owner: a hung owner holds up the other owners'
 * queued lookups until its deadline, after which it is marked down
 * (leg_finish) and later rounds fail its share at once, as fan_add skips a
 * down peer.
 */
#define LK_ROUNDS 8

struct lk_req {
    struct peer *p;
    struct kv__op *ops;                 /* the caller's, results written back */
    size_t n;
};

enum { LK_WAIT, LK_LEAD, LK_DONE };

struct lk_call {
    struct lk_call *next;               /* c->lkq (c->lklock) */
    struct lk_req *reqs;                /* one per remote owner */
    size_t nreq;
    unsigned round;                     /* the round that takes it (c->lklock) */
    _Atomic int state;                  /* LK_*; once LK_DONE the call may be gone */
};

static void lk_futex_wait(_Atomic uint32_t *w, uint32_t seen)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

/* Wakes every sleeper on w, after a change of w (so none is lost). */
static void lk_futex_bump(_Atomic uint32_t *w)
{
    atomic_fetch_add(w, 1);
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* The index of p in peers[0..*np), added at the end when it is not there. */
static size_t lk_peer_at(struct peer **peers, size_t *np, struct peer *p)
{
    size_t i = 0;
    while (i < *np && peers[i] != p)
        i++;
    if (i == *np)
        peers[(*np)++] = p;
    return i;
}

/* Runs the calls of list (taken from the queue) as one batch per owner,
 * their results written back into each call's ops. */
static void lk_round(struct kv__cluster *c, struct lk_call *list)
{
    size_t total = 0, nr = 0;
    for (struct lk_call *k = list; k; k = k->next) {
        nr += k->nreq;
        for (size_t i = 0; i < k->nreq; i++)
            total += k->reqs[i].n;
    }
    if (!nr)
        return;
    /* The owners the round reaches, each once, those found down last (not
     * sent into another timeout: their share fails at once), and the ops
     * grouped by owner in g as run_groups takes them. */
    struct peer **peers = malloc(nr * sizeof *peers);
    size_t *start = calloc(nr + 1, sizeof *start), *fill = calloc(nr, sizeof *fill);
    size_t *at = malloc(nr * sizeof *at);
    struct kv__op *g = malloc((total ? total : 1) * sizeof *g);
    if (!peers || !start || !fill || !at || !g) {
        for (struct lk_call *k = list; k; k = k->next)
            for (size_t i = 0; i < k->nreq; i++)
                for (size_t j = 0; j < k->reqs[i].n; j++)
                    k->reqs[i].ops[j].result = KV_ENOMEM;
        goto out;
    }
    size_t np = 0, nlive = 0, r = 0;
    for (struct lk_call *k = list; k; k = k->next)
        for (size_t i = 0; i < k->nreq; i++)
            lk_peer_at(peers, &np, k->reqs[i].p);
    for (size_t p = 0; p < np; p++)
        if (!peer_is_down(peers[p])) {
            struct peer *t = peers[nlive];
            peers[nlive++] = peers[p];
            peers[p] = t;
        }
    for (struct lk_call *k = list; k; k = k->next)
        for (size_t i = 0; i < k->nreq; i++, r++) {
            at[r] = lk_peer_at(peers, &np, k->reqs[i].p);
            start[at[r] + 1] += k->reqs[i].n;
        }
    for (size_t p = 0; p < np; p++)
        start[p + 1] += start[p];
    r = 0;
    for (struct lk_call *k = list; k; k = k->next)
        for (size_t i = 0; i < k->nreq; i++, r++) {
            memcpy(g + start[at[r]] + fill[at[r]], k->reqs[i].ops, k->reqs[i].n * sizeof *g);
            fill[at[r]] += k->reqs[i].n;
        }
    for (size_t j = start[nlive]; j < total; j++)
        g[j].result = KV_ENET;
    struct view pv = { .n = nlive, .owners = peers };
    run_groups(c, &pv, g, start);
    memset(fill, 0, np * sizeof *fill);
    r = 0;
    for (struct lk_call *k = list; k; k = k->next)
        for (size_t i = 0; i < k->nreq; i++, r++) {
            const struct kv__op *from = g + start[at[r]] + fill[at[r]];
            for (size_t j = 0; j < k->reqs[i].n; j++) {
                k->reqs[i].ops[j].result = from[j].result;
                k->reqs[i].ops[j].hit = from[j].hit;
            }
            fill[at[r]] += k->reqs[i].n;
        }
out:
    free(peers);
    free(start);
    free(fill);
    free(at);
    free(g);
}

/* Leads rounds while the queue has calls (at most LK_ROUNDS), then hands
 * the lead to the oldest queued call or leaves the queue idle. The caller
 * holds the lead, and its own call self is queued: the first round
 * answers it. */
static void lk_lead(struct kv__cluster *c, struct lk_call *self)
{
    for (int n = 0;; n++) {
        pthread_mutex_lock(&c->lklock);
        struct lk_call *list = c->lkq;
        if (!list || n >= LK_ROUNDS) {
            unsigned next = list ? list->round : 0;
            if (list)
                atomic_store(&list->state, LK_LEAD);
            else
                c->lkbusy = 0;
            pthread_mutex_unlock(&c->lklock);
            if (list)
                lk_futex_bump(&c->lkword[next & 1]);
            return;
        }
        unsigned r = c->lkround++;
        c->lkq = c->lklast = NULL;
        pthread_mutex_unlock(&c->lklock);
        lk_round(c, list);
        for (struct lk_call *k = list, *next; k; k = next) {
            next = k->next;     /* k may be gone once its caller sees done */
            atomic_store(&k->state, LK_DONE);
        }
        if (list != self || self->next)
            lk_futex_bump(&c->lkword[r & 1]);
    }
}

/* run_grouped for lookups: this node's share served here, the remote
 * owners' shares through the queue (see above). */
static int run_lookups(struct kv__cluster *c, struct view *v, struct kv__op *ops, size_t *owner,
                       size_t n)
{
    if (!n)
        return KV_OK;
    size_t *start = calloc(v->n + 1, sizeof *start), *fill = calloc(v->n + 1, sizeof *fill);
    size_t *pos = malloc(n * sizeof *pos);
    struct kv__op *g = malloc(n * sizeof *g);
    struct lk_req *reqs = malloc((v->n ? v->n : 1) * sizeof *reqs);
    int rc = KV_ENOMEM;
    if (!start || !fill || !pos || !g || !reqs)
        goto out;
    for (size_t i = 0; i < n; i++)
        start[owner[i] + 1]++;
    for (size_t p = 0; p < v->n; p++)
        start[p + 1] += start[p];
    for (size_t i = 0; i < n; i++) {
        pos[i] = start[owner[i]] + fill[owner[i]]++;
        g[pos[i]] = ops[i];
    }
    struct lk_call call = { .reqs = reqs, .state = LK_WAIT };
    for (size_t p = 0; p < v->n; p++)
        if (start[p + 1] > start[p] && !v->owners[p]->self)
            reqs[call.nreq++] = (struct lk_req){ .p = v->owners[p], .ops = g + start[p],
                                                 .n = start[p + 1] - start[p] };
    int lead = 0;
    if (call.nreq) {
        pthread_mutex_lock(&c->lklock);
        call.round = c->lkround;
        if (c->lkq)
            c->lklast->next = &call;
        else
            c->lkq = &call;
        c->lklast = &call;
        if (!c->lkbusy)
            c->lkbusy = lead = 1;
        pthread_mutex_unlock(&c->lklock);
    }
    /* This node's own share: no frame to share. A follower serves it while
     * the round in flight runs; a leader before its rounds, which other
     * callers' lookups join meanwhile. */
    for (size_t p = 0; p < v->n; p++)
        if (start[p + 1] > start[p] && v->owners[p]->self)
            run_local(c, g + start[p], start[p + 1] - start[p]);
    if (lead)
        lk_lead(c, &call);
    while (call.nreq) {
        _Atomic uint32_t *w = &c->lkword[call.round & 1];
        uint32_t seen = atomic_load(w);
        int st = atomic_load(&call.state);
        if (st == LK_DONE)
            break;
        if (st == LK_LEAD) {
            /* Handed the lead: this call is the oldest queued, so the
             * first round run here answers it. */
            atomic_store(&call.state, LK_WAIT);
            lk_lead(c, &call);
            continue;
        }
        lk_futex_wait(w, seen);
    }
    for (size_t i = 0; i < n; i++)
        ops[i] = g[pos[i]];
    rc = KV_OK;
out:
    free(start);
    free(fill);
    free(pos);
    free(g);
    free(reqs);
    return rc;
}

/* One try of kv__cluster_lookup on the current view (its version in *ver).
 * An id that missed because an owner failed as owner_failed says, or was
 * not asked for being down, gets failed[i] set (its caller may ask again
 * on a newer view). */
static int lookup_once(struct kv__cluster *c, int ns, const kv_block_id *ids, size_t n,
                       uint8_t *hit, uint8_t *failed, uint64_t *ver)
{
    struct fan f;
    if (fan_init(c, &f, n, true) != KV_OK)
        return KV_ENOMEM;
    *ver = f.v->version;
    for (size_t i = 0; i < n; i++) {
        struct kv__op op = { .kind = KV_OP_LOOKUP, .ns = (uint8_t)ns, .id = ids[i] };
        size_t k0 = f.k;
        /* An owner marked down is not asked: that is a failure too, not a miss. */
        failed[i] = fan_add(c, &f, i, &op) > f.k - k0;
        hit[i] = 0;
    }
    int rc = run_lookups(c, f.v, f.ops, f.owner, f.k);
    for (size_t j = 0; rc == KV_OK && j < f.k; j++) {
        if (f.ops[j].result == KV_OK && f.ops[j].hit)
            hit[f.item[j]] = 1;
        else if (owner_failed(f.ops[j].result))
            failed[f.item[j]] = 1;
    }
    /* During a move window, misses ask their previous owners too; while
     * owners leave, their owners without the leavers. */
    f.k = 0;
    for (size_t i = 0; rc == KV_OK && i < n; i++)
        if (!hit[i]) {
            struct kv__op op = { .kind = KV_OP_LOOKUP, .ns = (uint8_t)ns, .id = ids[i] };
            fan_add_prev(c, &f, i, &op);
            fan_add_stay(c, &f, i, &op);
        }
    if (f.k && rc == KV_OK) {
        rc = run_lookups(c, f.v, f.ops, f.owner, f.k);
        for (size_t j = 0; rc == KV_OK && j < f.k; j++)
            if (f.ops[j].result == KV_OK && f.ops[j].hit)
                hit[f.item[j]] = 1;
    }
    fan_free(&f);
    if (rc == KV_OK && ns == KV_NS_BLOCK && c->cfg.store.block_shards > 1)
        rc = complete_blocks(c, ns, ids, n, hit);
    return rc;
}

/* A miss because an owner was gone is not a miss: like every call (see
 * owner_failed), ids whose owner failed are asked once more on a view that
 * moved, so a caller behind the view is not told a stored block is absent. */
int kv__cluster_lookup(struct kv__cluster *c, int ns, const kv_block_id *ids, size_t n,
                       uint8_t *hit)
{
    if (!c || (n && (!ids || !hit)) || ns < 0 || ns >= KV_NS_COUNT)
        return KV_EINVAL;
    uint64_t t0 = kv__now_ms(), ver = 0;
    uint8_t one = 0, *failed = n > 1 ? malloc(n) : &one;
    if (!failed)
        return KV_ENOMEM;
    int rc = lookup_once(c, ns, ids, n, hit, failed, &ver);
    size_t k = 0;
    for (size_t i = 0; rc == KV_OK && i < n; i++)
        k += failed[i] && !hit[i];
    if (k && view_moved(c, t0, ver)) {
        kv_block_id *sub = malloc(k * sizeof *sub);
        size_t *idx = malloc(k * sizeof *idx);
        uint8_t *h2 = malloc(2 * k);
        if (sub && idx && h2) {
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                if (failed[i] && !hit[i]) {
                    idx[m] = i;
                    sub[m++] = ids[i];
                }
            if (lookup_once(c, ns, sub, m, h2, h2 + m, &ver) == KV_OK) {
                k = 0;   /* those still unsure after the second ask */
                for (size_t j = 0; j < m; j++) {
                    hit[idx[j]] = h2[j];
                    k += h2[m + j] && !h2[j];
                }
            }
        }
        free(sub);
        free(idx);
        free(h2);
    }
    /* Absent for all the caller can tell, but an owner could not be asked:
     * kv_lookup has no per-id error, so these are counted (a false miss
     * costs a recompute, never wrong bytes). */
    if (rc == KV_OK && k)
        atomic_fetch_add(&c->lookups_unsure, k);
    if (failed != &one)
        free(failed);
    return rc;
}

/* The fallback of size_once: asks owners[0..n) of v that are not down, in
 * turn, until one knows the size; KV_OK with *len, else KV_ENOTFOUND. */
static int size_from(struct kv__cluster *c, struct view *v, int ns, const kv_block_id *id,
                     uint32_t index, const size_t *owners, size_t n, uint64_t *len)
{
    for (size_t j = 0; j < n; j++) {
        if (peer_is_down(v->owners[owners[j]]))
            continue;
        struct kv__op o = { .kind = KV_OP_SIZE, .ns = (uint8_t)ns, .index = index, .id = *id };
        size_t own = owners[j];
        if (run_grouped(c, v, &o, &own, 1) == KV_OK && o.result == KV_OK) {
            *len = o.len;
            return KV_OK;
        }
    }
    return KV_ENOTFOUND;
}

static int size_once(struct kv__cluster *c, int ns, const kv_block_id *id, uint32_t index,
                     uint64_t *len, uint64_t *ver)
{
    if (!c || !id || !len || ns < 0 || ns >= KV_NS_COUNT)
        return KV_EINVAL;
    struct view *v = view_get(c);
    *ver = v->version;
    size_t cand[KV_PLACE_MAX];
    size_t m = candidates(v, id, c->replicas, cand);
    int res = m ? KV_ENET : KV_ENOTFOUND, rc = KV_OK;
    for (size_t j = 0; j < m; j++) {
        struct kv__op o = { .kind = KV_OP_SIZE, .ns = (uint8_t)ns, .index = index, .id = *id };
        size_t own = cand[j];
        if ((rc = run_grouped(c, v, &o, &own, 1)))
            break;
        if (o.result == KV_OK) {
            *len = o.len;
            res = KV_OK;
            break;
        }
        res = j == 0 ? o.result : worse(res, o.result);
        if (o.result == KV_ENOTFOUND)
            res = KV_ENOTFOUND;
    }
    /* Not on a current owner: while owners leave, on their owners without
     * the leavers; during a move window, on a previous one (as sizes_once
     * and a load ask them). */
    size_t st[KV_PLACE_MAX];
    size_t nsc = rc == KV_OK && res != KV_OK ? stay_candidates(v, id, c->replicas, cand, m, st)
                                             : 0;
    if (nsc && size_from(c, v, ns, id, index, st, nsc, len) == KV_OK)
        res = KV_OK;
    struct view *pv = rc == KV_OK && res != KV_OK ? prev_get(c) : NULL;
    if (pv) {
        size_t prev[KV_PLACE_MAX];
        size_t e = prev_candidates(v, pv, id, c->replicas, cand, m, prev);
        if (size_from(c, v, ns, id, index, prev, e, len) == KV_OK)
            res = KV_OK;
        view_put(pv);
    }
    view_put(v);
    return rc ? rc : res;
}

int kv__cluster_size(struct kv__cluster *c, int ns, const kv_block_id *id, uint32_t index,
                     uint64_t *len)
{
    uint64_t t0 = kv__now_ms(), ver = 0;
    int rc = size_once(c, ns, id, index, len, &ver);
    if (owner_failed(rc) && view_moved(c, t0, ver))
        rc = size_once(c, ns, id, index, len, &ver);
    return rc;
}

int kv__cluster_register_buffer(struct kv__cluster *c, void *addr, size_t len)
{
    if (!c || !addr || !len)
        return KV_EINVAL;
    return c->ops->register_buffer ? c->ops->register_buffer(c->t, addr, len) : KV_OK;
}

int kv__cluster_unregister_buffer(struct kv__cluster *c, void *addr)
{
    if (!c || !addr)
        return KV_EINVAL;
    return c->ops->unregister_buffer ? c->ops->unregister_buffer(c->t, addr) : KV_OK;
}

void kv__cluster_stats(struct kv__cluster *c, kv_stats *out)
{
    /* kv_stats has no cluster fields yet (see kv__cluster_counters); the
     * loads this client refused for their checksum add to the node's. */
    if (c && c->t)
        out->checksum_failures +=
            atomic_load(&((struct kv__transport_base *)c->t)->checksum_failures);
}

void kv__cluster_counters(struct kv__cluster *c, struct kv__cluster_counters *out)
{
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    out->remote_items = atomic_load(&c->remote_ops);
    out->remote_errors = atomic_load(&c->remote_errors);
    out->failovers = atomic_load(&c->failovers);
    out->moved = atomic_load(&c->moved);
    out->rereplicated_shards = atomic_load(&c->rr_shards);
    out->rereplicated_bytes = atomic_load(&c->rr_bytes);
    out->rereplicate_failed = atomic_load(&c->rr_failed);
    out->rereplicate_pending = atomic_load(&c->rr_pending);
    out->rereplicate_jobs = atomic_load(&c->rr_jobs);
    out->rereplicate_behind = atomic_load(&c->rr_wanted) - atomic_load(&c->rr_done);
    out->handed_off = atomic_load(&c->handed_off);
    out->forwarded = atomic_load(&c->forwarded);
    out->refused_not_owner = atomic_load(&c->refused_not_owner);
    out->refused_stale = atomic_load(&c->refused_stale);
    out->removes_fenced = atomic_load(&c->removes_fenced);
    out->lookups_unsure = atomic_load(&c->lookups_unsure);
    out->leaving = (uint64_t)atomic_load(&c->leaving);
    pthread_mutex_lock(&c->vlock);
    for (struct peer *p = c->peers; p; p = p->next)
        out->peers++;
    pthread_mutex_unlock(&c->vlock);
    struct view *v = view_get(c);
    out->view_version = v->version;
    out->members = v->nmembers;
    out->owners = v->n;
    view_put(v);
}

const char *kv__cluster_addr(struct kv__cluster *c)
{
    return c->be ? c->self.addr : "";
}

void kv__cluster_view(struct kv__cluster *c, uint64_t *version, size_t *members, size_t *owners)
{
    struct view *v = view_get(c);
    if (version)
        *version = v->version;
    if (members)
        *members = v->nmembers;
    if (owners)
        *owners = v->n;
    view_put(v);
}
