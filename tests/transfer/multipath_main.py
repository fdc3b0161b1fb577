"""Runs inside a network namespace for test_multipath: `target` serves, `initiator` measures.

The target prints {"name"} and serves until stdin closes. The initiator times a write over one
path, then striped over both, then a striped write during which it takes path 2 down, and
prints the results as JSON.
"""

import json
import subprocess
import sys
import threading
import time

import numpy as np

from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions

MiB = 1 << 20
OPTIONS = EngineOptions(protocol="tcp", slice_size=256 * 1024, streams_per_path=1,
                        slice_timeout=1.0, transfer_timeout=20.0, path_cooldown=60.0)


def target() -> None:
    listen = [("mcb1", "10.77.1.2"), ("mcb2", "10.77.2.2")]
    with TransferEngine(host="10.77.1.2", listen=listen, options=OPTIONS) as engine:
        engine.allocate_shared_buffer(16 * MiB)
        print(json.dumps({"name": engine.name}), flush=True)
        sys.stdin.read()


def timed_write(name: str, nics: list[str], size: int, cut_link_after: float | None = None) -> float:
    listen = [("mca1", "10.77.1.1"), ("mca2", "10.77.2.1")]
    with TransferEngine(host="10.77.1.1", listen=listen, options=OPTIONS,
                        topology={"cpu:0": [nics, []]}) as engine:
        data = np.ones(size, np.uint8)
        source = engine.register_local_memory(data)
        address = engine.segment_descriptor(name).buffers[0].address
        if cut_link_after is not None:
            threading.Timer(cut_link_after, subprocess.run,
                            (["ip", "link", "set", "mca2", "down"],)).start()
        started = time.perf_counter()
        engine.write(name, source, address, size)
        return time.perf_counter() - started


def initiator(name: str) -> None:
    size = 6 * MiB
    result = {
        "one_path_s": timed_write(name, ["mca1"], size),
        "striped_s": timed_write(name, ["mca1", "mca2"], size),
        "failover_s": timed_write(name, ["mca1", "mca2"], 12 * MiB, cut_link_after=0.3),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    target() if sys.argv[1] == "target" else initiator(sys.argv[2])
