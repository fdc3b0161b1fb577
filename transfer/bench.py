"""`mooncake bench transfer`: engine throughput against this machine's own limits, in one run.

Like Mooncake's transfer_engine_bench: a target engine in another process (or ``--target``),
``threads`` initiator threads each submitting batches of ``batch_size`` requests of
``block_size`` bytes for ``duration`` seconds. The same run measures single-thread memcpy and a
single-stream raw TCP socket (to a receiving process) for the same block size, between the
engine's rounds, so the ratios compare like with like on a machine whose speed varies with
whatever else runs on it.
Run as a script, this module is the target process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from collections.abc import Callable

import numpy as np

from transfer.batch import OpCode, Status, TransferRequest
from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.errors import TransferFailed

_MAX_ROUNDS = 10
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Without a run's own size, a limit moves data through a working set this large: a loop over one
# block that stays in the cache is no limit for an engine that walks its registered buffers.
_LIMIT_WORKING_SET = 64 << 20
_RAW_RECEIVER = """
import socket, sys
size = int(sys.argv[2])
buf = memoryview(bytearray(b"\\1") * size)  # written once: its pages are resident, as a target segment's are
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))  # after: the sender's clock starts here
total = offset = 0
while True:
    n = sock.recv_into(buf[offset:])
    if not n:
        break
    total += n
    offset = (offset + n) % size
