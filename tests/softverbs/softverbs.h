/*
 * softverbs.h — the parts of the libibverbs stand-in share this.
 *
 * The stand-in keeps one registry per test run in a file under /dev/shm,
 * mapped shared by every process that opens the device: memory regions
 * (key -> pid, protection domain, address, length, access) and queue pairs
 * (QPN -> pid, state, peer, PSNs). A work request looks its peer and rkey up
 * there, checks them the way an RC responder would, and moves the bytes with
 * process_vm_readv / process_vm_writev. One lock (a process mutex plus an
 * fcntl lock on the file) guards the registry, held across a transfer so
 * that a region cannot be deregistered under a copy.
 */
#ifndef SOFTVERBS_H
#define SOFTVERBS_H

#include <stdint.h>
#include <sys/types.h>

#define SV_MAX_CTX 256
#define SV_MAX_MR  2048
#define SV_MAX_QP  1024

struct sv_ctx_ent { int32_t pid; uint32_t ctx; };

struct sv_mr_ent {
    int32_t  pid;          /* 0: free */
    uint32_t ctx, pd, key, access, pad;
    uint64_t iova;         /* the address work requests name */
    uint64_t addr;         /* where the bytes are in pid's address space */
    uint64_t len;
};

struct sv_qp_ent {
    int32_t  pid;          /* 0: free */
    uint32_t ctx, pd, qpn, state, dest_qpn, access, mtu;
    uint32_t sq_psn;       /* next PSN this QP sends */
    uint32_t rq_psn;       /* next PSN this QP expects */
};

struct sv_registry {
    uint64_t magic;
    uint32_t gen, pad;
    struct sv_ctx_ent ctx[SV_MAX_CTX];
    struct sv_mr_ent  mr[SV_MAX_MR];
    struct sv_qp_ent  qp[SV_MAX_QP];
};

/* registry.c */
extern struct sv_registry *sv_reg;
int  sv_attach(uint32_t ctx);       /* 0 or an errno value */
void sv_detach(uint32_t ctx);
void sv_lock(void);
void sv_unlock(void);
int  sv_pid_alive(int32_t pid);
/* Under the lock: a free (or dead owner's) slot, or -1. */
int  sv_free_mr_slot(void);
int  sv_free_qp_slot(void);
uint32_t sv_next_gen(void);
/* Under the lock: the live entry a key / QPN names, or NULL. */
struct sv_mr_ent *sv_find_mr(uint32_t key);
struct sv_qp_ent *sv_find_qp(uint32_t qpn);

#endif
