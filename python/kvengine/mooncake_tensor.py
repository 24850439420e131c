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
AXIS_TP = 1

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
    """The 304-byte metadata block. axes: (kind, index, rank, count, split_dim)."""
    hdr = _HEADER.pack(MAGIC, VERSION, METADATA_SIZE, code, len(global_shape), layout, 0,
                       METADATA_SIZE, data_bytes)
    sh = _SHAPES.pack(*_dims(global_shape), *_dims(local_shape), len(axes), 0)
    ax = b"".join(_AXIS.pack(*a, 0, 0) for a in axes)
    ax += b"\0" * (_AXIS.size * (MAX_AXES - len(axes)))
    return hdr + sh + ax


class Meta:
    __slots__ = ("dtype", "ndim", "layout", "global_shape", "shape", "data_offset",
                 "data_bytes", "axes")


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
    m.axes = [_AXIS.unpack_from(buf, _HEADER.size + _SHAPES.size + i * _AXIS.size)[:5]
              for i in range(naxes)]
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


def serialize_tensor(tensor):
    """bytes of a tensor object (Mooncake's _serialize_tensor)."""
    meta, t = tensor_meta(tensor)
    return meta + (t.view(-1).view(_torch().uint8).numpy().tobytes() if t.numel() else b"")


def deserialize_tensor(data):
    """A tensor from tensor-object bytes (Mooncake's _deserialize_tensor), or None."""
    meta = parse(data)
    return None if meta is None else to_tensor(_torch(), bytearray(data), meta)


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
