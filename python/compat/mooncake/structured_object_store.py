"""mooncake.structured_object_store — the structure and codec inference of
Mooncake's structured object store (kvengine.mooncake_structured). The
storing half of Mooncake's module is not provided (see the README)."""
from kvengine.mooncake_structured import (MAX_DEPTH, MISSING, CodecDecision,  # noqa: F401
                                          LeafSpec, NodeSpec, _choose_leaf_codec,
                                          _escape_key, infer_structure)

__all__ = ["MISSING", "CodecDecision", "LeafSpec", "NodeSpec", "infer_structure"]
