#!/bin/bash
# attached_dumps.sh — attached 1 MiB dumps from kv_buffer_alloc memory
# (--kv-buffers: one copy, the server's) and from the bench's own buffers
# (two copies), each run with --compare dram (the same dump in process,
# from the same kind of memory), beside one kvnode serving store.name=da
# (pipeline dram). A measurement to read, not a test (doc/perf.md,
# "Attached dumps, seventh round").
#
#   bash bench/attached_dumps.sh [BUILD]      (default build)
#   AB=1 bash bench/attached_dumps.sh [BUILD]
#
# AB=1 runs bench/attached_ab.c instead (built here against BUILD's
# library): the same dumps, attached and in process alternated batch by
# batch in one process, so that both see the machine's drift alike; the
# phases of kvctl bench --compare run one after the other, and on a shared
# VM their ratio swung from 0.4x to 1.3x between rounds of one build.
#
# Environment: ROUNDS (5), ARGS (bench arguments; default 1 MiB x 512,
# batch 16), GIB (the kvnode's dram.capacity in GiB, 4), OUT (a directory for
# the summaries; default a temp dir that is removed). The kvnode is
# stopped on exit, however it exits.
set -u
B=$(cd "${1:-build}" && pwd) || exit 2
ROUNDS=${ROUNDS:-5}
ARGS=${ARGS:-"--scenario write_perf --value-size 1MiB --nr-objects 512 --batch-size 16"}
GIB=${GIB:-4}
KEEP=${OUT:+1}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/dumps.XXXXXX")}
. "$(dirname "$0")/kvnode_up.sh"
kvnode_up "$B" da "$GIB"
if [ -n "${AB:-}" ]; then
    cc -O2 -I"$(dirname "$0")/../include" "$(dirname "$0")/attached_ab.c" -o "$OUT/attached_ab" -L"$B" -lkvengine \
        -Wl,-rpath,"$B" || exit 1
    for r in $(seq 1 "$ROUNDS"); do
        for how in "" own; do
            "$OUT/attached_ab" da "$OUT/rv" 1048576 16 "${BATCHES:-80}" $how | tail -4 || exit 1
        done
    done
    exit 0
fi
for r in $(seq 1 "$ROUNDS"); do
    for how in kvbuf own; do
        extra=""; [ $how = kvbuf ] && extra=--kv-buffers
        "$B/kvctl" $C --set dram.capacity=1GiB bench $ARGS $extra --compare dram \
            --summary-json "$OUT/$how.$r.json" > "$OUT/$how.$r.txt" 2>&1 || { cat "$OUT/$how.$r.txt"; exit 1; }
        python3 - "$OUT/$how.$r.json" "$how" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
a = {p["name"]: p for p in j["phases"]}["write"]
b = {p["name"]: p for p in j["comparisons"][0]["phases"]}["write"]
print(f"{sys.argv[2]:5} write {a['mib_s']:8.0f} MiB/s p50 {a['lat_us']['p50']:7.1f} us"
      f" | in process {b['mib_s']:8.0f} p50 {b['lat_us']['p50']:7.1f}"
      f" | ratio {a['mib_s'] / b['mib_s']:.2f}x p50 {b['lat_us']['p50'] / a['lat_us']['p50']:.2f}x"
      f" | cpu client {a.get('client_cpu_s', 0):.3f} server {a.get('server_cpu_s', 0):.3f}"
      f" in process {b.get('client_cpu_s', 0):.3f} s")
PY
    done
done
