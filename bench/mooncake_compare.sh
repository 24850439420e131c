#!/bin/bash
# mooncake_compare.sh — Mooncake's own store_kv_bench.py against real
# Mooncake Store and against kvengine's drop-in (mooncake.store from
# python/compat), side by side on this machine: the same benchmark file,
# the same arguments, the systems taking turns, ROUNDS rounds. A
# measurement to read, not a test (CI does not run it).
#
#   bash bench/mooncake_compare.sh MOONCAKE_BUILD_DIR [KVENGINE_BUILD_DIR]
#
# MOONCAKE_BUILD_DIR is a CMake build of Mooncake (kvcache-ai/Mooncake)
# holding mooncake-store/src/mooncake_master and
# mooncake-integration/store*.so (TCP only, no CUDA, no etcd; doc/perf.md
# says how this one was built). The benchmark and the wheel's pure-Python
# modules come from its source tree (CMakeCache's CMAKE_HOME_DIRECTORY, or
# MOONCAKE_SRC). KVENGINE_BUILD_DIR (default build) holds libkvengine.so.0
# and kvmaster.
#
# Systems (SYSTEMS, in this order within a round):
#   mooncake  mooncake_master (HTTP metadata server in it) on loopback; the
#             benchmark process is the one client and holds the segment,
#             as store_kv_bench.md's examples run it;
#   kvmaster  kvengine's drop-in joined to a kvmaster on loopback (a
#             one-member cluster), the same arguments;
#   embedded  kvengine's drop-in with --master-server "" (a single-process
#             engine, the drop-in's default).
#   null      a "null store" (bench/null_store.py through the benchmark's
#             MOONCAKE_STORE_MODULE): the calls the benchmark makes, as cheap
#             as Python allows (a dict of bytes, memmove into the caller's
#             buffers). No store can do less, so what it reaches is the most
#             any store could reach in this harness on this machine: the
#             table adds X/null for every other system when it runs. A
#             measurement tool, not a store (one process; no leases).
#   kvmaster0, embedded0  the same with the Python package of BASELINE_PY
#             (another checkout's python/ directory, e.g. `git archive main
#             python | tar -x -C DIR`, then DIR/python) and the library
#             BASELINE_LIB (default: the same libkvengine.so.0): a change
#             measured before and after in one run.
# With TOPOLOGY=remote the segment lives in a second process instead (a
# "holder": a store set up with the segment that sleeps), and the benchmark
# sets up with --global-segment-size 0, so every byte crosses loopback TCP
# (Mooncake's transfer engine; kvengine's tcp transport); embedded is
# skipped there (it has no second process), and so is null.
#
# Real Mooncake has no isExist, which the benchmark calls in metadata_smoke,
# mixed_metadata, remove_perf and replay (and in zcopy reads that fail): it
# records 0 requests there. MC_SHIM=1 (default) runs Mooncake through a
# module that adds isExist = is_exist (MOONCAKE_STORE_MODULE, which the
# benchmark honours), so those scenarios measure something; MC_SHIM=0 runs
# the bare module.
#
# Environment: ROUNDS (3), SCENARIOS (all nine), IO_APIS ("plain zcopy"),
# SYSTEMS ("mooncake kvmaster embedded"), VALUE_SIZE (65536), NR_OBJECTS
# (1024), WRITE_OBJECTS (2048), BATCH (4), NUMJOBS (1), RUNTIME (2 s, the
# time-based phases), SEGMENT (384 MiB), LOCAL_BUF (128 MiB), RUN_TIMEOUT
# (90 s a run), PORTS (25000-25999), OUT (a directory for the summaries and
# logs; default a temp dir that is removed), TOPOLOGY (local | remote),
# BASELINE_PY and BASELINE_LIB (for kvmaster0 / embedded0).
# Every process it starts is stopped on exit, however it exits.
set -euo pipefail

