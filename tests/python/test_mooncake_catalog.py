"""test_mooncake_catalog.py — mooncake.dataproto_catalog on the drop-in: logical
rows (partition, key) mapped to rows of stored DataProto stages, resolved
and then read back through MooncakeBundleTransfer; tags; replacement and
removal; bad calls change nothing. Written from Mooncake's documentation of
DataProtoCatalog (module and method docstrings)."""

import uuid

import numpy as np
import pytest

import kvengine.mooncake as mc
from mooncake.dataproto_catalog import DataProtoCatalog
from mooncake.structured_object_store import MooncakeBundleTransfer, export_dataproto_ref

QUIET = {"dram.hugepages": "off", "log.level": "warn"}


class Proto:
    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch = batch or {}
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}


@pytest.fixture(scope="module")
def transfer():
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", "64MB", "16MB", "tcp", "", "",
                   kvengine_settings=QUIET) == 0, s.last_error
    yield MooncakeBundleTransfer(s, key_prefix="cat-%s" % uuid.uuid4().hex[:8])
    s.close()


def fake_handle(manifest, fields, rows):
    return {"type": "mooncake_dataproto_ref", "version": 1, "kind": "bundle_stages",
            "batch_size": rows, "stage_refs": {"s": {"manifest_key": manifest}},
            "field_index": {f: {"stage": "s", "member": "batch." + f, "section": "batch"}
                            for f in fields}}


def read(transfer, plan, field):
    """field's values for the plan's keys, read row by row from the store."""
    (group,) = [g for g in plan["field_groups"] if field in g["fields"]]
    out = []
    for manifest, row in group["locations"]:
        h = plan["handles"][manifest]
        out.append(transfer.get_dataproto(h, fields=[field], rows=[row])["batch"][field][0])
    return out


def test_fields_written_in_two_stages_in_different_row_orders_resolve_and_read(transfer):
    cat = DataProtoCatalog()
    ids = np.arange(6).reshape(3, 2)
    h1 = export_dataproto_ref(transfer.put_dataproto(Proto(batch={"ids": ids}), stage="gen"))
    cat.update("run", ["k0", "k1", "k2"], handle=h1, tags=[{"n": 0}, {"n": 1}, {"n": 2}])
    # scores come back for the keys in another order
    scores = np.asarray([20.0, 0.0, 10.0])
    h2 = export_dataproto_ref(transfer.put_dataproto(Proto(batch={"score": scores}), stage="rw"))
    res = cat.update("run", ["k2", "k0", "k1"], handle=h2, tags=[{"d": 1}] * 3)
    assert res["fields"] == ["ids", "score"]
    plan = cat.resolve("run", ["k0", "k1", "k2"])
    assert plan["fields"] == ["ids", "score"] and len(plan["field_groups"]) == 2
    assert [r.tolist() for r in read(transfer, plan, "ids")] == ids.tolist()
    assert read(transfer, plan, "score") == [0.0, 10.0, 20.0]
    assert cat.list("run") == {"run": {"k0": {"n": 0, "d": 1}, "k1": {"n": 1, "d": 1},
                                       "k2": {"n": 2, "d": 1}}}


def test_fields_from_one_fragment_in_one_group():
    cat = DataProtoCatalog()
    cat.update("p", ["x", "y"], handle=fake_handle("m/a", ["f", "g"], 2))
    cat.update("p", ["x", "y"], handle=fake_handle("m/b", ["h"], 2))
    plan = cat.resolve("p", ["y", "x"], ["g", "h", "f"])
    assert [g["fields"] for g in plan["field_groups"]] == [["g", "f"], ["h"]]
    assert plan["field_groups"][0]["locations"] == [("m/a", 1), ("m/a", 0)]
    assert set(plan["handles"]) == {"m/a", "m/b"}


def test_a_replaced_fragment_is_forgotten_and_remove_empties_the_catalog():
    cat = DataProtoCatalog()
    cat.update("p", ["x", "y"], handle=fake_handle("m/old", ["f"], 2))
    cat.update("p", ["x", "y"], handle=fake_handle("m/new", ["f"], 2))
    plan = cat.resolve("p", ["x", "y"])
    assert set(plan["handles"]) == {"m/new"}
    assert cat._fragments and all(f["manifest_key"] == "m/new"
                                  for f in cat._fragments.values())
    cat.remove("p", ["x", "nope"])
    assert cat.list() == {"p": {"y": {}}}
    cat.remove("p", ["y"])
    assert cat.list() == {} and cat._fragments == {}


@pytest.mark.parametrize("call,match", [
    (lambda c: c.update("p", ["x", "y"], tags=[{}]), "same length"),
    (lambda c: c.update("p", ["x"], handle=fake_handle("m", ["f"], 2)), "batch_size"),
    (lambda c: c.update("p", ["x"], handle={**fake_handle("m", ["f"], 1), "version": 7}),
     "unsupported.*version"),
    (lambda c: c.update("p", ["x"], handle={**fake_handle("m", ["f"], 1), "stage_refs": {
        "s": {"manifest_key": "m"}, "t": {"manifest_key": "n"}}}), "exactly one"),
    (lambda c: c.update("p", "x"), "sequence"),
    (lambda c: c.update("p", ["x", "x"]), "repeat"),
    (lambda c: c.update("", ["x"]), "partition"),
    (lambda c: c.resolve("q", ["zz"]), "not found"),
    (lambda c: c.resolve("q", ["a"], ["f"]), "not ready"),
    (lambda c: c.resolve("q", ["a"]), "do not contain any fields"),
    (lambda c: c.resolve("q", ["a"], "f"), "sequence"),
])
def test_bad_calls_raise_and_change_nothing(call, match):
    cat = DataProtoCatalog()
    cat.update("q", ["a", "b"], tags=[{"t": 1}, {}])
    cat.update("q", ["b"], handle=fake_handle("m/b", ["f"], 1))
    before = (cat.list(), dict(cat._fragments))
    with pytest.raises(ValueError, match=match):
        call(cat)
    assert (cat.list(), dict(cat._fragments)) == before
