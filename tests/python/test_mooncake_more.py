"""test_mooncake_more.py — the Mooncake drop-in's calls beyond the byte-object
core (issue 18): setup's whole argument list, tenants, ReplicateConfig,
leases and soft pins, multi-buffer and ranged calls, upserts, replica
descriptors, BufferPool, the tensor calls and Mooncake's tensor layout, the
pure-Python modules, and what raises NotImplementedError. Written from
Mooncake's documented behaviour."""

import ctypes
import json
import os
import struct
import subprocess
import sys
import time

import pytest

import kvengine
import kvengine.mooncake as mc


def _blob(t):
    """A tensor object's bytes (metadata block + data), as put_tensor stores it."""
    meta, ptr, size, _owner = mc._serialize_tensor(t)
    return meta + ctypes.string_at(ptr, size)

torch = pytest.importorskip("torch")

NOT_FOUND = -704
BAD = -600
HAS_LEASE = -706
QUIET = {"dram.hugepages": "off", "log.level": "warn"}


def _store(**kw):
    s = mc.MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", "32MB", "16MB", "tcp", "", "",
                 kvengine_settings=QUIET, **kw)
    assert rc == 0, s.last_error
    return s


@pytest.fixture
def store():
    s = _store()
    s.kv_lease_ttl_ms = 0      # leases where a test sets them
    yield s
    s.close()


def _cbuf(n, data=b""):
    b = (ctypes.c_ubyte * n)()
    ctypes.memmove(b, data, len(data))
    return b, ctypes.addressof(b)


# -- setup ----------------------------------------------------------------------

def test_setup_takes_sglangs_call(tmp_path):
    """SGLang's HiCache: 8 positional arguments, then keywords."""
    s = mc.MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "", "", None,
                 enable_ssd_offload=True, ssd_offload_path=str(tmp_path / "off"),
                 tenant_id="default", enable_client_http_server=False,
                 kvengine_settings=QUIET)
    assert rc == 0, s.last_error
    assert s.put("k", b"v") == 0 and s.get("k") == b"v"
    assert s._eng.stats()["ssd_capacity"] > 0          # the SSD tier is open
    s.close()
    # engine= is accepted (a TransferEngine has no use here: a warning)
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", "", object(),
                   kvengine_settings=QUIET) == 0
    s.close()


def test_setup_refuses_ssd_offload_without_a_path(monkeypatch):
    monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", raising=False)
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "", "16MB", "16MB", "tcp", "", "", enable_ssd_offload=True,
                   kvengine_settings=QUIET) == BAD
    assert "ssd_offload_path" in s.last_error


def test_setup_dict_form_reads_string_flags(tmp_path):
    s = mc.MooncakeDistributedStore()
    assert s.setup({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "16MB", "local_buffer_size": "16MB",
                    "protocol": "tcp", "master_server_addr": "", "tenant_id": "t1",
                    "enable_ssd_offload": "true", "ssd_offload_path": str(tmp_path / "d"),
                    "kvengine_settings": QUIET}) == 0, s.last_error
    s.close()
    assert s.setup({"local_hostname": "localhost", "enable_ssd_offload": "maybe"}) == BAD


def test_setup_sizes_past_64_bits_are_refused():
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "", 1 << 64, "16MB", "tcp", "", "",
                   kvengine_settings=QUIET) == BAD
    assert "64 bits" in s.last_error


def test_tenants_do_not_see_each_others_objects(tmp_path):
    # Two tenants on one store: one engine (store.name shares it when the
    # host store is in; here the keys are prefixed in one process).
    a = _store(tenant_id="alpha")
    try:
        assert a.put("k", b"alpha's") == 0
        a._prefix = mc._tenant_prefix("beta")      # the same engine, as tenant beta
        assert a.get("k") == b"" and a.is_exist("k") == 0
        assert a.put("k", b"beta's") == 0
        a._prefix = mc._tenant_prefix("alpha")
        assert a.get("k") == b"alpha's"
        a._prefix = b""                               # the default tenant: unprefixed
        assert a.is_exist("k") == 0
    finally:
        a.close()
    with pytest.raises(ValueError):
        mc._tenant_prefix("a\0b")
    assert mc._tenant_prefix("default") == b""


