"""test_mooncake_structured.py — the storing half of the drop-in's
mooncake.structured_object_store (kvengine.mooncake_bundle) on kvengine's
Mooncake store: structured objects, DataProto stages and their handles, a
second process reading what a first wrote, bad input, cleanup. Written from
Mooncake's documentation (dataproto-structured-object-transfer.md)."""

import ctypes
import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

import kvengine.mooncake as mc
from conftest import objarr, MC_QUIET as QUIET, DataProtoLike, mooncake_embedded_store
from kvengine import mooncake_bundle as mb, mooncake_tensor
from mooncake.structured_object_store import (BundleTransferPolicy, FieldSchema,
                                              MooncakeBundleTransfer, MooncakeDataProtoRef,
                                              RemoteBundleRef, StructuredMemberSlice,
                                              StructuredObjectPayload, export_dataproto_ref,
                                              import_dataproto_ref, is_dataproto_ref_handle,
                                              raw_destination, tensor_object_buffer)

torch = pytest.importorskip("torch")


@pytest.fixture
def store():
    s = mooncake_embedded_store("64MB", "16MB")
    yield s
    s.close()


@pytest.fixture
def transfer(store):
    return MooncakeBundleTransfer(store, key_prefix="t-%s" % uuid.uuid4().hex[:8])


Proto = DataProtoLike


def all_keys(transfer, ref):
    """Every store key a ref's manifests name, manifests included."""
    keys = []
    refs = ref.stage_refs.values() if isinstance(ref, MooncakeDataProtoRef) else [ref]
    for r in refs:
        keys += transfer._bundle_keys(transfer._manifest(r))
    return keys


def sample(n=6):
    return Proto(
        batch={"input_ids": torch.arange(n * 4, dtype=torch.int64).reshape(n, 4),
               "mask": np.arange(n * 3, dtype=np.float32).reshape(n, 3)},
        non_tensor_batch={
            "uid": np.asarray(["u%d" % i for i in range(n)], dtype=object),
            "reward": np.arange(n, dtype=np.float64) / 2,
            "blob": objarr([bytes([i]) * i if i % 3 else None for i in range(n)]),
            "info": objarr([{"i": i, "tags": ["a"] * i, "ok": i % 2 == 0} for i in range(n)]),
            "tokens": objarr([np.arange(i, dtype=np.int32) for i in range(n)]),
            "ragged": objarr([torch.full((i % 3 + 1,), float(i)) for i in range(n)]),
            "score": objarr([float(i) if i != 2 else None for i in range(n)]),
        },
        meta_info={"step": 7, "name": "rollout"})


def check_rows(got, want, rows):
    rows = list(range(len(want.non_tensor_batch["uid"])))[rows] if isinstance(rows, slice) \
        else list(rows)
    assert torch.equal(got["batch"]["input_ids"], want.batch["input_ids"][rows])
    assert np.array_equal(got["batch"]["mask"], want.batch["mask"][rows])
    nt, wt = got["non_tensor_batch"], want.non_tensor_batch
    assert nt["uid"].tolist() == [wt["uid"][i] for i in rows]
    assert np.array_equal(nt["reward"], wt["reward"][rows])
    assert nt["blob"].tolist() == [wt["blob"][i] for i in rows]
    assert nt["info"].tolist() == [wt["info"][i] for i in rows]
    assert nt["score"].tolist() == [wt["score"][i] for i in rows]
    for a, i in zip(nt["tokens"], rows):
        assert isinstance(a, np.ndarray) and a.dtype == np.int32
        assert np.array_equal(a, wt["tokens"][i])
    for t, i in zip(nt["ragged"], rows):
        assert torch.equal(t, wt["ragged"][i])


# -- structured objects ----------------------------------------------------------------

def test_structured_object_roundtrip_numpy_torch_bytes(transfer, store):
    arr = np.arange(24, dtype=np.int16).reshape(6, 4)
    ten = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    ref = transfer.put_structured_object(
        StructuredObjectPayload({"kind": "x"}, {"a": arr, "t": ten, "raw": b"hello",
                                                "s": torch.tensor(2.5),
                                                "b": torch.tensor([True, False])}))
    assert ref.manifest_key.startswith(transfer.key_prefix + "/default/")
    assert ref.manifest_key.endswith("/manifest")
    res = transfer.materialize(transfer.read_spec(ref))
    assert res.metadata["kind"] == "x" and res.metadata["layout"] == "structured"
    assert np.array_equal(res.objects["a"], arr) and res.objects["a"].dtype == np.int16
    assert torch.equal(res.objects["t"], ten)
    assert torch.equal(res.objects["s"], torch.tensor(2.5))
    assert torch.equal(res.objects["b"], torch.tensor([True, False]))
    assert res.objects["raw"] == b"hello"
    # a tensor member is a Mooncake tensor object another reader can open as one
    assert torch.equal(store.get_tensor(ref.manifest["buffers"]["t"]["key"]), ten)
    sel = transfer.materialize(transfer.read_spec(ref).select_members(["a"]))
    assert list(sel.objects) == ["a"]
    sl = transfer.materialize(transfer.read_spec(ref).slice_member("a", 0, 1, 6, 2)
                              .slice_member("t", 0, 1, 3))
    assert np.array_equal(sl.objects["a"], arr[1:6:2])
    assert torch.equal(sl.objects["t"], ten[1:3])


