"""Segment descriptors held in etcd (``metadata_backend = etcd``): engines find peers without a master.

Each engine's descriptor is the JSON of :meth:`SegmentDescriptor.to_wire` under
``mooncake/<cluster_id>/segments/<name>``. Its version is the etcd revision of the put that
wrote it, so, as with the master's table (:mod:`transfer.metadata.table`), a restarted peer's
new incarnation replaces the old descriptor under a higher version. A withdraw deletes the key
only if it still holds this incarnation, in one transaction guarded on the revision it read,
so a late withdraw from a dead process never deletes its successor's descriptor.
"""

from __future__ import annotations

import json

from transfer.descriptor import SegmentDescriptor
from transfer.errors import SegmentNotFound
from transfer.etcd.kv import EtcdKV
from transfer.etcd.leader import ETCD_SCHEME
from transfer.metadata.client import P2P
from transfer.settings import Config


def segments_prefix(cluster_id: str) -> str:
    return f"mooncake/{cluster_id}/segments/"


class EtcdMetadata:
    def __init__(self, endpoints: str, cluster_id: str, timeout: float = 5.0) -> None:
        self.kv = EtcdKV(endpoints, timeout)
        self.prefix = segments_prefix(cluster_id)

    def publish(self, descriptor: SegmentDescriptor) -> int:
        return self.kv.txn({self.prefix + descriptor.name: json.dumps(descriptor.to_wire())})

    def fetch(self, name: str) -> SegmentDescriptor:
        found = self.kv.get_revision(self.prefix + name)
        if found is None:
            raise SegmentNotFound(f"segment {name!r} is not published in etcd")
        value, revision = found
        return SegmentDescriptor.from_wire({**json.loads(value), "version": revision})

    def withdraw(self, descriptor: SegmentDescriptor) -> None:
        key = self.prefix + descriptor.name
        found = self.kv.get_revision(key)
        if found is not None and json.loads(found[0]).get("incarnation") == descriptor.incarnation:
            self.kv.txn({key: None}, if_mod_revision=(key, found[1]))

    def close(self) -> None:
        pass


def engine_metadata(config: Config, master_address: str) -> str | EtcdMetadata:
    """The ``metadata`` argument of TransferEngine for a daemon's engine, per the settings."""
    if config.metadata_backend == "p2p":
        return P2P
    if config.metadata_backend == "master":
        return master_address
    endpoints = config.etcd_endpoints
    if not endpoints and master_address.startswith(ETCD_SCHEME):
        endpoints = master_address[len(ETCD_SCHEME):].partition("/")[0]
    if not endpoints:
        raise ValueError("metadata_backend etcd needs etcd_endpoints (or --master etcd://...)")
    return EtcdMetadata(endpoints, config.cluster_id, timeout=config.rpc_timeout)
