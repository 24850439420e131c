"""test_ucm.py — kvengine.ucm.KvEngineStore, UCM's V1 store interface."""

import ctypes
import os

import pytest

import kvengine
from conftest import SMALL, ids
from kvengine.ucm import KvEngineStore, KvEngineTask, UcmKVStoreBaseV1

try:
    import numpy as np
except ImportError:
    np = None
try:
    import torch
except ImportError:
    torch = None

SIZE = 4096


@pytest.fixture
def store():
    s = KvEngineStore({"kvengine_settings": dict(SMALL), "tensor_size": SIZE})
    yield s
    s.close()


def _blocks(n, per):
    """n blocks of `per` tensors as bytearrays, and their addresses."""
    bufs = [[bytearray(os.urandom(SIZE)) for _ in range(per)] for _ in range(n)]
    addrs = [[ctypes.addressof((ctypes.c_char * SIZE).from_buffer(b)) for b in row]
             for row in bufs]
    return bufs, addrs


def test_interface_shape(store):
    assert isinstance(store, UcmKVStoreBaseV1)
    assert store.config["tensor_size"] == SIZE
    assert isinstance(store.cc_store(), int) and store.cc_store() > 0
    for name in ("lookup", "lookup_on_prefix", "prefetch", "load", "dump", "load_data",
                 "dump_data", "fetch_data", "wait", "check", "cc_store"):
        assert callable(getattr(store, name))


def test_dump_data_load_data_lists(store):
    bid = ids(3)
    src, saddr = _blocks(3, 2)
    task = store.dump_data(bid, [0, 0, 0], saddr)
    assert isinstance(task, KvEngineTask)
    store.wait(task)
    with pytest.raises(RuntimeError, match="already waited"):   # wait consumed it
        store.check(task)
    hit = store.lookup(bid + ids(1))
    assert isinstance(hit, np.ndarray) and hit.dtype == bool   # as UCM's stores return
    assert hit.tolist() == [True, True, True, False]
    assert store.lookup_on_prefix(bid + ids(1)) == 2
    assert store.lookup_on_prefix(ids(1) + bid) == -1
    store.prefetch(bid)
    dst, daddr = _blocks(3, 2)
    store.wait(store.load_data(bid, [0, 0, 0], daddr))
    assert dst == src


@pytest.mark.skipif(np is None, reason="numpy not installed")
def test_addresses_as_numpy_array(store):
    bid = ids(2)
    src, saddr = _blocks(2, 3)
    store.wait(store.dump_data(bid, [1, 1], np.array(saddr, dtype=np.uint64)))
    dst, daddr = _blocks(2, 3)
    store.wait(store.fetch_data(bid, [1, 1], np.array(daddr, dtype=np.int64)))
    assert dst == src


def test_tensor_size_list():
    s = KvEngineStore({"kvengine_settings": dict(SMALL), "tensor_size_list": [100, 300]})
    try:
        a = bytearray(os.urandom(100))
        b = bytearray(os.urandom(300))
        addr = lambda x: ctypes.addressof((ctypes.c_char * len(x)).from_buffer(x))  # noqa: E731
        bid = ids(1)
        s.wait(s.dump_data(bid, [0], [[addr(a), addr(b)]]))
        out = bytearray(400)
        s.engine.load([(bid[0], 0, [out])]).wait()
        assert out == a + b
        with pytest.raises(ValueError, match="3 addresses, but tensor_size_list has 2"):
            s.dump_data(bid, [0], [[1, 2, 3]])
    finally:
        s.close()


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_dump_load_cpu_tensors(store):
    bid = ids(2)
    src = [[torch.randn(256), torch.randint(0, 100, (64,), dtype=torch.int64)] for _ in bid]
    store.wait(store.dump(bid, [0, 0], src))
    dst = [[torch.zeros(256), torch.zeros(64, dtype=torch.int64)] for _ in bid]
    store.wait(store.load(bid, [0, 0], dst))
    for s_row, d_row in zip(src, dst):
        for s_t, d_t in zip(s_row, d_row):
            assert torch.equal(s_t, d_t)


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_staging_path(store, monkeypatch):
    """The device path with CPU tensors standing in for GPU ones: every tensor
    goes through a pooled host buffer, and a load's copy back happens when
    the task is waited for. No GPU here: this proves the staging logic, not
    CUDA itself."""
    monkeypatch.setattr(KvEngineStore, "_on_device", lambda self, t: True)
    bid = ids(2)
    src = [[torch.randn(128, dtype=torch.float32), torch.randn(64, dtype=torch.float16)]
           for _ in bid]
    store.wait(store.dump(bid, [0, 0], src))
    dst = [[torch.zeros(128), torch.zeros(64, dtype=torch.float16)] for _ in bid]
    t = store.load(bid, [0, 0], dst)
    store.wait(t)
    for s_row, d_row in zip(src, dst):
        for s_t, d_t in zip(s_row, d_row):
            assert torch.equal(s_t, d_t)
    # The host buffers went back to the pool for the next task.
    assert sum(len(v) for v in store._pool.free.values()) == 4
    # check() also completes the copy back.
    dst2 = [[torch.zeros(128), torch.zeros(64, dtype=torch.float16)] for _ in bid]
    t = store.load(bid, [0, 0], dst2)
    while not store.check(t):
        pass
    assert torch.equal(dst2[1][1], src[1][1])


