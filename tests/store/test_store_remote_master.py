"""Store commands pointed at a master with --master, from a workdir that holds no cluster.

This is how an operator on another host reaches a cluster: nothing is read from the workdir.
"""

from __future__ import annotations

import json

from tests.conftest import Mooncake


def test_put_get_exists_rm_inspect_through_master_flag(mooncake, tmp_path):
    cluster = mooncake.json("up", "--segment-size", "16MiB")
    master = next(d for d in cluster["daemons"] if d["role"] == "master")
    host_port = master["address"].removeprefix("tcp://")
    elsewhere = Mooncake(tmp_path / "no-cluster-here")
    # The operator elsewhere is given the cluster's secret, as on another host they would be.
    elsewhere.env["MOONCAKE_CLUSTER_SECRET_FILE"] = str(mooncake.workdir / "secret")

    put = elsewhere("put", "remote-key", "-", "--master", master["address"], input=b"\x00bytes\xff")
    assert put.returncode == 0, put.stderr.decode()
    got = elsewhere("get", "remote-key", "--master", host_port)
    assert got.returncode == 0 and got.stdout == b"\x00bytes\xff"
    assert elsewhere("exists", "remote-key", "--master", host_port).returncode == 0
    objects = elsewhere("inspect", "objects", "--json", "--master", host_port)
    assert objects.returncode == 0
    assert "remote-key" in json.dumps(json.loads(objects.stdout))
    assert elsewhere("rm", "remote-key", "--force", "--master", host_port).returncode == 0
    assert elsewhere("exists", "remote-key", "--master", host_port).returncode == 1
    # Without --master the empty workdir has no cluster: a clear failure, not a hang.
    lost = elsewhere("get", "remote-key")
    assert lost.returncode == 1 and b"no cluster" in lost.stderr
