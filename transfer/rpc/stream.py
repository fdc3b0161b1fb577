"""The control-plane RPC over a Unix stream socket, for clients on the daemon's own host.

ZeroMQ hands every message to an I/O thread on each side: four thread switches per round trip,
which on a 2-core host is most of a 4 KiB store get (a bare ZeroMQ echo measured 97-144 µs here,
a bare Unix-socket echo 39 µs). A ``unix://PATH`` endpoint carries the same messages, a msgpack
header frame and bulk frames, read and written by the caller's own thread, framed as

    u32 body length | u16 frame count | u32 length of each frame | the frames      (little-endian)

A body over the size limit is skipped unread and answered with an error. A peer whose frame
table is malformed gets an error reply and its connection is closed: its lengths cannot be
trusted to find the next message.

Each connection opens with a challenge, once, off the per-request path: the server's first
message is msgpack ``{"auth": "hmac-sha256", "nonce": 16 random bytes}`` (``{"auth": nil}`` when
it has no cluster secret), and a client answers with ``{"proof": HMAC-SHA256(secret,
"mooncake-rpc" + nonce)}`` as its first message. A wrong or
missing proof gets an AUTHENTICATION_FAILED error (id nil) and the connection is closed; a right
one ``{"auth": "ok"}``, which the client awaits before its first request. The
socket file is 0600 in the 0700 run directory besides, so other users cannot even connect.

A tenant client (:class:`transfer.auth.TenantCredential`) answers ``{"proof": HMAC-SHA256(tenant
key, "mooncake-rpc" + nonce), "tenant": name}``; a server that admits tenants derives that
tenant's key from the cluster secret, checks the proof, and binds the connection to the tenant
(:attr:`ServerConnection.tenant`): every request on it acts for that tenant only. A server that
does not admit tenants refuses such an answer.
"""

from __future__ import annotations

import os
import select
import socket
import stat
import struct
import time
from typing import Any
from collections.abc import Sequence

import msgpack

from transfer.auth import MAX_TENANT_NAME, RPC_PURPOSE, ClusterSecret, Credential, new_nonce
from transfer.errors import AuthenticationFailed, MalformedMessage, RpcError, RpcTimeout, error_from_wire

SCHEME = "unix://"

_LENGTH = struct.Struct("<I")
_COUNT = struct.Struct("<H")
# Below this a message is joined into one buffer; above it, sent as a scatter list so bulk
# frames are not copied. It also stays under malloc's mmap threshold for the receive buffer.
CHUNK = 1 << 16
MAX_FRAMES = 0xFFFF

Buffer = Any


def is_stream_address(address: str) -> bool:
    return address.startswith(SCHEME)


def socket_path(address: str) -> str:
    return address[len(SCHEME):]


class ConnectionLost(RpcError):
    """The peer closed the stream or it broke; calls waiting on it end with this."""


_ONE_FRAME = struct.Struct("<IHI")


def encode(frames: Sequence[Buffer]) -> list[Buffer]:
    """The wire form of one message, as buffers for ``sendmsg``."""
    if len(frames) == 1 and type(frames[0]) is bytes and len(frames[0]) <= CHUNK:
        # Nearly every control message: one msgpack header and no bulk.
        size = len(frames[0])
        return [_ONE_FRAME.pack(6 + size, 1, size) + frames[0]]
    if len(frames) > MAX_FRAMES:
        raise MalformedMessage(f"a message carries at most {MAX_FRAMES} frames")
    views = [f if isinstance(f, bytes) else memoryview(f).cast("B") for f in frames]
    lengths = [len(v) if isinstance(v, bytes) else v.nbytes for v in views]
    table = struct.pack(f"<IH{len(lengths)}I", 2 + 4 * len(lengths) + sum(lengths), len(lengths), *lengths)
    if sum(lengths) <= CHUNK:
        return [b"".join([table, *views])]
    return [table, *views]


def _split(body: memoryview) -> list[memoryview]:
    if len(body) < _COUNT.size:
        raise MalformedMessage("message body lacks its frame count")
    (count,) = _COUNT.unpack_from(body)
    if count == 1 and len(body) >= 6:
        (length,) = _LENGTH.unpack_from(body, _COUNT.size)
        if 6 + length != len(body):
            raise MalformedMessage("message frame lengths do not add up to its body length")
        return [body[6:]]
    offset = _COUNT.size + 4 * count
    if offset > len(body):
        raise MalformedMessage(f"message claims {count} frames but is too short for their lengths")
    lengths = struct.unpack_from(f"<{count}I", body, _COUNT.size)
    if offset + sum(lengths) != len(body):
        raise MalformedMessage("message frame lengths do not add up to its body length")
    frames = []
    for length in lengths:
        frames.append(body[offset:offset + length])
        offset += length
    return frames


