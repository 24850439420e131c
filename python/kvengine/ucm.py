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

import ctypes
import os
import threading
import time

from . import _lib
from .engine import EBUSY as _EBUSY, Engine, KvError, make_config

try:   # UCM's stores return numpy arrays from lookup; numpy is optional here
    import numpy as _np
except ImportError:   # pragma: no cover - numpy is installed where UCM runs
    _np = None


class UcmError(RuntimeError, ValueError):
    """An argument or config error. A RuntimeError, as UCM's stores raise
    (its connector catches only that), and a ValueError for callers that
    check arguments that way."""

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
        self.consumed = False   # wait() consumes the handle, as UCM's stores do

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
    """One shard index per block: an int for all, a list of n, or [] (as
    UCM's embed scripts pass it) for shard 0 of each."""
    if isinstance(shard_index, int):
        return [shard_index] * n
    idx = [int(x) for x in shard_index]
    if not idx:
        return [0] * n
    if len(idx) != n:
        raise UcmError("shard_index has %d entries for %d block ids" % (len(idx), n))
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


_SIZE_KEYS = ("tensor_size", "shard_size", "block_size")
# UCM's concurrency keys: each must be a positive count (UCM refuses 0);
# posix_data_trans_concurrency sizes kvengine's task workers (io.threads).
_CONCURRENCY = ("posix_data_trans_concurrency", "data_trans_concurrency",
                "posix_lookup_concurrency", "lookup_concurrency", "posix_open_concurrency",
                "posix_commit_concurrency")
_IGNORED = ("posix_io_engine", "io_engine", "cpu_affinity_cores", "posix_gc_enable",
            "posix_gc_recycle_percent", "posix_gc_concurrency", "posix_gc_check_interval_sec",
            "posix_gc_trigger_threshold_ratio", "posix_gc_max_recycle_count_per_shard",
            "share_buffer_enable", "waiting_queue_depth", "running_queue_depth",
            "cache_buffer_capacity_gb",
            "posix_gc_shard_sample_ratio", "data_dir_shard_bytes", "store_pipeline",
            "role", "local_rank_size", "kv_block_size", "io_size")


# UCM's store_pipeline names: a Cache layer (host memory) over a backend.
# Cache|Empty is the cache alone (kvengine's DRAM tier, nothing on SSD);
# Posix is files (the SSD tier); Cache|Posix both. The others keep data
# where kvengine cannot (3FS) or keep none (Empty, Fake: a store that
# drops every dump), so they are refused by name.
_PIPELINES = {"Cache|Empty": "dram", "Cache": "dram", "Posix": "ssd",
              "Cache|Posix": "dram|ssd"}


def _pipeline(config):
    """kvengine's pipeline for config's store_pipeline (None when absent)."""
    name = config.get("store_pipeline")
    if name is None:
        return None
    if name not in _PIPELINES:
        raise UcmError("store_pipeline %r: kvengine.ucm maps %s; %s" % (
            name, ", ".join(sorted(_PIPELINES)),
            "3FS is not a kvengine tier" if "Ds3fs" in str(name) else
            "a store that keeps nothing (Empty, Fake) is not one kvengine provides"))
    return _PIPELINES[name]


