/*
 * config.c — the engine's configuration: defaults, YAML, dotted keys, dump.
 *
 * Key design choice: one table, keys[] below, lists every key exactly once
 * (dotted name, type, field, range, default, doc line), and every entry
 * point goes through it: the defaults, the YAML walker, kv_config_set,
 * kv_config_get, kv_config_dump and validation. A key therefore cannot be
 * parsed one way and printed another, and adding one is one line.
 *
 * Values are taken as text and converted by the table's type, never by
 * YAML's own type resolution (YAML 1.1 would turn `on` or `0x10` into
 * surprises). libyaml's event API is used rather than its document API so
 * that aliases can be refused, duplicate keys caught, and every error
 * carry the line it is about.
 *
 * Numbers are parsed and printed in the "C" locale whatever the host
 * program set: an inference server that called setlocale() must not turn
 * "0.9" into a syntax error.
 */
#include <ctype.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <yaml.h>

#include "internal.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

/* The index packs segment offsets into 32 bits of 64-byte units. */
#define DRAM_CAPACITY_MAX (256 * GiB)
/* Durations fit 32 bits of milliseconds (49.7 days), so engine code may add
 * them to clocks and hand them to waits without thinking about overflow. */
#define DURATION_MAX_MS UINT32_MAX
/* A config file is small; this only stops a mistaken path from being read
 * into memory whole. */
#define FILE_MAX (4 * MiB)

/* ---- the schema ---------------------------------------------------------- */

enum type {
    T_SECTION,   /* a mapping of the keys named "<section>.*" */
    T_ENUM,      /* int, one of names[] */
    T_SIZE,      /* uint64_t bytes, at most max */
    T_MS,        /* uint64_t milliseconds, at most max */
    T_U32,       /* uint32_t in min..max */
    T_RATIO,     /* double in (0,1) or, when closed, (0,1] */
    T_BOOL,      /* bool */
    T_STR,       /* char[KV_CFG_STR] */
    T_ADDR,      /* char[KV_CFG_STR] holding host:port ("" when empty_ok) */
};

struct name {
    const char *name;
    int value;
};

struct key {
    const char *name;           /* dotted, as in YAML and kv_config_set */
    enum type type;
    size_t off;                 /* of the field in struct kv_config */
    uint64_t min, max;          /* T_U32, T_SIZE, T_MS: inclusive */
    bool closed;                /* T_RATIO: 1 is allowed */
    bool empty_ok;              /* T_ADDR: "" means off */
    bool any_port;              /* T_ADDR: port 0 (the kernel picks one) is fine */
    bool list;                  /* T_ADDR: one or more host:port, comma-separated */
    const char *(*check)(const char *s);   /* T_STR: a further rule (why, or NULL) */
    const struct name *names;   /* T_ENUM: the first name of a value is its own */
    const char *def;            /* the default, as text */
    const char *doc;
};

/* The offset of field f, which must have type T: a table line that names
 * the wrong field type fails to compile instead of corrupting a neighbour. */
#define FIELD(f, T)                                                           \
    (offsetof(struct kv_config, f) +                                          \
     0 * sizeof(char[__builtin_types_compatible_p(                            \
                         __typeof__(((struct kv_config *)0)->f), T) ? 1 : -1]))

#define SECTION(n, d)        { .name = n, .type = T_SECTION, .doc = d }
#define ENUM(n, f, l, v, d)  { .name = n, .type = T_ENUM, .off = FIELD(f, int), .names = l, .def = v, .doc = d }
#define SIZE(n, f, mx, v, d) { .name = n, .type = T_SIZE, .off = FIELD(f, uint64_t), .max = mx, .def = v, .doc = d }
#define MS(n, f, v, d)       { .name = n, .type = T_MS, .off = FIELD(f, uint64_t), .max = DURATION_MAX_MS, .def = v, .doc = d }
#define U32(n, f, lo, hi, v, d) { .name = n, .type = T_U32, .off = FIELD(f, uint32_t), .min = lo, .max = hi, .def = v, .doc = d }
#define RATIO(n, f, c, v, d) { .name = n, .type = T_RATIO, .off = FIELD(f, double), .closed = c, .def = v, .doc = d }
#define BOOL(n, f, v, d)     { .name = n, .type = T_BOOL, .off = FIELD(f, bool), .def = v, .doc = d }
#define STR(n, f, v, d)      { .name = n, .type = T_STR, .off = FIELD(f, char[KV_CFG_STR]), .def = v, .doc = d }
#define ADDR(n, f, e, v, d)  { .name = n, .type = T_ADDR, .off = FIELD(f, char[KV_CFG_STR]), .empty_ok = e, .def = v, .doc = d }
/* An address to listen on: port 0 asks the kernel for a free port. */
#define ADDRS(n, f, v, d)    { .name = n, .type = T_ADDR, .off = FIELD(f, char[KV_CFG_STR]), .list = true, .def = v, .doc = d }
#define STRC(n, f, c, v, d)  { .name = n, .type = T_STR, .off = FIELD(f, char[KV_CFG_STR]), .check = c, .def = v, .doc = d }
#define LISTEN(n, f, e, v, d) { .name = n, .type = T_ADDR, .off = FIELD(f, char[KV_CFG_STR]), .empty_ok = e, .any_port = true, .def = v, .doc = d }

static const struct name pipelines[] = {
    { "dram|ssd", KV_PIPE_DRAM_SSD }, { "dram", KV_PIPE_DRAM }, { "ssd", KV_PIPE_SSD }, { 0 },
};
static const struct name hugepages[] = {
    { "auto", KV_HUGE_AUTO }, { "on", KV_HUGE_ON }, { "off", KV_HUGE_OFF },
    { "true", KV_HUGE_ON }, { "false", KV_HUGE_OFF }, { 0 },
};
static const struct name compressions[] = { { "none", KV_COMP_NONE }, { "lz4", KV_COMP_LZ4 }, { 0 } };
static const struct name syncs[] = {
    { "none", KV_SYNC_NONE }, { "wal", KV_SYNC_WAL }, { "fsync", KV_SYNC_FSYNC }, { 0 },
};
static const struct name protocols[] = {
    { "auto", KV_PROTO_AUTO }, { "tcp", KV_PROTO_TCP }, { "rdma", KV_PROTO_RDMA }, { 0 },
};
static const struct name metadatas[] = { { "kvmaster", KV_META_KVMASTER }, { "etcd", KV_META_ETCD }, { 0 } };

