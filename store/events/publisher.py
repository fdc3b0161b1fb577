"""The master's KV-event publisher: a ZeroMQ PUB socket, a replay ROUTER socket, one thread.

The store service hands it one batch of recorded events per RPC (:meth:`KvEventPublisher.publish`,
a queue put, after the store lock is released); the thread encodes each batch
(:mod:`store.events.messages`) and sends it as vLLM's ``ZmqEventPublisher`` does::

    PUB     [topic b"", sequence (8 bytes, big-endian), payload]
    replay  request  [start sequence (8 bytes, big-endian)]   (from a REQ or DEALER)
            replies  [sequence, payload] for every buffered batch from there on,
                     then [-1 (8 bytes, signed), b""]

Sequence numbers count batches from 0 and are assigned under the store lock
(:meth:`next_sequence`), so ``store.kv_snapshot`` can say which batch its state follows. Two
threads (the RPC I/O thread, the daemon's tick) may hand their batches over in the other order:
the thread sends in sequence order, holding a batch until the ones before it arrived. ``epoch``
changes with every publisher (every master process), which is how a subscriber tells a restarted
master, whose sequence starts again, from the one it followed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque

import zmq

from store.events.messages import END_OF_REPLAY, TOPIC
from store.events.recorder import StoreEvent, batch_of

log = logging.getLogger(__name__)

REPLAY_BATCHES = 10_000  # batches kept for replay (vLLM's buffer_steps)
PUB_HWM = 100_000  # batches ZeroMQ queues per slow subscriber before it drops (it then resyncs)
MAX_HELD = 1_000  # out-of-order batches held for a missing one before giving up on it
POLL_S = 0.05  # how often an idle thread looks at the replay socket


class KvEventPublisher:
    def __init__(self, host: str, port: int = 0, replay_port: int = 0, advertise_host: str = "") -> None:
        """Bind both sockets on ``host``; ``address`` and ``replay_address`` name them with
        ``advertise_host`` (what other hosts reach) when given."""
        context = zmq.Context.instance()
        self._pub = context.socket(zmq.PUB)
        self._pub.set_hwm(PUB_HWM)
        self._replay = context.socket(zmq.ROUTER)
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
        self.last_sequence = -1  # the last one handed out; -1: none yet
        self.num_published = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BATCHES)
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def next_sequence(self) -> int:
        """The next batch's number; call it under the store lock, once per batch."""
        self.last_sequence += 1
        return self.last_sequence

    def publish(self, sequence: int, events: list[StoreEvent]) -> None:
        self._queue.put((sequence, time.time(), events))

    def close(self) -> None:
        """Send what was handed over, then stop the thread, which closes the sockets."""
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        held: dict[int, tuple[float, list[StoreEvent]]] = {}
        expected = 0
        try:
            while True:
                try:
                    item = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    item = ()
                if item is None:
                    break
                if item:
                    sequence, ts, events = item
                    held[sequence] = (ts, events)
                    if len(held) > MAX_HELD:  # a batch that never came: subscribers see the gap
                        log.error("KV event batch %d never arrived; skipping it", expected)
                        expected = min(held)
                    while expected in held:
                        self._send(expected, *held.pop(expected))
                        expected += 1
                while self._replay.poll(0):
                    self._serve_replay()
        finally:
            self._pub.close(linger=0)
            self._replay.close(linger=0)

    def _send(self, sequence: int, ts: float, events: list[StoreEvent]) -> None:
        payload = batch_of(events, ts).encode()
        self._pub.send_multipart([TOPIC, sequence.to_bytes(8, "big"), payload])
        self._buffer.append((sequence, payload))
        self.num_published += 1

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
