"""The conductor's policy facade: what the conductor daemon (and the simulator) calls.

Lifecycle of one request, every call taking the time ``now`` as an argument:

    decision = conductor.schedule(request, now)        # pick (prefill, decode) or reject (429)
    conductor.prefill_finished(request_id, now, ...)   # the worker reports; queue advances
    decode_id = conductor.admit_decode(request_id, now)  # None: rejected at decode
    conductor.decode_finished(request_id, now)

Cache state arrives as events on the index: live, the master's KV events
(:mod:`daemons.serving.kv_events`); in the simulator, its own caches' ``index.block_stored`` and
``block_evicted`` (``conductor.blocks_stored(instance_id, keys)`` for callers without an index of
their own, such as `bench sched`). A request that ends early, however it ended, is closed with
``conductor.abandon(request_id, now)``. A decision that pulls a prefix names ``transfer_from`` and
lists ``transfer_keys``: the prefill instance pulls those blocks from the holder (live: from the
store segment that holder's worker owns) and keeps a replica of them in its own, and the
master's event for that replica makes it a holder of the hot prefix. Live, the KV goes to the planned decode instance layer by layer while the prefill
computes, and the prefill reports once its last layer is there.

Costs: the predictors start from the configured figures; workers measure this machine's at start
and the daemon installs them (``install_calibration``), then live samples refit the prefill and
TBT models (``observe_prefill`` / ``observe_decode``) and, with the auto threshold, the transfer
model (``prefill_finished``). ``cost_figures`` tells what the conductor plans with now.
"""

from __future__ import annotations

import random
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

from scheduler.admission import DecodeForecast
from scheduler.algorithm import choose_prefill
from scheduler.cache_index import CacheIndex
from scheduler.config import SchedulerConfig
from scheduler.cpp import CppPrefillTimeModel
from scheduler.errors import NoInstances, UnknownRequest
from scheduler.instances import DecodeBatch, PrefillQueue
from scheduler.predictors import DecodeTbtModel, PrefillTimeModel, TransferTimeModel
from scheduler.types import REJECT_TBT, REJECT_TTFT, Decision, ScheduleRequest

PREFILL_SAMPLES = 512  # recent worker timings the prefill model is fitted on
PREFILL_REFIT = 64  # samples between refits once warm: a fit costs ~100 us, a decision ~50 us
# The first refit comes after this many samples, the next ones after as many again as there were
# (8, 16, 32, 64, then every PREFILL_REFIT): a start-up profile times the bare forward pass, the
# served path more (layers sent and stored as they are computed, other workers on the same
# cores), and the plan should follow the served costs within a handful of requests.
PREFILL_FIRST_REFIT = 8
# While few, the live samples are fitted together with the model they refine (the profile, or
# the configured figures), counted as this many samples; its weight fades to 0 by PREFILL_REFIT
# samples, which determine the curve alone.
PREFILL_PRIOR_SAMPLES = 4.0
DECODE_SAMPLES = 512  # recent decode steps the TBT model is fitted on
DECODE_REFIT = 64  # steps between refits (a busy decode worker reports hundreds a second)
OUTLIER_FACTOR = 10.0  # a step this many times slower than predicted and than usual is not fitted
ARRIVAL_SAMPLES = 256  # recent admissions the auto threshold's arrival rate is measured over


@dataclass
class _InFlight:
    prefill_id: str
    decode_id: str | None
    context: int
    prefilled: bool = False  # prefill_finished was called
    decoding: bool = False


