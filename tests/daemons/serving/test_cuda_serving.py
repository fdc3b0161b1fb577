"""Serving with the model on a GPU (`mooncake up --model-device cuda:0`), marked gpu: this
repository's CI has no GPU, so these run only through tests/gpu/run_on_gpu.sh on a host with one.

Greedy tokens equal the one-process CPU reference: a P/D cluster (1 prefill + 1 decode worker on
cuda:0) cold and with a prefix loaded from the store into the prefill worker's GPU pages, and a
CPP prefill group of 2 stages on cuda:0 cold over several chunks and with a prefix every stage
loads. Each path moves KV from GPU pages to the store, back, and into the decode worker's
landing pages through the transfer engine's staging, and onto the decode worker's GPU.
"""

from __future__ import annotations

import pytest

from tests.conftest import Mooncake, require_cuda
from tests.daemons.serving.helpers import SERVING_ENV, Reference, complete, prefix_then_tail, prompt

pytestmark = pytest.mark.gpu

BLOCK, CHUNK = 16, 32


def _cluster(tmp_path_factory, name: str, *flags: str):
    require_cuda()
    runner = Mooncake(tmp_path_factory.mktemp(name) / "cluster")
    runner.env.update({**SERVING_ENV, "MOONCAKE_PREFILL_WORKERS": "1", "MOONCAKE_DECODE_WORKERS": "1",
                       "MOONCAKE_KV_BLOCK_TOKENS": str(BLOCK), "MOONCAKE_PREFILL_CHUNK": str(CHUNK)})
    info = runner.json("up", "--model-device", "cuda:0", *flags, timeout=180)
    conductor = next(d for d in info["daemons"] if d["role"] == "conductor")
    return runner, conductor, info


@pytest.fixture(scope="module")
def reference():
    return Reference()  # on the CPU


@pytest.fixture(scope="module")
def pd_cluster(tmp_path_factory):
    runner, conductor, info = _cluster(tmp_path_factory, "cuda-pd")
    yield runner, conductor, info
    runner("down", timeout=60)


@pytest.fixture(scope="module")
def cpp_cluster(tmp_path_factory):
    runner, conductor, info = _cluster(tmp_path_factory, "cuda-cpp", "--prefill-group-size", "2")
    yield runner, conductor, info
    runner("down", timeout=60)


def _prefix_then_tail(cluster, reference: Reference, seed: int, tail: int) -> None:
    runner, conductor, info = cluster
    holder = next(d["name"] for d in info["daemons"] if d["role"] == "prefill")
    prefix_then_tail(runner, conductor["http_address"], conductor["address"], holder, reference, block=BLOCK,
                     seed=seed, head=2 * CHUNK, tail=tail, max_tokens=8)


def test_cuda_pd_cold_prompts_match_the_cpu_reference(pd_cluster, reference):
    url = pd_cluster[1]["http_address"]
    for length in (7, 3 * BLOCK, 150):
        tokens = prompt(length, seed=500 + length)
        answer = complete(url, prompt=tokens, max_tokens=10)
        assert answer["choices"][0]["token_ids"] == reference.tokens(tokens, 10)


def test_cuda_pd_prefix_reuse_through_the_store(pd_cluster, reference):
    _prefix_then_tail(pd_cluster, reference, seed=600, tail=CHUNK + 9)


@pytest.mark.parametrize("length", [CHUNK - 7, 3 * CHUNK + 5])  # stage 0 alone; pipelined
def test_cuda_cpp_cold_prompts_match_the_cpu_reference(cpp_cluster, reference, length):
    url = cpp_cluster[1]["http_address"]
    tokens = prompt(length, seed=700 + length)
    answer = complete(url, prompt=tokens, max_tokens=8)
    assert answer["choices"][0]["token_ids"] == reference.tokens(tokens, 8)


def test_cuda_cpp_prefix_loaded_by_every_stage(cpp_cluster, reference):
    _prefix_then_tail(cpp_cluster, reference, seed=800, tail=CHUNK + 9)
