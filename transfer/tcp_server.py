"""The target side of the TCP transport: listeners on each NIC and one thread per connection.

Each connection thread reads a request header, then moves the payload straight between the
socket and registered memory (recv_into a view of the buffer for WRITE, sendmsg of the view for
READ). WRITE acks are held while more requests are already waiting in the socket and sent
together when it drains, so a burst of small slices costs one ack syscall, not one each; they
are flushed at least every ``_ACK_EVERY`` bytes so a long stream still shows progress.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from typing import Callable

from transfer.batch import OpCode
from transfer.descriptor import Endpoint
from transfer.errors import AddressNotRegistered
from transfer.memory import MemoryRegistry
from transfer.tcp_wire import (REQUEST, RESPONSE, PeerClosed, recv_exact, recv_message,
                               send_all, send_message, tune)

log = logging.getLogger(__name__)
_DRAIN_CHUNK = 1 << 20
_ACK_EVERY = 1 << 20


class TcpTarget:
    def __init__(self, registry: MemoryRegistry, identity: Callable[[], tuple[str, str]],
                 listen: list[tuple[str, str]]) -> None:
        """``identity`` returns (segment name, incarnation); ``listen`` is (nic, host) pairs."""
        self._registry = registry
        self._identity = identity
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
            hello = recv_message(conn)
            name, incarnation = self._identity()
            if hello.get("segment") != name or hello.get("incarnation") != incarnation:
                send_message(conn, {"ok": False, "error": f"stale: {name} is now incarnation {incarnation}"})
                return
            send_message(conn, {"ok": True})
            conn.settimeout(None)
            self._serve_requests(conn)
        except (OSError, ConnectionError, ValueError) as exc:
            log.debug("tcp target connection ended: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _serve_requests(self, conn: socket.socket) -> None:
        header = bytearray(REQUEST.size)
        view = memoryview(header)
        acks: list[bytes] = []
        held = 0  # bytes written whose acks are held
        while True:
            if held >= _ACK_EVERY:
                send_all(conn, acks)
                acks.clear()
                held = 0
            self._read_header(conn, view, acks)
            if not acks:
                held = 0
            op, slice_id, address, length = REQUEST.unpack(header)
            target, status = self._resolve(address, length)
            if op == OpCode.WRITE:
                if target is None:
                    _drain(conn, length)  # keep the stream in step; nothing is written
                else:
                    recv_exact(conn, target)
                acks.append(RESPONSE.pack(status, slice_id, length))
                held += length
                continue
            acks.append(RESPONSE.pack(status, slice_id, length if target is not None else 0))
            send_all(conn, acks if target is None else [*acks, target])
            acks.clear()

    @staticmethod
    def _read_header(conn: socket.socket, view: memoryview, acks: list[bytes]) -> None:
        """Read the next header; flush held acks first if it has not arrived yet."""
        if acks:
            try:
                got = conn.recv_into(view, len(view), socket.MSG_DONTWAIT)
            except BlockingIOError:
                got = -1
            if got == 0:
                raise PeerClosed("peer closed the connection")
            if got > 0:
                recv_exact(conn, view[got:])
                return
            send_all(conn, acks)
            acks.clear()
        recv_exact(conn, view)

    def _resolve(self, address: int, length: int) -> tuple[memoryview | None, int]:
        try:
            buffer = self._registry.find(address, length)
        except AddressNotRegistered as exc:
            return None, exc.code
        if not buffer.remote_accessible:
            return None, AddressNotRegistered.code
        start = address - buffer.address
        return buffer.view[start:start + length], 0


def _drain(conn: socket.socket, length: int) -> None:
    scratch = memoryview(bytearray(min(length, _DRAIN_CHUNK) or 1))
    while length:
        n = min(length, len(scratch))
        recv_exact(conn, scratch[:n])
        length -= n


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
