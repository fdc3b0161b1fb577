"""The TCP transport: path choice per slice, a SIEVE-bounded endpoint pool, and a watchdog.

Each slice picks a local path (NIC) from the topology matrix and a stream on it by its position
in the submission; the pool key is (peer, incarnation, local NIC, peer endpoint, stream), so the
slices of one batch (of one big request, or of many small ones) run on different connections in
parallel. The pool keeps at most ``pool_size`` connections;
an evicted one finishes its in-flight slices before closing. A connection that dies is dropped
from the pool at once and rebuilt on next use. The watchdog declares dead a connection that has
work but made no progress for ``slice_timeout`` (a peer that stopped, a link that went down:
TCP alone would wait for minutes). Small transfers can skip all that: :meth:`move_now` moves
them on the calling thread's own link (see tcp_inline), bounded by the kernel's socket timeouts.
"""

from __future__ import annotations

import ipaddress
import threading
import time

from transfer.batch import OpCode, Slice
from transfer.descriptor import BufferDesc, Endpoint, SegmentDescriptor
from transfer.errors import TransferFailed, TransferTimeout
from transfer.memory import MemoryRegistry
from transfer.path_selection import PathSet
from transfer.sieve import SieveCache
from transfer.tcp.connection import Connection
from transfer.tcp.inline import InlineLink, Move
from transfer.tcp.server import TcpTarget
from transfer.auth import Credential
from transfer.tcp.wire import MAX_GROUP, Refused
from transfer.transport import SliceSink, Transport

_WATCHDOG_TICK = 0.1
# Reads from this size on are split over two inline links: the target serves each on its own
# thread, so two threads copy into the sockets while the caller drains them. Measured over
# loopback on the 2-core VM, per-call A/B interleaved (/tmp/s21/stripe_ab2.py, ab3.py), p50
# one link vs two: 1 MiB 515 -> 460 and 526 -> 440 us, 2 MiB 793 -> 726, 4 MiB 1646 -> 1438; but
# 256 KiB 217 -> 303 and 512 KiB 210 -> 267 (the second header and target wake-up cost more
# than the halved copy saves); four links lost to two on two cores (/tmp/s21/sf3.py).
STRIPE_BYTES = 1 << 20
INLINE_STRIPES = 2


