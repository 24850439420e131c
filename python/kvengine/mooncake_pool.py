"""mooncake_pool.py — Mooncake's BufferPool / RegisteredBufferPool for the drop-in.

A BufferPool hands out leases on registered memory (what the zero-copy
calls put_from / get_into and their batch forms read and write): acquire()
gives a BufferLease (ptr, size, buffer, release, a context manager);
buffer() gives a memoryview whose lease goes back when the view is
dropped. A lease cannot be released while a view of it is exported, and
close() refuses while leases are active, as Mooncake's pool does.

Key design choice: the memory comes from the engine's shared-buffer
allocator (kv_buffer_alloc / kv_buffer_free, the host store's segment,
so another process attached to the same store reads it with one copy)
when the loaded library has it; otherwise each region is a page-aligned
anonymous mmap registered with the store (kv_register_buffer), and
unregistered when it goes back. Regions are not cached between leases:
the engine's register call is cheap on tcp, and a pool that never grows
past max_bytes is what callers size against.
"""

import ctypes
import mmap
import threading
import time
import weakref

from . import _lib


def _view(lease, size, on_gone):
    """A writable memoryview of size bytes at lease.ptr. The ctypes array
    under it lives exactly as long as the view and every slice of it, so
    a finalizer on the array says when the last export is gone (memoryview
    itself takes no weak references)."""
    arr = (ctypes.c_ubyte * size).from_address(lease.ptr)
    arr._lease = lease          # the memory stays leased while a view lives
    lease._exports += 1
    weakref.finalize(arr, on_gone)
    return memoryview(arr).cast("B")


class BufferLeaseView:
    """Mooncake's BufferLeaseView: what .buffer wraps (a memoryview here)."""


class BufferLease:
    """One region of a BufferPool, held until release() (or the with block)."""

    def __init__(self, pool, region, size):
        self._pool = pool
        self._region = region
        self._size = size
        self._exports = 0

    @property
    def ptr(self):
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return self._region[0]

    @property
    def size(self):
        return self._size

    @property
    def buffer(self):
        """A writable memoryview of the lease's size bytes; the lease cannot
        be released while it (or a slice of it) lives."""
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        if not self._size:
            return memoryview(bytearray())
        return _view(self, self._size, self._unexport)

    def _unexport(self):
        self._exports -= 1

    def release(self):
        if self._region is None:
            return
        if self._exports:
            raise RuntimeError("cannot release buffer while exported views exist")
        region, self._region = self._region, None
        self._pool._give_back(region)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        if getattr(self, "_region", None) is not None:
            self._exports = 0
            self.release()


class BufferPool:
    """Mooncake's BufferPool(store, max_bytes=0, min_size_class=64 KiB,
    max_size_class=None, alignment=8 MiB, block_on_exhaustion=True,
    default_timeout=None, max_regions=None, prewarm_size=None,
    prewarm_count=0). max_bytes 0 means twice the store's local buffer."""

    def __init__(self, store, max_bytes=0, min_size_class=64 * 1024, max_size_class=None,
                 alignment=8 * 1024 * 1024, block_on_exhaustion=True, default_timeout=None,
                 max_regions=None, prewarm_size=None, prewarm_count=0):
        eng = getattr(store, "_eng", None)
        if eng is None:
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        local = getattr(store, "_local_buffer", 0)
        if not local:
            raise RuntimeError("BufferPool requires a store configured with a local buffer")
        self._store = store
        self._max_bytes = local * 2 if max_bytes == 0 else max(max_bytes, local)
        self._max_size_class = self._max_bytes if max_size_class is None else max_size_class
        self._block = block_on_exhaustion
        self._timeout = default_timeout
        self._max_regions = max_regions
        self._lock = threading.Condition()
        self._total = 0
        self._regions = 0
        self._closed = False

    # -- regions ---------------------------------------------------------------

    def _alloc(self, n):
        eng = self._store._eng
        if eng is None:
            raise RuntimeError("MooncakeDistributedStore is closed")
        if _lib.kv_buffer_alloc is not None:
            out = ctypes.c_void_p()
            h = eng._enter()
            try:
                rc = _lib.kv_buffer_alloc(h, n, ctypes.byref(out))
            finally:
                eng._leave()
            if rc == 0 and out.value:
                with self._store._llock:
                    self._store._regs[out.value] = n
                return (out.value, n, None)
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        rc = self._store.register_buffer(addr, n)
        if rc != 0:
            m.close()
            raise RuntimeError("buffer registration failed (%d)" % rc)
        return (addr, n, m)

    def _free(self, region):
        addr, n, m = region
        eng = self._store._eng
        if m is None:
            with self._store._llock:
                self._store._regs.pop(addr, None)
            if eng is not None:
                try:
                    h = eng._enter()
                except RuntimeError:     # closing: its buffers go with its segment
                    return
                try:
                    _lib.kv_buffer_free(h, addr)
                finally:
                    eng._leave()
            return
        if eng is not None:
            self._store.unregister_buffer(addr)
        try:
            m.close()
        except BufferError:   # a ctypes view still lives: the mapping goes with it
            pass

    def _fits(self, n):
        return self._total + n <= self._max_bytes and \
            (self._max_regions is None or self._regions < self._max_regions)

    # -- the interface -----------------------------------------------------------

    def acquire(self, size, block=None, timeout=None):
        if not isinstance(size, int) or size < 0:
            raise TypeError("size is a non-negative int")
        block = self._block if block is None else block
        timeout = self._timeout if timeout is None else timeout
        if timeout is not None and timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        n = max(size, 1)
        if n > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self._closed:
                    raise RuntimeError("buffer pool is closed")
                if self._fits(n):
                    self._total += n
                    self._regions += 1
                    break
                if not block:
                    raise RuntimeError("buffer pool is exhausted")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError("timed out waiting for buffer")
                self._lock.wait(left)
        try:
            region = self._alloc(n)
        except BaseException:
            with self._lock:
                self._total -= n
                self._regions -= 1
                self._lock.notify_all()
            raise
        return BufferLease(self, region, size)

    def buffer(self, size, block=None, timeout=None):
        """A writable memoryview of size bytes whose lease goes back with it."""
        lease = self.acquire(size, block, timeout)
        if not size:
            lease.release()
            return memoryview(bytearray())

        def gone():
            lease._exports -= 1
            lease.release()

        return _view(lease, size, gone)

    def prewarm(self, size, count):
        """Accepted; regions are made on demand (see the file's top)."""
        return None

    def _give_back(self, region):
        self._free(region)
        with self._lock:
            self._total -= region[1]
            self._regions -= 1
            self._lock.notify_all()

    def close(self):
        with self._lock:
            if self._closed:
                return
            if self._regions:
                raise RuntimeError("cannot close buffer pool with active leases")
            self._closed = True
            self._lock.notify_all()


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView
