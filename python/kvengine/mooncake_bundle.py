"""mooncake_bundle.py — the storing half of Mooncake's structured object
store (mooncake.structured_object_store) for the drop-in: bundles of named
buffers, structured objects, and DataProto stages with their handles.

Written from Mooncake's documentation (docs/source/api-reference/python/
dataproto-structured-object-transfer.md) and the names and documented
semantics of its interface; the code is this project's own.

Three layers, each a few functions over the one below:
- a bundle is metadata bytes plus named buffers. Every buffer is stored as
  one store object, or as objects "<key>/chunk/<i>" of at most chunk_bytes
  each; a JSON manifest at "<prefix>/<partition>/<hex id>/manifest" lists
  every key with its size, the metadata lives at ".../meta" and buffer
  NAME at ".../buffer/NAME". That is Mooncake's layout, kept so that
  another process (or Mooncake's own reader) finds what one process wrote
  from the manifest key alone.
- a structured object is a bundle whose metadata is JSON carrying a field
  spec per member (__mooncake_structured_fields__: ndarray with dtype and
  shape, torch_tensor, bytes). Torch tensors are stored as Mooncake tensor
  objects (the 304-byte tensor metadata, then the data), through the
  store's put_tensor when it has one.
- a DataProto stage is a structured object with members "batch.NAME" and
  "non_tensor_batch.NAME"; object-dtype non-tensor columns are encoded by
  a codec into payload members "non_tensor_batch.NAME.<payload>" (data,
  offsets, shapes, ndims, nulls), with the codec's name and metadata kept
  in the handle. A MooncakeDataProtoRef routes field names to stages; its
  exported form is JSON holding manifest keys only.

Key design choice: the manifest is the only thing a reader trusts, and it
is checked before it is believed: every key it names must lie under its
own object's prefix (or an object it lists as inherited), chunk sizes must
add up, and every object read must have the size the manifest says. A
damaged or forged manifest raises ValueError; it never makes the reader
read, or cleanup remove, keys outside the bundle.

Rows of nested dicts and lists with tensors or arrays inside are encoded
as "structured_recursive" (a node per container level, a leaf column per
value path); that codec's payload layout is this module's own.

What the drop-in leaves out (see the README): nested (jagged) tensors, the
ragged_tensor_dict and media (PIL) codecs, Mooncake's native fast-copy
extension and BufferPool-backed results.
"""

import copy
import ctypes
import json
import numbers
import struct
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping, Optional

import numpy as np

from kvengine import mooncake_structured as _infer

try:
    import torch as _torch
except ImportError:  # torch is optional: tensor members need it
    _torch = None

DEFAULT_BUNDLE_CHUNK_BYTES = 64 * 1024 ** 2
AUTO_PARALLEL_MIN_BYTES = DEFAULT_BUNDLE_CHUNK_BYTES
AUTO_PARALLEL_MIN_CHUNKS = 8
MISSING_OBJECT_ERROR = -704
STRUCTURED_FIELD_SPECS_KEY = "__mooncake_structured_fields__"
DATAPROTO_REF_HANDLE_TYPE = "mooncake_dataproto_ref"
DATAPROTO_REF_HANDLE_VERSION = 1
STORAGE_GROUP_ID = "storage_group_id"
_WRAPPED = "__mooncake_wrapped_object__"
_SECTIONS = ("batch", "non_tensor_batch", "meta_info")
_CODECS = ("ndarray", "typed_ragged", "ragged_tensor", "bytes_ragged", "utf8_ragged",
           "json_ragged", "msgpack_ragged", "structured_recursive", "ragged_tensor_dict",
           "auto")


# -- public value types ------------------------------------------------------

@dataclass(frozen=True)
class BundleTransferPolicy:
    """How payloads are written: max_inflight_put puts at once (>= 1),
    put_mode "auto" | "batch" | "parallel", copy_mode "auto" | "copy" |
    "zero_copy" (tensor members only as tensor_object_buffer)."""

    max_inflight_put: int = 1
    put_mode: str = "auto"
    copy_mode: str = "auto"


@dataclass(frozen=True)
class FieldSchema:
    """A codec for one DataProto field, instead of inferring one;
    metadata["section"] may pin the field to batch / non_tensor_batch /
    meta_info, metadata["dtype"] sets a typed codec's dtype."""

    codec: str
    nullable: bool = True
    metadata: dict = field(default_factory=dict)


@dataclass
class RemoteBundleRef:
    """A stored bundle: its manifest key, and the manifest when known
    ({} when only the key is, as after import)."""

    manifest_key: str
    manifest: dict


class StructuredObjectPayload:
    """A structured object to store: JSON-safe metadata and named members
    (numpy arrays, CPU torch tensors, bytes-like, tensor_object_buffer)."""

    __slots__ = ("metadata", "buffers")

    def __init__(self, metadata=None, buffers=None):
        if buffers is None:
            raise TypeError("StructuredObjectPayload requires buffers")
        object.__setattr__(self, "metadata", {} if metadata is None else metadata)
        object.__setattr__(self, "buffers", buffers)

    def __setattr__(self, name, value):
        raise AttributeError("StructuredObjectPayload is immutable")


@dataclass
class StructuredObjectResult:
    """A materialized structured object: its metadata and its members."""

    metadata: dict
    objects: dict


@dataclass(frozen=True)
class StructuredFieldLocation:
    """Where a DataProto field lives: stage, member name and section."""

    stage: str
    member: str
    section: str


@dataclass
class MooncakeDataProtoRef:
    """A DataProto handle: stage name -> structured object ref, field name
    -> location, batch size, meta_info; no dtypes or shapes (those stay in
    the manifests)."""

    batch_size: int
    stage_refs: dict
    field_index: dict
    meta_info: dict
    namespace: str = "default"
    partition: str = "default"
    global_indexes: Optional[list] = None
    encoded_non_tensor: dict = field(default_factory=dict)
    _storage_group_id: Optional[str] = field(default=None, repr=False)


@dataclass(frozen=True)
class StructuredMemberSlice:
    """Rows start:end:step of one member along axis (only 0 is supported)."""

    axis: int
    start: int
    end: int
    step: int = 1


@dataclass(frozen=True)
class StructuredObjectReadSpec:
    """A lazy read of a structured object: which members, which slices."""

    ref: Any
    member_names: Optional[tuple] = None
    member_slices: tuple = ()

    def select_members(self, names):
        return StructuredObjectReadSpec(self.ref, None if names is None else tuple(names),
                                        self.member_slices)

    def slice_member(self, name, axis, start, end, step=1):
        slices = dict(self.member_slices)
        slices[name] = StructuredMemberSlice(axis, start, end, step)
        return StructuredObjectReadSpec(self.ref, self.member_names, tuple(slices.items()))

    def member_slice(self, name):
        return dict(self.member_slices).get(name)


class _TensorObjectBuffer:
    """Memory at ptr holding a whole Mooncake tensor object (metadata then
    data), e.g. a BufferPool lease; owner keeps that memory alive."""

    __slots__ = ("ptr", "size", "owner", "batch_size")

    def __init__(self, ptr, size, owner, batch_size):
        self.ptr, self.size, self.owner, self.batch_size = ptr, size, owner, batch_size

    def __len__(self):
        if self.batch_size is None:
            raise TypeError("a tensor_object_buffer needs batch_size for DataProto use")
        return self.batch_size


class _RawDestination:
    """Caller memory at ptr (size bytes) to read a member's bytes into."""

    __slots__ = ("ptr", "size", "owner", "pre_registered")

    def __init__(self, ptr, size, owner, pre_registered):
        self.ptr, self.size, self.owner, self.pre_registered = ptr, size, owner, pre_registered


def tensor_object_buffer(ptr, size, owner=None, batch_size=None):
    """A member (or destination) that is a tensor object in caller memory."""
    ptr, size = _ptr_size(ptr, size)
    return _TensorObjectBuffer(ptr, size, owner, batch_size)


def raw_destination(ptr, size, owner=None, *, pre_registered=False):
    """A destination that is caller memory: a member's bytes land there."""
    ptr, size = _ptr_size(ptr, size)
    return _RawDestination(ptr, size, owner, bool(pre_registered))


def _ptr_size(ptr, size):
    if isinstance(ptr, bool) or isinstance(size, bool) or \
            not isinstance(ptr, numbers.Integral) or not isinstance(size, numbers.Integral):
        raise TypeError("ptr and size must be integers")
    if ptr <= 0 or size < 0:
        raise ValueError("ptr must be positive and size non-negative")
    return int(ptr), int(size)


# -- checks --------------------------------------------------------------------

def _segment(value, what):
    """A key component: a non-empty str without '/' or control characters."""
    if not isinstance(value, str) or not value or "/" in value or \
            any(ord(c) < 32 for c in value):
        raise ValueError("invalid bundle %s: %r" % (what, value))
    return value


def _chunk_bytes(n):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n <= 0:
        raise ValueError("chunk_bytes must be a positive integer, got %r" % (n,))
    return int(n)


def _policy(policy, max_inflight_put=None):
    p = BundleTransferPolicy() if policy is None else policy
    if not isinstance(p, BundleTransferPolicy):
        raise TypeError("policy must be a BundleTransferPolicy")
    n = p.max_inflight_put if max_inflight_put is None else max_inflight_put
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError("max_inflight_put must be an integer >= 1, got %r" % (n,))
    if p.put_mode not in ("auto", "batch", "parallel"):
        raise ValueError("put_mode must be auto, batch or parallel, got %r" % (p.put_mode,))
    if p.copy_mode not in ("auto", "copy", "zero_copy"):
        raise ValueError("copy_mode must be auto, copy or zero_copy, got %r" % (p.copy_mode,))
    return BundleTransferPolicy(int(n), p.put_mode, p.copy_mode)


def _json_bytes(value, what):
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise TypeError("%s must be JSON-serializable: %s" % (what, e)) from e


def _json_dict(data, what):
    try:
        value = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError("%s is damaged (not JSON): %s" % (what, e)) from e
    if not isinstance(value, dict):
        raise ValueError("%s is damaged: not a JSON object" % what)
    return value


def _json_safe(value):
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    raise TypeError("DataProto handles hold only JSON-safe values, got %s" % type(value).__name__)


def _copy_config(config):
    """A copy of a write config to change group_ids on, the caller's left alone."""
    try:
        return copy.copy(config)
    except Exception:
        ns = SimpleNamespace()
        for k in dir(config):
            if not k.startswith("_"):
                v = getattr(config, k, None)
                if not callable(v):
                    setattr(ns, k, v)
        return ns


def _one_group(config):
    """The one logical group config.group_ids names: (named?, id or None).
    A str is one id; [] and "" mean ungrouped; more than one is an error."""
    g = getattr(config, "group_ids", None) if config is not None else None
    if g is None:
        return False, None
    if isinstance(g, str):
        ids = [g]
    else:
        try:
            ids = list(g)
        except TypeError as e:
            raise ValueError("structured object store config.group_ids must contain strings") \
                from e
    if len(ids) > 1:
        raise ValueError("structured object store config.group_ids must hold exactly one"
                         " logical group id (it is applied to every key), got %d" % len(ids))
    if ids and not isinstance(ids[0], str):
        raise ValueError("structured object store config.group_ids must contain strings")
    return True, (ids[0] or None) if ids else None


def _key_config(config):
    """The config for one store key: group_ids as a one-id list (a str
    becomes one), None for an empty list; a one-id list is passed as is."""
    named, gid = _one_group(config)
    g = getattr(config, "group_ids", None) if named else None
    if not named or (not isinstance(g, str) and len(list(g)) == 1):
        return config
    c = _copy_config(config)
    c.group_ids = None if not isinstance(g, str) else [g]
    return c


def _config_for_grouped_keys(config, key_count):
    """The config for a batch write of key_count keys: the one group id
    repeated per key."""
    named, _ = _one_group(config)
    if not named or key_count <= 0:
        return config
    g = config.group_ids
    ids = [g] if isinstance(g, str) else list(g)
    c = _copy_config(config)
    c.group_ids = ids * key_count if ids else None
    return c


def _with_group(config, gid):
    if gid is None:
        return config
    if config is None:
        try:
            from kvengine.mooncake import ReplicateConfig
            c = ReplicateConfig()
        except ImportError:
            c = SimpleNamespace()
    else:
        c = _copy_config(config)
    c.group_ids = [gid]
    return c


def _status(rc, op, key):
    """A store call's result: 0 (or a non-negative count) is fine."""
    if isinstance(rc, numbers.Integral) and not isinstance(rc, bool) and rc < 0:
        raise RuntimeError("%s(%r) failed with %d" % (op, key, rc))
    return rc


# -- the store, as the bundle layer uses it ---------------------------------------

