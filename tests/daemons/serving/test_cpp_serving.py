"""A CPP prefill group as the prefill instance of a live cluster: `mooncake up` with
--prefill-group-size 2 and one decode worker; greedy tokens equal the one-process reference for
prompts shorter than, an exact multiple of, and longer than the chunk, cold and with a prefix
each stage loads from the store."""

from __future__ import annotations

import os

import psutil
import pytest

from tests.conftest import Mooncake
from tests.daemons.serving.helpers import SERVING_ENV, Reference, complete, prompt

BLOCK, CHUNK = 16, 32


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("cpp-serving") / "cluster")
    runner.env.update({**SERVING_ENV, "MOONCAKE_PREFILL_WORKERS": "1", "MOONCAKE_DECODE_WORKERS": "1",
                       "MOONCAKE_KV_BLOCK_TOKENS": str(BLOCK), "MOONCAKE_PREFILL_CHUNK": str(CHUNK)})
    info = runner.json("up", "--prefill-group-size", "2", timeout=120)
    conductor = next(d for d in info["daemons"] if d["role"] == "conductor")
    yield runner, conductor["http_address"], info
    stages = next(d for d in info["daemons"] if d["role"] == "prefill")["stage_pids"]
    runner("down", timeout=60)
    assert not [pid for pid in stages if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    # The stages' inboxes and staging buffers: freed by the stages themselves on the way out.
    assert not [n for n in os.listdir("/dev/shm") for pid in stages if n.startswith(f"mooncake-te-{pid}-")]


@pytest.fixture(scope="module")
def reference():
    return Reference()


def test_the_group_registers_as_one_prefill_instance(cluster):
    _, _, info = cluster
    prefill = [d for d in info["daemons"] if d["role"] == "prefill"]
    assert len(prefill) == 1 and prefill[0]["group_size"] == 2 and len(prefill[0]["stage_pids"]) == 2


@pytest.mark.parametrize("length", [CHUNK - 7, 2 * CHUNK, 3 * CHUNK + 5])
def test_cold_prompts_match_the_reference(cluster, reference, length):
    _, url, _ = cluster
    tokens = prompt(length, seed=100 + length)
    answer = complete(url, prompt=tokens, max_tokens=6)
    assert answer["choices"][0]["token_ids"] == reference.tokens(tokens, 6)
    assert answer["mooncake"]["prefix_tokens"] == 0


@pytest.mark.parametrize("tail", [CHUNK + 9, 10])  # pipelined after the prefix; stage 0 alone
def test_a_prefix_loaded_by_every_stage_gives_the_same_tokens(cluster, reference, tail):
    _, url, _ = cluster
    shared = prompt(4 * BLOCK + 3, seed=tail)
    complete(url, prompt=shared + prompt(2 * CHUNK, seed=tail + 1)[1:], max_tokens=1)
    second = shared + prompt(tail, seed=tail + 2)[1:]
    answer = complete(url, prompt=second, max_tokens=6)
    assert answer["mooncake"]["prefix_tokens"] == 4 * BLOCK
    assert answer["choices"][0]["token_ids"] == reference.tokens(second, 6)
