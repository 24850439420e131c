/*
 * bench.c — `kvctl bench`: options, the engine's config for the
 * benchmark, and the scenarios (after Mooncake's store_kv_bench).
 *
 * Key design choices:
 * - The bench measures what the user asked for and sizes only what the user
 *   left alone: unless the file or --set chose them, the pipeline is "dram",
 *   dram.capacity fits the data set (x1.3, at least 256 MiB), and an SSD
 *   tier gets a fresh temporary directory that is removed afterwards.
 * - A scenario is a list of phases run by jobs.c against a backend
 *   ops table; each --compare runs the same list, with the same blocks and
 *   the same buffers, against another backend after the previous one is
 *   closed (posix, or a Redis or memcached server: peers.c).
 * - Whenever a backend is reached over the network (a cluster client, a
 *   server), the run also measures raw loopback TCP with the same number
 *   of streams and the value size as the write size (sock.c), so
 *   every figure comes with its ratio to what the wire itself moved in the
 *   same run on the same (shared, noisy) machine.
 * - --scenario trace replaces the phase list by a replay of a serving trace
 *   (trace.c): the trace is read once, before any engine opens, and
 *   each run (kvengine, --compare posix, dram...) replays it and gets the
 *   infinite-cache and LRU models computed against its own DRAM tier.
 * - Block ids are a hash of (--salt, object number); the salt is random per
 *   run unless given, and printed, so a second run against a live cluster
 *   or server does not find the first run's values (and a given salt
 *   repeats a run's ids on purpose).
 */
#include "bench.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_VALUE_SIZE (1ull << 20)
#define DEFAULT_DATA_SET   (512ull << 20)  /* --nr-objects defaults to this much */
#define DEFAULT_MIXED_S    5.0
#define MIN_VALUE_SIZE     64              /* the header that names an object */
#define TCP_BASELINE_S     0.5
#define MAX_COMPARE        (KVCTL_MAX_RUNS - 1)

static const char *const scenarios[] = {
    "verify_write", "fill", "write_perf", "read_perf", "mixed_rw", "trace",
};
enum { SC_VERIFY_WRITE, SC_FILL, SC_WRITE_PERF, SC_READ_PERF, SC_MIXED_RW, SC_TRACE };

#define TRACE_VALUE_SIZE   (64ull << 10)    /* --value-size of a trace replay */
#define TRACE_LEASE_MS     "100"            /* its eviction.lease_ttl_ms: see usage */

/* One --compare: a backend, and the server's address for the network ones;
 * dram is the kvengine backend again, with pipeline: dram, in this process
 * (never attached to a host store); tcp is it as a pure cluster client. */
struct compare {
    const struct kvctl_backend *be;
    const char *addr;
    bool dram;
    bool tcp;
};

