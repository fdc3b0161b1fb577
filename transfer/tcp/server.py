"""The target side of the TCP transport: listeners on each NIC and one thread per connection.

Each connection thread reads a request group's headers, then moves the payloads straight
between the socket and registered memory: scatter ``recvmsg_into`` over views of the buffers
for the group's WRITEs, one gather ``sendmsg`` of views for its READs (see tcp_wire). WRITE
acks go out at the end of the group and every ``ACK_INTERVAL`` while it lasts, so a burst of
small slices costs one ack syscall, not one each, and a long one on a slow path still shows
progress.

A connection whose initiator proved a tenant's credential (not the cluster secret) is served
only inside the ranges of the master's grants it sent with its groups (:mod:`transfer.grants`);
any other request of it is answered UNAUTHORIZED and moves nothing. A target holding the cluster
secret checks those; one holding a tenant's credential admits no tenant connection at all.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from transfer.auth import MAX_TENANT_NAME, TCP_DATA_PURPOSE, ClusterSecret, Credential, new_nonce
from transfer.batch import OpCode
from transfer.descriptor import Endpoint
from transfer.errors import AddressNotRegistered, Unauthorized
from transfer.grants import TOKEN_BYTES, GrantedRanges
from transfer.memory import MemoryRegistry
from transfer.rpc.log_throttle import LogThrottle
from transfer.tcp.wire import (ACK_INTERVAL, ACKS, FRAME, GROUP, IOV_MAX, MAX_GROUP, READ_DATA,
                               REQUEST, RESPONSE, PeerClosed, Receiver, advance, recv_message,
                               send_all, send_message, tune)

log = logging.getLogger(__name__)
_DRAIN_CHUNK = 1 << 20


class TcpTarget:
    def __init__(self, registry: MemoryRegistry, identity: Callable[[], tuple[str, str]],
                 listen: list[tuple[str, str]], secret: Credential | None = None,
                 busy_poll: float = 0.0) -> None:
        """``identity`` returns (segment name, incarnation); ``listen`` is (nic, host) pairs;
        ``secret``: when given, only initiators proving they hold it are served; ``busy_poll``:
        how long an inline link's connection (see tcp_wire.hello) that answered a group polls
        for the next before its thread sleeps (see tcp_wire.Receiver): a caller moving small
        objects one by one sends the next within microseconds. A batch connection's next group
        is mostly in the socket already, and while it is not, the initiator's threads need the
        cores."""
        self._registry = registry
        self._identity = identity
        self._secret = secret
        self._busy_poll = busy_poll
        self._refusals = LogThrottle(log)
        self.num_refused = 0
        self._selector = selectors.DefaultSelector()
        self._listeners: list[socket.socket] = []
        self.endpoints: list[Endpoint] = []
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        try:
            for nic, host in listen:
                listener = socket.create_server((host, 0), backlog=128)
                self._listeners.append(listener)
                self._selector.register(listener, selectors.EVENT_READ)
                self.endpoints.append(Endpoint(nic, host, listener.getsockname()[1]))
        except OSError:
            self.close()
            raise
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-target", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = list(self._connections)
        if hasattr(self, "_wake_w"):
            self._wake_w.send(b"x")
            self._thread.join(timeout=2)
            self._wake_r.close()
            self._wake_w.close()
        for sock in self._listeners:
            sock.close()
        self._selector.close()
        for conn in connections:
            _shutdown(conn)  # wakes the connection thread, which closes its socket

    def _accept_loop(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.fileobj is self._wake_r:
                    return
                try:
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                except OSError:
                    continue
                with self._lock:
                    if self._closed:
                        conn.close()
                        return
                    self._connections.add(conn)
                threading.Thread(target=self._serve, args=(conn,), name="tcp-target-conn",
                                 daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            tune(conn)
            conn.settimeout(5.0)  # a client that connects and says nothing must not pin a thread
            nonce = new_nonce()
            send_message(conn, {"nonce": nonce, "auth": self._secret is not None})
            hello = recv_message(conn)
            name, incarnation = self._identity()
            tenant = hello.get("tenant")
            granted = None  # the cluster secret's connections move any registered range
            if self._secret and tenant is not None:
                reason = self._tenant_refusal(tenant, nonce, hello.get("proof"))
                if reason:
                    self._refuse(conn, reason)
                    return
                granted = GrantedRanges(self._secret, name)  # type: ignore[arg-type]
            elif self._secret and not self._secret.verify(TCP_DATA_PURPOSE, nonce, hello.get("proof")):
                self._refuse(conn, "no proof of the cluster secret" if hello.get("proof") is None
                             else "a wrong proof of the cluster secret")
                return
            if hello.get("segment") != name or hello.get("incarnation") != incarnation:
                send_message(conn, {"ok": False, "error": f"stale: {name} is now incarnation {incarnation}"})
                return
            send_message(conn, {"ok": True})
            conn.settimeout(None)
            self._serve_requests(conn, granted, self._busy_poll if hello.get("inline") is True else 0.0)
        except (OSError, ConnectionError, ValueError) as exc:
            log.debug("tcp target connection ended: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _tenant_refusal(self, tenant: object, nonce: bytes, proof: object) -> str:
        """Why a hello naming ``tenant`` is refused, or "" when its proof holds."""
        if not isinstance(self._secret, ClusterSecret):
            return "a tenant's credential, which only a target holding the cluster secret admits"
        if not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_NAME:
            return "no valid tenant name"
        if not self._secret.tenant_credential(tenant).verify(TCP_DATA_PURPOSE, nonce, proof):
            return f"a wrong proof of the credential of tenant {tenant!r}"
        return ""

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        self.num_refused += 1
        peer = _peer_host(conn)
        self._refusals.warning((peer, reason), "refused a TCP data connection from %s: %s", peer, reason)
        send_message(conn, {"ok": False, "error": f"refused: {reason}"})

    def _serve_requests(self, conn: socket.socket, granted: GrantedRanges | None, busy_poll: float) -> None:
        """``granted``: for a tenant's connection, the ranges its grants let it move."""
        receiver = Receiver(conn, busy_poll=busy_poll)
        scratch: memoryview | None = None  # where refused WRITE payloads are drained
        while True:
            count, grant_bytes = GROUP.unpack(receiver.exact(GROUP.size))
            if not 0 < count <= MAX_GROUP:
                raise ConnectionError(f"request group of {count} requests")
            if grant_bytes > MAX_GROUP * TOKEN_BYTES:
                raise ConnectionError(f"request group with {grant_bytes} bytes of grants")
            requests = list(REQUEST.iter_unpack(receiver.exact(count * REQUEST.size)))
            if grant_bytes:
                tokens = memoryview(bytearray(grant_bytes))
                receiver.fill([tokens])
                if granted is not None:
                    granted.add(bytes(tokens), time.time())
            views: list[memoryview] = []  # WRITE payload destinations, in stream order
            writes: list[tuple[bytes, int]] = []  # (ack, end index in views)
            reads: list[bytes] = []
            read_payloads: list[memoryview] = []
            last = [None]
            now = time.time() if granted is not None else 0.0
            for op, slice_id, address, length in requests:
                if granted is not None and not granted.covers(op, address, length, now):
                    target, status = None, Unauthorized.code
                else:
                    target, status = self._resolve(address, length, last)
                if op == OpCode.WRITE:
                    if target is not None:
                        views.append(target)
                    else:  # keep the stream in step; nothing is written
                        if scratch is None:
                            scratch = memoryview(bytearray(_DRAIN_CHUNK))
                        views.extend(scratch[:min(_DRAIN_CHUNK, length - offset)]
                                     for offset in range(0, length, _DRAIN_CHUNK))
                    writes.append((RESPONSE.pack(status, slice_id, length), len(views)))
                else:
                    reads.append(RESPONSE.pack(status, slice_id, length if target is not None else 0))
                    if target is not None:
                        read_payloads.append(target)
            if writes:
                _receive_writes(receiver, views, writes)
            if reads:
                send_all(conn, [FRAME.pack(READ_DATA, len(reads)) + b"".join(reads), *read_payloads])

    def _resolve(self, address: int, length: int, last: list) -> tuple[memoryview | None, int]:
        """The view of [address, +length) in registered memory, or (None, error code).
        ``last`` holds the buffer found for the previous request of the group: a group's
        slices mostly fall in one buffer, so the registry's lock and search are skipped."""
        buffer = last[0]
        if buffer is None or not buffer.address <= address <= address + length <= buffer.end:
            try:
                buffer = self._registry.find(address, length)
            except AddressNotRegistered as exc:
                return None, exc.code
            last[0] = buffer
        if not buffer.remote_accessible:
            return None, AddressNotRegistered.code
        start = address - buffer.address
        return buffer.view[start:start + length], 0


