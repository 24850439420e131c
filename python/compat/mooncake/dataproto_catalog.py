"""mooncake.dataproto_catalog — Mooncake's DataProtoCatalog (logical rows and
fields to rows of stored DataProto handles; kvengine.mooncake_catalog)."""
from kvengine.mooncake_catalog import DataProtoCatalog  # noqa: F401

__all__ = ["DataProtoCatalog"]