class _Io:
    """The store calls a bundle needs, each using the faster call when the
    store has it (put_tensor, batch_remove, get_into_ranges) and the plain
    put/get/remove otherwise, so any BundleStore works."""

    def __init__(self, store):
        for name in ("put", "get", "remove"):
            if not callable(getattr(store, name, None)):
                raise TypeError("the store needs put, get and remove (missing %s)" % name)
        self.store = store

    def _has(self, name):
        return callable(getattr(self.store, name, None))

    def put(self, key, data, config):
        config = _key_config(config)
        if config is None:
            rc = self.store.put(key, data)
        else:
            rc = self.store.put(key, data, config=config)
        _status(rc, "put", key)

    def put_many(self, items, policy, config, written, pool=None):
        """items: [(key, bytes-like)]. Each key is appended to written as its
        put is issued, so a failure leaves nothing to clean up that written
        does not list. As Mooncake documents its policy: "copy" uses put
        (max_inflight_put at a time); "auto" stages the items in one lease
        of the transfer's buffer pool and writes them with one
        batch_put_from, put without a pool; "zero_copy" only batch_put_from,
        from the items' own memory (registered for the call). kvengine's
        batch_put_from is one kv_put_many: a round per owner."""
        if not items:
            return
        staged = pool is not None and policy.copy_mode == "auto"
        batch = self._has("batch_put_from") and policy.put_mode != "parallel" and (
            policy.copy_mode == "zero_copy" or staged)
        if policy.copy_mode == "zero_copy" and not batch:
            raise RuntimeError("zero-copy put needs the store's batch_put_from (and"
                               " put_mode other than parallel)")
        if batch:
            left = self._batch_put_from(items, config, written, pool if staged else None)
            if not left:
                return
            if policy.copy_mode == "zero_copy":
                raise RuntimeError("zero-copy put: batch_put_from failed for %r" % (left[0][0],))
            items = left
        if policy.max_inflight_put > 1 and len(items) > 1:
            with ThreadPoolExecutor(min(policy.max_inflight_put, len(items))) as pool:
                futures = []
                for k, v in items:
                    written.append(k)
                    futures.append(pool.submit(self.put, k, v, config))
                for f in futures:
                    f.result()
        else:
            for k, v in items:
                written.append(k)
                self.put(k, v, config)

    def _batch_put_from(self, items, config, written, pool):
        """One batch_put_from of items (staged in a lease of pool when one
        is given); returns the items it did not store."""
        keys = [k for k, _ in items]
        sizes = [len(memoryview(v).cast("B")) for _, v in items]
        regs, lease = [], None
        if pool is not None:
            lease = pool.acquire(sum(sizes))
            if lease.size < sum(sizes):
                lease.release()
                raise RuntimeError("the buffer pool gave %d bytes for %d" % (lease.size, sum(sizes)))
            off, ptrs = 0, []
            for (_, v), n in zip(items, sizes):
                if n:
                    ctypes.memmove(lease.ptr + off, int(np.frombuffer(v, np.uint8).ctypes.data), n)
                ptrs.append(lease.ptr + off)
                off += n
        else:
            arrays = [np.frombuffer(v, np.uint8) for _, v in items]
            ptrs = [int(a.ctypes.data) for a in arrays]
            if self._has("register_buffer") and self._has("unregister_buffer"):
                regs = [p for p, n in zip(ptrs, sizes) if self.store.register_buffer(p, n) == 0]
        written.extend(keys)
        try:
            c = _config_for_grouped_keys(config, len(keys))
            res = self.store.batch_put_from(keys, ptrs, sizes) if c is None else \
                self.store.batch_put_from(keys, ptrs, sizes, config=c)
        finally:
            for p in regs:
                self.store.unregister_buffer(p)
            if lease is not None:
                lease.release()
        res = list(res) if res is not None else []
        if len(res) != len(items):
            return list(items)
        return [it for it, r in zip(items, res) if r != 0]

    def put_tensor(self, key, tensor, config):
        """True when the store stored it as a tensor object itself."""
        config = _key_config(config)
        name = "put_tensor" if config is None else "pub_tensor"
        if not self._has(name):
            return False
        fn = getattr(self.store, name)
        _status(fn(key, tensor) if config is None else fn(key, tensor, config), name, key)
        return True

    def put_from(self, key, ptr, size, config):
        config = _key_config(config)
        for name in ("put_tensor_from", "put_from"):
            if self._has(name):
                fn = getattr(self.store, name)
                rc = fn(key, ptr, size) if config is None or name == "put_tensor_from" \
                    else fn(key, ptr, size, config=config)
                if rc == 0 or name == "put_from":
                    _status(rc, name, key)
                    return
        if config is None:
            self.put(key, ctypes.string_at(ptr, size), None)
        else:
            self.put(key, ctypes.string_at(ptr, size), config)

    def get(self, key, size):
        """The whole object, which must be size bytes."""
        data = self.store.get(key)
        if data is None or len(data) != size:
            have = 0 if data is None else len(data)
            if have == 0:
                raise KeyError("store object %r is missing" % key)
            raise ValueError("store object %r has %d bytes, its manifest says %d"
                             % (key, have, size))
        return data

    def read_pieces(self, pieces, out):
        """Copies pieces [(key, object size, offset in it, length, offset in
        out)] into out (a uint8 ndarray), in one store call where the store can:
        batch_get_into when every piece is a whole object, get_into_ranges
        otherwise (out registered for the call), whole-object gets else."""
        pieces = [p for p in pieces if p[3] > 0]
        if not pieces:
            return
        whole = all(off == 0 and n == size for _, size, off, n, _ in pieces)
        fast = "batch_get_into" if whole and self._has("batch_get_into") else \
            ("get_into_ranges" if self._has("get_into_ranges") else None)
        if fast is not None and self._has("register_buffer") and self._has("unregister_buffer"):
            base = int(out.ctypes.data)
            if self.store.register_buffer(base, len(out)) == 0:
                try:
                    if self._read_fast(fast, base, pieces):
                        return
                finally:
                    self.store.unregister_buffer(base)
        # the plain path, which also says precisely what is wrong (an object
        # missing, or of another size than the manifest says)
        got = {}
        for key, size, off, n, dst in pieces:
            if key not in got:
                got[key] = self.get(key, size)
            out[dst:dst + n] = np.frombuffer(got[key], np.uint8, n, off)

    def _read_fast(self, fast, base, pieces):
        if fast == "batch_get_into":
            res = self.store.batch_get_into([p[0] for p in pieces],
                                            [base + p[4] for p in pieces],
                                            [p[3] for p in pieces])
            res = list(res) if res is not None else []
            return len(res) == len(pieces) and all(r == p[3] for r, p in zip(res, pieces))
        keys, dsts, srcs, sizes = [], [], [], []
        for key, _, off, n, dst in pieces:
            if not keys or keys[-1] != key:
                keys.append(key)
                dsts.append([])
                srcs.append([])
                sizes.append([])
            dsts[-1].append(dst)
            srcs[-1].append(off)
            sizes[-1].append(n)
        res = self.store.get_into_ranges([base], [keys], [dsts], [srcs], [sizes])
        try:
            flat = [r for per_key in res[0] for r in per_key]
        except (TypeError, IndexError):
            flat = []
        want = [n for per_key in sizes for n in per_key]
        if len(flat) != len(want) or any(r != n for r, n in zip(flat, want)):
            return False
        # a range read cannot see an object's size: check it once per key
        # where the store says (get_size), as the whole-object reads do
        if self._has("get_size"):
            for key, size in dict((p[0], p[1]) for p in pieces).items():
                have = self.store.get_size(key)
                if isinstance(have, int) and have >= 0 and have != size:
                    raise ValueError("store object %r has %d bytes, its manifest says %d"
                                     % (key, have, size))
        return True

    def remove_all(self, keys):
        """Removes every key (forced: these are ours); a key already gone is
        fine. Raises after trying them all when some could not go."""
        keys = list(dict.fromkeys(keys))
        left = keys
        if self._has("batch_remove") and keys:
            try:
                res = self.store.batch_remove(keys, force=True)
            except TypeError:
                res = self.store.batch_remove(keys)
            left = [k for k, r in zip(keys, res) if r not in (0, MISSING_OBJECT_ERROR)]
        failed = []
        for k in left:
            try:
                rc = self.store.remove(k, force=True)
            except TypeError:
                rc = self.store.remove(k)
            if rc not in (0, MISSING_OBJECT_ERROR, None):
                failed.append((k, rc))
        if failed:
            raise RuntimeError("cleanup could not remove %d keys (first: %r, %d)"
                               % (len(failed), failed[0][0], failed[0][1]))


# -- msgpack, for the msgpack_ragged codec (msgpack's published format) -------------

def _mp_pack(v, out, depth=0):
    if depth > _infer.MAX_DEPTH:
        raise ValueError("nested too deep")
    if v is None:
        out.append(0xc0)
    elif v is True or v is False:
        out.append(0xc3 if v else 0xc2)
    elif type(v) is int:
        if 0 <= v < 128:
            out.append(v)
        elif -32 <= v < 0:
            out.append(v & 0xff)
        elif 0 <= v < 2 ** 64:
            out += b"\xcf" + struct.pack(">Q", v)
        elif -2 ** 63 <= v < 0:
            out += b"\xd3" + struct.pack(">q", v)
        else:
            raise ValueError("integer out of msgpack's range")
    elif type(v) is float:
        out += b"\xcb" + struct.pack(">d", v)
    elif type(v) is str:
        b = v.encode("utf-8")
        if len(b) < 32:
            out.append(0xa0 | len(b))
        else:
            out += b"\xdb" + struct.pack(">I", len(b))
        out += b
    elif type(v) in (bytes, bytearray):
        out += b"\xc6" + struct.pack(">I", len(v)) + bytes(v)
    elif type(v) is list:
        out += (bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdd" + struct.pack(">I", len(v)))
        for x in v:
            _mp_pack(x, out, depth + 1)
    elif type(v) is dict:
        out += (bytes([0x80 | len(v)]) if len(v) < 16 else b"\xdf" + struct.pack(">I", len(v)))
        for k, x in v.items():
            _mp_pack(k, out, depth + 1)
            _mp_pack(x, out, depth + 1)
    else:
        raise TypeError("msgpack cannot encode %s" % type(v).__name__)


def _mp_unpack(b, i, depth=0):
    if depth > _infer.MAX_DEPTH or i >= len(b):
        raise ValueError("msgpack data is damaged")
    t = b[i]
    i += 1

    def take(n):
        if i + n > len(b):
            raise ValueError("msgpack data is truncated")
        return b[i:i + n]
    if t < 0x80:
        return t, i
    if t >= 0xe0:
        return t - 256, i
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return bytes(take(n)).decode("utf-8"), i + n
    if 0x90 <= t <= 0x9f or t in (0xdc, 0xdd):
        n, i = ((t & 0x0f), i) if t <= 0x9f else \
            ((struct.unpack(">H", take(2))[0], i + 2) if t == 0xdc
             else (struct.unpack(">I", take(4))[0], i + 4))
        out = []
        for _ in range(n):
            x, i = _mp_unpack(b, i, depth + 1)
            out.append(x)
        return out, i
    if 0x80 <= t <= 0x8f or t in (0xde, 0xdf):
        n, i = ((t & 0x0f), i) if t <= 0x8f else \
            ((struct.unpack(">H", take(2))[0], i + 2) if t == 0xde
             else (struct.unpack(">I", take(4))[0], i + 4))
        out = {}
        for _ in range(n):
            k, i = _mp_unpack(b, i, depth + 1)
            x, i = _mp_unpack(b, i, depth + 1)
            out[k] = x
        return out, i
    simple = {0xc0: None, 0xc2: False, 0xc3: True}
    if t in simple:
        return simple[t], i
    fixed = {0xcc: ">B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q", 0xd0: ">b", 0xd1: ">h",
             0xd2: ">i", 0xd3: ">q", 0xca: ">f", 0xcb: ">d"}
    if t in fixed:
        n = struct.calcsize(fixed[t])
        return struct.unpack(fixed[t], take(n))[0], i + n
    lens = {0xd9: (">B", "s"), 0xda: (">H", "s"), 0xdb: (">I", "s"),
            0xc4: (">B", "b"), 0xc5: (">H", "b"), 0xc6: (">I", "b")}
    if t in lens:
        fmt, kind = lens[t]
        w = struct.calcsize(fmt)
        n = struct.unpack(fmt, take(w))[0]
        i += w
        data = bytes(take(n))
        return (data.decode("utf-8") if kind == "s" else data), i + n
    raise ValueError("msgpack type 0x%02x is not supported" % t)


# -- non-tensor codecs (payload members: data, offsets, shapes, ndims, nulls) -----------

def _np_dtype_of_torch(name):
    return np.dtype(str(name).replace("torch.", "")) if name != "torch.bool" else np.dtype(bool)


def _contiguous(a):
    return a if a.flags.c_contiguous else a.copy(order="C")


def _ragged_arrays(values, dtype):
    """The typed_ragged payload of rows that are arrays, lists or None."""
    # np.asarray + a copy only when strided: np.ascontiguousarray would make
    # a 0-d row (np.asarray(7)) 1-d, and it would read back as [7]
    arrays = [np.zeros(0, dtype) if v is None else _contiguous(np.asarray(v, dtype=dtype))
              for v in values]
    if any(a.dtype.hasobject for a in arrays):
        raise ValueError("typed_ragged rows must be numeric")
    max_ndim = max((a.ndim for a in arrays), default=0)
    offsets = np.zeros(len(arrays) + 1, np.int64)
    shapes = np.zeros((len(arrays), max(max_ndim, 1)), np.int64)
    ndims = np.zeros(len(arrays), np.int16)
    for r, a in enumerate(arrays):
        offsets[r + 1] = offsets[r] + a.size
        ndims[r] = a.ndim
        shapes[r, :a.ndim] = a.shape
    data = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, dtype)
    is_nd = [v is not None and isinstance(v, np.ndarray) for v in values]
    fmt = "ndarray" if all(v is None or n for v, n in zip(values, is_nd)) else \
        ("mixed" if any(is_nd) else "list")
    if fmt == "ndarray":
        # Rows of arrays, Mooncake's way: a null row has no dims (ndims 0)
        # and does not count toward max_ndim; when every row is an array of
        # one rank >= 1 with one trailing shape, a null row's shape is
        # (0, *that trailing shape). Rows of lists keep an empty 1-d row.
        nn = [a for v, a in zip(values, arrays) if v is not None]
        max_ndim = max((a.ndim for a in nn), default=0)
        tail = nn[0].shape[1:] if nn and nn[0].ndim >= 1 else None
        if tail is not None and (0 in tail or any(a.shape[1:] != tail or a.ndim != nn[0].ndim
                                                  for a in nn)):
            tail = None
        shapes = np.zeros((len(arrays), max(max_ndim, 1)), np.int64)
        for r, (v, a) in enumerate(zip(values, arrays)):
            if v is None:
                ndims[r] = 0
                if tail is not None:
                    shapes[r, 1:max_ndim] = tail
            else:
                shapes[r, :a.ndim] = a.shape
    payload = {"data": data.astype(dtype, copy=False), "offsets": offsets, "shapes": shapes,
               "ndims": ndims, "nulls": np.asarray([v is None for v in values], np.bool_)}
    meta = {"dtype": str(np.dtype(dtype)), "max_ndim": int(max_ndim), "shape_policy": "ragged",
            "row_format": fmt, "ndarray_rows": is_nd if fmt == "mixed" else None}
    if fmt == "ndarray" and values:
        # Mooncake's name for this data layout (the rows' elements back to
        # back, row r at offsets[r]); its reader takes its fast path, rows
        # as views of one array, only when the manifest says so.
        meta["physical_layout"] = "contiguous_flat"
    return payload, meta


