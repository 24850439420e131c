/*
 * plot.c — `kvctl bench --plot FILE.png`: the benchmark's figures as
 * a picture, drawn by gnuplot.
 *
 * Key design choice: gnuplot runs as a program (popen), fed one script with
 * the data inline (gnuplot 5 "$name << EOD" blocks), so kvctl links no
 * plotting library and the script is plain text a user can read with
 * KVCTL_PLOT_SCRIPT=FILE (the script is also written there). Panels: MiB/s
 * per data phase and lookup ids/s (one bar per backend), task latency
 * percentiles per phase (log scale), and with --compare the kvengine/other
 * ratios of kvs/s per phase. A trace replay draws instead its hit ratio over
 * the trace, per window of requests and cumulated, for every run beside the
 * infinite cache and the LRU model.
 */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

static const struct kvctl_phase *find(const struct kvctl_run *run, const char *name)
{
    for (int i = 0; i < run->nphases; i++)
        if (strcmp(run->phases[i].name, name) == 0)
            return &run->phases[i];
    return NULL;
}

static void quote_path(FILE *f, const char *png);

static void script(FILE *f, const char *png, const struct kvctl_report *r)
{
    const struct kvctl_run *a = &r->runs[0];
    bool cmp = r->nruns >= 2 && r->runs[1].open_error == KV_OK;
    int panels = cmp ? 3 : 2;
    char vs[32];
    fprintf(f, "set terminal pngcairo noenhanced size 1200,%d font 'sans,10'\n", 330 * panels);
    quote_path(f, png);
    /* Throughput of the data phases in MiB/s, per backend; a lookup phase
     * moves no bytes, so its ids/s go into the panel's title instead of a
     * bar on a scale a thousand times off. */
    int ndata = 0;
    char lk[160] = "";
    fprintf(f, "$tput << EOD\nphase %s %s\n", a->backend, cmp ? r->runs[1].backend : "-");
    for (int i = 0; i < a->nphases; i++) {
        const struct kvctl_phase *p = &a->phases[i], *q = cmp ? find(&r->runs[1], p->name) : NULL;
        if (p->lookup) {
            int w = snprintf(lk, sizeof lk, "; lookup %.2f M ids/s", kvctl_phase_kvs_s(p) / 1e6);
            if (q && w > 0 && (size_t)w < sizeof lk)
                snprintf(lk + w, sizeof lk - (size_t)w, " (%s %.2f M)", r->runs[1].backend,
                         kvctl_phase_kvs_s(q) / 1e6);
            continue;
        }
        fprintf(f, "\"%s\" %.6g %.6g\n", p->name, kvctl_phase_mib_s(p),
                q ? kvctl_phase_mib_s(q) : 0);
        ndata++;
    }
    fprintf(f, "EOD\n$lat << EOD\nphase p50 p95 p99\n");
    for (int i = 0; i < a->nphases; i++) {
        const struct kvctl_phase *p = &a->phases[i];
        fprintf(f, "\"%s\" %.6g %.6g %.6g\n", p->name, p->p50_us > 0 ? p->p50_us : 0.01,
                p->p95_us > 0 ? p->p95_us : 0.01, p->p99_us > 0 ? p->p99_us : 0.01);
    }
    fprintf(f, "EOD\n");
    if (cmp) {
        fprintf(f, "$ratio << EOD\n");
        for (int i = 0; i < a->nphases; i++) {
            const struct kvctl_phase *p = &a->phases[i], *q = find(&r->runs[1], p->name);
            if (q)
                fprintf(f, "\"%s\" %.6g\n", p->name, ratio(kvctl_phase_kvs_s(p), kvctl_phase_kvs_s(q)));
        }
        fprintf(f, "EOD\n");
    }
    fprintf(f,
            "set multiplot layout %d,1 title \"kvctl bench: %s, %llu x %s, %u job(s), batch %u, "
            "pipeline %s\" font ',12'\n"
            "set style data histograms\nset style histogram clustered gap 1\n"
            "set style fill solid 0.85 border -1\nset boxwidth 0.9\nset grid ytics\n"
            "set key top right\nset yrange [0:*]\nset xtics nomirror\n",
            panels, r->scenario, (unsigned long long)r->nr_objects,
            kvctl_fmt_size(r->value_size, vs, sizeof vs), r->numjobs, r->batch_size, r->pipeline);
    fprintf(f, "set title 'Throughput per phase (MiB/s)%s'\nset ylabel 'MiB/s'\n", lk);
    fprintf(f, "set xrange [-0.6:%f]\n", ndata - 0.4);
    if (cmp)
        fprintf(f, "plot $tput using 2:xtic(1) title columnheader(2), '' using 3 title columnheader(3)\n");
    else
        fprintf(f, "plot $tput using 2:xtic(1) title columnheader(2)\n");
    fprintf(f, "set title 'Task latency percentiles (%s)'\nset ylabel 'us'\nset logscale y\n"
               "set yrange [*:*]\nset xrange [-0.6:%f]\nset key outside right top\n"
               "plot $lat using 2:xtic(1) title columnheader(2), '' using 3 title columnheader(3), '' using 4 title columnheader(4)\n"
               "unset logscale y\nset yrange [0:*]\nset key inside top right\n",
            a->backend, a->nphases - 0.4);
    if (cmp)
        fprintf(f, "set title '%s / %s: kvs/s per phase (above 1: %s faster)'\n"
                   "set ylabel 'ratio'\nset arrow 1 from graph 0, first 1 to graph 1, first 1 "
                   "nohead dt 2 lw 2\n"
                   "plot $ratio using 2:xtic(1) notitle lc rgb '#4a7ebb'\n",
                a->backend, r->runs[1].backend, a->backend);
    fprintf(f, "unset multiplot\n");
}

