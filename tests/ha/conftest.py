"""A private etcd on loopback per test, always stopped."""

from __future__ import annotations

import pytest

from daemons.etcd_server import EtcdServer


@pytest.fixture
def etcd(tmp_path):
    server = EtcdServer(tmp_path / "etcd")
    try:
        yield server.wait_ready()
    finally:
        server.stop()
