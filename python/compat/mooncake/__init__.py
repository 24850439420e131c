"""mooncake — a stand-in for Mooncake's Python package, backed by kvengine.

Only `mooncake.store` is provided (kvengine.mooncake under Mooncake's
name), so that code written for Mooncake Store runs unchanged with
python/compat on PYTHONPATH. Not installed into dist-packages, where it
would shadow a real Mooncake.
"""
