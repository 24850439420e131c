"""test_mooncake.py — the Mooncake Store drop-in: Mooncake's return
conventions on a single-process engine (the cluster case is in
test_cluster.py)."""

import ctypes
import os
import threading

import pytest

import kvengine.mooncake as mc


NOT_FOUND = -704
BAD = -600


def _setup(store, seg="16MB", buf="16 MB", **kw):
    return store.setup("localhost", "http://ignored:8080/metadata", seg, buf, "tcp", "", "",
                       kvengine_settings={"dram.hugepages": "off", "log.level": "warn"}, **kw)


@pytest.fixture
def store():
    s = mc.MooncakeDistributedStore()
    assert _setup(s) == 0
    s.kv_lease_ttl_ms = 0     # read leases are tested on their own (test_mooncake_more.py)
    yield s
    s.close()


def _cbuf(n, data=b""):
    b = (ctypes.c_ubyte * n)()
    ctypes.memmove(b, data, len(data))
    return b, ctypes.addressof(b)


def test_compat_import():
    import mooncake.store as ms
    assert ms.MooncakeDistributedStore is mc.MooncakeDistributedStore
    assert ms.ReplicateConfig is mc.ReplicateConfig and ms.SoftPinAction is mc.SoftPinAction


def test_setup_forms():
    s = mc.MooncakeDistributedStore()
    assert s.setup({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "16MB", "local_buffer_size": "16 MB",
                    "protocol": "tcp", "rdma_devices": "", "master_server_addr": "",
                    "kvengine_settings": {"dram.hugepages": "off"}}) == 0
    assert s.put("k", b"v") == 0 and s.get("k") == b"v"
    assert s.get_hostname() == "localhost"
    assert s.health_check() == 0
    assert s.setup({"global_segment_size": "16MB"}) == BAD        # already set up
    assert "already set up" in s.last_error
    assert s.close() == 0
    assert s.health_check() == 1
    assert s.close() == 0


@pytest.mark.parametrize("seg,buf,proto", [("50%", "16MB", "tcp"), ("16MB", "abc", "tcp"),
                                           (-1, "16MB", "tcp"), ("16MB", "16MB", "udp"),
                                           (True, "16MB", "tcp")])
def test_setup_refuses(seg, buf, proto):
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "", seg, buf, proto, "", "") == BAD
    assert s.last_error
    assert s.put("k", b"v") == -1            # never set up
    assert s.get("k") == b""


def test_parse_size():
    assert mc.parse_size("16MB") == mc.parse_size("16 MB") == mc.parse_size("16MiB") == 16 << 20
    assert mc.parse_size("1gb") == 1 << 30 and mc.parse_size(512) == 512
    assert mc.parse_size("1.5 KB") == 1536 and mc.parse_size("7") == 7
    for bad in ("50%", "", "MB", "-1MB", 2.5, None):
        with pytest.raises(ValueError):
            mc.parse_size(bad)


def test_put_get_exist_size_remove(store):
    data = b"Hello, kvengine!"
    assert store.put("key", data) == 0
    assert store.get_size("key") == len(data)
    assert store.get("key") == data
    assert store.put("key", data) == 0                  # again: still 0
    assert store.put("key", b"replaced") == 0
    assert store.get("key") == b"replaced"
    assert store.is_exist("key") == 1 and store.is_exist("nope") == 0
    assert store.get("nope") == b""
    assert store.get_size("nope") == NOT_FOUND
    assert store.remove("key") == 0
    assert store.remove("key") == NOT_FOUND
    assert store.is_exist("key") == 0
    assert store.put("empty", b"") == 0 and store.get_size("empty") == 0
    big = os.urandom(1 << 20)
    assert store.put(b"bytes-key", big) == 0 and store.get(b"bytes-key") == big


def test_bad_keys(store):
    for key in ("", "x" * 251, 42, None):
        assert store.put(key, b"v") == BAD
        assert store.get(key) == b""
        assert store.is_exist(key) == -1
        assert store.get_size(key) == BAD
        assert store.remove(key) == BAD
    assert store.put("k", 42) == BAD


def test_put_parts_and_batches(store):
    assert store.put_parts("greeting", b"Hello, ", bytearray(b"World"), memoryview(b"!")) == 0
    assert store.get("greeting") == b"Hello, World!"
    keys = ["b%d" % i for i in range(5)]
    vals = [os.urandom(100 + i) for i in range(5)]
    assert store.put_batch(keys, vals) == 0
    assert store.get_batch(keys + ["missing"]) == vals + [b""]
    assert store.put_batch(keys, vals[:4]) == BAD
    assert store.put_batch([], []) == 0 and store.get_batch([]) == []