struct bench_opts {
    int scenario;
    struct compare cmp[MAX_COMPARE];
    int ncmp;
    uint64_t salt;
    bool salt_given;
    uint64_t value_size, nr_objects;    /* nr_objects 0: DEFAULT_DATA_SET worth */
    uint64_t numjobs, batch_size, rwmixread;
    double runtime;                     /* < 0: not given */
    int pattern;
    bool verify, drop_caches, value_size_given, kv_buffers;
    const char *summary_json, *posix_dir, *plot;
    const char *trace;                  /* --scenario trace */
    uint64_t trace_limit, shards;
    double trace_speed;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvctl [--config FILE] [--set KEY=VALUE]... bench [OPTIONS]\n"
            "\n"
            "The embedded benchmark, after Mooncake's store_kv_bench. Each object is one\n"
            "block stored as shard 0; a batch is one dump or load task.\n"
            "\n"
            "Scenarios (phases):\n"
            "  verify_write  write every object, read it back and verify (write, read)\n"
            "  fill          write every object, then look every id up (write, lookup)\n"
            "  write_perf    write every object (write)\n"
            "  read_perf     prepare, look up every id once, read all (write, lookup, read)\n"
            "  mixed_rw      prepare, then for --runtime seconds random reads of prepared\n"
            "                objects and writes of new ones (write, mixed_read, mixed_write);\n"
            "                a prepared object that eviction dropped is a miss from then on\n"
            "  trace         replay a serving trace (--trace FILE.jsonl, Mooncake's format)\n"
            "                as a UCM connector does: per request kv_lookup_prefix, one\n"
            "                load task for the leading hits (verified), one dump task for\n"
            "                the rest (lookup, load, dump), with hit ratios per tier,\n"
            "                against an infinite cache and an exact LRU of the DRAM tier's\n"
            "                size\n"
            "\n"
            "Options:\n"
            "      --scenario NAME      the workload (default: read_perf)\n"
            "      --value-size SIZE    bytes per object, units KiB/MiB/GiB (default: 1MiB,\n"
            "                           64KiB for trace; at least 64 B); for trace, per\n"
            "                           block shard\n"
            "      --nr-objects N       objects to write (default: 512MiB / value size,\n"
            "                           i.e. 512 at 1MiB)\n"
            "      --numjobs N          job threads (default: 1); for trace, requests\n"
            "                           replayed at once (each job takes the next request\n"
            "                           in arrival order)\n"
            "      --batch-size N       shards per dump/load task and ids per lookup batch\n"
            "                           (default: 8; a data batch never exceeds the objects\n"
            "                           of one job)\n"
            "      --runtime SECONDS    mixed_rw's length (default: %.0f); for the others a\n"
            "                           cap on each phase (default: 0 = none)\n"
            "      --rwmixread PCT      percent of mixed_rw batches that read (default: 70)\n"
            "      --verify             check every byte read (always on for verify_write)\n"
            "      --pattern BYTE       fill values with BYTE, e.g. 0xA5 (default: fixed\n"
            "                           pseudo-random, incompressible bytes)\n"
            "      --summary-json FILE  write the results as JSON ('-' for stdout)\n"
            "      --compare BACKEND    also run the same blocks against BACKEND and print\n"
            "                           the ratios; repeatable, one of each:\n"
            "                             posix                UCM's file-per-block layout\n"
            "                             dram                 kvengine again with the same\n"
            "                                                  config but pipeline: dram (what\n"
            "                                                  the SSD tier adds), in this\n"
            "                                                  process even when store.name\n"
            "                                                  attaches the main run to a\n"
            "                                                  host store\n"
            "                             tcp                  kvengine as a pure cluster\n"
            "                                                  client (cluster.enabled, no\n"
            "                                                  DRAM, no store.name): the\n"
            "                                                  network path to the nodes\n"
            "                             redis=HOST:PORT      a Redis server (SET/GET/EXISTS,\n"
            "                                                  one connection per job, each\n"
            "                                                  batch pipelined)\n"
            "                             memcached=HOST:PORT  a memcached server (set/get, and\n"
            "                                                  mg for lookup; start it with -I\n"
            "                                                  above the value size)\n"
            "                           A server that does not answer ends the bench before\n"
            "                           anything runs (exit 1); a bad address is exit 2\n"
            "      --salt N             block ids are a hash of (N, object number) (default:\n"
            "                           random per run, printed): a second run against a\n"
            "                           live cluster or server does not find the first's\n"
            "                           values; giving a run's salt repeats its ids\n"
            "      --posix-dir DIR      parent of the posix backend's temporary directory\n"
            "                           (default: $TMPDIR or /tmp)\n"
            "      --plot FILE.png      draw throughput and latency percentiles per phase\n"
            "                           (and the --compare ratios) with gnuplot; for trace,\n"
            "                           the hit ratio over the trace of every run\n"
            "      --kv-buffers         write from memory the engine gave (kv_buffer_alloc):\n"
            "                           attached, a dump is then one copy, the server's\n"
            "                           (default: from the bench's own buffers; attached\n"
            "                           with --compare dram, a last phase, write_kvbuf,\n"
            "                           writes as many new objects from such memory, each\n"
            "                           batch alternated with the same batch into an\n"
            "                           in-process engine, kvbuf_inproc, its measure)\n"
            "      --drop-caches        sync and drop the kernel's page cache before every\n"
            "                           phase: each backend starts from the same clean\n"
            "                           cache, lookups and reads are cold (needs root, else\n"
            "                           a warning and warm caches)\n"
            "\n"
            "Trace replay (--scenario trace):\n"
            "      --trace FILE.jsonl   the trace: one JSON object per line with timestamp\n"
            "                           (ms), input_length and hash_ids (one per 512-token\n"
            "                           block, prefix order); a bad line is an error naming\n"
            "                           FILE:LINE (exit 2)\n"
            "      --trace-limit N      replay only the first N requests (default: all)\n"
            "      --shards K           shards per block, like per-layer shards, each of\n"
            "                           --value-size bytes (default: 1)\n"
            "      --trace-speed X      honour the timestamps, scaled: a request starts at\n"
            "                           timestamp / X (default: 0 = as fast as possible)\n"
            "  Unless set, dram.capacity fits every distinct block (x1.3, at least\n"
            "  256MiB) and eviction.lease_ttl_ms is " TRACE_LEASE_MS " (a replay compresses\n"
            "  time: a 60 s lease would pin most of the trace). Figures per run:\n"
            "  prefix_hit_ratio (blocks loaded / block references), hit_ratio_dram and\n"
            "  _ssd (loads served by each tier), ideal_hit_ratio (an infinite cache),\n"
            "  lru_hit_ratio (an exact LRU holding as many blocks as the DRAM tier,\n"
            "  capacity x high watermark / bytes per block, freeing like it down to\n"
            "  (high watermark - ratio) x capacity), broken_promises (a lookup said\n"
            "  hit, the load did not deliver), verify_failures, dumps_refused (no room:\n"
            "  not cached, not an error), spill_drops, load/dump MiB/s, seconds,\n"
            "  lookup+load latency per request, and prefill tokens skipped (hits x 512).\n"
            "%s"
            "\n"
            "Engine config: the defaults, then --config, then --set. Unless you set them,\n"
            "the bench uses pipeline: dram, sizes dram.capacity to the data set (x1.3, at\n"
            "least 256MiB), and gives an SSD tier a temporary ssd.path, removed afterwards.\n"
            "Against a cluster: --set cluster.enabled=true --set cluster.master=HOST:PORT\n"
            "--set dram.capacity=0 (a pure client: every block goes to the nodes).\n"
            "\n"
            "Figures per phase: ops (objects, or ids for lookup, attempted), MiB moved,\n"
            "seconds, MiB/s, kvs/s (successful objects or ids per second), task latency\n"
            "percentiles in us, misses, verify failures, errors, and MiB/s as a ratio of\n"
            "memcpy of the same bytes by the same number of threads. When a backend is\n"
            "reached over the network (cluster.enabled, redis, memcached) the bench also\n"
            "measures raw loopback TCP for %.1f s (--numjobs streams, value-size writes)\n"
            "and gives each phase's MiB/s as a ratio of it.\n"
            "\n%s",
            DEFAULT_MIXED_S, kvctl_common_help, TCP_BASELINE_S, kvctl_exit_help);
}

