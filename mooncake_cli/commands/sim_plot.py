"""The PNG of `mooncake sim --plot`: matplotlib is imported only here, and only when asked."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence

import numpy as np


def _label(result) -> str:
    p = result.params
    return f"{p['policy']}/{p['admission']}/thr={p['threshold']}/{p['scope']}"


def write_plot(path: Path, results: Sequence, sweep: list[dict] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    admissions = {r.params["admission"] for r in results}
    top = 1 + (sweep is not None)
    # One full-width row per run for load over time: overlaid, the runs' cycles hide each other.
    loads = list(results) if len(admissions) > 1 else []
    fig = plt.figure(figsize=(12, 4.5 + 2.2 * len(loads)))
    grid = fig.add_gridspec(1 + len(loads), top, height_ratios=[2] + [1] * len(loads))
    ax = fig.add_subplot(grid[0, 0])
    for result in results:
        if result.ttft:
            values = np.sort(np.asarray(result.ttft))
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=_label(result))
    ax.set(xscale="log", xlabel="TTFT (s)", ylabel="fraction of requests", title="TTFT CDF")
    ax.legend(fontsize=7)
    if sweep is not None:
        ax = fig.add_subplot(grid[0, 1])
        finite = [row for row in sweep if row["capacity_tokens"] is not None]
        ax.plot([r["capacity_tokens"] / 1e6 for r in finite], [r["hit_rate"] for r in finite], "o-", label="LRU")
        for row in sweep:
            if row["capacity_tokens"] is None:
                ax.axhline(row["hit_rate"], linestyle="--", color="gray", label="infinite")
        ax.set(xscale="log", xlabel="cache capacity (M tokens)", ylabel="token hit rate",
               title="hit rate against capacity")
        ax.legend(fontsize=7)
    first = None  # the rows share their scales, so one run's swing reads against another's
    for row, result in enumerate(loads, start=1):
        axes = _load_panel(fig.add_subplot(grid[row, :]), result)
        if first is None:
            first = axes
        else:
            axes[0].sharey(first[0])
            axes[1].sharey(first[1])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _load_panel(ax, result) -> tuple:
    """Decode load and prefill load of one run over a window from the middle of the run.

    The window is two minutes: the cycle of plain early rejection lasts a few prefill times, so
    over the whole run it is a smear.
    """
    samples = result.samples
    middle = samples[-1]["t"] / 2 if samples else 0.0
    shown = [s for s in samples if middle - 60 <= s["t"] <= middle + 60]
    times = [s["t"] for s in shown]
    ax.plot(times, [s["decode_load"] for s in shown], color="tab:blue", label="decode TBT/SLO")
    ax.set(ylabel="decode TBT/SLO", title=f"load over time: {_label(result)}")
    ax.set_xlabel("time (s)")
    twin = ax.twinx()
    twin.plot(times, [s["prefill_requests"] for s in shown], color="tab:orange",
              label="prefill requests/instance")
    twin.set_ylabel("prefill requests per instance")
    lines = ax.get_lines() + twin.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], fontsize=7, loc="upper left")
    return ax, twin
