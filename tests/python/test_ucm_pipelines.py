"""test_ucm_pipelines.py — KvEngineStore configured as UCM's e2e store
scripts configure UCM's stores (issue 18): store_pipeline names (Cache|Empty
with no directory, Posix, Cache|Posix; the ones kvengine cannot be are
refused by name), a scheduler and a worker in one process with the same
storage_backends and different unique_ids, a backend directory whose
parent does not exist yet, and UcmPcStoreV1's config without shard_size.
Each failed before its fix. Written from UCM's documented store semantics."""
import ctypes
import os

import pytest

from kvengine.ucm import KvEngineStore

QUIET = {"dram.hugepages": "off", "log.level": "warn", "io.threads": "2"}
SIZE = 4096


def _ids(n, tag):
    return [bytes([tag]) * 8 + i.to_bytes(8, "little") for i in range(n)]


def _bufs(n, fill=None):
    keep, addrs = [], []
    for i in range(n):
        b = bytearray(os.urandom(SIZE) if fill is None else bytes([fill]) * SIZE)
        keep.append(b)
        addrs.append([ctypes.addressof((ctypes.c_char * SIZE).from_buffer(b))])
    return keep, addrs


def _round_trip(worker, scheduler, tag):
    ids = _ids(4, tag)
    assert not any(scheduler.lookup(ids))
    src, saddr = _bufs(4)
    worker.wait(worker.dump_data(ids, [0] * 4, saddr))
    assert all(scheduler.lookup(ids))
    assert scheduler.lookup_on_prefix(ids) == 3
    dst, daddr = _bufs(4, 0)
    worker.wait(worker.load_data(ids, [0] * 4, daddr))
    assert dst == src


def _cfg(**kw):
    c = {"tensor_size": SIZE, "shard_size": SIZE, "block_size": SIZE,
         "kvengine_settings": dict(QUIET, **{"dram.capacity": "32MiB"})}
    c.update(kw)
    return c


def test_cache_over_empty_is_a_dram_store_without_a_directory(tmp_path):
    # UCM's cache_on_empty scripts: no storage_backends. Before: "config
    # names no store".
    cfg = _cfg(store_pipeline="Cache|Empty", unique_id="ucm-ce-" + tmp_path.name[-12:],
               cache_buffer_capacity_gb=1, share_buffer_enable=True)
    cfg["kvengine_settings"]["store.dir"] = str(tmp_path)
    worker = KvEngineStore(dict(cfg, device_id=0))
    scheduler = KvEngineStore(dict(cfg, device_id=-1))
    try:
        _round_trip(worker, scheduler, 1)
        assert worker.engine.stats()["ssd_capacity"] == 0
    finally:
        scheduler.close()
        worker.close()


def test_one_directory_two_unique_ids_in_one_process_share_it(tmp_path):
    # UCM's pcstore_embed_v1 gives every store it makes a new unique_id,
    # the scheduler's and the worker's alike, over one directory. Before:
    # the second open failed with KV_EBUSY ("in use by another engine").
    d = str(tmp_path / "posix")
    worker = KvEngineStore(_cfg(storage_backends=[d], device_id=0, unique_id="aaaa1111"))
    scheduler = KvEngineStore(_cfg(storage_backends=[d], device_id=-1, unique_id="bbbb2222"))
    try:
        _round_trip(worker, scheduler, 2)
    finally:
        scheduler.close()
        worker.close()


def test_a_backend_below_a_missing_directory_is_made(tmp_path):
    # UCM's posixstore scripts name ./build/data. Before: kv_open failed
    # (EIO: "cannot create").
    d = tmp_path / "build" / "data"
    s = KvEngineStore(_cfg(storage_backends=[str(d)], device_id=0, store_pipeline="Posix"))
    try:
        assert d.is_dir()
        _round_trip(s, s, 3)
    finally:
        s.close()


