"""``mooncake.mooncake_config``: the JSON/env configuration vLLM, SGLang and LMCache read.

``MooncakeConfig.from_file(path)`` reads a JSON object; ``MooncakeConfig.load_from_env()`` reads
the file named by ``MOONCAKE_CONFIG_PATH`` or, without one, the ``MOONCAKE_*`` variables
(``MOONCAKE_MASTER`` required). Sizes are bytes or strings such as "4GB", "512 mb", "1.5g",
every unit binary (GB = GiB), as the original reads them. Booleans may be strings ("true",
"off", "enable", ...); anything else is a ValueError, never a silent False. Protocols are
lower-cased; an unknown one is logged and passed on (the store decides).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from transfer.settings import parse_size

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB, the original's default
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

_KNOWN_PROTOCOLS = frozenset({
    "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex", "cxl",
    "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only",
})
_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")
_TRUE = ("true", "1", "yes", "on", "enable")
_FALSE = ("false", "0", "no", "off", "disable")


def _parse_segment_size(value: Any) -> int:
    """Bytes for an int, a float or a plain number as text (truncated, as the original does:
    "1e9", "3.5"), or a size with a unit in the project's one grammar ("4GB", "512 mb", "1.5g";
    every unit binary)."""
    if isinstance(value, bool):
        raise ValueError(f"Invalid segment size: {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip()
    try:
        size = int(float(text))
    except (ValueError, OverflowError):  # "nan" and "inf" too
        size = None
    try:
        if size is None:
            size = parse_size(text)
        if size < 0:
            raise ValueError(text)
        return size
    except ValueError:
        raise ValueError(f"Invalid segment size: {value!r} (expected e.g. 4096, 512MB or 3 GB)") from None


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    text = str(value).strip().lower()
    if not text:
        return False
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"Invalid boolean value: {value!r}")


@dataclass
class MooncakeConfig:
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: str
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r}. Protocol must be a non-empty "
                             "string, e.g. 'tcp' or 'rdma'.")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in _KNOWN_PROTOCOLS:
            logger.warning("Unrecognised protocol %r; passing it on (known: %s)",
                           self.protocol, ", ".join(sorted(_KNOWN_PROTOCOLS)))
        for name in ("global_segment_size", "local_buffer_size"):
            size = getattr(self, name)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"Invalid {name}: {size}. Size must be non-negative.")
        for name in _REQUIRED:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, got {value!r}.")

    @staticmethod
    def from_file(file_path: str) -> MooncakeConfig:
        with open(file_path) as f:
            config = json.load(f)
        for name in _REQUIRED:
            if name not in config:
                raise ValueError(f"Missing required config field: {name}")
        return MooncakeConfig(
            local_hostname=config["local_hostname"],
            metadata_server=config["metadata_server"],
            global_segment_size=_parse_segment_size(config.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_parse_segment_size(config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=config.get("protocol", "tcp"),
            device_name=config.get("device_name") or "",
            master_server_address=config["master_server_address"],
            enable_ssd_offload=_parse_bool(config.get("enable_ssd_offload", False)),
            ssd_offload_path=config.get("ssd_offload_path") or "",
            tenant_id=config.get("tenant_id") or "default",
            enable_client_http_server=_parse_bool(config.get("enable_client_http_server", False)),
            client_http_port=int(config.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_env() -> MooncakeConfig:
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path:
            return MooncakeConfig.from_file(path)
        if not os.getenv("MOONCAKE_MASTER"):
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor "
                             "'MOONCAKE_MASTER' is set.")
        env = os.getenv
        return MooncakeConfig(
            local_hostname=env("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_parse_segment_size(env("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_parse_segment_size(env("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=env("MOONCAKE_PROTOCOL", "tcp"),
            device_name=env("MOONCAKE_DEVICE", ""),
            master_server_address=env("MOONCAKE_MASTER"),
            enable_ssd_offload=_parse_bool(env("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=_parse_bool(env("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")),
            client_http_port=int(env("MOONCAKE_CLIENT_HTTP_PORT", 9300)),
        )
