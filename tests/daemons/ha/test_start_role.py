"""`mooncake start ROLE` refuses an address other hosts could not reach, before starting anything."""

from __future__ import annotations


def test_loopback_advertised_to_a_remote_master_is_refused(mooncake):
    result = mooncake("start", "store-client", "--bind-host", "127.0.0.1", "--master", "10.9.9.9:5000")
    assert result.returncode == 1
    assert b"ADDRESS_NOT_REACHABLE" in result.stderr and b"--advertise-address" in result.stderr


def test_master_on_every_interface_must_name_its_address(mooncake):
    result = mooncake("start", "master", "--bind-host", "0.0.0.0", "--ha-backend", "etcd",
                      "--etcd-endpoints", "10.9.9.9:2379")
    assert result.returncode == 1 and b"--advertise-address" in result.stderr
