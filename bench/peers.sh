#!/bin/sh
# peers.sh — kvengine's distributed DRAM tier beside Redis and memcached on
# loopback, same value sizes and client concurrency. A measurement to read,
# not a test; keep it short on shared machines.
#
#   sh bench/peers.sh [BUILD_DIR]      (default build; needs BUILD_DIR/kvmaster,
#                                       kvnode and bench_cluster, see below)
#
# bench_cluster is built by hand:
#   cc -O2 -Iinclude -D_GNU_SOURCE -pthread -o BUILD/bench_cluster \
#      tests/bench_cluster.c BUILD/libkvengine.a -lrocksdb -lyaml -llz4 \
#      -lxxhash -ljemalloc -lmicrohttpd -libverbs -lpthread -lm
#
# Redis is driven by redis-benchmark (-c JOBS, SET then GET of one key, so
# every GET returns a whole value). memcached has
# no stock benchmark here, so a small Python client (one connection per
# thread) drives it: its figures are a lower bound.
set -eu
B=${1:-build}
JOBS=${JOBS:-8}
SECS=${SECS:-3}
TMP=$(mktemp -d)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

for size in 1048576 65536; do
    echo "== value $((size / 1024)) KiB, $JOBS clients =="
    n=$(( size >= 1048576 ? 128 : 1024 ))
    if [ -x "$B/bench_cluster" ]; then
        "$B/bench_cluster" "$B" "$size" "$JOBS" "$n" "$SECS" 2 2>/dev/null |
            sed 's/^/kvengine  /'
    fi
    if command -v redis-server >/dev/null; then
        p=$(port)
        redis-server --port "$p" --save "" --appendonly no --daemonize no \
            --logfile "$TMP/redis.log" &
        PIDS="$PIDS $!"
        sleep 0.5
        redis-benchmark -p "$p" -c "$JOBS" -n $(( n * JOBS )) -d "$size" \
            -t set,get --csv 2>/dev/null | tr -d '"' |
            awk -F, -v s="$size" '$1=="SET"||$1=="GET" {
                printf "redis     %-4s %.1f MiB/s  %.0f ops/s  p50=%.0fus p99=%.0fus\n",
                       $1, $2 * s / 1048576, $2, $6 * 1000, $8 * 1000 }'
    fi
    if command -v memcached >/dev/null; then
        p=$(port)
        memcached -p "$p" -l 127.0.0.1 -m 4096 -I 2m -t 4 -U 0 $( [ "$(id -u)" = 0 ] && echo "-u nobody" ) &
        PIDS="$PIDS $!"
        sleep 0.5
        python3 - "$p" "$size" "$JOBS" "$n" <<'PY'
import socket, sys, threading, time
port, size, jobs, n = (int(a) for a in sys.argv[1:5])
val = b"x" * size
def conn():
    s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s, s.makefile("rb")
def readline(f): return f.readline()
def worker(j, op, lat):
    s, f = conn()
    for i in range(n):
        k = b"k%d_%d" % (j, i)
        t0 = time.perf_counter()
        if op == "set":
            s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (k, size, val))
            assert readline(f) == b"STORED\r\n"
        else:
            s.sendall(b"get %s\r\n" % k)
            h = readline(f); ln = int(h.split()[3]); f.read(ln + 2); readline(f)
        lat.append(time.perf_counter() - t0)
    s.close()
for op in ("set", "get"):
    lat = []; th = [threading.Thread(target=worker, args=(j, op, lat)) for j in range(jobs)]
    t0 = time.perf_counter(); [t.start() for t in th]; [t.join() for t in th]
    dt = time.perf_counter() - t0; lat.sort()
    print("memcached %-4s %.1f MiB/s  %.0f ops/s  p50=%.0fus p99=%.0fus (python client)" % (
        op.upper(), n * jobs * size / 1048576 / dt, n * jobs / dt,
        lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6))
PY
    fi
    cleanup_now=$PIDS; PIDS=""
    for p in $cleanup_now; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
done
