"""`mooncake put/get/rm/exists`: one object in the running cluster's store.

Each command is a library store client for its lifetime (see daemons.store_access): a put moves
the bytes from this process into the replicas' segments, a get moves them back, verified.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from daemons.store_access import connect
from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import EXIT_FAILED, emit, fail, fail_on, stderr
from store.errors import MooncakeError
from transfer.settings import parse_duration

SOFT_PIN_DEFAULT = "default"  # what a bare --soft-pin stands for: the soft_pin_ttl setting


@settings_options("cluster", "rpc", "transfer", "checksum", "soft_pin_ttl", "master", "cluster_id")
def put(
    key: str = typer.Argument(..., help="Object key."),
    source: str = typer.Argument("-", help="File to store, or - for stdin."),
    replicas: Optional[int] = typer.Option(None, "--replicas", min=1,
                                           help="Replicas on distinct segments, best effort [default: the replicas setting]."),
    soft_pin: Optional[str] = typer.Option(
        None, "--soft-pin", is_flag=False, flag_value=SOFT_PIN_DEFAULT, metavar="[=TTL]",
        help="Evict this object last; --soft-pin=30m sets how long (default: --soft-pin-ttl)."),
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
    ttl = None
    if soft_pin not in (None, SOFT_PIN_DEFAULT):
        try:
            ttl = parse_duration(soft_pin)
        except ValueError:
            raise typer.BadParameter(f"--soft-pin={soft_pin!r} is not a duration") from None
    if not data:
        fail("nothing to store: objects must hold at least one byte")
    try:
        with connect(config) as client:
            client.put(key, data, replicas=replicas, soft_pin=soft_pin is not None, soft_pin_ttl=ttl,
                       hard_pin=hard_pin)
    except MooncakeError as exc:
        fail_on(exc)


@settings_options("cluster", "rpc", "transfer", "checksum", "master", "cluster_id")
def get(
    key: str = typer.Argument(..., help="Object key."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write here instead of stdout."),
    *,
    config: Config,
) -> None:
    """Write the object's bytes to stdout (binary-safe) or to -o FILE.

    Exit 1 if there is no such object, its checksum does not match, or its read lease ran out
    before the copy finished."""
    try:
        with connect(config) as client:
            data = client.get(key)
    except MooncakeError as exc:
        fail_on(exc)
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        output.write_bytes(data)


@settings_options("cluster", "rpc", "master", "cluster_id")
def rm(
    key: str = typer.Argument(..., help="Object key."),
    force: bool = typer.Option(False, "--force", help="Remove even while a reader holds a lease."),
    *,
    config: Config,
) -> None:
    """Remove an object.

    Exit 1 if there is none, or a reader holds a lease on it (unless --force)."""
    try:
        with connect(config) as client:
            client.remove(key, force)
    except MooncakeError as exc:
        fail_on(exc)


@settings_options("cluster", "rpc", "master", "cluster_id")
def exists(
    key: str = typer.Argument(..., help="Object key."),
    json_output: bool = typer.Option(False, "--json", help="Print {\"key\", \"exists\"}."),
    *,
    config: Config,
) -> None:
    """Exit 0 if a complete object KEY exists, 1 if not.

    Grants no lease, so probing never keeps an object from being evicted."""
    try:
        with connect(config) as client:
            found = client.exists(key)
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
