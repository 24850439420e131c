#!/bin/bash
# peers.sh — kvengine's distributed DRAM tier beside Redis 7 and memcached
# 1.6 on loopback, measured by ONE `kvctl bench` per value size: same
# blocks, same value size, same number of jobs, same run, with the raw
# loopback TCP bandwidth kvctl measures itself (the "tcp" column is each
# phase's MiB/s over it). A measurement to read, not a test (CI does not
# run it); keep it short on shared machines.
#
#   bash bench/peers.sh [BUILD_DIR]        (default: build)
#
# Needs BUILD_DIR/kvctl, kvmaster and kvnode, and redis-server and memcached
# (Debian: apt-get install redis-server memcached). It starts, on free
# loopback ports:
#   redis-server --save '' --appendonly no
#   memcached -t 4 -m 4096 -I 8m
#   kvmaster, and NODES kvnodes (pipeline dram, NODE_DRAM each)
# then, for each size in SIZES, a pure cluster client (dram.capacity=0):
#   kvctl bench --numjobs JOBS --value-size SIZE \
#       --compare redis=... --compare memcached=...
# Every process it starts is stopped on exit, however it exits.
#
# Reading the figures: every write stores new keys. kvnodes fault their
# whole segment in at start; Redis and memcached allocate and fault in
# memory per new value, inside the write phase (an overwrite of keys they
# already hold runs ~1.5-2x faster). NODE_DRAM holds both sizes' data set
# (512 MiB each by default) with room to spare: read_perf's lookups lease
# every block for eviction.lease_ttl_ms (60 s), so a node that fills up in
# a later run evicts that run's own new blocks, and its reads miss.
# The TCP baseline is JOBS sender/receiver pairs (2 x JOBS threads); on a
# machine with fewer cores than that it is not a ceiling: a server with
# fewer threads can exceed it.
#
# A lookup phase looks every id up once: 512 ids at 1 MiB, a few
# milliseconds, which on a shared machine is noise (doc/perf.md). So after
# the sizes, two runs are about existence checks alone (the serving stacks'
# hottest control call):
#   lookups       kvctl bench --scenario fill --value-size 64
#                 --nr-objects LOOKUP_IDS, the same peers: the lookup phase
#                 (kv_lookup of block ids against EXISTS and mg) is the
#                 figure, the write phase only fills;
#   batch exists  bench/exists.c (built here against BUILD_DIR's library):
#                 kv_exists_many of plain keys (Mooncake's batch_is_exist)
#                 against pipelined EXISTS and mg, JOBS threads, batches
#                 of 8, EXISTS_S seconds each.
# LOOKUP_IDS=0 skips both.
#
# Environment: JOBS (8), SIZES ("1MiB 64KiB"), NODES (2), NODE_DRAM (1GiB),
# PROTOCOL (tcp), JSON_DIR (unset: no summaries; else peers-SIZE.json
# there), BENCH_ARGS (more kvctl bench options, e.g. "--batch-size 1"), and
# PORTS (LOW-HIGH: the loopback ports to pick from, default 20000-31999;
# give each person on a shared machine a range of their own), LOOKUP_IDS
# (262144) and EXISTS_S (2).
set -euo pipefail
B=${1:-build}
JOBS=${JOBS:-8}
SIZES=${SIZES:-"1MiB 64KiB"}
NODES=${NODES:-2}
NODE_DRAM=${NODE_DRAM:-1GiB}
PROTOCOL=${PROTOCOL:-tcp}
BENCH_ARGS=${BENCH_ARGS:-}
PORTS=${PORTS:-20000-31999}
LOOKUP_IDS=${LOOKUP_IDS:-262144}
EXISTS_S=${EXISTS_S:-2}
PORT_LO=${PORTS%-*}
PORT_HI=${PORTS#*-}

for bin in "$B/kvctl" "$B/kvmaster" "$B/kvnode"; do
    [ -x "$bin" ] || { echo "peers.sh: $bin missing (make BUILD=$B all)" >&2; exit 2; }
done
for bin in redis-server memcached; do
    command -v "$bin" >/dev/null || { echo "peers.sh: $bin not installed" >&2; exit 2; }
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvpeers.XXXXXX")
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A loopback port nothing listens on (bash's /dev/tcp: no helper needed).
used=" "
port() {
    local p
    while :; do
        # Below the kernel's ephemeral range (32768-60999 by default), so
        # no outgoing connection can take the port before the server binds.
        p=$(( PORT_LO + (RANDOM * 32768 + RANDOM) % (PORT_HI - PORT_LO + 1) ))
        case "$used" in *" $p "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            used="$used$p "
            echo "$p"
            return
        fi
    done
}

# Waits (10 s at most) for something to accept connections on port $1.
wait_port() {
    local i
    for i in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "peers.sh: nothing listens on 127.0.0.1:$1 ($2); logs in $TMP:" >&2
    tail -n 20 "$TMP"/*.log >&2 || true
    exit 1
}

RP=$(port); MP=$(port); KP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --logfile "$TMP/redis.log" &
PIDS+=($!)
user=()
[ "$(id -u)" = 0 ] && user=(-u nobody)     # memcached refuses to run as root otherwise
memcached -t 4 -m 4096 -I 8m -p "$MP" -l 127.0.0.1 "${user[@]}" >"$TMP/memcached.log" 2>&1 &
PIDS+=($!)
MASTER=127.0.0.1:$KP
"$B/kvmaster" --set cluster.master="$MASTER" --set log.level=warn >"$TMP/kvmaster.log" 2>&1 &
PIDS+=($!)
wait_port "$RP" redis-server
wait_port "$MP" memcached
wait_port "$KP" kvmaster
for i in $(seq "$NODES"); do
    "$B/kvnode" --set cluster.master="$MASTER" --set cluster.listen=127.0.0.1:0 \
        --set cluster.protocol="$PROTOCOL" --set pipeline=dram \
        --set dram.capacity="$NODE_DRAM" --set log.level=warn >"$TMP/kvnode$i.log" 2>&1 &
    PIDS+=($!)
done
# Every node in the view before anything is measured (segments fault in first).
for i in $(seq 150); do
    n=$("$B/kvctl" --set cluster.master="$MASTER" members --json 2>/dev/null |
        grep -o '"role":"owner"' | wc -l) || n=0
    [ "$n" -ge "$NODES" ] && break
    sleep 0.2
done
if [ "$n" -lt "$NODES" ]; then
    echo "peers.sh: only $n of $NODES kvnodes joined; logs in $TMP:" >&2
    tail -n 20 "$TMP"/kvnode*.log >&2 || true
    exit 1
fi
echo "peers.sh: redis-server $(redis-server --version | grep -o 'v=[^ ]*') on $RP," \
     "memcached $(memcached -V | cut -d' ' -f2) on $MP, kvmaster on $KP, $NODES kvnodes ($PROTOCOL)"

rc=0
for size in $SIZES; do
    echo
    echo "== value $size, $JOBS jobs =="
    json=()
    [ -n "${JSON_DIR:-}" ] && json=(--summary-json "$JSON_DIR/peers-$size.json")
    # shellcheck disable=SC2086
    "$B/kvctl" --set cluster.enabled=true --set cluster.master="$MASTER" \
        --set cluster.protocol="$PROTOCOL" --set dram.capacity=0 --set log.level=warn \
        bench --scenario read_perf --numjobs "$JOBS" --value-size "$size" \
        --compare redis=127.0.0.1:"$RP" --compare memcached=127.0.0.1:"$MP" \
        "${json[@]}" $BENCH_ARGS || rc=1
done
[ "$LOOKUP_IDS" -gt 0 ] || exit $rc

echo
echo "== lookups: $LOOKUP_IDS block ids, $JOBS jobs (the lookup phase is the figure) =="
json=()
[ -n "${JSON_DIR:-}" ] && json=(--summary-json "$JSON_DIR/peers-lookups.json")
# shellcheck disable=SC2086
"$B/kvctl" --set cluster.enabled=true --set cluster.master="$MASTER" \
    --set cluster.protocol="$PROTOCOL" --set dram.capacity=0 --set log.level=warn \
    bench --scenario fill --numjobs "$JOBS" --value-size 64 --nr-objects "$LOOKUP_IDS" \
    --compare redis=127.0.0.1:"$RP" --compare memcached=127.0.0.1:"$MP" \
    "${json[@]}" $BENCH_ARGS || rc=1

echo
echo "== batch exists: plain keys, $JOBS jobs =="
# The library's link line as the Makefile has it (LDLIBS).
SRC=$(dirname "$0")/exists.c
if [ -f "$B/libkvengine.a" ] && command -v cc >/dev/null &&
    cc -std=gnu11 -O2 -D_GNU_SOURCE -I"$(dirname "$0")/../include" "$SRC" "$B/libkvengine.a" \
        -o "$TMP/exists" -lrocksdb -lyaml -llz4 -lxxhash -ljemalloc -lmicrohttpd -libverbs \
        -lcurl -ljson-c -lcrypto -lpthread -lm; then
    "$TMP/exists" "$MASTER" 127.0.0.1:"$RP" 127.0.0.1:"$MP" "$JOBS" 8 "$EXISTS_S" || rc=1
else
    echo "peers.sh: cannot build $SRC against $B/libkvengine.a; batch exists skipped" >&2
    rc=1
fi
exit $rc
