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
