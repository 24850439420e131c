"""test_mooncake_layout.py — the drop-in writes what Mooncake's wheel writes.

Each test pins one layout difference found by running Mooncake's own
structured_object_store.py over the drop-in's store (tools/anchor-suites.sh,
its interop section) and fixed since: the shape of mooncake.store's tensor
helpers, which Mooncake's structured store unpacks; the notes and the
physical_layout an inferred column carries; which rows are encoded
structured_recursive; the order of a dict level's keys; the field spec of
byte-row data. Written from the format as Mooncake documents and writes
it; nothing of Mooncake's is needed to run them."""

import ctypes
import json
import uuid

import numpy as np
import pytest

from conftest import objarr, DataProtoLike, mooncake_embedded_store
from kvengine import mooncake_structured
from mooncake import store as mstore
from mooncake.structured_object_store import (FieldSchema, MooncakeBundleTransfer,
                                              StructuredObjectPayload, export_dataproto_ref)

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def store():
    s = mooncake_embedded_store("64MB", "16MB")
    yield s
    s.close()


@pytest.fixture
def transfer(store):
    return MooncakeBundleTransfer(store, key_prefix="lay-%s" % uuid.uuid4().hex[:8])


Proto = DataProtoLike


def encoded(transfer, col, schema=None):
    ref = transfer.put_dataproto(Proto(non_tensor_batch={"f": objarr(col)}),
                                 field_schemas={"f": schema} if schema else None)
    return export_dataproto_ref(ref)["encoded_non_tensor"]["f"], ref


def stage_specs(store, ref):
    (st,) = ref.stage_refs.values()
    m = json.loads(bytes(store.get(st.manifest_key)))
    meta = json.loads(bytes(store.get(m["meta"]["key"])))
    return meta["__mooncake_structured_fields__"]


# -- mooncake.store's tensor helpers ---------------------------------------------------

def test_serialize_tensor_is_metadata_pointer_size_owner():
    """Mooncake's _serialize_tensor returns (metadata, data address, size,
    owner), and its structured store unpacks four values: the drop-in
    returned one bytes object (metadata + data), so Mooncake's writer
    failed on every tensor member it staged."""
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    meta, ptr, size, owner = mstore._serialize_tensor(t)
    assert isinstance(meta, bytes) and len(meta) == mstore._tensor_metadata_size() == 304
    assert size == 48 and ptr == owner.data_ptr() and torch.equal(owner, t)
    assert ctypes.string_at(ptr, size) == t.numpy().tobytes()
    back = mstore._deserialize_tensor(meta + ctypes.string_at(ptr, size))
    assert torch.equal(back, t)
    # a strided tensor: the owner is a contiguous copy, the metadata its shape
    nc = t.t()
    meta, ptr, size, owner = mstore._serialize_tensor(nc)
    assert owner.is_contiguous() and torch.equal(owner, nc) and ptr == owner.data_ptr()
    assert torch.equal(mstore._deserialize_tensor(meta + ctypes.string_at(ptr, size)), nc)
    # empty: no bytes, metadata only
    meta, ptr, size, owner = mstore._serialize_tensor(torch.zeros(0, 3))
    assert size == 0 and mstore._deserialize_tensor(meta).shape == (0, 3)


def test_deserialize_tensor_raises_on_what_is_no_tensor():
    """Mooncake raises ValueError for bytes that are no tensor object; the
    drop-in returned None, which Mooncake's readers then used as a tensor."""
    meta, ptr, size, _ = mstore._serialize_tensor(torch.ones(4))
    whole = meta + ctypes.string_at(ptr, size)
    for bad in (b"", b"x" * 400, whole[:-1], whole + b"\0", b"\0" * 304 + whole[304:]):
        with pytest.raises(ValueError, match="invalid serialized Mooncake tensor"):
            mstore._deserialize_tensor(bad)
    with pytest.raises(ValueError):
        mstore._serialize_tensor(torch.ones(2, dtype=torch.complex64))


# -- the notes an inferred column carries ----------------------------------------------

