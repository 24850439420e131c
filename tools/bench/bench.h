/*
 * bench.h — what the parts of `kvctl bench` share (tools/bench/): the
 * backend ops table, the client sockets of the network peers, the jobs,
 * the results and their report, serving traces, plots.
 *
 * Key design choice: the benchmark drives every store through one small ops
 * table (struct kvctl_backend, after Redis's ConnectionType), so the same
 * scenario runs the same blocks against kvengine and against UCM's Posix
 * file-per-block layout or a Redis or memcached server, and adding a
 * backend touches no scenario code. Like the rest of kvctl it uses only the
 * public header; kvctl.h brings the common options and utilities.
 */
#ifndef KVCTL_BENCH_H
#define KVCTL_BENCH_H

#include "../kvctl.h"

/* ---- backends (engine.c, posix.c, peers.c) ------------------------------- */

/* What a backend is opened with. */
struct kvctl_open_args {
    const kv_config *cfg;   /* the engine's effective config (kvengine) */
    const char *dir;        /* the root directory (posix) */
    const char *addr;       /* HOST:PORT of the server (redis, memcached) */
    unsigned numjobs;       /* job threads that will call it at once */
    uint64_t value_size;    /* every block's size */
    /* Attached with --compare dram: the in-process engine's config, opened
     * beside the attached one for write_kvbuf (jobs.c run_write_kvbuf). */
    const kv_config *alt_cfg;
};

/* What a backend reports about itself after a run (0 = not applicable). */
struct kvctl_backend_info {
    uint64_t open_ns;       /* time its open took */
    uint64_t index_bytes;   /* memory its index holds */
    uint64_t shards;        /* shard values it holds in memory */
    uint64_t dram_used;     /* bytes of its DRAM tier in use */
    uint64_t hits_dram, hits_ssd;   /* shard reads served by each local tier,
                                       since open */
    uint64_t spill_drops;   /* evicted blocks the SSD tier's full spill
                               queue dropped, since open */
    bool attached;          /* a kvengine attached to a host store (kv_stats' host_attached) */
};

/*
 * The ops table. Every call is synchronous and may be made from many job
 * threads at once. A batch is n shards of distinct blocks; res[i] receives
 * each shard's result: KV_OK, KV_ENOTFOUND (a miss, for get) or another
 * KV_E* code. Calls return KV_OK, or an error that applies to the whole
 * batch (res is then filled with it too).
 */
struct kvctl_backend {
    const char *name;
    int  (*open)(const struct kvctl_open_args *a, void **st);
    void (*close)(void *st);
    int  (*put)(void *st, const kv_shard *s, size_t n, int *res);
    int  (*get)(void *st, const kv_shard *s, size_t n, int *res);
    int  (*lookup)(void *st, const kv_block_id *ids, size_t n, uint8_t *hit);
    void (*info)(void *st, struct kvctl_backend_info *out);
    /* Optional (NULL: read off lookup's mask): kv_lookup_prefix's answer,
     * the index of the last hit of the leading run, -1 when the first
     * misses, or a KV_E* below -1. */
    ssize_t (*lookup_prefix)(void *st, const kv_block_id *ids, size_t n);
    /* Optional (NULL: none): len bytes of the backend's own shared memory
     * (kv_buffer_alloc), freed by close; NULL when it has none to give. */
    void *(*buffer)(void *st, size_t len);
    /* Optional (NULL: none): the CPU seconds used so far by the process
     * that serves the host store this backend is attached to, < 0 when it
     * is not attached or that cannot be read. With the client's own CPU it
     * is what a phase cost the host, whoever the scheduler ran when. */
    double (*server_cpu_s)(void *st);
};

extern const struct kvctl_backend kvctl_backend_kvengine;
extern const struct kvctl_backend kvctl_backend_posix;
extern const struct kvctl_backend kvctl_backend_redis;
extern const struct kvctl_backend kvctl_backend_memcached;
/* Why the last open of a network backend failed, in words ("cannot connect
 * to 127.0.0.1:1: Connection refused"); "" when it did not. */
extern char kvctl_net_open_why[256];

/* ---- client sockets (sock.c) -------------------------------------------- */

/* A blocking TCP connection with SO_SNDTIMEO/SO_RCVTIMEO and a small read
 * buffer for reply lines; fd -1 when closed (or broken). */
struct kvctl_conn {
    int fd;
    unsigned timeout_ms;
    size_t rpos, rlen;
    char peer[128];
    char rbuf[16384];
};
struct iovec;
/* "HOST:PORT" (or "[V6]:PORT") into its parts; KV_EINVAL when it is not. */
int  kvctl_split_hostport(const char *hp, char *host, size_t hcap, char *port, size_t pcap);
/* Connects (TCP_NODELAY, timeouts set). KV_EINVAL (not HOST:PORT), KV_ENET
 * (refused, unknown host), KV_ETIMEDOUT; why says which in words. */
