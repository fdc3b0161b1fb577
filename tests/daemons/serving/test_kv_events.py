"""The conductor's cache index follows the master's KV events (daemons.serving.kv_events).

The follower's rules are checked pure; the subscriber thread runs against a stand-in master (a
real RPC server answering store.kv_events / store.kv_snapshot and a real PUB socket the test
publishes on, dropping or garbling what it likes) and a real ServingService.
"""

from __future__ import annotations

import time

import zmq

from daemons.serving.kv_events import IndexFollower, KvEventSubscriber, block_of
from daemons.serving.service import ServingService
from scheduler.block_hash import format_key
from scheduler.cache_index import POOL, CacheIndex
from store.events.messages import AllBlocksCleared, BlockRemoved, BlockStored
from store.events.recorder import REMOVED, STORED, StoreEvent, batch_of
from transfer.rpc.client_server import RpcServer
from transfer.settings import resolve


def obj(block: int, layer: int) -> bytes:
    return f"{format_key(block)}-{layer}".encode()


def test_block_of_reads_prefix_object_keys_only():
    assert block_of(f"{format_key(5)}-0") == (5, 0) and block_of(f"{format_key(5)}-12") == (5, 12)
    assert block_of("user-key") is None and block_of(format_key(5)) is None
    assert block_of(f"{format_key(5)}-x") is None


def test_a_block_is_held_while_layer_0_is_there_and_lost_with_any_layer():
    index = CacheIndex()
    follower = IndexFollower(index)
    follower.rebuild([], {"segP": "p0"})
    follower.apply([BlockStored([obj(1, 1)], "segP")])  # layer 1 alone: not loadable yet
    assert index.holders(1) == {}
    follower.apply([BlockStored([obj(1, 0), obj(2, 0)], "segP"), BlockStored([obj(1, 0)], "pool-a")])
    assert index.holders(1) == {"p0": 2, POOL: 4} and index.holders(2) == {"p0": 2}
    follower.apply([BlockRemoved([obj(1, 3)], "segP")])  # a missing layer: not loadable there
    assert index.holders(1) == {POOL: 4}
    follower.apply([AllBlocksCleared()])
    assert index.num_keys() == 0


def test_two_pool_segments_keep_a_block_in_the_pool_until_both_drop_it():
    index = CacheIndex()
    follower = IndexFollower(index)
    follower.apply([BlockStored([obj(1, 0)], "pool-a"), BlockStored([obj(1, 0)], "pool-b")])
    follower.apply([BlockRemoved([obj(1, 0)], "pool-a")])
    assert index.holders(1) == {POOL: 4}
    follower.apply([BlockRemoved([obj(1, 1)], "pool-b")])
    assert index.holders(1) == {}


def test_a_rebuild_maps_segments_to_their_instances_and_skips_blocks_missing_a_layer():
    index = CacheIndex()
    follower = IndexFollower(index)
    replicas = [(obj(b, layer).decode(), segment) for b, segment in ((1, "segP"), (2, "other"), (3, "other"))
                for layer in range(2)]
    replicas.remove((obj(3, 1).decode(), "other"))
    follower.rebuild(replicas + [("user-key", "segP")], {"segP": "p0"})
    assert index.sizes() == {"p0": 1, POOL: 1} and index.holders(3) == {}
    assert follower.current({"segP": "p0"}) and not follower.current({"segP": "p1"})


class FakeMaster:
    """store.kv_events / store.kv_snapshot over real RPC, and a PUB socket the test drives."""

    def __init__(self) -> None:
        self.pub = zmq.Context.instance().socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:*")
        self.address = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.sequence, self.replicas, self.epoch = -1, set(), "e1"
        self.server = RpcServer()
        self.server.register("store.kv_events", lambda r: self._info())
        self.server.register("store.kv_snapshot", self._snapshot)
        self.server.start()

    def _info(self) -> dict:
        return {"address": self.address, "replay_address": "", "epoch": self.epoch, "sequence": self.sequence}

    def _snapshot(self, request) -> dict:
        return {**self._info(), "blocks": sorted([k, s] for k, s in self.replicas)}

    def publish(self, events: list[StoreEvent], send: bool = True) -> None:
        for e in events:
            (self.replicas.add if e.kind == STORED else self.replicas.discard)((e.key, e.segment_id))
        self.sequence += 1
        if send:
            self.pub.send_multipart([b"", self.sequence.to_bytes(8, "big"), batch_of(events, 1.0).encode()])

    def close(self) -> None:
        self.server.stop(0.5)
        self.pub.close(linger=0)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def stored(block: int, segment: str = "pool-a") -> StoreEvent:
    return StoreEvent(STORED, obj(block, 0).decode(), segment)


