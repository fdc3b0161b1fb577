"""The store benchmark's measurements: put and get, single and batch, over the zero-copy API.

Each cell moves values of one size from (or into) memory registered once with the client, the way a
serving engine uses the store (Mooncake's put_from/get_into and their batch forms), so it measures
the store (two master round trips per put, or one through a put reservation as a run of puts of up
to 2 MiB uses (store.reservations; ``put_reservations`` off: two), one per get, the engine's copy)
and not Python allocating buffers. A get of a key the cell read before (single cells; twice before
in the batch cells), the last time less than half a lease before, reads through that get's lease
without a round trip (store.held_leases), as a serving engine re-reading a hot prefix does;
``reuse_read_leases`` off makes each get ask the master. A cell runs for ``duration`` seconds or
until the keys it may use fill ``budget`` bytes, whichever comes first; the gets then read the keys
the puts wrote. Before its timed puts a cell runs the same puts once untimed and removes them, so
the timed ones write pool memory that was written before (as a serving store's is), not memory idle
since the segment was committed. The objects a cell wrote are removed after it, and its put
reservations given back, so every cell starts with the same free pool, and a benchmark of a shared
cluster (``--master``) leaves everyone else's objects alone.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import asdict, dataclass

import numpy as np

from store.client import StoreClient
from store.errors import MooncakeError
from transfer.memory import address_of


@dataclass
class Cell:
    topology: str
    op: str  # put | get
    mode: str  # single | batch
    size: int
    batch: int
    ops: int
    seconds: float
    p50_us: float  # per call: one object (single) or one batch
    p99_us: float
    # Of a get cell's ops, those read through a lease held from an earlier get (no master call).
    lease_reuses: int = 0

    @property
    def gbps(self) -> float:
        return self.ops * self.size / self.seconds / 1e9

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds

    def as_dict(self) -> dict:
        return {**asdict(self), "gbps": self.gbps, "ops_per_s": self.ops_per_s}


def run_size(client: StoreClient, topology: str, segment_id: str, size: int, batch: int,
             duration: float, budget: int) -> list[Cell]:
    """put/get single, then put/get batch, for one value size; leaves the pool as it found it."""
    cells = []
    count = max(1, budget // size)
    per_batch = max(1, min(batch, count))
    source = np.frombuffer(np.random.default_rng(size).bytes(size * per_batch), dtype=np.uint8).copy()
    # Filled, not np.empty: the first write to a fresh page faults, and on a VM that cost (0.1-0.5
    # GB/s) would be measured as the store's get speed (the official store bench pre-faults too).
    sink = np.ones(size * per_batch, dtype=np.uint8)
    client.register_buffer(source)
    client.register_buffer(sink)
    try:
        for mode, n in (("single", 1), ("batch", per_batch)):
            sources = [address_of(source, i * size) for i in range(n)]
            sinks = [address_of(sink, i * size) for i in range(n)]

            # _measure calls this before the loop moves on: it sees this iteration's buffers.
            def put(g: list[str]) -> list:
                return client.batch_put_from(g, sources[:len(g)], [size] * len(g),  # noqa: B023
                                             preferred_segments=(segment_id,))

            # Untimed first: the same puts, removed again, so that the timed ones land in pool
            # memory already written once. On this VM the first write into segment memory left
            # idle since its commit costs 1.5-8 ms per 16 MiB (the host's page handling, no guest
            # fault), which a cell of 16 puts would otherwise report as the store's speed.
            warm = _groups(count, n)
            _, warmed = _measure(warm, duration, put)
            client.batch_remove([key for group in warm[:warmed] for key in group], force=True)
            groups = _groups(count, n)
            put_cell, written = _measure(groups, duration, put)
            cells.append(Cell(topology, "put", mode, size, n, *put_cell))
            readable = groups[:written] or groups[:1]
            reused = client.stats.as_dict()["num_lease_reuses"]
            get_cell, _ = _measure(itertools.islice(itertools.cycle(readable), 10**9), duration,
                                   lambda g: client.batch_get_into(g, sinks[:len(g)], [size] * len(g)))  # noqa: B023
            reused = client.stats.as_dict()["num_lease_reuses"] - reused
            cells.append(Cell(topology, "get", mode, size, n, *get_cell, lease_reuses=reused))
            if not np.array_equal(sink[:size], source[:size]):
                raise AssertionError("a get returned bytes that differ from what was put")
            client.batch_remove([key for group in groups[:written] for key in group], force=True)
            client.release_reservations()
    finally:
        client.unregister_buffer(source)
        client.unregister_buffer(sink)
    return cells


def _groups(count: int, n: int) -> list[list[str]]:
    """Fresh keys for ``count`` objects (whole groups of ``n``), in groups of ``n``."""
    keys = [f"bench-{uuid.uuid4().hex[:8]}-{i}" for i in range(count - count % n)]
    return [keys[i:i + n] for i in range(0, len(keys), n)]


def _measure(groups, duration: float, call) -> tuple[tuple[int, float, float, float], int]:
    """Run ``call`` per group until the groups or the time run out. Raises on any failed item."""
    latencies, ops, calls = [], 0, 0
    start = time.perf_counter()
    end = start + duration
    for group in groups:
        t0 = time.perf_counter()
        results = call(group)
        latencies.append(time.perf_counter() - t0)
        failed = [r for r in results if isinstance(r, MooncakeError)]
        if failed:
            raise failed[0]
        ops += len(group)
        calls += 1
        if t0 >= end:
            break
    seconds = time.perf_counter() - start
    lat = np.array(latencies) * 1e6
    return (ops, seconds, float(np.percentile(lat, 50)), float(np.percentile(lat, 99))), calls
