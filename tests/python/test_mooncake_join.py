"""test_mooncake_join.py — a member that joins reads what the others stored
before it came (issue 18: "a second member's reads just after setup(),
before its view settles"). Its first view makes it the owner of about half
the keys, whose values are still on the member that stored them until
re-replication copies them: its reads now ask that member too, as reads do
during any move window. Before the fix (net/cluster.c: the join window,
and the size calls asking previous owners) about half of these reads
missed. Written from Mooncake's behaviour: an object put is readable from
every client."""
import ctypes

import kvengine.mooncake as mc

QUIET = {"dram.hugepages": "off", "log.level": "warn"}


def _member(cluster, pool="32MB"):
    s = mc.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", pool, "16MB", "tcp", "", cluster.master,
                   kvengine_settings=dict(cluster.settings(), **QUIET)) == 0, s.last_error
    s.kv_lease_ttl_ms = 0
    return s


def test_a_new_member_reads_what_was_stored_before_it_joined(cluster):
    a = _member(cluster)
    b = None
    try:
        keys = ["before-join-%d" % i for i in range(64)]
        for k in keys:
            assert a.put(k, k.encode()) == 0
        b = _member(cluster)                      # read at once, no wait
        assert [b.get(k) for k in keys] == [k.encode() for k in keys]
        assert [b.get_size(k) for k in keys] == [len(k) for k in keys]
        assert b.batch_is_exist(keys) == [1] * len(keys)
        buf = (ctypes.c_ubyte * (64 * 32))()
        base = ctypes.addressof(buf)
        got = b.batch_get_into(keys, [base + 32 * i for i in range(64)], [32] * 64)
        assert got == [len(k) for k in keys]
        assert bytes(buf[:len(keys[0])]) == keys[0].encode()
        # A remove from the newcomer removes the object wherever it is.
        assert b.remove(keys[0]) == 0
        assert a.get(keys[0]) == b"" and b.get(keys[0]) == b""
    finally:
        if b is not None:
            b.close()
        a.close()
