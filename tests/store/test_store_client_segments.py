"""A client that owns a segment reads objects from a chosen segment and keeps copies of objects
it already holds in memory (what a prefill worker does with its instance-local KV cache); the
bytes of segments a client can map (its own, another process's on this host) it copies itself,
checking each object's checksum on the way."""

from __future__ import annotations

import mmap

import numpy as np
import xxhash

from daemons.cluster.store_access import connect
from store import segment_copy
from store.errors import ChecksumMismatch, ObjectNotFound
from transfer.batch import OpCode
from store_cluster import FAST, client_for, config_for, value_for

SEGMENT = 1 << 20


def test_read_from_a_chosen_segment_and_copy_from_held_memory(mooncake):
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir) as pool_writer, \
            connect(config_for(mooncake.workdir), segment_size=SEGMENT) as worker:
        mine = worker.owner.segment.segment_id
        pool = next(s["segment_id"] for s in worker.master.inspect("segments") if s["segment_id"] != mine)
        for key in ("a", "b"):
            pool_writer.put(key, value_for(key, 4096), preferred_segments=(pool,), replicas=1)
        memory = np.zeros(3 * 4096, dtype=np.uint8)
        base = worker.register_buffer(memory)
        addresses, sizes = [base, base + 4096], [4096, 4096]

        # Nothing on the worker's own segment yet; any replica (None) is found in the pool.
        results = worker.batch_get_into(["a", "b"], addresses, sizes, segments=[mine, None])
        assert isinstance(results[0], ObjectNotFound) and results[1] == 4096
        assert worker.batch_get_into(["a"], addresses[:1], sizes[:1], segments=[pool]) == [4096]
        assert bytes(memory[:4096]) == value_for("a", 4096)

        # Copies written from the memory it holds: real replicas on its own segment.
        assert worker.batch_copy_from(["a", "b"], addresses, sizes, mine) == [None, None]
        for key in ("a", "b"):
            assert sorted(r.segment_id for r in worker.get_replicas(key).replicas) == sorted([pool, mine])
        memory[:] = 0
        assert worker.batch_get_into(["a", "b"], addresses, sizes, segments=[mine, mine]) == [4096, 4096]
        assert bytes(memory[4096:8192]) == value_for("b", 4096)
        # Again: the replica is there already, nothing to write, still a success.
        assert worker.batch_copy_from(["a"], addresses[:1], sizes[:1], mine) == [None]

        # Memory that differs from the object is never published as its replica.
        pool_writer.put("c", value_for("c", 4096), preferred_segments=(pool,), replicas=1)
        error = worker.batch_copy_from(["c"], [base + 8192], [4096], mine)[0]
        assert isinstance(error, ChecksumMismatch)
        assert [r.segment_id for r in worker.get_replicas("c").replicas] == [pool]
        assert isinstance(worker.batch_copy_from(["missing"], [base], [4096], mine)[0], ObjectNotFound)
        worker.unregister_buffer(base)


def test_a_get_verifies_every_object_against_its_checksum(mooncake):
    """A batch get of objects in the reader's own segment, one bigger than a slice: each comes
    back intact; a byte changed in the segment after the put fails that object alone with
    ChecksumMismatch."""
    mooncake.json("up", env=FAST)
    with connect(config_for(mooncake.workdir), segment_size=8 << 20) as client:
        mine = client.owner.segment.segment_id
        sizes = {"big": (3 << 20) + 4321, "small": 4096, "odd": 70_001}
        values = {key: np.frombuffer(value_for(key, size), dtype=np.uint8) for key, size in sizes.items()}
        for key, value in values.items():
            client.put(key, value, preferred_segments=(mine,), replicas=1)
        sink = np.zeros(sum(sizes.values()), dtype=np.uint8)
        base = client.register_buffer(sink)
        offsets = np.cumsum([0, *sizes.values()])[:-1].tolist()
        addresses = [base + offset for offset in offsets]

        assert client.batch_get_into(list(sizes), addresses, list(sizes.values())) == list(sizes.values())
        for key, offset in zip(sizes, offsets):
            assert np.array_equal(sink[offset:offset + sizes[key]], values[key])

        # Flip the big object's last byte where it lives, in the segment.
        replica = client.get_replicas("big").replicas[0]
        client.owner.buffer[replica.address - client.owner.segment.base + sizes["big"] - 1] ^= 0xFF
        results = client.batch_get_into(list(sizes), addresses, list(sizes.values()))
        assert isinstance(results[0], ChecksumMismatch) and results[1:] == [sizes["small"], sizes["odd"]]
        client.unregister_buffer(base)


