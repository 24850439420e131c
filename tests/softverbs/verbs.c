/*
 * verbs.c — a userspace stand-in for libibverbs.so.1, for tests only.
 *
 * It reports one device, "softverbs0", with port 1 active on an Ethernet
 * link layer (RoCE-like: LID 0, GID ::ffff:127.0.0.1, a GRH is required),
 * and implements the exported calls an RC transport uses plus the context
 * ops behind the inline ibv_post_send / ibv_poll_cq. The context is a real
 * struct verbs_context with the ibv_context embedded last, so the inline
 * helpers that look for extended ops (ibv_query_port) find them.
 *
 * Key choice: a work request is carried out synchronously inside
 * ibv_post_send, checked against the shared registry (registry.c) the way
 * an RC responder checks a packet, and its bytes are moved with
 * process_vm_readv / process_vm_writev. It proves a protocol, not speed.
 * Supported: RC QPs, RDMA WRITE and RDMA READ, signaled or not, inline
 * data. Not supported (EOPNOTSUPP): SEND/RECV, immediate data, atomics,
 * completion channels, SRQs, UD, memory windows, extended verbs.
 *
 * Faithful to hardware where a transport could get it wrong: QP state
 * transitions and their required attribute masks, PSN agreement between
 * the two ends, rkey / bounds / PD / MR and QP access checks, and an error
 * completion moving the QP to the error state (later WRs are flushed). On a
 * remote access error the responder's QP goes to the error state too.
 */
#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/*
 * Test control (not libibverbs): the next n RDMA READ/WRITE work requests
 * this process posts fail as a wrong rkey would (IBV_WC_REM_ACCESS_ERR, the
 * QP to the error state), so a transport's tests can watch one error
 * completion fail exactly the items it carried. The fault lives here, in
 * the stand-in for the hardware, not as a hook in the library. Tests find
 * it with dlsym(RTLD_DEFAULT, "softverbs_fail_next").
 */
static _Atomic int fail_next;
void softverbs_fail_next(int n);
void softverbs_fail_next(int n) { atomic_store(&fail_next, n); }

static int injected_failure(void)
{
    return atomic_load(&fail_next) > 0 && atomic_fetch_sub(&fail_next, 1) > 0;
}

#include "softverbs.h"

/* The signatures are libibverbs'; many calls ignore some of their arguments. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define SV_MAX_SGE    16
#define SV_MAX_WR     4096
#define SV_MAX_INLINE 256
#define SV_MAX_MSG    (1u << 31)

struct sv_context { struct verbs_context vctx; uint32_t id; };
struct sv_pd      { struct ibv_pd pd; uint32_t id; int users; };
struct sv_mr      { struct ibv_mr mr; int slot; };
struct sv_cq {
    struct ibv_cq cq;
    pthread_mutex_t mu;
    int cap, head, count, users;
    struct ibv_wc *ring;
};
struct sv_qp {
    struct ibv_qp qp;
    int slot, sig_all;
    struct ibv_qp_cap cap;
    struct ibv_qp_attr attr;     /* what modify_qp was given, for query_qp */
};

#define CONTAINER(p, type, member) ((type *)((char *)(p) - offsetof(type, member)))

static pthread_mutex_t id_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_id;

static uint32_t new_id(void)
{
    pthread_mutex_lock(&id_mu);
    uint32_t id = ++next_id;
    pthread_mutex_unlock(&id_mu);
    return id;
}

static struct ibv_device sv_device = {
    .node_type = IBV_NODE_CA,
    .transport_type = IBV_TRANSPORT_IB,
    .name = "softverbs0",
    .dev_name = "uverbs0",
    .dev_path = "/sys/class/infiniband_verbs/uverbs0",
    .ibdev_path = "/sys/class/infiniband/softverbs0",
};

static uint64_t max_mr_size(void)
{
    const char *s = getenv("SOFTVERBS_MAX_MR_SIZE");
    if (!s || !*s)
        return 1ull << 30;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    }
    return v ? v : 1ull << 30;
}

/* ---- device ------------------------------------------------------------ */