@pytest.mark.parametrize("col,codec,kind", [
    (["a", None], "utf8_ragged", "str"),
    ([b"a", None], "bytes_ragged", "bytes-like"),
    ([1, 2], "ndarray", "numeric scalar"),
    ([[1], [2, 3]], "typed_ragged", "numeric sequence"),
    ([np.arange(2), np.arange(1)], "typed_ragged", "numeric sequence"),
    ([torch.ones(2), torch.ones(1)], "ragged_tensor", "torch.Tensor"),
    ([{"a": 1}, {"a": 2}], "msgpack_ragged", "msgpack"),
])
def test_an_inferred_column_says_how_it_was_inferred(transfer, col, codec, kind):
    """Mooncake writes schema_source, normalized_type and decision_reason
    into an inferred column's metadata; the drop-in wrote none."""
    enc, _ = encoded(transfer, col)
    assert enc["codec"] == codec
    md = enc["metadata"]
    assert md["schema_source"] == "inferred_from_runtime_values"
    assert md["normalized_type"] == kind and md["decision_reason"]
    assert (md.get("recursive_source") == "ndarray") == isinstance(col[0], np.ndarray)


def test_a_column_a_schema_names_carries_no_inference_notes(transfer):
    enc, _ = encoded(transfer, [[1], [2, 3]], FieldSchema("typed_ragged"))
    assert "schema_source" not in enc["metadata"] and "decision_reason" not in enc["metadata"]


def test_ndarray_rows_are_marked_contiguous_flat(transfer):
    """Mooncake's reader takes rows as views of one array only when the
    column says physical_layout contiguous_flat; the drop-in never said so."""
    for col in ([np.arange(3), None, np.arange(1)], [torch.ones(2), torch.zeros(3)]):
        enc, _ = encoded(transfer, col)
        assert enc["metadata"]["physical_layout"] == "contiguous_flat"
        assert enc["metadata"]["row_format"] == "ndarray"
    enc, _ = encoded(transfer, [[1], [2, 3]])          # list rows: not ndarray rows
    assert "physical_layout" not in enc["metadata"]


# -- which rows nest, and in what order ------------------------------------------------

def test_dict_rows_with_bytes_or_arrays_are_structured_recursive(transfer):
    """Mooncake keeps bytes, tensors and numeric arrays inside dict rows out
    of a msgpack blob (structured_recursive); the drop-in packed dicts of
    bytes as msgpack_ragged."""
    rows = [{"b": b"x", "s": "q"}, {"b": b"yy", "s": "r"}, {"b": None, "s": "t"}]
    enc, ref = encoded(transfer, rows)
    assert enc["codec"] == "structured_recursive"
    assert [lf["codec"] for lf in enc["metadata"]["leaves"]] == ["bytes_ragged", "utf8_ragged"]
    assert list(transfer.get_dataproto(ref)["non_tensor_batch"]["f"]) == rows
    enc, _ = encoded(transfer, [{"a": 1, "b": "x"}, {"a": 2}])
    assert enc["codec"] == "msgpack_ragged"            # nothing to keep out: one blob


def test_a_dict_levels_keys_are_sorted(transfer):
    """Mooncake sorts a dict level's keys (children, and so leaf ids and
    payload names); the drop-in kept first-seen order."""
    rows = [{"z": np.arange(2), "a": 1, "m": "x"}, {"z": np.arange(3), "a": 2, "m": "y"}]
    enc, ref = encoded(transfer, rows)
    md = enc["metadata"]
    assert md["nodes"][0]["children"] == ["a", "m", "z"]
    assert [lf["path"] for lf in md["leaves"]] == ["non_tensor_batch.f.%s" % k for k in "amz"]
    got = list(transfer.get_dataproto(ref)["non_tensor_batch"]["f"])
    assert [r["a"] for r in got] == [1, 2] and np.array_equal(got[1]["z"], np.arange(3))
    leaves, nodes = [], []
    mooncake_structured.infer_structure("r", [{"y": 1, "x": 2}, {"w": 3}], leaves, nodes)
    assert nodes[0].children == ["w", "x", "y"]


def test_byte_row_data_is_stored_as_bytes(transfer, store):
    """The data member of a byte-row codec has field spec {"encoding":
    "bytes"} in Mooncake's stage metadata; the drop-in wrote it as a uint8
    ndarray (dtype, shape)."""
    _, ref = encoded(transfer, ["a", "bc", None])
    specs = stage_specs(store, ref)
    assert specs["non_tensor_batch.f.data"] == {"encoding": "bytes"}
    assert specs["non_tensor_batch.f.offsets"]["encoding"] == "ndarray"
    assert list(transfer.get_dataproto(ref)["non_tensor_batch"]["f"]) == ["a", "bc", None]