def test_objects_in_the_own_segment_are_copied_in_process_even_when_forced_over_tcp(mooncake, monkeypatch):
    """Like the C++ store's memcpy for a local segment: a client reads and writes replicas in
    its own segment by copying, so even with the TCP transport forced it opens no connection to
    itself, for a batch big enough to be shared out among copy threads too; the checksums it
    takes on the way are those a reader verifies."""
    monkeypatch.setattr(segment_copy, "PARALLEL_BYTES", 1 << 20)  # what fits in a test's segment
    mooncake.json("up", env=FAST)
    with connect(config_for(mooncake.workdir, transfer_protocol="tcp"), segment_size=8 << 20) as client:
        mine = client.owner.segment.segment_id
        sizes = {"big": (2 << 20) + 17, "small": 4096, "odd": 300_001}
        values = {key: np.frombuffer(value_for(key, size), dtype=np.uint8) for key, size in sizes.items()}
        memory = np.concatenate(list(values.values()))
        base = client.register_buffer(memory)
        offsets = np.cumsum([0, *sizes.values()])[:-1].tolist()
        addresses = [base + offset for offset in offsets]
        assert client.batch_put_from(list(sizes), addresses, list(sizes.values()),
                                     preferred_segments=(mine,), replicas=1) == [None] * len(sizes)
        assert all(r.segment_id == mine for key in sizes for r in client.get_replicas(key).replicas)

        memory[:] = 0
        assert client.batch_get_into(list(sizes), addresses, list(sizes.values())) == list(sizes.values())
        assert np.array_equal(memory, np.concatenate(list(values.values())))
        with client_for(mooncake.workdir) as reader:  # another client verifies the put's checksums
            assert bytes(reader.get("odd")) == value_for("odd", sizes["odd"])
        tcp = next(t for t in client.engine.transports if t.name == "tcp")
        assert tcp.num_connections() == 0
        client.unregister_buffer(base)


def test_the_own_segment_shows_the_ranges_inside_it_and_none_once_drained(mooncake, monkeypatch):
    """A batch's copies look their ranges up in the segment at once: a range inside it is its
    bytes, one reaching outside it is None (the engine moves it, or reports it), and after a drain
    freed the memory every range is None."""
    mooncake.json("up", env=FAST)
    with connect(config_for(mooncake.workdir), segment_size=SEGMENT) as client:
        owner = client.owner
        base = owner.segment.base
        inside, last, beyond, before = owner.views([base + 64, base + SEGMENT - 8, base + SEGMENT - 8, base - 1],
                                                   [128, 8, 9, 4])
        inside[:] = b"x" * 128
        assert bytes(owner.views([base + 64], [128])[0]) == b"x" * 128
        assert last.nbytes == 8 and beyond is None and before is None
        inside.release()
        last.release()
        monkeypatch.setattr(owner, "drained", True)
        assert owner.views([base, base + 64], [8, 8]) == [None, None]
        monkeypatch.undo()  # drained for real it would not unmount at close