def test_put_object_and_get_object(transfer):
    ten = torch.arange(5, dtype=torch.int32)
    assert torch.equal(transfer.get_object(transfer.put_object(ten)), ten)
    got = transfer.get_object(transfer.put_object({"x": np.ones(3), "y": b"z"}))
    assert np.array_equal(got["x"], np.ones(3)) and got["y"] == b"z"


def test_chunked_members_and_row_ranges_across_chunks(transfer, store):
    arr = np.arange(1000, dtype=np.int64).reshape(250, 4)
    ref = transfer.put_structured_object(StructuredObjectPayload({}, {"a": arr}), chunk_bytes=96,
                                         policy=BundleTransferPolicy(max_inflight_put=4))
    chunks = ref.manifest["buffers"]["a"]["chunks"]
    assert len(chunks) == -(-arr.nbytes // 96)
    assert all(c["key"].startswith(ref.manifest["buffers"]["a"]["key"] + "/chunk/")
               for c in chunks)
    assert all(store.is_exist(c["key"]) == 1 for c in chunks)
    assert np.array_equal(transfer.materialize(transfer.read_spec(ref)).objects["a"], arr)
    got = transfer.materialize(transfer.read_spec(ref).slice_member("a", 0, 7, 201, 3))
    assert np.array_equal(got.objects["a"], arr[7:201:3])
    # a tensor past chunk_bytes goes as its tensor object's bytes, chunked
    ten = torch.arange(600, dtype=torch.float32).reshape(150, 4)
    ref = transfer.put_structured_object(StructuredObjectPayload({}, {"t": ten}), chunk_bytes=512)
    spec = ref.manifest["buffers"]["t"]
    assert len(spec["chunks"]) > 1 and max(c["bytes"] for c in spec["chunks"]) <= 512
    assert torch.equal(transfer.materialize(transfer.read_spec(ref)).objects["t"], ten)
    got = transfer.materialize(transfer.read_spec(ref).slice_member("t", 0, 33, 140, 5))
    assert torch.equal(got.objects["t"], ten[33:140:5])


def test_materialize_into_destinations(transfer):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    ten = torch.arange(6, dtype=torch.int64).reshape(3, 2)
    ref = transfer.put_structured_object(StructuredObjectPayload({}, {"a": arr, "t": ten}))
    dst = np.empty((3, 4), np.float32)
    tdst = torch.empty((3, 2), dtype=torch.int64)
    res = transfer.materialize_into(transfer.read_spec(ref), {"a": dst, "t": tdst})
    assert res.objects["a"] is dst and np.array_equal(dst, arr)
    assert res.objects["t"] is tdst and torch.equal(tdst, ten)
    with pytest.raises(ValueError, match="shape mismatch"):
        transfer.materialize_into(transfer.read_spec(ref), {"a": np.empty((2, 4), np.float32)})
    ro = np.empty((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        transfer.materialize_into(transfer.read_spec(ref), {"a": ro})
    # caller memory: a raw destination for an array, a tensor object buffer for a tensor
    mem = ctypes.create_string_buffer(arr.nbytes)
    got = transfer.materialize_into(transfer.read_spec(ref).select_members(["a"]),
                                    {"a": raw_destination(ctypes.addressof(mem), arr.nbytes, mem)})
    assert np.array_equal(got.objects["a"], arr) and bytes(mem.raw) == arr.tobytes()
    size = ref.manifest["buffers"]["t"]["bytes"]
    tmem = ctypes.create_string_buffer(size)
    dst = tensor_object_buffer(ctypes.addressof(tmem), size, tmem)
    got = transfer.materialize_into(transfer.read_spec(ref).select_members(["t"]), {"t": dst})
    assert torch.equal(got.objects["t"], ten)   # a tensor over the caller's memory
    assert got.objects["t"].data_ptr() == ctypes.addressof(tmem) + mooncake_tensor.METADATA_SIZE
    assert torch.equal(mooncake_tensor.deserialize_tensor(tmem.raw), ten)
    sl = transfer.materialize_into(transfer.read_spec(ref).slice_member("t", 0, 1, 3),
                                   {"t": dst})
    assert torch.equal(sl.objects["t"], ten[1:3]) and torch.equal(
        mooncake_tensor.deserialize_tensor(tmem.raw[:mooncake_tensor.METADATA_SIZE + 32]),
        ten[1:3])
    with pytest.raises(ValueError, match="holds 8 bytes"):
        transfer.materialize_into(transfer.read_spec(ref).select_members(["t"]),
                                  {"t": tensor_object_buffer(ctypes.addressof(tmem), 8, tmem)})


def test_tensor_object_buffer_member_is_stored_as_is(transfer, store):
    ten = torch.arange(8, dtype=torch.float64).reshape(2, 4)
    data = mooncake_tensor.serialize_tensor(ten)
    mem = ctypes.create_string_buffer(data, len(data))
    ref = transfer.put_structured_object(StructuredObjectPayload(
        {}, {"t": tensor_object_buffer(ctypes.addressof(mem), len(data), mem, batch_size=2)}),
        policy=BundleTransferPolicy(copy_mode="zero_copy"))
    assert store.get(ref.manifest["buffers"]["t"]["key"]) == data
    assert torch.equal(transfer.materialize(transfer.read_spec(ref)).objects["t"], ten)
    out = ctypes.create_string_buffer(len(data))
    dst = tensor_object_buffer(ctypes.addressof(out), len(data), out)
    assert transfer.materialize_into(transfer.read_spec(ref), {"t": dst}).objects["t"] is dst
    assert out.raw == bytes(data)
    with pytest.raises(ValueError, match="tensor-object buffer"):
        transfer.put_structured_object(StructuredObjectPayload({}, {"t": ten}),
                                       policy=BundleTransferPolicy(copy_mode="zero_copy"))


# -- DataProto -----------------------------------------------------------------------------

def test_dataproto_roundtrip_every_codec(transfer):
    data = sample()
    ref = transfer.put_dataproto(data, namespace="ns", partition="p1", stage="rollout")
    assert ref.batch_size == 6 and set(ref.stage_refs) == {"rollout"}
    codecs = {k: v["codec"] for k, v in ref.encoded_non_tensor.items()}
    assert codecs == {"uid": "utf8_ragged", "blob": "bytes_ragged", "info": "msgpack_ragged",
                      "tokens": "typed_ragged", "ragged": "ragged_tensor", "score": "ndarray"}
    assert ref.field_index["reward"].member == "non_tensor_batch.reward"
    got = transfer.get_dataproto(ref)
    check_rows(got, data, slice(None))
    assert got["meta_info"] == {"step": 7, "name": "rollout"}


@pytest.mark.parametrize("rows", [slice(1, 5), slice(0, 6, 2), [5, 0, 3], [-1], [],
                                  StructuredMemberSlice(axis=0, start=2, end=6, step=3)])
def test_dataproto_rows(transfer, rows):
    data = sample()
    ref = transfer.put_dataproto(data, chunk_bytes=40)
    want = rows if not isinstance(rows, StructuredMemberSlice) else \
        slice(rows.start, rows.end, rows.step)
    if isinstance(want, list):
        want = [i % 6 for i in want]
    check_rows(transfer.get_dataproto(ref, rows=rows), data, want)


def test_dataproto_selection_meta_and_data_cls(transfer):
    ref = transfer.put_dataproto(sample())
    got = transfer.get_dataproto(ref, fields=["input_ids", "uid"], meta_info_keys=["step"])
    assert set(got["batch"]) == {"input_ids"} and set(got["non_tensor_batch"]) == {"uid"}
    assert got["meta_info"] == {"step": 7}
    got = transfer.get_dataproto(ref, batch_fields=["mask"], non_tensor_fields=["reward"],
                                 data_cls=Proto)
    assert isinstance(got, Proto) and set(got.batch) == {"mask"}
    with pytest.raises(KeyError, match="unknown DataProto fields"):
        transfer.get_dataproto(ref, fields=["nope"])
    with pytest.raises(ValueError, match="is in batch"):
        transfer.get_dataproto(ref, non_tensor_fields=["mask"])
    with pytest.raises(KeyError):
        transfer.get_dataproto(ref, meta_info_keys=["nope"])
    with pytest.raises(IndexError, match="out of range"):
        transfer.get_dataproto(ref, rows=[6])
    with pytest.raises(TypeError, match="row indices"):
        transfer.get_dataproto(ref, rows=["a"])
    dst = np.empty((2, 3), np.float32)
    got = transfer.get_dataproto(ref, batch_fields=["mask"], rows=[4, 1],
                                 destinations={"mask": dst})
    assert got["batch"]["mask"] is dst and np.array_equal(dst, sample().batch["mask"][[4, 1]])


def test_append_fields_same_stage_and_overwrite(transfer, store):
    ref = transfer.put_dataproto(Proto(batch={"a": np.arange(4)}, meta_info={"x": 1}),
                                 stage="s1")
    ref2 = transfer.append_dataproto_fields(
        ref, Proto(batch={"b": torch.ones(4, 2)}, meta_info={"y": 2}), stage="s2")
    ref3 = transfer.append_dataproto_fields(
        ref2, Proto(non_tensor_batch={"c": np.asarray(list("wxyz"), dtype=object)}), stage="s1")
    assert set(ref3.stage_refs) == {"s1", "s2"}
    got = transfer.get_dataproto(ref3)
    assert np.array_equal(got["batch"]["a"], np.arange(4))
    assert torch.equal(got["batch"]["b"], torch.ones(4, 2))
    assert got["non_tensor_batch"]["c"].tolist() == list("wxyz")
    assert got["meta_info"] == {"x": 1, "y": 2}
    with pytest.raises(ValueError, match="already exist"):
        transfer.append_dataproto_fields(ref3, Proto(batch={"a": np.arange(4)}), stage="s3")
    with pytest.raises(ValueError, match="batch size"):
        transfer.append_dataproto_fields(ref3, Proto(batch={"d": np.arange(5)}), stage="s3")
    with pytest.raises(ValueError, match="must include existing fields"):
        transfer.append_dataproto_fields(ref3, Proto(batch={"a": np.arange(4)}), stage="s1",
                                         overwrite=True)
    old_keys = transfer._bundle_keys(transfer._manifest(ref3.stage_refs["s2"]))
    ref4 = transfer.append_dataproto_fields(ref3, Proto(batch={"b": torch.zeros(4, 2)}),
                                            stage="s2", overwrite=True)
    assert torch.equal(transfer.get_dataproto(ref4, fields=["b"])["batch"]["b"],
                       torch.zeros(4, 2))
    assert all(store.is_exist(k) == 0 for k in old_keys)   # the replaced stage is gone
    transfer.cleanup_dataproto(ref4)
    assert all(store.is_exist(k) == 0 for k in all_keys(transfer, ref3)
               if "/" + ref3.stage_refs["s1"].manifest["object_id"] + "/" in k)


def test_field_schemas(transfer):
    data = Proto(non_tensor_batch={"t": objarr([[1, 2], None, [3]]),
                                   "j": objarr([{"a": 1}, None, [1, "x"]])})
    ref = transfer.put_dataproto(data, field_schemas={
        "t": FieldSchema("typed_ragged", metadata={"dtype": "int16"}),
        "j": FieldSchema("json_ragged")})
    got = transfer.get_dataproto(ref)["non_tensor_batch"]
    assert got["t"].tolist() == [[1, 2], None, [3]]
    assert got["j"].tolist() == [{"a": 1}, None, [1, "x"]]
    with pytest.raises(ValueError, match="not nullable"):
        transfer.put_dataproto(data, field_schemas={"t": FieldSchema("typed_ragged",
                                                                     nullable=False)})
    with pytest.raises(ValueError, match="unknown codec"):
        transfer.put_dataproto(data, field_schemas={"t": FieldSchema("zip")})


def test_flat_dict_put_and_get(transfer):
    data = {"ids": np.arange(6).reshape(3, 2), "txt": ["a", "b", "c"], "tags": ["x", "y"],
            "step": 3}
    ref = transfer.put(data, type="dict")
    got = transfer.get(ref, type="dict")
    assert np.array_equal(got["ids"], data["ids"])
    assert got["txt"] == ["a", "b", "c"] and got["tags"] == ["x", "y"] and got["step"] == 3


def test_export_import_handle_is_json_and_reads_back(store, transfer):
    data = sample()
    ref = transfer.put_dataproto(data, stage="rollout")
    h = export_dataproto_ref(ref)
    assert is_dataproto_ref_handle(h)
    text = json.dumps(h)
    assert "chunks" not in text            # manifest keys only, no manifests
    back = import_dataproto_ref(json.loads(text))
    assert back.stage_refs["rollout"].manifest == {}
    other = MooncakeBundleTransfer(store, key_prefix=transfer.key_prefix)
    check_rows(other.get_dataproto(json.loads(text)), data, slice(None))
    view = other.dataproto_manifest_view(h)
    assert view["batch_fields"]["mask"]["spec"]["shape"] == [6, 3]
    assert view["non_tensor_fields"]["uid"]["spec"]["codec"] == "utf8_ragged"


# -- another process ---------------------------------------------------------------------

CHILD = r"""
import json, sys
import numpy as np, torch
import kvengine.mooncake as mc
from mooncake.structured_object_store import MooncakeBundleTransfer, import_dataproto_ref
how, arg, prefix, settings = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
s = mc.MooncakeDistributedStore()
if how == "cluster":
    rc = s.setup("127.0.0.1", "", "0", "16MB", "tcp", "", arg, kvengine_settings=settings)
else:
    rc = s.setup_dummy("16MB", "16MB", arg)
assert rc == 0, s.last_error
t = MooncakeBundleTransfer(s, key_prefix=prefix)
h = json.loads(sys.stdin.read())
if h.get("write"):
    ref = t.put_dataproto({"batch": {"x": torch.arange(10).reshape(5, 2)},
                           "non_tensor_batch": {"w": np.asarray(list("abcde"), dtype=object)},
                           "meta_info": {"from": "child"}}, stage="child")
    from mooncake.structured_object_store import export_dataproto_ref
    print(json.dumps(export_dataproto_ref(ref)))
else:
    got = t.get_dataproto(h, rows=[3, 1])
    print(json.dumps({"ids": got["batch"]["input_ids"].tolist(),
                      "mask": got["batch"]["mask"].tolist(),
                      "uid": got["non_tensor_batch"]["uid"].tolist(),
                      "info": got["non_tensor_batch"]["info"].tolist(),
                      "tokens": [a.tolist() for a in got["non_tensor_batch"]["tokens"]],
                      "meta": got["meta_info"]}))
s.close()
"""


def run_child(how, arg, prefix, settings, stdin):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", CHILD, how, arg, prefix, json.dumps(settings)],
                         input=stdin, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(params=["cluster", "host"])
def shared(request, cluster):
    """(store, how, arg, settings) of a store another process opens too."""
    if request.param == "cluster":
        cluster.start_node()
        cluster.wait_owners(1)
        settings = dict(cluster.settings(), **QUIET)
        s = mc.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "", "0", "16MB", "tcp", "", cluster.master,
                       kvengine_settings=settings) == 0, s.last_error
        arg = cluster.master
    else:
        settings = dict(QUIET)
        arg = "127.0.0.1:%s" % uuid.uuid4().hex[:8]
        s = mc.MooncakeDistributedStore()
        assert s.setup_dummy("32MB", "16MB", arg) == 0, s.last_error
    try:
        yield s, request.param, arg, settings
    finally:
        s.close()


def test_another_process_reads_what_this_one_wrote_and_back(shared):
    s, how, arg, settings = shared
    prefix = "xp-%s" % uuid.uuid4().hex[:8]
    t = MooncakeBundleTransfer(s, key_prefix=prefix)
    data = sample()
    ref = t.put_dataproto(data, stage="rollout", chunk_bytes=64)
    got = run_child(how, arg, prefix, settings, json.dumps(export_dataproto_ref(ref)))
    want = data.batch["input_ids"][[3, 1]]
    assert got["ids"] == want.tolist()
    assert got["mask"] == data.batch["mask"][[3, 1]].tolist()
    assert got["uid"] == ["u3", "u1"]
    assert got["info"] == [data.non_tensor_batch["info"][3], data.non_tensor_batch["info"][1]]
    assert got["tokens"] == [[0, 1, 2], [0]]
    assert got["meta"] == {"step": 7, "name": "rollout"}
    # and what the other process wrote is read (and cleaned up) here
    h = run_child(how, arg, prefix, settings, json.dumps({"write": True}))
    back = t.get_dataproto(h)
    assert torch.equal(back["batch"]["x"], torch.arange(10).reshape(5, 2))
    assert back["non_tensor_batch"]["w"].tolist() == list("abcde")
    keys = all_keys(t, import_dataproto_ref(h)) + all_keys(t, ref)
    t.cleanup_dataproto(h)
    t.cleanup_dataproto(ref)
    assert [k for k in keys if s.is_exist(k) != 0] == []


# -- bad input ------------------------------------------------------------------------------

def test_bad_arguments_raise_clear_errors(transfer, store):
    with pytest.raises(ValueError, match="key_prefix"):
        MooncakeBundleTransfer(store, key_prefix="/")
    with pytest.raises(ValueError, match="chunk_bytes"):
        MooncakeBundleTransfer(store, default_chunk_bytes=0)
    with pytest.raises(TypeError, match="put, get and remove"):
        MooncakeBundleTransfer(object())
    with pytest.raises(TypeError, match="requires buffers"):
        StructuredObjectPayload({})
    with pytest.raises(TypeError, match="cannot store a str"):
        transfer.put_structured_object(StructuredObjectPayload({}, {"a": "text"}))
    with pytest.raises(TypeError, match="object ndarray"):
        transfer.put_structured_object(StructuredObjectPayload({}, {"a": objarr([1])}))
    with pytest.raises(TypeError, match="mapping"):
        transfer.put_structured_object(StructuredObjectPayload([1], {"a": b"x"}))
    with pytest.raises(ValueError, match="reserved"):
        transfer.put_structured_object(StructuredObjectPayload(
            {mb.STRUCTURED_FIELD_SPECS_KEY: 1}, {"a": b"x"}))
    with pytest.raises(ValueError, match="buffer name"):
        transfer.put_structured_object(StructuredObjectPayload({}, {"a/b": b"x"}))
    with pytest.raises(ValueError, match="partition"):
        transfer.put_object(b"x", partition="a/b")
    with pytest.raises(ValueError, match="max_inflight_put"):
        transfer.put_object(b"x", max_inflight_put=0)
    with pytest.raises(ValueError, match="copy_mode"):
        transfer.put_object(b"x", policy=BundleTransferPolicy(copy_mode="fast"))
    with pytest.raises(TypeError, match="DataProto-like"):
        transfer.put_dataproto(42)
    with pytest.raises(ValueError, match="inconsistent batch sizes"):
        transfer.put_dataproto(Proto(batch={"a": np.arange(3), "b": np.arange(4)}))
    with pytest.raises(ValueError, match="overlap"):
        transfer.put_dataproto(Proto(batch={"a": np.arange(3)},
                                     non_tensor_batch={"a": np.arange(3)}))
    with pytest.raises(ValueError, match="unable to infer a safe codec"):
        transfer.put_dataproto(Proto(non_tensor_batch={"o": objarr([object()])}))
    with pytest.raises(ValueError, match="mixed tensor dtypes"):
        transfer.put_dataproto(Proto(non_tensor_batch={"r": objarr(
            [torch.ones(1), torch.ones(1, dtype=torch.int64)])}))
    with pytest.raises(TypeError, match="MooncakeDataProtoRef"):
        transfer.get_dataproto({"manifest_key": "x"})
    with pytest.raises(TypeError, match="batch_size"):
        len(tensor_object_buffer(1, 8))
    with pytest.raises(ValueError, match="selected no members"):
        transfer.materialize(transfer.read_spec({"manifest_key": "k"}).select_members([]))


def test_handles_that_do_not_check_out(transfer):
    h = export_dataproto_ref(transfer.put_dataproto(sample(), stage="s"))
    for damage, match in [(lambda x: x.update(type="other"), "not a Mooncake"),
                          (lambda x: x.update(version=9), "version"),
                          (lambda x: x["field_index"]["uid"].update(stage="zz"), "unknown stage"),
                          (lambda x: x["field_index"]["uid"].update(section="meta"), "section"),
                          (lambda x: x.update(batch_size="6"), "batch_size"),
                          (lambda x: x.update(global_indexes=[1, "2"]), "global_indexes"),
                          (lambda x: x["stage_refs"]["s"].update(manifest_key=""), "manifest_key")]:
        bad = json.loads(json.dumps(h))
        damage(bad)
        with pytest.raises(ValueError, match=match):
            import_dataproto_ref(bad)


def test_a_damaged_manifest_is_refused(transfer, store):
    ref = transfer.put_structured_object(StructuredObjectPayload({}, {"a": np.arange(8)}))
    key = ref.manifest_key
    m = dict(ref.manifest)
    spec = lambda: transfer.read_spec({"manifest_key": key})  # noqa: E731

    def write(value):
        assert store.remove(key, force=True) == 0
        assert store.put(key, value) == 0
    write(b"{not json")
    with pytest.raises(ValueError, match="damaged"):
        transfer.materialize(spec())
    other = json.loads(json.dumps(m))
    other["buffers"]["a"]["chunks"] = [{"key": "elsewhere/x", "bytes": 64}]
    write(json.dumps(other).encode())
    with pytest.raises(ValueError, match="outside"):
        transfer.materialize(spec())
    with pytest.raises(ValueError, match="outside"):
        transfer.remove_bundle({"manifest_key": key})     # cleanup never follows it out
    other = json.loads(json.dumps(m))
    other["buffers"]["a"]["chunks"][0]["bytes"] = 65
    write(json.dumps(other).encode())
    with pytest.raises(ValueError, match="expected"):
        transfer.materialize(spec())
    other = json.loads(json.dumps(m))
    other["buffers"]["a"]["bytes"] = other["buffers"]["a"]["chunks"][0]["bytes"] = 32
    write(json.dumps(other).encode())
    with pytest.raises(ValueError, match="manifest says"):
        transfer.materialize(spec())
    other = json.loads(json.dumps(m))
    other["cleanup_keys"] = ["victim/key"]
    write(json.dumps(other).encode())
    with pytest.raises(ValueError, match="cleanup_keys"):
        transfer.remove_bundle({"manifest_key": key})
    write(json.dumps(m).encode())
    with pytest.raises(ValueError, match="does not match"):
        transfer.materialize(transfer.read_spec(RemoteBundleRef(key + "x", m)))
    assert np.array_equal(transfer.materialize(spec()).objects["a"], np.arange(8))
    transfer.remove_bundle({"manifest_key": key})
    with pytest.raises(KeyError, match="not in the store"):
        transfer.materialize(spec())


def test_a_missing_payload_object_is_an_error_not_garbage(transfer, store):
    ref = transfer.put_structured_object(StructuredObjectPayload({}, {"a": np.arange(8)}))
    assert store.remove(ref.manifest["buffers"]["a"]["key"], force=True) == 0
    with pytest.raises(KeyError, match="missing"):
        transfer.materialize(transfer.read_spec(ref))


# -- cleanup ---------------------------------------------------------------------------------

def test_cleanup_leaves_no_keys(transfer, store):
    ref = transfer.put_dataproto(sample(), stage="a", chunk_bytes=50)
    ref = transfer.append_dataproto_fields(ref, Proto(batch={"z": np.zeros((6, 2))}), stage="a")
    ref = transfer.append_dataproto_fields(ref, Proto(batch={"y": np.zeros(6)}), stage="b")
    keys = all_keys(transfer, ref)
    assert len(keys) > 20 and all(store.is_exist(k) == 1 for k in keys)
    transfer.cleanup_dataproto(export_dataproto_ref(ref))
    assert [k for k in keys if store.is_exist(k) != 0] == []
    transfer.cleanup_dataproto(ref)          # a second cleanup finds nothing and is fine


class FailingStore:
    """A BundleStore that fails its nth put."""

    def __init__(self, inner, n):
        self.inner, self.n, self.keys = inner, n, []

    def put(self, key, value, config=None):
        self.n -= 1
        if self.n == 0:
            return -800
        self.keys.append(key)
        return self.inner.put(key, value)

    def get(self, key):
        return self.inner.get(key)

    def remove(self, key, force=False):
        return self.inner.remove(key, force)


@pytest.mark.parametrize("fail_at", [1, 3, 6])
def test_a_failed_put_removes_what_it_wrote(store, fail_at):
    fs = FailingStore(store, fail_at)
    t = MooncakeBundleTransfer(fs, key_prefix="f-%s" % uuid.uuid4().hex[:8])
    with pytest.raises(RuntimeError, match="failed with -800"):
        t.put_dataproto(sample(), chunk_bytes=64)
    assert len(fs.keys) == fail_at - 1          # the failed put wrote nothing
    assert [k for k in fs.keys if store.is_exist(k) != 0] == []


# -- the msgpack codec ---------------------------------------------------------------------

def test_msgpack_rows_use_msgpacks_published_encoding():
    out = bytearray()
    mb._mp_pack({"a": 1, "b": [True, None, -3, 2.5, "x" * 40, b"\x00"]}, out)
    assert bytes(out[:4]) == b"\x82\xa1a\x01"          # fixmap 2, fixstr "a", fixint 1
    v, end = mb._mp_unpack(bytes(out), 0)
    assert end == len(out) and v == {"a": 1, "b": [True, None, -3, 2.5, "x" * 40, b"\x00"]}
    for big in (2 ** 40, -2 ** 40, 200, -100):
        out = bytearray()
        mb._mp_pack(big, out)
        assert mb._mp_unpack(bytes(out), 0)[0] == big
    with pytest.raises(ValueError):
        mb._mp_unpack(b"\xdb\x00\x00\x00\x09abc", 0)     # truncated str32
    with pytest.raises(TypeError):
        mb._mp_pack((1, 2), bytearray())                  # tuples are not msgpack arrays


# -- nested rows, write paths, groups -----------------------------------------------------

def same(a, b):
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_nested_rows_with_tensors_keep_missing_keys_and_nulls_apart(transfer):
    rows = [{"tok": torch.arange(2), "label": None, "imgs": [{"px": torch.ones(2, 2)}]},
            {"label": 1, "imgs": []},
            None,
            {"tok": None, "label": 3, "imgs": [{"px": None}, {"px": torch.zeros(1, 2)}],
             "meta": {"r": "x"}}]
    ref = transfer.put_dataproto(Proto(non_tensor_batch={"s": objarr(rows)}))
    assert ref.encoded_non_tensor["s"]["codec"] == "structured_recursive"
    got = transfer.get_dataproto(ref)["non_tensor_batch"]["s"]
    assert all(same(g, w) for g, w in zip(got, rows)), got
    assert "tok" not in got[1] and "tok" in got[3] and got[3]["tok"] is None
    assert "meta" not in got[0]
    picked = transfer.get_dataproto(import_dataproto_ref(export_dataproto_ref(ref)),
                                    rows=[3, 0])["non_tensor_batch"]["s"]
    assert same(picked[0], rows[3]) and same(picked[1], rows[0])


def test_damaged_recursive_metadata_is_refused(transfer):
    ref = transfer.put_dataproto(Proto(non_tensor_batch={"s": objarr(
        [{"t": torch.ones(1)}, {"t": torch.ones(2)}])}))
    h = export_dataproto_ref(ref)
    h["encoded_non_tensor"]["s"]["metadata"]["root_path"] = "elsewhere"
    with pytest.raises(ValueError, match="no level"):
        transfer.get_dataproto(h)


class Recording:
    """Passes every call to a store, recording what batch_put_from and put get."""

    def __init__(self, inner):
        self.inner, self.batches, self.configs = inner, [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put(self, key, value, config=None):
        self.configs.append(config)
        return self.inner.put(key, value, config=config)

    def batch_put_from(self, keys, ptrs, sizes, config=None):
        self.batches.append(list(keys))
        self.configs.append(config)
        return self.inner.batch_put_from(keys, ptrs, sizes, config=config)


def test_batch_and_zero_copy_writes(store):
    rec = Recording(store)
    pool = mc.BufferPool(store)
    t = MooncakeBundleTransfer(rec, key_prefix="w-%s" % uuid.uuid4().hex[:8], buffer_pool=pool)
    arr = np.arange(40, dtype=np.int64)
    ref = t.put_object({"a": arr}, chunk_bytes=64)                 # staged in the pool
    assert len(rec.batches) == 1 and len(rec.batches[0]) == 5     # every chunk, one call
    assert np.array_equal(t.get_object(ref)["a"], arr)
    ref = t.put_object({"a": arr}, policy=BundleTransferPolicy(copy_mode="zero_copy"))
    assert np.array_equal(t.get_object(ref)["a"], arr) and len(rec.batches) == 2
    n = len(rec.batches)
    t.put_object({"a": arr}, policy=BundleTransferPolicy(copy_mode="copy"))
    assert len(rec.batches) == n
    with pytest.raises(RuntimeError, match="zero-copy put requires tensor-object buffers"):
        t.put_dataproto(Proto(non_tensor_batch={"u": np.asarray(["a"], dtype=object)}),
                        policy=BundleTransferPolicy(copy_mode="zero_copy"))

    class NoBatch:
        put, get, remove = store.put, store.get, store.remove
    with pytest.raises(RuntimeError, match="zero-copy put needs"):
        MooncakeBundleTransfer(NoBatch()).put_object(
            b"x", policy=BundleTransferPolicy(copy_mode="zero_copy"))
    pool.close()


def test_a_dataproto_writes_as_one_storage_group(store):
    rec = Recording(store)
    t = MooncakeBundleTransfer(rec, key_prefix="g-%s" % uuid.uuid4().hex[:8])
    ref = t.put_dataproto(Proto(batch={"a": np.arange(4)}), chunk_bytes=8)
    gid = ref._storage_group_id
    assert gid.startswith("structured-")
    assert export_dataproto_ref(ref)["storage_group_id"] == gid
    seen = [c.group_ids for c in rec.configs]
    assert seen and all(g == [gid] for g in seen)
    rec.configs.clear()
    ref2 = t.append_dataproto_fields(export_dataproto_ref(ref), Proto(batch={"b": np.arange(4)}),
                                     stage="two")
    assert ref2._storage_group_id == gid and all(c.group_ids == [gid] for c in rec.configs)
    cfg = mc.ReplicateConfig()
    cfg.group_ids = ["other"]
    with pytest.raises(ValueError, match="conflicts"):
        t.append_dataproto_fields(ref2, Proto(batch={"c": np.arange(4)}), stage="x", config=cfg)
    cfg.group_ids = ["a", "b"]
    with pytest.raises(ValueError, match="exactly one"):
        t.put_dataproto(Proto(batch={"c": np.arange(4)}), config=cfg)
    mine = mc.ReplicateConfig()
    mine.group_ids = ["mine"]
    assert t.put_dataproto(Proto(batch={"c": np.arange(4)}), config=mine)._storage_group_id \
        == "mine"
    assert mine.group_ids == ["mine"]                    # the caller's config is left alone
    t.cleanup_dataproto(ref2)


def test_a_range_read_checks_the_object_size(transfer, store):
    ref = transfer.put_structured_object(StructuredObjectPayload({}, {"a": np.arange(8)}))
    m = json.loads(json.dumps(ref.manifest))
    m["buffers"]["a"]["bytes"] = m["buffers"]["a"]["chunks"][0]["bytes"] = 32
    assert store.remove(ref.manifest_key, force=True) == 0
    assert store.put(ref.manifest_key, json.dumps(m).encode()) == 0
    with pytest.raises(ValueError, match="manifest says"):
        transfer.materialize(transfer.read_spec({"manifest_key": ref.manifest_key})
                             .slice_member("a", 0, 0, 2))


def test_damaged_field_specs_and_encodings_are_refused(transfer, store):
    ref = transfer.put_structured_object(StructuredObjectPayload({}, {"a": np.arange(4)}))
    meta_key = ref.manifest["meta"]["chunks"][0]["key"]
    meta = json.loads(store.get(meta_key))
    for bad in ({"encoding": "ndarray", "dtype": "no-such", "shape": [4]},
                {"encoding": "ndarray", "dtype": "<i8", "shape": [-4]},
                {"encoding": "ndarray", "dtype": "|O", "shape": [4]},
                {"encoding": "torch_tensor", "dtype": "torch.nothing", "shape": [4]},
                "ndarray"):
        meta[mb.STRUCTURED_FIELD_SPECS_KEY]["a"] = bad
        data = json.dumps(meta).encode()
        m = json.loads(json.dumps(ref.manifest))
        m["meta"]["bytes"] = m["meta"]["chunks"][0]["bytes"] = len(data)
        assert store.remove(meta_key, force=True) == 0 and store.put(meta_key, data) == 0
        with pytest.raises(ValueError, match="field spec of member 'a' is damaged"):
            transfer.materialize(transfer.read_spec(RemoteBundleRef(ref.manifest_key, m)))
    h = export_dataproto_ref(transfer.put_dataproto(sample()))
    for field_name, damage in (("tokens", lambda e: e["metadata"].update(dtype="nope")),
                               ("uid", lambda e: e.update(rows=99)),
                               ("info", lambda e: e.update(codec="utf8_ragged")),
                               ("tokens", lambda e: e["payload_members"].pop("shapes"))):
        bad = json.loads(json.dumps(h))
        damage(bad["encoded_non_tensor"][field_name])
        with pytest.raises(ValueError, match="encoding is damaged"):
            transfer.get_dataproto(bad, fields=[field_name])
