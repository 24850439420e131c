"""mooncake.store — kvengine.mooncake under Mooncake's module name.

Finds the kvengine package beside python/compat when it is not already
importable, so that PYTHONPATH=python/compat alone is enough in a tree.
"""
import os
import sys

try:
    import kvengine  # noqa: F401
except ImportError:
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from kvengine.mooncake import (BufferHandle, ErrorCode, MooncakeDistributedStore,  # noqa: E402,F401
                               ReplicateConfig, SoftPinAction)

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "BufferHandle",
           "ErrorCode"]
