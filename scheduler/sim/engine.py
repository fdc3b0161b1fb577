"""The discrete-event replay: arrivals, prefill completions and decode completions on one heap.

The simulator owns the "physical" cluster (instances, caches, NICs, compute, the cost model) and
consults the very Conductor the daemon runs for every decision, reporting back to it through the
same lifecycle calls and cache events a real cluster would send.

Compute is the paper's by default: every instance has its own, so a job waits for its instance
only. With ``SimSetup.shared_cores`` every instance computes on those few cores together, as the
live bench's hosts (namespaces of one machine) do: a prefill job that has its prefix joins the
cores as a task, a decode instance is one task while its batch is not empty, and every change of
who computes re-times the planned prefill completion and each decode instance's steps.

The conductor plans with the cost model's figures, so its predictions are the simulated
cluster's truth, unless ``SimSetup.planned_with`` gives other ones to start from (a live
conductor's start-up profile, say): then it learns the truth the way the live conductor does,
from each prefill's computing time (``Conductor.observe_prefill``; with shared cores, the
stretched time the job took) and each pull's time.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from collections.abc import Sequence

from scheduler.cache_index import POOL, CacheIndex
from scheduler.conductor import Conductor
from scheduler.config import SchedulerConfig
from scheduler.sim.cores import SharedCores
from scheduler.sim.cost_model import CostModel
from scheduler.sim.instances import PrefillJob, SimDecode, SimPrefill
from scheduler.sim.lru import BlockLRU
from scheduler.sim.metrics import SimResult
from scheduler.sim.trace import TraceRequest
from scheduler.types import REJECT_DECODE, ScheduleRequest

# Same-time events: finish work before admitting new work, so a freed slot is seen at once.
# _CORES_DONE and _PREFIX_READY happen only with shared cores (a prefill completion planned
# under the cores' current version; a job whose prefix is in place starting to compute).
_PREFILL_DONE, _CORES_DONE, _DECODE_DONE, _PREFIX_READY, _ARRIVAL = range(5)


@dataclass
class SimSetup:
    num_prefill: int = 16
    num_decode: int = 16
    cache_capacity_tokens: int | None = 3_000_000  # per prefill instance; None: unlimited
    pool_capacity_tokens: int = 0  # extra shared pool written by every prefill; 0: none
    cost: CostModel = field(default_factory=CostModel)
    # Load samples for the load-over-time plot. Early rejection's cycle is as long as the lag it
    # reads decode with, a prefill (seconds), so a coarser grid would alias it away.
    sample_seconds: float = 1.0
    # Cores that every instance's compute shares (processor sharing, see scheduler.sim.cores);
    # None: each instance computes on its own, as in the paper's cluster.
    shared_cores: int | None = None
    # The prefill and decode models the conductor starts from; None: the cost model's own.
    planned_with: CostModel | None = None


class Simulator:
    def __init__(self, requests: Sequence[TraceRequest], cfg: SchedulerConfig, setup: SimSetup) -> None:
        self.requests, self.cfg, self.setup, self.cost = requests, cfg, setup, setup.cost
        # The simulated caches report their own stores and evictions into the conductor's index.
        index, bs = CacheIndex(), cfg.block_tokens
        planned = setup.planned_with or self.cost
        self.conductor = Conductor(cfg, index=index, prefill_model=planned.prefill, tbt_model=planned.decode)
        self.learns = setup.planned_with is not None
        capacity = setup.cache_capacity_tokens
        self.prefill: dict[str, SimPrefill] = {}
        for i in range(setup.num_prefill):
            name = f"prefill-{i}"
            self.conductor.add_prefill(name)
            self.prefill[name] = SimPrefill(name, BlockLRU(name, None if capacity is None else capacity // bs, index))
        self.decode: dict[str, SimDecode] = {}
        for i in range(setup.num_decode):
            name = f"decode-{i}"
            self.conductor.add_decode(name, self.cost.decode_kv_capacity)
            self.decode[name] = SimDecode(name, self.cost)
        self.pool = (BlockLRU(POOL, setup.pool_capacity_tokens // bs, index, tier="pool")
                     if setup.pool_capacity_tokens else None)
        self.nic_free: dict[str, float] = {}
        self.cores = None if setup.shared_cores is None else SharedCores(setup.shared_cores)
        self._cores_planned = -1  # the cores' version the latest _CORES_DONE was planned under
        self.events: list = []
        self._seq = 0
        self.result = SimResult(params={})
        self._ttft: dict[int, float] = {}  # prefilled, awaiting decode's end (for goodput)

    def _push(self, at: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, kind, self._seq, payload))

    def run(self) -> SimResult:
        started = time.perf_counter()
        for i, request in enumerate(self.requests):
            self._push(request.arrival, _ARRIVAL, i)
        horizon = self.requests[-1].arrival if self.requests else 0.0
        interval = self.setup.sample_seconds
        next_sample, now = 0.0, 0.0
        self._window = [0, 0]  # accepted, rejected since the last sample
        while self.events:
            now, kind, _, payload = heapq.heappop(self.events)
            while next_sample <= now and next_sample <= horizon:
                self._sample(next_sample)
                next_sample += interval
            if kind == _ARRIVAL:
                self._arrive(payload, now)
            elif kind == _PREFILL_DONE:
                self._prefill_done(self.prefill[payload], now)
            elif kind == _CORES_DONE:
                self._cores_done(payload, now)
            elif kind == _PREFIX_READY:
                self._prefix_ready(self.prefill[payload], now)
            else:
                self._decode_done(self.decode[payload[0]], payload[1], now)
        result = self.result
        result.num_requests = len(self.requests)
        result.evicted_blocks = sum(p.cache.num_evicted for p in self.prefill.values())
        result.sim_seconds = now
        result.wall_seconds = time.perf_counter() - started
        return result

    # -- events -------------------------------------------------------------------------------

    def _arrive(self, index: int, now: float) -> None:
        request = self.requests[index]
        decision = self.conductor.schedule(
            ScheduleRequest(str(index), request.hash_ids, request.input_length, request.output_length), now)
        self.result.reasons[decision.reason] += 1
        if not decision.accepted:
            self._window[1] += 1
            return
        self._window[0] += 1
        instance = self.prefill[decision.prefill_id]
        # Reusing the local prefix makes it most recent, so it survives until the job runs.
        instance.cache.touch(request.hash_ids[:math.ceil(decision.local_tokens / self.cfg.block_tokens)])
        instance.jobs.append(PrefillJob(index, request.arrival, request.input_length, decision.prefix_tokens,
                                        decision.transfer_tokens, decision.transfer_from,
                                        decision.transfer_keys, request.hash_ids))
        if instance.running is None:
            self._start(instance, now)

    def _start(self, instance: SimPrefill, now: float) -> None:
        job = instance.jobs.popleft()
        instance.running, job.started, ready = job, now, now
        if job.transfer_tokens > 0:
            source = job.transfer_from
            wire = self.cost.wire_time(job.transfer_tokens)
            if source == POOL:  # the pool is spread over every node's NIC
                wire /= max(len(self.prefill), 1)
            begin = max(now, self.nic_free.get(source, 0.0))
            self.nic_free[source] = begin + wire
            ready = begin + wire + self.cost.link_latency
            instance.cache.insert(job.transfer_keys)  # the pulled prefix stays: hot-block replication
            self.result.transferred_tokens += job.transfer_tokens
        job.transfer_seconds, job.ready = ready - now, ready
        job.compute_seconds = self.cost.prefill_time(job.input_length, job.prefix_tokens)
        if self.cores is None:
            self._push(ready + job.compute_seconds, _PREFILL_DONE, instance.instance_id)
        else:
            self._push(ready, _PREFIX_READY, instance.instance_id)

    def _prefix_ready(self, instance: SimPrefill, now: float) -> None:
        self.cores.join(instance.instance_id, instance.running.compute_seconds, now)
        self._share_cores(now)

    def _cores_done(self, version: int, now: float) -> None:
        if version != self.cores.version:
            return  # who computes changed since this completion was planned
        for instance_id in self.cores.pop_finished(now):
            self._prefill_done(self.prefill[instance_id], now)
        self._share_cores(now)

    def _share_cores(self, now: float) -> None:
        """After who computes may have changed: count the decode instances that compute, give
        each its new share, and plan the next prefill completion."""
        cores = self.cores
        for decode in self.decode.values():
            cores.set_endless(decode.instance_id, bool(decode.members), now)
        for decode in self.decode.values():
            if decode.members and decode.speed != cores.rate:
                decode.set_speed(cores.rate, now)
                self._schedule_decode(decode, now)
        at = cores.next_finish(now)
        if at is not None and cores.version != self._cores_planned:
            self._cores_planned = cores.version
            self._push(at, _CORES_DONE, cores.version)

    def _prefill_done(self, instance: SimPrefill, now: float) -> None:
        job, instance.running = instance.running, None
        result, rid = self.result, str(job.request_index)
        instance.cache.insert(job.all_keys)
        if self.pool is not None:
            self.pool.insert(job.all_keys)
        instance.busy_seconds += now - job.started
        result.ttft.append(now - job.arrival)
        result.queue_seconds.append(job.started - job.arrival)
        self._ttft[job.request_index] = now - job.arrival
        result.input_tokens += job.input_length
        result.hit_tokens += job.prefix_tokens
        result.prefill_compute_seconds += job.compute_seconds
        result.transfer_seconds += job.transfer_seconds
        self.conductor.prefill_finished(rid, now, transfer_tokens=job.transfer_tokens,
                                        transfer_seconds=job.transfer_seconds if job.transfer_tokens else None)
        if self.learns:
            self.conductor.observe_prefill(job.input_length, job.prefix_tokens, now - job.ready, instance.instance_id)
        decode_id = self.conductor.admit_decode(rid, now)
        if decode_id is None:
            result.reasons[REJECT_DECODE] += 1
            result.wasted_prefill_seconds += job.compute_seconds
            del self._ttft[job.request_index]
        else:
            request = self.requests[job.request_index]
            decode = self.decode[decode_id]
            decode.join(job.request_index, request.output_length,
                        request.input_length + request.output_length, now)
            self._schedule_decode(decode, now)
        if instance.jobs:
            self._start(instance, now)

    def _schedule_decode(self, decode: SimDecode, now: float) -> None:
        at = decode.next_finish(now)
        if at is not None:
            self._push(at, _DECODE_DONE, (decode.instance_id, decode.version))

    def _decode_done(self, decode: SimDecode, version: int, now: float) -> None:
        if version != decode.version:
            return  # the batch changed since this completion was planned
        cfg, result = self.cfg, self.result
        for index, joined, output in decode.pop_finished(now):
            tbt = (now - joined) / max(output, 1)
            result.tbt.append(tbt)
            self.conductor.decode_finished(str(index), now)
            ttft = self._ttft.pop(index)
            if (cfg.ttft_slo <= 0 or ttft <= cfg.ttft_slo) and (cfg.tbt_slo <= 0 or tbt <= cfg.tbt_slo):
                result.goodput += 1
        self._schedule_decode(decode, now)
        if self.cores is not None:
            self._share_cores(now)

    def _sample(self, at: float) -> None:
        cfg = self.cfg
        queues = list(self.conductor.prefill_queue_times(at).values())
        loads = [self.cost.tbt(len(d.members), d.context) / cfg.tbt_slo if cfg.tbt_slo > 0 else 0.0
                 for d in self.decode.values()]
        self.result.samples.append({
            "t": at,
            "prefill_queue_s": sum(queues) / len(queues),
            "prefill_busy": sum(p.running is not None for p in self.prefill.values()) / len(self.prefill),
            # Requests queued or running per prefill instance: the prefill load of the paper's
            # Figure 10, which a 0/1 busy flag saturates at once.
            "prefill_requests": sum(len(p.jobs) + (p.running is not None)
                                    for p in self.prefill.values()) / len(self.prefill),
            "decode_batch": sum(len(d.members) for d in self.decode.values()) / len(self.decode),
            "decode_load": sum(loads) / len(loads),
            "accepted": self._window[0], "rejected": self._window[1],
        })
        self._window = [0, 0]


def simulate(requests: Sequence[TraceRequest], cfg: SchedulerConfig, setup: SimSetup | None = None) -> SimResult:
    return Simulator(requests, cfg, setup or SimSetup()).run()