def test_a_fixed_port_in_local_hostname_is_a_name(cluster):
    cluster.start_node()
    cluster.wait_owners(1)
    stores = []
    try:
        for _ in range(2):
            s = mc.MooncakeDistributedStore()
            rc = s.setup("127.0.0.1:12345", "P2PHANDSHAKE", "0", "16MB", "tcp", "",
                         cluster.master, kvengine_settings=dict(cluster.settings(), **QUIET))
            assert rc == 0, s.last_error                # the second binds no 12345 either
            assert s.get_hostname() == "127.0.0.1:12345"
            stores.append(s)
        assert stores[0].put("named", b"x") == 0 and stores[1].get("named") == b"x"
    finally:
        for s in stores:
            s.close()


def test_setup_dummy_opens_the_named_host_store():
    s = mc.MooncakeDistributedStore()
    assert s.setup_dummy("16MB", "16MB", "127.0.0.1:50052") == 0, s.last_error
    assert s.dummy and s.get_hostname() == "127.0.0.1:50052"
    assert s.put("d", b"dummy") == 0 and s.get("d") == b"dummy"
    s.close()
    assert s.setup_dummy("16MB", "16MB", "") == BAD
    assert mc.MooncakeDistributedStore().setup_dummy("16MB", "16MB", "h:1\0") == BAD


# -- ReplicateConfig --------------------------------------------------------------

def test_replicate_config_fields():
    c = mc.ReplicateConfig()
    assert c.soft_pin_ttl_ms is None and c.group_ids is None
    for bad in (-1, 1 << 64, 1.5, "10"):
        with pytest.raises(TypeError):
            c.soft_pin_ttl_ms = bad
    c.soft_pin_ttl_ms = (1 << 64) - 1
    c.soft_pin_ttl_ms = None
    c.group_ids = ["group-a", ""]
    assert c.group_ids == ["group-a", ""]
    c.group_ids = None
    with pytest.raises(TypeError):
        c.group_ids = "abc"
    with pytest.raises(TypeError):
        mc.ReplicateConfig(soft_pin_ttl_ms=-1)
    assert "soft_pin_ttl_ms=None" in str(mc.ReplicateConfig())


def test_group_ids_must_match_the_keys(store):
    c = mc.ReplicateConfig(group_ids=["g"])
    assert store.put_batch(["a", "b"], [b"1", b"2"], c) == BAD
    src, p = _cbuf(4, b"abcd")
    assert store.batch_put_from(["a", "b"], [p, p], [4, 4], c) == [BAD, BAD]
    c.group_ids = ["g", "h"]
    assert store.batch_put_from(["a", "b"], [p, p], [4, 4], c) == [0, 0]


# -- leases and soft pins --------------------------------------------------------------

def test_a_read_leases_the_object_against_remove(store):
    store.kv_lease_ttl_ms = 300
    # A put grants no lease, as real Mooncake's master (3b5a594) answers:
    # remove and batch_replica_clear right after a put succeed (Mooncake's
    # own store_kv_bench remove_perf relies on it; with a put lease every
    # one of its removes failed with -706).
    assert store.put("l", b"data") == 0
    assert store.remove("l") == 0
    assert store.put("l", b"data") == 0
    assert store.batch_replica_clear(["l"]) == ["l"]
    assert store.put("l", b"data") == 0
    assert store.get("l") == b"data"
    assert store.batch_replica_clear(["l"]) == []          # the get leased it
    assert store.remove("l") == HAS_LEASE
    assert store.is_exist("l") == 1
    time.sleep(0.35)                                       # past the lease
    assert store.remove("l") == 0
    assert store.put("l", b"data") == 0
    dst, p = _cbuf(16)
    assert store.get_into("l", p, 16) == 4
    assert store.remove("l") == HAS_LEASE
    assert store.remove("l", force=True) == 0