usage() { sed -n '2,58p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; echo "mooncake_compare.sh: give the Mooncake build dir" >&2; exit 2; }
MC=$(cd "$1" 2>/dev/null && pwd) || { echo "mooncake_compare.sh: $1: no such directory" >&2; exit 2; }
KB=$(cd "${2:-build}" 2>/dev/null && pwd) || { echo "mooncake_compare.sh: ${2:-build}: no such directory" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)

SYSTEMS=${SYSTEMS:-"mooncake kvmaster embedded"}
MASTER_BIN=$MC/mooncake-store/src/mooncake_master
STORE_SO=$(ls "$MC"/mooncake-integration/store*.so 2>/dev/null | head -n1 || true)
case " $SYSTEMS " in *" mooncake "*)
    [ -x "$MASTER_BIN" ] || { echo "mooncake_compare.sh: $MASTER_BIN missing: not a Mooncake build (ninja mooncake_master store)" >&2; exit 2; }
    [ -n "$STORE_SO" ] || { echo "mooncake_compare.sh: $MC/mooncake-integration/store*.so missing: build the store module (ninja store)" >&2; exit 2; } ;;
esac
# Without mooncake in SYSTEMS (kvengine's side alone) a build that is not
# finished, or Mooncake's source tree itself, is enough: only the benchmark
# is needed.
SRC=${MOONCAKE_SRC:-$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$MC/CMakeCache.txt" 2>/dev/null || true)}
[ -n "$SRC" ] || SRC=$MC
BENCH=$SRC/mooncake-store/benchmarks/store_kv_bench.py
[ -f "$BENCH" ] || { echo "mooncake_compare.sh: $BENCH missing (set MOONCAKE_SRC to Mooncake's source tree)" >&2; exit 2; }
[ -d "$SRC/mooncake-wheel/mooncake" ] || { echo "mooncake_compare.sh: $SRC/mooncake-wheel/mooncake missing" >&2; exit 2; }
case " $SYSTEMS " in *"0 "*)
    [ -f "${BASELINE_PY:-}/kvengine/mooncake.py" ] || { echo "mooncake_compare.sh: kvmaster0/embedded0 need BASELINE_PY, a python/ directory holding kvengine/" >&2; exit 2; }
    BASELINE_PY=$(cd "$BASELINE_PY" && pwd)
    BASELINE_LIB=$(realpath "${BASELINE_LIB:-$KB/libkvengine.so.0}") ;;
esac
for f in "$KB/libkvengine.so.0" "$KB/kvmaster"; do
    [ -e "$f" ] || { echo "mooncake_compare.sh: $f missing (make all)" >&2; exit 2; }
done

ROUNDS=${ROUNDS:-3}
SCENARIOS=${SCENARIOS:-"verify_write fill write_perf read_perf mixed_rw metadata_smoke mixed_metadata remove_perf replay"}
IO_APIS=${IO_APIS:-"plain zcopy"}
VALUE_SIZE=${VALUE_SIZE:-65536}
NR_OBJECTS=${NR_OBJECTS:-1024}
WRITE_OBJECTS=${WRITE_OBJECTS:-2048}
BATCH=${BATCH:-4}
NUMJOBS=${NUMJOBS:-1}
RUNTIME=${RUNTIME:-2}
SEGMENT=${SEGMENT:-$((384 << 20))}
LOCAL_BUF=${LOCAL_BUF:-$((128 << 20))}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
PORTS=${PORTS:-25000-25999}
TOPOLOGY=${TOPOLOGY:-local}
MC_SHIM=${MC_SHIM:-1}
PORT_LO=${PORTS%-*}
PORT_HI=${PORTS#*-}
case "$TOPOLOGY" in local|remote) ;; *) echo "mooncake_compare.sh: TOPOLOGY is local or remote" >&2; exit 2 ;; esac

