"""A real two-process CPP prefill group (activations through the transfer engine) against one
worker in this process: the same logits bit for bit, the same KV of every layer, and no
shared-memory region left behind; a stage that misses the job's timeout keeps the job running
until it answered. One group serves the module (its stages take seconds to start)."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
import torch

from daemons.model import BlockManager, KVCache, ModelRunner, Sequence, build_model, kv_layout
from daemons.workers.cpp.group import PrefillGroup, StageFailed
from tests.daemons.model.conftest import prompt
from transfer.settings import resolve

BLOCK, CHUNK = 16, 32


@pytest.fixture(scope="module")
def config():
    return resolve().replace(prefill_chunk=str(CHUNK), kv_block_tokens=str(BLOCK), kv_cache_size="2MiB")


def _regions_of(pids: list[int]) -> list[str]:
    """Shared-memory regions the stage processes made (named mooncake-te-<pid>-...); other
    people's tests may hold regions of their own meanwhile."""
    return [name for name in os.listdir("/dev/shm") for pid in pids if name.startswith(f"mooncake-te-{pid}-")]


def _single_worker(config, tokens):
    torch.set_num_threads(1)
    model = build_model(config)
    kv = KVCache(kv_layout(config, model))
    seq = Sequence.from_prompt("one", tokens, max_tokens=1)
    BlockManager(kv.layout.num_blocks, BLOCK).allocate(seq)
    logits = ModelRunner(model, kv).prefill(seq)
    return logits.numpy(), {layer: [kv.export_block(p, layer) for p in seq.block_table]
                            for layer in range(model.config.num_layers)}


@pytest.fixture(scope="module")
def group(config):
    group = PrefillGroup(config, 2)
    pids = [proc.pid for proc in group.procs]
    try:
        assert _regions_of(pids)  # inboxes and staging buffers, registered with the engines
        yield group
    finally:
        group.close()
    assert all(proc.exitcode == 0 for proc in group.procs)
    assert not _regions_of(pids)


def test_two_stage_group_equals_single_worker(config, group):
    # Shorter than a chunk (stage 0 alone), an exact multiple of it, longer with a tail.
    for length in (CHUNK - 7, 2 * CHUNK, 3 * CHUNK + 5):
        tokens = prompt(length, seed=length)
        expected_logits, expected_kv = _single_worker(config, tokens)
        result = group.prefill(tokens, want_kv=True)
        assert result["pipelined"] == (length > CHUNK)
        assert np.array_equal(result["logits"], expected_logits)
        assert result["first_token"] == int(expected_logits.argmax())
        kv = {}
        for answer in result["stages"]:
            kv.update(answer["kv"])
        assert kv == expected_kv


def test_a_stage_past_the_timeout_keeps_the_job_running_until_it_answers(config, group):
    """Until a stage answers it may still write into the decode worker's pages, so the group
    must not return (the job queue would call the job finished and prefill.drop would say
    "dropped"); once it answered the job fails, and the next job's answers are its own."""
    tokens = prompt(CHUNK - 7, seed=1)  # stage 0 alone
    stage = group.procs[0]
    outcome: dict[str, BaseException | dict] = {}

    def run() -> None:
        try:
            outcome["result"] = group.prefill(tokens, timeout=0.2)
        except BaseException as exc:
            outcome["error"] = exc

    os.kill(stage.pid, signal.SIGSTOP)  # a stage that overruns: alive, silent
    waiter = threading.Thread(target=run)
    try:
        waiter.start()
        waiter.join(timeout=2.0)  # ten times the timeout: the old group had given up by then
        assert waiter.is_alive() and not outcome
    finally:
        os.kill(stage.pid, signal.SIGCONT)
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert isinstance(outcome.get("error"), StageFailed) and "timeout" in str(outcome["error"])
    expected_logits, _ = _single_worker(config, tokens)
    # The late answer went to the failed job: this one's answers are its own.
    assert np.array_equal(group.prefill(tokens, timeout=60)["logits"], expected_logits)
