"""Overload control: reject at arrival, before prefill spends GPU time on a doomed request.

Plain early rejection reads the decode load *now*. Because a request reaches decode only after
its prefill, that load is stale: while decode has room, a burst is accepted whose prefills are
still running, they land together and overflow decode (their prefill is wasted at decode); while
decode is full, arrivals are turned away although slots free up before their prefill would end,
so prefill idles, decode drains, and the pools oscillate in anti-phase (paper, section 8).

The prediction-based variant forecasts, per decode instance, the batch this request will join
when its prefill ends: the requests decoding there now plus every request already admitted to
prefill and planned onto that instance. All of those land within the TTFT SLO, which is far
shorter than a request's stay in decode (tens of seconds), so the new request shares decode with
each of them whichever lands first. A request is admitted only onto an instance whose forecast
stays within the SLO, and that instance becomes its plan, so the next arrival's forecast already
counts it: admissions can no longer outrun what decode will hold.

The conductor plans every request on the instance of least forecast (load balancing by its own
books) whatever the admission, so the three differ only in what they test there at arrival:
nothing (the baseline), the load now (early), the forecast (predictive). Each landing is tested
again on that instance after prefill, where the baseline and a stale early admission reject.

Departures within the prefill window are deliberately not subtracted. Subtracting them with the
paper's uniform-occupancy model (a request leaves ``t_d`` after it started) was measured on the
conversation trace (8P+8D, 2x): it admits more while prefill queues lengthen, which widens the
window and admits more again, and ends with more rejections (1,621-1,898) than this forecast
(1,210); departures that do happen are seen by the next arrivals anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping

from scheduler.instances import DecodeBatch
from scheduler.predictors import DecodeTbtModel


@dataclass
class DecodeForecast:
    planned: dict[str, dict[str, int]] = field(default_factory=dict)  # decode -> rid -> context
    where: dict[str, str] = field(default_factory=dict)  # rid -> decode instance it is planned on

    def prefill_planned(self, request_id: str, decode_id: str, context: int) -> None:
        self.planned.setdefault(decode_id, {})[request_id] = context
        self.where[request_id] = decode_id

    def landed(self, request_id: str) -> None:
        """Prefill ended: the request is now in a decode batch (or was rejected at decode)."""
        decode_id = self.where.pop(request_id, None)
        if decode_id is not None:
            del self.planned[decode_id][request_id]

    def load_at(self, batch: DecodeBatch, context: int, model: DecodeTbtModel,
                tbt_slo: float) -> float:
        """Forecast load (TBT/SLO or KV fill) of ``batch``'s instance once ``context`` joins."""
        planned = self.planned.get(batch.instance_id)
        count, total = batch.batch + 1, batch.context + context
        if planned:
            count, total = count + len(planned), total + sum(planned.values())
        kv = total / batch.kv_capacity if batch.kv_capacity else 0.0
        if tbt_slo <= 0:
            return kv
        return max(model.predict(count, total) / tbt_slo, kv)

    def least_loaded(self, batches: Mapping[str, DecodeBatch], context: int,
                     model: DecodeTbtModel, tbt_slo: float) -> tuple[str, float]:
        """The instance with the least forecast load once ``context`` joins, and that load."""
        best_id, best_load = "", float("inf")
        for instance_id, batch in batches.items():
            load = self.load_at(batch, context, model, tbt_slo)
            if load < best_load:
                best_id, best_load = instance_id, load
        return best_id, best_load
