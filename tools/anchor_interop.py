"""anchor_interop.py — Mooncake's own structured-object reader and writer
against the drop-in's, over one kvengine store, and real Mooncake's tensor
metadata against the drop-in's.

Run by tools/anchor-suites.sh (its "interop" section), never by CI: it
needs Mooncake's source. MOONCAKE_SOS names Mooncake's
structured_object_store.py, extracted from the mirror into a scratch
directory at run time; it is loaded here under another module name so that
its `import mooncake.store` resolves to the drop-in (python/compat), which
is the whole point: Mooncake's pure-Python layer running over kvengine's
store. MOONCAKE_TENSOR_META, when set, names a pickle of real Mooncake's
_serialize_tensor output (written by the same section with the built
store module, which cannot share a process with the drop-in).

Key design choice: every case writes with one implementation and reads
with the other, passing only what another process would have (a manifest
key, or an exported handle through JSON), so a reader that leans on the
writer's in-memory objects cannot pass; and the manifests both write for
the same input are compared field by field, so a difference a tolerant
reader hides still shows.
"""

import importlib.util
import json
import os
import pickle
import sys
import uuid

import numpy as np
import pytest

import kvengine.mooncake as mc
from kvengine import mooncake_bundle as kb, mooncake_tensor

torch = pytest.importorskip("torch")
pytest.importorskip("msgpack")     # Mooncake's module imports it (python3-msgpack)


def _load_mooncake_sos():
    path = os.environ.get("MOONCAKE_SOS")
    if not path or not os.path.exists(path):
        pytest.skip("MOONCAKE_SOS does not name Mooncake's structured_object_store.py")
    spec = importlib.util.spec_from_file_location("mooncake_real_sos", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod        # its dataclasses look themselves up there
    spec.loader.exec_module(mod)
    return mod


# Mooncake writes a tensor member's size from Tensor.nbytes, which torch
# has had since 2.1; Debian's torch (1.13) lacks it, and Mooncake's writer
# would then record only the metadata's 304 bytes. The property is given
# here as newer torch defines it, so Mooncake's side writes what it does
# on the torch it supports (the drop-in never reads Tensor.nbytes).
if not hasattr(torch.Tensor, "nbytes"):
    torch.Tensor.nbytes = property(lambda t: t.numel() * t.element_size())
ms = _load_mooncake_sos()
QUIET = {"dram.hugepages": "off", "log.level": "warn"}


@pytest.fixture(scope="module")
def store():
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", "256MB", "64MB", "tcp", "", "",
                   kvengine_settings=QUIET) == 0, s.last_error
    yield s
    s.close()


@pytest.fixture
def prefix():
    return "io-%s" % uuid.uuid4().hex[:8]


SIDES = {"kv": lambda s, p: kb.MooncakeBundleTransfer(s, key_prefix=p),
         "mc": lambda s, p: ms.MooncakeBundleTransfer(s, key_prefix=p)}
PAIRS = [("kv", "mc"), ("mc", "kv")]


def pair(store, prefix, w, r):
    return SIDES[w](store, prefix), SIDES[r](store, prefix), \
        (kb if w == "kv" else ms), (kb if r == "kv" else ms)


class Proto:
    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch = batch or {}
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}


def objarr(values):
    a = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        a[i] = v
    return a


def sample(n=6):
    return Proto(
        batch={"input_ids": torch.arange(n * 4, dtype=torch.int64).reshape(n, 4),
               "logp": torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) / 3,
               "mask": np.arange(n * 3, dtype=np.float32).reshape(n, 3)},
        non_tensor_batch={
            "uid": np.asarray(["u%d" % i for i in range(n)], dtype=object),
            "reward": np.arange(n, dtype=np.float64) / 2,
            "blob": objarr([bytes([i]) * i if i % 3 else None for i in range(n)]),
            "info": objarr([{"i": i, "tags": ["a"] * i, "ok": i % 2 == 0} for i in range(n)]),
            "tokens": objarr([np.arange(i, dtype=np.int32) for i in range(n)]),
            "ragged": objarr([torch.full((i % 3 + 1,), float(i)) for i in range(n)]),
            "score": objarr([float(i) if i != 2 else None for i in range(n)]),
            "nested": objarr([{"t": np.arange(i % 3, dtype=np.int64), "s": "r%d" % i,
                               "k": [i, None]} for i in range(n)]),
        },
        meta_info={"step": 7, "name": "rollout"})