/* Block-weighted hit ratio of requests [lo, hi) by per-request hits h. */
static double window_ratio(const struct kvctl_trace *t, const uint32_t *h, size_t lo, size_t hi)
{
    uint64_t hits = 0, refs = 0;
    for (size_t i = lo; i < hi; i++) {
        hits += h[i];
        refs += t->req[i].n;
    }
    return refs ? (double)hits / (double)refs : 0;
}

static void quote_path(FILE *f, const char *png)
{
    fprintf(f, "set output '");
    for (const char *p = png; *p; p++)   /* gnuplot single quotes: '' is a quote */
        fprintf(f, *p == '\'' ? "''" : "%c", *p);
    fprintf(f, "'\n");
}

/* A trace replay: two panels, hit ratio per window of requests and
 * cumulated, one line per run and one per model. */
static void trace_script(FILE *f, const char *png, const struct kvctl_report *r)
{
    const struct kvctl_trace *t = r->trace;
    const struct kvctl_run *series[KVCTL_MAX_RUNS];
    int ns = 0;
    for (int i = 0; i < r->nruns; i++)
        if (r->runs[i].open_error == KV_OK && r->runs[i].trace.on && r->runs[i].trace.req_hits)
            series[ns++] = &r->runs[i];
    const uint32_t *lru = r->runs[0].trace.lru_req_hits;
    size_t w = t->nreq / 100 ? t->nreq / 100 : 1;
    char vs[32];
    fprintf(f, "set terminal pngcairo noenhanced size 1200,760 font 'sans,10'\n");
    quote_path(f, png);
    for (int pass = 0; pass < 2; pass++) {
        fprintf(f, "$%s << EOD\nrequest", pass ? "cum" : "win");
        for (int k = 0; k < ns; k++)
            fprintf(f, " \"%s\"", series[k]->backend);
        fprintf(f, " ideal%s\n", lru ? " LRU" : "");
        for (size_t lo = 0; lo < t->nreq; lo += w) {
            size_t hi = lo + w < t->nreq ? lo + w : t->nreq, from = pass ? 0 : lo;
            fprintf(f, "%zu", hi);
            for (int k = 0; k < ns; k++)
                fprintf(f, " %.5f", window_ratio(t, series[k]->trace.req_hits, from, hi));
            fprintf(f, " %.5f", window_ratio(t, r->ideal_req_hits, from, hi));
            if (lru)
                fprintf(f, " %.5f", window_ratio(t, lru, from, hi));
            fprintf(f, "\n");
        }
        fprintf(f, "EOD\n");
    }
    int cols = ns + 1 + (lru != NULL);
    fprintf(f, "set multiplot layout 2,1 title \"kvctl bench: trace %zu requests, %u shard(s) "
               "x %s, %u job(s), pipeline %s, dram.capacity %s\" font ',12'\n"
               "set grid\nset key outside right top\nset yrange [0:1]\n"
               "set xlabel 'request'\nset ylabel 'prefix hit ratio'\n",
            t->nreq, r->shards, kvctl_fmt_size(r->value_size, vs, sizeof vs), r->numjobs,
            r->pipeline, r->dram_capacity);
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            fprintf(f, "set title 'Cumulated: blocks loaded / block references so far'\n");
        else
            fprintf(f, "set title 'Per window of %zu requests'\n", w);
        fprintf(f, "plot ");
        for (int c = 0; c < cols; c++) {
            bool model = c >= ns;
            fprintf(f, "%s$%s using 1:%d with lines lw %s%s title columnheader(%d)",
                    c ? ", " : "", pass ? "cum" : "win", c + 2, model ? "1.5" : "2",
                    model ? " dt 2" : "", c + 2);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
}

int kvctl_plot(const char *png, const struct kvctl_report *r)
{
    if (r->nruns < 1 || r->runs[0].open_error != KV_OK || r->runs[0].nphases == 0) {
        fprintf(stderr, "kvctl bench: --plot: nothing to plot (the run did not happen)\n");
        return KV_EIO;
    }
    const char *keep = getenv("KVCTL_PLOT_SCRIPT");
    if (keep && *keep) {
        FILE *k = fopen(keep, "w");
        if (k) {
            (r->trace ? trace_script : script)(k, png, r);
            fclose(k);
        }
    }
    /* gnuplot's own complaints go to our stderr; its stdout is silenced. */
    FILE *g = popen("gnuplot >/dev/null", "w");
    if (!g) {
        fprintf(stderr, "kvctl bench: --plot: cannot run gnuplot: %s\n", strerror(errno));
        return KV_EIO;
    }
    (r->trace ? trace_script : script)(g, png, r);
    int st = pclose(g);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "kvctl bench: --plot: gnuplot failed%s (is gnuplot installed? "
                        "Debian: apt-get install gnuplot-nox)\n",
                WIFEXITED(st) && WEXITSTATUS(st) == 127 ? ": not found" : "");
        return KV_EIO;
    }
    return KV_OK;
}
