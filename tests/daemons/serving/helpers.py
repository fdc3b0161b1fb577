"""Talking to a serving cluster from tests: HTTP calls, the reference model, prompts."""

from __future__ import annotations

import http.client
import json
import random
import re
import time
from urllib.parse import urlsplit

import torch

from daemons.model import build_model, generate_reference
from scheduler.block_hash import format_key, prefix_block_keys
from transfer.rpc.client_server import RpcClient
from transfer.settings import resolve

# A cluster small enough to start quickly and to fault quickly: 32-token blocks, 2 s worker timeout.
SERVING_ENV = {
    "MOONCAKE_PREFILL_WORKERS": "2", "MOONCAKE_DECODE_WORKERS": "2", "MOONCAKE_KV_BLOCK_TOKENS": "32",
    "MOONCAKE_KV_CACHE_SIZE": "16MiB", "MOONCAKE_SEGMENT_SIZE": "64MiB", "MOONCAKE_WORKER_TIMEOUT": "1s",
    "MOONCAKE_REQUEST_TIMEOUT": "30s", "MOONCAKE_HTTP_MAX_BODY": "64KiB",
    # Shorter than many streams here: the body read timeout must not cut a stream's answer.
    "MOONCAKE_HTTP_READ_TIMEOUT": "1s",
    # Each worker imports torch and builds its model before it answers: on a loaded 2-core
    # machine a prefill group's stages took longer than the 20 s default to come up.
    "MOONCAKE_START_TIMEOUT": "90s",
    # The start-up profile's fewest shapes (enough to fit): tests check that costs are measured
    # and installed, not how well, and every worker start pays it.
    "MOONCAKE_CALIBRATION_TIME": "1ms",
    # These tests check serving and faults, not admission (test_rejection_cluster.py does): on a
    # loaded CI machine the TBT the decode workers measured for one sequence passed the 100 ms
    # default, and the fault tests' follow-up requests were rejected early (reject_tbt, load 1.07).
    "MOONCAKE_TBT_SLO": "0",
}
BLOCK = 32


def prompt(length: int, seed: int) -> list[int]:
    """BOS and ``length - 1`` random bytes, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [256] + [rng.randrange(256) for _ in range(length - 1)]


class Reference:
    """The same model as the workers (default model settings), generating in this process."""

    def __init__(self) -> None:
        torch.set_num_threads(1)  # as the workers: KV must come out bit for bit the same
        self.model = build_model(resolve({}, environ={}))

    def tokens(self, prompt_tokens: list[int], max_tokens: int) -> list[int]:
        return generate_reference(self.model, prompt_tokens, max_tokens)


JSON = {"Content-Type": "application/json"}


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None, timeout: float = 30) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One HTTP call (status, headers looked up case-insensitively, body); a body is sent as JSON
    unless ``headers`` say otherwise."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request(method, path, body, JSON if headers is None and body is not None else headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def complete(url: str, **body) -> dict:
    status, _, data = request(url, "POST", "/v1/completions", json.dumps(body).encode())
    assert status == 200, data
    return json.loads(data)


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of /metrics (0 when absent)."""
    _, _, text = request(url, "GET", "/metrics")
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    for line in text.decode().splitlines():
        if line.startswith(wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def busy_instance(url: str, gauge: str, instances: list[str], deadline: float) -> str:
    """The first of ``instances`` whose ``gauge`` shows work, polling until ``deadline``."""
    while time.monotonic() < deadline:
        for name in instances:
            if metric(url, gauge, worker=name) > 0:
                return name
        time.sleep(0.01)
    raise AssertionError(f"no instance got busy on {gauge}")


def sse_events(url: str, body: dict, timeout: float):
    """Yield each event of a streamed completion as it arrives (dicts, then "[DONE]")."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}).encode(), JSON)
        response = connection.getresponse()
        assert response.status == 200, response.read()
        for line in response:
            if match := re.match(rb"data: (.*)", line):
                data = match.group(1).strip()
                yield "[DONE]" if data == b"[DONE]" else json.loads(data)
    finally:
        connection.close()


def wait_until(predicate, timeout: float = 10.0, what: object = "condition not reached in time") -> None:
    """Poll ``predicate`` until it is true; fail with ``what`` (or what it returns, if callable)
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def wait_for_holders(conductor, blocks: list[str], expected: list[str], timeout: float = 10.0) -> None:
    """Wait until the conductor's index (``conductor.index``, through RpcClient ``conductor``)
    names exactly ``expected`` as the holders of every block in ``blocks`` (formatted keys): a
    worker's puts end after its report, and the index learns them from the master's events."""
    def holders() -> dict:
        return conductor.call("conductor.index", {"blocks": blocks})["holders"]
    wait_until(lambda: holders() == {b: expected for b in blocks}, timeout, holders)


def segments_of(store, worker: str) -> list[str]:
    """The segments a prefill worker (or CPP group) owns: its store client id starts with its name."""
    client = next(c for c in store.master.inspect("clients") if c["client_id"].startswith(f"{worker}-"))
    return client["segments"]


def replica_segments(store, names: list[str]) -> dict[str, list[str]]:
    """Object name -> the segments its replicas are in, sorted, as the master lists them."""
    return {name: sorted(r["segment_id"] for r in store.master.inspect("key", name)["replicas"])
            for name in names}


def prefix_then_tail(runner, url: str, conductor: str, holder: str, reference: Reference, *, block: int,
                     seed: int, head: int, tail: int, max_tokens: int) -> None:
    """A prompt that stores its blocks, then one sharing its first four (``tail`` more tokens after
    them): the second must load those four blocks from ``holder`` and give the reference's tokens.
    The holder puts its blocks after its report, and the conductor's index learns them from the
    master's events: on a loaded machine the second request could be scheduled before either, so
    it waits for the index to name the holder."""
    shared = prompt(4 * block + 3, seed=seed)
    complete(url, prompt=shared + prompt(head, seed=seed + 1)[1:], max_tokens=1)
    with RpcClient(conductor, secret=runner.secret) as client:
        wait_for_holders(client, [format_key(k) for k in prefix_block_keys(shared, block)], [holder])
    second = shared + prompt(tail, seed=seed + 2)[1:]
    answer = complete(url, prompt=second, max_tokens=max_tokens)
    assert answer["mooncake"]["prefix_tokens"] == 4 * block
    assert answer["choices"][0]["token_ids"] == reference.tokens(second, max_tokens)
