"""Tokenizers: what turns prompts and chat messages into token ids and generated ids back into text.

Every tokenizer here has the shape of :class:`Tokenizer`, so the front end never asks which one it
holds: a checkpoint's own is :class:`daemons.model.hf_tokenizer.HfTokenizer`, and
:class:`ByteTokenizer` serves the tiny random model: ids 0..255 are bytes, then BOS, EOS
and PAD; it needs no vocabulary file, so the model runs anywhere, and every string (any language,
any bytes) round-trips exactly.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Protocol


class Detokenizer(Protocol):
    """Text of a stream of generated ids, as it becomes final: a character split over several
    tokens is held back until its last token arrives, so no chunk ever ends in half of one."""

    def push(self, token_id: int) -> str:
        """The text that ``token_id`` completes (often "", never a partial character)."""
        ...

    def flush(self) -> str:
        """Whatever is still held back once the stream ends (an unfinished character as U+FFFD)."""
        ...


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int
    # Every id that ends a generation (EOS and the generation config's other stop tokens).
    stop_token_ids: frozenset[int]

    def encode(self, text: str) -> list[int]:
        """A prompt's ids, with the special tokens (BOS) its model expects in front."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids``; special tokens carry no text."""
        ...

    def detokenizer(self) -> Detokenizer:
        ...

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of a conversation (``[{"role", "content"}]``) followed by the prompt for the
        assistant's answer, as the model was trained to read it."""
        ...


@dataclass(frozen=True)
class ByteTokenizer:
    bos_token_id: int = 256
    eos_token_id: int = 257
    pad_token_id: int = 258

    @property
    def vocab_size(self) -> int:
        return 259

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return frozenset({self.eos_token_id})

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *text.encode("utf-8")]

    def decode(self, token_ids: list[int]) -> str:
        # Special tokens carry no text; a multi-byte character cut in half decodes as U+FFFD.
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")

    def detokenizer(self) -> Detokenizer:
        return _ByteDetokenizer()

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        # The random model was trained on nothing, so any unambiguous layout serves: one
        # "role: content" line per message, then the assistant's turn.
        lines = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return self.encode(lines + "assistant: ")


class _ByteDetokenizer:
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(bytes([token_id])) if token_id < 256 else ""

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