TMP=$(mktemp -d "${TMPDIR:-/tmp}/mccompare.XXXXXX")
KEEP_OUT=1
if [ -z "${OUT:-}" ]; then OUT=$TMP/out; KEEP_OUT=0; fi
mkdir -p "$OUT"
PIDS=()
stop_all() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
cleanup() {
    stop_all
    if [ "$KEEP_OUT" = 1 ]; then rm -rf "$TMP/mcpkg" "$TMP"/*.py; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The real package: the wheel's pure-Python modules and the built module,
# where `import mooncake.store` finds them (the build is not installed).
mkdir -p "$TMP/mcpkg/mooncake"
cp "$SRC"/mooncake-wheel/mooncake/*.py "$TMP/mcpkg/mooncake/"
[ -z "$STORE_SO" ] || ln -s "$STORE_SO" "$TMP/mcpkg/mooncake/$(basename "$STORE_SO")"
cat >"$TMP/mcshim.py" <<'EOF'
"""Real mooncake.store plus isExist (= is_exist), which the benchmark calls."""
from mooncake.store import *  # noqa: F401,F403
from mooncake import store as _s
BufferPool = _s.BufferPool


class MooncakeDistributedStore(_s.MooncakeDistributedStore):
    def isExist(self, key):
        return self.is_exist(key)


ReplicateConfig = _s.ReplicateConfig
EOF
# A holder for TOPOLOGY=remote: sets a store up with the segment and sleeps.
cat >"$TMP/holder.py" <<'EOF'
import sys, time
from mooncake.store import MooncakeDistributedStore
host, meta, seg, buf, master = sys.argv[1:6]
s = MooncakeDistributedStore()
rc = s.setup(host, meta, int(seg), int(buf), "tcp", "", master)
if rc != 0:
    sys.exit("holder: setup failed: %s" % rc)
print("ready", flush=True)
while True:
    time.sleep(3600)
EOF

used=" "
port() {
    local p
    while :; do
        p=$(( PORT_LO + (RANDOM * 32768 + RANDOM) % (PORT_HI - PORT_LO + 1) ))
        case "$used" in *" $p "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            used="$used$p "
            echo "$p"
            return
        fi
    done
}
wait_port() {   # port, what, log
    local i
    for i in $(seq 150); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "mooncake_compare.sh: nothing listens on 127.0.0.1:$1 ($2); $3:" >&2
    tail -n 20 "$3" >&2 || true
    return 1
}
wait_line() {   # file, text: the holder says it is set up (60 s at most)
    local i
    for i in $(seq 600); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "mooncake_compare.sh: holder not ready; $1:" >&2
    tail -n 20 "$1" >&2 || true
    return 1
}

# The replay scenario replays a journal: one written here by the
# benchmark's own mixed_metadata (--journal all) on the embedded engine.
# Its operations depend on the seed only, not on the system that ran it.
REPLAY=$TMP/replay.jsonl
replay_file() {
    [ -s "$REPLAY" ] && return 0
    PYTHONPATH="$ROOT/python/compat:$ROOT/python" KVENGINE_LIBRARY="$KB/libkvengine.so.0" \
        KVENGINE_SETTINGS="log.level=warn" \
        timeout "$RUN_TIMEOUT" python3 "$BENCH" --scenario mixed_metadata --io-api plain \
        --local-hostname 127.0.0.1 --master-server "" --protocol tcp \
        --global-segment-size "$SEGMENT" --local-buffer-size "$LOCAL_BUF" \
        --nr-objects "$NR_OBJECTS" --value-size "$VALUE_SIZE" --numjobs "$NUMJOBS" \
        --key-prefix replay --journal all --output-dir "$TMP/replaygen" \
        >"$TMP/replaygen.log" 2>&1 || true
    [ -s "$TMP/replaygen/journal.jsonl" ] || { echo "mooncake_compare.sh: no replay journal; $TMP/replaygen.log:" >&2; tail -n 20 "$TMP/replaygen.log" >&2; return 1; }
    cp "$TMP/replaygen/journal.jsonl" "$REPLAY"
}

# One benchmark run: system scenario io-api round -> $OUT/S-SC-API-rR.json
run_one() {
    local sys=$1 sc=$2 api=$3 r=$4
    local tag="$sys-$sc-$api-r$r" log="$OUT/$sys-$sc-$api-r$r.log" json="$OUT/$sys-$sc-$api-r$r.json"
    local master="" meta="http://127.0.0.1:1/metadata" seg=$SEGMENT pp env=()
    local py=$ROOT/python lib=$KB/libkvengine.so.0
    case "$sys" in *0) py=$BASELINE_PY lib=$BASELINE_LIB ;; esac
    local extra=()
    case "$sc" in
        verify_write) extra=(--verify --pattern 0xab) ;;
        read_perf) extra=(--prepare-mode auto --runtime "$RUNTIME" --verify --pattern 0xee) ;;
        mixed_rw) extra=(--prepare-mode auto --runtime "$RUNTIME" --write-objects "$WRITE_OBJECTS" --rwmixread 70 --verify --pattern 0x5a) ;;
        # write_perf's deadline starts before the store is set up (the
        # benchmark makes its sessions inside the phase), so a short runtime
        # can end before the first write; WRITE_OBJECTS ends it instead.
        write_perf) extra=(--runtime "$((RUNTIME + 30))" --write-objects "$WRITE_OBJECTS") ;;
        fill) extra=(--write-objects "$WRITE_OBJECTS") ;;
        replay) replay_file; extra=(--replay-file "$REPLAY" --key-prefix replay) ;;
    esac
    stop_all
    case "$sys" in
        mooncake)
            local mp hp xp
            mp=$(port); hp=$(port); xp=$(port)
            "$MASTER_BIN" --port="$mp" --rpc_address=127.0.0.1 --enable_http_metadata_server=true \
                --http_metadata_server_port="$hp" --http_metadata_server_host=127.0.0.1 \
                --metrics_port="$xp" --metrics_host=127.0.0.1 --enable_metric_reporting=false \
                >"$OUT/$tag.master.log" 2>&1 &
            PIDS+=($!)
            wait_port "$mp" mooncake_master "$OUT/$tag.master.log" || return 1
            wait_port "$hp" "mooncake_master's metadata server" "$OUT/$tag.master.log" || return 1
            master=127.0.0.1:$mp
            meta=http://127.0.0.1:$hp/metadata
            # the store module links the build's libasio.so (mooncake-common)
            env=(PYTHONPATH="$TMP/mcpkg:$TMP" LD_LIBRARY_PATH="$MC/mooncake-common${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
            [ "$MC_SHIM" = 1 ] && env+=(MOONCAKE_STORE_MODULE=mcshim)
            ;;
        kvmaster|kvmaster0)
            local kp
            kp=$(port)
            "$KB/kvmaster" --set cluster.master=127.0.0.1:"$kp" --set log.level=warn \
                >"$OUT/$tag.master.log" 2>&1 &
            PIDS+=($!)
            wait_port "$kp" kvmaster "$OUT/$tag.master.log" || return 1
            master=127.0.0.1:$kp
            env=(PYTHONPATH="$py/compat:$py" KVENGINE_LIBRARY="$lib"
                 KVENGINE_SETTINGS="cluster.listen=127.0.0.1:0 log.level=warn")
            ;;
        embedded|embedded0)
            env=(PYTHONPATH="$py/compat:$py" KVENGINE_LIBRARY="$lib"
                 KVENGINE_SETTINGS="log.level=warn")
            ;;
        null)
            env=(PYTHONPATH="$ROOT/bench" MOONCAKE_STORE_MODULE=null_store)
            ;;
        *) echo "mooncake_compare.sh: unknown system $sys" >&2; return 1 ;;
    esac
    if [ "$TOPOLOGY" = remote ]; then
        pp=$(port)
        env "${env[@]}" python3 "$TMP/holder.py" "127.0.0.1:$pp" "$meta" "$SEGMENT" "$LOCAL_BUF" "$master" \
            >"$OUT/$tag.holder.log" 2>&1 &
        PIDS+=($!)
        wait_line "$OUT/$tag.holder.log" ready || return 1
        seg=0
    fi
    pp=$(port)
    local rc=0
    env "${env[@]}" timeout "$RUN_TIMEOUT" python3 "$BENCH" --scenario "$sc" --io-api "$api" \
        --local-hostname "127.0.0.1:$pp" --metadata-server "$meta" --master-server "$master" \
        --protocol tcp --global-segment-size "$seg" --local-buffer-size "$LOCAL_BUF" \
        --nr-objects "$NR_OBJECTS" --batch-size "$BATCH" --numjobs "$NUMJOBS" \
        --value-size "$VALUE_SIZE" --key-prefix "b$r" --key-size 20 \
        --summary-json "$json" "${extra[@]}" >"$log" 2>&1 || rc=$?
    stop_all
    printf '%-9s %-15s %-6s round %d: rc=%d%s\n' "$sys" "$sc" "$api" "$r" "$rc" \
        "$([ -s "$json" ] || echo ' (no summary)')"
}

echo "mooncake_compare.sh: Mooncake $MC (source $SRC), kvengine $KB; topology $TOPOLOGY;" \
     "value $VALUE_SIZE B, $NR_OBJECTS objects, batch $BATCH, $NUMJOBS job(s), runtime $RUNTIME s; $ROUNDS rounds"
systems=()
for s in $SYSTEMS; do
    case "$s" in embedded|embedded0|null) [ "$TOPOLOGY" = remote ] && continue ;; esac
    systems+=("$s")
done
for r in $(seq "$ROUNDS"); do
    for sc in $SCENARIOS; do
        for api in $IO_APIS; do
            # Alternate the order each round, so neither system always runs
            # first (warm page cache, a neighbour's build starting).
            order=("${systems[@]}")
            if [ $((r % 2)) = 0 ]; then
                order=(); for ((i = ${#systems[@]} - 1; i >= 0; i--)); do order+=("${systems[$i]}"); done
            fi
            for s in "${order[@]}"; do run_one "$s" "$sc" "$api" "$r" || true; done
        done
    done
done

# The table: medians over the rounds of each phase's MiB/s (kv/s for the
# metadata phases, which move no bytes to speak of) and p99, and their
# ratios kvengine/Mooncake.
python3 - "$OUT" "$ROUNDS" "$SCENARIOS" "$IO_APIS" "${systems[*]}" <<'EOF'
import json, os, statistics, sys
out, rounds, scenarios, apis, systems = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split()
def load(s, sc, api, r):
    try:
        with open(os.path.join(out, "%s-%s-%s-r%d.json" % (s, sc, api, r))) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
kv = [s for s in systems if s != "mooncake"]
# With null in the run: X/null for every other system (how close each gets
# to what the harness itself allows).
vsnull = [s for s in kv if s != "null"] if "null" in kv else []
hdr = "%-15s %-6s %-14s %-7s %12s" % ("scenario", "api", "phase", "metric", "mooncake")
for s in kv:
    hdr += " %12s %8s" % (s, "ratio")
for s in vsnull:
    hdr += " %12s" % (s + "/null")
print(hdr)
def med(xs):
    return statistics.median(xs) if xs else None
def fmt(v):
    return "-" if v is None else ("%.0f" % v if v >= 100 else "%.2f" % v)
for sc in scenarios:
    for api in apis:
        phases = []
        for s in systems:
            for r in range(1, rounds + 1):
                d = load(s, sc, api, r)
                for name in (d or {}).get("phases", {}):
                    if name not in phases:
                        phases.append(name)
        for ph in phases:
            meta = ph in ("metadata_smoke", "mixed_metadata", "remove_perf", "replay")
            rows = [("kv/s" if meta else "MiB/s", "kv_per_sec" if meta else "MiB_per_sec", True),
                    ("p99 ms", "lat_p99_ms", False)]
            for label, key, higher in rows:
                vals, okr = {}, {}
                for s in systems:
                    xs, bad = [], 0
                    for r in range(1, rounds + 1):
                        d = load(s, sc, api, r)
                        p = (d or {}).get("phases", {}).get(ph)
                        if p is None or p.get("successful_kvs", 0) == 0:
                            continue
                        if p.get("failed_kvs", 0) or p.get("verify_failures", 0):
                            bad += 1
                        xs.append(p[key])
                    vals[s] = med(xs)
                    okr[s] = "" if not bad else "*"
                line = "%-15s %-6s %-14s %-7s %11s%1s" % (sc, api, ph, label, fmt(vals.get("mooncake")), okr.get("mooncake", ""))
                for s in kv:
                    m, k = vals.get("mooncake"), vals.get(s)
                    ratio = "-"
                    if m and k:
                        ratio = "%.2fx" % ((k / m) if higher else (m / k))
                    line += " %11s%1s %8s" % (fmt(k), okr.get(s, ""), ratio)
                for s in vsnull:
                    z, k = vals.get("null"), vals.get(s)
                    ratio = "-"
                    if z and k:
                        ratio = "%.2fx" % ((k / z) if higher else (z / k))
                    line += " %12s" % ratio
                print(line)
print("(medians of %d rounds; ratio = system/Mooncake throughput, Mooncake/system p99; X/null the same against null: "
      "above 1 is the system ahead; * = a round had failed kvs or verify failures; "
      "- = no successful kvs)" % rounds)
EOF
[ "$KEEP_OUT" = 1 ] && echo "summaries and logs in $OUT"
exit 0
