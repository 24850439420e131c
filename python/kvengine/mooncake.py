"""mooncake.py — a Mooncake Store drop-in (MooncakeDistributedStore) on kvengine.

Code written for `from mooncake.store import MooncakeDistributedStore`
(LMCache's Mooncake connector, SGLang's HiCache, vLLM's MooncakeStore) runs
on kvengine with python/compat on PYTHONPATH, or imports this module.

Mapping (what Mooncake's arguments mean here):
- setup(local_hostname, metadata_server, global_segment_size,
  local_buffer_size, protocol, rdma_devices, master_server_addr), or
  setup(dict) with the same keys. global_segment_size is the DRAM this
  process contributes (dram.capacity; 0 makes a pure client), and
  master_server_addr the kvmaster it joins (empty: a single-process engine
  with no cluster). protocol is tcp or rdma (cluster.protocol), the first of
  rdma_devices is cluster.device_name. local_hostname is the address this
  member serves on; without a port one is picked in 12300..14300, as
  Mooncake does. metadata_server is accepted and ignored: kvmaster holds
  membership and there is no separate metadata service. local_buffer_size
  bounds the values the copying calls (put, get, put_parts, put_batch,
  get_batch, get_buffer) move, as Mooncake's client buffer does: 0 makes
  them fail; the zero-copy calls (put_from, get_into, batch_*) do not use it.
  Anything else reaches the engine through the environment, for code that
  cannot change its setup call: KVENGINE_CONFIG (a YAML file) and
  KVENGINE_SETTINGS (space-separated dotted KEY=VALUE pairs, as --set
  takes them, e.g. "cluster.token=s3cret io.threads=8"); or through the
  keyword-only kvengine_config / kvengine_settings (also keys of the dict),
  which win over the environment.
- Objects are kvengine's plain keys (kv_put / kv_get / kv_exists /
  kv_remove): in a cluster they live on the key's owners (placed like
  blocks, cluster.replica_num of them), from members and pure clients
  alike. The batch calls (put_batch, get_batch, batch_put_from,
  batch_get_into, batch_is_exist) are one kv_put_many / kv_get_many /
  kv_exists_many each: one round per owner, not one per key (a library
  without those calls gets a loop).
- A put replaces an existing object (Mooncake's put of an existing key
  succeeds too). ReplicateConfig is accepted and checked, but replication
  is the engine's cluster.replica_num, and there is no per-object pinning:
  replica_num, pins and preferred segments of one call are ignored.
- Return conventions are Mooncake's: 0 or a negative code, bytes read for
  get_into, b"" from get when the object is missing, 1/0/-1 from is_exist.
  Codes are Mooncake's numbers (ErrorCode below) mapped from kvengine's:
  OBJECT_NOT_FOUND -704, NO_AVAILABLE_HANDLE -200 (no room), INVALID_PARAMS
  -600 (bad arguments, a buffer too small), BUFFER_OVERFLOW -10 (a value
  larger than local_buffer_size), RPC_FAIL -900 / RPC_TIMEOUT -901 (the
  network), INTERNAL_ERROR -1 (anything else, and a store not set up).
- remove_all removes every object in the store, whoever put it
  (kv_remove_all: every owner drops its plain keys; blocks stay).

Key design choice: nothing here raises on a failed store operation (only
on a call that cannot be made at all, like a missing argument): a caller
written for Mooncake tests return codes.
"""

import ctypes
import enum
import errno
import logging
import os
import re
import shlex
import socket
import struct
import threading

from . import _buffers
from . import _lib
from . import engine as _engine

log = logging.getLogger("kvengine.mooncake")


class ErrorCode(enum.IntEnum):
    """Mooncake's error numbers (mooncake-store/include/types.h) that this
    store returns."""
    OK = 0
    INTERNAL_ERROR = -1
    NOT_IMPLEMENTED = -2
    BUFFER_OVERFLOW = -10
    NO_AVAILABLE_HANDLE = -200
    INVALID_KEY = -400
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    OBJECT_NOT_FOUND = -704
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    RPC_TIMEOUT = -901


