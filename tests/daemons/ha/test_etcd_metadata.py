"""metadata_backend = etcd: engines publish and find segment descriptors in etcd, with no master."""

from __future__ import annotations

import numpy as np
import pytest

from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.etcd.kv import EtcdKV
from transfer.metadata.etcd_backend import EtcdMetadata, engine_metadata, segments_prefix
from transfer.settings import resolve

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20
FAST_FAIL = EngineOptions(protocol="tcp", transfer_timeout=4.0, slice_timeout=1.0, handshake_timeout=1.0,
                          retry_count=2, slice_size=256 * 1024, path_cooldown=0.2)


@pytest.fixture
def engines(etcd):
    made: list[TransferEngine] = []

    def make(name: str) -> TransferEngine:
        made.append(TransferEngine(name, metadata=EtcdMetadata(etcd.endpoints, "meta"), options=FAST_FAIL))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def test_two_engines_transfer_through_descriptors_held_in_etcd(etcd, engines):
    target, initiator = engines("etcd-target"), engines("etcd-initiator")
    remote = target.allocate_shared_buffer(MiB)
    data = np.arange(MiB, dtype=np.uint8)
    source = initiator.register_local_memory(data)
    address = initiator.segment_descriptor("etcd-target").buffers[0].address
    initiator.write("etcd-target", source, address, MiB)
    assert (remote[:MiB] == data).all()
    assert sorted(EtcdKV(etcd.endpoints).get_prefix_utf8(segments_prefix("meta"))) == [
        "mooncake/meta/segments/etcd-initiator", "mooncake/meta/segments/etcd-target"]


def test_a_restarted_peer_replaces_its_stale_descriptor(etcd, engines):
    initiator = engines("etcd-initiator")
    source = initiator.register_local_memory(np.full(4096, 5, np.uint8))
    old = engines("restarting")
    old.allocate_shared_buffer(MiB)
    stale = initiator.segment_descriptor("restarting")
    new = engines("restarting")  # the same name, published before the old process is gone
    remote = new.allocate_shared_buffer(MiB)
    old.close()  # its late withdraw must leave the successor's descriptor alone
    with pytest.raises(Exception) as failed:
        initiator.write("restarting", source, stale.buffers[0].address, 4096)
    assert getattr(failed.value, "code", None) in (-800, -801)
    fresh = initiator.segment_descriptor("restarting")
    assert fresh.incarnation == new.incarnation != stale.incarnation and fresh.version > stale.version
    initiator.write("restarting", source, fresh.buffers[0].address, 4096)
    assert (remote[:4096] == 5).all()


def test_daemons_take_the_backend_from_the_settings(etcd):
    config = resolve({"metadata_backend": "etcd", "cluster_id": "meta"}, environ={})
    backend = engine_metadata(config, f"etcd://{etcd.endpoints}/meta")  # endpoints from --master
    assert isinstance(backend, EtcdMetadata) and backend.prefix == "mooncake/meta/segments/"
    assert engine_metadata(resolve({"metadata_backend": "p2p"}, environ={}), "tcp://h:1") == "P2PHANDSHAKE"
    assert engine_metadata(resolve({}, environ={}), "tcp://h:1") == "tcp://h:1"