def test_batch_is_exist(store):
    keys = ["e%d" % i for i in range(20)]
    for k in keys[:10]:
        assert store.put(k, b"x") == 0
    assert store.batch_is_exist(keys) == [1] * 10 + [0] * 10
    assert store.batch_is_exist([]) == []
    assert store.batch_is_exist([keys[0]]) == [1]


def test_zero_copy(store):
    data = b"Hello, Zero-Copy World! " * 1000
    buf, ptr = _cbuf(len(data) + 1024, data)
    assert store.register_buffer(ptr, len(buf)) == 0
    assert store.put_from("zc", ptr, len(data)) == 0
    assert store.get("zc") == data
    ctypes.memset(buf, 0, len(buf))
    assert store.get_into("zc", ptr, len(buf)) == len(data)
    assert bytes(buf[:len(data)]) == data
    small, sptr = _cbuf(len(data) // 2, b"keep")
    assert store.register_buffer(sptr, len(small)) == 0
    assert store.get_into("zc", sptr, len(small)) < 0       # too small
    assert bytes(small[:4]) == b"keep"                       # and untouched
    assert store.get_into("missing", ptr, len(buf)) == NOT_FOUND
    assert store.put_from("zc2", 0, 10) == BAD
    assert store.get_into("zc", ptr, -1) == BAD
    assert store.unregister_buffer(ptr) == 0 and store.unregister_buffer(sptr) == 0
    assert store.register_buffer(0, 10) == BAD and store.register_buffer(ptr, 0) == BAD
    assert store.unregister_buffer(-5) == BAD


def test_batch_put_from_get_into(store):
    datas = [b"Batch Put Data %d! " % i * (100 * (i + 1)) for i in range(3)]
    spacing = 1 << 20
    big, base = _cbuf(spacing * 3)
    assert store.register_buffer(base, len(big)) == 0
    ptrs = [base + i * spacing for i in range(3)]
    for p, d in zip(ptrs, datas):
        ctypes.memmove(p, d, len(d))
    keys = ["bp%d" % i for i in range(3)]
    assert store.batch_put_from(keys, ptrs, [len(d) for d in datas]) == [0, 0, 0]
    assert store.get_batch(keys) == datas
    ctypes.memset(big, 0, len(big))
    res = store.batch_get_into(keys + ["missing"], ptrs + [base], [spacing] * 4)
    assert res == [len(d) for d in datas] + [NOT_FOUND]
    for p, d in zip(ptrs, datas):
        assert ctypes.string_at(p, len(d)) == d
    # Mismatched lists: one failure per key, nothing done.
    assert store.batch_put_from(keys[:2], ptrs, [1, 2, 3]) == [BAD, BAD]
    assert store.batch_get_into(keys[:2], ptrs[:3], [spacing] * 3) == [BAD, BAD]
    assert store.batch_put_from([], [], []) == [] and store.batch_get_into([], [], []) == []
    assert store.unregister_buffer(base) == 0


def test_get_buffer(store):
    data = os.urandom(5000)
    assert store.put("gb", data) == 0
    b = store.get_buffer("gb")
    assert b and b.size() == len(b) == len(data) and bytes(b) == data
    assert ctypes.string_at(b.ptr(), 16) == data[:16]
    assert store.get_buffer("missing") is None
    assert store.put("gb0", b"") == 0
    e = store.get_buffer("gb0")
    assert e is not None and bool(e) and e.size() == 0
    assert [x is None for x in store.batch_get_buffer(["gb", "missing"])] == [False, True]


def test_remove_all(store):
    for i in range(5):
        assert store.put("ra%d" % i, b"x") == 0
    assert store.remove("ra0") == 0
    assert store.remove_all() == 4
    assert store.batch_is_exist(["ra%d" % i for i in range(5)]) == [0] * 5
    assert store.remove_all() == 0
    assert store.batch_remove(["a", "b"]) == [NOT_FOUND, NOT_FOUND]


def test_local_buffer_bounds_copying_calls():
    s = mc.MooncakeDistributedStore()
    assert _setup(s, buf=0) == 0
    try:
        assert s.put("k", b"data") != 0
        assert s.is_exist("k") == 0
        buf, ptr = _cbuf(16, b"zero-copy")
        assert s.put_from("k", ptr, 9) == 0          # zero-copy needs no local buffer
        assert s.get_into("k", ptr, 16) == 9
        assert s.get("k") == b""                     # but a copying get does
    finally:
        s.close()
    s = mc.MooncakeDistributedStore()
    assert _setup(s, buf="1KB") == 0
    try:
        assert s.put("k", b"x" * 1024) == 0
        assert s.put("k2", b"x" * 1025) == mc.ErrorCode.BUFFER_OVERFLOW
    finally:
        s.close()


def test_closed_store_and_setup_again(store):
    assert store.put("td", b"Hello") == 0
    assert store.close() == 0
    assert store.put("td", b"x") == -1
    assert store.get("td") == b""
    assert store.is_exist("td") == -1
    assert store.get_size("td") == -1
    assert store.remove("td") == -1
    assert store.remove_all() == -1
    assert store.put_from("td", 1, 1) == -1 and store.get_into("td", 1, 1) == -1
    assert store.register_buffer(1, 1) == -1 and store.unregister_buffer(1) == -1
    assert store.batch_get_into(["td"], [1], [1]) == [-1]
    assert store.get_buffer("td") is None
    assert store.health_check() == 1
    assert _setup(store) == 0
    assert store.get("td") == b""                 # the data went with the engine
    assert store.put("td", b"Hello") == 0 and store.get("td") == b"Hello"


def test_replicate_config_and_soft_pin():
    c = mc.ReplicateConfig()
    assert (c.replica_num, c.with_soft_pin, c.with_hard_pin, c.preferred_segment) == \
        (1, False, False, "")
    c.replica_num = 3
    c.with_soft_pin = True
    c.preferred_segment = "node1:12345"
    c.soft_pin_action = mc.SoftPinAction.ENABLE
    assert "3" in str(c) and "node1:12345" in str(c) and "ENABLE" in str(c)
    assert [int(a) for a in mc.SoftPinAction] == [0, 1, 2]
    assert mc.SoftPinAction.DISABLE.name == "DISABLE"


def test_config_argument_accepted(store):
    c = mc.ReplicateConfig(replica_num=2, with_soft_pin=True)
    assert store.put("rc", b"v", c) == 0
    assert store.put_parts("rc2", b"a", b"b", config=c) == 0
    assert store.put_batch(["rc3"], [b"c"], c) == 0
    buf, ptr = _cbuf(4, b"abcd")
    assert store.put_from("rc4", ptr, 4, c) == 0
    assert store.batch_put_from(["rc5"], [ptr], [4], c) == [0]
    assert store.get_batch(["rc", "rc2", "rc3", "rc4", "rc5"]) == \
        [b"v", b"ab", b"c", b"abcd", b"abcd"]


def test_error_mapping():
    assert mc.to_mooncake(0) == 0
    assert mc.to_mooncake(-104) == -704 and mc.to_mooncake(-103) == -200
    assert mc.to_mooncake(-101) == -600 and mc.to_mooncake(-109) == -900
    assert mc.to_mooncake(-105) == -901 and mc.to_mooncake(-999) == -1


def test_concurrent_put_get(store):
    errors = []
    value = 64 * 1024

    def worker(t):
        try:
            data = os.urandom(value)
            keys = ["c%d_%d" % (t, i) for i in range(25)]
            for k in keys:
                assert store.put(k, data) == 0
            for k in keys:
                assert store.get(k) == data
            for k in keys:
                assert store.remove(k) == 0
        except Exception as exc:
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors


def test_no_room_is_no_available_handle():
    s = mc.MooncakeDistributedStore()
    assert _setup(s, seg="4MB", buf="64MB") == 0
    try:
        # A value larger than the whole segment can never fit.
        assert s.put("huge", b"x" * (8 << 20)) == mc.ErrorCode.NO_AVAILABLE_HANDLE
    finally:
        s.close()


def test_environment_settings(monkeypatch, tmp_path):
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("io:\n  threads: 3\n")
    monkeypatch.setenv("KVENGINE_CONFIG", str(cfg))
    monkeypatch.setenv("KVENGINE_SETTINGS", "dram.hugepages=off log.level=warn")
    assert mc.env_settings() == {"dram.hugepages": "off", "log.level": "warn"}
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "", "8MB", "8MB", "tcp", "", "") == 0
    try:
        assert s._eng.stats()["dram_capacity"] == 8 << 20
    finally:
        s.close()
    monkeypatch.setenv("KVENGINE_SETTINGS", "no-equals-sign")
    assert s.setup("localhost", "", "8MB", "8MB", "tcp", "", "") == BAD
    assert "KVENGINE_SETTINGS" in s.last_error
    monkeypatch.setenv("KVENGINE_SETTINGS", "no.such.key=1")
    assert s.setup("localhost", "", "8MB", "8MB", "tcp", "", "") == BAD
    assert "no.such.key" in s.last_error
    # The YAML file is read too: a bad one fails setup, naming it.
    monkeypatch.delenv("KVENGINE_SETTINGS")
    cfg.write_text("pipeline: bogus\n")
    assert s.setup("localhost", "", "8MB", "8MB", "tcp", "", "") == BAD
    assert "kv.yaml:1" in s.last_error


