"""A transfer engine set up from the settings: the one a store client moves object bytes with,
and the one a decode worker receives KV pages through.

Its segment descriptor is published where ``metadata_backend`` says: the master's metadata
service (the default: the master is the one service a cluster needs), etcd, or nowhere (P2P).
When a topology matrix is given, every NIC it names serves on the cluster's bind address: on a loopback cluster every path is loopback, but path choice still
follows the matrix, and on a real address each NIC is one of the host's paths.
"""

from __future__ import annotations

from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.metadata.client import P2P
from transfer.metadata.etcd_backend import engine_metadata
from transfer.settings import Config


def open_engine(name: str, master_address: str, config: Config, *, topology: dict | None = None,
                shm_prefix: str | None = None) -> TransferEngine:
    listen = None
    if topology:
        nics = dict.fromkeys(nic for tiers in topology.values() for tier in tiers for nic in tier)
        listen = [(nic, config.bind_host) for nic in nics] or None
    overrides = {"shm_prefix": shm_prefix} if shm_prefix else {}
    metadata = engine_metadata(config, master_address)
    if metadata == P2P:
        name = None  # under P2P handshake a segment's name is its engine's host:port
    return TransferEngine(name, metadata=metadata, options=EngineOptions.from_config(config, **overrides),
                          host=config.bind_host, listen=listen, topology=topology or None)
