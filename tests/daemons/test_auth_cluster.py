"""A cluster `up` started is authenticated: it made a 0600 secret in its workdir, which its own
commands find there, while a local client without it (or with another) is refused on tcp and
unix:// alike, never served, and the daemon logs it. Before, any local user could
`store.remove_all {force: true}` the pool away."""

from __future__ import annotations

import os
import stat
import time

import msgpack
import pytest
import zmq

from daemons.cluster.directory import daemon_address, local_daemon_address
from daemons.cluster.workdir import ClusterPaths
from tests.conftest import Mooncake
from transfer.auth import ClusterSecret
from transfer.errors import AuthenticationFailed, RpcTimeout
from transfer.rpc.client_server import RpcClient

FAST = {"MOONCAKE_SEGMENT_SIZE": "8MiB", "MOONCAKE_CLIENT_TTL": "2s", "MOONCAKE_PING_INTERVAL": "200ms"}
WRONG = ClusterSecret("somebody-elses-cluster-secret")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    mooncake = Mooncake(tmp_path_factory.mktemp("auth") / "cluster")
    mooncake.env.update(FAST)
    up = mooncake("up")
    assert up.returncode == 0, up.stderr.decode()
    yield mooncake, ClusterPaths.of(mooncake.workdir)
    mooncake("down", timeout=60)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _num_objects(paths, secret) -> int:
    with RpcClient(local_daemon_address(paths, "master"), timeout=5, secret=secret) as master:
        return master.call("store.inspect", {"what": "counters"})["num_objects"]


def test_up_makes_a_secret_only_its_owner_reads_and_the_cli_uses_it(cluster):
    mooncake, paths = cluster
    assert _mode(mooncake.workdir / "secret") == 0o600
    assert _mode(paths.run_dir) == 0o700
    assert _mode(paths.ipc_socket("master")) == 0o600
    assert mooncake("put", "guarded", "-", input=b"only for the cluster").returncode == 0
    got = mooncake("get", "guarded")
    assert got.returncode == 0 and got.stdout == b"only for the cluster"
    assert mooncake.json("status")["healthy"] is True


def test_a_client_without_the_secret_is_refused_on_both_transports(cluster):
    mooncake, paths = cluster
    tcp, unix = daemon_address(paths, "master"), local_daemon_address(paths, "master")
    assert unix.startswith("unix://")
    for secret, hint in ((None, "require a cluster secret"), (WRONG, "is the cluster secret right")):
        with RpcClient(tcp, timeout=1.0, secret=secret) as client:
            with pytest.raises(RpcTimeout, match=hint):
                client.call("status")
    for secret, why in ((None, "requires the cluster secret"), (WRONG, "does not match")):
        with RpcClient(unix, timeout=5, secret=secret) as client:
            with pytest.raises(AuthenticationFailed, match=why):
                client.call("status")
    with RpcClient(tcp, timeout=5, secret=mooncake.secret) as client:  # the secret opens both
        assert client.call("status")["role"] == "master"
    log = paths.log_file("master")
    deadline = time.monotonic() + 5
    wanted = ("refused a control connection", "refused a unix:// control connection",
              "left without proving")
    while not all(w in log.read_text() for w in wanted):
        assert time.monotonic() < deadline, f"the master's log lacks one of {wanted}"
        time.sleep(0.1)


def test_remove_all_from_a_client_without_the_secret_does_nothing(cluster):
    mooncake, paths = cluster
    assert mooncake("put", "survivor", "-", input=b"still here").returncode == 0
    before = _num_objects(paths, mooncake.secret)
    assert before >= 1
    request = msgpack.packb({"id": 1, "op": "store.remove_all", "args": {"force": True}})
    raw = zmq.Context.instance().socket(zmq.DEALER)  # what any local user could open
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(daemon_address(paths, "master"))
    try:
        raw.send(request)
        assert not raw.poll(500), "a client without the secret got an answer"
    finally:
        raw.close()
    with RpcClient(local_daemon_address(paths, "master"), timeout=5, secret=WRONG) as intruder:
        with pytest.raises(AuthenticationFailed):
            intruder.call("store.remove_all", {"force": True})
    assert _num_objects(paths, mooncake.secret) == before
    assert mooncake("get", "survivor").stdout == b"still here"


def test_config_show_masks_the_secret(cluster):
    mooncake, _ = cluster
    shown = mooncake.json("config", "show", env={"MOONCAKE_CLUSTER_SECRET": "a-secret-nobody-should-see"})
    row = next(r for r in shown["settings"] if r["name"] == "cluster_secret")
    assert row["value"] == "********" and row["source"] == "env"
    assert "a-secret-nobody-should-see" not in str(shown)