def test_batches_without_the_batched_c_calls(store, monkeypatch):
    """A library without kv_put_many & co: the batch calls loop, same answers."""
    import kvengine._lib as lib
    for name in ("kv_put_many", "kv_get_many", "kv_exists_many"):
        monkeypatch.setattr(lib, name, None)
    keys = ["f%d" % i for i in range(4)]
    vals = [os.urandom(50 + i) for i in range(4)]
    assert store.put_batch(keys, vals) == 0
    assert store.get_batch(keys + ["nope"]) == vals + [b""]
    assert store.batch_is_exist(keys[:2] + ["nope"]) == [1, 1, 0]
    buf, ptr = _cbuf(64, b"z" * 64)
    assert store.batch_put_from(["g0", "g1"], [ptr, ptr], [64, 32]) == [0, 0]
    assert store.batch_get_into(["g0", "g1", "nope"], [ptr, ptr, ptr], [64, 64, 64]) == \
        [64, 32, NOT_FOUND]


def test_batch_bad_items(store):
    buf, ptr = _cbuf(16, b"q" * 16)
    # One bad key or pointer fails that item only.
    assert store.batch_put_from(["ok", "", "ok2"], [ptr, ptr, 0], [16, 16, 16]) == [0, BAD, BAD]
    assert store.batch_get_into(["ok", 5, "ok"], [ptr, ptr, ptr], [16, 16, 8]) == [16, BAD, BAD]
    assert store.put_batch(["a", ""], [b"x", b"y"]) == BAD
    assert store.put_batch(["a", "b"], [b"x", 7]) == BAD
    assert store.get_batch(["ok", None]) == [b"q" * 16, b""]


