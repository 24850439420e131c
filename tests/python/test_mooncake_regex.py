"""test_mooncake_regex.py — the Mooncake drop-in's remove_by_regex (issue
18): Mooncake matches every key with std::regex_search and returns how many
objects it removed, skipping leased ones unless force. kvengine cannot list
keys, so a pattern that names a key prefix ("^literal", "^literal.*",
"^literal.*$") is one prefix removal and any other raises
NotImplementedError. Written from Mooncake's documented behaviour."""


import pytest

import kvengine.mooncake as mc
from conftest import mooncake_embedded_store

HAS_LEASE = -706
BAD = -600


def _store(**kw):
    return mooncake_embedded_store("32MB", "16MB", **kw)


@pytest.fixture
def store():
    s = _store()
    s.kv_lease_ttl_ms = 0      # leases where a test sets them
    yield s
    s.close()


def _put(store, keys):
    assert store.put_batch(keys, [k.encode() for k in keys]) == 0


def _present(store, keys):
    return [k for k, e in zip(keys, store.batch_is_exist(keys)) if e == 1]


@pytest.mark.parametrize("tail", ["", ".*", ".*$"])
def test_a_prefix_pattern_removes_that_prefix_and_counts(store, tail):
    target = ["regex_target_%d" % i for i in range(5)]
    other = ["regex_safe_%d" % i for i in range(3)] + ["xregex_target_0", "regex_targe"]
    _put(store, target + other)
    assert store.remove_by_regex("^regex_target_" + tail) == 5
    assert _present(store, target) == []
    assert _present(store, other) == other
    assert store.remove_by_regex("^regex_target_" + tail) == 0     # nothing left


def test_escaped_metacharacters_are_literal(store):
    keys = ["a.b/1", "a.b/2", "axb/1", "a.b+c", "a.bb+c", "a(1)", "a1"]
    _put(store, keys)
    assert store.remove_by_regex(r"^a\.b/") == 2              # not axb/1
    assert _present(store, keys) == ["axb/1", "a.b+c", "a.bb+c", "a(1)", "a1"]
    assert store.remove_by_regex(r"^a\.b\+c.*$") == 1
    assert store.remove_by_regex(r"^a\(") == 1
    assert _present(store, keys) == ["axb/1", "a.bb+c", "a1"]


def test_a_leased_object_stays_unless_forced(store):
    _put(store, ["lease/a", "lease/b", "lease/c", "other"])
    store.kv_lease_ttl_ms = 60000
    assert store.get("lease/b") == b"lease/b"                 # a read leases it
    assert store.remove_by_regex("^lease/.*") == 2            # as remove() refuses it
    assert _present(store, ["lease/a", "lease/b", "lease/c"]) == ["lease/b"]
    assert store.get("lease/b") == b"lease/b"                 # kept whole
    assert store.remove("lease/b") == HAS_LEASE
    assert store.remove_by_regex("^lease/", force=True) == 1
    assert _present(store, ["lease/b", "other"]) == ["other"]


def test_a_soft_pinned_object_stays_and_its_pin_goes_with_it(store):
    pin = mc.ReplicateConfig(with_soft_pin=True, soft_pin_ttl_ms=60000)
    assert store.put("pin/a", b"a", pin) == 0
    assert store.put("pin/b", b"b") == 0
    assert store.remove_by_regex("^pin/") == 1
    assert _present(store, ["pin/a", "pin/b"]) == ["pin/a"]
    assert store.remove_by_regex("^pin/", force=True) == 1
    # The pin went with the object: the same key put again is not pinned.
    assert store.put("pin/a", b"again") == 0
    assert store.remove("pin/a") == 0


def test_tenants_are_kept_apart():
    a = _store(tenant_id="alpha")
    try:
        a.kv_lease_ttl_ms = 0
        alpha = a._prefix
        _put(a, ["t/1", "t/2"])
        a._prefix = mc._tenant_prefix("beta")       # the same engine, as tenant beta
        _put(a, ["t/1", "t/3"])
        a._prefix = b""                              # the default tenant: unprefixed
        _put(a, ["t/9"])
        assert a.remove_by_regex("^t/.*") == 1       # its own key only
        a._prefix = alpha
        assert a.remove_by_regex("^t/") == 2
        assert _present(a, ["t/1", "t/2"]) == []
        a._prefix = mc._tenant_prefix("beta")
        assert _present(a, ["t/1", "t/3"]) == ["t/1", "t/3"]
        assert a.remove_by_regex("^") == 2            # every beta object: remove_all
        assert _present(a, ["t/1", "t/3"]) == []
    finally:
        a.close()


@pytest.mark.parametrize("pattern", [
    "regex_target_.*",     # unanchored: matches anywhere in a key
    "^a.b",                # an unescaped "."
    "^a\\d",               # a class
    "^a|^b",               # an alternation
    "^ab$",                # a whole key
    "^a[bc]",
    "^a+",
])
def test_other_patterns_raise_naming_why(store, pattern):
    _put(store, ["ab", "abc"])
    with pytest.raises(NotImplementedError, match="remove_by_regex.*no listing of keys"):
        store.remove_by_regex(pattern)
    assert _present(store, ["ab", "abc"]) == ["ab", "abc"]


def test_a_pattern_that_is_no_regex_is_invalid_params(store):
    assert store.remove_by_regex("^a(") == BAD
    assert store.remove_by_regex("[") == BAD


def test_the_prefix_parse():
    assert mc._regex_prefix("^abc") == b"abc"
    assert mc._regex_prefix("^abc.*") == b"abc"
    assert mc._regex_prefix("^abc.*$") == b"abc"
    assert mc._regex_prefix(r"^a\.\*\$\\") == b"a.*$\\"
    assert mc._regex_prefix(r"^a\.*") is None        # "\." then "*": dots repeated
    assert mc._regex_prefix("^caf\u00e9/") == "caf\u00e9/".encode()
    assert mc._regex_prefix(b"^k/") == b"k/"
    assert mc._regex_prefix("^") == b""
    for p in ("abc", "^a\\", "^a\\w", "^a\\1", "^a.", "^a*", "^a?", "^a{2}", "^(a)"):
        assert mc._regex_prefix(p) is None, p


def test_not_set_up_is_an_error():
    s = mc.MooncakeDistributedStore()
    assert s.remove_by_regex("^k") < 0
