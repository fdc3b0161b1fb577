"""Generated tokens to the text a client receives: incremental detokenization, stop tokens and
OpenAI's ``stop`` strings. Pure: tokens in, pieces of text out.

A stop string ends generation as soon as the text contains it, and neither it nor anything after
it is returned. While the text's tail could still grow into a stop string it is held back, so a
streamed piece is never taken back: ``"Hello Wor"`` with stop ``"World"`` releases ``"Hello "``
and waits. A stop token (the tokenizer's EOS and the generation config's others) ends generation
too and carries no text.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemons.model import Detokenizer


@dataclass(frozen=True)
class Piece:
    token: int
    text: str  # what this token releases (often "", never half a character)
    finish_reason: str | None  # "stop", "length", ...: the last piece


class TextStream:
    def __init__(self, detokenizer: Detokenizer | None, stop: list[str],
                 stop_token_ids: frozenset[int]) -> None:
        """``detokenizer`` None: a model served without a tokenizer, whose pieces carry no text."""
        self._detokenizer = detokenizer
        self._stop = stop
        self._stop_token_ids = stop_token_ids
        self._held = ""  # decoded, not yet released: it may be the start of a stop string

    def push(self, token: int, finish_reason: str | None) -> Piece:
        """The piece ``token`` makes; ``finish_reason`` is the worker's (None: it goes on). A
        piece whose finish_reason is set ends the stream: push nothing after it."""
        if token in self._stop_token_ids:
            return Piece(token, self._release_all(), "stop")
        if self._detokenizer is not None:
            self._held += self._detokenizer.push(token)
        if (cut := self._stop_at()) is not None:
            text, self._held = self._held[:cut], ""
            return Piece(token, text, "stop")
        if finish_reason is not None:
            return Piece(token, self._release_all(), finish_reason)
        keep = self._stop_prefix_length()
        text, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        return Piece(token, text, None)

    def _release_all(self) -> str:
        if self._detokenizer is not None:
            self._held += self._detokenizer.flush()
        cut = self._stop_at()
        text, self._held = self._held[:cut], ""
        return text

    def _stop_at(self) -> int | None:
        """Where the first stop string in the held text begins (None: none there). Released
        text never holds the start of one, so the held text is the only place to look."""
        found = [at for stop in self._stop if (at := self._held.find(stop)) >= 0]
        return min(found) if found else None

    def _stop_prefix_length(self) -> int:
        """Length of the longest tail of the held text that begins some stop string."""
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(self._held)), longest, -1):
                if self._held.endswith(stop[:length]):
                    longest = length
                    break
        return longest
