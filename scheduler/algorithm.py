"""Algorithm 1 of the paper (prefill selection) and its three baselines.

For every prefill instance the conductor estimates TTFT = queue + prefill on the prefix the
instance holds itself, or transfer + queue + prefill on the best prefix anywhere when that prefix
is longer by more than ``kvcache_balancing_threshold`` tokens, and picks the minimum. With the
threshold on ``auto`` both options are estimated and the cheaper wins, so the break-even point
follows the transfer rate the predictor has observed instead of a hand-tuned constant.

``auto`` also prices what the per-request comparison leaves out: the delay a placement imposes
on the requests that will queue behind it. Algorithm 1 compares instance i's queue + own work
(q_i + D_i, D_i = transfer + prefill there), which is this request's TTFT only; but D_i seconds
of work on a FIFO instance also delay every later request that joins that instance while this one
is still waiting or running, about ``rate * (q_i + D_i)`` of them at the observed arrival rate per
prefill instance. So auto picks by

    cost_i = TTFT_i + D_i * rate * TTFT_i = TTFT_i * (1 + rate * D_i)

which, when the cluster is busy, prefers the placement that adds the least work (the holder of
the prefix, or recomputing a short gap instead of queueing a pull on a busy instance) over
moving to an instance that is only a little less loaded. This is why small fixed thresholds such
as 512 looked slightly better than 0 in the sim: charging a non-holder for the recomputation of
a one-block gap is a crude version of the same bias toward less work (and 512's lead over 0 is
within what a 0.1% change of arrival times moves the mean TTFT by). The other unpriced cost, a
source's NIC serialising pulls, is small in the sim: pulls wait ~12 ms for it on average, ~3 ms
per request. The pull-or-recompute choice on one instance is unchanged by the term (it scales
both sides' D_i alike); it acts on which instance wins. Fixed thresholds keep Algorithm 1's rule.

The baselines of the paper's Figure 5 share the same estimates but choose differently:
random (any instance), load (shortest queue), cache (longest own prefix, then shortest queue).
None of them moves KV between instances. The decode half of the pair is the conductor's
(``Conductor.schedule``), which plans it with the admission forecast.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from collections.abc import Mapping

from scheduler.cache_index import PrefixMatch
from scheduler.config import SchedulerConfig
from scheduler.instances import PrefillQueue
from scheduler.predictors import PrefillTimeModel, TransferTimeModel
from scheduler.types import LOCAL_HIT, MISS, RECOMPUTE, TRANSFER, ScheduleRequest


@dataclass
class PrefillChoice:
    prefill_id: str
    reason: str
    local_tokens: int
    prefix_tokens: int
    transfer_from: str | None
    transfer_blocks: tuple[int, int]  # [start, end) block indices to pull
    t_transfer: float
    t_queue: float
    t_prefill: float

    @property
    def ttft(self) -> float:
        return self.t_transfer + self.t_queue + self.t_prefill


def choose_prefill(request: ScheduleRequest, match: PrefixMatch, queues: Mapping[str, PrefillQueue],
                   now: float, cfg: SchedulerConfig, prefill: PrefillTimeModel,
                   transfer: TransferTimeModel, rng: random.Random,
                   arrival_rate: float = 0.0) -> tuple[PrefillChoice, dict[str, float]]:
    """The prefill instance for ``request`` under ``cfg.policy``, and every candidate's TTFT.

    ``arrival_rate``: requests per second per prefill instance lately; with the auto threshold
    kvcentric charges each candidate the delay its work imposes on that many later arrivals per
    second of its TTFT (module docstring). 0 (or a fixed threshold) picks by TTFT alone.

    This runs for every request on every instance, so it works on plain numbers and builds the
    one PrefillChoice of the winner; estimates that depend only on the prefix length an instance
    holds are shared between instances holding the same length.
    """
    n, bs = request.input_length, cfg.block_tokens
    allow = cfg.policy == "kvcentric" and cfg.transfers
    best_blocks = match.best_len
    best = min(best_blocks * bs, n)
    # (local blocks, model id) -> (prefill, transfer, prefill after pulling the best) seconds
    by_length: dict[tuple[int, int], tuple[float, float, float]] = {}
    rows = []  # (ttft, queue, local_blocks, pulls, by_length key)
    for instance_id, queue in queues.items():
        blocks = match.lengths.get(instance_id, 0)
        model = queue.model or prefill  # a CPP group plans with its own model
        key = (blocks, id(model))
        times = by_length.get(key)
        if times is None:
            local = min(blocks * bs, n)
            times = by_length[key] = (model.predict(n, local), transfer.predict(best - local),
                                      model.predict(n, best))
        t_queue = queue.queue_time(now)
        ttft, pulls = t_queue + times[0], False
        # An instance short of the best prefix is not among its holders, so a source exists.
        if allow and best_blocks > blocks:
            pulled = times[1] + t_queue + times[2]
            if cfg.threshold is None:
                pulls = pulled < ttft
            else:
                pulls = best - min(blocks * bs, n) > cfg.threshold
            if pulls:
                ttft = pulled
        rows.append((ttft, t_queue, blocks, pulls, key))
    ids = list(queues)
    candidates = {ids[ix]: row[0] for ix, row in enumerate(rows)}
    if cfg.policy == "random":
        pick = rng.randrange(len(rows))
    elif cfg.policy == "load":
        pick = min(range(len(rows)), key=lambda ix: (rows[ix][1], ix))
    elif cfg.policy == "cache":
        pick = min(range(len(rows)), key=lambda ix: (-rows[ix][2], rows[ix][1], ix))
    elif cfg.threshold is None and arrival_rate > 0:
        # ttft * (1 + rate * own work): own TTFT plus own work times the later arrivals it delays.
        # Among the candidates that meet the TTFT SLO, if any: the charge must not turn a request
        # that one instance could serve in time into a rejection.
        slo = cfg.ttft_slo

        def cost(ix: int) -> tuple[bool, float, int]:
            ttft, t_queue = rows[ix][0], rows[ix][1]
            return slo > 0 and ttft > slo, ttft * (1.0 + arrival_rate * (ttft - t_queue)), ix
        pick = min(range(len(rows)), key=cost)
    else:
        pick = min(range(len(rows)), key=lambda ix: (rows[ix][0], ix))
    _, t_queue, blocks, pulls, key = rows[pick]
    local = min(blocks * bs, n)
    t_prefill, t_transfer, t_best = by_length[key]
    if pulls:
        # Spread pulls of a hot prefix over its holders; the same request always picks the same.
        holders = match.best_holders
        source = holders[zlib.crc32(request.request_id.encode()) % len(holders)]
        return PrefillChoice(ids[pick], TRANSFER, local, best, source, (blocks, best_blocks),
                             t_transfer, t_queue, t_best), candidates
    reason = RECOMPUTE if best_blocks > blocks else (LOCAL_HIT if local else MISS)
    return PrefillChoice(ids[pick], reason, local, local, None, (blocks, blocks), 0.0, t_queue,
                         t_prefill), candidates