def test_a_get_from_another_processs_segment_verifies_what_it_copied(mooncake, monkeypatch):
    """Objects in a store-client daemon's segment on this host, a batch big enough to be shared
    out among copy threads: read intact; a byte changed there after the put fails that object
    alone with ChecksumMismatch."""
    monkeypatch.setattr(segment_copy, "PARALLEL_BYTES", 1 << 20)  # what fits in a test's segment
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir) as client:
        sizes = {"big": (2 << 20) + 99, "small": 4096, "odd": 70_001}
        values = {key: np.frombuffer(value_for(key, size), dtype=np.uint8) for key, size in sizes.items()}
        memory = np.concatenate(list(values.values()))
        base = client.register_buffer(memory)
        addresses = [base + offset for offset in np.cumsum([0, *sizes.values()])[:-1].tolist()]
        assert client.batch_put_from(list(sizes), addresses, list(sizes.values())) == [None] * len(sizes)

        memory[:] = 0
        assert client.batch_get_into(list(sizes), addresses, list(sizes.values())) == list(sizes.values())
        assert np.array_equal(memory, np.concatenate(list(values.values())))

        replica = client.get_replicas("odd").replicas[0]
        region = client.engine.segment_descriptor(replica.segment_name).find_buffer(replica.address, sizes["odd"])
        with open(f"/dev/shm/{region.shm_name}", "r+b") as segment, \
                mmap.mmap(segment.fileno(), region.length) as mapped:
            mapped[replica.address - region.address + 1234] ^= 0xFF
        results = client.batch_get_into(list(sizes), addresses, list(sizes.values()))
        assert results[0] == sizes["big"] and isinstance(results[2], ChecksumMismatch) and results[1] == 4096
        client.unregister_buffer(base)


def test_a_put_copied_into_two_mapped_segments_is_read_intact_from_either(mooncake):
    """One replica in the writer's own segment, one in another process's: the checksum the put
    took while copying is the one both replicas are verified against."""
    mooncake.json("up", env=FAST)
    with connect(config_for(mooncake.workdir), segment_size=8 << 20) as client:
        mine = client.owner.segment.segment_id
        pool = next(s["segment_id"] for s in client.master.inspect("segments") if s["segment_id"] != mine)
        value = value_for("two", 300_001)
        client.put("two", value, replicas=2)
        assert sorted(r.segment_id for r in client.get_replicas("two").replicas) == sorted([mine, pool])
        memory = np.zeros(len(value), dtype=np.uint8)
        base = client.register_buffer(memory)
        for segment in (mine, pool):
            memory[:] = 0
            assert client.batch_get_into(["two"], [base], [len(value)], segments=[segment]) == [len(value)]
            assert bytes(memory) == value
        client.unregister_buffer(base)


def test_reads_over_tcp_up_to_four_mib_run_on_the_callers_thread(mooncake):
    """A read of a few MiB over TCP needs no engine batch (its connection threads and their
    hand-offs): the engine splits it over two links of the calling thread; writes of more than
    1 MiB still go as a batch."""
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir, transfer_protocol="tcp") as client:
        value = value_for("three", 3 << 20)
        client.put("three", value, replicas=1)
        batches = []
        allocate = client.engine.allocate_batch_id
        client.engine.allocate_batch_id = lambda capacity: batches.append(capacity) or allocate(capacity)
        assert bytes(client.get("three")) == value
        assert batches == []
        client.put("again", value, replicas=1)
        assert batches == [1]


def test_writes_over_tcp_record_the_checksum_of_the_bytes_put_on_every_replica(mooncake):
    """A put the engine moves over TCP is hashed from the writer's memory while the engine
    moves it (a batch of more than 1 MiB) or before (a small one): the checksum the master
    records is xxh3 of the bytes put, once per object however many replicas it has, and a
    get from either replica verifies against it."""
    mooncake.json("up", "--store-clients", "2", env=FAST)
    with client_for(mooncake.workdir, transfer_protocol="tcp") as client:
        values = {"big": value_for("big", (3 << 20) + 4321), "small": value_for("small", 4096)}
        assert client.batch_put(list(values), list(values.values()), replicas=2) == [None, None]
        client.put("alone", values["small"], replicas=2)  # on the calling thread, no batch
        values["alone"] = values["small"]
        for key, value in values.items():
            replicas = client.get_replicas(key)
            assert replicas.checksum == xxhash.xxh3_64_intdigest(value)
            segments = [r.segment_id for r in replicas.replicas]
            assert len(set(segments)) == 2
            memory = np.zeros(len(value), dtype=np.uint8)
            base = client.register_buffer(memory)
            for segment in segments:
                memory[:] = 0
                assert client.batch_get_into([key], [base], [len(value)], segments=[segment]) == [len(value)]
                assert bytes(memory) == value
            client.unregister_buffer(base)