class Conductor:
    def __init__(self, cfg: SchedulerConfig | None = None, *, index: CacheIndex | None = None,
                 prefill_model: PrefillTimeModel | None = None,
                 transfer_model: TransferTimeModel | None = None,
                 tbt_model: DecodeTbtModel | None = None) -> None:
        self.cfg = cfg or SchedulerConfig()
        self.index = index or CacheIndex()
        self.prefill_model = prefill_model or PrefillTimeModel()
        self.transfer_model = transfer_model or TransferTimeModel(
            self.cfg.bytes_per_token, self.cfg.bandwidth)
        # Only the auto threshold compares options on the transfer estimate, so only it learns.
        self.transfer_model.learn = self.cfg.threshold is None
        self.tbt_model = tbt_model or DecodeTbtModel()
        self.forecast = DecodeForecast()
        self.prefill_samples: deque[tuple[int, int, float]] = deque(maxlen=PREFILL_SAMPLES)
        self._since_refit = 0
        self._prefill_prior = self.prefill_model  # what early refits start from
        self.decode_samples: deque[tuple[int, int, float]] = deque(maxlen=DECODE_SAMPLES)
        self._since_decode_refit = 0
        self._recent_step_ratios: deque[float] = deque(maxlen=DECODE_REFIT)  # measured / predicted
        self.num_decode_outliers = 0
        # A live refit has happened since the start: a later worker's start-up profile must not
        # replace what the cluster's own samples taught.
        self._prefill_refitted = self._tbt_refitted = False
        self._calibrated_bandwidth: float | None = None  # slowest pull a worker measured
        self.prefill: dict[str, PrefillQueue] = {}
        self.decode: dict[str, DecodeBatch] = {}
        self.inflight: dict[str, _InFlight] = {}
        self._rng = random.Random(self.cfg.seed)
        # Times of recent admissions to prefill: the auto threshold charges a placement for the
        # later arrivals its work delays, at this observed rate (scheduler.algorithm).
        self._admitted: deque[float] = deque(maxlen=ARRIVAL_SAMPLES)

    # -- membership ---------------------------------------------------------------------------

    def add_prefill(self, instance_id: str, model: Any = None) -> None:
        """``model``: the instance's own prefill time model (a CPP group is one instance whose
        long prompts run faster than one worker's); None plans it with the shared one."""
        self.prefill.setdefault(instance_id, PrefillQueue(instance_id, model))

    def add_decode(self, instance_id: str, kv_capacity_tokens: int) -> None:
        self.decode.setdefault(instance_id, DecodeBatch(instance_id, kv_capacity_tokens))

    def group_model(self, stages: int, chunk: int) -> CppPrefillTimeModel:
        """The time model a CPP group of ``stages`` prefilling ``chunk`` tokens per chunk plans
        with, built on the shared single-worker model (so it follows that model's refits)."""
        return CppPrefillTimeModel(self.prefill_model, stages, chunk)

    def remove_instance(self, instance_id: str) -> None:
        self.prefill.pop(instance_id, None)
        self.decode.pop(instance_id, None)
        self.index.location_removed(instance_id)

    # -- lifecycle ----------------------------------------------------------------------------

    def schedule(self, request: ScheduleRequest, now: float) -> Decision:
        """Algorithm 1: the (prefill, decode) pair with the least TTFT, or a rejection."""
        if not self.prefill or not self.decode:
            raise NoInstances(f"{len(self.prefill)} prefill and {len(self.decode)} decode instances")
        cfg = self.cfg
        match = self.index.match(request.block_keys)
        choice, candidates = choose_prefill(request, match, self.prefill, now, cfg,
                                            self.prefill_model, self.transfer_model, self._rng,
                                            self.arrival_rate(now) if cfg.threshold is None else 0.0)
        context = request.input_length + request.expected_output
        decision = Decision(
            request.request_id, choice.reason, choice.prefill_id, None, choice.prefix_tokens,
            choice.local_tokens, choice.transfer_from,
            tuple(request.block_keys[choice.transfer_blocks[0]:choice.transfer_blocks[1]]),
            choice.t_transfer, choice.t_queue, choice.t_prefill, choice.ttft, 0.0, candidates)
        if cfg.ttft_slo > 0 and choice.ttft > cfg.ttft_slo:
            decision.reason = REJECT_TTFT
            return decision
        # Every policy plans the request onto the instance its books say is least loaded, counting
        # the requests already sent to prefill for it: Algorithm 1 picks the (prefill, decode) pair
        # at arrival and the KV streams to that decode node during prefill (paper, Figure 3, s3),
        # so spreading those reservations is plain load balancing. Balancing on the current load
        # alone would send every arrival between two decode events to the same instance.
        decode_id, forecast = self.forecast.least_loaded(self.decode, context, self.tbt_model,
                                                         cfg.tbt_slo)
        # What each admission reads at arrival (the paper's section 8): "none" nothing (it finds
        # out after prefill, in admit_decode); "early" the planned instance's load now, which lags
        # by the prefill time; "predictive" its load when this prefill ends. Both reject when the
        # request would push that load past the TBT SLO (or the instance's KV memory).
        load = forecast if cfg.admission == "predictive" else \
            self.decode[decode_id].load_with(self.tbt_model, cfg.tbt_slo, context)
        decision.decode_id, decision.decode_load = decode_id, load
        if cfg.admission != "none" and load > 1.0:
            decision.decode_id, decision.reason = None, REJECT_TBT
            return decision
        self.prefill[choice.prefill_id].enqueue(request.request_id, choice.ttft - choice.t_queue, now)
        self._admitted.append(now)
        self.forecast.prefill_planned(request.request_id, decode_id, context)
        self.inflight[request.request_id] = _InFlight(choice.prefill_id, decode_id, context)
        return decision

    def prefill_finished(self, request_id: str, now: float, *, transfer_tokens: int = 0,
                         transfer_seconds: float | None = None) -> None:
        """The prefill instance is done (its KV is streaming to decode)."""
        flight = self._flight(request_id)
        flight.prefilled = True
        queue = self.prefill.get(flight.prefill_id)
        if queue is not None:
            queue.finish(request_id, now)
        if transfer_seconds is not None:
            self.transfer_model.observe(transfer_tokens, transfer_seconds)

    def admit_decode(self, request_id: str, now: float) -> str | None:
        """Start decoding the prefilled request on its planned instance, or reject it (None)
        when that instance cannot take it within the TBT SLO.

        Only the planned instance: its KV was streamed there layer by layer during prefill
        (paper, Figure 3, s3), so another instance would need the whole KV moved again, and the
        paper's baseline rejects here. This is also the check that still catches, under early
        rejection, the burst admitted while decode looked idle.
        """
        flight = self._flight(request_id)
        self.forecast.landed(request_id)
        batch = self.decode.get(flight.decode_id)
        if batch is None or batch.load_with(self.tbt_model, self.cfg.tbt_slo, flight.context) > 1.0:
            del self.inflight[request_id]
            return None
        flight.decoding = True
        batch.admit(request_id, flight.context)
        return flight.decode_id

    def decode_finished(self, request_id: str, now: float) -> None:
        flight = self.inflight.pop(request_id, None)
        if flight is None:
            return
        if flight.decode_id in self.decode:
            self.decode[flight.decode_id].release(request_id)

    def abandon(self, request_id: str, now: float) -> None:
        """Close the books of a request that ends, however it ended: a prefill never reported
        frees its queue slot and its forecast on the planned decode instance, a decode admitted
        frees its batch slot. Nothing happens for a request no longer in flight (finished, or
        rejected at decode)."""
        flight = self.inflight.get(request_id)
        if flight is None:
            return
        if not flight.prefilled:
            self.prefill_finished(request_id, now)
            self.forecast.landed(request_id)
        self.decode_finished(request_id, now)

    def blocks_stored(self, instance_id: str, keys: list) -> None:
        """The prefill instance stored these blocks: it holds the prefix now. A report from an
        instance removed meanwhile (its worker was dropped) is ignored: its blocks went with it."""
        if instance_id in self.prefill:
            self.index.block_stored(instance_id, keys)

    # -- what the instances hold now ---------------------------------------------------------

    def prefill_queue_lengths(self) -> dict[str, int]:
        return {name: queue.num_queued for name, queue in self.prefill.items()}

    def prefill_queue_times(self, now: float) -> dict[str, float]:
        return {name: queue.queue_time(now) for name, queue in self.prefill.items()}

    def decode_batch_sizes(self) -> dict[str, int]:
        return {name: batch.batch for name, batch in self.decode.items()}

    def smallest_kv_capacity(self) -> int:
        """KV tokens the smallest decode instance holds (0 with none)."""
        return min((batch.kv_capacity for batch in self.decode.values()), default=0)

    def observe_prefill(self, input_length: int, prefix_tokens: int, seconds: float,
                        instance_id: str | None = None) -> bool:
        """A worker's measured prefill time; refits the prefill model by least squares over the
        last ``PREFILL_SAMPLES``: after ``PREFILL_FIRST_REFIT`` samples, then after as many again
        as it had (up to every ``PREFILL_REFIT``), the first fits leaning on the model they
        refine (``PREFILL_PRIOR_SAMPLES``). True when it refitted.

        Profiled coefficients drift from what the workers achieve (the profile times a bare
        forward pass, the served path also sends and stores each layer, on cores other workers
        share; other kernels, other hardware, a shifted length mix); the TTFT estimates, and so
        every choice, follow the workers only if the model is refitted from what they report.

        The shared model is one worker's: a CPP group's pipelined prefill (``instance_id``
        plans with a :class:`CppPrefillTimeModel` and the prompt had more new tokens than its
        chunk) runs faster than that curve and would bend it, so it is left out. A group's
        short prompt ran on its first stage alone, which is one worker's run, and counts.
        A group's model is built on the shared one, so it follows the refit too.
        """
        group = self.prefill[instance_id].model if instance_id in self.prefill else None
        if isinstance(group, CppPrefillTimeModel) and input_length - prefix_tokens > group.chunk:
            return False
        self.prefill_samples.append((input_length, prefix_tokens, seconds))
        self._since_refit += 1
        seen = len(self.prefill_samples)
        if self._since_refit < min(PREFILL_REFIT, max(PREFILL_FIRST_REFIT, seen - self._since_refit)):
            return False
        self._since_refit = 0
        prior_weight = PREFILL_PRIOR_SAMPLES * max(0.0, 1.0 - seen / PREFILL_REFIT)
        try:
            fitted = PrefillTimeModel.fit(self.prefill_samples, self._prefill_prior, prior_weight)
        except ValueError:
            return False  # too uniform a sample to identify the curve: keep the old model
        self._use_prefill_model(fitted)
        self._prefill_refitted = True
        return True

    def observe_decode(self, batch: int, context_tokens: int, seconds: float) -> bool:
        """A decode worker's measured step (``batch`` sequences holding ``context_tokens``);
        refits the TBT model every ``DECODE_REFIT`` steps over the last ``DECODE_SAMPLES``.
        True when it refitted.

        Admission predicts each decode instance's TBT with this model: with profiled
        coefficients a slower worker would be filled past its SLO, a faster one turned away.
        """
        if batch <= 0:
            return False
        ratio = seconds / max(self.tbt_model.predict(batch, context_tokens), 1e-9)
        self._recent_step_ratios.append(ratio)
        if ratio > OUTLIER_FACTOR * max(1.0, statistics.median(self._recent_step_ratios)):
            # Far from the prediction AND from what steps recently took: a stall (or a forged
            # report), not this machine's cost; fitted in, a few would pin admission shut. A
            # real change of speed moves the median too, and is then fitted.
            self.num_decode_outliers += 1
            return False
        self.decode_samples.append((batch, context_tokens, seconds))
        self._since_decode_refit += 1
        if self._since_decode_refit < DECODE_REFIT:
            return False
        self._since_decode_refit = 0
        try:
            self.tbt_model = DecodeTbtModel.fit(self.decode_samples)
        except ValueError:
            return False  # one batch size and context so far: keep the old model
        self._tbt_refitted = True
        return True

    # -- this machine's costs -----------------------------------------------------------------

    def install_calibration(self, *, bytes_per_token: int | None = None, bandwidth: float | None = None,
                            prefill_coef: tuple[float, float, float] | None = None,
                            tbt_coef: tuple[float, float, float] | None = None) -> None:
        """Plan with what a worker measured at start (each figure None: not measured).

        - ``bytes_per_token``, from the served model's KV layout, is exact: always installed.
        - ``bandwidth`` of a prefix pull: the slowest any worker measured, because a pull may come
          from any holder and the slow path is the one that makes a transfer not worth it.
        - The prefill and TBT coefficients replace the configured ones, but never a model the
          live samples refitted: those describe this cluster at work, a profile only its start.

        Installing a transfer figure restarts the transfer model's learned line from it: what
        it learned was measured against the old figures' prior.
        """
        if bandwidth is not None and bandwidth > 0:
            slowest = self._calibrated_bandwidth
            self._calibrated_bandwidth = bandwidth if slowest is None else min(slowest, bandwidth)
        if bytes_per_token is not None or bandwidth is not None:
            current = self.transfer_model
            self.transfer_model = TransferTimeModel(
                bytes_per_token or current.bytes_per_token, self._calibrated_bandwidth or current.bandwidth,
                current.latency, learn=current.learn, decay=current.decay)
        if prefill_coef is not None and not self._prefill_refitted:
            self._prefill_prior = PrefillTimeModel(prefill_coef)
            self._use_prefill_model(self._prefill_prior)
        if tbt_coef is not None and not self._tbt_refitted:
            self.tbt_model = DecodeTbtModel(tbt_coef)

    def cost_figures(self) -> dict:
        """What the policy plans with now: KV bytes per token, pull bandwidth (bytes/s), the
        prefill and TBT coefficients, and the transfer model's learned line."""
        transfer = self.transfer_model
        return {"kv_bytes_per_token": transfer.bytes_per_token, "transfer_bandwidth": transfer.bandwidth,
                "transfer_seconds_per_token": transfer.seconds_per_token, "transfer_fixed": transfer.fixed,
                "prefill_coef": list(self.prefill_model.coef), "tbt_coef": list(self.tbt_model.coef)}

    def _use_prefill_model(self, model: PrefillTimeModel) -> None:
        """The shared single-worker model; CPP groups' models are built on it and follow."""
        self.prefill_model = model
        for queue in self.prefill.values():
            if isinstance(queue.model, CppPrefillTimeModel):
                queue.model.single = model

    def arrival_rate(self, now: float) -> float:
        """Requests per second per prefill instance admitted lately (the last
        ``ARRIVAL_SAMPLES`` admissions, up to ``now``); 0 until two came at different times."""
        if len(self._admitted) < 2 or not self.prefill:
            return 0.0
        span = now - self._admitted[0]
        if span <= 0:
            return 0.0
        return (len(self._admitted) - 1) / span / len(self.prefill)

    # -- helpers ------------------------------------------------------------------------------

    def _flight(self, request_id: str) -> _InFlight:
        try:
            return self.inflight[request_id]
        except KeyError:
            raise UnknownRequest(f"no request {request_id!r} in flight") from None