def test_a_soft_pin_is_a_lease_of_its_ttl(store):
    store.kv_lease_ttl_ms = 0
    assert store.put("p", b"pinned", mc.ReplicateConfig(with_soft_pin=True,
                                                       soft_pin_ttl_ms=60000)) == 0
    assert store.remove("p") == HAS_LEASE
    assert store.batch_remove(["p"]) == [HAS_LEASE]
    assert store.remove("p", force=True) == 0
    assert store.put("q", b"short", mc.ReplicateConfig(with_soft_pin=True,
                                                      soft_pin_ttl_ms=100)) == 0
    time.sleep(0.15)
    assert store.remove("q") == 0


def test_soft_pin_action_and_its_ttl(store):
    store.kv_lease_ttl_ms = 0
    on = mc.ReplicateConfig(soft_pin_action=mc.SoftPinAction.ENABLE, soft_pin_ttl_ms=60000)
    assert store.put("sp", b"x", on) == 0 and store.remove("sp") == HAS_LEASE
    # a TTL without a pin to apply it to is refused, as Mooncake does
    assert store.upsert("sp", b"x", mc.ReplicateConfig(soft_pin_ttl_ms=1000)) == BAD
    assert store.upsert("sp", b"x", mc.ReplicateConfig(
        soft_pin_action=mc.SoftPinAction.DISABLE, soft_pin_ttl_ms=1000)) == BAD
    assert store.upsert("sp", b"x", mc.ReplicateConfig(
        soft_pin_action=mc.SoftPinAction.DISABLE)) == 0          # unpinned
    assert store.remove("sp") == 0


def test_remove_all_keeps_leased_objects_unless_forced(store):
    for i in range(4):
        assert store.put("r%d" % i, b"v%d" % i) == 0
    store.kv_lease_ttl_ms = 60000
    assert store.get("r0") == b"v0"
    assert store.remove_all() == 3
    assert store.get("r0") == b"v0" and store.is_exist("r1") == 0
    assert store.remove_all(force=True) == 1
    assert store.is_exist("r0") == 0


# -- several buffers, ranges, upserts, aliases ------------------------------------------

def test_multi_buffers_round_trip(store):
    parts = [os.urandom(n) for n in (1000, 1, 4096)]
    bufs = [_cbuf(len(x), x) for x in parts]
    ptrs = [p for _, p in bufs]
    sizes = [len(x) for x in parts]
    one, p1 = _cbuf(300, b"z" * 300)
    assert store.batch_put_from_multi_buffers(["m", "one"], [ptrs, [p1]], [sizes, [300]]) == [0, 0]
    assert store.get("m") == b"".join(parts)               # back to back
    outs = [_cbuf(n) for n in sizes]
    o1, q1 = _cbuf(300)
    got = store.batch_get_into_multi_buffers(["m", "one", "absent"],
                                             [[p for _, p in outs], [q1], [q1]],
                                             [sizes, [300], [300]])
    assert got == [sum(sizes), 300, NOT_FOUND]
    assert [bytes(b) for b, _ in outs] == parts and bytes(o1) == b"z" * 300
    # buffers too small together, lists of different lengths, a bad pointer
    small = [_cbuf(10), _cbuf(10)]
    assert store.batch_get_into_multi_buffers(["m"], [[p for _, p in small]], [[10, 10]]) == [BAD]
    assert store.batch_put_from_multi_buffers(["m"], [ptrs], [sizes[:2]]) == [BAD]
    assert store.batch_put_from_multi_buffers(["m", "n"], [ptrs], [sizes]) == [BAD, BAD]
    assert store.batch_put_from_multi_buffers(["m"], [[0]], [[5]]) == [BAD]