static int bad(const char *opt, const char *arg, const char *why)
{
    fprintf(stderr, "kvctl bench: %s '%s': %s (see kvctl bench --help)\n", opt, arg, why);
    return KVCTL_EXIT_USAGE;
}

enum {
    O_SCENARIO = 256, O_VALUE_SIZE, O_NR_OBJECTS, O_NUMJOBS, O_BATCH, O_RUNTIME, O_RWMIX,
    O_VERIFY, O_PATTERN, O_JSON, O_COMPARE, O_POSIX_DIR, O_PLOT, O_DROP_CACHES, O_SALT,
    O_TRACE, O_TRACE_LIMIT, O_SHARDS, O_TRACE_SPEED, O_KV_BUFFERS,
};

/* posix | dram | redis=HOST:PORT | memcached=HOST:PORT; returns -1 or an
 * exit code. */
static int parse_compare(const char *arg, struct bench_opts *o)
{
    static const struct { const char *name; const struct kvctl_backend *be; bool net; } all[] = {
        { "posix", &kvctl_backend_posix, false },
        { "dram", &kvctl_backend_kvengine, false },
        { "redis", &kvctl_backend_redis, true },
        { "memcached", &kvctl_backend_memcached, true },
        { "tcp", &kvctl_backend_kvengine, false },
    };
    const char *eq = strchr(arg, '=');
    size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strlen(all[i].name) != nlen || strncmp(arg, all[i].name, nlen) != 0)
            continue;
        char host[256], port[16];
        if (all[i].net && (!eq || kvctl_split_hostport(eq + 1, host, sizeof host, port,
                                                       sizeof port) != KV_OK))
            return bad("--compare", arg, "want NAME=HOST:PORT, e.g. redis=127.0.0.1:6379");
        if (!all[i].net && eq)
            return bad("--compare", arg, "posix and dram take no address");
        bool tcp = strcmp(all[i].name, "tcp") == 0;
        for (int k = 0; k < o->ncmp; k++)
            if (o->cmp[k].be == all[i].be && o->cmp[k].tcp == tcp)
                return bad("--compare", arg, "each backend may be compared once");
        o->cmp[o->ncmp++] = (struct compare){ all[i].be, eq ? eq + 1 : NULL,
                                              all[i].be == &kvctl_backend_kvengine && !tcp, tcp };
        return -1;
    }
    return bad("--compare", arg, "the other backends are posix, dram, tcp, redis=HOST:PORT and "
                                 "memcached=HOST:PORT");
}

