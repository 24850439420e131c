"""mooncake.mooncake_store_service — Mooncake's store service (an aiohttp REST
daemon: mount and unmount of shared-memory and local-disk segments into
Mooncake's master, plus put/get/exist/remove over HTTP) is not provided.

Its core is segment mounting, which has no counterpart here: a kvengine
store's DRAM is one segment sized by dram.capacity and its SSD tier is
ssd.path, both fixed when the engine opens (mount_segment and the like
raise NotImplementedError on the drop-in's store). The host's store
daemon is kvnode (store.name / ssd.path), and kvctl reads and removes keys.
Importing the module says so, instead of a ModuleNotFoundError.
"""
raise NotImplementedError(
    "mooncake.mooncake_store_service: Mooncake's REST service mounts segments into "
    "Mooncake's master; kvengine's segments are fixed when an engine opens (dram.capacity, "
    "ssd.path). Run kvnode as the host's store daemon and use kvctl to look keys up")
