"""mooncake.buffer_pool — the local-buffer pools (kvengine.mooncake_pool)."""
from kvengine.mooncake_pool import BufferPool, RegisteredBufferPool  # noqa: F401

__all__ = ["BufferPool", "RegisteredBufferPool"]
