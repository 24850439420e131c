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
  succeeds too), so the upsert family is the put family. ReplicateConfig
  is checked as Mooncake's C++ checks it; replication is the engine's
  cluster.replica_num, so replica counts and preferred segments of one
  call are unused. Reads lease an object (DEFAULT_KV_LEASE_TTL ms) and soft
  pins keep one for their TTL; remove refuses a leased object (-706) unless
  forced. Leases and pins are kept in the store (see "Leases" below), so
  every process that opens it sees them.
- The rest of setup's arguments: engine (a TransferEngine) is unused,
  enable_ssd_offload opens the SSD tier at ssd_offload_path, tenant_id
  prefixes keys (none for "default"), enable_client_http_server serves
  kvengine's /metrics and /health on client_http_port; a port in
  local_hostname is the member's name, never bound. setup_dummy opens the
  host's store named after its server_address (store.name).
- Return conventions are Mooncake's: 0 or a negative code, bytes read for
  get_into, b"" from get when the object is missing, 1/0/-1 from is_exist.
  Codes are Mooncake's numbers (ErrorCode below) mapped from kvengine's:
  OBJECT_NOT_FOUND -704, NO_AVAILABLE_HANDLE -200 (no room), INVALID_PARAMS
  -600 (bad arguments, a buffer too small), BUFFER_OVERFLOW -10 (a value
  larger than local_buffer_size), RPC_FAIL -900 / RPC_TIMEOUT -901 (the
  network), INTERNAL_ERROR -1 (anything else, and a store not set up).