class Oversized:
    """In place of a message whose body exceeds the limit: its size, and its header frame when
    that arrived with the length (so the error reply can carry the request id)."""

    def __init__(self, size: int, header: bytes | None) -> None:
        self.size, self.header = size, header


def _header_of(body_start: memoryview) -> bytes | None:
    try:
        (count,) = _COUNT.unpack_from(body_start)
        (length,) = _LENGTH.unpack_from(body_start, _COUNT.size) if count else (None,)
    except struct.error:
        return None
    start = _COUNT.size + 4 * count
    if length is None or len(body_start) < start + length:
        return None
    return bytes(body_start[start:start + length])


class MessageReader:
    """Cuts a byte stream into messages; a message's frames stay valid after later reads.

    A body over ``max_body`` is not buffered: its bytes are skipped as they arrive and it
    comes out as an :class:`Oversized`, so the peer gets an error and the stream stays usable."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self._pending = bytearray()
        self._skip = 0  # bytes of an oversized body still to discard

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished message held until the rest arrives."""
        return len(self._pending)

    def feed(self, data: bytes) -> list[list[memoryview] | Oversized]:
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = data[skipped:]
        if self._pending:
            self._pending += data
            if not self._holds_whole_message(self._pending):
                return []  # keep appending: converting on every chunk would copy a big body n times
            data, self._pending = bytes(self._pending), bytearray()
        view = memoryview(data)
        messages: list[list[memoryview] | Oversized] = []
        offset = 0
        while len(data) - offset >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(data, offset)
            body = offset + _LENGTH.size
            if length > self.max_body:
                messages.append(Oversized(length, _header_of(view[body:body + length])))
                offset = min(len(data), body + length)
                self._skip = body + length - offset
                continue
            if body + length > len(data):
                break
            messages.append(_split(view[body:body + length]))
            offset = body + length
        if offset < len(data):
            self._pending += view[offset:]
        return messages

    def _holds_whole_message(self, pending: bytearray) -> bool:
        if len(pending) < _LENGTH.size:
            return False
        (length,) = _LENGTH.unpack_from(pending)
        # An oversized body is let through at once, to be cut short by feed().
        return length > self.max_body or len(pending) >= _LENGTH.size + length


def _send_some(sock: socket.socket, buffers: list[Buffer]) -> list[Buffer]:
    """Send what the socket takes now; returns what is left (empty when all went)."""
    try:
        if len(buffers) == 1 and type(buffers[0]) is bytes:
            sent = sock.send(buffers[0])
            return [] if sent == len(buffers[0]) else [memoryview(buffers[0])[sent:]]
        sent = sock.sendmsg(buffers)
    except BlockingIOError:
        return buffers
    left = []
    for buffer in buffers:
        size = len(buffer) if isinstance(buffer, bytes) else memoryview(buffer).nbytes
        if sent >= size:
            sent -= size
            continue
        left.append(memoryview(buffer).cast("B")[sent:] if sent else buffer)
        sent = 0
    return left


def body_limit(max_message_size: int) -> int:
    """Most bytes a peer may send as one message (or, on ZeroMQ, one frame) before it is refused
    unread: the limit itself, plus the frame table (room for a few hundred frames' lengths)."""
    return max_message_size + 4096


class StreamListener:
    """A listening Unix socket owned by an RPC server; removes its file when closed."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.path = socket_path(address)
        _clear_stale_socket(self.path)
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.socket.bind(self.path)
            # Only our own user may connect (connecting needs write permission on the file).
            os.chmod(self.path, 0o600)
            self.socket.listen(128)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.fd = self.socket.fileno()

    def accept(self) -> list[socket.socket]:
        accepted = []
        while True:
            try:
                conn, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return accepted
            except OSError:
                return accepted  # e.g. out of file descriptors: the next poll retries
            conn.setblocking(False)
            accepted.append(conn)

    def close(self) -> None:
        self.socket.close()
        try:
            if stat.S_ISSOCK(os.stat(self.path).st_mode):
                os.unlink(self.path)
        except FileNotFoundError:
            pass


def _clear_stale_socket(path: str) -> None:
    """Remove a socket file a killed predecessor left; refuse one that someone still serves."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise OSError(f"{path} exists and is not a socket")
    except FileNotFoundError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody accepts on it: left behind
        return
    finally:
        probe.close()
    raise OSError(f"another process already serves {path}")


