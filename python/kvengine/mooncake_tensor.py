"""mooncake_tensor.py — Mooncake's tensor object layout, for the drop-in's tensor calls.

A tensor put through Mooncake's put_tensor is stored as one object: a
304-byte metadata block, then the tensor's bytes. Writing the same block
here means a tensor put by a Mooncake process and read by a kvengine one
(or the reverse, with objects moved between stores byte for byte) keeps
its dtype and shape, and two kvengine processes agree with each other.

The block, little-endian and packed as the C structs are on x86-64 and
aarch64 (every field naturally aligned, no padding):
    header (40 bytes): u32 magic 0x4d4f4f4e, u16 version 1, u16 header_size
        304, i32 dtype, i32 ndim, u32 layout_kind (0 full, 1 shard),
        u32 reserved_flags, u64 data_offset (304), u64 data_bytes
    layout (264 bytes): i64 global_shape[8], i64 local_shape[8] (unused
        dims -1), u32 axis_count, u32 reserved, then 4 axes of 32 bytes:
        i32 kind (0 dp, 1 tp, 2 ep, 3 pp), i32 axis_index, i32 shard_rank,
        i32 shard_count, i32 split_dim, i32 reserved0, i64 reserved1
A tensor parallel shard (put_tensor_with_tp) is stored under
"<key>_tp_<rank>" with layout_kind 1, the whole tensor's shape as
global_shape, the shard's as local_shape and one tp axis.

Key design choice: parsing checks everything a reader relies on (magic,
version, sizes, that data_bytes is what dtype x shape says) and returns
None for anything else, so a foreign or torn object is a miss, never a
wrong tensor.
"""

import ctypes
import struct

MAGIC = 0x4D4F4F4E
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
_HEADER = struct.Struct("<IHHiiIIQQ")
_SHAPES = struct.Struct("<8q8qII")
_AXIS = struct.Struct("<iiiiiiq")
METADATA_SIZE = _HEADER.size + _SHAPES.size + MAX_AXES * _AXIS.size
assert _HEADER.size == 40 and METADATA_SIZE == 304

FULL, SHARD = 0, 1
AXIS_DP, AXIS_TP, AXIS_EP, AXIS_PP = 0, 1, 2, 3
_AXIS_KINDS = {"dp": AXIS_DP, "tp": AXIS_TP, "ep": AXIS_EP, "pp": AXIS_PP}

# Mooncake's TensorDtype numbers, by torch dtype name, and element sizes.
_DTYPES = [("float32", 4), ("float64", 8), ("int8", 1), ("uint8", 1), ("int16", 2),
           ("uint16", 2), ("int32", 4), ("uint32", 4), ("int64", 8), ("uint64", 8),
           ("bool", 1), ("float16", 2), ("bfloat16", 2), ("float8_e4m3fn", 1),
           ("float8_e5m2", 1)]
_BY_NAME = {name: i for i, (name, _) in enumerate(_DTYPES)}


def dtype_code(torch_dtype):
    """Mooncake's number for a torch dtype, or None when it has none."""
    return _BY_NAME.get(str(torch_dtype).replace("torch.", ""))


def element_size(code):
    return _DTYPES[code][1] if 0 <= code < len(_DTYPES) else None


def torch_dtype(torch, code):
    return getattr(torch, _DTYPES[code][0], None) if 0 <= code < len(_DTYPES) else None


def _dims(shape):
    d = list(shape)[:MAX_DIMS]
    return d + [-1] * (MAX_DIMS - len(d))


def pack(code, global_shape, local_shape, data_bytes, layout=FULL, axes=()):
    """The 304-byte metadata block. axes: (kind, index, rank, count,
    split_dim[, reserved0: an ep axis's expert id, a pp axis's stage id])."""
    hdr = _HEADER.pack(MAGIC, VERSION, METADATA_SIZE, code, len(global_shape), layout, 0,
                       METADATA_SIZE, data_bytes)
    sh = _SHAPES.pack(*_dims(global_shape), *_dims(local_shape), len(axes), 0)
    ax = b"".join(_AXIS.pack(*a[:5], a[5] if len(a) > 5 else 0, 0) for a in axes)
    ax += b"\0" * (_AXIS.size * (MAX_AXES - len(axes)))
    return hdr + sh + ax


class Meta:
    __slots__ = ("dtype", "ndim", "layout", "global_shape", "shape", "data_offset",
                 "data_bytes", "axes", "axis_ids")


