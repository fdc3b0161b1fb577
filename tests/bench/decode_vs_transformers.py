"""Decode tokens/s of our paged, batched decode beside transformers' generate on the same weights.

    python -m tests.bench.decode_vs_transformers                 # batches 1, 8, 32; a table
    python -m tests.bench.decode_vs_transformers --batch 8 --json

Both sides get the same random model (``ModelConfig.tiny()`` unless told otherwise), exported with
``save_checkpoint`` and loaded by ``LlamaForCausalLM.from_pretrained``, the same prompts (one per
sequence, all ``--prompt-tokens`` long, so transformers needs no padding), the same number of torch
threads, greedy decoding and no end-of-sequence stop, so each side generates exactly
``--new-tokens`` per sequence. Only decoding is timed, step by step: the first new token comes out
of prefill, and each later step adds one token to every sequence. For transformers, a stopping
criterion that stops nothing notes the time as generate appends each token; for us, each
``ModelRunner.decode`` step is timed with its page allocation and argmax. The rate is ``batch``
over the median step of ``--repeats`` runs per side, the two sides taking turns: a step that
another process preempted on a shared machine does not move a median. The generated tokens of
both sides are compared, so a fast wrong answer shows.

transformers is a test-only dependency, which is why this lives under tests/ (pytest does not
collect it; tests/daemons/model/test_decode_benchmark.py runs it at a tiny size).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import LlamaForCausalLM, StoppingCriteria, StoppingCriteriaList

from daemons.model import (BlockManager, KVCache, KVCacheLayout, LlamaModel, ModelConfig, ModelRunner, Sequence,
                           random_model, save_checkpoint)

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Row:
    batch: int
    ours_tokens_per_s: float
    transformers_tokens_per_s: float
    tokens_equal: bool

    @property
    def ratio(self) -> float:
        return self.ours_tokens_per_s / self.transformers_tokens_per_s


def prompts(batch: int, length: int, config: ModelConfig) -> list[list[int]]:
    """BOS and random token ids below EOS, one reproducible prompt per sequence."""
    rng = random.Random(batch)
    return [[config.bos_token_id] + [rng.randrange(config.bos_token_id) for _ in range(length - 1)]
            for _ in range(batch)]


def ours(model: LlamaModel, batch_prompts: list[list[int]], new_tokens: int) -> tuple[list[float], list[list[int]]]:
    """(seconds of each decode step, generated tokens per sequence) of prefill then decode through
    ModelRunner over a paged KV cache: what a decode worker's batcher runs each step, a page for
    each new token included, without the end-of-sequence check."""
    lengths = [len(p) + new_tokens for p in batch_prompts]
    num_blocks = sum(-(-n // BLOCK_SIZE) for n in lengths)
    runner = ModelRunner(model, KVCache(KVCacheLayout.for_model(model.config, BLOCK_SIZE, num_blocks)))
    pages = BlockManager(num_blocks, BLOCK_SIZE)
    seqs = [Sequence.from_prompt(i, p, new_tokens) for i, p in enumerate(batch_prompts)]
    for seq in seqs:
        pages.allocate(seq)
        seq.token_ids.append(int(runner.prefill(seq).argmax()))
    times = [time.perf_counter()]
    for _ in range(new_tokens - 1):
        for seq in seqs:
            pages.allocate(seq)
        for seq, token in zip(seqs, runner.decode(seqs).argmax(dim=-1).tolist()):
            seq.token_ids.append(token)
        times.append(time.perf_counter())
    return _durations(times), [seq.generated for seq in seqs]


class _StepTimes(StoppingCriteria):
    """Never stops anything: notes the time each time generate has appended a token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def theirs(model: LlamaForCausalLM, batch_prompts: list[list[int]],
           new_tokens: int) -> tuple[list[float], list[list[int]]]:
    """(seconds of each decode step, generated tokens per sequence) of transformers' greedy
    generate, from the first token (which prefill produced) on, as generate's own loop sees them."""
    input_ids = torch.tensor(batch_prompts)
    steps = _StepTimes()
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                         max_new_tokens=new_tokens, stopping_criteria=StoppingCriteriaList([steps]))
    if len(steps.times) != new_tokens:
        raise RuntimeError(f"generate took {len(steps.times)} steps for {new_tokens} tokens")
    return _durations(steps.times), out[:, input_ids.shape[1]:].tolist()


def _durations(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


def measure(config: ModelConfig, batches: list[int], prompt_tokens: int, new_tokens: int,
            repeats: int) -> list[Row]:
    model = random_model(config, seed=0)
    with tempfile.TemporaryDirectory() as directory:
        save_checkpoint(model, directory)
        reference = LlamaForCausalLM.from_pretrained(directory, dtype=config.torch_dtype).eval()
    # No stop token on either side: every sequence decodes exactly new_tokens.
    reference.generation_config.eos_token_id = None
    reference.generation_config.pad_token_id = config.eos_token_id
    rows = []
    for batch in batches:
        batch_prompts = prompts(batch, prompt_tokens, config)
        ours(model, batch_prompts, 2)  # warm both up: first calls allocate and pick kernels
        theirs(reference, batch_prompts, 2)
        ours_runs, their_runs = [], []
        for _ in range(repeats):  # alternating, so that both sides see the same background load
            ours_runs.append(ours(model, batch_prompts, new_tokens))
            their_runs.append(theirs(reference, batch_prompts, new_tokens))
        rows.append(Row(batch, batch / _median_step(ours_runs), batch / _median_step(their_runs),
                        all(tokens == their_runs[0][1] for _, tokens in ours_runs + their_runs)))
    return rows


def _median_step(runs: list[tuple[list[float], list[list[int]]]]) -> float:
    return statistics.median(step for steps, _ in runs for step in steps)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64, help="at least 2: the first comes from prefill")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, for both sides")
    parser.add_argument("--layers", type=int, default=ModelConfig.tiny().num_layers)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.new_tokens < 2 or args.prompt_tokens < 1:
        parser.error("--new-tokens must be at least 2 and --prompt-tokens at least 1")
    torch.set_num_threads(args.threads)
    rows = measure(ModelConfig.tiny(layers=args.layers), args.batch, args.prompt_tokens, args.new_tokens,
                   args.repeats)
    if args.json:
        print(json.dumps([{**asdict(row), "ratio": row.ratio} for row in rows]))
    else:
        print(f"decode tokens/s, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, "
              f"{args.threads} thread(s), median step of {args.repeats} runs each")
        print(f"{'batch':>5} {'ours':>10} {'transformers':>13} {'ratio':>6}  tokens equal")
        for row in rows:
            print(f"{row.batch:>5} {row.ours_tokens_per_s:>10.0f} {row.transformers_tokens_per_s:>13.0f} "
                  f"{row.ratio:>6.2f}  {'yes' if row.tokens_equal else 'NO'}")
    return rows


if __name__ == "__main__":
    main()
