# kvnode_up.sh — sourced by the attached benchmarks (attached_dumps.sh,
# direct_reads.sh): kvnode_up BUILD NAME GIB starts one kvnode serving
# store.name=NAME (pipeline dram, GIB GiB) in $OUT/rv, sets C (the --set
# options a kvctl beside it needs) and NP (its pid), stops it on exit
# (removing $OUT unless KEEP is set), and returns once it serves and its
# segment is in 2 MiB pages (the collapse competes for CPU with a run), or
# after 60 s; it says on stderr how much of the segment got them.
kvnode_up() {
    mkdir -p -m 700 "$OUT/rv"
    C="--set store.name=$2 --set store.dir=$OUT/rv --set pipeline=dram --set log.level=warn"
    "$1/kvnode" $C --set dram.capacity="$3GiB" > "$OUT/node.log" 2>&1 &
    NP=$!
    trap 'kill $NP 2>/dev/null; wait 2>/dev/null; [ -n "$KEEP" ] || rm -rf "$OUT"' EXIT
    for _ in $(seq 1 100); do [ -S "$OUT/rv/$2.sock" ] && break; sleep 0.2; done
    local want=$(( $3 * 1024 * 1024 * 9 / 10 )) h t0=$SECONDS
    for _ in $(seq 1 300); do
        h=$(awk '/ShmemPmdMapped/{print $2}' "/proc/$NP/smaps_rollup" 2>/dev/null)
        [ "${h:-0}" -ge "$want" ] && break
        sleep 0.2
    done
    # what the figures that follow were measured on: a segment left in
    # 4 KiB pages (no free huge pages) copies slower
    echo "kvnode: $(( ${h:-0} / 1024 )) of $(( $3 * 1024 )) MiB of its segment in 2 MiB pages" \
         "after $(( SECONDS - t0 )) s" >&2
}