def rows_of(x):
    return list(x) if not isinstance(x, np.ndarray) else x.tolist()


def check_rows(got, want, rows):
    b, nb = got["batch"], got["non_tensor_batch"]
    assert torch.equal(b["input_ids"], want.batch["input_ids"][rows])
    assert torch.equal(b["logp"], want.batch["logp"][rows])
    assert np.array_equal(b["mask"], want.batch["mask"][rows])
    w = want.non_tensor_batch
    assert rows_of(nb["uid"]) == [w["uid"][i] for i in rows]
    assert np.array_equal(np.asarray(nb["reward"], dtype=np.float64), w["reward"][rows])
    assert rows_of(nb["blob"]) == [w["blob"][i] for i in rows]
    assert rows_of(nb["info"]) == [w["info"][i] for i in rows]
    assert rows_of(nb["score"]) == [w["score"][i] for i in rows]
    for a, i in zip(nb["tokens"], rows):
        assert np.asarray(a).dtype == np.int32 and np.array_equal(a, w["tokens"][i])
    for t, i in zip(nb["ragged"], rows):
        assert torch.equal(t, w["ragged"][i])
    for v, i in zip(nb["nested"], rows):
        assert v["s"] == w["nested"][i]["s"] and list(v["k"]) == [i, None]
        assert np.array_equal(np.asarray(v["t"]), w["nested"][i]["t"])


def by_key(store, key):
    return json.loads(bytes(store.get(key)))


# -- structured objects ----------------------------------------------------------------

@pytest.mark.parametrize("w,r", PAIRS)
def test_structured_object_by_manifest_key(store, prefix, w, r):
    tw, tr, mw, mr = pair(store, prefix, w, r)
    arr = np.arange(24, dtype=np.int16).reshape(6, 4)
    ten = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    ref = tw.put_structured_object(mw.StructuredObjectPayload(
        {"kind": "x", "n": [1, 2]},
        {"a": arr, "t": ten, "raw": b"hello", "s": torch.tensor(2.5),
         "b": torch.tensor([True, False]), "e": np.zeros((0, 3), np.float64)}))
    spec = tr.read_spec({"manifest_key": ref.manifest_key})
    res = tr.materialize(spec)
    assert res.metadata["kind"] == "x" and res.metadata["n"] == [1, 2]
    o = res.objects
    assert np.array_equal(o["a"], arr) and o["a"].dtype == np.int16
    assert torch.equal(o["t"], ten) and torch.equal(o["s"], torch.tensor(2.5))
    assert torch.equal(o["b"], torch.tensor([True, False]))
    assert bytes(o["raw"]) == b"hello"
    assert o["e"].shape == (0, 3) and o["e"].dtype == np.float64
    sl = tr.materialize(tr.read_spec({"manifest_key": ref.manifest_key})
                        .slice_member("a", 0, 1, 6, 2).select_members(["a"]))
    assert list(sl.objects) == ["a"] and np.array_equal(sl.objects["a"], arr[1:6:2])


@pytest.mark.parametrize("w,r", PAIRS)
def test_structured_object_chunked(store, prefix, w, r):
    tw, tr, mw, _ = pair(store, prefix, w, r)
    arr = np.arange(1000, dtype=np.int32).reshape(250, 4)
    ref = tw.put_structured_object(mw.StructuredObjectPayload({}, {"a": arr}), chunk_bytes=1024)
    assert len(ref.manifest["buffers"]["a"]["chunks"]) == 4
    got = tr.materialize(tr.read_spec({"manifest_key": ref.manifest_key})
                         .slice_member("a", 0, 30, 200))
    assert np.array_equal(got.objects["a"], arr[30:200])