/* Returns -1 to go on, or an exit code. */
static int parse(struct kvctl_common *c, int argc, char **argv, struct bench_opts *o)
{
    static const struct option longopts[] = {
        KVCTL_COMMON_LONGOPTS,
        { "help", no_argument, NULL, 'h' },
        { "scenario", required_argument, NULL, O_SCENARIO },
        { "value-size", required_argument, NULL, O_VALUE_SIZE },
        { "nr-objects", required_argument, NULL, O_NR_OBJECTS },
        { "numjobs", required_argument, NULL, O_NUMJOBS },
        { "batch-size", required_argument, NULL, O_BATCH },
        { "runtime", required_argument, NULL, O_RUNTIME },
        { "rwmixread", required_argument, NULL, O_RWMIX },
        { "verify", no_argument, NULL, O_VERIFY },
        { "pattern", required_argument, NULL, O_PATTERN },
        { "summary-json", required_argument, NULL, O_JSON },
        { "compare", required_argument, NULL, O_COMPARE },
        { "posix-dir", required_argument, NULL, O_POSIX_DIR },
        { "plot", required_argument, NULL, O_PLOT },
        { "drop-caches", no_argument, NULL, O_DROP_CACHES },
        { "kv-buffers", no_argument, NULL, O_KV_BUFFERS },
        { "salt", required_argument, NULL, O_SALT },
        { "trace", required_argument, NULL, O_TRACE },
        { "trace-limit", required_argument, NULL, O_TRACE_LIMIT },
        { "shards", required_argument, NULL, O_SHARDS },
        { "trace-speed", required_argument, NULL, O_TRACE_SPEED },
        { NULL, 0, NULL, 0 },
    };
    *o = (struct bench_opts){ .scenario = SC_READ_PERF, .value_size = DEFAULT_VALUE_SIZE,
                              .numjobs = 1, .batch_size = 8, .rwmixread = 70, .runtime = -1,
                              .pattern = -1, .shards = 1 };
    int opt, rc;
    uint64_t v;
    optind = 0;
    while ((opt = kvctl_getopt(c, argc, argv, "c:s:h", longopts, &rc)) != -1) {
        switch (opt) {
        case 'h':
            usage(stdout);
            return KVCTL_EXIT_OK;
        case O_SCENARIO:
            o->scenario = -1;
            for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
                if (strcmp(optarg, scenarios[i]) == 0)
                    o->scenario = (int)i;
            if (o->scenario < 0)
                return bad("--scenario", optarg, "unknown scenario");
            break;
        case O_VALUE_SIZE:
            if (kvctl_parse_size(optarg, &o->value_size) != KV_OK ||
                o->value_size < MIN_VALUE_SIZE || o->value_size > KV_VALUE_MAX)
                return bad("--value-size", optarg, "want a size from 64 B to 4 GiB, e.g. 64KiB");
            o->value_size_given = true;
            break;
        case O_NR_OBJECTS:
            if (kvctl_parse_u64(optarg, 1, 1ull << 40, &o->nr_objects) != KV_OK)
                return bad("--nr-objects", optarg, "want a positive number");
            break;
        case O_NUMJOBS:
            if (kvctl_parse_u64(optarg, 1, 256, &o->numjobs) != KV_OK)
                return bad("--numjobs", optarg, "want 1..256");
            break;
        case O_BATCH:
            if (kvctl_parse_u64(optarg, 1, 65536, &o->batch_size) != KV_OK)
                return bad("--batch-size", optarg, "want 1..65536");
            break;
        case O_RUNTIME:
            if (kvctl_parse_seconds(optarg, &o->runtime) != KV_OK)
                return bad("--runtime", optarg, "want seconds, e.g. 10 or 2.5");
            break;
        case O_RWMIX:
            if (kvctl_parse_u64(optarg, 0, 100, &o->rwmixread) != KV_OK)
                return bad("--rwmixread", optarg, "want a percentage, 0..100");
            break;
        case O_VERIFY:
            o->verify = true;
            break;
        case O_PATTERN:
            if (kvctl_parse_u64(optarg, 0, 255, &v) != KV_OK)
                return bad("--pattern", optarg, "want a byte, e.g. 0xA5");
            o->pattern = (int)v;
            break;
        case O_JSON:
            o->summary_json = optarg;
            break;
        case O_COMPARE: {
            int pc = parse_compare(optarg, o);
            if (pc >= 0)
                return pc;
            break;
        }
        case O_SALT:
            if (kvctl_parse_u64(optarg, 0, UINT64_MAX, &o->salt) != KV_OK)
                return bad("--salt", optarg, "want a whole number (0x... for hex)");
            o->salt_given = true;
            break;
        case O_POSIX_DIR:
            o->posix_dir = optarg;
            break;
        case O_PLOT:
            o->plot = optarg;
            break;
        case O_DROP_CACHES:
            o->drop_caches = true;
            break;
        case O_KV_BUFFERS:
            o->kv_buffers = true;
            break;
        case O_TRACE:
            o->trace = optarg;
            break;
        case O_TRACE_LIMIT:
            if (kvctl_parse_u64(optarg, 1, UINT32_MAX, &o->trace_limit) != KV_OK)
                return bad("--trace-limit", optarg, "want a positive number of requests");
            break;
        case O_SHARDS:
            if (kvctl_parse_u64(optarg, 1, 1024, &o->shards) != KV_OK)
                return bad("--shards", optarg, "want 1..1024 shards per block");
            break;
        case O_TRACE_SPEED: {
            char *end = NULL;
            errno = 0;
            o->trace_speed = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(o->trace_speed >= 0) ||
                o->trace_speed > 1e9)
                return bad("--trace-speed", optarg, "want a factor >= 0, e.g. 1 (real time), "
                                                    "10 or 0 (as fast as possible)");
            break;
        }
        default:
            usage(stderr);
            return KVCTL_EXIT_USAGE;
        }
    }
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        fprintf(stderr, "kvctl bench: unexpected argument '%s'\n\n", argv[optind]);
        usage(stderr);
        return KVCTL_EXIT_USAGE;
    }
    if (o->scenario == SC_TRACE && !o->trace)
        return bad("--scenario", "trace", "needs --trace FILE.jsonl");
    if (o->scenario != SC_TRACE && (o->trace || o->trace_limit || o->shards != 1 ||
                                    o->trace_speed > 0))
        return bad(o->trace ? "--trace" : o->trace_limit ? "--trace-limit"
                   : o->shards != 1 ? "--shards" : "--trace-speed",
                   o->trace ? o->trace : "", "only with --scenario trace");
    if (o->scenario == SC_TRACE && !o->value_size_given)
        o->value_size = TRACE_VALUE_SIZE;
    if (o->nr_objects == 0)
        o->nr_objects = DEFAULT_DATA_SET / o->value_size ? DEFAULT_DATA_SET / o->value_size : 1;
    if (o->runtime < 0)
        o->runtime = o->scenario == SC_MIXED_RW ? DEFAULT_MIXED_S : 0;
    if (o->scenario == SC_MIXED_RW && o->runtime <= 0)
        return bad("--runtime", "0", "mixed_rw needs a positive runtime");
    if (o->scenario == SC_VERIFY_WRITE)
        o->verify = true;
    if (o->nr_objects > UINT64_MAX / o->value_size)
        return bad("--nr-objects", "", "data set too large");
    return -1;
}