_E = _engine
_MAP = {
    0: 0,
    _E.ENOTFOUND: ErrorCode.OBJECT_NOT_FOUND,
    _E.ENOSPC: ErrorCode.NO_AVAILABLE_HANDLE,
    _E.EINVAL: ErrorCode.INVALID_PARAMS,
    _E.ENOBUFS: ErrorCode.INVALID_PARAMS,
    _E.ECONFIG: ErrorCode.INVALID_PARAMS,
    _E.EBUSY: ErrorCode.INVALID_PARAMS,
    _E.ENET: ErrorCode.RPC_FAIL,
    _E.EPROTO: ErrorCode.RPC_FAIL,
    _E.ETIMEDOUT: ErrorCode.RPC_TIMEOUT,
    _E.EIO: ErrorCode.TRANSFER_FAIL,
    _E.ECORRUPT: ErrorCode.TRANSFER_FAIL,
    _E.EPERM: ErrorCode.ILLEGAL_CLIENT,
    _E.ENOTSUP: ErrorCode.NOT_IMPLEMENTED,
}


def to_mooncake(rc):
    """Mooncake's code for a kvengine return code."""
    return int(_MAP.get(rc, ErrorCode.INTERNAL_ERROR))


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    """Mooncake's per-put replication settings. Accepted for compatibility:
    kvengine replicates by its cluster.replica_num (see the module's top)."""

    def __init__(self, replica_num=1, with_soft_pin=False, with_hard_pin=False,
                 preferred_segment="", preferred_segments=None, prefer_alloc_in_same_node=False,
                 soft_pin_action=SoftPinAction.PRESERVE, soft_pin_ttl_ms=0):
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.with_hard_pin = with_hard_pin
        self.preferred_segment = preferred_segment
        self.preferred_segments = list(preferred_segments or [])
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node
        self.soft_pin_action = soft_pin_action
        self.soft_pin_ttl_ms = soft_pin_ttl_ms

    def __repr__(self):
        return ("ReplicateConfig(replica_num=%d, with_soft_pin=%s, with_hard_pin=%s, "
                "preferred_segment=%r, soft_pin_action=%s)"
                % (self.replica_num, self.with_soft_pin, self.with_hard_pin,
                   self.preferred_segment, SoftPinAction(self.soft_pin_action).name))

    __str__ = __repr__


class BufferHandle(bytearray):
    """What get_buffer returns: the object's bytes (buffer protocol), with
    Mooncake's ptr() and size(). Always true, even for an empty object."""

    def ptr(self):
        return _buffers.span(self, True)[0] if len(self) else 0

    def size(self):
        return len(self)

    def __bool__(self):
        return True


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?(b)?\s*$", re.I)
_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(v):
    """Bytes from an int or a string like "16MB", "16 MB", "1GiB", "512"
    (binary units, as Mooncake reads them). ValueError for anything else,
    e.g. "50%"."""
    if isinstance(v, bool):
        raise ValueError("a size is an int or a string like '16MB', got a bool")
    if isinstance(v, int):
        if v < 0:
            raise ValueError("a size cannot be negative, got %d" % v)
        return v
    if not isinstance(v, str):
        raise ValueError("a size is an int or a string like '16MB', got %s" % type(v).__name__)
    m = _SIZE_RE.match(v)
    if not m:
        raise ValueError("cannot read %r as a size (use bytes or B/KB/MB/GB/TB)" % v)
    n = float(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None]
    return int(n)


