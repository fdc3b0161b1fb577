"""Prefill time of a CPP group: X workers that pipeline a long prompt's chunks over their layers.

The conductor plans a group as one prefill instance with this model in place of the single-worker
one. A prompt of at most ``chunk`` new tokens runs on one worker, so it costs what it costs
there. A longer one is cut into chunks; chunk i costs what the single-worker model charges for
those tokens after the ones before them (its attention grows with the context), split evenly
over the stages, and stage k starts chunk i once it finished chunk i-1 and stage k-1 handed it
chunk i (``hop`` seconds for the activations). TTFT is when the last stage ends the last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.predictors import PrefillTimeModel


@dataclass
class CppPrefillTimeModel:
    single: PrefillTimeModel
    stages: int
    chunk: int
    hop: float = 0.0  # seconds to move one chunk's hidden states to the next stage

    def __post_init__(self) -> None:
        if self.stages < 1 or self.chunk < 1:
            raise ValueError(f"a CPP group needs stages >= 1 and chunk >= 1, got {self.stages}, {self.chunk}")

    def predict(self, input_len: int, prefix_len: int) -> float:
        new = max(input_len - prefix_len, 0)
        if self.stages == 1 or new <= self.chunk:
            return self.single.predict(input_len, prefix_len)
        fixed = self.single.coef[0]
        finish = [0.0] * self.stages  # when each stage finished its latest chunk
        done = prefix_len
        while done < input_len:
            end = min(done + self.chunk, input_len)
            share = (self.single.predict(end, done) - fixed) / self.stages
            for k in range(self.stages):
                ready = finish[k - 1] + self.hop if k else 0.0
                finish[k] = max(finish[k], ready) + share
            done = end
        return fixed + finish[-1]


def ttft_curve(single: PrefillTimeModel, group: CppPrefillTimeModel, lengths: list[int]) -> list[dict]:
    """Prefill seconds of a fresh prompt of each length on one worker and on the group."""
    rows = []
    for n in lengths:
        one, cpp = single.predict(n, 0), group.predict(n, 0)
        rows.append({"tokens": n, "single": one, "cpp": cpp, "speedup": one / cpp})
    return rows
