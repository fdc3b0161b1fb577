"""`mooncake drain SEGMENT` against real daemons: two store clients, segment A filled, then drained
while threads put and get; nothing stored before or during the drain is lost or corrupted."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter

from store.errors import MooncakeError, ObjectNotFound
from store_cluster import FAST, client_for, value_for, wait_until

# A lease short enough that the drain's wait for readers is short, long enough for a loaded
# machine's gets to finish within it.
ENV = {**FAST, "MOONCAKE_STORE_CLIENTS": "2", "MOONCAKE_LEASE_TTL": "2s"}
STORM_SECONDS, STORM_THREADS, STORM_BYTES = 4.0, 3, 600_000


def _storm(client, name: str, before: list[str], written: list[str], stats: Counter) -> None:
    """Puts (up to STORM_BYTES), gets of what was stored before or by this thread, and gets of
    keys never written, each checked: right bytes, or a clean miss for a never-written key."""
    rng = random.Random(name)
    stored, end, i = 0, time.monotonic() + STORM_SECONDS, 0
    while time.monotonic() < end:
        i += 1
        roll = rng.random()
        try:
            if roll < 0.1:
                try:
                    client.get(f"{name}-never-{i}")
                    stats["wrong"] += 1
                except ObjectNotFound:
                    stats["clean_miss"] += 1
            elif stored >= STORM_BYTES or roll < 0.6:
                key = rng.choice(before + written)
                data = client.get(key)
                stats["get_ok" if bytes(data) == value_for(key, len(data)) else "wrong"] += 1
            else:
                key = f"{name}-{i}"
                size = rng.choice((4096, 30_000, 65_536))
                client.put(key, value_for(key, size))
                written.append(key)
                stored += size
                stats["put_ok"] += 1
        except MooncakeError as exc:
            stats[exc.name] += 1


def test_drain_under_a_put_get_storm_moves_everything_then_unmounts(mooncake):
    mooncake.json("up", env=ENV)
    with client_for(mooncake.workdir, rpc_timeout="3s") as client:
        a, b = (s["segment_id"] for s in client.master.inspect("segments"))
        only_a = [f"a-{i}" for i in range(40)]
        for key in only_a:
            client.put(key, value_for(key, 50_000), preferred_segments=(a,))
        shared = [f"shared-{i}" for i in range(5)]
        for key in shared:
            client.put(key, value_for(key, 20_000), replicas=2)

        unknown = mooncake("drain", "no-such-segment", "--json", env=ENV)
        assert unknown.returncode == 1 and b"SEGMENT_NOT_FOUND" in unknown.stderr and not unknown.stdout
        # B with 7 MiB taken cannot hold A's 2 MB: refused before anything moved or closed.
        client.put("filler", value_for("filler", 7 << 20), preferred_segments=(b,))
        full = mooncake("drain", a, "--json", env=ENV)
        assert full.returncode == 1 and b"not enough room elsewhere" in full.stderr, full.stderr
        assert b"NO_AVAILABLE_HANDLE" in full.stderr
        assert all(s["drain"] is None for s in client.master.inspect("segments"))
        client.remove("filler")

        before = only_a + shared
        threads, written, stats = [], [[] for _ in range(STORM_THREADS)], Counter()
        for n in range(STORM_THREADS):
            threads.append(threading.Thread(target=_storm, args=(client, f"t{n}", before, written[n], stats)))
            threads[-1].start()
        time.sleep(0.5)  # some of the storm's puts land on A before the drain closes it
        drain = mooncake("drain", a, "--json", env=ENV)
        for thread in threads:
            thread.join(timeout=30)
        assert drain.returncode == 0, drain.stderr.decode()
        report = json.loads(drain.stdout)
        # Every get was right or a clean miss; a get the loaded machine did not finish within its
        # lease is refused (LEASE_EXPIRED), never served.
        assert stats["wrong"] == 0 and stats["put_ok"] > 0 and stats["get_ok"] > 0 and stats["clean_miss"] > 0
        assert set(stats) <= {"put_ok", "get_ok", "clean_miss", "wrong", "LEASE_EXPIRED"}, stats

        assert report["outcome"] == "unmounted" and report["segment_id"] == a
        assert report["moved"] >= len(only_a) and report["bytes_moved"] >= 50_000 * len(only_a)
        assert report["already_replicated"] == len(shared) and report["left"] == [] and report["num_left"] == 0
        # A is gone; everything stored before or during the drain lives on B, byte for byte.
        assert [s["segment_id"] for s in client.master.inspect("segments")] == [b]
        keys = before + [k for w in written for k in w]
        objects = {o["key"]: o for o in client.master.inspect("objects")}
        assert set(keys) <= set(objects)
        assert all([r["segment_id"] for r in objects[k]["replicas"]] == [b] for k in keys)
        for key, data in zip(keys, client.batch_get(keys)):
            assert bytes(data) == value_for(key, objects[key]["size"]), key

    # The drained store client keeps running, healthy, without its segment.
    status = mooncake.json("status", env=ENV)
    drained = [d for d in status["daemons"] if d["details"].get("drained")]
    assert len(drained) == 1 and all(d["healthy"] for d in status["daemons"]), status
    again = mooncake("drain", a, env=ENV)
    assert again.returncode == 1 and b"SEGMENT_NOT_FOUND" in again.stderr


def test_a_drain_that_runs_out_of_room_stops_reports_what_is_left_and_reopens_the_segment(mooncake):
    from store.drain.drainer import Drainer

    mooncake.json("up", env=ENV)
    with client_for(mooncake.workdir, rpc_timeout="3s") as client:
        a, b = (s["segment_id"] for s in client.master.inspect("segments"))
        keys = [f"k{i}" for i in range(6)]
        for key in keys:
            client.put(key, value_for(key, 500_000), preferred_segments=(a,))

        def take_the_room(progress):
            # Once one object moved, a put takes all but 100 kB of B: room the start counted on.
            if progress.moved == 1 and not client.exists("filler"):
                free = next(s for s in client.master.inspect("segments") if s["segment_id"] == b)["largest_free_range"]
                client.put("filler", value_for("filler", free - 100_000), preferred_segments=(b,))

        report = Drainer(client, a, on_progress=take_the_room, unmount_timeout=5.0, in_flight_wait=5.0).run()
        assert (report.outcome, report.num_moved, report.num_left) == ("stopped", 1, 5)
        [(key, reason)] = report.left.items()
        assert "no other segment has 500000 free bytes" in reason
        # Cancelled: A stays mounted with what was not moved, every object reads back right, and
        # A takes puts again from the master's next tick (no lease was dropped there).
        segments = {s["segment_id"]: s for s in client.master.inspect("segments")}
        assert segments[a]["num_replicas"] == 5 and segments[a]["drain"] in ("cancelled", None)
        for key, data in zip(keys, client.batch_get(keys)):
            assert bytes(data) == value_for(key, 500_000)
        wait_until(lambda: all(s["drain"] is None for s in client.master.inspect("segments")))
        client.put("after", b"x", preferred_segments=(a,))
        assert [r["segment_id"] for r in client.master.inspect("key", "after")["replicas"]] == [a]
