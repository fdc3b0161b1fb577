"""A caller thread's own TCP connection to one peer incarnation, for small transfers.

Handing a small request to a :class:`~transfer.tcp.connection.Connection` costs four thread
wake-ups (caller -> sender -> target -> reader -> waiter), tens of microseconds each. An
inline link is used by one thread alone, so that thread sends the request group and reads the
response frames itself: only the target's thread wakes in between. The kernel's send and
receive timeouts are the slice timeout, so a peer that stops answering ends the call with a
timeout instead of a hang (a Python socket timeout would add a poll() before every call).
A large read can be split over several links of the thread (:meth:`InlineLink.move_striped`):
the target serves each on a thread of its own, so they fill their sockets at once.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from transfer.batch import OpCode
from transfer.descriptor import Endpoint, SegmentDescriptor
from transfer.auth import Credential
from transfer.tcp.wire import MAX_GROUP, ResponseReader, hello, request_group, send_all, tune

Move = tuple[OpCode, memoryview, int, bytes]  # (opcode, local bytes, remote address, grant)


class InlineLink:
    def __init__(self, peer: SegmentDescriptor, local_host: str | None, remote: Endpoint,
                 handshake_timeout: float, io_timeout: float, secret: Credential | None = None,
                 busy_poll: float = 0.0) -> None:
        """Connect and say hello; raises tcp_wire.Refused (stale peer), OSError or ConnectionError.
        ``busy_poll``: how long the answer to a group is polled for before the thread sleeps
        (see tcp_wire.Receiver); the thread waits for nothing else meanwhile."""
        source = (local_host, 0) if local_host else None
        sock = socket.create_connection((remote.host, remote.port), timeout=handshake_timeout,
                                        source_address=source)
        try:
            tune(sock)
            hello(sock, peer, secret, inline=True)
            sock.settimeout(None)
            seconds = int(io_timeout)
            timeval = struct.pack("ll", seconds, int((io_timeout - seconds) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._io_timeout = io_timeout
        # A tenant's credential sends the master's grant for each range (transfer.grants).
        self._sends_grants = secret is not None and secret.tenant is not None
        self._reader = ResponseReader(sock, busy_poll)
        self._lock = threading.Lock()
        self._busy = False
        self._closed = False

    def move(self, moves: list[Move]) -> list[int]:
        """Move each (opcode, local, remote address, grant); the target's status per move (0: done).
        Groups go one at a time: the target sends READ data only after reading a whole group,
        so a second group in flight could fill both directions' buffers at once."""
        with self._in_use():
            statuses: list[int] = []
            for first in range(0, len(moves), MAX_GROUP):
                group = moves[first:first + MAX_GROUP]
                self._send_group(group)
                statuses.extend(self._read_group(group))
            return statuses

    @contextmanager
    def _in_use(self) -> Iterator[None]:
        """Marks the link busy for :meth:`close`; any error closes it: frames of an unfinished
        group may still arrive, and read by the next call they would be taken for its own (slice
        ids restart at 0 in every group)."""
        with self._lock:
            if self._closed:
                raise ConnectionError("link was closed")
            self._busy = True
        try:
            yield
        except BaseException as exc:
            with self._lock:
                self._closed = True
            if isinstance(exc, BlockingIOError):  # the kernel's send or receive timeout ran out
                raise TimeoutError(f"no progress for {self._io_timeout:g}s") from exc
            raise
        finally:
            with self._lock:
                self._busy = False
                if self._closed:
                    self._sock.close()

    def _send_group(self, group: list[Move]) -> None:
        grants = b"".join({move[3]: None for move in group}) if self._sends_grants else b""
        send_all(self._sock, request_group(((op, n, address, local)
                                            for n, (op, local, address, _) in enumerate(group)), grants))

    def _read_group(self, group: list[Move]) -> list[int]:
        statuses: list[int | None] = [None] * len(group)
        waiting = len(group)

        def read_views(ids: list[int]) -> list[memoryview | None]:
            return [group[n][1] if 0 <= n < len(group) and group[n][0] == OpCode.READ
                    and statuses[n] is None else None for n in ids]

        while waiting:
            for status, n, _ in self._reader.read(read_views):
                if not 0 <= n < len(group) or statuses[n] is not None:
                    raise ConnectionError(f"response for an unknown slice {n}")
                statuses[n] = status
                waiting -= 1
        return statuses  # type: ignore[return-value]

    @staticmethod
    def move_striped(links: list[InlineLink], parts: list[list[Move]]) -> list[list[int]]:
        """Each part (at most MAX_GROUP moves) on its own link to the same peer, every group sent
        before any answer is read: the target serves each connection on a thread of its own, so
        one transfer is copied into the sockets by several threads at once while this thread
        drains them in turn (a 1 MiB READ over loopback, halves on two connections: ~300 us
        against ~470 on one, /tmp/s21/sf5.py). Statuses per part; an error closes every link."""
        with ExitStack() as in_use:
            for link in links:
                in_use.enter_context(link._in_use())
            for link, part in zip(links, parts):
                link._send_group(part)
            return [link._read_group(part) for link, part in zip(links, parts)]

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """From any thread: a link in use is shut down (its owner's call fails and closes the
        socket), an idle one closed, so no descriptor is reused under a running syscall."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            busy = self._busy
        if busy:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        else:
            self._sock.close()
