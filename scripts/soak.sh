#!/usr/bin/env bash
# soak.sh — `make soak`: kvengine under sustained load, watched for memory
# and descriptor leaks.
#
#   scripts/soak.sh [SECONDS]      (default 600; the tools come from $KV_BUILD,
#                                   default build/)
#
# Two loads run side by side for SECONDS of mixed reads and writes, all on
# 127.0.0.1:
#   local    kvctl bench mixed_rw on a dram|ssd engine whose DRAM tier is a
#            fraction of what is written (eviction and spill never stop) and
#            whose SSD tier is small (capacity GC deletes old blocks, and the
#            value log's compaction copies out what stays live);
#   cluster  a kvmaster, two kvnodes (dram|ssd, tcp) and a kvctl bench client
#            (a pure client: dram.capacity 0) running mixed_rw against them.
# Every second the RSS and open descriptors of each of the five processes
# are sampled. After a warm-up (a quarter of the run, at least 10 s) the
# steady state is cut in thirds; the run fails when a process's peak RSS in
# the last third is more than 5% above its peak in the first — and more
# than 1 MiB, so that a small kvmaster is not failed by one allocator page
# — or when it ends holding more than 16 descriptors over its warm-up
# maximum. Peaks, not single samples, because RocksDB's memtables fill and
# are flushed in cycles (16 MiB each): a leak raises every peak, a memtable
# only moves within them (the client writes 8 KiB values so that the
# nodes' memtables cycle every half minute or so, several times even in
# CI's 3-minute run). It also fails when a bench fails or a daemon dies. It
# prints each process's RSS curve (tenths of the run).
# Every process it starts is stopped at the end, on failure too.
#
# The key design choice is to measure the real programs, not an in-process
# loop: the leaks that matter in production are in the daemons' event loops,
# connection pools, RocksDB and the allocator's retention, which only the
# shipped binaries exercise together.
set -u

# All of it in one function: bash reads a script as it runs, so an edit to
# this file during a 10-minute soak would otherwise break the run.
main() {
secs=${1:-600}
build=${KV_BUILD:-build}
case $secs in ''|*[!0-9]*) echo "soak: SECONDS must be a whole number, got '$secs'" >&2; exit 2;; esac
for t in kvctl kvmaster kvnode; do
    [ -x "$build/$t" ] || { echo "soak: $build/$t not found (make all first, or set KV_BUILD)" >&2; exit 2; }
done

warm=$(( secs / 4 > 10 ? secs / 4 : 10 ))
# The values live on tmpfs when there is one: the soak is about memory and
# descriptors, not about wearing the disk with a few hundred GB of churn.
base=${TMPDIR:-/tmp}
[ -d /dev/shm ] && [ -w /dev/shm ] && base=/dev/shm
work=$(mktemp -d "$base/kvsoak.XXXXXX") || { echo "soak: cannot make a work directory" >&2; exit 1; }
token=soak-$$
names=()
pids=()
failed=""