def test_a_tensor_member_is_a_tensor_object_of_the_right_size(transfer, store):
    ten = torch.arange(6, dtype=torch.float32)
    ref = transfer.put_structured_object(StructuredObjectPayload({}, {"t": ten}))
    spec = ref.manifest["buffers"]["t"]
    assert spec["kind"] == "tensor" and spec["metadata_bytes"] == 304
    assert spec["bytes"] == 304 + 24 == store.get_size(spec["key"])


def test_dataproto_manifest_view_has_mooncakes_shape(transfer):
    """Mooncake's view names each field's section, gives an encoded field's
    payload members with their field specs, and a stage as its manifest key
    and DataProto metadata; the drop-in gave the encoded field's handle
    entry as its spec and the whole stage metadata."""
    ref = transfer.put_dataproto(Proto(batch={"x": np.zeros((3, 2), np.float32)},
                                       non_tensor_batch={"u": objarr(["a", "b", None])},
                                       meta_info={"k": 1}), stage="s")
    view = transfer.dataproto_manifest_view(ref)
    x, u = view["batch_fields"]["x"], view["non_tensor_fields"]["u"]
    assert x["section"] == "batch" and x["spec"]["encoding"] == "ndarray"
    assert x["spec"]["shape"] == [3, 2]
    assert u["section"] == "non_tensor_batch" and u["member"] == "non_tensor_batch.u"
    sp = u["spec"]
    assert sp["encoding"] == "structured_non_tensor" and sp["codec"] == "utf8_ragged"
    assert set(sp["payload_members"]) == {"data", "offsets", "nulls"} == set(sp["payload_specs"])
    assert sp["payload_specs"]["data"] == {"encoding": "bytes"}
    assert sp["payload_specs"]["offsets"]["shape"] == [4]
    assert view["stages"]["s"]["manifest_key"] == ref.stage_refs["s"].manifest_key
    assert view["stages"]["s"]["dataproto"]["stage"] == "s"
    assert view["meta_info_keys"] == ["k"] and view["batch_size"] == 3


# -- rows of arrays with null rows; columns with no value ------------------------------

def member(store, ref, name):
    (st,) = ref.stage_refs.values()
    m = json.loads(bytes(store.get(st.manifest_key)))
    return b"".join(bytes(store.get(c["key"])) for c in m["buffers"][name]["chunks"])


def test_a_null_row_among_arrays_has_no_dims(transfer, store):
    """Mooncake writes ndims 0 for a null row among array rows, and, when the
    rows share a trailing shape, (0, *that shape) as its shape; the drop-in
    wrote an empty 1-d row (ndims 1, shape zeros)."""
    _, ref = encoded(transfer, [torch.ones(2, 2), torch.zeros(3, 2), None])
    nd = np.frombuffer(member(store, ref, "non_tensor_batch.f.ndims"), np.int16)
    sh = np.frombuffer(member(store, ref, "non_tensor_batch.f.shapes"), np.int64).reshape(3, 2)
    assert nd.tolist() == [2, 2, 0] and sh.tolist() == [[2, 2], [3, 2], [0, 2]]
    got = list(transfer.get_dataproto(ref)["non_tensor_batch"]["f"])
    assert torch.equal(got[1], torch.zeros(3, 2)) and got[2] is None
    # rows of lists keep their empty 1-d null row, as Mooncake writes them
    _, ref = encoded(transfer, [[1.5], None])
    assert np.frombuffer(member(store, ref, "non_tensor_batch.f.ndims"), np.int16).tolist() \
        == [1, 1]


def test_a_ragged_tensor_column_with_no_tensor_is_float32_with_no_dims(transfer):
    enc, ref = encoded(transfer, [None, None], FieldSchema("ragged_tensor"))
    assert enc["metadata"]["dtype"] == "torch.float32" and enc["metadata"]["max_ndim"] == 0
    assert list(transfer.get_dataproto(ref)["non_tensor_batch"]["f"]) == [None, None]