/* ---- the engine's config ------------------------------------------------- */

static int set_key(kv_config *cfg, const char *key, const char *value)
{
    int rc = kv_config_set(cfg, key, value);
    if (rc != KV_OK)
        fprintf(stderr, "kvctl bench: cannot set %s=%s: %s\n", key, value, kv_strerror(rc));
    return rc;
}

/* Builds the engine's config; *ssd_tmp is a directory to remove afterwards.
 * pipeline, when not NULL, replaces the user's (--compare dram). The
 * pipeline and dram.capacity it ends with go to pipeline[64] and
 * dram_capacity[64]. */
static int engine_config(struct kvctl_common *c, const struct bench_opts *o,
                         const struct kvctl_trace *trace, const char *pipeline, kv_config **out,
                         char **ssd_tmp, char *pipe_out, char *dram_capacity)
{
    kv_config *cfg = NULL;
    int rc = kvctl_build_config(c, &cfg);
    if (rc != KVCTL_EXIT_OK)
        return rc;
    rc = KVCTL_EXIT_FAIL;
    bool pure = pipeline && strcmp(pipeline, "tcp") == 0;
    if (pipeline ? set_key(cfg, "pipeline", pure ? "dram" : pipeline) != KV_OK
                 : !kvctl_user_set(c, "pipeline") && set_key(cfg, "pipeline", "dram") != KV_OK)
        goto fail;
    /* A compared kvengine runs in this process or over the network, never
     * attached to the host store the main run may be attached to. */
    if (pipeline && (set_key(cfg, "store.name", "") != KV_OK ||
                     (!pure && set_key(cfg, "cluster.enabled", "false") != KV_OK)))
        goto fail;
    if (pure && (set_key(cfg, "cluster.enabled", "true") != KV_OK ||
         set_key(cfg, "dram.capacity", "0") != KV_OK))
        goto fail;
    if (kv_config_get(cfg, "pipeline", pipe_out, 64) != KV_OK)
        snprintf(pipe_out, 64, "?");
    bool has_dram = strstr(pipe_out, "dram") != NULL;
    bool has_ssd = strstr(pipe_out, "ssd") != NULL;
    /* A replay compresses the trace's time: a lease as long as the
     * default (60 s) would cover most of it and leave eviction nothing to
     * take. What a lease must cover is the gap between a lookup and the
     * load right after it. */
    if (trace && !kvctl_user_set(c, "eviction.lease_ttl_ms") &&
        set_key(cfg, "eviction.lease_ttl_ms", TRACE_LEASE_MS) != KV_OK)
        goto fail;
    if (has_dram && !pure && !kvctl_user_set(c, "dram.capacity")) {
        double want = trace ? (double)trace->ndistinct * (double)o->shards
                                  * (double)o->value_size * 1.3
                            : (double)o->nr_objects * (double)o->value_size * 1.3;
        uint64_t mib = (uint64_t)(want / (1 << 20)) + 1;
        char v[32];
        snprintf(v, sizeof v, "%" PRIu64 "MiB", mib < 256 ? 256 : mib);
        if (set_key(cfg, "dram.capacity", v) != KV_OK)
            goto fail;
    }
    if (kv_config_get(cfg, "dram.capacity", dram_capacity, 64) != KV_OK)
        snprintf(dram_capacity, 64, "?");
    if (has_ssd && !kvctl_user_set(c, "ssd.path")) {
        *ssd_tmp = kvctl_mktemp_dir(NULL, "kvbench-ssd");
        if (!*ssd_tmp) {
            perror("kvctl bench: temporary ssd.path");
            goto fail;
        }
        if (set_key(cfg, "ssd.path", *ssd_tmp) != KV_OK)
            goto fail;
    }
    *out = cfg;
    return KVCTL_EXIT_OK;
fail:
    kv_config_free(cfg);
    return rc;
}

/* ---- scenarios ----------------------------------------------------------- */

/* --drop-caches: every phase starts with nothing dirty and nothing cached,
 * so a backend's writes do not pay for the other's writeback, and what a
 * lookup or read touches comes from the disk, for both backends alike. A
 * failure (not root, a container) is said once and the run goes on warm. */
static void drop_caches(void)
{
    static bool warned;
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    bool ok = f && fputs("3\n", f) >= 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok && !warned) {
        warned = true;
        fprintf(stderr, "kvctl bench: --drop-caches: cannot write /proc/sys/vm/drop_caches; "
                        "caches stay warm\n");
    }
}

static bool g_drop_caches;

static void add(struct kvctl_run *run, struct kvctl_jobs *js, const struct kvctl_backend *be,
                void *st, enum kvctl_phase_kind kind, double seconds)
{
    if (g_drop_caches)
        drop_caches();
    run->nphases += kvctl_jobs_run(js, be, st, kind, seconds, &run->phases[run->nphases]);
}

/* What a trace run needs beside the options: the trace, and how its runs
 * are set up (the backend and tiers are set per run). */
struct trace_ctx {
    const struct kvctl_trace *t;
    struct kvctl_trace_opts opts;
    uint64_t ideal_hits;
};