def _bytes_rows(parts):
    offsets = np.zeros(len(parts) + 1, np.int64)
    for r, p in enumerate(parts):
        offsets[r + 1] = offsets[r] + (0 if p is None else len(p))
    # bytes, not a uint8 array: its field spec is then {"encoding": "bytes"},
    # as Mooncake writes the data of its byte-row codecs
    data = b"".join(bytes(p) for p in parts if p is not None)
    return {"data": data,
            "offsets": offsets,
            "nulls": np.asarray([p is None for p in parts], np.bool_)}


# -- ragged_tensor_dict: rows that are dicts of tensors, named by a FieldSchema ----
# Never inferred. Each key is its own ragged_tensor column (payload members
# "<key>.data", "<key>.offsets", ... , None where a row is null or lacks the
# key), plus "null_mask" for rows that are None; the metadata lists the keys
# (the schema's metadata["keys"] in its order, else the rows' keys sorted)
# and each key's column metadata, as Mooncake lays it out, so one key can be
# read without the others.

def _tensor_dict_keys(keys, path):
    out = []
    for k in keys:
        if not isinstance(k, str):
            raise TypeError("%s: ragged_tensor_dict keys must be str, got %s"
                            % (path, type(k).__name__))
        if not k:
            raise ValueError("%s: ragged_tensor_dict keys must not be empty" % path)
        if any(c in k for c in "./\\"):
            raise ValueError("%s: ragged_tensor_dict key %r must not contain '.', '/' or '\\'"
                             % (path, k))
        if k in out:
            raise ValueError("%s: ragged_tensor_dict key %r is named twice" % (path, k))
        out.append(k)
    return out


def _encode_tensor_dicts(path, vals, schema_meta):
    declared = schema_meta.get("keys")
    if declared is not None:
        if isinstance(declared, (str, bytes)):
            raise TypeError("%s: FieldSchema metadata['keys'] must be a list of str" % path)
        declared = _tensor_dict_keys(list(declared), path)
    seen = set()
    for r, v in enumerate(vals):
        if v is None:
            continue
        if not isinstance(v, Mapping):
            raise TypeError("%s: ragged_tensor_dict rows must be dicts or None; row %d is %s"
                            % (path, r, type(v).__name__))
        row_keys = _tensor_dict_keys(list(v), path)
        nulls = [k for k in row_keys if v[k] is None]
        if nulls:
            raise TypeError("%s: row %d has explicit None for %s; leave the key out instead"
                            % (path, r, nulls))
        if declared is not None:
            extra = sorted(set(row_keys) - set(declared))
            if extra:
                raise ValueError("%s: row %d has keys not declared in FieldSchema "
                                 "metadata['keys']: %s" % (path, r, extra))
        seen.update(row_keys)
    keys = declared if declared is not None else sorted(seen)
    payload = {"null_mask": np.asarray([v is None for v in vals], np.bool_)}
    key_codecs = {}
    for k in keys:
        col = [None if v is None else v.get(k) for v in vals]
        try:
            _, sub, meta = _encode_column("%s.%s" % (path, k), col, "ragged_tensor")
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError("%s: ragged_tensor_dict key %r: %s" % (path, k, e)) from e
        for n, x in sub.items():
            payload["%s.%s" % (k, n)] = x
        key_codecs[k] = meta
    return "ragged_tensor_dict", payload, {"keys": list(keys), "key_codecs": key_codecs}


def _decode_tensor_dicts(path, rows, payload, meta):
    keys, codecs = meta.get("keys"), meta.get("key_codecs")
    if not isinstance(keys, list) or not isinstance(codecs, dict):
        raise ValueError("%s: ragged_tensor_dict metadata needs keys and key_codecs" % path)
    keys = _tensor_dict_keys(keys, path)
    if "null_mask" not in payload:
        raise ValueError("%s: payload 'null_mask' is missing" % path)
    nm = payload["null_mask"]
    nm = np.frombuffer(bytes(nm), np.bool_) if isinstance(nm, (bytes, bytearray, memoryview)) \
        else np.asarray(nm, np.bool_).reshape(-1)
    if len(nm) != rows:
        raise ValueError("%s: %d null flags for %d rows" % (path, len(nm), rows))
    cols = {}
    for k in keys:
        pre = k + "."
        sub = {n[len(pre):]: x for n, x in payload.items() if n.startswith(pre)}
        cm = codecs.get(k)
        if not isinstance(cm, dict):
            raise ValueError("%s: ragged_tensor_dict key %r has no column metadata" % (path, k))
        cols[k] = _decode_column("%s.%s" % (path, k), "ragged_tensor", rows, sub, cm)
    return [None if nm[r] else {k: cols[k][r] for k in keys if cols[k][r] is not None}
            for r in range(rows)]


def _encode_column(path, values, codec, schema_meta=None):
    """(codec, payload {name: ndarray}, metadata) for a column of values."""
    schema_meta = schema_meta or {}
    vals = [None if v is _infer.MISSING else v for v in values]
    if codec == "ragged_tensor_dict":
        return _encode_tensor_dicts(path, vals, schema_meta)
    if codec == "ndarray":
        present = [v for v in vals if v is not None]
        dtype = np.dtype(schema_meta["dtype"]) if "dtype" in schema_meta else \
            (np.asarray(present).dtype if present else np.dtype(np.int64))
        if dtype.hasobject:
            raise ValueError("%s: ndarray codec needs numeric scalars" % path)
        fill = False if dtype == np.bool_ else 0
        data = np.asarray([fill if v is None else v for v in vals], dtype=dtype)
        return codec, {"data": data, "nulls": np.asarray([v is None for v in vals], np.bool_)}, \
            {"dtype": str(data.dtype), "shape": list(data.shape)}
    if codec in ("typed_ragged", "ragged_tensor"):
        tdtype = None
        rows = []
        for v in vals:
            if _torch is not None and isinstance(v, _torch.Tensor):
                if tdtype is not None and v.dtype != tdtype:
                    raise ValueError("%s: mixed tensor dtypes %s and %s" % (path, tdtype, v.dtype))
                tdtype = v.dtype
                if v.dtype == _torch.bfloat16:
                    raise ValueError("%s: the ragged tensor codec does not support torch.bfloat16"
                                     % path)
                v = v.detach().cpu().contiguous().numpy()
            rows.append(v)
        if "dtype" in schema_meta:
            dtype = _np_dtype_of_torch(schema_meta["dtype"])
        else:
            present = [np.asarray(v) for v in rows if v is not None]
            # no value to go by: Mooncake's defaults (torch.float32 for tensors)
            dtype = np.result_type(*present) if present else \
                np.dtype(np.float32 if codec == "ragged_tensor" else np.int64)
        payload, meta = _ragged_arrays(rows, dtype)
        if codec == "ragged_tensor":
            meta["dtype"] = str(tdtype) if tdtype is not None else "torch.%s" % np.dtype(dtype).name
        return codec, payload, meta
    if codec == "bytes_ragged":
        if any(v is not None and not isinstance(v, (bytes, bytearray, memoryview)) for v in vals):
            raise TypeError("%s: bytes_ragged rows must be bytes-like" % path)
        return codec, _bytes_rows(vals), {}
    if codec == "utf8_ragged":
        return codec, _bytes_rows([None if v is None else v.encode("utf-8") for v in vals]), {}
    if codec == "json_ragged":
        return codec, _bytes_rows([None if v is None else _json_bytes(v, path) for v in vals]), {}
    if codec == "msgpack_ragged":
        data = bytearray()
        offsets = np.zeros(len(vals) + 1, np.int64)
        for r, v in enumerate(vals):
            if v is not None:
                try:
                    _mp_pack(v, data)
                except (TypeError, ValueError) as e:
                    raise ValueError("%s: msgpack codec cannot encode row %d: %s" % (path, r, e))
            offsets[r + 1] = len(data)
        return codec, {"data": bytes(data),
                       "offsets": offsets,
                       "nulls": np.asarray([v is None for v in vals], np.bool_)}, {}
    raise ValueError("%s: unsupported codec %r" % (path, codec))


# What Mooncake's inference writes next to a codec it chose (not one a
# FieldSchema named): where the schema came from, what the rows were taken
# to be and why, by codec. Readers on neither side act on them; they are
# written so that a manifest reads the same whichever side wrote it.
_INFERRED = {
    "ndarray": ("all rows are numeric scalar", "numeric scalar"),
    "bytes_ragged": ("all rows are bytes-like", "bytes-like"),
    "utf8_ragged": ("all rows are str", "str"),
    "msgpack_ragged": ("all rows are msgpack-like", "msgpack"),
    "ragged_tensor": ("all non-null rows are Tensor", "torch.Tensor"),
    "typed_ragged": ("all rows are numeric sequences", "numeric sequence"),
    "json_ragged": ("all rows are null or missing", "json"),
}


def _note_inferred(codec, values, meta):
    """meta (a column's metadata) with the inference's notes for codec."""
    if codec not in _INFERRED:
        return meta
    reason, kind = _INFERRED[codec]
    present = [v for v in values if v is not None and v is not _infer.MISSING]
    if codec == "typed_ragged" and present and all(isinstance(v, np.ndarray) for v in present):
        reason = "all rows are numeric ndarray"
        meta["recursive_source"] = "ndarray"
    meta.update({"schema_source": "inferred_from_runtime_values", "decision_reason": reason,
                 "normalized_type": kind})
    return meta


def _auto_codec(path, values):
    present = [v for v in values if v is not None and v is not _infer.MISSING]
    if not present:
        return "json_ragged"
    # numeric ndarray rows (equal or ragged shapes) are typed_ragged here too
    if all(isinstance(v, np.ndarray) and not v.dtype.hasobject for v in present):
        return "typed_ragged"
    decision = _infer._choose_leaf_codec(values)
    if not decision.accepted:
        if decision.codec == "ragged_tensor":
            raise ValueError("%s: mixed tensor dtypes (%s)" % (path, decision.reason))
        raise ValueError("unsupported structured non-tensor field %s: unable to infer a safe"
                         " codec (%s)" % (path, decision.reason))
    return decision.codec


