"""Prefix block keys: one chained hash per full block of tokens.

A block's key covers the block *and its whole prefix*, so two prompts share the key of block k
exactly when their first (k+1)*block_size tokens are equal. That is what makes a key usable as a
store object name and as the unit of prefix matching: an equal key means reusable KV.

key_k = xxh3_128(seed, parent_key_k-1 || salt || token ids of block k)

The salt separates tenants (or models): the same tokens under two salts never share KV. Only full
blocks get keys; the tail is always recomputed, because a partial block can still grow.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash

BlockKey = int  # 128-bit unsigned; format_key() renders it for the store, parse_key() reads it back

_ROOT = b"\x00" * 16


def hash_block(parent: BlockKey | None, token_ids: Sequence[int], *, seed: int = 0, salt: bytes = b"") -> BlockKey:
    """The key of one block given its parent's key (None for the first block)."""
    parent_bytes = _ROOT if parent is None else parent.to_bytes(16, "little")
    # array('q') is a fixed-width, platform-independent enough encoding of token ids (int64 LE
    # on every platform we run on) and much faster than packing ints one by one.
    body = array("q", token_ids).tobytes()
    return xxhash.xxh3_128_intdigest(parent_bytes + salt + body, seed=seed)


def prefix_block_keys(token_ids: Sequence[int], block_size: int, *, seed: int = 0,
                      salt: bytes = b"") -> list[BlockKey]:
    """Keys of every full block of ``token_ids``, each chained to the one before."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    keys: list[BlockKey] = []
    parent: BlockKey | None = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size], seed=seed, salt=salt)
        keys.append(parent)
    return keys


def format_key(key: BlockKey) -> str:
    """The store object name of a block key: 32 lowercase hex digits."""
    return f"{key:032x}"


def parse_key(text: str) -> BlockKey:
    """The block key :func:`format_key` rendered; ValueError for anything else."""
    if len(text) != 32 or text.strip("0123456789abcdef"):
        raise ValueError(f"not a block key: {text[:40]!r}")
    return int(text, 16)