def parse(buf, total=None):
    """A Meta from the first bytes of an object of `total` bytes (default
    len(buf)), or None when they are not a valid tensor object."""
    if total is None:
        total = len(buf)
    if len(buf) < METADATA_SIZE or total < METADATA_SIZE:
        return None
    magic, ver, hsize, code, ndim, layout, _, off, nbytes = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC or ver != VERSION or hsize != METADATA_SIZE:
        return None
    if not 0 <= ndim <= MAX_DIMS or layout not in (FULL, SHARD):
        return None
    esize = element_size(code)
    if esize is None or off < METADATA_SIZE or off > total or nbytes != total - off:
        return None
    f = _SHAPES.unpack_from(buf, _HEADER.size)
    gshape, lshape, naxes = f[:ndim], f[MAX_DIMS:MAX_DIMS + ndim], f[2 * MAX_DIMS]
    if any(d < 0 for d in lshape) or naxes > MAX_AXES:
        return None
    n = esize
    for d in lshape:
        n *= d
    if n != nbytes:
        return None
    m = Meta()
    m.dtype, m.ndim, m.layout = code, ndim, layout
    m.global_shape, m.shape = tuple(gshape), tuple(lshape)
    m.data_offset, m.data_bytes = off, nbytes
    raw = [_AXIS.unpack_from(buf, _HEADER.size + _SHAPES.size + i * _AXIS.size)
           for i in range(naxes)]
    m.axes = [a[:5] for a in raw]
    m.axis_ids = [a[5] for a in raw]   # reserved0: expert id (ep), stage id (pp)
    return m


def tensor_meta(tensor):
    """(metadata block, contiguous CPU tensor) for a torch tensor put whole;
    ValueError for a tensor that cannot be stored (device, dtype, rank)."""
    t = tensor
    if not getattr(t, "is_cpu", t.device.type == "cpu"):
        raise ValueError("only CPU tensors are stored by this store (got %s)" % t.device.type)
    code = dtype_code(t.dtype)
    if code is None:
        raise ValueError("dtype %s has no Mooncake tensor code" % t.dtype)
    if t.dim() > MAX_DIMS:
        raise ValueError("a tensor has at most %d dims, got %d" % (MAX_DIMS, t.dim()))
    t = t.contiguous()
    shape = tuple(t.shape)
    return pack(code, shape, shape, t.numel() * t.element_size()), t


def tp_shards(tensor, tp_size, split_dim):
    """[(metadata block, contiguous shard)] for ranks 0..tp_size-1, split
    evenly along split_dim as Mooncake does (the dim must divide)."""
    code = dtype_code(tensor.dtype)
    if code is None:
        raise ValueError("dtype %s has no Mooncake tensor code" % tensor.dtype)
    shape = tuple(tensor.shape)
    if not 0 <= split_dim < len(shape) or tp_size <= 0 or shape[split_dim] % tp_size:
        raise ValueError("cannot split dim %d of %s into %d equal shards"
                         % (split_dim, shape, tp_size))
    out = []
    for rank in range(tp_size):
        start = shape[split_dim] * rank // tp_size
        end = shape[split_dim] * (rank + 1) // tp_size
        chunk = tensor.narrow(split_dim, start, end - start).contiguous()
        meta = pack(code, shape, tuple(chunk.shape), chunk.numel() * chunk.element_size(),
                    SHARD, [(AXIS_TP, 0, rank, tp_size, split_dim)])
        out.append((meta, chunk))
    return out


def to_tensor(torch, mem, meta):
    """A tensor over mem's bytes (a writable buffer object holding the
    whole object): no copy, so it keeps mem alive and shares it."""
    dt = torch_dtype(torch, meta.dtype)
    if dt is None:
        return None
    if meta.data_bytes == 0:
        return torch.empty(meta.shape, dtype=dt)
    flat = torch.frombuffer(mem, dtype=torch.uint8, count=meta.data_bytes,
                            offset=meta.data_offset)
    return flat.view(dt).reshape(meta.shape)


def tp_key(key, rank):
    return "%s_tp_%d" % (key, rank)


def _torch():
    import torch   # only when a tensor call is made
    return torch