def test_get_into_ranges(store):
    assert store.put("a", bytes(range(100))) == 0
    assert store.put("b", b"B" * 50) == 0
    dst, base = _cbuf(64)
    # an unregistered destination is refused: its end cannot be checked
    assert store.get_into_ranges([base], [["a"]], [[[0]]], [[[0]]], [[[4]]]) == [[[BAD]]]
    assert store.register_buffer(base, 64) == 0
    got = store.get_into_ranges([base], [["a", "b", "nope"]],
                                [[[0, 10], [20], [30]]], [[[5, 90], [40], [0]]],
                                [[[4, 10], [10], [1]]])
    assert got == [[[4, 10], [10], [NOT_FOUND]]]
    assert bytes(dst[0:4]) == bytes(range(5, 9)) and bytes(dst[10:20]) == bytes(range(90, 100))
    assert bytes(dst[20:30]) == b"B" * 10
    # past the object's end, past the registered buffer's end (nothing written)
    assert store.get_into_ranges([base], [["b"]], [[[0]]], [[[45]]], [[[10]]]) == [[[BAD]]]
    guard, gp = _cbuf(64)
    assert store.register_buffer(gp, 32) == 0
    assert store.get_into_ranges([gp], [["a"]], [[[30]]], [[[0]]], [[[4]]]) == [[[BAD]]]
    assert bytes(guard) == bytes(64)
    assert store.get_into_ranges([gp + 8], [["a"]], [[[20]]], [[[0]]], [[[4]]]) == [[[4]]]
    assert store.unregister_buffer(gp) == 0 and store.unregister_buffer(base) == 0


def test_upserts_replace(store):
    assert store.upsert("u", b"one") == 0 and store.upsert("u", b"two") == 0
    assert store.get("u") == b"two"
    assert store.upsert_parts("u", b"a", b"b") == 0 and store.get("u") == b"ab"
    assert store.upsert_batch(["u", "w"], [b"3", b"4"]) == 0
    src, p = _cbuf(3, b"xyz")
    assert store.upsert_from("u", p, 3) == 0 and store.get("u") == b"xyz"
    assert store.batch_upsert_from(["u", "w"], [p, p], [1, 2]) == [0, 0]
    assert store.get_batch(["u", "w"]) == [b"x", b"xy"]


def test_isExist_is_is_exist(store):
    assert store.put("e", b"1") == 0
    assert store.isExist("e") == 1 and store.isExist("f") == 0


def test_replica_descriptors_and_clear(store):
    store.kv_lease_ttl_ms = 0
    assert store.put("rd", b"12345") == 0
    d = store.batch_get_replica_desc(["rd", "none"])
    assert list(d) == ["rd"]
    r = d["rd"][0]
    assert r.is_memory_replica() and not r.is_disk_replica()
    assert r.status == mc.ReplicaStatus.COMPLETE
    assert r.get_memory_descriptor().buffer_descriptor.size == 5
    assert store.get_replica_desc("none") == []
    assert store.batch_replica_clear(["rd"], "some-other-segment") == []
    assert store.is_exist("rd") == 1
    assert store.batch_replica_clear(["rd", "none"]) == ["rd"]
    assert store.is_exist("rd") == 0


def test_alloc_from_mem_pool_gives_registered_memory(store):
    p = store.alloc_from_mem_pool(1 << 20)
    assert p and p % 4096 == 0
    ctypes.memmove(p, b"pool!", 5)
    assert store.put_from("mp", p, 5) == 0 and store.get("mp") == b"pool!"
    # registered: a ranged read into it is checked against its end
    assert store.get_into_ranges([p], [["mp"]], [[[(1 << 20) - 2]]], [[[0]]], [[[5]]]) == [[[BAD]]]
    assert store.get_into_ranges([p], [["mp"]], [[[8]]], [[[0]]], [[[5]]]) == [[[5]]]
    assert store.alloc_from_mem_pool(0) == 0


def test_sizes_past_64_bits_do_not_wrap(store):
    src, p = _cbuf(8, b"12345678")
    assert store.put_from("w", p, 1 << 64) == BAD
    assert store.put_from("w", p + (1 << 64), 8) == BAD
    assert store.get_into("w", p, (1 << 64) + 8) == BAD
    assert store.register_buffer(p, 1 << 64) == BAD
    with pytest.raises(ValueError, match="64 bits"):
        store._eng.dump([(b"\1" * 16, 0, [(p, 1 << 64)])])
    with pytest.raises(ValueError, match="64 bits"):
        store._eng.register_buffer(p, (1 << 64) + 1)