@pytest.mark.parametrize("w,r", PAIRS)
def test_put_object_get_object(store, prefix, w, r):
    tw, tr, _, _ = pair(store, prefix, w, r)
    ten = torch.arange(5, dtype=torch.int32)
    assert torch.equal(tr.get_object({"manifest_key": tw.put_object(ten).manifest_key}), ten)
    ref = tw.put_object({"x": np.ones(3), "y": b"z"})
    got = tr.get_object({"manifest_key": ref.manifest_key})
    assert np.array_equal(got["x"], np.ones(3)) and bytes(got["y"]) == b"z"


@pytest.mark.parametrize("w,r", PAIRS)
def test_bundle_and_remove_by_the_other(store, prefix, w, r):
    tw, tr, _, _ = pair(store, prefix, w, r)
    ref = tw.put_bundle(b"meta", {"x": b"a" * 100, "y": np.arange(10, dtype=np.uint8)},
                        chunk_bytes=64)
    m = by_key(store, ref.manifest_key)
    keys = [c["key"] for spec in m["buffers"].values() for c in spec["chunks"]]
    assert all(store.is_exist(k) == 1 for k in keys)
    tr.remove_bundle({"manifest_key": ref.manifest_key})
    assert all(store.is_exist(k) == 0 for k in keys + [ref.manifest_key])


# -- DataProto -------------------------------------------------------------------------

@pytest.mark.parametrize("w,r", PAIRS)
def test_dataproto_handle_every_codec(store, prefix, w, r):
    tw, tr, mw, mr = pair(store, prefix, w, r)
    data = sample()
    ref = tw.put_dataproto(data, namespace="ns", partition="p1", stage="rollout")
    handle = json.loads(json.dumps(mw.export_dataproto_ref(ref)))
    got = tr.get_dataproto(mr.import_dataproto_ref(handle))
    check_rows(got, data, list(range(6)))
    assert got["meta_info"] == {"step": 7, "name": "rollout"}
    got = tr.get_dataproto(handle, rows=[5, 0, 3])
    check_rows(got, data, [5, 0, 3])
    # (Mooncake's reader slices tensor members with step 1 only)
    got = tr.get_dataproto(handle, rows=slice(1, 4), fields=["input_ids", "uid"])
    assert torch.equal(got["batch"]["input_ids"], data.batch["input_ids"][1:4])
    assert rows_of(got["non_tensor_batch"]["uid"]) == ["u1", "u2", "u3"]


@pytest.mark.parametrize("w,r", PAIRS)
def test_dataproto_small_chunks(store, prefix, w, r):
    tw, tr, mw, mr = pair(store, prefix, w, r)
    data = sample()
    ref = tw.put_dataproto(data, chunk_bytes=40)
    handle = json.loads(json.dumps(mw.export_dataproto_ref(ref)))
    check_rows(tr.get_dataproto(handle, rows=[4, 1, 2]), data, [4, 1, 2])


@pytest.mark.parametrize("w,r", PAIRS)
def test_dataproto_appended_stages(store, prefix, w, r):
    tw, tr, mw, mr = pair(store, prefix, w, r)
    ref = tw.put_dataproto(Proto(batch={"a": np.arange(4)}, meta_info={"x": 1}), stage="s1")
    ref = tw.append_dataproto_fields(
        ref, Proto(batch={"b": torch.ones(4, 2)}, meta_info={"y": 2}), stage="s2")
    ref = tw.append_dataproto_fields(
        ref, Proto(non_tensor_batch={"c": np.asarray(list("wxyz"), dtype=object)}), stage="s1")
    handle = json.loads(json.dumps(mw.export_dataproto_ref(ref)))
    got = tr.get_dataproto(handle)
    assert np.array_equal(got["batch"]["a"], np.arange(4))
    assert torch.equal(got["batch"]["b"], torch.ones(4, 2))
    assert rows_of(got["non_tensor_batch"]["c"]) == list("wxyz")
    assert got["meta_info"] == {"x": 1, "y": 2}
    # the reader appends to what the writer stored, and the writer reads it
    ref2 = tr.append_dataproto_fields(mr.import_dataproto_ref(handle),
                                      Proto(batch={"d": np.arange(4) * 2}), stage="s3")
    h2 = json.loads(json.dumps(mr.export_dataproto_ref(ref2)))
    got = tw.get_dataproto(mw.import_dataproto_ref(h2), fields=["d", "a"])
    assert np.array_equal(got["batch"]["d"], np.arange(4) * 2)
    assert np.array_equal(got["batch"]["a"], np.arange(4))


