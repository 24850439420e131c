"""test_cluster.py — the Python client against real kvmaster + kvnode
processes on loopback (tcp). Every process is killed and reaped by the
cluster fixture (conftest.py), pass or fail."""

import ctypes
import gc
import os
import threading
import time

import pytest

import kvengine
import kvengine.mooncake as mc
from conftest import free_port, ids


def client_settings(cluster, cap="0"):
    return cluster.settings(**{
        "pipeline": "dram", "dram.capacity": cap, "dram.hugepages": "off",
        "cluster.enabled": "true", "cluster.protocol": "tcp",
        "cluster.listen": "127.0.0.1:%d" % free_port(), "io.threads": "2",
        "io.timeout_ms": "4000"})


def test_pure_client_dumps_to_a_node(cluster):
    cluster.start_node()
    cluster.wait_owners(1)
    with kvengine.Engine(settings=client_settings(cluster)) as e:
        assert e.stats()["dram_capacity"] == 0          # a pure client stores nothing
        bid = ids(8)
        data = [os.urandom(65536 + i) for i in range(8)]
        e.dump([(bid[i], 0, [data[i]]) for i in range(8)]).wait()
        assert e.lookup(bid + ids(1)) == [True] * 8 + [False]
        assert e.lookup_prefix(bid) == 7
        assert e.shard_size(bid[3]) == len(data[3])
        outs = [bytearray(len(d)) for d in data]
        e.load([(bid[i], 0, [outs[i]]) for i in range(8)]).wait()
        assert [bytes(o) for o in outs] == data
        with pytest.raises(kvengine.KvError) as ei:
            e.load([(ids(1)[0], 0, [bytearray(10)])]).wait()
        assert ei.value.code == kvengine.ENOTFOUND
    # Another client process sees the blocks: they live on the node.
    with kvengine.Engine(settings=client_settings(cluster)) as e2:
        out = bytearray(len(data[0]))
        e2.load([(bid[0], 0, [out])]).wait()
        assert out == data[0]


def test_members_view(cluster):
    node = cluster.start_node()
    cluster.wait_owners(1)
    version, members = kvengine.members(settings=cluster.settings())
    assert version > 0
    assert [m["addr"] for m in members if m["owner"]] == [node]
    with pytest.raises(kvengine.KvError) as ei:
        kvengine.members(settings=cluster.settings(**{"cluster.token": "wrong"}))
    assert ei.value.code == kvengine.EPERM


def _mstore(cluster, seg="16MB", **extra):
    s = mc.MooncakeDistributedStore()
    settings = {"cluster.token": cluster.TOKEN, "cluster.node_ttl_ms": "1000",
                "dram.hugepages": "off", "log.level": "warn", "io.timeout_ms": "4000"}
    settings.update(extra)
    rc = s.setup("localhost", "http://unused/metadata", seg, "64MB", "tcp", "", cluster.master,
                 kvengine_settings=settings)
    assert rc == 0, s.last_error
    return s


def test_mooncake_store_joins_the_cluster(cluster):
    s = _mstore(cluster)
    try:
        host, port = s.get_hostname().split(":")
        assert host == "localhost" and 12300 <= int(port) <= 14300
        cluster.wait_owners(1)                      # this store contributes DRAM
        # The member advertises the address localhost resolves to.
        assert [m["addr"] for m in cluster.owners()] == ["127.0.0.1:" + port]
        assert s.health_check() == 0
        data = os.urandom(1 << 20)
        assert s.put("obj", data) == 0 and s.get("obj") == data
        n = 4
        src = (ctypes.c_ubyte * (n << 16))()
        ctypes.memmove(src, os.urandom(n << 16), n << 16)
        base = ctypes.addressof(src)
        keys = ["z%d" % i for i in range(n)]
        ptrs = [base + (i << 16) for i in range(n)]
        assert s.register_buffer(base, n << 16) == 0
        assert s.batch_put_from(keys, ptrs, [1 << 16] * n) == [0] * n
        dst = (ctypes.c_ubyte * (n << 16))()
        dbase = ctypes.addressof(dst)
        assert s.batch_get_into(keys, [dbase + (i << 16) for i in range(n)],
                                [1 << 16] * n) == [1 << 16] * n
        assert bytes(dst) == bytes(src)
        assert s.unregister_buffer(base) == 0
        # The master goes away: the store says so.
        cluster.master_proc.kill()
        cluster.master_proc.wait(10)
        assert s.health_check() == 2
    finally:
        s.close()