int  kvctl_dial(const char *hostport, unsigned timeout_ms, int *fd, char *why, size_t whylen);
int  kvctl_conn_open(struct kvctl_conn *c, const char *hostport, unsigned timeout_ms,
                     char *why, size_t whylen);
void kvctl_conn_close(struct kvctl_conn *c);
/* Writes all of v[0..n) (v is consumed). */
int  kvctl_conn_writev(struct kvctl_conn *c, struct iovec *v, int n);
/* One reply line without its CRLF, NUL-terminated, at most cap - 1 bytes;
 * KV_EPROTO for a longer one or a bare LF. */
int  kvctl_conn_line(struct kvctl_conn *c, char *out, size_t cap);
/* Exactly len bytes into iov (which must hold at least len), and the
 * "\r\n" after a value; discard drops n bytes. */
int  kvctl_conn_read_value(struct kvctl_conn *c, const kv_iov *iov, uint32_t cnt, uint64_t len);
int  kvctl_conn_expect_crlf(struct kvctl_conn *c);
int  kvctl_conn_discard(struct kvctl_conn *c, uint64_t n);

/* n connections to one server, each checked by hello (may be NULL); a job
 * takes one for a call (get) and gives it back (put). get returns NULL when
 * none is free or a broken one cannot be redialed. */
struct kvctl_pool;
int  kvctl_pool_new(unsigned n, const char *hostport, unsigned timeout_ms,
                    int (*hello)(struct kvctl_conn *c, char *why, size_t whylen),
                    struct kvctl_pool **out, char *why, size_t whylen);
void kvctl_pool_free(struct kvctl_pool *p);
struct kvctl_conn *kvctl_pool_get(struct kvctl_pool *p);
void kvctl_pool_put(struct kvctl_pool *p, struct kvctl_conn *c);

/* Raw loopback TCP: `streams` sender/receiver thread pairs on 127.0.0.1,
 * each sending write_size bytes per send() for `seconds`. MiB/s received,
 * all streams together; 0 when it could not be measured. */
double kvctl_tcp_baseline(unsigned streams, uint64_t write_size, double seconds);

/* ---- results (report.c) ------------------------------------------------- */

/* One phase of one backend's run. ops counts the items attempted (objects,
 * or ids for a lookup phase); bytes only those moved successfully. */
struct kvctl_phase {
    char name[16];
    bool lookup;                /* ids, no bytes: kvs_s is ids/s */
    uint64_t ops, bytes, misses, verify_failures, errors;
    int first_error;            /* the first KV_E* seen, for the message */
    double seconds;
    double cpu_s;               /* CPU time of this whole process in the phase
                                   (the client's side: job and engine threads) */
    bool has_server_cpu;        /* attached to a host store: server_cpu_s is known */
    double server_cpu_s;        /* CPU time of the process serving that store in
                                   the phase (all its threads: its other clients'
                                   work and its background collapse too) */
    double p50_us, p95_us, p99_us;
};
double kvctl_phase_mib_s(const struct kvctl_phase *p);
/* Successful items per second (for lookup: ids looked up per second). */
double kvctl_phase_kvs_s(const struct kvctl_phase *p);
/* Sorts lat (ns, one per task) and sets the phase's percentiles. */
void kvctl_phase_latency(struct kvctl_phase *p, uint64_t *lat, size_t n);

#define KVCTL_MAX_PHASES 6
/* kvengine and one run per --compare backend (posix, dram, redis,
 * memcached). */
#define KVCTL_MAX_RUNS 5

/* What one run of --scenario trace found (trace.c). Ratios are NAN
 * where they do not apply (written as null). */
