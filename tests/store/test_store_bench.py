"""`mooncake bench store`'s cells (store.bench.run_size) against a real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

from store.bench import run_size
from store_cluster import FAST, client_for
from tests.conftest import REPO


class Recording:
    """The store client, with each batch put's keys and each batch remove's keys written down."""

    def __init__(self, client) -> None:
        self.client, self.puts, self.removes = client, [], []

    def batch_put_from(self, keys, *args, **kwargs):
        self.puts.append(list(keys))
        return self.client.batch_put_from(keys, *args, **kwargs)

    def batch_remove(self, keys, **kwargs):
        self.removes.append(list(keys))
        return self.client.batch_remove(keys, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_each_cell_puts_once_untimed_and_removes_it_before_its_timed_puts(mooncake):
    """The timed puts of a cell write pool memory an untimed round wrote just before (on this VM
    a first write into memory idle since the segment's commit costs several ms per 16 MiB), and
    the untimed objects are gone before they start: the cell's pool and figures are its own."""
    mooncake.json("up", env=FAST)
    with client_for(mooncake.workdir) as client:
        segment = client.master.inspect("segments")[0]["segment_id"]
        recording = Recording(client)
        cells = run_size(recording, "remote", segment, 4096, 4, duration=0.2, budget=64 * 4096)
        assert [(c.op, c.mode) for c in cells] == [("put", "single"), ("get", "single"), ("put", "batch"), ("get", "batch")]
        assert all(c.ops > 0 for c in cells)
        for mode in range(2):  # single, then batch: warm-up puts, their removal, the timed puts, their removal
            warm, timed = (sorted(k for keys in recording.puts if keys[0] in group for k in keys)
                           for group in (set(recording.removes[2 * mode]), set(recording.removes[2 * mode + 1])))
            assert warm and timed and not set(warm) & set(timed)
            assert warm == sorted(recording.removes[2 * mode]) and timed == sorted(recording.removes[2 * mode + 1])
        first_timed = recording.puts.index(next(keys for keys in recording.puts if keys[0] in set(recording.removes[1])))
        last_warm = max(i for i, keys in enumerate(recording.puts) if keys[0] in set(recording.removes[0]))
        assert last_warm < first_timed  # the whole untimed round came first
        assert client.master.inspect("segments")[0]["used_bytes"] == 0  # nothing left behind


def test_get_cells_say_how_many_gets_read_through_a_held_lease(mooncake):
    """The gets cycle over the keys the puts wrote: from a key's second get in the single cell
    (its third in the batch cell) the client reads it through the lease of the one before, and
    the cell counts those reads (none with reuse off)."""
    mooncake.json("up", env=FAST)
    for reuse in (True, False):
        with client_for(mooncake.workdir, reuse_read_leases=reuse) as client:
            segment = client.master.inspect("segments")[0]["segment_id"]
            cells = run_size(client, "remote", segment, 4096, 4, duration=0.2, budget=16 * 4096)
            gets = [c for c in cells if c.op == "get"]
            assert all(c.ops > 48 for c in gets)  # every key read three times or more
            if reuse:  # all but the first read of each of the 16 keys; a batch's first two reads
                single, batch = gets
                assert single.lease_reuses == single.ops - 16
                assert 0 < batch.lease_reuses <= batch.ops - 32
            else:
                assert all(c.lease_reuses == 0 for c in gets)


def _busy_loops() -> list[psutil.Process]:
    """The CpuLoad processes (transfer.rpc.bench) on this machine."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if len(cmdline) > 2 and cmdline[1] == "-c" and "os.getppid() == parent" in cmdline[2]:
            found.append(process)
    return found


def test_bench_store_load_runs_busy_loops_beside_its_cells_and_stops_them(mooncake):
    """`--load N`: N CPU-bound processes run while the cells do (the figure of a busy host), each
    row says how many, and none is left once the command ends."""
    before = {p.pid for p in _busy_loops()}
    command = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "bench", "store", "--sizes", "4KiB",
                                "--duration", "0.3", "--budget", "256KiB", "--load", "1", "--json"],
                               cwd=REPO, env=mooncake.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = set()
    try:
        while command.poll() is None:
            seen |= {p.pid for p in _busy_loops()} - before
            time.sleep(0.05)
        out, err = command.communicate(timeout=60)
    finally:
        command.kill()
    assert command.returncode == 0, err.decode()
    rows = json.loads(out)
    assert rows and all(row["load"] == 1 for row in rows)
    assert len(seen) == 1  # one busy loop, seen while the cells ran
    assert not {p.pid for p in _busy_loops()} - before  # and gone with the command
