"""Control-plane RPC that every daemon speaks: ZeroMQ ROUTER on the daemon, DEALER on clients.

Wire protocol (one ZeroMQ multipart message each way; ROUTER adds/strips the peer identity):

    request:  [header, bulk_0, bulk_1, ...]
              header = msgpack {"id": int, "op": str, "args": map, "timeout_ms": int (optional)}
    reply:    [header, bulk_0, ...]
              header = msgpack {"id": int, "ok": true, "result": any}
                     | msgpack {"id": int|nil, "ok": false,
                                "error": {"code": int, "name": str, "message": str}}

Bulk bytes travel as extra frames, never inside msgpack. Many requests may be in flight on one
socket; replies carry the request id and may come back in any order. Every malformed, oversized
or unknown request gets an error reply (id nil when the id itself could not be read) and the
server keeps serving. ``timeout_ms`` lets the server skip work whose caller has already given up.

Handlers run on the server's I/O thread unless registered ``blocking=True``; blocking handlers
run on a thread pool and hand their reply back through a queue and a wake-up pipe, because a
ZeroMQ socket must only ever be touched by the thread that polls it.

A server may also listen on ``unix://PATH`` (:mod:`transfer.rpc.stream`): the same messages over
a Unix stream socket, which the same I/O thread polls beside the ZeroMQ socket. A client given a
``unix://`` address speaks that transport; any other address goes through ZeroMQ.

Given the cluster secret, a server admits only clients that hold it too: ZeroMQ CURVE on its
ZeroMQ endpoints (:mod:`transfer.rpc.curve`), a challenge on each unix:// connection
(:mod:`transfer.rpc.stream`). Without one, both are open to any local user who can connect.

A server made with ``tenant_ops`` (the master's store ops on keys) also admits tenant
credentials (:class:`transfer.auth.TenantCredential`): each request is bound to the tenant its
connection proved (on ZeroMQ, its message's sender key, :func:`transfer.rpc.curve.sender`; on a
stream, the connection's challenge), handed to the handler as :attr:`Request.tenant`, and refused
with UNAUTHORIZED for any op outside ``tenant_ops``. A tenant client names its tenant in every
request header (``"tenant": name``), which is what a ZeroMQ server derives the expected key from.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

import msgpack
import zmq

from transfer.auth import ClusterSecret, Credential
from transfer.rpc import curve, spin, stream
from transfer.rpc.log_throttle import LogThrottle
from transfer.errors import (
    AuthenticationFailed,
    HandlerFailed,
    MalformedMessage,
    MessageTooLarge,
    MooncakeError,
    RpcError,
    RpcTimeout,
    ShuttingDown,
    Unauthorized,
    UnknownOperation,
    error_from_wire,
)

log = logging.getLogger(__name__)

# Plain ints, not pyzmq's enum members: `events & zmq.POLLIN` on the hot path would run the
# enum's Python-level __and__ on every request.
# Deadline of a call a process makes on its way out (unmount, withdraw a descriptor): against a
# peer that is gone, several such calls must still fit in `down`'s stop_grace (5 s by default).
FAREWELL_TIMEOUT_S = 1.0
# How often a daemon polling for a client's next request asks whether a core is still free
# (spin.CoreHeadroom.free_now, 2.5 us a sample): a twentieth of the spin's time at most.
# A spin stops once SPIN_CROWDED_SAMPLES in a row found every core taken: 150 us, a fraction of a
# 1 MiB transfer over TCP, which keeps two threads running throughout. Against one sample or
# two, three kept small puts' p50 (149-175 vs 173-189 us) and a 1 MiB TCP put's (678-798 vs
# 783-826 us; /tmp/mb/abspin2.sh, three rounds).
SPIN_RECHECK_INTERVAL = 50e-6
SPIN_CROWDED_SAMPLES = 3

_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)
_POLLOUT = int(zmq.POLLOUT)

Buffer = Any  # bytes, bytearray, memoryview, numpy array: anything with the buffer protocol


@dataclass
class Request:
    op: str
    args: dict
    frames: list[memoryview]
    deadline: float  # time.monotonic() after which the caller no longer waits
    peer: Any = b""  # a ZeroMQ identity, or the stream connection the request came on
    # The tenant whose credential the request came with; None: the cluster secret's (or no
    # authentication), which may act for any tenant.
    tenant: str | None = None


@dataclass
class Reply:
    """A handler's answer with bulk frames; also what :meth:`RpcClient.call_frames` returns."""

    result: Any = None
    frames: Sequence[Buffer] = field(default_factory=list)