def _decode_column(path, codec, rows, payload, meta):
    def need(*names):
        for n in names:
            if n not in payload:
                raise ValueError("%s: payload %r is missing" % (path, n))
    if codec == "ragged_tensor_dict":
        return _decode_tensor_dicts(path, rows, payload, meta)
    if codec != "ndarray":
        need("data", "offsets")
        offsets = np.asarray(payload["offsets"], np.int64)
        if len(offsets) != rows + 1:
            raise ValueError("%s: offsets length %d does not match %d rows"
                             % (path, len(offsets), rows))
        if rows and (offsets[0] != 0 or np.any(np.diff(offsets) < 0)):
            raise ValueError("%s: offsets are not ascending from 0" % path)
    need("nulls")
    nulls = np.asarray(payload["nulls"], np.bool_)
    if len(nulls) != rows:
        raise ValueError("%s: %d null flags for %d rows" % (path, len(nulls), rows))
    if codec == "ndarray":
        need("data")
        data = np.asarray(payload["data"])
        if len(data) != rows:
            raise ValueError("%s: %d values for %d rows" % (path, len(data), rows))
        return [None if nulls[r] else data[r].item() for r in range(rows)]
    if codec in ("typed_ragged", "ragged_tensor"):
        need("shapes", "ndims")
        dtype = _np_dtype_of_torch(meta.get("dtype", "int64"))
        data = np.frombuffer(bytes(payload["data"]), dtype) if not \
            isinstance(payload["data"], np.ndarray) else payload["data"].view(dtype).reshape(-1)
        if rows and offsets[-1] > data.size:
            raise ValueError("%s: data is shorter than its offsets" % path)
        shapes, ndims = payload["shapes"], payload["ndims"]
        fmt = meta.get("row_format", "list")
        nd_rows = meta.get("ndarray_rows") or []
        out = []
        for r in range(rows):
            if nulls[r]:
                out.append(None)
                continue
            shape = tuple(int(x) for x in shapes[r][:int(ndims[r])])
            a = data[offsets[r]:offsets[r + 1]].reshape(shape).copy()
            if codec == "ragged_tensor":
                out.append(_torch.from_numpy(a))
            elif fmt == "ndarray" or (fmt == "mixed" and r < len(nd_rows) and nd_rows[r]):
                out.append(a)
            else:
                out.append(a.tolist())
        return out
    raw = bytes(np.asarray(payload["data"]).view(np.uint8).reshape(-1)) \
        if isinstance(payload["data"], np.ndarray) else bytes(payload["data"])
    if rows and offsets[-1] > len(raw):
        raise ValueError("%s: data is shorter than its offsets" % path)
    parts = [None if nulls[r] else raw[offsets[r]:offsets[r + 1]] for r in range(rows)]
    if codec == "bytes_ragged":
        return parts
    if codec == "utf8_ragged":
        return [None if p is None else p.decode("utf-8") for p in parts]
    if codec == "json_ragged":
        return [None if p is None else json.loads(p) for p in parts]
    if codec == "msgpack_ragged":
        out = []
        for p in parts:
            if p is None:
                out.append(None)
                continue
            v, end = _mp_unpack(p, 0)
            if end != len(p):
                raise ValueError("%s: a msgpack row has trailing bytes" % path)
            out.append(v)
        return out
    raise ValueError("%s: unknown codec %r" % (path, codec))


# -- structured_recursive: rows of nested dicts and lists, with tensors inside --------
# The rows are walked as mooncake_structured's inference walks them: a node
# per dict level (its keys) and per list of containers (its per-row
# lengths; the items of every row form the next level's rows), a leaf per
# column of values, encoded by the codecs above. Each level keeps, per row,
# whether the value was absent (MISSING: the dict lacked the key) and
# whether it held a container (else it was None), so decoding gives back
# "key absent" and "key present, None" apart.

def _is_null(v):
    return v is None or v is _infer.MISSING


def _recursive_fits(values):
    present = [v for v in values if not _is_null(v)]
    return bool(present) and (all(isinstance(v, dict) for v in present) or
                              all(isinstance(v, list) for v in present))


def _encode_recursive(path, values):
    nodes, leaves, payload = [], [], {}

    def flags(name, vals, test, dtype=np.bool_):
        payload[name] = np.asarray([test(v) for v in vals], dtype=dtype)
        return name

    def walk(p, vals, depth):
        if depth > _infer.MAX_DEPTH:
            raise ValueError("%s: nested deeper than %d levels" % (p, _infer.MAX_DEPTH))
        present = [v for v in vals if not _is_null(v)]
        if present and all(isinstance(v, dict) for v in present):
            keys = list(dict.fromkeys(k for v in present for k in v))
            for k in keys:
                if not isinstance(k, str) or not k or any(c in k for c in "./\\["):
                    raise ValueError("%s: dict keys must be non-empty str and must not contain"
                                     " '.', '/', '\\' or '[' (got %r)" % (p, k))
            keys.sort()     # Mooncake's order: a dict level's keys sorted
            i = len(nodes)
            node = {"id": i, "path": p, "node_type": "dict", "children": keys}
            nodes.append(node)
            node["missing_payload"] = flags("node.%d.missing" % i, vals, lambda v: v is _infer.MISSING)
            node["row_mask_payload"] = flags("node.%d.row_mask" % i, vals,
                                             lambda v: isinstance(v, dict))
            for k in keys:
                walk("%s.%s" % (p, k), [v.get(k, _infer.MISSING) if isinstance(v, dict) else v
                                        for v in vals], depth + 1)
            return
        if present and all(isinstance(v, list) for v in present) and \
                any(isinstance(x, (dict, list)) for v in present for x in v):
            i = len(nodes)
            node = {"id": i, "path": p, "node_type": "list", "children": []}
            nodes.append(node)
            node["missing_payload"] = flags("node.%d.missing" % i, vals, lambda v: v is _infer.MISSING)
            node["row_mask_payload"] = flags("node.%d.row_mask" % i, vals,
                                             lambda v: isinstance(v, list))
            node["lengths_payload"] = flags("node.%d.lengths" % i, vals,
                                            lambda v: len(v) if isinstance(v, list) else 0,
                                            np.int64)
            walk(p + "[0]", [x for v in vals if isinstance(v, list) for x in v], depth + 1)
            return
        i = len(leaves)
        plain = [None if v is _infer.MISSING else v for v in vals]
        codec, lp, meta = _encode_column(p, plain, _auto_codec(p, plain))
        _note_inferred(codec, plain, meta)
        members = {}
        for name, value in lp.items():
            payload["leaf.%d.%s" % (i, name)] = value
            members[name] = "leaf.%d.%s" % (i, name)
        members["missing"] = flags("leaf.%d.missing" % i, vals, lambda v: v is _infer.MISSING)
        leaves.append({"id": i, "path": p, "codec": codec, "rows": len(vals), "metadata": meta,
                       "payload_members": members})
    walk(path, list(values), 0)
    return "structured_recursive", payload, {
        "schema_source": "inferred_from_runtime_values", "structure_version": 1,
        "root_path": path, "nodes": nodes, "leaves": leaves}


def _decode_recursive(name, rows, payload, meta):
    def get(member, what):
        if member not in payload:
            raise ValueError("%s: %s payload %r is missing" % (name, what, member))
        return payload[member]
    try:
        by_path = {n["path"]: ("node", n) for n in meta["nodes"]}
        by_path.update({lf["path"]: ("leaf", lf) for lf in meta["leaves"]})
        root = meta["root_path"]
    except (KeyError, TypeError) as e:
        raise ValueError("%s: structured_recursive metadata is damaged" % name) from e

    def column(p, count, depth):
        if depth > _infer.MAX_DEPTH or p not in by_path:
            raise ValueError("%s: structured_recursive metadata has no level %r" % (name, p))
        kind, d = by_path[p]
        if kind == "leaf":
            lp = {k: get(v, "leaf") for k, v in d["payload_members"].items() if k != "missing"}
            vals = _decode_column(p, d["codec"], int(d["rows"]), lp, d.get("metadata") or {})
            miss = get(d["payload_members"]["missing"], "leaf")
            if len(vals) != count or len(miss) != count:
                raise ValueError("%s: level %r has %d rows, expected %d" % (name, p, len(vals), count))
            return [_infer.MISSING if m else v for v, m in zip(vals, miss)]
        miss = get(d["missing_payload"], "node")
        mask = get(d["row_mask_payload"], "node")
        if len(miss) != count or len(mask) != count:
            raise ValueError("%s: level %r has %d rows, expected %d" % (name, p, len(miss), count))
        if d["node_type"] == "dict":
            kids = {k: column("%s.%s" % (p, k), count, depth + 1) for k in d["children"]}
            return [_infer.MISSING if miss[r] else
                    ({k: c[r] for k, c in kids.items() if c[r] is not _infer.MISSING}
                     if mask[r] else None) for r in range(count)]
        lengths = np.asarray(get(d["lengths_payload"], "node"), np.int64)
        if len(lengths) != count or np.any(lengths < 0):
            raise ValueError("%s: level %r has damaged lengths" % (name, p))
        items = column(p + "[0]", int(lengths.sum()), depth + 1)
        out, pos = [], 0
        for r in range(count):
            out.append(_infer.MISSING if miss[r] else
                       (items[pos:pos + lengths[r]] if mask[r] else None))
            pos += int(lengths[r])
        return out
    return [None if v is _infer.MISSING else v for v in column(root, rows, 0)]


# Helpers under the names Mooncake's module gives them, over the codecs and
# manifest format above (its tests and tools call them).

def _encode_manifest(manifest):
    return _json_bytes(manifest, "bundle manifest")


def _decode_manifest(data):
    return _json_dict(data, "bundle manifest")


class _EncodedField:
    """A non-tensor column as encoded: codec, rows, payload, metadata."""

    __slots__ = ("codec", "rows", "payload", "metadata")

    def __init__(self, codec, rows, payload, metadata):
        self.codec, self.rows, self.payload, self.metadata = codec, rows, payload, metadata


def _needs_recursive(path, vals):
    """True when rows of containers hold a column that Mooncake keeps out
    of a flat msgpack blob: tensors, bytes, or numeric ndarrays. Mooncake
    encodes such rows structured_recursive even when msgpack could pack
    them (bytes), so the drop-in does too: the same rows, the same layout."""
    leaves, nodes = [], []
    try:
        _infer.infer_structure(path, vals, leaves, nodes)
    except ValueError:
        return False
    if not nodes:
        return False
    for lf in leaves:
        present = [v for v in lf.values if not _is_null(v)]
        if lf.decision.codec in ("ragged_tensor", "bytes_ragged") and lf.decision.accepted:
            return True
        if any(isinstance(v, np.ndarray) and not v.dtype.hasobject for v in present):
            return True
    return False


def _infer_codec(path, vals):
    """A column's inferred codec: structured_recursive where Mooncake's
    inference picks it (_needs_recursive), else the flat one that fits,
    else structured_recursive when its rows can nest (ValueError otherwise)."""
    if _recursive_fits(vals) and _needs_recursive(path, vals):
        return "structured_recursive"
    try:
        return _auto_codec(path, vals)
    except ValueError:
        if not _recursive_fits(vals):
            raise
        return "structured_recursive"


def _encode_with_schema(path, values, schema):
    """A column encoded by schema.codec ("auto": inferred)."""
    vals = list(values)
    codec = schema.codec
    inferred = codec == "auto"
    if inferred:
        codec = _infer_codec(path, vals)
    if codec == "structured_recursive":
        codec, payload, meta = _encode_recursive(path, vals)
    else:
        codec, payload, meta = _encode_column(path, vals, codec, schema.metadata)
        if inferred:
            _note_inferred(codec, vals, meta)
    return _EncodedField(codec, len(vals), payload, meta)


def _encode_msgpack_ragged_values(path, values):
    _, payload, meta = _encode_column(path, list(values), "msgpack_ragged")
    return payload, meta


def _decode_msgpack_ragged_values(payload, rows):
    return _decode_column("msgpack_ragged", "msgpack_ragged", rows, payload, {})


def _object_array(values):
    a = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        a[i] = v
    return a


# -- members of a structured object ------------------------------------------------------

def _is_tensor(v):
    return _torch is not None and isinstance(v, _torch.Tensor)


def _tensor_lib():
    from kvengine import mooncake_tensor
    return mooncake_tensor


def _tensor_object(t):
    """A contiguous CPU tensor as Mooncake tensor object bytes, one copy."""
    tl = _tensor_lib()
    meta, ct = tl.tensor_meta(t)
    n = ct.numel() * ct.element_size()
    out = np.empty(len(meta) + n, np.uint8)
    out[:len(meta)] = np.frombuffer(meta, np.uint8)
    if n:
        ctypes.memmove(int(out.ctypes.data) + len(meta), ct.data_ptr(), n)
    return out


def _check_field_spec(name, fs):
    """A member's field spec as read from a store: believed once it parses."""
    def ints(v):
        return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                           and x >= 0 for x in v)
    ok = isinstance(fs, dict) and isinstance(fs.get("encoding", "bytes"), str)
    if ok and fs.get("encoding") == "ndarray":
        try:
            ok = not np.dtype(fs["dtype"]).hasobject and ints(fs["shape"])
        except (KeyError, TypeError, ValueError):
            ok = False
    if ok and fs.get("encoding") == "torch_tensor" and "shape" in fs:
        ok = ints(fs["shape"]) and isinstance(fs.get("dtype"), str) and \
            _torch is not None and isinstance(getattr(_torch, fs["dtype"].replace("torch.", ""),
                                                      None), _torch.dtype)
    if not ok:
        raise ValueError("structured field spec of member %r is damaged: %r" % (name, fs))