def test_a_batch_read_over_tcp_is_verified_as_each_object_lands(mooncake):
    """Gets the engine moves as one batch over TCP (more than 4 MiB in all): each object is
    hashed once its own bytes are in, while the rest still move, and verified against its
    checksum: every object comes back intact into memory that held other bytes, and one whose
    stored bytes were changed after the put fails alone with ChecksumMismatch."""
    mooncake.json("up", env={**FAST, "MOONCAKE_SEGMENT_SIZE": "16MiB"})
    with client_for(mooncake.workdir, transfer_protocol="tcp") as client:
        values = {f"part-{i}": value_for(f"part-{i}", (1 << 20) + 1000 * i) for i in range(6)}
        assert client.batch_put(list(values), list(values.values())) == [None] * 6
        sizes = [len(v) for v in values.values()]
        sink = np.full(sum(sizes), 0x5A, dtype=np.uint8)
        base = client.register_buffer(sink)
        offsets = np.cumsum([0, *sizes])[:-1].tolist()
        batches = []
        allocate = client.engine.allocate_batch_id
        client.engine.allocate_batch_id = lambda capacity: batches.append(capacity) or allocate(capacity)
        assert client.batch_get_into(list(values), [base + o for o in offsets], sizes) == sizes
        assert batches == [6], "one engine batch moved them"
        for value, offset in zip(values.values(), offsets):
            assert bytes(sink[offset:offset + len(value)]) == value

        # Change one byte of the third object where it is stored, past the store's back.
        replica = client.get_replicas("part-2").replicas[0]
        flipped = np.frombuffer(bytes([values["part-2"][100] ^ 0xFF]), dtype=np.uint8).copy()
        client.register_buffer(flipped)
        assert client.move_ranges(OpCode.WRITE, [(flipped.ctypes.data, replica, 100, 1)]) == [None]
        sink[:] = 0x5A
        results = client.batch_get_into(list(values), [base + o for o in offsets], sizes)
        assert isinstance(results[2], ChecksumMismatch)
        assert results[:2] + results[3:] == sizes[:2] + sizes[3:]
        client.unregister_buffer(base)


def test_a_puts_checksums_taken_beside_the_copy_are_those_a_reader_verifies(mooncake, monkeypatch):
    """A put of objects of a CHUNK or more into the own segment, with a core free: a helper
    hashes their sources while the client copies them; another client reads them back intact,
    each verified against the checksum that put recorded."""
    monkeypatch.setattr(segment_copy.spin.HEADROOM, "free", lambda: True)
    mooncake.json("up", env=FAST)
    with connect(config_for(mooncake.workdir), segment_size=8 << 20) as client:
        mine = client.owner.segment.segment_id
        sizes = {"first": segment_copy.CHUNK + 5, "tiny": 10, "second": segment_copy.CHUNK + 999}
        memory = np.concatenate([np.frombuffer(value_for(key, size), dtype=np.uint8) for key, size in sizes.items()])
        base = client.register_buffer(memory)
        offsets = np.cumsum([0, *sizes.values()])[:-1].tolist()
        assert client.batch_put_from(list(sizes), [base + offset for offset in offsets], list(sizes.values()),
                                     preferred_segments=(mine,), replicas=1) == [None] * len(sizes)
        assert client.mover.copier._pool is not None, "the helper hashed the big objects"
        with client_for(mooncake.workdir) as reader:
            for key, size in sizes.items():
                assert bytes(reader.get(key)) == value_for(key, size)
        client.unregister_buffer(base)
