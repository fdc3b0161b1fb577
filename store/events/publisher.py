"""The master's KV-event publisher: a ZeroMQ PUB socket, a replay ROUTER socket, one thread.

The store service hands it the events each RPC recorded (:meth:`KvEventPublisher.publish`): a
deque append, which wakes nobody while events flow, so a put pays no system call and no thread
switch for it. Every ``SEND_INTERVAL_S`` the thread takes what piled up, makes it one batch
(:mod:`store.events.messages`) numbered by the next sequence number, and sends it as vLLM's
``ZmqEventPublisher`` does::

    PUB     [topic b"", sequence (8 bytes, big-endian), payload]
    replay  request  [start sequence (8 bytes, big-endian)]   (from a REQ socket)
            replies  [sequence, payload] for every buffered batch from there on,
                     then [-1 (8 bytes, signed), b""]

Given the cluster secret, both sockets are CURVE servers (:mod:`transfer.rpc.curve`): only a
subscriber holding the secret reads which blocks the store holds.

One batch per interval rather than per RPC: the thread's work (encoding, sending) then grows
with the events, not with the calls, and stays off the put path's CPU. After an interval with
nothing to send the thread sleeps until a replay request or a doorbell (an eventfd) that the first
event after the quiet rings: an idle master then wakes nobody 200 times a second (that cost it
about 2% of a core), and a put pays the one system call only when the thread sleeps.

Snapshots: ``store.kv_snapshot`` reads the state under the store lock and drops a
:meth:`mark` into the same deque; the thread closes the batch in progress at the mark and
resolves it with that batch's sequence number, so the snapshot says exactly which batch its state
follows. ``epoch`` changes with every publisher (every master process), which is how a
subscriber tells a restarted master, whose sequence starts again at 0, from the one it followed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque

import zmq

from store.events.messages import END_OF_REPLAY, TOPIC
from store.events.recorder import StoreEvent, batch_of
from transfer.auth import ClusterSecret
from transfer.errors import ShuttingDown
from transfer.rpc import curve

log = logging.getLogger(__name__)

REPLAY_BATCHES = 10_000  # batches kept for replay (vLLM's buffer_steps)
PUB_HWM = 100_000  # batches ZeroMQ queues per slow subscriber before it drops (it then resyncs)
# How often the thread sends what piled up and looks at the replay socket. Waking it per RPC
# instead cost a 4 KiB put about 30 us of the master's time (a thread switch each).
SEND_INTERVAL_S = 0.005
REQUEST_LIMIT = 64 * 2**10  # bytes of one subscription or replay request


class SnapshotMark:
    """A point in the event stream; resolved with the sequence of the last batch before it."""

    def __init__(self) -> None:
        self.sequence = -1
        self._resolved = threading.Event()

    def resolve(self, sequence: int) -> None:
        self.sequence = sequence
        self._resolved.set()

    def wait(self, timeout: float) -> int:
        if not self._resolved.wait(timeout):
            raise ShuttingDown("the master's KV event publisher is not running")
        return self.sequence


class KvEventPublisher:
    def __init__(self, host: str, port: int = 0, replay_port: int = 0, advertise_host: str = "",
                 secret: ClusterSecret | None = None) -> None:
        """Bind both sockets on ``host``; ``address`` and ``replay_address`` name them with
        ``advertise_host`` (what other hosts reach) when given."""
        context = zmq.Context.instance()
        self._pub = context.socket(zmq.PUB)
        self._pub.set_hwm(PUB_HWM)
        self._replay = context.socket(zmq.ROUTER)
        # Both take only small requests (subscriptions, replay ranges): nobody can make the
        # master buffer a large frame through them.
        for sock in (self._pub, self._replay):
            sock.setsockopt(zmq.MAXMSGSIZE, REQUEST_LIMIT)
            if secret:
                curve.make_server(sock, context, secret, monitor=False)
        try:
            self._pub.bind(f"tcp://{host}:{port or '*'}")
            self._replay.bind(f"tcp://{host}:{replay_port or '*'}")
        except zmq.ZMQError:
            self._pub.close(linger=0)
            self._replay.close(linger=0)
            raise
        self.address = _named(self._pub.getsockopt_string(zmq.LAST_ENDPOINT), advertise_host)
        self.replay_address = _named(self._replay.getsockopt_string(zmq.LAST_ENDPOINT), advertise_host)
        self.epoch = uuid.uuid4().hex[:16]
        self.last_sequence = -1  # of the last batch sent; -1: none yet. Written by the thread only.
        self._handed: deque[list[StoreEvent] | SnapshotMark] = deque()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BATCHES)
        self._closing = threading.Event()
        self._doorbell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._asleep = False  # set by the thread before its last look at the deque, then it sleeps
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[StoreEvent]) -> None:
        """Hand over one RPC's events; call it under the store lock, which orders the calls."""
        self._hand(events)

    def mark(self) -> SnapshotMark:
        """A mark after everything handed over so far; under the store lock, like publish."""
        mark = SnapshotMark()
        self._hand(mark)
        return mark

    def close(self) -> None:
        """Send what was handed over, then stop the thread, which closes the sockets."""
        if self._closing.is_set():
            return
        self._closing.set()
        os.eventfd_write(self._doorbell, 1)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():  # else it may still poll the doorbell: leave it open
            os.close(self._doorbell)

    def _hand(self, item: list[StoreEvent] | SnapshotMark) -> None:
        # Append before looking at the flag: the thread sets the flag before its last look at the
        # deque, so either it sees this item or this call sees it asleep and rings.
        self._handed.append(item)
        if self._asleep:
            self._asleep = False
            os.eventfd_write(self._doorbell, 1)

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        sleeper = zmq.Poller()
        sleeper.register(self._replay, zmq.POLLIN)
        sleeper.register(self._doorbell, zmq.POLLIN)
        try:
            while True:
                closing = self._closing.wait(SEND_INTERVAL_S)
                try:
                    busy = self._send_handed()
                    while self._replay.poll(0):
                        self._serve_replay()
                        busy = True
                except Exception:  # keep publishing: subscribers resync over what was lost
                    log.exception("KV event publisher: a round failed")
                    busy = True
                if closing:
                    break
                if not busy:
                    self._sleep(sleeper)
        finally:
            self._pub.close(linger=0)
            self._replay.close(linger=0)

    def _sleep(self, sleeper: zmq.Poller) -> None:
        """Block until an event is handed over, a replay request comes, or close() rings."""
        self._asleep = True
        if not self._handed and not self._closing.is_set():
            sleeper.poll()
        self._asleep = False
        try:
            os.eventfd_read(self._doorbell)
        except BlockingIOError:  # woken by a replay request, not the doorbell
            pass

    def _send_handed(self) -> bool:
        """Send what was handed over; False when there was nothing."""
        if not self._handed:
            return False
        pending: list[StoreEvent] = []
        while self._handed:
            item = self._handed.popleft()
            if isinstance(item, SnapshotMark):
                self._send(pending)
                pending = []
                item.resolve(self.last_sequence)
            else:
                pending.extend(item)
        self._send(pending)
        return True

    def _send(self, events: list[StoreEvent]) -> None:
        if not events:
            return
        sequence = self.last_sequence + 1
        payload = batch_of(events, time.time()).encode()
        self._pub.send_multipart([TOPIC, sequence.to_bytes(8, "big"), payload])
        self._buffer.append((sequence, payload))
        self.last_sequence = sequence

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignoring a malformed KV event replay request (%d frames)", len(frames))
            return
        identity, start = frames[0], int.from_bytes(frames[2], "big")
        for sequence, payload in list(self._buffer):
            if sequence >= start:
                self._replay.send_multipart([identity, b"", sequence.to_bytes(8, "big"), payload])
        self._replay.send_multipart([identity, b"", END_OF_REPLAY.to_bytes(8, "big", signed=True), b""])


def _named(bound: str, host: str) -> str:
    return f"tcp://{host}:{bound.rpartition(':')[2]}" if host else bound
