"""One RPC server on TCP, on a ZeroMQ ipc:// socket and on a unix:// stream socket at once: a
same-host client over either Unix socket must get exactly what a TCP client gets, errors included."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from transfer.errors import HandlerFailed, MessageTooLarge, RpcTimeout, SegmentNotFound, UnknownOperation
from transfer.rpc.client_server import Reply, RpcClient, RpcServer

MAX_SIZE = 1 << 20


def crash(request):
    raise ValueError("boom")


def typed_failure(request):
    raise SegmentNotFound(f"no segment {request.args['name']!r}")


@pytest.fixture
def endpoints(tmp_path):
    server = RpcServer("tcp://127.0.0.1:*", max_message_size=MAX_SIZE, handler_threads=2)
    ipc = server.bind(f"ipc://{tmp_path / 'daemon.sock'}")
    stream = server.bind(f"unix://{tmp_path / 'daemon.stream'}")
    server.register("echo", lambda r: Reply(r.args, r.frames))
    server.register("crash", crash)
    server.register("typed_failure", typed_failure)
    server.register("wait", lambda r: threading.Event().wait(r.args["seconds"]), blocking=True)
    server.start()
    yield {"tcp": server.address, "ipc": ipc, "unix": stream}
    server.stop(drain_timeout=0.5)


def outcome(client: RpcClient, op: str, args: dict, frames=()) -> tuple:
    """What a call produced, comparable across transports: the reply, or the error's type and code."""
    try:
        reply = client.call_frames(op, args, frames)
        return "ok", reply.result, [bytes(f) for f in reply.frames]
    except Exception as exc:
        return type(exc).__name__, getattr(exc, "code", None), str(exc)


def test_ipc_endpoint_is_a_unix_socket_beside_tcp(endpoints, tmp_path):
    assert endpoints["tcp"].startswith("tcp://127.0.0.1:")
    assert endpoints["ipc"] == f"ipc://{tmp_path / 'daemon.sock'}"
    assert (tmp_path / "daemon.sock").is_socket()
    assert endpoints["unix"] == f"unix://{tmp_path / 'daemon.stream'}"
    assert (tmp_path / "daemon.stream").is_socket()


def test_ipc_client_gets_the_same_answers_as_tcp(endpoints):
    bulk = np.arange(70_000, dtype=np.uint8).tobytes()
    calls = [
        ("echo", {"k": "v", "n": [1, 2]}, ()),
        ("echo", {}, (bulk, b"tail")),
        ("crash", {}, ()),
        ("typed_failure", {"name": "seg-9"}, ()),
        ("no_such_op", {}, ()),
    ]
    answers = {}
    for transport, address in endpoints.items():
        with RpcClient(address, timeout=5.0) as client:
            answers[transport] = [outcome(client, *call) for call in calls]
    assert answers["ipc"] == answers["tcp"] == answers["unix"]
    assert answers["unix"][1] == ("ok", {}, [bulk, b"tail"])
    assert [a[0] for a in answers["unix"][2:]] == [
        HandlerFailed.__name__, SegmentNotFound.__name__, UnknownOperation.__name__]


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_many_in_flight_from_threads_and_limits(endpoints, transport):
    with RpcClient(endpoints[transport], timeout=5.0) as client:
        calls = [client.submit("echo", {"i": i}) for i in range(200)]
        assert [c.wait().result for c in reversed(calls)] == [{"i": i} for i in reversed(range(200))]

        def worker(base: int, seen: list) -> None:
            seen.extend(client.call("echo", {"i": base + i})["i"] for i in range(100))

        results: list[list] = [[] for _ in range(4)]
        threads = [threading.Thread(target=worker, args=(1000 * t, results[t])) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [[1000 * t + i for i in range(100)] for t in range(4)]

        with pytest.raises(MessageTooLarge):
            client.call("echo", {}, [bytes(MAX_SIZE + 1)])
        with pytest.raises(RpcTimeout):
            client.call("wait", {"seconds": 1.0}, timeout=0.2)
        assert client.call("echo", {"after": "timeout"}) == {"after": "timeout"}
