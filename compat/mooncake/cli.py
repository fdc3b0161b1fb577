"""The original wheel's console scripts, over our daemons, in the foreground like its binaries.

    mooncake_master [--rpc_port=50051|--port 50051] [--rpc_address=ADDR] [--default_kv_lease_ttl=MS]
                    [--eviction_high_watermark_ratio=R] [--enable_http_metadata_server[=true]] ...
    mooncake_http_metadata_server [--port 8080] [--host 0.0.0.0]
    mooncake_client [--master_server_address=H:P] [--global_segment_size="4 GB"] [--port=50052] ...

Flags take gflags' forms (``--flag=value``, ``--flag value``, ``-flag``, booleans as ``--flag``
or ``--flag=true|false``). Each script hands the flags our daemon has to ``mooncake start``
(run with ``--foreground``: same process, until SIGTERM or Ctrl-C); the original's tuning flags
that have no counterpart here (thread counts, cluster id, ...) are accepted and
named in one log line; a flag neither knows ends the script with gflags' error and status 1.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

from mooncake._setup_args import parse_size

VERSION = "mooncake-compat 0.1.0 (mooncake-py)"
REAL_CLIENT_PORT = 50052  # the original's mooncake_client listens here for its dummy clients

MASTER_FLAGS = {  # original flag -> our `start master` flag (same meaning)
    "rpc_port": "--rpc_port", "port": "--port", "rpc_address": "--rpc_address",
    "default_kv_lease_ttl": "--default_kv_lease_ttl", "default_kv_soft_pin_ttl": "--default_kv_soft_pin_ttl",
    "eviction_high_watermark_ratio": "--eviction_high_watermark_ratio", "eviction_ratio": "--eviction_ratio",
    "client_ttl": "--client_ttl", "http_metadata_server_port": "--http_metadata_server_port",
    "http_metadata_server_host": "--http_metadata_server_host",
    "metrics_port": "--metrics-port",  # its HTTP server: /metrics, /health, inspection (9003)
}
MASTER_SWITCHES = {"enable_http_metadata_server"}
MASTER_IGNORED = {
    "rpc_thread_num", "max_threads", "rpc_interface", "rpc_conn_timeout_seconds", "rpc_enable_tcp_no_delay",
    "enable_metric_reporting", "cluster_id", "memory_allocator", "allocation_strategy",
    "allow_evict_soft_pinned_objects", "max_kv_soft_pin_ttl", "put_start_discard_timeout_sec",
    "put_start_release_timeout_sec", "enable_metadata_cleanup_on_timeout", "config_path",
    "alsologtostderr", "logtostderr", "v", "minloglevel", "log_dir",
}
CLIENT_IGNORED = {"host", "metadata_server", "device_names", "protocol", "local_buffer_size",
                  "threads", "tenant_id", "enable_offload", "start_offload_rpc_server",
                  "alsologtostderr", "logtostderr", "v", "minloglevel", "log_dir"}
BOOL_IGNORED = {"enable_metric_reporting", "allow_evict_soft_pinned_objects", "enable_metadata_cleanup_on_timeout",
                "alsologtostderr", "logtostderr", "enable_offload", "start_offload_rpc_server",
                "rpc_enable_tcp_no_delay"}


class FlagError(Exception):
    pass


def parse_gflags(argv: list[str], switches: set[str]) -> dict[str, str]:
    """gflags' command line as {name: value}; a switch without a value is "true"."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg in ("-", "--"):
            raise FlagError(f"unexpected argument '{arg}'")
        name, sep, value = arg.lstrip("-").partition("=")
        if not sep:
            if name in switches or (i + 1 < len(argv) and argv[i + 1].startswith("-")) or i + 1 == len(argv):
                value = "true"
            else:
                i += 1
                value = argv[i]
        flags[name] = value
        i += 1
    return flags


def _is_true(value: str) -> bool:
    if value.lower() in ("true", "1", "yes", "t", "y"):
        return True
    if value.lower() in ("false", "0", "no", "f", "n"):
        return False
    raise FlagError(f"illegal value '{value}' for a bool flag")


def master_args(argv: list[str]) -> list[str]:
    """`mooncake start master` arguments for the original's mooncake_master command line."""
    flags = parse_gflags(argv, MASTER_SWITCHES | BOOL_IGNORED)
    args = ["start", "master", "--foreground"]
    ignored = []
    for name, value in flags.items():
        if name in MASTER_FLAGS:
            args += [MASTER_FLAGS[name], value]
        elif name in MASTER_SWITCHES:
            if _is_true(value):
                args.append(f"--{name}")
        elif name in MASTER_IGNORED:
            ignored.append(name)
        else:
            raise FlagError(f"unknown command line flag '{name}'")
    if ignored:
        print(f"mooncake_master: accepted without effect here: {', '.join(sorted(ignored))}", file=sys.stderr)
    return args


def client_args(argv: list[str]) -> list[str]:
    """`mooncake start store-client` arguments for the original's mooncake_client command line."""
    flags = parse_gflags(argv, BOOL_IGNORED)
    master = flags.pop("master_server_address", "127.0.0.1:50051")
    size = parse_size(flags.pop("global_segment_size", "4 GB"), "global_segment_size")
    # The port dummy clients (setup_dummy) are given; here the daemon's control port, which
    # tells them the master.
    port = flags.pop("port", str(REAL_CLIENT_PORT))
    unknown = sorted(set(flags) - CLIENT_IGNORED)
    if unknown:
        raise FlagError(f"unknown command line flag '{unknown[0]}'")
    if flags:
        print(f"mooncake_client: accepted without effect here: {', '.join(sorted(flags))}", file=sys.stderr)
    address = master if master.startswith(("tcp://", "etcd://")) else f"tcp://{master}"
    return ["start", "store-client", "--foreground", "--master", address, "--segment-size", str(size),
            "--port", port]


def _run_mooncake(build: Callable[[list[str]], list[str]], program: str) -> int:
    argv = sys.argv[1:]
    if argv in (["--version"], ["-version"]):
        print(f"{program} {VERSION}")
        return 0
    try:
        args = build(argv)
    except (FlagError, ValueError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    from mooncake_cli.app import main as mooncake  # our CLI; imported only to run it
    sys.argv = ["mooncake", *args]
    try:
        mooncake()
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def master_main() -> int:
    return _run_mooncake(master_args, "mooncake_master")


def client_main() -> int:
    return _run_mooncake(client_args, "mooncake_client")


def http_metadata_server_main() -> int:
    """Mooncake's HTTP metadata protocol (GET|PUT|DELETE /metadata?key=K) until SIGTERM."""
    import argparse
    from transfer.auth import cluster_secret
    from transfer.metadata.http_backend import HttpMetadataServer
    from transfer.settings import resolve

    parser = argparse.ArgumentParser(prog="mooncake_http_metadata_server",
                                     description="HTTP metadata server for Mooncake transfer engines")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    options = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # Like every part of the drop-in, it takes the cluster secret from MOONCAKE_CLUSTER_SECRET
    # (or the file / workdir the settings name): with one, only our engines' requests are served.
    secret = cluster_secret(resolve())
    server = HttpMetadataServer(options.host, options.port, token=secret.http_token if secret else None)
    print(f"HTTP metadata server serving on {server.url}", flush=True)
    try:
        stop.wait()
    finally:
        server.close()
    return 0
