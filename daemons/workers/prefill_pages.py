"""A prefill's KV pages, which a job holds until its background store puts end.

A prefill reports as soon as its KV is in decode's pages, while its new blocks are still being
put from its pages on the storing thread; that thread gives the pages back once the puts end.
The next job waits here for them instead of failing when the cache is momentarily full.
"""

from __future__ import annotations

import threading

from daemons.model import BlockManager, Sequence


class PrefillPages:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self._manager = BlockManager(num_blocks, block_size)
        self._freed = threading.Condition()

    @property
    def num_free_blocks(self) -> int:
        return self._manager.num_free_blocks

    def take(self, seq: Sequence, timeout: float) -> None:
        """Pages for all of ``seq``'s tokens, waiting up to ``timeout`` for jobs still storing to
        give theirs back; KVCacheFull if they do not."""
        with self._freed:
            if self._manager.missing_blocks(seq) <= self._manager.num_blocks:  # else no wait helps
                self._freed.wait_for(lambda: self._manager.can_allocate(seq), timeout=timeout)
            self._manager.allocate(seq)

    def give_back(self, seq: Sequence) -> None:
        with self._freed:
            self._manager.deallocate(seq)
            self._freed.notify_all()