def test_a_config_without_shard_size_stores_whole_blocks(tmp_path):
    # UcmPcStoreV1's config: block_size and tensor_size (one per layer), no
    # shard_size; dumps pass shard_index=[]. Before: "invalid sizes".
    layers = 4
    s = KvEngineStore({"storage_backends": [str(tmp_path / "pc")], "device_id": 1,
                       "tensor_size": SIZE, "block_size": SIZE * layers,
                       "kvengine_settings": dict(QUIET, **{"dram.capacity": "32MiB"})})
    try:
        ids = _ids(2, 4)
        keep = [[bytearray(os.urandom(SIZE)) for _ in range(layers)] for _ in ids]
        addrs = [[ctypes.addressof((ctypes.c_char * SIZE).from_buffer(b)) for b in row]
                 for row in keep]
        s.wait(s.dump_data(ids, [], addrs))
        assert list(s.lookup(ids)) == [True, True]     # one shard makes a block
        out = [[bytearray(SIZE) for _ in range(layers)] for _ in ids]
        oaddrs = [[ctypes.addressof((ctypes.c_char * SIZE).from_buffer(b)) for b in row]
                  for row in out]
        s.wait(s.load_data(ids, [], oaddrs))
        assert out == keep
    finally:
        s.close()


def test_cache_over_posix_keeps_both_tiers(tmp_path):
    s = KvEngineStore(_cfg(storage_backends=[str(tmp_path / "cp")], device_id=0,
                           store_pipeline="Cache|Posix"))
    try:
        st = s.engine.stats()
        assert st["dram_capacity"] > 0 and st["ssd_capacity"] > 0
        _round_trip(s, s, 5)
    finally:
        s.close()


@pytest.mark.parametrize("name,why", [("Cache|Ds3fs", "3FS"), ("Empty", "keeps nothing"),
                                      ("Fake", "keeps nothing"), ("Nope", "maps")])
def test_pipelines_kvengine_is_not_are_refused_by_name(tmp_path, name, why):
    with pytest.raises(RuntimeError, match=why):
        KvEngineStore(_cfg(storage_backends=[str(tmp_path / "x")], device_id=0,
                           store_pipeline=name))


def test_posix_without_a_directory_is_refused():
    with pytest.raises(RuntimeError, match="needs storage_backends"):
        KvEngineStore(_cfg(device_id=0, store_pipeline="Posix"))


def test_a_worker_waits_for_a_peer_still_building_the_store(tmp_path):
    # UCM's cache_on_empty_mp script starts two workers over one unique_id;
    # while the first was still faulting in its GiB (seconds on a loaded
    # host), the second's kv_open waited io.timeout_ms for it to answer and
    # failed with KV_EBUSY, and the first then waited at the script's
    # barrier for ever. Here the peer is this test holding the store's lock
    # (the server holds it while it builds the store) past the open's
    # timeout, then going away: the worker becomes the store's server.
    import fcntl
    import threading
    uid = "ucm-wait-" + tmp_path.name[-12:]
    os.chmod(tmp_path, 0o700)
    fd = os.open(str(tmp_path / (uid + ".lock")), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    cfg = _cfg(store_pipeline="Cache|Empty", unique_id=uid, timeout_ms=200,
               cache_buffer_capacity_gb=1)
    cfg["kvengine_settings"]["store.dir"] = str(tmp_path)
    got = {}

    def open_it():
        try:
            got["store"] = KvEngineStore(cfg)
        except Exception as exc:       # noqa: BLE001 - reported below
            got["error"] = exc
    t = threading.Thread(target=open_it)
    t.start()
    t.join(1.0)                        # several of the open's 200 ms timeouts
    assert t.is_alive(), "gave up while a peer held the store: %r" % got.get("error")
    os.unlink(str(tmp_path / (uid + ".lock")))
    os.close(fd)                       # the peer is gone
    t.join(60)
    assert "error" not in got, got.get("error")
    s = got["store"]
    try:
        _round_trip(s, s, 4)
    finally:
        s.close()