def test_a_nul_in_a_setting_or_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="NUL"):
        kvengine.Engine(settings={"ssd.path": str(tmp_path) + "\0tail"})
    with pytest.raises(ValueError, match="NUL"):
        kvengine.Engine(str(tmp_path / "a.yaml") + "\0.yaml")
    s = _store()
    try:
        assert s.put("a\0b", b"x") == BAD       # would be cut at the NUL
    finally:
        s.close()


def test_calls_without_meaning_here_say_why(store):
    for call, args in ((store.mount_segment, ("/dev/cxl", 1 << 20)),
                       (store.create_copy_task, ("k", ["seg"])),
                       (store.create_move_task, ("k", "a", "b")),
                       (store.query_task, (1,)), (store.remove_by_regex, ("k.*",)),
                       (store.init_all, ("tcp", ""))):
        with pytest.raises(NotImplementedError) as ei:
            call(*args)
        assert len(str(ei.value)) > 20
    import mooncake.engine as me
    with pytest.raises(NotImplementedError):
        me.TransferEngine().initialize("localhost", "P2PHANDSHAKE", "tcp", "")
    mc.bind_to_numa_node(0)        # no NUMA here or there: never raises


# -- BufferPool -------------------------------------------------------------------------

def test_buffer_pool_leases(store):
    from mooncake import BufferPool, RegisteredBufferPool
    assert BufferPool is RegisteredBufferPool is mc.BufferPool
    pool = BufferPool(store, max_bytes=32 << 20)
    lease = pool.acquire(1 << 20)
    assert lease.size == 1 << 20 and lease.ptr % 4096 == 0
    view = lease.buffer
    view[:5] = b"hello"
    view[-1] = 7
    assert store.put_from("z", lease.ptr, lease.size) == 0
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    del view
    with pool.acquire(1 << 20) as out:
        assert store.get_into("z", out.ptr, out.size) == 1 << 20
        v = out.buffer
        assert bytes(v[:5]) == b"hello" and v[-1] == 7
        del v
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    lease.release()
    lease.release()                        # again: nothing
    with pytest.raises(RuntimeError, match="closed"):
        lease.ptr
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(10)


def test_buffer_pool_exhaustion_and_views(store):
    pool = mc.BufferPool(store, max_bytes=16 << 20)         # the local buffer: 16 MB
    with pytest.raises(RuntimeError, match="exceeds"):
        pool.acquire(64 << 20)
    a = pool.acquire(16 << 20)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1 << 20, block=False)
    with pytest.raises(RuntimeError, match="timed out"):
        pool.acquire(1 << 20, timeout=0.05)
    a.release()
    v = pool.buffer(4 << 20)                                # a view that owns its lease
    assert isinstance(v, memoryview) and len(v) == 4 << 20
    v2 = pool.buffer(12 << 20)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1, block=False)
    del v, v2                                               # their leases go with them
    pool.acquire(16 << 20, block=False).release()
    pool.close()
    with pytest.raises(RuntimeError):
        mc.BufferPool(mc.MooncakeDistributedStore())        # not set up


# -- tensors ----------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
          torch.int64, torch.bool, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_put_get_tensor(store, dtype):
    t = (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) - 7).to(dtype)
    assert store.put_tensor("t", t) == 0
    got = store.get_tensor("t")
    assert got.dtype == dtype and got.shape == t.shape and torch.equal(got, t)
    assert store.get_tensor("absent") is None


def test_the_stored_object_is_mooncakes_layout(store):
    t = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    assert store.put_tensor("lay", t) == 0
    raw = store.get("lay")
    assert len(raw) == 304 + 24
    magic, ver, hsize, dtype, ndim, kind, _, off, nbytes = struct.unpack_from("<IHHiiIIQQ", raw)
    assert (magic, ver, hsize, dtype, ndim, kind, off, nbytes) == \
        (0x4D4F4F4E, 1, 304, 4, 2, 0, 304, 24)
    shapes = struct.unpack_from("<8q8q", raw, 40)
    assert shapes[:3] == (3, 4, -1) and shapes[8:11] == (3, 4, -1)
    assert raw[304:] == t.numpy().tobytes()
    assert mc._tensor_metadata_size() == 304
    assert torch.equal(mc._deserialize_tensor(_blob(t)), t)
    # a torn or foreign object is no tensor
    assert store.put("torn", raw[:-2]) == 0 and store.get_tensor("torn") is None
    assert store.put("foreign", b"x" * 400) == 0 and store.get_tensor("foreign") is None


