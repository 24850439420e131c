"""engine.py — kvengine.Engine and kvengine.Task: the C engine, from Python.

Key design choices:
- A shard list is packed into one bytearray (the iovec array, then the
  kv_shard array) with struct, not built from ctypes objects field by
  field: per-shard cost is the figure that matters for 4 KiB shards, and a
  ctypes field store costs more than a whole struct.pack_into.
- A Task owns everything the C task touches after kv_dump/kv_load return
  (the iovec array and the pins of every buffer) until it is done; a Task
  dropped unwaited waits in its finalizer, so Python can never free memory
  the engine is still writing.
- close() may race with other threads: calls enter through a counter that
  close waits to drain, then close waits every task still pending (their
  results stay readable), and only then calls kv_close, which must be the
  last call on an engine.
"""

import ctypes
import struct
import threading
import weakref

from . import _buffers
from . import _lib
from ._lib import ERR_NAMES

OK = 0
EINVAL, ENOMEM, ENOSPC, ENOTFOUND, ETIMEDOUT, EIO, ECORRUPT, ECONFIG, ENET, EPROTO, \
    EPERM, EBUSY, ENOBUFS, ECLOSED, ENOTSUP = range(-101, -116, -1)

_SHARD = struct.Struct("=16sI4xQI4x")
assert _SHARD.size == ctypes.sizeof(_lib.kv_shard) == 40
_IOV_SIZE = ctypes.sizeof(_lib.kv_iov)
_U32_MAX = 0xFFFFFFFF
_SCRATCH = 64 * 1024   # plain-key reads up to this size take one call


class KvError(RuntimeError):
    """A kvengine call failed: .code is the negative KV_E* value, .name its
    name without the KV_ prefix (e.g. "ENOSPC")."""

    def __init__(self, code, what=None):
        self.code = code
        self.name = ERR_NAMES.get(code, "E%d" % -code)
        desc = _lib.kv_strerror(code).decode()
        msg = "KV_%s (%d): %s" % (self.name, code, desc)
        super().__init__("%s: %s" % (what, msg) if what else msg)


def strerror(code):
    return _lib.kv_strerror(code).decode()


def version():
    """The version of the C library actually loaded."""
    return _lib.kv_version().decode()


def _key_bytes(key):
    if type(key) is bytes:
        k = key
    elif isinstance(key, str):
        k = key.encode()
    elif isinstance(key, (bytearray, memoryview)):
        k = bytes(key)
    else:
        raise TypeError("a key is str or bytes, got %s" % type(key).__name__)
    if not 0 < len(k) <= _lib.KV_KEY_MAX:
        raise ValueError("a key is 1..%d bytes, got %d" % (_lib.KV_KEY_MAX, len(k)))
    return k


def _id_blob(ids, what="ids"):
    """The ids back to back, checked: a list of 16-byte bytes-likes."""
    if isinstance(ids, (bytes, bytearray, str)):
        raise TypeError("%s must be a list of 16-byte block ids, got one %s"
                        % (what, type(ids).__name__))
    try:
        blob = b"".join(ids)
    except TypeError:
        bad = next(i for i, x in enumerate(ids) if not isinstance(x, (bytes, bytearray, memoryview)))
        raise TypeError("%s[%d]: a block id is 16 bytes, got %s"
                        % (what, bad, type(ids[bad]).__name__)) from None
    n = len(ids)
    if len(blob) != n * 16 or any(len(x) != 16 for x in ids):
        bad = next(i for i, x in enumerate(ids) if len(x) != 16)
        raise ValueError("%s[%d]: a block id is 16 bytes, got %d" % (what, bad, len(ids[bad])))
    return blob, n


def _settings_items(settings):
    if settings is None:
        return []
    if not isinstance(settings, dict):
        raise TypeError("settings is a dict of dotted keys, got %s" % type(settings).__name__)
    out = []
    for k, v in settings.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        k, v = str(k), str(v)
        # C strings end at a NUL: "ssd.path=/a\0b" would quietly become /a.
        if "\0" in k or "\0" in v:
            raise ValueError("setting %r: a key or value must not contain NUL" % (k,))
        out.append((k, v))
    return out


