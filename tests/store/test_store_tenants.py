"""Tenants against a real master and store-client daemon: namespaces, quotas, eviction.

One cluster for the module: a 4 MiB pool, tenant ``ay`` with a 1 MiB quota from the settings, a
high watermark of 1.0 so that no background pass evicts anything a test did not ask for.
"""

from __future__ import annotations

import pytest

from store.errors import NoAvailableHandle, ObjectNotFound, TenantQuotaExceeded
from store_cluster import FAST, client_for, value_for
from tests.conftest import Mooncake

KIB = 1024
ENV = {**FAST, "MOONCAKE_SEGMENT_SIZE": "4MiB", "MOONCAKE_TENANT_QUOTAS": "ay=1MiB",
       "MOONCAKE_HIGH_WATERMARK": "1.0"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    mooncake = Mooncake(tmp_path_factory.mktemp("tenants") / "cluster")
    assert mooncake("up", env=ENV).returncode == 0
    yield mooncake
    mooncake("down", timeout=60)


def test_two_tenants_with_the_same_keys_never_see_each_others_objects(cluster):
    with client_for(cluster.workdir, tenant="red") as red, client_for(cluster.workdir, tenant="blue") as blue, \
            client_for(cluster.workdir) as plain:
        for client, name in ((red, "red"), (blue, "blue"), (plain, "default")):
            assert client.batch_put(["k0", "k1"], [value_for(f"{name}/k0", 1000), value_for(f"{name}/k1", 1000)]) \
                == [None, None]
        red.put("only-red", b"r")
        assert red.get("k0") == value_for("red/k0", 1000) and blue.get("k0") == value_for("blue/k0", 1000)
        assert plain.batch_get(["k0", "k1"]) == [value_for("default/k0", 1000), value_for("default/k1", 1000)]
        assert red.exists("only-red") and not blue.exists("only-red") and not plain.exists("only-red")
        assert blue.batch_exists(["k0", "only-red"]) == [True, False]
        with pytest.raises(ObjectNotFound):
            blue.get("only-red")
        assert sorted(o["key"] for o in red.master.inspect("objects")) == ["k0", "k1", "only-red"]
        assert red.master.inspect("key", "k0")["tenant"] == "red"

        blue.remove("k0", force=True)  # our gets leased it
        assert red.exists("k0") and plain.exists("k0") and not blue.exists("k0")
        assert red.batch_remove(["k1", "nope"], force=True)[1].name == "OBJECT_NOT_FOUND"
        assert plain.exists("k1") and blue.exists("k1")
        assert blue.remove_all(force=True) == 1  # its k1; nobody else's
        assert red.exists("k0") and plain.batch_exists(["k0", "k1"]) == [True, True]
        assert red.remove_all(force=True) == 2 and plain.remove_all(force=True) == 2


def test_the_cli_takes_the_tenant_from_a_flag_or_the_environment(cluster):
    assert cluster("put", "same", "-", "--tenant", "cli-a", input=b"from a", env=ENV).returncode == 0
    assert cluster("put", "same", "-", input=b"from b", env={**ENV, "MOONCAKE_TENANT": "cli-b"}).returncode == 0
    assert cluster("get", "same", "--tenant", "cli-a", env=ENV).stdout == b"from a"
    assert cluster("get", "same", env={**ENV, "MOONCAKE_TENANT": "cli-b"}).stdout == b"from b"
    assert cluster("exists", "same", env=ENV).returncode == 1  # the default tenant has none
    listed = cluster.json("inspect", "objects", "--tenant", "cli-a", env=ENV)
    assert [o["key"] for o in listed] == ["same"] and listed[0]["tenant"] == "cli-a"
    assert cluster("rm", "same", "--force", "--tenant", "cli-a", env=ENV).returncode == 0  # our get leased it
    assert cluster("get", "same", "--tenant", "cli-b", env=ENV).stdout == b"from b"
    assert cluster("rm", "same", "--force", "--tenant", "cli-b", env=ENV).returncode == 0
    bad = cluster("exists", "same", "--tenant", "_hidden", env=ENV)
    assert bad.returncode == 1 and b"INVALID_PARAMS" in bad.stderr


def test_a_tenant_at_its_quota_is_refused_and_never_evicts_another_tenants_objects(cluster):
    size = 256 * KIB
    with client_for(cluster.workdir, tenant="bee") as bee, client_for(cluster.workdir, tenant="ay") as ay:
        bee_keys = [f"b{i}" for i in range(8)]
        assert bee.batch_put(bee_keys, [value_for(k, size) for k in bee_keys]) == [None] * 8  # 2 of 4 MiB
        for i in range(4):
            ay.put(f"pinned{i}", value_for(f"pinned{i}", size), hard_pin=True)  # ay's 1 MiB quota
        with pytest.raises(TenantQuotaExceeded) as refused:
            ay.put("over", value_for("over", size))
        assert refused.value.code == -1700

        raised = cluster.json("tenant", "quota", "ay", "3MiB", env=ENV)
        assert raised == {"tenant": "ay", "quota_bytes": 3 << 20, "used_bytes": 1 << 20, "num_objects": 4}
        # Within its new quota ay now fills the pool, and past it evicts only its own objects.
        for i in range(6):
            ay.put(f"free{i}", value_for(f"free{i}", size))
        assert not ay.exists("free0") and not ay.exists("free1") and ay.exists("free5")
        # Probed without a lease first: a get's lease would have kept them from eviction anyway.
        assert bee.batch_exists(bee_keys) == [True] * 8
        assert bee.batch_get(bee_keys) == [value_for(k, size) for k in bee_keys]
        # The master's headroom pass after ay's evictions may have taken more of ay's: what is
        # left is leased now, so that nothing of ay's can go.
        frees = [f"free{i}" for i in range(6)]
        alive = [k for k, got in zip(frees, ay.batch_get(frees)) if got == value_for(k, size)]
        with pytest.raises(NoAvailableHandle):  # within its quota, but nothing of ay's can go
            ay.put("big", value_for("big", 2 * size))
        assert bee.batch_exists(bee_keys) == [True] * 8

        rows = {row["tenant"]: row for row in cluster.json("tenant", "list", env=ENV)}
        assert rows["ay"] == {"tenant": "ay", "quota_bytes": 3 << 20, "used_bytes": size * (4 + len(alive)),
                              "num_objects": 4 + len(alive)}
        assert rows["bee"] == {"tenant": "bee", "quota_bytes": 0, "used_bytes": 2 << 20, "num_objects": 8}
