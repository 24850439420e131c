#!/bin/bash
# anchor-suites.sh — run the serving stacks' own test suites against
# kvengine's Python package and print passed/failed/skipped per file.
#
# The anchors are Mooncake Store (its wheel tests, scripts/test_*.py and
# the store_kv_bench test) and UCM (its e2e store scripts). Their files are
# taken from the local git mirrors at run time into a scratch directory and
# are never copied into this tree; this script is not run by CI, because
# CI has no mirrors. Mooncake's files run unchanged with `mooncake.store`
# resolving to python/compat; UCM's e2e scripts are scripts (no asserts
# framework, a non-zero exit or a traceback is a failure), so they are
# rewritten on the way in, the way a UCM user would point them at
# kvengine: the connector module becomes kvengine.ucm (UCM's
# ucm_connector_module_path), CUDA tensors become CPU tensors, and their
# sizes are scaled down to fit a shared machine.
#
# A last section (interop) runs Mooncake's own structured-object reader and
# writer against the drop-in's over one store, and real Mooncake's tensor
# objects against the drop-in's (see the section).
#
# Usage: tools/anchor-suites.sh [-k] [-o DIR] [FILE-PATTERN...]
#   -k      keep the scratch directory (logs, junit XML) and print its path
#   -o DIR  use DIR as the scratch directory
#   FILE-PATTERN  only run files whose path contains one of the patterns
# Environment: MOONCAKE_MIRROR, UCM_MIRROR (bare git dirs), BUILD (default
# build), PORTS (default 24000-24999: the kvmaster's port is taken from
# it), PER_FILE_TIMEOUT (seconds, default 600), PYTHON (/usr/bin/python3),
# MOONCAKE_BUILD (a Mooncake build directory, for the interop section).
# Mooncake files that hard-code 127.0.0.1:50051 as their master get a
# second kvmaster there for their run only (when the port is free).
set -u

ROOT=${KVENGINE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
MOONCAKE_MIRROR=${MOONCAKE_MIRROR:-/work/.mirror/kvcache-ai+Mooncake/repo}
UCM_MIRROR=${UCM_MIRROR:-/work/.mirror/ModelEngine-Group+unified-cache-management/repo}
BUILD=${BUILD:-$ROOT/build}
PORTS=${PORTS:-24000-24999}
PER_FILE_TIMEOUT=${PER_FILE_TIMEOUT:-600}
PYTHON=${PYTHON:-/usr/bin/python3}
KEEP=0
SCRATCH=

while getopts "ko:h" opt; do
    case $opt in
        k) KEEP=1 ;;
        o) SCRATCH=$OPTARG ;;
        *) sed -n '2,30p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
PATTERNS=("$@")

die() { echo "anchor-suites: $*" >&2; exit 1; }
[ -x "$BUILD/kvmaster" ] || die "no $BUILD/kvmaster: run make all first"
[ -e "$BUILD/libkvengine.so.0" ] || die "no $BUILD/libkvengine.so.0"
$PYTHON -c 'import pytest' 2>/dev/null || die "$PYTHON has no pytest (python3-pytest)"

if [ -z "$SCRATCH" ]; then SCRATCH=$(mktemp -d /tmp/anchor-suites.XXXXXX); fi
mkdir -p "$SCRATCH" || die "cannot make $SCRATCH"
SCRATCH=$(cd "$SCRATCH" && pwd)

