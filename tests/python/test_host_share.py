"""test_host_share.py — the host store through the Python drop-ins, with
real processes (issue 16): UCM's scheduler/worker pattern, one
kvengine.ucm config as UCM's connector builds it (unique_id, the scheduler
with device_id -1), in a dram store and an ssd one (storage_backends); and
Mooncake's setup_dummy sharing a store with a client in another process.

Each peer is a child interpreter driven line by line over its stdin and
stdout, so the parent knows exactly when the other side's call returned:
"sees every block at once" is checked right after the dump's wait, with no
sleep between. Every child is killed and reaped at teardown, pass or fail.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, _child_setup

BLOCK = 32768
N = 16

# A child: reads one JSON command a line, answers one JSON line.
PEER = textwrap.dedent(r"""
    import ctypes, json, os, sys
    sys.path.insert(0, os.path.join(%(root)r, "python"))
    sys.path.insert(0, os.path.join(%(root)r, "python", "compat"))
    kind, cfg = sys.argv[1], json.loads(sys.argv[2])
    if kind == "ucm":
        from kvengine.ucm import KvEngineStore
        s = KvEngineStore(cfg)
    else:
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        rc = s.setup_dummy(*cfg["dummy"]) if "dummy" in cfg else s.setup(**cfg["real"])
        if rc != 0:
            print(json.dumps({"error": s.last_error}), flush=True)
            sys.exit(1)
    def blob(i, n):
        return bytes([(i * 7 + j) %% 251 for j in range(256)]) * (n // 256)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        op, ids = c["op"], [bytes.fromhex(x) for x in c.get("ids", [])]
        out = {}
        if op == "dump":
            bufs = [bytearray(blob(i, %(block)d)) for i in range(len(ids))]
            addrs = [[ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b))] for b in bufs]
            s.wait(s.dump_data(ids, [0] * len(ids), addrs))
        elif op == "lookup":
            out["prefix"] = s.lookup_on_prefix(ids)
            out["hits"] = [bool(x) for x in s.lookup(ids)]
        elif op == "load":
            bufs = [bytearray(%(block)d) for _ in ids]
            addrs = [[ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b))] for b in bufs]
            s.wait(s.load_data(ids, [0] * len(ids), addrs))
            out["same"] = all(bytes(b) == blob(i, %(block)d) for i, b in enumerate(bufs))
        elif op == "put":
            out["rc"] = s.put(c["key"], bytes.fromhex(c["value"]))
        elif op == "get":
            out["value"] = s.get(c["key"]).hex()
        elif op == "attached":
            # kv_stats.host_attached: the third field past open_ns, which
            # python/kvengine/_lib.py keeps as reserved[2].
            from kvengine import _lib
            eng = s._eng if hasattr(s, "_eng") else s.engine
            st = _lib.kv_stats()
            assert _lib.kv_stats_get(eng._h, ctypes.byref(st)) == 0
            out["attached"] = st.reserved[2]
        print(json.dumps(out), flush=True)
    s.close()
