"""test_mooncake_fast.py — the Mooncake drop-in's batch calls on their fast
path (issue 18: whole-list checks and packing instead of per-key Python
work) give the answers of the per-key path: every key its own code in a
batch that mixes good and bad entries, lengths of what was read, misses,
tenants, read leases, soft pins; and the offload directory's default.
Written from Mooncake's documented batch_put_from / batch_get_into."""
import ctypes
import os

import pytest

import kvengine.mooncake as mc

BAD = -600
NOT_FOUND = -704
HAS_LEASE = -706
QUIET = {"dram.hugepages": "off", "log.level": "warn"}


def _store(settings=None, **kw):
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", "32MB", "16MB", "tcp", "", "",
                   kvengine_settings=dict(QUIET, **(settings or {})), **kw) == 0, s.last_error
    s.kv_lease_ttl_ms = 0
    return s


@pytest.fixture
def store():
    s = _store()
    yield s
    s.close()


@pytest.fixture
def shared_store(host_store_settings):
    """A store other processes can attach to (store.name): its read leases
    are records in the store, for them."""
    s = _store(host_store_settings)
    yield s
    s.close()


def _buf(n, data=None):
    b = (ctypes.c_ubyte * n)()
    if data:
        ctypes.memmove(b, data, len(data))
    return b, ctypes.addressof(b)


def test_a_batch_round_trips(store, monkeypatch):
    # str keys and int pointers never reach the per-key checks.
    monkeypatch.setattr(mc.MooncakeDistributedStore, "_key",
                        lambda self, k: pytest.fail("took the per-key path"))
    n, size = 64, 512
    src, sa = _buf(n * size, os.urandom(n * size))
    dst, da = _buf(n * size)
    keys = ["fast-%d" % i for i in range(n)]
    assert store.batch_put_from(keys, [sa + i * size for i in range(n)], [size] * n) == [0] * n
    assert store.batch_get_into(keys, [da + i * size for i in range(n)], [size] * n) == [size] * n
    assert bytes(dst) == bytes(src)
    # Shorter objects report their own length; a missing one its code.
    assert store.batch_put_from(["short"], [sa], [7]) == [0]
    assert store.batch_get_into(["short", "absent"], [da, da + size], [size, size]) == \
        [7, NOT_FOUND]


def test_every_entry_of_a_mixed_batch_gets_its_own_answer(store):
    src, sa = _buf(64, b"x" * 64)
    dst, da = _buf(64 * 8)
    keys = ["ok-1", "", "nul\0key", "k" * 300, "ok-2", "ok-3", b"ok-bytes", "ok-4"]
    ptrs = [sa, sa, sa, sa, 0, -5, sa, 1 << 64]
    sizes = [8, 8, 8, 8, 8, 8, 8, 8]
    assert store.batch_put_from(keys, ptrs, sizes) == [0, BAD, BAD, BAD, BAD, BAD, 0, BAD]
    assert store.batch_get_into(["ok-1", "ok-bytes", "", "ok-2"],
                                [da, da + 64, da + 128, da + 192], [64] * 4) == \
        [8, 8, BAD, NOT_FOUND]
    # An empty buffer at address 0 is a valid (empty) object, as per key.
    assert store.batch_put_from(["empty"], [0], [0]) == [store.put_from("empty2", 0, 0)]
    # A too-small destination is Mooncake's INVALID_PARAMS, the object kept.
    assert store.batch_put_from(["big"], [sa], [64]) == [0]
    assert store.batch_get_into(["big"], [da], [8]) == [store.get_into("big", da, 8)]
    assert store.get_size("big") == 64


def test_lists_of_other_lengths_are_refused(store):
    assert store.batch_put_from(["a", "b"], [1], [1, 1]) == [BAD, BAD]
    assert store.batch_get_into(["a"], [1, 2], [1]) == [BAD]
    assert store.batch_put_from([], [], []) == []
    assert store.batch_get_into([], [], []) == []


def test_tenants_stay_apart_on_the_fast_path(tmp_path):
    a, b = _store(tenant_id="ta"), _store(tenant_id="tb")
    try:
        src, sa = _buf(16, b"tenant-a-value!!")
        dst, da = _buf(16)
        assert a.batch_put_from(["same"], [sa], [16]) == [0]
        assert b.batch_get_into(["same"], [da], [16]) == [NOT_FOUND]
        assert a.batch_get_into(["same"], [da], [16]) == [16]
        assert bytes(dst) == b"tenant-a-value!!"
    finally:
        a.close()
        b.close()