struct kvctl_trace_stats {
    bool on;
    uint64_t requests, block_refs;
    uint64_t hits;              /* blocks loaded whole and verified, in the
                                   leading run of each request */
    uint64_t lookup_hits;       /* blocks lookup_prefix said were there */
    uint64_t broken_promises;   /* blocks a lookup said hit whose load failed */
    uint64_t verify_failures;   /* shards loaded with the wrong bytes */
    uint64_t dumps_refused;     /* shards a dump could not store for lack of
                                   room (KV_ENOSPC): not cached, no error */
    uint64_t spill_drops;       /* evicted blocks dropped, not spilled (the
                                   spill queue was full) */
    double prefix_hit_ratio;    /* hits / block_refs */
    double hit_ratio_dram, hit_ratio_ssd;   /* loads served by each tier /
                                               block_refs (NAN: not known) */
    double ideal_hit_ratio;     /* an infinite cache */
    double lru_hit_ratio;       /* exact LRU of lru_blocks blocks that, like
                                   the tier, frees down to lru_low_blocks
                                   when full (NAN: no DRAM tier) */
    uint64_t lru_blocks, lru_low_blocks;
    double lru_plain_hit_ratio; /* the same LRU dropping one block at a time */
    double seconds;             /* the whole replay */
    double cpu_s;               /* CPU time of this process in the replay */
    double p50_us, p99_us;      /* lookup + load, per request */
    uint64_t tokens_skipped;    /* min(hits x 512, input_length), summed */
    uint64_t prompt_tokens;     /* input_length, summed */
    double shard_bytes;         /* DRAM a stored shard took (0: none stored),
                                   the least seen in the run: write-back in
                                   flight counts as used but holds no shard */
    uint32_t *req_hits;         /* per request: blocks loaded (malloc'd) */
    uint32_t *lru_req_hits;     /* per request: the LRU model's hits */
};

/* One backend's run of the scenario. */
struct kvctl_run {
    const char *backend;
    char pipeline[64];          /* a kvengine run's pipeline ("" otherwise) */
    const char *addr;           /* the server's HOST:PORT (redis, memcached) */
    int open_error;             /* KV_OK, or why the backend did not open */
    struct kvctl_phase phases[KVCTL_MAX_PHASES];
    int nphases;
    struct kvctl_backend_info info;
    uint64_t rss, peak_rss;     /* at the end of the run, before close */
    struct kvctl_trace_stats trace;         /* --scenario trace */
};

/* Everything a bench invocation reports. */
struct kvctl_report {
    const char *scenario;
    uint64_t value_size, nr_objects;
    unsigned numjobs, batch_size;
    double runtime;             /* seconds, 0 = none */
    unsigned rwmixread;         /* percent, mixed_rw only */
    int pattern;                /* fill byte, or -1 for pseudo-random */
    bool verify;
    char pipeline[64];          /* the engine's, as kv_config_get says */
    char dram_capacity[64];
    double memcpy_mib_s;
    double tcp_mib_s;           /* the loopback TCP baseline, 0 = not measured */
    uint64_t salt;              /* block ids are a hash of (salt, object number) */
    struct kvctl_run runs[KVCTL_MAX_RUNS];  /* kvengine, then each --compare */
    int nruns;
    /* --scenario trace */
    const struct kvctl_trace *trace;
    unsigned shards;            /* shards per block */
    double trace_speed;         /* 0: as fast as possible */
    uint64_t trace_limit;       /* 0: all requests */
    unsigned lease_ttl_ms;      /* the engine's, as the replay ran */
    uint32_t *ideal_req_hits;   /* per request: the infinite cache's hits */
};

/* Whether a run passed: no errors, no verify failures (and, for
 * verify_write, no misses). */
bool kvctl_run_ok(const struct kvctl_report *r, const struct kvctl_run *run);
void kvctl_report_print(FILE *f, const struct kvctl_report *r);
/* Writes the summary JSON; KV_OK or KV_EIO (after printing why). */
int  kvctl_report_json(const char *path, const struct kvctl_report *r);

/* ---- jobs (jobs.c) ------------------------------------------------------- */

/* The workload, as the jobs see it. */
struct kvctl_workload {
    uint64_t value_size, nr_objects;
    unsigned numjobs, batch_size;
    unsigned rwmixread;         /* percent of mixed_rw batches that read */
    int pattern;                /* fill byte, or -1 for pseudo-random bytes */
    bool verify;
    bool kv_buffers;            /* writes from the backend's buffers (--kv-buffers) */
    uint64_t salt;              /* block ids are a hash of (salt, object number) */
};

enum kvctl_phase_kind {
    KVCTL_PH_WRITE,     /* every object once, in batches */
    KVCTL_PH_LOOKUP,    /* every written id once, in batches of batch_size */
    KVCTL_PH_READ,      /* every written object once, in batches */
    KVCTL_PH_MIXED,     /* for runtime seconds: random reads, fresh writes */
    KVCTL_PH_WRITE_KVBUF, /* "write_kvbuf": as WRITE, objects never written before, each
                             value whole in the backend's buffers (kv_buffer_alloc) */
};

struct kvctl_jobs;
/* Allocates and touches every job's buffers (first touch is slow: it must
 * not land in a timed phase). KV_ENOMEM when they do not fit. */
int  kvctl_jobs_new(const struct kvctl_workload *w, struct kvctl_jobs **out);
void kvctl_jobs_free(struct kvctl_jobs *j);
/* The memcpy baseline: every job copies its value buffer into its
 * pre-touched destinations as many times as it writes objects (at least
 * 256 times; for at most `seconds`, when > 0). MiB/s. */
