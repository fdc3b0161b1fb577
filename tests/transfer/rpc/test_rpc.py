"""The control-plane RPC against a real server process over real ZeroMQ on loopback."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from transfer.errors import (
    HandlerFailed, MalformedMessage, MessageTooLarge, RpcError, RpcTimeout, SegmentNotFound,
    UnknownOperation,
)
from transfer.rpc.client_server import RpcClient, RpcServer

SERVER = Path(__file__).with_name("rpc_server_proc.py")
MAX_SIZE = 1 << 20


class ServerProcess:
    def __init__(self, bind: str = "tcp://127.0.0.1:*") -> None:
        self.process = subprocess.Popen([sys.executable, str(SERVER), bind, str(MAX_SIZE)],
                                        stdout=subprocess.PIPE, text=True)
        self.address = self.process.stdout.readline().strip()
        assert self.address.startswith("tcp://"), "server did not start"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def server():
    proc = ServerProcess()
    yield proc
    proc.kill()


@pytest.fixture
def client(server):
    with RpcClient(server.address, timeout=5.0) as c:
        yield c


def raw_request(address: str, *frames: bytes) -> dict:
    """Send arbitrary frames with a bare DEALER and return the decoded reply header."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(list(frames))
        assert sock.poll(5000), "server sent no error reply"
        return msgpack.unpackb(sock.recv_multipart()[0], raw=False)
    finally:
        sock.close()


def test_echo_carries_args_and_bulk_frames(client):
    payload = bytes(range(256)) * 1000
    reply = client.call_frames("echo", {"key": "k1", "n": 3}, [payload, b"second"])
    assert reply.result == {"key": "k1", "n": 3}
    assert [bytes(f) for f in reply.frames] == [payload, b"second"]


def test_many_in_flight_replies_come_back_out_of_order(client):
    slow = client.submit("sleep", {"seconds": 1.0, "tag": "slow"}, timeout=10)
    # If replies were serialised behind the slow call, these would miss their short deadline.
    fast = [client.submit("echo", {"i": i}, timeout=0.8) for i in range(50)]
    assert [f.wait().result for f in fast] == [{"i": i} for i in range(50)]
    assert slow.wait().result == "slow"


def test_concurrent_blocking_calls_each_get_their_own_reply(client):
    calls = [client.submit("sleep", {"seconds": 0.05 * (4 - i), "tag": i}, timeout=10) for i in range(4)]
    assert [c.wait().result for c in calls] == [0, 1, 2, 3]


def test_unknown_op_gets_typed_error_and_server_keeps_serving(client):
    with pytest.raises(UnknownOperation, match="no_such_op"):
        client.call("no_such_op")
    assert client.call("echo", {"after": 1}) == {"after": 1}


def test_handler_exception_becomes_error_reply(client):
    with pytest.raises(HandlerFailed, match="ValueError: boom"):
        client.call("crash")
    assert client.call("echo", {"still": "alive"}) == {"still": "alive"}


def test_typed_error_is_raised_again_on_the_client(client):
    with pytest.raises(SegmentNotFound, match="no segment 'x'") as info:
        client.call("typed_failure", {"name": "x"})
    assert info.value.code == -210


@pytest.mark.parametrize("frames, code", [
    ((b"\xc1\xc1 not msgpack",), MalformedMessage.code),
    ((msgpack.packb([1, 2, 3]),), MalformedMessage.code),
    ((msgpack.packb({"id": 7}),), MalformedMessage.code),
    ((msgpack.packb({"id": "seven", "op": "echo"}),), MalformedMessage.code),
    ((msgpack.packb({"id": 8, "op": "echo", "args": [1]}),), MalformedMessage.code),
])
def test_malformed_messages_get_error_replies(server, client, frames, code):
    reply = raw_request(server.address, *frames)
    assert reply["ok"] is False and reply["error"]["code"] == code
    assert client.call("echo", {"ok": True}) == {"ok": True}


def test_oversized_message_gets_error_reply_with_its_id(server, client):
    header = msgpack.packb({"id": 42, "op": "echo", "args": {}})
    reply = raw_request(server.address, header, b"x" * (MAX_SIZE + 1))
    assert reply == {"id": 42, "ok": False, "error": reply["error"]}
    assert reply["error"]["code"] == MessageTooLarge.code
    assert client.call("echo", {"small": 1}) == {"small": 1}


def test_client_refuses_to_send_oversized_message(server):
    with RpcClient(server.address, max_message_size=1000) as c:
        with pytest.raises(MessageTooLarge):
            c.call("echo", {}, [b"x" * 2000])


def test_deadline_against_sleeping_server_then_client_is_reusable(client):
    started = time.monotonic()
    with pytest.raises(RpcTimeout):
        client.call("sleep", {"seconds": 3, "tag": "late"}, timeout=0.3)
    assert time.monotonic() - started < 2.5, "the timeout did not fire at its deadline"
    assert client.call("echo", {"next": 1}) == {"next": 1}


def test_killed_server_gives_timeout_and_client_recovers_on_restart(server):
    address = server.address
    with RpcClient(address, timeout=0.5) as c:
        assert c.call("echo", {"n": 1}) == {"n": 1}
        server.kill()
        with pytest.raises(RpcTimeout):
            c.call("echo", {"n": 2})
        restarted = ServerProcess(bind=address)
        try:
            deadline = time.monotonic() + 10
            while True:  # the DEALER reconnects on its own; allow it a few tries
                try:
                    assert c.call("echo", {"n": 3}) == {"n": 3}
                    break
                except RpcTimeout:
                    assert time.monotonic() < deadline, "client never reached the restarted server"
        finally:
            restarted.kill()


def test_closing_a_client_ends_calls_waiting_on_it_with_a_typed_error(client):
    waiting = client.submit("sleep", {"seconds": 2, "tag": "never read"}, timeout=10)
    closer = threading.Timer(0.2, client.close)
    closer.start()
    with pytest.raises(RpcError, match="was closed"):
        waiting.wait()
    with pytest.raises(RpcError, match="was closed"):
        client.call("echo", {})
    closer.join()


def test_a_handler_bug_hit_many_times_logs_one_traceback_per_interval(caplog):
    """~1,800 bad calls once wrote 892 tracebacks to a conductor's log."""
    server = RpcServer("tcp://127.0.0.1:*")
    server.register("buggy", lambda r: {}["missing"], blocking=True)
    server.register("other", lambda r: 1 / 0, blocking=True)
    server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="transfer.rpc.client_server"), \
                RpcClient(server.address, timeout=5) as client:
            for op in ["buggy"] * 50 + ["other"] * 5:
                with pytest.raises(HandlerFailed):
                    client.call(op)
        logged = [r for r in caplog.records if r.exc_info]
        assert sorted(r.args[0] for r in logged) == ["buggy", "other"]
    finally:
        server.stop(drain_timeout=0)
