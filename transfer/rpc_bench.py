"""Measurements behind `mooncake bench rpc`, and the raw ZeroMQ echo server used as the floor.

The floor is a bare ROUTER that sends every message straight back: the round trip no RPC layer
on this machine can beat. Reporting it in the same run keeps our figures honest on a noisy host.
Run ``python -m transfer.rpc_bench ipc://PATH`` to start the raw echo server; it prints its TCP
and its ipc address.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import zmq

from transfer.rpc import RpcClient


@dataclass
class LatencyResult:
    p50_us: float
    p99_us: float
    count: int


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


WARMUP = 200


def rpc_latency(client: RpcClient, count: int) -> LatencyResult:
    # Unmeasured calls first: the connection handshake and a just-started daemon's own start-up
    # work would otherwise land in whichever transport is measured first.
    for i in range(WARMUP):
        client.call("echo", {"i": i})
    samples = []
    for i in range(count):
        start = time.perf_counter()
        client.call("echo", {"i": i})
        samples.append(time.perf_counter() - start)
    samples.sort()
    return LatencyResult(_percentile(samples, 0.5) * 1e6, _percentile(samples, 0.99) * 1e6, count)


def rpc_throughput(client: RpcClient, count: int, outstanding: int) -> float:
    """Ops/s with ``outstanding`` requests kept in flight on one socket."""
    in_flight: deque = deque()
    start = time.perf_counter()
    for i in range(count):
        in_flight.append(client.submit("echo", {"i": i}))
        if len(in_flight) >= outstanding:
            in_flight.popleft().wait()
    while in_flight:
        in_flight.popleft().wait()
    return count / (time.perf_counter() - start)


def raw_latency(address: str, count: int) -> LatencyResult:
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            sock.send(b"ping")
            if not sock.poll(5000):
                raise TimeoutError("raw echo server did not answer")
            sock.recv()
            samples.append(time.perf_counter() - start)
    finally:
        sock.close()
    samples.sort()
    return LatencyResult(_percentile(samples, 0.5) * 1e6, _percentile(samples, 0.99) * 1e6, count)


class RawEchoServer:
    """A bare ROUTER echo loop in its own process; owned by a ``with`` block.

    It listens on TCP loopback (``address``) and on an ipc:// socket in ``ipc_dir``
    (``ipc_address``), as a daemon does, so each transport has its own floor.
    """

    def __init__(self, ipc_dir: str) -> None:
        self.ipc_dir = ipc_dir

    def __enter__(self) -> "RawEchoServer":
        self.process = subprocess.Popen(
            [sys.executable, "-m", "transfer.rpc_bench", f"ipc://{Path(self.ipc_dir) / 'raw-echo.sock'}"],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.address = self.process.stdout.readline().strip()
        self.ipc_address = self.process.stdout.readline().strip()
        if not self.address or not self.ipc_address:
            self.process.kill()
            raise RuntimeError("raw echo server failed to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def _serve_raw_echo(ipc_endpoint: str) -> None:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    for endpoint in ("tcp://127.0.0.1:*", ipc_endpoint):
        sock.bind(endpoint)
        print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    while True:
        sock.send_multipart(sock.recv_multipart())


if __name__ == "__main__":
    _serve_raw_echo(sys.argv[1])