struct ibv_device **ibv_get_device_list(int *num_devices)
{
    /* Lets a test take the real library's "no device" path under the stand-in. */
    if (getenv("SOFTVERBS_NO_DEVICE")) {
        if (num_devices)
            *num_devices = 0;
        errno = ENOSYS;
        return NULL;
    }
    struct ibv_device **l = calloc(2, sizeof *l);
    if (!l) {
        errno = ENOMEM;
        return NULL;
    }
    l[0] = &sv_device;
    if (num_devices)
        *num_devices = 1;
    return l;
}

void ibv_free_device_list(struct ibv_device **list) { free(list); }

const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }

__be64 ibv_get_device_guid(struct ibv_device *device) { return htobe64(0x50f7000000000001ull); }

int ibv_fork_init(void) { return 0; }

static int sv_not_supported(void) { return EOPNOTSUPP; }

static int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    *bad = wr;
    return EOPNOTSUPP;
}
static int sv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc);
static int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only) { return EOPNOTSUPP; }
static int sv_query_port_ex(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len);

/* process_vm_readv on a peer needs ptrace rights over it; under Yama scope 1
 * only a declared ptracer may, so every process declares any as allowed. */
static void allow_peers(void)
{
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (!f)
        return;
    int scope = 0;
    if (fscanf(f, "%d", &scope) != 1)
        scope = 0;
    fclose(f);
    if (scope == 1)
        prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    else if (scope >= 2 && geteuid() != 0)
        fprintf(stderr, "softverbs: kernel.yama.ptrace_scope=%d forbids "
                        "process_vm_readv between processes; transfers will fail\n", scope);
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    if (device != &sv_device) {
        errno = ENODEV;
        return NULL;
    }
    allow_peers();
    struct sv_context *c = calloc(1, sizeof *c);
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->id = new_id();
    int err = sv_attach(c->id);
    if (err) {
        free(c);
        errno = err;
        return NULL;
    }
    struct ibv_context *ctx = &c->vctx.context;
    ctx->device = device;
    ctx->cmd_fd = -1;
    ctx->async_fd = -1;
    ctx->num_comp_vectors = 1;
    pthread_mutex_init(&ctx->mutex, NULL);
    ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
    ctx->ops.post_send = sv_post_send;
    ctx->ops.post_recv = sv_post_recv;
    ctx->ops.poll_cq = sv_poll_cq;
    ctx->ops.req_notify_cq = sv_req_notify_cq;
    ctx->ops.post_srq_recv = (void *)sv_not_supported;
    ctx->ops.bind_mw = (void *)sv_not_supported;
    ctx->ops.dealloc_mw = (void *)sv_not_supported;
    c->vctx.sz = sizeof c->vctx;
    c->vctx.query_port = sv_query_port_ex;
    return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
    struct sv_context *c = CONTAINER(ctx, struct sv_context, vctx.context);
    sv_detach(c->id);
    pthread_mutex_destroy(&ctx->mutex);
    free(c);
    return 0;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
    memset(a, 0, sizeof *a);
    snprintf(a->fw_ver, sizeof a->fw_ver, "softverbs-1");
    a->node_guid = ibv_get_device_guid(ctx->device);
    a->sys_image_guid = a->node_guid;
    a->max_mr_size = max_mr_size();
    a->page_size_cap = 0xfffff000;
    a->max_qp = SV_MAX_QP;
    a->max_qp_wr = SV_MAX_WR;
    a->max_sge = SV_MAX_SGE;
    a->max_sge_rd = SV_MAX_SGE;
    a->max_cq = 1024;
    a->max_cqe = 65536;
    a->max_mr = SV_MAX_MR;
    a->max_pd = 1024;
    a->max_qp_rd_atom = 16;
    a->max_res_rd_atom = 16 * SV_MAX_QP;
    a->max_qp_init_rd_atom = 16;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_pkeys = 1;
    a->phys_port_cnt = 1;
    return 0;
}

