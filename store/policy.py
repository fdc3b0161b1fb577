"""The policy values the master state machine runs under.

The state machine never reads the settings registry: the daemon builds a :class:`StorePolicy`
(usually with :meth:`StorePolicy.from_config`) and passes it in, so tests can state every value.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any
from collections.abc import Mapping

from store.errors import InvalidParams
from store.tenants import parse_quotas

ALLOCATION_STRATEGIES = ("random", "free_ratio_first", "local_first")
OFFLOAD_POLICIES = ("evicted", "all")


@dataclass(frozen=True)
class StorePolicy:
    lease_ttl: float = 10.0
    soft_pin_ttl: float = 30 * 60.0
    max_soft_pin_ttl: float = 24 * 3600.0
    allow_evict_soft_pinned: bool = True
    high_watermark: float = 0.90
    eviction_ratio: float = 0.05
    allocation_strategy: str = "random"
    client_ttl: float = 10.0
    put_start_discard_timeout: float = 30.0
    alignment: int = 64
    max_key_length: int = 4096  # bytes of UTF-8; a 1 MiB key is a mistake, not a key
    offload_policy: str = "evicted"
    tenant_quotas: str = ""  # "name=size,...": see store.tenants
    default_tenant_quota: int = 0  # bytes; 0: unlimited

    def __post_init__(self) -> None:
        if self.allocation_strategy not in ALLOCATION_STRATEGIES:
            raise InvalidParams(f"allocation_strategy must be one of {', '.join(ALLOCATION_STRATEGIES)}")
        if self.offload_policy not in OFFLOAD_POLICIES:
            raise InvalidParams(f"offload_policy must be one of {', '.join(OFFLOAD_POLICIES)}")
        if not 0.0 < self.high_watermark <= 1.0 or not 0.0 <= self.eviction_ratio <= 1.0:
            raise InvalidParams("high_watermark must be in (0, 1] and eviction_ratio in [0, 1]")
        if min(self.lease_ttl, self.soft_pin_ttl, self.client_ttl, self.put_start_discard_timeout) < 0:
            raise InvalidParams("durations must be >= 0")
        if self.max_soft_pin_ttl < self.soft_pin_ttl:
            raise InvalidParams("max_soft_pin_ttl must be >= soft_pin_ttl")
        parse_quotas(self.tenant_quotas)  # refused at start, not at the first put
        if self.default_tenant_quota < 0:
            raise InvalidParams("default_tenant_quota must be >= 0 (0: unlimited)")

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any) -> StorePolicy:
        """Take every field that the settings registry (or any mapping) has a value for."""
        values = config if isinstance(config, Mapping) else config.values
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