class TensorCalls:
    """Mooncake's tensor calls (CPU tensors), built on the store's byte
    calls: a put is one object (metadata block + the tensor's bytes,
    gathered by batch_put_from_multi_buffers), a get reads the object and
    returns a tensor over its bytes (or, for *_into, over the caller's
    buffer). Failures are Mooncake's: a negative code from puts, None from
    gets. pub_* are the puts with a ReplicateConfig; upsert_* the same
    (a put replaces). The *_with_tp forms store rank r's shard under
    "<key>_tp_<r>"."""

    # -- puts -----------------------------------------------------------------

    def _put_tensors(self, keys, tensors, config=None):
        n = len(keys)
        if self._eng is None:
            return [-600] * n
        if len(tensors) != n:
            return [-600] * n
        ptrs, sizes, keep, ok = [], [], [], []
        for t in tensors:
            try:
                meta, ct = tensor_meta(t)
            except (ValueError, AttributeError, TypeError):
                ok.append(False)
                ptrs.append([])
                sizes.append([])
                continue
            mb = ctypes.create_string_buffer(meta, len(meta))
            keep += (mb, ct)
            nb = ct.numel() * ct.element_size()
            ptrs.append([ctypes.addressof(mb)] + ([ct.data_ptr()] if nb else []))
            sizes.append([len(meta)] + ([nb] if nb else []))
            ok.append(True)
        good = [i for i in range(n) if ok[i]]
        res = [-600] * n
        if good:
            got = self.batch_put_from_multi_buffers([keys[i] for i in good],
                                                    [ptrs[i] for i in good],
                                                    [sizes[i] for i in good], config)
            for i, r in zip(good, got):
                res[i] = r
        return res

    def put_tensor(self, key, tensor):
        return self._put_tensors([key], [tensor])[0]

    def batch_put_tensor(self, keys, tensors_list):
        return self._put_tensors(list(keys), list(tensors_list))

    def pub_tensor(self, key, tensor, config=None):
        return self._put_tensors([key], [tensor], config)[0]

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        return self._put_tensors(list(keys), list(tensors_list), config)

    upsert_tensor = put_tensor
    batch_upsert_tensor = batch_put_tensor
    upsert_pub_tensor = pub_tensor
    batch_upsert_pub_tensor = batch_pub_tensor

    def _put_tp(self, key, tensor, config, tp_size, split_dim):
        if tp_size <= 1:
            return self._put_tensors([key], [tensor], config)[0]
        try:
            shards = tp_shards(tensor, tp_size, split_dim)
        except (ValueError, AttributeError, TypeError):
            return -600
        keys = [tp_key(key, r) for r in range(tp_size)]
        res = self._put_shards(keys, shards, config)
        return next((r for r in res if r), 0)

    def _put_shards(self, keys, shards, config):
        ptrs, sizes, keep = [], [], []
        for meta, chunk in shards:
            mb = ctypes.create_string_buffer(meta, len(meta))
            keep += (mb, chunk)
            nb = chunk.numel() * chunk.element_size()
            ptrs.append([ctypes.addressof(mb)] + ([chunk.data_ptr()] if nb else []))
            sizes.append([len(meta)] + ([nb] if nb else []))
        return self.batch_put_from_multi_buffers(keys, ptrs, sizes, config)

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        """Splits tensor into tp_size shards along split_dim and stores every
        rank's shard (tp_rank is not used, as in Mooncake)."""
        return self._put_tp(key, tensor, None, tp_size, split_dim)

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        return self._put_tp(key, tensor, config, tp_size, split_dim)

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0):
        return [self._put_tp(k, t, None, tp_size, split_dim)
                for k, t in zip(base_keys, tensors_list)]

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0):
        return [self._put_tp(k, t, config, tp_size, split_dim)
                for k, t in zip(base_keys, tensors_list)]

    def put_tensor_from(self, key, buffer_ptr, size):
        """Stores [buffer_ptr, +size), which must already be a tensor object
        (metadata block first); INVALID_PARAMS when it is not."""
        if not self._ptr_ok(buffer_ptr, size) or not buffer_ptr or size < METADATA_SIZE:
            return -600
        head = ctypes.string_at(buffer_ptr, METADATA_SIZE)
        if parse(head, size) is None:
            return -600
        return self.put_from(key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes):
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n:
            return [-600] * n
        return [self.put_tensor_from(k, p, z) for k, p, z in zip(keys, buffer_ptrs, sizes)]

    upsert_tensor_from = put_tensor_from
    batch_upsert_tensor_from = batch_put_tensor_from

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        if tp_size <= 1:
            return self.put_tensor_from(key, buffer_ptr, size)
        if not self._ptr_ok(buffer_ptr, size) or not buffer_ptr or size < METADATA_SIZE:
            return -600
        # The buffer holds one whole tensor object: read it as a tensor and
        # store its shards as put_tensor_with_tp does.
        raw = (ctypes.c_ubyte * size).from_address(buffer_ptr)
        meta = parse(bytes(raw[:METADATA_SIZE]), size)
        if meta is None:
            return -600
        t = to_tensor(_torch(), raw, meta)
        return self._put_tp(key, t, None, tp_size, split_dim)

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1, split_dim=0):
        """put_tensor_with_tp_from of each full tensor object (every TP
        shard of each stored; tp_rank kept for the signature, as Mooncake)."""
        n = len(base_keys)
        if len(buffer_ptrs) != n or len(sizes) != n:
            return [-600] * n
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        return [self.put_tensor_with_tp_from(k, p, z, tp_rank, tp_size, split_dim)
                for k, p, z in zip(base_keys, buffer_ptrs, sizes)]

    # -- gets -------------------------------------------------------------------

    def get_tensor(self, key):
        """The tensor stored under key (a fresh CPU tensor), or None."""
        return self.batch_get_tensor([key])[0]

    def batch_get_tensor(self, keys):
        torch = _torch()
        out = []
        for v in self.get_batch(list(keys)):
            meta = parse(v) if v else None
            out.append(None if meta is None else to_tensor(torch, bytearray(v), meta))
        return out

    def get_tensor_into(self, key, buffer_ptr, size):
        """Reads key's object into [buffer_ptr, +size) and returns a tensor
        over that memory (the caller keeps it alive), or None."""
        if not buffer_ptr:
            return None
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        n = len(keys)
        if self._eng is None or len(buffer_ptrs) != n or len(sizes) != n or \
                any(not p for p in buffer_ptrs):
            return [-600] * n
        torch = _torch()
        out = []
        for p, got in zip(buffer_ptrs, self.batch_get_into(list(keys), list(buffer_ptrs),
                                                           list(sizes))):
            if got < METADATA_SIZE:
                out.append(None)
                continue
            mem = (ctypes.c_ubyte * got).from_address(p)
            meta = parse(bytes(mem[:METADATA_SIZE]), got)
            out.append(None if meta is None else to_tensor(torch, mem, meta))
        return out

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        return self.get_tensor(key if tp_size <= 1 else tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        if tp_size <= 1:
            return self.batch_get_tensor(base_keys)
        return self.batch_get_tensor([tp_key(k, tp_rank) for k in base_keys])

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        return self.get_tensor_into(key if tp_size <= 1 else tp_key(key, tp_rank),
                                    buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1):
        keys = base_keys if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)