static double config_double(const kv_config *cfg, const char *key)
{
    char v[64];
    return kv_config_get(cfg, key, v, sizeof v) == KV_OK ? strtod(v, NULL) : NAN;
}

static bool cluster_enabled(const kv_config *cfg)
{
    char v[16];
    return kv_config_get(cfg, "cluster.enabled", v, sizeof v) == KV_OK && strcmp(v, "true") == 0;
}

/* The models' side of a trace run: the infinite cache's ratio, and an exact
 * LRU of this run's DRAM tier. The tier holds at most capacity x high
 * watermark bytes and, when full, frees eviction.ratio x capacity at once,
 * least recently used first (approximately: it samples); the model holds
 * as many blocks and frees as many, in exact LRU order, so that the two
 * differ only in how well the tier's order approximates LRU. A block's
 * bytes are measured during the run (the allocator's rounding included). The plain LRU (one block at a time, at the high watermark)
 * is reported beside it. Runs without a local DRAM tier (ssd, posix, a
 * cluster client) get no model. */
static void trace_models(const struct trace_ctx *tc, const struct kvctl_open_args *args,
                         struct kvctl_run *run)
{
    struct kvctl_trace_stats *ts = &run->trace;
    double refs = (double)tc->t->nrefs;
    ts->ideal_hit_ratio = refs > 0 ? (double)tc->ideal_hits / refs : NAN;
    ts->lru_hit_ratio = ts->lru_plain_hit_ratio = NAN;
    char cap_s[64];
    uint64_t cap = 0;
    if (!args->cfg || !strstr(run->pipeline, "dram") || cluster_enabled(args->cfg) ||
        kv_config_get(args->cfg, "dram.capacity", cap_s, sizeof cap_s) != KV_OK ||
        kvctl_parse_size(cap_s, &cap) != KV_OK)
        return;
    double per_block = (ts->shard_bytes > 0 ? ts->shard_bytes : (double)tc->opts.value_size)
                     * tc->opts.shards;
    double hwm = config_double(args->cfg, "eviction.high_watermark_ratio");
    double ratio = config_double(args->cfg, "eviction.ratio");
    if (!(hwm > 0) || !(ratio > 0) || !(per_block > 0) || refs == 0)
        return;
    ts->lru_blocks = (uint64_t)((double)cap * hwm / per_block);
    double low = (double)cap * (hwm - ratio) / per_block;
    ts->lru_low_blocks = low > 0 ? (uint64_t)low : 0;
    free(ts->lru_req_hits);
    ts->lru_req_hits = calloc(tc->t->nreq, sizeof *ts->lru_req_hits);
    uint64_t h = kvctl_trace_lru(tc->t, ts->lru_blocks, ts->lru_low_blocks, ts->lru_req_hits);
    if (h != UINT64_MAX)
        ts->lru_hit_ratio = (double)h / refs;
    h = kvctl_trace_lru(tc->t, ts->lru_blocks, ts->lru_blocks ? ts->lru_blocks - 1 : 0, NULL);
    if (h != UINT64_MAX)
        ts->lru_plain_hit_ratio = (double)h / refs;
}

static void run_backend(const struct bench_opts *o, struct kvctl_jobs *js,
                        const struct kvctl_backend *be, const struct kvctl_open_args *args,
                        const struct trace_ctx *tc, struct kvctl_run *run)
{
    void *st = NULL;
    run->backend = be->name;
    run->addr = args->addr;
    kvctl_jobs_reset(js);
    kvctl_rss_reset_peak();
    run->open_error = be->open(args, &st);
    if (run->open_error != KV_OK) {
        fprintf(stderr, "kvctl bench: %s: open failed: %s\n", be->name,
                args->addr && kvctl_net_open_why[0] ? kvctl_net_open_why
                                                    : kv_strerror(run->open_error));
        return;
    }
    if (o->scenario == SC_TRACE) {
        struct kvctl_trace_opts to = tc->opts;
        to.tiers = be == &kvctl_backend_posix ? KVCTL_TIERS_FILES
                 : be == &kvctl_backend_kvengine && !cluster_enabled(args->cfg)
                       ? KVCTL_TIERS_ENGINE : KVCTL_TIERS_UNKNOWN;
        if (g_drop_caches)
            drop_caches();
        int rc = kvctl_trace_replay(tc->t, &to, be, st, run);
        if (rc != KV_OK)
            run->open_error = rc;       /* it could not run: said why already */
        else
            trace_models(tc, args, run);
    } else {
        /* mixed_rw's runtime is its mixed phase's length, not a cap on the
         * preparation. */
        double cap = o->scenario == SC_MIXED_RW ? 0 : o->runtime;
        add(run, js, be, st, KVCTL_PH_WRITE, cap);
        switch (o->scenario) {
        case SC_VERIFY_WRITE:
            add(run, js, be, st, KVCTL_PH_READ, cap);
            break;
        case SC_FILL:
            add(run, js, be, st, KVCTL_PH_LOOKUP, cap);
            break;
        case SC_READ_PERF:
            add(run, js, be, st, KVCTL_PH_LOOKUP, cap);
            add(run, js, be, st, KVCTL_PH_READ, cap);
            break;
        case SC_MIXED_RW:
            add(run, js, be, st, KVCTL_PH_MIXED, o->runtime);
            break;
        default:
            break;
        }
        /* Attached with --compare dram: the dump from kv_buffer_alloc
         * memory (one copy, the server's) against the in-process dump,
         * in the same run; last, so that it disturbs no other phase. */
        struct kvctl_backend_info bi;
        be->info(st, &bi);
        bool dram_cmp = false;
        for (int i = 0; i < o->ncmp; i++)
            dram_cmp |= o->cmp[i].dram;
        if (dram_cmp && bi.attached && !o->kv_buffers && be->buffer) {
            /* ...and, alternated batch by batch with it, the same dumps
             * into an in-process engine (kvbuf_inproc): the ratio of two
             * phases run one after the other swung 2x with the VM's
             * memory bandwidth. */
            struct kvctl_open_args aa = *args;
            void *alt = NULL;
            aa.cfg = args->alt_cfg;
            if (aa.cfg && be->open(&aa, &alt) != KV_OK) {
                fprintf(stderr, "kvctl bench: the in-process engine for write_kvbuf did not "
                                "open: write_kvbuf runs alone\n");
                alt = NULL;
            }
            kvctl_jobs_set_alternate(js, be, alt);
            add(run, js, be, st, KVCTL_PH_WRITE_KVBUF, cap);
            kvctl_jobs_set_alternate(js, be, NULL);
            if (alt)
                be->close(alt);
        }
    }
    be->info(st, &run->info);
    kvctl_rss(&run->rss, &run->peak_rss);
    be->close(st);
}