def _member_spec(name, value):
    """(field spec, what to store) for one member."""
    if isinstance(value, _TensorObjectBuffer):
        return {"encoding": "torch_tensor"}, value
    if _is_tensor(value):
        if value.is_nested:
            raise ValueError("member %r: nested tensors are not supported here" % name)
        return {"encoding": "torch_tensor", "dtype": str(value.dtype), "shape": list(value.shape),
                "element_size": int(value.element_size())}, value
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("member %r: an object ndarray cannot be stored as raw bytes"
                            " (put it in non_tensor_batch)" % name)
        a = np.ascontiguousarray(value)
        return {"encoding": "ndarray", "dtype": a.dtype.str, "shape": list(a.shape)}, \
            a.reshape(-1).view(np.uint8)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"encoding": "bytes"}, memoryview(value).cast("B")
    raise TypeError("member %r: cannot store a %s (numpy arrays, torch tensors, bytes-like and"
                    " tensor_object_buffer can be)" % (name, type(value).__name__))


class MooncakeBundleTransfer:
    """Structured objects and DataProto stages on a Mooncake store (any
    object with put/get/remove; the drop-in's MooncakeDistributedStore)."""

    def __init__(self, store, key_prefix="bundle", default_chunk_bytes=DEFAULT_BUNDLE_CHUNK_BYTES,
                 buffer_pool=None):
        if not isinstance(key_prefix, str):
            raise ValueError("key_prefix must be a non-empty str")
        prefix = key_prefix.strip("/")
        if not prefix or any(ord(c) < 32 for c in prefix):
            raise ValueError("key_prefix must be a non-empty key prefix, got %r" % (key_prefix,))
        self.store = store
        self.key_prefix = prefix
        self.default_chunk_bytes = _chunk_bytes(default_chunk_bytes)
        self.buffer_pool = buffer_pool
        self._io = _Io(store)

    # -- bundles ---------------------------------------------------------------------

    def _put_payload(self, key, view, chunk, items):
        """The payload spec of view stored at key (split into chunks);
        appends (key, bytes) to items."""
        n = len(view)
        if n == 0:
            return {"key": key, "bytes": 0, "chunks": []}
        parts = [view[i:i + chunk] for i in range(0, n, chunk)]
        keys = [key] if len(parts) == 1 else ["%s/chunk/%d" % (key, i) for i in range(len(parts))]
        items.extend(zip(keys, parts))
        return {"key": key, "bytes": n, "chunks": [{"key": k, "bytes": len(p)}
                                                  for k, p in zip(keys, parts)]}

    def _write_bundle(self, meta, members, partition, chunk_bytes, policy, config,
                      inherited=None):
        """Stores meta bytes and members ({name: (value to store)}) as a new
        bundle; inherited (a manifest) contributes its buffers by reference.
        Everything written is removed again when any write fails."""
        _segment(partition, "partition")
        chunk = _chunk_bytes(self.default_chunk_bytes if chunk_bytes is None else chunk_bytes)
        object_id = "%s/%s" % (partition, uuid.uuid4().hex)
        base = "%s/%s" % (self.key_prefix, object_id)
        items, meta_items, tensors, written = [], [], [], []
        meta_spec = self._put_payload(base + "/meta", memoryview(meta).cast("B"), chunk,
                                      meta_items)
        buffers = {}
        for name, value in members.items():
            _segment(name, "buffer name")
            key = "%s/buffer/%s" % (base, name)
            if isinstance(value, _TensorObjectBuffer) or _is_tensor(value):
                tensors.append((name, key, value))
            else:
                buffers[name] = self._put_payload(key, value, chunk, items)
        if any(not isinstance(v, _TensorObjectBuffer) for _, _, v in tensors) and \
                policy.copy_mode == "zero_copy":
            raise ValueError("copy_mode='zero_copy': zero-copy structured tensor fields require a"
                             " BufferPool tensor-object buffer (tensor_object_buffer), not a"
                             " plain torch tensor")
        try:
            for name, key, value in tensors:
                written.append(key)
                buffers[name] = self._put_tensor(key, value, policy, config, chunk, items)
            self._io.put_many(items, policy, config, written, self.buffer_pool)
            # metadata and manifest are small: always the copy path
            self._io.put_many(meta_items, BundleTransferPolicy(copy_mode="copy"), config, written)
            manifest = {"version": 1, "layout": "bundle", "object_id": object_id,
                        "meta": meta_spec, "buffers": buffers}
            if inherited is not None:
                merged = dict(inherited["buffers"])
                dup = sorted(set(merged) & set(buffers))
                if dup:
                    raise ValueError("structured members already exist: %s" % dup)
                merged.update(buffers)
                manifest["buffers"] = merged
                ids = set(inherited.get("buffer_object_ids", [inherited["object_id"]]))
                ids.add(object_id)
                manifest["buffer_object_ids"] = sorted(ids)
                old_base = "%s/%s" % (self.key_prefix, inherited["object_id"])
                cleanup = list(inherited.get("cleanup_keys", []))
                cleanup += [c["key"] for c in inherited["meta"]["chunks"]] + [old_base + "/manifest"]
                manifest["cleanup_keys"] = list(dict.fromkeys(cleanup))
            self._check_manifest(manifest)
            mkey = base + "/manifest"
            self._io.put(mkey, _json_bytes(manifest, "bundle manifest"), config)
        except BaseException:
            try:
                self._io.remove_all(written)
            except Exception:  # the write's own error is the one to report
                pass
            raise
        return RemoteBundleRef(manifest_key=mkey, manifest=manifest)

    def _put_tensor(self, key, value, policy, config, chunk, items):
        """A tensor member: through the store's put_tensor when it fits in
        one chunk, else (or with copy_mode "copy") as the tensor object's
        bytes, chunked like any payload (chunk_bytes bounds every object a
        bundle writes; kvengine refuses objects past its client buffer)."""
        if isinstance(value, _TensorObjectBuffer):
            self._io.put_from(key, value.ptr, value.size, config)
            return {"key": key, "bytes": value.size,
                    "chunks": [{"key": key, "bytes": value.size}],
                    "metadata_bytes": _tensor_lib().METADATA_SIZE}
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        meta_size = _tensor_lib().METADATA_SIZE
        total = meta_size + t.numel() * t.element_size()
        spec = {"key": key, "bytes": total, "chunks": [{"key": key, "bytes": total}],
                "metadata_bytes": meta_size}
        if total > chunk:
            data = _tensor_object(t)
            spec = self._put_payload(key, memoryview(data), chunk, items)
            spec["metadata_bytes"] = meta_size
            return spec
        if policy.copy_mode != "copy" and self._io.put_tensor(key, t, config):
            # stored by the store's tensor API: read back through get_tensor
            spec.update(kind="tensor", dtype=str(t.dtype), shape=list(t.shape))
            return spec
        data = _tensor_object(t.reshape(-1) if t.dim() == 0 else t)
        self._io.put(key, data, config)
        spec["bytes"] = spec["chunks"][0]["bytes"] = len(data)
        return spec

    def put_bundle(self, meta, buffers, partition="default", chunk_bytes=None, policy=None,
                   max_inflight_put=None, config=None):
        """Stores raw metadata bytes and named bytes-like buffers."""
        pol = _policy(policy, max_inflight_put)
        if not isinstance(meta, (bytes, bytearray, memoryview)):
            raise TypeError("bundle meta must be bytes-like")
        members = {}
        for name, value in buffers.items():
            if not isinstance(value, (bytes, bytearray, memoryview, np.ndarray)):
                raise TypeError("bundle buffer %r must be bytes-like" % (name,))
            members[name] = memoryview(np.ascontiguousarray(value).reshape(-1).view(np.uint8)
                                       if isinstance(value, np.ndarray) else value).cast("B")
        return self._write_bundle(meta, members, partition, chunk_bytes, pol, config)

    def _check_spec(self, spec, bases):
        if not isinstance(spec, dict):
            raise ValueError("bundle payload spec must be a dict")
        key = spec.get("key")
        if not isinstance(key, str) or not any(key.startswith(b + "/") for b in bases):
            raise ValueError("bundle payload key %r is outside the bundle namespace" % (key,))
        total = spec.get("bytes")
        chunks = spec.get("chunks")
        if not isinstance(total, int) or isinstance(total, bool) or total < 0 or \
                not isinstance(chunks, list) or (total and not chunks):
            raise ValueError("bundle payload spec of %r is damaged" % key)
        seen, s = set(), 0
        for c in chunks:
            ck = c.get("key") if isinstance(c, dict) else None
            cb = c.get("bytes") if isinstance(c, dict) else None
            if not isinstance(ck, str) or (ck != key and not ck.startswith(key + "/")):
                raise ValueError("bundle chunk key %r is outside the payload namespace" % (ck,))
            if ck in seen or not isinstance(cb, int) or isinstance(cb, bool) or cb < 0:
                raise ValueError("bundle chunk %r is damaged" % ck)
            seen.add(ck)
            s += cb
        if s != total:
            raise ValueError("bundle payload chunks total %d bytes, expected %d" % (s, total))

    def _check_manifest(self, m):
        if not isinstance(m, dict) or m.get("version") != 1 or m.get("layout") != "bundle":
            raise ValueError("invalid bundle manifest (version or layout)")
        oid = m.get("object_id")
        if not isinstance(oid, str) or not oid or ".." in oid.split("/"):
            raise ValueError("bundle manifest object_id is damaged")
        ids = m.get("buffer_object_ids", [oid])
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ValueError("bundle manifest buffer_object_ids must be a list of strings")
        bases = ["%s/%s" % (self.key_prefix, i) for i in ids]
        self._check_spec(m.get("meta"), ["%s/%s" % (self.key_prefix, oid)])
        bufs = m.get("buffers")
        if not isinstance(bufs, dict):
            raise ValueError("bundle manifest buffers must be a dict")
        for name, spec in bufs.items():
            _segment(name, "buffer name")
            self._check_spec(spec, bases)
        cleanup = m.get("cleanup_keys", [])
        if not isinstance(cleanup, list) or not all(
                isinstance(k, str) and any(k.startswith(b + "/") for b in bases) for k in cleanup):
            raise ValueError("bundle manifest cleanup_keys are outside the bundle namespace")

    def _manifest(self, ref):
        """The checked manifest of a ref (RemoteBundleRef, or a mapping with
        manifest_key and/or manifest)."""
        if isinstance(ref, RemoteBundleRef):
            key, m = ref.manifest_key, ref.manifest or None
        elif isinstance(ref, Mapping):
            key, m = ref.get("manifest_key"), ref.get("manifest") or None
        else:
            raise TypeError("expected a RemoteBundleRef or a mapping, got %s" % type(ref).__name__)
        if m is None:
            if not isinstance(key, str) or not key:
                raise ValueError("a bundle ref needs a manifest_key")
            data = self.store.get(key)
            if not data:
                raise KeyError("bundle manifest %r is not in the store" % key)
            m = _json_dict(data, "bundle manifest %r" % key)
        self._check_manifest(m)
        expected = "%s/%s/manifest" % (self.key_prefix, m["object_id"])
        if key is not None and key != expected:
            raise ValueError("bundle manifest_key %r does not match its object_id" % key)
        return m

    @staticmethod
    def _pieces(spec, offset, length, dst, pieces):
        """Appends the per-chunk pieces of bytes offset..offset+length of a
        payload, landing at dst onwards."""
        if offset < 0 or length < 0 or offset + length > spec["bytes"]:
            raise ValueError("range %d+%d is outside a payload of %d bytes"
                             % (offset, length, spec["bytes"]))
        pos = 0
        for c in spec["chunks"]:
            lo, hi = max(offset, pos), min(offset + length, pos + c["bytes"])
            if lo < hi:
                pieces.append((c["key"], c["bytes"], lo - pos, hi - lo, dst + lo - offset))
            pos += c["bytes"]

    def _read(self, spec):
        """A payload's bytes (a uint8 ndarray: np.empty, so no page is
        touched twice), chunks joined."""
        out = np.empty(spec["bytes"], np.uint8)
        pieces = []
        self._pieces(spec, 0, spec["bytes"], 0, pieces)
        self._io.read_pieces(pieces, out)
        return out

    def _read_ranges(self, spec, ranges):
        """The bytes of [(offset, length)] of a payload, back to back."""
        out = np.empty(sum(n for _, n in ranges), np.uint8)
        pieces, dst = [], 0
        for off, n in ranges:
            self._pieces(spec, off, n, dst, pieces)
            dst += n
        self._io.read_pieces(pieces, out)
        return out

    def _bundle_keys(self, m):
        keys = [c["key"] for s in [m["meta"]] + list(m["buffers"].values()) for c in s["chunks"]]
        return keys + list(m.get("cleanup_keys", [])) + \
            ["%s/%s/manifest" % (self.key_prefix, m["object_id"])]

    def remove_bundle(self, ref):
        """Removes every store object of a bundle (payloads, inherited ones,
        earlier manifests of the same stage, the manifest)."""
        self._io.remove_all(self._bundle_keys(self._manifest(ref)))

    # -- structured objects -----------------------------------------------------------

    def put_structured_object(self, payload, partition="default", chunk_bytes=None, policy=None,
                              max_inflight_put=None, config=None):
        """Stores a StructuredObjectPayload; returns its RemoteBundleRef."""
        return self._put_structured(payload, partition, chunk_bytes,
                                    _policy(policy, max_inflight_put), config)

    def _put_structured(self, payload, partition, chunk_bytes, pol, config, inherited=None,
                        inherited_meta=None):
        if not isinstance(payload, StructuredObjectPayload):
            raise TypeError("expected a StructuredObjectPayload, got %s" % type(payload).__name__)
        if not isinstance(payload.metadata, Mapping):
            raise TypeError("structured metadata must be a mapping")
        if not isinstance(payload.buffers, Mapping):
            raise TypeError("structured buffers must be a mapping")
        meta = dict(payload.metadata)
        if STRUCTURED_FIELD_SPECS_KEY in meta:
            raise ValueError("structured metadata key %r is reserved" % STRUCTURED_FIELD_SPECS_KEY)
        if not isinstance(meta.get("layout", "structured"), str):
            raise ValueError("structured metadata layout must be a string")
        meta.setdefault("layout", "structured")
        specs, members = {}, {}
        for name, value in payload.buffers.items():
            _segment(name, "buffer name")
            specs[name], members[name] = _member_spec(name, value)
        if inherited_meta is not None:
            old = dict(inherited_meta.get(STRUCTURED_FIELD_SPECS_KEY, {}))
            dup = sorted(set(old) & set(specs))
            if dup:
                raise ValueError("structured members already exist: %s" % dup)
            old.update(specs)
            specs = old
        if specs:
            meta[STRUCTURED_FIELD_SPECS_KEY] = specs
        return self._write_bundle(_json_bytes(meta, "structured metadata"), members, partition,
                                  chunk_bytes, pol, config, inherited)

    def put_object(self, obj, partition="default", chunk_bytes=None, policy=None,
                   max_inflight_put=None, config=None):
        """Stores a mapping of members, or one tensor/array/bytes value."""
        if isinstance(obj, Mapping):
            payload = StructuredObjectPayload({}, obj)
        else:
            payload = StructuredObjectPayload({_WRAPPED: True}, {"value": obj})
        return self.put_structured_object(payload, partition, chunk_bytes, policy,
                                          max_inflight_put, config)

    def get_object(self, ref):
        """What put_object stored."""
        res = self.materialize(self.read_spec(ref))
        return res.objects["value"] if res.metadata.get(_WRAPPED) else res.objects

    def read_spec(self, ref):
        return StructuredObjectReadSpec(ref=ref)

    def materialize(self, spec):
        return self.materialize_into(spec, None)

    def _meta(self, m):
        meta = _json_dict(self._read(m["meta"]), "structured metadata")
        specs = meta.get(STRUCTURED_FIELD_SPECS_KEY, {})
        if not isinstance(specs, dict):
            raise ValueError("structured field specs must be a dict")
        for name, fs in specs.items():
            _check_field_spec(name, fs)
        return meta, specs

    def materialize_into(self, spec, destinations):
        """The selected members (sliced where the spec says), read into
        destinations[name] where given."""
        if not isinstance(spec, StructuredObjectReadSpec):
            raise TypeError("expected a StructuredObjectReadSpec")
        if spec.member_names is not None and not spec.member_names:
            raise ValueError("structured read spec selected no members")
        if destinations is not None and not isinstance(destinations, Mapping):
            raise TypeError("destinations must be a mapping of member name to buffer")
        m = self._manifest(spec.ref)
        meta, specs = self._meta(m)
        names = list(m["buffers"]) if spec.member_names is None else list(spec.member_names)
        for n in names:
            if n not in m["buffers"]:
                raise KeyError("structured object has no member %r" % (n,))
        slices = dict(spec.member_slices)
        dests = destinations or {}
        objects = {}
        for n in names:
            rows = None
            if n in slices:
                sl = slices[n]
                if not isinstance(sl, StructuredMemberSlice):
                    raise TypeError("member slice of %r must be a StructuredMemberSlice" % n)
                rows = ("slice", sl)
            objects[n] = self._read_member(n, m["buffers"][n], specs.get(n, {"encoding": "bytes"}),
                                           rows, dests.get(n))
        return StructuredObjectResult(metadata=meta, objects=objects)

    def _rows_of(self, name, shape, rows):
        """(indices or None, start, stop, step) of the rows to read."""
        if rows is None:
            return None
        n = shape[0] if shape else None
        if n is None:
            raise ValueError("member %r is a scalar: it has no rows to select" % name)
        kind, sel = rows
        if kind == "slice":
            if sel.axis != 0:
                raise ValueError("member %r: only axis=0 slices are supported" % name)
            if sel.step <= 0:
                raise ValueError("member %r: slice step must be positive" % name)
            if not (0 <= sel.start <= sel.end <= n):
                raise ValueError("member %r: slice %d:%d is outside its %d rows"
                                 % (name, sel.start, sel.end, n))
            return list(range(sel.start, sel.end, sel.step))
        idx = []
        for i in sel:
            if not (-n <= i < n):
                raise IndexError("row index %d is out of range for %d rows" % (i, n))
            idx.append(i % n)
        return idx

    def _read_rows(self, spec, base, rowbytes, idx):
        """The bytes of rows idx (each rowbytes long) of a payload starting
        at base: one range for a run of rows, one per row otherwise."""
        if idx and idx == list(range(idx[0], idx[-1] + 1)):
            return self._read_ranges(spec, [(base + idx[0] * rowbytes, len(idx) * rowbytes)])
        return self._read_ranges(spec, [(base + i * rowbytes, rowbytes) for i in idx])

    def _read_member(self, name, pspec, fspec, rows, dest):
        enc = fspec.get("encoding", "bytes")
        if enc == "ndarray":
            dtype, shape = np.dtype(fspec["dtype"]), tuple(fspec["shape"])
            idx = self._rows_of(name, shape, rows)
            if idx is None:
                raw, out_shape = self._read(pspec), shape
            else:
                rowbytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
                raw, out_shape = self._read_rows(pspec, 0, rowbytes, idx), (len(idx),) + shape[1:]
            if len(raw) != int(np.prod(out_shape, dtype=np.int64)) * dtype.itemsize:
                raise ValueError("member %r: its bytes do not match dtype and shape" % name)
            arr = np.frombuffer(raw, dtype).reshape(out_shape)
            return _into(name, arr, dest)
        if enc == "torch_tensor":
            if _torch is None:
                raise RuntimeError("member %r is a torch tensor and torch is not installed" % name)
            tl = _tensor_lib()
            if isinstance(dest, _TensorObjectBuffer) and rows is None and \
                    pspec.get("kind") != "tensor":
                # the stored tensor object's bytes straight into the caller's
                # memory (registered for the read), unparsed: the result is
                # the destination (a member put as put_tensor gives a tensor
                # over that memory instead, below)
                n = pspec["bytes"]
                if dest.size < n:
                    raise ValueError("destination for %r holds %d bytes, the tensor object"
                                     " needs %d" % (name, dest.size, n))
                out = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(dest.ptr)) \
                    if n else np.empty(0, np.uint8)
                pieces = []
                self._pieces(pspec, 0, n, 0, pieces)
                self._io.read_pieces(pieces, out)
                return dest
            if pspec.get("kind") == "tensor":
                if not self._io._has("get_tensor"):
                    raise RuntimeError("member %r was stored with put_tensor and the store does"
                                       " not support get_tensor" % name)
                t = self.store.get_tensor(pspec["key"])
                if t is None:
                    raise KeyError("tensor object %r is missing" % pspec["key"])
                if "shape" in fspec and list(t.shape) != list(fspec["shape"]) and \
                        t.numel() == int(np.prod(fspec["shape"], dtype=np.int64)):
                    t = t.reshape(fspec["shape"])
                if "shape" in fspec and list(t.shape) != list(fspec["shape"]):
                    raise ValueError("member %r: stored tensor has shape %s, the manifest says %s"
                                     % (name, list(t.shape), fspec["shape"]))
                if rows is not None:
                    t = t[self._rows_of(name, tuple(t.shape), rows)]
                return _into(name, t, dest)
            if rows is None or "shape" not in fspec:
                raw = self._read(pspec)
                meta = tl.parse(raw)
                t = None if meta is None else tl.to_tensor(_torch, raw, meta)  # over raw: no copy
                if t is None:
                    raise ValueError("member %r: not a Mooncake tensor object" % name)
                if "shape" in fspec:
                    t = t.reshape(fspec["shape"])
                if rows is not None:
                    idx = self._rows_of(name, tuple(t.shape), rows)
                    t = t[idx]
                return _into(name, t, dest)
            shape = tuple(fspec["shape"])
            idx = self._rows_of(name, shape, rows)
            dtype = getattr(_torch, fspec["dtype"].replace("torch.", ""))
            esize = int(fspec.get("element_size") or _torch.empty(0, dtype=dtype).element_size())
            rowbytes = int(np.prod(shape[1:], dtype=np.int64)) * esize
            raw = self._read_rows(pspec, int(pspec.get("metadata_bytes", tl.METADATA_SIZE)),
                                  rowbytes, idx)
            t = _torch.frombuffer(raw, dtype=dtype) if len(raw) else _torch.empty(0, dtype=dtype)
            return _into(name, t.reshape((len(idx),) + shape[1:]), dest)
        if enc != "bytes":
            raise ValueError("member %r: unsupported structured field encoding %r" % (name, enc))
        raw = self._read(pspec)
        if rows is not None:
            raise ValueError("member %r holds bytes, which does not support slicing" % name)
        if dest is not None:
            return _into(name, np.frombuffer(raw, np.uint8), dest)
        return bytes(raw)

    @staticmethod
    def release_result(result):
        """Nothing is pool-backed here (results are ordinary arrays); kept
        for callers written against Mooncake's split API."""
        return None

    # -- DataProto ------------------------------------------------------------------

    def put(self, data, *, type="dataproto", namespace="default", partition="default",
            stage="default", chunk_bytes=None, policy=None, config=None, field_schemas=None):
        """Stores a DataProto-like object (type="dataproto") or a flat dict
        of fields (type="dict"); returns a MooncakeDataProtoRef."""
        if type == "dict":
            data = _flat_to_envelope(data, field_schemas)
        elif type != "dataproto":
            raise ValueError("unsupported Mooncake payload type: %r" % (type,))
        return self._stage(None, data, namespace, partition, stage, chunk_bytes, policy, False,
                           field_schemas, config)

    def put_dataproto(self, data, *, namespace="default", partition="default", stage="default",
                      chunk_bytes=None, policy=None, field_schemas=None, config=None):
        return self.put(data, type="dataproto", namespace=namespace, partition=partition,
                        stage=stage, chunk_bytes=chunk_bytes, policy=policy, config=config,
                        field_schemas=field_schemas)

    def append_dataproto_fields(self, ref, data, *, stage, overwrite=False, chunk_bytes=None,
                                policy=None, field_schemas=None, config=None):
        """Adds fields as (part of) a stage; existing fields are not rewritten;
        overwrite=True replaces a whole stage and then removes the old one."""
        ref = _resolve_ref(ref)
        return self._stage(ref, data, ref.namespace, ref.partition, stage, chunk_bytes, policy,
                           overwrite, field_schemas, config)

    def _stage(self, ref, data, namespace, partition, stage, chunk_bytes, policy, overwrite,
               field_schemas, config):
        _segment(stage, "stage")
        _segment(partition, "partition")
        if not isinstance(namespace, str) or not namespace:
            raise ValueError("namespace must be a non-empty str")
        pol = _policy(policy)
        batch, non_tensor, meta_info = _split(data, field_schemas)
        n = _batch_size(batch, non_tensor)
        if n is None:
            n = ref.batch_size if ref is not None else 0
        if ref is not None and n != ref.batch_size:
            raise ValueError("DataProto append batch size %d does not match the ref's %d"
                             % (n, ref.batch_size))
        both = sorted(set(batch) & set(non_tensor))
        if both:
            raise ValueError("DataProto batch and non_tensor_batch fields overlap: %s" % both)
        members, fields, encoded = {}, {}, {}
        for name, value in batch.items():
            _segment(name, "field name")
            members["batch." + name] = value
            fields[name] = StructuredFieldLocation(stage, "batch." + name, "batch")
        for name, value in non_tensor.items():
            _segment(name, "field name")
            member = "non_tensor_batch." + name
            schema = (field_schemas or {}).get(name)
            if schema is not None and not isinstance(schema, FieldSchema):
                raise TypeError("field_schemas[%r] must be a FieldSchema" % name)
            if schema is not None and schema.metadata.get("section") not in (None,
                                                                             "non_tensor_batch"):
                schema = None     # a schema for a same-named field of another section
            if isinstance(value, (list, tuple)):
                value = _object_array(list(value))
            if not isinstance(value, np.ndarray):
                raise TypeError("non_tensor_batch field %r must be a numpy array or a list, got %s"
                                % (name, type(value).__name__))
            if value.dtype.hasobject or (schema is not None and schema.codec != "auto"):
                vals = list(value)
                if schema is not None and not schema.nullable and any(v is None for v in vals):
                    raise ValueError("non_tensor_batch field %r is not nullable but has None"
                                     % name)
                path = "non_tensor_batch." + name
                inferred = schema is None or schema.codec == "auto"
                codec = _infer_codec(path, vals) if inferred else schema.codec
                try:
                    if codec == "structured_recursive":
                        codec, payload, cmeta = _encode_recursive(path, vals)
                    else:
                        codec, payload, cmeta = _encode_column(path, vals, codec,
                                                               schema.metadata if schema else None)
                        if inferred:
                            _note_inferred(codec, vals, cmeta)
                except (TypeError, ValueError, AttributeError) as e:
                    raise type(e)("failed to encode non_tensor_batch field %r with codec %r: %s"
                                  % (name, codec, e)) from e
                if pol.copy_mode == "zero_copy":
                    raise RuntimeError("zero-copy put requires tensor-object buffers: field %r is"
                                       " encoded by %s into staged copies" % (name, codec))
                pm = {}
                for pname, pval in payload.items():
                    members["%s.%s" % (member, pname)] = pval
                    pm[pname] = "%s.%s" % (member, pname)
                encoded[name] = {"codec": codec, "rows": len(vals), "metadata": cmeta,
                                 "payload_members": pm}
            else:
                members[member] = value
            fields[name] = StructuredFieldLocation(stage, member, "non_tensor_batch")
        if ref is not None:
            dup = sorted(set(ref.field_index) & set(fields))
            if dup and not overwrite:
                raise ValueError("DataProto fields already exist: %s" % dup)
            if overwrite:
                left = sorted(k for k, loc in ref.field_index.items()
                              if loc.stage == stage and k not in fields)
                if left:
                    raise ValueError("DataProto overwrite of stage %r must include existing fields %s"
                                     % (stage, left))
                other = sorted(k for k in dup if ref.field_index[k].stage != stage)
                if other:
                    raise ValueError("DataProto overwrite of stage %r names fields of other"
                                     " stages: %s" % (stage, other))
        # One storage group per DataProto (Mooncake's documented grouping):
        # taken from config.group_ids, made up when it names none, inherited
        # by appends; decided before anything is written.
        # (None or [] names no group, so one is made up; "" or [""] means
        # ungrouped; a handle without a group writes with the caller's.)
        named, cgid = _one_group(config)
        g = getattr(config, "group_ids", None) if named else None
        explicit = named and (cgid is not None or g == "" or list(g) == [""])
        if ref is None:
            gid = cgid if explicit else "structured-%s" % uuid.uuid4().hex
        else:
            gid = ref._storage_group_id
            if gid is not None and cgid is not None and cgid != gid:
                raise ValueError("config.group_ids %r conflicts with the DataProto storage group"
                                 " %r" % (cgid, gid))
        if gid is not None:
            config = _with_group(config, gid)
        stage_refs = dict(ref.stage_refs) if ref is not None else {}
        if members:
            payload = StructuredObjectPayload(
                {"layout": "dataproto_stage",
                 "dataproto": {"version": 1, "namespace": namespace, "partition": partition,
                               "stage": stage, "batch_size": n}}, members)
            old = stage_refs.get(stage)
            if old is not None and not overwrite:
                om = self._manifest(old)
                ometa, _ = self._meta(om)
                if ometa.get("dataproto") != payload.metadata["dataproto"]:
                    raise ValueError("DataProto stage %r metadata does not match" % stage)
                new = self._put_structured(payload, partition, chunk_bytes, pol, config, om, ometa)
            else:
                new = self._put_structured(payload, partition, chunk_bytes, pol, config)
                if old is not None:
                    self.remove_bundle(old)
            stage_refs[stage] = new
        index = dict(ref.field_index) if ref is not None else {}
        index.update(fields)
        enc = dict(ref.encoded_non_tensor) if ref is not None else {}
        for k in fields:
            enc.pop(k, None)
        enc.update(encoded)
        mi = dict(ref.meta_info) if ref is not None else {}
        mi.update(meta_info)
        return MooncakeDataProtoRef(batch_size=n, stage_refs=stage_refs, field_index=index,
                                    meta_info=mi, namespace=namespace, partition=partition,
                                    global_indexes=None if ref is None else ref.global_indexes,
                                    encoded_non_tensor=enc, _storage_group_id=gid)

    def dataproto_manifest_view(self, ref):
        """What the manifests say about a ref, in Mooncake's shape:
        {"namespace", "partition", "batch_size", "meta_info_keys",
        "stages": {stage: {"manifest_key", "dataproto": its stage metadata}},
        "batch_fields" / "non_tensor_fields": {name: {"section", "stage",
        "member", "spec"}}}. A plain member's spec is its field spec; an
        encoded non-tensor field's is {"encoding": "structured_non_tensor",
        "codec", "metadata", "payload_members", "payload_specs" (the field
        spec of each payload member)}."""
        ref = _resolve_ref(ref)
        stages, specs = {}, {}
        for st, r in ref.stage_refs.items():
            meta, specs[st] = self._meta(self._manifest(r))
            stages[st] = {"manifest_key": r.manifest_key, "dataproto": meta.get("dataproto", {})}
        view = {"namespace": ref.namespace, "partition": ref.partition,
                "batch_size": ref.batch_size, "batch_fields": {}, "non_tensor_fields": {},
                "meta_info_keys": list(ref.meta_info), "stages": stages}
        for name, loc in ref.field_index.items():
            fs = specs[loc.stage]
            e = ref.encoded_non_tensor.get(name)
            if e is None:
                spec = dict(fs.get(loc.member, {"encoding": "bytes"}))
            else:
                pm = dict(e["payload_members"])
                spec = {"encoding": "structured_non_tensor", "codec": e["codec"],
                        "metadata": e.get("metadata"), "payload_members": pm,
                        "payload_specs": {n: dict(fs.get(m, {"encoding": "bytes"}))
                                          for n, m in pm.items()}}
            sec = "batch_fields" if loc.section == "batch" else "non_tensor_fields"
            view[sec][name] = {"section": loc.section, "stage": loc.stage,
                               "member": loc.member, "spec": spec}
        return view

    def get(self, ref, *, type="dataproto", fields=None, batch_fields=None,
            non_tensor_fields=None, meta_info_keys=None, data_cls=None, destinations=None,
            rows=None):
        if type not in ("dataproto", "dict"):
            raise ValueError("unsupported Mooncake payload type: %r" % (type,))
        res = self.get_dataproto(ref, fields=fields, batch_fields=batch_fields,
                                 non_tensor_fields=non_tensor_fields,
                                 meta_info_keys=meta_info_keys,
                                 data_cls=None if type == "dict" else data_cls,
                                 destinations=destinations, rows=rows)
        if type == "dataproto":
            return res
        flat = {}
        for sec in ("batch", "non_tensor_batch", "meta_info"):
            for k, v in res[sec].items():
                if k in flat:
                    raise ValueError("Duplicate keys in the flattened dict: %r is in two sections" % k)
                flat[k] = v.tolist() if sec == "non_tensor_batch" and \
                    isinstance(v, np.ndarray) and v.dtype.hasobject else v
        return flat

    def get_dataproto(self, ref, *, fields=None, batch_fields=None, non_tensor_fields=None,
                      meta_info_keys=None, data_cls=None, destinations=None, rows=None):
        """The selected fields (all when none is named), rows selected by a
        slice, a StructuredMemberSlice or a sequence of row indices."""
        ref = _resolve_ref(ref)
        if destinations is not None and not isinstance(destinations, Mapping):
            raise TypeError("destinations must be a mapping of field name to buffer")
        want = {}
        if fields is not None and (batch_fields is not None or non_tensor_fields is not None):
            raise ValueError("fields cannot be combined with batch_fields or non_tensor_fields")
        if fields is None and batch_fields is None and non_tensor_fields is None:
            want = dict.fromkeys(ref.field_index)
        for group, section in ((fields, None), (batch_fields, "batch"),
                               (non_tensor_fields, "non_tensor_batch")):
            if group is None:
                continue
            if isinstance(group, str):
                raise TypeError("field selections are sequences of names, not a str")
            unknown = [n for n in group if n not in ref.field_index]
            if unknown:
                raise KeyError("unknown DataProto fields: %s" % unknown)
            for name in group:
                loc = ref.field_index[name]
                if section is not None and loc.section != section:
                    raise ValueError("DataProto field %r is in %s, not %s"
                                     % (name, loc.section, section))
                want[name] = None
        sel = _row_selection(rows, ref.batch_size)
        dests = destinations or {}
        for k in dests:
            if k not in want:
                raise KeyError("destination for %r, which is not selected" % (k,))
        out = {"batch": {}, "non_tensor_batch": {}}
        by_stage = {}
        for name in want:
            by_stage.setdefault(ref.field_index[name].stage, []).append(name)
        for stage, names in by_stage.items():
            sref = ref.stage_refs.get(stage)
            if sref is None:
                raise ValueError("DataProto field %r names unknown stage %r" % (names[0], stage))
            m = self._manifest(sref)
            _, specs = self._meta(m)
            for name in names:
                loc = ref.field_index[name]
                enc = ref.encoded_non_tensor.get(name)
                if enc is not None:
                    payload = {}
                    for pname, member in enc["payload_members"].items():
                        if member not in m["buffers"]:
                            raise ValueError("DataProto field %r: member %r is missing from its"
                                             " manifest" % (name, member))
                        payload[pname] = self._read_member(member, m["buffers"][member],
                                                           specs.get(member, {}), None, None)
                    try:
                        rows_n = enc["rows"]
                        if isinstance(rows_n, bool) or not isinstance(rows_n, int) or \
                                rows_n != ref.batch_size:
                            raise ValueError("rows %r, the ref has %d" % (rows_n, ref.batch_size))
                        if enc["codec"] == "structured_recursive":
                            vals = _decode_recursive(name, rows_n, payload,
                                                     enc.get("metadata") or {})
                        else:
                            vals = _decode_column(name, enc["codec"], rows_n, payload,
                                                  enc.get("metadata") or {})
                    except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
                        raise ValueError("DataProto field %r: its encoding is damaged: %s"
                                         % (name, e)) from e
                    if sel is not None:
                        vals = [vals[i] for i in sel]
                    value = _into(name, _object_array(vals), dests.get(name))
                else:
                    if loc.member not in m["buffers"]:
                        raise ValueError("DataProto field %r: member %r is missing from its"
                                         " manifest" % (name, loc.member))
                    value = self._read_member(loc.member, m["buffers"][loc.member],
                                              specs.get(loc.member, {"encoding": "bytes"}),
                                              None if sel is None else ("index", sel),
                                              dests.get(name))
                out[loc.section][name] = value
        if meta_info_keys is None:
            mi = dict(ref.meta_info)
        else:
            missing = [k for k in meta_info_keys if k not in ref.meta_info]
            if missing:
                raise KeyError("meta_info has no keys %s" % missing)
            mi = {k: ref.meta_info[k] for k in meta_info_keys}
        out["meta_info"] = mi
        if data_cls is None or data_cls is dict:
            return out
        from_dict = getattr(data_cls, "from_dict", None)
        if callable(from_dict):
            try:
                return from_dict(out["batch"], out["non_tensor_batch"], meta_info=mi)
            except TypeError:
                pass
        try:
            return data_cls(batch=out["batch"], non_tensor_batch=out["non_tensor_batch"],
                            meta_info=mi)
        except TypeError as e:
            raise TypeError("data_cls %s cannot be constructed by from_dict(batch,"
                            " non_tensor_batch, meta_info=) nor (batch=, non_tensor_batch=,"
                            " meta_info=): %s"
                            % (getattr(data_cls, "__name__", data_cls), e)) from e

    def cleanup_dataproto(self, ref):
        """Removes every store object of every stage of the ref."""
        ref = _resolve_ref(ref)
        errors = []
        for stage, sref in ref.stage_refs.items():
            try:
                self.remove_bundle(sref)
            except KeyError:
                pass  # already cleaned up
            except (RuntimeError, ValueError) as e:
                errors.append("%s: %s" % (stage, e))
        if errors:
            raise RuntimeError("cleanup_dataproto failed for stages: %s" % "; ".join(errors))

    cleanup = cleanup_dataproto


