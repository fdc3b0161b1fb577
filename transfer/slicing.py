"""Cutting a request into slices (pure).

Requests up to ``threshold`` bytes move as one slice. Longer ones are cut into ``slice_size``
pieces; like Mooncake, a tail shorter than slice_size / fragment_ratio is merged into the
previous slice rather than sent as a tiny fragment that costs a full per-slice overhead.
"""

from __future__ import annotations

FRAGMENT_RATIO = 4


def cut(length: int, slice_size: int, threshold: int) -> list[tuple[int, int]]:
    """(offset, length) pairs covering [0, length)."""
    if length <= max(threshold, slice_size):
        return [(0, length)]
    pieces = [(offset, min(slice_size, length - offset)) for offset in range(0, length, slice_size)]
    last_offset, last_length = pieces[-1]
    if len(pieces) > 1 and last_length < slice_size // FRAGMENT_RATIO:
        pieces.pop()
        prev_offset, prev_length = pieces[-1]
        pieces[-1] = (prev_offset, prev_length + last_length)
    return pieces
