"""Chunked pipeline-parallel prefill (CPP): a prompt cut into chunks that flow through stages.

Stage k computes chunk i while stage k+1 computes chunk i-1: each stage runs its chunks in
order, takes each chunk's hidden states from the stage before and hands its own to the stage
after. What carries them is a :class:`Link`; here an in-process queue (threads, for tests), in
a prefill group the transfer engine (``daemons.workers.cpp.link``). A stage's attention over earlier
chunks reads their KV from its own pages, so stages exchange nothing but activations.

Every chunk but the last is a whole number of KV blocks, and a stage computes a chunk block by
block (``prefill_layer``), so the KV and hidden states are the same bits as a one-worker prefill.
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol

import torch

from daemons.model.runner import LayerDone
from daemons.model.sequence import Sequence
from daemons.model.stage import StageRunner


class Link(Protocol):
    def send(self, hidden: torch.Tensor) -> None: ...

    def recv(self, num_tokens: int) -> torch.Tensor: ...


def chunk_bounds(start: int, end: int, chunk: int, block_size: int) -> list[tuple[int, int]]:
    """[begin, end) chunks of tokens start..end, each ``chunk`` tokens rounded up to whole blocks
    (so the next chunk begins on a block boundary), the last one shorter."""
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    step = -(-chunk // block_size) * block_size
    return [(a, min(a + step, end)) for a in range(start, end, step)]


def run_stage(runner: StageRunner, seq: Sequence, chunks: list[tuple[int, int]], inbox: Link | None,
              outbox: Link | None, on_layer_done: LayerDone | None = None) -> torch.Tensor | None:
    """This stage's share of one prompt; float32 logits [vocab] of its last token on the last
    stage, None elsewhere. ``inbox`` is None on the first stage, ``outbox`` on the last."""
    hidden = None
    for begin, end in chunks:
        incoming = inbox.recv(end - begin) if inbox is not None else None
        hidden = runner.run_chunk(seq, begin, end, incoming, on_layer_done)
        if outbox is not None:
            outbox.send(hidden)
    seq.num_kv_tokens = chunks[-1][1]
    return runner.stage.logits(hidden[-1:])[0] if runner.stage.is_last else None


class QueueLink:
    """Hidden states between two threads of one process."""

    def __init__(self, timeout: float = 60.0) -> None:
        self._queue: queue.Queue[torch.Tensor] = queue.Queue()
        self.timeout = timeout

    def send(self, hidden: torch.Tensor) -> None:
        self._queue.put(hidden)

    def recv(self, num_tokens: int) -> torch.Tensor:
        hidden = self._queue.get(timeout=self.timeout)
        if hidden.shape[0] != num_tokens:
            raise ValueError(f"expected {num_tokens} hidden states, got {hidden.shape[0]}")
        return hidden


def prefill_in_threads(runners: list[StageRunner], seqs: list[Sequence], chunk: int,
                       on_layer_done: LayerDone | None = None) -> torch.Tensor:
    """One prompt through ``runners`` (stages in order, one thread each; ``seqs[k]`` is the
    prompt with stage k's pages); the logits of its last token."""
    size = runners[0].block_size
    chunks = chunk_bounds(seqs[0].num_kv_tokens, len(seqs[0]), chunk, size)
    links = [QueueLink() for _ in runners[1:]]
    results: list[torch.Tensor | None] = [None] * len(runners)
    errors: list[BaseException] = []

    def stage(k: int) -> None:
        try:
            results[k] = run_stage(runners[k], seqs[k], chunks, links[k - 1] if k else None,
                                   links[k] if k < len(links) else None, on_layer_done)
        except BaseException as exc:  # surfaced in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=stage, args=(k,), name=f"cpp-stage-{k}") for k in range(len(runners))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results[-1]
