"""`mooncake generate`: one completion through the running cluster's conductor, P/D disaggregated.

The conductor's HTTP address and KV block size (which --demo sizes its shared prefix by) come from
the cluster in the workdir, or, with ``--master`` (an address or etcd://...), from the master it
registered with, for a conductor on another host.
"""

from __future__ import annotations


import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import EXIT_USAGE, JSON_HELP, emit, fail, fail_on, stdout
from transfer.errors import MooncakeError

DEMO_SENTENCE = "Mooncake keeps the KVCache of every prompt prefix in a pool shared by all prefill nodes. "


def _demo_prompts(block: int) -> list[str]:
    """Two prompts sharing a prefix of several KV blocks of ``block`` tokens, the cluster's own."""
    prefix = (DEMO_SENTENCE * (1 + (3 * block + block // 2) // len(DEMO_SENTENCE)))[:3 * block + block // 2]
    return [prefix + "Question one: what is stored?", prefix + "Question two: who reads it?"]


def _row(result: dict) -> dict:
    info = result["mooncake"]
    return {"text": result["text"], "token_ids": result["token_ids"], "finish_reason": result["finish_reason"],
            "ttft_s": info.get("ttft_s"), "tbt_s": info.get("tbt_s"), "prompt_tokens": info.get("prompt_tokens"),
            "prefix_tokens": info.get("prefix_tokens"), "prefill": info.get("prefill"),
            "decode": info.get("decode"), "reason": info.get("reason"), "request_id": info.get("request_id")}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


@settings_options("cluster", "request_timeout", "rpc_timeout", "master")
def generate(
    prompt: str | None = typer.Argument(None, help="The prompt text."),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1, help="Tokens to generate at most."),
    demo: bool = typer.Option(False, "--demo", help="Send two prompts sharing a long prefix instead "
                              "and show the second one reusing it from the store (lower TTFT)."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Generate a greedy completion of PROMPT through the conductor and its P/D workers.

    Shows the text with its TTFT, mean TBT, the prefix tokens reused from the KVCache store, and
    which prefill and decode workers served it."""
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from daemons.serving.client import find_conductor, stream_completion

    if demo == (prompt is not None):
        fail("give a PROMPT or --demo (not both)", EXIT_USAGE)
    try:
        conductor = find_conductor(config)
        prompts = _demo_prompts(conductor["kv_block_tokens"]) if demo else [prompt]
        rows = []
        for text in prompts:
            done = stream_completion(conductor["http_address"], {"prompt": text, "max_tokens": max_tokens},
                                     config.request_timeout)
            rows.append(_row(done.__dict__))
    except MooncakeError as exc:
        fail_on(exc)

    def render(data: list[dict]) -> Table:
        table = Table("prompt", "TTFT ms", "TBT ms", "prompt tokens", "reused", "prefill", "decode", "text",
                      title="mooncake generate (P/D disaggregated, greedy)")
        for n, r in enumerate(data, 1):
            table.add_row(str(n), _ms(r["ttft_s"]), _ms(r["tbt_s"]), str(r["prompt_tokens"]),
                          str(r["prefix_tokens"]), r["prefill"], r["decode"], repr(r["text"]))
        return table

    if json_output:
        emit(rows if demo else rows[0], True, str)
        return
    emit(rows, False, render)
    if demo and rows[0]["ttft_s"] and rows[1]["ttft_s"]:
        stdout.print(f"the second prompt reused {rows[1]['prefix_tokens']} prefix tokens from the store: "
                     f"TTFT {_ms(rows[0]['ttft_s'])} ms -> {_ms(rows[1]['ttft_s'])} ms", highlight=False)


def register(root: typer.Typer) -> None:
    root.command("generate")(generate)


__all__ = ["generate", "register"]