/* An etcd key prefix: absolute, no trailing '/' (members live under
 * PREFIX/members/), nothing a shell or a URL would mangle. */
static const char *check_prefix(const char *s)
{
    if (s[0] != '/' || !s[1])
        return "must start with '/' and name something, e.g. /kvengine/default";
    if (s[strlen(s) - 1] == '/')
        return "must not end with '/'";
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("/-_.", *p))
            return "may hold letters, digits and / - _ . only";
    return NULL;
}

/* store.name: a name processes agree on, which becomes part of a file name. */
static const char *check_store_name(const char *s)
{
    if (strlen(s) > 64)
        return "must be at most 64 bytes";
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("-_.", *p))
            return "may hold letters, digits and - _ . only";
    if (s[0] == '.')
        return "must not start with '.'";
    return NULL;
}

/* ssd.group: a group name as useradd takes one, or a numeric gid; whether
 * it exists and the user is a member is checked at open (persist/modes.c). */
static const char *check_group(const char *s)
{
    if (strlen(s) > 32)
        return "must be at most 32 bytes";
    if (s[0] == '-')
        return "must not start with '-'";
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("-_.", *p) && !(*p == '$' && !p[1]))
            return "may hold letters, digits and - _ . only (a group name or a gid)";
    return NULL;
}

static const struct name levels[] = {
    { "error", KV_LOG_ERROR }, { "warn", KV_LOG_WARN }, { "info", KV_LOG_INFO },
    { "debug", KV_LOG_DEBUG }, { "warning", KV_LOG_WARN }, { 0 },
};

/* Sections come before their keys; kv_config_dump writes them in this order. */
static const struct key keys[] = {
    ENUM("pipeline", pipeline, pipelines, "dram|ssd",
         "which tiers hold blocks: dram, dram|ssd (evictions spill to SSD) or ssd"),

    SECTION("dram", "the DRAM tier: one segment, indexed by a sharded hash table"),
    SIZE("dram.capacity", dram.capacity, DRAM_CAPACITY_MAX, "4GiB",
         "bytes of the DRAM segment, at most 256GiB; 0 = pure cluster client"),
    U32("dram.shards", dram.shards, 1, 4096, "64", "index shards, each with its own lock, 1..4096"),
    ENUM("dram.hugepages", dram.hugepages, hugepages, "auto",
         "back the segment with huge pages: auto (when available), on (required) or off"),

    SECTION("eviction", "when and how much the DRAM tier evicts"),
    RATIO("eviction.high_watermark_ratio", eviction.high_watermark_ratio, true, "0.9",
          "evict when used bytes pass this share of dram.capacity, in (0,1]"),
    RATIO("eviction.ratio", eviction.ratio, false, "0.1",
          "share of dram.capacity freed per eviction, in (0,1)"),
    MS("eviction.lease_ttl_ms", eviction.lease_ttl_ms, "60000",
       "how long a lookup hit protects a block from eviction (ms)"),

    SECTION("ssd", "the SSD tier, on RocksDB"),
    STR("ssd.path", ssd.path, "./kvdata", "directory of the RocksDB database"),
    SIZE("ssd.capacity", ssd.capacity, UINT64_MAX, "64GiB", "bytes the SSD tier may hold"),
    ENUM("ssd.compression", ssd.compression, compressions, "lz4", "value compression: none or lz4"),
    BOOL("ssd.write_through", ssd.write_through, "false",
         "also persist every dump at once, not only evicted blocks"),
    RATIO("ssd.gc_trigger_ratio", ssd.gc_trigger_ratio, true, "0.9",
          "collect when the tier passes this share of ssd.capacity, in (0,1]"),
    RATIO("ssd.gc_ratio", ssd.gc_ratio, false, "0.1",
          "share of ssd.capacity deleted per collection, coldest first, in (0,1)"),
    ENUM("ssd.sync", ssd.sync, syncs, "none",
         "durability of writes: none, wal (synced every second) or fsync (sync every write)"),
    BOOL("ssd.promote", ssd.promote, "true", "copy blocks loaded from SSD back into DRAM"),
    SIZE("ssd.spill_queue", ssd.spill_queue, UINT64_MAX, "256MiB",
         "bytes of evicted blocks that may wait to be written to SSD"),
    STRC("ssd.group", ssd.group, check_group, "",
         "group (name or gid) that may read the store: ssd.path's directories become 2750 and its "
         "files 0640 in that group; empty = 0700 and 0600, the owner only"),

    SECTION("io", "worker threads that run dump and load tasks"),
    U32("io.threads", io.threads, 1, 256, "4", "worker threads, 1..256"),
    MS("io.timeout_ms", io.timeout_ms, "0", "default task timeout (ms); 0 = none"),

    SECTION("cluster", "pooling DRAM across nodes"),
    BOOL("cluster.enabled", cluster.enabled, "false", "join a cluster"),
    ADDR("cluster.master", cluster.master, false, "127.0.0.1:50088", "kvmaster's host:port"),
    LISTEN("cluster.listen", cluster.listen, false, "0.0.0.0:50071",
           "host:port this node serves its DRAM on (port 0: any free port)"),
    ENUM("cluster.protocol", cluster.protocol, protocols, "auto",
         "transport: auto (rdma when a device is present, else tcp), tcp or rdma"),
    STR("cluster.device_name", cluster.device_name, "",
        "RDMA device to use, e.g. mlx5_0; empty = the first one"),
    U32("cluster.replica_num", cluster.replica_num, 1, 16, "1", "copies of each block, 1..16"),
    MS("cluster.node_ttl_ms", cluster.node_ttl_ms, "10000",
       "a node silent this long leaves the view (ms)"),
    STR("cluster.token", cluster.token, "", "shared secret members present; empty = none"),
    BOOL("cluster.insecure", cluster.insecure, "false",
         "allow serving beyond loopback (cluster.listen, cluster.master) with an empty token"),
    ENUM("cluster.metadata", cluster.metadata, metadatas, "kvmaster",
         "where membership lives: kvmaster (cluster.master) or etcd (cluster.etcd_endpoints)"),
    ADDRS("cluster.etcd_endpoints", cluster.etcd_endpoints, "127.0.0.1:2379",
          "etcd's client endpoints, host:port[,host:port...] (cluster.metadata: etcd)"),
    STRC("cluster.etcd_prefix", cluster.etcd_prefix, check_prefix, "/kvengine/default",
         "etcd key prefix of this cluster's member records; one per cluster"),
    STR("cluster.etcd_user", cluster.etcd_user, "", "etcd user name; empty = no authentication"),
    STR("cluster.etcd_password", cluster.etcd_password, "", "password of cluster.etcd_user"),
    U32("cluster.rereplicate_mib_s", cluster.rereplicate_mib_s, 0, 100000, "64",
        "MiB/s a node may spend copying blocks to their new owners after a view change; 0 = off"),
    STR("cluster.token_file", cluster.token_file, "",
        "file holding cluster.token (mode 0600 or 0400, ours), read at open; else KVENGINE_TOKEN "
        "or KV_TOKEN from the environment when cluster.token is empty"),
    STR("cluster.etcd_cacert", cluster.etcd_cacert, "",
        "CA certificates (PEM) to verify etcd by; set: etcd is spoken to over https"),
    STR("cluster.etcd_cert", cluster.etcd_cert, "", "client certificate (PEM) for etcd over https"),
    STR("cluster.etcd_key", cluster.etcd_key, "", "private key (PEM) of cluster.etcd_cert"),

    SECTION("store", "one store per host: processes that name the same store share it"),
    STRC("store.name", store.name, check_store_name, "",
         "processes of one user on one host that open the same name (or, with an SSD tier, the "
         "same ssd.path) share one store; empty = share by ssd.path only"),
    U32("store.block_shards", store.block_shards, 1, 65536, "1",
        "shards of a complete block: lookup hits a block only once shards 0..N-1 are all "
        "stored (UCM's block_size / shard_size)"),
    STR("store.dir", store.dir, "",
        "the rendezvous directory of shared stores (<id>.lock, <id>.sock), created 0700; "
        "empty = $XDG_RUNTIME_DIR/kvengine, else /tmp/kvengine-<euid>"),
    BOOL("store.direct_reads", store.direct_reads, "true",
         "an attached process loads the shards its store holds in DRAM straight from the shared "
         "segment, with no round trip (checked against the segment's directory); false = each "
         "load asks the serving process, which pins them while they are copied"),

    SECTION("metrics", "the HTTP endpoint for /metrics and /health"),
    LISTEN("metrics.listen", metrics.listen, true, "",
           "host:port to serve on, e.g. 127.0.0.1:9300; empty = off"),
    STR("metrics.token", metrics.token, "",
        "bearer token /metrics asks for (Authorization: Bearer TOKEN); empty = none"),
    BOOL("metrics.insecure", metrics.insecure, "false",
         "allow metrics.listen beyond loopback with an empty metrics.token"),

    SECTION("log", "logging to stderr"),
    ENUM("log.level", log.level, levels, "info",
         "error, warn, info or debug; KV_LOG_LEVEL in the environment overrides it"),
};