def _into(name, value, dest):
    """value, or value copied into dest (returned) when one is given."""
    if dest is None:
        return value
    if isinstance(dest, np.ndarray):
        src = value.numpy() if _is_tensor(value) else np.asarray(value)
        if dest.shape != src.shape or (dest.dtype != src.dtype and not src.dtype.hasobject):
            raise ValueError("destination shape mismatch for %r: it is %s %s, the data is %s %s"
                             % (name, dest.dtype, dest.shape, src.dtype, src.shape))
        if not dest.flags.writeable:
            raise ValueError("destination for %r is not writeable" % name)
        dest[...] = src
        return dest
    if _is_tensor(dest):
        if not _is_tensor(value):
            value = _torch.from_numpy(np.ascontiguousarray(value))
        if tuple(dest.shape) != tuple(value.shape) or dest.dtype != value.dtype:
            raise ValueError("destination shape mismatch for %r: it is %s %s, the data is %s %s"
                             % (name, dest.dtype, tuple(dest.shape), value.dtype,
                                tuple(value.shape)))
        dest.copy_(value)
        return dest
    if isinstance(dest, (_TensorObjectBuffer, _RawDestination)) and _is_tensor(value):
        # a tensor lands in caller memory as a Mooncake tensor object
        data = _tensor_lib().serialize_tensor(value.contiguous())
        if len(data) > dest.size:
            raise ValueError("destination for %r holds %d bytes, the tensor object needs %d"
                             % (name, dest.size, len(data)))
        ctypes.memmove(dest.ptr, int(np.frombuffer(data, np.uint8).ctypes.data), len(data))
        if isinstance(dest, _RawDestination):
            return dest
        # a tensor over the caller's memory (its owner must outlive it)
        tl = _tensor_lib()
        mem = np.ctypeslib.as_array((ctypes.c_uint8 * len(data)).from_address(dest.ptr))
        return tl.to_tensor(_torch, mem, tl.parse(mem))
    if isinstance(dest, _TensorObjectBuffer):
        raise ValueError("destination for %r: a tensor_object_buffer takes tensor members only"
                         % name)
    if isinstance(dest, _RawDestination):
        src = value.numpy() if _is_tensor(value) else np.ascontiguousarray(value)
        if src.dtype.hasobject:
            raise ValueError("destination for %r: object rows cannot go to raw memory" % name)
        if src.nbytes > dest.size:
            raise ValueError("destination for %r holds %d bytes, the data needs %d"
                             % (name, dest.size, src.nbytes))
        arr = np.ctypeslib.as_array((ctypes.c_uint8 * max(src.nbytes, 1)).from_address(dest.ptr))
        arr = arr[:src.nbytes].view(src.dtype).reshape(src.shape)
        arr[...] = src
        return arr
    raise TypeError("destination for %r must be a numpy array, a torch tensor, raw_destination"
                    " or tensor_object_buffer, got %s" % (name, type(dest).__name__))


