"""anchor_tensor_real.py — both sides of the tensor-object layout check of
tools/anchor-suites.sh (its interop section), one process per side, since
real Mooncake's store module and the drop-in both call themselves `store`.

  python3 anchor_tensor_real.py kv OUT.pkl
      with the drop-in on PYTHONPATH: the objects its put_tensor and
      put_tensor_with_tp store, byte for byte (an embedded store).
  python3 anchor_tensor_real.py real OUT.pkl KV.pkl MASTER METADATA HOST
      with real Mooncake's store module importable as `store`: its
      _serialize_tensor of each case; the objects its put_tensor and
      put_tensor_with_tp store (read back with get); and, for each object
      the drop-in wrote (KV.pkl), whether real Mooncake's get_tensor /
      get_tensor_with_tp / _deserialize_tensor give the tensor back once
      the bytes are put into its store as they are.

anchor_interop.py reads OUT.pkl (MOONCAKE_TENSOR_META) and checks the
metadata byte for byte and the drop-in reading real Mooncake's objects.
"""

import pickle
import sys

import torch


def cases():
    # dtypes real Mooncake can name on this torch: its dtype table looks up
    # torch.uint16 and the like, which torch 1.13 lacks, and then it refuses
    # every dtype after them in its table (float16, bfloat16, int32, ...)
    return {
        "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "f64": torch.arange(4, dtype=torch.float64),
        "i8": torch.arange(-3, 3, dtype=torch.int8),
        "u8": torch.arange(5, dtype=torch.uint8),
        "i16": torch.arange(8, dtype=torch.int16).reshape(2, 2, 2),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
        "d6": torch.arange(8, dtype=torch.float32).reshape(1, 2, 1, 2, 1, 2),
        "f16": torch.arange(8, dtype=torch.float16),
        "i64": torch.arange(5, dtype=torch.int64),
        "bool": torch.tensor([True, False, True]),
    }


TP = {"w": (torch.arange(48, dtype=torch.float32).reshape(4, 12), 3, 1),
      "v": (torch.arange(32, dtype=torch.float64).reshape(8, 4), 2, 0)}


def objects(s):
    """{key: bytes} of what s's tensor puts store."""
    out = {}
    for name, t in cases().items():
        if s.put_tensor("t-" + name, t) == 0:
            out["t-" + name] = bytes(s.get("t-" + name))
    for key, (t, tp, dim) in TP.items():
        if s.put_tensor_with_tp(key, t, tp_size=tp, split_dim=dim) == 0:
            for r in range(tp):
                out["%s_tp_%d" % (key, r)] = bytes(s.get("%s_tp_%d" % (key, r)))
    return out


def kv_side(out):
    from mooncake import store
    s = store.MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", "",
                   kvengine_settings={"dram.hugepages": "off", "log.level": "warn"}) == 0
    try:
        res = {"objects": objects(s)}
    finally:
        s.close()
    with open(out, "wb") as f:
        pickle.dump(res, f)


def real_side(out, kv_pkl, master, metadata, host):
    import store
    res = {"size": store._tensor_metadata_size(), "cases": {}, "read_back": {}}
    for name, t in cases().items():
        try:
            meta, ptr, size, owner = store._serialize_tensor(t)
            c = owner.contiguous()
            data = c.view(torch.uint8).numpy().tobytes() if c.numel() else b""
            res["cases"][name] = ("ok", bytes(meta), int(size), data, t)
        except Exception as e:     # noqa: BLE001 - recorded, judged by the test
            res["cases"][name] = ("err", "%s: %s" % (type(e).__name__, e))
    s = store.MooncakeDistributedStore()
    rc = s.setup(host, metadata, 64 << 20, 16 << 20, "tcp", "", master)
    if rc != 0:
        raise SystemExit("real Mooncake setup failed: %d" % rc)
    try:
        res["objects"] = objects(s)
        with open(kv_pkl, "rb") as f:
            kv = pickle.load(f)["objects"]
        tensors = cases()
        refused = {"t-" + n for n, c in res["cases"].items() if c[0] != "ok"}
        for key, blob in kv.items():
            k = "kv-" + key
            if key in refused:
                res["read_back"][key] = "skip"      # a dtype it refuses on this torch
                continue
            if s.put(k, blob) != 0:
                res["read_back"][key] = "put failed"
                continue
            if "_tp_" in key:
                base, rank = key.rsplit("_tp_", 1)
                t, tp, dim = TP[base]
                want = t.chunk(tp, dim)[int(rank)]
                got = s.get_tensor_with_tp("kv-" + base, tp_rank=int(rank), tp_size=tp,
                                           split_dim=dim)
            else:
                want = tensors[key[2:]]
                got = s.get_tensor(k)
                try:
                    again = store._deserialize_tensor(blob)
                except Exception as e:  # noqa: BLE001
                    again = e
                if not (isinstance(again, torch.Tensor) and again.dtype == want.dtype
                        and torch.equal(again, want.contiguous())):
                    res["read_back"][key] = "_deserialize_tensor gave %r" % (again,)
                    continue
            ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and \
                tuple(got.shape) == tuple(want.shape) and torch.equal(got, want.contiguous())
            res["read_back"][key] = "ok" if ok else "read %r" % (got,)
    finally:
        s.close()
    with open(out, "wb") as f:
        pickle.dump(res, f)


if __name__ == "__main__":
    if sys.argv[1] == "kv":
        kv_side(sys.argv[2])
    else:
        real_side(*sys.argv[2:7])