""") % {"root": ROOT, "block": BLOCK}


class Peer:
    def __init__(self, kind, cfg):
        self.p = subprocess.Popen([sys.executable, "-c", PEER, kind, json.dumps(cfg)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, preexec_fn=_child_setup)
        first = self._line()
        assert first.get("ready"), first

    def _line(self):
        line = self.p.stdout.readline()
        if not line:
            self.p.wait(timeout=10)
            raise AssertionError("peer died (rc %s): %s" % (self.p.returncode, self.p.stderr.read()))
        return json.loads(line)

    def call(self, op, **kw):
        kw["op"] = op
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        return self._line()

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait()
        self.p.stdout.close()
        self.p.stderr.close()
        return self.p.returncode


@pytest.fixture
def peers():
    started = []

    def start(kind, cfg):
        p = Peer(kind, cfg)
        started.append(p)
        return p
    yield start
    for p in reversed(started):
        p.close()


def _store_dir(tmp_path):
    d = tmp_path / "rendezvous"
    d.mkdir(mode=0o700)
    return str(d)


def _ucm_config(tmp_path, device_id, ssd):
    """What UCM's connector hands every process: the same dict but for
    device_id (-1 the scheduler, a rank for a worker)."""
    d = tmp_path / "rendezvous"
    if not d.exists():
        _store_dir(tmp_path)
    cfg = {"device_id": device_id, "unique_id": "ucm-" + tmp_path.name[-24:].replace("_", "-"),
           "tensor_size": BLOCK, "shard_size": BLOCK, "block_size": BLOCK,
           "kvengine_settings": {"store.dir": str(d),
                                 "dram.capacity": "64MiB", "dram.hugepages": "off",
                                 "io.threads": "2", "log.level": "warn"}}
    if ssd:
        cfg["storage_backends"] = [str(tmp_path / "posix")]
    else:
        cfg["kvengine_settings"]["pipeline"] = "dram"
    return cfg


def _ids(tag):
    return [("%02x" % tag) * 8 + "%016x" % i for i in range(N)]


@pytest.mark.parametrize("ssd", [False, True], ids=["dram", "ssd"])
def test_ucm_scheduler_sees_every_block_a_worker_dumped(tmp_path, peers, ssd):
    # The scheduler opens first (as UCM's connector does): it serves.
    sched = peers("ucm", _ucm_config(tmp_path, -1, ssd))
    worker = peers("ucm", _ucm_config(tmp_path, 0, ssd))
    ids = _ids(1)
    assert sched.call("lookup", ids=ids)["prefix"] == -1
    worker.call("dump", ids=ids)
    got = sched.call("lookup", ids=ids)     # no sleep: the dump's wait returned
    assert got["prefix"] == N - 1 and all(got["hits"]), got
    # And the other way: a second worker (rank 1) loads what rank 0 dumped.
    other = peers("ucm", _ucm_config(tmp_path, 1, ssd))
    assert other.call("load", ids=ids)["same"]
    # One store: the attached processes hold no DRAM of their own.
    assert worker.call("attached")["attached"] == 1
    assert other.call("attached")["attached"] == 1


def test_ucm_worker_first_then_the_scheduler(tmp_path, peers):
    # A worker that opens first serves; the scheduler attaches to it.
    worker = peers("ucm", _ucm_config(tmp_path, 0, True))
    sched = peers("ucm", _ucm_config(tmp_path, -1, True))
    ids = _ids(2)
    worker.call("dump", ids=ids)
    got = sched.call("lookup", ids=ids)
    assert got["prefix"] == N - 1 and all(got["hits"]), got
    assert sched.call("attached")["attached"] == 1


def test_mooncake_setup_dummy_shares_with_a_client_in_another_process(tmp_path, peers,
                                                                      monkeypatch):
    d = _store_dir(tmp_path)
    monkeypatch.setenv("KVENGINE_SETTINGS", "store.dir=%s log.level=warn dram.hugepages=off" % d)
    addr = "127.0.0.1:%d" % (50000 + os.getpid() % 10000)
    real = peers("mooncake", {"dummy": ["32MB", "16MB", addr]})
    dummy = peers("mooncake", {"dummy": ["32MB", "16MB", addr]})
    value = os.urandom(3000).hex()
    assert real.call("put", key="from-real", value=value)["rc"] == 0
    assert dummy.call("get", key="from-real")["value"] == value
    assert dummy.call("put", key="from-dummy", value=value[::-1])["rc"] == 0
    assert real.call("get", key="from-dummy")["value"] == value[::-1]
    assert dummy.call("attached")["attached"] == 1


def test_mooncake_dummies_share_the_store_a_kvnode_serves(tmp_path, peers, monkeypatch):
    # Mooncake's real client as a daemon (its mooncake_client) is kvnode
    # here, serving the store setup_dummy names after server_address.
    import time
    from conftest import build_dir
    d = _store_dir(tmp_path)
    addr = "127.0.0.1:%d" % (50000 + (os.getpid() + 1) % 10000)
    name = "mooncake-" + addr.replace(":", "-")
    log = open(str(tmp_path / "kvnode.log"), "wb")
    node = subprocess.Popen([os.path.join(build_dir(), "kvnode"), "--set", "store.name=" + name,
                             "--set", "store.dir=" + d, "--set", "pipeline=dram",
                             "--set", "dram.capacity=64MiB", "--set", "dram.hugepages=off",
                             "--set", "log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_child_setup)
    log.close()
    try:
        sock = os.path.join(d, name + ".sock")
        t0 = time.monotonic()
        while not os.path.exists(sock):   # kvnode binds it once its tiers are open
            assert node.poll() is None and time.monotonic() - t0 < 20, \
                open(str(tmp_path / "kvnode.log")).read()
            time.sleep(0.02)
        monkeypatch.setenv("KVENGINE_SETTINGS", "store.dir=%s log.level=warn" % d)
        a = peers("mooncake", {"dummy": ["16MB", "16MB", addr]})
        b = peers("mooncake", {"dummy": ["16MB", "16MB", addr]})
        assert a.call("attached")["attached"] == 1 and b.call("attached")["attached"] == 1
        value = os.urandom(5000).hex()
        assert a.call("put", key="k", value=value)["rc"] == 0
        assert b.call("get", key="k")["value"] == value
        a.close()
        b.close()
    finally:
        os.killpg(node.pid, 9)
        node.wait(timeout=10)
