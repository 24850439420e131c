"""mooncake.async_store — Mooncake's asyncio face of the store:
MooncakeDistributedStoreAsync is the store, and every call `x` of it is
also `async_x`, a coroutine that runs `x` in the event loop's default
executor (a thread), so a slow call never blocks the loop. The store's
calls are safe from many threads at once (kvengine's API is), so
coroutines may run concurrently, as asyncio.gather in Mooncake's own
async tests does.
"""
import asyncio
import functools

from kvengine.mooncake import MooncakeDistributedStore


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    def __getattr__(self, name):
        # Only names the store lacks reach here: async_<call> for a call it has.
        if name.startswith("async_"):
            call = getattr(self, name[len("async_"):], None)
            if callable(call):
                async def run(*args, **kwargs):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(None, functools.partial(call, *args,
                                                                              **kwargs))
                run.__name__ = name
                run.__doc__ = "Coroutine of %s (run in the loop's executor)." % name[6:]
                return run
        raise AttributeError("%r object has no attribute %r" % (type(self).__name__, name))