def make_config(config_file=None, settings=None):
    """A kv_config handle (the caller frees it): defaults, then the YAML file,
    then each dotted key. KvError(ECONFIG) names the file, line or key."""
    items = _settings_items(settings)
    cfg = ctypes.c_void_p()
    rc = _lib.kv_config_new(ctypes.byref(cfg))
    if rc:
        raise KvError(rc, "kv_config_new")
    try:
        if config_file is not None:
            if "\0" in str(config_file):
                raise ValueError("config file %r: a path must not contain NUL" % (config_file,))
            err = ctypes.create_string_buffer(512)
            rc = _lib.kv_config_load(cfg, str(config_file).encode(), err, len(err))
            if rc:
                raise KvError(rc, err.value.decode(errors="replace") or str(config_file))
        for k, v in items:
            rc = _lib.kv_config_set(cfg, k.encode(), v.encode())
            if rc:
                raise KvError(rc, "setting %s=%r" % (k, v))
    except BaseException:
        _lib.kv_config_free(cfg)
        raise
    return cfg


def _config_value(cfg, key):
    """A key's current value in a kv_config handle, as text ("" when unset)."""
    buf = ctypes.create_string_buffer(4096)
    rc = _lib.kv_config_get(cfg, key.encode(), buf, len(buf))
    if rc:
        raise KvError(rc, "kv_config_get(%s)" % key)
    return buf.value.decode(errors="replace")


def config_shared(cfg):
    """Whether an engine opened from the kv_config handle cfg keeps a store
    other processes can reach: a host store (store.name, or an SSD tier,
    shared by its ssd.path: engine/host.c's store_id) or a cluster. When
    not, nothing this process stores can be seen by anyone else."""
    return bool(_config_value(cfg, "store.name")) or \
        "ssd" in _config_value(cfg, "pipeline").split("|") or \
        _config_value(cfg, "cluster.enabled") == "true"


def _check_id(bid, i):
    if not isinstance(bid, (bytes, bytearray, memoryview)):
        raise TypeError("shards[%d]: a block id is 16 bytes, got %s" % (i, type(bid).__name__))
    bid = bytes(bid)
    if len(bid) != 16:
        raise ValueError("shards[%d]: a block id is 16 bytes, got %d" % (i, len(bid)))
    return bid


_STRUCTS = {}


def _shards_struct(n):
    """A compiled Struct for n kv_shards, kept for the batch sizes in use."""
    st = _STRUCTS.get(n)
    if st is None:
        if len(_STRUCTS) >= 256:
            _STRUCTS.clear()
        st = _STRUCTS[n] = struct.Struct("=" + "16sI4xQI4x" * n)
    return st


class Task:
    """An asynchronous dump or load. check() never blocks; wait() blocks and
    raises KvError when the task failed. Both may be called again after the
    task finished: they report the same result."""

    __slots__ = ("_engine", "_handle", "_pins", "_result", "_lock", "__weakref__")

    def __init__(self, engine, handle, pins):
        self._engine = engine
        self._handle = handle
        self._pins = pins
        self._result = None
        self._lock = threading.Lock()

    @property
    def id(self):
        """The engine's 64-bit task handle."""
        return self._handle

    @property
    def result(self):
        """None while running (or not yet waited), else 0 or a KV_E* code."""
        return self._result

    def _finish(self, timeout_ms=0):
        # Called with self._lock held. A timed-out wait has cancelled and
        # drained the task (include/kvengine.h), so the pins may go in every
        # case.
        rc = _lib.kv_wait(self._engine._h, self._handle, timeout_ms)
        self._result = rc
        self._pins = None
        self._engine._tasks.discard(self)
        return rc

    def check(self):
        """True when the task has finished (successfully or not)."""
        with self._lock:
            if self._result is not None:
                return True
            done = ctypes.c_int()
            rc = _lib.kv_check(self._engine._h, self._handle, ctypes.byref(done))
            if rc:
                raise KvError(rc, "kv_check(task %d)" % self._handle)
            return bool(done.value)

    def wait(self, timeout_ms=0):
        """Blocks until done (timeout_ms 0 = forever); raises KvError for a
        failed task, KV_ETIMEDOUT (the task is then cancelled) on timeout."""
        if not isinstance(timeout_ms, int) or not 0 <= timeout_ms <= _U32_MAX:
            # (kv_wait takes an unsigned int: a larger one would wrap to a short wait)
            raise ValueError("timeout_ms is an int in 0..2^32-1, got %r" % (timeout_ms,))
        with self._lock:
            rc = self._result
            if rc is None:
                rc = self._finish(timeout_ms)
        if rc:
            raise KvError(rc, "task %d" % self._handle)

    def __del__(self):
        # An unwaited task still owns buffers the engine may write into.
        lock = getattr(self, "_lock", None)
        if lock is not None and self._result is None and self._engine._h:
            with lock:
                if self._result is None:
                    self._finish()

    def __repr__(self):
        state = "running" if self._result is None else ERR_NAMES.get(self._result, self._result)
        return "<kvengine.Task %d %s>" % (self._handle, state)