def test_tensor_into_and_batches(store):
    ts = [torch.randn(8, 16), torch.arange(10, dtype=torch.int64), torch.zeros(0)]
    assert store.batch_put_tensor(["b0", "b1", "b2"], ts) == [0, 0, 0]
    got = store.batch_get_tensor(["b0", "b1", "b2", "bx"])
    assert all(torch.equal(a, b) for a, b in zip(got[:3], ts)) and got[3] is None
    buf, p = _cbuf(4096)
    t = store.get_tensor_into("b0", p, 4096)
    assert torch.equal(t, ts[0]) and t.data_ptr() == p + 304     # over the caller's memory
    bufs = [_cbuf(4096), _cbuf(4096)]
    got = store.batch_get_tensor_into(["b0", "b1"], [q for _, q in bufs], [4096, 4096])
    assert torch.equal(got[0], ts[0]) and torch.equal(got[1], ts[1])
    assert store.get_tensor_into("b0", p, 100) is None               # too small
    assert store.put_tensor("gpu?", "not a tensor") == BAD
    assert store.pub_tensor("pub", ts[1], mc.ReplicateConfig()) == 0
    assert store.batch_pub_tensor(["pub2"], [ts[1]]) == [0]
    assert store.upsert_tensor("pub", ts[0]) == 0 and torch.equal(store.get_tensor("pub"), ts[0])
    assert store.batch_upsert_tensor(["pub"], [ts[1]]) == [0]
    assert store.upsert_pub_tensor("pub", ts[0]) == 0
    assert store.batch_upsert_pub_tensor(["pub"], [ts[1]]) == [0]
    assert torch.equal(store.get_tensor("pub"), ts[1])


def test_tensor_from_a_serialized_buffer(store):
    t = torch.randn(5, 5)
    blob = _blob(t)
    b, p = _cbuf(len(blob), blob)
    assert store.put_tensor_from("tf", p, len(blob)) == 0
    assert torch.equal(store.get_tensor("tf"), t)
    assert store.batch_put_tensor_from(["tf2"], [p], [len(blob)]) == [0]
    junk, q = _cbuf(400, b"j" * 400)
    assert store.put_tensor_from("tf3", q, 400) == BAD
    assert store.upsert_tensor_from("tf", p, len(blob)) == 0
    assert store.batch_upsert_tensor_from(["tf"], [p], [len(blob)]) == [0]


def test_tensor_parallel_shards(store):
    t = torch.arange(48, dtype=torch.float32).reshape(4, 12)
    assert store.put_tensor_with_tp("w", t, tp_size=3, split_dim=1) == 0
    for r in range(3):
        part = store.get_tensor_with_tp("w", tp_rank=r, tp_size=3)
        assert torch.equal(part, t[:, 4 * r:4 * r + 4])
        raw = store.get("w_tp_%d" % r)
        assert struct.unpack_from("<I", raw, 16)[0] == 1                 # a shard
        g = struct.unpack_from("<8q8q", raw, 40)
        assert g[:2] == (4, 12) and g[8:10] == (4, 4)
        assert struct.unpack_from("<I", raw, 168)[0] == 1               # one axis
        assert struct.unpack_from("<iiiii", raw, 176) == (1, 0, r, 3, 1)
    assert store.get_tensor_with_tp("w") is None          # tp_size 1: the key itself
    assert store.put_tensor_with_tp("w", t, tp_size=5, split_dim=1) == BAD   # uneven
    assert store.batch_put_tensor_with_tp(["x", "y"], [t, t], tp_size=2) == [0, 0]
    got = store.batch_get_tensor_with_tp(["x", "y"], tp_rank=1, tp_size=2)
    assert all(torch.equal(g, t[2:]) for g in got)
    assert store.pub_tensor_with_tp("pz", t, tp_size=2) == 0
    assert store.batch_pub_tensor_with_tp(["pz"], [t], tp_size=2) == [0]
    bufs = [_cbuf(1024), _cbuf(1024)]
    got = store.batch_get_tensor_with_tp_into(["x", "y"], [q for _, q in bufs], [1024, 1024],
                                              tp_rank=0, tp_size=2)
    assert all(torch.equal(g, t[:2]) for g in got)
    b, p = _cbuf(1024)
    assert torch.equal(store.get_tensor_with_tp_into("x", p, 1024, tp_rank=1, tp_size=2), t[2:])
    blob = _blob(t)
    bb, bp = _cbuf(len(blob), blob)
    assert store.put_tensor_with_tp_from("f", bp, len(blob), tp_size=4, split_dim=0) == 0
    assert torch.equal(store.get_tensor_with_tp("f", tp_rank=3, tp_size=4), t[3:])