def _row_selection(rows, n):
    if rows is None:
        return None
    if isinstance(rows, slice):
        if rows.step is not None and rows.step <= 0:
            raise ValueError("rows slice step must be positive")
        return list(range(n))[rows]
    if isinstance(rows, StructuredMemberSlice):
        if rows.axis != 0:
            raise ValueError("rows: only axis=0 is supported")
        if rows.step <= 0 or not (0 <= rows.start <= rows.end <= n):
            raise ValueError("rows %d:%d:%d are outside %d rows"
                             % (rows.start, rows.end, rows.step, n))
        return list(range(rows.start, rows.end, rows.step))
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise TypeError("rows must be a slice, a StructuredMemberSlice or a sequence of ints")
    out = []
    for i in rows:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError("row indices must be integers, got %r" % (i,))
        if not (-n <= i < n):
            raise IndexError("row index %d is out of range for %d rows" % (i, n))
        out.append(int(i) % n)
    return out


def _split(data, schemas):
    """(batch, non_tensor_batch, meta_info) of a DataProto-like object or dict."""
    if isinstance(data, Mapping):
        if data and set(data) <= set(_SECTIONS) and \
                all(v is None or isinstance(v, Mapping) for v in data.values()):
            parts = [data.get(s) for s in _SECTIONS]
        else:
            parts = [data, None, None]
    elif all(hasattr(data, s) for s in _SECTIONS):
        parts = [getattr(data, s) for s in _SECTIONS]
    else:
        raise TypeError("expected a DataProto-like object (batch, non_tensor_batch, meta_info)"
                        " or a dict, got %s" % type(data).__name__)
    out = []
    for s, p in zip(_SECTIONS, parts):
        if p is None:
            p = {}
        if not isinstance(p, Mapping):
            if hasattr(p, "items") and hasattr(p, "keys"):
                p = dict(p.items())
            else:
                raise TypeError("DataProto %s must be a mapping, got %s" % (s, type(p).__name__))
        out.append(dict(p))
    batch, non_tensor, meta = out
    for name, schema in (schemas or {}).items():
        if not isinstance(schema, FieldSchema):
            raise TypeError("field_schemas[%r] must be a FieldSchema" % (name,))
        if schema.codec not in _CODECS:
            raise ValueError("field_schemas[%r]: unknown codec %r" % (name, schema.codec))
        sec = schema.metadata.get("section")
        if sec is not None and sec not in _SECTIONS:
            raise ValueError("field_schemas[%r]: unknown section %r" % (name, sec))
        if sec is not None:
            where = [s for s, d in zip(_SECTIONS, out) if name in d]
            if where and sec not in where:
                raise ValueError("field_schemas[%r] declares section %s, the field is in %s"
                                 % (name, sec, where[0]))
    return batch, non_tensor, meta


