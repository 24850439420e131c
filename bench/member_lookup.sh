#!/usr/bin/env bash
# member_lookup.sh — lookups attached through a kvnode that is a cluster
# member (issue 16), several builds alternated in one run.
#
#   ROUNDS=N PASSES=P IDS=I PORTS=LO-HI bash bench/member_lookup.sh BUILD_DIR...
#
# Each round, for each build in turn: a fresh kvmaster, kvnode A serving
# store.name as a member, a second member kvnode B, then bench/lookup.c
# (built here against that build's libkvengine.a) attached to A: it dumps
# IDS blocks of 64 bytes (half of them owned by B) and makes P passes
# looking every id up once, 1000 a call; the round's figures are the
# medians of its passes, wall ids/s and CPU per id (the client thread plus
# both kvnodes). With KVCTL=1 the round runs kvctl bench --scenario fill
# (the command in /work/notes/s3/16.md) instead and reports its lookup
# phase. Alternating the builds inside one run is what makes two builds
# comparable on a shared, noisy machine; the medians over rounds are
# printed last. Everything it starts is stopped on exit.
set -u
[ $# -ge 1 ] || { sed -n 2,14p "$0" >&2; exit 2; }
ROUNDS=${ROUNDS:-5}
PASSES=${PASSES:-5}
IDS=${IDS:-262144}
SRC=$(cd "$(dirname "$0")" && pwd)/lookup.c
PORTS=${PORTS:-22500-22999}
PORT_LO=${PORTS%-*}
PORT_HI=${PORTS#*-}
for b in "$@"; do
    for bin in kvctl kvmaster kvnode; do
        [ -x "$b/$bin" ] || { echo "member_lookup.sh: $b/$bin missing" >&2; exit 2; }
    done
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvmlook.XXXXXX")
PIDS=()
stop_all() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
trap 'stop_all; [ -n "${KEEP:-}" ] || rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

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
wait_port() {
    local i
    for i in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# One measurement: prints the lookup phase's ids/s, or "fail".
one() {
    local B=$1 tag=$2 kp d master n i
    kp=$(port); d="$TMP/$tag"; mkdir -m 700 -p "$d"; master=127.0.0.1:$kp
    local common=(--set cluster.master="$master" --set cluster.protocol=tcp
                  --set log.level=warn)
    "$B/kvmaster" --set cluster.master="$master" --set log.level=warn >"$d/kvmaster.log" 2>&1 &
    PIDS+=($!)
    wait_port "$kp" || { echo fail; stop_all; return; }
    "$B/kvnode" "${common[@]}" --set cluster.enabled=true --set store.name=X --set store.dir="$d" --set pipeline=dram \
        --set dram.capacity=512MiB --set cluster.listen=127.0.0.1:0 >"$d/a.log" 2>&1 &
    PIDS+=($!)
    "$B/kvnode" "${common[@]}" --set pipeline=dram --set dram.capacity=512MiB \
        --set cluster.listen=127.0.0.1:0 >"$d/b.log" 2>&1 &
    PIDS+=($!)
    for i in $(seq 150); do
        n=$("$B/kvctl" --set cluster.master="$master" members --json 2>/dev/null |
            grep -o '"id"' | wc -l)
        [ "$n" -ge 2 ] && [ -S "$d/X.sock" ] && break
        sleep 0.1
    done
    if [ "$n" -lt 2 ]; then
        echo "member_lookup.sh: $n of 2 kvnodes joined" >&2
        echo fail; stop_all; return
    fi
    if [ -n "${KVCTL:-}" ]; then
        "$B/kvctl" "${common[@]}" --set store.name=X --set store.dir="$d" --set pipeline=dram \
            --set dram.capacity=512MiB --set cluster.enabled=true \
            bench --scenario fill --value-size 64 --nr-objects "$IDS" --batch-size 1000 \
            --summary-json "$d/sum.json" >"$d/bench.log" 2>&1
        python3 - "$d/sum.json" <<'PY' 2>/dev/null || echo fail
import json, sys
s = json.load(open(sys.argv[1]))
for p in s["phases"]:
    if p["name"] == "lookup":
        print("%.0f %.0f" % (p["kvs_s"], p["lat_us"]["p50"]))
PY
    else
        KV_BENCH_PIDS="${PIDS[1]},${PIDS[2]}" "$TMP/lookup$tag_b" "$IDS" 1000 "$PASSES" \
            cluster.master="$master" cluster.protocol=tcp log.level=warn store.name=X \
            store.dir="$d" pipeline=dram dram.capacity=512MiB cluster.enabled=true \
            >"$d/bench.log" 2>&1
        sed -n 's/^median of .*: \([0-9.]*\) M ids\/s, \([0-9]*\) ns CPU per id; 0 misses$/\1e6 \2/p' \
            "$d/bench.log" | grep . || echo fail
    fi
    stop_all
    [ -n "${KEEP:-}" ] || rm -rf "$d"
}

k=0
for B in "$@"; do
    [ -n "${KVCTL:-}" ] && break
    cc -std=gnu11 -O2 -D_GNU_SOURCE -I"$(dirname "$SRC")/../include" "$SRC" "$B/libkvengine.a" \
        -o "$TMP/lookup$k" -lrocksdb -lyaml -llz4 -lxxhash -ljemalloc -lmicrohttpd -libverbs \
        -lcurl -ljson-c -lcrypto -lpthread -lm ||
        { echo "member_lookup.sh: cannot build $SRC against $B" >&2; exit 2; }
    k=$((k + 1))
done
declare -A res cpu
what="ids/s, p50 us per batch"
[ -n "${KVCTL:-}" ] || what="ids/s, ns CPU per id (medians of $PASSES passes)"
for r in $(seq "$ROUNDS"); do
    k=0
    for B in "$@"; do
        tag_b=$k
        out=$(one "$B" "r${r}b$k")
        echo "round $r $B: $what: $out"
        res[$k]="${res[$k]:-} ${out%% *}"
        cpu[$k]="${cpu[$k]:-} ${out##* }"
        k=$((k + 1))
    done
done
k=0
for B in "$@"; do
    echo "$B: ${res[$k]}:${cpu[$k]}" | python3 -c '
import sys, statistics
name, vals, cpus = sys.stdin.read().rsplit(":", 2)
v = [float(x) for x in vals.split() if x != "fail"]
c = [float(x) for x in cpus.split() if x != "fail"]
print("%s: median %.2f M ids/s over %d rounds (%s); second column median %.0f" % (name,
      statistics.median(v) / 1e6 if v else 0, len(v), " ".join("%.2f" % (x / 1e6) for x in v),
      statistics.median(c) if c else 0))'
    k=$((k + 1))
done