def test_a_tensor_put_by_one_process_is_read_by_another(cluster, tmp_path):
    cluster.start_node()
    cluster.wait_owners(1)
    settings = dict(cluster.settings(), **QUIET)
    s = mc.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "", "0", "16MB", "tcp", "", cluster.master,
                   kvengine_settings=settings) == 0, s.last_error
    try:
        t = torch.arange(30, dtype=torch.bfloat16).reshape(5, 6)
        assert s.put_tensor("xproc", t) == 0
        code = (
            "import json, sys, torch, kvengine.mooncake as mc\n"
            "s = mc.MooncakeDistributedStore()\n"
            "assert s.setup('127.0.0.1', '', '0', '16MB', 'tcp', '', sys.argv[1],"
            " kvengine_settings=json.loads(sys.argv[2])) == 0, s.last_error\n"
            "t = s.get_tensor('xproc')\n"
            "print(t.dtype, tuple(t.shape), float(t.float().sum()))\n"
            "s.put_tensor('back', t * 2)\n"
            "s.close()\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([sys.executable, "-c", code, cluster.master, json.dumps(settings)],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["torch.bfloat16", "(5,", "6)", "435.0"]
        assert torch.equal(s.get_tensor("back"), t * 2)
    finally:
        s.close()


# -- the pure-Python modules --------------------------------------------------------------

def test_mooncake_config(tmp_path, monkeypatch):
    from mooncake.mooncake_config import MooncakeConfig
    p = tmp_path / "mc.json"
    p.write_text(json.dumps({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                             "master_server_address": "127.0.0.1:50051",
                             "global_segment_size": "4GB", "protocol": "RDMA"}))
    c = MooncakeConfig.from_file(str(p))
    assert c.global_segment_size == 4 << 30 and c.protocol == "rdma"
    assert c.local_buffer_size == 1 << 30 and c.tenant_id == "default"
    p.write_text(json.dumps({"local_hostname": "h", "metadata_server": "x"}))
    with pytest.raises(ValueError, match="master_server_address"):
        MooncakeConfig.from_file(str(p))
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    monkeypatch.delenv("MOONCAKE_MASTER", raising=False)
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:50051")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "512mb")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "true")
    c = MooncakeConfig.load_from_env()
    assert c.global_segment_size == 512 << 20 and c.enable_ssd_offload is True
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "perhaps")
    with pytest.raises(ValueError):
        MooncakeConfig.load_from_env()


def test_bench_runs_the_zcopy_path():
    """python -m kvengine.bench --io-api zcopy: the Mooncake store on
    BufferPool leases against kvctl bench (a small run: figures printed,
    none asserted)."""
    import io
    import contextlib
    from kvengine import bench
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--io-api", "zcopy", "--value-size", "64KiB", "--nr-objects", "64",
                         "--rounds", "1", "--json"])
    assert rc == 0
    res = json.loads(out.getvalue())
    assert res["io_api"] == "zcopy" and len(res["rounds"]) == 1
    assert res["rounds"][0]["py_read_mib_s"] > 0


