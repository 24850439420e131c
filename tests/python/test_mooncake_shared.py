"""test_mooncake_shared.py — the Mooncake drop-in's leases and soft pins kept in
the store (seen by every process and host-store client), remove_all per
tenant, put_from_with_metadata, the *_with_parallelism tensor calls, and the
structure inference of mooncake.structured_object_store (issue 18). Written
from Mooncake's documented behaviour."""

import ctypes
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

import kvengine.mooncake as mc


def _blob(t):
    """A tensor object's bytes (metadata block + data), as put_tensor stores it."""
    meta, ptr, size, _owner = mc._serialize_tensor(t)
    return meta + ctypes.string_at(ptr, size)

torch = pytest.importorskip("torch")

BAD = -600
HAS_LEASE = -706
NOT_SUPPORTED = -1012
QUIET = {"dram.hugepages": "off", "log.level": "warn"}


def _local(settings=None):
    s = mc.MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", "32MB", "16MB", "tcp", "", "",
                 kvengine_settings=dict(QUIET, **(settings or {})))
    assert rc == 0, s.last_error
    return s


def _client(cluster, tenant="default"):
    s = mc.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "", "0", "16MB", "tcp", "", cluster.master, tenant_id=tenant,
                 kvengine_settings=dict(cluster.settings(), **QUIET))
    assert rc == 0, s.last_error
    return s


