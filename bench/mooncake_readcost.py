"""mooncake_readcost.py — the CPU one batch_get_into of the Mooncake drop-in
costs (kvengine's Python and C together, no copy to speak of): 4 objects of
8 bytes, every read a first read that takes a read lease (TTL, default 5000
ms; TTL=0 for none), as Mooncake's store_kv_bench verify_read reads. Prints
the 10th percentile, minimum and median of REPS runs of NOBJ/4 calls, in us
of this thread's CPU per call (the 10th percentile is the figure to read on
a shared host, where a median moves with the neighbours). A measurement,
not a test.

    PYTHONPATH=python KVENGINE_LIBRARY=build/libkvengine.so.0 python3 bench/mooncake_readcost.py
"""
import ctypes
import os
import shutil
import statistics
import tempfile
import time

import kvengine.mooncake as mc

ttl = int(os.environ.get("TTL", "5000"))
nobj = int(os.environ.get("NOBJ", "256"))
reps = int(os.environ.get("REPS", "300"))
settings = {"log.level": "warn"}
tmp = None
if os.environ.get("SHARED") == "1":
    tmp = tempfile.mkdtemp(prefix="kvrc")
    settings.update({"store.name": "readcost%d" % os.getpid(), "store.dir": tmp})
s = mc.MooncakeDistributedStore()
assert s.setup("127.0.0.1", "", 128 << 20, 16 << 20, "tcp", "", os.environ.get("MASTER", ""),
               kvengine_settings=settings) == 0, s.last_error
buf = (ctypes.c_ubyte * 64)()
base = ctypes.addressof(buf)
keys = [("b1_%d" % i).rjust(20, "_") for i in range(nobj)]
ptrs = [base + 8 * j for j in range(4)]
sizes = [8] * 4
for i in range(0, nobj, 4):
    assert s.batch_put_from(keys[i:i + 4], ptrs, sizes) == [0] * 4
cpu = []
for _ in range(reps):
    s._wrote.clear()          # every read a first read again: a lease to store
    s._leases.clear()
    s.kv_lease_ttl_ms = ttl
    c0 = time.thread_time()
    for i in range(0, nobj, 4):
        s.batch_get_into(keys[i:i + 4], ptrs, sizes)
    cpu.append((time.thread_time() - c0) / (nobj // 4) * 1e6)
cpu.sort()
print("batch_get_into of 4, ttl %d ms%s: CPU us/call p10 %.1f min %.1f median %.1f"
      % (ttl, ", shared" if tmp else ", cluster" if os.environ.get("MASTER") else "", cpu[len(cpu) // 10], cpu[0], statistics.median(cpu)))
s.close()
if tmp:
    shutil.rmtree(tmp, ignore_errors=True)
