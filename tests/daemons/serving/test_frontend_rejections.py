"""The front end's answers that need no worker: early rejection (429) and no workers (503).

The conductor's policy rejects before any worker is called, so registered (but absent) workers
and a real front end on loopback are all these need.
"""

from __future__ import annotations

import json
import socket

import pytest

from daemons.model import ByteTokenizer
from daemons.serving.http_frontend import build_app
from daemons.asgi.server import HttpServer
from daemons.serving.messages import WorkerCalibration
from daemons.serving.service import ServingService
from tests.daemons.serving.helpers import metric, request
from transfer.errors import InvalidArgument
from transfer.rpc.client_server import Request
from transfer.settings import resolve


@pytest.fixture
def frontend():
    started = []

    def start(**settings) -> tuple[str, ServingService]:
        service = ServingService(resolve(settings, environ={}))
        app = build_app(service, ByteTokenizer(), 259, "mooncake-random", 2**16, 4,
                        read_timeout=service.config.http_read_timeout)
        server = HttpServer(app, "127.0.0.1", 0, grace=1.0,
                            header_timeout=service.config.http_read_timeout).start(timeout=10)
        started.append(server)
        return server.url, service

    yield start
    for server in started:
        server.close()


def _join(service: ServingService, name: str, role: str) -> None:
    service.heartbeat(Request("conductor.heartbeat", {"name": name, "role": role, "address": "tcp://127.0.0.1:9",
                                                      "kv_capacity_tokens": 4096, "credential": "ab" * 16}, [], 0.0))


def test_no_workers_is_503_and_unhealthy(frontend):
    url, _ = frontend()
    status, _, data = request(url, "POST", "/v1/completions", b'{"prompt": "hi"}')
    assert status == 503 and json.loads(data)["error"]["type"] == "no_workers"
    assert request(url, "GET", "/health")[0] == 503


def test_a_request_predicted_to_miss_the_ttft_slo_is_rejected_early_with_retry_after(frontend):
    url, service = frontend(ttft_slo="1ms")
    _join(service, "prefill-0", "prefill")
    _join(service, "decode-0", "decode")
    status, headers, data = request(url, "POST", "/v1/completions", b'{"prompt": "' + b"x" * 2000 + b'"}')
    assert status == 429 and int(headers["Retry-After"]) >= 1
    error = json.loads(data)["error"]
    assert error["reason"] == "reject_ttft" and "predicted TTFT" in error["message"]
    assert metric(url, "mooncake_rejections_total", reason="reject_ttft") == 1
    assert not service.flights and not service.conductor.inflight  # nothing left behind
    assert json.loads(request(url, "GET", "/health")[2])["status"] == "ok"  # one rejection is policy


def test_health_says_degraded_while_the_conductor_rejects_everything(frontend):
    # Forged decode steps once pinned the TBT model so that every request was rejected for
    # minutes while /health said ok.
    url, service = frontend(ttft_slo="1ms")
    _join(service, "prefill-0", "prefill")
    _join(service, "decode-0", "decode")
    for _ in range(10):
        assert request(url, "POST", "/v1/completions", b'{"prompt": "' + b"x" * 2000 + b'"}')[0] == 429
    status, _, data = request(url, "GET", "/health")
    assert status == 503 and json.loads(data)["status"] == "degraded"
    assert json.loads(data)["recent_rejected"] == 10


def test_an_unexpected_error_answers_500_and_the_front_end_keeps_serving(frontend, monkeypatch):
    url, service = frontend()

    def broken_submit(request):
        raise KeyError("a bug in the service")

    monkeypatch.setattr(service, "submit", broken_submit)
    status, _, data = request(url, "POST", "/v1/completions", b'{"prompt": "hi"}')
    assert status == 500 and "KeyError" in json.loads(data)["error"]["message"]
    assert request(url, "GET", "/health")[0] == 503  # still answering


def test_a_workers_calibration_is_planned_with_and_a_bad_one_refused(frontend):
    url, service = frontend()
    beat = {"name": "prefill-0", "role": "prefill", "address": "tcp://127.0.0.1:9", "kv_capacity_tokens": 4096,
            "credential": "ab" * 16}
    with pytest.raises(InvalidArgument):
        service.heartbeat(Request("conductor.heartbeat", {**beat, "calibration": {"prefill_coef": [1.0]}}, [], 0.0))
    assert not service.workers  # refused before it joined
    calibration = WorkerCalibration(2048, 3e8, prefill_coef=(0.001, 2e-4, 1e-7))
    service.heartbeat(Request("conductor.heartbeat", {**beat, "calibration": calibration.to_wire()}, [], 0.0))
    assert metric(url, "mooncake_cost_kv_bytes_per_token") == 2048
    assert metric(url, "mooncake_cost_transfer_bandwidth_bytes") == 3e8
    assert metric(url, "mooncake_cost_prefill_seconds", term="per_token") == 2e-4
    assert service.conductor.prefill_model.predict(1000, 0) == pytest.approx(0.001 + 0.2 + 1e-7 * 1000 * 1000 / 2)


def test_malformed_bodies_are_400_and_a_slow_body_is_408(frontend):
    """Tried as an attacker: 61 of 300 malformed bodies got 500 (a lone surrogate reached the
    tokenizer), and 40 clients trickling their bodies held the front end's connections."""
    url, _ = frontend(http_read_timeout="500ms")
    for body in (b'{"prompt": "\\ud800"}', b'{"prompt": "a\\udfff b"}', b"[" * 5000 + b"]" * 5000,
                 b'{"prompt": "\xff\xfe"}', b'{"prompt": "hi", "max_tokens": NaN}',
                 b'{"messages": [{"role": "user", "content": "\\udc00"}]}'):
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        status, _, data = request(url, "POST", path, body)
        assert status == 400 and json.loads(data)["error"]["code"] == 400, (body[:40], status, data[:200])
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        answer = b""
        while piece := slow.recv(4096):  # within the read timeout, not whenever the client pleases
            answer += piece
        assert answer.startswith(b"HTTP/1.1 408") and b"http_read_timeout" in answer
    for opening in (b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"):  # silent, or slow headers
        with socket.create_connection((host, int(port)), timeout=10) as slow:
            slow.sendall(opening)
            assert slow.recv(4096) == b""  # closed by the server, well before the client's 10 s