def _batch_size(batch, non_tensor):
    sizes = {}
    for sec, d in (("batch", batch), ("non_tensor_batch", non_tensor)):
        for name, v in d.items():
            if isinstance(v, (bytes, bytearray, memoryview, str)):
                raise TypeError("DataProto field %r must be an array or tensor with rows" % name)
            try:
                n = len(v)
            except TypeError as e:
                raise TypeError("DataProto field %r has no rows: %s" % (name, e)) from e
            sizes[name] = int(n)
    if not sizes:
        return None
    distinct = set(sizes.values())
    if len(distinct) > 1:
        raise ValueError("DataProto fields have inconsistent batch sizes: %s" % sizes)
    return distinct.pop()


def _flat_to_envelope(data, schemas):
    """A flat dict as a DataProto envelope: tensors and numeric arrays are
    batch fields (and set the row count), lists and object arrays of that
    many rows are non-tensor fields, everything else is meta_info; a
    FieldSchema's metadata["section"] decides where it says."""
    if not isinstance(data, Mapping):
        raise TypeError("type='dict' needs a mapping, got %s" % type(data).__name__)
    schemas = schemas or {}

    def pinned(k):
        sc = schemas.get(k)
        return sc.metadata.get("section") if isinstance(sc, FieldSchema) else None

    def batchlike(v):
        return _is_tensor(v) or (isinstance(v, np.ndarray) and not v.dtype.hasobject)

    def rowlike(v):
        return isinstance(v, (list, tuple)) or (isinstance(v, np.ndarray) and v.dtype.hasobject)
    n = next((len(v) for k, v in data.items() if pinned(k) in (None, "batch") and batchlike(v)
              and getattr(v, "ndim", 1) > 0), None)
    if n is None:
        n = next((len(v) for k, v in data.items() if rowlike(v) and pinned(k) != "meta_info"),
                 None)
    out = {s: {} for s in _SECTIONS}
    for k, v in data.items():
        sec = pinned(k)
        if sec is None:
            if batchlike(v) and getattr(v, "ndim", 1) > 0:
                sec = "batch"
            elif rowlike(v) and len(v) == n:
                sec = "non_tensor_batch"
            else:
                sec = "meta_info"
        if sec == "non_tensor_batch" and isinstance(v, (list, tuple)):
            v = _object_array(list(v))
        out[sec][k] = v
    return out


# -- handles ---------------------------------------------------------------------------

def is_dataproto_ref_handle(value):
    return isinstance(value, Mapping) and value.get("type") == DATAPROTO_REF_HANDLE_TYPE


def export_dataproto_ref(ref):
    """A JSON-safe handle of a ref: manifest keys, no manifests."""
    if not isinstance(ref, MooncakeDataProtoRef):
        raise TypeError("expected MooncakeDataProtoRef, got %s" % type(ref).__name__)
    h = {"type": DATAPROTO_REF_HANDLE_TYPE, "version": DATAPROTO_REF_HANDLE_VERSION,
         "kind": "bundle_stages", "batch_size": int(ref.batch_size),
         "namespace": ref.namespace, "partition": ref.partition,
         "global_indexes": _json_safe(ref.global_indexes),
         "stage_refs": {s: {"manifest_key": r.manifest_key} for s, r in ref.stage_refs.items()},
         "field_index": {n: {"stage": loc.stage, "member": loc.member, "section": loc.section}
                         for n, loc in ref.field_index.items()},
         "meta_info": _json_safe(ref.meta_info),
         "encoded_non_tensor": _json_safe(ref.encoded_non_tensor)}
    if ref._storage_group_id is not None:
        h[STORAGE_GROUP_ID] = ref._storage_group_id
    json.dumps(h)
    return h


def _mapping(v, what):
    if not isinstance(v, Mapping):
        raise ValueError("DataProto ref handle %s must be a mapping" % what)
    return v


def import_dataproto_ref(handle):
    """The ref of an exported handle (checked; manifests read lazily)."""
    if not is_dataproto_ref_handle(handle):
        raise ValueError("not a Mooncake DataProto ref handle")
    if handle.get("version") not in (1, 2):
        raise ValueError("unsupported DataProto ref handle version: %r" % (handle.get("version"),))
    if handle.get("kind") != "bundle_stages":
        raise ValueError("unsupported DataProto ref handle kind: %r" % (handle.get("kind"),))
    stages = {}
    for s, r in _mapping(handle.get("stage_refs"), "stage_refs").items():
        key = _mapping(r, "stage_refs[%r]" % s).get("manifest_key")
        if not isinstance(s, str) or not s or not isinstance(key, str) or not key:
            raise ValueError("DataProto ref handle stage refs need non-empty names and"
                             " manifest_key values")
        stages[s] = RemoteBundleRef(manifest_key=key, manifest={})
    index = {}
    for n, loc in _mapping(handle.get("field_index"), "field_index").items():
        loc = _mapping(loc, "field_index[%r]" % n)
        sec, st, mem = loc.get("section"), loc.get("stage"), loc.get("member")
        if sec not in ("batch", "non_tensor_batch"):
            raise ValueError("invalid DataProto field section: %r" % (sec,))
        if not all(isinstance(x, str) and x for x in (n, st, mem)):
            raise ValueError("DataProto ref handle field locations must be non-empty strings")
        if st not in stages:
            raise ValueError("DataProto ref handle field %r references unknown stage %r" % (n, st))
        index[n] = StructuredFieldLocation(st, mem, sec)
    bs = handle.get("batch_size")
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 0:
        raise ValueError("DataProto ref handle batch_size must be a non-negative integer")
    gi = handle.get("global_indexes")
    if gi is not None and (not isinstance(gi, list) or
                           any(isinstance(i, bool) or not isinstance(i, int) for i in gi)):
        raise ValueError("DataProto ref handle global_indexes must be a list of integers or null")
    gid = handle.get(STORAGE_GROUP_ID)
    if (handle.get("version") == 2 and gid is None) or \
            (gid is not None and (not isinstance(gid, str) or not gid)):
        raise ValueError("DataProto ref handle has an invalid storage_group_id")
    enc = dict(_mapping(handle.get("encoded_non_tensor", {}), "encoded_non_tensor"))
    for n, e in enc.items():
        if n not in index or not isinstance(e, Mapping) or \
                not isinstance(e.get("payload_members"), Mapping) or \
                not all(isinstance(k, str) and isinstance(v, str)
                        for k, v in e["payload_members"].items()) or \
                not isinstance(e.get("metadata", {}), Mapping) or e.get("codec") not in _CODECS:
            raise ValueError("DataProto ref handle encoded_non_tensor[%r] is damaged" % (n,))
    return MooncakeDataProtoRef(batch_size=bs, stage_refs=stages, field_index=index,
                                meta_info=dict(_mapping(handle.get("meta_info", {}), "meta_info")),
                                namespace=str(handle.get("namespace", "default")),
                                partition=str(handle.get("partition", "default")),
                                global_indexes=None if gi is None else list(gi),
                                encoded_non_tensor=enc, _storage_group_id=gid)


export_ref = export_dataproto_ref
import_ref = import_dataproto_ref


def _resolve_ref(ref):
    if isinstance(ref, MooncakeDataProtoRef):
        return ref
    if is_dataproto_ref_handle(ref):
        return import_dataproto_ref(ref)
    raise TypeError("expected MooncakeDataProtoRef or an exported handle, got %s"
                    % type(ref).__name__)