# Replies a server holds for a peer that does not read them; beyond this it stops reading that
# peer's requests until they drain, so one stuck client cannot grow the daemon without bound.
BACKLOG_LIMIT = 8 << 20


class ServerConnection:
    """One accepted client on a server's I/O thread: its reader and the replies not yet sent."""

    def __init__(self, sock: socket.socket, max_message_size: int, secret: Credential | None = None,
                 admits_tenants: bool = False) -> None:
        self.socket = sock
        self.fd = sock.fileno()
        self.reader = MessageReader(body_limit(max_message_size))
        self.unsent: list[Buffer] = []
        self.open = True
        self._secret = secret
        self._admits_tenants = admits_tenants and isinstance(secret, ClusterSecret)
        self._nonce = new_nonce() if secret else b""
        self.authenticated = secret is None
        self.tenant: str | None = None  # the tenant whose credential it proved; None: the cluster's
        self.send([msgpack.packb({"auth": "hmac-sha256" if secret else None, "nonce": self._nonce})])

    def admit(self, message: list[memoryview] | Oversized) -> str | None:
        """Check the client's first message, its proof; why it fails, or None when it holds."""
        try:
            answer = msgpack.unpackb(message[0], raw=False) if isinstance(message, list) and len(message) == 1 else None
        except Exception:
            answer = None
        if not isinstance(answer, dict) or "proof" not in answer:
            return "the client sent no proof of the cluster secret (it has none)"
        tenant = answer.get("tenant")
        if tenant is not None:
            if not self._admits_tenants:
                return "the client presents a tenant credential, which this daemon does not admit"
            if not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_NAME:
                return "the client names no valid tenant"
            if not self._secret.tenant_credential(tenant).verify(RPC_PURPOSE, self._nonce, answer["proof"]):
                return f"the client's proof does not match the credential of tenant {tenant!r} (a wrong secret)"
            self.tenant = tenant
        elif not self._secret.verify(RPC_PURPOSE, self._nonce, answer["proof"]):
            return "the client's proof does not match the cluster secret (a wrong secret)"
        self.authenticated = True
        self.send([msgpack.packb({"auth": "ok"})])
        return None

    @property
    def interest(self) -> tuple[bool, bool]:
        """(read, write): its requests unless its replies are backlogged, and room to send
        while any reply waits."""
        if not self.unsent:
            return True, False
        return sum(len(b) for b in self.unsent) <= BACKLOG_LIMIT, True

    def receive(self) -> list[list[memoryview] | Oversized]:
        """The whole messages that arrived; ConnectionLost when the peer is gone. A malformed
        one raises MalformedMessage, after which the caller closes the connection."""
        try:
            data = self.socket.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as exc:
            raise ConnectionLost(str(exc)) from None
        if not data:
            raise ConnectionLost("peer closed the connection")
        return self.reader.feed(data)

    def send(self, frames: Sequence[Buffer]) -> None:
        if not self.open:
            return  # the requester left; its reply has nobody to go to
        buffers = encode(frames)
        if self.unsent:
            self.unsent.extend(bytes(memoryview(b).cast("B")) for b in buffers)
            return
        try:
            left = _send_some(self.socket, buffers)
        except OSError:
            self.close()
            return
        # What stays queued is copied: a handler's bulk frames may be reused once it returns.
        self.unsent = [bytes(memoryview(b).cast("B")) for b in left]

    def flush(self) -> None:
        try:
            self.unsent = _send_some(self.socket, self.unsent)
        except OSError:
            self.close()

    def close(self) -> None:
        if self.open:
            self.open = False
            self.unsent = []
            self.socket.close()


