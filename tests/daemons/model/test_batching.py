"""Continuous batching: sequences joining and leaving between steps decode as they would alone."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from daemons.model import (BlockManager, ContinuousBatcher, KVCache, KVCacheLayout, ModelConfig,
                           ModelRunner, Sequence, generate_reference, random_model)
from tests.daemons.model.conftest import BLOCK, prompt

# The tiny model's weights with byte 233 as EOS: it comes up in one of the scenario's
# continuations, so that request ends at EOS while the others run to max_tokens.
EOS = 233


@pytest.fixture(scope="module")
def model():
    return random_model(replace(ModelConfig.tiny(), eos_token_id=EOS), seed=0)


def _decode_worker(model, num_blocks=64, max_batch_size=64):
    kv = KVCache(KVCacheLayout.for_model(model.config, BLOCK, num_blocks))
    runner, pages = ModelRunner(model, kv), BlockManager(num_blocks, BLOCK)
    return runner, pages, ContinuousBatcher(runner, pages, stop_token_ids={EOS}, max_batch_size=max_batch_size)


def _prefilled(runner, pages, seq_id, tokens, max_tokens):
    seq = Sequence.from_prompt(seq_id, tokens, max_tokens)
    pages.allocate(seq)
    seq.append(int(runner.prefill(seq).argmax()), {EOS})
    return seq


def _run_alone(model, tokens, max_tokens):
    runner, pages, batcher = _decode_worker(model)
    seq = _prefilled(runner, pages, "alone", tokens, max_tokens)
    if not seq.is_finished:
        batcher.add(seq)
    while batcher.num_active:
        batcher.step()
    return seq.generated


def test_eight_sequences_joining_at_different_steps_match_running_alone(model):
    lengths = [3, 16, 21, 33, 8, 47, 12, 30]
    max_tokens = [12, 5, 9, 20, 1, 7, 15, 3]
    joins = [0, 0, 1, 2, 4, 4, 6, 9]  # the step before which each request arrives
    runner, pages, batcher = _decode_worker(model, max_batch_size=6)
    seqs = {}
    step, finished_at = 0, {}
    while len(finished_at) < len(lengths):
        for i, join in enumerate(joins):
            if join == step:
                seqs[i] = _prefilled(runner, pages, i, prompt(lengths[i], seed=100 + i), max_tokens[i])
                if seqs[i].is_finished:  # done at its first token: never decodes
                    pages.deallocate(seqs[i])
                    finished_at[i] = step
                else:
                    batcher.add(seqs[i])
        for event in batcher.step():
            if event.finish_reason:
                finished_at[event.seq_id] = step
        step += 1
    for i, seq in seqs.items():
        assert seq.generated == _run_alone(model, prompt(lengths[i], seed=100 + i), max_tokens[i])
        assert seq.generated == generate_reference(model, prompt(lengths[i], seed=100 + i), max_tokens[i])
        assert len(seq.generated) <= max_tokens[i]
        assert seq.finish_reason == ("stop" if seq.generated[-1] == EOS else "length")
    assert sum(seq.finish_reason == "stop" for seq in seqs.values()) == 1
    # Every request left the batch and gave its pages back.
    assert batcher.num_active == 0 and pages.num_free_blocks == pages.num_blocks
    assert len(set(finished_at.values())) > 1


def test_sequence_that_cannot_grow_ends_and_others_continue(model):
    runner, pages, batcher = _decode_worker(model, num_blocks=3)
    a = _prefilled(runner, pages, "a", prompt(16, seed=1), max_tokens=20)  # full page; needs one more
    b = _prefilled(runner, pages, "b", prompt(10, seed=2), max_tokens=3)
    pages.allocate(Sequence.from_prompt("hog", prompt(16, seed=3), max_tokens=1))
    batcher.add(a)
    batcher.add(b)
    events = batcher.step()
    assert events[0].seq_id == "a" and events[0].token is None and events[0].finish_reason == "kv_cache_full"
    assert [e.seq_id for e in events[1:]] == ["b"]
    assert a.block_table == [] and pages.num_free_blocks == 1


def _decode_together(model, prompts_and_max, kv_fill=None):
    """Prefill every prompt, then decode them all in one batch until each finishes. Every other
    sequence reserves its whole life's pages up front, so its block table runs past its context;
    the others grow a page at a time, interleaving their pages."""
    runner, pages, batcher = _decode_worker(model, num_blocks=96)
    if kv_fill is not None:
        runner.kv_cache.tensor.fill_(kv_fill)
    seqs = []
    for i, (tokens, max_tokens) in enumerate(prompts_and_max):
        seq = _prefilled(runner, pages, i, tokens, max_tokens)
        if i % 2:
            pages.allocate(seq, len(tokens) + max_tokens)
        seqs.append(seq)
        batcher.add(seq)
    steps = 0
    while batcher.num_active:
        batcher.step()
        steps += 1
    return seqs, steps


def test_batch_of_very_different_lengths_decodes_like_each_alone_and_like_the_reference(model):
    # From a lone BOS to nine pages, on and around page boundaries, so one step's keys are padded
    # from 1 to 144 positions and some sequences cross into a new page mid-batch.
    lengths = [1, 130, 16, 17, 2, 47, 64, 15]
    cases = [(prompt(n, seed=200 + n), 10) for n in lengths]
    seqs, steps = _decode_together(model, cases)
    assert steps > 1  # they did decode together, not one at a time
    for seq, (tokens, max_tokens) in zip(seqs, cases):
        assert seq.generated == _run_alone(model, tokens, max_tokens)
        assert seq.generated == generate_reference(model, tokens, max_tokens)


def test_whatever_stale_pages_hold_does_not_reach_other_sequences(model):
    # Padding reads pages past a sequence's own length: another request's old KV, or bytes from
    # anywhere. Even NaN there (masked scores, but 0 * NaN is NaN) must not touch the output.
    cases = [(prompt(n, seed=300 + n), 6) for n in (3, 40, 70)]
    seqs, _ = _decode_together(model, cases, kv_fill=float("nan"))
    for seq, (tokens, max_tokens) in zip(seqs, cases):
        assert seq.generated == generate_reference(model, tokens, max_tokens)


class _HeldForward:
    """A runner whose decode forward waits until the test lets it go, saying when it started."""

    def __init__(self, runner):
        self.runner, self.started, self.go = runner, threading.Event(), threading.Event()

    def decode(self, batch):
        self.started.set()
        assert self.go.wait(10)
        return self.runner.decode(batch)


def test_a_step_releases_the_workers_lock_during_the_forward_and_frees_a_cancelled_sequence_after_it(model):
    # On a decode worker, decode.reserve and decode.start take the lock the step loop holds:
    # held through the forward, every request's TTFT waited out a decode step, twice.
    runner, pages, batcher = _decode_worker(model, num_blocks=8)
    held = batcher.runner = _HeldForward(runner)
    a = _prefilled(runner, pages, "a", prompt(10, seed=1), max_tokens=5)
    b = _prefilled(runner, pages, "b", prompt(12, seed=2), max_tokens=5)
    batcher.add(a)
    batcher.add(b)
    lock = threading.Condition()
    events = []

    def loop_step():
        with lock:
            events.extend(batcher.step(lock=lock))

    stepping = threading.Thread(target=loop_step)
    stepping.start()
    try:
        assert held.started.wait(10)
        # While the forward runs: the lock is free, and a cancel takes "a" out of the batch...
        assert lock.acquire(timeout=10), "the step held its caller's lock through the forward"
        try:
            free_before = pages.num_free_blocks
            assert batcher.cancel("a")
            # ... but its pages, which the forward still writes, stay taken until it is done.
            assert pages.num_free_blocks == free_before and a.block_table
        finally:
            lock.release()
    finally:
        held.go.set()
        stepping.join(10)
    assert [e.seq_id for e in events] == ["b"]  # no token for the cancelled sequence
    assert a.block_table == [] and len(a.generated) == 1  # its first token (the prefill's) only
    assert batcher.num_running == 1 and pages.num_free_blocks == pages.num_blocks - len(b.block_table)