class ParallelAxis:
    """One axis of a shard's identity (Mooncake's ParallelAxis): kind "tp",
    "dp", "ep" or "pp", rank, size, split_dim, expert_id, stage_id."""

    def __init__(self, kind="tp", rank=0, size=1, split_dim=None, expert_id=None, stage_id=None):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def __repr__(self):
        return "ParallelAxis(%r, rank=%r, size=%r, split_dim=%r)" % (
            self.kind, self.rank, self.size, self.split_dim)


class TensorParallelism:
    """An ordered list of ParallelAxis naming a stored or wanted shard."""

    def __init__(self, axes=None):
        self.axes = list(axes or [])

    def __repr__(self):
        return "TensorParallelism(%r)" % (self.axes,)


class ReadTarget:
    """What a read wants: mode "as_stored" (the object under the key),
    "shard" (the shard parallelism names) or "full" (the whole tensor)."""

    def __init__(self, mode="as_stored", parallelism=None):
        self.mode, self.parallelism = mode, parallelism

    def __repr__(self):
        return "ReadTarget(%r, %r)" % (self.mode, self.parallelism)


def _tp_only(parallelism):
    """The one tp axis of parallelism as (rank, size, split_dim), None for
    no parallelism, or False for what this store does not map (several
    axes, or a kind other than tp)."""
    if parallelism is None:
        return None
    axes = list(getattr(parallelism, "axes", None) or [])
    if not axes:
        return None
    if len(axes) != 1 or getattr(axes[0], "kind", None) != "tp":
        return False
    a = axes[0]
    sd = 0 if a.split_dim is None else a.split_dim
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a.rank, a.size, sd)) or \
            not 0 <= a.rank < a.size:
        return False
    return a.rank, a.size, sd


def _int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _axes(parallelism):
    """parallelism's axes in Mooncake's canonical order (dp, tp, ep, pp) as
    dicts, [] for none, or None for what is not a valid shard identity
    (an unknown kind, a kind twice, more than 4 axes, a rank outside
    0..size-1, a split_dim or id that is not an int, a dp axis with a
    split_dim, an ep axis without its expert_id)."""
    if parallelism is None:
        return []
    out = []
    for a in list(getattr(parallelism, "axes", None) or []):
        kind = getattr(a, "kind", None)
        d = {"kind": kind, "rank": getattr(a, "rank", None), "size": getattr(a, "size", None),
             "split_dim": getattr(a, "split_dim", None),
             "expert_id": getattr(a, "expert_id", None), "stage_id": getattr(a, "stage_id", None)}
        if kind not in _AXIS_KINDS or not _int(d["rank"]) or not _int(d["size"]) or \
                not 0 <= d["rank"] < d["size"] or \
                any(d[f] is not None and not _int(d[f]) for f in ("split_dim", "expert_id",
                                                                   "stage_id")):
            return None
        # Mooncake's axis rules: dp names a replica, never a split of the
        # tensor; ep names an expert, so it carries its expert_id.
        if (kind == "dp" and d["split_dim"] is not None) or \
                (kind == "ep" and d["expert_id"] is None):
            return None
        out.append(d)
    if len(out) > MAX_AXES or len({d["kind"] for d in out}) != len(out):
        return None
    return sorted(out, key=lambda d: _AXIS_KINDS[d["kind"]])


def _axis_suffix(d):
    s = "%s_%dof%d" % (d["kind"], d["rank"], d["size"])
    if d["split_dim"] is not None:
        s += "_sd%d" % d["split_dim"]
    if d["expert_id"] is not None:
        s += "_eid%d" % d["expert_id"]
    if d["stage_id"] is not None:
        s += "_sid%d" % d["stage_id"]
    return s


def parallel_key(key, axes):
    """The object name of the shard axes identify: a single tp axis keeps
    the *_with_tp name "<key>_tp_<rank>"; any other identity appends
    "__<kind>_<rank>of<size>[_sd<d>][_eid<e>][_sid<s>]" per axis in
    canonical order, as Mooncake names them."""
    if len(axes) == 1 and axes[0]["kind"] == "tp":
        return tp_key(key, axes[0]["rank"])
    return key + "".join("__" + _axis_suffix(d) for d in axes)