MASTER_PIDS=()
cleanup() {
    local p
    for p in "${MASTER_PIDS[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    if [ "$KEEP" = 1 ]; then echo "scratch kept: $SCRATCH"; else rm -rf "$SCRATCH"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_free() {
    $PYTHON - "$1" <<'EOF'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

# start_master PORT: a kvmaster on 127.0.0.1:PORT, waited for until it
# answers; its pid goes into MASTER_PIDS (stopped at exit) and LAST_MASTER.
start_master() {
    local port=$1 i
    "$BUILD/kvmaster" --set cluster.master=127.0.0.1:$port --set log.level=warn \
        > "$SCRATCH/kvmaster-$port.log" 2>&1 &
    LAST_MASTER=$!
    MASTER_PIDS+=("$LAST_MASTER")
    for i in $(seq 100); do
        if ! kill -0 "$LAST_MASTER" 2>/dev/null; then
            cat "$SCRATCH/kvmaster-$port.log" >&2; return 1
        fi
        if ! port_free "$port"; then return 0; fi
        sleep 0.05
    done
    return 1
}

stop_master() {
    local p=$1 keep=() q
    kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    for q in "${MASTER_PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
    MASTER_PIDS=("${keep[@]}")
}

lo=${PORTS%-*}; hi=${PORTS#*-}
MASTER_PORT=
for ((p = lo; p <= hi; p++)); do
    if port_free $p; then MASTER_PORT=$p; break; fi
done
[ -n "$MASTER_PORT" ] || die "no free port in $PORTS"
start_master "$MASTER_PORT" || die "kvmaster did not start"

selected() {
    local f=$1 pat
    [ ${#PATTERNS[@]} = 0 ] && return 0
    for pat in "${PATTERNS[@]}"; do
        case $f in *"$pat"*) return 0 ;; esac
    done
    return 1
}

PYROOT=${KVENGINE_PYTHON:-$ROOT/python}
export PYTHONPATH=$PYROOT/compat:$PYROOT
export KVENGINE_LIBRARY=$BUILD/libkvengine.so.0
export KV_BUILD=$BUILD
export MASTER_SERVER=127.0.0.1:$MASTER_PORT
export MOONCAKE_MASTER=127.0.0.1:$MASTER_PORT
export MC_METADATA_SERVER=P2PHANDSHAKE
export PROTOCOL=tcp
export DEVICE_NAME=
export KV_LOG_LEVEL=${KV_LOG_LEVEL:-warn}
# Mooncake's CI (scripts/run_tests.sh) runs its master with
# --default_kv_lease_ttl=500 and its tests with this, and points the
# client's file storage at a test directory.
export DEFAULT_KV_LEASE_TTL=500
export MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=$SCRATCH/offload
mkdir -p "$MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"

RESULTS=$SCRATCH/results.txt
: > "$RESULTS"

# junit_counts XML: "passed failed skipped" from pytest's junit report.
junit_counts() {
    $PYTHON - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 1 0 (no report)"); sys.exit()
p = f = s = 0
for case in root.iter("testcase"):
    tags = {c.tag for c in case}
    if "skipped" in tags:
        s += 1
    elif "failure" in tags or "error" in tags:
        f += 1
    else:
        p += 1
# collection errors are <testcase>-less <error>s in some versions
for suite in root.iter("testsuite"):
    if not list(suite.iter("testcase")) and int(suite.get("errors", 0)):
        f += int(suite.get("errors"))
print(p, f, s)
EOF
}

# start_host_daemon NAME: a kvnode serving the host store NAME alone (no
# cluster), in the place of the mooncake_client Mooncake's CI starts
# before its dummy-client tests; waited for until it serves.
start_host_daemon() {
    local i log
    DAEMON_N=$((${DAEMON_N:-0} + 1))
    log=$SCRATCH/kvnode-$1-$DAEMON_N.log
    "$BUILD/kvnode" --set store.name="$1" --set cluster.enabled=false --set pipeline=dram \
        --set dram.capacity=1GiB --set dram.hugepages=off --set log.level=info \
        > "$log" 2>&1 &
    LAST_DAEMON=$!
    MASTER_PIDS+=("$LAST_DAEMON")
    # up to 30 s: on a loaded machine 10 s was not always enough, and a
    # daemon given up on kept serving into the next file's run
    for i in $(seq 600); do
        grep -q "engine open" "$log" && return 0
        kill -0 "$LAST_DAEMON" 2>/dev/null || break
        sleep 0.05
    done
    cat "$log" >&2
    stop_master "$LAST_DAEMON"
    return 1
}

# unittest_counts LOG: "passed failed skipped" from a unittest run's log.
unittest_counts() {
    $PYTHON - "$1" <<'EOF'
import re, sys
t = open(sys.argv[1], errors="replace").read()
m = re.search(r"^Ran (\d+) tests?", t, re.M)
if not m:
    print("0 1 0 (did not run)"); sys.exit()
ran = int(m.group(1))
def n(what):
    x = re.search(what + r"=(\d+)", t)
    return int(x.group(1)) if x else 0
f, s = n("failures") + n("errors"), n("skipped")
print(ran - f - s, f, s)
EOF
}

# run_script LABEL DIR FILE ARGS...: a file that is a script, not a test
# module (it reads sys.argv): one test, passed when it exits 0.
run_script() {
    local label=$1 dir=$2 file=$3 tag rc counts
    shift 3
    tag=$(echo "$label" | tr '/' '_')
    (cd "$dir" && timeout -k 10 "$PER_FILE_TIMEOUT" $PYTHON "$file" "$@") > "$SCRATCH/$tag.log" 2>&1
    rc=$?
    if [ "$rc" = 0 ]; then counts="1 0 0"; else counts="0 1 0 (exit $rc)"; fi
    printf '%-58s %s\n' "$label" "$counts" | tee -a "$RESULTS"
}

# run_pair LABEL DIR FILE: Mooncake's two-process test, run as its CI runs
# it (--client-id client1 and client2 at once); counted per client.
run_pair() {
    local label=$1 dir=$2 file=$3 tag p1 p2 c
    tag=$(echo "$label" | tr '/' '_')
    (cd "$dir" && exec timeout -k 10 "$PER_FILE_TIMEOUT" $PYTHON "$file" --client-id client1) \
        > "$SCRATCH/$tag.1.log" 2>&1 &
    p1=$!
    (cd "$dir" && exec timeout -k 10 "$PER_FILE_TIMEOUT" $PYTHON "$file" --client-id client2) \
        > "$SCRATCH/$tag.2.log" 2>&1 &
    p2=$!
    wait $p1 $p2
    for c in 1 2; do
        printf '%-58s %s\n' "$label[client$c]" "$(unittest_counts "$SCRATCH/$tag.$c.log")" \
            | tee -a "$RESULTS"
    done
}

# run_pytest LABEL DIR FILE: pytest on FILE from DIR, counted from junit.

run_pytest() {
    local label=$1 dir=$2 file=$3 tag counts rc
    tag=$(echo "$label" | tr '/' '_')
    (cd "$dir" && timeout -k 10 "$PER_FILE_TIMEOUT" $PYTHON -m pytest -q -p no:cacheprovider \
        -o addopts= --junitxml="$SCRATCH/$tag.xml" "$file") > "$SCRATCH/$tag.log" 2>&1
    rc=$?
    counts=$(junit_counts "$SCRATCH/$tag.xml")
    [ "$rc" = 124 ] && counts="$counts (timed out)"
    printf '%-58s %s\n' "$label" "$counts" | tee -a "$RESULTS"
}

# ---- Mooncake ---------------------------------------------------------
MC=$SCRATCH/mooncake
mkdir -p "$MC"
git --git-dir="$MOONCAKE_MIRROR" archive HEAD mooncake-wheel/tests scripts \
    mooncake-store/benchmarks/store_kv_bench.py mooncake-store/benchmarks/test_store_kv_bench.py \
    2>/dev/null | tar -x -C "$MC" || die "cannot read $MOONCAKE_MIRROR"

MC_FILES=()
for f in "$MC"/mooncake-wheel/tests/test_*.py "$MC"/scripts/test_*.py \
         "$MC"/mooncake-store/benchmarks/test_store_kv_bench.py; do
    MC_FILES+=("${f#$MC/}")
done

echo "file                                                       passed failed skipped"
for rel in "${MC_FILES[@]}"; do
    selected "$rel" || continue
    hard=
    # A file that names 127.0.0.1:50051 outside an os.getenv default has
    # no way to be pointed elsewhere: give it a master there.
    if grep -v 'getenv\|environ' "$MC/$rel" | grep -q '\(127\.0\.0\.1\|localhost\):50051'; then
        # 50051 is in the ephemeral range: a connection's local port can hold
        # it for a moment (it did, once in three runs), so try a while.
        for _ in $(seq 20); do
            if port_free 50051 && start_master 50051 2>/dev/null; then hard=$LAST_MASTER; break; fi
            sleep 0.25
        done
        [ -n "$hard" ] || echo "note: 127.0.0.1:50051 is taken; $rel runs without a master there" >&2
    fi
    daemon=
    # setup_dummy reaches a real client's store: Mooncake's CI runs
    # mooncake_client at 127.0.0.1:50052 for these; the drop-in names the
    # host store after that address.
    if grep -q 'setup_dummy' "$MC/$rel" && grep -q '127.0.0.1:50052' "$MC/$rel"; then
        start_host_daemon mooncake-127.0.0.1-50052 && daemon=$LAST_DAEMON
    fi
    case $rel in
        */test_meta_server.py)          # a QPS script: argv is master host, threads
            run_script "$rel" "$MC/$(dirname "$rel")" "$(basename "$rel")" 127.0.0.1 2 ;;
        */test_multi_dummy_clients.py)
            run_pair "$rel" "$MC/$(dirname "$rel")" "$(basename "$rel")" ;;
        *)
            run_pytest "$rel" "$MC/$(dirname "$rel")" "$(basename "$rel")" ;;
    esac
    [ -n "$hard" ] && stop_master "$hard"
    [ -n "$daemon" ] && stop_master "$daemon"
