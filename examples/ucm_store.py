"""ucm_store.py — kvengine as a UCM V1 store: dump a few KV blocks, look
them up, load them back into fresh buffers and compare.

    PYTHONPATH=python python3 examples/ucm_store.py

UCM (vLLM's unified-cache-management) calls the same methods on any V1
store; with UCM installed, KvEngineStore subclasses its UcmKVStoreBaseV1.
Tensors are torch tensors when torch is installed, else bytearrays: both
are buffers the engine copies directly.
"""
import hashlib

from kvengine.ucm import KvEngineStore

try:
    import torch
except ImportError:
    torch = None

LAYERS, TENSOR_BYTES, BLOCKS = 4, 16 * 1024, 8

store = KvEngineStore({
    # The engine: a 64 MiB DRAM tier, no SSD (any dotted key of kvengine.yaml).
    "kvengine_settings": {"pipeline": "dram", "dram.capacity": "64MiB", "log.level": "warn"},
    # What load_data / dump_data addresses point at (UCM passes no sizes).
    "tensor_size": TENSOR_BYTES,
})

# Block ids are 16-byte hashes of the token prefix (md5, as in UCM).
tokens = list(range(BLOCKS * 16))
block_ids = [hashlib.md5(str(tokens[:16 * (i + 1)]).encode()).digest() for i in range(BLOCKS)]


def tensors(fill):
    if torch is not None:
        return [[torch.full((TENSOR_BYTES // 2,), fill * 100 + b * 10 + l, dtype=torch.float16)
                 for l in range(LAYERS)] for b in range(BLOCKS)]
    return [[bytearray([(fill + b + l) % 256]) * TENSOR_BYTES for l in range(LAYERS)]
            for b in range(BLOCKS)]


src = tensors(1)
store.wait(store.dump(block_ids, [0] * BLOCKS, src))           # save every block
hits = store.lookup(block_ids)
prefix = store.lookup_on_prefix(block_ids)

dst = tensors(0)                                                # zeros-like destinations
task = store.load(block_ids, [0] * BLOCKS, dst)
store.wait(task)                                                # RuntimeError on failure
same = all((torch.equal(a, b) if torch is not None else a == b)
           for ra, rb in zip(src, dst) for a, b in zip(ra, rb))
# The raw-address form UCM uses when it already holds pointers: load_data.
# The tensors behind raw addresses must outlive the task: keep them named.
if torch is not None:
    raw = tensors(0)
    addrs = [[t.data_ptr() for t in row] for row in raw]
    store.wait(store.load_data(block_ids, [0] * BLOCKS, addrs))
    same = same and all(torch.equal(a, b) for ra, rb in zip(src, raw) for a, b in zip(ra, rb))
store.close()
print("ucm_store: hits=%d/%d prefix=%d same=%s" % (sum(hits), BLOCKS, prefix, same))
