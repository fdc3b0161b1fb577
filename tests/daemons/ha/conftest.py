"""A private etcd on loopback per test, always stopped."""

from __future__ import annotations

import pytest

from daemons.ha.etcd_server import EtcdServer
from tests.conftest import require_program


@pytest.fixture
def etcd(tmp_path):
    require_program("etcd", "etcd-server")
    server = EtcdServer(tmp_path / "etcd")
    try:
        yield server.wait_ready()
    finally:
        server.stop()