double kvctl_jobs_memcpy(struct kvctl_jobs *j, double seconds);
/* Forgets what was written, before a run against a fresh backend. */
void kvctl_jobs_reset(struct kvctl_jobs *j);
/* Runs one phase against an open backend for at most `seconds` (0 = to
 * the end; KVCTL_PH_MIXED needs > 0) and fills out[0] (and, for
 * KVCTL_PH_MIXED, out[0] = the reads, out[1] = the writes; for
 * KVCTL_PH_WRITE_KVBUF with an alternate, out[0] = this backend's side,
 * out[1] = "kvbuf_inproc", the alternate's). Returns how many it filled. */
unsigned kvctl_jobs_run(struct kvctl_jobs *j, const struct kvctl_backend *be, void *st,
                        enum kvctl_phase_kind kind, double seconds, struct kvctl_phase *out);
/* The open backend a write_kvbuf phase alternates with, batch by batch
 * (an in-process engine beside an attached one); st NULL: none (before it
 * closes). */
void kvctl_jobs_set_alternate(struct kvctl_jobs *j, const struct kvctl_backend *be, void *st);

/* ---- serving traces (trace.c) ------------------------------------------- */

#define KVCTL_BLOCK_TOKENS 512  /* tokens per hash id in the trace format */

/* One request: hash ids [first, first + n) of the trace's arrays. */
struct kvctl_trace_req {
    double ts_ms;               /* arrival, ms from the trace's start */
    uint64_t input_length;      /* prompt tokens */
    uint32_t first, n;
};

struct kvctl_trace {
    char *path;
    struct kvctl_trace_req *req;
    size_t nreq;
    uint64_t *hash;             /* per block reference: the trace's id */
    uint32_t *dense;            /* per block reference: 0..ndistinct-1 */
    size_t nrefs, ndistinct;
    uint32_t max_blocks;        /* the longest request */
    uint64_t prompt_tokens;
};

/* Reads a JSONL trace (at most limit requests, 0 = all). A line that is not
 * a request prints "kvctl bench: FILE:LINE: column C: why" on stderr and
 * gives KV_EINVAL; KV_EIO when the file cannot be read, KV_ENOMEM. */
int  kvctl_trace_load(const char *path, uint64_t limit, struct kvctl_trace **out);
void kvctl_trace_free(struct kvctl_trace *t);
/* Block hits of an infinite cache and of an exact LRU cache of `capacity`
 * blocks over the trace, replayed as a connector does (lookup_prefix, load
 * the run, dump the rest); per request into req_hits when not NULL. When
 * the LRU is full it drops its least recently used blocks down to `low`
 * (capacity - 1: one at a time). UINT64_MAX when out of memory. */
uint64_t kvctl_trace_ideal(const struct kvctl_trace *t, uint32_t *req_hits);
uint64_t kvctl_trace_lru(const struct kvctl_trace *t, uint64_t capacity, uint64_t low,
                         uint32_t *req_hits);

/* Where a backend's hits come from, for hit_ratio_dram/ssd. */
enum kvctl_tiers {
    KVCTL_TIERS_UNKNOWN,        /* a cluster client, a server: not said */
    KVCTL_TIERS_ENGINE,         /* a local engine: info()'s hits per tier */
    KVCTL_TIERS_FILES,          /* posix: every hit is read from a file */
};

struct kvctl_trace_opts {
    uint64_t value_size, salt;
    unsigned shards, numjobs;
    double speed;               /* arrival = timestamp / speed; 0 = no waits */
    enum kvctl_tiers tiers;
};
/* Replays the trace against an open backend: fills run->phases (lookup,
 * load, dump) and run->trace (all but the models' ratios). KV_ENOMEM when
 * the buffers do not fit (after printing why). */
int  kvctl_trace_replay(const struct kvctl_trace *t, const struct kvctl_trace_opts *o,
                        const struct kvctl_backend *be, void *st, struct kvctl_run *run);

/* Block id of object k (jobs.c): a hash of (salt, k). */
kv_block_id kvctl_object_id(uint64_t salt, uint64_t k);
/* Fills p with the pattern byte, or (pattern < 0) fixed pseudo-random
 * bytes, the same in every call. */
void kvctl_fill_payload(uint8_t *p, uint64_t len, int pattern);

/* ---- plots (plot.c) ------------------------------------------------------ */

/* Draws the report as a PNG with gnuplot (run as a program): throughput and
 * latency percentiles per phase, and the comparison ratios when a
 * comparison ran. KV_OK, or KV_EIO after printing why (gnuplot missing,
 * failed). */
int kvctl_plot(const char *png, const struct kvctl_report *r);

#endif
