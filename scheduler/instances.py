"""The conductor's view of each instance: a prefill queue and a decode batch.

Both are bookkeeping only; they learn what happens from the lifecycle calls (enqueue/finish,
admit/release), so a daemon and the simulator keep them current the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.predictors import DecodeTbtModel


@dataclass
class PrefillQueue:
    """FIFO of predicted prefill durations; queue time is what is left of their sum."""

    instance_id: str
    # Its own prefill time model (a CPP group's), or None for the conductor's shared one.
    model: Any = None
    durations: dict[str, float] = field(default_factory=dict)  # request_id -> seconds, FIFO order
    total: float = 0.0
    head_started_at: float = 0.0

    @property
    def num_queued(self) -> int:
        return len(self.durations)

    def queue_time(self, now: float) -> float:
        """Seconds until a job enqueued now would start: what the head has left, and the rest."""
        if not self.durations:
            return 0.0
        head = next(iter(self.durations.values()))
        return self.total - head + self.head_left(head, now - self.head_started_at)

    @staticmethod
    def head_left(predicted: float, elapsed: float) -> float:
        """What a head job predicted to take ``predicted`` seconds, running for ``elapsed``,
        still needs. Within its prediction, the rest of it. Past it, the job has shown it is
        slower than predicted (cores shared with other work, a slow pull) and is not done: taken
        as needing as long again as it has overrun, which grows the longer it keeps running.
        (Counting it as finishing now made a loaded instance look free, exactly when its
        jobs run late.)"""
        return abs(predicted - elapsed)

    def enqueue(self, request_id: str, seconds: float, now: float) -> None:
        if not self.durations:
            self.head_started_at = now
        self.durations[request_id] = seconds
        self.total += seconds

    def finish(self, request_id: str, now: float) -> None:
        was_head = bool(self.durations) and next(iter(self.durations)) == request_id
        seconds = self.durations.pop(request_id, None)
        if seconds is None:
            return
        self.total -= seconds
        if not self.durations:
            self.total = 0.0  # drop float drift when the queue empties
        if was_head:
            self.head_started_at = now


@dataclass
class DecodeBatch:
    """The running batch of one decode instance: sequences and the context they hold."""

    instance_id: str
    kv_capacity: int  # tokens of KV the instance's GPUs can hold
    contexts: dict[str, int] = field(default_factory=dict)
    context: int = 0

    @property
    def batch(self) -> int:
        return len(self.contexts)

    def load_with(self, model: DecodeTbtModel, tbt_slo: float, extra_context: int) -> float:
        """TBT/SLO (or KV fill, whichever is worse) if one more sequence joined."""
        context = self.context + extra_context
        kv = context / self.kv_capacity if self.kv_capacity else 0.0
        if tbt_slo <= 0:
            return kv
        return max(model.predict(self.batch + 1, context) / tbt_slo, kv)

    def admit(self, request_id: str, context: int) -> None:
        self.contexts[request_id] = context
        self.context += context

    def release(self, request_id: str) -> None:
        self.context -= self.contexts.pop(request_id, 0)
