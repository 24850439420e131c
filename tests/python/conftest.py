"""conftest.py — fixtures for the Python package's tests (pytest).

The package under test is python/kvengine of this tree; the library is
$KVENGINE_LIBRARY (the Makefile points it at $(BUILD)/libkvengine.so.0),
and kvmaster/kvnode come from $KV_BUILD (else the library's directory).
Cluster fixtures start real processes on 127.0.0.1 with kernel-chosen
ports and kill and reap every one of them at teardown, pass or fail.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "python", "compat"))

import kvengine  # noqa: E402

SMALL = {"pipeline": "dram", "dram.capacity": "64MiB", "dram.hugepages": "off",
         "io.threads": "2", "log.level": "warn"}


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _child_setup():
    # Each daemon gets its own process group (killed whole at stop) and
    # dies with this process even when pytest itself is killed.
    os.setsid()
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def build_dir():
    return os.environ.get("KV_BUILD") or os.path.dirname(os.path.abspath(kvengine.library_path))


_PORT_LO, _PORT_SPAN = 10000, 11000
_port_next = [(os.getpid() * 7919) % _PORT_SPAN]


def free_port():
    """A port below the ephemeral range (32768 up), free when asked, never
    the same one twice in a process (as tests/testutil.c's tu_free_port):
    binding port 0 lets the kernel hand the port just freed out again, and
    an outgoing connection may take an ephemeral one before a node binds."""
    for _ in range(_PORT_SPAN):
        port = _PORT_LO + _port_next[0]
        _port_next[0] = (_port_next[0] + 1) % _PORT_SPAN
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        return port
    raise RuntimeError("no free port in %d..%d" % (_PORT_LO, _PORT_LO + _PORT_SPAN - 1))


@pytest.fixture
def engine():
    e = kvengine.Engine(settings=SMALL)
    yield e
    e.close()


def ids(n):
    """n random 16-byte block ids."""
    return [os.urandom(16) for _ in range(n)]


class Cluster:
    """kvmaster plus kvnodes on loopback, torn down by stop()."""

    TOKEN = "pytok"

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        self.master = "127.0.0.1:%d" % free_port()

    def _spawn(self, argv, log):
        f = open(os.path.join(self.tmp, log), "wb")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=_child_setup)
        f.close()
        self.procs.append(p)
        return p

    def settings(self, **extra):
        s = {"cluster.master": self.master, "cluster.token": self.TOKEN,
             "cluster.node_ttl_ms": "1000", "log.level": "warn"}
        s.update(extra)
        return s

    def start_master(self):
        b = build_dir()
        self.master_proc = self._spawn(
            [os.path.join(b, "kvmaster"), "--set", "cluster.master=" + self.master,
             "--set", "cluster.node_ttl_ms=1000", "--set", "cluster.token=" + self.TOKEN],
            "kvmaster.log")
        self._until(lambda: self._members() is not None, "kvmaster answers")

    def start_node(self, cap="64MiB"):
        b = build_dir()
        i = len(self.procs)
        addr = "127.0.0.1:%d" % free_port()
        sets = {"cluster.enabled": "true", "cluster.master": self.master,
                "cluster.listen": addr, "dram.capacity": cap, "pipeline": "dram",
                "dram.hugepages": "off", "cluster.protocol": "tcp", "io.threads": "2",
                "cluster.node_ttl_ms": "1000", "cluster.token": self.TOKEN,
                "ssd.path": os.path.join(self.tmp, "node%d" % i)}
        argv = [os.path.join(b, "kvnode")]
        for k, v in sets.items():
            argv += ["--set", "%s=%s" % (k, v)]
        self._spawn(argv, "kvnode%d.log" % i)
        return addr

    def _members(self):
        try:
            return kvengine.members(settings=self.settings())[1]
        except kvengine.KvError:
            return None

    def owners(self):
        m = self._members() or []
        return [x for x in m if x["owner"]]

    def wait_owners(self, n):
        self._until(lambda: len(self.owners()) == n, "%d owners in the view" % n)

    def _until(self, cond, what, timeout=10.0):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError("%s exited with %s (logs in %s)"
                                         % (p.args[0], p.returncode, self.tmp))
            if cond():
                return
            time.sleep(0.05)
        raise AssertionError("timed out waiting until %s (logs in %s)" % (what, self.tmp))

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)
        self.procs = []


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path))
    try:
        c.start_master()
        yield c
    finally:
        c.stop()


MC_QUIET = {"dram.hugepages": "off", "log.level": "warn"}


def mooncake_embedded_store(segment="64MB", buffer="16MB", settings=None, **kw):
    """The drop-in's MooncakeDistributedStore set up embedded (no master),
    as the Mooncake tests' store fixtures use it (setup's keywords in kw,
    e.g. tenant_id; more kvengine settings in settings); the caller closes
    it."""
    import kvengine.mooncake as mc
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", segment, buffer, "tcp", "", "",
                   kvengine_settings=dict(MC_QUIET, **(settings or {})), **kw) == 0, s.last_error
    return s


@pytest.fixture
def host_store_settings():
    """kvengine settings that make an embedded store a host store other
    processes (and other engines of this one) attach to: a store.name of
    its own in a short 0700 directory (a Unix socket's path is short),
    removed afterwards."""
    import shutil
    import tempfile
    import uuid
    d = tempfile.mkdtemp(prefix="kvh")
    try:
        yield {"store.name": "t" + uuid.uuid4().hex[:12], "store.dir": d}
    finally:
        shutil.rmtree(d, ignore_errors=True)


class DataProtoLike:
    """A DataProto-like object: what MooncakeBundleTransfer's put_dataproto
    reads (batch, non_tensor_batch, meta_info)."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch = batch or {}
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}

    @classmethod
    def from_dict(cls, batch, non_tensor_batch=None, meta_info=None):
        return cls(batch, non_tensor_batch, meta_info)


def objarr(values):
    """A 1-d numpy object array of values, as is (np.asarray would make
    ragged rows 2-d or refuse them)."""
    import numpy as np
    a = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        a[i] = v
    return a
