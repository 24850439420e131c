"""test_engine.py — kvengine.Engine / Task / KvError: every method, the
buffer kinds, bad input, a closed engine, data checked byte for byte."""

import ctypes
import gc
import os
import threading

import pytest

import kvengine
from conftest import SMALL, ids

try:
    import numpy as np
except ImportError:   # numpy is optional for the package, and so here
    np = None
try:
    import torch
except ImportError:
    torch = None


def test_version_and_library():
    assert kvengine.version().count(".") == 2
    assert os.path.exists(kvengine.library_path)
    assert kvengine.BLOCK_ID_LEN == 16 and kvengine.KEY_MAX == 250


def test_dump_lookup_load_roundtrip(engine):
    bid = ids(6)
    parts = [[os.urandom(1000), os.urandom(3096)] for _ in range(6)]
    t = engine.dump([(bid[i], i % 2, parts[i]) for i in range(6)])
    assert isinstance(t, kvengine.Task) and t.id > 0
    t.wait()
    assert t.check() is True and t.result == 0
    # Shard 0 decides a lookup hit: blocks dumped with shard 1 only miss.
    assert engine.lookup(bid) == [i % 2 == 0 for i in range(6)]
    outs = [[bytearray(1000), bytearray(3096)] for _ in range(6)]
    engine.load([(bid[i], i % 2, outs[i]) for i in range(6)]).wait()
    for i in range(6):
        assert bytes(outs[i][0]) == parts[i][0] and bytes(outs[i][1]) == parts[i][1]
    # A shard's iovecs are stored back to back: one buffer reads both.
    whole = bytearray(4096)
    engine.load([(bid[0], 0, [whole])]).wait()
    assert bytes(whole) == parts[0][0] + parts[0][1]


def test_lookup_prefix_and_prefetch(engine):
    bid = ids(4)
    engine.dump([(b, 0, [b"x" * 64]) for b in bid[:2]]).wait()
    assert engine.lookup_prefix(bid) == 1
    assert engine.lookup_prefix(bid[2:]) == -1
    assert engine.lookup_prefix([]) == -1
    assert engine.lookup([]) == []
    assert engine.prefetch(bid) is None