def env_settings():
    """The dotted keys of $KVENGINE_SETTINGS ("k=v k2=v2") as a dict."""
    out = {}
    for item in shlex.split(os.environ.get("KVENGINE_SETTINGS", "")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError("KVENGINE_SETTINGS: %r is not KEY=VALUE" % item)
        out[key] = value
    return out


_PORT_LO, _PORT_HI = 12300, 14300


def _pick_port(host):
    """A port in Mooncake's 12300..14300 range that binds now on host."""
    import random
    ports = list(range(_PORT_LO, _PORT_HI + 1))
    random.shuffle(ports)
    for p in ports[:200]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((host, p))
            return p
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
        finally:
            s.close()
    raise OSError(errno.EADDRINUSE, "no free port in %d..%d" % (_PORT_LO, _PORT_HI))


_NOT_SET_UP = int(ErrorCode.INTERNAL_ERROR)
_PAIR = ctypes.sizeof(_lib.kv_pair)
_BAD = int(ErrorCode.INVALID_PARAMS)


class MooncakeDistributedStore:
    """Mooncake's MooncakeDistributedStore, backed by a kvengine engine."""

    def __init__(self):
        self._eng = None
        self._lock = threading.Lock()
        self._keys = set() if _lib.kv_remove_all is None else None
        self._hostname = ""
        self._local_buffer = 0
        self._cluster_settings = None
        self.last_error = ""

    # -- setup / teardown ------------------------------------------------------

    def setup(self, local_hostname, metadata_server=None, global_segment_size=16 << 20,
              local_buffer_size=1 << 30, protocol="tcp", rdma_devices="",
              master_server_addr="", *, kvengine_config=None, kvengine_settings=None):
        """0 on success, else a negative code (self.last_error says why)."""
        if isinstance(local_hostname, dict):
            d = dict(local_hostname)
            try:
                return self.setup(
                    d.get("local_hostname", "localhost"), d.get("metadata_server"),
                    d.get("global_segment_size", 16 << 20), d.get("local_buffer_size", 1 << 30),
                    d.get("protocol", "tcp"), d.get("rdma_devices", d.get("device_name", "")),
                    d.get("master_server_addr", d.get("master_server_address", "")),
                    kvengine_config=d.get("kvengine_config", kvengine_config),
                    kvengine_settings=d.get("kvengine_settings", kvengine_settings))
            except TypeError as exc:
                return self._fail(_BAD, "setup: %s" % exc)
        with self._lock:
            if self._eng is not None:
                return self._fail(_BAD, "setup: the store is already set up; close() it first")
            try:
                seg = parse_size(global_segment_size)
                buf = parse_size(local_buffer_size)
            except ValueError as exc:
                return self._fail(_BAD, "setup: %s" % exc)
            if protocol not in ("tcp", "rdma"):
                return self._fail(_BAD, "setup: protocol is tcp or rdma, got %r" % (protocol,))
            host = str(local_hostname or "localhost")
            port = None
            if host.count(":") == 1:
                host, p = host.split(":")
                try:
                    port = int(p)
                except ValueError:
                    return self._fail(_BAD, "setup: bad port in local_hostname %r"
                                      % local_hostname)
            settings = {"pipeline": "dram", "dram.capacity": str(seg)}
            clustered = bool(master_server_addr)
            if clustered:
                settings.update({"cluster.enabled": "true",
                                 "cluster.master": str(master_server_addr),
                                 "cluster.protocol": protocol})
                if rdma_devices:
                    settings["cluster.device_name"] = str(rdma_devices).split(",")[0].strip()
            try:
                settings.update(env_settings())
            except ValueError as exc:
                return self._fail(_BAD, "setup: %s" % exc)
            if kvengine_settings:
                settings.update(kvengine_settings)
            if kvengine_config is None:
                kvengine_config = os.environ.get("KVENGINE_CONFIG") or None
            tries = 1 if (port is not None or not clustered) else 5
            rc = 0
            for _ in range(tries):
                p = port
                if clustered:
                    if p is None:
                        try:
                            p = _pick_port(host)
                        except OSError as exc:
                            return self._fail(_NOT_SET_UP, "setup: %s" % exc)
                    settings["cluster.listen"] = "%s:%d" % (host, p)
                try:
                    self._eng = _engine.Engine(kvengine_config, settings)
                    break
                except _engine.KvError as exc:
                    rc = exc.code
                    self.last_error = "setup: %s" % exc
                except (TypeError, ValueError) as exc:
                    return self._fail(_BAD, "setup: %s" % exc)
                if rc != _engine.ENET:   # only a port taken meanwhile is worth a retry
                    break
            if self._eng is None:
                log.error("%s", self.last_error)
                return to_mooncake(rc)
            self._hostname = "%s:%d" % (host, p) if clustered else str(local_hostname)
            self._local_buffer = buf
            self._keys = set() if _lib.kv_remove_all is None else None
            self._cluster_settings = settings if clustered else None
            self._config_file = kvengine_config
            self.last_error = ""
            return 0

    def _fail(self, code, msg):
        self.last_error = msg
        log.error("%s", msg)
        return code

    def close(self):
        """Closes the engine (in-process objects go with it); 0."""
        with self._lock:
            eng, self._eng = self._eng, None
        if eng is not None:
            eng.close()
        return 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def health_check(self):
        """0 healthy; 1 not set up (or closed); 2 the kvmaster does not answer."""
        eng = self._eng
        if eng is None or eng.closed:
            return 1
        if self._cluster_settings:
            try:
                _engine.members(self._config_file, self._cluster_settings)
            except _engine.KvError:
                return 2
        return 0

    def get_hostname(self):
        """host:port this member serves on (local_hostname when not clustered)."""
        return self._hostname

    # -- helpers ---------------------------------------------------------------

    def _enter(self):
        eng = self._eng
        if eng is None:
            return None, None
        try:
            return eng, eng._enter()
        except _engine.KvError:
            return None, None

    @staticmethod
    def _key(key):
        if type(key) is str:
            k = key.encode()
        elif type(key) is bytes:
            k = key
        else:
            return None
        return k if 0 < len(k) <= _lib.KV_KEY_MAX else None

    def _put_raw(self, h, k, addr, n):
        rc = _lib.kv_put(h, k, len(k), addr, n)
        if rc == 0 and self._keys is not None:
            self._keys.add(k)
        return rc

    # -- copying calls -----------------------------------------------------------

    def put(self, key, value, config=None):
        return self.put_parts(key, value, config=config)

    def put_parts(self, key, *parts, config=None):
        """Stores the parts back to back as one object; 0 or a negative code."""
        if self._eng is None:
            return _NOT_SET_UP
        k = self._key(key)
        if k is None:
            return _BAD
        try:
            if len(parts) == 1:
                addr, n, pin = _buffers.span(parts[0], False)
            else:
                joined = b"".join(parts)
                addr, n, pin = _buffers.span(joined, False)
        except (TypeError, ValueError, BufferError):
            return _BAD
        if n > self._local_buffer:
            return int(ErrorCode.BUFFER_OVERFLOW)
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            return to_mooncake(self._put_raw(h, k, addr, n))
        finally:
            eng._leave()

    def put_batch(self, keys, values, config=None):
        """0 when every put succeeded, else the first failure's code. One
        kv_put_many: in a cluster one round per owner, not per key."""
        if len(keys) != len(values):
            return _BAD
        if self._eng is None:
            return _NOT_SET_UP
        if _lib.kv_put_many is None:
            for k, v in zip(keys, values):
                rc = self.put(k, v, config)
                if rc:
                    return rc
            return 0
        items = []
        pins = []
        for key, v in zip(keys, values):
            k = self._key(key)
            if k is None:
                return _BAD
            try:
                addr, n, pin = _buffers.span(v, False)
            except (TypeError, ValueError, BufferError):
                return _BAD
            if n > self._local_buffer:
                return int(ErrorCode.BUFFER_OVERFLOW)
            pins.append(pin)
            items.append((k, addr, n))
        if not items:
            return 0
        got = self._many(_lib.kv_put_many, items)
        if got is None:
            return _NOT_SET_UP
        res, _ = got
        first = 0
        for (k, _, _), rc in zip(items, res):
            if rc == 0:
                if self._keys is not None:
                    self._keys.add(k)
            elif not first:
                first = to_mooncake(rc)
        return first

    def get(self, key):
        """The object's bytes; b"" when it is missing (or anything failed)."""
        if self._key(key) is None:
            return b""
        eng = self._eng
        if eng is None:
            return b""
        try:
            v = eng.get(key)
        except (_engine.KvError, TypeError, ValueError):
            return b""
        if v is None or len(v) > self._local_buffer:
            return b""
        return v

    def get_batch(self, keys):
        """[bytes] per key (b"" when missing): the sizes in one kv_get_many,
        then the values in a second."""
        if self._eng is None or _lib.kv_get_many is None:
            return [self.get(k) for k in keys]
        out = [b""] * len(keys)
        ks = [(i, self._key(key)) for i, key in enumerate(keys)]
        ks = [(i, k) for i, k in ks if k is not None]
        if not ks:
            return out
        got = self._many(_lib.kv_get_many, [(k, 0, 0) for _, k in ks])
        if got is None:
            return out
        res, lens = got
        want = []
        for (i, k), rc, n in zip(ks, res, lens):
            if rc == _engine.ENOBUFS and n <= self._local_buffer:
                obj, addr = _engine._new_bytes(n)
                want.append((i, k, obj, addr, n))
        if not want:
            return out
        got = self._many(_lib.kv_get_many, [(k, addr, n) for _, k, _, addr, n in want])
        if got is None:
            return out
        res, lens = got
        for (i, k, obj, _, n), rc, ln in zip(want, res, lens):
            if rc == 0:
                out[i] = obj if ln == n else obj[:ln]
            elif rc == _engine.ENOBUFS:     # it grew in between: read it alone
                out[i] = self.get(keys[i])
        return out

    def get_buffer(self, key):
        """A BufferHandle with the object's bytes, or None when missing."""
        size = self.get_size(key)
        if size < 0 or size > self._local_buffer:
            return None
        for _ in range(8):
            if size == 0:
                return BufferHandle()
            out = BufferHandle(size)
            n = self.get_into(key, out.ptr(), size)
            if n >= 0:
                if n != size:
                    del out[n:]
                return out
            if n != _BAD:      # not a size change between the two calls
                return None
            size = self.get_size(key)
            if size < 0:
                return None
        return None

    def batch_get_buffer(self, keys):
        return [self.get_buffer(k) for k in keys]

    # -- zero-copy calls ---------------------------------------------------------

    def put_from(self, key, buffer_ptr, size, config=None):
        k = self._key(key)
        if k is None or not isinstance(buffer_ptr, int) or not isinstance(size, int) \
                or size < 0 or (size > 0 and buffer_ptr <= 0):
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            return to_mooncake(self._put_raw(h, k, buffer_ptr, size))
        finally:
            eng._leave()

    def get_into(self, key, buffer_ptr, size):
        """Bytes read into [buffer_ptr, buffer_ptr+size), or a negative code
        (INVALID_PARAMS when the object is larger than size)."""
        k = self._key(key)
        if k is None or not isinstance(buffer_ptr, int) or not isinstance(size, int) \
                or size < 0 or (size > 0 and buffer_ptr <= 0):
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        vlen = ctypes.c_size_t()
        try:
            rc = _lib.kv_get(h, k, len(k), buffer_ptr or None, size, ctypes.byref(vlen))
        finally:
            eng._leave()
        return vlen.value if rc == 0 else to_mooncake(rc)

    @staticmethod
    def _ptr_ok(ptr, size):
        return isinstance(ptr, int) and isinstance(size, int) and size >= 0 and \
            (size == 0 or ptr > 0)

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """A code per key; every entry INVALID_PARAMS when the lists differ
        in length. One kv_put_many (one round per owner in a cluster)."""
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n:
            return [_BAD] * n
        if self._eng is None:
            return [_NOT_SET_UP] * n
        if _lib.kv_put_many is None:
            return [self.put_from(keys[i], buffer_ptrs[i], sizes[i], config) for i in range(n)]
        out = [_BAD] * n
        idx = []
        items = []
        for i in range(n):
            k = self._key(keys[i])
            if k is not None and self._ptr_ok(buffer_ptrs[i], sizes[i]):
                idx.append(i)
                items.append((k, buffer_ptrs[i], sizes[i]))
        if items:
            got = self._many(_lib.kv_put_many, items)
            if got is None:
                return [_NOT_SET_UP] * n
            for i, item, rc in zip(idx, items, got[0]):
                out[i] = to_mooncake(rc)
                if rc == 0:
                    if self._keys is not None:
                        self._keys.add(item[0])
        return out

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """Bytes read per key, or a negative code per key. One kv_get_many."""
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n:
            return [_BAD] * n
        if self._eng is None:
            return [_NOT_SET_UP] * n
        if _lib.kv_get_many is None:
            return [self.get_into(keys[i], buffer_ptrs[i], sizes[i]) for i in range(n)]
        out = [_BAD] * n
        idx = []
        items = []
        for i in range(n):
            k = self._key(keys[i])
            if k is not None and self._ptr_ok(buffer_ptrs[i], sizes[i]):
                idx.append(i)
                items.append((k, buffer_ptrs[i], sizes[i]))
        if items:
            got = self._many(_lib.kv_get_many, items)
            if got is None:
                return [_NOT_SET_UP] * n
            for i, rc, ln in zip(idx, got[0], got[1]):
                out[i] = ln if rc == 0 else to_mooncake(rc)
        return out

    def _many(self, fn, items):
        """Runs kv_put_many / kv_get_many / kv_exists_many over items, a list
        of (key bytes, value address, length). (results, lengths after the
        call), or None when the store is not set up. The keys are bytes the
        caller holds, so their addresses stay valid through the call."""
        n = len(items)
        flat = []
        for k, addr, ln in items:
            ka = _buffers.span(k, False)[0]
            flat += (ka, len(k), addr or 0, ln)
        mem = bytearray(_PAIR * n)
        struct.pack_into("=%dQ" % (4 * n), mem, 0, *flat)
        arr = ctypes.c_char.from_buffer(mem)
        res = (ctypes.c_int * n)()
        eng, h = self._enter()
        if h is None:
            return None
        try:
            rc = fn(h, ctypes.addressof(arr), n, res)
        finally:
            eng._leave()
        if rc:
            return [rc] * n, [0] * n
        lens = struct.unpack_from("=%dQ" % (4 * n), mem)[3::4]
        del arr
        return list(res), list(lens)

    def register_buffer(self, buffer_ptr, size):
        if not isinstance(buffer_ptr, int) or not isinstance(size, int) \
                or buffer_ptr <= 0 or size <= 0:
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            return to_mooncake(_lib.kv_register_buffer(h, buffer_ptr, size))
        finally:
            eng._leave()

    def unregister_buffer(self, buffer_ptr):
        if not isinstance(buffer_ptr, int) or buffer_ptr <= 0:
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            return to_mooncake(_lib.kv_unregister_buffer(h, buffer_ptr))
        finally:
            eng._leave()

    # -- existence, size, removal --------------------------------------------------

    def is_exist(self, key):
        """1 present, 0 absent, -1 error."""
        k = self._key(key)
        eng, h = self._enter() if k is not None else (None, None)
        if h is None:
            return -1
        try:
            rc = _lib.kv_exists(h, k, len(k))
        finally:
            eng._leave()
        return rc if rc in (0, 1) else -1

    def batch_is_exist(self, keys):
        """1/0/-1 per key, from one kv_exists_many."""
        if self._eng is None or _lib.kv_exists_many is None:
            return [self.is_exist(k) for k in keys]
        out = [-1] * len(keys)
        ks = [(i, self._key(key)) for i, key in enumerate(keys)]
        ks = [(i, k) for i, k in ks if k is not None]
        if ks:
            got = self._many(_lib.kv_exists_many, [(k, 0, 0) for _, k in ks])
            if got is not None:
                for (i, _), rc in zip(ks, got[0]):
                    out[i] = rc if rc in (0, 1) else -1
        return out

    def get_size(self, key):
        """The object's size in bytes, or a negative code."""
        k = self._key(key)
        if k is None:
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        vlen = ctypes.c_size_t()
        try:
            rc = _lib.kv_get(h, k, len(k), None, 0, ctypes.byref(vlen))
        finally:
            eng._leave()
        if rc in (0, _engine.ENOBUFS):
            return vlen.value
        return to_mooncake(rc)

    def remove(self, key, force=False):
        """0, or OBJECT_NOT_FOUND (-704) when the object is not there."""
        k = self._key(key)
        if k is None:
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            rc = _lib.kv_remove(h, k, len(k))
        finally:
            eng._leave()
        if rc in (0, _engine.ENOTFOUND) and self._keys is not None:
            self._keys.discard(k)
        return to_mooncake(rc)

    def batch_remove(self, keys, force=False):
        return [self.remove(k, force) for k in keys]

    def remove_all(self):
        """Removes every object in the store (in a cluster, on every owner,
        whoever put it: kv_remove_all); returns how many were removed, or -1
        when the store is not set up or an owner could not be reached."""
        if self._eng is None:
            return -1
        if self._keys is None:
            try:
                return self._eng.remove_all()
            except _engine.KvError:
                return -1
        count = 0   # an older library: the objects this store put
        for k in list(self._keys):
            rc = self.remove(k)
            if rc == 0:
                count += 1
            elif rc != ErrorCode.OBJECT_NOT_FOUND:
                return -1
        return count
