"""KV events from a real master daemon, read with a plain ZeroMQ SUB socket as a router would.

The master announces its PUB address (cluster.json, `status --json`); every batch is the
multipart message [topic, 8-byte big-endian sequence, msgpack payload] in vLLM's shape, sequence
numbers go up by one, ``store.kv_snapshot`` agrees with what the events said, and the replay
socket answers as vLLM's does.
"""

from __future__ import annotations

import msgpack
import zmq

from daemons.cluster.store_access import master_of
from store.events.messages import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from store.master_client import MasterClient
from store_cluster import client_for, config_for
from transfer.rpc import curve


def receive(sub: zmq.Socket, count: int) -> list[tuple[int, KVEventBatch]]:
    batches = []
    for _ in range(count):
        assert sub.poll(5000), f"only {len(batches)} of {count} batches came"
        topic, sequence, payload = sub.recv_multipart()
        assert topic == b"" and len(sequence) == 8
        # The raw shape vLLM's msgspec decoder expects: tagged arrays, not maps.
        raw = msgpack.unpackb(payload)
        assert isinstance(raw, list) and isinstance(raw[0], float) and all(isinstance(e, list) for e in raw[1])
        batches.append((int.from_bytes(sequence, "big"), KVEventBatch.decode(payload)))
    return batches


def probe(event) -> bool:
    """A probe put's store, which may still have been on its way when the test caught up."""
    return isinstance(event, BlockStored) and all(h.startswith(b"probe-") for h in event.block_hashes)


def test_a_master_publishes_store_events_in_vllm_shape(mooncake, tmp_path):
    cluster = mooncake.json("up", "--segment-size", "16MiB")
    master = next(d for d in cluster["daemons"] if d["role"] == "master")
    status = mooncake.json("status")
    assert master["kv_events_address"].startswith("tcp://127.0.0.1:")
    assert master["kv_events_address"] in str(status)
    context = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    curve.make_client(sub, mooncake.secret)  # the stream is the cluster's: a SUB needs its secret
    sub.connect(master["kv_events_address"])
    config = config_for(mooncake.workdir)
    store = client_for(mooncake.workdir)
    admin = MasterClient(master_of(config)[0], "test-admin", secret=mooncake.secret)
    try:
        # A SUB joins late (ZeroMQ's slow joiner): put until a batch gets through, then read up
        # to the last batch the master sent.
        for i in range(100):
            store.put(f"probe-{i}", b"x" * 64)
            if sub.poll(100):
                break
        last = receive(sub, 1)[0][0]
        while last < admin.kv_events()["sequence"]:
            ((sequence, _),) = receive(sub, 1)
            assert sequence == last + 1
            last = sequence
        store.put("a", b"x" * 4096)
        store.remove("a")
        store.remove_all(force=True)
        events = []
        while len(events) < 3:  # the master sends what piled up every few ms: 1 to 3 batches
            ((sequence, batch),) = receive(sub, 1)
            assert sequence == last + 1
            last, events = sequence, events + [e for e in batch.events if not probe(e)]
        segment = events[0].medium
        assert events == [BlockStored([b"a"], segment), BlockRemoved([b"a"], segment), AllBlocksCleared()]
        assert segment
        store.put("b", b"y" * 64)
        ((sequence, _),) = receive(sub, 1)
        snapshot = admin.kv_snapshot()
        assert snapshot["sequence"] == sequence and snapshot["blocks"] == [["b", segment]]
        # The replay socket (vLLM's protocol) hands back buffered batches, then the end marker.
        replay = context.socket(zmq.REQ)
        curve.make_client(replay, mooncake.secret)
        replay.connect(master["kv_events_replay_address"])
        replay.send(sequence.to_bytes(8, "big"))
        assert replay.poll(5000)
        seq, payload = replay.recv_multipart()
        assert int.from_bytes(seq, "big") == sequence and KVEventBatch.decode(payload).events[0].block_hashes == [b"b"]
        replay.close(linger=0)
    finally:
        admin.close()
        store.close()
        sub.close(linger=0)
