"""The control plane with a cluster secret: a client that holds it is served on tcp (ZeroMQ
CURVE) and unix:// (a challenge per connection); one without it, or with another, gets a clear
error within its deadline and never a reply, and the server logs the refusal."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from transfer.auth import ClusterSecret
from transfer.errors import AuthenticationFailed, RpcTimeout
from transfer.rpc.client_server import RpcClient, RpcServer

SECRET = ClusterSecret("the-cluster-secret-of-these-tests")
OTHER = ClusterSecret("another-cluster-secret-entirely")
QUICK = 0.5  # seconds a refused tcp client waits: ZeroMQ drops a failed handshake unanswered


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with the secret on tcp and unix://; (tcp address, unix address, calls counter)."""
    server = RpcServer(secret=SECRET)
    unix = server.bind(f"unix://{tmp_path_factory.mktemp('auth') / 'daemon.sock'}")
    calls = []
    server.register("remove_all", lambda request: calls.append(request.args) or {"removed": 20})
    server.start()
    yield server.address, unix, calls
    server.stop()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_client_holding_the_secret_is_served(served, transport):
    tcp, unix, calls = served
    with RpcClient(tcp if transport == "tcp" else unix, timeout=5, secret=SECRET) as client:
        assert client.call("remove_all", {"force": True}) == {"removed": 20}
        assert client.call("remove_all", {"again": True}) == {"removed": 20}  # one handshake, two calls


def test_a_tcp_client_without_the_secret_or_with_another_gets_no_reply_and_a_hint(served, caplog):
    tcp, _, calls = served
    before = len(calls)
    with caplog.at_level(logging.WARNING, logger="transfer.rpc.curve"):
        with RpcClient(tcp, timeout=QUICK) as client:
            with pytest.raises(RpcTimeout, match="require a cluster secret"):
                client.call("remove_all", {"force": True})
        with RpcClient(tcp, timeout=QUICK, secret=OTHER) as client:
            with pytest.raises(RpcTimeout, match="is the cluster secret right"):
                client.call("remove_all", {"force": True})
    assert len(calls) == before, "a refused client's request reached a handler"
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "does not use CURVE" in logged and "do not match" in logged


def test_a_unix_client_without_the_secret_or_with_another_is_refused_at_once(served, caplog):
    _, unix, calls = served
    before = len(calls)
    with RpcClient(unix, timeout=5) as client:
        with pytest.raises(AuthenticationFailed, match="requires the cluster secret"):
            client.call("remove_all", {"force": True})
    with caplog.at_level(logging.WARNING, logger="transfer.rpc.client_server"):
        with RpcClient(unix, timeout=5, secret=OTHER) as client:
            with pytest.raises(AuthenticationFailed, match="does not match the cluster secret"):
                client.call("remove_all", {"force": True})
    assert len(calls) == before, "a refused client's request reached a handler"
    assert any("refused a unix:// control connection" in r.getMessage() for r in caplog.records)


def test_the_unix_socket_is_for_its_owner_only(served):
    _, unix, _ = served
    assert stat.S_IMODE(os.stat(unix.removeprefix("unix://")).st_mode) == 0o600


def test_a_client_with_a_secret_still_reaches_a_server_without_one(tmp_path):
    """No secret on the server means authentication is off; a client that has one is served."""
    server = RpcServer()
    unix = server.bind(f"unix://{tmp_path / 'open.sock'}")
    server.register("ping", lambda request: "pong")
    server.start()
    try:
        with RpcClient(unix, timeout=5, secret=SECRET) as client:
            assert client.call("ping") == "pong"
    finally:
        server.stop()


def test_a_request_zeromq_will_not_queue_yet_waits_for_the_connection_within_its_deadline(served, monkeypatch):
    """ZeroMQ refuses to queue (EAGAIN) while it makes a dropped connection again (a failed
    handshake, a restarting daemon); under load a call once failed at once there with "send
    queue full". It now waits for the socket within its deadline, then says what it may be."""
    import time

    import zmq

    tcp, _, _ = served
    refusals = []

    class Refusing(zmq.Socket):
        def send(self, *args, **kwargs):
            if len(refusals) < limit:
                refusals.append(time.monotonic())
                raise zmq.Again()
            return super().send(*args, **kwargs)

        send_multipart = zmq.Socket.send_multipart

    limit = 2
    with RpcClient(tcp, timeout=5, secret=SECRET) as client:
        client._channel.socket.__class__ = Refusing
        assert client.call("remove_all", {"force": True}) == {"removed": 20}
    assert len(refusals) == 2
    refusals.clear()
    limit = 10**9
    with RpcClient(tcp, timeout=QUICK, secret=SECRET) as client:
        client._channel.socket.__class__ = Refusing
        started = time.monotonic()
        with pytest.raises(RpcTimeout, match="could not send .* within the deadline .*cluster secret right"):
            client.call("remove_all", {"force": True})
        assert QUICK <= time.monotonic() - started < QUICK + 2
