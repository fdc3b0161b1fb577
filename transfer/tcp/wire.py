"""The TCP data-plane framing, shared by the initiator and the target side.

On accept, the target sends a challenge (4-byte length + msgpack ``{"nonce": 16 random bytes,
"auth": bool}``); the initiator answers with its hello ``{"segment", "incarnation", "proof", "inline"}``,
where proof is HMAC-SHA256(cluster secret, "mooncake-tcp-data" + nonce), and the target answers
``{"ok", "error"}``. A target that has the cluster secret refuses a hello without the right proof:
nobody without the secret reads or writes its registered memory. A fresh nonce per connection
means a proof overheard on the wire cannot be replayed (a timestamped one could, until it
expired, and would need synchronised clocks). An initiator holding a tenant's credential (not the
cluster secret) names its tenant in the hello and proves the tenant key; a target serves it only
inside the ranges of the master's grants the initiator sent (:mod:`transfer.grants`). A
connection to a restarted peer is refused as stale instead of writing at addresses that now
mean something else. Then the initiator sends request *groups* and the target answers with
response *frames*:

    group = GROUP (count, grant bytes) + count x REQUEST (op, slice id, remote address, length)
            + the grants for the group's ranges (a tenant's initiator only; none: 0 bytes)
            + the payloads of the group's WRITEs, in request order
    frame = FRAME (kind, count) + count x RESPONSE (status, slice id, length)
            [+ for kind READ_DATA: the payloads of the frame's successful READs, in order]

One header block per group and per frame lets each side move a whole group of slices with a
few scatter/gather syscalls (``sendmsg`` of header + payload views, ``recvmsg_into`` straight
into registered memory) instead of several syscalls and a Python round per slice. The target
answers a group's WRITEs in ACKS frames, only after their bytes are in its memory: at the end
of the group, and every ``ACK_INTERVAL`` while it lasts, so a long group on a slow path still
shows progress while a fast one costs a single ack frame (and one wake-up of the waiter);
it answers the group's READs with one READ_DATA frame. Status 0 is success, otherwise a
negative error code (a refused READ carries no payload, a refused WRITE's payload is drained).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any
from collections.abc import Callable, Iterable

import msgpack

from transfer.auth import TCP_DATA_PURPOSE, Credential
from transfer.batch import OpCode
from transfer.descriptor import SegmentDescriptor
from transfer.rpc import spin

REQUEST = struct.Struct("<B7xQQQ")
RESPONSE = struct.Struct("<qQQ")
GROUP = struct.Struct("<II")
FRAME = struct.Struct("<B3xI")
ACKS, READ_DATA = 0, 1
MAX_GROUP = 256  # requests per group (and responses per frame)
ACK_INTERVAL = 0.005  # seconds: held WRITE acks are flushed at least this often
SEND_CHUNK = 4 << 20  # bytes per sendmsg when the caller tracks progress
SEND_BUFFER = 4 << 20  # SO_SNDBUF requested for data connections
IOV_MAX = 1024  # buffers per sendmsg / recvmsg_into call (Linux UIO_MAXIOV)
RECEIVE_BUFFER = 16 << 10  # bytes a Receiver reads ahead: headers and small payloads in one call
MAX_POLL_BACKOFF = 64  # waits a Receiver blocks at once, at most, after polls that found nothing
_LENGTH = struct.Struct("<I")
MAX_HELLO = 64 * 1024


class PeerClosed(ConnectionError):
    pass


class Refused(ConnectionError):
    """The peer answered the hello with a refusal (it restarted: our descriptor is stale, or our
    proof of the cluster secret is missing or wrong)."""


def hello(sock: socket.socket, peer: SegmentDescriptor, secret: Credential | None, inline: bool = False) -> None:
    """Answer the target's challenge with the hello naming the ``peer`` incarnation it means;
    Refused if the target is another one now or does not accept our proof. ``inline``: the
    connection is one thread's own link, whose every group that thread sends and then awaits
    (tcp_inline): the target polls for its next group before sleeping, and for no other."""
    challenge = recv_message(sock)
    nonce = challenge.get("nonce")
    if not isinstance(nonce, bytes):
        raise ConnectionError("the target's challenge carries no nonce")
    if challenge.get("auth") and secret is None:
        raise Refused(f"{peer.name} requires the cluster secret and this engine has none")
    proof = secret.proof(TCP_DATA_PURPOSE, nonce) if secret else None
    tenant = {"tenant": secret.tenant} if secret is not None and secret.tenant is not None else {}
    send_message(sock, {"segment": peer.name, "incarnation": peer.incarnation, "proof": proof,
                        "inline": inline, **tenant})
    answer = recv_message(sock)
    if not answer.get("ok"):
        raise Refused(str(answer.get("error", "handshake refused")))


def request_group(requests: Iterable[tuple[int, int, int, memoryview]], grants: bytes = b"") -> list:
    """The parts of one request group for :func:`send_all`: its header block, the ``grants``
    its ranges need (concatenated tokens), then its WRITE payloads (views, not copies). Each
    request is (opcode, slice id, remote address, local bytes); at most MAX_GROUP of them."""
    requests = list(requests)
    header = bytearray(GROUP.size + len(requests) * REQUEST.size)
    GROUP.pack_into(header, 0, len(requests), len(grants))
    parts: list = [header, grants] if grants else [header]
    for i, (opcode, slice_id, address, local) in enumerate(requests):
        REQUEST.pack_into(header, GROUP.size + i * REQUEST.size, opcode, slice_id, address, len(local))
        if opcode == OpCode.WRITE:
            parts.append(local)
    return parts


class Receiver:
    """One socket's incoming stream, read through a small buffer: a single ``recv`` picks up a
    frame's header, its entries and any small payloads behind them together (a 4 KiB READ
    costs one receive call, not three), while the rest of a large payload goes straight from
    the socket into its memory. Bytes past the current frame stay buffered for the next.

    ``busy_poll``: how long :meth:`exact` polls the socket without sleeping before it blocks,
    while a core is free (:mod:`transfer.rpc.spin`): over loopback on the 2-core VM a 4 KiB
    ping-pong took 67-78 us with both ends blocking, 24-27 with the asking end polling and
    11-12 with both (/tmp/mb/pingspin.py): most of a small transfer's round trip is two
    wake-ups from sleep. Not while a daemon that just answered this process still polls
    (:meth:`transfer.rpc.spin.CoreHeadroom.free_for_a_third`). A poll that found nothing
    doubles the count of the waits after it that block at once (up to MAX_POLL_BACKOFF); one
    that found bytes ends that: a peer whose next bytes come later than a poll lasts (a put's
    target, whose initiator asks the master between two writes) is not polled for in vain
    each time, one that answers within it always is."""

    def __init__(self, sock: socket.socket, size: int = RECEIVE_BUFFER, busy_poll: float = 0.0) -> None:
        self.sock = sock
        self._buffer = memoryview(bytearray(size))
        self._start = self._end = 0  # the buffered, not yet consumed bytes
        self._busy_poll = busy_poll
        self._backoff = 0  # waits to block at once after the last poll that found nothing
        self._skips = 0  # of those, still to come

    def exact(self, size: int) -> memoryview:
        """The next ``size`` (at most the buffer's size) bytes: a view of the buffer, valid
        until the next call."""
        if self._end - self._start < size:
            if self._start:  # make room: move the leftover to the front
                left = self._end - self._start
                self._buffer[:left] = bytes(self._buffer[self._start:self._end])
                self._start, self._end = 0, left
            if self._busy_poll:
                self._poll(size)
            while self._end < size:
                got = self.sock.recv_into(self._buffer[self._end:])
                if not got:
                    raise PeerClosed("peer closed the connection")
                self._end += got
        view = self._buffer[self._start:self._start + size]
        self._start += size
        return view

    def _poll(self, size: int) -> None:
        """Buffer what arrives within busy_poll, up to ``size`` bytes, without sleeping, unless
        this wait is one to block at once or every core is taken."""
        if self._skips:
            self._skips -= 1
            return
        if not spin.HEADROOM.free_for_a_third():
            return
        had = self._end
        until = time.perf_counter() + self._busy_poll
        while self._end < size and time.perf_counter() < until:
            try:
                got = self.sock.recv_into(self._buffer[self._end:], 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                # A process woken onto this core (the target our request woke) runs now
                # rather than after the poll: with 2 cores, one held by another poller, it
                # otherwise waited the whole poll.
                os.sched_yield()
                continue
            if not got:
                raise PeerClosed("peer closed the connection")
            self._end += got
        if self._end > had:
            self._backoff = 0
        else:
            self._backoff = self._skips = min(MAX_POLL_BACKOFF, max(1, 2 * self._backoff))

    def drain_into(self, views: list, first: int) -> int:
        """Copy buffered bytes into ``views`` from index ``first`` (see :func:`advance`);
        returns the first view still to be filled from the socket."""
        while self._start < self._end and first < len(views):
            view = views[first]
            count = min(len(view), self._end - self._start)
            view[:count] = self._buffer[self._start:self._start + count]
            self._start += count
            first = advance(views, first, count)
        return first

    def fill(self, views: list[memoryview], progress: Callable[[], None] | None = None) -> None:
        """Fill each flat byte view in turn: first from the buffer, then from the socket. (Not
        with MSG_WAITALL: a 1 MiB READ that waited for all its bytes in one call measured
        slower, ~650 against ~490 us, than one call per burst of segments.)"""
        views = list(views)
        first = self.drain_into(views, advance(views, 0, 0))
        while first < len(views):
            got = self.sock.recvmsg_into(views[first:first + IOV_MAX])[0]
            if not got:
                raise PeerClosed("peer closed the connection")
            if progress is not None:
                progress()
            first = advance(views, first, got)


class ResponseReader:
    """Reads response frames off one connection (``busy_poll``: see :class:`Receiver`)."""

    def __init__(self, sock: socket.socket, busy_poll: float = 0.0) -> None:
        self._receiver = Receiver(sock, busy_poll=busy_poll)

    def read(self, read_views: Callable[[list[int]], list[memoryview | None]],
             progress: Callable[[], None] | None = None) -> list[tuple[int, int, int]]:
        """One frame's (status, slice id, length) responses. A READ_DATA frame's payloads are
        scattered straight into ``read_views(slice ids)``: the local bytes of each READ, None
        for an id that is no READ in flight (the stream is then out of step: PeerClosed)."""
        kind, count = FRAME.unpack(self._receiver.exact(FRAME.size))
        if not 0 < count <= MAX_GROUP:
            raise PeerClosed(f"response frame of {count} responses")
        responses = list(RESPONSE.iter_unpack(self._receiver.exact(count * RESPONSE.size)))
        if kind == READ_DATA:
            views = []
            for (status, slice_id, length), view in zip(responses, read_views([r[1] for r in responses])):
                if view is None:
                    raise PeerClosed(f"READ data for unknown or WRITE slice {slice_id}")
                if status == 0:
                    if length != len(view):
                        raise PeerClosed(f"READ of {length} bytes for slice {slice_id}")
                    views.append(view)
            self._receiver.fill(views, progress)
        return responses


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the socket, straight into its memory."""
    got, total = 0, len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise PeerClosed("peer closed the connection")
        got += n


def advance(views: list, first: int, count: int) -> int:
    """Consume ``count`` bytes of ``views`` from index ``first``: fully used views are passed,
    a partly used one is replaced by its rest. Returns the first view with bytes left."""
    while count:
        size = len(views[first])
        if count >= size:
            count -= size
            first += 1
        else:
            views[first] = memoryview(views[first])[count:]
            count = 0
    while first < len(views) and not len(views[first]):
        first += 1
    return first


def send_all(sock: socket.socket, parts: list[Any], progress: Callable[[], None] | None = None) -> None:
    """Gather-send ``parts`` (bytes, bytearrays, flat byte memoryviews) without joining them.

    With ``progress``, each ``sendmsg`` carries at most SEND_CHUNK bytes and progress is
    called after each, so a slow path reports progress while a large group drains."""
    parts = list(parts)
    first = advance(parts, 0, 0)
    while first < len(parts):
        if progress is None:
            sent = sock.sendmsg(parts[first:first + IOV_MAX])
        else:
            sent = sock.sendmsg(_window(parts, first))
            progress()
        first = advance(parts, first, sent)


def _window(parts: list, first: int) -> list:
    window, room = [], SEND_CHUNK
    for part in parts[first:first + IOV_MAX]:
        if len(part) >= room:
            window.append(part if len(part) == room else memoryview(part)[:room])
            break
        window.append(part)
        room -= len(part)
    return window


def send_message(sock: socket.socket, message: dict) -> None:
    body = msgpack.packb(message, use_bin_type=True)
    send_all(sock, [_LENGTH.pack(len(body)), body])


def recv_message(sock: socket.socket) -> dict:
    head = bytearray(_LENGTH.size)
    recv_exact(sock, memoryview(head))
    (length,) = _LENGTH.unpack(head)
    if length > MAX_HELLO:
        raise ConnectionError(f"hello of {length} bytes is too large")
    body = bytearray(length)
    recv_exact(sock, memoryview(body))
    message = msgpack.unpackb(bytes(body), raw=False)
    if not isinstance(message, dict):
        raise ConnectionError("hello is not a map")
    return message


def tune(sock: socket.socket) -> None:
    """No Nagle delay for headers and acks; a send buffer large enough that a sender of
    megabyte groups blocks (and wakes) far less often than with the autotuned default (the
    kernel caps the request at net.core.wmem_max). The receive buffer stays autotuned: fixing
    it disables autotuning, which measured slower."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