fail() { failed="$failed
soak: FAIL: $*"; }

stop_all() {
    local i
    for i in "${!pids[@]}"; do kill -TERM "${pids[$i]}" 2>/dev/null; done
    local t0=$SECONDS
    for i in "${!pids[@]}"; do
        while kill -0 "${pids[$i]}" 2>/dev/null && [ $((SECONDS - t0)) -lt 15 ]; do sleep 0.2; done
        kill -KILL "${pids[$i]}" 2>/dev/null
        wait "${pids[$i]}" 2>/dev/null
    done
    pids=()
}

cleanup() {
    stop_all
    rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "soak: interrupted" >&2; exit 130' INT TERM

# start NAME CMD...: runs CMD in the background with its output in NAME.log.
start() {
    local name=$1
    shift
    "$@" >"$work/$name.log" 2>&1 &
    names+=("$name")
    pids+=("$!")
}

pid_of() {
    local i
    for i in "${!names[@]}"; do [ "${names[$i]}" = "$1" ] && { echo "${pids[$i]}"; return; }; done
}

alive() { kill -0 "$(pid_of "$1")" 2>/dev/null; }

common=(--set cluster.token="$token" --set log.level=info)

# The master on a free port below 32768 (a few tries: another program may
# take the one picked).
master=""
for try in 1 2 3 4 5 6 7 8; do
    port=$(( 20000 + (RANDOM * 32768 + RANDOM) % 12000 ))
    start kvmaster "$build/kvmaster" "${common[@]}" --set cluster.master="127.0.0.1:$port"
    sleep 0.5
    if alive kvmaster; then master=127.0.0.1:$port; break; fi
    wait "$(pid_of kvmaster)" 2>/dev/null
    unset 'names[-1]' 'pids[-1]'
done
[ -n "$master" ] || { echo "soak: kvmaster would not start; its log:" >&2; cat "$work/kvmaster.log" >&2; exit 1; }

for n in 1 2; do
    start "kvnode$n" "$build/kvnode" "${common[@]}" --set cluster.master="$master" \
        --set cluster.listen=127.0.0.1:0 --set cluster.protocol=tcp \
        --set pipeline='dram|ssd' --set dram.capacity=64MiB --set ssd.path="$work/node$n" \
        --set ssd.capacity=128MiB --set io.threads=2
done
t0=$SECONDS
until [ "$("$build/kvctl" "${common[@]}" --set cluster.master="$master" members 2>/dev/null |
           grep -c ' owner ')" -ge 2 ]; do
    if [ $((SECONDS - t0)) -ge 20 ]; then
        echo "soak: the two nodes did not join within 20 s; logs:" >&2
        tail -n 5 "$work"/kv*.log >&2
        exit 1
    fi
    sleep 0.5
done

# The loads. mixed_rw first writes --nr-objects (the prepared set, well
# within DRAM), then for --runtime seconds reads random prepared objects and
# writes new ones, so DRAM evicts and spills, the SSD tier fills, GC deletes
# and the log compacts, and reads of prepared objects come from every tier
# (or miss once GC has taken them, which the bench counts, not fails).
start local "$build/kvctl" "${common[@]}" --set pipeline='dram|ssd' --set dram.capacity=64MiB \
    --set ssd.path="$work/local" --set ssd.capacity=256MiB \
    bench --scenario mixed_rw --value-size 16KiB --nr-objects 2000 --numjobs 2 --runtime "$secs"
start client "$build/kvctl" "${common[@]}" --set cluster.enabled=true --set cluster.master="$master" \
    --set cluster.protocol=tcp --set dram.capacity=0 --set pipeline=dram \
    bench --scenario mixed_rw --value-size 8KiB --nr-objects 4000 --numjobs 2 --runtime "$secs"

echo "soak: ${secs}s of mixed_rw (local dram|ssd engine, and a client of 2 kvnodes via kvmaster" \
     "$master); warm-up ${warm}s; work dir $work"
samples=$work/samples.tsv
: >"$samples"
start_s=$SECONDS
said=0
limit=$(( secs + 180 ))     # the prepare phases and the benches' own teardown
while alive local || alive client; do
    now=$(( SECONDS - start_s ))
    if [ "$now" -ge "$limit" ]; then
        fail "the benches were still running ${limit}s after the start"
        break
    fi
    # Builtins only: a sample must not cost a fork per process.
    for i in "${!names[@]}"; do
        name=${names[$i]}
        pid=${pids[$i]}
        rss=""
        while read -r key val _; do
            [ "$key" = "VmRSS:" ] && { rss=$val; break; }
        done 2>/dev/null <"/proc/$pid/status"
        [ -n "$rss" ] || continue
        fdl=("/proc/$pid/fd/"*)
        printf '%s\t%s\t%s\t%s\n' "$now" "$name" "$rss" "${#fdl[@]}" >>"$samples"
    done
    if [ $(( now / 60 )) -gt "$said" ]; then
        said=$(( now / 60 ))
        echo "soak: ${now}s"
    fi
    sleep 1
done
run_s=$(( SECONDS - start_s ))

for name in local client; do
    pid=$(pid_of "$name")
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        rc=$?
        # A write refused for lack of room (all DRAM held by write-back that
        # has not landed yet) is a cache saying no, which DESIGN allows; any
        # other error still fails the soak.
        log=$work/$name.log
        if [ "$rc" -ne 0 ] && grep -q ': first error ' "$log" &&
           ! grep ': first error ' "$log" | grep -vq ': first error ENOSPC'; then
            echo "soak: bench '$name': some writes refused with ENOSPC (counted, not a failure):"
            grep ': first error ' "$log"
            rc=0
        fi
        [ "$rc" -eq 0 ] || fail "bench '$name' exited $rc; its log ends:
$(tail -n 15 "$work/$name.log")"
    fi
done
for name in kvmaster kvnode1 kvnode2; do
    alive "$name" || fail "$name died during the run; its log ends:
$(tail -n 15 "$work/$name.log")"
done

echo "soak: results after ${run_s}s (RSS in MiB at each tenth of the run)"
verdict=$(awk -F'\t' -v warm="$warm" -v run="$run_s" '
    { t[$2, n[$2]] = $1; r[$2, n[$2]] = $3; f[$2, n[$2]] = $4; n[$2]++ }
    function median(a, lo, hi,    k, m, i, j, tmp, v) {
        m = 0
        for (i = lo; i < hi; i++) v[m++] = a[i]
        for (i = 0; i < m; i++) for (j = i + 1; j < m; j++) if (v[j] < v[i]) { tmp = v[i]; v[i] = v[j]; v[j] = tmp }
        return m ? v[int(m / 2)] : 0
    }
    END {
        split("kvmaster kvnode1 kvnode2 local client", order, " ")
        bad = 0
        for (o = 1; o <= 5; o++) {
            p = order[o]; c = n[p]
            if (!c) { printf "  %-9s no samples\n", p; continue }
            curve = ""
            for (d = 0; d <= 10; d++) {
                i = int((c - 1) * d / 10)
                curve = curve sprintf(" %.1f", r[p, i] / 1024)
            }
            first = -1; warmfd = 0
            for (i = 0; i < c; i++) {
                if (t[p, i] < warm) { if (f[p, i] > warmfd) warmfd = f[p, i] }
                else if (first < 0) first = i
            }
            printf "  %-9s%s\n", p, curve
            if (first < 0 || c - first < 10) {
                printf "  %-9s too few samples after the warm-up to judge\n", p
                bad = 1
                continue
            }
            for (i = 0; i < c; i++) ff[i] = f[p, i]
            third = int((c - first) / 3)
            b = 0; e = 0
            for (i = first; i < first + third; i++) if (r[p, i] > b) b = r[p, i]
            for (i = c - third; i < c; i++) if (r[p, i] > e) e = r[p, i]
            ef = median(ff, c - 5, c)
            g = b ? (e - b) * 100 / b : 0
            printf "  %-9s peak %.1f MiB in the first third after the warm-up, %.1f in the last (%+.1f%%); fds: warm-up max %d, end %d\n",
                   p, b / 1024, e / 1024, g, warmfd, ef
            if (g > 5 && e - b > 1024) { printf "FAIL %s RSS grew %.1f%% after the warm-up\n", p, g; bad = 1 }
            if (ef > warmfd + 16) { printf "FAIL %s holds %d descriptors, %d over its warm-up maximum\n", p, ef, ef - warmfd; bad = 1 }
        }
        exit bad
    }' "$samples")
vrc=$?
printf '%s\n' "$verdict" | grep -v '^FAIL '
printf '%s\n' "$verdict" | sed -n 's/^FAIL /soak: FAIL: /p'
[ "$vrc" -eq 0 ] || failed="$failed
soak: FAIL: see above"
for name in local client; do
    echo "soak: $name bench:"
    grep -E '^(write|mixed_read|mixed_write|RSS) ' "$work/$name.log" | sed 's/^/    /'
done
echo "soak: local SSD churn: $(grep -c 'capacity GC deleted' "$work/local.log") GC rounds," \
     "$(grep -c 'value log compaction moved' "$work/local.log") log compactions"

stop_all
if [ -n "$failed" ]; then
    printf '%s\n' "$failed" >&2
    exit 1
fi
echo "soak: ok"
}

main "$@"
