"""The engine's tunables as one plain value, filled from the settings registry or by hand."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from transfer.auth import Credential, TenantCredential, client_credential
from transfer.settings import Config, resolve


@dataclass(frozen=True)
class EngineOptions:
    protocol: str = "auto"
    slice_size: int = 1 << 20
    slice_threshold: int = 1 << 20
    streams_per_path: int = 2
    endpoint_pool_size: int = 256
    handshake_timeout: float = 5.0
    transfer_timeout: float = 30.0
    slice_timeout: float = 5.0
    tcp_busy_poll: float = 200e-6
    retry_count: int = 9
    path_cooldown: float = 30.0
    shm_copy_threads: int = 2
    rdma_slice_size: int = 64 << 10
    rdma_gid_index: int = -1
    rdma_mtu: int = 0
    rdma_qps_per_endpoint: int = 2
    metadata_ttl: float = 300.0  # our descriptor is published again every fifth of it
    shm_prefix: str = "mooncake-te-"  # a cluster's daemons pass daemons.cluster.workdir.shm_prefix(cluster_id)
    # Required of peers by the engine's control server and TCP target, and proven to theirs. An
    # engine given a tenant's credential (transfer.auth) moves bytes over TCP only: shared memory
    # is one OS user's, and no check could keep a tenant process from mapping another's segment.
    secret: Credential | None = None

    def __post_init__(self) -> None:
        if isinstance(self.secret, TenantCredential) and self.protocol != "tcp":
            object.__setattr__(self, "protocol", "tcp")

    @classmethod
    def from_config(cls, config: Config | None = None, **overrides: Any) -> EngineOptions:
        """Options from resolved settings (defaults, env, file, flags), then ``overrides``."""
        config = config or resolve()
        values = {f.name: config[_SETTING.get(f.name, f.name)] for f in fields(cls)
                  if _SETTING.get(f.name, f.name) in config.values}
        values["secret"] = client_credential(config)
        values.update(overrides)
        return cls(**values)


_SETTING = {"protocol": "transfer_protocol"}  # option name -> settings registry name
