"""kvengine — the kvengine KV-cache store from Python (ctypes over libkvengine.so.0).

    import kvengine
    with kvengine.Engine(settings={"pipeline": "dram", "dram.capacity": "256MiB"}) as e:
        e.dump([(block_id, 0, [tensor_bytes])]).wait()
        e.lookup([block_id])            # [True]

Standard library only; numpy arrays and torch tensors are accepted as
buffers when those packages are present, and never imported here.
Submodules: kvengine.ucm (UCM's V1 store interface), kvengine.mooncake
(a Mooncake Store drop-in, also importable as mooncake.store from
python/compat).
"""

from . import _lib
from .engine import (Engine, KvError, Task, members, strerror, version, OK, EINVAL, ENOMEM,
                     ENOSPC, ENOTFOUND, ETIMEDOUT, EIO, ECORRUPT, ECONFIG, ENET, EPROTO, EPERM,
                     EBUSY, ENOBUFS, ECLOSED, ENOTSUP)

BLOCK_ID_LEN = _lib.KV_BLOCK_ID_LEN
KEY_MAX = _lib.KV_KEY_MAX
VALUE_MAX = _lib.KV_VALUE_MAX
library_path = _lib.path

__all__ = ["Engine", "Task", "KvError", "members", "strerror", "version", "BLOCK_ID_LEN",
           "KEY_MAX", "VALUE_MAX", "OK", "EINVAL", "ENOMEM", "ENOSPC", "ENOTFOUND", "ETIMEDOUT",
           "EIO", "ECORRUPT", "ECONFIG", "ENET", "EPROTO", "EPERM", "EBUSY", "ENOBUFS",
           "ECLOSED", "ENOTSUP"]
