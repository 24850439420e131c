"""_lib.py — finding libkvengine.so.0 and declaring its C API for ctypes.

Key design choice: the library is found in a fixed order, so that a test
run, a built tree and an installation each load the library that belongs
to them: $KVENGINE_LIBRARY, then build/libkvengine.so.0 of the tree this
package sits in (python/kvengine/../../build), then the library installed
beside this package ($PREFIX/lib/python3/dist-packages/kvengine ->
$PREFIX/lib), then whatever the dynamic linker finds by soname. Every
prototype is declared once here with argtypes/restype, so a call with a
wrong type fails in Python instead of passing a truncated pointer.

The shared library does not link jemalloc (see the Makefile): loading it
into a Python process leaves the interpreter's allocator alone.
"""

import ctypes
import os

SONAME = "libkvengine.so.0"

KV_BLOCK_ID_LEN = 16
KV_KEY_MAX = 250
KV_VALUE_MAX = 0xFFFFFFC0

# The KV_ERR_MAP of include/kvengine.h: name -> (value, description). The
# descriptions are read from kv_strerror at load time; these are the names.
ERR_NAMES = {
    0: "OK",
    -101: "EINVAL", -102: "ENOMEM", -103: "ENOSPC", -104: "ENOTFOUND",
    -105: "ETIMEDOUT", -106: "EIO", -107: "ECORRUPT", -108: "ECONFIG",
    -109: "ENET", -110: "EPROTO", -111: "EPERM", -112: "EBUSY",
    -113: "ENOBUFS", -114: "ECLOSED", -115: "ENOTSUP",
}


class kv_block_id(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * KV_BLOCK_ID_LEN)]


class kv_iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class kv_shard(ctypes.Structure):
    _fields_ = [("block", kv_block_id), ("index", ctypes.c_uint32),
                ("iov", ctypes.c_void_p), ("iovcnt", ctypes.c_uint32)]


# Field order of struct kv_stats up to its reserved tail; the tail keeps the
# Python struct as large as the C one, which kv_stats_get memsets whole.
STATS_FIELDS = (
    "dram_capacity", "dram_used", "dram_blocks",
    "ssd_capacity", "ssd_used", "ssd_blocks",
    "hits_dram", "hits_ssd", "misses",
    "evictions", "spills", "spill_drops", "checksum_failures",
    "tasks_inflight",
    "dram_shards", "dram_index_bytes", "promotions", "keys",
    "dumps_ok", "dumps_failed", "loads_ok", "loads_failed",
    "enospc", "open_ns",
)


class kv_stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in STATS_FIELDS] + \
               [("reserved", ctypes.c_uint64 * 16)]