def test_mooncake_setup_fails_without_master(tmp_path):
    s = mc.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "", "16MB", "16MB", "tcp", "", "127.0.0.1:%d" % free_port(),
                 kvengine_settings={"dram.hugepages": "off", "log.level": "error",
                                    "io.timeout_ms": "1000"})
    # kv_open tolerates a master that is not up yet (members retry); either
    # way the store must not claim a healthy cluster.
    if rc == 0:
        assert s.health_check() == 2
        s.close()
    else:
        assert rc < 0 and s.last_error


def test_plain_keys_are_cluster_wide(cluster):
    """Objects put by one pure client are read by another: plain keys live
    on the key's owners (issue 11 part 1), and the batch calls reach them in
    one kv_*_many each."""
    cluster.start_node()
    cluster.start_node()
    cluster.wait_owners(2)
    a = _mstore(cluster, seg="0")          # pure clients: no DRAM of their own
    b = _mstore(cluster, seg="0")
    try:
        assert a.put("shared", b"seen from everywhere") == 0
        assert b.get("shared") == b"seen from everywhere"
        assert b.is_exist("shared") == 1 and b.get_size("shared") == 20
        keys = ["k%d" % i for i in range(16)]
        vals = [os.urandom(1000 + 997 * i) for i in range(16)]
        assert a.put_batch(keys, vals) == 0
        assert b.get_batch(keys + ["absent"]) == vals + [b""]
        assert b.batch_is_exist(keys[:3] + ["absent", ""]) == [1, 1, 1, 0, -1]
        n, size = 8, 1 << 20
        src = (ctypes.c_ubyte * (n * size))()
        ctypes.memmove(src, os.urandom(n * size), n * size)
        base = ctypes.addressof(src)
        big = ["big%d" % i for i in range(n)]
        assert a.batch_put_from(big, [base + i * size for i in range(n)], [size] * n) == [0] * n
        dst = (ctypes.c_ubyte * (n * size))()
        dbase = ctypes.addressof(dst)
        got = b.batch_get_into(big + ["absent"], [dbase + i * size for i in range(n)] + [dbase],
                               [size] * (n + 1))
        assert got == [size] * n + [-704]
        assert bytes(dst) == bytes(src)
        # A destination too small for its object fails that key only.
        assert b.batch_get_into(["big0", "k0"], [dbase, dbase + size], [size - 1, size]) == \
            [-600, 1000]
        # A replace is seen by the other client; a remove too.
        assert b.put("shared", b"replaced") == 0
        assert a.get("shared") == b"replaced"
        assert a.remove("shared", force=True) == 0   # a read it: leased
        assert b.is_exist("shared") == 0 and b.get("shared") == b""
        # remove_all from one client removes what the other put too, each
        # object counted once (two nodes, replica_num 1 or 2 alike).
        assert b.put("from-b", b"b's") == 0
        assert a.remove_all(force=True) == len(keys) + n + 1
        assert b.batch_is_exist(keys + big + ["from-b"]) == [0] * (len(keys) + n + 1)
        assert a.remove_all(force=True) == 0
    finally:
        a.close()
        b.close()


def test_mooncake_two_stores_one_closes(cluster):
    """Mooncake's two-store case (issue 18): two stores, each contributing
    DRAM, put objects; one store goes away without close() (SGLang never
    calls it: the garbage collector closes it). It hands its objects to the
    other and leaves the view before it stops serving, so the other still
    gets every object, and its puts during and after succeed (they failed
    with -900/KV_ENET for about a second, and the objects were gone)."""
    held = [_mstore(cluster)]
    b = _mstore(cluster)
    try:
        cluster.wait_owners(2)
        time.sleep(0.6)                 # both stores' next heartbeats bring the view
        keys = ["obj%d" % i for i in range(100)]
        vals = [os.urandom(4096 + 31 * i) for i in range(100)]
        for i, (k, v) in enumerate(zip(keys, vals)):
            assert (held[0] if i % 2 else b).put(k, v) == 0
        failed, done, stop = [], [], threading.Event()

        def putter():
            while not stop.is_set():
                k = "live%d" % len(done)
                rc = b.put(k, k.encode() * 100)
                (failed if rc else done).append((k, rc))
                time.sleep(0.003)       # a steady stream, too little to evict anything

        t = threading.Thread(target=putter)
        t.start()
        try:
            time.sleep(0.1)
            held.clear()
            gc.collect()                # the store's engine closes here
            cluster.wait_owners(1)
            time.sleep(0.5)             # and puts after it is gone
        finally:
            stop.set()
            t.join()
        assert failed == [] and len(done) > 10
        assert b.get_batch(keys) == vals
        assert b.batch_is_exist([k for k, _ in done]) == [1] * len(done)
        assert b.put("after", b"still here") == 0 and b.get("after") == b"still here"
    finally:
        held.clear()
        b.close()