#define NKEYS KV__ARRAY_LEN(keys)

#define AT(cfg, k, T)  ((T *)((char *)(cfg) + (k)->off))
#define CAT(cfg, k, T) ((const T *)((const char *)(cfg) + (k)->off))

static const struct key *find_key(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

/* ---- numbers in the "C" locale ------------------------------------------ */

static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static locale_t c_locale_obj;

static void make_c_locale(void)
{
    c_locale_obj = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

static locale_t c_locale(void)
{
    pthread_once(&c_locale_once, make_c_locale);
    return c_locale_obj;   /* (locale_t)0 if newlocale failed: the caller's */
}

/* The shortest %g text that reads back as exactly v. */
static int format_double(double v, char *buf, size_t cap)
{
    locale_t c = c_locale(), old = c ? uselocale(c) : (locale_t)0;
    int n = 0;
    for (int prec = 6; prec <= 17; prec++) {
        n = snprintf(buf, cap, "%.*g", prec, v);
        if ((size_t)n < cap && strtod(buf, NULL) == v)
            break;
    }
    if (old)
        uselocale(old);
    return n;
}

/* ---- sizes and durations ------------------------------------------------ */

struct unit {
    const char *name;   /* lower case */
    uint64_t mult;
};

/* KB/MB/GB/TB are binary too, as Mooncake reads global_segment_size: people
 * write "30GB" meaning what the allocator will call 30GiB. */
static const struct unit size_units[] = {
    { "", 1 }, { "b", 1 },
    { "k", KiB }, { "kb", KiB }, { "kib", KiB },
    { "m", MiB }, { "mb", MiB }, { "mib", MiB },
    { "g", GiB }, { "gb", GiB }, { "gib", GiB },
    { "t", TiB }, { "tb", TiB }, { "tib", TiB },
    { 0 },
};
static const struct unit ms_units[] = { { "", 1 }, { "ms", 1 }, { "s", 1000 }, { 0 } };
static const struct unit no_units[] = { { "", 1 }, { 0 } };

/*
 * Parses "<digits>[.<digits>][ ]<unit>" into a whole number of base units.
 * A fraction is fine when the result is whole ("1.5GiB", "1.5s"), refused
 * when it is not ("1.5" bytes). Returns NULL, or why the text is refused.
 */
static const char *parse_scaled(const char *s, const struct unit *units, const char *whole_of,
                                uint64_t *out)
{
    while (*s == ' ')
        s++;
    if (*s == '-')
        return "must not be negative";
    if (!isdigit((unsigned char)*s))
        return "not a number";

    uint64_t whole = 0, frac = 0, scale = 1;
    for (; isdigit((unsigned char)*s); s++)
        if (__builtin_mul_overflow(whole, 10, &whole) ||
            __builtin_add_overflow(whole, (uint64_t)(*s - '0'), &whole))
            return "too large";
    if (*s == '.') {
        s++;
        if (!isdigit((unsigned char)*s))
            return "not a number";
        for (; isdigit((unsigned char)*s); s++) {
            if (scale >= 1000000000000000000ull)
                return "too many decimal places";
            frac = frac * 10 + (uint64_t)(*s - '0');
            scale *= 10;
        }
    }
    while (*s == ' ')
        s++;
    size_t ulen = strlen(s);
    while (ulen > 0 && s[ulen - 1] == ' ')
        ulen--;

    const struct unit *u = units;
    while (u->name && !(strlen(u->name) == ulen && strncasecmp(u->name, s, ulen) == 0))
        u++;
    if (!u->name)
        return units == size_units
            ? "unknown unit (use B, KiB, MiB, GiB, TiB; KB, MB, GB, TB are the same)"
            : units == ms_units ? "unknown unit (use ms or s)" : "not a number";

    unsigned __int128 part = (unsigned __int128)frac * u->mult;
    if (part % scale != 0)
        return whole_of;
    unsigned __int128 total = (unsigned __int128)whole * u->mult + part / scale;
    if (total > UINT64_MAX)
        return "too large";
    *out = (uint64_t)total;
    return NULL;
}

int kv__parse_size(const char *s, uint64_t *out)
{
    if (!s || !out)
        return KV_EINVAL;
    return parse_scaled(s, size_units, "not a whole number of bytes", out) ? KV_ECONFIG : KV_OK;
}

KV__EXPORT int kv_parse_size(const char *text, uint64_t *bytes)
{
    return kv__parse_size(text, bytes) == KV_OK ? KV_OK : KV_EINVAL;
}

int kv__parse_duration_ms(const char *s, uint64_t *out)
{
    if (!s || !out)
        return KV_EINVAL;
    return parse_scaled(s, ms_units, "not a whole number of milliseconds", out) ? KV_ECONFIG : KV_OK;
}

int kv__format_size(uint64_t v, char *buf, size_t cap)
{
    static const struct unit big[] = { { "TiB", TiB }, { "GiB", GiB }, { "MiB", MiB }, { "KiB", KiB } };
    for (size_t i = 0; v != 0 && i < KV__ARRAY_LEN(big); i++)
        if (v % big[i].mult == 0)
            return snprintf(buf, cap, "%llu%s", (unsigned long long)(v / big[i].mult), big[i].name);
    return snprintf(buf, cap, "%llu", (unsigned long long)v);
}

const char *kv__pipeline_name(int pipeline)
{
    for (const struct name *n = pipelines; n->name; n++)
        if (n->value == pipeline)
            return n->name;
    return "invalid";
}

/* ---- one value: text to field ------------------------------------------- */

/* YAML can carry any Unicode text, but libyaml will not read back C0/C1
 * controls or broken UTF-8, and a path or token holding them is a mistake. */
static bool printable_utf8(const char *str)
{
    static const uint32_t least[] = { 0, 0x80, 0x800, 0x10000 };
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s++, n;
        uint32_t cp;
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f)
                return false;
            continue;
        }
        if (c >= 0xf0 && c <= 0xf4) { n = 3; cp = c & 0x07; }
        else if (c >= 0xe0 && c < 0xf0) { n = 2; cp = c & 0x0f; }
        else if (c >= 0xc0 && c < 0xe0) { n = 1; cp = c & 0x1f; }
        else return false;
        for (unsigned i = 0; i < n; i++, s++) {
            if ((*s & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (*s & 0x3f);
        }
        if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ||
            (cp >= 0x80 && cp <= 0x9f) || cp == 0xfffe || cp == 0xffff)
            return false;
    }
    return true;
}

