"""Soak check (not collected by pytest): the conductor's cache index over a long live replay.

Starts a single-host cluster whose store segments are small enough that the master evicts
prefix blocks within seconds and whose index bound (``index_max_blocks``) is below what the
segments can hold, replays multi-turn conversations of the paper's conversation trace (scheduler/sim/traces)
in a loop for ``--duration`` seconds, and every ``--every`` seconds compares the conductor's index
(``conductor.index``) with the master's own view (``store.kv_snapshot``):

- ``blocks`` must never exceed ``max_blocks``;
- a block the index lists with a holder should be in the master's snapshot. While requests run,
  the two are read at different instants, so a few blocks evicted between the reads (or stored
  after the snapshot) are counted as ``in_flight``; once the load stops and events settle, the
  count must be exactly 0.

    python tests/soak/index_replay.py --duration 600 --json

Exit status 0 when both hold, 1 otherwise. It stops the cluster on every exit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from daemons.serving.bench import scale
from daemons.serving.client import stream_completion
from daemons.serving.errors import ServingError
from daemons.serving.kv_events import block_of
from scheduler.block_hash import format_key, prefix_block_keys
from scheduler.sim.trace import CONVERSATION_TRACE, load_trace, multi_turn
from transfer.auth import read_secret_file, secret_file
from transfer.rpc.client_server import RpcClient

TRACE = CONVERSATION_TRACE
BLOCK_TOKENS = 32
PAUSE_S = 0.1  # between one loop's requests: the soak checks correctness, it leaves CPU to others
MAX_QUERY = 1024  # conductor.index answers holders for at most this many blocks per call

CLUSTER_ENV = {
    "MOONCAKE_PREFILL_WORKERS": "2", "MOONCAKE_DECODE_WORKERS": "1",
    "MOONCAKE_KV_BLOCK_TOKENS": str(BLOCK_TOKENS), "MOONCAKE_KV_CACHE_SIZE": "16MiB",
    # A block of the default model is 4 layers x 16 KiB: these hold 128 and 2 x 64 blocks, so the
    # master evicts within the first minute and the 150-block index bound is below the 256 blocks
    # the segments can hold together.
    "MOONCAKE_SEGMENT_SIZE": "8MiB", "MOONCAKE_PREFILL_SEGMENT_SIZE": "4MiB",
    "MOONCAKE_INDEX_MAX_BLOCKS": "150", "MOONCAKE_REQUEST_TIMEOUT": "30s",
    "MOONCAKE_START_TIMEOUT": "90s", "MOONCAKE_CALIBRATION_TIME": "1ms",
}


def mooncake(workdir: Path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    env.update(CLUSTER_ENV, MOONCAKE_WORKDIR=str(workdir))
    done = subprocess.run([sys.executable, "-m", "mooncake_cli", *args, "--json"], env=env,
                          capture_output=True, timeout=180, check=False)
    if done.returncode:
        raise SystemExit(f"mooncake {' '.join(args)} failed: {done.stderr.decode()[-2000:]}")
    return json.loads(done.stdout) if done.stdout.strip() else {}


class Replay:
    """Sends the scaled trace's prompts in a loop, two at a time, remembering their block keys."""

    def __init__(self, url: str, hash_seed: int) -> None:
        trace = multi_turn(load_trace(TRACE), min_turns=4)
        self.prompts = [tokens for _, tokens, _ in scale(trace, BLOCK_TOKENS, 16, 2, salt="soak")]
        self.url, self.hash_seed = url, hash_seed
        self.sent = self.failed = 0
        self.recent: dict[str, None] = {}  # block keys of recent prompts, oldest first
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self) -> None:
        with ThreadPoolExecutor(2) as pool:
            for worker in range(2):
                pool.submit(self._loop, worker)

    def _loop(self, worker: int) -> None:
        index = worker
        while not self.stopping.is_set():
            tokens = self.prompts[index % len(self.prompts)]
            index += 2
            time.sleep(PAUSE_S)
            try:
                stream_completion(self.url, {"prompt": tokens, "max_tokens": 2}, 30.0)
            except ServingError:
                with self.lock:
                    self.failed += 1
            keys = [format_key(k) for k in prefix_block_keys(tokens, BLOCK_TOKENS, seed=self.hash_seed)]
            with self.lock:
                self.sent += 1
                for key in keys:
                    self.recent.pop(key, None)
                    self.recent[key] = None
                while len(self.recent) > MAX_QUERY:
                    self.recent.pop(next(iter(self.recent)))

    def recent_blocks(self) -> list[str]:
        with self.lock:
            return list(self.recent)


def compare(conductor: RpcClient, master: RpcClient, blocks: list[str]) -> dict:
    view = conductor.call("conductor.index", {"blocks": blocks})
    held = {format_key(parsed[0]) for key, _ in master.call("store.kv_snapshot")["blocks"]
            if (parsed := block_of(key)) is not None}
    listed = [block for block, holders in view["holders"].items() if holders]
    return {"blocks": view["blocks"], "max_blocks": view["max_blocks"], "dropped": view["dropped"],
            "listed_of_recent": len(listed), "master_blocks": len(held),
            "listed_but_not_held": sum(block not in held for block in listed)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of replay")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between comparisons")
    parser.add_argument("--json", action="store_true", help="print the samples and verdict as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mooncake-soak-") as tmp:
        workdir = Path(tmp) / "cluster"
        info = mooncake(workdir, "up")
        try:
            by_role = {d["role"]: d for d in info["daemons"]}
            secret = read_secret_file(secret_file(workdir))
            conductor = RpcClient(by_role["conductor"]["address"], secret=secret)
            master = RpcClient(by_role["master"]["address"], secret=secret)
            replay = Replay(by_role["conductor"]["http_address"], int(os.environ.get("MOONCAKE_BLOCK_HASH_SEED", "0")))
            driver = threading.Thread(target=replay.run, daemon=True)
            began = time.monotonic()
            driver.start()
            samples = []
            while time.monotonic() - began < args.duration:
                time.sleep(args.every)
                sample = compare(conductor, master, replay.recent_blocks())
                sample.update(t_s=round(time.monotonic() - began, 1), requests=replay.sent, failed=replay.failed)
                samples.append(sample)
                if not args.json:
                    print(sample, flush=True)
            replay.stopping.set()
            driver.join(60)
            time.sleep(3.0)  # the last events reach the conductor
            settled = compare(conductor, master, replay.recent_blocks())
        finally:
            mooncake(workdir, "down")
    over_bound = [s for s in samples if s["blocks"] > s["max_blocks"]]
    verdict = {"ok": not over_bound and settled["listed_but_not_held"] == 0 and settled["blocks"] <= settled["max_blocks"],
               "samples": samples, "settled": settled,
               "max_index_blocks_seen": max((s["blocks"] for s in samples), default=0),
               "max_in_flight_stale": max((s["listed_but_not_held"] for s in samples), default=0)}
    print(json.dumps(verdict, indent=2) if args.json else
          f"settled {settled}; max index blocks {verdict['max_index_blocks_seen']}; ok={verdict['ok']}")
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