# -- ragged_tensor_dict ------------------------------------------------------------------

def test_ragged_tensor_dict_rows_round_trip_in_mooncakes_layout(transfer, store):
    """Rows that are dicts of tensors, by FieldSchema("ragged_tensor_dict"):
    a ragged_tensor column per key, a null_mask, the keys and each key's
    column metadata (before: "unknown codec 'ragged_tensor_dict'")."""
    rows = [{"img": torch.ones(2, 3), "aud": torch.arange(4.0)}, None,
            {"img": torch.zeros(1, 3)}]
    enc, ref = encoded(transfer, rows, FieldSchema("ragged_tensor_dict"))
    assert enc["codec"] == "ragged_tensor_dict"
    assert enc["metadata"]["keys"] == ["aud", "img"]                  # sorted when inferred
    assert enc["metadata"]["key_codecs"]["img"]["dtype"] == "torch.float32"
    assert set(enc["payload_members"]) == {"null_mask"} | {
        "%s.%s" % (k, n) for k in ("aud", "img")
        for n in ("data", "offsets", "shapes", "ndims", "nulls")}
    got = list(transfer.get_dataproto(ref)["non_tensor_batch"]["f"])
    assert got[1] is None and list(got[2]) == ["img"] and torch.equal(got[2]["img"], rows[2]["img"])
    assert torch.equal(got[0]["aud"], rows[0]["aud"]) and torch.equal(got[0]["img"], rows[0]["img"])
    # declared keys: their order, a key no row has is an empty column
    enc, ref = encoded(transfer, rows, FieldSchema("ragged_tensor_dict",
                                                   metadata={"keys": ["img", "vid", "aud"]}))
    assert enc["metadata"]["keys"] == ["img", "vid", "aud"]
    assert list(transfer.get_dataproto(ref)["non_tensor_batch"]["f"])[0].keys() == {"img", "aud"}


@pytest.mark.parametrize("rows,keys,exc,match", [
    ([{"a.b": torch.ones(1)}], None, ValueError, "must not contain"),
    ([{"a/b": torch.ones(1)}], None, ValueError, "must not contain"),
    ([{"": torch.ones(1)}], None, ValueError, "must not be empty"),
    ([{"a": None}], None, TypeError, "explicit None"),
    ([{"a": torch.ones(1), "b": torch.ones(1)}], ["a"], ValueError, "keys not declared"),
    (["not a dict"], None, TypeError, "must be dicts"),
    ([{"a": torch.ones(1)}, {"a": torch.ones(1, dtype=torch.int64)}], None, ValueError,
     "mixed tensor dtypes"),
])
def test_ragged_tensor_dict_refuses_what_it_cannot_store(transfer, rows, keys, exc, match):
    md = {} if keys is None else {"keys": keys}
    with pytest.raises(exc, match=match):
        encoded(transfer, rows, FieldSchema("ragged_tensor_dict", metadata=md))


def test_a_0d_array_row_stays_0d(transfer, store):
    """Rows of arrays keep their rank: a 0-d row (np.asarray(7)) came back
    as [7], a 1-d row (np.ascontiguousarray makes every array at least 1-d);
    Mooncake's own test_typed_ragged_packs_ndarray_rows_contiguously failed
    on it. Its ndims entry is 0 and the column's data is the rows back to back."""
    rows = [np.asarray(7, dtype=np.int32), np.arange(3, dtype=np.int32), None,
            np.arange(6, dtype=np.int32).reshape(2, 3)]
    enc, ref = encoded(transfer, rows, FieldSchema("typed_ragged"))
    got = list(transfer.get_dataproto(ref)["non_tensor_batch"]["f"])
    assert got[0].shape == () and got[0] == 7 and got[2] is None
    assert got[1].tolist() == [0, 1, 2] and got[3].shape == (2, 3)
    nd = np.frombuffer(member(store, ref, "non_tensor_batch.f.ndims"), np.int16)
    assert nd.tolist() == [0, 1, 0, 2] and enc["metadata"]["max_ndim"] == 2
    data = np.frombuffer(member(store, ref, "non_tensor_batch.f.data"), np.int32)
    assert data.tolist() == [7, 0, 1, 2, 0, 1, 2, 3, 4, 5]
