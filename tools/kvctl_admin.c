/*
 * kvctl_admin.c — the operator's commands: stats, members, lookup, put, get,
 * rm, and ssd ls | scrub | compact | recover.
 *
 *     kvctl [--config FILE] [--set K=V]... stats [--json] [--node HOST:PORT]
 *     kvctl ... members [--json]
 *     kvctl ... lookup|put|get|rm ...
 *     kvctl ... ssd ls|scrub|compact|recover
 *
 * Key design choices:
 * - Every command is one line of a table (`admins`, at the end): its help,
 *   the options it takes, how many arguments, how many of them are block
 *   ids or keys, and what it needs opened (nothing, the config, the store,
 *   or a store put may create). One driver, kvctl_admin_main, parses,
 *   checks, opens, calls the handler and closes; a handler is only its
 *   command's own logic. A handler whose needs depend on its options
 *   (stats --node, ssd recover) says so in its prep step, which runs after
 *   the arguments are checked and before anything is opened.
 * - A command that needs data opens the store the config describes, through
 *   the public API, as any program would ("offline": the store must not be
 *   held by a running engine; a running node is reached with --node). Unless
 *   the user chose dram.capacity, no DRAM segment is mapped and faulted in
 *   just to answer one question: a store with an SSD tier is opened as
 *   pipeline ssd (the same files), so every put goes straight to disk and
 *   is still there after kvctl exits, and in a cluster (cluster.enabled)
 *   kvctl is a pure client (dram.capacity 0) that stores nothing itself.
 * - A store that does not exist is an error, not a fresh empty one: only
 *   put may create it. A block id is 32 hex digits; anything else is a plain
 *   key (--key and --block force one reading).
 * - Data goes to stdout, everything else to stderr; --json prints one JSON
 *   document on stdout. Long walks (scrub, compact) show a progress line on
 *   a terminal only.
 */
#include "kvctl.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NODE_TIMEOUT_MS 3000u

/* ---- commands: what a handler is given ------------------------------------ */

struct aopts {
    bool json, repair, key, block, prom, health;
    const char *node, *output;
    uint64_t index, timeout_ms;
};

struct name {
    bool block;
    kv_block_id id;
    const char *key;
    size_t klen;
};

/* What the driver opens before the handler runs (and closes after). */
enum need {
    NEED_NOTHING,
    NEED_CONFIG,            /* the effective config, x->cfg */
    NEED_STORE,             /* the store the config describes, x->e */
    NEED_NEW_STORE,         /* the same, created when it does not exist (put) */
};

/*
 * A command's context. The driver fills it in order: options, arguments,
 * names (args[0..nnames) read as block ids or plain keys), then whatever
 * `need` says is opened; it closes and frees all of it, buf included, after
 * the handler returns.
 */
struct actx {
    const char *cmd;
    struct kvctl_common *c;
    struct aopts o;
    char **args;            /* the arguments after the options */
    int nargs;
    struct name *names;
    int nnames;
    enum need need;         /* the table's; a prep step may change it */
    kv_config *cfg;
    kv_engine *e;
    void *buf;              /* a handler's memory, kept from prep to run */
    size_t buflen;
};

/* A line of the table. prep (optional) and run return an exit code; prep
 * returns -1 to go on. */
struct admin {
    const char *name;
    const char *help;
    const char *opts;       /* the short letters of the options it takes */
    int min_args, max_args;
    int names;              /* how many leading arguments are names */
    enum need need;
    int (*prep)(struct actx *x);
    int (*run)(struct actx *x);
};

static void usage(const struct admin *a, FILE *f)
{
    fprintf(f, "%s\nCommon options:\n%s\n%s", a->help, kvctl_common_help, kvctl_exit_help);
}

/* ---- options ---------------------------------------------------------------- */

/* Parses the options a->opts names (short letters); -1 to go on, or an
 * exit code. The arguments left start at optind. */
static int parse(struct kvctl_common *c, int argc, char **argv, const struct admin *a,
                 struct aopts *o)
{
    static const struct option longopts[] = {
        KVCTL_COMMON_LONGOPTS,
        { "help", no_argument, NULL, 'h' },
        { "json", no_argument, NULL, 'j' },
        { "node", required_argument, NULL, 'n' },
        { "timeout", required_argument, NULL, 't' },
        { "output", required_argument, NULL, 'o' },
        { "repair", no_argument, NULL, 'r' },
        { "key", no_argument, NULL, 'k' },
        { "block", no_argument, NULL, 'b' },
        { "index", required_argument, NULL, 'i' },
        { "prometheus", no_argument, NULL, 'p' },
        { "health", no_argument, NULL, 'H' },
        { NULL, 0, NULL, 0 },
    };
    *o = (struct aopts){ .timeout_ms = NODE_TIMEOUT_MS };
    const char *cmd = argv[0];
    int opt, rc;
    optind = 0;
    opterr = 1;
    while ((opt = kvctl_getopt(c, argc, argv, "c:s:hjn:t:o:rkbi:pH", longopts, &rc)) != -1) {
        if (opt == 'h') {
            usage(a, stdout);
            return KVCTL_EXIT_OK;
        }
        if (opt == '?' || !strchr(a->opts, opt)) {
            if (opt != '?')
                fprintf(stderr, "kvctl %s: option '%s' does not apply here\n", cmd,
                        argv[optind - 1]);
            fprintf(stderr, "(see kvctl %s --help)\n", cmd);
            return KVCTL_EXIT_USAGE;
        }
        switch (opt) {
        case 'j': o->json = true; break;
        case 'n': o->node = optarg; break;
        case 'o': o->output = optarg; break;
        case 'r': o->repair = true; break;
        case 'k': o->key = true; break;
        case 'b': o->block = true; break;
        case 'p': o->prom = true; break;
        case 'H': o->health = true; break;
        case 't':
            if (kvctl_parse_u64(optarg, 1, 3600000, &o->timeout_ms) != KV_OK) {
                fprintf(stderr, "kvctl %s: --timeout '%s': want milliseconds, 1..3600000\n",
                        cmd, optarg);
                return KVCTL_EXIT_USAGE;
            }
            break;
        case 'i':
            if (kvctl_parse_u64(optarg, 0, UINT32_MAX, &o->index) != KV_OK) {
                fprintf(stderr, "kvctl %s: --index '%s': want a shard index, 0..4294967295\n",
                        cmd, optarg);
                return KVCTL_EXIT_USAGE;
            }
            break;
        default:
            break;
        }
    }
    if (rc >= 0)
        return rc;
    if (o->key && o->block) {
        fprintf(stderr, "kvctl %s: --key and --block exclude each other\n", cmd);
        return KVCTL_EXIT_USAGE;
    }
    return -1;
}

