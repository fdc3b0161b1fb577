"""The simulated instances: what actually happens, as opposed to what the conductor predicts.

A prefill instance runs its jobs one at a time, first in first out. A job first pulls its
transferred prefix through the source's NIC (which serves one pull at a time) and then computes:
on compute of its own, or on cores that every instance shares (:mod:`scheduler.sim.cores`).

A decode instance runs continuous batching. Between two batch changes every sequence gains one
token per step of ``tbt(batch, context)`` seconds, so instead of simulating each step we keep a
per-instance token clock (tokens every member has generated since the instance started) and
each sequence's finish mark on that clock; the next finish is ``(min mark - clock) * tbt / speed``
away. ``speed`` is 1 unless the instance shares cores with others (:mod:`scheduler.sim.cores`):
then it is the share of a core each computing task gets, and a step takes ``tbt / speed``.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from scheduler.sim.cost_model import CostModel
from scheduler.sim.lru import BlockLRU


@dataclass
class PrefillJob:
    request_index: int
    arrival: float
    input_length: int
    prefix_tokens: int
    transfer_tokens: int
    transfer_from: str | None
    transfer_keys: tuple
    all_keys: tuple
    started: float = 0.0
    ready: float = 0.0  # its prefix in place: it computes from here
    transfer_seconds: float = 0.0
    compute_seconds: float = 0.0  # its work: what it takes alone on its own compute


@dataclass
class SimPrefill:
    instance_id: str
    cache: BlockLRU
    jobs: deque = field(default_factory=deque)
    running: PrefillJob | None = None
    busy_seconds: float = 0.0


@dataclass
class SimDecode:
    instance_id: str
    cost: CostModel
    clock: float = 0.0  # tokens generated per member since start
    updated: float = 0.0
    step: float = 0.0  # current seconds per token on a core of its own
    speed: float = 1.0  # share of a core it gets
    context: int = 0
    marks: list = field(default_factory=list)  # heap of (finish mark, request index)
    members: dict = field(default_factory=dict)  # request index -> (joined, output, context)
    version: int = 0  # bumps on every batch change; stale completion events are ignored

    def advance(self, now: float) -> None:
        if self.members and self.step > 0:
            self.clock += (now - self.updated) * self.speed / self.step
        self.updated = now

    def join(self, index: int, output: int, context: int, now: float) -> None:
        self.advance(now)
        self.members[index] = (now, output, context)
        self.context += context
        heapq.heappush(self.marks, (self.clock + output, index))
        self._restep()

    def pop_finished(self, now: float) -> list[tuple[int, float, int]]:
        """Members done by ``now``: (request index, joined, output)."""
        self.advance(now)
        done = []
        while self.marks and self.marks[0][0] <= self.clock + 1e-9:
            _, index = heapq.heappop(self.marks)
            joined, output, context = self.members.pop(index)
            self.context -= context
            done.append((index, joined, output))
        self._restep()
        return done

    def next_finish(self, now: float) -> float | None:
        if not self.marks:
            return None
        return now + max(self.marks[0][0] - self.clock, 0.0) * self.step / self.speed

    def set_speed(self, speed: float, now: float) -> None:
        """From ``now`` on it gets ``speed`` of a core (planned finishes go stale)."""
        self.advance(now)
        self.speed = speed
        self.version += 1

    def _restep(self) -> None:
        self.step = self.cost.tbt(len(self.members), self.context)
        self.version += 1
