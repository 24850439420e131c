"""test_ucm_more.py — KvEngineStore with UCM's own config keys (issue 18): a
port of UCM's posix_store_test (its invalid configs, dump then load, with
io_direct), complete blocks from block_size / shard_size, wait consuming the
handle and honouring timeout_ms, RuntimeError for argument errors,
shard_index=[], the scheduler's store, and prerequisite events."""

import ctypes
import os

import pytest


from kvengine.ucm import KvEngineStore

QUIET = {"dram.hugepages": "off", "log.level": "warn", "dram.capacity": "64MiB",
         "io.threads": "2"}
BLOCK = bytes.fromhex("a1b2c3d4e5f6789012345678901234ab")


def _posix(tmp_path, **extra):
    cfg = {"storage_backends": [str(tmp_path / "posix")], "device_id": 0,
           "tensor_size": 32768, "shard_size": 32768, "block_size": 32768,
           "kvengine_settings": dict(QUIET)}
    cfg.update(extra)
    return cfg


def _buf(n, fill=None):
    b = bytearray(os.urandom(n) if fill is None else bytes([fill]) * n)
    return b, ctypes.addressof((ctypes.c_char * n).from_buffer(b))


@pytest.mark.parametrize("cfg", [
    {},                                                                   # empty
    {"storage_backends": ["/tmp/x"], "device_id": 0},                     # device, no sizes
    {"storage_backends": ["/tmp/x"], "device_id": 0, "tensor_size": 4096, "shard_size": 4096,
     "block_size": 4096, "posix_io_engine": "psync", "posix_data_trans_concurrency": 0},
    {"storage_backends": ["/tmp/x"], "device_id": -2},
    {"storage_backends": ["/tmp/x"], "device_id": 0, "tensor_size": 4096, "shard_size": 6144,
     "block_size": 12288},                                                # shard not whole tensors
    {"storage_backends": ["/tmp/a", "/tmp/b"]},                           # one directory only
    {"storage_backends": []},
    {"storage_backends": ["/tmp/x"], "timeout_ms": -1},
    {"storage_backends": ["/tmp/x"], "io_direct": "yes"},
], ids=["empty", "device-without-sizes", "zero-concurrency", "device-2", "uneven", "two-dirs",
        "no-dirs", "timeout", "io_direct"])
def test_posix_store_test_invalid_configs_raise(cfg):
    with pytest.raises(RuntimeError):
        KvEngineStore(cfg)


@pytest.mark.parametrize("io_direct", [False, True])
def test_posix_store_test_dump_then_load(tmp_path, io_direct):
    s = KvEngineStore(_posix(tmp_path, io_direct=io_direct))
    try:
        assert s.lookup([BLOCK]).tolist() == [False]
        src, sa = _buf(32768)
        s.wait(s.dump_data([BLOCK], [0], [[sa]]))
        assert s.lookup([BLOCK]).tolist() == [True]
        dst, da = _buf(32768, 0)
        s.wait(s.load_data([BLOCK], [0], [[da]]))
        assert dst == src
        assert os.listdir(str(tmp_path / "posix"))        # the SSD tier lives there
    finally:
        s.close()


def test_a_block_is_present_once_its_last_shard_is(tmp_path):
    # 4 shards of 8 KiB make a 32 KiB block (UCM commits after the last).
    s = KvEngineStore(_posix(tmp_path, tensor_size=8192, shard_size=8192, block_size=32768))
    try:
        bufs = [_buf(8192) for _ in range(4)]
        for i in range(3):
            s.wait(s.dump_data([BLOCK], [i], [[bufs[i][1]]]))
        assert s.lookup([BLOCK]).tolist() == [False]
        assert s.lookup_on_prefix([BLOCK]) == -1
        s.wait(s.dump_data([BLOCK], [3], [[bufs[3][1]]]))
        assert s.lookup([BLOCK]).tolist() == [True]
    finally:
        s.close()


def test_wait_consumes_and_honours_timeout_ms(tmp_path):
    s = KvEngineStore(_posix(tmp_path, timeout_ms=1500))
    try:
        src, sa = _buf(32768)
        t = s.dump_data([BLOCK], [0], [[sa]])
        seen = []

        class Spy:
            def __init__(self, real):
                self.real = real

            def wait(self, ms=0):
                seen.append(ms)
                return self.real.wait(ms)

            def __getattr__(self, name):
                return getattr(self.real, name)

        t.task = Spy(t.task)
        s.wait(t)
        assert seen == [1500]                               # the config's timeout
        with pytest.raises(RuntimeError, match="already waited"):
            s.wait(t)
        with pytest.raises(RuntimeError, match="already waited"):
            s.check(t)
        t2 = s.dump_data([BLOCK], [0], [[sa]])
        while not s.check(t2):
            pass
        s.wait(t2)                                          # check does not consume
    finally:
        s.close()


def test_argument_errors_are_runtimeerrors_and_empty_shard_index_is_zeros(tmp_path):
    s = KvEngineStore(_posix(tmp_path))
    try:
        src, sa = _buf(32768)
        with pytest.raises(RuntimeError, match="16 bytes"):
            s.lookup([b"short"])
        with pytest.raises(RuntimeError, match="shard_index"):
            s.dump_data([BLOCK, BLOCK], [0], [[sa], [sa]])
        with pytest.raises(RuntimeError):
            s.dump_data([BLOCK], [0], [[sa, sa, sa]] * 2)
        s.wait(s.dump_data([BLOCK], [], [[sa]]))           # [] = shard 0 of each
        dst, da = _buf(32768, 0)
        s.wait(s.load_data([BLOCK], [], [[da]]))
        assert dst == src
    finally:
        s.close()


def test_unique_id_names_the_store(tmp_path):
    s = KvEngineStore(_posix(tmp_path, unique_id="ucm-worker-1"))
    s.close()
    with pytest.raises(RuntimeError, match="store.name"):
        KvEngineStore(_posix(tmp_path, unique_id="no/slashes"))


def test_the_schedulers_store_holds_no_dram(tmp_path):
    s = KvEngineStore({"storage_backends": [str(tmp_path / "sched")], "device_id": -1,
                       "kvengine_settings": {"log.level": "warn"}})
    try:
        st = s.engine.stats()
        assert st["dram_capacity"] == 0 and st["ssd_capacity"] > 0
        assert s.lookup([BLOCK]).tolist() == [False]
    finally:
        s.close()


def test_a_prerequisite_event_needs_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the device script covers events")
    s = KvEngineStore(_posix(tmp_path))
    try:
        src, sa = _buf(32768)
        with pytest.raises(RuntimeError, match="CUDA event"):
            s.dump_data([BLOCK], [0], [[sa]], prerequisite_handle=0x1234)
        s.wait(s.dump_data([BLOCK], [0], [[sa]], prerequisite_handle=0))
    finally:
        s.close()


def test_kvengine_settings_win(tmp_path):
    s = KvEngineStore(_posix(tmp_path, kvengine_settings=dict(QUIET, pipeline="dram")))
    try:
        assert s.engine.stats()["ssd_capacity"] == 0
    finally:
        s.close()
