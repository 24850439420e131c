"""test_mooncake_async.py — mooncake.async_store (issue 18): every store
call x is also the coroutine async_x, run off the event loop, concurrent
calls included; a name the store lacks is still an AttributeError.
Mooncake's scripts/test_async_store.py could not import it before.
Written from Mooncake's documented async store."""
import asyncio

import pytest

from mooncake.async_store import MooncakeDistributedStoreAsync

QUIET = {"dram.hugepages": "off", "log.level": "warn"}


def test_async_calls_are_the_store_calls():
    s = MooncakeDistributedStoreAsync()
    assert s.setup("localhost", "", "32MB", "16MB", "tcp", "", "", kvengine_settings=QUIET) == 0
    s.kv_lease_ttl_ms = 0

    async def go():
        assert await s.async_put("a", b"one") == 0
        assert await s.async_get("a") == b"one"
        keys = ["k%d" % i for i in range(16)]
        rcs = await asyncio.gather(*(s.async_put(k, k.encode()) for k in keys))
        assert rcs == [0] * 16
        assert await s.async_batch_is_exist(keys + ["none"]) == [1] * 16 + [0]
        got = await asyncio.gather(*(s.async_get(k) for k in keys))
        assert got == [k.encode() for k in keys]
        assert await s.async_remove("a") == 0
        assert await s.async_is_exist("a") == 0
        assert await s.async_remove_all() == 16
    try:
        asyncio.run(go())
        assert s.get("k1") == b""
        with pytest.raises(AttributeError):
            s.async_no_such_call
        with pytest.raises(AttributeError):
            s.no_such_call
    finally:
        s.close()
