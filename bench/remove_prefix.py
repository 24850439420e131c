"""remove_prefix.py — what kv_remove_prefix costs: one tenant's keys cleared
out of a store shared by ten, on DRAM alone and with most keys only on the
SSD tier (whose records are read whole to learn their keys). A measurement
to read, not a test (CI does not run it).

    PYTHONPATH=python KVENGINE_LIBRARY=build/libkvengine.so.0 python3 bench/remove_prefix.py
"""
import shutil
import tempfile
import time

import kvengine

BASE = {"dram.hugepages": "off", "log.level": "warn", "io.threads": "1"}


def run(settings, n, vsize, tenants):
    """Puts n keys spread over tenants, clears tenant 0's; (removed, wall s, CPU s)."""
    e = kvengine.Engine(settings=dict(BASE, **settings))
    try:
        v = b"x" * vsize
        for i in range(n):
            e.put(b"\0t%d\0k%d" % (i % tenants, i), v)
        t0, c0 = time.perf_counter(), time.process_time()
        removed = e.remove_prefix(b"\0t0\0")
        return removed, time.perf_counter() - t0, time.process_time() - c0
    finally:
        e.close()


def main():
    n = 100000
    r, w, c = run({"pipeline": "dram", "dram.capacity": "256MiB"}, n, 100, 10)
    print("dram: %d keys x 100 B, 10 tenants: removed %d in %.3f s wall, %.3f s CPU "
          "(%.2f us per key walked)" % (n, r, w, c, w / n * 1e6))
    d = tempfile.mkdtemp()
    try:
        n = 2000
        r, w, c = run({"pipeline": "dram|ssd", "dram.capacity": "8MiB", "ssd.path": d + "/ssd",
                       "ssd.compression": "none"}, n, 65536, 10)
        print("dram|ssd (8 MiB DRAM): %d keys x 64 KiB, 10 tenants: removed %d in %.3f s wall, "
              "%.3f s CPU (%.1f us per key walked)" % (n, r, w, c, w / n * 1e6))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
