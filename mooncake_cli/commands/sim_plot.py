"""The PNG of `mooncake sim --plot`: matplotlib is imported only here, and only when asked."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def _label(result) -> str:
    p = result.params
    return f"{p['policy']}/{p['admission']}/thr={p['threshold']}/{p['scope']}"


def write_plot(path: Path, results: Sequence, sweep: list[dict] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    admissions = {r.params["admission"] for r in results}
    panels = 1 + (sweep is not None) + (len(admissions) > 1)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    axes = list(axes[0])
    ax = axes.pop(0)
    for result in results:
        if result.ttft:
            values = np.sort(np.asarray(result.ttft))
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=_label(result))
    ax.set(xscale="log", xlabel="TTFT (s)", ylabel="fraction of requests", title="TTFT CDF")
    ax.legend(fontsize=7)
    if sweep is not None:
        ax = axes.pop(0)
        finite = [row for row in sweep if row["capacity_tokens"] is not None]
        ax.plot([r["capacity_tokens"] / 1e6 for r in finite], [r["hit_rate"] for r in finite], "o-", label="LRU")
        for row in sweep:
            if row["capacity_tokens"] is None:
                ax.axhline(row["hit_rate"], linestyle="--", color="gray", label="infinite")
        ax.set(xscale="log", xlabel="cache capacity (M tokens)", ylabel="token hit rate",
               title="hit rate against capacity")
        ax.legend(fontsize=7)
    if len(admissions) > 1:
        ax = axes.pop(0)
        for result in results:
            times = [s["t"] for s in result.samples]
            line = ax.plot(times, [s["decode_load"] for s in result.samples], label=f"{_label(result)} decode")
            ax.plot(times, [s["prefill_busy"] for s in result.samples], linestyle=":",
                    color=line[0].get_color(), label=f"{_label(result)} prefill busy")
        ax.set(xlabel="time (s)", ylabel="load (decode TBT/SLO, prefill busy fraction)",
               title="load over time")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