class Engine:
    """One kvengine engine in this process (kv_open ... kv_close).

    Engine(config_file=None, settings=None): a YAML file and/or a dict of
    dotted keys, e.g. {"pipeline": "dram", "dram.capacity": "1GiB"}.
    """

    def __init__(self, config_file=None, settings=None):
        self._h = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._users = 0
        self._closing = False
        self._tasks = weakref.WeakSet()
        self._tls = threading.local()
        cfg = make_config(config_file, settings)
        try:
            # Other processes may see this store (config_shared): what a
            # caller keeps only for them (the Mooncake drop-in's read
            # leases) it need not store otherwise.
            self.shared = config_shared(cfg)
            h = ctypes.c_void_p()
            rc = _lib.kv_open(cfg, ctypes.byref(h))
            if rc:
                raise KvError(rc, "kv_open (the library logged why)")
        finally:
            _lib.kv_config_free(cfg)
        self._h = h.value

    # -- life cycle --------------------------------------------------------

    def _enter(self):
        with self._lock:
            if self._h is None or self._closing:
                raise KvError(ECLOSED, "engine is closed")
            self._users += 1
            return self._h

    def _leave(self):
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._closing:
                self._idle.notify_all()

    @property
    def closed(self):
        return self._h is None

    def close(self):
        """Finishes every pending task (their results stay readable), then
        closes the engine. Calling it again does nothing."""
        with self._lock:
            if self._h is None or self._closing:
                return
            self._closing = True
            while self._users:
                self._idle.wait()
        for t in list(self._tasks):
            with t._lock:
                if t._result is None:
                    t._finish()
        h, self._h = self._h, None
        _lib.kv_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()

    # -- blocks -----------------------------------------------------------

    def lookup(self, ids):
        """[bool] per block id: the block is complete (shards 0..store.block_shards-1
        each stored in some tier); hits are leased."""
        blob, n = _id_blob(ids)
        hit = ctypes.create_string_buffer(n or 1)
        h = self._enter()
        try:
            rc = _lib.kv_lookup(h, blob, n, hit)
        finally:
            self._leave()
        if rc:
            raise KvError(rc, "kv_lookup")
        return [b != 0 for b in hit.raw[:n]]

    def lookup_prefix(self, ids):
        """Index of the last hit in the leading run of hits; -1 when ids[0] misses."""
        blob, n = _id_blob(ids)
        h = self._enter()
        try:
            rc = _lib.kv_lookup_prefix(h, blob, n)
        finally:
            self._leave()
        if rc < -1:
            raise KvError(rc, "kv_lookup_prefix")
        return rc

    def prefetch(self, ids):
        """A hint to stage SSD-resident blocks into DRAM; returns at once."""
        blob, n = _id_blob(ids)
        h = self._enter()
        try:
            rc = _lib.kv_prefetch(h, blob, n)
        finally:
            self._leave()
        if rc:
            raise KvError(rc, "kv_prefetch")

    @staticmethod
    def _pack(shards, writable):
        """(address of the kv_shard array, n, pins): one bytearray holding the
        iovec array, then the kv_shard array; pins keep it and every buffer
        alive. The loop is written for speed (per-shard cost is measured):
        checks are inline, a bytes buffer needs no call, and a buffer object
        repeated in one call is resolved once."""
        if isinstance(shards, tuple) and len(shards) == 3 and isinstance(shards[0], bytes):
            raise TypeError("shards is a list of (id, index, buffers) tuples, got one tuple")
        n = len(shards)
        if n == 0:
            raise ValueError("no shards given")
        flat = []
        pins = []
        sargs = []
        pin = pins.append
        span = _buffers.span
        off = None if writable else _buffers.BYTES_OFFSET
        seen = {}
        i = -1
        try:
            for i, sh in enumerate(shards):
                bid, idx, bufs = sh
                if type(bid) is not bytes or len(bid) != 16:
                    bid = _check_id(bid, i)
                if type(idx) is not int or idx < 0 or idx > _U32_MAX:
                    raise ValueError("shards[%d]: the shard index is an int in 0..2^32-1, got %r"
                                     % (i, idx))
                tb = type(bufs)
                if tb is not list and tb is not tuple:
                    raise TypeError("shards[%d]: buffers is a list of buffers, got %s"
                                    % (i, tb.__name__))
                sargs += (bid, idx, len(flat) >> 1, len(bufs))
                for b in bufs:
                    if type(b) is bytes and off is not None:
                        flat += (id(b) + off, len(b))
                        pin(b)
                        continue
                    got = seen.get(id(b))
                    if got is None:
                        try:
                            got = span(b, writable)
                        except (TypeError, ValueError, BufferError) as exc:
                            raise type(exc)("shards[%d] buffer %d: %s"
                                            % (i, bufs.index(b), exc)) from None
                        if got[2] is not None:
                            pin(got[2])
                        pin(b)   # keeps id(b) unique while seen holds it
                        seen[id(b)] = got
                    flat += (got[0], got[1])
        except (TypeError, ValueError) as exc:
            if str(exc).startswith("shards["):
                raise
            raise TypeError("shards[%d]: a shard is (block id, shard index, [buffers])" % i) \
                from None
        m = len(flat) >> 1
        ioff = _IOV_SIZE * m
        mem = bytearray(ioff + _SHARD.size * n)
        arr = ctypes.c_char.from_buffer(mem)
        base = ctypes.addressof(arr)
        if m:
            struct.pack_into("=%dQ" % (2 * m), mem, 0, *flat)
        for k in range(2, 4 * n, 4):
            sargs[k] = base + _IOV_SIZE * sargs[k]
        _shards_struct(n).pack_into(mem, ioff, *sargs)
        pins.append(arr)
        return base + ioff, n, pins

    def _submit(self, fn, name, shards, writable, wait):
        addr, n, pins = self._pack(shards, writable)
        task = ctypes.c_uint64()
        h = self._enter()
        try:
            if wait:
                rc = fn(h, addr, n, ctypes.byref(task))
                if rc == OK:
                    # Waited at once: kv_wait then runs the task on this
                    # thread unless a worker claimed it first, so nothing
                    # is done between the two calls.
                    rc = _lib.kv_wait(h, task.value, 0)
                if rc:
                    raise KvError(rc, name)
                return None
            # The Task exists before the C task does, so that the time
            # between kv_dump and a wait that follows at once is as short as
            # can be (a wait that comes before any worker claims the task
            # runs it itself, without a thread switch).
            t = Task(self, 0, pins)
            t._result = ECLOSED
            self._tasks.add(t)
            rc = fn(h, addr, n, ctypes.byref(task))
            if rc:
                self._tasks.discard(t)
                raise KvError(rc, name)
            t._handle = task.value
            t._result = None
        finally:
            self._leave()
        return t

    def dump(self, shards, wait=False):
        """Starts copying shards in; returns a Task (or, with wait=True, runs
        it to the end and returns None: a little faster than .wait() for
        small shards). A shard is (16-byte block id, shard index, [buffers]);
        a buffer is bytes-like, a numpy array, a CPU torch tensor or an
        (address, size) pair. The buffers must stay unchanged until the task
        is done (the Task keeps Python objects alive until then)."""
        return self._submit(_lib.kv_dump, "kv_dump", shards, False, wait)

    def load(self, shards, wait=False):
        """Starts copying shards out into writable buffers; returns a Task
        (None with wait=True, as dump). The buffers of a shard must add up to
        its stored size exactly."""
        return self._submit(_lib.kv_load, "kv_load", shards, True, wait)

    def shard_size(self, block_id, index=0):
        """The stored length of shard (block_id, index), or None when absent."""
        blob, _ = _id_blob([block_id], "block_id")
        out = ctypes.c_uint64()
        h = self._enter()
        try:
            rc = _lib.kv_shard_size(h, blob, index, ctypes.byref(out))
        finally:
            self._leave()
        if rc == ENOTFOUND:
            return None
        if rc:
            raise KvError(rc, "kv_shard_size")
        return out.value

    # -- plain keys ---------------------------------------------------------

    def put(self, key, value):
        """Stores (or replaces) key's value (str or bytes key; bytes-like value)."""
        k = _key_bytes(key)
        addr, ln, pin = _buffers.span(value, False)
        h = self._enter()
        try:
            rc = _lib.kv_put(h, k, len(k), addr, ln)
        finally:
            self._leave()
        if rc:
            raise KvError(rc, "kv_put(%r)" % (key,))

    def _scratch(self):
        s = getattr(self._tls, "buf", None)
        if s is None:
            s = self._tls.buf = ctypes.create_string_buffer(_SCRATCH)
        return s

    def get(self, key):
        """The value as bytes, or None when the key is absent."""
        k = _key_bytes(key)
        vlen = ctypes.c_size_t()
        scratch = self._scratch()
        h = self._enter()
        try:
            rc = _lib.kv_get(h, k, len(k), scratch, _SCRATCH, ctypes.byref(vlen))
            for _ in range(16):
                # A value larger than the scratch buffer: read it again into
                # a buffer of its size (it may change size in between).
                if rc != ENOBUFS:
                    break
                need = vlen.value
                out, addr = _new_bytes(need)
                rc = _lib.kv_get(h, k, len(k), addr, need, ctypes.byref(vlen))
                if rc == OK:
                    return out if vlen.value == need else out[:vlen.value]
        finally:
            self._leave()
        if rc == ENOTFOUND:
            return None
        if rc:
            raise KvError(rc, "kv_get(%r)" % (key,))
        return scratch.raw[:vlen.value]

    def get_into(self, key, buf):
        """Copies the value into a writable buffer; returns its length, or
        None when absent. KvError(ENOBUFS) when the buffer is too small."""
        k = _key_bytes(key)
        addr, cap, pin = _buffers.span(buf, True)
        vlen = ctypes.c_size_t()
        h = self._enter()
        try:
            rc = _lib.kv_get(h, k, len(k), addr or None, cap, ctypes.byref(vlen))
        finally:
            self._leave()
        if rc == ENOTFOUND:
            return None
        if rc:
            raise KvError(rc, "kv_get(%r) into %d bytes (the value has %d)"
                          % (key, cap, vlen.value) if rc == ENOBUFS else "kv_get(%r)" % (key,))
        return vlen.value

    def exists(self, key):
        k = _key_bytes(key)
        h = self._enter()
        try:
            rc = _lib.kv_exists(h, k, len(k))
        finally:
            self._leave()
        if rc < 0:
            raise KvError(rc, "kv_exists(%r)" % (key,))
        return rc == 1

    def remove(self, key):
        """Removes key; True when it was there, False when it was absent."""
        k = _key_bytes(key)
        h = self._enter()
        try:
            rc = _lib.kv_remove(h, k, len(k))
        finally:
            self._leave()
        if rc == ENOTFOUND:
            return False
        if rc:
            raise KvError(rc, "kv_remove(%r)" % (key,))
        return True

    def remove_all(self):
        """Removes every plain key (blocks stay), in a cluster from every
        owner, whoever put them; returns how many were removed."""
        if _lib.kv_remove_all is None:   # pragma: no cover - an older library
            raise KvError(ENOTSUP, "kv_remove_all: not in this libkvengine")
        n = ctypes.c_uint64(0)
        h = self._enter()
        try:
            rc = _lib.kv_remove_all(h, ctypes.byref(n))
        finally:
            self._leave()
        if rc:
            raise KvError(rc, "kv_remove_all")
        return n.value

    def remove_prefix(self, prefix):
        """Removes every plain key that begins with prefix (bytes or str,
        at most 250 bytes; blocks stay), in a cluster from every owner,
        whoever put them; returns how many were removed. An empty prefix
        is remove_all."""
        if _lib.kv_remove_prefix is None:   # pragma: no cover - an older library
            raise KvError(ENOTSUP, "kv_remove_prefix: not in this libkvengine")
        p = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        n = ctypes.c_uint64(0)
        h = self._enter()
        try:
            rc = _lib.kv_remove_prefix(h, p, len(p), ctypes.byref(n))
        finally:
            self._leave()
        if rc:
            raise KvError(rc, "kv_remove_prefix(%r)" % (prefix,))
        return n.value

    # -- zero copy and counters ---------------------------------------------

    def register_buffer(self, buf, size=None):
        """Registers memory for RDMA: a buffer object, or an address and size.
        Returns the address registered (what unregister_buffer takes)."""
        if size is None:
            addr, size, _ = _buffers.span(buf, False)
        else:
            addr = buf
        if not isinstance(addr, int) or not isinstance(size, int) or addr <= 0 or size <= 0:
            raise ValueError("register_buffer takes a buffer, or an address and a size > 0")
        _buffers.check_u64("address", addr)
        _buffers.check_u64("size", size)
        h = self._enter()
        try:
            rc = _lib.kv_register_buffer(h, addr, size)
        finally:
            self._leave()
        if rc:
            raise KvError(rc, "kv_register_buffer(0x%x, %d)" % (addr, size))
        return addr

    def unregister_buffer(self, buf):
        addr = buf if isinstance(buf, int) else _buffers.span(buf, False)[0]
        h = self._enter()
        try:
            rc = _lib.kv_unregister_buffer(h, addr)
        finally:
            self._leave()
        if rc:
            raise KvError(rc, "kv_unregister_buffer(0x%x)" % addr)

    def stats(self):
        """The engine's counters (kv_stats) as a dict."""
        st = _lib.kv_stats()
        h = self._enter()
        try:
            rc = _lib.kv_stats_get(h, ctypes.byref(st))
        finally:
            self._leave()
        if rc:
            raise KvError(rc, "kv_stats_get")
        return {name: getattr(st, name) for name in _lib.STATS_FIELDS}


