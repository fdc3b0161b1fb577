"""The `mooncake` command: a typer app whose subcommands live one per file in commands/."""

from __future__ import annotations

import logging
import sys

import typer

from mooncake_cli.commands import (bench, bench_failover, bench_prefill, bench_sched, bench_serve, bench_store, bench_transfer, cluster, config,
                                   generate, inspect, sim, start, start_role, store, topo)

app = typer.Typer(
    name="mooncake",
    help="Mooncake: KVCache-centric disaggregated LLM serving (transfer engine, KVCache store, "
    "conductor, prefill/decode workers). Exit codes: 0 ok, 1 operation failed, 2 usage error.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

cluster.register(app)
config.register(app)
topo.register(app)
sim.register(app)
store.register(app)
inspect.register(app)
app.command("generate")(generate.generate)
app.add_typer(start.app, name="start")
start_role.register(start.app)
app.add_typer(bench.app, name="bench")
bench.app.command("sched")(bench_sched.sched)
bench.app.command("transfer")(bench_transfer.transfer)
bench.app.command("store")(bench_store.store)
bench.app.command("serve")(bench_serve.serve)
bench.app.command("prefill")(bench_prefill.prefill)
bench.app.command("failover")(bench_failover.failover)


def main() -> None:
    from transfer.errors import MooncakeError
    from mooncake_cli.output import fail_on

    # Commands are quiet by default: library chatter (such as "RDMA unavailable, using TCP" on a
    # host without RDMA) is for the daemons' logs; a command reports through its result or error.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    sys.argv[1:] = store.expand_soft_pin_value(sys.argv[1:])
    try:
        app()
    except MooncakeError as exc:  # anything a command did not render itself
        try:
            fail_on(exc)
        except typer.Exit as exit_:
            raise SystemExit(exit_.exit_code) from None