def test_mooncake_config_sizes_and_protocols(caplog):
    from mooncake.mooncake_config import MooncakeConfig, _parse_segment_size
    assert _parse_segment_size("1e9") == 10 ** 9 and _parse_segment_size(1.5) == 1
    assert _parse_segment_size("  2048  ") == 2048 and _parse_segment_size("512 mb") == 512 << 20
    for bad in ("", "inf", "lots", True):
        with pytest.raises(ValueError):
            _parse_segment_size(bad)
    base = dict(local_hostname="h", metadata_server="m", global_segment_size=0,
                local_buffer_size=0, protocol="tcp", device_name="",
                master_server_address="127.0.0.1:50051")
    with pytest.raises(ValueError, match="global_segment_size"):
        MooncakeConfig(**dict(base, global_segment_size=-1))
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match="Invalid protocol"):
            MooncakeConfig(**dict(base, protocol=bad))
    assert MooncakeConfig(**dict(base, protocol="  RDMA ")).protocol == "rdma"
    with caplog.at_level("WARNING"):
        assert MooncakeConfig(**dict(base, protocol="Foo")).protocol == "foo"
    assert "Unrecognised protocol" in caplog.text
    c = MooncakeConfig(**dict(base, tenant_id=None, ssd_offload_path=None,
                              enable_client_http_server="enable"))
    assert c.tenant_id == "default" and c.ssd_offload_path == "" and c.enable_client_http_server


def test_safetensor_files(store, tmp_path):
    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    assert store.put_tensor("st", t) == 0
    path = str(tmp_path / "t.safetensors")
    assert store.save_tensor_to_safetensor("st", path) == 0
    raw = open(path, "rb").read()
    n = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8:8 + n])
    assert header["st"] == {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}
    assert raw[8 + n:] == t.view(torch.uint8).numpy().tobytes()
    got = store.load_tensor_from_safetensor("copy", path)       # not in the file: its first
    assert torch.equal(got, t) and torch.equal(store.get_tensor("copy"), t)
    assert store.save_tensor_to_safetensor("absent", path) == -1100
    assert store.load_tensor_from_safetensor("x", str(tmp_path / "none.safetensors")) is None
    open(str(tmp_path / "bad"), "wb").write(b"\xff" * 16)
    assert store.load_tensor_from_safetensor("x", str(tmp_path / "bad")) is None


def test_sessions_move_layers_by_ranges(store):
    page, layers = 1024, 4
    keys = ["block0", "block1"]
    src = [_cbuf(page, bytes([i]) * page) for i in range(layers)]
    dst = [_cbuf(page) for _ in range(layers)]
    for _, p in src + dst:
        assert store.register_buffer(p, page) == 0
    assert store.batch_put_session_start(keys, [page * layers] * 2) == [0, 0]
    assert store.is_exist("block0") == 0                    # not readable before the end
    for layer in range(layers):
        rcs = store.batch_put_from_multi_buffer_ranges(
            keys, [[src[layer][1]]] * 2, [[page]] * 2, [[layer * page]] * 2)
        assert rcs == [page, page]
    assert store.batch_put_from_multi_buffer_ranges(["block0"], [[src[0][1]]], [[page]],
                                                    [[layers * page]]) == [BAD]   # past the end
    assert store.batch_put_session_end(keys) == [0, 0]
    assert store.get("block1") == b"".join(bytes([i]) * page for i in range(layers))
    assert store.batch_get_session_start(keys + ["nope"]) == [0, 0, NOT_FOUND]
    for layer in reversed(range(layers)):
        rcs = store.batch_get_into_multi_buffer_ranges(
            keys[:1], [[dst[layer][1]]], [[page]], [[layer * page]])
        assert rcs == [page] and bytes(dst[layer][0]) == bytes([layer]) * page
    unreg, up = _cbuf(page)
    assert store.batch_get_into_multi_buffer_ranges(keys[:1], [[up]], [[page]], [[0]]) == [BAD]
    assert store.batch_get_session_end(keys) == 0
    assert store.batch_get_into_multi_buffer_ranges(keys[:1], [[dst[0][1]]], [[page]],
                                                    [[0]]) == [BAD]   # session over
    assert store.batch_put_session_start(["rv"], [10]) == [0]
    assert store.batch_put_session_revoke(["rv", "none"]) == [0, BAD]
    assert store.batch_put_session_end(["rv"]) == [BAD] and store.is_exist("rv") == 0