static int want_args(const char *cmd, int have, int lo, int hi)
{
    if (have >= lo && have <= hi)
        return -1;
    if (have < lo)
        fprintf(stderr, "kvctl %s: missing argument (see kvctl %s --help)\n", cmd, cmd);
    else
        fprintf(stderr, "kvctl %s: too many arguments (see kvctl %s --help)\n", cmd, cmd);
    return KVCTL_EXIT_USAGE;
}

/* ---- names: block ids and plain keys ---------------------------------------- */

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

static bool parse_hex_id(const char *s, kv_block_id *id)
{
    if (strlen(s) != 2 * KV_BLOCK_ID_LEN)
        return false;
    for (int i = 0; i < KV_BLOCK_ID_LEN; i++) {
        int hi = hexval((unsigned char)s[2 * i]), lo = hexval((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        id->bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

static void fmt_id(const kv_block_id *id, char out[2 * KV_BLOCK_ID_LEN + 1])
{
    for (int i = 0; i < KV_BLOCK_ID_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", id->bytes[i]);
}

/* -1 to go on, or an exit code after saying why. */
static int parse_name(const char *cmd, const struct aopts *o, const char *arg, struct name *n)
{
    memset(n, 0, sizeof *n);
    if (!o->key && parse_hex_id(arg, &n->id)) {
        n->block = true;
        return -1;
    }
    if (o->block) {
        fprintf(stderr, "kvctl %s: '%s' is not a block id (32 hex digits)\n", cmd, arg);
        return KVCTL_EXIT_USAGE;
    }
    n->key = arg;
    n->klen = strlen(arg);
    if (n->klen == 0 || n->klen > KV_KEY_MAX) {
        fprintf(stderr, "kvctl %s: a plain key is 1..%d bytes, '%s' is %zu\n", cmd, KV_KEY_MAX,
                arg, n->klen);
        return KVCTL_EXIT_USAGE;
    }
    return -1;
}

/* ---- opening the store ---------------------------------------------------------- */

static bool cfg_is(const kv_config *cfg, const char *key, const char *want)
{
    char v[512] = "";
    return kv_config_get(cfg, key, v, sizeof v) == KV_OK && strcmp(v, want) == 0;
}

/* Opens the store the config describes. create: put may make a new one.
 * Returns an exit code; on success *out is the engine. */
static int open_store(struct kvctl_common *c, const char *cmd, bool create, kv_engine **out)
{
    *out = NULL;
    kv_config *cfg = NULL;
    int rc = kvctl_build_config(c, &cfg);
    if (rc != KVCTL_EXIT_OK)
        return rc;
    rc = KVCTL_EXIT_USAGE;
    char pipeline[64] = "", path[1024] = "";
    kv_config_get(cfg, "pipeline", pipeline, sizeof pipeline);
    kv_config_get(cfg, "ssd.path", path, sizeof path);
    bool cluster = cfg_is(cfg, "cluster.enabled", "true");
    bool has_ssd = strstr(pipeline, "ssd") != NULL;
    /* A named host store (store.name) is opened as configured: kvctl then
     * attaches to the process serving it, like any other opener. */
    bool sized = kvctl_user_set(c, "dram.capacity") || !cfg_is(cfg, "store.name", "");
    /* No DRAM unless asked for: a cluster member becomes a pure client, a
     * store with an SSD tier is opened as pipeline ssd (the same files on
     * disk; every put lands there at once). */
    if (!sized && cluster && kv_config_set(cfg, "dram.capacity", "0") != KV_OK)
        goto out;
    /* A pure client stores nothing: no local SSD tier either (the engine
     * would open one at ssd.path, ./kvdata by default). */
    if (!sized && cluster && !kvctl_user_set(c, "pipeline") &&
        kv_config_set(cfg, "pipeline", "dram") != KV_OK)
        goto out;
    if (!sized && !cluster && has_ssd && kv_config_set(cfg, "pipeline", "ssd") != KV_OK)
        goto out;
    if (!kvctl_user_set(c, "log.level"))
        kv_config_set(cfg, "log.level", "error");
    if (!cluster && !has_ssd && !sized) {
        fprintf(stderr,
                "kvctl %s: pipeline '%s' keeps nothing between runs, so there is no store to\n"
                "open offline; give the config of an SSD store (pipeline dram|ssd or ssd), a\n"
                "cluster (cluster.enabled: true), or --node HOST:PORT for a running node's stats\n",
                cmd, pipeline);
        goto out;
    }
    if (!cluster && has_ssd && !create) {
        struct stat st;
        char current[1100];
        snprintf(current, sizeof current, "%s/CURRENT", path);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode) || stat(current, &st) != 0) {
            fprintf(stderr, "kvctl %s: no store at %s (ssd.path): %s\n", cmd, path,
                    errno == ENOENT ? "it does not exist" : strerror(errno));
            rc = KVCTL_EXIT_FAIL;
            goto out;
        }
    }
    rc = KVCTL_EXIT_FAIL;
    int err = kv_open(cfg, out);
    if (err != KV_OK) {
        if (err == KV_EBUSY)
            fprintf(stderr,
                    "kvctl %s: the store at %s is in use by another engine (a running node?\n"
                    "use kvctl stats --node HOST:PORT for its figures)\n", cmd, path);
        else if (cluster && (err == KV_ENET || err == KV_ETIMEDOUT))
            fprintf(stderr, "kvctl %s: cannot join the cluster: kvmaster at %s does not answer\n",
                    cmd, (kv_config_get(cfg, "cluster.master", path, sizeof path), path));
        else
            fprintf(stderr, "kvctl %s: cannot open the store: %s (%s)\n", cmd, kv_strerror(err),
                    kv_err_name(err));
        goto out;
    }
    rc = KVCTL_EXIT_OK;
out:
    kv_config_free(cfg);
    return rc;
}

/* ---- stats ------------------------------------------------------------------------ */

static void print_stats_json(const kv_stats *s)
{
    static const char *const names[] = {
        "dram_capacity", "dram_used", "dram_blocks", "ssd_capacity", "ssd_used", "ssd_blocks",
        "hits_dram", "hits_ssd", "misses", "evictions", "spills", "spill_drops",
        "checksum_failures", "tasks_inflight", "dram_shards", "dram_index_bytes",
        "promotions", "keys", "dumps_ok", "dumps_failed", "loads_ok", "loads_failed",
        "enospc", "open_ns", "lookup_hits_dram", "lookup_hits_ssd", "lookup_misses",
        "prefix_ids", "prefix_hits",
    };
    const uint64_t v[] = {
        s->dram_capacity, s->dram_used, s->dram_blocks, s->ssd_capacity, s->ssd_used,
        s->ssd_blocks, s->hits_dram, s->hits_ssd, s->misses, s->evictions, s->spills,
        s->spill_drops, s->checksum_failures, s->tasks_inflight, s->dram_shards,
        s->dram_index_bytes, s->promotions, s->keys, s->dumps_ok, s->dumps_failed,
        s->loads_ok, s->loads_failed, s->enospc, s->open_ns, s->lookup_hits_dram,
        s->lookup_hits_ssd, s->lookup_misses, s->prefix_ids, s->prefix_hits,
    };
    printf("{\"source\":\"store\"");
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        printf(",\"%s\":%" PRIu64, names[i], v[i]);
    printf("}\n");
}

static void print_stats_text(const kv_stats *s)
{
    char a[32], b[32];
    printf("%-5s %12s %12s %10s %10s\n", "tier", "capacity", "used", "blocks", "hits");
    printf("%-5s %12s %12s %10" PRIu64 " %10" PRIu64 "\n", "dram",
           kvctl_fmt_size(s->dram_capacity, a, sizeof a), kvctl_fmt_size(s->dram_used, b, sizeof b),
           s->dram_blocks, s->hits_dram);
    printf("%-5s %12s %12s %10" PRIu64 " %10" PRIu64 "\n", "ssd",
           kvctl_fmt_size(s->ssd_capacity, a, sizeof a), kvctl_fmt_size(s->ssd_used, b, sizeof b),
           s->ssd_blocks, s->hits_ssd);
    printf("misses %" PRIu64 ", evictions %" PRIu64 ", spills %" PRIu64 ", spill drops %" PRIu64
           ", checksum failures %" PRIu64 ", plain keys in dram %" PRIu64 "\n",
           s->misses, s->evictions, s->spills, s->spill_drops, s->checksum_failures, s->keys);
}

/* Prints a /metrics body: samples only as text, or one JSON object. */
static int print_node_metrics(const char *node, char *body, bool json)
{
    size_t nsamples = 0;
    if (json) {
        printf("{\"source\":");
        kvctl_jstr(stdout, node);
        printf(",\"metrics\":{");
    }
    for (char *line = strtok(body, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *sp = strrchr(line, ' ');
        if (!sp)
            continue;
        *sp = '\0';
        char *end = NULL;
        double v = strtod(sp + 1, &end);
        if (json) {
            printf("%s", nsamples ? "," : "");
            kvctl_jstr(stdout, line);
            putchar(':');
            kvctl_jnum(stdout, v);
        } else {
            printf("%s %s\n", line, sp + 1);
        }
        nsamples++;
    }
    if (json)
        printf("}}\n");
    if (nsamples == 0) {
        fprintf(stderr, "kvctl stats: %s served no samples\n", node);
        return KVCTL_EXIT_FAIL;
    }
    return KVCTL_EXIT_OK;
}

/* stats --node asks the node, not a store (the config only for
 * metrics.token). */
static int stats_prep(struct actx *x)
{
    if (x->o.health && !x->o.node) {
        fprintf(stderr, "kvctl stats: --health asks a running process: give --node HOST:PORT\n");
        return KVCTL_EXIT_USAGE;
    }
    if (x->o.node)
        x->need = NEED_CONFIG;
    return -1;
}

/* stats --node --health: /health's answer, and 0 only for 200. */
static int node_health(const struct aopts *o, const char *token)
{
    char *body = NULL, why[512] = "";
    size_t len = 0;
    int status = 0;
    int err = kvctl_http_get(o->node, "/health", token, (unsigned)o->timeout_ms, &body, &len,
                             &status, why, sizeof why);
    if (err != KV_OK) {
        fprintf(stderr, "kvctl stats: %s\n", why);
        return err == KV_EINVAL ? KVCTL_EXIT_USAGE : KVCTL_EXIT_FAIL;
    }
    body[strcspn(body, "\n")] = '\0';
    if (o->json) {
        printf("{\"node\":");
        kvctl_jstr(stdout, o->node);
        printf(",\"status\":%d,\"healthy\":%s,\"answer\":", status, status == 200 ? "true" : "false");
        kvctl_jstr(stdout, body);
        printf("}\n");
    } else {
        printf("%s: %s (HTTP %d)\n", o->node, body, status);
    }
    free(body);
    return status == 200 ? KVCTL_EXIT_OK : KVCTL_EXIT_FAIL;
}

static int node_stats(const struct aopts *o, const char *token)
{
    if (o->health)
        return node_health(o, token);
    char *body = NULL, why[512] = "";
    size_t len = 0;
    int status = 0;
    int err = kvctl_http_get(o->node, "/metrics", token, (unsigned)o->timeout_ms, &body, &len,
                             &status, why, sizeof why);
    if (err != KV_OK) {
        fprintf(stderr, "kvctl stats: %s\n", why);
        return err == KV_EINVAL ? KVCTL_EXIT_USAGE : KVCTL_EXIT_FAIL;
    }
    if (status != 200) {
        fprintf(stderr, "kvctl stats: %s answered HTTP %d to /metrics\n", o->node, status);
        free(body);
        return KVCTL_EXIT_FAIL;
    }
    int rc = print_node_metrics(o->node, body, o->json);
    free(body);
    return rc;
}

static int stats_run(struct actx *x)
{
    if (x->o.node) {
        char token[256] = "";
        if (x->cfg)
            kv_config_get(x->cfg, "metrics.token", token, sizeof token);
        return node_stats(&x->o, token);
    }
    kv_stats s;
    int err;
    if (x->o.prom) {
        char *text = NULL;
        size_t len = 0;
        err = kv_metrics_render(x->e, &text, &len);
        if (err == KV_OK)
            fwrite(text, 1, len, stdout);
        free(text);
    } else if ((err = kv_stats_get(x->e, &s)) == KV_OK) {
        if (x->o.json)
            print_stats_json(&s);
        else
            print_stats_text(&s);
    }
    if (err != KV_OK) {
        fprintf(stderr, "kvctl stats: %s\n", kv_strerror(err));
        return KVCTL_EXIT_FAIL;
    }
    return KVCTL_EXIT_OK;
}

/* ---- members ------------------------------------------------------------------------ */

static int members_run(struct actx *x)
{
    char master[256] = "?", meta[16] = "kvmaster", where[300];
    kv_config_get(x->cfg, "cluster.metadata", meta, sizeof meta);
    int etcd = strcmp(meta, "etcd") == 0;
    kv_config_get(x->cfg, etcd ? "cluster.etcd_endpoints" : "cluster.master", master,
                  sizeof master);
    snprintf(where, sizeof where, "%s at %s (%s)", etcd ? "etcd" : "kvmaster", master,
             etcd ? "cluster.etcd_endpoints" : "cluster.master");
    uint64_t version = 0;
    kv_member_info *m = NULL;
    size_t n = 0;
    int err = kv_members(x->cfg, &version, &m, &n);
    if (err != KV_OK) {
        if (err == KV_ENET || err == KV_ETIMEDOUT)
            fprintf(stderr, "kvctl members: %s does not answer: %s\n", where,
                    err == KV_ETIMEDOUT ? "timed out" : "connection refused or reset");
        else if (err == KV_EPERM)
            fprintf(stderr, "kvctl members: %s refused %s\n", where,
                    etcd ? "cluster.etcd_user / etcd_password" : "cluster.token");
        else
            fprintf(stderr, "kvctl members: %s: %s\n", master, kv_strerror(err));
        return err == KV_ECONFIG ? KVCTL_EXIT_USAGE : KVCTL_EXIT_FAIL;
    }
    /* The cluster's totals: what its owners hold and could hold. */
    kv_member_info tot;
    memset(&tot, 0, sizeof tot);
    size_t owners = 0;
    for (size_t i = 0; i < n; i++) {
        owners += m[i].owner != 0;
        tot.dram_capacity += m[i].dram_capacity;
        tot.dram_used += m[i].dram_used;
        tot.ssd_capacity += m[i].ssd_capacity;
        tot.ssd_used += m[i].ssd_used;
        tot.dram_blocks += m[i].dram_blocks;
        tot.ssd_blocks += m[i].ssd_blocks;
        tot.keys += m[i].keys;
    }
    if (x->o.json) {
        printf("{\"master\":");
        kvctl_jstr(stdout, master);
        printf(",\"version\":%" PRIu64 ",\"members\":[", version);
        for (size_t i = 0; i < n; i++) {
            printf("%s{\"id\":", i ? "," : "");
            kvctl_jstr(stdout, m[i].id);
            printf(",\"addr\":");
            kvctl_jstr(stdout, m[i].addr);
            printf(",\"role\":\"%s\",\"segments\":%u,\"segment_bytes\":%" PRIu64,
                   m[i].owner ? "owner" : "client", m[i].segments, m[i].segment_bytes);
            printf(",\"dram_capacity\":%" PRIu64 ",\"dram_used\":%" PRIu64
                   ",\"ssd_capacity\":%" PRIu64 ",\"ssd_used\":%" PRIu64
                   ",\"dram_blocks\":%" PRIu64 ",\"ssd_blocks\":%" PRIu64 ",\"keys\":%" PRIu64
                   ",\"heartbeat_age_ms\":%" PRId64 ",\"lib_version\":",
                   m[i].dram_capacity, m[i].dram_used, m[i].ssd_capacity, m[i].ssd_used,
                   m[i].dram_blocks, m[i].ssd_blocks, m[i].keys, m[i].heartbeat_age_ms);
            kvctl_jstr(stdout, m[i].version);
            printf("}");
        }
        printf("],\"totals\":{\"members\":%zu,\"owners\":%zu,\"clients\":%zu"
               ",\"dram_capacity\":%" PRIu64 ",\"dram_used\":%" PRIu64
               ",\"ssd_capacity\":%" PRIu64 ",\"ssd_used\":%" PRIu64
               ",\"dram_blocks\":%" PRIu64 ",\"ssd_blocks\":%" PRIu64 ",\"keys\":%" PRIu64 "}}\n",
               n, owners, n - owners, tot.dram_capacity, tot.dram_used, tot.ssd_capacity,
               tot.ssd_used, tot.dram_blocks, tot.ssd_blocks, tot.keys);
    } else {
        printf("view %" PRIu64 " at %s: %zu member%s (%zu owner%s, %zu client%s)\n", version,
               master, n, n == 1 ? "" : "s", owners, owners == 1 ? "" : "s", n - owners,
               n - owners == 1 ? "" : "s");
        const char *fmt = "%-22s %-21s %-6s %21s %21s %17s %8s %7s %s\n";
        printf(fmt, "id", "address", "role", "dram used/capacity", "ssd used/capacity",
               "blocks dram/ssd", "keys", "beat", "version");
        char du[16], dc[16], su[16], sc[16], d[48], sd[48], b[40], k[24], age[24];
        for (size_t i = 0; i <= n; i++) {
            const kv_member_info *r = i < n ? &m[i] : &tot;
            snprintf(d, sizeof d, "%s / %s", kvctl_fmt_size(r->dram_used, du, sizeof du),
                     kvctl_fmt_size(r->dram_capacity, dc, sizeof dc));
            snprintf(sd, sizeof sd, "%s / %s", kvctl_fmt_size(r->ssd_used, su, sizeof su),
                     kvctl_fmt_size(r->ssd_capacity, sc, sizeof sc));
            snprintf(b, sizeof b, "%" PRIu64 " / %" PRIu64, r->dram_blocks, r->ssd_blocks);
            snprintf(k, sizeof k, "%" PRIu64, r->keys);
            if (i == n)
                snprintf(age, sizeof age, "-");
            else if (r->heartbeat_age_ms < 0)
                snprintf(age, sizeof age, "?");
            else
                snprintf(age, sizeof age, "%.1fs", (double)r->heartbeat_age_ms / 1000);
            printf(fmt, i < n ? r->id : "total", i < n ? (r->addr[0] ? r->addr : "-") : "",
                   i < n ? (r->owner ? "owner" : "client") : "", d, sd, b, k, age,
                   i < n && r->version[0] ? r->version : i < n ? "?" : "");
        }
    }
    free(m);
    return KVCTL_EXIT_OK;
}

/* ---- lookup ------------------------------------------------------------------------------ */

static int lookup_run(struct actx *x)
{
    if (x->o.json)
        printf("{\"results\":[");
    bool miss = false, failed = false;
    for (int i = 0; i < x->nnames; i++) {
        const struct name *n = &x->names[i];
        int hit = 0;
        if (n->block) {
            uint8_t h = 0;
            int err = kv_lookup(x->e, &n->id, 1, &h);
            hit = err == KV_OK ? h : err;
        } else {
            hit = kv_exists(x->e, n->key, n->klen);
        }
        if (hit < 0) {
            fprintf(stderr, "kvctl lookup: %s: %s\n", x->args[i], kv_strerror(hit));
            failed = true;
        }
        miss |= hit == 0;
        if (x->o.json) {
            printf("%s{\"name\":", i ? "," : "");
            kvctl_jstr(stdout, x->args[i]);
            printf(",\"kind\":\"%s\",\"hit\":%s}", n->block ? "block" : "key",
                   hit > 0 ? "true" : "false");
        } else {
            printf("%s\t%s\t%s\n", x->args[i], n->block ? "block" : "key",
                   hit > 0 ? "hit" : hit == 0 ? "miss" : "error");
        }
    }
    if (x->o.json)
        printf("]}\n");
    return failed ? KVCTL_EXIT_FAIL : miss ? KVCTL_EXIT_NOTFOUND : KVCTL_EXIT_OK;
}

/* ---- put / get / rm ------------------------------------------------------------------------ */

/* Reads a whole file ('-' or NULL: stdin) into a malloc'd buffer. */
static int slurp(const char *path, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    FILE *f = !path || strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kvctl put: %s: %s\n", path, strerror(errno));
        return KVCTL_EXIT_FAIL;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    int rc = buf ? KVCTL_EXIT_OK : KVCTL_EXIT_FAIL;
    while (rc == KVCTL_EXIT_OK) {
        if (n == cap) {
            uint8_t *nb = cap >= KV_VALUE_MAX ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                fprintf(stderr, "kvctl put: the value is too large (at most %zu bytes)\n",
                        (size_t)KV_VALUE_MAX);
                rc = KVCTL_EXIT_FAIL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                fprintf(stderr, "kvctl put: reading %s: %s\n", path ? path : "stdin",
                        strerror(errno));
                rc = KVCTL_EXIT_FAIL;
            }
            break;
        }
    }
    if (f != stdin)
        fclose(f);
    if (rc != KVCTL_EXIT_OK || n > KV_VALUE_MAX) {
        free(buf);
        return KVCTL_EXIT_FAIL;
    }
    *out = buf;
    *len = n;
    return KVCTL_EXIT_OK;
}

/* The value is read before the store opens: a file that cannot be read
 * creates no store. */
static int put_prep(struct actx *x)
{
    uint8_t *val = NULL;
    int rc = slurp(x->nargs == 2 ? x->args[1] : NULL, &val, &x->buflen);
    x->buf = val;
    return rc == KVCTL_EXIT_OK ? -1 : rc;
}

static int put_run(struct actx *x)
{
    const struct name *n = &x->names[0];
    int err;
    if (n->block) {
        kv_iov iov = { x->buf, x->buflen };
        kv_shard s = { .block = n->id, .index = (uint32_t)x->o.index, .iov = &iov, .iovcnt = 1 };
        kv_task t = 0;
        err = kv_dump(x->e, &s, 1, &t);
        if (err == KV_OK)
            err = kv_wait(x->e, t, 0);
    } else {
        err = kv_put(x->e, n->key, n->klen, x->buf, x->buflen);
    }
    if (err != KV_OK) {
        fprintf(stderr, "kvctl put: %s: %s\n", x->args[0], kv_strerror(err));
        return KVCTL_EXIT_FAIL;
    }
    return KVCTL_EXIT_OK;
}

/* Writes the value to path (stdout without one). A write that fails (a full
 * disk, most often) says why, and the partial file is removed: a file that
 * exists after `get -o` holds the whole value. */
static int write_out(const char *path, const void *p, size_t len)
{
    FILE *f = path ? fopen(path, "wb") : stdout;
    if (!f) {
        fprintf(stderr, "kvctl get: %s: %s\n", path, strerror(errno));
        return KVCTL_EXIT_FAIL;
    }
    /* Only a regular file is synced, and only a regular file removed
     * (never a device such as /dev/full). */
    struct stat st;
    bool regular = f != stdout && fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
    errno = 0;
    bool ok = fwrite(p, 1, len, f) == len;
    int e = errno;
    if (f == stdout) {
        ok &= fflush(f) == 0;
    } else {
        ok &= fflush(f) == 0 && (!regular || fsync(fileno(f)) == 0);
        if (!ok && !e)
            e = errno;
        ok &= fclose(f) == 0;
    }
    if (!e)
        e = errno;
    if (!ok) {
        fprintf(stderr, "kvctl get: writing %s failed: %s%s\n", path ? path : "stdout",
                e ? strerror(e) : "short write", regular ? "; the partial file was removed" : "");
        if (regular)
            unlink(path);
        return KVCTL_EXIT_FAIL;
    }
    return KVCTL_EXIT_OK;
}

static int get_run(struct actx *x)
{
    const struct name *n = &x->names[0];
    uint8_t *buf = NULL;
    size_t vlen = 0;
    int err, rc = KVCTL_EXIT_OK;
    if (n->block) {
        uint64_t len = 0;
        err = kv_shard_size(x->e, &n->id, (uint32_t)x->o.index, &len);
        if (err == KV_OK && !(buf = malloc(len ? len : 1)))
            err = KV_ENOMEM;
        if (err == KV_OK) {
            kv_iov iov = { buf, len };
            kv_shard s = { .block = n->id, .index = (uint32_t)x->o.index, .iov = &iov,
                           .iovcnt = 1 };
            kv_task t = 0;
            err = kv_load(x->e, &s, 1, &t);
            if (err == KV_OK)
                err = kv_wait(x->e, t, 0);
            vlen = len;
        }
    } else {
        err = kv_get(x->e, n->key, n->klen, NULL, 0, &vlen);
        if (err == KV_ENOBUFS || (err == KV_OK && vlen == 0)) {
            buf = malloc(vlen ? vlen : 1);
            err = buf ? kv_get(x->e, n->key, n->klen, buf, vlen, &vlen) : KV_ENOMEM;
        }
    }
    if (err == KV_OK)
        rc = write_out(x->o.output, buf, vlen);
    else if (err == KV_ENOTFOUND)
        fprintf(stderr, "kvctl get: %s: not found\n", x->args[0]);
    else
        fprintf(stderr, "kvctl get: %s: %s\n", x->args[0], kv_strerror(err));
    free(buf);
    if (err == KV_ENOTFOUND)
        return KVCTL_EXIT_NOTFOUND;
    return err == KV_OK ? rc : KVCTL_EXIT_FAIL;
}

static int rm_run(struct actx *x)
{
    bool missing = false, failed = false;
    for (int i = 0; i < x->nnames; i++) {
        const struct name *n = &x->names[i];
        int err = n->block ? kv_ssd_remove(x->e, &n->id) : kv_remove(x->e, n->key, n->klen);
        if (err == KV_ENOTFOUND) {
            fprintf(stderr, "kvctl rm: %s: not found\n", x->args[i]);
            missing = true;
        } else if (err != KV_OK) {
            fprintf(stderr, "kvctl rm: %s: %s\n", x->args[i],
                    err == KV_ENOTSUP ? "blocks are removed from the SSD tier; this store has none"
                                      : kv_strerror(err));
            failed = true;
        }
    }
    return failed ? KVCTL_EXIT_FAIL : missing ? KVCTL_EXIT_NOTFOUND : KVCTL_EXIT_OK;
}

/* ---- ssd ------------------------------------------------------------------------------------ */

struct walk {
    bool json;
    uint64_t n, bad;
    struct kvctl_progress prog;
    bool prog_started;
};

static void print_entry(struct walk *w, const kv_ssd_entry *ent, bool with_status)
{
    char hex[2 * KV_BLOCK_ID_LEN + 1];
    fmt_id(&ent->id, hex);
    const char *kind = ent->ns == KV_SSD_NS_KEY ? "key" : "block";
    if (w->json) {
        printf("%s{\"kind\":\"%s\",\"id\":\"%s\",\"index\":%u,\"size\":%" PRIu64, w->n ? "," : "",
               kind, hex, ent->index, ent->size);
        if (with_status)
            printf(",\"status\":\"%s\"", ent->status == KV_OK ? "ok" : kv_err_name(ent->status));
        printf("}");
    } else if (with_status) {
        printf("bad\t%s\t%s\t%u\t%" PRIu64 "\t%s\n", kind, hex, ent->index, ent->size,
               kv_strerror(ent->status));
    } else {
        printf("%s\t%s\t%u\t%" PRIu64 "\n", kind, hex, ent->index, ent->size);
    }
    w->n++;
}

static int ls_cb(void *ctx, const kv_ssd_entry *ent)
{
    print_entry(ctx, ent, false);
    return 0;
}

static int scrub_cb(void *ctx, const kv_ssd_entry *ent)
{
    struct walk *w = ctx;
    if (!w->prog_started) {
        kvctl_progress_start(&w->prog, "scrub", ent->total, 0, 0);
        w->prog.unit = "values";
        w->prog_started = true;
    }
    if (ent->status != KV_OK) {
        /* A bad line must not land inside the progress line: clear it, and
         * go on counting from the same start. */
        if (w->prog.on && w->prog.last != w->prog.t0)
            fputs("\r\033[K", stderr);
        print_entry(w, ent, true);
        fflush(stdout);
    }
    kvctl_progress_tick(&w->prog, ent->seq + 1);
    return 0;
}

struct ticker {
    pthread_t th;
    atomic_bool stop;
    struct kvctl_progress prog;
};

/* Compaction says nothing about its progress: show the time it has taken. */
static void *tick_main(void *arg)
{
    struct ticker *t = arg;
    uint64_t t0 = kvctl_now_ns();
    while (!atomic_load(&t->stop)) {
        if (t->prog.on) {
            fprintf(stderr, "\r[compact] running %.1f s\033[K", (double)(kvctl_now_ns() - t0) / 1e9);
            fflush(stderr);
        }
        usleep(200000);
    }
    if (t->prog.on)
        fputs("\r\033[K", stderr);
    return NULL;
}

/* The subcommand decides what is opened: ssd recover works on the files,
 * with no engine open (the rebuild is what an open does once RocksDB's
 * files are set aside); the others open the store. */
static int ssd_prep(struct actx *x)
{
    const char *sub = x->args[0];
    if (strcmp(sub, "ls") != 0 && strcmp(sub, "scrub") != 0 && strcmp(sub, "compact") != 0 &&
        strcmp(sub, "recover") != 0) {
        fprintf(stderr, "kvctl ssd: unknown subcommand '%s' (ls, scrub, compact or recover)\n", sub);
        return KVCTL_EXIT_USAGE;
    }
    if (x->o.repair && strcmp(sub, "scrub") != 0) {
        fprintf(stderr, "kvctl ssd %s: --repair applies to scrub only\n", sub);
        return KVCTL_EXIT_USAGE;
    }
    if (strcmp(sub, "recover") == 0)
        x->need = NEED_CONFIG;
    return -1;
}

static int ssd_recover(struct actx *x)
{
    char err[512] = "", path[1024] = "";
    kv_config_get(x->cfg, "ssd.path", path, sizeof path);
    uint64_t n = 0, t0 = kvctl_now_ns();
    int e = kv_ssd_recover(x->cfg, &n, err, sizeof err);
    double secs = (double)(kvctl_now_ns() - t0) / 1e9;
    if (e != KV_OK) {
        fprintf(stderr, "kvctl ssd recover: %s: %s\n", kv_strerror(e), err[0] ? err : path);
        return e == KV_ENOTSUP ? KVCTL_EXIT_USAGE : KVCTL_EXIT_FAIL;
    }
    if (x->o.json)
        printf("{\"recovered\":%" PRIu64 ",\"seconds\":%.3f}\n", n, secs);
    else
        fprintf(stderr, "recover: %" PRIu64 " values indexed from the value log of %s in %.2f s; "
                "RocksDB's old files are in %s/damaged-*\n", n, path, secs, path);
    return KVCTL_EXIT_OK;
}

static int ssd_run(struct actx *x)
{
    const char *sub = x->args[0];
    if (strcmp(sub, "recover") == 0)
        return ssd_recover(x);
    struct walk w = { .json = x->o.json };
    int err;
    uint64_t checked = 0, bad = 0;
    uint64_t t0 = kvctl_now_ns();
    if (strcmp(sub, "ls") == 0) {
        if (x->o.json)
            printf("{\"entries\":[");
        err = kv_ssd_scan(x->e, ls_cb, &w);
        if (x->o.json)
            printf("],\"count\":%" PRIu64 "}\n", w.n);
    } else if (strcmp(sub, "scrub") == 0) {
        if (x->o.json)
            printf("{\"bad\":[");
        err = kv_ssd_scrub(x->e, x->o.repair, scrub_cb, &w, &checked, &bad);
        if (w.prog_started)
            kvctl_progress_end(&w.prog);
        double secs = (double)(kvctl_now_ns() - t0) / 1e9;
        if (x->o.json)
            printf("],\"checked\":%" PRIu64 ",\"bad_count\":%" PRIu64 ",\"repaired\":%s,"
                   "\"seconds\":%.3f}\n", checked, bad, x->o.repair && bad ? "true" : "false",
                   secs);
        else
            fprintf(stderr, "scrub: %" PRIu64 " values checked, %" PRIu64 " bad%s, %.2f s\n",
                    checked, bad,
                    bad ? (x->o.repair ? " (deleted)" : " (kept; --repair deletes them)") : "",
                    secs);
    } else {
        struct ticker t = { 0 };
        kvctl_progress_start(&t.prog, "compact", 0, 0, 0);
        bool threaded = t.prog.on && pthread_create(&t.th, NULL, tick_main, &t) == 0;
        err = kv_ssd_compact(x->e);
        atomic_store(&t.stop, true);
        if (threaded)
            pthread_join(t.th, NULL);
        double secs = (double)(kvctl_now_ns() - t0) / 1e9;
        if (x->o.json)
            printf("{\"compacted\":%s,\"seconds\":%.3f}\n", err == KV_OK ? "true" : "false", secs);
        else if (err == KV_OK)
            fprintf(stderr, "compact: done in %.2f s\n", secs);
    }
    if (err == KV_ENOTSUP) {
        fprintf(stderr, "kvctl ssd %s: the store has no SSD tier (pipeline dram)\n", sub);
        return KVCTL_EXIT_USAGE;
    }
    if (err != KV_OK) {
        fprintf(stderr, "kvctl ssd %s: %s\n", sub, kv_strerror(err));
        return KVCTL_EXIT_FAIL;
    }
    return bad ? KVCTL_EXIT_FAIL : KVCTL_EXIT_OK;
}

/* ---- the table and the driver ------------------------------------------------ */

#define ALL INT_MAX

static const struct admin admins[] = {
    { "stats",
      "usage: kvctl [--config FILE] [--set KEY=VALUE]... stats [--json] [--prometheus]\n"
      "       kvctl stats --node HOST:PORT [--json] [--timeout MS] [--health]\n"
      "\n"
      "Without --node: opens the store the config describes (offline: no running\n"
      "engine may hold it) and prints its figures: capacity, used bytes and blocks\n"
      "per tier, hits, misses, evictions, spills, checksum failures.\n"
      "With --node: fetches http://HOST:PORT/metrics from a running kvnode, kvmaster\n"
      "or engine (its metrics.listen) and prints its samples, sending metrics.token\n"
      "as a bearer token when the config sets one. With --health: asks /health\n"
      "instead, prints its answer, and exits 0 when it is 200 (serving), 1 when\n"
      "not (503 and the reason: joining, a tier failed, the membership store\n"
      "unreachable) or when nothing answers.\n"
      "\n"
      "  -j, --json             one JSON object on stdout\n"
      "      --prometheus       the offline store's figures in the Prometheus text\n"
      "                         format, as /metrics would serve them\n"
      "  -n, --node HOST:PORT   a running process's metrics.listen address\n"
      "  -t, --timeout MS       how long to wait for the node (default: 3000)\n"
      "      --health           the node's /health instead of its /metrics\n",
      "jnptH", 0, 0, 0, NEED_STORE, stats_prep, stats_run },
    { "members",
      "usage: kvctl [--config FILE] [--set KEY=VALUE]... members [--json]\n"
      "\n"
      "Asks the kvmaster at cluster.master (with cluster.token), or etcd at\n"
      "cluster.etcd_endpoints when cluster.metadata is etcd, for the view and\n"
      "prints its version and members: id, address, role (owner or client), DRAM\n"
      "and SSD used and capacity, blocks per tier, plain keys, the age of its last\n"
      "heartbeat and its version, as each member's signed record carries them\n"
      "(refreshed every heartbeat); then the cluster's totals. Does not join the\n"
      "view.\n"
      "\n"
      "  -j, --json             one JSON object on stdout\n",
      "j", 0, 0, 0, NEED_CONFIG, NULL, members_run },
    { "lookup",
      "usage: kvctl [--config FILE] [--set KEY=VALUE]... lookup [--json] [--key|--block] ID|KEY...\n"
      "\n"
      "Says for each argument whether the store holds it: a block id (32 hex digits)\n"
      "hits when its shard 0 is in some tier; anything else is a plain key.\n"
      "Exit status 3 when any of them misses.\n"
      "\n"
      "  -k, --key              every argument is a plain key\n"
      "  -b, --block            every argument is a block id in hex\n"
      "  -j, --json             one JSON object on stdout\n",
      "jkb", 1, 1 << 20, ALL, NEED_STORE, NULL, lookup_run },
    { "put",
      "usage: kvctl [--config FILE] [--set KEY=VALUE]... put [--key|--block] [--index N] ID|KEY [FILE]\n"
      "\n"
      "Stores FILE's bytes (standard input when FILE is absent or '-') under a plain\n"
      "key, or as shard N of a block id given in hex. A shard already present is\n"
      "left as it is (the store never rewrites a shard); a plain key is replaced.\n"
      "Creates the store when it does not exist.\n"
      "\n"
      "  -k, --key              the name is a plain key\n"
      "  -b, --block            the name is a block id in hex\n"
      "  -i, --index N          the shard index of a block (default: 0)\n",
      "kbi", 1, 2, 1, NEED_NEW_STORE, put_prep, put_run },
    { "get",
      "usage: kvctl [--config FILE] [--set KEY=VALUE]... get [--key|--block] [--index N] [-o FILE] ID|KEY\n"
      "\n"
      "Writes the value of a plain key, or of shard N of a block, to standard output\n"
      "or FILE. Exit status 3 when it is absent.\n"
      "\n"
      "  -o, --output FILE      write the value to FILE instead of standard output\n"
      "  -k, --key, -b, --block, -i, --index N   as for put\n",
      "kbio", 1, 1, 1, NEED_STORE, NULL, get_run },
    { "rm",
      "usage: kvctl [--config FILE] [--set KEY=VALUE]... rm [--key|--block] ID|KEY...\n"
      "\n"
      "Removes plain keys, or every shard of blocks from the SSD tier. Exit status 3\n"
      "when any of them was absent (the others are still removed).\n"
      "\n"
      "  -k, --key, -b, --block  as for put\n",
      "kb", 1, 1 << 20, ALL, NEED_STORE, NULL, rm_run },
    { "ssd",
      "usage: kvctl [--config FILE] [--set KEY=VALUE]... ssd ls [--json]\n"
      "       kvctl ... ssd scrub [--repair] [--json]\n"
      "       kvctl ... ssd compact\n"
      "       kvctl ... ssd recover [--json]\n"
      "\n"
      "The SSD tier of the store the config describes. ls, scrub and compact run\n"
      "in the process serving the store when one does (a kvnode, or an engine\n"
      "that shares it: kvctl attaches as any opener does); recover is offline.\n"
      "  ls       list every value: kind (block or key), id in hex (a plain key's is\n"
      "           the hash of its name), shard index, size; from the index, no I/O\n"
      "  scrub    read every value and verify its checksum; lists the bad ones and\n"
      "           exits 1 when there are any\n"
      "  compact  compact the value log files left mostly dead (small values'\n"
      "           space) and the RocksDB index: gives deleted values' space back\n"
      "  recover  rebuild the index from the value log: RocksDB's files are moved\n"
      "           to ssd.path/damaged-TIME/ and every intact value re-indexed (the\n"
      "           store must not be open: refused, naming the pid serving it; an\n"
      "           open does this itself when RocksDB's files are missing or cannot\n"
      "           be opened)\n"
      "\n"
      "  -r, --repair           scrub: delete the bad values (a load would too)\n"
      "  -j, --json             one JSON object on stdout\n",
      "jr", 1, 1, 0, NEED_STORE, ssd_prep, ssd_run },
};

/* argv[0] names the command (main() found it in kvctl.c's table, which
 * names this function for every command here). */
int kvctl_admin_main(struct kvctl_common *c, int argc, char **argv)
{
    const struct admin *a = NULL;
    for (size_t i = 0; i < sizeof admins / sizeof admins[0] && !a; i++)
        if (strcmp(admins[i].name, argv[0]) == 0)
            a = &admins[i];
    if (!a)
        return KVCTL_EXIT_USAGE;
    struct actx x = { .cmd = a->name, .c = c, .need = a->need };
    int rc = parse(c, argc, argv, a, &x.o);
    if (rc >= 0)
        return rc;
    x.args = argv + optind;
    x.nargs = argc - optind;
    if ((rc = want_args(a->name, x.nargs, a->min_args, a->max_args)) >= 0)
        return rc;
    x.nnames = x.nargs < a->names ? x.nargs : a->names;
    if (x.nnames > 0 && !(x.names = calloc((size_t)x.nnames, sizeof *x.names)))
        return KVCTL_EXIT_FAIL;
    for (int i = 0; i < x.nnames; i++)
        if ((rc = parse_name(a->name, &x.o, x.args[i], &x.names[i])) >= 0)
            goto out;
    if (a->prep && (rc = a->prep(&x)) >= 0)
        goto out;
    if (x.need == NEED_CONFIG)
        rc = kvctl_build_config(c, &x.cfg);
    else if (x.need != NEED_NOTHING)
        rc = open_store(c, a->name, x.need == NEED_NEW_STORE, &x.e);
    else
        rc = KVCTL_EXIT_OK;
    if (rc == KVCTL_EXIT_OK)
        rc = a->run(&x);
out:
    if (x.e)
        kv_close(x.e);
    kv_config_free(x.cfg);
    free(x.names);
    free(x.buf);
    return rc;
}
