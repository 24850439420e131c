"""ucm.py — kvengine as a UCM V1 store (KvEngineStore).

UCM (unified-cache-management) reaches its stores through the abstract
class UcmKVStoreBaseV1 of ucm/store/ucmstore_v1.py. KvEngineStore
implements it over kvengine.Engine, subclassing UCM's class when the `ucm`
package is importable and a local class of the same shape otherwise.

    store = KvEngineStore({"kvengine_settings": {"pipeline": "dram",
                                                 "dram.capacity": "8GiB"},
                           "tensor_size": 65536})
    task = store.dump(block_ids, [0] * n, tensors)   # tensors[i]: block i's list
    store.wait(task)                                 # RuntimeError on failure

Key design choices:
- UCM passes no sizes with the raw-address calls (load_data / dump_data):
  they come from the config, `tensor_size` for every address or
  `tensor_size_list[j]` for the j-th address of each block, as UCM's own
  stores take them.
- Tensors on a GPU are staged through pinned host buffers when torch.cuda
  is available: a dump copies device -> host before the engine task starts,
  a load copies host -> device when the task is waited for (or checked done).
  The engine itself only ever sees host memory. Pinned buffers are pooled
  by size, because pinning is far slower than a copy.
"""

import threading

from .engine import Engine, KvError

try:   # pragma: no cover - depends on UCM being installed
    from ucm.store.ucmstore_v1 import Task as _UcmTaskBase
    from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1
except Exception:   # ImportError, or a UCM without the V1 interface
    class _UcmTaskBase:
        """UCM's opaque task handle (local stand-in; ucm is not installed)."""

    class UcmKVStoreBaseV1:
        """Local stand-in of UCM's UcmKVStoreBaseV1 (ucm is not installed)."""

        def __init__(self, config):
            self.config = config


class KvEngineTask(_UcmTaskBase):
    """What load/dump return: the engine task, plus the device copies a
    staged load still owes (run once, when the task is found done)."""

    def __init__(self, task, after=None, release=None):
        self.task = task
        self.task_id = task.id
        self._after = after
        self._release = release
        self._lock = threading.Lock()
        self._error = None

    def _settle(self):
        with self._lock:
            after, release = self._after, self._release
            self._after = self._release = None
        try:
            if after is not None and self.task.result == 0:
                try:
                    after()
                except Exception as exc:   # a failed device copy fails the task
                    self._error = exc
        finally:
            if release is not None:
                release()

    def __repr__(self):
        return "<KvEngineTask %r>" % (self.task,)


def _shard_indexes(shard_index, n):
    if isinstance(shard_index, int):
        return [shard_index] * n
    idx = list(shard_index)
    if len(idx) != n:
        raise ValueError("shard_index has %d entries for %d block ids" % (len(idx), n))
    return idx


class _PinnedPool:
    """Pinned host buffers by size, reused across tasks."""

    def __init__(self, torch):
        self.torch = torch
        self.free = {}
        self.lock = threading.Lock()

    def get(self, nbytes):
        with self.lock:
            lst = self.free.get(nbytes)
            if lst:
                return lst.pop()
        return self.torch.empty(nbytes, dtype=self.torch.uint8,
                                pin_memory=self.torch.cuda.is_available())

    def put(self, bufs):
        with self.lock:
            for b in bufs:
                self.free.setdefault(b.numel(), []).append(b)


class _CudaSpan:
    """A device address as an object torch.as_tensor understands
    (__cuda_array_interface__), so raw device pointers can be staged too."""

    def __init__(self, addr, size):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                         "data": (addr, False), "version": 3}


