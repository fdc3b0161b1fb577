"""The dataclasses that pass between the conductor, its callers and the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Hashable, Sequence

# Why a request went where it went (or nowhere). Stable strings: they appear in --json output.
LOCAL_HIT = "local_hit"  # reused the chosen instance's own prefix; nothing longer elsewhere
TRANSFER = "transfer"  # the chosen instance pulls a longer prefix from another location
RECOMPUTE = "recompute"  # a longer prefix exists elsewhere but recomputing it is faster
MISS = "miss"  # no block of the prompt is cached anywhere
REJECT_TTFT = "reject_ttft"  # no prefill instance can meet the TTFT SLO
REJECT_TBT = "reject_tbt"  # decode is (or is predicted to be) too loaded to meet the TBT SLO
REJECT_DECODE = "reject_decode"  # rejected after prefill: no decode instance could take it

REJECTIONS = (REJECT_TTFT, REJECT_TBT, REJECT_DECODE)


@dataclass(frozen=True)
class ScheduleRequest:
    request_id: str
    block_keys: Sequence[Hashable]  # prefix hash chain of the prompt, one key per block
    input_length: int  # tokens
    expected_output: int = 0  # tokens; only for the decode context reservation


@dataclass
class Decision:
    request_id: str
    reason: str
    prefill_id: str | None = None
    decode_id: str | None = None
    prefix_tokens: int = 0  # tokens the prefill reuses (local plus transferred)
    local_tokens: int = 0  # of those, already on the prefill instance
    transfer_from: str | None = None
    transfer_keys: tuple[Hashable, ...] = ()  # blocks to pull and keep (hot-block replication)
    predicted_transfer: float = 0.0
    predicted_queue: float = 0.0
    predicted_prefill: float = 0.0
    predicted_ttft: float = 0.0
    decode_load: float = 0.0  # TBT / TBT_SLO seen (or forecast) by admission
    candidates: dict[str, float] = field(default_factory=dict)  # prefill_id -> predicted TTFT

    @property
    def accepted(self) -> bool:
        return self.reason not in REJECTIONS

    @property
    def transfer_tokens(self) -> int:
        return self.prefix_tokens - self.local_tokens