def _layout_axes(axes):
    """The metadata block's axis records for canonical axes."""
    out = []
    for i, d in enumerate(axes):
        extra = d["expert_id"] if d["kind"] == "ep" else d["stage_id"] if d["kind"] == "pp" \
            else None
        out.append((_AXIS_KINDS[d["kind"]], i, d["rank"], d["size"],
                    -1 if d["split_dim"] is None else d["split_dim"],
                    0 if extra is None else extra))
    return out


def _meta_matches(meta, axes):
    """True when a stored shard's metadata names exactly these axes."""
    if meta is None or meta.layout != SHARD or len(meta.axes) != len(axes):
        return False
    for (kind, _, rank, count, sd), rid, d in zip(meta.axes, meta.axis_ids, _layout_axes(axes)):
        if (kind, rank, count, sd) != (d[0], d[2], d[3], d[4]) or \
                (kind in (AXIS_EP, AXIS_PP) and rid != d[5]):
            return False
    return True


def _tp_of(axes):
    return next((d for d in axes if d["kind"] == "tp"), None)


def _partition(wp):
    """(rank, size, split_dim) from a writer_partition: a tuple or an
    object with those fields; None when it is not one."""
    try:
        r, n, d = (wp.rank, wp.size, wp.split_dim) if hasattr(wp, "rank") else tuple(wp)
    except (TypeError, ValueError, AttributeError):
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (r, n, d)) or \
            not 0 <= r < n:
        return None
    return r, n, d