def _receive_writes(receiver: Receiver, views: list[memoryview],
                    writes: list[tuple[bytes, int]]) -> None:
    """Scatter-receive a group's WRITE payloads (what the receiver already holds, then straight
    from the socket); ack each WRITE once all its bytes are in memory, in ACKS frames sent
    every ACK_INTERVAL and at the end of the group."""
    conn = receiver.sock
    acks: list[bytes] = []
    done = 0
    flush_at = time.monotonic() + ACK_INTERVAL
    first = receiver.drain_into(views, advance(views, 0, 0))
    while True:
        while done < len(writes) and writes[done][1] <= first:
            acks.append(writes[done][0])
            done += 1
        if done == len(writes):
            break
        if acks and time.monotonic() >= flush_at:
            _send_acks(conn, acks)
            acks = []
            flush_at = time.monotonic() + ACK_INTERVAL
        got = conn.recvmsg_into(views[first:first + IOV_MAX])[0]
        if not got:
            raise PeerClosed("peer closed the connection")
        first = advance(views, first, got)
    _send_acks(conn, acks)


def _send_acks(conn: socket.socket, acks: list[bytes]) -> None:
    if acks:
        send_all(conn, [FRAME.pack(ACKS, len(acks)) + b"".join(acks)])


def _peer_host(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return "a peer that left"


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