Handler = Callable[[Request], Any]


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _error_header(request_id: Any, error: MooncakeError) -> bytes:
    return _pack({"id": request_id, "ok": False, "error": error.to_wire()})


class RpcServer:
    """A ROUTER socket serving registered operations on a background I/O thread."""

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:*",
        *,
        max_message_size: int = 64 * 2**20,
        max_buffered_bytes: int = 128 * 2**20,
        handler_threads: int = 8,
        busy_poll: float = 0.0,
        context: zmq.Context | None = None,
        secret: Credential | None = None,
        tenant_ops: frozenset[str] = frozenset(),
    ) -> None:
        self._context = context or zmq.Context.instance()
        self._busy_poll = busy_poll
        self._secret = secret
        # Only a cluster secret can check a tenant's credential (it derives the tenant's key).
        self._tenant_ops = tenant_ops if isinstance(secret, ClusterSecret) else frozenset()
        self._socket = self._context.socket(zmq.ROUTER)
        self._refusals = curve.RefusalLog(curve.make_server(
            self._socket, self._context, secret, admits_tenants=bool(self._tenant_ops))) if secret else None
        self._socket.setsockopt(zmq.LINGER, 0)
        # A peer that disconnects while we reply must not make send() raise or block.
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # ZeroMQ buffers a frame whole before we see it: without this cap a peer that declares a
        # 1 GiB frame makes the daemon allocate it. Over the cap, ZeroMQ drops the connection as
        # soon as the frame's header arrives; smaller messages over the limit get a typed error.
        self._socket.setsockopt(zmq.MAXMSGSIZE, stream.body_limit(max_message_size))
        self._socket.bind(bind)
        self.address: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.max_message_size = max_message_size
        self.max_buffered_bytes = max_buffered_bytes
        self._handlers: dict[str, tuple[Handler, bool]] = {}
        self._pool = ThreadPoolExecutor(handler_threads, thread_name_prefix="rpc-handler")
        self._done: queue.SimpleQueue[list] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._accepting = True
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: dict[int, stream.StreamListener] = {}
        self._streams: dict[int, stream.ServerConnection] = {}
        self._poll_items_stale = True
        self.num_served = 0
        self._failures = LogThrottle(log)
        self._stream_refusals = LogThrottle(log)

    def bind(self, endpoint: str) -> str:
        """Serve on ``endpoint`` as well, e.g. a ``unix://`` stream socket (or a ZeroMQ ipc://
        one) beside the TCP port for same-host clients. Call before :meth:`start`: afterwards
        only the I/O thread may touch the sockets. Returns the bound address."""
        if stream.is_stream_address(endpoint):
            listener = stream.StreamListener(endpoint)
            self._listeners[listener.fd] = listener
            return listener.address
        self._socket.bind(endpoint)
        return self._socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def register(self, op: str, handler: Handler, *, blocking: bool = False) -> None:
        self._handlers[op] = (handler, blocking)

    def start(self) -> RpcServer:
        self._thread = threading.Thread(target=self._loop, name="rpc-server", daemon=True)
        self._thread.start()
        return self

    def stop(self, drain_timeout: float = 3.0) -> None:
        """Refuse new requests, let in-flight blocking handlers finish up to the deadline, close."""
        self._accepting = False
        deadline = time.monotonic() + drain_timeout
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopping.set()
        os.write(self._wake_write, b"x")
        if self._thread:
            self._thread.join(timeout=max(1.0, drain_timeout))
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._refusals:
            self._refusals.close(self._socket)
        self._socket.close(linger=0)
        for connection in self._streams.values():
            connection.close()
        for listener in self._listeners.values():
            listener.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    # -- I/O thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        sock, wake = self._socket, self._wake_read
        items: list = []
        spin_until = recheck_at = 0.0
        crowded = 0  # samples in a row that found more runnable threads than cores
        while not self._stopping.is_set():
            if self._poll_items_stale:
                # zmq_poll on a list rebuilt only when connections come and go: Poller.poll and
                # dict() of its result cost a few µs of Python per wake-up, a visible share of a
                # round trip.
                items = self._poll_items()
            # Right after a stream request, poll without sleeping for a while: a client's next
            # request (a put's PutEnd after its PutStart) usually comes within it, and a thread
            # woken from sleep on an idle host takes tens of µs to run again. Not after ZeroMQ
            # traffic: its I/O threads need the CPU a spinning thread would hold. Nor while
            # every core is taken (:mod:`transfer.rpc.spin`): the client needs ours.
            now = time.perf_counter()
            spinning = now < spin_until
            ready = zmq.zmq_poll(items, 0 if spinning else 500)
            if spinning and not ready and now >= recheck_at:
                # A thread woken since the spin began (a TCP transfer's target, woken by the
                # client that just had its answer) would wait for the core this spin holds:
                # a 1 MiB put over TCP moved in 363-387 us without the master's spin and
                # 472-543 with it (/tmp/mb/put1m.py). Seen in SPIN_CROWDED_SAMPLES in a row,
                # not one: on one alone, threads that run briefly (timers, pings) ended about a
                # tenth of the spins before small puts' next requests, each of which then paid
                # ~100 us waking the master (/tmp/mb/abspin.sh).
                recheck_at = now + SPIN_RECHECK_INTERVAL
                crowded = 0 if spin.HEADROOM.free_now() else crowded + 1
                if crowded >= SPIN_CROWDED_SAMPLES:
                    spin_until = 0.0
            # One ZeroMQ message per poll: a poll that finds something ready returns at once and
            # costs no more than the EVENTS check a drain loop would make, and a finished
            # blocking reply never waits behind a burst of requests.
            for item, events in ready:
                if item is sock:
                    if self._tenant_ops:
                        message, sender_key = _recv_message_with_sender(sock)
                    else:
                        message, sender_key = _recv_message(sock, True), None
                    self._answer(message[0], message[1:2], [f.buffer for f in message[2:]], sender_key)
                elif item == wake:
                    self._send_finished_replies()
                elif self._refusals and item is self._refusals.monitor:
                    self._refusals.read()
                else:
                    self._stream_ready(item, events)
                    if self._busy_poll and spin.HEADROOM.free():
                        spin_until, crowded = time.perf_counter() + self._busy_poll, 0
        self._send_finished_replies()

    def _poll_items(self) -> list:
        self._poll_items_stale = False
        items = [(self._socket, _POLLIN), (self._wake_read, _POLLIN)]
        if self._refusals:
            items.append((self._refusals.monitor, _POLLIN))
        items += [(fd, _POLLIN) for fd in self._listeners]
        for fd, connection in self._streams.items():
            reading, writing = connection.interest
            items.append((fd, (_POLLIN if reading else 0) | (_POLLOUT if writing else 0)))
        return items

    def _stream_ready(self, fd: int, events: int) -> None:
        listener = self._listeners.get(fd)
        if listener is not None:
            for sock in listener.accept():
                connection = stream.ServerConnection(sock, self.max_message_size, self._secret,
                                                     admits_tenants=bool(self._tenant_ops))
                self._streams[connection.fd] = connection
            self._poll_items_stale = True
            return
        connection = self._streams.get(fd)
        if connection is None:
            return
        watched = connection.interest
        if events & _POLLOUT:
            connection.flush()
        if events & ~_POLLOUT:
            try:
                for message in connection.receive():
                    if not connection.authenticated:
                        self._admit(connection, message)
                        if not connection.open:
                            break
                    elif isinstance(message, stream.Oversized):
                        self._reply(connection, [_error_header(_peek_id(message.header), MessageTooLarge(
                            f"message of {message.size} bytes exceeds the limit of "
                            f"{self.max_message_size} bytes"))])
                    else:
                        self._answer(connection, message[:1], message[1:])
            except stream.ConnectionLost:
                if not connection.authenticated:
                    self._stream_refusals.warning("left", "a unix:// client left without proving it holds "
                                                  "the cluster secret")
                connection.close()
            except MooncakeError as exc:  # a bad frame table: where the next message starts is lost
                connection.send([_error_header(None, exc)])
                connection.close()
        if not connection.open:
            del self._streams[fd]
            self._poll_items_stale = True
        elif connection.interest != watched:
            self._poll_items_stale = True
        if connection.open and connection.reader.buffered:
            self._enforce_buffer_budget()

    def _admit(self, connection: stream.ServerConnection, proof: Any) -> None:
        """A unix:// connection's first message: its proof of the secret, or it is closed."""
        reason = connection.admit(proof)
        if reason is None:
            return
        self._stream_refusals.warning(reason, "refused a unix:// control connection: %s", reason)
        connection.send([_error_header(None, AuthenticationFailed(
            f"connection refused: {reason}; give the client the cluster secret "
            "(MOONCAKE_CLUSTER_SECRET or cluster_secret_file)"))])
        connection.close()

    def _enforce_buffer_budget(self) -> None:
        """Close the connections holding the most unfinished request bytes until all of them
        together fit ``max_buffered_bytes``: each may stay under the message limit, so only a
        budget across connections bounds what slow or hostile senders make us hold."""
        held = {fd: c.reader.buffered for fd, c in self._streams.items() if c.open and c.reader.buffered}
        total = sum(held.values())
        for fd in sorted(held, key=held.__getitem__, reverse=True):
            if total <= self.max_buffered_bytes:
                return
            connection = self._streams[fd]
            log.warning("closing a unix:// connection holding %d bytes of an unfinished request: "
                        "%d bytes are held across connections (rpc_max_buffered_bytes %d)",
                        held[fd], total, self.max_buffered_bytes)
            connection.send([_error_header(None, MessageTooLarge(
                f"{total} bytes of unfinished requests across connections exceed the daemon's "
                f"budget of {self.max_buffered_bytes} bytes"))])
            connection.close()
            del self._streams[fd]
            total -= held[fd]
            self._poll_items_stale = True

    def _send_finished_replies(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                peer, reply = self._done.get_nowait()
            except queue.Empty:
                return
            self._reply(peer, reply)

    def _answer(self, peer: Any, header: list, bulk: list, sender_key: str | None = None) -> None:
        reply = self._dispatch(peer, header, bulk, sender_key)
        if reply is not None:
            self._reply(peer, reply)

    def _reply(self, peer: Any, reply: list) -> None:
        if isinstance(peer, bytes):
            _send(self._socket, [peer, *reply])
            return
        watched = peer.interest
        peer.send(reply)
        if not peer.open or peer.interest != watched:
            self._poll_items_stale = True

    def _dispatch(self, peer: Any, header: list, bulk: list[memoryview],
                  sender_key: str | None = None) -> list | None:
        """Parse and route one request (``header``: its first frame, or none at all). Returns
        reply frames now, or None if a pool thread will."""
        request_id = None
        try:
            if not header:
                raise MalformedMessage("empty message: expected a msgpack header frame")
            size = len(header[0])
            if bulk:
                size += sum(len(f) for f in bulk)
            if size > self.max_message_size:
                request_id = _peek_id(header[0])
                raise MessageTooLarge(
                    f"message of {size} bytes exceeds the limit of {self.max_message_size} bytes"
                )
            header = _parse_header(header[0])
            request_id = header["id"]
            if not self._accepting:
                raise ShuttingDown("daemon is shutting down")
            entry = self._handlers.get(header["op"])
            if entry is None:
                raise UnknownOperation(f"unknown operation {header['op']!r}")
            tenant = self._tenant_of(peer, header, sender_key) if self._tenant_ops else None
            timeout_ms = header.get("timeout_ms")
            timeout = timeout_ms / 1000.0 if isinstance(timeout_ms, (int, float)) else 3600.0
            request = Request(
                op=header["op"],
                args=header["args"],
                frames=bulk,
                deadline=time.monotonic() + timeout,
                peer=peer,
                tenant=tenant,
            )
        except MooncakeError as exc:
            return [_error_header(request_id, exc)]
        handler, blocking = entry
        if not blocking:
            return self._run(handler, request_id, request)
        with self._in_flight_lock:
            self._in_flight += 1
        self._pool.submit(self._run_in_pool, handler, request_id, request)
        return None

    def _tenant_of(self, peer: Any, header: dict, sender_key: str | None) -> str | None:
        """The tenant a request acts for (None: the cluster's credential); Unauthorized when a
        tenant's credential asks for an op outside ``tenant_ops``."""
        if isinstance(peer, stream.ServerConnection):
            tenant = peer.tenant
        else:
            tenant = curve.sender(self._secret, sender_key or "", header.get("tenant"))
        if tenant is not None and header["op"] not in self._tenant_ops:
            raise Unauthorized(f"{header['op']}: the credential of tenant {tenant!r} does not allow "
                               "this operation (it takes the cluster secret)")
        return tenant

    def _run_in_pool(self, handler: Handler, request_id: int, request: Request) -> None:
        try:
            if time.monotonic() > request.deadline:
                reply = [_error_header(request_id, RpcTimeout("deadline passed before the handler ran"))]
            else:
                reply = self._run(handler, request_id, request)
            self._done.put((request.peer, reply))
            os.write(self._wake_write, b"x")
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1

    def _run(self, handler: Handler, request_id: int, request: Request) -> list:
        try:
            outcome = handler(request)
        except MooncakeError as exc:
            return [_error_header(request_id, exc)]
        except Exception as exc:  # a bug in a handler must not take the daemon down
            self._failures.exception((request.op, type(exc)), "handler for %r failed", request.op)
            return [_error_header(request_id, HandlerFailed(f"{type(exc).__name__}: {exc}"))]
        self.num_served += 1
        if isinstance(outcome, Reply):
            return [_pack({"id": request_id, "ok": True, "result": outcome.result}), *outcome.frames]
        return [_pack({"id": request_id, "ok": True, "result": outcome})]


def _recv_message(sock: zmq.Socket, router: bool) -> list:
    """One multipart message: leading small frames as bytes, bulk frames without a copy.

    Copying the small routing and header frames is cheaper than wrapping them in zmq.Frame;
    everything after the header stays a zero-copy Frame. ``router``: the first frame is the
    peer's identity and the header follows it.
    """
    parts = [sock.recv(_NOBLOCK)]
    if router and sock.getsockopt(_RCVMORE):
        parts.append(sock.recv())
    while sock.getsockopt(_RCVMORE):
        parts.append(sock.recv(copy=False))
    return parts


def _recv_message_with_sender(sock: zmq.Socket) -> tuple[list, str]:
    """:func:`_recv_message` of a ROUTER, and the ZAP User-Id its header frame came with: the
    sender's CURVE public key (z85), which only a Frame, not a copy, still carries."""
    parts = [sock.recv(_NOBLOCK)]
    header = sock.recv(copy=False) if sock.getsockopt(_RCVMORE) else None
    sender_key = header.get("User-Id") if header is not None else ""
    if header is not None:
        parts.append(header.bytes)
    while sock.getsockopt(_RCVMORE):
        parts.append(sock.recv(copy=False))
    return parts, sender_key


def _send(sock: zmq.Socket, parts: list) -> None:
    """Send a reply ([peer, header, bulk...]). Without bulk, two plain sends: send_multipart's
    per-frame Python (and copy=False's Frame wrapping) costs more than copying a small header."""
    if len(parts) == 2:
        sock.send(parts[0], _SNDMORE)
        sock.send(parts[1])
    else:
        sock.send_multipart(parts, copy=False)


def _peek_id(header_bytes: bytes | None) -> Any:
    try:
        header = msgpack.unpackb(header_bytes, raw=False)
        return header.get("id") if isinstance(header, dict) else None
    except Exception:
        return None


def _parse_header(header_bytes: bytes) -> dict:
    try:
        header = msgpack.unpackb(header_bytes, raw=False, strict_map_key=False)
    except Exception as exc:
        raise MalformedMessage(f"header is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise MalformedMessage("header must be a msgpack map")
    if "id" not in header or "op" not in header:
        raise MalformedMessage("header lacks " + ", ".join(k for k in ("id", "op") if k not in header))
    if not isinstance(header["id"], int) or not isinstance(header["op"], str):
        raise MalformedMessage("header 'id' must be an integer and 'op' a string")
    header.setdefault("args", {})
    if not isinstance(header["args"], dict):
        raise MalformedMessage("header 'args' must be a map")
    return header


class PendingCall:
    """A request in flight; :meth:`wait` returns its Reply or raises its typed error."""

    def __init__(self, client: RpcClient, request_id: int, op: str, deadline: float) -> None:
        self.client, self.id, self.op, self.deadline = client, request_id, op, deadline

    def wait(self) -> Reply:
        return self.client._wait(self)


class _ZmqChannel:
    """A DEALER socket: what :class:`RpcClient` uses for tcp:// and ipc:// addresses."""

    def __init__(self, context: zmq.Context, address: str, secret: Credential | None) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if secret:
            curve.make_client(self.socket, secret)
        self.socket.connect(address)
        self._poll_items = [(self.socket, _POLLIN)]
        self.address = address

    def send(self, op: str, frames: list, deadline: float) -> None:
        """Queue the request; zmq.Again once the deadline passed with the queue still full.
        ZeroMQ refuses to queue while a connection it dropped (a failed handshake, a daemon
        restarting) is being made again, which a later moment may end."""
        while True:
            try:
                if len(frames) > 1:
                    self.socket.send_multipart(frames, flags=_NOBLOCK, copy=False)
                else:
                    self.socket.send(frames[0], _NOBLOCK)
                return
            except zmq.Again:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.socket.poll(max(1, int(remaining * 1000)), _POLLOUT):
                    raise

    def wait_readable(self, timeout_ms: int) -> bool:
        return bool(zmq.zmq_poll(self._poll_items, timeout_ms))

    def receive(self) -> list[list]:
        """Every message the socket holds; the caller's poll said there is at least one."""
        messages, readable = [], True
        while readable:
            frames = _recv_message(self.socket, False)
            messages.append([frames[0], *(f.buffer for f in frames[1:])])
            readable = bool(self.socket.getsockopt(_EVENTS) & _POLLIN)
        return messages

    def close(self) -> None:
        self.socket.close(linger=0)


class RpcClient:
    """A connection to one daemon. Thread-safe; many calls may be in flight at once.

    ``unix://PATH`` speaks the stream transport (:mod:`transfer.rpc.stream`), any other address
    ZeroMQ. On a stream whose peer dies, calls waiting on it end at once with ConnectionLost
    (an RpcError) and the next call connects again. ``busy_poll``: on a stream, how long a call
    polls for its reply without sleeping before it blocks, while a core is free for the daemon
    (:mod:`transfer.rpc.spin`). ``secret``: the cluster secret, which a daemon that has one
    requires (see :func:`transfer.auth.cluster_secret`)."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 5.0,
        max_message_size: int | None = None,
        busy_poll: float = 0.0,
        context: zmq.Context | None = None,
        secret: Credential | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.secret = secret
        # A tenant's credential names its tenant in every header: a ZeroMQ server derives from
        # it the key the request must come with (transfer.rpc.curve.sender).
        self._sender = {"tenant": secret.tenant} if secret is not None and secret.tenant is not None else {}
        self.max_message_size = max_message_size
        self._context = context or zmq.Context.instance()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: set[int] = set()
        self._arrived: dict[int, Reply | MooncakeError] = {}
        self._closed = False
        self._channel = self._connect()
        # Only a stream client spins: ZeroMQ's own I/O threads need the CPU to bring the reply.
        self._spin = busy_poll if isinstance(self._channel, stream.ClientChannel) else 0.0

    def _connect(self) -> _ZmqChannel | stream.ClientChannel:
        if stream.is_stream_address(self.address):
            # Replies are not limited by our request limit: a daemon may answer with more.
            return stream.ClientChannel(self.address, 0xFFFFFFFF, self.secret)
        return _ZmqChannel(self._context, self.address, self.secret)

    def close(self) -> None:
        """Close the connection. Calls still waiting on it, in other threads, end with RpcError:
        an owner may drop a client (a worker it declared dead) while requests wait on it."""
        # Set before taking the lock: a waiter polls with the lock held and takes it straight
        # back after each slice, so the closer may not get it until the reply has come. The
        # flag alone ends every waiter at its next slice, which then lets the lock go for good.
        self._closed = True
        with self._lock:
            self._channel.close()

    def _check_open(self, op: str) -> None:
        if self._closed:
            raise RpcError(f"{op}: the client to {self.address} was closed")

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def call(self, op: str, args: dict | None = None, frames: Sequence[Buffer] = (),
             timeout: float | None = None) -> Any:
        return self.submit(op, args, frames, timeout).wait().result

    def call_frames(self, op: str, args: dict | None = None, frames: Sequence[Buffer] = (),
                    timeout: float | None = None) -> Reply:
        return self.submit(op, args, frames, timeout).wait()

    def submit(self, op: str, args: dict | None = None, frames: Sequence[Buffer] = (),
               timeout: float | None = None) -> PendingCall:
        timeout = self.timeout if timeout is None else timeout
        request_id = next(self._ids)
        header = _pack({"id": request_id, "op": op, "args": args or {},
                        "timeout_ms": int(timeout * 1000), **self._sender})
        if self.max_message_size is not None:
            size = len(header) + sum(memoryview(f).nbytes for f in frames)
            if size > self.max_message_size:
                raise MessageTooLarge(
                    f"{op}: message of {size} bytes exceeds the limit of {self.max_message_size} bytes")
        deadline = time.monotonic() + timeout
        with self._lock:
            self._check_open(op)
            try:
                self._channel.send(op, [header, *frames], deadline)
            except zmq.Again:
                raise RpcTimeout(f"{op}: could not send to {self.address} within the deadline"
                                 + self._timeout_hint()) from None
            except stream.ConnectionLost as exc:
                # The peer closed the stream while it sat idle (the daemon restarted): what was
                # in flight on it is lost, and this request never went out whole, so one try on
                # a fresh connection cannot run it twice.
                self._lose_waiting(exc)
                self._channel.send(op, [header, *frames], deadline)
            self._waiting.add(request_id)
        return PendingCall(self, request_id, op, deadline)

    def _wait(self, call: PendingCall) -> Reply:
        # Poll without sleeping for busy_poll first: a control-plane reply usually comes within
        # it, and waking from sleep on an idle host costs more than the reply takes. Not while
        # every core is taken: the spin would hold the core the daemon needs to answer.
        spin_until = time.perf_counter() + self._spin if self._spin and spin.HEADROOM.free() else 0.0
        while True:
            with self._lock:
                outcome = self._take(call.id)
                if outcome is None:
                    self._check_open(call.op)
                    remaining = call.deadline - time.monotonic()
                    if remaining <= 0:
                        self._give_up(call.id)
                        raise RpcTimeout(f"{call.op}: no reply from {self.address} within the deadline"
                                         + self._timeout_hint())
                    # Poll in short slices so other threads sharing this client get the socket
                    # too; what a poll brings in is looked at before the lock is let go.
                    slice_ms = 0 if time.perf_counter() < spin_until else max(1, int(min(remaining, 0.02) * 1000))
                    if self._channel.wait_readable(slice_ms):
                        self._receive_ready()
                        outcome = self._take(call.id)
            if outcome is not None:
                break
        if self._spin:  # the daemon polls for our next request (see spin.CoreHeadroom.peer_polls)
            spin.HEADROOM.peer_polls(self._spin)
        if isinstance(outcome, MooncakeError):
            raise outcome
        return outcome

    def _timeout_hint(self) -> str:
        """ZeroMQ drops a connection whose CURVE handshake failed without a word, so a wrong
        secret looks like a dead daemon: say which it may be."""
        if isinstance(self._channel, stream.ClientChannel):
            return ""
        if self.secret and self.secret.tenant is not None:
            return " (a tenant credential reaches the master alone: is this the master, and the credential right?)"
        if self.secret:
            return " (is the cluster secret right?)"
        return " (is it down, or does it require a cluster secret this client lacks?)"

    def _take(self, request_id: int) -> Reply | MooncakeError | None:
        """The call's outcome if it has arrived, else None. Called under the lock."""
        outcome = self._arrived.pop(request_id, None)
        if outcome is not None:
            self._waiting.discard(request_id)
        return outcome

    def _receive_ready(self) -> None:
        try:
            messages = self._channel.receive()
        except stream.ConnectionLost as exc:
            self._lose_waiting(exc)
            return
        for frames in messages:
            try:
                header = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
                request_id = header["id"]
            except Exception:
                log.warning("dropping unreadable reply from %s", self.address)
                continue
            if request_id not in self._waiting:
                continue  # a late reply to a call that already timed out
            if header.get("ok"):
                self._arrived[request_id] = Reply(header.get("result"), frames[1:])
            else:
                self._arrived[request_id] = error_from_wire(header.get("error"))

    def _lose_waiting(self, error: MooncakeError) -> None:
        """End every call in flight on a stream that broke: its reply will never come."""
        for request_id in self._waiting:
            self._arrived.setdefault(request_id, error)

    def _give_up(self, request_id: int) -> None:
        self._waiting.discard(request_id)
        if not self._waiting and not self._closed:
            # Nothing else is in flight: start afresh so requests queued for a dead peer are not
            # delivered later, when it comes back, as stale work.
            self._channel.close()
            self._channel = self._connect()
            self._arrived.clear()
