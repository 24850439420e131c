import os, sys
import kvengine.mooncake as mc
def mk(port):
    s = mc.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:%d" % port, "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", "127.0.0.1:26500",
                 kvengine_settings={"dram.hugepages": "off", "log.level": "warn", "cluster.listen": "127.0.0.1:%d" % port})
    assert rc == 0, s.last_error
    return s
a = mk(26501); b = mk(26502)
import time; time.sleep(1.5)
keys = ["pre/%d" % i for i in range(50)] + ["other/%d" % i for i in range(10)]
assert a.put_batch(keys, [b"x" * 100] * len(keys)) == 0
print("exist from b:", sum(b.batch_is_exist(keys)))
b.kv_lease_ttl_ms = 60000
assert b.get("pre/7") == b"x" * 100          # b leases it
a.kv_lease_ttl_ms = 60000
print("a remove pre/7 (b's lease):", a.remove("pre/7"))
print("a remove_by_regex ^pre/:", a.remove_by_regex("^pre/"))
print("left pre:", sum(b.batch_is_exist(keys[:50])), "other:", sum(b.batch_is_exist(keys[50:])))
print("b remove_by_regex ^pre/ :", b.remove_by_regex("^pre/"), "force:", b.remove_by_regex("^pre/", force=True))
a.close(); b.close()
