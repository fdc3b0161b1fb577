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


class RecordedReceives:
    """The flags of each receive call on the receiving end of a socketpair (MSG_DONTWAIT for a
    poll, 0 for a blocking receive), and a way to send bytes only once a blocking receive has
    begun: bytes that come "late", after any poll, whatever the machine's load."""

    def __init__(self, sender: socket.socket, other_end: socket.socket) -> None:
        self.sender, self.other_end = sender, other_end
        self.flags: list[int] = []
        self.blocking = threading.Event()

    def record(self, flags: int) -> None:
        self.flags.append(flags)
        if flags == 0:
            self.blocking.set()

    def send_once_blocking(self, data: bytes) -> threading.Thread:
        self.blocking.clear()

        def send() -> None:
            assert self.blocking.wait(10), "the receiver never blocked"
            self.sender.sendall(data)

        thread = threading.Thread(target=send)
        thread.start()
        return thread


@pytest.fixture
def receives(monkeypatch):
    """A socketpair whose receiving end's receive calls are recorded (RecordedReceives). Cores
    count as free."""
    real_recv_into = socket.socket.recv_into
    sender, other_end = socket.socketpair()
    recorded = RecordedReceives(sender, other_end)

    def recv_into(sock, buffer, nbytes=0, flags=0):
        if sock is other_end:
            recorded.record(flags)
        return real_recv_into(sock, buffer, nbytes, flags)

    monkeypatch.setattr("transfer.rpc.spin.HEADROOM.free_for_a_third", lambda: True)
    monkeypatch.setattr(socket.socket, "recv_into", recv_into)
    with sender, other_end:
        yield recorded


def test_a_polling_receiver_takes_bytes_that_come_during_its_poll_or_after_it(receives):
    """With busy_poll the first bytes are polled for without sleeping; bytes that come only
    after the poll ran out are still read, by the blocking receive that follows. A frame split
    over two sends comes out whole either way."""
    receiver = Receiver(receives.other_end, size=1024, busy_poll=0.01)
    receives.sender.sendall(b"HEAD")
    receives.sender.sendall(b"TAIL")
    assert bytes(receiver.exact(8)) == b"HEADTAIL"
    assert receives.flags[0] == socket.MSG_DONTWAIT  # found while polling

    receives.flags.clear()
    late = receives.send_once_blocking(b"LATE")
    assert bytes(receiver.exact(4)) == b"LATE"
    late.join()
    assert receives.flags[0] == socket.MSG_DONTWAIT and receives.flags[-1] == 0  # polled, then blocked
    receives.sender.close()
    with pytest.raises(PeerClosed):
        receiver.exact(1)


def test_no_poll_while_every_core_is_taken(receives, monkeypatch):
    """On a busy host the poll would hold the core the peer needs: the receiver blocks at once."""
    monkeypatch.setattr("transfer.rpc.spin.HEADROOM.free_for_a_third", lambda: False)
    receiver = Receiver(receives.other_end, size=1024, busy_poll=1.0)
    receives.sender.sendall(b"DATA")
    assert bytes(receiver.exact(4)) == b"DATA"
    assert receives.flags == [0]


def test_a_poll_that_found_nothing_makes_the_next_waits_block_at_once_until_one_finds_bytes(receives):
    """A peer whose bytes come later than a poll lasts is polled for less and less often (one
    wait in 2, then in 3...); bytes found by a poll make every wait poll again."""
    receiver = Receiver(receives.other_end, size=1024, busy_poll=0.001)

    def polled_for_late_bytes() -> bool:
        receives.flags.clear()
        late = receives.send_once_blocking(b"X")
        assert bytes(receiver.exact(1)) == b"X"
        late.join()
        return socket.MSG_DONTWAIT in receives.flags

    assert [polled_for_late_bytes() for _ in range(6)] == [True, False, True, False, False, True]
    assert [polled_for_late_bytes() for _ in range(4)] == [False] * 4  # after a third miss, four
    receives.sender.sendall(b"Z")  # waiting when the next poll starts: it finds bytes
    receives.flags.clear()
    assert bytes(receiver.exact(1)) == b"Z" and receives.flags == [socket.MSG_DONTWAIT]
    assert [polled_for_late_bytes() for _ in range(3)] == [True, False, True]  # back to one in 2
