"""The conductor's cache index, kept from the master's KV events.

The master publishes every complete memory replica that appears or goes (:mod:`store.events`);
:class:`KvEventSubscriber`, a thread the conductor daemon owns, follows that stream and is the only
writer of the conductor's cache index. :class:`IndexFollower` (pure) turns store events into index
events:

- an object key ``"<32 hex>-<layer>"`` (:mod:`daemons.workers.prefix_store`) names block
  ``<32 hex>``; other keys are not prefix blocks and are ignored;
- a segment is the location of the prefill instance whose heartbeat announces it (``segment``);
  every other segment is the shared pool (``POOL``);
- a block is held at a location while its layer-0 object is in one of that location's segments:
  BlockStored of layer 0 adds it; BlockRemoved of *any* layer there removes it (a block missing a
  layer cannot be loaded; the store evicts one object at a time, so the first layer to go takes
  the block with it). Between rebuilds layers are not tracked one by one: a block that lost a
  layer is listed again when its layer 0 is stored again. A rebuild lists a block where all its
  layers are (as many as the snapshot's blocks have at most: one model's, in a cluster);
- AllBlocksCleared clears the index.

Sequence numbers: each batch carries one, counted by the master. A batch that is not the next one
(one was lost; a slow subscriber's queue overflowed) makes the subscriber resynchronise: it asks
the master for ``store.kv_snapshot`` (its sequence number and every complete memory replica),
rebuilds the index from it and follows from the batch after it. Once a second it also asks
``store.kv_events`` (cheap): a master whose ``epoch`` or address changed restarted (its sequence
started again), and a batch the master published a probe ago that never came is a gap the stream
itself cannot show. A change in which segment belongs to which prefill instance also rebuilds the
index, from a snapshot. Garbage on the socket is logged once, counted and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

import zmq

from transfer.auth import ClusterSecret
from transfer.rpc import curve
from transfer.rpc.client_server import FAREWELL_TIMEOUT_S
from scheduler.block_hash import BlockKey, parse_key
from scheduler.cache_index import POOL, CacheIndex
from store.events.messages import AllBlocksCleared, BlockStored, KvEvent, KVEventBatch, MalformedEvent
from store.master_client import MasterClient

log = logging.getLogger(__name__)

PROBE_INTERVAL = 1.0  # seconds between store.kv_events probes
RETRY_INTERVAL = 1.0  # seconds before trying an unreachable master again
POLL_MS = 100


def block_of(object_key: str) -> tuple[BlockKey, int] | None:
    """(block key, layer) of a prefix object's key; None for any other object."""
    hex_key, dash, layer = object_key.rpartition("-")
    if not dash or not layer.isdigit():
        return None
    try:
        return parse_key(hex_key), int(layer)
    except ValueError:
        return None