done

# ---- UCM --------------------------------------------------------------
UC=$SCRATCH/ucm
mkdir -p "$UC"
git --git-dir="$UCM_MIRROR" archive HEAD ucm/store/test/e2e ucm/store/ucmstore_v1.py \
    ucm/store/factory_v1.py 2>/dev/null | tar -x -C "$UC" || die "cannot read $UCM_MIRROR"
# UCM's package __init__ and logger pull in its vLLM patches and native
# logger; the e2e scripts need neither, so both are replaced by stand-ins.
: > "$UC/ucm/__init__.py"
: > "$UC/ucm/store/__init__.py"
printf 'import logging\n\ndef init_logger(name):\n    return logging.getLogger(name)\n' \
    > "$UC/ucm/logger.py"
E2E=$UC/ucm/store/test/e2e
mkdir -p "$UC/run"
# Each script is rewritten (the rules below) next to a pytest file with one
# test that runs it in a fresh interpreter: a zero exit is a pass.
cat > "$SCRATCH/anchor-ucm.py" <<'PYEOF'
import os, re, sys
src, outdir = sys.argv[1], sys.argv[2]
name = os.path.basename(src)
text = open(src).read()
if "cupy" in text or "ds3fs" in text:
    print("skip: 3FS and cupy, not a kvengine store"); sys.exit()