def test_reads_lease_and_pins_hold_on_the_fast_path(store):
    src, sa = _buf(16, b"v" * 16)
    dst, da = _buf(16)
    store.kv_lease_ttl_ms = 5000
    assert store.batch_put_from(["leased"], [sa], [16]) == [0]
    store._leases.clear()                 # only the read's lease below
    assert store.batch_get_into(["leased"], [da], [16]) == [16]
    assert store.remove("leased") == HAS_LEASE
    assert store.remove("leased", force=True) == 0
    cfg = mc.ReplicateConfig()
    cfg.with_soft_pin = True
    store.kv_lease_ttl_ms = 0
    assert store.batch_put_from(["pinned"], [sa], [16], cfg) == [0]
    assert store.remove("pinned") == HAS_LEASE
    assert store.remove("pinned", force=True) == 0


def test_ssd_offload_defaults_to_mooncakes_directory(monkeypatch, tmp_path):
    # Mooncake's FileStorage falls back to /data/file_storage; a setup
    # naming no directory uses it when it exists, else says what to give.
    monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", raising=False)
    monkeypatch.setattr(mc, "_OFFLOAD_DEFAULT", str(tmp_path / "file_storage"))
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "", "16MB", "16MB", "tcp", "", "", enable_ssd_offload=True,
                   kvengine_settings=QUIET) == BAD
    assert "file_storage" in s.last_error
    (tmp_path / "file_storage").mkdir()
    assert s.setup("localhost", "", "16MB", "16MB", "tcp", "", "", enable_ssd_offload=True,
                   kvengine_settings=QUIET) == 0, s.last_error
    try:
        assert s.put("off", b"loaded") == 0
        assert s.get("off") == b"loaded"
    finally:
        s.close()


def test_modules_without_meaning_here_say_why():
    # Mooncake's EP buffers, its process-group backend, its transfer
    # engine's metadata server and its SPDK target tool: importing their
    # tests ended in ModuleNotFoundError before; now in NotImplementedError
    # naming why.
    import importlib
    import sys
    from mooncake.http_metadata_server import KVBootstrapServer
    from mooncake.mooncake_ep_buffer import Buffer
    from mooncake.spdk_tgt_create import SPDKTgtCreator, parse_arguments
    for make, why in ((lambda: Buffer(None, num_ep_buffer_bytes=1), "transfer engine"),
                      (lambda: KVBootstrapServer(port=0), "kvmaster"),
                      (lambda: SPDKTgtCreator(["ip:127.0.0.1"]), "NVMe-oF"),
                      (parse_arguments, "SPDK")):
        with pytest.raises(NotImplementedError, match=why):
            make()
    sys.modules.pop("mooncake.pg", None)
    with pytest.raises(NotImplementedError, match="torch.distributed backend"):
        importlib.import_module("mooncake.pg")


def test_batch_is_exist_answers_per_key(store):
    assert store.put("here", b"1") == 0
    assert store.batch_is_exist(["here", "gone", "here"]) == [1, 0, 1]
    assert store.batch_is_exist(["here", "", "x" * 300, b"here", "nul\0"]) == [1, -1, -1, 1, -1]
    assert store.batch_is_exist([]) == []


def test_task_types_import_and_copy_move_say_why(store):
    # Mooncake's test_copy_move_api failed at import (no QueryTaskResponse);
    # now its calls end in NotImplementedError naming why.
    from mooncake.store import QueryTaskResponse, TaskStatus, TaskType
    r = QueryTaskResponse()
    assert r.status == TaskStatus.PENDING and r.type == TaskType.REPLICA_COPY
    assert {s.name for s in TaskStatus} == {"PENDING", "PROCESSING", "SUCCESS", "FAILED"}
    with pytest.raises(NotImplementedError, match="hashing"):
        store.create_copy_task("k", ["localhost:10002"])
    with pytest.raises(NotImplementedError, match="hashing"):
        store.create_move_task("k", "localhost:10001", "localhost:10002")


# Read leases are plain-key records stored by the read itself (one
# kv_put_many on the caller's thread), not blocks dumped by a task: the
# dump's hand-off to a pool worker cost Mooncake's benchmark's verify_read
# about a context switch per batch_get_into.