class kv_pair(ctypes.Structure):
    _fields_ = [("key", ctypes.c_void_p), ("klen", ctypes.c_size_t),
                ("val", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class kv_member_info(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char * 129), ("addr", ctypes.c_char * 129),
                ("owner", ctypes.c_int), ("segments", ctypes.c_uint32),
                ("segment_bytes", ctypes.c_uint64),
                ("dram_capacity", ctypes.c_uint64), ("dram_used", ctypes.c_uint64),
                ("ssd_capacity", ctypes.c_uint64), ("ssd_used", ctypes.c_uint64),
                ("dram_blocks", ctypes.c_uint64), ("ssd_blocks", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("heartbeat_age_ms", ctypes.c_int64),
                ("version", ctypes.c_char * 33), ("reserved", ctypes.c_uint64 * 8)]


def _candidates():
    env = os.environ.get("KVENGINE_LIBRARY")
    if env:
        # An explicit choice is the only one: silently loading another
        # library than the one asked for would test the wrong build.
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        os.path.join(here, "..", "..", "build", SONAME),   # a built tree
        os.path.join(here, "..", "..", "..", SONAME),      # $PREFIX/lib
        SONAME,                                            # ld.so's search
    ]


def _load():
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append("%s: not found" % os.path.normpath(path))
            continue
        try:
            return ctypes.CDLL(os.path.normpath(path) if os.sep in path else path), path
        except OSError as exc:
            errors.append(str(exc))
    raise ImportError("kvengine: cannot load %s (set KVENGINE_LIBRARY to its path, or run "
                      "`make` first): %s" % (SONAME, "; ".join(errors)))


lib, path = _load()

_p = ctypes.c_void_p
_sz = ctypes.c_size_t
_i = ctypes.c_int


def _proto(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


kv_strerror = _proto("kv_strerror", ctypes.c_char_p, _i)
kv_err_name = _proto("kv_err_name", ctypes.c_char_p, _i)
kv_version = _proto("kv_version", ctypes.c_char_p)

kv_config_new = _proto("kv_config_new", _i, ctypes.POINTER(_p))
kv_config_load = _proto("kv_config_load", _i, _p, ctypes.c_char_p, ctypes.c_char_p, _sz)
kv_config_parse = _proto("kv_config_parse", _i, _p, ctypes.c_char_p, _sz, ctypes.c_char_p, _sz)
kv_config_set = _proto("kv_config_set", _i, _p, ctypes.c_char_p, ctypes.c_char_p)
kv_config_get = _proto("kv_config_get", _i, _p, ctypes.c_char_p, ctypes.c_char_p, _sz)
kv_config_free = _proto("kv_config_free", None, _p)

kv_open = _proto("kv_open", _i, _p, ctypes.POINTER(_p))
kv_close = _proto("kv_close", None, _p)

kv_lookup = _proto("kv_lookup", _i, _p, _p, _sz, _p)
kv_lookup_prefix = _proto("kv_lookup_prefix", ctypes.c_ssize_t, _p, _p, _sz)
kv_prefetch = _proto("kv_prefetch", _i, _p, _p, _sz)
kv_dump = _proto("kv_dump", _i, _p, _p, _sz, ctypes.POINTER(ctypes.c_uint64))
kv_load = _proto("kv_load", _i, _p, _p, _sz, ctypes.POINTER(ctypes.c_uint64))
kv_check = _proto("kv_check", _i, _p, ctypes.c_uint64, ctypes.POINTER(_i))
kv_wait = _proto("kv_wait", _i, _p, ctypes.c_uint64, ctypes.c_uint)

kv_put = _proto("kv_put", _i, _p, _p, _sz, _p, _sz)
kv_get = _proto("kv_get", _i, _p, _p, _sz, _p, _sz, ctypes.POINTER(_sz))
kv_exists = _proto("kv_exists", _i, _p, _p, _sz)
kv_remove = _proto("kv_remove", _i, _p, _p, _sz)

kv_register_buffer = _proto("kv_register_buffer", _i, _p, _p, _sz)
kv_unregister_buffer = _proto("kv_unregister_buffer", _i, _p, _p)
kv_stats_get = _proto("kv_stats_get", _i, _p, ctypes.POINTER(kv_stats))
kv_shard_size = _proto("kv_shard_size", _i, _p, _p, ctypes.c_uint32,
                       ctypes.POINTER(ctypes.c_uint64))
kv_members = _proto("kv_members", _i, _p, ctypes.POINTER(ctypes.c_uint64),
                    ctypes.POINTER(ctypes.POINTER(kv_member_info)), ctypes.POINTER(_sz))

# The batched plain-key calls (kv_put_many ...) came with cluster-wide plain
# keys; an older library lacks them and the Mooncake store then loops.
if hasattr(lib, "kv_put_many"):
    kv_put_many = _proto("kv_put_many", _i, _p, _p, _sz, _p)
    kv_get_many = _proto("kv_get_many", _i, _p, _p, _sz, _p)
    kv_exists_many = _proto("kv_exists_many", _i, _p, _p, _sz, _p)
else:   # pragma: no cover - depends on the library loaded
    kv_put_many = kv_get_many = kv_exists_many = None
# kv_remove_all came later still; without it the Mooncake store removes
# the keys it put itself.
if hasattr(lib, "kv_remove_all"):
    kv_remove_all = _proto("kv_remove_all", _i, _p, ctypes.POINTER(ctypes.c_uint64))
else:   # pragma: no cover - depends on the library loaded
    kv_remove_all = None
# kv_remove_prefix (a tenant's remove_all) came after it.
if hasattr(lib, "kv_remove_prefix"):
    kv_remove_prefix = _proto("kv_remove_prefix", _i, _p, _p, _sz,
                              ctypes.POINTER(ctypes.c_uint64))
else:   # pragma: no cover - depends on the library loaded
    kv_remove_prefix = None

_libc = ctypes.CDLL(None)
free = _libc.free
free.restype = None
free.argtypes = [_p]

# Shared buffers of the host store (kv_buffer_alloc / kv_buffer_free) came
# with it; a library without them leaves BufferPool on page-aligned mmap
# memory registered with kv_register_buffer.
if hasattr(lib, "kv_buffer_alloc") and hasattr(lib, "kv_buffer_free"):
    kv_buffer_alloc = _proto("kv_buffer_alloc", _i, _p, _sz, ctypes.POINTER(_p))
    kv_buffer_free = _proto("kv_buffer_free", _i, _p, _p)
else:   # pragma: no cover - depends on the library loaded
    kv_buffer_alloc = kv_buffer_free = None