sock.sendall(str(total).encode())
"""


def run(*, protocol: str, op: str, block_size: int, batch_size: int, threads: int,
        duration: float, target: str | None = None, options: EngineOptions | None = None) -> dict:
    """The engine runs in rounds of about a second; before each, the limits are measured for a
    moment, so on a shared machine both see the same load (one limit measured after the run
    alone swings the ratio by 2x when another job starts or stops)."""
    options = replace(options or EngineOptions.from_config(), protocol=protocol)
    size = block_size * batch_size * threads
    process = None if target else _start_target(size, protocol)
    limits: list[tuple[float, float]] = []

    def measure_limits() -> None:
        # Over the same working set as the engine's batch: the limits see the same cache misses.
        limits.append((memcpy_gbps(block_size, 0.1, size), raw_socket_gbps(block_size, 0.25, size)))

    try:
        name = target or json.loads(process.stdout.readline())["name"]  # type: ignore[union-attr]
        result = _measure_engine(name, options, OpCode[op.upper()], block_size, batch_size,
                                 threads, duration, measure_limits)
    finally:
        if process is not None:
            process.stdin.close()  # type: ignore[union-attr]
            process.wait(timeout=10)
            process.stdout.close()  # type: ignore[union-attr]
    result["memcpy_gbps"] = float(np.mean([m for m, _ in limits]))
    result["raw_socket_gbps"] = float(np.mean([r for _, r in limits]))
    result["vs_memcpy"] = result["gbps"] / result["memcpy_gbps"]
    result["vs_raw_socket"] = result["gbps"] / result["raw_socket_gbps"]
    return result


def _start_target(size: int, protocol: str) -> subprocess.Popen:
    # One BLAS thread: the target does no linear algebra, and idle OpenBLAS workers spinning
    # on a 2-core machine take CPU from the transfer being measured.
    return subprocess.Popen([sys.executable, "-m", "transfer.bench", str(size), protocol],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=_ROOT,
                            env={**os.environ, "PYTHONPATH": _ROOT, "OPENBLAS_NUM_THREADS": "1"})


def _measure_engine(name: str, options: EngineOptions, opcode: OpCode, block_size: int, batch_size: int,
                    threads: int, duration: float, between_rounds: Callable[[], None]) -> dict:
    with TransferEngine(options=options) as engine:
        handle = engine.open_segment(name)
        remote = engine.segment_descriptor(handle).buffers[0]
        local = np.ones(block_size * batch_size * threads, np.uint8)
        source = engine.register_local_memory(local)
        latencies: list[list[float]] = [[] for _ in range(threads)]
        errors: list[str] = []

        def worker(index: int, until: float) -> None:
            base = index * block_size * batch_size
            requests = [TransferRequest(opcode, source + base + i * block_size, handle,
                                        remote.address + base + i * block_size, block_size)
                        for i in range(batch_size)]
            while time.monotonic() < until and not errors:
                batch = engine.allocate_batch_id(batch_size)
                started = time.perf_counter()
                engine.submit_transfer(batch, requests)
                status = engine.wait_batch(batch)
                latencies[index].append(time.perf_counter() - started)
                engine.free_batch_id(batch)
                if status.status != Status.COMPLETED:
                    errors.append(status.error)

        worker(0, time.monotonic() + min(0.3, duration))  # warm-up: connections, page faults
        latencies[0].clear()
        rounds = max(1, min(_MAX_ROUNDS, round(duration)))
        elapsed = 0.0
        for _ in range(rounds):
            between_rounds()
            until = time.monotonic() + duration / rounds
            pool = [threading.Thread(target=worker, args=(i, until)) for i in range(threads)]
            started = time.perf_counter()
            for thread in pool:
                thread.start()
            for thread in pool:
                thread.join()
            elapsed += time.perf_counter() - started
    if errors:
        raise TransferFailed(f"benchmark transfer failed: {errors[0]}")
    per_batch = np.array([x for each in latencies for x in each]) * 1000
    requests_done = len(per_batch) * batch_size
    return {
        "protocol": options.protocol, "op": opcode.name.lower(), "block_size": block_size,
        "batch_size": batch_size, "threads": threads, "seconds": elapsed, "rounds": rounds,
        "gbps": requests_done * block_size / elapsed / 1e9, "requests_per_s": requests_done / elapsed,
        "batch_p50_ms": float(np.percentile(per_batch, 50)),
        "batch_p99_ms": float(np.percentile(per_batch, 99)),
    }


def memcpy_gbps(block_size: int, seconds: float = 0.3, working_set: int = _LIMIT_WORKING_SET) -> float:
    """Single-thread copies of block_size between two buffers of working_set bytes in this process."""
    count = max(1, working_set // block_size)
    source, destination = np.ones(block_size * count, np.uint8), np.zeros(block_size * count, np.uint8)
    np.copyto(destination, source)  # fault the pages in before timing
    copied, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for i in range(count):
            np.copyto(destination[i * block_size:(i + 1) * block_size],
                      source[i * block_size:(i + 1) * block_size])
        copied += block_size * count
    return copied / (time.perf_counter() - started) / 1e9


def raw_socket_gbps(block_size: int, seconds: float = 0.5, working_set: int = _LIMIT_WORKING_SET) -> float:
    """One loopback TCP stream to another process: sendall of block_size buffers walking working_set
    bytes, received into a buffer of the same size."""
    count = max(1, working_set // block_size)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        receiver = subprocess.Popen([sys.executable, "-c", _RAW_RECEIVER,
                                     str(listener.getsockname()[1]), str(block_size * count)])
        listener.settimeout(10)
        try:
            conn, _ = listener.accept()
            with conn:
                source = memoryview(np.ones(block_size * count, np.uint8))
                blocks = [source[i * block_size:(i + 1) * block_size] for i in range(count)]
                sent, started = 0, time.perf_counter()
                while time.perf_counter() - started < seconds:
                    for block in blocks:
                        conn.sendall(block)
                    sent += block_size * count
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(10)
                received = int(conn.recv(64))
                elapsed = time.perf_counter() - started
        finally:
            receiver.wait(timeout=10)
    if received != sent:
        raise RuntimeError(f"raw socket limit: sent {sent} bytes, the receiver counted {received}")
    return received / elapsed / 1e9


def _serve_target(size: int, protocol: str) -> None:
    with TransferEngine(options=EngineOptions.from_config(protocol=protocol)) as engine:
        engine.allocate_shared_buffer(size)
        print(json.dumps({"name": engine.name}), flush=True)
        sys.stdin.read()  # serve until the benchmark closes our stdin


if __name__ == "__main__":
    _serve_target(int(sys.argv[1]), sys.argv[2])
