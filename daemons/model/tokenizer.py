"""A byte-level tokenizer: ids 0..255 are bytes, then BOS, EOS and PAD.

It needs no vocabulary file, so the tiny random model runs anywhere, and every string (any
language, any bytes) round-trips exactly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ByteTokenizer:
    bos_token_id: int = 256
    eos_token_id: int = 257
    pad_token_id: int = 258

    @property
    def vocab_size(self) -> int:
        return 259

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_bos else ids

    def decode(self, token_ids: list[int]) -> str:
        # Special tokens carry no text; a multi-byte character cut in half decodes as U+FFFD.
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")