static int sv_query_port_ex(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len)
{
    if (port != 1)
        return EINVAL;
    struct ibv_port_attr p = {
        .state = IBV_PORT_ACTIVE, .max_mtu = IBV_MTU_4096, .active_mtu = IBV_MTU_1024,
        .gid_tbl_len = 1, .max_msg_sz = SV_MAX_MSG, .pkey_tbl_len = 1, .lid = 0,
        .active_width = 2, .active_speed = 32, .phys_state = 5,
        .link_layer = IBV_LINK_LAYER_ETHERNET,
    };
    memcpy(a, &p, len < sizeof p ? len : sizeof p);
    return 0;
}

/* The old entry point, for callers built without the verbs_context helper:
 * it fills only the fields that struct had (everything before flags). */
int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *a)
{
    return sv_query_port_ex(c, port, (struct ibv_port_attr *)a,
                            offsetof(struct ibv_port_attr, flags));
}

int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
    if (port != 1 || index != 0)
        return -1;
    /* RoCE v2 derives the GID from the interface address: ::ffff:127.0.0.1. */
    memset(gid, 0, sizeof *gid);
    gid->raw[10] = gid->raw[11] = 0xff;
    gid->raw[12] = 127;
    gid->raw[15] = 1;
    return 0;
}

/* ---- protection domains and memory regions ----------------------------- */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    struct sv_pd *p = calloc(1, sizeof *p);
    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    p->pd.context = ctx;
    p->id = new_id();
    p->pd.handle = p->id;
    return &p->pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    struct sv_pd *p = CONTAINER(pd, struct sv_pd, pd);
    if (__atomic_load_n(&p->users, __ATOMIC_RELAXED))
        return EBUSY;
    free(p);
    return 0;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                uint64_t iova, unsigned int access)
{
    struct sv_pd *p = CONTAINER(pd, struct sv_pd, pd);
    unsigned known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_HUGETLB | IBV_ACCESS_RELAXED_ORDERING;
    access &= ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_RELAXED_ORDERING;
    if ((access & ~known) || length == 0 || !addr || length > max_mr_size() ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
         !(access & IBV_ACCESS_LOCAL_WRITE))) {
        errno = (access & ~known) ? EOPNOTSUPP : EINVAL;
        return NULL;
    }
    /* Real registration pins the pages and fails on a hole in the range. */
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)addr & ~(uintptr_t)(pg - 1);
    if (msync((void *)lo, (uintptr_t)addr + length - lo, MS_ASYNC) < 0) {
        errno = EFAULT;
        return NULL;
    }
    struct sv_mr *m = calloc(1, sizeof *m);
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    struct sv_context *c = CONTAINER(pd->context, struct sv_context, vctx.context);
    sv_lock();
    int slot = sv_free_mr_slot();
    if (slot < 0) {
        sv_unlock();
        free(m);
        errno = ENOMEM;
        return NULL;
    }
    struct sv_mr_ent *e = &sv_reg->mr[slot];
    *e = (struct sv_mr_ent){
        .pid = getpid(), .ctx = c->id, .pd = p->id,
        .key = (uint32_t)(slot + 1) << 8 | (sv_next_gen() & 0xff),
        .access = access, .iova = iova, .addr = (uintptr_t)addr, .len = length,
    };
    m->slot = slot;
    m->mr = (struct ibv_mr){ .context = pd->context, .pd = pd, .addr = addr, .length = length,
                             .handle = (uint32_t)slot, .lkey = e->key, .rkey = e->key };
    sv_unlock();
    __atomic_add_fetch(&p->users, 1, __ATOMIC_RELAXED);
    return &m->mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
                               uint64_t iova, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    struct sv_mr *m = CONTAINER(mr, struct sv_mr, mr);
    struct sv_pd *p = CONTAINER(mr->pd, struct sv_pd, pd);
    sv_lock();
    struct sv_mr_ent *e = &sv_reg->mr[m->slot];
    if (e->pid == getpid() && e->key == mr->lkey)
        memset(e, 0, sizeof *e);
    sv_unlock();
    __atomic_sub_fetch(&p->users, 1, __ATOMIC_RELAXED);
    free(m);
    return 0;
}

