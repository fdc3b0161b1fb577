"""Early rejection through a real cluster: `mooncake up` with a TTFT SLO no prefill can meet,
so the conductor's policy refuses every request before calling a worker and the front end
answers 429 with Retry-After, counts it, and keeps serving."""

from __future__ import annotations

import json

from scheduler.types import REJECT_TTFT
from tests.conftest import Mooncake
from tests.daemons.serving.helpers import SERVING_ENV, metric, prompt, request


def test_a_request_predicted_to_miss_the_ttft_slo_gets_429_with_retry_after(tmp_path):
    runner = Mooncake(tmp_path / "cluster")
    runner.env.update({**SERVING_ENV, "MOONCAKE_PREFILL_WORKERS": "1", "MOONCAKE_DECODE_WORKERS": "1"})
    info = runner.json("up", "--ttft-slo", "1ms", timeout=120)
    try:
        url = next(d for d in info["daemons"] if d["role"] == "conductor")["http_address"]
        body = json.dumps({"prompt": prompt(40, seed=1), "max_tokens": 4}).encode()
        for attempt in (1, 2):
            status, headers, data = request(url, "POST", "/v1/completions", body)
            assert status == 429, data
            assert int(headers["Retry-After"]) >= 1
            assert json.loads(data)["error"]["reason"] == REJECT_TTFT
            assert metric(url, "mooncake_rejections_total", reason=REJECT_TTFT) == attempt
        assert request(url, "GET", "/health")[0] == 200
    finally:
        runner("down", timeout=60)
