"""mooncake.http_metadata_server — Mooncake's HTTP metadata server serves
its transfer engine's segment metadata; kvengine has no counterpart.

kvengine's members are kept by kvmaster (or etcd), which its library
reaches itself (cluster.master / cluster.metadata), so there is no
metadata server to run; the names exist for imports and constructing the
server says why.
"""
import enum


class KVPoll(enum.IntEnum):
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class KVBootstrapServer:
    def __init__(self, *a, **kw):
        raise NotImplementedError(
            "mooncake.http_metadata_server.KVBootstrapServer: it serves the transfer "
            "engine's metadata; kvengine has no transfer engine, and its membership is "
            "kvmaster's (or etcd's): run kvmaster and set cluster.master")
