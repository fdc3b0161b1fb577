"""One initiator-side TCP stream to a peer endpoint, bound to one local path.

Two threads per connection: a sender that pipelines queued slices in request groups (one
header block and the WRITE payload views gathered in one ``sendmsg``, without copying) and a
reader that matches response frames to slices and scatter-receives READ payloads straight into
local memory. Both restart the watchdog's clock on every syscall that moved bytes. The socket is connected lazily by
the sender, so submitting never waits on the network. The socket has one owner: whichever of
the two threads exits last closes it, so neither can find its descriptor reused under it.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from transfer.batch import OpCode, Slice
from transfer.descriptor import Endpoint, SegmentDescriptor
from transfer.auth import Credential
from transfer.tcp.wire import (MAX_GROUP, PeerClosed, Refused, ResponseReader, hello, request_group,
                               send_all, tune)
from transfer.transport import SliceSink

_MAX_BYTES_PER_SEND = 8 << 20


class Connection:
    def __init__(self, peer: SegmentDescriptor, nic: str, local_host: str | None,
                 remote: Endpoint, sink: SliceSink, handshake_timeout: float,
                 on_dead: Callable[[Connection], None], secret: Credential | None = None) -> None:
        self.peer, self.nic, self.local_host, self.remote = peer, nic, local_host, remote
        self._secret = secret
        # A tenant's credential moves only the ranges the master granted: each group carries
        # the grants of its slices (transfer.grants); the cluster secret's needs none.
        self._sends_grants = secret is not None and secret.tenant is not None
        self._sink, self._handshake_timeout, self._on_dead = sink, handshake_timeout, on_dead
        self._cv = threading.Condition()
        self._queue: deque[Slice] = deque()
        self._inflight: dict[int, Slice] = {}
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._threads_alive = 1
        self.dead = False
        self.retiring = False
        self.last_progress = time.monotonic()
        threading.Thread(target=self._send_loop, name=f"tcp-send-{nic}", daemon=True).start()

    # -- called by the transport --------------------------------------------------------------

    def enqueue(self, pieces: list[Slice]) -> bool:
        """Queue slices; False if the connection already died (the caller picks another)."""
        with self._cv:
            if self.dead:
                return False
            if not self._queue and not self._inflight:
                self.last_progress = time.monotonic()  # idle until now: the clock starts here
            self._queue.extend(pieces)
            self._cv.notify()
        return True

    def retire(self) -> None:
        """Evicted from the pool: finish what is queued and in flight, then close."""
        with self._cv:
            self.retiring = True
            self._cv.notify()

    def stalled(self, now: float, timeout: float) -> bool:
        with self._cv:
            busy = bool(self._queue or self._inflight)
        return busy and now - self.last_progress > timeout

    def kill(self, reason: str) -> None:
        """Fail everything queued or in flight (they may be retried elsewhere) and close."""
        with self._cv:
            if self.dead:
                return
            self.dead = True
            pieces = [*self._inflight.values(), *self._queue]
            self._inflight.clear()
            self._queue.clear()
            self._cv.notify_all()
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes both threads out of their syscalls
            except OSError:
                pass
        self._on_dead(self)
        for piece in pieces:
            self._sink.failed(piece, reason, self.nic)

    # -- sender thread --------------------------------------------------------------------------

    def _send_loop(self) -> None:
        try:
            self._connect()
        except Refused as exc:
            self._fail_stale(str(exc))
            self._thread_exit()
            return
        except (OSError, ConnectionError, ValueError) as exc:
            self.kill(f"connect to {self.remote.host}:{self.remote.port} via {self.nic} failed: {exc}")
            self._thread_exit()
            return
        with self._cv:
            self._threads_alive += 1
        threading.Thread(target=self._read_loop, name=f"tcp-read-{self.nic}", daemon=True).start()
        try:
            while self._send_some():
                pass
        except (OSError, ConnectionError) as exc:
            self.kill(f"send to {self.peer.name} via {self.nic} failed: {exc}")
        self._thread_exit()

    def _connect(self) -> None:
        source = (self.local_host, 0) if self.local_host else None
        sock = socket.create_connection((self.remote.host, self.remote.port),
                                        timeout=self._handshake_timeout, source_address=source)
        try:
            tune(sock)
            hello(sock, self.peer, self._secret)
            sock.settimeout(None)  # from here the watchdog, not a socket timeout, bounds waits
        except BaseException:
            sock.close()
            raise
        with self._cv:
            self._sock = sock
            if self.dead:  # killed by the watchdog while we were connecting
                sock.shutdown(socket.SHUT_RDWR)
                raise ConnectionError("connection was killed while connecting")

    def _send_some(self) -> bool:
        with self._cv:
            while not self._queue and not self.dead and not (self.retiring and not self._inflight):
                self._cv.wait()
            if self.dead:
                return False
            retired = not self._queue  # retiring and drained
            if retired:
                self.dead = True
                self._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
        if retired:
            self._on_dead(self)  # outside our lock: the transport takes its own lock first
            return False
        with self._cv:
            group: list[tuple[int, Slice]] = []
            size = 0
            while self._queue and len(group) < MAX_GROUP and size < _MAX_BYTES_PER_SEND:
                piece = self._queue.popleft()
                slice_id = next(self._ids)
                self._inflight[slice_id] = piece
                group.append((slice_id, piece))
                size += piece.length
            sock = self._sock
        grants = b"".join({piece.task.request.grant: None for _, piece in group}) if self._sends_grants else b""
        parts = request_group(((piece.opcode, slice_id, piece.remote_address, piece.local)
                               for slice_id, piece in group), grants)
        send_all(sock, parts, self._touch)  # type: ignore[arg-type]
        return True

    def _touch(self) -> None:
        """Bytes moved: the watchdog's clock restarts."""
        self.last_progress = time.monotonic()

    # -- reader thread --------------------------------------------------------------------------

    def _read_loop(self) -> None:
        reader = ResponseReader(self._sock)  # type: ignore[arg-type]
        try:
            while True:
                responses = reader.read(self._read_views, self._touch)
                with self._cv:
                    if self.dead:  # killed meanwhile: kill() already reported them
                        break
                    known = all(slice_id in self._inflight for _, slice_id, _ in responses)
                    if known:
                        finished = [(status, self._inflight.pop(slice_id))
                                    for status, slice_id, _ in responses]
                        self.last_progress = time.monotonic()
                        self._cv.notify()
                if not known:
                    raise PeerClosed("response for an unknown slice")
                for status, piece in finished:
                    if status == 0:
                        self._sink.done(piece)  # type: ignore[arg-type]
                    else:
                        self._sink.failed(piece, f"target {self.peer.name} refused the range "  # type: ignore[arg-type]
                                          f"(code {status})", None, fatal=True)
        except (OSError, ConnectionError) as exc:
            self.kill(f"connection to {self.peer.name} via {self.nic} lost: {exc}")
        self._thread_exit()

    def _read_views(self, slice_ids: list[int]) -> list[memoryview | None]:
        """Where a READ_DATA frame's payloads go: the memory of the READ slices in flight."""
        with self._cv:
            pieces = [self._inflight.get(slice_id) for slice_id in slice_ids]
        return [piece.local if piece is not None and piece.opcode == OpCode.READ else None
                for piece in pieces]

    def _fail_stale(self, reason: str) -> None:
        with self._cv:
            self.dead = True
            pieces = list(self._queue)
            self._queue.clear()
        self._on_dead(self)
        for piece in pieces:
            self._sink.failed(piece, f"segment {self.peer.name} refused the connection: {reason}", None, fatal=True)

    def _thread_exit(self) -> None:
        with self._cv:
            self._threads_alive -= 1
            last = self._threads_alive == 0
            sock = self._sock
        if last and sock is not None:
            sock.close()
