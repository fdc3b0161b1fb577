"""Malformed and hostile control frames against every daemon of a live cluster, over both
transports (ZeroMQ tcp:// and the unix:// stream socket).

A seeded generator makes each frame: garbage bytes, msgpack of the wrong shape, headers with
unknown or real ops and arguments of every wrong type and size. Every frame must get an answer
(a typed error, or a result where the arguments happen to make sense), no answer may be
HANDLER_FAILED (an exception the handler did not expect is a bug), every daemon must stay alive
and healthy, and none may grow by more than RSS_BUDGET. ``MOONCAKE_FUZZ_FRAMES`` sets the frames
per daemon and transport (the suite runs a few hundred; `MOONCAKE_FUZZ_FRAMES=50000` for a soak).
"""

from __future__ import annotations

import json
import math
import os
import random
import socket

import msgpack
import psutil
import pytest
import zmq

from daemons.cluster.workdir import ClusterPaths
from tests.conftest import Mooncake
from transfer.auth import RPC_PURPOSE, ClusterSecret
from transfer.rpc import curve
from transfer.rpc.stream import MessageReader, encode

FRAMES = int(os.environ.get("MOONCAKE_FUZZ_FRAMES", "300"))
RSS_BUDGET = 32 * 2**20
HANDLER_FAILED = -906
OPS = [
    *(f"store.{op}" for op in ["put_start", "upsert_start", "put_end", "put_revoke", "batch_put_start", "batch_upsert_start", "batch_put_end", "batch_put_revoke", "reserve_space", "batch_put_commit", "get_replica_list", "batch_get_replica_list", "exists", "batch_exists", "remove", "batch_remove", "remove_all", "mount_segment", "unmount_segment", "add_disk_replica", "promote_start", "promote_end", "promote_revoke", "copy_start", "copy_end", "copy_revoke", "drain_start", "drain_pending", "drain_move_start", "drain_finish", "drain_cancel", "drain_status", "remount", "ping", "inspect", "kv_events", "kv_snapshot", "disk_read"]),
    "te.meta.put", "te.meta.get", "te.meta.remove", "te.meta.list",
    "cluster.register_service", "cluster.lookup_service", "cluster.list_services",
    "conductor.heartbeat", "conductor.prefill_done", "conductor.tokens", "conductor.index",
    "prefill.run", "prefill.drop", "decode.reserve", "decode.start", "decode.release",
    "health", "status", "echo", "no.such.op",
]
KEYS = ["client_id", "key", "keys", "size", "sizes", "segment", "segment_id", "segment_ids", "name", "address", "config", "force", "what", "blocks", "descriptor", "incarnation", "acks", "objects", "segments", "disk_objects", "checksum", "checksums", "replica_num", "step_s", "events", "role", "kv_capacity_tokens", "request_id", "token_ids", "decode", "block_ids", "writer", "calibration", "worker", "batch", "context", "ok", "error", "load_blocks", "store", "timeout_ms", "limit", "skip"]


