"""The TCP data-plane framing, shared by the initiator and the target side.

After connecting, the initiator sends a hello (4-byte length + msgpack ``{"segment",
"incarnation"}``) and the target answers ``{"ok", "error"}``: a connection to a restarted peer
is refused as stale instead of writing at addresses that now mean something else. Then:

    request  = REQUEST header (op, slice id, remote address, length) [+ length bytes if WRITE]
    response = RESPONSE header (status, slice id, length)            [+ length bytes if READ ok]

Responses come back in request order on one connection. Status 0 is success, otherwise a
negative error code; a WRITE is answered only after its bytes are in the target's memory.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack

REQUEST = struct.Struct("<B7xQQQ")
RESPONSE = struct.Struct("<q QQ")
_LENGTH = struct.Struct("<I")
MAX_HELLO = 64 * 1024


class PeerClosed(ConnectionError):
    pass


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the socket, straight into its memory."""
    got, total = 0, len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise PeerClosed("peer closed the connection")
        got += n


def send_all(sock: socket.socket, parts: list[Any]) -> None:
    """Gather-send ``parts`` (bytes / memoryviews) without joining them into one buffer."""
    views = [memoryview(p).cast("B") for p in parts]
    first = 0
    while first < len(views):
        sent = sock.sendmsg(views[first:first + 1024])  # at most IOV_MAX pieces per call
        while sent:
            if sent >= len(views[first]):
                sent -= len(views[first])
                first += 1
            else:
                views[first] = views[first][sent:]
                sent = 0
        while first < len(views) and not len(views[first]):
            first += 1


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
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