/* ---- completion queues --------------------------------------------------- */

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    if (channel) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (cqe < 1 || cqe > 65536) {
        errno = EINVAL;
        return NULL;
    }
    struct sv_cq *q = calloc(1, sizeof *q);
    if (q)
        q->ring = calloc((size_t)cqe, sizeof *q->ring);
    if (!q || !q->ring) {
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->cap = cqe;
    pthread_mutex_init(&q->mu, NULL);
    q->cq.context = ctx;
    q->cq.cq_context = cq_context;
    q->cq.cqe = cqe;
    pthread_mutex_init(&q->cq.mutex, NULL);
    pthread_cond_init(&q->cq.cond, NULL);
    return &q->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    struct sv_cq *q = CONTAINER(cq, struct sv_cq, cq);
    if (__atomic_load_n(&q->users, __ATOMIC_RELAXED))
        return EBUSY;
    pthread_mutex_destroy(&q->mu);
    pthread_mutex_destroy(&q->cq.mutex);
    pthread_cond_destroy(&q->cq.cond);
    free(q->ring);
    free(q);
    return 0;
}

static int sv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    struct sv_cq *q = CONTAINER(ibcq, struct sv_cq, cq);
    int got = 0;
    pthread_mutex_lock(&q->mu);
    while (got < n && q->count > 0) {
        wc[got++] = q->ring[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    pthread_mutex_unlock(&q->mu);
    return got;
}

static int cq_room(struct sv_cq *q)
{
    pthread_mutex_lock(&q->mu);
    int room = q->cap - q->count;
    pthread_mutex_unlock(&q->mu);
    return room;
}

static void cq_push(struct sv_cq *q, const struct ibv_wc *wc)
{
    pthread_mutex_lock(&q->mu);
    if (q->count < q->cap) {
        q->ring[(q->head + q->count) % q->cap] = *wc;
        q->count++;
    }
    pthread_mutex_unlock(&q->mu);
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    static const char *const s[] = {
        [IBV_WC_SUCCESS] = "success",
        [IBV_WC_LOC_LEN_ERR] = "local length error",
        [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
        [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
        [IBV_WC_LOC_PROT_ERR] = "local protection error",
        [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
        [IBV_WC_MW_BIND_ERR] = "memory management operation error",
        [IBV_WC_BAD_RESP_ERR] = "bad response error",
        [IBV_WC_LOC_ACCESS_ERR] = "local access error",
        [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
        [IBV_WC_REM_ACCESS_ERR] = "remote access error",
        [IBV_WC_REM_OP_ERR] = "remote operation error",
        [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
        [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
        [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
        [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
        [IBV_WC_REM_ABORT_ERR] = "aborted error",
        [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
        [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
        [IBV_WC_FATAL_ERR] = "fatal error",
        [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
        [IBV_WC_GENERAL_ERR] = "general error",
    };
    if ((unsigned)status < sizeof s / sizeof s[0] && s[status])
        return s[status];
    return "unknown";
}

const char *ibv_port_state_str(enum ibv_port_state s)
{
    static const char *const n[] = { "PORT_NOP", "PORT_DOWN", "PORT_INIT",
                                     "PORT_ARMED", "PORT_ACTIVE", "PORT_ACTIVE_DEFER" };
    return (unsigned)s < 6 ? n[s] : "unknown";
}

/* ---- queue pairs ----------------------------------------------------------- */

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    if (ia->qp_type != IBV_QPT_RC || ia->srq) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (!ia->send_cq || !ia->recv_cq || ia->cap.max_send_wr > SV_MAX_WR ||
        ia->cap.max_recv_wr > SV_MAX_WR || ia->cap.max_send_sge > SV_MAX_SGE ||
        ia->cap.max_recv_sge > SV_MAX_SGE || ia->cap.max_inline_data > SV_MAX_INLINE) {
        errno = EINVAL;
        return NULL;
    }
    struct sv_qp *q = calloc(1, sizeof *q);
    if (!q) {
        errno = ENOMEM;
        return NULL;
    }
    struct sv_pd *p = CONTAINER(pd, struct sv_pd, pd);
    struct sv_context *c = CONTAINER(pd->context, struct sv_context, vctx.context);
    sv_lock();
    int slot = sv_free_qp_slot();
    if (slot < 0) {
        sv_unlock();
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    uint32_t qpn = (sv_next_gen() % 0x3fffu + 1) << 10 | (uint32_t)slot;
    sv_reg->qp[slot] = (struct sv_qp_ent){ .pid = getpid(), .ctx = c->id, .pd = p->id,
                                           .qpn = qpn, .state = IBV_QPS_RESET };
    sv_unlock();
    q->slot = slot;
    q->sig_all = ia->sq_sig_all;
    q->cap = ia->cap;
    q->cap.max_inline_data = SV_MAX_INLINE;
    ia->cap = q->cap;
    q->qp = (struct ibv_qp){ .context = pd->context, .qp_context = ia->qp_context, .pd = pd,
                             .send_cq = ia->send_cq, .recv_cq = ia->recv_cq,
                             .handle = (uint32_t)slot, .qp_num = qpn,
                             .state = IBV_QPS_RESET, .qp_type = IBV_QPT_RC };
    pthread_mutex_init(&q->qp.mutex, NULL);
    pthread_cond_init(&q->qp.cond, NULL);
    __atomic_add_fetch(&p->users, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&CONTAINER(ia->send_cq, struct sv_cq, cq)->users, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&CONTAINER(ia->recv_cq, struct sv_cq, cq)->users, 1, __ATOMIC_RELAXED);
    return &q->qp;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    struct sv_qp *q = CONTAINER(qp, struct sv_qp, qp);
    sv_lock();
    struct sv_qp_ent *e = &sv_reg->qp[q->slot];
    if (e->pid == getpid() && e->qpn == qp->qp_num)
        memset(e, 0, sizeof *e);
    sv_unlock();
    __atomic_sub_fetch(&CONTAINER(qp->pd, struct sv_pd, pd)->users, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&CONTAINER(qp->send_cq, struct sv_cq, cq)->users, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&CONTAINER(qp->recv_cq, struct sv_cq, cq)->users, 1, __ATOMIC_RELAXED);
    pthread_mutex_destroy(&qp->mutex);
    pthread_cond_destroy(&qp->cond);
    free(q);
    return 0;
}

/* The attribute masks the kernel requires for each RC transition. */
static int transition_ok(enum ibv_qp_state cur, enum ibv_qp_state next, int mask)
{
    int need;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
        return 1;
    if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT)
        need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT)
        need = 0;
    else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR)
        need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    else if ((cur == IBV_QPS_RTR || cur == IBV_QPS_RTS) && next == IBV_QPS_RTS)
        need = cur == IBV_QPS_RTS ? 0 : IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
    else
        return 0;
    return (mask & need) == need;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    struct sv_qp *q = CONTAINER(qp, struct sv_qp, qp);
    sv_lock();
    struct sv_qp_ent *e = &sv_reg->qp[q->slot];
    enum ibv_qp_state cur = (enum ibv_qp_state)e->state;
    enum ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
    int err = 0;
    if (!transition_ok(cur, next, mask))
        err = EINVAL;
    else if ((mask & IBV_QP_PORT) && attr->port_num != 1)
        err = EINVAL;
    else if ((mask & IBV_QP_AV) && (attr->ah_attr.port_num != 1 || !attr->ah_attr.is_global))
        err = EINVAL;      /* RoCE: every packet carries a GRH */
    else if ((mask & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096))
        err = EINVAL;
    if (err) {
        sv_unlock();
        return err;
    }
    if (mask & IBV_QP_ACCESS_FLAGS)
        e->access = attr->qp_access_flags;
    if (mask & IBV_QP_PATH_MTU)
        e->mtu = 128u << attr->path_mtu;
    if (mask & IBV_QP_DEST_QPN)
        e->dest_qpn = attr->dest_qp_num;
    if (mask & IBV_QP_RQ_PSN)
        e->rq_psn = attr->rq_psn & 0xffffff;
    if (mask & IBV_QP_SQ_PSN)
        e->sq_psn = attr->sq_psn & 0xffffff;
    e->state = next;
    if (next == IBV_QPS_RESET) {
        uint32_t keep[] = { (uint32_t)e->pid, e->ctx, e->pd, e->qpn };
        *e = (struct sv_qp_ent){ .pid = (int32_t)keep[0], .ctx = keep[1], .pd = keep[2],
                                 .qpn = keep[3], .state = IBV_QPS_RESET };
    }
    sv_unlock();
    qp->state = next;
    /* Remember what was set so query_qp can give it back. */
    q->attr.qp_state = next;
    if (mask & IBV_QP_AV) q->attr.ah_attr = attr->ah_attr;
    if (mask & IBV_QP_PKEY_INDEX) q->attr.pkey_index = attr->pkey_index;
    if (mask & IBV_QP_PORT) q->attr.port_num = attr->port_num;
    if (mask & IBV_QP_TIMEOUT) q->attr.timeout = attr->timeout;
    if (mask & IBV_QP_RETRY_CNT) q->attr.retry_cnt = attr->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) q->attr.rnr_retry = attr->rnr_retry;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q->attr.max_rd_atomic = attr->max_rd_atomic;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) q->attr.max_dest_rd_atomic = attr->max_dest_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER) q->attr.min_rnr_timer = attr->min_rnr_timer;
    if (mask & IBV_QP_PATH_MTU) q->attr.path_mtu = attr->path_mtu;
    return 0;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *ia)
{
    struct sv_qp *q = CONTAINER(qp, struct sv_qp, qp);
    *attr = q->attr;
    sv_lock();
    struct sv_qp_ent *e = &sv_reg->qp[q->slot];
    attr->qp_state = attr->cur_qp_state = (enum ibv_qp_state)e->state;
    attr->dest_qp_num = e->dest_qpn;
    attr->qp_access_flags = e->access;
    attr->sq_psn = e->sq_psn;
    attr->rq_psn = e->rq_psn;
    sv_unlock();
    attr->cap = q->cap;
    memset(ia, 0, sizeof *ia);
    ia->qp_context = qp->qp_context;
    ia->send_cq = qp->send_cq;
    ia->recv_cq = qp->recv_cq;
    ia->cap = q->cap;
    ia->qp_type = IBV_QPT_RC;
    ia->sq_sig_all = q->sig_all;
    return 0;
}

/* ---- the data path --------------------------------------------------------- */

/* Finds where [addr, addr+len) of a region's iova space lies in its owner's
 * memory; 0 when it is not wholly inside. */
static uint64_t translate(const struct sv_mr_ent *m, uint64_t addr, uint64_t len)
{
    if (addr < m->iova || len > m->len || addr - m->iova > m->len - len)
        return 0;
    return m->addr + (addr - m->iova);
}

/* Carries out one RDMA READ or WRITE under the registry lock, as an RC
 * requester and responder would check it; returns the completion status. */
static enum ibv_wc_status execute(struct sv_qp *q, struct ibv_send_wr *wr, uint32_t *byte_len)
{
    struct sv_qp_ent *me = &sv_reg->qp[q->slot];
    struct sv_pd *pd = CONTAINER(q->qp.pd, struct sv_pd, pd);
    int32_t self = getpid();
    if (me->state == IBV_QPS_ERR)
        return IBV_WC_WR_FLUSH_ERR;

    int is_read = wr->opcode == IBV_WR_RDMA_READ;
    struct iovec local[SV_MAX_SGE];
    uint64_t total = 0;
    for (int i = 0; i < wr->num_sge; i++) {
        struct ibv_sge *s = &wr->sg_list[i];
        uint64_t at = s->addr;
        if (s->length && !(wr->send_flags & IBV_SEND_INLINE)) {
            struct sv_mr_ent *m = sv_find_mr(s->lkey);
            if (!m || m->pid != self || m->pd != pd->id ||
                (is_read && !(m->access & IBV_ACCESS_LOCAL_WRITE)))
                return IBV_WC_LOC_PROT_ERR;
            if (!(at = translate(m, s->addr, s->length)))
                return IBV_WC_LOC_PROT_ERR;
        }
        local[i] = (struct iovec){ (void *)(uintptr_t)at, s->length };
        total += s->length;
    }
    if (total > SV_MAX_MSG)
        return IBV_WC_LOC_LEN_ERR;
    *byte_len = (uint32_t)total;

    /* A peer that is gone, not ready, or connected elsewhere never answers:
     * the requester retries until its retry count runs out. */
    struct sv_qp_ent *peer = sv_find_qp(me->dest_qpn);
    if (!peer || !sv_pid_alive(peer->pid) || peer->dest_qpn != me->qpn ||
        (peer->state != IBV_QPS_RTR && peer->state != IBV_QPS_RTS))
        return IBV_WC_RETRY_EXC_ERR;
    /* Out-of-sequence PSNs draw NAKs or silence, and end the same way. */
    if (peer->rq_psn != me->sq_psn)
        return IBV_WC_RETRY_EXC_ERR;

    uint64_t remote = 0;
    if (total > 0) {
        struct sv_mr_ent *m = injected_failure() ? NULL : sv_find_mr(wr->wr.rdma.rkey);
        unsigned need = is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
        if (!m || m->pid != peer->pid || m->pd != peer->pd || !(m->access & need) ||
            !(peer->access & need) || !(remote = translate(m, wr->wr.rdma.remote_addr, total))) {
            peer->state = IBV_QPS_ERR;
            return IBV_WC_REM_ACCESS_ERR;
        }
        struct iovec riov = { (void *)(uintptr_t)remote, total };
        ssize_t n = is_read ? process_vm_readv(peer->pid, local, (unsigned long)wr->num_sge, &riov, 1, 0)
                            : process_vm_writev(peer->pid, local, (unsigned long)wr->num_sge, &riov, 1, 0);
        if (n != (ssize_t)total) {
            int err = n < 0 ? errno : EIO;
            if (err == ESRCH)
                return IBV_WC_RETRY_EXC_ERR;
            fprintf(stderr, "softverbs: process_vm_%s(pid %d): %s\n", is_read ? "readv" : "writev",
                    (int)peer->pid, strerror(err));
            return err == EFAULT ? IBV_WC_LOC_PROT_ERR : IBV_WC_REM_OP_ERR;
        }
    }
    uint32_t mtu = me->mtu ? me->mtu : 1024;
    uint32_t packets = total ? (uint32_t)((total + mtu - 1) / mtu) : 1;
    me->sq_psn = (me->sq_psn + packets) & 0xffffff;
    peer->rq_psn = (peer->rq_psn + packets) & 0xffffff;
    return IBV_WC_SUCCESS;
}

static int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct sv_qp *q = CONTAINER(ibqp, struct sv_qp, qp);
    struct sv_cq *cq = CONTAINER(ibqp->send_cq, struct sv_cq, cq);
    for (; wr; wr = wr->next) {
        int err = 0;
        uint64_t inl = 0;
        for (int i = 0; i < wr->num_sge && i < SV_MAX_SGE; i++)
            inl += wr->sg_list[i].length;
        if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ)
            err = EOPNOTSUPP;
        else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge ||
                 (wr->num_sge && !wr->sg_list))
            err = EINVAL;
        else if ((wr->send_flags & IBV_SEND_INLINE) &&
                 (wr->opcode != IBV_WR_RDMA_WRITE || inl > q->cap.max_inline_data))
            err = EINVAL;
        else if (cq_room(cq) < 1)
            err = ENOMEM;   /* the send queue is full until completions are polled */
        if (!err) {
            sv_lock();
            uint32_t state = sv_reg->qp[q->slot].state;
            if (state != IBV_QPS_RTS && state != IBV_QPS_ERR)
                err = EINVAL;
            sv_unlock();
        }
        if (err) {
            *bad = wr;
            return err;
        }
        struct ibv_wc wc = { .wr_id = wr->wr_id, .qp_num = ibqp->qp_num,
                             .opcode = wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ
                                                                      : IBV_WC_RDMA_WRITE };
        sv_lock();
        wc.status = execute(q, wr, &wc.byte_len);
        if (wc.status != IBV_WC_SUCCESS) {
            sv_reg->qp[q->slot].state = IBV_QPS_ERR;
            ibqp->state = IBV_QPS_ERR;
        }
        sv_unlock();
        if (wc.status != IBV_WC_SUCCESS || q->sig_all || (wr->send_flags & IBV_SEND_SIGNALED))
            cq_push(cq, &wc);
    }
    return 0;
}