if re.search(r"ucm\.store\.ucmstore import|nfsstore_connector import|pcstore_connector import", text):
    print("skip: UCM's v0 store API; kvengine.ucm is the V1 store"); sys.exit()
if "input(" in text:
    print("skip: interactive"); sys.exit()
# The connector module, as ucm_connector_module_path would name it.
text = text.replace('module_path = "ucm.store.pipeline.connector"', 'module_path = "kvengine.ucm"')
text = text.replace('class_name = "UcmPipelineStore"', 'class_name = "KvEngineStore"')
text = re.sub(r"from ucm\.store\.pipeline\.connector import UcmPipelineStore",
              "from kvengine.ucm import KvEngineStore as UcmPipelineStore", text)
text = re.sub(r"from ucm\.store\.pcstore\.pcstore_connector_v1 import UcmPcStoreV1",
              "from kvengine.ucm import KvEngineStore as UcmPcStoreV1", text)
# CPU tensors where the scripts put them on a GPU.
text = re.sub(r'"cuda:\{\}"\.format\([^)]*\)', '"cpu"', text)
text = re.sub(r'f"cuda:\{[^}]*\}"', '"cpu"', text)
text = text.replace('"cuda:0"', '"cpu"')
text = re.sub(r"torch\.cuda\.set_device\([^)]*\)", "None", text)
text = re.sub(r"torch\.cuda\.synchronize\(\)", "None", text)
# Scaled down: counts of blocks, batches, layers and workers.
caps = {"block_number": 16, "test_batch_number": 2, "batch_number": 2, "batch_size": 16,
        "layer_size": 8, "request_size": 8, "worker_number": 2, "block_layer": 4,
        "dump_epoch_number": 2, "load_epoch_number": 2, "block_num": 16,
        "cache_buffer_capacity_gb": 1, "posix_capacity_gb": 1}