class IndexFollower:
    """Applies store events to a :class:`CacheIndex`, given which prefill instance owns which
    segment. Pure: the caller serialises calls and passes the segment map each time."""

    def __init__(self, index: CacheIndex) -> None:
        self.index = index
        self._locations: dict[str, str] = {}  # segment -> prefill instance, as of the last rebuild
        # Which segments hold each block's layer 0, so a location that holds a block in two
        # segments (two pool segments) keeps it when one drops it. Bounded like the index.
        self._segments: OrderedDict[BlockKey, set[str]] = OrderedDict()

    def current(self, locations: dict[str, str]) -> bool:
        """False when the segment map changed since the last rebuild: rebuild from a snapshot."""
        return locations == self._locations

    def rebuild(self, replicas: Iterable[tuple[str, str]], locations: dict[str, str]) -> None:
        """Start over from a snapshot's (object key, segment) pairs."""
        self.index.clear()
        self._segments.clear()
        self._locations = dict(locations)
        layers: dict[tuple[BlockKey, str], set[int]] = {}
        for key, segment in replicas:
            parsed = block_of(key)
            if parsed is not None:
                layers.setdefault((parsed[0], segment), set()).add(parsed[1])
        num_layers = max((max(held) + 1 for held in layers.values()), default=0)
        for (block, segment), held in layers.items():
            if len(held) == num_layers:
                self._stored(block, segment)

    def apply(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self.index.clear()
                self._segments.clear()
                continue
            segment = event.medium or ""
            for raw in event.block_hashes:
                parsed = block_of(raw.decode(errors="replace"))
                if parsed is None:
                    continue
                if isinstance(event, BlockStored):
                    if parsed[1] == 0:
                        self._stored(parsed[0], segment)
                else:
                    self._removed(parsed[0], segment)

    def _location(self, segment: str) -> tuple[str, str]:
        """(location, tier) of a segment."""
        owner = self._locations.get(segment)
        return (owner, "dram") if owner is not None else (POOL, "pool")

    def _stored(self, block: BlockKey, segment: str) -> None:
        segments = self._segments.get(block)
        if segments is None:
            segments = self._segments[block] = set()
        else:
            self._segments.move_to_end(block)
        segments.add(segment)
        if self.index.max_blocks is not None and len(self._segments) > self.index.max_blocks:
            self._segments.popitem(last=False)
        location, tier = self._location(segment)
        self.index.block_stored(location, [block], tier)

    def _removed(self, block: BlockKey, segment: str) -> None:
        segments = self._segments.get(block, set())
        segments.discard(segment)
        if not segments:
            self._segments.pop(block, None)
        location, tier = self._location(segment)
        if all(self._location(s)[0] != location for s in segments):
            self.index.block_evicted(location, [block], tier)


class FollowedIndex(Protocol):
    """The conductor's side (:class:`daemons.serving.service.ServingService`): an
    :class:`IndexFollower` behind the conductor's lock and its current segment map."""

    def apply_kv_events(self, events: list[KvEvent]) -> bool:
        """Apply a batch; False (nothing applied) when the segment map changed: rebuild."""

    def rebuild_kv_index(self, replicas: list[tuple[str, str]]) -> None: ...

    def kv_index_current(self) -> bool: ...


class KvEventSubscriber:
    """The thread that follows the master's KV events into the conductor's index. It owns its
    SUB socket (made, used and closed on the thread) and its master client."""

    def __init__(self, master: str, index: FollowedIndex, timeout: float = 5.0,
                 secret: ClusterSecret | None = None) -> None:
        self._master = MasterClient(master, "conductor-kv-events", timeout=timeout, secret=secret)
        self._secret = secret
        self._index = index
        self._sub: zmq.Socket | None = None
        self._stop = threading.Event()
        self.address = self.epoch = ""
        self.sequence = -1  # the last batch applied (or the snapshot's)
        self._behind = -1  # the master's sequence at the last probe
        self.num_batches = self.num_resyncs = self.num_malformed = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def start(self) -> KvEventSubscriber:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        # The thread may be waiting out a call to a master that is gone: don't wait with it. It
        # is a daemon thread that owns its master client until it ends, at the latest at exit.
        self._thread.join(timeout=FAREWELL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._master.close()

    def stats(self) -> dict[str, Any]:
        return {"kv_events_address": self.address, "sequence": self.sequence, "batches": self.num_batches,
                "resyncs": self.num_resyncs, "malformed": self.num_malformed}

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        next_probe = 0.0
        stale, unreachable = True, False
        try:
            while not self._stop.is_set():
                try:
                    if stale:
                        self._resync()
                        stale = False
                    if self._sub.poll(POLL_MS):
                        stale = not self._receive(self._sub.recv_multipart())
                    if not stale and time.monotonic() >= next_probe:
                        next_probe = time.monotonic() + PROBE_INTERVAL
                        stale = not self._probe()
                    unreachable = False
                except Exception as exc:  # a master gone, or answering nonsense: start over
                    if not unreachable:
                        log.warning("KV events: cannot follow the master (%s: %s); retrying every %gs",
                                    type(exc).__name__, exc, RETRY_INTERVAL)
                    stale, unreachable = True, True
                    self._stop.wait(RETRY_INTERVAL)
        finally:
            if self._sub is not None:
                self._sub.close(linger=0)

    def _receive(self, frames: list[bytes]) -> bool:
        """Apply one batch; False when the index must be rebuilt."""
        if len(frames) != 3 or len(frames[1]) != 8:
            self._malformed(f"{len(frames)} frames")
            return True
        sequence = int.from_bytes(frames[1], "big")
        if sequence <= self.sequence:
            return True  # the snapshot we rebuilt from covers it already
        if sequence != self.sequence + 1:
            log.info("KV events: batch %d after %d; resynchronising", sequence, self.sequence)
            return False
        try:
            batch = KVEventBatch.decode(frames[2])
        except MalformedEvent as exc:
            self._malformed(str(exc))  # not applied: the next batch shows the gap
            return True
        if not self._index.apply_kv_events(batch.events):
            return False
        self.sequence = sequence
        self.num_batches += 1
        return True

    def _probe(self) -> bool:
        """False when the master restarted, a batch it published a probe ago never came, or the
        segment map changed."""
        if not self._index.kv_index_current():
            return False
        info = self._master.kv_events()
        if info["epoch"] != self.epoch or info["address"] != self.address:
            log.info("KV events: the master's publisher changed (restart); resynchronising")
            return False
        missing = self.sequence < self._behind
        self._behind = info["sequence"]
        return not missing

    def _resync(self) -> None:
        """(Re)connect to the master's publisher and rebuild the index from its snapshot."""
        info = self._master.kv_events()
        if self._sub is None or info["address"] != self.address:
            if self._sub is not None:
                self._sub.close(linger=0)
            self._sub = zmq.Context.instance().socket(zmq.SUB)
            self._sub.setsockopt(zmq.SUBSCRIBE, b"")
            if self._secret:
                curve.make_client(self._sub, self._secret)
            self._sub.connect(info["address"])
            self.address = info["address"]
        # Subscribed before the snapshot: batches after it queue up and are not lost.
        snapshot = self._master.kv_snapshot()
        self._index.rebuild_kv_index([(key, segment) for key, segment in snapshot["blocks"]])
        self.sequence = self._behind = snapshot["sequence"]
        self.epoch = snapshot["epoch"]
        self.num_resyncs += 1

    def _malformed(self, why: str) -> None:
        self.num_malformed += 1
        if self.num_malformed == 1:
            log.warning("KV events: skipping a malformed message (%s); later ones are only counted", why)
