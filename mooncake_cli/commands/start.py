"""`mooncake start master`: one master daemon, taking the C++ `mooncake_master`'s common flags.

Deployment scripts written for Mooncake run `mooncake_master --rpc_port=50051
--default_kv_lease_ttl=10000 --eviction_high_watermark_ratio=0.9
--enable_http_metadata_server=true --http_metadata_server_port=8080`; the same flags work here
and map onto our settings (lease_ttl, soft_pin_ttl, high_watermark, eviction_ratio,
client_ttl, bind_host). Our own flags (--lease-ttl, ...) work too; the C++ form wins when both
are given. With --enable_http_metadata_server the same process also serves Mooncake's HTTP
metadata protocol (:mod:`transfer.metadata.http_backend`), for transfer engines given
metadata_server="http://host:port/metadata" (:func:`daemons.master.run_master`).

Without --foreground the command starts itself again with --foreground as a background process
through the launcher (pidfile under <workdir>/run, log under <workdir>/logs, like `mooncake up`),
waits until the master answers, and prints its address; `mooncake status` and `mooncake down`
then see it.
"""

from __future__ import annotations


import typer
from typer.core import TyperCommand

from daemons.errors import MetadataServerUnavailable
from mooncake_cli.commands import start_role
from mooncake_cli.commands.start_role import launch, preflight
from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, fail

NAME = "master"
app = typer.Typer(help="Start one daemon in the foreground or as a background process.",
                  no_args_is_help=True)


def _gflag(name: str, help_text: str, **kwargs) -> typer.Option:
    return typer.Option(None, f"--{name}", help=help_text, show_default=False,
                        rich_help_panel="mooncake_master flags", **kwargs)


class _GflagsCommand(TyperCommand):
    """Takes gflags' boolean forms: ``--flag=true`` is ``--flag``, ``--flag=false`` leaves it off
    (click's switches, under typer, refuse a value)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, [a for arg in args for a in _switch(arg)])


def _switch(arg: str) -> list[str]:
    name, sep, value = arg.partition("=")
    if sep and name in BOOL_GFLAGS and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return [name] if value.lower() in ("true", "1", "yes") else []
    return [arg]


BOOL_GFLAGS = {"--enable_http_metadata_server"}


@app.command("master", cls=_GflagsCommand)
@settings_options("cluster", "metrics", "rpc", "store", "ha")
def master(
    foreground: bool = typer.Option(False, "--foreground", help="Run in this process until SIGTERM or Ctrl-C."),
    rpc_port: int | None = _gflag("rpc_port", "Control port (alias --port) (default 50051, as mooncake_master).",
                                     min=0, max=65535),
    port: int | None = _gflag("port", "Deprecated alias of --rpc_port.", min=0, max=65535),
    rpc_address: str | None = _gflag("rpc_address", "Address to bind (sets bind_host)."),
    default_kv_lease_ttl: int | None = _gflag("default_kv_lease_ttl", "Read lease in milliseconds (lease_ttl).", min=0),
    default_kv_soft_pin_ttl: int | None = _gflag("default_kv_soft_pin_ttl", "Soft pin in milliseconds (soft_pin_ttl).", min=0),
    eviction_high_watermark_ratio: float | None = _gflag("eviction_high_watermark_ratio",
                                                            "Usage ratio that starts eviction (high_watermark).", min=0),
    # Named apart from our settings of the same name, whose flags are --eviction-ratio, --client-ttl.
    gflag_eviction_ratio: float | None = _gflag("eviction_ratio", "Share of the pool one eviction frees.",
                                                   min=0, max=1),
    gflag_client_ttl: int | None = _gflag("client_ttl", "Seconds of silence before a store client is dropped.",
                                             min=1),
    enable_http_metadata_server: bool = typer.Option(
        False, "--enable_http_metadata_server", help="Also serve Mooncake's HTTP metadata protocol "
        "(--enable_http_metadata_server or =true).", rich_help_panel="mooncake_master flags"),
    http_metadata_server_port: int = typer.Option(8080, "--http_metadata_server_port",
                                                  help="Port of the HTTP metadata server.", min=0, max=65535,
                                                  rich_help_panel="mooncake_master flags"),
    http_metadata_server_host: str | None = _gflag("http_metadata_server_host",
                                                      "Address of the HTTP metadata server (default: bind_host)."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Start the master daemon, accepting mooncake_master's flags (--rpc_port, --default_kv_lease_ttl,
    --eviction_high_watermark_ratio, --enable_http_metadata_server, ...)."""
    overrides = {name: value for name, value in {
        "bind_host": rpc_address,
        "lease_ttl": f"{default_kv_lease_ttl}ms" if default_kv_lease_ttl is not None else None,
        "soft_pin_ttl": f"{default_kv_soft_pin_ttl}ms" if default_kv_soft_pin_ttl is not None else None,
        "high_watermark": eviction_high_watermark_ratio, "eviction_ratio": gflag_eviction_ratio,
        "client_ttl": gflag_client_ttl}.items() if value is not None}
    config = config.replace(**overrides)
    control_port = next((p for p in (rpc_port, port) if p is not None), 50051)
    http = None
    if enable_http_metadata_server:
        http = (http_metadata_server_host or config.bind_host, http_metadata_server_port)
    paths = preflight(config, "master", NAME)
    if foreground:
        # Imported here, not at the top: every `mooncake` call imports this module to build its
        # parser, and the master brings the store's and the metadata servers' code.
        from daemons.master import run_master

        try:
            raise typer.Exit(run_master(paths, config, NAME, control_port, http))
        except MetadataServerUnavailable as exc:
            fail(exc.message)
    args = ["--rpc_port", str(control_port)]
    if http:
        args += ["--enable_http_metadata_server", "--http_metadata_server_host", http[0],
                 "--http_metadata_server_port", str(http[1])]
    emit(launch(paths, config, "master", NAME, args), json_output,
         lambda record: f"master serving on {record['address']}")


start_role.register(app)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="start")
