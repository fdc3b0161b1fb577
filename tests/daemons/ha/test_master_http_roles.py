"""With HA on etcd, each master's HTTP server says which role it has, a standby names the leader,
and a standby's inspection endpoints answer as Mooncake's do while the service plane is elsewhere.
A master started on its own binds metrics_port itself."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from tests.conftest import Mooncake


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_leader_and_standby_answer_their_roles(etcd, tmp_path):
    masters = []
    try:
        for name in ("a", "b"):
            runner = Mooncake(tmp_path / name)
            port = free_port()
            record = runner.json("start", "master", "--rpc_port", "0", "--metrics-port", str(port),
                                 "--ha-backend", "etcd", "--etcd-endpoints", etcd.endpoints, "--cluster-id", "roles")
            assert urlsplit(record["metrics_url"]).port == port  # as given, not a free one
            masters.append((runner, record))
        urls = [record["metrics_url"].removesuffix("/metrics") for _, record in masters]
        deadline = time.monotonic() + 10
        while sorted(roles := [get(url + "/role") for url in urls]) != [(200, b"leader"), (200, b"standby")]:
            assert time.monotonic() < deadline, roles
            time.sleep(0.1)
        lead = 0 if roles[0] == (200, b"leader") else 1  # whichever won the election
        leader = masters[lead][1]
        leader_url, standby_url = urls[lead], urls[1 - lead]
        health = json.loads(get(standby_url + "/health")[1])
        assert health == {"status": "ok", "role": "standby", "ha_state": "standby", "service_ready": False,
                          "leader_address": leader["address"]}
        assert json.loads(get(standby_url + "/leader")[1]) == {"present": True,
                                                                 "leader_address": leader["address"]}
        status, body = get(standby_url + "/query_key?key=anything")
        assert status == 503 and json.loads(body)["error_code"] == -1011
        assert get(leader_url + "/query_key?key=anything")[0] == 404
        assert b"mooncake_master_leading 0.0" in get(standby_url + "/metrics")[1]
        assert b"mooncake_master_leading 1.0" in get(leader_url + "/metrics")[1]
    finally:
        for runner, _ in masters:
            runner("down", timeout=60)