/* Every server named by --compare answers before anything is measured:
 * a typo in a port should not cost a whole kvengine run first. */
static int probe_servers(const struct bench_opts *o)
{
    for (int i = 0; i < o->ncmp; i++) {
        if (!o->cmp[i].addr)
            continue;
        struct kvctl_open_args a = { .addr = o->cmp[i].addr, .numjobs = 1 };
        void *st = NULL;
        int rc = o->cmp[i].be->open(&a, &st);
        if (rc != KV_OK) {
            fprintf(stderr, "kvctl bench: --compare %s=%s: %s\n", o->cmp[i].be->name,
                    o->cmp[i].addr, kvctl_net_open_why[0] ? kvctl_net_open_why : kv_strerror(rc));
            return KVCTL_EXIT_FAIL;
        }
        o->cmp[i].be->close(st);
    }
    return KVCTL_EXIT_OK;
}

static uint64_t fresh_salt(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* 53 bits: the summary JSON's number reads back exactly in any parser. */
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    return x & ((1ull << 53) - 1);
}

int kvctl_bench_main(struct kvctl_common *c, int argc, char **argv)
{
    struct bench_opts o;
    int rc = parse(c, argc, argv, &o);
    if (rc >= 0)
        return rc;
    struct kvctl_report r = {
        .scenario = scenarios[o.scenario], .value_size = o.value_size,
        .nr_objects = o.nr_objects, .numjobs = (unsigned)o.numjobs,
        .batch_size = (unsigned)o.batch_size, .runtime = o.runtime,
        .rwmixread = (unsigned)o.rwmixread, .pattern = o.pattern, .verify = o.verify,
        .shards = (unsigned)o.shards, .trace_speed = o.trace_speed,
        .trace_limit = o.trace_limit,
    };
    kv_config *cfg = NULL, *dram_cfg = NULL, *tcp_cfg = NULL;
    char *tcp_ssd_tmp = NULL, tcp_pipe[64] = "", tcp_cap[64] = "";
    char *ssd_tmp = NULL, *dram_ssd_tmp = NULL, *posix_tmp = NULL;
    struct kvctl_jobs *js = NULL;
    struct kvctl_trace *trace = NULL;
    struct trace_ctx tc = { 0 };
    char dram_pipe[64], dram_cap[64];
    if (o.scenario == SC_TRACE) {
        int trc = kvctl_trace_load(o.trace, o.trace_limit, &trace);
        if (trc != KV_OK) {
            rc = trc == KV_ENOMEM ? KVCTL_EXIT_FAIL : KVCTL_EXIT_USAGE;
            goto out;
        }
        /* Replays verify every load: it is what tells a broken promise. */
        r.verify = true;
        r.trace = trace;
        r.nr_objects = trace->ndistinct;
    }
    rc = engine_config(c, &o, trace, NULL, &cfg, &ssd_tmp, r.pipeline, r.dram_capacity);
    if (rc != KVCTL_EXIT_OK)
        goto out;
    for (int i = 0; i < o.ncmp; i++) {
        if (!o.cmp[i].dram)
            continue;
        rc = engine_config(c, &o, trace, "dram", &dram_cfg, &dram_ssd_tmp, dram_pipe, dram_cap);
        if (rc != KVCTL_EXIT_OK)
            goto out;
    }
    for (int i = 0; i < o.ncmp; i++) {
        if (!o.cmp[i].tcp)
            continue;
        rc = engine_config(c, &o, trace, "tcp", &tcp_cfg, &tcp_ssd_tmp, tcp_pipe, tcp_cap);
        if (rc != KVCTL_EXIT_OK)
            goto out;
    }
    if (trace) {
        char v[32];
        if (kv_config_get(cfg, "eviction.lease_ttl_ms", v, sizeof v) == KV_OK)
            r.lease_ttl_ms = (unsigned)strtoul(v, NULL, 10);
    }
    rc = probe_servers(&o);
    if (rc != KVCTL_EXIT_OK)
        goto out;
    r.salt = o.salt_given ? o.salt : fresh_salt();
    /* A replay's memcpy baseline copies as many values as the trace has
     * distinct shards, up to DEFAULT_DATA_SET worth. */
    uint64_t objects = o.nr_objects;
    if (trace) {
        objects = trace->ndistinct * o.shards;
        if (objects > DEFAULT_DATA_SET / o.value_size)
            objects = DEFAULT_DATA_SET / o.value_size;
        if (objects == 0)
            objects = 1;
    }
    struct kvctl_workload w = {
        .value_size = o.value_size, .nr_objects = objects, .numjobs = r.numjobs,
        .batch_size = r.batch_size, .rwmixread = r.rwmixread, .pattern = o.pattern,
        .verify = o.verify, .salt = r.salt, .kv_buffers = o.kv_buffers,
    };
    rc = KVCTL_EXIT_FAIL;
    if (kvctl_jobs_new(&w, &js) != KV_OK) {
        fprintf(stderr, "kvctl bench: cannot allocate the jobs' buffers\n");
        goto out;
    }
    r.memcpy_mib_s = kvctl_jobs_memcpy(js, o.scenario == SC_MIXED_RW ? 0 : o.runtime);
    bool net = cluster_enabled(cfg);
    for (int i = 0; i < o.ncmp; i++)
        net |= o.cmp[i].addr != NULL;
    if (net)
        r.tcp_mib_s = kvctl_tcp_baseline(r.numjobs, o.value_size, TCP_BASELINE_S);
    if (trace) {
        tc.t = trace;
        tc.opts = (struct kvctl_trace_opts){ .value_size = o.value_size, .salt = r.salt,
                                             .shards = (unsigned)o.shards,
                                             .numjobs = r.numjobs, .speed = o.trace_speed };
        r.ideal_req_hits = calloc(trace->nreq, sizeof *r.ideal_req_hits);
        tc.ideal_hits = kvctl_trace_ideal(trace, r.ideal_req_hits);
        if (!r.ideal_req_hits || tc.ideal_hits == UINT64_MAX) {
            fprintf(stderr, "kvctl bench: out of memory for the trace's models\n");
            goto out;
        }
    }

    g_drop_caches = o.drop_caches;
    struct kvctl_open_args args = { .cfg = cfg, .value_size = o.value_size,
                                    .numjobs = r.numjobs, .alt_cfg = dram_cfg };
    snprintf(r.runs[0].pipeline, sizeof r.runs[0].pipeline, "%s", r.pipeline);
    run_backend(&o, js, &kvctl_backend_kvengine, &args, &tc, &r.runs[r.nruns++]);
    for (int i = 0; i < o.ncmp; i++) {
        struct kvctl_run *run = &r.runs[r.nruns++];
        struct kvctl_open_args a = args;
        a.addr = o.cmp[i].addr;
        if (o.cmp[i].dram) {
            a.cfg = dram_cfg;
            snprintf(run->pipeline, sizeof run->pipeline, "%s", dram_pipe);
        } else if (o.cmp[i].tcp) {
            a.cfg = tcp_cfg;
            snprintf(run->pipeline, sizeof run->pipeline, "%s", tcp_pipe);
        } else if (o.cmp[i].be != &kvctl_backend_kvengine) {
            a.cfg = NULL;
        }
        if (o.cmp[i].be == &kvctl_backend_posix) {
            posix_tmp = kvctl_mktemp_dir(o.posix_dir, "kvbench-posix");
            if (!posix_tmp) {
                perror("kvctl bench: posix directory");
                goto out;
            }
            a.dir = posix_tmp;
        }
        run_backend(&o, js, o.cmp[i].be, &a, &tc, run);
        if (o.cmp[i].dram)
            run->backend = "dram";
        if (o.cmp[i].tcp)
            run->backend = "tcp";
        if (posix_tmp) {
            kvctl_rmtree(posix_tmp);    /* before the next server is measured */
            posix_tmp = NULL;
        }
    }
    kvctl_report_print(stdout, &r);
    if (o.summary_json && kvctl_report_json(o.summary_json, &r) != KV_OK)
        goto out;
    if (o.plot && kvctl_plot(o.plot, &r) != KV_OK)
        goto out;
    rc = KVCTL_EXIT_OK;
    for (int i = 0; i < r.nruns; i++)
        if (!kvctl_run_ok(&r, &r.runs[i]))
            rc = KVCTL_EXIT_FAIL;
out:
    for (int i = 0; i < r.nruns; i++) {
        free(r.runs[i].trace.req_hits);
        free(r.runs[i].trace.lru_req_hits);
    }
    free(r.ideal_req_hits);
    kvctl_trace_free(trace);
    kvctl_jobs_free(js);
    kv_config_free(cfg);
    kv_config_free(dram_cfg);
    kv_config_free(tcp_cfg);
    kvctl_rmtree(tcp_ssd_tmp);
    kvctl_rmtree(ssd_tmp);
    kvctl_rmtree(dram_ssd_tmp);
    kvctl_rmtree(posix_tmp);
    return rc;
}
