"""A library store client for a process outside the cluster (the CLI, benchmarks, tests).

It finds the master through ``<workdir>/cluster.json`` and uses the matrix `up` wrote, so its
transfer engine picks the same paths as the daemons'. A caller that only asks the master
(`mooncake exists`, `rm`) takes :func:`connect_master` and leaves the store client, its
transfer engine and numpy unimported: the CLI pays for every import on each call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daemons.cluster.directory import cluster_info, local_daemon_address
from daemons.cluster.workdir import ClusterPaths, shm_prefix
from store.master_client import MasterClient
from transfer.auth import client_credential
from transfer.settings import Config

if TYPE_CHECKING:
    from store.client import StoreClient


def master_of(config: Config) -> tuple[str, str]:
    """The master to talk to and the cluster id that names our shared memory.

    ``--master`` (an address on another host, or etcd://... to follow the elected leader) wins;
    otherwise the cluster in ``config.workdir``, reached over its unix:// endpoint when it has one
    here, since every put and get waits on that round trip."""
    if config.master:
        return config.master, config.cluster_id
    paths = ClusterPaths.of(config.workdir)
    return local_daemon_address(paths, "master"), cluster_info(paths)["cluster_id"]


def connect_master(config: Config, client_id: str) -> MasterClient:
    """A client of the master :func:`master_of` names, for ops that move no object bytes, acting
    for the tenant of ``config`` like a store client would."""
    return MasterClient(master_of(config)[0], client_id, config.rpc_timeout, config.rpc_busy_poll,
                        secret=client_credential(config), tenant=config.tenant)


def connect(config: Config, segment_size: int = 0) -> StoreClient:
    """A client of the master :func:`master_of` names; with ``segment_size`` it also contributes
    a segment (named with the cluster's shm prefix, so `down` removes it if we die)."""
    master, cluster_id = master_of(config)
    return connect_to(config, master, cluster_id, segment_size=segment_size)


def connect_to(config: Config, master: str, cluster_id: str, segment_size: int = 0,
               client_id: str | None = None) -> StoreClient:
    """A client of the master at ``master``: for a process that `up` starts, before cluster.json
    (written once every daemon is up) exists. ``client_id`` names it to the master (default: a
    random one)."""
    import topology  # with the store client below: see the module's docstring
    from store.client import StoreClient

    paths = ClusterPaths.of(config.workdir)
    matrix = topology.load_matrix(paths.topology_file) if paths.topology_file.exists() else None
    return StoreClient(master, config, segment_size=segment_size, topology=matrix,
                       shm_prefix=shm_prefix(cluster_id), client_id=client_id)
