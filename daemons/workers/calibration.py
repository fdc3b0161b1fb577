"""A worker's start-up profile: what a prefill, a decode step and a prefix pull cost on this machine.

The conductor plans every request with a prefill time model, a decode TBT model and a transfer
model (:mod:`scheduler.predictors`). Their defaults describe a 70B model on 8xA800 nodes; a worker
measures its own at start, in about a second, and sends the figures in its heartbeat
(:class:`daemons.serving.messages.WorkerCalibration`), so the conductor plans with this machine's
costs from the first request and refits them from live samples afterwards.

- Prefill: a few prompts of several lengths, cold and after a cached prefix (the prefix's KV is
  left in the pages from the cold run, exactly as a loaded prefix would be), least squares over
  (input, prefix, seconds). Each shape runs twice and the faster run counts: the first run of a
  shape pays allocator warm-up the live path does not.
- Decode: a few steps at several batch sizes and context lengths, fitted the same way.
- Bytes per token: the served model's KV layout (layers x K,V x KV heads x head dim x dtype).
- Bandwidth: a probe object put on another client's segment (one on another host if any is
  mounted) and read back through the worker's own store client, timed: the path a transfer pulls
  a prefix over (shared memory from a holder on this host, TCP from one on another). This
  measures the engine the live prefill uses, not the NIC's nominal rate: on one host a TCP figure
  would be wrong by the shm/TCP ratio, and across hosts a nominal figure ignores Python's
  per-slice cost. The conductor plans with the slowest figure any worker measured.

On a GPU every timing waits for the kernels queued so far, before the clock starts and before it
is read (:func:`daemons.model.device.synchronize`): a CUDA call returns once its kernel is queued.

Both profiles run on a scratch KV cache of their own (on the model's device), never on the
worker's pages, and stop adding shapes once ``calibration_time`` has passed (the first
``MIN_SHAPES`` always run, so a loaded machine still gets a fit); samples that do not determine
a fit leave the figure out (None), and the conductor keeps what it had. Profiled while the machine is busy (other workers
starting, say), the figures come out pessimistic; the live refits correct them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from collections.abc import Sequence as Samples

import numpy as np

from daemons.model import BlockManager, KVCache, KVCacheLayout, LlamaModel, ModelRunner, Sequence
from daemons.model.device import synchronize
from daemons.serving.messages import WorkerCalibration
from scheduler.predictors import DecodeTbtModel, PrefillTimeModel
from store.client import StoreClient
from transfer.errors import MooncakeError

# (new tokens, prefix tokens) per profiled prompt, cheapest first so a tight budget still gets a
# fit; the prefix is cut to whole blocks (the served path reuses whole blocks only).
PREFILL_SHAPES = ((64, 0), (256, 0), (64, 512), (512, 0), (128, 256), (256, 512))
# (batch, context tokens per sequence) per profiled decode step.
DECODE_SHAPES = ((1, 64), (8, 64), (4, 512), (1, 1024), (8, 1024))
MIN_SHAPES = 3  # what a 3-term least squares needs, however long they take on a loaded machine
BANDWIDTH_PROBE_BYTES = 4 * 2**20


def kv_bytes_per_token(layout: KVCacheLayout) -> int:
    """KV bytes one token occupies over every layer (what a prefix pull moves per token)."""
    return layout.layer_block_bytes * layout.num_layers // layout.block_size


def _scratch_runner(model: LlamaModel, block_size: int, num_blocks: int) -> tuple[ModelRunner, BlockManager]:
    layout = KVCacheLayout.for_model(model.config, block_size, num_blocks)
    return ModelRunner(model, KVCache(layout, device=model.device)), BlockManager(num_blocks, block_size)


def _within_budget(shapes: Samples[tuple[int, int]], budget_s: float, samples: list) -> Iterator[tuple[int, int]]:
    """The shapes to profile, in order, until ``budget_s`` has passed; the first ``MIN_SHAPES``
    (as many ``samples`` as a fit needs) whatever the time."""
    deadline = time.monotonic() + budget_s
    for shape in shapes:
        if len(samples) >= MIN_SHAPES and time.monotonic() > deadline:
            return
        yield shape


def _tokens(count: int, vocab: int, rng: np.random.Generator) -> list[int]:
    return [int(t) for t in rng.integers(0, vocab, count)]


def profile_prefill(model: LlamaModel, block_size: int, budget_s: float,
                    shapes: Samples[tuple[int, int]] = PREFILL_SHAPES) -> list[tuple[int, int, float]]:
    """(input tokens, prefix tokens, seconds) per shape profiled within ``budget_s``."""
    blocks = max(-(-(new + prefix) // block_size) for new, prefix in shapes) + 1
    runner, pages = _scratch_runner(model, block_size, blocks)
    rng = np.random.default_rng(0)
    samples: list[tuple[int, int, float]] = []
    for new, prefix in _within_budget(shapes, budget_s, samples):
        prefix -= prefix % block_size
        prompt = _tokens(new + prefix, model.config.vocab_size, rng)
        seq = Sequence.from_prompt("calibration", prompt, max_tokens=1)
        pages.allocate(seq)
        try:
            if prefix:
                runner.prefill(seq)  # leaves the prefix's KV in the pages, as a loaded prefix would
            best = float("inf")
            for _ in range(2):
                seq.num_kv_tokens = prefix
                synchronize(model.device)
                began = time.perf_counter()
                runner.prefill(seq)
                synchronize(model.device)
                best = min(best, time.perf_counter() - began)
        finally:
            pages.deallocate(seq)
        samples.append((len(prompt), prefix, best))
    return samples


def profile_decode(model: LlamaModel, block_size: int, budget_s: float,
                   shapes: Samples[tuple[int, int]] = DECODE_SHAPES) -> list[tuple[int, int, float]]:
    """(batch, context tokens of the batch, seconds per step) per shape profiled within ``budget_s``.

    The context's KV is whatever the scratch pages hold: a step's cost depends on how much it
    attends over, not on the values."""
    steps = 3
    blocks = max(batch * (context // block_size + 2) for batch, context in shapes)
    runner, pages = _scratch_runner(model, block_size, blocks)
    rng = np.random.default_rng(0)
    samples: list[tuple[int, int, float]] = []
    for batch, context in _within_budget(shapes, budget_s, samples):
        seqs = [Sequence.from_prompt(f"calibration-{i}", _tokens(context, model.config.vocab_size, rng),
                                     max_tokens=steps) for i in range(batch)]
        for seq in seqs:
            pages.allocate(seq, len(seq) + steps)
            seq.num_kv_tokens = len(seq) - 1
        try:
            best = float("inf")
            for _ in range(steps):
                attended = sum(len(seq) for seq in seqs)
                synchronize(model.device)
                began = time.perf_counter()
                logits = runner.decode(seqs)
                synchronize(model.device)
                best = min(best, time.perf_counter() - began)
                for seq, token in zip(seqs, logits.argmax(dim=-1).tolist()):
                    seq.token_ids.append(int(token))  # no EOS handling: only the step's cost counts
        finally:
            for seq in seqs:
                pages.deallocate(seq)
        samples.append((batch, attended, best))
    return samples


def fit_prefill(samples: Samples[tuple[int, int, float]]) -> tuple[float, float, float] | None:
    """The fitted coefficients; None when the samples do not determine the model."""
    try:
        return PrefillTimeModel.fit(samples).coef
    except ValueError:
        return None


def fit_decode(samples: Samples[tuple[int, int, float]]) -> tuple[float, float, float] | None:
    try:
        return DecodeTbtModel.fit(samples).coef
    except ValueError:
        return None


def _farthest_segment(store: StoreClient, nbytes: int) -> str | None:
    """Another client's segment with room for the probe, on another host if there is one: a
    transfer pulls a prefix from another holder, and the slowest such path is the one that
    decides whether pulling beats recomputing. None: let the master place it."""
    try:
        rows = store.master.inspect("segments")
    except MooncakeError:
        return None
    others = [row for row in rows if row["client_id"] != store.client_id and row["free_bytes"] >= nbytes]
    others.sort(key=lambda row: row["host"] == store.engine.host_id)  # other hosts first
    return others[0]["segment_id"] if others else None


def measure_pull_bandwidth(store: StoreClient, nbytes: int = BANDWIDTH_PROBE_BYTES) -> float | None:
    """Bytes per second of the faster of two gets of an ``nbytes`` object put through ``store``;
    None if the store cannot take it (full, or no segment yet). The object is removed after."""
    key = f"calibration-{uuid.uuid4().hex}"
    target = _farthest_segment(store, nbytes)
    try:
        store.put(key, np.zeros(nbytes, dtype=np.uint8), preferred_segments=(target,) if target else ())
    except MooncakeError:
        return None
    try:
        best = float("inf")
        for _ in range(2):
            began = time.perf_counter()
            store.get(key)
            best = min(best, time.perf_counter() - began)
        return nbytes / best
    except MooncakeError:
        return None
    finally:
        try:
            store.remove(key, force=True)
        except MooncakeError:
            pass  # it goes with our lease anyway; a leftover probe is 4 MiB of pool


def calibrate(role: str, model: LlamaModel, layout: KVCacheLayout, budget_s: float,
              store: StoreClient | None = None) -> WorkerCalibration:
    """The figures a worker of ``role`` sends: its KV bytes per token always; a prefill worker its
    prefill coefficients (and, with a ``store``, its pull bandwidth), a decode worker its TBT
    coefficients; nothing profiled when ``budget_s`` is 0."""
    bytes_per_token = kv_bytes_per_token(layout)
    if budget_s <= 0:
        return WorkerCalibration(bytes_per_token)
    if role == "prefill":
        return WorkerCalibration(bytes_per_token,
                                 measure_pull_bandwidth(store) if store is not None else None,
                                 prefill_coef=fit_prefill(profile_prefill(model, layout.block_size, budget_s)))
    return WorkerCalibration(bytes_per_token, tbt_coef=fit_decode(profile_decode(model, layout.block_size, budget_s)))
