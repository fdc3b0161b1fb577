"""One request's state on a worker: its tokens, its pages and how far its KV reaches."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Container, Hashable

from scheduler.block_hash import BlockKey, prefix_block_keys


@dataclass
class Sequence:
    seq_id: Hashable
    token_ids: list[int]
    num_prompt_tokens: int
    max_tokens: int
    block_table: list[int] = field(default_factory=list)
    # Leading tokens whose KV is in this worker's pages: loaded prefix blocks, then whatever
    # prefill and decode have computed. The next forward pass starts here.
    num_kv_tokens: int = 0
    finish_reason: str | None = None  # "stop" (a stop token) or "length" (max_tokens), or a failure

    @classmethod
    def from_prompt(cls, seq_id: Hashable, prompt_tokens: list[int], max_tokens: int) -> Sequence:
        if not prompt_tokens:
            raise ValueError("prompt_tokens must not be empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        return cls(seq_id, list(prompt_tokens), len(prompt_tokens), max_tokens)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def generated(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def block_keys(self, block_size: int, *, seed: int = 0, salt: bytes = b"") -> list[BlockKey]:
        """Store keys of the prompt's full blocks: key i names the KV in ``block_table[i]``.
        Generated tokens get no keys; their KV comes from decode and is never shared."""
        return prefix_block_keys(self.token_ids[:self.num_prompt_tokens], block_size, seed=seed, salt=salt)

    def append(self, token: int, stop_token_ids: Container[int]) -> None:
        """Add a sampled token; the sequence finishes on a stop token (kept in the output) or at
        max_tokens."""
        self.token_ids.append(token)
        if token in stop_token_ids:
            self.finish_reason = "stop"
        elif len(self.generated) >= self.max_tokens:
            self.finish_reason = "length"