def test_a_read_takes_its_lease_without_a_task(shared_store):
    store = shared_store
    src, sa = _buf(64, b"l" * 64)
    dst, da = _buf(64 * 4)
    store.kv_lease_ttl_ms = 5000
    keys = ["lease-%d" % i for i in range(4)]
    assert store.batch_put_from(keys, [sa] * 4, [64] * 4) == [0] * 4
    before = store._eng.stats()
    assert store.batch_get_into(keys, [da + 64 * i for i in range(4)], [64] * 4) == [64] * 4
    after = store._eng.stats()
    # Before: the leases were one kv_dump (dumps_ok + 1) of 4 blocks.
    assert after["dumps_ok"] == before["dumps_ok"]
    assert after["dram_blocks"] == before["dram_blocks"]
    assert after["keys"] == before["keys"] + 4          # one record per object
    store._leases.clear()                                # as another process sees it
    assert all(store._leases_in_store(store._key(k)) for k in keys)
    assert store.batch_remove(keys) == [HAS_LEASE] * 4
    # A miss takes no lease.
    assert store.batch_get_into(["absent"], [da], [64]) == [NOT_FOUND]
    assert not store._leases_in_store(store._key("absent"))


def test_every_read_key_is_leased_in_the_store_whatever_the_batch(shared_store):
    store = shared_store
    # A read writes its lease records into a buffer made once per thread
    # (mc._LEASE_CAP records); a larger batch builds its own. Every key of
    # either, and of reads on several threads at once, has its record.
    import threading
    store.kv_lease_ttl_ms = 5000
    n = mc._LEASE_CAP + 9
    keys = ["many-%d" % i for i in range(4 * n)]
    vals = [b"%05d" % i for i in range(len(keys))]
    assert store.put_batch(keys, vals) == 0
    assert store.get_batch(keys[:n]) == vals[:n]                  # past the cap
    assert store.get_batch(keys[n:n + 4]) == vals[n:n + 4]        # the common path
    errs = []

    def read(lo, hi):
        for i in range(lo, hi, 4):
            if store.get_batch(keys[i:i + 4]) != vals[i:i + 4]:
                errs.append(i)
    ts = [threading.Thread(target=read, args=(n + 4 + j * 40, n + 4 + (j + 1) * 40)) for j in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    read_keys = keys[:n + 4 + 160]
    store._leases.clear()                                # as another process sees it
    missing = [k for k in read_keys if not store._leases_in_store(store._key(k))]
    assert missing == []
    assert not store._leases_in_store(store._key(keys[-1]))  # never read
    assert store.remove(read_keys[0]) == HAS_LEASE


def test_default_tenant_remove_all_keeps_the_leases_of_what_it_keeps(shared_store):
    store = shared_store
    src, sa = _buf(8, b"k" * 8)
    dst, da = _buf(8)
    store.kv_lease_ttl_ms = 5000
    assert store.batch_put_from(["kept", "gone"], [sa, sa], [8, 8]) == [0, 0]
    assert store.batch_get_into(["kept"], [da], [8]) == [8]
    # The read's lease record is not counted as an object, and the object
    # it keeps still shows its lease to other processes afterwards.
    assert store.remove_all() == 1
    assert store.is_exist("kept") == 1 and store.is_exist("gone") == 0
    store._leases.clear()
    assert store._leases_in_store(store._key("kept"))
    assert store.remove("kept") == HAS_LEASE
    assert store.remove_all(force=True) == 1


def test_a_lease_taken_on_the_fast_path_holds_for_another_client(cluster):
    cluster.start_node()
    cluster.wait_owners(1)
    stores = []
    for _ in range(2):
        s = mc.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "", "0", "16MB", "tcp", "", cluster.master,
                       kvengine_settings=dict(cluster.settings(), **QUIET)) == 0, s.last_error
        stores.append(s)
    a, b = stores
    try:
        a.kv_lease_ttl_ms = b.kv_lease_ttl_ms = 30000
        src, sa = _buf(4096, os.urandom(4096))
        dst, da = _buf(4096 * 3)
        keys = ["c-%d" % i for i in range(3)]
        assert b.batch_put_from(keys, [sa] * 3, [4096] * 3) == [0] * 3
        assert a.batch_get_into(keys, [da + 4096 * i for i in range(3)], [4096] * 3) == [4096] * 3
        assert bytes(dst) == bytes(src) * 3
        assert b.batch_remove(keys) == [HAS_LEASE] * 3
        assert b.batch_remove(keys, force=True) == [0] * 3
    finally:
        a.close()
        b.close()


