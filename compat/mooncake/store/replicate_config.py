"""``ReplicateConfig`` and ``SoftPinAction``: how a put asks to be placed and kept.

The fields are the original's, settable as attributes. They are checked when a put uses them,
as the original does, so a bad config makes that put return INVALID_PARAMS (-600) rather than
raise: ``replica_num`` must be at least 1; ``soft_pin_ttl_ms`` may only be set with
``soft_pin_action = SoftPinAction.ENABLE`` and must then be positive. Assigning
``soft_pin_ttl_ms`` anything but None or an unsigned 64-bit integer raises TypeError at once,
as the original's binding does.
"""

from __future__ import annotations

import enum
from typing import Any

from mooncake._setup_args import SetupError


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0  # a new object is not soft-pinned
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    def __init__(self) -> None:
        self.replica_num = 1
        self.preferred_segment = ""
        self.preferred_segments: list[str] = []
        self.soft_pin_action = SoftPinAction.PRESERVE
        self._soft_pin_ttl_ms: int | None = None
        self.with_hard_pin = False

    @property
    def soft_pin_ttl_ms(self) -> int | None:
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value: int | None) -> None:
        # The original's field is an optional uint64: pybind refuses anything else with TypeError.
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 <= value < 1 << 64):
            raise TypeError(f"soft_pin_ttl_ms must be None or an integer in [0, 2**64), not {value!r}")
        self._soft_pin_ttl_ms = value

    def preferred(self) -> list[str]:
        """The segments asked for, the single field first as the original reads it."""
        return [self.preferred_segment] if self.preferred_segment else list(self.preferred_segments)

    def replication(self) -> dict[str, Any]:
        """Our StoreClient's replication keywords, without preferred segments (the store maps
        those names to segment ids); SetupError for a config the original refuses."""
        if not isinstance(self.replica_num, int) or self.replica_num < 1:
            raise SetupError(f"replica_num must be at least 1, not {self.replica_num!r}")
        action = SoftPinAction(self.soft_pin_action)
        ttl = self.soft_pin_ttl_ms
        if ttl is not None and (action != SoftPinAction.ENABLE or ttl <= 0):
            raise SetupError("soft_pin_ttl_ms needs soft_pin_action ENABLE and a positive value")
        return {"replicas": self.replica_num, "soft_pin": action == SoftPinAction.ENABLE,
                "soft_pin_ttl": None if ttl is None else ttl / 1000, "hard_pin": bool(self.with_hard_pin)}

    def __repr__(self) -> str:
        return (f"ReplicateConfig(replica_num={self.replica_num}, preferred={self.preferred()}, "
                f"soft_pin_action={SoftPinAction(self.soft_pin_action).name}, "
                f"soft_pin_ttl_ms={self.soft_pin_ttl_ms}, with_hard_pin={self.with_hard_pin})")
