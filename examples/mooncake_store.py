"""mooncake_store.py — Mooncake Store code, unchanged, on kvengine.

    PYTHONPATH=python/compat python3 examples/mooncake_store.py            # one process
    PYTHONPATH=python/compat python3 examples/mooncake_store.py 127.0.0.1:50088
                                      # join the kvmaster there (start kvmaster first)

`mooncake.store` here is kvengine's drop-in (python/compat/mooncake): the
calls and return codes are Mooncake's; the engine under it is kvengine.
"""
import ctypes
import sys

from mooncake.store import MooncakeDistributedStore, ReplicateConfig

master = sys.argv[1] if len(sys.argv) > 1 else ""
store = MooncakeDistributedStore()
rc = store.setup("localhost",          # this member's address (a port is picked)
                 "P2PHANDSHAKE",       # metadata server: accepted and ignored
                 "64MB",               # DRAM this process contributes
                 "16MB",               # bound on values put/get copy
                 "tcp", "",            # protocol, RDMA devices
                 master)               # kvmaster; "" for a single-process store
if rc != 0:
    sys.exit("setup failed: %d" % rc)

config = ReplicateConfig()
config.replica_num = 1
assert store.put("config", b'{"model": "demo"}', config) == 0
assert store.put_parts("greeting", b"Hello, ", b"kvengine!") == 0
print(store.get("greeting").decode(), "| exists:", store.batch_is_exist(["config", "nope"]))

# Zero copy: values go straight from and into registered memory.
size = 1 << 20
src = (ctypes.c_ubyte * size)(*([7] * 64))
dst = (ctypes.c_ubyte * size)()
src_ptr, dst_ptr = ctypes.addressof(src), ctypes.addressof(dst)
store.register_buffer(src_ptr, size)
store.register_buffer(dst_ptr, size)
keys = ["layer0", "layer1"]
put = store.batch_put_from(keys, [src_ptr, src_ptr], [size, size // 2])
got = store.batch_get_into(keys, [dst_ptr, dst_ptr], [size, size])
print("batch_put_from:", put, "batch_get_into:", got, "bytes equal:", bytes(dst) == bytes(src))
store.unregister_buffer(src_ptr)
store.unregister_buffer(dst_ptr)

print("missing key reads as", store.get("missing"), "and removes as", store.remove("missing"))
print("removed", store.remove_all(force=True), "objects; hostname", store.get_hostname(),
      "health", store.health_check())
store.close()
