#!/bin/sh
# layers.sh BUILD — the link graph has no cycles between the layers.
#
# engine/ is the top: the public calls, the DRAM tier, tasks. It calls
# down into net/ (the cluster) and persist/ (the SSD tier), and hands them
# what they need of it as ops tables (engine/backend.c, the spill sink).
# So no object of net/ or persist/ may use a symbol defined by an engine/
# object, except the utility layer every layer shares (errors.c, log.c,
# config.c); and net/ and persist/ never use each other. Checked with nm on
# the objects the build made; prints each offending reference.
set -eu
b=${1:-build}/obj
[ -d "$b/engine" ] || { echo "layers.sh: no objects under $b (build first)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvlayers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# symbol -> defining object, per layer
for layer in engine net persist; do
    for o in "$b/$layer"/*.o; do
        nm -g --defined-only "$o" | awk -v f="$layer/$(basename "$o" .o).c" 'NF==3 {print $3, f}'
    done
done | sort > "$tmp/defs"
bad=0
for layer in net persist; do
    for o in "$b/$layer"/*.o; do
        src="$layer/$(basename "$o" .o).c"
        nm -u "$o" | awk '{print $NF}' | sort -u | join - "$tmp/defs" |
        while read -r sym def; do
            case "$def" in
                engine/errors.c|engine/log.c|engine/config.c) continue ;;
                "$layer"/*) continue ;;
            esac
            echo "layers.sh: $src uses $sym from $def (a cycle: $layer/ may not call up into ${def%%/*}/)"
        done
    done
done > "$tmp/out"
if [ -s "$tmp/out" ]; then
    cat "$tmp/out" >&2
    exit 1
fi
echo "layers.sh: no cycles (net/ and persist/ use only engine/errors.c, log.c, config.c)"
