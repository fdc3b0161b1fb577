"""The conductor's request path: schedule, reserve decode pages, prefill, decode, stream back.

One request's life, driven by the thread that serves it (:meth:`ServingService.generate`)::

    submit:  schedule (the scheduler/ policy: prefill + decode pair, or early rejection -> 429)
             -> decode.reserve (pages for prompt + max_tokens on the planned decode worker)
             -> prefill.run (queued on the prefill worker; it loads the prefix from its own
                segment and, for a transfer, from the holder's segment, computes the rest and
                writes each layer's KV into the reserved pages as it is computed; it reports
                once the last layer is written, and stores new blocks in the background)
    run:     wait for conductor.prefill_done -> admit_decode -> first token (TTFT)
             -> decode.start -> one conductor.tokens event per step until the request finishes

Worker reports arrive as RPCs and only land in the request's event queue, so all decisions for a
request happen on its own thread. Liveness is heartbeats: a worker silent for ``worker_timeout``
(or one that fails a call) is removed from the policy, and every request it was serving gets an
error event at once instead of waiting out its deadline.

Which blocks each prefill instance (or the pool) holds comes only from the master's KV events:
the conductor daemon's :class:`daemons.serving.kv_events.KvEventSubscriber` applies them through
:meth:`ServingService.apply_kv_events` / :meth:`rebuild_kv_index`, mapping each store segment to
the prefill worker whose heartbeat announces it (``segment``; any other segment is the pool).

A worker's heartbeat carries the costs it measured at start (``calibration``); the conductor plans
with them from the worker's first beat (:meth:`Conductor.install_calibration`) and `/metrics`
shows the figures it plans with now (``mooncake_cost_*``).

Decode pages reserved for a request are freed only once nothing can write into them any more.
The conductor frees them (``decode.release``) when the request ends after its prefill reported
- a result, a failure, or a job dropped unstarted - or after decode started. A request that
ends while its prefill may still run (timed out, cancelled, its prefill worker dropped for
silence or for a failed call: a silent worker may only be slow) leaves an orphan whose late
report frees them; an orphan is forgotten at its deadline, after which the decode worker's own
expiry takes over: it frees the pages once the prefill worker says the job can no longer write
(the reservation names that worker) or its processes are verifiably dead. Each prefill job
carries ``deadline_s``, the time left to the request, and is dropped unstarted once it passes.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any
from collections import deque
from collections.abc import Generator, Iterator

from daemons.model import KVCacheFull
from daemons.serving.completion_request import CompletionRequest
from daemons.serving.errors import BadRequest, GenerationFailed, GenerationTimeout, NoWorkers, Rejected
from daemons.serving.kv_events import IndexFollower
from daemons.serving.messages import (DecodeStep, KvTarget, PrefillJob, PrefillReport, PrefillWriter,
                                      WorkerHeartbeat, WriterProcess)
from daemons.serving.metrics import Series, ServingMetrics, series
from daemons.serving.state import Flight, Worker, prefill_model
from scheduler.block_hash import BlockKey, format_key, prefix_block_keys
from scheduler.cache_index import CacheIndex
from scheduler.conductor import Conductor
from scheduler.config import SchedulerConfig
from scheduler.errors import NoInstances
from scheduler.types import REJECT_DECODE, ScheduleRequest
from transfer.auth import cluster_secret
from transfer.errors import InvalidArgument, MooncakeError
from transfer.rpc.client_server import Request, RpcClient
from transfer.settings import Config

log = logging.getLogger(__name__)

DEGRADED_AFTER = 10  # requests in a row all rejected: /health says degraded
DEGRADED_WINDOW_S = 60.0  # ... among those of the last minute


class ServingService:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.sched = SchedulerConfig.from_config(config)
        self.conductor = Conductor(self.sched, index=CacheIndex(config.index_max_blocks))
        self.index_follower = IndexFollower(self.conductor.index)
        self.lock = threading.Lock()
        self.workers: dict[str, Worker] = {}
        self.flights: dict[str, Flight] = {}
        self.metrics = ServingMetrics(self.gauges)
        self.call_timeout = min(config.rpc_timeout, 2.0)
        self.admissions: deque[tuple[float, bool]] = deque(maxlen=64)  # (when, accepted) per request
        self.secret = cluster_secret(config)  # the workers' servers require it of our calls

    # -- worker reports (RPC handlers) -------------------------------------------------------

    def heartbeat(self, request: Request) -> dict:
        beat, now = WorkerHeartbeat.from_wire(request.args), time.monotonic()
        with self.lock:
            worker = self.workers.get(beat.name)
            if worker is not None and (worker.address, worker.role, worker.credential) != \
                    (beat.address, beat.role, beat.credential):
                if now - worker.last_seen <= self.config.worker_timeout:
                    # A live worker keeps its name: a second process claiming it (a stale
                    # restart, or anyone on the host) would take its requests and its pages.
                    raise InvalidArgument(f"a live {worker.role} worker named {beat.name!r} serves at "
                                          f"{worker.address}; {beat.address} may take the name once it "
                                          f"has been silent for {self.config.worker_timeout:g}s")
                self._forget_worker(worker)
                worker = None
            if worker is None:
                worker = Worker(beat.name, beat.role, beat.address,
                                RpcClient(beat.address, timeout=self.call_timeout, secret=self.secret), now,
                                beat.credential)
                self.workers[worker.name] = worker
                if worker.role == "prefill":
                    self.conductor.add_prefill(worker.name, prefill_model(self.conductor, beat.load))
                else:
                    self.conductor.add_decode(worker.name, beat.kv_capacity_tokens)
                calibration = beat.calibration
                if calibration is not None:
                    self.conductor.install_calibration(
                        bytes_per_token=calibration.kv_bytes_per_token, bandwidth=calibration.transfer_bandwidth,
                        prefill_coef=calibration.prefill_coef, tbt_coef=calibration.tbt_coef)
                log.info("%s worker %s joined at %s", worker.role, worker.name, worker.address)
            worker.last_seen, worker.load = now, beat.load
        return {"ok": True}

    def prefill_done(self, request: Request) -> dict:
        report = PrefillReport.from_wire(request.args)
        with self.lock:
            flight = self.flights.get(report.request_id)
            if flight is None:
                return {"known": False}
            prefill = self.workers.get(flight.decision.prefill_id)
            if report.worker != flight.decision.prefill_id or prefill is None or \
                    prefill.credential != report.credential:
                # Only the prefill worker the request went to may report it (a forged report
                # would hand the client a first token nobody computed).
                raise InvalidArgument(f"{report.request_id} is not {report.worker!r}'s to report")
            flight.prefill_reported = True
            if flight.orphaned:
                del self.flights[flight.request_id]
        if flight.orphaned:
            self._release_pages(flight)
        else:
            flight.events.put(("prefill", report))
        return {"known": True}

    def tokens(self, request: Request) -> dict:
        step = DecodeStep.from_wire(request.args)
        with self.lock:
            worker = self.workers.get(step.worker)
            if worker is None or worker.role != "decode" or worker.credential != step.credential:
                raise InvalidArgument(f"no decode worker {step.worker!r} with that credential is registered")
            # Only the requests this worker decodes take its tokens.
            routed = [(flight, event) for event in step.events
                      if (flight := self.flights.get(event.request_id)) is not None
                      and flight.decision.decode_id == step.worker]
            self.conductor.observe_decode(step.batch, step.context, step.step_s)
        for flight, event in routed:
            flight.events.put(("token", event.token, event.finish_reason))
        return {"ok": True}

    def check_liveness(self, now: float) -> None:
        silent = [w.name for w in list(self.workers.values())
                  if now - w.last_seen > self.config.worker_timeout]
        for name in silent:
            self._drop_worker(name, f"stopped answering for {self.config.worker_timeout:g}s")
        with self.lock:  # past its deadline an orphan's pages are the decode worker's to free
            for request_id in [f.request_id for f in self.flights.values() if f.orphaned and now > f.deadline]:
                del self.flights[request_id]

    def _forget_worker(self, worker: Worker) -> None:
        """Under the lock: a silent worker whose name another process now takes."""
        del self.workers[worker.name]
        self.conductor.remove_instance(worker.name)
        worker.client.close()

    def _drop_worker(self, name: str, why: str) -> None:
        with self.lock:
            worker = self.workers.pop(name, None)
            if worker is None:
                return
            self.conductor.remove_instance(name)
            # Their pages stay reserved: a silent prefill worker may only be slow, and still write.
            hit = [f for f in self.flights.values() if name in (f.decision.prefill_id, f.decision.decode_id)]
        log.warning("dropping %s worker %s: %s", worker.role, name, why)
        worker.client.close()
        for flight in hit:
            flight.events.put(("error", f"{worker.role} worker {name} {why}"))

    # -- one request ---------------------------------------------------------------------------

    def submit(self, request: CompletionRequest) -> Flight:
        """Schedule the request and start its prefill; Rejected (429) or NoWorkers (503) if not."""
        capacity = self.capacity_tokens()
        if capacity and len(request.token_ids) + request.max_tokens > capacity:
            raise BadRequest(f"prompt ({len(request.token_ids)} tokens) plus max_tokens "
                             f"({request.max_tokens}) exceed a decode worker's KV cache ({capacity} tokens)")
        now = time.monotonic()
        request_id = f"cmpl-{uuid.uuid4().hex[:16]}"
        keys = prefix_block_keys(request.token_ids, self.sched.block_tokens, seed=self.sched.hash_seed)
        wanted = ScheduleRequest(request_id, keys if request.prefix_reuse else [],
                                 len(request.token_ids), request.max_tokens)
        with self.lock:
            try:
                decision = self.conductor.schedule(wanted, now)
            except NoInstances as exc:
                raise NoWorkers(f"no workers to serve the request: {exc.message}") from None
            self.admissions.append((now, decision.accepted))
            if not decision.accepted:
                self.metrics.rejections.labels(reason=decision.reason).inc()
                raise Rejected(f"rejected early ({decision.reason}): predicted TTFT "
                               f"{decision.predicted_ttft:.3f}s, decode load {decision.decode_load:.2f}",
                               decision.reason, max(1, math.ceil(decision.predicted_queue)))
            self.metrics.decisions.labels(reason=decision.reason).inc()
            flight = Flight(request_id, request, keys, decision, now, now + self.config.request_timeout)
            self.flights[request_id] = flight
            prefill, decode = self.workers[decision.prefill_id], self.workers[decision.decode_id]
            # Where the pulled blocks are: the holder's own segment (the pool or a worker
            # without one: any replica).
            holder = self.workers.get(decision.transfer_from or "")
            source_segment = holder.load.get("segment") if holder is not None else None
            writer = PrefillWriter(prefill.name, prefill.address,
                                   [WriterProcess.from_wire(p) for p in prefill.load.get("writers", [])])
        block = self.sched.block_tokens
        try:
            flight.reservation = KvTarget.from_wire(decode.client.call("decode.reserve", {
                "request_id": request_id, "token_ids": request.token_ids, "max_tokens": request.max_tokens,
                "writer": writer.to_wire()}))
            queued = prefill.client.call("prefill.run", PrefillJob(
                request_id, request.token_ids, decision.prefix_tokens // block,
                request.prefix_reuse, flight.reservation, local_blocks=decision.local_tokens // block,
                source_segment=source_segment, replicate=decision.transfer_tokens > 0,
                deadline_s=max(0.0, flight.deadline - time.monotonic())).to_wire())
        except KVCacheFull as exc:
            self._finish(flight)
            self.metrics.rejections.labels(reason="kv_cache_full").inc()
            raise Rejected(f"rejected: decode worker {decode.name} has no room ({exc.message})",
                           "kv_cache_full") from None
        except MooncakeError as exc:
            failed = decode if flight.reservation is None else prefill
            # A prefill.run without an answer may still have been queued: its pages are left to
            # the late report or to the decode worker, which asks the prefill worker first.
            self._finish(flight)
            self._drop_worker(failed.name, f"failed a call ({exc.message})")
            raise GenerationFailed(f"{failed.role} worker {failed.name} failed: {exc.message}") from None
        if not queued.get("accepted", True):
            # Dropped before it arrived (the decode worker had asked): it will never write.
            flight.prefill_reported = True
            self._finish(flight)
            raise GenerationFailed(f"prefill worker {prefill.name} refused the job: dropped before it arrived")
        return flight

    def generate(self, flight: Flight) -> Iterator[tuple[int, str | None]]:
        """(token, finish_reason) as the workers produce them; GenerationFailed/Timeout on trouble.
        Closing the iterator early (client gone) cancels the request."""
        try:
            report = self._next(flight, "prefill")
            if not report.ok:
                raise GenerationFailed(f"prefill on {flight.decision.prefill_id} failed: {report.error}")
            first = self._prefilled(flight, report)
            started = self._call_decode(flight, "decode.start", {"request_id": flight.request_id,
                                                                 "first_token": first})
            flight.decode_started = True
            finish = started["finish_reason"]
            flight.token_ids.append(first)
            yield first, finish
            last = time.monotonic()
            while finish is None:
                token, finish = self._next(flight, "token")
                now = time.monotonic()
                flight.gaps.append(now - last)
                self.metrics.tbt.observe(now - last)
                last = now
                if token is None:
                    raise GenerationFailed(f"decode on {flight.decision.decode_id} ended: {finish}")
                flight.token_ids.append(token)
                yield token, finish
            flight.completed = True
        finally:
            self._finish(flight)

    def stop(self, flight: Flight, tokens: Generator) -> None:
        """End a request whose client has all it asked for (its stop string or stop token came
        before the worker's own end), from the thread iterating ``tokens``: it counts as completed,
        and its decode pages are freed (decode.release also takes it out of the batch)."""
        flight.stopped = True
        tokens.close()

    def cancel(self, flight: Flight, why: str) -> None:
        """End a request from any thread (its client went away): the thread iterating its tokens
        gets GenerationFailed(why) at once instead of waiting for the next token."""
        flight.events.put(("error", why))

    def _prefilled(self, flight: Flight, report: PrefillReport) -> int:
        """Book the finished prefill with the policy and admit the request to decode."""
        now, decision, size = time.monotonic(), flight.decision, self.sched.block_tokens
        flight.report, flight.ttft = report, now - flight.arrived
        timings = report.timings
        with self.lock:
            self.conductor.prefill_finished(
                flight.request_id, now, transfer_tokens=decision.transfer_tokens,
                transfer_seconds=timings.load if decision.transfer_tokens else None)
            self.conductor.observe_prefill(len(flight.request.token_ids), report.loaded_blocks * size,
                                           timings.compute, decision.prefill_id)
            admitted = self.conductor.admit_decode(flight.request_id, now)
        self.metrics.ttft.observe(flight.ttft)
        self.metrics.prompt_tokens.inc(len(flight.request.token_ids))
        self.metrics.prefix_hit_tokens.inc(report.loaded_blocks * size)
        self.metrics.replicated_blocks.inc(report.replicated_blocks or 0)
        if admitted != decision.decode_id:
            # The KV sits in the planned instance's pages; elsewhere it would have to move again.
            self.metrics.rejections.labels(reason=REJECT_DECODE).inc()
            raise Rejected(f"rejected after prefill: decode worker {decision.decode_id} is full", REJECT_DECODE)
        return report.first_token

    def _next(self, flight: Flight, kind: str) -> Any:
        try:
            event = flight.events.get(timeout=max(0.0, flight.deadline - time.monotonic()))
        except queue.Empty:
            raise GenerationTimeout(f"no {kind} within request_timeout "
                                    f"({self.config.request_timeout:g}s)") from None
        if event[0] == "error":
            raise GenerationFailed(event[1])
        return event[1] if kind == "prefill" else event[1:]

    def _call_decode(self, flight: Flight, op: str, args: dict) -> dict:
        with self.lock:
            decode = self.workers.get(flight.decision.decode_id)
        if decode is None:
            raise GenerationFailed(f"decode worker {flight.decision.decode_id} is gone")
        try:
            return decode.client.call(op, args)
        except InvalidArgument as exc:
            # The worker answered: it is alive, only this request is lost (its reservation expired).
            raise GenerationFailed(f"decode worker {decode.name} refused {op}: {exc.message}") from None
        except MooncakeError as exc:
            self._drop_worker(decode.name, f"failed a call ({exc.message})")
            raise GenerationFailed(f"decode worker {decode.name} failed: {exc.message}") from None

    def _finish(self, flight: Flight) -> None:
        """Close the request's books and free what it holds, however it ended."""
        now, rid = time.monotonic(), flight.request_id
        with self.lock:
            self.conductor.abandon(rid, now)
            free_now = not flight.completed and (flight.decode_started or flight.prefill_reported)
            flight.orphaned = not flight.completed and not free_now and flight.reservation is not None
            if not flight.orphaned:
                self.flights.pop(rid, None)
        self.metrics.requests.labels(outcome="completed" if flight.completed or flight.stopped else "failed").inc()
        if free_now and flight.reservation is not None:
            self._release_pages(flight)

    def _release_pages(self, flight: Flight) -> None:
        with self.lock:
            decode = self.workers.get(flight.decision.decode_id)
        if decode is None:
            return  # the worker is gone, and its pages with it
        try:
            decode.client.call("decode.release", {"request_id": flight.request_id})
        except MooncakeError as exc:
            log.warning("could not free decode pages of %s on %s: %s", flight.request_id, decode.name, exc)

    # -- the cache index, from the master's KV events (daemons.serving.kv_events) ----------------

    def apply_kv_events(self, events: list) -> bool:
        """Apply one batch; False, applying nothing, when the segment map changed: rebuild."""
        with self.lock:
            if not self.index_follower.current(self._segment_locations()):
                return False
            self.index_follower.apply(events)
            return True

    def rebuild_kv_index(self, replicas: list[tuple[str, str]]) -> None:
        with self.lock:
            self.index_follower.rebuild(replicas, self._segment_locations())

    def kv_index_current(self) -> bool:
        with self.lock:
            return self.index_follower.current(self._segment_locations())

    def index_view(self, blocks: list[BlockKey] = ()) -> dict[str, Any]:
        """Sizes of the cache index (the conductor.index op), and who holds ``blocks``."""
        with self.lock:
            index = self.conductor.index
            return {"blocks": index.num_keys(), "locations": index.sizes(), "max_blocks": index.max_blocks,
                    "dropped": index.num_dropped,
                    "holders": {format_key(b): sorted(index.holders(b)) for b in blocks}}

    def _segment_locations(self) -> dict[str, str]:
        """Store segment -> the prefill worker that announces it; under the lock."""
        return {w.load["segment"]: w.name for w in self.workers.values()
                if w.role == "prefill" and isinstance(w.load.get("segment"), str)}

    # -- what the front end shows ----------------------------------------------------------------

    def summary(self, flight: Flight) -> dict:
        report = flight.report
        return {
            "request_id": flight.request_id, "ttft_s": flight.ttft,
            "tbt_s": sum(flight.gaps) / len(flight.gaps) if flight.gaps else None,
            "prompt_tokens": len(flight.request.token_ids),
            "prefix_tokens": (report.loaded_blocks if report else 0) * self.sched.block_tokens,
            "prefill": flight.decision.prefill_id, "decode": flight.decision.decode_id,
            "reason": flight.decision.reason, "transfer_from": flight.decision.transfer_from,
            "timings": asdict(report.timings) if report and report.timings else {},
        }

    def gauges(self) -> dict[Series, float]:
        with self.lock:
            values = {series("mooncake_inflight_requests"): len(self.flights)}
            for name, length in self.conductor.prefill_queue_lengths().items():
                values[series("mooncake_prefill_queue_length", worker=name)] = length
            for name, size in self.conductor.decode_batch_sizes().items():
                values[series("mooncake_decode_batch_size", worker=name)] = size
            values.update(cost_gauges(self.conductor.cost_figures()))
        for role, count in self.worker_counts().items():
            values[series("mooncake_workers", role=role)] = count
        return values

    def health(self, now: float) -> dict[str, Any]:
        """``status``: "unavailable" without a prefill and a decode worker; "degraded" when the
        last ``DEGRADED_AFTER`` requests of the last minute were all rejected (a predictor that
        rejects everything serves nobody, though every worker answers); else "ok"."""
        workers = self.worker_counts()
        with self.lock:
            recent = [accepted for when, accepted in self.admissions if now - when <= DEGRADED_WINDOW_S]
        rejecting = len(recent) >= DEGRADED_AFTER and not any(recent[-DEGRADED_AFTER:])
        status = "unavailable" if not all(workers.values()) else "degraded" if rejecting else "ok"
        return {"ok": status == "ok", "status": status, "workers": workers,
                "recent_requests": len(recent), "recent_rejected": recent.count(False)}

    def worker_counts(self) -> dict[str, int]:
        """Live workers per role, prefill and decode."""
        with self.lock:
            return {role: sum(w.role == role for w in self.workers.values()) for role in ("prefill", "decode")}

    def capacity_tokens(self) -> int:
        """KV tokens the smallest decode worker holds: no request may need more."""
        with self.lock:
            return self.conductor.smallest_kv_capacity()


PREFILL_TERMS = ("fixed", "per_token", "per_token_pair")
TBT_TERMS = ("fixed", "per_sequence", "per_context_token")


def cost_gauges(figures: dict) -> dict[Series, float]:
    """The conductor's cost figures (:meth:`Conductor.cost_figures`) as `/metrics` gauges."""
    values = {series("mooncake_cost_kv_bytes_per_token"): figures["kv_bytes_per_token"],
              series("mooncake_cost_transfer_bandwidth_bytes"): figures["transfer_bandwidth"]}
    for term, coef in zip(PREFILL_TERMS, figures["prefill_coef"]):
        values[series("mooncake_cost_prefill_seconds", term=term)] = coef
    for term, coef in zip(TBT_TERMS, figures["tbt_coef"]):
        values[series("mooncake_cost_tbt_seconds", term=term)] = coef
    return values
