"""A client reads a key again through the read lease its last get of it was granted, without
asking the master, only while that lease promises the same bytes: the master counts one lease,
the bytes are verified, and whatever moved the bytes sends the reader back to the master."""

from __future__ import annotations

import time

from store.errors import ObjectNotFound
from store.held_leases import HeldLeases
from store.objects import ReplicaDescriptor, ReplicaList, ReplicaTier
from store_cluster import FAST, client_for, value_for


def _leases_granted(client) -> int:
    return client.master.inspect("counters")["num_leases_granted"]


def test_a_single_get_holds_its_lease_from_the_first_read_a_batch_from_the_second(mooncake):
    """A get of one key keeps its lease at once: every later read of that key, within half of
    it, goes without asking the master. A get of several keys only notes each key's first read
    (a scan holds nothing) and holds from the second, so from the third no read asks."""
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir) as client:
        client.put("k", value_for("k", 4096))
        before = _leases_granted(client)
        for _ in range(3):
            assert client.get("k") == value_for("k", 4096)
        assert client.batch_get(["k"]) == [value_for("k", 4096)]
        assert _leases_granted(client) == before + 1
        assert client.stats.as_dict()["num_lease_reuses"] == 3

        client.put("a", value_for("a", 4096))
        client.put("b", value_for("b", 4096))
        before = _leases_granted(client)
        for _ in range(3):
            assert client.batch_get(["a", "b"]) == [value_for("a", 4096), value_for("b", 4096)]
        assert _leases_granted(client) == before + 4
        assert client.stats.as_dict()["num_lease_reuses"] == 3 + 2
        assert client.stats.as_dict()["num_gets"] == 4 + 6


def test_bytes_overwritten_under_a_held_lease_send_the_reader_back_to_the_master(mooncake):
    """Another client removes the object by force (what a lease does not stop) and writes
    other bytes into the same range: the reuse's checksum fails, and the reader gets the key's
    new object from the master instead of an error or the bytes of another object."""
    mooncake.json("up", env=FAST)
    # Plain puts: a put reservation would place the new object in a range of its own.
    with client_for(mooncake.workdir, put_reservations=False) as writer, client_for(mooncake.workdir) as reader:
        writer.put("k", value_for("k", 4096), replicas=1)
        assert reader.get("k") == value_for("k", 4096)  # a single get: held from its first read
        held = reader.held_leases.reusable(["k"], time.monotonic())[0]
        assert held is not None
        writer.remove("k", force=True)
        writer.put("k", value_for("other", 4096), replicas=1)
        # The same range (the allocator reuses the lowest free one): else this test shows nothing.
        assert writer.get_replicas("k").replicas[0].address == held[0].replicas[0].address
        assert reader.get("k") == value_for("other", 4096)
        assert reader.stats.as_dict()["num_lease_reuses"] == 0


def test_the_readers_own_remove_forgets_the_lease(mooncake):
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir) as client:
        client.put("k", value_for("k", 4096))
        client.get("k")
        assert len(client.held_leases) == 1
        client.remove("k", force=True)  # the bytes stay in the segment until reused
        try:
            client.get("k")
        except ObjectNotFound:
            pass
        else:
            raise AssertionError("a removed key was read through a forgotten lease")


def test_a_lease_is_reused_for_half_its_time_and_not_at_all_when_switched_off(mooncake):
    mooncake.json("up", env={**FAST, "MOONCAKE_LEASE_TTL": "600ms"})
    with client_for(mooncake.workdir) as client, \
            client_for(mooncake.workdir, reuse_read_leases=False) as asking:
        client.put("k", value_for("k", 4096))
        before = _leases_granted(client)
        client.get("k")  # held from here
        client.get("k")
        time.sleep(0.35)  # past half of the 600 ms lease
        client.get("k")
        assert _leases_granted(client) == before + 2
        assert client.stats.as_dict()["num_lease_reuses"] == 1
        for _ in range(3):
            asking.get("k")
        assert _leases_granted(client) == before + 5
        assert asking.stats.as_dict()["num_lease_reuses"] == 0


def _replicas(key: str, tier: str = ReplicaTier.MEMORY.value, checksum: int | None = 7,
              promote: bool = False) -> ReplicaList:
    replica = ReplicaDescriptor("seg", "seg", "endpoint", "host", 4096, 4096, tier)
    return ReplicaList(key, 4096, [replica], 10.0, checksum, promote)


def test_only_verified_memory_replicas_read_twice_are_held_and_the_oldest_go_first():
    held = HeldLeases(capacity=2)
    now = 100.0
    held.hold([("disk", _replicas("disk", tier=ReplicaTier.DISK.value), now),
               ("unverified", _replicas("unverified", checksum=None), now),
               ("promoting", _replicas("promoting", promote=True), now)], now)
    assert len(held) == 0
    fresh = [("a", _replicas("a"), now), ("b", _replicas("b"), now + 1), ("c", _replicas("c"), now + 2)]
    held.hold(fresh, now + 2)
    assert len(held) == 0  # a first read of a batch is only noted
    held.hold([("single", _replicas("single"), now)], now, first_read=True)
    assert held.reusable(["single"], now)[0] is not None  # a single get's first read is held
    held.forget(["single"])
    held.hold(fresh, now + 2)
    assert [entry is not None for entry in held.reusable(["a", "b", "c"], now + 2)] == [False, True, True]
    # b was asked for at 101 with a 10 s lease: reusable until 106, not from then on.
    assert held.reusable(["b"], now + 5.9)[0] is not None
    assert held.reusable(["b"], now + 6.0) == [None]
    assert len(held) == 1