def removed(block: int, segment: str = "pool-a") -> StoreEvent:
    return StoreEvent(REMOVED, obj(block, 0).decode(), segment)


def test_the_subscriber_resyncs_after_a_lost_batch_a_restart_and_survives_garbage():
    master = FakeMaster()
    master.publish([stored(1)], send=False)  # before the subscriber: only the snapshot has it
    service = ServingService(resolve({}, environ={}))
    subscriber = KvEventSubscriber(master.server.address, service, timeout=2.0).start()
    try:
        wait_for(lambda: subscriber.num_resyncs == 1)
        assert service.index_view()["locations"] == {POOL: 1}
        # A SUB connects asynchronously: publish until one batch got through.
        block = 100
        while subscriber.num_batches == 0:
            master.publish([stored(block)])
            block += 1
            time.sleep(0.05)
        resyncs = subscriber.num_resyncs
        master.publish([removed(1)], send=False)  # lost
        master.publish([stored(2)])  # shows the gap: the index is rebuilt from the snapshot
        wait_for(lambda: subscriber.num_resyncs == resyncs + 1 and subscriber.sequence == master.sequence)
        assert service.conductor.index.holders(1) == {} and service.conductor.index.holders(2) == {POOL: 4}
        # Garbage: wrong frame count, a payload that is not msgpack. Skipped and counted.
        master.pub.send_multipart([b"junk"])
        master.sequence += 1
        master.pub.send_multipart([b"", master.sequence.to_bytes(8, "big"), b"\xc1\xc1 not msgpack"])
        master.publish([removed(2)])  # the garbled batch is a gap: resync again, from the truth
        wait_for(lambda: subscriber.num_malformed == 2 and subscriber.sequence == master.sequence)
        assert service.conductor.index.holders(2) == {}
        # The last batch lost with nothing after it: the once-a-second probe notices.
        resyncs = subscriber.num_resyncs
        master.publish([stored(3)], send=False)
        wait_for(lambda: subscriber.num_resyncs > resyncs, timeout=5.0)
        assert service.conductor.index.holders(3) == {POOL: 4}
        # A restarted master: empty, counting from 0 again. Its first batches look old; the
        # probe sees the new epoch and the index is rebuilt from the new master's snapshot.
        resyncs = subscriber.num_resyncs
        master.epoch, master.sequence, master.replicas = "e2", -1, set()
        master.publish([stored(4)])
        wait_for(lambda: subscriber.num_resyncs > resyncs, timeout=5.0)
        assert service.conductor.index.holders(3) == {} and service.conductor.index.holders(4) == {POOL: 4}
        assert subscriber.sequence == 0
    finally:
        subscriber.close()
        master.close()
    assert not subscriber._thread.is_alive()


def test_closing_the_subscriber_does_not_wait_out_a_call_to_a_master_that_is_gone():
    """A conductor stopped after its master died once waited out the master client's deadline
    (5 s by default) here and was killed by `down`."""
    gone = zmq.Context.instance().socket(zmq.ROUTER)  # takes the call and never answers
    port = gone.bind_to_random_port("tcp://127.0.0.1")
    service = ServingService(resolve({}, environ={}))
    subscriber = KvEventSubscriber(f"tcp://127.0.0.1:{port}", service, timeout=5.0).start()
    try:
        assert gone.poll(5000), "the subscriber never asked the master"
        started = time.monotonic()
        subscriber.close()
        assert time.monotonic() - started < 3.0
    finally:
        gone.close(linger=0)