- remove_all in the default tenant removes every object in the store,
  whoever put it (kv_remove_all: every owner drops its plain keys; blocks
  stay); a tenant's removes every object of the tenant, whoever put it
  (kv_remove_prefix of the tenant's prefix).

Key design choice: nothing here raises on a failed store operation (only
on a call that cannot be made at all, like a missing argument): a caller
written for Mooncake tests return codes.
"""

import array
import ctypes
import enum
import errno
import hashlib
import logging
import os
import re
import shlex
import socket
import struct
import threading
import time

from . import _buffers
from . import _lib
from . import engine as _engine
from . import mooncake_tensor as _tensor
from .mooncake_pool import (BufferLease, BufferLeaseView, BufferPool,  # noqa: F401
                            RegisteredBufferLease, RegisteredBufferLeaseView,
                            RegisteredBufferPool)

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
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    NOT_SUPPORTED = -1012


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


class TaskType(enum.IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(enum.IntEnum):
    PENDING = 0
    PROCESSING = 1
    SUCCESS = 2
    FAILED = 3


class QueryTaskResponse:
    """Mooncake's answer to query_task. Nothing makes one here: copy and
    move tasks raise NotImplementedError (kvengine places objects itself),
    and the type exists so that code importing it loads."""

    def __init__(self):
        self.id = ""
        self.type = TaskType.REPLICA_COPY
        self.status = TaskStatus.PENDING
        self.created_at_ms_epoch = 0
        self.last_updated_at_ms_epoch = 0
        self.assigned_client = ""
        self.message = ""

    def __repr__(self):
        return "QueryTaskResponse(id=%s, type=%d, status=%d)" % (self.id, self.type, self.status)


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


_U64_MAX = (1 << 64) - 1


def _check_u64(name, v, optional=False):
    """Mooncake's fields are C++ integers: pybind11 refuses anything that
    does not fit with TypeError, and so does this."""
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U64_MAX:
        raise TypeError("ReplicateConfig.%s: incompatible value %r (an int in 0..2**64-1%s)"
                        % (name, v, " or None" if optional else ""))
    return v


class ReplicateConfig:
    """Mooncake's per-put replication settings.

    Mapped here: with_soft_pin / soft_pin_ttl_ms (a soft pin is kept as a
    lease of soft_pin_ttl_ms, Mooncake's 30 minutes when None, during which
    remove() refuses the object with OBJECT_HAS_LEASE unless forced);
    group_ids (checked: one per key in a batch). Accepted and not used,
    because kvengine places objects by rendezvous hashing over
    cluster.replica_num owners: replica_num, nof_replica_num,
    dfs_replica_num, with_hard_pin, preferred_segment(s),
    preferred_nof_segments, prefer_alloc_in_same_node, data_type."""

    __slots__ = ("replica_num", "nof_replica_num", "dfs_replica_num", "with_soft_pin",
                 "with_hard_pin", "preferred_segment", "preferred_segments",
                 "preferred_nof_segments", "prefer_alloc_in_same_node", "soft_pin_action",
                 "_soft_pin_ttl_ms", "data_type", "_group_ids")

    def __init__(self, replica_num=1, with_soft_pin=False, with_hard_pin=False,
                 preferred_segment="", preferred_segments=None, prefer_alloc_in_same_node=False,
                 soft_pin_action=SoftPinAction.PRESERVE, soft_pin_ttl_ms=None,
                 nof_replica_num=0, dfs_replica_num=0, preferred_nof_segments=None,
                 data_type=0, group_ids=None):
        self.replica_num = replica_num
        self.nof_replica_num = nof_replica_num
        self.dfs_replica_num = dfs_replica_num
        self.with_soft_pin = with_soft_pin
        self.with_hard_pin = with_hard_pin
        self.preferred_segment = preferred_segment
        self.preferred_segments = list(preferred_segments or [])
        self.preferred_nof_segments = list(preferred_nof_segments or [])
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node
        self.soft_pin_action = soft_pin_action
        self.soft_pin_ttl_ms = soft_pin_ttl_ms
        self.data_type = data_type
        self.group_ids = group_ids

    @property
    def soft_pin_ttl_ms(self):
        """None (the default: Mooncake's master default applies) or ms."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, v):
        self._soft_pin_ttl_ms = _check_u64("soft_pin_ttl_ms", v, optional=True)

    @property
    def group_ids(self):
        return self._group_ids

    @group_ids.setter
    def group_ids(self, v):
        if v is not None:
            if isinstance(v, (str, bytes)) or not all(isinstance(x, str) for x in v):
                raise TypeError("ReplicateConfig.group_ids: a list of str or None, got %r" % (v,))
            v = list(v)
        self._group_ids = v

    def __repr__(self):
        return ("ReplicateConfig(replica_num=%s, with_soft_pin=%s, with_hard_pin=%s, "
                "preferred_segment=%r, soft_pin_action=%s, soft_pin_ttl_ms=%s, group_ids=%r)"
                % (self.replica_num, self.with_soft_pin, self.with_hard_pin,
                   self.preferred_segment, SoftPinAction(self.soft_pin_action).name,
                   self.soft_pin_ttl_ms, self.group_ids))

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


def _addr_key(addr):
    """host:port with the host resolved, so that a segment named
    localhost:p and a member registered as 127.0.0.1:p compare equal."""
    host, sep, port = str(addr).rpartition(":")
    if not sep:
        return str(addr)
    try:
        host = socket.gethostbyname(host)
    except (OSError, UnicodeError):
        pass
    return "%s:%s" % (host, port)


def _is_u64(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _U64_MAX


def _env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _flag(v):
    """A bool from Mooncake's dict form, where values may be strings."""
    if isinstance(v, str):
        if v.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if v.strip().lower() in ("", "0", "false", "no", "off"):
            return False
        raise ValueError("not a boolean: %r" % v)
    return bool(v)


def _tenant_prefix(tenant_id):
    """The key prefix of a tenant: none for Mooncake's "default" tenant (so
    those objects are the same as an untenanted store's), else NUL, the
    name, NUL: no tenant's key can spell another's, since a tenant name
    may not hold a NUL."""
    if tenant_id is None or tenant_id in ("", "default"):
        return b""
    if not isinstance(tenant_id, str):
        raise TypeError("tenant_id is a str, got %s" % type(tenant_id).__name__)
    if "\0" in tenant_id:
        raise ValueError("tenant_id must not contain NUL")
    t = tenant_id.encode()
    if len(t) > 64:
        raise ValueError("tenant_id is at most 64 bytes, got %d" % len(t))
    return b"\0" + t + b"\0"


# Mooncake's FileStorage directory when neither ssd_offload_path nor
# $MOONCAKE_OFFLOAD_FILE_STORAGE_PATH names one (it must exist there too).
_OFFLOAD_DEFAULT = "/data/file_storage"

# A read lease's expiry is rounded down to this. A remove asks for every
# bucket of its horizon (5 s or the TTL): at 20 ms that was 252 records, and
# in a cluster the lookup and its packing took ~200 us of a remove that
# Mooncake's master answers in one RPC; at 100 ms it is 52. The cost: a
# lease may end up to 100 ms before Mooncake's would (never after).
_LEASE_MS = 100
_PIN_NS = b"\0\0mc-pin\0"   # no tenant prefix or user key starts with two NULs
_LEASE_NS = b"\0\0mc-ls\0"   # a read lease's plain key: this, then two words (8 bytes, one word)
_LEASE_NS_WORD = struct.unpack("=Q", _LEASE_NS)[0]


def _now_ms():
    return int(time.time() * 1000)


_M64 = (1 << 64) - 1
_WORDS = struct.Struct("=QQ")
# Copied, not built, per key: building a personalized blake2b costs about
# twice what copying a built one does, and a fresh read hashes every key.
_LEASE_HASH = hashlib.blake2b(digest_size=16, person=b"mooncake-lease")


def _lease_hi(k):
    """The first word of every lease record of engine key k; the second is
    the lease's bucket. One hash per key, not per bucket: a remove asks for
    every bucket of the lease horizon (~250 records), and hashing each was
    ~250 us of Python per remove. Two keys' records meet only when their
    first words do (a 64-bit collision)."""
    h = _LEASE_HASH.copy()
    h.update(k)
    return _WORDS.unpack(h.digest())[0]


# Bucket numbers around now as native words, so that a horizon's records
# are two array slice assignments (building 250 words from ints each time
# cost more than the lookup): (first bucket, array), replaced whole as time
# moves on.
_BUCKET_SPAN = 1 << 14
_buckets = (0, array.array("Q"))


def _bucket_words(b0, b1):
    global _buckets
    first, words = _buckets
    if b0 < first or b1 > first + len(words):
        first = b0
        words = array.array("Q", range(b0, b0 + max(_BUCKET_SPAN, b1 - b0)))
        _buckets = (first, words)
    return words[b0 - first:b1 - first]


# A read's lease records are written into one buffer per thread, made
# once: NS words in place, and a kv_pair array that already points at each
# record and at the shared value word, so a read fills in only the hashes,
# the bucket and the expiry. Building the two arrays per read (a flat list
# of 13 words, then one of 16) was ~3 of the ~7 us a fresh read's leases
# cost (4 keys, bench/mooncake_readcost.py). A batch of more keys than
# _LEASE_CAP builds its arrays as before.
_LEASE_CAP = 64
_lease_tls = threading.local()


def _lease_buf():
    """This thread's (rec, pairs address, res, res address)."""
    b = getattr(_lease_tls, "b", None)
    if b is None:
        cap = _LEASE_CAP
        rec = array.array("Q", bytes(8 * (3 * cap + 1)))
        rec[0:3 * cap:3] = array.array("Q", [_LEASE_NS_WORD]) * cap
        base = rec.buffer_info()[0]
        pairs = array.array("Q", bytes(32 * cap))
        pairs[0::4] = array.array("Q", range(base, base + 24 * cap, 24))
        pairs[1::4] = array.array("Q", [24]) * cap
        pairs[2::4] = array.array("Q", [base + 24 * cap]) * cap
        pairs[3::4] = array.array("Q", [8]) * cap
        res = array.array("i", bytes(4 * cap))
        b = _lease_tls.b = (rec, pairs, pairs.buffer_info()[0], res, res.buffer_info()[0])
    return b


def _lease_records(hi, b0, b1):
    """The lease records of one key (first word hi) at buckets b0..b1-1:
    their keys (_LEASE_NS, hi, bucket: 24 bytes each) back to back in one
    array, and the kv_pair array naming them (no values)."""
    m = b1 - b0
    rec = array.array("Q", bytes(24 * m))
    rec[0::3] = array.array("Q", [_LEASE_NS_WORD]) * m
    rec[1::3] = array.array("Q", [hi]) * m
    rec[2::3] = _bucket_words(b0, b1)
    base = rec.buffer_info()[0]
    pairs = array.array("Q", bytes(32 * m))
    pairs[0::4] = array.array("Q", range(base, base + 24 * m, 24))
    pairs[1::4] = array.array("Q", [24]) * m
    return rec, pairs


def _pin_key(k, prefix=b""):
    """The plain key of engine key k's soft pin: under its tenant's prefix
    (so that the tenant's kv_remove_prefix takes it too), then _PIN_NS,
    which no key of the tenant can start with (a tenant's user keys start
    with a byte other than NUL, and a tenant's name holds no NUL)."""
    return prefix + _PIN_NS + hashlib.blake2b(k, digest_size=16, person=b"mooncake-pin").digest()


# ECMAScript's syntax characters: outside them a pattern character is itself.
_RE_SYNTAX = frozenset("^$\\.*+?()[]{}|")


def _regex_prefix(pattern):
    """The key prefix (UTF-8 bytes) that a remove_by_regex pattern selects
    exactly, or None when it is not one: "^", then characters that are not
    syntax characters or are escaped ("\\" and a character that is not a
    letter, digit or "_": ECMAScript's identity escapes), then nothing,
    ".*" or ".*$"."""
    if isinstance(pattern, bytes):
        try:
            pattern = pattern.decode()
        except UnicodeDecodeError:
            return None
    if not isinstance(pattern, str) or not pattern.startswith("^"):
        return None
    body = pattern[1:]
    for tail in (".*$", ".*"):
        if body.endswith(tail) and not _escaped_end(body, len(body) - len(tail)):
            body = body[:-len(tail)]
            break
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 == len(body):
                return None
            c = body[i + 1]
            if c.isalnum() or c == "_" or not c.isascii():
                return None       # a class (\d, \w), an assertion, a number escape
            i += 2
        elif c in _RE_SYNTAX:
            return None
        else:
            i += 1
        out.append(c)
    return "".join(out).encode()


def _escaped_end(s, n):
    """True when s[:n] ends in an odd number of backslashes (so s[n] is
    escaped)."""
    k = 0
    while n - k - 1 >= 0 and s[n - k - 1] == "\\":
        k += 1
    return k % 2 == 1


_NOT_SET_UP = int(ErrorCode.INTERNAL_ERROR)
_PRUNE_AT = 65536
# get / get_batch read straight into bytes of the last size seen up to this
# (a wrong guess above it would allocate, and for get_batch zero-fill
# nothing but still map, a large buffer per key for nothing).
_HINT_MAX = 16 << 20
_PAIR = ctypes.sizeof(_lib.kv_pair)
_PAIR_WORDS = struct.Struct("=4Q")   # a kv_pair: key, klen, val, len
assert _PAIR_WORDS.size == _PAIR
_BAD = int(ErrorCode.INVALID_PARAMS)


class MooncakeDistributedStore(_tensor.TensorCalls, _tensor.ParallelismCalls,
                               _tensor.SafetensorCalls):
    """Mooncake's MooncakeDistributedStore, backed by a kvengine engine."""

    def __init__(self):
        self._eng = None
        self._lock = threading.Lock()
        self._keys = set() if _lib.kv_remove_prefix is None else None
        self._hostname = ""
        self._local_buffer = 0
        self._cluster_settings = None
        self._prefix = b""
        self._leases = {}
        self._wrote = {}         # key -> expiry of the read lease this process stored last
        self._pins = {}          # key -> expiry of the soft pins this process stored
        # The lease copies are pruned of expired entries when they pass
        # these sizes, then set to twice what is left: with a fixed bound,
        # more live leases than it (65536 keys read within the TTL) rebuilt
        # the whole dict on every read (two thirds of a read's CPU).
        self._leases_max = self._wrote_max = _PRUNE_AT
        self._block_shards = 1
        self._llock = threading.Lock()
        self._regs = {}          # registered buffers: address -> size (get_into_ranges)
        # The size of the objects read last when a whole batch had one size
        # (0 when not): get and get_batch read straight into bytes of that
        # size, one kv_get_many instead of a size query and then the read.
        self._size_hint = 0
        self.dummy = False
        # Mooncake's master grants a read lease of default_kv_lease_ttl
        # (5 s); its tests read the same DEFAULT_KV_LEASE_TTL to know it.
        self.kv_lease_ttl_ms = _env_int("DEFAULT_KV_LEASE_TTL", 5000)
        self.kv_soft_pin_ttl_ms = _env_int("DEFAULT_KV_SOFT_PIN_TTL", 30 * 60 * 1000)
        self.last_error = ""

    # -- setup / teardown ------------------------------------------------------

    def setup(self, local_hostname, metadata_server=None, global_segment_size=16 << 20,
              local_buffer_size=1 << 30, protocol="tcp", rdma_devices="",
              master_server_addr="", engine=None, enable_ssd_offload=False,
              ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
              client_http_port=9300, *, kvengine_config=None, kvengine_settings=None):
        """Mooncake's setup, positionally or by keyword, or setup(dict) with
        the same keys (values may be strings, as Mooncake's dict form takes
        them). 0 on success, else a negative code (self.last_error says why).
        See the module's top for what each argument means here."""
        if isinstance(local_hostname, dict):
            d = dict(local_hostname)
            try:
                return self.setup(
                    d.get("local_hostname", "localhost"), d.get("metadata_server"),
                    d.get("global_segment_size", 16 << 20), d.get("local_buffer_size", 1 << 30),
                    d.get("protocol", "tcp"), d.get("rdma_devices", d.get("device_name", "")),
                    d.get("master_server_addr", d.get("master_server_address", "")),
                    d.get("engine"), _flag(d.get("enable_ssd_offload", False)),
                    d.get("ssd_offload_path", ""), d.get("tenant_id", "default"),
                    _flag(d.get("enable_client_http_server", False)),
                    int(d.get("client_http_port", 9300)),
                    kvengine_config=d.get("kvengine_config", kvengine_config),
                    kvengine_settings=d.get("kvengine_settings", kvengine_settings))
            except (TypeError, ValueError) as exc:
                return self._fail(_BAD, "setup: %s" % exc)
        with self._lock:
            if self._eng is not None:
                return self._fail(_BAD, "setup: the store is already set up; close() it first")
            try:
                seg = parse_size(global_segment_size)
                buf = parse_size(local_buffer_size)
                _buffers.check_u64("global_segment_size", seg)
                _buffers.check_u64("local_buffer_size", buf)
                prefix = _tenant_prefix(tenant_id)
            except (ValueError, TypeError) as exc:
                return self._fail(_BAD, "setup: %s" % exc)
            if protocol not in ("tcp", "rdma"):
                return self._fail(_BAD, "setup: protocol is tcp or rdma, got %r" % (protocol,))
            if engine is not None:
                # A Mooncake TransferEngine moves Mooncake's bytes; kvengine
                # has its own transports (cluster.protocol), so it is unused.
                log.warning("setup: the TransferEngine passed as engine= is not used: kvengine "
                            "moves data over its own transport (cluster.protocol)")
            host = str(local_hostname or "localhost")
            named_port = None
            if host.count(":") == 1:
                host, p = host.split(":")
                try:
                    named_port = int(p)
                except ValueError:
                    return self._fail(_BAD, "setup: bad port in local_hostname %r"
                                      % local_hostname)
            settings = {"pipeline": "dram", "dram.capacity": str(seg)}
            if enable_ssd_offload:
                path = ssd_offload_path or os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "")
                if not path and os.path.isdir(_OFFLOAD_DEFAULT):
                    path = _OFFLOAD_DEFAULT      # Mooncake's FileStorage default
                if not path:
                    return self._fail(_BAD, "setup: enable_ssd_offload needs ssd_offload_path "
                                      "(or $MOONCAKE_OFFLOAD_FILE_STORAGE_PATH, or Mooncake's "
                                      "default directory %s to exist)" % _OFFLOAD_DEFAULT)
                settings.update({"pipeline": "dram|ssd", "ssd.path": str(path)})
            if enable_client_http_server:
                # Mooncake's client HTTP server serves its metrics; kvengine's
                # metrics endpoint serves /metrics and /health.
                settings["metrics.listen"] = "%s:%d" % (host, int(client_http_port))
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
            rc = self._open(kvengine_config, settings, host, clustered)
            if rc:
                return rc
            # A port in local_hostname names this member, as Mooncake's
            # segment name; the port served on is picked, so two stores
            # named alike on one host do not collide.
            if named_port is not None or not clustered:
                self._hostname = str(local_hostname)
            self._local_buffer = buf
            self._size_hint = 0
            self._prefix = prefix
            # remove_all is kv_remove_prefix of the tenant's prefix; a
            # library without it leaves the keys this store put to be
            # tracked here (see remove_all).
            self._keys = set() if _lib.kv_remove_prefix is None else None
            self._cluster_settings = settings if clustered else None
            self._config_file = kvengine_config
            self.last_error = ""
            return 0

    def _open(self, config_file, settings, host, clustered):
        """Opens the engine (picking a port to serve on in a cluster, with
        retries when one is taken meanwhile); 0 or a Mooncake code."""
        rc = 0
        picked = False
        for _ in range(5 if clustered else 1):
            if clustered and "cluster.listen" not in settings:
                try:
                    p = _pick_port(host)
                except OSError as exc:
                    return self._fail(_NOT_SET_UP, "setup: %s" % exc)
                settings["cluster.listen"] = "%s:%d" % (host, p)
                picked = True
            try:
                self._block_shards = max(1, int(settings.get("store.block_shards", 1)))
            except ValueError:
                return self._fail(_BAD, "setup: store.block_shards is a positive integer")
            try:
                self._eng = _engine.Engine(config_file, settings)
                self._hostname = settings.get("cluster.listen", host) if clustered else host
                return 0
            except _engine.KvError as exc:
                rc = self._open_rc = exc.code
                self.last_error = "setup: %s" % exc
            except (TypeError, ValueError) as exc:
                return self._fail(_BAD, "setup: %s" % exc)
            if rc != _engine.ENET or not picked:   # only a port taken meanwhile is worth a retry
                break
            settings.pop("cluster.listen", None)
        log.error("%s", self.last_error)
        return to_mooncake(rc)

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Mooncake's dummy client: a process that reaches a real client's
        store on this host (server_address names it) instead of holding
        one. Here that is kvengine's one store per host: the store is
        named after server_address (store.name), and every process that
        opens that name shares one store; the first serves it.
        mem_pool_size is the DRAM the store has when this process is the
        first. 0 or a negative code."""
        try:
            pool = parse_size(mem_pool_size)
            buf = parse_size(local_buffer_size)
        except ValueError as exc:
            return self._fail(_BAD, "setup_dummy: %s" % exc)
        if not isinstance(server_address, str) or not server_address or "\0" in server_address:
            return self._fail(_BAD, "setup_dummy: server_address is host:port, got %r"
                              % (server_address,))
        name = "mooncake-" + re.sub(r"[^A-Za-z0-9_.-]", "-", server_address)[:54]
        with self._lock:
            if self._eng is not None:
                return self._fail(_BAD, "setup_dummy: the store is already set up")
            settings = {"pipeline": "dram", "dram.capacity": str(pool), "store.name": name}
            try:
                settings.update(env_settings())
            except ValueError as exc:
                return self._fail(_BAD, "setup_dummy: %s" % exc)
            # Another process may be opening the store right now (faulting
            # in a large pool takes seconds): kv_open waits io.timeout_ms or
            # 5 s for it, then says EBUSY; a dummy client started next to
            # its peers keeps asking, up to a minute, as long as it is so.
            deadline = time.monotonic() + 60
            self._open_rc = 0
            while True:
                rc = self._open(os.environ.get("KVENGINE_CONFIG") or None, settings,
                                "localhost", False)
                if not rc or self._open_rc != _engine.EBUSY or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if rc:
                return rc
            self._hostname = server_address
            self._local_buffer = buf
            self._size_hint = 0
            self._cluster_settings = None
            self._config_file = None
            self.dummy = True
            return 0

    def _fail(self, code, msg):
        self.last_error = msg
        log.error("%s", msg)
        return code

    def close(self):
        """Closes the engine (in-process objects go with it); 0."""
        for pool, region in getattr(self, "_mem_regions", ()):
            pool._free(region)
        self._mem_regions = []
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

    def _key(self, key):
        """The engine's key for a Mooncake key (the tenant's prefix, then the
        key's UTF-8), or None for a key that is not one."""
        if type(key) is str:
            if "\0" in key:
                return None
            k = key.encode()
        elif type(key) is bytes:
            k = key
        else:
            return None
        if not k or k[0] == 0:    # a leading NUL is the store's own namespaces'
            return None
        k = self._prefix + k
        return k if len(k) <= _lib.KV_KEY_MAX else None

    def _put_raw(self, h, k, addr, n):
        rc = _lib.kv_put(h, k, len(k), addr, n)
        if rc == 0:
            if self._keys is not None:
                self._keys.add(k)
        return rc

    # Leases: Mooncake's master leases an object for default_kv_lease_ttl
    # to every reader (not its writer: a put grants none, so a remove right
    # after a put succeeds, as Mooncake's own benchmark's remove_perf
    # expects, and as real Mooncake 3b5a594 answers), and a soft pin keeps it for
    # its TTL; remove() and batch_replica_clear() refuse an object under
    # lease (OBJECT_HAS_LEASE) unless forced. kvengine's plain keys have no
    # leases, so they are kept in the store itself, where every process
    # (and every attached host-store client) that opens it sees them:
    #
    # - A read lease is a plain key (_LEASE_NS, then a hash of the object's
    #   key and the lease's expiry rounded down to _LEASE_MS, as two words)
    #   holding that expiry; the read that takes it stores it with one
    #   kv_put_many, on the reader's thread, before it returns. (They were
    #   blocks, stored by kv_dump + kv_wait: that task woke a pool worker
    #   and kept one on standby, about one context switch per read on a
    #   busy host, which cost Mooncake's benchmark's verify_read a third of
    #   its speed.) A record is never rewritten, so renewing writes the next
    #   one; a remove asks kv_exists_many, in one call, for the records of
    #   every expiry between now and the lease horizon. No tenant prefix or
    #   user key starts with two NULs, so no tenant's remove_all reaches
    #   them, and the default tenant's drops them first, uncounted; an
    #   expired one is simply never asked for again and is evicted as the
    #   coldest data (bounded by the tiers, never cleaned key by key). A
    #   process renews an object's lease only when the one it wrote last has
    #   less than 3/4 of the TTL left: at most one record per object per
    #   TTL/4 of reads.
    # - A soft pin is a plain key (_PIN_NS + a hash of the object's key)
    #   holding its expiry: pins are rare and must also be dropped early
    #   (soft_pin_action DISABLE, remove), which a block cannot be. It goes
    #   with the object's remove; an expired one is removed when met.
    # - A copy of every lease and pin is kept in this process too (the fast
    #   answer for its own removes). A store nobody else can reach (no host
    #   store: neither store.name nor an SSD tier; no cluster: the drop-in's
    #   embedded default, Engine.shared false) keeps its read leases only
    #   here: no record is written, and a remove asks the store for the pin
    #   alone. Nothing else could have read them, and a fresh read's
    #   records were a seventh of its CPU (bench/mooncake_readcost.py).
    # Expiries are wall-clock milliseconds, so processes on one host agree;
    # across hosts they are as good as the hosts' clock sync.

    def _lease(self, k, ttl_ms=None):
        """This process's copy of a lease on k."""
        ttl = self.kv_lease_ttl_ms if ttl_ms is None else ttl_ms
        if ttl <= 0:
            return
        until = time.monotonic() + ttl / 1000.0
        with self._llock:
            if self._leases.get(k, 0) < until:
                self._leases[k] = until
            if len(self._leases) > self._leases_max:
                now = time.monotonic()
                self._leases = {x: t for x, t in self._leases.items() if t > now}
                self._leases_max = max(_PRUNE_AT, 2 * len(self._leases))

    def _share_leases(self, ks, h=None):
        """Read leases on the objects ks, in the store (one kv_put_many of the
        lease records not already fresh) and here. h: the engine's handle
        when the caller holds it (entered) already."""
        ttl = self.kv_lease_ttl_ms
        eng = self._eng
        if ttl <= 0 or not ks or eng is None:
            return
        now = _now_ms()
        # Rounded down, so a lease never outlives Mooncake's (a caller that
        # sleeps the TTL and then removes succeeds), but past the next step.
        bucket = max((now + ttl) // _LEASE_MS, now // _LEASE_MS + 1)
        fresh = now + ttl * 3 // 4
        fresh_ks = []
        until = time.monotonic() + ttl / 1000.0
        expiry = bucket * _LEASE_MS
        shared = eng.shared     # else this process's copy is the whole lease
        with self._llock:
            wrote = self._wrote
            leases = self._leases
            for k in ks:
                if leases.get(k, 0) < until:
                    leases[k] = until
                if not shared or wrote.get(k, 0) >= fresh:
                    continue
                wrote[k] = expiry
                fresh_ks.append(k)
            if len(wrote) > self._wrote_max:
                self._wrote = {x: t for x, t in wrote.items() if t > now}
                self._wrote_max = max(_PRUNE_AT, 2 * len(self._wrote))
            if len(leases) > self._leases_max:
                m = time.monotonic()
                self._leases = {x: t for x, t in leases.items() if t > m}
                self._leases_max = max(_PRUNE_AT, 2 * len(self._leases))
        if not fresh_ks:
            return
        # One array: the records' keys (3 words each), then the value (the
        # expiry) that every record shares; the pairs point into it.
        n = len(fresh_ks)
        if n <= _LEASE_CAP:
            rec, pairs, pa, res, ra = _lease_buf()
            # _lease_hi of each key, inline: the digests' first words.
            cp = _LEASE_HASH.copy
            ds = []
            for k in fresh_ks:
                x = cp()
                x.update(k)
                ds.append(x.digest())
            rec[1:3 * n:3] = array.array("Q", b"".join(ds))[::2]
            rec[2:3 * n:3] = array.array("Q", (bucket,)) * n
            rec[3 * _LEASE_CAP] = expiry
            base = rec.buffer_info()[0]
        else:
            rec = array.array("Q", [w for k in fresh_ks for w in (_LEASE_NS_WORD, _lease_hi(k), bucket)])
            rec.append(expiry)
            base = rec.buffer_info()[0]
            val = base + 24 * n
            pairs = array.array("Q", [w for i in range(n) for w in (base + 24 * i, 24, val, 8)])
            res = array.array("i", bytes(4 * n))
            pa, ra = pairs.buffer_info()[0], res.buffer_info()[0]
        eng2 = None
        if h is None:
            eng2, h = self._enter()
            if h is None:
                return
        try:
            if _lib.kv_put_many is not None:
                rc = _lib.kv_put_many(h, pa, n, ra)
            else:   # pragma: no cover - an older library
                for i in range(n):
                    res[i] = _lib.kv_put(h, base + 24 * i, 24, pairs[4 * i + 2], 8)
                rc = 0
        finally:
            if eng2 is not None:
                eng2._leave()
        if not rc and any(res[:n]):
            rc = next(r for r in res[:n] if r)
        if rc:                 # a cache may refuse (ENOSPC): the lease is lost
            log.debug("read lease not stored: %s", _engine.KvError(rc, "kv_put_many"))

    def _leases_in_store(self, k):
        """True while any process holds a read lease or a soft pin on k."""
        return self._store_lease_state(k)[0]

    def _store_lease_state(self, k):
        """(held, no_pin): held while any process holds a read lease or a
        soft pin on k; no_pin when k has no pin record in the store now (none
        was found, or an expired one was removed), so that a remove need
        not remove it again. One kv_exists_many asks for the lease records
        of the horizon and the pin record together (in a cluster one round
        per owner; the pin, which is rare, is read only when it is there)."""
        eng = self._eng
        if eng is None:
            return False, False
        now = _now_ms()
        horizon = max(self.kv_lease_ttl_ms, 5000)
        if eng.shared:
            rec, pairs = _lease_records(_lease_hi(k), now // _LEASE_MS + 1,
                                        (now + horizon) // _LEASE_MS + 2)
        else:   # no read lease is stored (_share_leases): the pin alone
            rec, pairs = None, array.array("Q")
        pk = _pin_key(k, self._prefix)
        pairs.extend((id(pk) + _buffers.BYTES_OFFSET if _buffers.BYTES_OFFSET is not None
                      else ctypes.cast(ctypes.c_char_p(pk), ctypes.c_void_p).value, len(pk), 0, 0))
        m = len(pairs) >> 2
        res = array.array("i", bytes(4 * m))
        eng2, h = self._enter()
        if h is None:
            return False, False
        try:
            if _lib.kv_exists_many is not None:
                rc = _lib.kv_exists_many(h, pairs.buffer_info()[0], m, res.buffer_info()[0])
            else:   # pragma: no cover - an older library
                for i in range(m - 1):
                    res[i] = _lib.kv_exists(h, pairs[4 * i], 24)
                res[m - 1] = _lib.kv_exists(h, pk, len(pk))
                rc = 0
            if rc == 0 and 1 in res[:m - 1]:
                return True, False
            if rc == 0 and res[m - 1] == 0:
                return False, True
            buf = ctypes.create_string_buffer(8)
            vlen = ctypes.c_size_t()
            rc = _lib.kv_get(h, pk, len(pk), buf, 8, ctypes.byref(vlen))
            if rc != 0 or vlen.value != 8:
                return False, False
            if struct.unpack("<Q", buf.raw)[0] > now:
                return True, False
            # an expired pin goes when met
            return False, _lib.kv_remove(h, pk, len(pk)) in (0, _engine.ENOTFOUND)
        finally:
            eng2._leave()           # (rec, the keys pairs points into, lives to here)

    def _leased(self, k):
        return self._lease_check(k)[0]

    def _lease_check(self, k):
        """(held, no_pin), as _store_lease_state; a lease of this process's
        own is held without asking the store."""
        with self._llock:
            t = self._leases.get(k)
            if t is not None:
                if t > time.monotonic():
                    return True, False
                del self._leases[k]
        return self._store_lease_state(k)

    def _drop_lease(self, k, pin=False):
        """Forgets this process's lease on k; with pin, drops k's soft pin
        from the store too (the read leases there expire by themselves)."""
        with self._llock:
            self._leases.pop(k, None)
            self._wrote.pop(k, None)
            had = self._pins.pop(k, None)
        if pin or had:
            eng, h = self._enter()
            if h is None:
                return
            try:
                pk = _pin_key(k, self._prefix)
                _lib.kv_remove(h, pk, len(pk))
            finally:
                eng._leave()

    @staticmethod
    def _pinning(config):
        """True (pin), False (unpin: soft_pin_action DISABLE) or None."""
        if config is None:
            return None
        if getattr(config, "with_soft_pin", False) or \
                getattr(config, "soft_pin_action", 0) == SoftPinAction.ENABLE:
            return True
        return False if getattr(config, "soft_pin_action", 0) == SoftPinAction.DISABLE else None

    def _pin(self, k, config):
        """A soft pin (with_soft_pin, or soft_pin_action ENABLE) is kept for
        its TTL, in the store and here; soft_pin_action DISABLE drops it."""
        how = self._pinning(config)
        if how:
            ttl = config.soft_pin_ttl_ms
            ttl = self.kv_soft_pin_ttl_ms if ttl is None else ttl
            if ttl <= 0:
                return
            self._lease(k, ttl)
            until = _now_ms() + ttl
            with self._llock:
                self._pins[k] = until
            pk = _pin_key(k, self._prefix)
            eng, h = self._enter()
            if h is None:
                return
            try:
                v = struct.pack("<Q", min(until, _U64_MAX))
                rc = _lib.kv_put(h, pk, len(pk), v, 8)
            finally:
                eng._leave()
            if rc:
                log.warning("soft pin on %r not stored in the store (%s): it holds in this "
                            "process only", k, _engine.KvError(rc))
        elif how is False:
            self._drop_lease(k, pin=True)

    @classmethod
    def _check_group_ids(cls, config, n):
        """False for a config Mooncake refuses: group_ids not one per key,
        or a soft-pin TTL without a soft pin to apply it to."""
        if config is None:
            return True
        g = getattr(config, "group_ids", None)
        if g is not None and len(g) != n:
            return False
        return getattr(config, "soft_pin_ttl_ms", None) is None or bool(cls._pinning(config))

    # -- copying calls -----------------------------------------------------------

    def put(self, key, value, config=None):
        return self.put_parts(key, value, config=config)

    def put_parts(self, key, *parts, config=None):
        """Stores the parts back to back as one object; 0 or a negative code."""
        if self._eng is None:
            return _NOT_SET_UP
        k = self._key(key)
        if k is None or not self._check_group_ids(config, 1):
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
            rc = to_mooncake(self._put_raw(h, k, addr, n))
        finally:
            eng._leave()
        if rc == 0:
            self._pin(k, config)
        return rc

    def put_batch(self, keys, values, config=None):
        """0 when every put succeeded, else the first failure's code. One
        kv_put_many: in a cluster one round per owner, not per key."""
        if len(keys) != len(values) or not self._check_group_ids(config, len(keys)):
            return _BAD
        if self._eng is None:
            return _NOT_SET_UP
        if _lib.kv_put_many is None:
            for k, v in zip(keys, values):
                rc = self.put(k, v, config)
                if rc:
                    return rc
            return 0
        fast = self._fast_put_bytes(keys, values, config)
        if fast is not None:
            return fast
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
                self._pin(k, config)
            elif not first:
                first = to_mooncake(rc)
        return first

    def _fast_put_bytes(self, keys, values, config):
        """put_batch's fast path, for str keys and bytes values (what
        Mooncake's callers pass): one packed kv_put_many, no per-key span.
        Its answer, or None to take the general path."""
        off = _buffers.BYTES_OFFSET
        if off is None or not values or any(type(v) is not bytes for v in values):
            return None
        if max(map(len, values)) > self._local_buffer:
            return None
        ks = self._fast_keys(keys)
        if ks is None:
            return None
        a = self._fast_pairs(ks, [id(v) + off for v in values], list(map(len, values)))
        if a is None:
            return None
        res = self._run_pairs(_lib.kv_put_many, a, len(ks))     # values live in `values`
        if res is None:
            return _NOT_SET_UP
        pinning = config is not None and self._pinning(config) is not None
        if self._keys is not None or pinning:
            for k, rc in zip(ks, res):
                if rc == 0:
                    if self._keys is not None:
                        self._keys.add(k)
                    if pinning:
                        self._pin(k, config)
        return next((to_mooncake(rc) for rc in res if rc), 0)

    def _read(self, k):
        """The object's bytes (a bytes object), or None; leases it."""
        eng, h = self._enter()
        if h is None:
            return None
        try:
            vlen = ctypes.c_size_t()
            hint = self._size_hint
            if hint:
                # Most objects have the size of the last ones read: read into
                # bytes of that size at once (a size query first cost a
                # second engine call per get).
                out, addr = _engine._new_bytes(hint)
                rc = _lib.kv_get(h, k, len(k), addr, hint, ctypes.byref(vlen))
                if rc == 0:
                    self._share_leases([k], h)
                    if vlen.value == hint:
                        return out
                    self._size_hint = 0
                    return out[:vlen.value]
            else:
                rc = _lib.kv_get(h, k, len(k), None, 0, ctypes.byref(vlen))
            for _ in range(16):
                if rc not in (0, _engine.ENOBUFS):
                    return None
                need = vlen.value
                if need > self._local_buffer:
                    return None
                out, addr = _engine._new_bytes(need)
                rc = _lib.kv_get(h, k, len(k), addr if need else None, need, ctypes.byref(vlen))
                if rc == 0:
                    self._share_leases([k], h)
                    if vlen.value == need:
                        self._size_hint = need if 0 < need <= _HINT_MAX else 0
                        return out
                    return out[:vlen.value]
            return None
        finally:
            eng._leave()

    def get(self, key):
        """The object's bytes; b"" when it is missing (or anything failed)."""
        k = self._key(key)
        if k is None or self._eng is None:
            return b""
        v = self._read(k)
        return b"" if v is None else v

    def get_batch(self, keys):
        """[bytes] per key (b"" when missing): the sizes in one kv_get_many,
        then the values in a second; or, while the objects read last were
        all of one size, straight into bytes of that size in one call, the
        objects of another size then read as before."""
        if self._eng is None or _lib.kv_get_many is None:
            return [self.get(k) for k in keys]
        if self._size_hint and keys:
            got = self._hinted_batch(keys)
            if got is not None:
                return got
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
        read = []
        for (i, k), rc, n in zip(ks, res, lens):
            if rc == 0 and n == 0:
                out[i] = b""
                read.append(k)
            elif rc == _engine.ENOBUFS and n <= self._local_buffer:
                obj, addr = _engine._new_bytes(n)
                want.append((i, k, obj, addr, n))
        if want:
            got = self._many(_lib.kv_get_many, [(k, addr, n) for _, k, _, addr, n in want])
            if got is None:
                return out
            res, lens = got
            for (i, k, obj, _, n), rc, ln in zip(want, res, lens):
                if rc == 0:
                    out[i] = obj if ln == n else obj[:ln]
                    read.append(k)
                elif rc == _engine.ENOBUFS:     # it grew in between: read it alone
                    out[i] = self.get(keys[i])
            sizes = set(n for _, _, _, _, n in want)
            if len(sizes) == 1 and len(want) == len(ks):
                n = sizes.pop()
                self._size_hint = n if n <= _HINT_MAX else 0
        self._share_leases(read)
        return out

    def _hinted_batch(self, keys):
        """get_batch in one kv_get_many into bytes of _size_hint each (and
        its leases under the same _enter); the objects of another size are
        read by a second call. None to take the general path (a key that
        needs checking one by one)."""
        if _buffers.BYTES_OFFSET is None:
            return None
        ks = self._fast_keys(keys)
        if ks is None:
            return None
        hint = self._size_hint
        n = len(ks)
        new = _engine._bytes_new          # _new_bytes without a call per object
        objs = [new(None, hint) for _ in range(n)]
        off = _buffers.BYTES_OFFSET
        a = self._fast_pairs(ks, [id(o) + off for o in objs], [hint] * n)
        if a is None:
            return None
        res = array.array("i", bytes(4 * n))
        eng, h = self._enter()
        if h is None:
            return [b""] * n
        try:
            rc = _lib.kv_get_many(h, a.buffer_info()[0], n, res.buffer_info()[0])
            if rc:
                return [b""] * n
            lens = a[3::4]
            if not any(res) and lens.count(hint) == n:
                # The common case: every object read, each of the hinted size.
                if self.kv_lease_ttl_ms > 0:
                    self._share_leases(ks, h)
                return objs
            out = [b""] * n
            read = []
            again = []
            for i in range(n):
                r = res[i]
                if r == 0:
                    ln = lens[i]
                    obj = objs[i]
                    out[i] = obj if ln == hint else obj[:ln]
                    if ln != hint:
                        self._size_hint = 0
                    read.append(ks[i])
                elif r == _engine.ENOBUFS:
                    again.append(i)
            if self.kv_lease_ttl_ms > 0 and read:
                self._share_leases(read, h)
        finally:
            eng._leave()
        if again:
            # Larger than the hint: the general path for those (sizes, then
            # values), which also sets the hint anew.
            self._size_hint = 0
            for i, v in zip(again, self.get_batch([keys[i] for i in again])):
                out[i] = v
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
        if k is None or not self._ptr_ok(buffer_ptr, size) or \
                not self._check_group_ids(config, 1):
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            rc = to_mooncake(self._put_raw(h, k, buffer_ptr, size))
        finally:
            eng._leave()
        if rc == 0:
            self._pin(k, config)
        return rc

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size, metadata_size,
                               config=None):
        """Stores the metadata buffer's metadata_size bytes, then the data
        buffer's size bytes, as one object (Mooncake's layout for it: the
        metadata first). 0 or a negative code; an empty data buffer stores
        nothing and succeeds, as Mooncake's does."""
        if self._eng is None:
            return _NOT_SET_UP
        if not self._ptr_ok(buffer_ptr, size) or not self._ptr_ok(metadata_buffer_ptr,
                                                                  metadata_size):
            return _BAD
        if size == 0:
            return 0
        ptrs = [p for p, z in ((metadata_buffer_ptr, metadata_size), (buffer_ptr, size)) if z]
        sizes = [z for z in (metadata_size, size) if z]
        return self.batch_put_from_multi_buffers([key], [ptrs], [sizes], config)[0]

    def get_into(self, key, buffer_ptr, size):
        """Bytes read into [buffer_ptr, buffer_ptr+size), or a negative code
        (INVALID_PARAMS when the object is larger than size)."""
        k = self._key(key)
        if k is None or not self._ptr_ok(buffer_ptr, size):
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        vlen = ctypes.c_size_t()
        try:
            rc = _lib.kv_get(h, k, len(k), buffer_ptr or None, size, ctypes.byref(vlen))
        finally:
            eng._leave()
        if rc == 0:
            self._share_leases([k])
            return vlen.value
        return to_mooncake(rc)

    @staticmethod
    def _ptr_ok(ptr, size):
        # An int past 2^64 would be cut to its low bits by ctypes: refused.
        return isinstance(ptr, int) and isinstance(size, int) and 0 <= size <= _U64_MAX and \
            0 <= ptr <= _U64_MAX and (size == 0 or ptr > 0)

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """A code per key; every entry INVALID_PARAMS when the lists differ
        in length. One kv_put_many (one round per owner in a cluster)."""
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n or not self._check_group_ids(config, n):
            return [_BAD] * n
        if self._eng is None:
            return [_NOT_SET_UP] * n
        if _lib.kv_put_many is None:
            return [self.put_from(keys[i], buffer_ptrs[i], sizes[i], config) for i in range(n)]
        fast = self._fast_put(keys, buffer_ptrs, sizes, config)
        if fast is not None:
            return fast
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
                    self._pin(item[0], config)
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
        fast = self._fast_get(keys, buffer_ptrs, sizes)
        if fast is not None:
            return fast
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
            read = []
            for i, item, rc, ln in zip(idx, items, got[0], got[1]):
                out[i] = ln if rc == 0 else to_mooncake(rc)
                if rc == 0:
                    read.append(item[0])
            self._share_leases(read)
        return out

    # Several buffers per object (vLLM's and vLLM-Ascend's Mooncake
    # connectors store each block's layers as one object): the object is
    # the buffers back to back. kvengine's plain keys take one value
    # buffer, so a key with several buffers is gathered into (or scattered
    # from) one staging buffer: one extra memcpy of its bytes. A key with
    # one buffer is moved as batch_put_from / batch_get_into move it.

    def _multi_ok(self, keys, all_ptrs, all_sizes):
        n = len(keys)
        if len(all_ptrs) != n or len(all_sizes) != n:
            return False
        for ptrs, sizes in zip(all_ptrs, all_sizes):
            if len(ptrs) != len(sizes) or not all(self._ptr_ok(p, z) for p, z in zip(ptrs, sizes)):
                return False
        return True

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """A code per key: key i's object is its buffers back to back."""
        n = len(keys)
        if self._eng is None:
            return [_NOT_SET_UP] * n
        if not self._multi_ok(keys, all_buffer_ptrs, all_sizes) or \
                not self._check_group_ids(config, n):
            return [_BAD] * n
        ptrs, sizes, stage = [], [], []
        for bp, bs in zip(all_buffer_ptrs, all_sizes):
            if len(bp) == 1:
                ptrs.append(bp[0])
                sizes.append(bs[0])
                continue
            total = sum(bs)
            buf = (ctypes.c_char * max(total, 1))()
            off = 0
            for p, z in zip(bp, bs):
                ctypes.memmove(ctypes.addressof(buf) + off, p, z)
                off += z
            stage.append(buf)
            ptrs.append(ctypes.addressof(buf))
            sizes.append(total)
        return self.batch_put_from(keys, ptrs, sizes, config)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Bytes read per key (the object spread over its buffers in order),
        or a negative code; INVALID_PARAMS when the object is larger than
        the buffers together."""
        n = len(keys)
        if self._eng is None:
            return [_NOT_SET_UP] * n
        if not self._multi_ok(keys, all_buffer_ptrs, all_sizes):
            return [_BAD] * n
        ptrs, sizes, stage = [], [], {}
        for i, (bp, bs) in enumerate(zip(all_buffer_ptrs, all_sizes)):
            if len(bp) == 1:
                ptrs.append(bp[0])
                sizes.append(bs[0])
                continue
            total = sum(bs)
            buf = (ctypes.c_char * max(total, 1))()
            stage[i] = buf
            ptrs.append(ctypes.addressof(buf))
            sizes.append(total)
        res = self.batch_get_into(keys, ptrs, sizes)
        for i, buf in stage.items():
            got = res[i]
            if got < 0:
                continue
            off = 0
            for p, z in zip(all_buffer_ptrs[i], all_sizes[i]):
                m = min(z, got - off)
                if m <= 0:
                    break
                ctypes.memmove(p, ctypes.addressof(buf) + off, m)
                off += m
        return res

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Byte ranges of objects into buffers: for buffer i, key j, range r,
        copies all_sizes[i][j][r] bytes from offset all_src_offsets[i][j][r]
        of object all_keys[i][j] to buffer_ptrs[i] + all_dst_offsets[i][j][r].
        Returns [[[bytes copied or a negative code per range]]]; a range past
        the object's end, or past the end of the registered buffer (or
        BufferPool lease) buffer_ptrs[i] lies in, is INVALID_PARAMS: the
        buffers must be registered, as Mooncake's transfers need them to be,
        which is also what lets a destination range be checked before it is
        written. Each object is read whole once (into a staging buffer)."""
        out = []
        nb = len(buffer_ptrs)
        if not (len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) ==
                len(all_sizes) == nb):
            return [[[_BAD]] for _ in range(nb)]
        for i in range(nb):
            base = buffer_ptrs[i]
            reg = self._region(base) if _is_u64(base) else None
            room = reg[0] + reg[1] - base if reg else -1
            row = []
            for j, key in enumerate(all_keys[i]):
                try:
                    dsts, srcs, lens = all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j]
                except IndexError:
                    row.append([_BAD])
                    continue
                if not (len(dsts) == len(srcs) == len(lens)) or not self._ptr_ok(base, 1) or \
                        not all(_is_u64(x) for x in list(dsts) + list(srcs) + list(lens)):
                    row.append([_BAD] * max(len(lens), 1))
                    continue
                k = self._key(key)
                v = self._read(k) if k is not None and self._eng is not None else None
                if v is None:
                    code = _NOT_SET_UP if self._eng is None else (
                        _BAD if k is None else int(ErrorCode.OBJECT_NOT_FOUND))
                    row.append([code] * len(lens))
                    continue
                rr = []
                for d, sft, z in zip(dsts, srcs, lens):
                    if sft + z > len(v) or d + z > room:
                        rr.append(_BAD)
                        continue
                    ctypes.memmove(base + d, _buffers.span(v, False)[0] + sft, z)
                    rr.append(z)
                row.append(rr)
            out.append(row)
        return out

    # Sessions (layerwise KV load and save): Mooncake resolves an object's
    # replica once and then moves byte ranges per layer. Here a get session
    # reads each object whole at its start (one kv_get_many) and the range
    # calls copy out of that copy; a put session gathers the ranges in a
    # buffer of the object's size and stores it whole at its end. So the
    # bytes are copied once more than by batch_put_from / batch_get_into;
    # a range call itself never reaches the engine. Every buffer must lie
    # in registered memory (register_buffer, a BufferPool lease,
    # alloc_from_mem_pool), as Mooncake requires, which also bounds it.

    def _sessions(self):
        try:
            return self._gets, self._puts
        except AttributeError:
            self._gets, self._puts = {}, {}
            return self._gets, self._puts

    def _ranges_ok(self, ptrs, sizes, offs):
        if not (len(ptrs) == len(sizes) == len(offs)):
            return False
        for p, z, o in zip(ptrs, sizes, offs):
            if not (_is_u64(p) and _is_u64(z) and _is_u64(o)) or not p:
                return False
            reg = self._region(p)
            if reg is None or p + z > reg[0] + reg[1]:
                return False
        return True

    def batch_get_session_start(self, keys):
        """Opens a get session per key: 0, or a negative code (OBJECT_NOT_FOUND)."""
        if self._eng is None:
            return []
        gets, _ = self._sessions()
        out = []
        for key, v in zip(keys, self.get_batch(list(keys))):
            k = self._key(key)
            if k is None:
                out.append(_BAD)
            elif not v and self.get_size(key) != 0:
                out.append(int(ErrorCode.OBJECT_NOT_FOUND))
            else:
                gets[k] = v
                out.append(0)
        return out

    def batch_get_into_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes,
                                           all_src_offsets):
        """Bytes copied per key from its session's object, or a negative code."""
        if self._eng is None:
            return []
        gets, _ = self._sessions()
        n = len(keys)
        if not (len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets) == n):
            return [_BAD] * n
        out = []
        for key, ptrs, sizes, offs in zip(keys, all_buffer_ptrs, all_sizes, all_src_offsets):
            k = self._key(key)
            v = gets.get(k) if k is not None else None
            if v is None:
                out.append(_BAD)          # no session for it
                continue
            if not self._ranges_ok(ptrs, sizes, offs) or \
                    any(o + z > len(v) for z, o in zip(sizes, offs)):
                out.append(_BAD)
                continue
            base = _buffers.span(v, False)[0] if v else 0
            for p, z, o in zip(ptrs, sizes, offs):
                if z:
                    ctypes.memmove(p, base + o, z)
            out.append(sum(sizes))
        return out

    def batch_get_session_end(self, keys):
        if self._eng is None:
            return -1
        gets, _ = self._sessions()
        for key in keys:
            gets.pop(self._key(key), None)
        return 0

    def batch_put_session_start(self, keys, sizes, config=None):
        """Opens a put session per key for an object of sizes[i] bytes: 0, or
        a negative code. A key that has one already is left as it is."""
        if self._eng is None:
            return []
        n = len(keys)
        if len(sizes) != n or not self._check_group_ids(config, n):
            return [_BAD] * n
        _, puts = self._sessions()
        out = []
        for key, z in zip(keys, sizes):
            k = self._key(key)
            if k is None or not _is_u64(z):
                out.append(_BAD)
            elif z > self._local_buffer:
                out.append(int(ErrorCode.BUFFER_OVERFLOW))
            else:
                if k not in puts:
                    puts[k] = (key, (ctypes.c_char * max(z, 1))(), z, config)
                out.append(0)
        return out

    def batch_put_from_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes,
                                           all_dst_offsets):
        """Bytes copied per key into its session's object, or a negative code."""
        if self._eng is None:
            return []
        _, puts = self._sessions()
        n = len(keys)
        if not (len(all_buffer_ptrs) == len(all_sizes) == len(all_dst_offsets) == n):
            return [_BAD] * n
        out = []
        for key, ptrs, sizes, offs in zip(keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
            sess = puts.get(self._key(key))
            if sess is None or not self._ranges_ok(ptrs, sizes, offs) or \
                    any(o + z > sess[2] for z, o in zip(sizes, offs)):
                out.append(_BAD)
                continue
            base = ctypes.addressof(sess[1])
            for p, z, o in zip(ptrs, sizes, offs):
                if z:
                    ctypes.memmove(base + o, p, z)
            out.append(sum(sizes))
        return out

    def batch_put_session_end(self, keys):
        """Stores each session's object (readable from then on); a code per key."""
        if self._eng is None:
            return []
        _, puts = self._sessions()
        out = []
        for key in keys:
            sess = puts.pop(self._key(key), None)
            if sess is None:
                out.append(_BAD)
                continue
            out.append(self.put_from(sess[0], ctypes.addressof(sess[1]), sess[2], sess[3]))
        return out

    def batch_put_session_revoke(self, keys):
        if self._eng is None:
            return []
        _, puts = self._sessions()
        return [0 if puts.pop(self._key(key), None) is not None else _BAD for key in keys]

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
        if not self._ptr_ok(buffer_ptr, size) or buffer_ptr <= 0 or size <= 0:
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            rc = to_mooncake(_lib.kv_register_buffer(h, buffer_ptr, size))
        finally:
            eng._leave()
        if rc == 0:
            with self._llock:
                self._regs[buffer_ptr] = size
        return rc

    def _region(self, ptr):
        """(start, size) of the registered buffer holding ptr, or None."""
        with self._llock:
            for a, n in self._regs.items():
                if a <= ptr < a + n:
                    return a, n
        return None

    def unregister_buffer(self, buffer_ptr):
        if not self._ptr_ok(buffer_ptr, 1) or buffer_ptr <= 0:
            return _BAD
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            rc = to_mooncake(_lib.kv_unregister_buffer(h, buffer_ptr))
        finally:
            eng._leave()
        with self._llock:
            self._regs.pop(buffer_ptr, None)
        return rc

    # -- the upsert family: a put here replaces what is there already -------------

    def upsert(self, key, value, config=None):
        return self.put(key, value, config)

    def upsert_parts(self, key, *parts, config=None):
        return self.put_parts(key, *parts, config=config)

    def upsert_batch(self, keys, values, config=None):
        return self.put_batch(keys, values, config)

    def upsert_from(self, key, buffer_ptr, size, config=None):
        return self.put_from(key, buffer_ptr, size, config)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        return self.batch_put_from(keys, buffer_ptrs, sizes, config)

    # -- existence, size, removal --------------------------------------------------

    # The batch calls' fast path. A batch of str keys and int pointers is
    # checked and packed with whole-list builtins (map, min/max, array
    # slices, one join) instead of per-key Python calls: at 4 KiB that
    # per-key work was most of a batch's cost (python -m kvengine.bench
    # --io-api zcopy). Anything the fast checks do not clear (a bytes key,
    # a NUL, an empty or long key, a pointer out of range) takes the
    # per-key path, which gives each key its own answer.

    def _fast_keys(self, keys):
        """The engine keys of a list of str keys, every one valid, or None
        (then the caller checks key by key)."""
        try:
            ks = list(map(str.encode, keys))
        except (TypeError, UnicodeError):
            return None
        if not ks:
            return ks
        p = self._prefix
        if min(map(len, ks)) == 0 or max(map(len, ks)) > _lib.KV_KEY_MAX - len(p) or \
                b"\0" in b"".join(ks):
            return None
        return [p + k for k in ks] if p else ks

    @staticmethod
    def _fast_pairs(ks, ptrs, sizes):
        """The kv_pair array (an array('Q'), 4 words a pair) of keys ks and
        the buffers ptrs/sizes, or None when a pointer or size is not a
        64-bit int or a non-empty buffer is at address 0. The keys' bytes
        must outlive the call that reads the array."""
        off = _buffers.BYTES_OFFSET
        # One packed pair per key, joined, then one array: half the cost of
        # a flat list of words into an array (2.0 against 1.0 us at
        # Mooncake's batch of 4), which was a quarter of the four column
        # arrays and slice assignments before it.
        pack = _PAIR_WORDS.pack
        try:
            a = array.array("Q", b"".join([pack(id(k) + off, len(k), p, z)
                                           for k, p, z in zip(ks, ptrs, sizes)]))
        except (TypeError, OverflowError, struct.error):
            return None
        if not all(ptrs) and any(z and not q for q, z in zip(ptrs, sizes)):
            return None
        return a

    def _run_pairs(self, fn, a, n):
        """fn (kv_put_many / kv_get_many) over the packed array a: the list
        of return codes, or None when the store is not set up."""
        res = array.array("i", bytes(4 * n))
        eng, h = self._enter()
        if h is None:
            return None
        try:
            rc = fn(h, a.buffer_info()[0], n, res.buffer_info()[0])
        finally:
            eng._leave()
        return [rc] * n if rc else res.tolist()

    def _fast_args(self, fn, keys, buffer_ptrs, sizes):
        """(keys as bytes, packed pairs) for a fast batch call of fn, or None
        when fn is missing or an argument needs the per-key path."""
        if fn is None or _buffers.BYTES_OFFSET is None:
            return None
        ks = self._fast_keys(keys)
        if ks is None:
            return None
        a = self._fast_pairs(ks, buffer_ptrs, sizes)
        return None if a is None else (ks, a)

    def _fast_put(self, keys, buffer_ptrs, sizes, config):
        """batch_put_from's fast path: its answer, or None to take the slow one."""
        got = self._fast_args(_lib.kv_put_many, keys, buffer_ptrs, sizes)
        if got is None:
            return None
        ks, a = got
        n = len(ks)
        res = self._run_pairs(_lib.kv_put_many, a, n)
        if res is None:
            return [_NOT_SET_UP] * n
        ok = ks if not any(res) else [k for k, rc in zip(ks, res) if rc == 0]
        if self._keys is not None:
            self._keys.update(ok)
        if config is not None and self._pinning(config) is not None:
            for k in ok:
                self._pin(k, config)
        if ok is ks:
            return [0] * n
        return [0 if rc == 0 else to_mooncake(rc) for rc in res]

    def _fast_get(self, keys, buffer_ptrs, sizes):
        """batch_get_into's fast path: its answer, or None to take the slow one."""
        got = self._fast_args(_lib.kv_get_many, keys, buffer_ptrs, sizes)
        if got is None:
            return None
        ks, a = got
        n = len(ks)
        # The read and its leases under one _enter (each costs two lock
        # round trips, a tenth of a 4-key batch's Python).
        res = array.array("i", bytes(4 * n))
        eng, h = self._enter()
        if h is None:
            return [_NOT_SET_UP] * n
        try:
            rc = _lib.kv_get_many(h, a.buffer_info()[0], n, res.buffer_info()[0])
            res = [rc] * n if rc else res.tolist()
            if self.kv_lease_ttl_ms > 0:
                self._share_leases(ks if not any(res) else
                                   [k for k, r in zip(ks, res) if r == 0], h)
        finally:
            eng._leave()
        lens = a[3::4].tolist()
        if not any(res):
            return lens
        return [ln if rc == 0 else to_mooncake(rc) for rc, ln in zip(res, lens)]

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

    # Mooncake's own store_kv_bench.py calls isExist.
    isExist = is_exist

    def batch_is_exist(self, keys):
        """1/0/-1 per key, from one kv_exists_many."""
        if self._eng is None or _lib.kv_exists_many is None:
            return [self.is_exist(k) for k in keys]
        ks = self._fast_keys(keys) if _buffers.BYTES_OFFSET is not None else None
        if ks is not None:
            n = len(ks)
            if n == 0:
                return []
            a = array.array("Q", bytes(32 * n))
            off = _buffers.BYTES_OFFSET
            a[0::4] = array.array("Q", [id(k) + off for k in ks])
            a[1::4] = array.array("Q", map(len, ks))
            res = self._run_pairs(_lib.kv_exists_many, a, n)
            if res is None:
                return [-1] * n
            return [rc if rc in (0, 1) else -1 for rc in res] if min(res) < 0 else res
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
        """0; OBJECT_NOT_FOUND (-704) when the object is not there;
        OBJECT_HAS_LEASE (-706) while this process holds a read lease or a
        soft pin on it, unless force."""
        k = self._key(key)
        if k is None:
            return _BAD
        held, no_pin = self._lease_check(k) if not force else (False, False)
        if held:
            return int(ErrorCode.OBJECT_HAS_LEASE)
        eng, h = self._enter()
        if h is None:
            return _NOT_SET_UP
        try:
            rc = _lib.kv_remove(h, k, len(k))
        finally:
            eng._leave()
        if rc in (0, _engine.ENOTFOUND):
            # The check just found no pin record: no third call (on a shared
            # store or in a cluster, a third round trip) to remove it.
            self._drop_lease(k, pin=not no_pin)
            if self._keys is not None:
                self._keys.discard(k)
        return to_mooncake(rc)

    def batch_remove(self, keys, force=False):
        return [self.remove(k, force) for k in keys]

    def remove_by_regex(self, regex_pattern, force=False):
        """Removes the objects of this store's tenant whose keys the pattern
        matches (Mooncake: std::regex_search, ECMAScript) and returns how
        many; INVALID_PARAMS (-600) for a pattern that is not a regex.
        Without force an object under a lease or soft pin stays and is not
        counted, as Mooncake's master skips it; force removes it too.

        kvengine cannot list keys, so only patterns that name a key prefix
        are served: "^" and a literal (metacharacters escaped with "\\" or
        absent), optionally followed by ".*" or ".*$"; those are one
        kv_remove_prefix of the tenant's prefix and the literal, in a
        cluster on every owner. An empty literal is remove_all. Any other
        pattern raises NotImplementedError.

        What a prefix removal cannot do that Mooncake's does: ".*$" does
        not match a key holding "\\n" or "\\r" after the prefix in Mooncake
        (its "." stops there), here such a key is removed too; and, as in
        remove_all, only this process's leases and pins keep their objects
        (another process's, kept in the store under a hash of each key, are
        found only from the key). A removed object's read lease records
        expire by themselves; its soft pin record is dropped when this
        process set the pin, and another process's stays until its TTL (a
        new object under that key reads as pinned until then)."""
        lit = _regex_prefix(regex_pattern)
        if lit is None:
            try:
                re.compile(regex_pattern)
            except (re.error, TypeError):
                return _BAD
            raise NotImplementedError(
                "remove_by_regex(%r): only '^literal', '^literal.*' and '^literal.*$' are "
                "served (a key prefix); kvengine's API has no listing of keys to match "
                "another pattern against" % (regex_pattern,))
        if self._eng is None:
            return -1
        if not lit:
            return self.remove_all(force)
        if lit[0] == 0 or b"\0" in lit:
            return 0                      # no Mooncake key holds a NUL
        p = self._prefix + lit
        if len(p) > _lib.KV_KEY_MAX:
            return 0
        if self._keys is not None:        # a library without kv_remove_prefix
            n = 0
            for k in [k for k in self._keys if k.startswith(p)]:
                rc = self.remove(k[len(self._prefix):], force)
                if rc == 0:
                    n += 1
                elif rc not in (int(ErrorCode.OBJECT_HAS_LEASE), int(ErrorCode.OBJECT_NOT_FOUND)):
                    return rc
            return n
        with self._llock:
            now = time.monotonic()
            mine = {k for k, t in self._leases.items() if t > now and k.startswith(p)}
            mine.update(k for k in self._pins if k.startswith(p))
        # Without force, this process's leased and pinned objects are read
        # first and put back after the removal (kv_remove_prefix takes no
        # exceptions), uncounted, with their pins; a reader sees them
        # missing in between, as in remove_all.
        keep = []
        if not force:
            for k in mine:
                if self._leased(k):
                    v = self._read(k)
                    if v is not None:
                        keep.append((k, v))
        try:
            n = self._eng.remove_prefix(p)
        except _engine.KvError as e:
            return to_mooncake(e.code)
        kept = {k for k, _ in keep}
        for k in mine:
            if k not in kept:
                self._drop_lease(k, pin=True)
        if keep:
            # Their pin records live outside the prefix (_pin_key) and stay.
            eng, h = self._enter()
            if h is None:
                return -1
            try:
                for k, v in keep:
                    if self._put_raw(h, k, _buffers.span(v, False)[0], len(v)) == 0:
                        n -= 1
            finally:
                eng._leave()
        return max(n, 0)

    def remove_all(self, force=False):
        """Removes every object of this store's tenant, in a cluster on
        every owner, whoever put it; returns how many were removed, or -1
        when the store is not set up or an owner could not be reached.
        Without force, leased and soft-pinned objects stay, as in Mooncake.

        A tenant's objects are the plain keys under its prefix, removed by
        kv_remove_prefix: never another tenant's. The default tenant (no
        prefix) removes every plain key of the store (kv_remove_all), other
        tenants' objects included, since its keys share no prefix.

        Without force, the objects this process holds leases or pins on are
        read first and put back after it, with their pins (a write to one
        of them by another process in between is lost, and a reader sees
        it missing meanwhile); other processes' leases and pins do not keep
        their objects here: the engine keeps no leases on plain keys, and a
        lease block (see "Leases") is found only from its object's key,
        which the store cannot list. The store's pin records are removed
        with the objects and not counted."""
        if self._eng is None:
            return -1
        if self._keys is not None:
            return self._remove_tracked(force)
        keep = []
        if not force:
            with self._llock:
                now = time.monotonic()
                leased = [k for k, t in self._leases.items() if t > now]
            for k in leased:
                v = self._read(k)
                if v is not None:
                    keep.append((k, v))
        with self._llock:
            pins = dict(self._pins)
        try:
            # The pin records first, so that they are not counted as objects.
            self._eng.remove_prefix(self._prefix + _PIN_NS)
            if not self._prefix:      # the read leases, which kv_remove_all would count
                self._eng.remove_prefix(_LEASE_NS)
            n = self._eng.remove_prefix(self._prefix) if self._prefix else \
                self._eng.remove_all()
        except _engine.KvError:
            return -1
        with self._llock:
            self._pins = {}
        eng, h = self._enter()
        if h is None:
            return -1
        try:
            for k, v in keep:
                if self._put_raw(h, k, _buffers.span(v, False)[0], len(v)) == 0:
                    n -= 1
                until = pins.get(k)
                if until is not None and until > _now_ms():
                    pk = _pin_key(k, self._prefix)
                    if _lib.kv_put(h, pk, len(pk), struct.pack("<Q", until), 8) == 0:
                        with self._llock:
                            self._pins[k] = until
        finally:
            eng._leave()
        if keep and not self._prefix:     # their read leases went with the others'
            with self._llock:
                for k, _ in keep:
                    self._wrote.pop(k, None)
            self._share_leases([k for k, _ in keep])
        if force:
            with self._llock:
                self._leases.clear()
        return max(n, 0)

    def _remove_tracked(self, force):
        """remove_all over the keys this store put (a library without
        kv_remove_prefix)."""
        n = 0
        for k in list(self._keys):
            if not force and self._leased(k):
                continue
            eng, h = self._enter()
            if h is None:
                return -1
            try:
                rc = _lib.kv_remove(h, k, len(k))
            finally:
                eng._leave()
            if rc in (0, _engine.ENOTFOUND):
                n += rc == 0
                self._keys.discard(k)
                self._drop_lease(k, pin=True)
            else:
                return -1
        return n

    # -- replicas ------------------------------------------------------------------
    # kvengine places an object on cluster.replica_num owners chosen by
    # rendezvous hashing of its key over the live members, so a replica is
    # "the object on one owner"; which owners hold it is not reported to
    # clients. A descriptor therefore says the one thing that is known: a
    # complete memory replica of that size exists.

    def get_replica_desc(self, key):
        """[ReplicaDescriptor] for a stored object (one memory replica,
        COMPLETE, its size; the owner's address unknown: ""), [] when
        absent."""
        size = self.get_size(key)
        if size < 0:
            return []
        return [ReplicaDescriptor(size)]

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor]} for the keys that are stored."""
        out = {}
        for key in keys:
            d = self.get_replica_desc(key)
            if d:
                out[key] = d
        return out

    def batch_replica_clear(self, keys, segment_name=""):
        """Clears the replicas of keys whose lease has expired and returns
        the keys cleared. segment_name "" (every segment) drops the object
        from every owner. A store that is not a cluster member has one
        segment, its own (get_hostname): naming it drops the object (its
        only copy is there), naming any other clears nothing (there is no
        such segment).

        Clearing one segment of a cluster (Mooncake's clear of a specific
        segment: the object stays readable from its other replicas) raises
        NotImplementedError: kvengine places a plain key on
        cluster.replica_num owners by rendezvous hashing, tells clients
        neither which owners hold it nor lets them drop one owner's copy
        (a remove asks every owner), and re-replication would copy a
        dropped copy back. Dropping the object everywhere instead would
        break what the caller relies on: reads from the other replicas."""
        if self._eng is None:
            return []
        if segment_name and self._cluster_settings is not None and not self.dummy:
            # A segment is a member (its address; this store's own name
            # stands for its own address). One that owns nothing holds no
            # replica: nothing to clear. The only owner holds every
            # replica: clearing its segment is clearing the object.
            own = self._cluster_settings.get("cluster.listen")
            name = _addr_key(own if segment_name == self._hostname else segment_name)
            try:
                owners = [_addr_key(m["addr"]) for m in
                          _engine.members(self._config_file, self._cluster_settings)[1]
                          if m["owner"]]
            except _engine.KvError:
                owners = None
            if owners is not None and name not in owners:
                return []
            if owners == [name]:
                segment_name = ""
        if segment_name:
            if self._cluster_settings is not None or self.dummy:
                raise NotImplementedError(
                    "batch_replica_clear(segment_name=%r): kvengine drops an object from all "
                    "its owners or none (placement by hashing over cluster.replica_num "
                    "owners; one owner's copy cannot be dropped alone); pass "
                    "segment_name=\"\" to clear every replica" % (segment_name,))
            if segment_name != self._hostname:
                return []
        return [key for key in keys if self.remove(key) == 0]

    def create_copy_task(self, key, targets):
        raise NotImplementedError(
            "create_copy_task: kvengine places objects by hashing over cluster.replica_num "
            "owners and re-replicates by itself; there are no segments to copy to")

    def create_move_task(self, key, source, target):
        raise NotImplementedError(
            "create_move_task: kvengine places objects by hashing; an object cannot be moved "
            "to a chosen segment")

    def query_task(self, task_id):
        raise NotImplementedError("query_task: there are no copy or move tasks here")

    def get_offload_rpc_read_count(self):
        return 0

    # -- what cannot mean anything here ----------------------------------------------

    def _no_segments(name):
        def call(self, *a, **kw):
            raise NotImplementedError("%s: CXL / external segments; kvengine's DRAM is "
                                      "dram.capacity, given at setup" % name)
        call.__name__ = name
        return call

    # each names itself: a caller's traceback says which call it made
    mount_segment = _no_segments("mount_segment")
    unmount_segment = _no_segments("unmount_segment")
    allocate_and_mount_segment = _no_segments("allocate_and_mount_segment")
    unmount_and_free_segment = _no_segments("unmount_and_free_segment")
    del _no_segments

    def unmount_local_disk_segment(self, *a, **kw):
        raise NotImplementedError("unmount_local_disk_segment: kvengine's SSD tier is ssd.path, "
                                  "not a mounted segment")

    def init_all(self, *a, **kw):
        raise NotImplementedError("init_all: the transfer engine is Mooncake's; kvengine "
                                  "opens its transport in setup()")

    def alloc_from_mem_pool(self, size):
        """The address of size bytes of registered memory the store can read
        and write with the zero-copy calls (a dummy client's shared pool in
        Mooncake): kvengine's shared buffers when the library has them,
        else a page-aligned mapping registered with the store. It lives
        until close(). 0 when nothing can be had."""
        if self._eng is None or not _is_u64(size) or size <= 0:
            return 0
        try:
            pool = self._mem_pool
        except AttributeError:
            pool = self._mem_pool = BufferPool.__new__(BufferPool)
            pool._store = self
            self._mem_regions = []
        try:
            region = pool._alloc(size)
        except (RuntimeError, OSError, ValueError):
            return 0
        self._mem_regions.append((pool, region))
        return region[0]

    def get_tensor_into_cuda(self, key, tensor):
        raise NotImplementedError("get_tensor_into_cuda: CUDA IPC reads need Mooncake's dummy "
                                  "client over CUDA; this store copies CPU tensors")

    batch_get_tensor_into_cuda = get_tensor_into_cuda


class ReplicaDescriptor:
    """Mooncake's ReplicaDescriptor, as far as kvengine knows it (see
    MooncakeDistributedStore.get_replica_desc)."""

    def __init__(self, size):
        self.status = ReplicaStatus.COMPLETE
        self._mem = MemoryDescriptor(size)

    def is_memory_replica(self):
        return True

    def is_disk_replica(self):
        return False

    def is_local_disk_replica(self):
        return False

    def get_memory_descriptor(self):
        return self._mem

    def get_disk_descriptor(self):
        raise RuntimeError("not a disk replica")

    def __repr__(self):
        return "<ReplicaDescriptor memory %s size=%d>" % (self.status.name,
                                                          self._mem.buffer_descriptor.size)


class Descriptor:
    """An allocated buffer's descriptor (size, buffer_address, transport_endpoint)."""

    def __init__(self, size=0, buffer_address=0, transport_endpoint=""):
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self):
        return "<Descriptor size=%d buffer_address=%d transport_endpoint=%s>" % (
            self.size, self.buffer_address, self.transport_endpoint)


class MemoryDescriptor:
    def __init__(self, size):
        self.buffer_descriptor = Descriptor(size)


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


def bind_to_numa_node(node):
    """Runs this thread on the CPUs of NUMA node `node` (sched_setaffinity
    from /sys/devices/system/node); a warning and nothing else where that
    is not possible, as Mooncake does."""
    try:
        with open("/sys/devices/system/node/node%d/cpulist" % int(node)) as f:
            spec = f.read().strip()
        cpus = set()
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError) as exc:
        log.warning("bind_to_numa_node(%r): skipped: %s", node, exc)


ParallelAxis = _tensor.ParallelAxis
TensorParallelism = _tensor.TensorParallelism
ReadTarget = _tensor.ReadTarget
# Mooncake's shapes: a 4-tuple (metadata, data address, size, owner) out,
# metadata + data in; Mooncake's structured object store unpacks them so.
_serialize_tensor = _tensor.serialize_tensor_parts
_deserialize_tensor = _tensor.deserialize_tensor_strict


def _tensor_metadata_size():
    return _tensor.METADATA_SIZE
