"""Master failover on loopback: a standby takes over, clients follow it, no object is lost."""

from __future__ import annotations

import pytest

from daemons.ha.failover_scenario import run_failover
from transfer.etcd.leader import MasterView

pytestmark = pytest.mark.timeout(90)


def test_standby_takes_over_and_clients_follow(etcd, tmp_path):
    outcome = run_failover(tmp_path / "cluster", etcd.endpoints, num_objects=50, object_size=4096, ttl=2.0)
    assert outcome["leader_after"] != outcome["leader_before"]
    assert outcome["failover_s"] < 10
    assert outcome["wrong_bytes"] == 0
    print(f"failover (SIGKILL of the leader -> first good put): {outcome['failover_s']:.2f}s")


def test_a_cluster_without_a_leader_is_reported(etcd):
    assert MasterView(f"etcd://{etcd.endpoints}/nobody").leader() is None


def test_objects_their_owner_never_heard_of_survive_the_kill(etcd, tmp_path):
    # C pings every 30 s, so it learns of none of its objects before the kill: only the op log
    # the new leader replays can bring them back (within run_failover's 30 s wait).
    outcome = run_failover(tmp_path / "cluster", etcd.endpoints, num_objects=200, object_size=4096, ttl=2.0,
                           ping_interval="30s", client_ttl="60s")
    assert outcome["leader_after"] != outcome["leader_before"]
    assert outcome["wrong_bytes"] == 0