class ClientChannel:
    """The client end: connects on first use, and again after the connection was lost."""

    def __init__(self, address: str, max_message_size: int, secret: Credential | None = None) -> None:
        self.address = address
        self.path = socket_path(address)
        self.max_message_size = max_message_size
        self.secret = secret
        self._socket: socket.socket | None = None
        self._reader: MessageReader | None = None
        self._poller = select.poll()

    def _connected(self, op: str, deadline: float) -> socket.socket:
        if self._socket is None:
            sock = self._connect(op, deadline)
            reader = MessageReader(body_limit(self.max_message_size))
            try:
                self._answer_challenge(sock, reader, op, deadline)
            except BaseException:
                sock.close()
                raise
            sock.setblocking(False)
            self._socket, self._reader = sock, reader
            self._poller = select.poll()
            self._poller.register(sock.fileno(), select.POLLIN)
        return self._socket

    def _connect(self, op: str, deadline: float) -> socket.socket:
        """Connect, retrying until the deadline while nobody listens: a daemon that restarts
        is back within it, as a ZeroMQ peer would be (which queues the request meanwhile)."""
        pause = 0.005
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RpcTimeout(f"{op}: cannot reach {self.address} within the deadline: "
                                     f"{exc.strerror}") from None
                time.sleep(min(pause, remaining))
                pause = min(pause * 2, 0.1)
            except OSError as exc:
                sock.close()
                raise RpcError(f"{op}: cannot reach {self.address}: {exc.strerror or exc}") from None

    def _answer_challenge(self, sock: socket.socket, reader: MessageReader, op: str, deadline: float) -> None:
        """Read the server's challenge, send our proof and wait for the verdict: a refusal then
        reaches us as the server's error, not as a broken pipe under our first request."""
        challenge = self._read_greeting(sock, reader, op, deadline)
        if not challenge.get("auth"):
            return
        if self.secret is None:
            raise AuthenticationFailed(
                f"{op}: {self.address} requires the cluster secret and this client has none "
                "(set MOONCAKE_CLUSTER_SECRET or cluster_secret_file)")
        nonce = challenge.get("nonce")
        if not isinstance(nonce, bytes):
            raise MalformedMessage(f"{op}: {self.address} sent a challenge without a nonce")
        try:
            tenant = {"tenant": self.secret.tenant} if self.secret.tenant is not None else {}
            sock.sendall(encode([msgpack.packb({"proof": self.secret.proof(RPC_PURPOSE, nonce), **tenant})])[0])
        except OSError as exc:
            raise ConnectionLost(f"{op}: connection to {self.address} lost: {exc.strerror or exc}") from None
        verdict = self._read_greeting(sock, reader, op, deadline)
        if verdict.get("auth") == "ok":
            return
        if verdict.get("ok") is False:
            raise error_from_wire(verdict.get("error"))
        raise MalformedMessage(f"{op}: {self.address} answered our proof with neither yes nor no")

    def _read_greeting(self, sock: socket.socket, reader: MessageReader, op: str, deadline: float) -> dict:
        """One handshake message (a msgpack map), read within the deadline."""
        messages: list = []
        try:
            while not messages:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data = sock.recv(CHUNK)
                if not data:
                    raise ConnectionLost(f"{op}: {self.address} closed the connection during the handshake")
                messages = reader.feed(data)
            message = msgpack.unpackb(messages[0][0], raw=False) if isinstance(messages[0], list) else None
        except TimeoutError:
            raise RpcTimeout(f"{op}: {self.address} did not complete the handshake within the deadline") from None
        except OSError as exc:
            raise ConnectionLost(f"{op}: connection to {self.address} lost: {exc.strerror or exc}") from None
        except (ValueError, msgpack.UnpackException):
            message = None
        if not isinstance(message, dict) or len(messages) != 1:
            raise MalformedMessage(f"{op}: {self.address} broke the handshake")
        return message

    def send(self, op: str, frames: Sequence[Buffer], deadline: float) -> None:
        sock = self._connected(op, deadline)
        left = encode(frames)
        try:
            left = _send_some(sock, left)
            while left:
                # A big request the kernel cannot take at once; the server keeps reading.
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.reset()  # half a message went out: this stream is unusable
                    raise RpcTimeout(f"{op}: {self.address} did not take the request within the deadline")
                select.select([], [sock], [], remaining)
                left = _send_some(sock, left)
        except OSError as exc:
            self.reset()
            raise ConnectionLost(f"{op}: connection to {self.address} lost: {exc.strerror or exc}") from None

    def wait_readable(self, timeout_ms: int) -> bool:
        if self._socket is None:
            time.sleep(timeout_ms / 1000)
            return False
        return bool(self._poller.poll(timeout_ms))

    def receive(self) -> list[list[memoryview]]:
        """Messages that arrived; ConnectionLost (and a reset) when the stream ended or broke."""
        if self._socket is None:
            return []
        try:
            data = self._socket.recv(CHUNK)
            if not data:
                raise ConnectionLost(f"{self.address} closed the connection")
            return self._reader.feed(data)
        except (BlockingIOError, InterruptedError):
            return []
        except (OSError, RpcError) as exc:
            self.reset()
            if isinstance(exc, ConnectionLost):
                raise
            raise ConnectionLost(f"connection to {self.address} lost: {exc}") from None

    def reset(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = self._reader = None

    close = reset
