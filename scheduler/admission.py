"""Overload control: reject at arrival, before prefill spends GPU time on a doomed request.

Plain early rejection reads the decode load *now*. Because a request reaches decode only after
its prefill, that load is stale: while decode is full, arrivals are turned away, prefill idles,
decode drains, a burst is accepted, and the pools oscillate in anti-phase (paper, section 8).

The prediction-based variant forecasts the decode load at the moment the request's prefill would
finish, with the paper's system-level model: every request occupies decode for the same time
``t_d`` (learned from observed decode durations). Starting from the requests decoding now, the
forecast for time t removes those whose ``start + t_d`` falls in (now, t] and adds those in
prefill predicted to finish by t. Requests already past ``t_d`` stay: they are certainly still
there now, and output lengths are heavy-tailed, so assuming they just left undercounts the load.
The load is the TBT of that average batch relative to the SLO.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.predictors import DecodeTbtModel


@dataclass
class DecodeForecast:
    occupancy: float  # t_d, seconds a request stays in decode
    smoothing: float = 0.05
    prefilling: dict[str, tuple[float, int]] = field(default_factory=dict)  # rid -> (finish, ctx)
    decoding: dict[str, tuple[float, int]] = field(default_factory=dict)  # rid -> (start, ctx)

    def prefill_planned(self, request_id: str, finish: float, context: int) -> None:
        self.prefilling[request_id] = (finish, context)

    def decode_started(self, request_id: str, now: float) -> None:
        _, context = self.prefilling.pop(request_id, (now, 0))
        self.decoding[request_id] = (now, context)

    def dropped(self, request_id: str) -> None:
        self.prefilling.pop(request_id, None)
        self.decoding.pop(request_id, None)

    def decode_finished(self, request_id: str, now: float) -> None:
        started = self.decoding.pop(request_id, None)
        if started is not None:
            self.occupancy += self.smoothing * ((now - started[0]) - self.occupancy)

    def load_at(self, now: float, t: float, context: int, num_decode: int, kv_capacity: int,
                model: DecodeTbtModel, tbt_slo: float) -> float:
        """Forecast mean decode load at time t >= now if one more request of ``context`` joined."""
        t_d = self.occupancy
        count, total = 1, context
        for start, ctx in self.decoding.values():
            if not now < start + t_d <= t:
                count, total = count + 1, total + ctx
        for finish, ctx in self.prefilling.values():
            if finish <= t < finish + t_d:
                count, total = count + 1, total + ctx
        batch, per_instance = count / num_decode, total / num_decode
        kv = per_instance / kv_capacity if kv_capacity else 0.0
        if tbt_slo <= 0:
            return kv
        return max(model.predict(batch, per_instance) / tbt_slo, kv)