/* host:port or [v6]:port, port 1..65535 (0..65535 with any_port).
 * Returns NULL or why not. */
static const char *check_addr(const char *s, bool any_port)
{
    const char *host = s, *colon, *allowed = "-._";
    size_t hlen;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return "expected [host]:port";
        host = s + 1;
        hlen = (size_t)(close - host);
        colon = close + 1;
        allowed = ":.%";
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return "expected host:port";
        hlen = (size_t)(colon - s);
        if (memchr(s, ':', hlen))
            return "an IPv6 host needs brackets, as in [::1]:50088";
    }
    if (hlen == 0)
        return "the host is empty";
    for (size_t i = 0; i < hlen; i++)
        if (!isalnum((unsigned char)host[i]) && !strchr(allowed, host[i]))
            return "the host has a character a host name cannot have";
    const char *p = colon + 1;
    unsigned long port = 0;
    for (; isdigit((unsigned char)*p) && port <= 65535; p++)
        port = port * 10 + (unsigned long)(*p - '0');
    if (p == colon + 1 || *p || port > 65535)
        return any_port ? "the port must be a number in 0..65535"
                        : "the port must be a number in 1..65535";
    if (port == 0 && !any_port)
        return "the port must be a number in 1..65535";
    return NULL;
}

static bool is_blank(const char *s)
{
    return s[strspn(s, " ")] == '\0';
}

static bool parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = { "true", "yes", "on" }, *const no[] = { "false", "no", "off" };
    for (size_t i = 0; i < KV__ARRAY_LEN(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return *out = true, true;
        if (strcasecmp(s, no[i]) == 0)
            return *out = false, true;
    }
    return false;
}

