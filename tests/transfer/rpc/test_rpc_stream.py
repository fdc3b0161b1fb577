"""The stream transport (unix://) on its own: framing limits, big messages, dead and restarted
servers, socket files. What it shares with TCP and ipc:// is in test_rpc_ipc.py."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

from transfer.errors import MalformedMessage, MessageTooLarge, RpcTimeout
from transfer.rpc.client_server import Reply, RpcClient, RpcServer
from transfer.rpc.stream import ConnectionLost, MessageReader, encode

SERVER = Path(__file__).with_name("rpc_server_proc.py")
MAX_SIZE = 1 << 20


class StreamServerProcess:
    """rpc_server_proc.py serving TCP and a Unix stream socket at ``path``."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "tcp://127.0.0.1:*", str(MAX_SIZE), f"unix://{path}"],
            stdout=subprocess.PIPE, text=True)
        self.process.stdout.readline()
        self.address = self.process.stdout.readline().strip()
        assert self.address == f"unix://{path}", "server did not start"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def stream_server(tmp_path):
    proc = StreamServerProcess(tmp_path / "daemon.sock")
    yield proc
    proc.kill()


def connect_raw(path: str) -> socket.socket:
    """A raw connection past the server's greeting (a challenge only when it has a secret)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    reader, greeting = MessageReader(1 << 30), []
    while not greeting:
        greeting = reader.feed(sock.recv(65536))
    assert msgpack.unpackb(greeting[0][0])["auth"] is None
    return sock


def raw_exchange(path: str, data: bytes) -> tuple[dict | None, bool]:
    """Send raw bytes; return the decoded reply header (None if none came) and whether the
    server then closed the connection."""
    sock = connect_raw(path)
    try:
        sock.sendall(data)
        reader = MessageReader(1 << 30)
        messages = []
        while not messages:
            chunk = sock.recv(65536)
            if not chunk:
                return None, True
            messages = reader.feed(chunk)
        header = msgpack.unpackb(messages[0][0], raw=False)
        sock.settimeout(0.5)
        try:
            closed = sock.recv(65536) == b""
        except TimeoutError:
            closed = False
        return header, closed
    finally:
        sock.close()


def test_reader_reassembles_messages_split_at_every_byte():
    wire = b"".join(bytes(b) for f in ([b"head", b"bulk" * 100], [b"second"]) for b in encode(f))
    reader = MessageReader(MAX_SIZE)
    messages = []
    for i in range(len(wire)):
        messages += reader.feed(wire[i:i + 1])
    assert [[bytes(f) for f in m] for m in messages] == [[b"head", b"bulk" * 100], [b"second"]]


def test_oversized_message_is_skipped_with_an_error_reply_and_the_stream_stays_usable(stream_server, tmp_path):
    sock = connect_raw(str(tmp_path / "daemon.sock"))
    try:
        too_big = [msgpack.packb({"id": 41, "op": "echo", "args": {}}), bytes(MAX_SIZE + 8192)]
        fine = [msgpack.packb({"id": 42, "op": "echo", "args": {"n": 42}})]
        sock.sendall(b"".join(bytes(b) for b in encode(too_big) + encode(fine)))
        reader, replies = MessageReader(1 << 30), []
        while len(replies) < 2:
            replies += [msgpack.unpackb(m[0], raw=False) for m in reader.feed(sock.recv(65536))]
        assert replies[0]["id"] == 41 and replies[0]["error"]["code"] == MessageTooLarge.code
        assert replies[1] == {"id": 42, "ok": True, "result": {"n": 42}}
    finally:
        sock.close()


def test_a_huge_length_prefix_gets_an_error_reply(stream_server, tmp_path):
    header, _ = raw_exchange(str(tmp_path / "daemon.sock"), struct.pack("<I", 1 << 31) + b"x" * 16)
    assert header["ok"] is False and header["id"] is None
    assert header["error"]["code"] == MessageTooLarge.code
    with RpcClient(stream_server.address, timeout=5) as client:
        assert client.call("echo", {"after": "bad peer"}) == {"after": "bad peer"}


@pytest.mark.parametrize("body", [
    struct.pack("<H", 3) + struct.pack("<I", 4),           # fewer lengths than frames
    struct.pack("<HI", 1, 10) + b"short",                  # lengths exceed the body
    b"\x01",                                               # no frame count at all
])
def test_malformed_frame_table_gets_an_error_reply(stream_server, tmp_path, body):
    header, closed = raw_exchange(str(tmp_path / "daemon.sock"), struct.pack("<I", len(body)) + body)
    assert header["ok"] is False and header["error"]["code"] == MalformedMessage.code
    assert closed


def test_malformed_header_on_a_good_frame_keeps_the_connection(stream_server, tmp_path):
    sock = connect_raw(str(tmp_path / "daemon.sock"))
    try:
        reader = MessageReader(1 << 30)
        for frames in ([b"\xc1 not msgpack"], [msgpack.packb({"id": 5, "op": "echo", "args": {"n": 5}})]):
            sock.sendall(b"".join(bytes(b) for b in encode(frames)))
            messages = []
            while not messages:
                messages = reader.feed(sock.recv(65536))
            replies = msgpack.unpackb(messages[0][0], raw=False)
        assert replies == {"id": 5, "ok": True, "result": {"n": 5}}
    finally:
        sock.close()


def test_messages_larger_than_the_socket_buffers_travel_whole(stream_server):
    bulk = np.random.default_rng(1).bytes(MAX_SIZE - 4096)
    with RpcClient(stream_server.address, timeout=10) as client:
        calls = [client.submit("echo", {"i": i}, [bulk, bulk[:1000]]) for i in range(3)]
        for i, call in enumerate(calls):
            reply = call.wait()
            assert reply.result == {"i": i}
            assert bytes(reply.frames[0]) == bulk and bytes(reply.frames[1]) == bulk[:1000]
        with pytest.raises(MessageTooLarge):
            client.call("echo", {}, [bulk, bulk])


def test_a_dead_server_ends_calls_at_once_and_a_restarted_one_is_reached_again(tmp_path):
    path = tmp_path / "daemon.sock"
    server = StreamServerProcess(path)
    with RpcClient(server.address, timeout=30) as client:
        assert client.call("echo", {"n": 1}) == {"n": 1}
        waiting = client.submit("sleep", {"seconds": 20, "tag": "never"})
        time.sleep(0.2)
        server.kill()
        started = time.monotonic()
        with pytest.raises(ConnectionLost):
            waiting.wait()
        assert time.monotonic() - started < 5, "a lost connection waited for the call's deadline"
        started = time.monotonic()
        with pytest.raises(RpcTimeout, match="cannot reach .* within the deadline"):
            client.call("echo", {"n": 2}, timeout=0.3)
        assert time.monotonic() - started < 2
        server = StreamServerProcess(path)  # replaces the socket file the killed one left
        try:
            assert client.call("echo", {"n": 3}) == {"n": 3}
            # Restarted while the client sat idle: the next call goes out on a fresh connection.
            server.kill()
            server = StreamServerProcess(path)
            assert client.call("echo", {"n": 4}) == {"n": 4}
        finally:
            server.kill()


def test_socket_file_is_removed_on_stop_and_a_live_one_is_not_taken_over(tmp_path):
    path = tmp_path / "daemon.sock"
    first = RpcServer("tcp://127.0.0.1:*")
    first.bind(f"unix://{path}")
    first.register("echo", lambda r: Reply(r.args))
    first.start()
    try:
        second = RpcServer("tcp://127.0.0.1:*")
        with pytest.raises(OSError, match="already serves"):
            second.bind(f"unix://{path}")
        second.stop(drain_timeout=0)
        with RpcClient(f"unix://{path}", timeout=5) as client:
            assert client.call("echo", {"still": "first"}) == {"still": "first"}
    finally:
        first.stop(drain_timeout=0)
    assert not path.exists()


def test_a_call_made_before_the_server_listens_goes_through_once_it_does(tmp_path):
    path = tmp_path / "daemon.sock"
    outcome: list = []
    with RpcClient(f"unix://{path}", timeout=10) as client:
        caller = threading.Thread(target=lambda: outcome.append(client.call("echo", {"early": True})))
        caller.start()
        time.sleep(0.3)
        server = StreamServerProcess(path)
        try:
            caller.join(timeout=10)
        finally:
            server.kill()
    assert outcome == [{"early": True}]


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_busy_polling_keeps_deadlines_and_still_takes_late_replies(tmp_path, transport):
    server = RpcServer("tcp://127.0.0.1:*", busy_poll=0.05)
    stream = server.bind(f"unix://{tmp_path / 'spin.sock'}")
    server.register("echo", lambda r: Reply(r.args))
    server.register("sleep", lambda r: time.sleep(r.args["seconds"]) or "slept", blocking=True)
    server.start()
    try:
        address = server.address if transport == "tcp" else stream
        with RpcClient(address, timeout=5, busy_poll=1.0) as client:
            assert [client.call("echo", {"i": i}) for i in range(50)] == [{"i": i} for i in range(50)]
            started = time.monotonic()
            with pytest.raises(RpcTimeout):
                client.call("sleep", {"seconds": 0.5}, timeout=0.1)  # the deadline ends the spin
            assert time.monotonic() - started < 0.4
        with RpcClient(address, timeout=5, busy_poll=0.01) as client:
            assert client.call("sleep", {"seconds": 0.2}) == "slept"  # a reply after the spin
    finally:
        server.stop(drain_timeout=1)


def test_a_client_that_never_reads_its_replies_cannot_grow_the_server_without_bound(tmp_path):
    from transfer.rpc import stream as rpc_stream

    server = RpcServer("tcp://127.0.0.1:*", max_message_size=2 * MAX_SIZE)
    address = server.bind(f"unix://{tmp_path / 'flood.sock'}")
    server.register("echo", lambda r: Reply(r.args, r.frames))
    server.start()
    flood = connect_raw(str(tmp_path / "flood.sock"))
    flood.settimeout(None)
    bulk = bytes(range(256)) * (MAX_SIZE // 256)
    requests = [b"".join(bytes(b) for b in encode([msgpack.packb({"id": i, "op": "echo", "args": {}}), bulk]))
                for i in range(40)]
    sender = threading.Thread(target=lambda: [flood.sendall(r) for r in requests], daemon=True)
    try:
        sender.start()
        time.sleep(1.0)  # the server answers until its backlog for this peer passes the limit
        held = sum(len(b) for c in list(server._streams.values()) for b in c.unsent)
        assert held <= rpc_stream.BACKLOG_LIMIT + 2 * MAX_SIZE, f"{held} bytes of replies held"
        with RpcClient(address, timeout=5) as other:
            assert other.call("echo", {"still": "serving"}) == {"still": "serving"}
        reader, replies = MessageReader(1 << 30), []
        flood.settimeout(10)
        while len(replies) < 40:  # reading drains it, and every reply comes, intact and in order
            replies += reader.feed(flood.recv(1 << 20))
        assert [msgpack.unpackb(m[0])["id"] for m in replies] == list(range(40))
        assert all(bytes(m[1]) == bulk for m in replies)
    finally:
        flood.close()
        server.stop(drain_timeout=0)


def test_slow_senders_together_cannot_make_the_server_hold_more_than_its_budget(tmp_path):
    """Each of 8 connections sends most of a message under the limit and stalls: before the
    budget across connections the server held all of them (8 x 50 MB took a master to 454 MiB)."""
    budget = 3 * MAX_SIZE
    server = RpcServer("tcp://127.0.0.1:*", max_message_size=2 * MAX_SIZE, max_buffered_bytes=budget)
    address = server.bind(f"unix://{tmp_path / 'slow.sock'}")
    server.register("echo", lambda r: Reply(r.args, r.frames))
    server.start()
    stalled = []
    try:
        whole = b"".join(bytes(b) for b in encode([msgpack.packb({"id": 1, "op": "echo", "args": {}}),
                                                   bytes(int(1.5 * MAX_SIZE))]))
        for _ in range(8):
            sock = connect_raw(str(tmp_path / "slow.sock"))
            sock.sendall(whole[:-1000])  # all but the end: the server must hold it to finish it
            stalled.append(sock)
        time.sleep(0.5)
        held = sum(c.reader.buffered for c in list(server._streams.values()))
        assert held <= budget, f"{held} bytes of unfinished requests held"
        closed = 0
        for sock in stalled:  # the ones closed were told why
            sock.settimeout(0.2)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            closed += 1
            if data:
                assert b"budget" in data
        assert closed >= 8 - budget // int(1.5 * MAX_SIZE)
        with RpcClient(address, timeout=5) as other:
            assert other.call("echo", {"still": "serving"}) == {"still": "serving"}
    finally:
        for sock in stalled:
            sock.close()
        server.stop(drain_timeout=0)


def test_a_reply_over_a_polling_stream_tells_this_process_the_daemon_polls(tmp_path, monkeypatch):
    """After a reply on a same-host stream the daemon polls for the next request: a poll for a
    third process's answer (a TCP transfer's target) waits until that poll is over; a reply over
    ZeroMQ, whose client does not poll, says nothing of the kind."""
    from transfer.rpc import spin

    monkeypatch.setattr(spin.HEADROOM, "free", lambda: True)
    spin.HEADROOM.peer_polls(0.0)
    server = RpcServer("tcp://127.0.0.1:*", busy_poll=0.05)
    stream = server.bind(f"unix://{tmp_path / 'third.sock'}")
    server.register("echo", lambda r: Reply(r.args))
    server.start()
    try:
        with RpcClient(server.address, timeout=5, busy_poll=30.0) as client:
            client.call("echo", {})
        assert spin.HEADROOM.free_for_a_third()
        with RpcClient(stream, timeout=5, busy_poll=30.0) as client:
            client.call("echo", {})
        assert not spin.HEADROOM.free_for_a_third()
    finally:
        spin.HEADROOM.peer_polls(0.0)
        server.stop(drain_timeout=1)


def _thread_cpu_ticks(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks


def test_a_daemon_stops_polling_for_the_next_request_once_a_woken_thread_needs_its_core(tmp_path, monkeypatch):
    """The spin after a reply starts while a core is free; a thread woken meanwhile (a TCP
    transfer's target, woken by the client that just had its answer) ends it within
    SPIN_RECHECK_INTERVAL instead of waiting for the whole busy_poll."""
    from transfer.rpc import spin

    rechecks = []
    monkeypatch.setattr(spin.HEADROOM, "free", lambda: True)
    monkeypatch.setattr(spin.HEADROOM, "free_now", lambda: rechecks.append(1) and False)
    server = RpcServer("tcp://127.0.0.1:*", busy_poll=30.0)
    stream = server.bind(f"unix://{tmp_path / 'yield.sock'}")
    server.register("echo", lambda r: Reply(r.args))
    server.start()
    try:
        with RpcClient(stream, timeout=5) as client:
            client.call("echo", {})
            before = _thread_cpu_ticks(server._thread.native_id)
            time.sleep(1.0)  # a 30 s spin would burn this whole second
            burnt = _thread_cpu_ticks(server._thread.native_id) - before
        assert rechecks
        assert burnt < os.sysconf("SC_CLK_TCK") // 4
    finally:
        server.stop(drain_timeout=1)
