/*
 * config.h — the effective configuration of an engine, as plain fields.
 *
 * kv_config (opaque in the public header) is this struct. The YAML schema is
 * DESIGN.md's; every field here has exactly one dotted key, listed in the
 * table in config.c, which drives parsing, kv_config_set, kv_config_get and
 * kv_config_dump alike.
 */
#ifndef KV_ENGINE_CONFIG_H
#define KV_ENGINE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvengine.h"

enum kv__pipeline {
    KV_PIPE_DRAM = 1,       /* "dram": eviction drops blocks */
    KV_PIPE_DRAM_SSD = 3,   /* "dram|ssd": eviction spills to SSD (default) */
    KV_PIPE_SSD = 2,        /* "ssd": SSD only */
};
#define KV_PIPE_HAS_DRAM(p) ((p) & 1)
#define KV_PIPE_HAS_SSD(p)  ((p) & 2)

enum kv__hugepages { KV_HUGE_AUTO, KV_HUGE_ON, KV_HUGE_OFF };
enum kv__compression { KV_COMP_NONE, KV_COMP_LZ4 };
enum kv__sync { KV_SYNC_NONE, KV_SYNC_WAL, KV_SYNC_FSYNC };
enum kv__protocol { KV_PROTO_AUTO, KV_PROTO_TCP, KV_PROTO_RDMA };
enum kv__metadata { KV_META_KVMASTER, KV_META_ETCD };
enum kv__loglevel { KV_LOG_ERROR, KV_LOG_WARN, KV_LOG_INFO, KV_LOG_DEBUG };

#define KV_CFG_STR 256   /* longest string value (paths, addresses, token) */

struct kv_config {
    int pipeline;                       /* enum kv__pipeline */
    struct {
        uint64_t capacity;              /* bytes; 0 = pure client (cluster) */
        uint32_t shards;                /* index shards, 1..4096 */
        int hugepages;                  /* enum kv__hugepages */
    } dram;
    struct {
        double high_watermark_ratio;    /* (0,1] */
        double ratio;                   /* (0,1) */
        uint64_t lease_ttl_ms;
    } eviction;
    struct {
        char path[KV_CFG_STR];
        uint64_t capacity;              /* bytes */
        int compression;                /* enum kv__compression */
        bool write_through;
        double gc_trigger_ratio;        /* (0,1] */
        double gc_ratio;                /* (0,1) */
        int sync;                       /* enum kv__sync */
        bool promote;                   /* copy SSD hits back into DRAM */
        uint64_t spill_queue;           /* bytes waiting to spill, at most */
        char group[KV_CFG_STR];         /* "" = none; a group name or gid (persist/modes.c) */
    } ssd;
    struct {
        uint32_t threads;               /* 1..256 */
        uint64_t timeout_ms;            /* 0 = none */
    } io;
    struct {
        bool enabled;
        char master[KV_CFG_STR];        /* host:port */
        char listen[KV_CFG_STR];        /* host:port */
        int protocol;                   /* enum kv__protocol */
        char device_name[KV_CFG_STR];
        uint32_t replica_num;           /* >= 1 */
        uint64_t node_ttl_ms;
        char token[KV_CFG_STR];
        bool insecure;                  /* serve beyond loopback without a token */
        int metadata;                   /* enum kv__metadata */
        char etcd_endpoints[KV_CFG_STR]; /* host:port[,host:port...] */
        char etcd_prefix[KV_CFG_STR];   /* "/..." without a trailing '/' */
        char etcd_user[KV_CFG_STR];     /* "" = no authentication */
        char etcd_password[KV_CFG_STR];
        uint32_t rereplicate_mib_s;     /* 0 = no re-replication */
        char token_file[KV_CFG_STR];    /* "" = none; read at open (net/auth.c) */
        char etcd_cacert[KV_CFG_STR];   /* etcd over https: CA bundle; "" = http */
        char etcd_cert[KV_CFG_STR];     /* client certificate (PEM); "" = none */
        char etcd_key[KV_CFG_STR];      /* its private key (PEM) */
    } cluster;
    struct {
        char name[KV_CFG_STR];          /* "" = shared by ssd.path alone (or not at all) */
        uint32_t block_shards;          /* shards a block has when complete (lookup), >= 1 */
        char dir[KV_CFG_STR];           /* rendezvous directory; "" = the default */
        bool direct_reads;              /* attached loads read the segment's directory */
    } store;
    struct {
        char listen[KV_CFG_STR];        /* "" = off */
        char token[KV_CFG_STR];         /* bearer token /metrics asks for; "" = none */
        bool insecure;                  /* allow beyond loopback without a token */
    } metrics;
    struct {
        int level;                      /* enum kv__loglevel */
    } log;
};

/* Fills cfg with the defaults (DESIGN.md, "Configuration"). */
void kv__config_defaults(struct kv_config *cfg);

/* Cross-field checks kv_open makes (e.g. a pipeline with no tier), after
 * re-checking every field's own range. KV_ECONFIG with a message naming
 * the keys. */
int kv__config_validate(const struct kv_config *cfg, char *err, size_t errlen);

/* kv_config_set with a message ("eviction.ratio: must be in (0,1), got 2")
 * for tools that report a bad --set KEY=VALUE. */
int kv__config_set(struct kv_config *cfg, const char *key, const char *value,
                   char *err, size_t errlen);

/* The i-th settable dotted key in schema order and, through doc, its
 * one-line description; NULL past the last. For listing keys (kvctl) and
 * for tests that walk the schema. */
const char *kv__config_key_name(size_t i, const char **doc);

/* True when every keyed field of a equals b's (padding and bytes after a
 * string's NUL are ignored). */
bool kv__config_equal(const struct kv_config *a, const struct kv_config *b);

/* Parses "512MiB", "4GB", "1024" into bytes; 0 or KV_ECONFIG. KB/MB/GB/TB
 * (and K/M/G/T) are binary, like KiB/MiB/GiB/TiB, as in Mooncake. */
int kv__parse_size(const char *s, uint64_t *out);
/* Parses "250ms", "2s", "1.5s", "1000" (ms) into milliseconds; 0 or
 * KV_ECONFIG. */
int kv__parse_duration_ms(const char *s, uint64_t *out);
/* Writes bytes with the largest binary unit that divides it exactly
 * ("4GiB", "1536", "0"); returns the length like snprintf. */
int kv__format_size(uint64_t bytes, char *buf, size_t cap);

/* "dram", "dram|ssd", "ssd", or "invalid". */
const char *kv__pipeline_name(int pipeline);

/* One entry of the config schema, for the generated references
 * (scripts/gendoc.c): the strings point into the table (range is filled in). */
struct kv__config_entry {
    const char *name;      /* dotted; a section's own name */
    bool section;          /* a section heading, not a key */
    const char *type;      /* section, enum, size, duration, integer, ratio, bool, string, address */
    const char *def;       /* the default as text ("" for sections) */
    const char *doc;
    const char *unit;      /* "bytes", "ms" or NULL */
    char range[256];       /* "1..4096", "(0,1]", the enum's values, or "" */
};
/* Entry i of the table, sections included, in table order; KV_ENOTFOUND past the last. */
int kv__config_schema(size_t i, struct kv__config_entry *out);

#endif