class TcpTransport(Transport):
    name = "tcp"

    def __init__(self, registry: MemoryRegistry, identity, sink: SliceSink, paths: PathSet,
                 nic_addresses: dict[str, str], listen: list[tuple[str, str]], *,
                 streams_per_path: int, pool_size: int, handshake_timeout: float,
                 slice_timeout: float, secret: Credential | None = None, busy_poll: float = 0.0) -> None:
        """``busy_poll``: how long an inline link awaits an answer, and a target connection the
        next request group, polling before it sleeps (see tcp_wire.Receiver)."""
        self._sink, self._paths, self._nic_addresses = sink, paths, dict(nic_addresses)
        self._busy_poll = busy_poll
        self._nic_networks: dict[str, ipaddress.IPv4Network | None] = {}  # see _local_network
        self._streams = streams_per_path
        self._handshake_timeout, self._slice_timeout = handshake_timeout, slice_timeout
        self._lock = threading.Lock()
        self._pool: SieveCache[tuple, Connection] = SieveCache(pool_size)
        self._retiring: set[Connection] = set()
        # (thread id, peer, incarnation, NIC) -> that thread's link. A dead thread's id may be
        # reused by a new thread, which then reuses its link: never two threads at once.
        self._links: dict[tuple, InlineLink] = {}
        self.num_evicted = 0
        self._secret = secret
        self.target = TcpTarget(registry, identity, listen, secret, busy_poll)
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="tcp-watchdog", daemon=True)
        self._watchdog.start()

    def endpoints(self) -> list[Endpoint]:
        return list(self.target.endpoints)

    def reaches(self, peer: SegmentDescriptor, buffer: BufferDesc) -> bool:
        return bool(peer.endpoints)

    def submit(self, pieces: list[Slice]) -> None:
        """Stripe the pieces over paths and streams by their position in this submission, so
        a batch of many one-slice requests runs on every stream at once, as the slices of one
        big request do (a retry comes alone and walks the paths by its attempt number)."""
        now = time.monotonic()
        groups: dict[Connection, list[Slice]] = {}
        routes: dict[tuple, Connection] = {}  # one path choice per distinct route, not per slice
        lanes: dict[str, int] = {}  # location -> its NICs x streams: stripes repeat with this period
        with self._lock:
            for stripe, piece in enumerate(pieces):
                peer, location = piece.peer, piece.location
                period = lanes.get(location)
                if period is None:
                    period = lanes[location] = self._nics(location) * self._streams
                lane = stripe % period
                route = (peer.name, peer.incarnation, location, lane, piece.attempt)
                connection = routes.get(route)
                if connection is None:
                    nic = self._paths.choose(location, lane, piece.attempt, now)
                    stream = (lane // self._nics(location)) % self._streams
                    connection = routes[route] = self._connection(peer, nic, stream)
                group = groups.get(connection)
                if group is None:
                    groups[connection] = [piece]
                else:
                    group.append(piece)
        for connection, group in groups.items():
            if not connection.enqueue(group):  # died between lookup and enqueue
                for piece in group:
                    self._sink.failed(piece, "connection closed before sending", connection.nic)

    def _nics(self, location: str) -> int:
        """How many NICs a first attempt from ``location`` stripes over."""
        preferred, secondary = self._paths.tiers(location)
        return max(1, len(preferred or secondary))

    def _connection(self, peer: SegmentDescriptor, nic: str, stream: int) -> Connection:
        local_host = self._local_address(nic)
        remote = _match_endpoint(peer.endpoints, self._local_network(nic), nic)
        key = (peer.name, peer.incarnation, nic, remote.host, remote.port, stream)
        connection = self._pool.get(key)
        if connection is not None and not connection.dead:
            return connection
        connection = Connection(peer, nic, local_host, remote, self._sink, self._handshake_timeout,
                                on_dead=lambda c, key=key: self._drop(key, c), secret=self._secret)
        for _, evicted in self._pool.put(key, connection):
            self.num_evicted += 1
            self._retiring.add(evicted)
            evicted.retire()
        return connection

    def move_now(self, peer: SegmentDescriptor, location: str,
                 moves: list[Move]) -> list[TransferFailed | None]:
        """Move small requests to one peer on the calling thread: per move None (done) or its
        error. Reads of STRIPE_BYTES or more are split over two of the thread's links (see
        InlineLink.move_striped). Any error closes the links used, whose streams may be out of
        step; the caller should forget the peer's descriptor (it may have restarted), as a
        batch's final failure does."""
        nic = self._paths.choose(location, 0, 0, time.monotonic())
        stripes = _stripes(moves, min(self._streams, INLINE_STRIPES))
        keys = [(threading.get_ident(), peer.name, peer.incarnation, nic, stripe)
                for stripe in range(len(stripes))]
        with self._lock:
            links = [self._links.get(key) for key in keys]
        try:
            for n, key in enumerate(keys):
                if links[n] is None or links[n].closed:  # type: ignore[union-attr]
                    links[n] = self._link(key, peer, nic)
            if len(stripes) == 1:
                statuses = links[0].move(moves)  # type: ignore[union-attr]
            else:
                statuses = _joined(moves, stripes, InlineLink.move_striped(links, stripes))  # type: ignore[arg-type]
        except Refused as exc:
            return [TransferFailed(f"segment {peer.name} refused the connection: {exc}")] * len(moves)
        except (OSError, ConnectionError, ValueError) as exc:
            for key, link in zip(keys, links):
                if link is not None:
                    self._close_link(key, link)
            self._paths.mark_failed(nic, time.monotonic())
            kind = TransferTimeout if isinstance(exc, TimeoutError) else TransferFailed
            return [kind(f"link to {peer.name} via {nic} failed: {type(exc).__name__}: {exc}")] * len(moves)
        return [None if status == 0 else
                TransferFailed(f"target {peer.name} refused the range (code {status})")
                for status in statuses]

    def _link(self, key: tuple, peer: SegmentDescriptor, nic: str) -> InlineLink:
        local_host = self._local_address(nic)
        link = InlineLink(peer, local_host, _match_endpoint(peer.endpoints, self._local_network(nic), nic),
                          self._handshake_timeout, self._slice_timeout, self._secret, self._busy_poll)
        with self._lock:
            closed = self._stop.is_set()
            if not closed:
                self._links[key] = link
                # Threads that ended left their links behind: a process that runs each request
                # on a thread of its own would otherwise gather one socket per request.
                alive = {thread.ident for thread in threading.enumerate()}
                orphans = [(k, old) for k, old in self._links.items() if k[0] not in alive]
        if closed:  # close() already took its list of links
            link.close()
            raise ConnectionError("transfer engine closed")
        for orphan_key, orphan in orphans:
            self._close_link(orphan_key, orphan)
        return link

    def _close_link(self, key: tuple, link: InlineLink) -> None:
        with self._lock:
            if self._links.get(key) is link:
                del self._links[key]
        link.close()

    def _drop(self, key: tuple, connection: Connection) -> None:
        with self._lock:
            if self._pool.get(key) is connection:
                self._pool.pop(key)
            self._retiring.discard(connection)

    def _local_address(self, nic: str) -> str | None:
        if nic not in self._nic_addresses:
            self._nic_addresses[nic] = _interface_ipv4(nic)
        return self._nic_addresses[nic]

    def _local_network(self, nic: str) -> ipaddress.IPv4Network | None:
        """The subnet of our NIC's address, looked up once as the address is: psutil lists every
        interface's addresses, ~0.3 ms, which every batch's submit paid (a single 16 MiB store
        put over TCP spent 6% of its time there, /tmp/mb/big.py under cProfile)."""
        if nic not in self._nic_networks:
            self._nic_networks[nic] = _network_of(self._local_address(nic))
        return self._nic_networks[nic]

    def forget_peer(self, peer_name: str) -> None:
        with self._lock:
            stale = [c for c in self._pool.values() if c.peer.name == peer_name]
            links = [(key, link) for key, link in self._links.items() if key[1] == peer_name]
        for connection in stale:
            connection.kill(f"segment {peer_name} was forgotten")
        for key, link in links:
            self._close_link(key, link)

    def num_connections(self) -> int:
        with self._lock:
            return len(self._pool)

    def _watch(self) -> None:
        while not self._stop.wait(_WATCHDOG_TICK):
            now = time.monotonic()
            with self._lock:
                connections = [*self._pool.values(), *self._retiring]
            for connection in connections:
                if connection.stalled(now, self._slice_timeout):
                    connection.kill(f"no progress for {self._slice_timeout:g}s on path {connection.nic}")

    def close(self) -> None:
        self._stop.set()
        self._watchdog.join(timeout=2)
        with self._lock:
            connections = [*self._pool.values(), *self._retiring]
            links = list(self._links.values())
            self._links.clear()
        for connection in connections:
            connection.kill("transfer engine closed")
        for link in links:
            link.close()
        self.target.close()


def _interface_ipv4(nic: str) -> str | None:
    import psutil  # here and in _network_of: only a TCP connection needs it, not every engine's start

    for address in psutil.net_if_addrs().get(nic, []):
        if address.family.name == "AF_INET":
            return address.address
    return None


def _match_endpoint(endpoints: list[Endpoint], network: ipaddress.IPv4Network | None, nic: str) -> Endpoint:
    """The peer endpoint reached through our NIC: same NIC name (loopback), else in our NIC's
    subnet (``network``)."""
    for endpoint in endpoints:
        if endpoint.nic == nic:
            return endpoint
    if network is not None:
        for endpoint in endpoints:
            try:
                if ipaddress.ip_address(endpoint.host) in network:
                    return endpoint
            except ValueError:
                continue
    return endpoints[0]


def _network_of(host: str | None) -> ipaddress.IPv4Network | None:
    if host is None:
        return None
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.address == host and address.netmask:
                return ipaddress.ip_network(f"{host}/{address.netmask}", strict=False)
    return None


def _stripes(moves: list[Move], count: int) -> list[list[Move]]:
    """``moves`` as one part, or, when they are all READs of at least STRIPE_BYTES in total,
    as ``count`` parts of about equal bytes (a move on a cut is split in two: same grant,
    consecutive ranges). Each part stays within one request group."""
    total = sum(len(move[1]) for move in moves)
    if count < 2 or total < STRIPE_BYTES or len(moves) >= MAX_GROUP \
            or any(move[0] != OpCode.READ for move in moves):
        return [moves]
    share = -(-total // count)
    parts: list[list[Move]] = [[]]
    room = share
    for opcode, local, address, grant in moves:
        offset = 0
        while offset < len(local):
            if not room:
                parts.append([])
                room = share
            take = min(room, len(local) - offset)
            parts[-1].append((opcode, local[offset:offset + take], address + offset, grant))
            offset += take
            room -= take
    return parts


def _joined(moves: list[Move], stripes: list[list[Move]], statuses: list[list[int]]) -> list[int]:
    """Per move of ``moves``, the first failed status of its pieces in ``stripes`` (0: all done)."""
    pieces = iter(zip((piece for part in stripes for piece in part),
                      (status for part in statuses for status in part)))
    joined = []
    for _, local, _, _ in moves:
        left, outcome = len(local), 0
        while left:
            piece, status = next(pieces)
            left -= len(piece[1])
            outcome = outcome or status
        joined.append(outcome)
    return joined
