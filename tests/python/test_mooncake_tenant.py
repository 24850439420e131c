"""test_mooncake_tenant.py — a Mooncake tenant's remove_all on kv_remove_prefix
(issue 18): every object of the tenant goes, whoever put it, and nothing of
another tenant's; Engine.remove_prefix itself. Written from Mooncake's
documented behaviour (RemoveAll(tenant_id, force): the tenant's objects,
leased ones kept unless forced)."""

import pytest

import kvengine
import kvengine.mooncake as mc

QUIET = {"dram.hugepages": "off", "log.level": "warn"}


def _client(cluster, tenant):
    s = mc.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "", "0", "16MB", "tcp", "", cluster.master, tenant_id=tenant,
                 kvengine_settings=dict(cluster.settings(), **QUIET))
    assert rc == 0, s.last_error
    s.kv_lease_ttl_ms = 0        # no read leases: each test says what it leases
    return s


def test_engine_remove_prefix(engine):
    for i in range(20):
        engine.put("t/%d" % i, b"v")
        engine.put("u/%d" % i, b"v")
    engine.put("t", b"shorter than the prefix")
    assert engine.remove_prefix("t/") == 20
    assert engine.remove_prefix(b"t/") == 0
    assert engine.get("t/3") is None and engine.get("u/3") == b"v"
    assert engine.get("t") == b"shorter than the prefix"
    with pytest.raises(kvengine.KvError):
        engine.remove_prefix(b"x" * 251)
    assert engine.remove_prefix(b"") == 21      # everything: remove_all


def test_tenant_remove_all_takes_what_other_processes_put(cluster):
    """Before: alpha's remove_all removed only the objects its own store had
    put (3 of 5), leaving those of alpha's other client."""
    cluster.start_node()
    cluster.wait_owners(1)
    a1, a2, b = (_client(cluster, "alpha"), _client(cluster, "alpha"),
                 _client(cluster, "beta"))
    try:
        for i in range(3):
            assert a1.put("k%d" % i, b"a1") == 0
        for i in range(3, 5):
            assert a2.put("k%d" % i, b"a2") == 0
        assert b.put("k0", b"beta") == 0
        a1._leases.clear()
        a2._leases.clear()
        assert a1.remove_all() == 5
        assert a2.batch_is_exist(["k%d" % i for i in range(5)]) == [0] * 5
        assert b.get("k0") == b"beta"
        assert a2.remove_all() == 0
        # A key that spells another tenant's prefix is still this tenant's.
        assert b.put("alpha", b"beta's") == 0
        assert a1.remove_all(force=True) == 0
        assert b.get("alpha") == b"beta's"
    finally:
        for s in (a1, a2, b):
            s.close()


def test_tenant_remove_all_keeps_own_leases_and_pins_unless_forced(cluster):
    cluster.start_node()
    cluster.wait_owners(1)
    a1, a2 = _client(cluster, "gamma"), _client(cluster, "gamma")
    try:
        pin = mc.ReplicateConfig(with_soft_pin=True, soft_pin_ttl_ms=60000)
        assert a1.put("pinned", b"p", pin) == 0
        assert a1.put("plain", b"x") == 0
        assert a2.put("read", b"r") == 0
        a1.kv_lease_ttl_ms = 60000
        assert a1.get("read") == b"r"           # a1's read lease
        # a1's lease and pin keep those two (put back, not counted); the
        # pin record is not counted as an object either.
        assert a1.remove_all() == 1
        assert a2.batch_is_exist(["pinned", "read", "plain"]) == [1, 1, 0]
        assert a1.get("pinned") == b"p" and a1.remove("pinned") == -706
        # Forced, from the other client: both go, and the pin record too,
        # uncounted.
        assert a2.remove_all(force=True) == 2
        assert a1.batch_is_exist(["pinned", "read"]) == [0, 0]
        assert a2.put("pinned", b"new") == 0
        assert a2.remove("pinned") == 0         # no pin left in the store
    finally:
        a1.close()
        a2.close()
