"""A load generator for fault tests, run as its own process: puts and gets until told to stop.

    python tests/store/storm_main.py WORKDIR NAME SECONDS [PUT_BYTES]

Every value is ``value_for(key)``; a get whose bytes differ is counted as ``wrong`` (the one
number that must stay 0). Errors are counted by name. Prints one JSON line at the end. With
PUT_BYTES it only gets once its puts stored that many bytes, so it cannot fill a small pool
and make the master evict what a test wants to find again.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from store.errors import MooncakeError  # noqa: E402
from store_cluster import client_for, value_for  # noqa: E402


def main(workdir: str, name: str, seconds: float, put_bytes: float = float("inf")) -> int:
    stats: Counter = Counter()
    stored = 0
    written: list[str] = []
    rng = random.Random(name)
    with client_for(workdir, rpc_timeout="1s", transfer_timeout="2s", slice_timeout="500ms") as client:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            i += 1
            try:
                if written and (stored >= put_bytes or rng.random() < 0.5):
                    key = rng.choice(written)
                    data = client.get(key)
                    stats["get_ok" if bytes(data) == value_for(key, len(data)) else "wrong"] += 1
                else:
                    key = f"{name}-{i}"
                    size = rng.choice((4096, 65536, 200_000))
                    client.put(key, value_for(key, size))
                    written.append(key)
                    stored += size
                    stats["put_ok"] += 1
            except MooncakeError as exc:
                stats[exc.name] += 1
    print(json.dumps({"stats": stats, "written": written}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), *map(float, sys.argv[4:5])))