class ParallelismCalls:
    """Mooncake's unified parallel tensor calls (*_with_parallelism), as its
    documentation ("Unified Parallel Tensor IO") describes them.

    Writes: no parallelism stores the full tensor under the key. A single
    tp axis is Mooncake's shard-input form: the tensor is the caller's
    shard, stored as put_tensor_with_tp stores rank r's ("<key>_tp_<r>").
    writer_partition=(rank, size, split_dim) cuts a full tensor into the
    one shard it names (stored the same way). Several axes (dp, tp, ep, pp,
    in any order, each at most once) name a shard identity, stored under
    parallel_key's name with every axis in the metadata block: when a tp
    axis is among them the tensor is the full source and the tp rank's
    uniform slice along its split_dim (default 0) is what is stored
    (Mooncake's full-tensor input for dp_tp / pp_tp / ep_tp); without one
    (dp, pp, ep alone: scope tags) the tensor is stored as given.

    Reads: as_stored (the key's object), shard (the object the identity
    names, checked against its metadata; for an identity with a tp axis
    that is not stored, the slice is cut from the full tensor under the key
    when there is one), full (no parallelism: the object under the key,
    else every single-axis TP shard joined; with a parallelism holding a
    tp axis: that identity's tp shards for every tp rank, the other axes
    fixed, joined along the tp split dim). A full read with no tp axis, or
    a shard set with one missing, is None. A shard read with another tp
    size than the one stored is cut from the stored shards joined
    (reshard on read, uniform slices only); remapping between kinds (tp
    to ep) is not done: Mooncake's planner leaves most of it undone too."""

    def _put_par(self, key, tensor, parallelism, config, writer_partition):
        if parallelism is not None and writer_partition is not None:
            return -600
        if writer_partition is not None:
            part = _partition(writer_partition)
            if part is None:
                return -600
            rank, size, dim = part
            try:
                meta, chunk = tp_shards(tensor, size, dim)[rank]
            except (ValueError, AttributeError, TypeError, IndexError):
                return -600
            return self._put_shards([tp_key(key, rank)], [(meta, chunk)], config)[0]
        tp = _tp_only(parallelism)
        if tp is False:
            return self._put_axes(key, tensor, parallelism, config)
        if tp is None:
            return self._put_tensors([key], [tensor], config)[0]
        rank, size, dim = tp
        try:
            code = dtype_code(tensor.dtype)
            shape = tuple(tensor.shape)
            if code is None or not 0 <= dim < len(shape) or not tensor.is_cpu:
                return -600
            chunk = tensor.contiguous()
        except AttributeError:
            return -600
        gshape = shape[:dim] + (shape[dim] * size,) + shape[dim + 1:]
        meta = pack(code, gshape, shape, chunk.numel() * chunk.element_size(), SHARD,
                    [(AXIS_TP, 0, rank, size, dim)])
        return self._put_shards([tp_key(key, rank)], [(meta, chunk)], config)[0]

    def _put_axes(self, key, tensor, parallelism, config):
        """A shard identity of several axes (or one that is not tp)."""
        axes = _axes(parallelism)
        if not axes:
            return -600
        try:
            code = dtype_code(tensor.dtype)
            shape = tuple(tensor.shape)
            if code is None or not tensor.is_cpu or len(shape) > MAX_DIMS:
                return -600
        except AttributeError:
            return -600
        tp = _tp_of(axes)
        if tp is not None:
            if tp["split_dim"] is None:
                tp["split_dim"] = 0
            dim, n, r = tp["split_dim"], tp["size"], tp["rank"]
            if not 0 <= dim < len(shape) or shape[dim] % n:
                return -600   # Mooncake stores uniform slices only
            step = shape[dim] // n
            chunk = tensor.narrow(dim, r * step, step).contiguous()
            gshape = shape
        else:
            chunk = tensor.contiguous()
            gshape = list(shape)
            for d in axes:   # an axis that splits a dim (ep's) scales it
                if d["split_dim"] is not None:
                    if not 0 <= d["split_dim"] < len(shape):
                        return -600
                    gshape[d["split_dim"]] *= d["size"]
            gshape = tuple(gshape)
        meta = pack(code, gshape, tuple(chunk.shape), chunk.numel() * chunk.element_size(),
                    SHARD, _layout_axes(axes))
        return self._put_shards([parallel_key(key, axes)], [(meta, chunk)], config)[0]

    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                    writer_partition=None):
        return self._put_par(key, tensor, parallelism, config, writer_partition)

    def batch_put_tensor_with_parallelism(self, keys, tensors, parallelisms=None, config=None,
                                          writer_partitions=None):
        n = len(keys)
        pars = [None] * n if parallelisms is None else list(parallelisms)
        wps = [None] * n if writer_partitions is None else list(writer_partitions)
        if len(tensors) != n or len(pars) != n or len(wps) != n:
            return [-600] * n
        return [self._put_par(k, t, p, config, w) for k, t, p, w in zip(keys, tensors, pars, wps)]

    upsert_tensor_with_parallelism = put_tensor_with_parallelism
    batch_upsert_tensor_with_parallelism = batch_put_tensor_with_parallelism

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                         config=None, writer_partition=None):
        """[buffer_ptr, +size) holds one tensor object; stored as
        put_tensor_with_parallelism stores that tensor."""
        if not self._ptr_ok(buffer_ptr, size) or not buffer_ptr or size < METADATA_SIZE:
            return -600
        if _tp_only(parallelism) is None and writer_partition is None:
            rc = self.put_tensor_from(key, buffer_ptr, size)
            if rc == 0 and config is not None:
                self._pin(self._key(key), config)
            return rc
        raw = (ctypes.c_ubyte * size).from_address(buffer_ptr)
        meta = parse(bytes(raw[:METADATA_SIZE]), size)
        if meta is None:
            return -600
        return self._put_par(key, to_tensor(_torch(), raw, meta), parallelism, config,
                             writer_partition)

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, parallelisms=None,
                                               config=None, writer_partitions=None):
        n = len(keys)
        pars = [None] * n if parallelisms is None else list(parallelisms)
        wps = [None] * n if writer_partitions is None else list(writer_partitions)
        if len(buffer_ptrs) != n or len(sizes) != n or len(pars) != n or len(wps) != n:
            return [-600] * n
        return [self.put_tensor_with_parallelism_from(k, p, z, q, config, w)
                for k, p, z, q, w in zip(keys, buffer_ptrs, sizes, pars, wps)]

    upsert_tensor_with_parallelism_from = put_tensor_with_parallelism_from
    batch_upsert_tensor_with_parallelism_from = batch_put_tensor_with_parallelism_from

    def _target(self, key, target):
        """("one", stored key), ("full", key), ("axes", canonical axes) for
        a shard of several axes, ("fullaxes", canonical axes) for a full
        read through an identity, or None for a target not mapped."""
        mode = "as_stored" if target is None else getattr(target, "mode", None)
        par = None if target is None else getattr(target, "parallelism", None)
        if mode == "as_stored":
            return "one", key
        if mode == "full":
            if _tp_only(par) is not False:
                return "full", key
            axes = _axes(par)
            return ("fullaxes", axes) if axes and _tp_of(axes) else None
        if mode == "shard":
            tp = _tp_only(par)
            if tp is False:
                axes = _axes(par)
                return ("axes", axes) if axes else None
            if not tp:
                return None
            return "tpshard", tp
        return None

    @staticmethod
    def _slice(full, rank, size, dim):
        """Rank's uniform slice of full along dim, or None when full does
        not split evenly (Mooncake serves uniform slices only)."""
        if full is None or not 0 <= dim < full.dim() or full.shape[dim] % size:
            return None
        step = full.shape[dim] // size
        return full.narrow(dim, rank * step, step).contiguous()

    def _tp_shard(self, key, tp):
        """A single-axis tp shard (rank, size, split_dim): the stored shard
        when its layout is that one; else (another tp size stored, or
        none) the slice of the full tensor, the key's own or its stored tp
        shards joined: Mooncake's reshard on read."""
        rank, size, dim = tp
        v = self.get_buffer(tp_key(key, rank))
        meta = parse(v) if v else None
        if meta is not None:
            if meta.layout != SHARD:
                return to_tensor(_torch(), bytearray(v), meta)
            if len(meta.axes) == 1 and meta.axes[0][0] == AXIS_TP and \
                    meta.axes[0][3] == size and meta.axes[0][4] == dim:
                return to_tensor(_torch(), bytearray(v), meta)
        return self._slice(self._full(key), rank, size, dim)

    def _stored_tp_size(self, key, axes, tp):
        """The tp size this identity (the other axes as given) is stored
        with, looking for rank 0 of each size up to 64 in one batch; None."""
        sizes = [n for n in range(1, 65) if n != tp["size"]]
        names = [parallel_key(key, [dict(d, rank=0, size=n) if d is tp else d for d in axes])
                 for n in sizes]
        found = self.batch_is_exist(names)
        return next((n for n, f in zip(sizes, found) if f == 1), None)

    def _shard_axes(self, key, axes):
        """The shard axes name: stored under its name with matching
        metadata, else (with a tp axis) cut from the full tensor stored
        under the key; None."""
        tp = _tp_of(axes)
        if tp is not None and tp["split_dim"] is None:
            tp["split_dim"] = 0
        v = self.get_buffer(parallel_key(key, axes))
        meta = parse(v) if v else None
        if _meta_matches(meta, axes):
            return to_tensor(_torch(), bytearray(v), meta)
        if tp is None:
            return None
        full = self.get_tensor(key)
        if full is None:
            # Stored with another tp size: join that layout, cut this one.
            n = self._stored_tp_size(key, axes, tp)
            if n is None:
                return None
            full = self._full_axes(key, [dict(d, rank=0, size=n) if d is tp else d
                                         for d in axes])
        return self._slice(full, tp["rank"], tp["size"], tp["split_dim"])

    def _full_axes(self, key, axes):
        """The full tensor of the identity's tp shards (every tp rank, the
        other axes as given), joined along the tp split dim; None."""
        tp = _tp_of(axes)
        if tp["split_dim"] is None:
            tp["split_dim"] = 0
        names = [parallel_key(key, [dict(d, rank=r) if d is tp else d for d in axes])
                 for r in range(tp["size"])]
        blobs = self.get_batch(names)
        parts, gshape = [], None
        for r, v in enumerate(blobs):
            meta = parse(v) if v else None
            if not _meta_matches(meta, [dict(d, rank=r) if d is tp else d for d in axes]):
                return None
            gshape = meta.global_shape
            parts.append(to_tensor(_torch(), bytearray(v), meta))
        try:
            out = _torch().cat(parts, tp["split_dim"])
        except RuntimeError:
            return None
        return out if tuple(out.shape) == gshape else None

    def _read_target(self, key, t):
        if t[0] == "one":
            return self.get_tensor(t[1])
        if t[0] == "tpshard":
            return self._tp_shard(key, t[1])
        if t[0] == "axes":
            return self._shard_axes(key, t[1])
        if t[0] == "fullaxes":
            return self._full_axes(key, t[1])
        return self._full(key)

    def _full(self, key):
        torch = _torch()
        t = self.get_tensor(key)
        if t is not None:
            return t
        first = self.get_buffer(tp_key(key, 0))
        meta = parse(first) if first is not None else None
        if meta is None or meta.layout != SHARD or len(meta.axes) != 1 or \
                meta.axes[0][0] != AXIS_TP:
            return None
        _, _, _, count, dim = meta.axes[0]
        parts = self.batch_get_tensor([tp_key(key, r) for r in range(count)])
        if any(p is None for p in parts):
            return None
        try:
            out = torch.cat(parts, dim)
        except RuntimeError:
            return None
        return out if tuple(out.shape) == meta.global_shape else None

    def get_tensor_with_parallelism(self, key, target=None):
        t = self._target(key, target)
        return None if t is None else self._read_target(key, t)

    def batch_get_tensor_with_parallelism(self, keys, targets=None):
        targets = [None] * len(keys) if targets is None else list(targets)
        if len(targets) != len(keys):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        """As get_tensor_into, for as_stored targets;
        any other target reads its tensor (a full tensor, a shard of
        several axes), writes it into the buffer as a tensor object and
        returns a tensor over the buffer (written as a full tensor object)."""
        t = self._target(key, target)
        if t is None:
            return None
        if t[0] == "one":
            return self.get_tensor_into(t[1], buffer_ptr, size)
        full = self._read_target(key, t)
        if full is None or not self._ptr_ok(buffer_ptr, size) or not buffer_ptr:
            return None
        blob = serialize_tensor(full)
        if len(blob) > size:
            return None
        ctypes.memmove(buffer_ptr, blob, len(blob))
        mem = (ctypes.c_ubyte * len(blob)).from_address(buffer_ptr)
        return to_tensor(_torch(), mem, parse(blob))

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes, targets=None):
        n = len(keys)
        targets = [None] * n if targets is None else list(targets)
        if len(buffer_ptrs) != n or len(sizes) != n or len(targets) != n:
            return [None] * n
        return [self.get_tensor_with_parallelism_into(k, p, z, t)
                for k, p, z, t in zip(keys, buffer_ptrs, sizes, targets)]


