"""What the conductor's request path keeps per worker and per request, and which time model a
worker's heartbeat asks the policy to plan it with.

:mod:`daemons.serving.service` drives these; they hold no sockets of their own beyond the worker's client.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from daemons.serving.completion_request import CompletionRequest
from daemons.serving.messages import KvTarget, PrefillReport
from scheduler.conductor import Conductor
from scheduler.cpp import CppPrefillTimeModel
from scheduler.types import Decision
from transfer.rpc.client_server import RpcClient


@dataclass
class Worker:
    name: str
    role: str
    address: str
    client: RpcClient
    last_seen: float
    load: dict = field(default_factory=dict)


@dataclass
class Flight:
    request_id: str
    request: CompletionRequest
    keys: list
    decision: Decision
    arrived: float
    deadline: float
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    reservation: KvTarget | None = None
    prefill_reported: bool = False
    decode_started: bool = False
    completed: bool = False
    stopped: bool = False  # ended early by the client's stop string or token (ServingService.stop)
    orphaned: bool = False
    report: PrefillReport | None = None
    token_ids: list[int] = field(default_factory=list)
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)


def prefill_model(conductor: Conductor, beat: dict) -> CppPrefillTimeModel | None:
    """A CPP group (a heartbeat with ``group_size`` > 1) plans with its own model, built on the
    conductor's single-worker one; a plain worker with the shared model (None)."""
    stages = beat.get("group_size", 1)
    if stages <= 1:
        return None
    return conductor.group_model(stages, beat["prefill_chunk"])