/* The names an enum accepts, its own names only ("auto, on, off"). */
static void enum_names(const struct name *names, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (const struct name *n = names; n->name; n++) {
        const struct name *first = names;
        while (first->value != n->value)
            first++;
        if (first == n && len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", n->name);
    }
}

/*
 * Parses text as key k's value and stores it in cfg; the field is written
 * only when the whole value is good. On error returns -1 with why (without
 * the key name) in why.
 */
static int apply(struct kv_config *cfg, const struct key *k, const char *s, char *why, size_t n)
{
    const char *bad = NULL;
    uint64_t u = 0;

    if (k->type != T_STR && k->type != T_ADDR && is_blank(s)) {
        snprintf(why, n, "a value is missing");
        return -1;
    }
    switch (k->type) {
    case T_SECTION:
        snprintf(why, n, "is a section, not a key");
        return -1;
    case T_ENUM:
        for (const struct name *nm = k->names; nm->name; nm++)
            if (strcasecmp(s, nm->name) == 0) {
                *AT(cfg, k, int) = nm->value;
                return 0;
            }
        char list[128];
        enum_names(k->names, list, sizeof list);
        snprintf(why, n, "must be one of %s; got \"%.64s\"", list, s);
        return -1;
    case T_SIZE:
    case T_MS:
        if (k->type == T_SIZE)
            bad = parse_scaled(s, size_units, "not a whole number of bytes", &u);
        else
            bad = parse_scaled(s, ms_units, "not a whole number of milliseconds", &u);
        if (bad) {
            snprintf(why, n, "%s%s; got \"%.64s\"", k->type == T_SIZE ? "bad size: " : "bad duration: ",
                     bad, s);
            return -1;
        }
        if (u > k->max) {
            char lim[32];
            if (k->type == T_SIZE)
                kv__format_size(k->max, lim, sizeof lim);
            else
                snprintf(lim, sizeof lim, "%llums", (unsigned long long)k->max);
            snprintf(why, n, "must be at most %s, got %.64s", lim, s);
            return -1;
        }
        *AT(cfg, k, uint64_t) = u;
        return 0;
    case T_U32:
        if (parse_scaled(s, no_units, "not whole", &u)) {
            snprintf(why, n, "must be an integer in %llu..%llu, got \"%.64s\"",
                     (unsigned long long)k->min, (unsigned long long)k->max, s);
            return -1;
        }
        if (u < k->min || u > k->max) {
            snprintf(why, n, "must be in %llu..%llu, got %.64s",
                     (unsigned long long)k->min, (unsigned long long)k->max, s);
            return -1;
        }
        *AT(cfg, k, uint32_t) = (uint32_t)u;
        return 0;
    case T_RATIO: {
        /* Digits, a point, an exponent: no hex, no inf, no nan. */
        const char *t = s + strspn(s, " ");
        char *end = NULL;
        double d = NAN;
        if (isdigit((unsigned char)*t) || *t == '.') {
            locale_t c = c_locale();
            d = c ? strtod_l(t, &end, c) : strtod(t, &end);
        }
        if (!end || end == t || !is_blank(end) || strspn(t, "0123456789.eE+-") < (size_t)(end - t) ||
            !isfinite(d)) {
            snprintf(why, n, "must be a number in (0,1%c, got \"%.64s\"", k->closed ? ']' : ')', s);
            return -1;
        }
        if (!(d > 0 && (k->closed ? d <= 1 : d < 1))) {
            snprintf(why, n, "must be in (0,1%c, got %.64s", k->closed ? ']' : ')', s);
            return -1;
        }
        *AT(cfg, k, double) = d;
        return 0;
    }
    case T_BOOL: {
        bool b;
        if (!parse_bool(s, &b)) {
            snprintf(why, n, "must be true or false (or yes/no, on/off), got \"%.64s\"", s);
            return -1;
        }
        *AT(cfg, k, bool) = b;
        return 0;
    }
    case T_STR:
    case T_ADDR:
        if (strlen(s) >= KV_CFG_STR) {
            snprintf(why, n, "longer than %d bytes", KV_CFG_STR - 1);
            return -1;
        }
        if (!printable_utf8(s)) {
            snprintf(why, n, "must be printable UTF-8 text");
            return -1;
        }
        if (k->type == T_ADDR && k->list) {
            /* Each comma-separated item is an address of its own. */
            char item[KV_CFG_STR];
            for (const char *p = s;; p++) {
                size_t len = strcspn(p, ",");
                snprintf(item, sizeof item, "%.*s", (int)len, p);
                if ((bad = check_addr(item, false))) {
                    snprintf(why, n, "%s; got \"%.64s\" in \"%.64s\"", bad, item, s);
                    return -1;
                }
                p += len;
                if (!*p)
                    break;
            }
        } else if (k->type == T_ADDR && !(k->empty_ok && *s == '\0') &&
                   (bad = check_addr(s, k->any_port))) {
            snprintf(why, n, "%s; got \"%.64s\"", bad, s);
            return -1;
        }
        if (k->check && (bad = k->check(s))) {
            snprintf(why, n, "%s; got \"%.64s\"", bad, s);
            return -1;
        }
        /* Zero the tail too, so equal configs are equal bytes. */
        memset(AT(cfg, k, char), 0, KV_CFG_STR);
        memcpy(AT(cfg, k, char), s, strlen(s));
        return 0;
    }
    snprintf(why, n, "unknown type");
    return -1;
}

/* Key k's value as text, like snprintf. */
static int format(const struct kv_config *cfg, const struct key *k, char *buf, size_t cap)
{
    switch (k->type) {
    case T_ENUM:
        for (const struct name *nm = k->names; nm->name; nm++)
            if (nm->value == *CAT(cfg, k, int))
                return snprintf(buf, cap, "%s", nm->name);
        return snprintf(buf, cap, "invalid(%d)", *CAT(cfg, k, int));
    case T_SIZE:
        return kv__format_size(*CAT(cfg, k, uint64_t), buf, cap);
    case T_MS:
        return snprintf(buf, cap, "%llu", (unsigned long long)*CAT(cfg, k, uint64_t));
    case T_U32:
        return snprintf(buf, cap, "%u", (unsigned)*CAT(cfg, k, uint32_t));
    case T_RATIO:
        return format_double(*CAT(cfg, k, double), buf, cap);
    case T_BOOL:
        return snprintf(buf, cap, "%s", *CAT(cfg, k, bool) ? "true" : "false");
    case T_STR:
    case T_ADDR:
        return snprintf(buf, cap, "%.*s", KV_CFG_STR - 1, CAT(cfg, k, char));
    case T_SECTION:
        break;
    }
    return snprintf(buf, cap, "%s", "");
}

/* ---- unknown keys ------------------------------------------------------- */

/* Edit distance with transpositions, so "drma" is one step from "dram". */
static size_t distance(const char *a, const char *b)
{
    enum { MAXLEN = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= MAXLEN || lb >= MAXLEN)
        return SIZE_MAX;
    size_t d[MAXLEN + 1][MAXLEN + 1];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            size_t best = sub < del ? sub : del;
            best = best < ins ? best : ins;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

static const char *leaf(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* The key the user probably meant, or NULL. */
static const struct key *suggest(const char *name)
{
    const struct key *best = NULL;
    size_t bestd = SIZE_MAX;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t d = distance(name, keys[i].name);
        if (d < bestd)
            best = &keys[i], bestd = d;
    }
    if (best && bestd <= 1 + strlen(name) / 5)
        return best;
    /* The right key in the wrong section: "dram.path" -> "ssd.path". */
    for (size_t i = 0; i < NKEYS; i++)
        if (keys[i].type != T_SECTION && strcmp(leaf(keys[i].name), leaf(name)) == 0)
            return &keys[i];
    return NULL;
}

static void unknown_key(const char *name, bool top, char *why, size_t n)
{
    const struct key *k = suggest(name);
    bool section = top && !(k && k->type != T_SECTION);
    if (k)
        snprintf(why, n, "unknown %s (did you mean %s?)", section ? "section" : "key", k->name);
    else
        snprintf(why, n, "unknown %s", section ? "section" : "key");
}

/* ---- the YAML walker ---------------------------------------------------- */

struct walk {
    yaml_parser_t parser;
    const char *name;               /* the file, or "<string>" */
    const char *text;               /* the document, for reader-error lines */
    size_t len;
    struct kv_config *cfg;
    size_t seen_line[NKEYS];        /* where each key was set; 0 = not yet */
    char *err;
    size_t errlen;
};

/* "name:line: key: message"; key may be NULL. Returns KV_ECONFIG. */
__attribute__((format(printf, 4, 5)))
static int fail(struct walk *w, size_t line, const char *key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kv__errf(w->err, w->errlen, "%s:%zu: %s%s%s", w->name, line, key ? key : "", key ? ": " : "", msg);
    return KV_ECONFIG;
}

static size_t line_of(const yaml_event_t *ev)
{
    return ev->start_mark.line + 1;
}

static int next(struct walk *w, yaml_event_t *ev)
{
    if (yaml_parser_parse(&w->parser, ev))
        return KV_OK;
    const yaml_parser_t *p = &w->parser;
    if (p->error == YAML_MEMORY_ERROR) {
        kv__errf(w->err, w->errlen, "%s: out of memory", w->name);
        return KV_ENOMEM;
    }
    size_t line = p->problem_mark.line + 1;
    if (p->error == YAML_READER_ERROR) {   /* the reader reports an offset, not a mark */
        line = 1;
        for (size_t i = 0; i < p->problem_offset && i < w->len; i++)
            line += w->text[i] == '\n';
    }
    const char *problem = p->problem ? p->problem : "unknown problem";
    if (p->context)
        return fail(w, line, NULL, "YAML syntax error: %s (%s)", problem, p->context);
    return fail(w, line, NULL, "YAML syntax error: %s", problem);
}

static const char *kind(const yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_SCALAR_EVENT:         return "a scalar";
    case YAML_MAPPING_START_EVENT:  return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a sequence";
    case YAML_ALIAS_EVENT:          return "an alias";
    default:                        return "something else";
    }
}

static bool has_anchor(const yaml_event_t *ev)
{
    return ev->type == YAML_ALIAS_EVENT ||
           (ev->type == YAML_SCALAR_EVENT && ev->data.scalar.anchor) ||
           (ev->type == YAML_MAPPING_START_EVENT && ev->data.mapping_start.anchor) ||
           (ev->type == YAML_SEQUENCE_START_EVENT && ev->data.sequence_start.anchor);
}

/* An unquoted empty, ~ or null: "nothing here". */
static bool is_null(const yaml_event_t *ev)
{
    static const char *const nulls[] = { "", "~", "null", "Null", "NULL" };
    if (ev->type != YAML_SCALAR_EVENT || ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    for (size_t i = 0; i < KV__ARRAY_LEN(nulls); i++)
        if (strcmp((const char *)ev->data.scalar.value, nulls[i]) == 0)
            return true;
    return false;
}

static int walk_mapping(struct walk *w, const struct key *section);

static int walk_value(struct walk *w, const struct key *k, const yaml_event_t *v)
{
    size_t line = line_of(v);
    if (has_anchor(v))
        return fail(w, line, k->name, "anchors and aliases are not supported");
    if (k->type == T_SECTION) {
        if (v->type == YAML_MAPPING_START_EVENT)
            return walk_mapping(w, k);
        if (is_null(v))   /* "dram:" with every key under it commented out */
            return KV_OK;
        return fail(w, line, k->name, "expected a mapping, got %s", kind(v));
    }
    if (v->type != YAML_SCALAR_EVENT)
        return fail(w, line, k->name, "expected a scalar, got %s", kind(v));
    const char *value = (const char *)v->data.scalar.value;
    if (strlen(value) != v->data.scalar.length)   /* a "\0" escape */
        return fail(w, line, k->name, "contains a NUL character");
    const char *text = is_null(v) ? "" : value;
    char why[512];
    if (apply(w->cfg, k, text, why, sizeof why))
        return fail(w, line, k->name, "%s", why);
    return KV_OK;
}

static int walk_pair(struct walk *w, const struct key *section, const yaml_event_t *kev)
{
    size_t line = line_of(kev);
    if (kev->type != YAML_SCALAR_EVENT)
        return fail(w, line, section ? section->name : NULL, "keys must be names, got %s",
                    kind(kev));

    const char *given = (const char *)kev->data.scalar.value;
    char name[128];
    snprintf(name, sizeof name, "%s%s%s", section ? section->name : "", section ? "." : "", given);
    if (has_anchor(kev))
        return fail(w, line, name, "anchors and aliases are not supported");
    /* One spelling per key: nest it, as the dump and the example do. */
    if (strchr(given, '.'))
        return fail(w, line, name, "dotted names are for kv_config_set and --set; nest the key under its section");

    const struct key *k = find_key(name);
    if (!k) {
        char why[256];
        unknown_key(name, section == NULL, why, sizeof why);
        return fail(w, line, name, "%s", why);
    }
    size_t i = (size_t)(k - keys);
    if (w->seen_line[i])
        return fail(w, line, name, "duplicate key (first given on line %zu)", w->seen_line[i]);
    w->seen_line[i] = line;

    yaml_event_t v;
    int rc = next(w, &v);
    if (rc)
        return rc;
    rc = walk_value(w, k, &v);
    yaml_event_delete(&v);
    return rc;
}

/* Reads key-value pairs up to the mapping's end. */
static int walk_mapping(struct walk *w, const struct key *section)
{
    for (;;) {
        yaml_event_t kev;
        int rc = next(w, &kev);
        if (rc)
            return rc;
        if (kev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&kev);
            return KV_OK;
        }
        rc = walk_pair(w, section, &kev);
        yaml_event_delete(&kev);
        if (rc)
            return rc;
    }
}

/* The stream: nothing, or one document whose top level is a mapping. */
static int walk_stream(struct walk *w)
{
    bool had_document = false;
    for (;;) {
        yaml_event_t ev;
        int rc = next(w, &ev);
        if (rc)
            return rc;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            yaml_event_delete(&ev);
            return KV_OK;
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (had_document)
                rc = fail(w, line_of(&ev), NULL, "only one YAML document is allowed");
            had_document = true;
            break;
        case YAML_MAPPING_START_EVENT:
            if (has_anchor(&ev))
                rc = fail(w, line_of(&ev), NULL, "anchors and aliases are not supported");
            else
                rc = walk_mapping(w, NULL);
            break;
        default:
            if (!is_null(&ev))   /* an empty document keeps the defaults */
                rc = fail(w, line_of(&ev), NULL, "the top level must be a mapping, got %s",
                          kind(&ev));
            break;
        }
        yaml_event_delete(&ev);
        if (rc)
            return rc;
    }
}