@pytest.mark.parametrize("w,r", PAIRS)
def test_dataproto_cleanup_by_the_other(store, prefix, w, r):
    tw, tr, mw, mr = pair(store, prefix, w, r)
    ref = tw.put_dataproto(sample(), chunk_bytes=64)
    handle = json.loads(json.dumps(mw.export_dataproto_ref(ref)))
    keys = []
    for st in handle["stage_refs"].values():
        m = by_key(store, st["manifest_key"])
        keys.append(st["manifest_key"])
        keys += [c["key"] for spec in m["buffers"].values() for c in spec["chunks"]]
        keys += list(m.get("cleanup_keys", []))
    assert keys and all(store.is_exist(k) == 1 for k in keys)
    tr.cleanup_dataproto(mr.import_dataproto_ref(handle))
    assert [k for k in keys if store.is_exist(k) != 0] == []


@pytest.mark.parametrize("w,r", PAIRS)
def test_flat_dict(store, prefix, w, r):
    tw, tr, mw, mr = pair(store, prefix, w, r)
    data = {"ids": np.arange(6).reshape(3, 2), "txt": ["a", "b", "c"], "step": 3}
    ref = tw.put(data, type="dict")
    handle = json.loads(json.dumps(mw.export_dataproto_ref(ref)))
    got = tr.get(mr.import_dataproto_ref(handle), type="dict")
    assert np.array_equal(got["ids"], data["ids"])
    assert list(got["txt"]) == ["a", "b", "c"] and got["step"] == 3


# -- the manifests themselves ----------------------------------------------------------

def _shape(v):
    """A manifest with the values that must differ between two writes (ids,
    keys, uuids) replaced by their types, so two layouts compare by fields."""
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in sorted(v.items())}
    if isinstance(v, list):
        return [_shape(x) for x in v]
    if isinstance(v, str) and ("/" in v or len(v) == 32):
        return "<str>"
    return v


def _manifests(store, handle):
    return {s: by_key(store, r["manifest_key"]) for s, r in handle["stage_refs"].items()}


def test_dataproto_manifests_match_field_by_field(store, prefix):
    data = sample()
    out = {}
    for side, mod in (("kv", kb), ("mc", ms)):
        t = SIDES[side](store, prefix + side)
        h = json.loads(json.dumps(mod.export_dataproto_ref(
            t.put_dataproto(data, stage="rollout"))))
        out[side] = (h, _manifests(store, h))
    (hk, mk), (hm, mm) = out["kv"], out["mc"]
    assert _shape(hk["encoded_non_tensor"]) == _shape(hm["encoded_non_tensor"])
    assert hk["field_index"] == hm["field_index"]
    assert sorted(hk) == sorted(hm)
    for stage in mm:
        a, b = _shape(mk[stage]), _shape(mm[stage])
        assert sorted(a) == sorted(b)
        for k in b:
            assert a[k] == b[k], "manifest field %r differs" % k


@pytest.mark.parametrize("w", ["kv", "mc"])
def test_dataproto_manifest_view_reads_alike(store, prefix, w):
    """dataproto_manifest_view, Mooncake's and the drop-in's, over one
    handle: the same view, field by field."""
    mod = kb if w == "kv" else ms
    h = json.loads(json.dumps(mod.export_dataproto_ref(
        SIDES[w](store, prefix).put_dataproto(sample(), stage="rollout"))))
    views = {side: SIDES[side](store, prefix).dataproto_manifest_view(
        (kb if side == "kv" else ms).import_dataproto_ref(h)) for side in SIDES}
    out = []
    _diff(json.loads(json.dumps(views["kv"], default=str)),
          json.loads(json.dumps(views["mc"], default=str)), "", out)
    assert out == []


