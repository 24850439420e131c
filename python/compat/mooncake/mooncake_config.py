"""mooncake.mooncake_config — MooncakeConfig: a store's setup arguments from
a JSON file or the environment, as Mooncake's wheel documents them.

    cfg = MooncakeConfig.load_from_env()      # $MOONCAKE_CONFIG_PATH, else $MOONCAKE_*
    store.setup(cfg.local_hostname, cfg.metadata_server, cfg.global_segment_size,
                cfg.local_buffer_size, cfg.protocol, cfg.device_name,
                cfg.master_server_address)

A file is JSON with the field names below (sizes as ints or "4GB");
local_hostname, metadata_server and master_server_address are required and
non-empty. The environment form reads MOONCAKE_MASTER (required),
MOONCAKE_LOCAL_HOSTNAME, MOONCAKE_TE_META_DATA_SERVER, MOONCAKE_PROTOCOL,
MOONCAKE_DEVICE, MOONCAKE_GLOBAL_SEGMENT_SIZE, MOONCAKE_LOCAL_BUFFER_SIZE,
MOONCAKE_OFFLOAD_ENABLED, MOONCAKE_OFFLOAD_FILE_STORAGE_PATH,
MOONCAKE_TENANT_ID, MOONCAKE_ENABLE_CLIENT_HTTP_SERVER and
MOONCAKE_CLIENT_HTTP_PORT. The protocol is lowercased; one not known to
Mooncake only warns.
"""
import dataclasses
import json
import logging
import os
from typing import Optional

from kvengine.mooncake import parse_size

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200   # 3.125 GiB, Mooncake's default
DEFAULT_LOCAL_BUFFER_SIZE = 1 << 30
_KNOWN = {"tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex",
          "cxl", "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only"}
_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")


def _bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on", "enable",
                                                    "enabled"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off", "", "disable",
                                                    "disabled"):
        return False
    raise ValueError("Invalid boolean value: %r" % (v,))


def _size(v):
    """Bytes from an int, a float (truncated), or a string: a number
    ("1024", "1e9", "1.5") or one with a binary unit ("4GB", "512 mb")."""
    if isinstance(v, bool):
        raise ValueError("Invalid segment size: %r" % (v,))
    if isinstance(v, float):
        return int(v)
    if isinstance(v, str):
        t = v.strip()
        if not t:
            raise ValueError("Invalid segment size: empty string")
        try:
            return int(float(t))          # "1024", "1e9", "1.5"
        except OverflowError:
            raise ValueError("Invalid segment size: %r" % (v,)) from None
        except ValueError:
            pass
        try:
            return parse_size(t.lower().replace(" ", ""))
        except ValueError:
            raise ValueError("Invalid segment size: %r" % (v,)) from None
    return parse_size(v)


@dataclasses.dataclass
class MooncakeConfig:
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self):
        for f in ("global_segment_size", "local_buffer_size"):
            try:
                n = _size(getattr(self, f))
            except ValueError as exc:
                raise ValueError("%s: %s" % (f, exc)) from None
            if n < 0:
                raise ValueError("%s must not be negative, got %d" % (f, n))
            setattr(self, f, n)
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError("Invalid protocol: %r" % (self.protocol,))
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in _KNOWN:
            logger.warning("Unrecognised protocol %r: passed through (Mooncake's C++ layer "
                           "decides what it supports)", self.protocol)
        if self.tenant_id is None:
            self.tenant_id = "default"
        if self.ssd_offload_path is None:
            self.ssd_offload_path = ""
        self.enable_ssd_offload = _bool(self.enable_ssd_offload)
        self.enable_client_http_server = _bool(self.enable_client_http_server)
        self.client_http_port = int(self.client_http_port)
        if not 0 < self.client_http_port < 65536:
            raise ValueError("client_http_port must be in 1..65535, got %d"
                             % self.client_http_port)
        for f in _REQUIRED:
            v = getattr(self, f)
            if not isinstance(v, str) or not v.strip():
                raise ValueError("Missing required config field: %s" % f)

    @staticmethod
    def from_file(file_path):
        with open(file_path) as f:
            d = json.load(f)
        for f in _REQUIRED:
            if f not in d:
                raise ValueError("Missing required config field: %s" % f)
        return MooncakeConfig(
            local_hostname=d["local_hostname"], metadata_server=d["metadata_server"],
            global_segment_size=d.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE),
            local_buffer_size=d.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE),
            protocol=d.get("protocol", "tcp"), device_name=d.get("device_name", ""),
            master_server_address=d["master_server_address"],
            enable_ssd_offload=d.get("enable_ssd_offload", False),
            ssd_offload_path=d.get("ssd_offload_path", ""),
            tenant_id=d.get("tenant_id", "default"),
            enable_client_http_server=d.get("enable_client_http_server", False),
            client_http_port=d.get("client_http_port", 9300))

    @staticmethod
    def load_from_env():
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path:
            return MooncakeConfig.from_file(path)
        if not os.getenv("MOONCAKE_MASTER"):
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor "
                             "'MOONCAKE_MASTER' is set.")
        e = os.getenv
        return MooncakeConfig(
            local_hostname=e("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=e("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=e("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE),
            local_buffer_size=e("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE),
            protocol=e("MOONCAKE_PROTOCOL", "tcp"), device_name=e("MOONCAKE_DEVICE", ""),
            master_server_address=e("MOONCAKE_MASTER"),
            enable_ssd_offload=e("MOONCAKE_OFFLOAD_ENABLED", "false"),
            ssd_offload_path=e("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=e("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=e("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false"),
            client_http_port=int(e("MOONCAKE_CLIENT_HTTP_PORT", 9300)))


# The names Mooncake's own module has for its two parsers.
_parse_segment_size = _size
_parse_bool = _bool