def value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(12 if depth < 3 else 8)
    if kind == 0:
        return rng.choice([0, 1, -1, 2**31, -(2**63), 2**64 - 1, rng.randrange(-10**6, 10**6)])
    if kind == 1:
        return rng.choice([0.5, -1.0, math.inf, -math.inf, math.nan, 1e308])
    if kind == 2:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(0, 40)))
    if kind == 3:
        return rng.randbytes(rng.randrange(0, 64))
    if kind == 4:
        return None
    if kind == 5:
        return rng.choice([True, False])
    if kind == 6:
        return "x" * rng.choice([1, 1000, 100_000])
    if kind == 7:
        return rng.choice(["tcp://127.0.0.1:1", "unix:///nonexistent", "../../etc/passwd", "", "prefill-0"])
    if kind in (8, 9):
        return [value(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    return {rng.choice(KEYS): value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def frame(rng: random.Random, request_id: int) -> tuple[bytes, bool]:
    """A header frame, and whether it carries ``request_id`` (the answer must then name it)."""
    shape = rng.randrange(10)
    if shape == 0:
        return rng.randbytes(rng.randrange(0, 200)), False
    if shape == 1:
        return msgpack.packb(value(rng)), False
    if shape == 2:  # a map that is almost a header
        header = {"id": rng.choice([request_id, "7", None, -1.5]), "op": rng.choice([*OPS, 5, None])}
        if rng.random() < 0.5:
            header["args"] = value(rng)
        return msgpack.packb(header), False
    args = {rng.choice(KEYS): value(rng) for _ in range(rng.randrange(0, 8))}
    header = {"id": request_id, "op": rng.choice(OPS), "args": args}
    if rng.random() < 0.2:
        header["timeout_ms"] = value(rng)
    return msgpack.packb(header), True


class Zmq:
    """A peer holding the cluster secret (CURVE keys) that sends junk once admitted."""

    def __init__(self, address: str, secret: ClusterSecret) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        curve.make_client(self.socket, secret)
        self.socket.connect(address)

    def exchange(self, data: bytes) -> bytes | None:
        self.socket.send(data)
        return self.socket.recv_multipart()[0] if self.socket.poll(10_000) else None

    def close(self) -> None:
        self.socket.close()


class Unix:
    """A peer that answers the connection's challenge with the secret, then sends junk."""

    def __init__(self, path: str, secret: ClusterSecret) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.settimeout(10)
        self.socket.connect(path)
        self.reader = MessageReader(1 << 30)
        nonce = msgpack.unpackb(self._receive())["nonce"]
        verdict = self.exchange(msgpack.packb({"proof": secret.proof(RPC_PURPOSE, nonce)}))
        assert msgpack.unpackb(verdict) == {"auth": "ok"}

    def _receive(self) -> bytes:
        while True:
            messages = self.reader.feed(self.socket.recv(1 << 16))
            if messages:
                return bytes(messages[0][0])

    def exchange(self, data: bytes) -> bytes | None:
        self.socket.sendall(b"".join(bytes(b) for b in encode([data])))
        return self._receive()

    def close(self) -> None:
        self.socket.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("fuzz") / "cluster")
    runner.env.update({"MOONCAKE_PREFILL_WORKERS": "1", "MOONCAKE_DECODE_WORKERS": "1",
                       "MOONCAKE_KV_BLOCK_TOKENS": "32", "MOONCAKE_KV_CACHE_SIZE": "8MiB",
                       "MOONCAKE_SEGMENT_SIZE": "32MiB", "MOONCAKE_PREFILL_SEGMENT_SIZE": "16MiB",
                       "MOONCAKE_CALIBRATION_TIME": "1ms", "MOONCAKE_START_TIMEOUT": "90s",
                       "MOONCAKE_WORKER_TIMEOUT": "5s"})
    info = runner.json("up", timeout=120)
    yield runner, info
    runner("down", timeout=60)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_every_daemon_answers_every_malformed_frame_and_stays_small(cluster, transport):
    runner, info = cluster
    paths = ClusterPaths.of(runner.workdir)
    for daemon in info["daemons"]:
        name, process = daemon["name"], psutil.Process(daemon["pid"])
        rss_before = process.memory_info().rss
        peer = (Zmq(daemon["address"], runner.secret) if transport == "tcp"
                else Unix(str(paths.ipc_socket(name)), runner.secret))
        rng = random.Random(f"{name}-{transport}")
        answered, handler_failed = 0, []
        try:
            for request_id in range(FRAMES):
                data, named = frame(rng, request_id)
                reply = peer.exchange(data)
                assert reply is not None, f"{name} gave no answer to {data[:80]!r}"
                header = msgpack.unpackb(reply, raw=False, strict_map_key=False)
                if named:
                    assert header["id"] == request_id
                if not header.get("ok") and header.get("error", {}).get("code") == HANDLER_FAILED:
                    handler_failed.append((msgpack.unpackb(data, strict_map_key=False)["op"],
                                           header["error"]["message"]))
                answered += 1
            health = peer.exchange(msgpack.packb({"id": FRAMES, "op": "health", "args": {}}))
            assert msgpack.unpackb(health, raw=False)["ok"], f"{name} unhealthy after the fuzz"
        finally:
            peer.close()
        assert answered == FRAMES
        assert not handler_failed, f"{name}: unexpected exceptions in handlers: {handler_failed[:5]}"
        assert process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        growth = process.memory_info().rss - rss_before
        print(f"{name} {transport}: {FRAMES} frames, RSS {rss_before / 2**20:.1f} -> "
              f"{(rss_before + growth) / 2**20:.1f} MiB")  # shown with -s: the soak's figures
        assert growth < RSS_BUDGET, f"{name} grew by {growth / 2**20:.1f} MiB over {FRAMES} frames"
    status = json.loads(runner("status", "--json").stdout)
    assert status["healthy"], status
