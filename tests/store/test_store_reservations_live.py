"""Put reservations on a live cluster (store.reservations): a run of small puts goes through one
commit each, another client reads exactly what was put (checksums verified), a lone put goes
the plain way, and a reservation lost behind the client's back costs a plain put, not an object."""

from __future__ import annotations

import pytest

from store.errors import ObjectAlreadyExists
from store_cluster import FAST, client_for, value_for


def _counters(client) -> dict:
    return client.master.inspect("counters")


def _used(client) -> int:
    return sum(s["used_bytes"] for s in client.master.inspect("segments"))


def test_a_run_of_puts_commits_through_reservations_and_reads_back(mooncake):
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir) as writer, client_for(mooncake.workdir) as reader:
        before = _counters(writer)
        writer.put("lone", value_for("lone", 4096))
        assert _counters(writer)["num_reservations"] == before["num_reservations"]  # a lone put: plain
        keys = [f"k{i}" for i in range(40)]
        for key in keys[:20]:
            writer.put(key, value_for(key, 4096))
        assert writer.batch_put(keys[20:], [value_for(k, 1000) for k in keys[20:]]) == [None] * 20
        after = _counters(writer)
        assert after["num_reservations"] > before["num_reservations"]
        assert after["num_put_ends"] - before["num_put_ends"] == 41
        assert reader.get("lone") == value_for("lone", 4096)
        assert [bytes(v) for v in reader.batch_get(keys)] == \
            [value_for(k, 4096) for k in keys[:20]] + [value_for(k, 1000) for k in keys[20:]]
        assert reader.get_replicas("k0").checksum is not None  # taken by the writer, verified by the reader
        objects = sum(-(-n // 64) * 64 for n in [4096] * 21 + [1000] * 20)
        assert _used(writer) > objects  # the writer still holds a reservation...
        writer.release_reservations()
        assert _used(writer) == objects  # ...and gives it back


def test_a_reservation_lost_behind_the_clients_back_costs_a_plain_put(mooncake):
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir) as writer, client_for(mooncake.workdir) as reader:
        for key in ("a", "b"):  # the second put asked for a grant and kept the rest of it
            writer.put(key, value_for(key, 4096))
        held = [h.grant.reservation_id for h in writer.reservations._held]
        assert held
        writer.master.reserve_space(0, writer.replicate_config(), held)  # gone at the master
        calls = _count_calls(writer.master, "batch_put_start")
        writer.put("c", value_for("c", 4096))
        assert calls == ["batch_put_start"]  # the commit failed as a whole: put the plain way
        assert reader.get("c") == value_for("c", 4096)
        with pytest.raises(ObjectAlreadyExists):
            writer.put("c", b"again")


def test_with_put_reservations_off_every_put_goes_the_plain_way(mooncake):
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir, put_reservations=False) as writer:
        assert writer.reservations is None
        before = _counters(writer)["num_reservations"]
        calls = _count_calls(writer.master, "batch_put_start")
        for i in range(5):
            writer.put(f"t{i}", value_for(f"t{i}", 4096))
        assert _counters(writer)["num_reservations"] == before and len(calls) == 5


def _count_calls(master, name: str) -> list[str]:
    """A list that grows by ``name`` at each call of that method of ``master`` (a real call)."""
    calls: list[str] = []
    method = getattr(master, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return method(*args, **kwargs)

    setattr(master, name, counted)
    return calls