def cap(m):
    n = m.group(2)
    v = min(int(m.group(3)), caps[n])
    return "%s%s = %d" % (m.group(1), n, v)
text = re.sub(r"^(\s*)(%s) = (\d+)\s*$" % "|".join(caps), cap, text, flags=re.M)
text = re.sub(r'(config\["(cache_buffer_capacity_gb|posix_capacity_gb)"\]) = \d+', r"\1 = 1", text)
base = name[:-3]
open(os.path.join(outdir, "anchor_" + name), "w").write(text)
open(os.path.join(outdir, "test_" + name), "w").write(
    "import os, subprocess, sys\n"
    "def test_%s():\n"
    "    here = os.path.dirname(os.path.abspath(__file__))\n"
    "    try:\n"
    "        r = subprocess.run([sys.executable, os.path.join(here, 'anchor_%s')], cwd=here,\n"
    "                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=%d)\n"
    "    except subprocess.TimeoutExpired as e:\n"
    "        # what it printed before it hung is the reader's only clue\n"
    "        raise AssertionError('timed out; its output:\\n' +\n"
    "                             (e.output or b'').decode(errors='replace')[-4000:])\n"
    "    assert r.returncode == 0, r.stdout.decode(errors='replace')[-4000:]\n"
    % (re.sub(r"\W", "_", base), name, int(os.environ.get("PER_FILE_TIMEOUT", "600")) - 20))
