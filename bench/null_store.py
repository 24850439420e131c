"""null_store.py — a "null store" for Mooncake's store_kv_bench.py: the
mooncake.store calls that benchmark makes, done as cheaply as Python
allows, so that a run against it measures the benchmark's own work (its
payload building, memset, string_at, compare, its Python) and nothing
else. What it reaches is the most any store could reach in that harness
on this machine; bench/mooncake_compare.sh runs it as the system `null`
(MOONCAKE_STORE_MODULE=null_store, this directory on PYTHONPATH).

A measurement tool, not a store: one process, no leases, no
replication, and every call moves the bytes once, the least a store that
keeps its data outside the caller's objects can do: a put (put, put_batch,
put_from) is one ctypes.memmove into a segment mapped and faulted in at
setup (global_segment_size bytes, MAP_POPULATE), as a store's segment is;
get is one ctypes.string_at out of it (a new bytes object, as every store
returns), get_into one memmove. Two cheaper shapes were tried and are
wrong as a bound: keeping the caller's bytes object and returning it from
get lets the benchmark's verify skip its compare (bytes == tests identity
first), and copying into new bytes objects kept in a dict cost 35 us per
64 KiB here, nearly all page faults on fresh heap memory, slower than
kvengine's zcopy writes. Slots are reused by size (an overwrite, a
remove). Return values are Mooncake's (0, a length, OBJECT_NOT_FOUND -704,
INVALID_PARAMS -600, NO_AVAILABLE_HANDLE -200 when the segment is full), so
the benchmark counts successes as it does for a real store.
"""

import ctypes
import mmap

_memmove = ctypes.memmove
_string_at = ctypes.string_at
NOT_FOUND = -704
BAD = -600
FULL = -200


class ReplicateConfig:
    def __init__(self):
        self.replica_num = 1
        self.nof_replica_num = 0


class MooncakeDistributedStore:
    def __init__(self):
        self._z = {}          # key -> (address, size) in the segment
        self._free = {}       # size -> [address]
        self._seg = None
        self._next = self._end = 0

    def setup(self, local_hostname=None, metadata_server=None, global_segment_size=0,
              *args, **kwargs):
        n = int(global_segment_size) or (384 << 20)
        self._seg = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS |
                              getattr(mmap, "MAP_POPULATE", 0))
        self._next = ctypes.addressof(ctypes.c_char.from_buffer(self._seg))
        self._end = self._next + n
        return 0

    def close(self):
        self._z.clear()
        self._free.clear()
        return 0

    def tearDownAll(self):
        return self.close()

    def _slot(self, key, n):
        """The segment address for key's n bytes, or 0 when it is full."""
        z = self._z
        old = z.get(key)
        if old is not None:
            if old[1] == n:
                return old[0]
            self._free.setdefault(old[1], []).append(old[0])
        free = self._free.get(n)
        if free:
            a = free.pop()
        elif self._next + n <= self._end:
            a = self._next
            self._next += (n + 63) & ~63
        else:
            z.pop(key, None)
            return 0
        z[key] = (a, n)
        return a

    def put(self, key, value, config=None):
        n = len(value)
        a = self._slot(key, n)
        if not a:
            return FULL
        _memmove(a, value, n)
        return 0

    def put_batch(self, keys, values, config=None):
        for k, v in zip(keys, values):
            rc = self.put(k, v)
            if rc:
                return rc
        return 0

    def put_from(self, key, buffer_ptr, size, config=None):
        a = self._slot(key, size)
        if not a:
            return FULL
        _memmove(a, buffer_ptr, size)
        return 0

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        return [self.put_from(k, p, n) for k, p, n in zip(keys, buffer_ptrs, sizes)]

    def get(self, key):
        z = self._z.get(key)
        return b"" if z is None else _string_at(z[0], z[1])

    def get_batch(self, keys):
        get = self._z.get
        out = []
        for k in keys:
            z = get(k)
            out.append(b"" if z is None else _string_at(z[0], z[1]))
        return out

    def get_into(self, key, buffer_ptr, size):
        z = self._z.get(key)
        if z is None:
            return NOT_FOUND
        if z[1] > size:
            return BAD
        _memmove(buffer_ptr, z[0], z[1])
        return z[1]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        return [self.get_into(k, p, n) for k, p, n in zip(keys, buffer_ptrs, sizes)]

    def is_exist(self, key):
        return 1 if key in self._z else 0

    isExist = is_exist

    def batch_is_exist(self, keys):
        z = self._z
        return [1 if k in z else 0 for k in keys]

    def remove(self, key, force=False):
        z = self._z.pop(key, None)
        if z is None:
            return NOT_FOUND
        self._free.setdefault(z[1], []).append(z[0])
        return 0


class _Lease:
    def __init__(self, pool, m, size):
        self._pool, self._m, self.size = pool, m, size
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))

    def release(self):
        if self._m is not None:
            self._pool._leases.discard(self)
            self.ptr = 0
            self._m = None      # the mapping goes when the last view of it does


class BufferPool:
    """Page-aligned anonymous memory (mmap), as kvengine's pool hands out
    when it has no shared buffer: the benchmark's memmove into it meets the
    same alignment."""

    def __init__(self, store, max_bytes=0, max_regions=0, **kwargs):
        self._max = max_bytes
        self._leases = set()

    def acquire(self, size, block=True, timeout=None):
        if self._max and size > self._max:
            raise RuntimeError("null BufferPool: %d bytes over max_bytes %d" % (size, self._max))
        lease = _Lease(self, mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS),
                       size)
        self._leases.add(lease)
        return lease

    def close(self):
        for lease in list(self._leases):
            lease.release()
