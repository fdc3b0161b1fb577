"""Measurements behind `mooncake bench rpc`, and the raw echo servers used as floors.

The floors are a bare ZeroMQ ROUTER (for TCP) and a bare Unix stream socket (for unix://), each
sending every message straight back: the round trip no RPC layer over that transport can beat
on this machine. Reporting them in the same run keeps our figures honest on a noisy host. Run
``python -m transfer.rpc.bench PATH`` to start the raw echo servers; it prints the ZeroMQ TCP
address, then the Unix socket's path.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import zmq

from transfer.rpc.client_server import RpcClient
from transfer.rpc.spin import HEADROOM


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


def _wait_readable(poll: Callable[[int], Any], spin: float, timeout_ms: int) -> bool:
    """Poll without sleeping for ``spin`` seconds, then block up to ``timeout_ms`` (-1: no
    limit): the Unix-socket floor busy-polls as daemons and store clients do on unix://
    (rpc_busy_poll, and like them only while a core is free), or it would measure the host's
    wake-up latency instead of the transport."""
    end = time.perf_counter() + spin if spin and HEADROOM.free() else 0.0
    while time.perf_counter() < end:
        if poll(0):
            return True
    return bool(poll(timeout_ms))


def raw_latency(address: str, count: int, spin: float = 0.0) -> LatencyResult:
    """Round trips of a 4-byte ping to a raw echo server: ZeroMQ at tcp://, a bare socket at a path."""
    ping = _unix_ping(address, spin) if not address.startswith("tcp://") else _zmq_ping(address)
    try:
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            next(ping)
            samples.append(time.perf_counter() - start)
    finally:
        ping.close()
    samples.sort()
    return LatencyResult(_percentile(samples, 0.5) * 1e6, _percentile(samples, 0.99) * 1e6, count)


def _zmq_ping(address: str):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        while True:
            sock.send(b"ping")
            if not sock.poll(5000):
                raise TimeoutError("raw echo server did not answer")
            sock.recv()
            yield
    finally:
        sock.close()


def _unix_ping(path: str, spin: float):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    try:
        while True:
            sock.sendall(b"ping")
            if not _wait_readable(poller.poll, spin, 5000) or not sock.recv(4):
                raise TimeoutError("raw echo server did not answer")
            yield
    finally:
        sock.close()


class RawEchoServer:
    """The bare echo loops in their own process; owned by a ``with`` block.

    ZeroMQ listens on TCP loopback (``address``), the bare socket at ``unix_path`` in
    ``socket_dir``, as a daemon listens, so each transport has its own floor.
    """

    def __init__(self, socket_dir: str, spin: float = 0.0) -> None:
        self.socket_dir, self.spin = socket_dir, spin

    def __enter__(self) -> RawEchoServer:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "transfer.rpc.bench", str(Path(self.socket_dir) / "raw-echo.sock"),
             str(self.spin)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.address = self.process.stdout.readline().strip()
        self.unix_path = self.process.stdout.readline().strip()
        if not self.address or not self.unix_path:
            self.process.kill()
            raise RuntimeError("raw echo server failed to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


# A CPU-bound loop that also ends once its parent is gone (its parent pid is no longer the one
# given: the hog was handed on to init) or after the seconds given, so a benchmark killed mid-run
# leaves no hog behind. The parent's pid comes as an argument, in case it dies before we start.
_HOG = """
import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while os.getppid() == parent and time.monotonic() < end:
    for _ in range(100_000):
        pass
"""


class CpuLoad:
    """``count`` CPU-bound processes running beside a measurement, owned by a ``with`` block:
    the figure of a host that another program keeps busy, where a thread that busy-polls holds
    the core its peer needs. Each stops at the block's end, or after ``limit`` seconds."""

    def __init__(self, count: int, limit: float = 1800.0) -> None:
        self.count, self.limit = count, limit
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> CpuLoad:
        try:
            for _ in range(self.count):
                self.processes.append(subprocess.Popen([sys.executable, "-c", _HOG, str(os.getpid()), str(self.limit)],
                                                       stdin=subprocess.DEVNULL))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait()
        self.processes = []


def _serve_raw_echo(unix_path: str, spin: float) -> None:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind("tcp://127.0.0.1:*")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(unix_path)
    listener.listen()
    threading.Thread(target=_echo_unix, args=(listener, spin), daemon=True).start()
    print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    print(unix_path, flush=True)
    while True:  # until killed; the socket file goes with the caller's temporary directory
        sock.send_multipart(sock.recv_multipart())


def _echo_unix(listener: socket.socket, spin: float) -> None:
    conn, _ = listener.accept()
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    while _wait_readable(poller.poll, spin, -1) and (data := conn.recv(65536)):
        conn.sendall(data)


if __name__ == "__main__":
    _serve_raw_echo(sys.argv[1], float(sys.argv[2]))