def test_wait_raises_runtimeerror_on_failure(store):
    dst, daddr = _blocks(1, 1)
    t = store.load_data(ids(1), [0], daddr)
    with pytest.raises(RuntimeError) as ei:
        store.wait(t)
    assert isinstance(ei.value, kvengine.KvError) and ei.value.code == kvengine.ENOTFOUND
    with pytest.raises(RuntimeError, match="already waited"):
        store.wait(t)


def test_bad_input(store):
    bid = ids(2)
    src, saddr = _blocks(2, 1)
    with pytest.raises(ValueError, match="shard_index has 1 entries for 2 block ids"):
        store.dump_data(bid, [0], saddr)
    with pytest.raises(ValueError, match="1 address lists for 2 block ids"):
        store.dump_data(bid, [0, 0], saddr[:1])
    with pytest.raises(ValueError, match="16 bytes"):
        store.dump_data([b"short", bid[1]], [0, 0], saddr)
    with pytest.raises(ValueError, match="1 tensor lists for 2"):
        store.dump(bid, [0, 0], [[bytearray(4)]])
    with pytest.raises(ValueError, match="16 bytes"):
        store.lookup([b"x"])
    with pytest.raises(RuntimeError, match="not a task"):
        store.wait(42)
    with pytest.raises(RuntimeError):
        KvEngineStore("not a dict")
    with pytest.raises(ValueError, match="tensor_size"):
        KvEngineStore({"kvengine_settings": dict(SMALL), "tensor_size": -1})
    s = KvEngineStore({"kvengine_settings": dict(SMALL)})
    try:
        with pytest.raises(ValueError, match="need tensor_size or tensor_size_list"):
            s.load_data(bid, [0, 0], saddr)
    finally:
        s.close()


def test_engine_defaults_and_yaml(tmp_path):
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("pipeline: dram\ndram: { capacity: 16MiB, hugepages: off }\n"
                   "log: { level: warn }\n")
    s = KvEngineStore({"kvengine_config": str(cfg), "tensor_size": 8})
    try:
        assert s.engine.stats()["dram_capacity"] == 16 << 20
    finally:
        s.close()


def test_closed_store(store):
    store.close()
    with pytest.raises(kvengine.KvError) as ei:
        store.lookup(ids(1))
    assert ei.value.code == kvengine.ECLOSED
    with pytest.raises(kvengine.KvError):
        store.cc_store()


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_device_id_without_cuda_means_host_addresses():
    s = KvEngineStore({"kvengine_settings": dict(SMALL), "tensor_size": SIZE, "device_id": 0,
                       "shard_size": SIZE, "block_size": SIZE})
    try:
        bid = ids(1)
        src, saddr = _blocks(1, 2)
        s.wait(s.dump_data(bid, [0], saddr))
        dst, daddr = _blocks(1, 2)
        s.wait(s.load_data(bid, [0], daddr))
        assert dst == src
    finally:
        s.close()