def _config_settings(config):
    """(engine settings, sizes, device_id, wait timeout ms) from a UCM
    config; UcmError names the key that cannot be mapped."""
    settings = {}
    pipe = _pipeline(config)
    if pipe == "dram":
        settings["pipeline"] = "dram"
        gb = config.get("cache_buffer_capacity_gb")
        if gb is not None:
            if isinstance(gb, bool) or not isinstance(gb, (int, float)) or gb <= 0:
                raise UcmError("cache_buffer_capacity_gb: a positive size in GiB, got %r" % (gb,))
            settings["dram.capacity"] = str(int(gb * (1 << 30)))
    elif pipe is not None and "storage_backends" not in config:
        raise UcmError("store_pipeline %r needs storage_backends" % config["store_pipeline"])
    if "storage_backends" in config:
        b = config["storage_backends"]
        paths = [b] if isinstance(b, str) else list(b) if isinstance(b, (list, tuple)) else None
        if not paths or not all(isinstance(x, str) and x for x in paths):
            raise UcmError("storage_backends: a list of directories, got %r" % (b,))
        if len(paths) > 1:
            raise UcmError("storage_backends: kvengine's SSD tier is one directory (ssd.path); "
                           "got %d (%s)" % (len(paths), ", ".join(paths)))
        settings["ssd.path"] = paths[0]
        if pipe in ("ssd", "dram|ssd"):
            settings["pipeline"] = pipe
        # UCM's scripts name a directory below the working directory
        # (./build/data) that need not exist yet: made, as a store's own
        # directory is.
        try:
            os.makedirs(paths[0], exist_ok=True)
        except OSError as exc:
            raise UcmError("storage_backends: cannot make %s: %s" % (paths[0], exc.strerror))
    dev = config.get("device_id", -1)
    if isinstance(dev, bool) or not isinstance(dev, int) or dev < -1:
        raise UcmError("device_id: -1 (the scheduler's store) or a device number, got %r" % (dev,))
    sizes = {}
    for k in _SIZE_KEYS:
        v = config.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
            raise UcmError("%s: a size in bytes, got %r" % (k, v))
        sizes[k] = v
    t, sh, bl = sizes["tensor_size"], sizes["shard_size"], sizes["block_size"]
    if sh == 0 and bl and "shard_size" not in config:
        # UCM's whole-block stores (UcmPcStoreV1, callers passing
        # shard_index=[]) give no shard_size: a block is one shard.
        sh = bl
    if dev >= 0 and "tensor_size_list" not in config:
        # UCM's rule: a block is whole shards, a shard whole tensors.
        if t == 0 or sh < t or bl < sh or sh % t or bl % sh:
            raise UcmError("invalid sizes for device %d: tensor_size %d, shard_size %d, "
                           "block_size %d (need 0 < tensor <= shard <= block, each dividing "
                           "the next)" % (dev, t, sh, bl))
    if sh and bl:
        if bl % sh:
            raise UcmError("block_size %d is not a multiple of shard_size %d" % (bl, sh))
        settings["store.block_shards"] = str(bl // sh)
    for k in _CONCURRENCY:
        if k in config:
            v = config[k]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise UcmError("%s: a positive count, got %r" % (k, v))
            if k.endswith("data_trans_concurrency"):
                settings["io.threads"] = str(min(v, 256))
    timeout = config.get("timeout_ms", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 <= timeout < 1 << 32:
        raise UcmError("timeout_ms: milliseconds, got %r" % (timeout,))
    if timeout:
        settings["io.timeout_ms"] = str(timeout)
    if "io_direct" in config and not isinstance(config["io_direct"], bool):
        raise UcmError("io_direct: a bool, got %r" % (config["io_direct"],))
    uid = config.get("unique_id")
    if uid is not None:
        if not isinstance(uid, str) or not uid:
            raise UcmError("unique_id: a non-empty str, got %r" % (uid,))
        if "ssd.path" in settings:
            # With storage_backends the directory names the store, as UCM's
            # Posix backend is shared by directory whatever unique_id a
            # process has (its scripts give the scheduler and the worker
            # different ones); a second name for the same directory would
            # make the store refuse the second opener. unique_id is still
            # checked as a store name would be.
            _lib.kv_config_free(make_config(None, {"store.name": uid}))
        else:
            settings["store.name"] = uid
    if dev == -1 and "ssd.path" in settings:
        # The scheduler's store (lookups) holds no DRAM of its own: it reads
        # the SSD tier, and with the host store shares the workers' store.
        settings["pipeline"] = "ssd"
    return settings, dev, timeout


class KvEngineStore(UcmKVStoreBaseV1):
    """UCM's V1 store interface over a kvengine engine.

    UCM's config keys are mapped (anything else is ignored, as UCM's
    stores ignore keys of other stores):
    - storage_backends: [dir] -> ssd.path (one directory);
    - device_id: -1 is the scheduler's store (no DRAM of its own: pipeline
      ssd when storage_backends is given), >= 0 a worker's; then
      tensor_size / shard_size / block_size must nest as UCM requires;
    - tensor_size (or tensor_size_list): the bytes behind each address of
      load_data / dump_data; block_size / shard_size: store.block_shards, the
      shards a block has before lookup calls it present;
    - timeout_ms: io.timeout_ms, and the limit of wait();
    - unique_id: store.name (processes naming it share one store); with
      storage_backends the directory names the store instead, and
      unique_id is only checked;
    - posix_data_trans_concurrency: io.threads; it and the other
      concurrency keys must be positive;
    - io_direct: accepted (a bool), not applied: the value log writes
      through the page cache, ssd.sync says what is durable when.
    kvengine_config (a YAML path) and kvengine_settings (dotted keys) come
    last and win. A config with none of storage_backends, kvengine_config
    and kvengine_settings is refused, as UCM's Posix store refuses an empty
    one."""

    def __init__(self, config):
        if not isinstance(config, dict):
            raise UcmError("config is a dict, got %s" % type(config).__name__)
        if not any(k in config for k in ("storage_backends", "kvengine_config",
                                          "kvengine_settings")) and \
                _pipeline(config) != "dram":
            raise UcmError("config names no store: give storage_backends (UCM's) or "
                           "kvengine_config / kvengine_settings")
        super().__init__(config)
        self.config = config
        settings, self._device_id, self._timeout_ms = _config_settings(config)
        sizes = config.get("tensor_size_list")
        size = config.get("tensor_size")
        if sizes is not None:
            if not isinstance(sizes, (list, tuple)) or not sizes or \
                    not all(isinstance(x, int) and x > 0 for x in sizes):
                raise UcmError("tensor_size_list is a non-empty list of positive ints")
            self._sizes = list(sizes)
        elif size:
            self._sizes = size
        else:
            self._sizes = None
        self._torch = None
        self._pool = None
        extra = config.get("kvengine_settings")
        if extra is not None and not isinstance(extra, dict):
            raise UcmError("kvengine_settings is a dict of dotted keys")
        settings.update(extra or {})
        # UCM starts its workers together over one store (unique_id or the
        # backend directory names it): while one of them is still building
        # the store (faulting in a GiB of DRAM takes seconds on a loaded
        # host), kv_open waits io.timeout_ms (5 s by default) for it to
        # answer and then says EBUSY. A worker keeps asking, up to a
        # minute, as long as that is the answer, as Mooncake's dummy
        # clients do (kvengine.mooncake's setup_dummy).
        deadline = time.monotonic() + 60
        while True:
            try:
                self.engine = Engine(config.get("kvengine_config"), settings)
                break
            except (TypeError, ValueError) as exc:
                raise UcmError(str(exc)) from None
            except KvError as exc:
                if exc.code != _EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # -- UCM V1 interface ----------------------------------------------------

    def cc_store(self):
        """The kv_engine pointer, for native code that links libkvengine."""
        h = self.engine._h
        if h is None:
            raise KvError(-114, "store is closed")
        return h

    def lookup(self, block_ids):
        """A numpy bool array (a list without numpy): block i is complete
        (every shard of store.block_shards stored) in some tier."""
        hits = _args(self.engine.lookup, block_ids)
        return _np.array(hits, dtype=bool) if _np is not None else hits

    def lookup_on_prefix(self, block_ids):
        """Index of the last block found in the leading run; -1 when none."""
        return _args(self.engine.lookup_prefix, block_ids)

    def prefetch(self, block_ids):
        _args(self.engine.prefetch, block_ids)

    def dump(self, block_ids, shard_index, src_tensor):
        return _args(self._tensors, False, block_ids, shard_index, src_tensor)

    def load(self, block_ids, shard_index, dst_tensor):
        return _args(self._tensors, True, block_ids, shard_index, dst_tensor)

    def dump_data(self, block_ids, shard_index, src_addr, prerequisite_handle=0):
        """prerequisite_handle: a CUDA event (cudaEvent_t) the source bytes
        wait for; it is synchronized before the engine reads them (0: none)."""
        if prerequisite_handle:
            _wait_event(prerequisite_handle)
        return _args(self._addrs, False, block_ids, shard_index, src_addr)

    def load_data(self, block_ids, shard_index, dst_addr):
        return _args(self._addrs, True, block_ids, shard_index, dst_addr)

    # Older UCM releases name load_data fetch_data.
    fetch_data = load_data

    def wait(self, task, timeout_ms=None):
        """Blocks until task is done (at most the config's timeout_ms, 0 =
        forever; the task is then cancelled) and consumes it: a second wait,
        or a check after it, raises RuntimeError, as UCM's stores do.
        RuntimeError (a KvError) when the task failed or timed out."""
        t = self._task(task)
        with t._lock:
            if t.consumed:
                raise RuntimeError("task %d: already waited for" % t.task_id)
            t.consumed = True
        limit = self._timeout_ms if timeout_ms is None else timeout_ms
        try:
            t.task.wait(limit)
        except ValueError as exc:
            raise UcmError(str(exc)) from None
        finally:
            t._settle()
        if t._error is not None:
            raise RuntimeError("task %d: copying to the device failed: %s"
                               % (t.task_id, t._error)) from t._error

    def check(self, task):
        """True once task has finished (successfully or not); never blocks.
        RuntimeError for a task already waited for."""
        t = self._task(task)
        if t.consumed:
            raise RuntimeError("task %d: already waited for" % t.task_id)
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
            raise UcmError("not a task of this store: %r" % (task,))
        return task

    def _torch_mod(self):
        if self._torch is None:
            import torch   # only when a tensor or a device is in play
            self._torch = torch
            self._pool = _PinnedPool(torch)
        return self._torch

    def _sync(self):
        """Waits for the device copies this thread queued on its current
        stream: an event recorded after them, not the whole device."""
        torch = self._torch
        if torch.cuda.is_available():
            ev = torch.cuda.Event()
            ev.record()
            ev.synchronize()

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
        if self._device_id >= 0 and _device_pointers(rows):
            # Device pointers: view them as device tensors and stage them.
            torch = self._torch_mod()
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


def _args(fn, *a):
    """Calls fn; an argument error (TypeError/ValueError) becomes a
    RuntimeError (UcmError), the one exception UCM's connector catches."""
    try:
        return fn(*a)
    except UcmError:
        raise
    except (TypeError, ValueError) as exc:
        raise UcmError(str(exc)) from None


class _CudaRuntime:
    """The few CUDA runtime calls used here, through ctypes on the
    libcudart torch loaded (None where there is none)."""

    _lib = None
    _tried = False

    class _Attrs(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int),
                    ("devicePointer", ctypes.c_void_p), ("hostPointer", ctypes.c_void_p)]

    @classmethod
    def get(cls):
        if not cls._tried:
            cls._tried = True
            try:
                import torch
                if not torch.cuda.is_available():
                    return None
                torch.cuda.init()
            except Exception:
                return None
            for name in ("libcudart.so", "libcudart.so.12", "libcudart.so.11.0"):
                try:
                    cls._lib = ctypes.CDLL(name)
                    break
                except OSError:
                    continue
            if cls._lib is None:
                # torch's own copy, already mapped into this process.
                try:
                    with open("/proc/self/maps") as f:
                        paths = {ln.split()[-1] for ln in f if "libcudart" in ln}
                    for p in paths:
                        cls._lib = ctypes.CDLL(p)
                        break
                except OSError:
                    pass
        return cls._lib

    @classmethod
    def is_device(cls, addr):
        """True for device (or managed) memory; False for host memory, which
        includes pinned and mmap'ed buffers a Posix pipeline passes."""
        lib = cls.get()
        if lib is None:
            return False
        a = cls._Attrs()
        rc = lib.cudaPointerGetAttributes(ctypes.byref(a), ctypes.c_void_p(addr))
        if rc != 0:
            lib.cudaGetLastError()   # an unregistered host pointer on old runtimes
            return False
        return a.type in (2, 3)      # cudaMemoryTypeDevice, cudaMemoryTypeManaged


def _device_pointers(rows):
    """Whether load_data / dump_data addresses are device memory: asked of
    the CUDA runtime for the first address (a call passes one kind); no
    CUDA, no device memory."""
    for row in rows:
        for a in row:
            return bool(a) and _CudaRuntime.is_device(int(a))
    return False


def _wait_event(handle):
    """Synchronizes a cudaEvent_t given as an int."""
    lib = _CudaRuntime.get()
    if lib is None:
        raise UcmError("prerequisite_handle %#x is a CUDA event, but CUDA is not available "
                       "in this process" % handle)
    rc = lib.cudaEventSynchronize(ctypes.c_void_p(handle))
    if rc != 0:
        raise RuntimeError("cudaEventSynchronize(prerequisite_handle %#x) failed: error %d"
                           % (handle, rc))