def test_a_store_nobody_else_reaches_keeps_its_read_leases_here(store):
    # The drop-in's embedded default (no store.name, no SSD tier, no
    # cluster): no other process can see the store, so a read's lease is
    # this process's copy alone. Before: one record per object read (keys
    # + 4), and a remove asked the store for 52 lease records.
    assert store._eng.shared is False
    src, sa = _buf(64, b"p" * 64)
    dst, da = _buf(64 * 4)
    store.kv_lease_ttl_ms = 5000
    keys = ["own-%d" % i for i in range(4)]
    assert store.batch_put_from(keys, [sa] * 4, [64] * 4) == [0] * 4
    before = store._eng.stats()["keys"]
    assert store.batch_get_into(keys, [da + 64 * i for i in range(4)], [64] * 4) == [64] * 4
    assert store.get_batch(keys[:2]) == [b"p" * 64] * 2
    assert store._eng.stats()["keys"] == before           # no lease record
    assert store.batch_remove(keys) == [HAS_LEASE] * 4     # the leases hold here
    assert store.remove_all() == 0
    assert store.batch_remove(keys, force=True) == [0] * 4
    # A soft pin is still a record, and still refuses a remove.
    cfg = mc.ReplicateConfig()
    cfg.with_soft_pin = True
    assert store.put("pinned", b"v", cfg) == 0
    store._pins.clear()
    store._leases.clear()
    assert store.remove("pinned") == HAS_LEASE


def test_which_stores_others_can_reach(tmp_path):
    # Engine.shared mirrors engine/host.c's rule (store.name, or an SSD tier
    # shared by its path) and a cluster.
    from kvengine import engine as ke
    cases = [({"pipeline": "dram"}, False),
             ({"pipeline": "dram", "store.name": "x"}, True),
             ({"pipeline": "dram|ssd", "ssd.path": str(tmp_path)}, True),
             ({"pipeline": "dram", "cluster.enabled": "true"}, True)]
    for settings, want in cases:
        cfg = ke.make_config(None, settings)
        try:
            assert ke.config_shared(cfg) is want, settings
        finally:
            mc._lib.kv_config_free(cfg)


def test_a_shared_stores_read_lease_refuses_another_engines_remove(host_store_settings):
    # A store.name store: a second engine (attached, here in this process)
    # sees the first's read leases through their records.
    a = _store(host_store_settings)
    b = _store(host_store_settings)
    try:
        assert a._eng.shared and b._eng.shared
        a.kv_lease_ttl_ms = 5000       # within the horizon b's remove looks over
        assert b.put("seen", b"by a") == 0
        assert a.get("seen") == b"by a"
        assert b.remove("seen") == HAS_LEASE
        assert b.remove("seen", force=True) == 0
    finally:
        b.close()
        a.close()


def test_a_buffer_lease_outliving_its_engine_goes_quietly():
    # At interpreter exit the engine may be finalized before a BufferPool
    # lease: releasing it raised KvError ("engine is closed") from __del__.
    s = _store()
    pool = mc.BufferPool(s, max_bytes=32 << 20, max_regions=1)
    lease = pool.acquire(1 << 20, block=False)
    assert lease.ptr
    s._eng.close()
    lease.release()
    pool.close()
    s.close()


def test_a_removes_lease_check_is_one_small_lookup(shared_store, monkeypatch):
    store = shared_store
    # In a cluster every lookup is a round trip: before, a remove asked for
    # 252 lease records (20 ms buckets over 5 s) and then read the soft
    # pin with a kv_get of its own; now 52 + the pin in one kv_exists_many.
    src, sa = _buf(8, b"r" * 8)
    assert store.batch_put_from(["plain", "pinned"], [sa, sa], [8, 8]) == [0, 0]
    assert store.put("pinned", b"p", mc.ReplicateConfig(with_soft_pin=True)) == 0
    calls = []
    real_exists, real_get = mc._lib.kv_exists_many, mc._lib.kv_get
    monkeypatch.setattr(mc._lib, "kv_exists_many",
                        lambda h, a, n, r: calls.append(("exists", n)) or real_exists(h, a, n, r))
    monkeypatch.setattr(mc._lib, "kv_get",
                        lambda *a: calls.append(("get", 1)) or real_get(*a))
    store._leases.clear()
    store._pins.clear()
    assert store._leases_in_store(store._key("plain")) is False
    assert len(calls) == 1 and calls[0][0] == "exists" and calls[0][1] <= 60
    del calls[:]
    assert store._leases_in_store(store._key("pinned")) is True     # its pin, read once found
    assert [c[0] for c in calls] == ["exists", "get"]


