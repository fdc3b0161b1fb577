"""`mooncake put/get/rm/exists`: one object in the running cluster's store.

put and get are each a library store client for their lifetime (see daemons.cluster.store_access):
a put moves the bytes from this process into the replicas' segments, a get moves them back,
verified. rm and exists only ask the master, so they open no transfer engine.

KEY is a key of the tenant the ``tenant`` setting names (--tenant, MOONCAKE_TENANT; default
``default``): another tenant's object of the same name is never seen.
"""

from __future__ import annotations

import sys
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import EXIT_FAILED, emit, fail, fail_on, stderr
from transfer.errors import MooncakeError

if TYPE_CHECKING:
    from store.client import StoreClient
    from store.master_client import MasterClient


def _connect(config: Config) -> StoreClient:
    """The store client a put or get uses for its lifetime, imported only when one runs: rm,
    exists and `mooncake --help` import this module too, and should not pay for the store's and
    the transfer engine's code."""
    from daemons.cluster.store_access import connect

    return connect(config)


def _connect_master(config: Config) -> MasterClient:
    from daemons.cluster.store_access import connect_master  # here for start-up time, as in _connect

    return connect_master(config, "cli")


def expand_soft_pin_value(argv: list[str]) -> list[str]:
    """``put ... --soft-pin=TTL`` as ``--soft-pin --soft-pin-ttl TTL``, before parsing: a Typer
    option cannot take an optional value, so --soft-pin is a switch and its TTL form is
    rewritten (a bare --soft-pin followed by another option was otherwise read as its value)."""
    if not argv or argv[0] != "put":
        return argv
    expanded: list[str] = []
    for n, arg in enumerate(argv):
        if arg == "--":  # what follows is positional, whatever it looks like
            return expanded + argv[n:]
        if arg.startswith("--soft-pin="):
            expanded += ["--soft-pin", "--soft-pin-ttl", arg.partition("=")[2]]
        else:
            expanded.append(arg)
    return expanded


@settings_options("cluster", "rpc", "transfer", "checksum", "soft_pin_ttl", "master", "cluster_id", "tenant")
def put(
    key: str = typer.Argument(..., help="Object key."),
    source: str = typer.Argument("-", help="File to store, or - for stdin."),
    replicas: int | None = typer.Option(None, "--replicas", min=1,
                                           help="Replicas on distinct segments, best effort [default: the replicas setting]."),
    soft_pin: bool = typer.Option(
        False, "--soft-pin", help="Evict this object last, for --soft-pin-ttl (--soft-pin=30m is the "
        "same as --soft-pin --soft-pin-ttl 30m); without one, for the master's soft_pin_ttl."),
    hard_pin: bool = typer.Option(False, "--hard-pin", help="Never evict this object."),
    *,
    config: Config,
) -> None:
    """Store FILE (or stdin) under KEY.

    Exit 1 if KEY exists (OBJECT_ALREADY_EXISTS; objects are immutable) or no segment has room
    even after eviction (NO_AVAILABLE_HANDLE)."""
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        fail(f"cannot read {source}: {exc.strerror}")
    if not data:
        fail("nothing to store: objects must hold at least one byte")
    # --soft-pin-ttl (flag, env or file) when one was given; else the master applies its own.
    ttl = config.soft_pin_ttl if config.sources.get("soft_pin_ttl", "default") != "default" else None
    try:
        with _connect(config) as client:
            client.put(key, data, replicas=replicas, soft_pin=soft_pin, soft_pin_ttl=ttl, hard_pin=hard_pin)
    except MooncakeError as exc:
        fail_on(exc)


@settings_options("cluster", "rpc", "transfer", "checksum", "master", "cluster_id", "tenant")
def get(
    key: str = typer.Argument(..., help="Object key."),
    # Text, not a Path: typer converts a Path through pydantic, whose import cost this command
    # ~0.12 s of its ~0.3 s (see mooncake_cli.coercion).
    output: str | None = typer.Option(None, "-o", "--output", metavar="FILE", help="Write here instead of stdout."),
    *,
    config: Config,
) -> None:
    """Write the object's bytes to stdout (binary-safe) or to -o FILE.

    Exit 1 if there is no such object, its checksum does not match, or its read lease ran out
    before the copy finished."""
    try:
        with _connect(config) as client:
            data = client.get(key)
    except MooncakeError as exc:
        fail_on(exc)
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        try:
            Path(output).write_bytes(data)
        except OSError as exc:
            fail(f"cannot write {output}: {exc.strerror}")


@settings_options("cluster", "rpc", "master", "cluster_id", "tenant")
def rm(
    key: str = typer.Argument(..., help="Object key."),
    force: bool = typer.Option(False, "--force", help="Remove even while a reader holds a lease."),
    *,
    config: Config,
) -> None:
    """Remove an object.

    Exit 1 if there is none, or a reader holds a lease on it (unless --force)."""
    try:
        with closing(_connect_master(config)) as master:
            master.remove(key, force)
    except MooncakeError as exc:
        fail_on(exc)


@settings_options("cluster", "rpc", "master", "cluster_id", "tenant")
def exists(
    key: str = typer.Argument(..., help="Object key."),
    json_output: bool = typer.Option(False, "--json", help="Print {\"key\", \"exists\"}."),
    *,
    config: Config,
) -> None:
    """Exit 0 if a complete object KEY exists, 1 if not.

    Grants no lease, so probing never keeps an object from being evicted."""
    try:
        with closing(_connect_master(config)) as master:
            found = master.exists(key)
    except MooncakeError as exc:
        fail_on(exc)
    if json_output:
        emit({"key": key, "exists": found}, True, str)
    if not found:
        if not json_output:
            stderr.print(f"no object {key!r}", highlight=False)
        raise typer.Exit(EXIT_FAILED)


def register(root: typer.Typer) -> None:
    root.command("put")(put)
    root.command("get")(get)
    root.command("rm")(rm)
    root.command("exists")(exists)