/* Applies a document to cfg as a whole: on error cfg is left as it was. */
static int parse_named(struct kv_config *cfg, const char *name, const char *text, size_t len,
                       char *err, size_t errlen)
{
    struct walk *w = calloc(1, sizeof *w);
    struct kv_config *tmp = malloc(sizeof *tmp);
    int rc = KV_ENOMEM;
    if (!w || !tmp || !yaml_parser_initialize(&w->parser)) {
        kv__errf(err, errlen, "%s: out of memory", name);
        goto out;
    }
    memcpy(tmp, cfg, sizeof *tmp);
    w->name = name;
    w->text = text;
    w->len = len;
    w->cfg = tmp;
    w->err = err;
    w->errlen = errlen;
    yaml_parser_set_input_string(&w->parser, (const unsigned char *)text, len);
    rc = walk_stream(w);
    yaml_parser_delete(&w->parser);
    if (rc == KV_OK)
        memcpy(cfg, tmp, sizeof *cfg);
out:
    free(tmp);
    free(w);
    return rc;
}

/* ---- public entry points ------------------------------------------------ */

void kv__config_defaults(struct kv_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < NKEYS; i++) {
        char why[256];
        if (keys[i].type != T_SECTION && apply(cfg, &keys[i], keys[i].def, why, sizeof why) != 0)
            abort();   /* a bad default in the table; the config suite catches it */
    }
}

