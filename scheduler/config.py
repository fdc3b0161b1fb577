"""SchedulerConfig: the settings the policy reads, typed, in one place.

Built from the registry's Config (``SchedulerConfig.from_config``) or directly in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from scheduler.errors import SettingError

POLICIES = ("random", "load", "cache", "kvcentric")
ADMISSIONS = ("none", "early", "predictive")


def parse_threshold(text: Any) -> int | None:
    """Tokens from ``"1024"`` / ``1024``; None for ``"auto"``."""
    if text is None or str(text).strip().lower() == "auto":
        return None
    value = int(str(text).strip())
    if value < 0:
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class SchedulerConfig:
    block_tokens: int = 512
    hash_seed: int = 0
    threshold: int | None = None  # None: auto
    policy: str = "kvcentric"
    admission: str = "predictive"
    ttft_slo: float = 30.0  # 0: no TTFT SLO
    tbt_slo: float = 0.1  # 0: no TBT SLO
    bytes_per_token: int = 327680
    bandwidth: float = 12.5e9
    transfers: bool = True  # False: cache_scope local, no prefix moves between instances
    seed: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {self.admission!r}")

    @classmethod
    def from_config(cls, config: Any) -> SchedulerConfig:
        try:
            threshold = parse_threshold(config.kvcache_balancing_threshold)
        except ValueError:
            raise SettingError("kvcache_balancing_threshold", config.kvcache_balancing_threshold,
                               "a token count such as 1024, or auto") from None
        return cls(
            block_tokens=config.kv_block_tokens, hash_seed=config.block_hash_seed,
            threshold=threshold, policy=config.schedule_policy,
            admission=config.admission_policy, ttft_slo=config.ttft_slo, tbt_slo=config.tbt_slo,
            bytes_per_token=config.kv_bytes_per_token, bandwidth=float(config.kv_transfer_bandwidth),
            transfers=config.cache_scope == "global",
        )

    def with_(self, **changes: Any) -> SchedulerConfig:
        return replace(self, **changes)
