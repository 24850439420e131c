"""test_mooncake_parallel.py — the Mooncake drop-in's multi-axis tensor
parallelism, batch_put_tensor_with_tp_from with the batch *_with_tp _into
reads, and batch_replica_clear of one segment (issue 18). Written from
Mooncake's documentation (mooncake-store.md "Unified Parallel Tensor IO",
the *_with_tp calls, batch_replica_clear), on CPU tensors."""

import ctypes

import pytest

import kvengine.mooncake as mc
import kvengine.mooncake_tensor as mt


def _blob(t):
    """A tensor object's bytes (metadata block + data), as put_tensor stores it."""
    meta, ptr, size, _owner = mc._serialize_tensor(t)
    return meta + ctypes.string_at(ptr, size)

torch = pytest.importorskip("torch")

BAD = -600
QUIET = {"dram.hugepages": "off", "log.level": "warn"}


@pytest.fixture
def store():
    s = mc.MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", "64MB", "16MB", "tcp", "", "",
                 kvengine_settings=QUIET)
    assert rc == 0, s.last_error
    s.kv_lease_ttl_ms = 0
    yield s
    s.close()


def _axis(kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    a = mc.ParallelAxis()          # Mooncake's style: fields set one by one
    a.kind, a.rank, a.size, a.split_dim = kind, rank, size, split_dim
    a.expert_id, a.stage_id = expert_id, stage_id
    return a


def _par(*axes):
    p = mc.TensorParallelism()
    p.axes = list(axes)
    return p


def _target(mode, par=None):
    t = mc.ReadTarget()
    t.mode, t.parallelism = mode, par
    return t


def test_dp_tp_full_input_stores_the_tp_slice_and_reads_back(store):
    """Before: NOT_SUPPORTED (-1012) for any identity of several axes."""
    full = torch.arange(48, dtype=torch.float32).reshape(4, 12)
    for dp in range(2):
        for tp in range(3):       # each writer passes the full source tensor
            p = _par(_axis("dp", dp, 2), _axis("tp", tp, 3, 1))
            assert store.put_tensor_with_parallelism("w", full + dp, p) == 0
    # Mooncake's object names: canonical order, one suffix per axis.
    assert store.is_exist("w__dp_1of2__tp_2of3_sd1") == 1
    for dp in range(2):
        chunks = (full + dp).chunk(3, 1)
        for tp in range(3):
            p = _par(_axis("tp", tp, 3, 1), _axis("dp", dp, 2))      # any order
            got = store.get_tensor_with_parallelism("w", _target("shard", p))
            assert torch.equal(got, chunks[tp])
        p = _par(_axis("dp", dp, 2), _axis("tp", 0, 3, 1))
        assert torch.equal(store.get_tensor_with_parallelism("w", _target("full", p)), full + dp)
    # The metadata block names every axis, the whole tensor's shape too.
    meta = mt.parse(store.get("w__dp_0of2__tp_1of3_sd1"))
    assert meta.layout == mt.SHARD and meta.global_shape == (4, 12) and meta.shape == (4, 4)
    assert [(a[0], a[2], a[3], a[4]) for a in meta.axes] == [(mt.AXIS_DP, 0, 2, -1),
                                                               (mt.AXIS_TP, 1, 3, 1)]
    # One shard gone: no full view of that dp group, the other still joins.
    assert store.remove("w__dp_0of2__tp_1of3_sd1") == 0
    assert store.get_tensor_with_parallelism(
        "w", _target("full", _par(_axis("dp", 0, 2), _axis("tp", 0, 3, 1)))) is None
    assert store.get_tensor_with_parallelism(
        "w", _target("full", _par(_axis("dp", 1, 2), _axis("tp", 0, 3, 1)))) is not None


def test_tags_without_tp_store_the_tensor_as_given(store):
    t = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    pp = _par(_axis("pp", 1, 4, stage_id=1))
    assert store.put_tensor_with_parallelism("s", t, pp) == 0
    assert store.is_exist("s__pp_1of4_sid1") == 1
    assert torch.equal(store.get_tensor_with_parallelism("s", _target("shard", pp)), t)
    # Another stage id is another identity: not this object.
    other = _par(_axis("pp", 1, 4, stage_id=2))
    assert store.get_tensor_with_parallelism("s", _target("shard", other)) is None
    # A full read needs a tp axis to join along.
    assert store.get_tensor_with_parallelism("s", _target("full", pp)) is None
    # ep with a split dim: the stored global shape counts every expert's part.
    ep = _par(_axis("ep", 2, 4, split_dim=0, expert_id=7))
    assert store.put_tensor_with_parallelism("e", t, ep) == 0
    meta = mt.parse(store.get("e__ep_2of4_sd0_eid7"))
    assert meta.global_shape == (8, 3) and meta.axis_ids == [7]
    assert torch.equal(store.get_tensor_with_parallelism("e", _target("shard", ep)), t)


def test_a_tp_shard_is_cut_from_the_full_tensor_when_not_stored(store):
    full = torch.arange(16, dtype=torch.float64).reshape(2, 8)
    assert store.put_tensor_with_parallelism("f", full) == 0
    p = _par(_axis("dp", 0, 1), _axis("tp", 3, 4, 1))
    got = store.get_tensor_with_parallelism("f", _target("shard", p))
    assert torch.equal(got, full.chunk(4, 1)[3])


def test_bad_identities_are_refused(store):
    t = torch.zeros(4, 6)
    twice = _par(_axis("tp", 0, 2, 0), _axis("tp", 1, 2, 0), _axis("dp", 0, 1))
    assert store.put_tensor_with_parallelism("x", t, twice) == BAD
    assert store.put_tensor_with_parallelism(
        "x", t, _par(_axis("dp", 2, 2), _axis("tp", 0, 2))) == BAD          # rank >= size
    assert store.put_tensor_with_parallelism(
        "x", t, _par(_axis("dp", 0, 2), _axis("tp", 0, 4, 1))) == BAD       # 6 % 4: not uniform
    assert store.put_tensor_with_parallelism(
        "x", t, _par(_axis("mp", 0, 2), _axis("tp", 0, 2))) == BAD          # unknown kind
    assert store.put_tensor_with_parallelism(
        "x", t, _par(_axis("dp", 0, 2), _axis("tp", 0, 2, 5))) == BAD       # no dim 5
    assert store.get_tensor_with_parallelism(
        "x", _target("shard", _par(_axis("dp", 0, 2), _axis("zz", 0, 2)))) is None
    res = store.batch_put_tensor_with_parallelism(
        ["b0", "b1"], [t, t], [_par(_axis("dp", 0, 2), _axis("tp", 1, 2, 1)), twice])
    assert res[0] == 0 and res[1] == BAD


def test_several_axes_from_and_into(store):
    full = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    blob = _blob(full)
    src = (ctypes.c_ubyte * len(blob)).from_buffer_copy(blob)
    sp = ctypes.addressof(src)
    assert store.register_buffer(sp, len(blob)) == 0
    for tp in range(2):
        p = _par(_axis("pp", 0, 2, stage_id=0), _axis("tp", tp, 2, 0))
        assert store.put_tensor_with_parallelism_from("fr", sp, len(blob), p) == 0
    dst = (ctypes.c_ubyte * (len(blob) + 512))()
    dp = ctypes.addressof(dst)
    assert store.register_buffer(dp, len(dst)) == 0
    p = _par(_axis("pp", 0, 2, stage_id=0), _axis("tp", 0, 2, 0))
    into = store.get_tensor_with_parallelism_into("fr", dp, len(dst), _target("full", p))
    assert torch.equal(into, full)
    got = store.batch_get_tensor_with_parallelism_into(
        ["fr"], [dp], [len(dst)], [_target("shard", p)])[0]
    assert torch.equal(got, full.chunk(2, 0)[0])
    # A buffer too small for the joined tensor: None, nothing half written past it.
    assert store.get_tensor_with_parallelism_into("fr", dp, 64, _target("full", p)) is None


def test_batch_put_tensor_with_tp_from_then_batch_get_with_tp_into(store):
    """Mooncake's test_tensor_api pattern; before: AttributeError (no
    batch_put_tensor_with_tp_from)."""
    tensors = [torch.randn(8, 6) for _ in range(3)]
    blobs = [_blob(t) for t in tensors]
    srcs = [(ctypes.c_ubyte * len(b)).from_buffer_copy(b) for b in blobs]
    ptrs = [ctypes.addressof(s) for s in srcs]
    for p, b in zip(ptrs, blobs):
        assert store.register_buffer(p, len(b)) == 0
    keys = ["tpf%d" % i for i in range(3)]
    assert store.batch_put_tensor_with_tp_from(keys, ptrs, [len(b) for b in blobs],
                                               tp_rank=1, tp_size=2, split_dim=1) == [0, 0, 0]
    space = 4096
    dst = (ctypes.c_ubyte * (space * 6))()
    base = ctypes.addressof(dst)
    assert store.register_buffer(base, space * 6) == 0
    for rank in range(2):
        outs = store.batch_get_tensor_with_tp_into(
            keys, [base + (rank * 3 + i) * space for i in range(3)], [space] * 3,
            tp_rank=rank, tp_size=2)
        for i in range(3):
            assert torch.equal(outs[i], tensors[i].chunk(2, 1)[rank])
    # tp_size 1 is batch_put_tensor_from; mismatched lists are refused.
    assert store.batch_put_tensor_with_tp_from(["one"], ptrs[:1], [len(blobs[0])]) == [0]
    assert torch.equal(store.get_tensor("one"), tensors[0])
    assert store.batch_put_tensor_with_tp_from(keys, ptrs[:2], [1, 2, 3], tp_size=2) == [BAD] * 3


def test_replica_clear_of_one_segment(store, cluster):
    # Not a cluster member: one segment, its own.
    assert store.put("c", b"v") == 0
    assert store.batch_replica_clear(["c"], "no-such-segment") == []
    assert store.batch_replica_clear(["c"], store.get_hostname()) == ["c"]
    assert store.is_exist("c") == 0
    # In a cluster a segment is a member. A pure client (no segment)
    # holds no replica, nor does a name that is no member: nothing cleared.
    # The only owner holds every replica: clearing its segment clears the
    # object (Mooncake's test_clear_with_segment_name_self, issue 18;
    # both raised NotImplementedError before).
    node = cluster.start_node()
    cluster.wait_owners(1)
    m = mc.MooncakeDistributedStore()
    assert m.setup("127.0.0.1", "", "0", "16MB", "tcp", "", cluster.master,
                   kvengine_settings=dict(cluster.settings(), **QUIET)) == 0
    try:
        m.kv_lease_ttl_ms = 0
        assert m.put("c", b"v") == 0
        assert m.batch_replica_clear(["c"], m.get_hostname()) == []
        assert m.batch_replica_clear(["c"], "nonexistent_host:99999") == []
        assert m.is_exist("c") == 1
        assert m.batch_replica_clear(["c"], node) == ["c"]
        assert m.is_exist("c") == 0
        # With two owners one owner's copy cannot be dropped alone: it says so.
        node2 = cluster.start_node()
        cluster.wait_owners(2)
        assert m.put("c", b"v") == 0
        with pytest.raises(NotImplementedError, match="one owner's copy"):
            m.batch_replica_clear(["c"], node2)
        assert m.is_exist("c") == 1
        assert m.batch_replica_clear(["c"]) == ["c"]
    finally:
        m.close()


@pytest.mark.parametrize("other", [None, ("dp", 0, 2, None, None, None),
                                   ("pp", 1, 2, None, None, 3),
                                   ("ep", 0, 2, None, 5, None)])
def test_a_shard_read_with_another_tp_size_is_cut_from_the_stored_layout(store, other):
    # Mooncake's reshard on read: stored with tp 4, read as tp 2 (and tp 2
    # read as tp 4). Before, a single-tp read returned stored rank r's
    # shard of the other size, and a multi-axis one None.
    full = torch.arange(8 * 12 * 6, dtype=torch.float32).view(8, 12, 6)

    def par(rank, size):
        axes = [_axis("tp", rank, size, split_dim=1)]
        if other is not None:
            k, r, n, sd, eid, sid = other
            axes.append(_axis(k, r, n, split_dim=sd, expert_id=eid, stage_id=sid))
        return _par(*axes)

    key = "reshard-%s" % (other[0] if other else "tp")
    for rank in range(4):
        src = full.chunk(4, 1)[rank].contiguous() if other is None else full
        assert store.put_tensor_with_parallelism(key, src, par(rank, 4)) == 0
    for size in (2, 4, 3):
        for rank in range(size):
            got = store.get_tensor_with_parallelism(key, _target("shard", par(rank, size)))
            assert torch.equal(got, full.chunk(size, 1)[rank]), (size, rank)
    assert store.get_tensor_with_parallelism(key, _target("shard", par(0, 5))) is None
    # The _into form reads the same bytes into the caller's buffer.
    buf = (ctypes.c_ubyte * 8192)()
    got = store.get_tensor_with_parallelism_into(key, ctypes.addressof(buf), 8192,
                                                 _target("shard", par(1, 2)))
    assert torch.equal(got, full.chunk(2, 1)[1])


def test_axis_fields_mooncake_refuses(store):
    t = torch.zeros(8, 8)
    assert store.put_tensor_with_parallelism("bad", t, _par(_axis("dp", 0, 2, split_dim=0))) != 0
    assert store.put_tensor_with_parallelism("bad", t, _par(_axis("ep", 0, 2))) != 0
    assert store.put_tensor_with_parallelism("ok", t, _par(_axis("dp", 0, 2))) == 0
    assert store.put_tensor_with_parallelism("ok", t, _par(_axis("ep", 0, 2, expert_id=1))) == 0


def test_replica_clear_of_its_own_segment_named_localhost(cluster):
    # Mooncake's test_clear_with_segment_name_self: the only owner, set up
    # as "localhost", clears with get_hostname() ("localhost:<port>") while
    # its member record says 127.0.0.1:<port>. Before: nothing cleared.
    s = mc.MooncakeDistributedStore()
    assert s.setup("localhost", "", "16MB", "16MB", "tcp", "", cluster.master,
                   kvengine_settings=dict(cluster.settings(), **QUIET)) == 0, s.last_error
    try:
        s.kv_lease_ttl_ms = 0
        assert s.get_hostname().startswith("localhost:")
        assert s.put("mine", b"v") == 0
        assert s.batch_replica_clear(["mine"], s.get_hostname()) == ["mine"]
        assert s.is_exist("mine") == 0
    finally:
        s.close()
