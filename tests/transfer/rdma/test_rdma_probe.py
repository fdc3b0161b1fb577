"""Start-up checks and the fallback to TCP: every message says what is missing."""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest
from tests.transfer.rdma.fake_verbs import Fabric, FakeVerbs

from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.errors import DeviceNotFound, MemoryLockLimit
from transfer.memory import address_of
from transfer.rdma import probe as rdma_probe
from transfer.rdma import verbs_pyverbs
from transfer.rdma.verbs import GidEntry, VerbsUnavailable

MiB = 1 << 20


def _engine(verbs, protocol="auto", **options):
    return TransferEngine(options=EngineOptions(protocol=protocol, **options), verbs=verbs, gpudirect=False)


def test_pyverbs_not_installed_is_named(monkeypatch):
    for name in [n for n in sys.modules if n == "pyverbs" or n.startswith("pyverbs.")] + ["pyverbs"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing pyverbs.* now raises ImportError
    with pytest.raises(VerbsUnavailable, match=r"pyverbs is not installed .*apt-get install python3-pyverbs"):
        verbs_pyverbs.load()


def test_the_real_adapter_reports_this_hosts_rdma_state():
    has_devices = bool(os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"))
    borrowed = verbs_pyverbs.SYSTEM_PACKAGES not in sys.path
    try:
        verbs = verbs_pyverbs.load()
    except VerbsUnavailable as exc:
        missing = f"{exc} (the README's test command installs it)"
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    if borrowed:  # Debian's packages were on the path for pyverbs's import only
        assert verbs_pyverbs.SYSTEM_PACKAGES not in sys.path
    if has_devices:
        assert verbs.device_names()
    else:
        with pytest.raises(VerbsUnavailable, match="no RDMA device on this host"):
            verbs.device_names()


def test_auto_falls_back_to_tcp_and_says_why_once(caplog):
    verbs = FakeVerbs(Fabric(), "a", ["once_0"], port_state="DOWN")
    with caplog.at_level(logging.WARNING, logger="transfer.engine"):
        with _engine(verbs) as first, _engine(verbs) as second:
            for engine in (first, second):
                assert engine.status()["transports"] == ["shm", "tcp"]
                assert engine.status()["rdma_unavailable"] == (
                    "no usable RDMA device: once_0 has no active port (port 1 is DOWN)")
    warnings = [r.getMessage() for r in caplog.records if "once_0" in r.getMessage()]
    assert warnings == ["RDMA unavailable, transfers use TCP: "
                        "no usable RDMA device: once_0 has no active port (port 1 is DOWN)"]


def test_auto_skips_pyverbs_when_the_kernel_lists_no_device(tmp_path, monkeypatch):
    """A client under ``auto`` on a host without RDMA need not import pyverbs to learn that; one
    whose kernel lists a device still asks libibverbs (here the import is made to fail)."""
    monkeypatch.setattr(rdma_probe, "SYSFS_DEVICES", str(tmp_path / "absent"))
    monkeypatch.setattr(verbs_pyverbs, "load", lambda: pytest.fail("pyverbs was loaded"))
    with TransferEngine(options=EngineOptions(protocol="auto"), gpudirect=False) as engine:
        assert engine.status()["transports"] == ["shm", "tcp"]
        assert "lists none" in engine.status()["rdma_unavailable"]
    (tmp_path / "listed" / "mlx5_0").mkdir(parents=True)
    monkeypatch.setattr(rdma_probe, "SYSFS_DEVICES", str(tmp_path / "listed"))

    def unavailable():
        raise VerbsUnavailable("pyverbs is not installed (test)")
    monkeypatch.setattr(verbs_pyverbs, "load", unavailable)
    with TransferEngine(options=EngineOptions(protocol="auto"), gpudirect=False) as engine:
        assert engine.status()["rdma_unavailable"] == "pyverbs is not installed (test)"


def test_rdma_only_without_a_device_refuses_to_start():
    with pytest.raises(DeviceNotFound, match=r"no RDMA device on this host \(libibverbs lists none\)"):
        _engine(FakeVerbs(Fabric(), "a", []), protocol="rdma")


def test_gid_and_mtu_are_probed_or_forced():
    fabric = Fabric()
    device = FakeVerbs(fabric, "a", ["mlx5_0"], mtu=2048).open("mlx5_0")
    plan = rdma_probe.plan_device(device, gid_index=-1, mtu=0)
    assert (plan.gid_index, plan.mtu, plan.port) == (3, 2048, 1)  # RoCEv2, IPv4-mapped; active MTU
    assert rdma_probe.plan_device(device, gid_index=0, mtu=1024).gid_index == 0
    with pytest.raises(VerbsUnavailable, match=r"no GID at index 7 \(rdma_gid_index\); valid: \[0, 3\]"):
        rdma_probe.plan_device(device, gid_index=7, mtu=0)
    with pytest.raises(VerbsUnavailable, match="rdma_mtu 4096 exceeds mlx5_0 port 1's active MTU 2048"):
        rdma_probe.plan_device(device, gid_index=-1, mtu=4096)
    with pytest.raises(VerbsUnavailable, match="rdma_mtu 3000 is not an RDMA MTU"):
        rdma_probe.plan_device(device, gid_index=-1, mtu=3000)
    bare = FakeVerbs(fabric, "a", ["roce0"], gids=[]).open("roce0")
    with pytest.raises(VerbsUnavailable, match="roce0 port 1 \\(RoCE\\) has no GID: configure an IP"):
        rdma_probe.plan_device(bare, gid_index=-1, mtu=0)
    v1_only = FakeVerbs(fabric, "a", ["mlx5_9"], gids=[GidEntry(1, "fe80:0000:0000:0000:0000:0000:0000:0002", False)])
    assert rdma_probe.plan_device(v1_only.open("mlx5_9"), -1, 0).gid_index == 1


def test_memlock_limit_too_low_for_the_segment(monkeypatch, caplog):
    monkeypatch.setattr(rdma_probe, "memlock_limit", lambda: MiB)
    segment = np.zeros(2 * MiB, np.uint8)
    with pytest.raises(MemoryLockLimit, match=r"ulimit -l\) is 1MiB but RDMA registration needs 2MiB"):
        with _engine(FakeVerbs(Fabric(), "a", ["mlx5_0"]), protocol="rdma") as engine:
            engine.register_local_memory(segment)
    with caplog.at_level(logging.WARNING, logger="transfer.engine"):
        with _engine(FakeVerbs(Fabric(), "a", ["mlx5_0"])) as engine:
            engine.register_local_memory(segment)
            assert engine.status()["transports"] == ["shm", "tcp"]
            assert "ulimit -l) is 1MiB" in engine.status()["rdma_unavailable"]
            assert engine.descriptor().buffers[0].rkeys == ()
    assert any("transfers use TCP: locked-memory limit" in r.getMessage() for r in caplog.records)


def test_memlock_limit_reads_the_rlimit_unless_cap_ipc_lock(monkeypatch):
    monkeypatch.setattr(rdma_probe, "_has_ipc_lock", lambda: False)
    monkeypatch.setattr(rdma_probe.resource, "getrlimit", lambda which: (8 * MiB, 8 * MiB))
    assert rdma_probe.memlock_limit() == 8 * MiB
    monkeypatch.setattr(rdma_probe, "_has_ipc_lock", lambda: True)
    assert rdma_probe.memlock_limit() is None


@pytest.mark.rdma_hardware
def test_loopback_rdma_transfer_on_a_real_device():
    try:
        verbs = verbs_pyverbs.load()
        verbs.device_names()
        rdma_probe.open_devices(verbs)[0][0].close()
    except VerbsUnavailable as exc:
        pytest.skip(f"needs an RDMA device with an active port: {exc}")
    options = EngineOptions(protocol="rdma", transfer_timeout=10.0)
    with TransferEngine(options=options) as initiator, TransferEngine(options=options) as target:
        remote = np.zeros(4 * MiB, np.uint8)
        target.register_local_memory(remote)
        data = np.random.default_rng(1).integers(0, 256, 4 * MiB, dtype=np.uint8)
        initiator.register_local_memory(data)
        handle = initiator.open_segment(target.name)
        assert initiator.write(handle, address_of(data), address_of(remote), len(data)) == len(data)
        assert np.array_equal(remote, data)
        back = np.zeros_like(data)
        initiator.register_local_memory(back)
        initiator.read(handle, address_of(back), address_of(remote), len(data))
        assert np.array_equal(back, data)
