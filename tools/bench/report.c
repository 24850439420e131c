/*
 * report.c — what the benchmark prints: per-phase figures, the human
 * tables, the comparison ratios, and the summary JSON (the progress line
 * and the JSON string escapes are kvctl's, in kvctl_util.c).
 *
 * Key design choice: the JSON is written by hand, field by field, in
 * DESIGN.md's shape ({"scenario", "memcpy_mib_s", "phases": [...]} plus
 * extra top-level fields), with every string escaped and every number
 * finite (null otherwise), so any JSON parser reads it; no library needed.
 */
#include "bench.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

/* ---- figures ------------------------------------------------------------- */

static double per_s(double v, double seconds)
{
    return seconds > 0 ? v / seconds : 0;
}

double kvctl_phase_mib_s(const struct kvctl_phase *p)
{
    return per_s((double)p->bytes / MIB, p->seconds);
}

double kvctl_phase_kvs_s(const struct kvctl_phase *p)
{
    uint64_t good = p->ops;
    if (!p->lookup)
        good = p->ops - (p->misses + p->errors > p->ops ? p->ops : p->misses + p->errors);
    return per_s((double)good, p->seconds);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v. */
static double pct(const uint64_t *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    size_t rank = (size_t)ceil(q * (double)n);
    if (rank < 1)
        rank = 1;
    return (double)v[rank - 1] / 1000.0;
}

void kvctl_phase_latency(struct kvctl_phase *p, uint64_t *lat, size_t n)
{
    qsort(lat, n, sizeof *lat, cmp_u64);
    p->p50_us = pct(lat, n, 0.50);
    p->p95_us = pct(lat, n, 0.95);
    p->p99_us = pct(lat, n, 0.99);
}

bool kvctl_run_ok(const struct kvctl_report *r, const struct kvctl_run *run)
{
    if (run->open_error != KV_OK)
        return false;
    for (int i = 0; i < run->nphases; i++) {
        const struct kvctl_phase *p = &run->phases[i];
        if (p->errors || p->verify_failures)
            return false;
        if (p->misses && strcmp(r->scenario, "verify_write") == 0)
            return false;
    }
    if (run->trace.on && (run->trace.broken_promises || run->trace.verify_failures))
        return false;
    return true;
}

static const struct kvctl_phase *find_phase(const struct kvctl_run *run, const char *name)
{
    for (int i = 0; i < run->nphases; i++)
        if (strcmp(run->phases[i].name, name) == 0)
            return &run->phases[i];
    return NULL;
}

/* What an attached run's write_kvbuf is measured against: its own
 * kvbuf_inproc (the same dumps into an in-process engine, alternated batch
 * by batch), else the in-process run b's write. */
static const struct kvctl_phase *kvbuf_base(const struct kvctl_run *a, const struct kvctl_run *b)
{
    const struct kvctl_phase *p = find_phase(a, "kvbuf_inproc");
    return p && p->ops ? p : find_phase(b, "write");
}

/* ---- tables -------------------------------------------------------------- */

/* "0.612", or "-" where a ratio does not apply. */
static const char *fmt_ratio(double v, char *buf, size_t cap)
{
    if (isfinite(v))
        snprintf(buf, cap, "%.3f", v);
    else
        snprintf(buf, cap, "-");
    return buf;
}

/* The figures of a trace run that are not a phase's. */
static void print_trace(FILE *f, const struct kvctl_trace_stats *t)
{
    char a[16], b[16], c[16], d[16], e[16];
    fprintf(f, "trace: %" PRIu64 " requests, %" PRIu64 " block refs, %.3f s; prefix hit ratio "
               "%s (dram %s, ssd %s); ideal %s; LRU %s",
            t->requests, t->block_refs, t->seconds, fmt_ratio(t->prefix_hit_ratio, a, sizeof a),
            fmt_ratio(t->hit_ratio_dram, b, sizeof b), fmt_ratio(t->hit_ratio_ssd, c, sizeof c),
            fmt_ratio(t->ideal_hit_ratio, d, sizeof d), fmt_ratio(t->lru_hit_ratio, e, sizeof e));
    if (isfinite(t->lru_hit_ratio))
        fprintf(f, " (%" PRIu64 " blocks, freeing down to %" PRIu64 "; one at a time: %s)",
                t->lru_blocks, t->lru_low_blocks, fmt_ratio(t->lru_plain_hit_ratio, e, sizeof e));
    fprintf(f, "\n       broken promises %" PRIu64 ", verify failures %" PRIu64
               ", dumps refused %" PRIu64 ", spill drops %" PRIu64
               "; lookup+load per request p50 %.1f us, p99 %.1f us\n",
            t->broken_promises, t->verify_failures, t->dumps_refused, t->spill_drops, t->p50_us,
            t->p99_us);
    fprintf(f, "       prefill skipped for %" PRIu64 " of %" PRIu64 " prompt tokens (%.1f%%)\n",
            t->tokens_skipped, t->prompt_tokens,
            t->prompt_tokens ? 100.0 * (double)t->tokens_skipped / (double)t->prompt_tokens : 0);
}

static void print_run(FILE *f, const struct kvctl_report *r, const struct kvctl_run *run)
{
    char b1[32], b2[32];
    fprintf(f, "\n[%s]", run->backend);
    if (run->addr)
        fprintf(f, " %s", run->addr);
    if (run->open_error != KV_OK) {
        fprintf(f, " did not open: %s\n", kv_strerror(run->open_error));
        return;
    }
    fprintf(f, " open %.1f ms\n", (double)run->info.open_ns / 1e6);
    fprintf(f, "%-11s %9s %9s %8s %9s %10s %9s %9s %9s %6s %6s %6s %7s", "phase", "ops",
            "MiB", "sec", "MiB/s", "kvs/s", "p50 us", "p95 us", "p99 us", "miss", "verr",
            "err", "memcpy");
    fprintf(f, r->tcp_mib_s > 0 ? " %6s\n" : "\n", "tcp");
    for (int i = 0; i < run->nphases; i++) {
        const struct kvctl_phase *p = &run->phases[i];
        char mib[32] = "-", mibs[32] = "-", ratio[32] = "-", tcp[32] = "-";
        if (!p->lookup) {
            snprintf(mib, sizeof mib, "%.1f", (double)p->bytes / MIB);
            snprintf(mibs, sizeof mibs, "%.1f", kvctl_phase_mib_s(p));
            if (r->memcpy_mib_s > 0)
                snprintf(ratio, sizeof ratio, "%.2fx", kvctl_phase_mib_s(p) / r->memcpy_mib_s);
            if (r->tcp_mib_s > 0)
                snprintf(tcp, sizeof tcp, "%.2fx", kvctl_phase_mib_s(p) / r->tcp_mib_s);
        }
        fprintf(f, "%-11s %9" PRIu64 " %9s %8.3f %9s %10.0f %9.1f %9.1f %9.1f %6" PRIu64
                   " %6" PRIu64 " %6" PRIu64 " %7s",
                p->name, p->ops, mib, p->seconds, mibs, kvctl_phase_kvs_s(p), p->p50_us,
                p->p95_us, p->p99_us, p->misses, p->verify_failures, p->errors, ratio);
        fprintf(f, r->tcp_mib_s > 0 ? " %6s\n" : "\n", tcp);
        if (p->errors)
            fprintf(f, "  %s: first error %s (%s)\n", p->name, kv_err_name(p->first_error),
                    kv_strerror(p->first_error));
    }
    if (run->trace.on)
        print_trace(f, &run->trace);
    const struct kvctl_phase *lk = find_phase(run, "lookup");
    fprintf(f, "RSS %s (peak %s)", kvctl_fmt_size(run->rss, b1, sizeof b1),
            kvctl_fmt_size(run->peak_rss, b2, sizeof b2));
    if (run->info.shards)
        fprintf(f, ", index %.1f B/shard (%" PRIu64 " shards)",
                (double)run->info.index_bytes / (double)run->info.shards, run->info.shards);
    if (lk)
        fprintf(f, ", lookup %.0f ids/s", kvctl_phase_kvs_s(lk));
    fprintf(f, "%s\n", kvctl_run_ok(r, run) ? "" : "  ** FAILED **");
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : NAN;
}

static void print_compare(FILE *f, const struct kvctl_report *r, const struct kvctl_run *b)
{
    const struct kvctl_run *a = &r->runs[0];
    if (a->open_error != KV_OK || b->open_error != KV_OK)
        return;
    fprintf(f, "\n%s / %s      kvs/s     MiB/s\n", a->backend, b->backend);
    if (a->trace.on && b->trace.on)
        fprintf(f, "%-18s %9.2fx %9s   (the whole replay: its seconds, inverted)\n", "replay",
                ratio(b->trace.seconds, a->trace.seconds), "-");
    for (int i = 0; i < a->nphases; i++) {
        const struct kvctl_phase *pa = &a->phases[i], *pb = find_phase(b, pa->name);
        if (!pb)
            continue;
        double k = ratio(kvctl_phase_kvs_s(pa), kvctl_phase_kvs_s(pb));
        if (pa->lookup)
            fprintf(f, "%-18s %9.2fx %9s   (ids/s)\n", pa->name, k, "-");
        else
            fprintf(f, "%-18s %9.2fx %8.2fx\n", pa->name, k,
                    ratio(kvctl_phase_mib_s(pa), kvctl_phase_mib_s(pb)));
    }
    /* An attached run's dump from kv_buffer_alloc memory against the
     * in-process one (issue 16 asks for 0.8x): against kvbuf_inproc, the
     * same dumps alternated with it batch by batch, when the run has it;
     * else against the in-process run's write. */
    const struct kvctl_phase *kb = find_phase(a, "write_kvbuf"), *w = kvbuf_base(a, b);
    if (kb && w && strcmp(b->backend, "dram") == 0)
        fprintf(f, "%-18s %9.2fx %8.2fx   (%s: a dump from kv_buffer_alloc memory; "
                   "p50 %.2fx)\n", "write_kvbuf/write",
                ratio(kvctl_phase_kvs_s(kb), kvctl_phase_kvs_s(w)),
                ratio(kvctl_phase_mib_s(kb), kvctl_phase_mib_s(w)),
                strcmp(w->name, "write") ? "write_kvbuf / kvbuf_inproc, alternated batch by batch"
                                         : "write_kvbuf here / write there",
                ratio(w->p50_us, kb->p50_us));
}

/* Every backend's MiB/s (ids/s for lookup) and p50/p99 per phase, one line
 * each: the figures an issue asks for, in one place. */
static void print_side_by_side(FILE *f, const struct kvctl_report *r)
{
    bool srv = false;   /* an attached run: its server's CPU gets a column */
    for (int k = 0; k < r->nruns; k++)
        for (int i = 0; i < r->runs[k].nphases; i++)
            srv |= r->runs[k].phases[i].has_server_cpu;
    fprintf(f, "\n%-11s %-10s %12s %9s %9s %7s %12s%s\n", "phase", "backend", "MiB/s", "p50 us",
            "p99 us", r->tcp_mib_s > 0 ? "tcp" : "", "client cpu", srv ? "   server cpu" : "");
    const struct kvctl_run *a = &r->runs[0];
    for (int i = 0; i < a->nphases; i++) {
        for (int k = 0; k < r->nruns; k++) {
            const struct kvctl_run *run = &r->runs[k];
            const struct kvctl_phase *p = run->open_error == KV_OK
                                              ? find_phase(run, a->phases[i].name) : NULL;
            if (!p)
                continue;
            char rate[32], tcp[32] = "";
            if (p->lookup)
                snprintf(rate, sizeof rate, "%.0f ids/s", kvctl_phase_kvs_s(p));
            else
                snprintf(rate, sizeof rate, "%.1f", kvctl_phase_mib_s(p));
            if (!p->lookup && r->tcp_mib_s > 0)
                snprintf(tcp, sizeof tcp, "%.2fx", kvctl_phase_mib_s(p) / r->tcp_mib_s);
            /* The client's CPU per GiB moved (per million ids for lookup):
             * what a backend costs the process that uses it. */
            double per = p->lookup ? (p->ops ? p->cpu_s / ((double)p->ops / 1e6) : 0)
                                   : (p->bytes ? p->cpu_s / ((double)p->bytes / (MIB * 1024)) : 0);
            /* A trace replay's phases interleave: only the whole replay has
             * a CPU time (in its trace figures). */
            char cpu[32] = "-";
            if (!run->trace.on)
                snprintf(cpu, sizeof cpu, "%7.2f s/%s", per, p->lookup ? "M" : "G");
            /* The serving process's CPU per GiB (per M ids), beside it:
             * client + server is the attached path's whole cost. */
            char scpu[32] = "";
            if (srv && p->has_server_cpu) {
                double sper = p->lookup ? (p->ops ? p->server_cpu_s / ((double)p->ops / 1e6) : 0)
                                        : (p->bytes ? p->server_cpu_s / ((double)p->bytes / (MIB * 1024))
                                                    : 0);
                snprintf(scpu, sizeof scpu, "   %7.2f s/%s", sper, p->lookup ? "M" : "G");
            }
            fprintf(f, "%-11s %-10s %12s %9.1f %9.1f %7s %12s%s\n", k ? "" : p->name,
                    run->backend, rate, p->p50_us, p->p99_us, tcp, cpu, scpu);
        }
    }
}

/* The trace figures of every run, one line each. */
static void print_trace_side_by_side(FILE *f, const struct kvctl_report *r)
{
    fprintf(f, "\n%-10s %8s %8s %8s %8s %8s %8s %7s %5s %9s %9s %10s %10s\n", "backend",
            "seconds", "prefix", "dram", "ssd", "ideal", "LRU", "broken", "verr", "p50 us",
            "p99 us", "load MiB/s", "dump MiB/s");
    for (int k = 0; k < r->nruns; k++) {
        const struct kvctl_run *run = &r->runs[k];
        const struct kvctl_trace_stats *t = &run->trace;
        if (run->open_error != KV_OK || !t->on)
            continue;
        char a[16], b[16], c[16], d[16], e[16];
        const struct kvctl_phase *ld = find_phase(run, "load"), *dp = find_phase(run, "dump");
        fprintf(f, "%-10s %8.3f %8s %8s %8s %8s %8s %7" PRIu64 " %5" PRIu64
                   " %9.1f %9.1f %10.1f %10.1f\n",
                run->backend, t->seconds, fmt_ratio(t->prefix_hit_ratio, a, sizeof a),
                fmt_ratio(t->hit_ratio_dram, b, sizeof b), fmt_ratio(t->hit_ratio_ssd, c, sizeof c),
                fmt_ratio(t->ideal_hit_ratio, d, sizeof d), fmt_ratio(t->lru_hit_ratio, e, sizeof e),
                t->broken_promises, t->verify_failures, t->p50_us, t->p99_us,
                ld ? kvctl_phase_mib_s(ld) : 0, dp ? kvctl_phase_mib_s(dp) : 0);
    }
}

void kvctl_report_print(FILE *f, const struct kvctl_report *r)
{
    char vs[32], total[32];
    fprintf(f, "kvctl bench: scenario %s, pipeline %s, dram.capacity %s\n", r->scenario,
            r->pipeline, r->dram_capacity);
    if (r->trace) {
        const struct kvctl_trace *t = r->trace;
        fprintf(f, "  trace %s: %zu requests, %zu block refs, %zu distinct blocks x %u shard%s"
                   " x %s (%s)\n",
                t->path, t->nreq, t->nrefs, t->ndistinct, r->shards, r->shards == 1 ? "" : "s",
                kvctl_fmt_size(r->value_size, vs, sizeof vs),
                kvctl_fmt_size((uint64_t)t->ndistinct * r->shards * r->value_size, total,
                               sizeof total));
        fprintf(f, "  %u job%s, ", r->numjobs, r->numjobs == 1 ? "" : "s");
        if (r->trace_speed > 0)
            fprintf(f, "timestamps / %g", r->trace_speed);
        else
            fprintf(f, "as fast as possible");
        fprintf(f, ", lease %u ms, verify on, salt %" PRIu64 "\n", r->lease_ttl_ms, r->salt);
    } else {
        fprintf(f, "  %" PRIu64 " objects x %s (%s), %u job%s, batch %u", r->nr_objects,
                kvctl_fmt_size(r->value_size, vs, sizeof vs),
                kvctl_fmt_size(r->nr_objects * r->value_size, total, sizeof total), r->numjobs,
                r->numjobs == 1 ? "" : "s", r->batch_size);
        if (r->pattern >= 0)
            fprintf(f, ", pattern 0x%02X", r->pattern);
        else
            fprintf(f, ", pattern random");
        fprintf(f, ", verify %s, salt %" PRIu64, r->verify ? "on" : "off", r->salt);
        if (r->runtime > 0)
            fprintf(f, ", runtime %.1f s", r->runtime);
        if (strcmp(r->scenario, "mixed_rw") == 0)
            fprintf(f, ", %u%% reads", r->rwmixread);
        fprintf(f, "\n");
    }
    fprintf(f, "  memcpy %.1f MiB/s (%u thread%s)\n", r->memcpy_mib_s, r->numjobs,
            r->numjobs == 1 ? "" : "s");
    if (r->tcp_mib_s > 0)
        fprintf(f, "  loopback TCP %.1f MiB/s (%u stream%s, %s writes)\n", r->tcp_mib_s,
                r->numjobs, r->numjobs == 1 ? "" : "s", vs);
    for (int i = 0; i < r->nruns; i++)
        print_run(f, r, &r->runs[i]);
    for (int i = 1; i < r->nruns; i++)
        print_compare(f, r, &r->runs[i]);
    if (r->nruns > 1)
        print_side_by_side(f, r);
    if (r->nruns > 1 && r->trace)
        print_trace_side_by_side(f, r);
    fflush(f);
}

/* ---- JSON ---------------------------------------------------------------- */

#define jstr kvctl_jstr
#define jnum kvctl_jnum

/* ,"key":v (a number, null when not finite). */
static void jfield(FILE *f, const char *key, double v)
{
    fprintf(f, ",\"%s\":", key);
    jnum(f, v);
}

static void jkey(FILE *f, const char *k)
{
    jstr(f, k);
    fputc(':', f);
}

static void json_phases(FILE *f, const struct kvctl_run *run)
{
    jkey(f, "phases");
    fputc('[', f);
    for (int i = 0; i < run->nphases; i++) {
        const struct kvctl_phase *p = &run->phases[i];
        fprintf(f, "%s{", i ? "," : "");
        jkey(f, "name");
        jstr(f, p->name);
        fprintf(f, ",\"ops\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"seconds\":", p->ops, p->bytes);
        jnum(f, p->seconds);
        jfield(f, "mib_s", kvctl_phase_mib_s(p));
        jfield(f, "client_cpu_s", p->cpu_s);
        if (p->has_server_cpu)   /* attached: the serving process's */
            jfield(f, "server_cpu_s", p->server_cpu_s);
        jfield(f, "kvs_s", kvctl_phase_kvs_s(p));
        fputs(",\"lat_us\":{\"p50\":", f);
        jnum(f, p->p50_us);
        jfield(f, "p95", p->p95_us);
        jfield(f, "p99", p->p99_us);
        fprintf(f, "},\"misses\":%" PRIu64 ",\"verify_failures\":%" PRIu64 ",\"errors\":%" PRIu64
                   "}",
                p->misses, p->verify_failures, p->errors);
    }
    fputc(']', f);
}

/* A count that may not apply: null when the ratio beside it is NAN. */
static void jcount(FILE *f, uint64_t v, bool applies)
{
    if (applies)
        fprintf(f, "%" PRIu64, v);
    else
        fputs("null", f);
}

/* DESIGN.md's "trace" object of one run. */
static void json_trace(FILE *f, const struct kvctl_run *run)
{
    const struct kvctl_trace_stats *t = &run->trace;
    const struct kvctl_phase *ld = find_phase(run, "load"), *dp = find_phase(run, "dump");
    fprintf(f, ",\"trace\":{\"requests\":%" PRIu64 ",\"block_refs\":%" PRIu64
               ",\"hits\":%" PRIu64 ",\"lookup_hits\":%" PRIu64 ",\"prefix_hit_ratio\":",
            t->requests, t->block_refs, t->hits, t->lookup_hits);
    jnum(f, t->prefix_hit_ratio);
    jfield(f, "hit_ratio_dram", t->hit_ratio_dram);
    jfield(f, "hit_ratio_ssd", t->hit_ratio_ssd);
    jfield(f, "ideal_hit_ratio", t->ideal_hit_ratio);
    jfield(f, "lru_hit_ratio", t->lru_hit_ratio);
    fputs(",\"lru_blocks\":", f);
    jcount(f, t->lru_blocks, isfinite(t->lru_hit_ratio));
    fputs(",\"lru_low_blocks\":", f);
    jcount(f, t->lru_low_blocks, isfinite(t->lru_hit_ratio));
    jfield(f, "lru_plain_hit_ratio", t->lru_plain_hit_ratio);
    fprintf(f, ",\"broken_promises\":%" PRIu64 ",\"verify_failures\":%" PRIu64
               ",\"dumps_refused\":%" PRIu64 ",\"spill_drops\":%" PRIu64 ",\"load_mib_s\":",
            t->broken_promises, t->verify_failures, t->dumps_refused, t->spill_drops);
    jnum(f, ld ? kvctl_phase_mib_s(ld) : NAN);
    jfield(f, "dump_mib_s", dp ? kvctl_phase_mib_s(dp) : NAN);
    jfield(f, "seconds", t->seconds);
    jfield(f, "client_cpu_s", t->cpu_s);
    fputs(",\"lookup_load_lat_us\":{\"p50\":", f);
    jnum(f, t->p50_us);
    jfield(f, "p99", t->p99_us);
    fprintf(f, "},\"tokens_skipped\":%" PRIu64 ",\"prompt_tokens\":%" PRIu64
               ",\"tokens_skipped_ratio\":",
            t->tokens_skipped, t->prompt_tokens);
    jnum(f, t->prompt_tokens ? (double)t->tokens_skipped / (double)t->prompt_tokens : NAN);
    fputc('}', f);
}

/* The fields that describe one backend's run beside its phases. */
static void json_run_extras(FILE *f, const struct kvctl_report *r, const struct kvctl_run *run)
{
    if (run->trace.on)
        json_trace(f, run);
    jfield(f, "open_ms", (double)run->info.open_ns / 1e6);
    if (run->open_error != KV_OK) {
        fputs(",\"open_error\":", f);
        jstr(f, kv_err_name(run->open_error));
    }
    jfield(f, "index_bytes_per_shard",
           run->info.shards ? (double)run->info.index_bytes / (double)run->info.shards : NAN);
    jfield(f, "rss_mib", (double)run->rss / MIB);
    jfield(f, "peak_rss_mib", (double)run->peak_rss / MIB);
    const struct kvctl_phase *lk = find_phase(run, "lookup");
    jfield(f, "lookup_ids_s", lk ? kvctl_phase_kvs_s(lk) : NAN);
    fputs(",\"memcpy_ratio\":{", f);
    int n = 0;
    for (int i = 0; i < run->nphases; i++) {
        if (run->phases[i].lookup)
            continue;
        fprintf(f, "%s", n++ ? "," : "");
        jkey(f, run->phases[i].name);
        jnum(f, ratio(kvctl_phase_mib_s(&run->phases[i]), r->memcpy_mib_s));
    }
    fputc('}', f);
    if (r->tcp_mib_s > 0) {
        fputs(",\"tcp_ratio\":{", f);
        n = 0;
        for (int i = 0; i < run->nphases; i++) {
            if (run->phases[i].lookup)
                continue;
            fprintf(f, "%s", n++ ? "," : "");
            jkey(f, run->phases[i].name);
            jnum(f, ratio(kvctl_phase_mib_s(&run->phases[i]), r->tcp_mib_s));
        }
        fputc('}', f);
    }
    if (run->addr) {
        fputs(",\"addr\":", f);
        jstr(f, run->addr);
    }
    fputs(",\"ok\":", f);
    fputs(kvctl_run_ok(r, run) ? "true" : "false", f);
}

static void json_ratios(FILE *f, const struct kvctl_run *a, const struct kvctl_run *b)
{
    fputs(",\"ratios\":{", f);
    int n = 0;
    if (a->trace.on && b->trace.on) {
        /* The whole replay: how many times faster the main run was. */
        fputs("\"replay\":{\"speedup\":", f);
        jnum(f, ratio(b->trace.seconds, a->trace.seconds));
        fputc('}', f);
        n++;
    }
    for (int i = 0; i < a->nphases; i++) {
        const struct kvctl_phase *pa = &a->phases[i], *pb = find_phase(b, pa->name);
        if (!pb)
            continue;
        fprintf(f, "%s", n++ ? "," : "");
        jkey(f, pa->name);
        if (pa->lookup) {
            fputs("{\"ids_s\":", f);
            jnum(f, ratio(kvctl_phase_kvs_s(pa), kvctl_phase_kvs_s(pb)));
        } else {
            fputs("{\"kvs_s\":", f);
            jnum(f, ratio(kvctl_phase_kvs_s(pa), kvctl_phase_kvs_s(pb)));
            jfield(f, "mib_s", ratio(kvctl_phase_mib_s(pa), kvctl_phase_mib_s(pb)));
        }
        fputc('}', f);
    }
    /* As print_compare: the attached dump from kv_buffer_alloc memory over
     * the in-process one (kvbuf_inproc, or the in-process run's write). */
    const struct kvctl_phase *kb = find_phase(a, "write_kvbuf"), *w = kvbuf_base(a, b);
    if (kb && w && strcmp(b->backend, "dram") == 0) {
        fprintf(f, "%s\"write_kvbuf/write\":{\"kvs_s\":", n++ ? "," : "");
        jnum(f, ratio(kvctl_phase_kvs_s(kb), kvctl_phase_kvs_s(w)));
        jfield(f, "mib_s", ratio(kvctl_phase_mib_s(kb), kvctl_phase_mib_s(w)));
        jfield(f, "p50", ratio(w->p50_us, kb->p50_us));
        fprintf(f, ",\"against\":\"%s\"", w->name);
        fputc('}', f);
    }
    fputc('}', f);
}

int kvctl_report_json(const char *path, const struct kvctl_report *r)
{
    FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
    if (!f) {
        perror(path);
        return KV_EIO;
    }
    const struct kvctl_run *run = &r->runs[0];
    fputc('{', f);
    jkey(f, "scenario");
    jstr(f, r->scenario);
    jfield(f, "memcpy_mib_s", r->memcpy_mib_s);
    if (r->tcp_mib_s > 0) {
        jfield(f, "tcp_mib_s", r->tcp_mib_s);
    }
    fprintf(f, ",\"salt\":%" PRIu64 ",", r->salt);
    json_phases(f, run);
    fputs(",\"backend\":", f);
    jstr(f, run->backend);
    fputs(",\"pipeline\":", f);
    jstr(f, r->pipeline);
    fputs(",\"dram_capacity\":", f);
    jstr(f, r->dram_capacity);
    fprintf(f, ",\"value_size\":%" PRIu64 ",\"nr_objects\":%" PRIu64
               ",\"numjobs\":%u,\"batch_size\":%u,\"runtime_s\":",
            r->value_size, r->nr_objects, r->numjobs, r->batch_size);
    jnum(f, r->runtime);
    if (strcmp(r->scenario, "mixed_rw") == 0)
        fprintf(f, ",\"rwmixread\":%u", r->rwmixread);
    fputs(",\"pattern\":", f);
    if (r->pattern >= 0) {
        char pat[16];
        snprintf(pat, sizeof pat, "0x%02X", r->pattern);
        jstr(f, pat);
    } else {
        jstr(f, "random");
    }
    fprintf(f, ",\"verify\":%s", r->verify ? "true" : "false");
    if (r->trace) {
        fputs(",\"trace_file\":", f);
        jstr(f, r->trace->path);
        fprintf(f, ",\"shards\":%u,\"trace_limit\":%" PRIu64 ",\"trace_speed\":",
                r->shards, r->trace_limit);
        jnum(f, r->trace_speed);
        fprintf(f, ",\"lease_ttl_ms\":%u,\"distinct_blocks\":%zu", r->lease_ttl_ms,
                r->trace->ndistinct);
    }
    json_run_extras(f, r, run);
    fputs(",\"comparisons\":[", f);
    for (int i = 1; i < r->nruns; i++) {
        fprintf(f, "%s{", i > 1 ? "," : "");
        jkey(f, "backend");
        jstr(f, r->runs[i].backend);
        if (r->runs[i].pipeline[0]) {
            fputs(",\"pipeline\":", f);
            jstr(f, r->runs[i].pipeline);
        }
        fputc(',', f);
        json_phases(f, &r->runs[i]);
        json_run_extras(f, r, &r->runs[i]);
        json_ratios(f, run, &r->runs[i]);
        fputc('}', f);
    }
    fputs("]}\n", f);
    int bad = ferror(f);
    if (f != stdout)
        bad |= fclose(f) != 0;
    else
        bad |= fflush(f) != 0;
    if (bad) {
        fprintf(stderr, "kvctl: %s: write failed\n", path);
        return KV_EIO;
    }
    return KV_OK;
}