def _kinds():
    """(name, source factory, destination factory, bytes of a destination)."""
    k = [
        ("bytes/bytearray", lambda d: d, lambda n: bytearray(n), bytes),
        ("memoryview", lambda d: memoryview(d), lambda n: memoryview(bytearray(n)), bytes),
        ("ctypes", lambda d: (ctypes.c_char * len(d)).from_buffer_copy(d),
         lambda n: (ctypes.c_char * n)(), lambda b: bytes(b)),
    ]
    if np is not None:
        k.append(("numpy", lambda d: np.frombuffer(d, dtype=np.uint8).reshape(8, -1),
                  lambda n: np.zeros(n // 4, dtype=np.float32), lambda a: a.tobytes()))
    if torch is not None:
        k.append(("torch", lambda d: torch.frombuffer(bytearray(d), dtype=torch.int16),
                  lambda n: torch.zeros(n // 2, dtype=torch.int16),
                  lambda t: t.numpy().tobytes()))
    return k


@pytest.mark.parametrize("kind", _kinds(), ids=lambda k: k[0])
def test_buffer_kinds(engine, kind):
    _, src, dst, tobytes = kind
    data = os.urandom(4096)
    bid = ids(1)[0]
    engine.dump([(bid, 0, [src(data)])]).wait()
    out = dst(4096)
    engine.load([(bid, 0, [out])]).wait()
    assert tobytes(out) == data


def test_address_pairs(engine):
    src = bytearray(os.urandom(8192))
    dst = bytearray(8192)
    sa = ctypes.addressof((ctypes.c_char * 8192).from_buffer(src))
    da = ctypes.addressof((ctypes.c_char * 8192).from_buffer(dst))
    bid = ids(2)
    engine.dump([(bid[0], 0, [(sa, 4096)]), (bid[1], 0, [(sa + 4096, 4096)])]).wait()
    engine.load([(bid[1], 0, [(da, 4096)]), (bid[0], 0, [(da + 4096, 4096)])]).wait()
    assert dst[:4096] == src[4096:] and dst[4096:] == src[:4096]


def test_load_missing_fails_and_leaves_destination(engine):
    bid = ids(2)
    engine.dump([(bid[0], 0, [b"a" * 128])]).wait()
    a, b = bytearray(b"?" * 128), bytearray(b"?" * 128)
    t = engine.load([(bid[0], 0, [a]), (bid[1], 0, [b])])
    with pytest.raises(kvengine.KvError) as ei:
        t.wait()
    assert ei.value.code == kvengine.ENOTFOUND and ei.value.name == "ENOTFOUND"
    assert bytes(a) == b"a" * 128          # the other shard is still copied
    assert bytes(b) == b"?" * 128          # the missing one is untouched
    # The task reports the same result again, without raising anything else.
    assert t.check() is True and t.result == kvengine.ENOTFOUND
    with pytest.raises(kvengine.KvError):
        t.wait()


def test_load_size_mismatch(engine):
    bid = ids(1)[0]
    engine.dump([(bid, 0, [b"z" * 100])]).wait()
    with pytest.raises(kvengine.KvError) as ei:
        engine.load([(bid, 0, [bytearray(99)])]).wait()
    assert ei.value.code == kvengine.EINVAL


def test_dump_present_shard_is_skipped(engine):
    bid = ids(1)[0]
    engine.dump([(bid, 0, [b"first"])]).wait()
    engine.dump([(bid, 0, [b"other"])]).wait()
    out = bytearray(5)
    engine.load([(bid, 0, [out])]).wait()
    assert out == b"first"


@pytest.mark.parametrize("bad,exc,msg", [
    ([(b"short", 0, [b"x"])], ValueError, "shards[0]: a block id is 16 bytes, got 5"),
    ([(b"x" * 17, 0, [b"x"])], ValueError, "got 17"),
    ([("str-id-16-bytes!", 0, [b"x"])], TypeError, "block id"),
    ([(b"x" * 16, -1, [b"x"])], ValueError, "shard index"),
    ([(b"x" * 16, 2 ** 32, [b"x"])], ValueError, "shard index"),
    ([(b"x" * 16, 0, b"not a list")], TypeError, "buffers is a list"),
    ([(b"x" * 16, 0)], TypeError, "a shard is"),
    ([(b"x" * 16, 0, [12345])], TypeError, "not a buffer"),
    ([(b"x" * 16, 0, [(1, 2, 3)])], TypeError, "pair"),
    ([(b"x" * 16, 0, [(0, 10)])], ValueError, "not a valid pointer"),
    ([], ValueError, "no shards"),
    ((b"x" * 16, 0, [b"x"]), TypeError, "list of (id, index, buffers)"),
])
def test_dump_bad_input(engine, bad, exc, msg):
    with pytest.raises(exc) as ei:
        engine.dump(bad)
    assert msg in str(ei.value)


def test_load_needs_writable_buffers(engine):
    bid = ids(1)[0]
    with pytest.raises(TypeError, match="writable"):
        engine.load([(bid, 0, [b"read-only bytes"])])
    with pytest.raises(TypeError, match="writable"):
        engine.load([(bid, 0, [memoryview(b"read-only")])])
    if np is not None:
        with pytest.raises(ValueError, match="contiguous"):
            engine.load([(bid, 0, [np.zeros((8, 8))[:, ::2]])])


def test_lookup_bad_ids(engine):
    with pytest.raises(ValueError, match=r"ids\[1\]: a block id is 16 bytes, got 3"):
        engine.lookup([b"a" * 16, b"abc"])
    # Lengths that add up right still name the bad id.
    with pytest.raises(ValueError, match=r"ids\[0\]"):
        engine.lookup([b"a" * 15, b"b" * 17])
    with pytest.raises(TypeError):
        engine.lookup([b"a" * 16, 7])
    with pytest.raises(TypeError, match="list of 16-byte"):
        engine.lookup(b"a" * 16)


def test_task_wait_argument_and_timeout(engine):
    t = engine.dump([(ids(1)[0], 0, [b"q" * 4096])])
    with pytest.raises(ValueError):
        t.wait(-1)
    t.wait(5000)
    assert repr(t).endswith("OK>")


def test_unwaited_task_is_finished_by_gc(engine):
    src = bytearray(os.urandom(65536))
    bid = ids(1)[0]
    engine.dump([(bid, 0, [src])])          # dropped at once
    gc.collect()
    out = bytearray(65536)
    engine.load([(bid, 0, [out])]).wait()
    assert out == src


def test_plain_keys(engine):
    assert engine.get("absent") is None
    assert engine.exists("absent") is False
    assert engine.remove("absent") is False
    engine.put("k", b"v1")
    engine.put("k", b"value two")          # a put replaces
    assert engine.get("k") == b"value two" and engine.get(b"k") == b"value two"
    assert engine.exists("k") is True
    big = os.urandom(300000)                # larger than the one-call scratch buffer
    engine.put(b"big", bytearray(big))
    assert engine.get("big") == big
    engine.put("empty", b"")
    assert engine.get("empty") == b"" and engine.exists("empty")
    engine.put("x" * 250, memoryview(b"longest key"))
    assert engine.get("x" * 250) == b"longest key"
    assert engine.remove("k") is True and engine.get("k") is None
    # Plain keys and block ids never collide.
    bid = b"k" * 16
    engine.put(bid, b"plain")
    assert engine.lookup([bid]) == [False]


def test_plain_key_bad_input(engine):
    with pytest.raises(ValueError, match="1..250 bytes, got 251"):
        engine.put("x" * 251, b"v")
    with pytest.raises(ValueError, match="got 0"):
        engine.get("")
    with pytest.raises(TypeError, match="str or bytes"):
        engine.exists(42)
    with pytest.raises(TypeError):
        engine.put("k", 42)


def test_get_into(engine):
    engine.put("k", b"0123456789")
    out = bytearray(16)
    assert engine.get_into("k", out) == 10 and out[:10] == b"0123456789"
    assert engine.get_into("absent", out) is None
    small = bytearray(b"untouched")
    with pytest.raises(kvengine.KvError) as ei:
        engine.get_into("k", small)
    assert ei.value.code == kvengine.ENOBUFS and "the value has 10" in str(ei.value)
    assert small == b"untouched"


def test_shard_size(engine):
    bid = ids(2)
    engine.dump([(bid[0], 3, [b"a" * 77])]).wait()
    assert engine.shard_size(bid[0], 3) == 77
    assert engine.shard_size(bid[1]) is None


def test_register_buffer(engine):
    buf = bytearray(4096)
    addr = engine.register_buffer(buf)
    assert addr > 0
    engine.unregister_buffer(addr)
    a2 = engine.register_buffer(addr, 4096)
    assert a2 == addr
    engine.unregister_buffer(buf)
    with pytest.raises(ValueError):
        engine.register_buffer(0, 10)
    with pytest.raises(ValueError):
        engine.register_buffer(addr, 0)


def test_stats(engine):
    before = engine.stats()
    assert before["dram_capacity"] == 64 << 20
    engine.dump([(b, 0, [b"s" * 1024]) for b in ids(3)]).wait()
    engine.put("a", b"b")
    after = engine.stats()
    assert after["dram_shards"] == before["dram_shards"] + 3
    assert after["keys"] == before["keys"] + 1
    assert after["dumps_ok"] >= before["dumps_ok"] + 1
    assert set(after) >= {"dram_used", "hits_dram", "misses", "evictions", "open_ns"}


def test_closed_engine():
    e = kvengine.Engine(settings=SMALL)
    src = bytearray(os.urandom(1 << 20))
    bid = ids(1)[0]
    pending = e.dump([(bid, 0, [src])])
    e.close()
    # close finished the pending task: its result is still there.
    assert pending.check() is True
    pending.wait()
    e.close()                               # a second close does nothing
    assert e.closed
    calls = [lambda: e.lookup([bid]), lambda: e.lookup_prefix([bid]), lambda: e.prefetch([bid]),
             lambda: e.dump([(bid, 0, [b"x"])]), lambda: e.load([(bid, 0, [bytearray(1)])]),
             lambda: e.put("k", b"v"), lambda: e.get("k"), lambda: e.exists("k"),
             lambda: e.remove("k"), lambda: e.get_into("k", bytearray(1)), lambda: e.stats(),
             lambda: e.register_buffer(src), lambda: e.shard_size(bid)]
    for call in calls:
        with pytest.raises(kvengine.KvError) as ei:
            call()
        assert ei.value.code == kvengine.ECLOSED


def test_context_manager():
    with kvengine.Engine(settings=SMALL) as e:
        e.put("k", b"v")
        assert e.get("k") == b"v"
    assert e.closed


def test_config_file_and_errors(tmp_path):
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("pipeline: dram\ndram:\n  capacity: 32MiB\n  hugepages: off\n"
                   "log:\n  level: warn\n")
    with kvengine.Engine(str(cfg)) as e:
        assert e.stats()["dram_capacity"] == 32 << 20
    # settings override the file.
    with kvengine.Engine(str(cfg), {"dram.capacity": "48MiB"}) as e:
        assert e.stats()["dram_capacity"] == 48 << 20
    with pytest.raises(kvengine.KvError) as ei:
        kvengine.Engine(settings={"no.such.key": "1"})
    assert ei.value.code == kvengine.ECONFIG and "no.such.key" in str(ei.value)
    with pytest.raises(kvengine.KvError) as ei:
        kvengine.Engine(settings={"eviction.ratio": "1.5"})
    assert ei.value.code == kvengine.ECONFIG
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: dram\neviction:\n  ratio: 1.5\n")
    with pytest.raises(kvengine.KvError) as ei:
        kvengine.Engine(str(bad))
    assert "bad.yaml:3" in str(ei.value) and "eviction.ratio" in str(ei.value)
    with pytest.raises(kvengine.KvError) as ei:
        kvengine.Engine(str(tmp_path / "missing.yaml"))
    assert ei.value.code == kvengine.EIO
    with pytest.raises(TypeError):
        kvengine.Engine(settings=["pipeline", "dram"])


def test_kverror():
    e = kvengine.KvError(kvengine.ENOSPC, "dumping")
    assert isinstance(e, RuntimeError)
    assert e.code == -103 and e.name == "ENOSPC"
    assert str(e).startswith("dumping: KV_ENOSPC (-103): ")
    assert kvengine.strerror(kvengine.ENOTFOUND) == "not found"


def test_threads_byte_for_byte(engine):
    errors = []

    def worker(n):
        try:
            for r in range(20):
                bid = ids(4)
                data = [os.urandom(2048 + n * 16 + i) for i in range(4)]
                engine.dump([(bid[i], 0, [data[i]]) for i in range(4)]).wait()
                outs = [bytearray(len(d)) for d in data]
                engine.load([(bid[i], 0, [outs[i]]) for i in range(4)]).wait()
                assert [bytes(o) for o in outs] == data
                engine.put("t%d-%d" % (n, r), data[0])
                assert engine.get("t%d-%d" % (n, r)) == data[0]
        except Exception as exc:   # reported by the main thread
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors


def test_close_races_with_callers():
    e = kvengine.Engine(settings=SMALL)
    stop = threading.Event()
    seen = []

    def hammer():
        while not stop.is_set():
            try:
                e.put("k", b"v" * 1000)
                e.dump([(ids(1)[0], 0, [b"d" * 4096])]).wait()
            except kvengine.KvError as exc:
                seen.append(exc.code)
                return

    ts = [threading.Thread(target=hammer) for _ in range(3)]
    for t in ts:
        t.start()
    e.close()
    stop.set()
    for t in ts:
        t.join(30)
    assert all(code == kvengine.ECLOSED for code in seen)


def test_dump_load_wait_true(engine):
    bid = ids(3)
    data = [os.urandom(3000) for _ in bid]
    assert engine.dump([(bid[i], 0, [data[i]]) for i in range(3)], wait=True) is None
    outs = [bytearray(3000) for _ in bid]
    assert engine.load([(bid[i], 0, [outs[i]]) for i in range(3)], wait=True) is None
    assert [bytes(o) for o in outs] == data
    with pytest.raises(kvengine.KvError) as ei:
        engine.load([(ids(1)[0], 0, [bytearray(8)])], wait=True)
    assert ei.value.code == kvengine.ENOTFOUND


def test_dump_refused_by_the_engine_leaves_no_task(engine):
    # kv_dump itself refuses a shard above KV_VALUE_MAX (before touching it).
    with pytest.raises(kvengine.KvError) as ei:
        engine.dump([(ids(1)[0], 0, [(4096, kvengine.VALUE_MAX + 1)])])
    assert ei.value.code == kvengine.EINVAL and "kv_dump" in str(ei.value)
    assert len(engine._tasks) == 0
    # A task that fails later fails at wait: no room for 65 MiB in 64 MiB.
    t = engine.dump([(ids(1)[0], 0, [bytearray(65 << 20)])])
    with pytest.raises(kvengine.KvError) as ei:
        t.wait()
    assert ei.value.code == kvengine.ENOSPC
    assert len(engine._tasks) == 0
