"""cluster_remove.py — what a plain key's remove costs in a two-member tcp
cluster on loopback (a kvmaster, a kvnode, and this process as the other
member): the wall time of one kv_remove, and of one kv_put for scale, as medians over ROUNDS rounds of N keys. Run it
against two builds in turn (KV_BUILD, KVENGINE_LIBRARY) to see what a
change to the remove path costs. A measurement, not a test.

    KV_BUILD=build KVENGINE_LIBRARY=build/libkvengine.so.0 PYTHONPATH=python \
        python3 bench/cluster_remove.py
"""
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

import kvengine

N = int(os.environ.get("N", "2000"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
TOKEN = "benchtok"


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    build = os.environ.get("KV_BUILD", "build")
    tmp = tempfile.mkdtemp(prefix="kvrm")
    master = "127.0.0.1:%d" % port()
    common = ["--set", "cluster.token=" + TOKEN, "--set", "cluster.node_ttl_ms=1000",
              "--set", "log.level=warn"]
    procs = []
    try:
        log = open(os.path.join(tmp, "log"), "wb")
        procs.append(subprocess.Popen([os.path.join(build, "kvmaster"), "--set",
                                       "cluster.master=" + master] + common,
                                      stdout=log, stderr=log))
        time.sleep(0.3)
        node = "127.0.0.1:%d" % port()
        procs.append(subprocess.Popen(
            [os.path.join(build, "kvnode"), "--set", "cluster.enabled=true", "--set",
             "cluster.master=" + master, "--set", "cluster.listen=" + node, "--set",
             "dram.capacity=64MiB", "--set", "pipeline=dram", "--set", "dram.hugepages=off",
             "--set", "cluster.protocol=tcp"] + common, stdout=log, stderr=log))
        settings = {"cluster.enabled": "true", "cluster.master": master,
                    "cluster.listen": "127.0.0.1:%d" % port(), "cluster.protocol": "tcp",
                    "cluster.token": TOKEN, "cluster.node_ttl_ms": "1000",
                    "dram.capacity": "64MiB", "pipeline": "dram", "dram.hugepages": "off",
                    "log.level": "warn"}
        with kvengine.Engine(settings=settings) as e:
            t0 = time.monotonic()
            while sum(1 for m in kvengine.members(settings=settings)[1] if m["owner"]) < 2:
                if time.monotonic() - t0 > 10:
                    raise SystemExit("the two members did not both join in 10 s")
                time.sleep(0.05)
            time.sleep(0.5)
            val = b"v" * 64
            put, rm = [], []
            for r in range(ROUNDS):
                keys = [b"r%dk%d" % (r, i) for i in range(N)]
                t = time.perf_counter()
                for k in keys:
                    e.put(k, val)
                put.append((time.perf_counter() - t) / N)
                t = time.perf_counter()
                for k in keys:
                    e.remove(k)
                rm.append((time.perf_counter() - t) / N)
            print("cluster remove (tcp, 2 members, %d keys x %d rounds, medians): put %.1f us, "
                  "remove %.1f us" % (N, ROUNDS, statistics.median(put) * 1e6,
                                      statistics.median(rm) * 1e6))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
