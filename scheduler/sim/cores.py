"""Cores that every simulated instance computes on together: processor sharing.

The paper's cluster gives each instance its own GPUs, so a busy instance makes the next job wait
(the engine's default). The live bench's "hosts" are network namespaces on one machine instead:
an instance that has work starts at once, and every computing task slows the others. With
``cores`` cores and k tasks computing, each progresses at ``min(1, cores / k)`` seconds of work
per second.

Since every task progresses at the same rate, one clock stands for all of them (as the decode
instance's token clock does): the seconds of work each task has received since the start. A task
that joins when the clock reads w with W seconds of work finishes when it reads w + W, and the
first finish is ``(smallest mark - clock) / rate`` away. A change of k changes the rate, so
``version`` bumps and completions planned under an older version are ignored.

A task either has an end (a prefill job: its work) or computes until it says it stopped (a
decode instance while its batch is not empty): the latter only counts in k.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

# Float slack when comparing the work clock with a mark it was timed to reach.
_SLACK = 1e-9


@dataclass
class SharedCores:
    cores: int
    clock: float = 0.0  # seconds of work every computing task has received
    updated: float = 0.0
    marks: list = field(default_factory=list)  # heap of (clock at which it is done, task id)
    endless: set = field(default_factory=set)  # ids of tasks computing without an end of their own
    version: int = 0  # bumps whenever the rate may change

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"shared cores must be at least 1, got {self.cores}")

    @property
    def num_tasks(self) -> int:
        return len(self.marks) + len(self.endless)

    @property
    def rate(self) -> float:
        """Seconds of work each computing task gets per second."""
        return min(1.0, self.cores / self.num_tasks) if self.num_tasks else 1.0

    def advance(self, now: float) -> None:
        if self.num_tasks:
            self.clock += (now - self.updated) * self.rate
        self.updated = now

    def join(self, task: str, work: float, now: float) -> None:
        """``task`` starts computing ``work`` seconds of work (what it takes alone on a core)."""
        self.advance(now)
        heapq.heappush(self.marks, (self.clock + work, task))
        self.version += 1

    def set_endless(self, task: str, computing: bool, now: float) -> None:
        """Whether ``task``, which has no end of its own, computes from ``now`` on."""
        if (task in self.endless) == computing:
            return
        self.advance(now)
        if computing:
            self.endless.add(task)
        else:
            self.endless.discard(task)
        self.version += 1

    def pop_finished(self, now: float) -> list[str]:
        """Tasks whose work is done by ``now``, first finished first. The completion planned
        for ``now`` is spent: the version bumps even if float rounding left nothing done yet."""
        self.advance(now)
        done = []
        while self.marks and self.marks[0][0] <= self.clock + _SLACK:
            done.append(heapq.heappop(self.marks)[1])
        self.version += 1
        return done

    def next_finish(self, now: float) -> float | None:
        """When the first task with an end finishes if nothing joins or leaves before."""
        if not self.marks:
            return None
        return now + max(self.marks[0][0] - self.clock, 0.0) / self.rate