class KvEngineStore(UcmKVStoreBaseV1):
    """UCM's V1 store interface over a kvengine engine.

    config keys: kvengine_config (a YAML path) and kvengine_settings (a dict
    of dotted keys) configure the engine (neither: its defaults);
    tensor_size or tensor_size_list give the sizes behind load_data /
    dump_data addresses; device_id >= 0 says those addresses are on that
    CUDA device (staged through pinned host memory) when torch.cuda is
    available; without it they are host addresses."""

    def __init__(self, config):
        if not isinstance(config, dict):
            raise TypeError("config is a dict, got %s" % type(config).__name__)
        super().__init__(config)
        self.config = config
        sizes = config.get("tensor_size_list")
        size = config.get("tensor_size")
        if sizes is not None:
            if not isinstance(sizes, (list, tuple)) or not sizes or \
                    not all(isinstance(x, int) and x > 0 for x in sizes):
                raise ValueError("tensor_size_list is a non-empty list of positive ints")
            self._sizes = list(sizes)
        elif size is not None:
            if not isinstance(size, int) or size <= 0:
                raise ValueError("tensor_size is a positive int, got %r" % (size,))
            self._sizes = size
        else:
            self._sizes = None
        self._device_id = int(config.get("device_id", -1))
        self._torch = None
        self._pool = None
        self.engine = Engine(config.get("kvengine_config"), config.get("kvengine_settings"))

    # -- UCM V1 interface ----------------------------------------------------

    def cc_store(self):
        """The kv_engine pointer, for native code that links libkvengine."""
        h = self.engine._h
        if h is None:
            raise KvError(-114, "store is closed")
        return h

    def lookup(self, block_ids):
        return self.engine.lookup(block_ids)

    def lookup_on_prefix(self, block_ids):
        """Index of the last block found in the leading run; -1 when none."""
        return self.engine.lookup_prefix(block_ids)

    def prefetch(self, block_ids):
        self.engine.prefetch(block_ids)

    def dump(self, block_ids, shard_index, src_tensor):
        return self._tensors(False, block_ids, shard_index, src_tensor)

    def load(self, block_ids, shard_index, dst_tensor):
        return self._tensors(True, block_ids, shard_index, dst_tensor)

    def dump_data(self, block_ids, shard_index, src_addr, prerequisite_handle=0):
        return self._addrs(False, block_ids, shard_index, src_addr)

    def load_data(self, block_ids, shard_index, dst_addr):
        return self._addrs(True, block_ids, shard_index, dst_addr)

    # Older UCM releases name load_data fetch_data.
    fetch_data = load_data

    def wait(self, task):
        """Blocks until task is done; RuntimeError (a KvError) on failure."""
        t = self._task(task)
        try:
            t.task.wait()
        finally:
            t._settle()
        if t._error is not None:
            raise RuntimeError("task %d: copying to the device failed: %s"
                               % (t.task_id, t._error)) from t._error

    def check(self, task):
        """True once task has finished (successfully or not); never blocks."""
        t = self._task(task)
        if not t.task.check():
            return False
        # Done: collect the result so that a staged load's device copy runs.
        try:
            t.task.wait()
        except KvError:
            pass
        t._settle()
        return True

    # -- beyond the interface ---------------------------------------------------

    def close(self):
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals ------------------------------------------------------------

    @staticmethod
    def _task(task):
        if not isinstance(task, KvEngineTask):
            raise TypeError("not a task of this store: %r" % (task,))
        return task

    def _torch_mod(self):
        if self._torch is None:
            import torch   # only when a tensor or a device is in play
            self._torch = torch
            self._pool = _PinnedPool(torch)
        return self._torch

    def _sync(self):
        """Waits for the device copies queued on this thread's stream."""
        torch = self._torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def _on_device(self, t):
        """True when t must be staged through host memory."""
        dev = getattr(t, "device", None)
        return dev is not None and dev.type != "cpu"

    def _tensors(self, load, block_ids, shard_index, tensors):
        n = len(block_ids)
        idx = _shard_indexes(shard_index, n)
        if len(tensors) != n:
            raise ValueError("%d tensor lists for %d block ids" % (len(tensors), n))
        staged = any(self._on_device(t) for row in tensors for t in row)
        if not staged:
            shards = [(block_ids[i], idx[i], list(tensors[i])) for i in range(n)]
            fn = self.engine.load if load else self.engine.dump
            return KvEngineTask(fn(shards))
        return self._staged(load, block_ids, idx, [list(r) for r in tensors])

    def _staged(self, load, block_ids, idx, rows):
        """Device tensors through pinned host buffers (see the file's top)."""
        torch = self._torch_mod()
        hosts = []
        pairs = []
        shards = []
        for i, row in enumerate(rows):
            hrow = []
            for t in row:
                if not self._on_device(t):
                    hrow.append(t)
                    continue
                if not t.is_contiguous():
                    raise ValueError("block %d: tensor is not contiguous" % i)
                nbytes = t.numel() * t.element_size()
                h = self._pool.get(nbytes)
                hosts.append(h)
                flat = t.view(-1).view(torch.uint8) if nbytes else t
                if not load:
                    h.copy_(flat, non_blocking=True)
                pairs.append((flat, h))
                hrow.append(h)
            shards.append((block_ids[i], idx[i], hrow))
        pool = self._pool

        def release():
            pool.put(hosts)

        try:
            if not load:
                self._sync()
                return KvEngineTask(self.engine.dump(shards), release=release)

            def after():
                for dev, h in pairs:
                    dev.copy_(h, non_blocking=True)
                self._sync()

            return KvEngineTask(self.engine.load(shards), after=after, release=release)
        except BaseException:
            release()
            raise

    def _addrs(self, load, block_ids, shard_index, addrs):
        if self._sizes is None:
            raise ValueError("load_data/dump_data need tensor_size or tensor_size_list in the "
                             "store's config: UCM passes addresses without sizes")
        n = len(block_ids)
        idx = _shard_indexes(shard_index, n)
        if hasattr(addrs, "tolist") and getattr(addrs, "ndim", 2) == 2:
            rows = addrs.tolist()   # a 2-D numpy array of addresses
        else:
            rows = addrs
        if len(rows) != n:
            raise ValueError("%d address lists for %d block ids" % (len(rows), n))
        sizes = self._sizes
        if self._device_id >= 0 and self._torch_mod().cuda.is_available():
            # Device pointers: view them as device tensors and stage them.
            torch = self._torch
            dev = torch.device("cuda", self._device_id)
            trows = []
            for i, row in enumerate(rows):
                szs = self._row_sizes(sizes, row, i)
                trows.append([torch.as_tensor(_CudaSpan(a, s), device=dev)
                              for a, s in zip(row, szs)])
            return self._staged(load, block_ids, idx, trows)
        shards = []
        for i, row in enumerate(rows):
            szs = self._row_sizes(sizes, row, i)
            shards.append((block_ids[i], idx[i], [(a, s) for a, s in zip(row, szs)]))
        fn = self.engine.load if load else self.engine.dump
        return KvEngineTask(fn(shards))

    @staticmethod
    def _row_sizes(sizes, row, i):
        if isinstance(sizes, int):
            return [sizes] * len(row)
        if len(row) != len(sizes):
            raise ValueError("block %d: %d addresses, but tensor_size_list has %d sizes"
                             % (i, len(row), len(sizes)))
        return sizes