def serialize_tensor(tensor):
    """bytes of a tensor object (Mooncake's _serialize_tensor)."""
    meta, t = tensor_meta(tensor)
    return meta + (t.view(-1).view(_torch().uint8).numpy().tobytes() if t.numel() else b"")


def deserialize_tensor(data):
    """A tensor from tensor-object bytes, or None."""
    meta = parse(data)
    return None if meta is None else to_tensor(_torch(), bytearray(data), meta)


def serialize_tensor_parts(tensor):
    """Mooncake's _serialize_tensor: (the 304-byte metadata block, the
    address of the tensor's bytes, their length, the tensor that owns them).
    The bytes are not copied: Mooncake's structured object store gathers
    metadata and data into one object itself, so the owner (the tensor, or
    its contiguous copy) must stay referenced until they are written.
    ValueError for a tensor that cannot be stored, as Mooncake raises."""
    meta, t = tensor_meta(tensor)
    return meta, (t.data_ptr() if t.numel() else 0), t.numel() * t.element_size(), t


def deserialize_tensor_strict(data):
    """Mooncake's _deserialize_tensor: a tensor (over its own copy of the
    bytes) from metadata + data; ValueError, as Mooncake raises, for bytes
    that are not a whole, valid tensor object."""
    mem = bytearray(data)
    meta = parse(mem)
    t = None if meta is None else to_tensor(_torch(), mem, meta)
    if t is None:
        raise ValueError("invalid serialized Mooncake tensor payload")
    return t


