#!/bin/bash
# direct_reads.sh — attached 64 KiB one-pass reads with store.direct_reads
# true and false alternated, beside one kvnode serving store.name=dx
# (pipeline dram, 2 GiB), each run with --compare dram (the same load in
# process). A measurement to read, not a test (doc/perf.md, "Attached
# loads, sixth round").
#
#   bash bench/direct_reads.sh [BUILD]      (default build)
#
# Environment: ROUNDS (5), ARGS (bench arguments; default 64 KiB x 2048,
# small enough that every round's blocks stay in DRAM under the others'
# 60 s lookup leases), OUT (a directory for the summaries; default a temp
# dir that is removed). The kvnode is stopped on exit, however it exits.
set -u
B=$(cd "${1:-build}" && pwd) || exit 2
ROUNDS=${ROUNDS:-5}
ARGS=${ARGS:-"--value-size 64KiB --nr-objects 2048"}
KEEP=${OUT:+1}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/direct.XXXXXX")}
. "$(dirname "$0")/kvnode_up.sh"
kvnode_up "$B" dx 2
for r in $(seq 1 "$ROUNDS"); do
    for d in true false; do
        "$B/kvctl" $C --set dram.capacity=2GiB --set store.direct_reads=$d bench $ARGS --compare dram \
            --summary-json "$OUT/$d.$r.json" > "$OUT/$d.$r.txt" 2>&1 || { cat "$OUT/$d.$r.txt"; exit 1; }
        python3 - "$OUT/$d.$r.json" "$d" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
a = {p["name"]: p for p in j["phases"]}["read"]
b = {p["name"]: p for p in j["comparisons"][0]["phases"]}["read"]
print(f"direct={sys.argv[2]:5} read {a['mib_s']:8.0f} MiB/s p50 {a['lat_us']['p50']:6.1f} us"
      f" | in process {b['mib_s']:8.0f} p50 {b['lat_us']['p50']:6.1f}"
      f" | ratio {a['mib_s'] / b['mib_s']:.2f}x"
      f" | cpu client {a.get('client_cpu_s', 0):.3f} server {a.get('server_cpu_s', 0):.3f}"
      f" in process {b.get('client_cpu_s', 0):.3f} s")
PY
    done
done
