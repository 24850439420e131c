#!/bin/sh
# run.sh BUILD SECONDS HARNESS... — what `make fuzz` runs: each harness in
# turn replays its corpus (tests/fuzz/corpus/NAME, read-only; the inputs it
# finds go to BUILD/corpus/NAME) and then fuzzes for SECONDS. A crash, leak,
# timeout or broken property fails the run and leaves the reproducer in
# BUILD/artifacts/ (replay it with: HARNESS FILE). Prints executions per
# harness at the end.
set -u
build=$1
secs=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$build/artifacts" "$build/logs"
fail=""
summary=""
for bin in "$@"; do
    name=$(basename "$bin")
    seeds="$here/corpus/$name"
    work="$build/corpus/$name"
    log="$build/logs/$name.log"
    mkdir -p "$work" "$seeds"
    # -timeout: an input that takes 20 s is a hang, not slowness.
    # -rss_limit_mb: a harness that grows past it is leaking or bloating.
    echo "fuzz: $name for ${secs}s (log $log)"
    "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
        -artifact_prefix="$build/artifacts/$name-" "$work" "$seeds" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    summary="$summary$(printf '%-14s %10s execs %7s/s  %s rc=%s' "$name" "${execs:-?}" "${rate:-?}" "${cov:-}" "$rc")
"
    if [ "$rc" -ne 0 ]; then
        fail="$fail $name"
        echo "fuzz: $name FAILED (rc $rc); its log ends:" >&2
        tail -40 "$log" >&2
        ls -1 "$build/artifacts/$name-"* 2>/dev/null | sed 's/^/fuzz: reproducer: /' >&2
    fi
done
printf '%s' "$summary"
if [ -n "$fail" ]; then
    echo "fuzz: failed:$fail" >&2
    exit 1
fi
echo "fuzz: all harnesses clean"
