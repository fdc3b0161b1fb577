"""`mooncake bench prefill`: TTFT of chunked pipeline-parallel prefill against prompt length, as
the served path sees it (the first token known and the KV in decode's pages), and what storing KV
layer by layer costs against storing it after the last layer."""

from __future__ import annotations

import random
import tempfile

import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, stderr

# A store mode per prefill of a cell: "layer" puts each layer's blocks while the next computes,
# "end" puts them all after the last layer (what a worker without layer-wise storing does).
MODES = ("layer", "end")


@settings_options("cluster", "model", "prefill_chunk", "kv_block_tokens", "transfer_protocol")
def prefill(
    lengths: str = typer.Option("2048,8192,32768", help="Comma-separated prompt lengths in tokens."),
    stages: str = typer.Option("1,2", help="Comma-separated group sizes (1: one worker, no pipeline)."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """TTFT per prompt length and group size, one torch thread per stage process.

    Starts a store-only cluster in a scratch directory; every prefill puts its KV there and
    writes it, layer by layer as each is computed, into pages registered in this process that
    stand in for a decode worker's. For each cell a fresh prompt is prefilled twice: storing
    layer by layer ("layer") and after the last layer ("end"). TTFT is when the last stage has
    the logits and every stage's layers are in the decode pages, as the served path reports it:
    it never includes store puts. "store tail" is the time from the last layer sent to the last
    put acknowledged. Prompts longer than prefill_chunk are pipelined.
    """
    # Imported here, not at the top: every `mooncake` call imports this module to build its
    # parser, and the prefill group brings torch.
    from daemons import supervisor
    from daemons.cluster.store_access import master_of
    from daemons.cluster.workdir import ClusterPaths, shm_prefix
    from daemons.workers.cpp.group import PrefillGroup
    from daemons.workers.kv_sender import PageSink
    from mooncake_cli.commands.start_role import check_model_device
    from transfer.from_settings import open_engine

    check_model_device(config)  # the stages run the model there
    sizes = [int(v) for v in lengths.split(",")]
    groups = [int(v) for v in stages.split(",")]
    kv_bytes = 2 * config.model_layers * config.model_kv_heads * (config.model_hidden_size // config.model_heads) * 4
    needed = (max(sizes) + config.kv_block_tokens) * kv_bytes
    rng = random.Random(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as scratch:
        config = config.replace(workdir=scratch, prefill_workers="0", decode_workers="0",
                                kv_cache_size=str(max(config.kv_cache_size, needed)),
                                segment_size=str(4 * needed * len(groups)))
        supervisor.up(config)
        block, decode = config.kv_block_tokens, None
        try:
            master, cluster_id = master_of(config)
            decode = open_engine("bench-decode", master, config, shm_prefix=shm_prefix(cluster_id))
            sink = PageSink(decode, -(-max(sizes) // block), block * kv_bytes)
            for group_size in groups:
                with PrefillGroup(config, group_size, with_store=True) as group:
                    for n in sizes:
                        row = {"stages": group_size, "tokens": n}
                        for mode in MODES:  # a fresh prompt each time, so no put finds its key taken
                            tokens = [256] + [rng.randrange(256) for _ in range(n - 1)]
                            result = group.prefill(tokens, store=mode, decode=sink.target(-(-n // block)),
                                                   timeout=3600)
                            row[mode] = {"ttft": result["ttft"], "done": result["done"],
                                         "store_tail": max(s["store_tail"] for s in result["stages"]),
                                         "pipelined": result["pipelined"]}
                        stderr.print(f"{group_size} stage(s), {n} tokens: TTFT {row['layer']['ttft']:.2f}s")
                        rows.append(row)
        finally:
            if decode is not None:
                decode.close()
            supervisor.down(ClusterPaths.of(config.workdir), config.stop_grace)

    def render(data: list[dict]) -> Table:
        table = Table("stages", "tokens", "TTFT s", "done s", "store tail s", "TTFT s (end)", "done s (end)",
                      "store tail s (end)",
                      title=f"mooncake bench prefill ({config.model_layers} layers, hidden {config.model_hidden_size}, "
                            f"chunk {config.prefill_chunk}); TTFT: logits and KV in decode's pages; storing layer by layer, "
                            f"then after the last layer")
        for r in data:
            layer, end = r["layer"], r["end"]
            table.add_row(str(r["stages"]), f"{r['tokens']:,}", f"{layer['ttft']:.2f}", f"{layer['done']:.2f}",
                          f"{layer['store_tail']:.3f}", f"{end['ttft']:.2f}", f"{end['done']:.2f}",
                          f"{end['store_tail']:.3f}")
        return table

    emit(rows, json_output, render)


__all__ = ["prefill"]