def test_reads_guessing_the_last_size_answer_as_exact_ones(store):
    # get / get_batch read straight into bytes of the size read last while
    # a batch was all of one size: every other size, a miss, an empty
    # object and a tenant's keys must still read exactly.
    vals = {"u%d" % i: os.urandom(4096) for i in range(4)}
    vals.update({"big": os.urandom(9000), "small": os.urandom(100), "empty": b""})
    for k, v in vals.items():
        assert store.put(k, v) == 0
    u = ["u0", "u1", "u2", "u3"]
    assert store.get_batch(u) == [vals[k] for k in u]
    assert store._size_hint == 4096
    assert store.get_batch(u) == [vals[k] for k in u]          # on the guess
    mixed = ["u0", "big", "missing", "small", "empty", "u1"]
    assert store.get_batch(mixed) == [vals.get(k, b"") for k in mixed]
    assert store.get_batch(["big", "big"]) == [vals["big"]] * 2
    assert store._size_hint == 9000
    for k in ("u2", "small", "empty", "missing", "big"):
        assert store.get(k) == vals.get(k, b"")
    assert store.get_batch(["small", "u3"]) == [vals["small"], vals["u3"]]
    assert store.get_batch([]) == []
    assert store.get_batch(["u0", 5]) == [vals["u0"], b""]     # not a key


def test_live_leases_past_the_prune_size_are_not_rebuilt_every_read(shared_store, monkeypatch):
    store = shared_store
    # This process's lease copies are pruned of expired entries when they
    # pass a size; with more live leases than that, pruning every read made
    # each read rebuild the whole dict. Now the next prune waits for twice
    # what was left.
    monkeypatch.setattr(mc, "_PRUNE_AT", 8)
    store._leases_max = store._wrote_max = 8
    store.kv_lease_ttl_ms = 60000
    keys = ["lease%d" % i for i in range(40)]
    assert store.put_batch(keys, [b"v"] * 40) == 0
    sizes = []
    for i in range(0, 40, 4):
        assert store.get_batch(keys[i:i + 4]) == [b"v"] * 4
        sizes.append(store._leases_max)
    assert len(store._leases) == 40 and len(store._wrote) == 40    # all live, all kept
    assert sizes[-1] >= 40 and len(set(sizes)) <= 4                # grew by doubling
    assert store.remove(keys[0]) == HAS_LEASE


def test_a_remove_on_a_shared_store_is_two_store_calls(shared_store, monkeypatch):
    # A remove asks the store for the key's read leases and its pin record
    # (one kv_exists_many), then removes the key: two calls, which are two
    # round trips attached or in a cluster. Before, a third call removed
    # the pin record the check had just found absent.
    store = shared_store
    removed = []
    real = mc._lib.kv_remove
    monkeypatch.setattr(mc._lib, "kv_remove",
                        lambda h, k, n: removed.append(bytes(k[:n])) or real(h, k, n))
    assert store.put("plain", b"v") == 0
    assert store.remove("plain") == 0
    assert removed == [b"plain"]
    assert store.is_exist("plain") == 0
    # With force nothing was asked, so the pin record goes too.
    assert store.put("forced", b"v") == 0
    del removed[:]
    assert store.remove("forced", force=True) == 0
    assert len(removed) == 2 and removed[0] == b"forced"
    # A soft pin still refuses a remove (its record is found), from another
    # store of the same process as from this one, and force takes both.
    cfg = mc.ReplicateConfig()
    cfg.with_soft_pin = True
    assert store.put("pinned", b"v", cfg) == 0
    store._pins.clear()
    store._leases.clear()
    del removed[:]
    assert store.remove("pinned") == HAS_LEASE
    assert removed == []
    assert store.remove("pinned", force=True) == 0
    assert len(removed) == 2
    assert store.is_exist("pinned") == 0
    # ...and once the pin is gone, a plain remove is two calls again.
    assert store.put("pinned", b"w") == 0
    del removed[:]
    assert store.remove("pinned") == 0
    assert removed == [b"pinned"]