def _child(how, arg, code, ttl_ms):
    """Runs code in another process against the same store: `s` is its
    store, opened as a cluster client (how="cluster", arg the master) or as
    a dummy client of the host store (how="host", arg the server address)."""
    head = ("import json, sys, kvengine.mooncake as mc\n"
            "s = mc.MooncakeDistributedStore()\n"
            "if sys.argv[1] == 'cluster':\n"
            "    rc = s.setup('127.0.0.1', '', '0', '16MB', 'tcp', '', sys.argv[2],"
            " kvengine_settings=json.loads(sys.argv[3]))\n"
            "else:\n"
            "    rc = s.setup_dummy('16MB', '16MB', sys.argv[2])\n"
            "assert rc == 0, s.last_error\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               DEFAULT_KV_LEASE_TTL=str(ttl_ms))
    settings = json.dumps(dict(QUIET, **(_child.settings or {})))
    out = subprocess.run([sys.executable, "-c", head + code + "s.close()\n", how, arg, settings],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


_child.settings = None


@pytest.fixture(params=["cluster", "host"])
def shared(request, cluster):
    """(this process's store, how, arg) for a store another process opens too."""
    if request.param == "cluster":
        cluster.start_node()
        cluster.wait_owners(1)
        _child.settings = cluster.settings()
        s = _client(cluster)
        arg = cluster.master
    else:
        _child.settings = None
        arg = "127.0.0.1:%s" % uuid.uuid4().hex[:8]
        s = mc.MooncakeDistributedStore()
        assert s.setup_dummy("32MB", "16MB", arg) == 0, s.last_error
    s.kv_lease_ttl_ms = 30000       # the horizon its removes look over
    try:
        yield s, request.param, arg
    finally:
        s.close()


def test_another_process_read_lease_refuses_remove(shared):
    """Before: leases were this process's, so the remove succeeded (0)."""
    s, how, arg = shared
    assert s.put("leased", b"read elsewhere") == 0
    s._leases.clear()               # not this process's put lease: only the other's read
    out = _child(how, arg, "print(s.get('leased').decode())\n", 30000)
    assert out.strip() == "read elsewhere"
    assert s.remove("leased") == HAS_LEASE           # after the reader has exited, too
    assert s.batch_remove(["leased"]) == [HAS_LEASE]
    assert s.remove("leased", force=True) == 0
    assert s.is_exist("leased") == 0


def test_a_read_lease_in_the_store_expires(shared):
    s, how, arg = shared
    assert s.put("short", b"x") == 0
    s._leases.clear()
    _child(how, arg, "assert s.batch_get_into(['short'], [0], [0]) == [-600]\n"
                     "b = bytearray(8); import ctypes\n"
                     "p = ctypes.addressof((ctypes.c_char * 8).from_buffer(b))\n"
                     "assert s.get_into('short', p, 8) == 1\n", 300)
    rcs = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rcs.append(s.remove("short"))
        if rcs[-1] != HAS_LEASE:
            break
        time.sleep(0.05)
    assert rcs[-1] == 0, rcs


def test_another_process_soft_pin_refuses_remove_until_unpinned(shared):
    s, how, arg = shared
    _child(how, arg, "c = mc.ReplicateConfig(with_soft_pin=True, soft_pin_ttl_ms=600000)\n"
                     "assert s.put('pinned', b'pin', c) == 0\n", 0)
    assert s.get("pinned") == b"pin"
    s.kv_lease_ttl_ms = 0
    s._leases.clear()
    s._wrote.clear()
    assert s.remove("pinned") == HAS_LEASE
    # Unpinned by a put with soft_pin_action DISABLE (here, in this process).
    assert s.put("pinned", b"pin", mc.ReplicateConfig(
        soft_pin_action=mc.SoftPinAction.DISABLE)) == 0
    s._leases.clear()
    assert s.remove("pinned") == 0


def test_lease_state_is_bounded_and_leaves_with_the_object(host_store_settings):
    s = _local(host_store_settings)      # a store others reach: leases are records
    try:
        s.kv_lease_ttl_ms = 60000
        assert s.put("o", b"v", mc.ReplicateConfig(with_soft_pin=True)) == 0
        pin = mc._pin_key(s._key("o"))
        assert s._eng.exists(pin)
        before = s._eng.stats()["keys"]
        for _ in range(50):                      # fresh leases are not written again
            assert s.get("o") == b"v"
        assert s._eng.stats()["keys"] - before == 1
        assert s.remove("o") == HAS_LEASE
        assert s.remove("o", force=True) == 0
        assert not s._eng.exists(pin)            # the pin went with the object
        # The store's own namespaces cannot be reached as objects.
        assert s.put(b"\0\0mc-pin\0x", b"forged") == BAD
        assert s.get(pin) == b""
        for i in range(70000):                   # the process's copy stays bounded
            s._lease(b"k%d" % i, 1)
        time.sleep(0.01)
        s._lease(b"last", 1)
        assert len(s._leases) < 65536
    finally:
        s.close()


def test_remove_all_is_per_tenant(cluster):
    """Before: alpha's remove_all removed beta's objects too (5 for 3)."""
    cluster.start_node()
    cluster.wait_owners(1)
    a, b = _client(cluster, "alpha"), _client(cluster, "beta")
    try:
        a.kv_lease_ttl_ms = b.kv_lease_ttl_ms = 0
        for i in range(3):
            assert a.put("k%d" % i, b"a") == 0
        for i in range(2):
            assert b.put("k%d" % i, b"b") == 0
        a._leases.clear()
        b._leases.clear()
        assert a.remove_all() == 3
        assert a.batch_is_exist(["k0", "k1", "k2"]) == [0, 0, 0]
        assert b.batch_is_exist(["k0", "k1"]) == [1, 1]
        assert b.get("k0") == b"b"
        # Leased objects stay unless forced, whoever leased them.
        b.kv_lease_ttl_ms = 30000
        assert b.get("k1") == b"b"
        assert b.remove_all() == 1 and b.is_exist("k1") == 1
        assert b.remove_all(force=True) == 1 and b.is_exist("k1") == 0
        assert a.remove_all() == 0
    finally:
        a.close()
        b.close()


def test_default_tenant_remove_all_does_not_count_lease_records(host_store_settings):
    s = _local(host_store_settings)
    try:
        s.kv_lease_ttl_ms = 60000
        for i in range(4):
            assert s.put("c%d" % i, b"v", mc.ReplicateConfig(with_soft_pin=True)) == 0
        assert s.get_batch(["c0", "c1"]) == [b"v", b"v"]
        assert s.remove_all(force=True) == 4       # not the 4 pin records too
        assert s.remove_all() == 0
    finally:
        s.close()


# -- put_from_with_metadata -----------------------------------------------------------------

def test_put_from_with_metadata_stores_metadata_then_data():
    s = _local()
    try:
        data = (ctypes.c_ubyte * 1000).from_buffer_copy(os.urandom(1000))
        meta = (ctypes.c_ubyte * 8).from_buffer_copy(b"METADATA")
        dp, mp = ctypes.addressof(data), ctypes.addressof(meta)
        assert s.register_buffer(dp, 1000) == 0 and s.register_buffer(mp, 8) == 0
        assert s.put_from_with_metadata("wm", dp, mp, 1000, 8) == 0
        assert s.get("wm") == b"METADATA" + bytes(data)
        assert s.put_from_with_metadata("wm0", dp, mp, 0, 8) == 0     # empty data: nothing
        assert s.is_exist("wm0") == 0
        assert s.put_from_with_metadata("wm", dp, -1, 1000, 8) == BAD
    finally:
        s.close()
    assert mc.MooncakeDistributedStore().put_from_with_metadata("k", 1, 1, 1, 1) == -1


# -- the unified parallel tensor calls -------------------------------------------------------

def _tp(rank, size, dim):
    ax = mc.ParallelAxis()
    ax.kind, ax.rank, ax.size, ax.split_dim = "tp", rank, size, dim
    p = mc.TensorParallelism()
    p.axes = [ax]
    return p


def _target(mode, par=None):
    t = mc.ReadTarget()
    t.mode, t.parallelism = mode, par
    return t


@pytest.fixture
def store():
    s = _local()
    s.kv_lease_ttl_ms = 0
    yield s
    s.close()


def test_with_parallelism_full_tensor(store):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert store.put_tensor_with_parallelism("full", t) == 0
    assert torch.equal(store.get_tensor_with_parallelism("full"), t)
    assert torch.equal(store.get_tensor_with_parallelism("full", _target("as_stored")), t)
    assert torch.equal(store.get_tensor_with_parallelism("full", _target("full")), t)
    assert store.upsert_tensor_with_parallelism("full", t + 1) == 0
    assert torch.equal(store.get_tensor("full"), t + 1)


def test_with_parallelism_tp_shards_and_the_full_view(store):
    full = torch.arange(24, dtype=torch.int32).reshape(2, 12)
    shards = full.chunk(3, 1)
    for r in range(3):        # shard input: each rank puts its own shard
        assert store.put_tensor_with_parallelism("w", shards[r].contiguous(), _tp(r, 3, 1)) == 0
    for r in range(3):
        got = store.get_tensor_with_parallelism("w", _target("shard", _tp(r, 3, 1)))
        assert torch.equal(got, shards[r])
        assert torch.equal(store.get_tensor_with_tp("w", tp_rank=r, tp_size=3), shards[r])
    assert torch.equal(store.get_tensor_with_parallelism("w", _target("full")), full)
    got = store.batch_get_tensor_with_parallelism(
        ["w", "w"], [_target("full"), _target("shard", _tp(1, 3, 1))])
    assert torch.equal(got[0], full) and torch.equal(got[1], shards[1])
    # A missing shard: no full view.
    assert store.remove("w_tp_2") == 0
    assert store.get_tensor_with_parallelism("w", _target("full")) is None


def test_with_parallelism_writer_partition(store):
    full = torch.arange(8, dtype=torch.float32).view(2, 4)
    for r in range(2):
        assert store.put_tensor_with_parallelism("wp", full, writer_partition=(r, 2, 1)) == 0
    assert torch.equal(store.get_tensor_with_parallelism("wp", _target("full")), full)
    odd = torch.arange(6, dtype=torch.float32).view(2, 3)        # 3 does not split in 2
    assert store.put_tensor_with_parallelism("odd", odd, writer_partition=(0, 2, 1)) != 0
    assert store.get_tensor_with_parallelism("odd", _target("full")) is None
    assert store.put_tensor_with_parallelism("both", full, _tp(0, 2, 1), None, (0, 2, 1)) == BAD
    res = store.batch_put_tensor_with_parallelism(["b0", "b1"], [full, odd],
                                                  writer_partitions=[(0, 2, 1), (0, 2, 1)])
    assert res[0] == 0 and res[1] != 0


def test_with_parallelism_several_axes(store):
    # Several axes are stored now (test_mooncake_parallel.py says how).
    dp = mc.ParallelAxis("dp", 0, 2)
    tp = mc.ParallelAxis("tp", 1, 2, 1)
    par = mc.TensorParallelism([dp, tp])
    t = torch.zeros(2, 4)
    assert store.put_tensor_with_parallelism("m", t, par) == 0
    assert store.get_tensor_with_parallelism("m", _target("shard", par)).shape == (2, 2)
    assert store.get_tensor_with_parallelism("m", _target("bogus")) is None


def test_with_parallelism_from_and_into(store):
    t = torch.arange(16, dtype=torch.float64).view(4, 4)
    blob = _blob(t)
    src = (ctypes.c_ubyte * len(blob)).from_buffer_copy(blob)
    sp = ctypes.addressof(src)
    assert store.register_buffer(sp, len(blob)) == 0
    assert store.put_tensor_with_parallelism_from("from", sp, len(blob)) == 0
    assert torch.equal(store.get_tensor("from"), t)
    assert store.put_tensor_with_parallelism_from("fs", sp, len(blob), _tp(1, 2, 0)) == 0
    got = store.get_tensor_with_parallelism("fs", _target("shard", _tp(1, 2, 0)))
    assert torch.equal(got, t)                      # the buffer held rank 1's shard
    assert store.put_tensor_with_parallelism_from("bad", sp, 10) == BAD
    dst = (ctypes.c_ubyte * (len(blob) + 64))()
    dp = ctypes.addressof(dst)
    assert store.register_buffer(dp, len(dst)) == 0
    into = store.get_tensor_with_parallelism_into("from", dp, len(dst))
    assert torch.equal(into, t)
    into = store.get_tensor_with_parallelism_into("from", dp, len(dst), _target("full"))
    assert torch.equal(into, t)
    assert store.batch_get_tensor_with_parallelism_into(["from"], [dp], [len(dst)])[0] is not None


# -- structured_object_store: the inference Mooncake's tests import --------------------------

def test_structure_inference():
    from mooncake.structured_object_store import (MISSING, _choose_leaf_codec, _escape_key,
                                                  infer_structure)
    assert _choose_leaf_codec([b"a", bytearray(b"b")]).codec == "bytes_ragged"
    assert _choose_leaf_codec(["x", None, MISSING]).accepted
    assert not _choose_leaf_codec([None, MISSING]).accepted
    d = _choose_leaf_codec([torch.zeros(1), torch.zeros(2, dtype=torch.int8)])
    assert d.codec == "ragged_tensor" and not d.accepted
    assert _choose_leaf_codec([(1, 2.5), [3]]).codec == "typed_ragged"
    assert _choose_leaf_codec([True, 2]).codec == "ndarray"
    assert _choose_leaf_codec([{"a": [1, {"b": b"x"}]}]).accepted
    assert not _choose_leaf_codec([{1: "int key"}]).accepted
    leaves, nodes = [], []
    infer_structure("r", [{"m": [{"t": "a"}, {"t": "b"}]}, None, {"m": [{"t": "c"}]}],
                    leaves, nodes)
    assert [n.node_type for n in nodes] == ["dict", "list", "dict"]
    assert nodes[0].row_mask == [True, False, True]
    assert nodes[1].lengths == [2, 0, 1]
    assert [(x.path, x.values) for x in leaves] == [("r.m[0].t", ["a", "b", "c"])]
    assert _escape_key("x\\.[") == "x\\\\\\.\\["
    assert repr(MISSING) == "MISSING" and not MISSING


def test_setup_dummy_waits_for_a_peer_still_opening_the_store():
    """Mooncake's CI starts its dummy clients together; before, the second
    one failed with -600 (kv_open's EBUSY after 5 s) while the first was
    still faulting in its pool."""
    addr = "127.0.0.1:%s" % uuid.uuid4().hex[:8]
    code = ("import sys, time, kvengine.mooncake as mc\n"
            "s = mc.MooncakeDistributedStore()\n"
            "rc = s.setup_dummy('64MB', '16MB', sys.argv[1])\n"
            "print(rc, s.last_error)\n"
            "assert rc == 0\n"
            "assert s.put('from-' + sys.argv[2], b'x') == 0\n"
            "t = time.monotonic()\n"
            "while s.is_exist('from-' + sys.argv[3]) != 1 and time.monotonic() - t < 60:\n"
            "    time.sleep(0.05)\n"
            "assert s.is_exist('from-' + sys.argv[3]) == 1\n"
            "time.sleep(0.5)\n"
            "s.close()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               KVENGINE_SETTINGS="dram.hugepages=off log.level=error io.timeout_ms=50")
    procs = [subprocess.Popen([sys.executable, "-c", code, addr, me, peer], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for me, peer in (("a", "b"), ("b", "a"))]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs


def test_with_parallelism_from_takes_a_writer_partition(store):
    """Mooncake's test_upsert_api passes writer_partition(s) to the _from
    forms: TypeError before."""
    full = torch.arange(8, dtype=torch.float32).view(4, 2)
    blob = _blob(full)
    src = (ctypes.c_ubyte * len(blob)).from_buffer_copy(blob)
    sp = ctypes.addressof(src)
    assert store.register_buffer(sp, len(blob)) == 0
    for r in range(2):
        assert store.upsert_tensor_with_parallelism_from("wf", sp, len(blob),
                                                         writer_partition=(r, 2, 0)) == 0
    assert torch.equal(store.get_tensor_with_parallelism("wf", _target("full")), full)
    assert store.batch_put_tensor_with_parallelism_from(
        ["wb", "wb"], [sp, sp], [len(blob)] * 2, writer_partitions=[(0, 2, 0), (1, 2, 0)]) == [0, 0]
    assert torch.equal(store.get_tensor_with_parallelism("wb", _target("full")), full)