# -- a member that goes away with its process (issue 18) ----------------------------

_LEAVER = r"""
import json, sys
import kvengine.mooncake as mc
master, settings, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
store = mc.MooncakeDistributedStore()     # a module global, as SGLang keeps it
assert store.setup("localhost", "http://unused/metadata", "16MB", "16MB", "tcp", "", master,
                   kvengine_settings=settings) == 0, store.last_error
for i in range(n):
    assert store.put("gone%d" % i, (b"%d." % i) * 500) == 0
print("ready", flush=True)
sys.stdin.readline()
# and the process ends here: no close(), the store goes with the interpreter
"""


def test_a_store_that_goes_with_its_process_hands_its_objects_on(cluster):
    """SGLang's way out (issue 18): the store is never closed; the process
    exits and the interpreter collects it. It still leaves gracefully: the
    objects it put (about half of them on itself) stay readable from the
    store that stays, and that store's puts to those objects never fail,
    neither while the other goes nor after (issue 18 saw RPC_FAIL -900 for
    about a second), and each object reads back as last put."""
    import subprocess
    import sys
    import time
    settings = {"cluster.token": cluster.TOKEN, "cluster.node_ttl_ms": "1000",
                "dram.hugepages": "off", "log.level": "warn", "io.timeout_ms": "4000"}
    stay = mc.MooncakeDistributedStore()
    assert stay.setup("localhost", "http://unused/metadata", "16MB", "16MB", "tcp", "",
                      cluster.master, kvengine_settings=settings) == 0, stay.last_error
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    n = 200
    leaver = subprocess.Popen([sys.executable, "-c", _LEAVER, cluster.master,
                               __import__("json").dumps(settings), str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert leaver.stdout.readline().strip() == "ready"
        cluster.wait_owners(2)
        time.sleep(0.6)                 # the staying store's heartbeat brings the view
        failed, done, stop = [], [], threading.Event()
        latest = {}                     # the leaver's keys, replaced by the store that stays

        def putter():
            while not stop.is_set():
                i = len(done)
                k, v = "gone%d" % (i % n), b"stay%d." % i * 100
                rc = stay.put(k, v)
                (failed if rc else done).append((k, rc))
                if rc == 0:
                    latest[k] = v
                time.sleep(0.002)

        t = threading.Thread(target=putter)
        t.start()
        try:
            time.sleep(0.1)
            leaver.stdin.write("\n")    # let it end
            leaver.stdin.flush()
            assert leaver.wait(timeout=30) == 0
            cluster.wait_owners(1)
            time.sleep(0.5)             # puts after it is gone
        finally:
            stop.set()
            t.join()
        assert failed == [] and len(done) > 10
        keys = ["gone%d" % i for i in range(n)]
        assert stay.get_batch(keys) == [latest.get(k, (b"%d." % i) * 500)
                                        for i, k in enumerate(keys)]
        assert stay.put("after", b"still here") == 0 and stay.get("after") == b"still here"
    finally:
        if leaver.poll() is None:
            leaver.kill()
            leaver.wait()
        stay.close()
