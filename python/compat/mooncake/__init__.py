"""mooncake — a stand-in for Mooncake's Python package, backed by kvengine.

Provided so that code written for Mooncake Store runs unchanged with
python/compat on PYTHONPATH: mooncake.store (kvengine.mooncake under
Mooncake's name), mooncake.buffer_pool, mooncake.mooncake_config, and
mooncake.engine (whose TransferEngine says why it cannot work here),
mooncake.dataproto_catalog (logical rows to stored DataProto rows), and
mooncake.mooncake_ep_buffer, mooncake.pg, mooncake.http_metadata_server
and mooncake.spdk_tgt_create, which raise NotImplementedError naming why
(GPU expert-parallel buffers, collectives and metadata of Mooncake's
transfer engine, SPDK NVMe-oF targets). Not
installed into dist-packages, where it would shadow a real Mooncake.
"""
import os
import sys

try:
    import kvengine  # noqa: F401
except ImportError:
    # PYTHONPATH=python/compat alone is enough in a tree.
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from mooncake.buffer_pool import BufferPool, RegisteredBufferPool  # noqa: E402

__all__ = ["BufferPool", "RegisteredBufferPool"]