def test_structured_manifests_match_field_by_field(store, prefix):
    bufs = {"a": np.arange(24, dtype=np.int16).reshape(6, 4),
            "t": torch.arange(6, dtype=torch.float32), "raw": b"xyz"}
    got = {}
    for side, mod in (("kv", kb), ("mc", ms)):
        t = SIDES[side](store, prefix + side)
        ref = t.put_structured_object(mod.StructuredObjectPayload({"k": 1}, bufs))
        got[side] = _shape(by_key(store, ref.manifest_key))
    assert sorted(got["kv"]) == sorted(got["mc"])
    for k in got["mc"]:
        assert got["kv"][k] == got["mc"][k], "manifest field %r differs" % k


O = objarr
# One column per kind of row each codec (and each inference rule) covers.
COLUMNS = {
    "str": O(["a", "bb", None]), "bytes": O([b"x", None, b"yz"]), "int": O([1, 2, 3]),
    "float_none": O([1.5, None, 2.0]), "bool": O([True, False, True]),
    "list_int": O([[1, 2], [3], []]), "list_float": O([[1.5], [2, 3], None]),
    "nd_1d": O([np.arange(3), np.arange(2), np.arange(0)]),
    "nd_2d": O([np.zeros((2, 3), np.float32), np.ones((1, 3), np.float32),
                np.zeros((4, 3), np.float32)]),
    "nd_regular": O([np.arange(4, dtype=np.int16)] * 3),
    "nd_null": O([np.arange(3), None, np.arange(1)]),
    "tensor": O([torch.ones(2), torch.zeros(3), torch.ones(1)]),
    "tensor_2d": O([torch.ones(2, 2), torch.zeros(3, 2), None]),
    "dict_plain": O([{"a": 1, "b": "x"}, {"a": 2}, None]),
    "dict_bytes": O([{"b": b"x", "s": "q"}, {"b": b"yy", "s": "r"}, {"b": None, "s": "t"}]),
    "dict_nd": O([{"z": np.arange(2), "a": 1}, {"z": np.arange(3), "a": 2}, {"a": 3}]),
    "dict_tensor": O([{"t": torch.ones(2)}, {"t": torch.zeros(1)}, None]),
    "list_dicts": O([[{"a": 1}], [], [{"a": 2}, {"a": 3}]]),
}


