"""mooncake.engine — Mooncake's transfer engine has no kvengine counterpart.

kvengine moves data over its own transports (cluster.protocol: tcp or
rdma) inside the store calls; there is no separate engine to drive, so
TransferEngine exists for imports and says so when used.
"""
import enum


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


class TransferEngine:
    def __init__(self, *a, **kw):
        pass

    def __getattr__(self, name):
        raise NotImplementedError(
            "TransferEngine.%s: kvengine has no transfer engine; its store moves data over "
            "cluster.protocol inside each call (use mooncake.store)" % name)