KV__EXPORT int kv_config_new(kv_config **out)
{
    if (!out)
        return KV_EINVAL;
    *out = malloc(sizeof **out);
    if (!*out)
        return KV_ENOMEM;
    kv__config_defaults(*out);
    return KV_OK;
}

KV__EXPORT void kv_config_free(kv_config *cfg)
{
    free(cfg);
}

KV__EXPORT int kv_config_parse(kv_config *cfg, const char *yaml, size_t len, char *err, size_t errlen)
{
    if (!cfg || !yaml)
        return KV_EINVAL;
    return parse_named(cfg, "<string>", yaml, len, err, errlen);
}

KV__EXPORT int kv_config_load(kv_config *cfg, const char *path, char *err, size_t errlen)
{
    if (!cfg || !path)
        return KV_EINVAL;
    char eb[128];
    FILE *f = fopen(path, "rb");
    if (!f) {
        kv__errf(err, errlen, "%s: cannot open: %s", path, strerror_r(errno, eb, sizeof eb));
        return KV_EIO;
    }
    char *text = malloc(FILE_MAX + 1);
    size_t len = 0;
    int rc = KV_OK;
    if (!text) {
        kv__errf(err, errlen, "%s: out of memory", path);
        rc = KV_ENOMEM;
        goto out;
    }
    len = fread(text, 1, FILE_MAX + 1, f);
    if (ferror(f)) {
        kv__errf(err, errlen, "%s: cannot read: %s", path, strerror_r(errno, eb, sizeof eb));
        rc = KV_EIO;
    } else if (len > FILE_MAX) {
        kv__errf(err, errlen, "%s: larger than %llu MiB, not a config file", path, FILE_MAX / MiB);
        rc = KV_ECONFIG;
    } else {
        rc = parse_named(cfg, path, text, len, err, errlen);
    }
out:
    free(text);
    fclose(f);
    return rc;
}

int kv__config_set(struct kv_config *cfg, const char *key, const char *value, char *err, size_t errlen)
{
    if (!cfg || !key || !value)
        return KV_EINVAL;
    const struct key *k = find_key(key);
    char why[512];
    if (!k || k->type == T_SECTION) {
        unknown_key(key, false, why, sizeof why);
        kv__errf(err, errlen, "%s: %s", key, why);
        return KV_ECONFIG;
    }
    if (apply(cfg, k, value, why, sizeof why)) {
        kv__errf(err, errlen, "%s: %s", key, why);
        return KV_ECONFIG;
    }
    return KV_OK;
}

KV__EXPORT int kv_config_set(kv_config *cfg, const char *key, const char *value)
{
    return kv__config_set(cfg, key, value, NULL, 0);
}

KV__EXPORT int kv_config_get(const kv_config *cfg, const char *key, char *buf, size_t cap)
{
    if (!cfg || !key || !buf)
        return KV_EINVAL;
    const struct key *k = find_key(key);
    if (!k || k->type == T_SECTION)
        return KV_ECONFIG;
    char text[KV_CFG_STR + 64];
    int n = format(cfg, k, text, sizeof text);
    if (n < 0 || (size_t)n >= cap)
        return KV_ENOBUFS;
    memcpy(buf, text, (size_t)n + 1);
    return KV_OK;
}

/* A growing write into a caller's buffer that counts what it could not fit. */
struct out {
    char *buf;
    size_t cap, len;
};

__attribute__((format(printf, 2, 3)))
static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->len < o->cap ? o->buf + o->len : NULL, o->len < o->cap ? o->cap - o->len : 0,
                      fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

/* Plain when our reader would take it back unchanged, else double-quoted. */
static void put_string(struct out *o, const char *s)
{
    static const char *const special[] = { "~", "null", "Null", "NULL", "true", "false", "yes",
                                           "no", "on", "off" };
    /* U+2028 and U+2029 are line breaks to YAML: a plain or quoted
     * scalar holding one raw reads back folded (fuzz_config found it), so
     * they are quoted and escaped as \L and \P. */
    bool quote = *s == '\0' || strchr("-?:,[]{}#&*!|>'\"%@` ", *s) || s[strlen(s) - 1] == ' ' ||
                 s[strlen(s) - 1] == ':' || strstr(s, ": ") || strstr(s, " #") ||
                 strpbrk(s, "\"\\") || strstr(s, "\xe2\x80\xa8") || strstr(s, "\xe2\x80\xa9");
    for (size_t i = 0; !quote && i < KV__ARRAY_LEN(special); i++)
        quote = strcasecmp(s, special[i]) == 0;
    if (!quote) {
        put(o, "%s", s);
        return;
    }
    put(o, "\"");
    for (; *s; s++) {   /* no control characters: apply() refuses them */
        if (strncmp(s, "\xe2\x80\xa8", 3) == 0 || strncmp(s, "\xe2\x80\xa9", 3) == 0) {
            put(o, "\\%c", s[2] == '\xa8' ? 'L' : 'P');
            s += 2;
            continue;
        }
        put(o, "%s%c", *s == '"' || *s == '\\' ? "\\" : "", *s);
    }
    put(o, "\"");
}