print("ok")
PYEOF
for f in "$E2E"/*.py; do
    rel=ucm/store/test/e2e/$(basename "$f")
    selected "$rel" || continue
    out=$(PYTHONPATH=$UC:$PYTHONPATH "$PYTHON" "$SCRATCH/anchor-ucm.py" "$f" "$UC/run" 2>&1)
    case $out in
        skip:*) printf '%-58s 0 0 1 (%s)\n' "$rel" "${out#skip: }" | tee -a "$RESULTS"; continue ;;
        ok) ;;
        *) printf '%-58s 0 1 0 (rewrite: %s)\n' "$rel" "$out" | tee -a "$RESULTS"; continue ;;
    esac
    PYTHONPATH=$UC:$PYTHONPATH run_pytest "$rel" "$UC/run" "test_$(basename "$f")"
done

# ---- interop: Mooncake's own reader and writer against the drop-in's ----
# Mooncake's structured_object_store.py (pure Python in its wheel), taken
# from the mirror into the scratch directory, runs over the drop-in's store
# next to kvengine.mooncake_bundle: each writes, the other reads, and the
# manifests both write are compared field by field (tools/anchor_interop.py).
# With a Mooncake build (MOONCAKE_BUILD, holding mooncake-integration's
# store module and mooncake-store/src/mooncake_master), real Mooncake's
# tensor objects (put_tensor, put_tensor_with_tp, _serialize_tensor) and
# the drop-in's are read by the other side too (tools/anchor_tensor_real.py).
MOONCAKE_BUILD=${MOONCAKE_BUILD:-/work/wt/realmc-build/mc-build}
IO=$SCRATCH/interop
if selected interop/test_interop.py; then
    mkdir -p "$IO"
    git --git-dir="$MOONCAKE_MIRROR" show HEAD:mooncake-wheel/mooncake/structured_object_store.py \
        > "$IO/mooncake_real_sos.py" || die "cannot read $MOONCAKE_MIRROR"
    cp "$ROOT/tools/anchor_interop.py" "$IO/test_interop.py"
    cp "$ROOT/tools/anchor_tensor_real.py" "$IO/"
    export MOONCAKE_SOS=$IO/mooncake_real_sos.py
    unset MOONCAKE_TENSOR_META
    so=$(ls "$MOONCAKE_BUILD"/mooncake-integration/store.cpython-*.so 2>/dev/null | head -1)
    mm=$MOONCAKE_BUILD/mooncake-store/src/mooncake_master
    if [ -n "$so" ] && [ -x "$mm" ]; then
        used=" $MASTER_PORT "
        pick() {
            local q
            for ((q = lo; q <= hi; q++)); do
                case $used in *" $q "*) continue ;; esac
                if port_free $q; then used="$used$q "; echo $q; return 0; fi
            done
            return 1
        }
        mp=$(pick); used="$used$mp "; hp=$(pick); used="$used$hp "
        xp=$(pick); used="$used$xp "; cp_=$(pick)
        mkdir -p "$IO/realmod"
        ln -sf "$so" "$IO/realmod/"
        if (cd "$IO" && $PYTHON anchor_tensor_real.py kv kv.pkl) > "$IO/tensor-kv.log" 2>&1; then
            "$mm" --port="$mp" --rpc_address=127.0.0.1 --enable_http_metadata_server=true \
                --http_metadata_server_port="$hp" --http_metadata_server_host=127.0.0.1 \
                --metrics_port="$xp" --metrics_host=127.0.0.1 --enable_metric_reporting=false \
                > "$IO/mooncake_master.log" 2>&1 &
            rm_pid=$!
            MASTER_PIDS+=("$rm_pid")
            for i in $(seq 100); do ! port_free "$hp" && ! port_free "$mp" && break; sleep 0.05; done
            if (cd "$IO" && LD_LIBRARY_PATH="$MOONCAKE_BUILD/mooncake-common${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                    PYTHONPATH="$IO/realmod" timeout -k 10 120 $PYTHON anchor_tensor_real.py real real.pkl \
                    kv.pkl 127.0.0.1:$mp http://127.0.0.1:$hp/metadata 127.0.0.1:$cp_) \
                    > "$IO/tensor-real.log" 2>&1; then
                export MOONCAKE_TENSOR_META=$IO/real.pkl
            else
                echo "note: real Mooncake's tensor side failed (see $IO/tensor-real.log)" >&2
            fi
            stop_master "$rm_pid"
        else
            echo "note: the drop-in's tensor side failed (see $IO/tensor-kv.log)" >&2
        fi
    else
        echo "note: no Mooncake build at $MOONCAKE_BUILD: the real-Mooncake tensor checks skip" >&2
    fi
    run_pytest interop/test_interop.py "$IO" test_interop.py
fi

$PYTHON - "$RESULTS" <<'EOF'
import sys
p = f = s = 0
for line in open(sys.argv[1]):
    parts = line.split()
    p += int(parts[1]); f += int(parts[2]); s += int(parts[3])
print("%-58s %d %d %d" % ("total", p, f, s))
EOF
