"""The compat package is installed separately (`pip install -e compat/`); CI installs only the
main project, so these tests import it from compat/ by path."""

from __future__ import annotations

import secrets
import sys

import pytest

from tests.conftest import REPO, Mooncake

sys.path.insert(0, str(REPO / "compat"))

from mooncake.store import MooncakeDistributedStore  # noqa: E402


@pytest.fixture(scope="session")
def secret_env() -> dict[str, str]:
    """The clusters of these tests share one secret, given to their daemons and to each test's
    drop-in calls through the environment, as a consumer's deployment would."""
    return {"MOONCAKE_CLUSTER_SECRET": secrets.token_urlsafe(32)}


@pytest.fixture(autouse=True)
def secret_in_environment(secret_env, monkeypatch):
    """Set for each test and taken away after it, so no test outside tests/compat sees it."""
    for name, value in secret_env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def master(tmp_path_factory, secret_env) -> str:
    """A running cluster (master + one store client with a 64 MiB segment), shared by the compat
    tests: its master's "host:port". Tests use their own keys."""
    mooncake = Mooncake(tmp_path_factory.mktemp("compat") / "cluster")
    cluster = mooncake.json("up", "--segment-size", "64MiB", "--lease-ttl", "2s", env=secret_env)
    yield next(d["address"] for d in cluster["daemons"] if d["role"] == "master").removeprefix("tcp://")
    mooncake("down", timeout=60)


def make_store(master, hostname="127.0.0.1", segment="16MB", buffer="16MB") -> MooncakeDistributedStore:
    """A store set up against ``master`` over tcp with P2PHANDSHAKE metadata; the caller closes it."""
    store = MooncakeDistributedStore()
    assert store.setup(hostname, "P2PHANDSHAKE", segment, buffer, "tcp", "", master) == 0
    return store


@pytest.fixture
def store(master):
    store = make_store(master, hostname="localhost")
    yield store
    store.close()
