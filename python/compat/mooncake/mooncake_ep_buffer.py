"""mooncake.mooncake_ep_buffer — Mooncake's expert-parallel all-to-all
buffers have no kvengine counterpart.

Mooncake's Buffer dispatches and combines MoE tokens between GPUs through
its transfer engine and CUDA kernels; kvengine is a KV-cache store and has
neither, so the names exist for imports and constructing one says why.
"""

_WHY = ("mooncake.mooncake_ep_buffer.%s: expert-parallel all-to-all buffers run on "
        "Mooncake's transfer engine and GPU kernels; kvengine is a KV-cache store with no "
        "transfer engine (use mooncake.store for KV blocks)")


class Buffer:
    def __init__(self, *a, **kw):
        raise NotImplementedError(_WHY % "Buffer")


class EventOverlap:
    def __init__(self, *a, **kw):
        raise NotImplementedError(_WHY % "EventOverlap")