KV__EXPORT int kv_config_dump(const kv_config *cfg, char *buf, size_t cap)
{
    if (!cfg || (!buf && cap > 0))
        return KV_EINVAL;
    struct out o = { buf, cap, 0 };
    if (cap > 0)
        buf[0] = '\0';
    for (size_t i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        if (k->type == T_SECTION) {
            put(&o, "%s:\n", k->name);
            continue;
        }
        bool nested = strchr(k->name, '.') != NULL;
        put(&o, "%s%s: ", nested ? "  " : "", leaf(k->name));
        char text[KV_CFG_STR + 64];
        format(cfg, k, text, sizeof text);
        if (k->type == T_STR || k->type == T_ADDR)
            put_string(&o, text);
        else
            put(&o, "%s", text);
        put(&o, "\n");
    }
    return o.len > INT32_MAX ? KV_ENOBUFS : (int)o.len;
}

const char *kv__config_key_name(size_t i, const char **doc)
{
    for (size_t j = 0; j < NKEYS; j++) {
        if (keys[j].type == T_SECTION)
            continue;
        if (i-- == 0) {
            if (doc)
                *doc = keys[j].doc;
            return keys[j].name;
        }
    }
    return NULL;
}

bool kv__config_equal(const struct kv_config *a, const struct kv_config *b)
{
    for (size_t i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        bool same = true;
        switch (k->type) {
        case T_SECTION:                                                                 break;
        case T_ENUM:            same = *CAT(a, k, int) == *CAT(b, k, int);              break;
        case T_SIZE: case T_MS: same = *CAT(a, k, uint64_t) == *CAT(b, k, uint64_t);    break;
        case T_U32:             same = *CAT(a, k, uint32_t) == *CAT(b, k, uint32_t);    break;
        case T_RATIO:           same = *CAT(a, k, double) == *CAT(b, k, double);        break;
        case T_BOOL:            same = *CAT(a, k, bool) == *CAT(b, k, bool);            break;
        case T_STR: case T_ADDR:
            same = strncmp(CAT(a, k, char), CAT(b, k, char), KV_CFG_STR) == 0;
            break;
        }
        if (!same)
            return false;
    }
    return true;
}

int kv__config_validate(const struct kv_config *cfg, char *err, size_t errlen)
{
    if (!cfg)
        return KV_EINVAL;

    /* Each field on its own first: kv_open may be handed a struct that was
     * filled in directly rather than through this table. */
    struct kv_config scratch;
    for (size_t i = 0; i < NKEYS; i++) {
        char text[KV_CFG_STR + 64], why[512];
        if (keys[i].type == T_SECTION)
            continue;
        format(cfg, &keys[i], text, sizeof text);
        if (apply(&scratch, &keys[i], text, why, sizeof why)) {
            kv__errf(err, errlen, "%s: %s", keys[i].name, why);
            return KV_ECONFIG;
        }
    }

    const char *pipe = kv__pipeline_name(cfg->pipeline);
    if (KV_PIPE_HAS_DRAM(cfg->pipeline) && cfg->dram.capacity == 0 && !cfg->cluster.enabled) {
        kv__errf(err, errlen, "dram.capacity: 0 is only allowed with cluster.enabled (a pure "
                 "client); pipeline %s needs DRAM", pipe);
        return KV_ECONFIG;
    }
    if (KV_PIPE_HAS_SSD(cfg->pipeline) && cfg->ssd.path[0] == '\0') {
        kv__errf(err, errlen, "ssd.path: must be set when pipeline is %s", pipe);
        return KV_ECONFIG;
    }
    if (!(cfg->ssd.gc_ratio < cfg->ssd.gc_trigger_ratio)) {
        kv__errf(err, errlen, "ssd.gc_ratio (%g) must be less than ssd.gc_trigger_ratio (%g)",
                 cfg->ssd.gc_ratio, cfg->ssd.gc_trigger_ratio);
        return KV_ECONFIG;
    }
    if (!(cfg->eviction.ratio <= cfg->eviction.high_watermark_ratio)) {
        kv__errf(err, errlen, "eviction.ratio (%g) must be at most eviction.high_watermark_ratio (%g)",
                 cfg->eviction.ratio, cfg->eviction.high_watermark_ratio);
        return KV_ECONFIG;
    }
    return KV_OK;
}

/* The schema for the generated references (doc/config.md, kvengine.yaml(5);
 * scripts/gendoc.c): entry i of keys[], sections included, with its type,
 * unit, range and values spelled out from the same fields apply() checks. */
int kv__config_schema(size_t i, struct kv__config_entry *out)
{
    if (i >= NKEYS || !out)
        return KV_ENOTFOUND;
    const struct key *k = &keys[i];
    static const char *const types[] = {
        [T_SECTION] = "section", [T_ENUM] = "enum", [T_SIZE] = "size", [T_MS] = "duration",
        [T_U32] = "integer", [T_RATIO] = "ratio", [T_BOOL] = "bool", [T_STR] = "string",
        [T_ADDR] = "address",
    };
    memset(out, 0, sizeof *out);
    out->name = k->name;
    out->section = k->type == T_SECTION;
    out->type = types[k->type];
    out->def = k->def ? k->def : "";
    out->doc = k->doc;
    struct out o = { out->range, sizeof out->range, 0 };
    switch (k->type) {
    case T_SECTION: case T_BOOL:
        break;
    case T_ENUM:
        /* Only a value's own (first) name: aliases (true, warning) are accepted but not shown. */
        for (const struct name *n = k->names; n->name; n++) {
            bool first = true;
            for (const struct name *m = k->names; m < n; m++)
                first &= m->value != n->value;
            if (first)
                put(&o, "%s%s", o.len ? ", " : "", n->name);
        }
        break;
    case T_SIZE: {
        out->unit = "bytes";
        char mx[64];
        kv__format_size(k->max, mx, sizeof mx);
        if (k->max != UINT64_MAX)
            put(&o, "0..%s", mx);
        break;
    }
    case T_MS:
        out->unit = "ms";
        put(&o, "0..%llu", (unsigned long long)k->max);
        break;
    case T_U32:
        put(&o, "%llu..%llu", (unsigned long long)k->min, (unsigned long long)k->max);
        break;
    case T_RATIO:
        put(&o, "(0,1%c", k->closed ? ']' : ')');
        break;
    case T_STR:
        break;
    case T_ADDR:
        put(&o, "%s%s%s", k->list ? "host:port[,host:port...]" : "host:port",
            k->any_port ? " (port 0: any free port)" : "", k->empty_ok ? "; empty = off" : "");
        break;
    }
    return KV_OK;
}