# -- safetensors files ---------------------------------------------------------
# The format (huggingface/safetensors' documented layout): an 8-byte
# little-endian header length N, N bytes of JSON {name: {"dtype", "shape",
# "data_offsets": [begin, end]}, "__metadata__": {...}} (padded with spaces),
# then the tensors' bytes, offsets counted from the end of the header.
# Written here so that no safetensors package is needed; the
# safetensors.torch package is used instead when it is installed.

_ST_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
             "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
             "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
             "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_ST_DTYPES = {v: k for k, v in _ST_NAMES.items()}


def save_safetensors(tensors, path):
    """Writes {name: CPU tensor} to path in the safetensors format."""
    import json
    try:
        from safetensors.torch import save_file
    except ImportError:
        save_file = None
    if save_file is not None:
        save_file(tensors, path)
        return
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        code = _ST_NAMES.get(str(t.dtype).replace("torch.", ""))
        if code is None:
            raise ValueError("dtype %s has no safetensors name" % t.dtype)
        t = t.detach().contiguous()
        raw = t.view(-1).view(_torch().uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """{name: tensor} from a safetensors file; ValueError when it is not one."""
    import json
    try:
        from safetensors.torch import load_file
    except ImportError:
        load_file = None
    if load_file is not None:
        return load_file(path)
    torch = _torch()
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: not a safetensors file" % path)
    (n,) = struct.unpack_from("<Q", data)
    if n > len(data) - 8:
        raise ValueError("%s: header length %d past the file's end" % (path, n))
    header = json.loads(data[8:8 + n])
    body = 8 + n
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        dt = getattr(torch, _ST_DTYPES.get(d.get("dtype"), ""), None)
        b, e = d["data_offsets"]
        shape = [int(x) for x in d["shape"]]
        if dt is None or not 0 <= b <= e <= len(data) - body:
            raise ValueError("%s: tensor %r is not readable" % (path, name))
        raw = bytearray(data[body + b:body + e])
        t = torch.frombuffer(raw, dtype=torch.uint8).view(dt) if raw else \
            torch.empty(0, dtype=dt)
        out[name] = t.reshape(shape)
    return out


class SafetensorCalls:
    """save_tensor_to_safetensor / load_tensor_from_safetensor, as Mooncake
    documents them."""

    def save_tensor_to_safetensor(self, key, file_name=None):
        """Writes the tensor stored under key to file_name (default: key); 0,
        or FILE_NOT_FOUND (-1100) when no tensor is stored there, or
        INVALID_PARAMS when the file cannot be written."""
        t = self.get_tensor(key)
        if t is None:
            return -1100
        try:
            save_safetensors({key: t}, key if file_name is None else file_name)
        except (OSError, ValueError, TypeError):
            return -600
        return 0

    def load_tensor_from_safetensor(self, key=None, file_name=None):
        """Reads a tensor from a safetensors file and stores it under key
        (default: file_name); the tensor named key in the file, else its
        first. Returns the tensor, or None."""
        if file_name is None:
            return None
        try:
            loaded = load_safetensors(file_name)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not loaded:
            return None
        target = file_name if key is None else key
        name = key if key is not None and key in loaded else next(iter(loaded))
        t = loaded[name]
        return t if self.put_tensor(target, t) == 0 else None
