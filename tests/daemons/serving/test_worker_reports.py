"""What workers report to the conductor is checked before it is believed.

Tried as an attacker on the host: a heartbeat with ``kv_capacity_tokens: "x"`` made later
completions 500, one under a live worker's name made them 502, and 64 ``conductor.tokens`` calls
with ``step_s: 30`` refitted the TBT model so that every completion was rejected for minutes.
"""

from __future__ import annotations

import pytest

from daemons.serving.messages import DecodeStep
from daemons.serving.service import ServingService
from transfer.errors import InvalidArgument
from transfer.rpc.client_server import Request
from transfer.settings import resolve

CREDENTIAL = "ab" * 16
BEAT = {"name": "decode-0", "role": "decode", "address": "tcp://127.0.0.1:9", "kv_capacity_tokens": 4096,
        "credential": CREDENTIAL}


def beat(service: ServingService, **fields) -> None:
    service.heartbeat(Request("conductor.heartbeat", {**BEAT, **fields}, [], 0.0))


def step(service: ServingService, seconds: float, worker: str = "decode-0", credential: str = CREDENTIAL) -> None:
    service.tokens(Request("conductor.tokens", DecodeStep(worker, seconds, 8, 8000, [], credential).to_wire(), [], 0.0))


@pytest.fixture
def service():
    return ServingService(resolve({"worker_timeout": "2s"}, environ={}))


@pytest.mark.parametrize("bad", [
    {"kv_capacity_tokens": "x"}, {"kv_capacity_tokens": -1}, {"kv_capacity_tokens": True},
    {"role": "admin"}, {"name": "../x"}, {"name": 7}, {"address": "http://evil"}, {"address": ""},
    {"running": -3}, {"segment": 5}, {"writers": [{"host": "h", "pid": "x", "started": 0}]},
    {"group_size": 0, "prefill_chunk": 512}, {"calibration": {"kv_bytes_per_token": "many"}},
    {"credential": "short"}, {"credential": None},
])
def test_a_malformed_heartbeat_is_refused_and_joins_nothing(service, bad):
    with pytest.raises(InvalidArgument):
        beat(service, **bad)
    assert not service.workers and not service.conductor.decode_batch_sizes()


def test_a_live_workers_name_cannot_be_taken_over(service, monkeypatch):
    beat(service)
    with pytest.raises(InvalidArgument, match="live decode worker"):
        beat(service, address="tcp://127.0.0.1:10")
    with pytest.raises(InvalidArgument, match="live decode worker"):  # same address, not its credential
        beat(service, credential="cd" * 16)
    assert service.workers["decode-0"].address == "tcp://127.0.0.1:9"
    beat(service)  # the real one goes on beating
    # Silent past worker_timeout (a restart elsewhere), the name is free again.
    service.workers["decode-0"].last_seen -= 5.0
    beat(service, address="tcp://127.0.0.1:10", credential="cd" * 16)
    assert service.workers["decode-0"].address == "tcp://127.0.0.1:10"


def test_decode_steps_are_checked_and_outliers_do_not_pin_the_tbt_model(service):
    beat(service)
    with pytest.raises(InvalidArgument, match="no decode worker"):
        step(service, 0.01, worker="decode-9")
    with pytest.raises(InvalidArgument, match="no decode worker"):  # its name, not its credential
        step(service, 0.01, credential="cd" * 16)
    for bad in ({"step_s": "x"}, {"step_s": -1.0}, {"step_s": 1e9}, {"events": [[1, 2]]}, {"batch": -1}):
        with pytest.raises(InvalidArgument):
            service.tokens(Request("conductor.tokens", {**DecodeStep("decode-0", 0.01, 8, 8000, [], CREDENTIAL).to_wire(),
                                                        **bad},
                                   [], 0.0))
    typical = service.conductor.tbt_model.predict(8, 8000)
    for i in range(640):  # a busy worker's real steps, with 64 forged 30-second ones among them
        step(service, 30.0 if i % 10 == 5 else typical * (1.0 + 0.01 * (i % 7)))
    assert service.conductor.num_decode_outliers == 64
    assert service.conductor.tbt_model.predict(8, 8000) < 2 * typical
