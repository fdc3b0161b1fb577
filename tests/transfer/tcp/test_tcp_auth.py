"""The TCP data plane with a cluster secret: the target reads or writes registered memory only
for an initiator whose hello proves the secret on this connection's own nonce."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest

from transfer.auth import TCP_DATA_PURPOSE, ClusterSecret
from transfer.batch import OpCode, TransferRequest
from transfer.tcp.wire import (FRAME, READ_DATA, RESPONSE, Refused, hello, recv_exact, recv_message,
                               request_group, send_all, send_message)

SECRET = ClusterSecret("the-cluster-secret-of-these-tests")
OTHER = ClusterSecret("another-cluster-secret-entirely")
SIZE = 4096


@pytest.fixture
def target(make_engine):
    """An engine with the secret serving 4 KiB of 7s; (its descriptor, the buffer's address)."""
    engine = make_engine(protocol="tcp", secret=SECRET)
    memory = np.full(SIZE, 7, np.uint8)
    address = engine.register_local_memory(memory)
    yield engine.descriptor(), address
    engine.unregister_local_memory(address)


def _connect(descriptor) -> socket.socket:
    endpoint = descriptor.endpoints[0]
    return socket.create_connection((endpoint.host, endpoint.port), timeout=5)


def _read(sock: socket.socket, address: int) -> bytes:
    """One READ of the buffer on a connection past its hello; the bytes, or b"" if the target
    closed the connection instead of answering."""
    try:
        send_all(sock, request_group([(OpCode.READ, 1, address, memoryview(bytearray(SIZE)))]))
        head = bytearray(FRAME.size + RESPONSE.size)
        recv_exact(sock, memoryview(head))
        kind, _ = FRAME.unpack_from(head)
        status, _, length = RESPONSE.unpack_from(head, FRAME.size)
        assert kind == READ_DATA and status == 0
        data = bytearray(length)
        recv_exact(sock, memoryview(data))
        return bytes(data)
    except (ConnectionError, OSError):
        return b""


def test_a_hello_without_a_proof_is_refused_and_reads_nothing(target, caplog):
    descriptor, address = target
    with _connect(descriptor) as sock, caplog.at_level(logging.WARNING, logger="transfer.tcp.server"):
        challenge = recv_message(sock)
        assert challenge["auth"] is True and len(challenge["nonce"]) == 16
        send_message(sock, {"segment": descriptor.name, "incarnation": descriptor.incarnation})
        answer = recv_message(sock)
        assert answer["ok"] is False and "no proof" in answer["error"]
        assert _read(sock, address) == b""
    assert any("refused a TCP data connection" in r.getMessage() for r in caplog.records)


def test_a_wrong_or_replayed_proof_is_refused(target):
    descriptor, address = target
    with _connect(descriptor) as sock:
        with pytest.raises(Refused, match="wrong proof"):
            hello(sock, descriptor, OTHER)
        assert _read(sock, address) == b""
    with _connect(descriptor) as first:  # a proof overheard on one connection ...
        nonce = recv_message(first)["nonce"]
        overheard = SECRET.proof(TCP_DATA_PURPOSE, nonce)
    with _connect(descriptor) as sock:  # ... is worth nothing on the next: its nonce is new
        recv_message(sock)
        send_message(sock, {"segment": descriptor.name, "incarnation": descriptor.incarnation,
                            "proof": overheard})
        assert recv_message(sock)["ok"] is False
        assert _read(sock, address) == b""


def test_an_initiator_without_the_secret_says_so_before_sending_anything(target):
    descriptor, _ = target
    with _connect(descriptor) as sock:
        with pytest.raises(Refused, match="requires the cluster secret"):
            hello(sock, descriptor, None)


def test_the_right_proof_is_served(target, make_engine):
    descriptor, address = target
    with _connect(descriptor) as sock:
        hello(sock, descriptor, SECRET)
        assert _read(sock, address) == bytes([7]) * SIZE
    # And the engine's own path, which proves the secret on the control plane and the data plane.
    initiator = make_engine(protocol="tcp", secret=SECRET)
    into = np.zeros(SIZE, np.uint8)
    local = initiator.register_local_memory(into)
    handle = initiator.open_segment(descriptor.name)
    assert initiator.transfer_now_many([TransferRequest(OpCode.READ, local, handle, address, SIZE)]) == [True]
    assert (into == 7).all()