_bytes_new = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_new.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_bytes_new.restype = ctypes.py_object


def _new_bytes(n):
    """A fresh bytes object of n bytes and the address of its data: the
    engine copies a value straight into it (one copy, not two). Nothing else
    holds it yet, so filling it in place is what C extensions do too."""
    if _buffers.BYTES_OFFSET is not None:
        obj = _bytes_new(None, n)
        return obj, id(obj) + _buffers.BYTES_OFFSET
    buf = bytearray(n)
    return buf, (ctypes.addressof((ctypes.c_char * n).from_buffer(buf)) if n else 0)


def members(config_file=None, settings=None):
    """The cluster view kvmaster holds (kv_members): (version, [dict])."""
    cfg = make_config(config_file, settings)
    try:
        ver = ctypes.c_uint64()
        arr = ctypes.POINTER(_lib.kv_member_info)()
        n = ctypes.c_size_t()
        rc = _lib.kv_members(cfg, ctypes.byref(ver), ctypes.byref(arr), ctypes.byref(n))
    finally:
        _lib.kv_config_free(cfg)
    if rc:
        raise KvError(rc, "kv_members")
    try:
        out = [{"id": arr[i].id.decode(), "addr": arr[i].addr.decode(),
                "owner": bool(arr[i].owner), "segments": arr[i].segments,
                "segment_bytes": arr[i].segment_bytes} for i in range(n.value)]
    finally:
        if arr:
            _lib.free(ctypes.cast(arr, ctypes.c_void_p))
    return ver.value, out
