"""The buffered receiver under both ends of a TCP data connection: headers and small payloads
arrive in one read, a frame's leftover stays for the next one, and payloads larger than its
buffer reach their memory whole."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from transfer.tcp.wire import PeerClosed, Receiver


def test_frames_small_and_large_payloads_and_leftovers_come_out_in_order():
    rng = np.random.default_rng(7)
    small, large = rng.bytes(4096), rng.bytes(300 * 1024)  # the large one overflows the buffer
    sender, other_end = socket.socketpair()
    with sender, other_end:
        receiver = Receiver(other_end, size=64 * 1024)
        # two "frames" sent in one go: the first read pulls in part of the second
        stream = b"HEAD" + small + b"NEXT" + large + b"TAIL"
        sender.sendall(stream[:70_000])
        assert bytes(receiver.exact(4)) == b"HEAD"
        got_small = memoryview(bytearray(len(small)))
        receiver.fill([got_small])
        assert bytes(got_small) == small
        assert bytes(receiver.exact(4)) == b"NEXT"
        rest = threading.Thread(target=sender.sendall, args=(stream[70_000:],))
        rest.start()  # more than the socket buffers hold: sent while the receiver reads
        halves = [memoryview(bytearray(100 * 1024)), memoryview(bytearray(200 * 1024))]
        receiver.fill(halves)
        rest.join()
        assert bytes(halves[0]) + bytes(halves[1]) == large
        assert bytes(receiver.exact(4)) == b"TAIL"
        sender.close()
        with pytest.raises(PeerClosed):
            receiver.exact(1)


@pytest.fixture
def receive_flags(monkeypatch):
    """The socketpair (sender, receiving end) whose receiving end records the flags of each
    receive call: MSG_DONTWAIT for a poll, 0 for a blocking receive. Cores count as free."""
    flags: list[int] = []
    real_recv_into = socket.socket.recv_into
    monkeypatch.setattr("transfer.rpc.spin.HEADROOM.free_for_a_third", lambda: True)
    monkeypatch.setattr(socket.socket, "recv_into",
                        lambda sock, buffer, n=0, f=0: flags.append(f) or real_recv_into(sock, buffer, n, f))
    sender, other_end = socket.socketpair()
    with sender, other_end:
        yield sender, other_end, flags


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_a_polling_receiver_takes_bytes_that_come_during_its_poll_or_after_it(receive_flags, delay):
    """With busy_poll the first bytes are polled for without sleeping; bytes that come only
    after the poll ran out are still read, by the blocking receive that follows. A frame split
    over two sends comes out whole either way."""
    sender, other_end, flags = receive_flags
    receiver = Receiver(other_end, size=1024, busy_poll=0.01)
    timer = threading.Timer(delay, lambda: (sender.sendall(b"HEAD"), sender.sendall(b"TAIL")))
    timer.start()
    assert bytes(receiver.exact(8)) == b"HEADTAIL"
    timer.join()
    assert socket.MSG_DONTWAIT in flags  # it polled first
    if delay > 0.01:
        assert flags[-1] == 0  # the poll ran out: the bytes came to a blocking receive
    sender.close()
    with pytest.raises(PeerClosed):
        receiver.exact(1)


def test_no_poll_while_every_core_is_taken(receive_flags, monkeypatch):
    """On a busy host the poll would hold the core the peer needs: the receiver blocks at once."""
    sender, other_end, flags = receive_flags
    monkeypatch.setattr("transfer.rpc.spin.HEADROOM.free_for_a_third", lambda: False)
    receiver = Receiver(other_end, size=1024, busy_poll=1.0)
    sender.sendall(b"DATA")
    assert bytes(receiver.exact(4)) == b"DATA"
    assert flags == [0]


def test_a_poll_that_found_nothing_makes_the_next_waits_block_at_once_until_one_finds_bytes(receive_flags):
    """A peer whose bytes come later than a poll lasts is polled for less and less often (one
    wait in 2, then in 3...); bytes found by a poll make every wait poll again."""
    sender, other_end, flags = receive_flags
    receiver = Receiver(other_end, size=1024, busy_poll=0.001)

    def polled(delay: float) -> bool:
        flags.clear()
        timer = threading.Timer(delay, sender.sendall, args=(b"X",))
        timer.start()
        assert bytes(receiver.exact(1)) == b"X"
        timer.join()
        return socket.MSG_DONTWAIT in flags

    late = 0.03
    assert [polled(late) for _ in range(6)] == [True, False, True, False, False, True]
    assert [polled(late) for _ in range(4)] == [False] * 4  # after a third miss, four
    sender.sendall(b"Z")  # waiting when the next poll starts: it finds bytes
    flags.clear()
    assert bytes(receiver.exact(1)) == b"Z" and flags == [socket.MSG_DONTWAIT]
    assert [polled(late) for _ in range(3)] == [True, False, True]  # back to one in 2