def _diff(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append("%s/%s only in %s" % (path, k, "mooncake" if k not in a else "kvengine"))
            else:
                _diff(a[k], b[k], "%s/%s" % (path, k), out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, "%s[%d]" % (path, i), out)
    elif a != b:
        out.append("%s: kvengine %r, mooncake %r" % (path, a, b))


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_each_column_kind_is_written_alike_and_read_across(store, prefix, name):
    col = COLUMNS[name]
    got = {}
    for side, mod in (("kv", kb), ("mc", ms)):
        t = SIDES[side](store, prefix + side)
        h = json.loads(json.dumps(mod.export_dataproto_ref(
            t.put_dataproto(Proto(non_tensor_batch={"f": col})))))
        (m,) = _manifests(store, h).values()
        got[side] = {"encoded": _shape(h["encoded_non_tensor"]["f"]),
                     "buffers": _shape(m["buffers"])}
        other = SIDES["mc" if side == "kv" else "kv"](store, prefix + side)
        mine = list(t.get_dataproto(h)["non_tensor_batch"]["f"])
        theirs = list(other.get_dataproto(h)["non_tensor_batch"]["f"])
        assert repr(theirs) == repr(mine), "%s written by %s reads differently" % (name, side)
        # and the payload members' bytes
        got[side]["bytes"] = {n: b"".join(bytes(store.get(c["key"])) for c in sp["chunks"])
                              for n, sp in m["buffers"].items() if n != "meta"}
    assert got["kv"].pop("bytes") == got["mc"].pop("bytes")
    out = []
    _diff(got["kv"], got["mc"], "", out)
    assert out == []


@pytest.mark.parametrize("keys", [None, ["img", "aud", "vid"]])
def test_ragged_tensor_dict_is_written_alike_and_read_across(store, prefix, keys):
    rows = objarr([{"img": torch.ones(2, 3), "aud": torch.arange(4.0)}, None,
                   {"img": torch.zeros(1, 3)}])
    got = {}
    for side, mod in (("kv", kb), ("mc", ms)):
        md = {} if keys is None else {"keys": keys}
        t = SIDES[side](store, prefix + side)
        h = json.loads(json.dumps(mod.export_dataproto_ref(t.put_dataproto(
            Proto(non_tensor_batch={"f": rows}),
            field_schemas={"f": mod.FieldSchema("ragged_tensor_dict", metadata=md)}))))
        (m,) = _manifests(store, h).values()
        got[side] = {"encoded": _shape(h["encoded_non_tensor"]["f"]),
                     "buffers": _shape(m["buffers"])}
        for reader in SIDES:
            v = list(SIDES[reader](store, prefix + side).get_dataproto(h)
                     ["non_tensor_batch"]["f"])
            assert v[1] is None and sorted(v[0]) == ["aud", "img"] and list(v[2]) == ["img"]
            assert torch.equal(v[0]["img"], torch.ones(2, 3))
            assert torch.equal(v[0]["aud"], torch.arange(4.0))
    out = []
    _diff(got["kv"], got["mc"], "", out)
    assert out == []


# -- tensor metadata: real Mooncake's C++ _serialize_tensor ----------------------------

def _real_tensor_meta():
    path = os.environ.get("MOONCAKE_TENSOR_META")
    if not path or not os.path.exists(path):
        pytest.skip("MOONCAKE_TENSOR_META names no dump of real Mooncake's _serialize_tensor")
    with open(path, "rb") as f:
        return pickle.load(f)


def test_tensor_metadata_is_real_mooncakes_byte_for_byte():
    real = _real_tensor_meta()
    compared = 0
    for name, (status, *rest) in real["cases"].items():
        if status != "ok":
            continue            # a dtype this torch lacks on Mooncake's side
        meta, size, tensor_bytes, t = rest
        ours = mc._serialize_tensor(t)
        assert bytes(ours[0]) == meta, name
        assert ours[2] == size, name
        back = mc._deserialize_tensor(meta + tensor_bytes)
        assert back.dtype == t.dtype and torch.equal(back, t.contiguous()), name
        compared += 1
    assert compared >= 5
    assert mc._tensor_metadata_size() == real["size"]


def test_real_mooncake_reads_the_drop_ins_tensor_objects():
    """What the drop-in's put_tensor and put_tensor_with_tp stored, put
    byte for byte into real Mooncake's store, read by its get_tensor,
    get_tensor_with_tp and _deserialize_tensor."""
    real = _real_tensor_meta()
    rb = real.get("read_back", {})
    bad = {k: v for k, v in rb.items() if v not in ("ok", "skip")}
    assert bad == {}
    assert sum(v == "ok" for v in rb.values()) >= 10


def test_the_drop_in_reads_real_mooncakes_tensor_objects(store):
    """What real Mooncake's put_tensor and put_tensor_with_tp stored, read
    by the drop-in's get_tensor and get_tensor_with_tp after a plain put."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import anchor_tensor_real as atr
    real = _real_tensor_meta()
    objs = real["objects"]
    tensors = atr.cases()
    read = 0
    for key, blob in objs.items():
        assert store.put("real-" + key, blob) == 0
        if "_tp_" in key:
            continue
        want = tensors[key[2:]]
        got = store.get_tensor("real-" + key)
        assert got is not None and got.dtype == want.dtype, key
        assert torch.equal(got, want.contiguous()), key
        read += 1
    for base, (t, tp, dim) in atr.TP.items():
        for r in range(tp):
            got = store.get_tensor_with_tp("real-" + base, tp_rank=r, tp_size=tp)
            assert got is not None and torch.equal(got, t.chunk(tp, dim)[r]), (base, r)
            read += 1
    assert read >= 10
