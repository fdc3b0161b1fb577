"""Continuous batching on a decode worker: who runs in the next step, and who leaves after it.

Sequences arrive prefilled (KV of every token but the last in their pages, the last being the
first generated token) and join between steps; each step decodes one token for every running
sequence with greedy sampling; a sequence leaves as soon as it finishes (any of the model's stop
tokens, or max_tokens) and its pages go back.

A worker that serves other calls while it decodes (reserving pages, joining, cancelling) passes
:meth:`ContinuousBatcher.step` the lock those calls take: the step holds it for its bookkeeping
only, not for the model's forward, so such a call never waits out a whole step (on a decode
worker, ``decode.reserve`` and ``decode.start`` sit on every request's TTFT path). A sequence
cancelled while the forward runs keeps its pages until the forward is done: the forward writes
the step's KV into them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from daemons.model.block_manager import BlockManager
from daemons.model.errors import KVCacheFull
from daemons.model.runner import ModelRunner
from daemons.model.sequence import Sequence


@dataclass(frozen=True)
class TokenEvent:
    seq_id: Hashable
    token: int | None  # None when the sequence ended without a token (no page for it)
    finish_reason: str | None


class ContinuousBatcher:
    def __init__(self, runner: ModelRunner, block_manager: BlockManager, *, stop_token_ids: Collection[int],
                 max_batch_size: int = 64) -> None:
        self.runner = runner
        self.block_manager = block_manager
        self.stop_token_ids = frozenset(stop_token_ids)
        self.max_batch_size = max_batch_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # Tokens the last step attended over: with the batch size, what a step's time depends on.
        self.last_step_context = 0
        self._stepping: list[Sequence] = []  # the batch whose forward runs now
        self._cancelled_in_step: list[Sequence] = []  # out of the batch, pages freed after the forward

    @property
    def num_active(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def add(self, seq: Sequence) -> None:
        """Queue a prefilled, unfinished sequence; it joins the batch at the next step with room."""
        if seq.is_finished or seq.num_kv_tokens != len(seq) - 1:
            raise ValueError(f"sequence {seq.seq_id!r} is not ready to decode")
        self.waiting.append(seq)

    def cancel(self, seq_id: Hashable) -> bool:
        """Take the sequence out of the batch (waiting or running) and give its pages back;
        False when it is not here."""
        for queue in (self.waiting, self.running):
            for seq in queue:
                if seq.seq_id == seq_id:
                    queue.remove(seq)
                    if any(seq is stepping for stepping in self._stepping):
                        self._cancelled_in_step.append(seq)  # the forward still writes its pages
                    else:
                        self.block_manager.deallocate(seq)
                    return True
        return False

    def step(self, lock: threading.Condition | threading.Lock | threading.RLock | None = None) -> list[TokenEvent]:
        """Decode one token for every running sequence; finished ones leave and free their pages.

        ``lock``, held by the caller, is released while the model's forward runs (and held again
        before the tokens are booked): the lock under which the caller adds, cancels and
        allocates."""
        while self.waiting and len(self.running) < self.max_batch_size:
            self.running.append(self.waiting.popleft())
        events, batch = [], []
        for seq in self.running:
            try:
                self.block_manager.allocate(seq)  # a page for the token about to be computed
            except KVCacheFull:
                # Without preemption a sequence that cannot grow must end; the worker reports it.
                # Reserving prompt + max_tokens at admission avoids this altogether.
                seq.finish_reason = "kv_cache_full"
                events.append(TokenEvent(seq.seq_id, None, seq.finish_reason))
                continue
            batch.append(seq)
        self.last_step_context = sum(len(seq) for seq in batch)
        if batch:
            self._stepping = batch
            try:
                with _released(lock):
                    logits = self.runner.decode(batch)
            finally:
                self._stepping = []
                cancelled, self._cancelled_in_step = self._cancelled_in_step, []
                for seq in cancelled:
                    self.block_manager.deallocate(seq)
            gone = {id(seq) for seq in cancelled}
            for seq, token in zip(batch, logits.argmax(dim=-1).tolist()):
                if id(seq) in gone:
                    continue
                seq.append(token, self.stop_token_ids)
                events.append(TokenEvent(seq.seq_id, token, seq.finish_reason))
        for seq in [s for s in self.running if s.is_finished]:
            self.block_manager.deallocate(seq)
            self.running.remove(seq)
        return events


@contextmanager
def _released(lock: threading.Condition | threading.Lock | threading.RLock | None) -> Iterator[None]:
    """Within: ``lock`` (held on entry, if any) is not held."""
    if lock is None:
        yield
        return
    lock.release()
    try:
        yield
    finally:
        lock.acquire()
