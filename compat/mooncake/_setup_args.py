"""The original's setup arguments, checked and turned into ours.

Sizes: an integer, or a string "16MB", "1 GiB", "512kb" where every unit is binary (Mooncake
reads MB as MiB); anything else ("50%") is refused. Hostnames: "host" or "host:port"; without a
port the store holds one free port of [12300, 14300] (``MC_STORE_CLIENT_MIN/MAX_PORT``) for its
life, so two stores on a host never take the same name. Protocols: "tcp" and "rdma".
"""

from __future__ import annotations

import os
import socket

from mooncake._codes import INVALID_PARAMS
from transfer.settings import parse_size as project_parse_size

# A second live store set up with a "host:port" already in use gets the client id "host:port#2".
CLIENT_ID_SEPARATOR = "#"
METADATA_SCHEMES = ("http://", "https://", "etcd://", "redis://", "tcp://")
P2P = "P2PHANDSHAKE"


class SetupError(ValueError):
    """An argument the original would refuse; setup returns ``code``."""

    code = INVALID_PARAMS


def parse_size(value: int | str, what: str) -> int:
    """Bytes for an int or a string such as "16MB" or "1 GiB": the project's one size grammar,
    every unit binary as in the original."""
    try:
        return project_parse_size(value)
    except ValueError:
        raise SetupError(f"{what}: {value!r} is not a size such as 4096, 16MB or 1 GiB") from None


def hostname_of(client_id: str) -> str:
    """The "host:port" a client id stands for."""
    return client_id.partition(CLIENT_ID_SEPARATOR)[0]


def engine_protocol(protocol: str) -> str:
    """Our engine's protocol for the original's. "tcp" keeps shared memory for same-host peers,
    as the original copies with memcpy when both ends are local."""
    if protocol == "tcp":
        return "auto"
    if protocol == "rdma":
        return "rdma"
    raise SetupError(f"protocol {protocol!r} is not supported here (tcp or rdma)")


def check_metadata_server(metadata_server: str) -> str:
    if metadata_server == P2P or metadata_server.startswith(METADATA_SCHEMES):
        return metadata_server
    host, sep, port = metadata_server.rpartition(":")
    if sep and host and port.isdigit():
        return f"etcd://{metadata_server}"  # the original reads a bare host:port as etcd
    raise SetupError(f"metadata server {metadata_server!r}: expected P2PHANDSHAKE, "
                     "http://host:port/metadata, etcd://host:port or redis://host:port")


def master_address(address: str) -> str:
    """Our master's control address for the original's "host:port"."""
    if address.startswith("tcp://"):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SetupError(f"master address {address!r}: expected host:port")
    return f"tcp://{host}:{port}"


def split_hostname(hostname: str) -> tuple[str, int | None]:
    host, sep, port = hostname.rpartition(":")
    if sep and port.isdigit() and host:
        return host, int(port)
    if not hostname:
        raise SetupError("local_hostname is empty")
    return hostname, None


def bind_address(host: str) -> str:
    """The IP our engine binds for a hostname (ZeroMQ binds addresses, not names)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise SetupError(f"local_hostname {host!r} does not resolve") from None


def reserve_port(ip: str) -> socket.socket:
    """A socket bound to a free port of the store's range; closing it frees the port."""
    low = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", 12300))
    high = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", 14300))
    for port in range(low, high + 1):
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            holder.bind((ip, port))
            return holder
        except OSError:
            holder.close()
    raise SetupError(f"no free port in [{low}, {high}] on {ip}")
