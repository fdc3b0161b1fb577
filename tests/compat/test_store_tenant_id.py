"""`setup(..., tenant_id=...)` and `setup(dict)` with ``tenant_id``: each store sees its tenant's keys only."""

from __future__ import annotations

from mooncake.store import MooncakeDistributedStore
from transfer.auth import ClusterSecret

OBJECT_NOT_FOUND = -704


def test_stores_of_two_tenants_share_key_names_but_not_objects(master):
    red, blue, plain = MooncakeDistributedStore(), MooncakeDistributedStore(), MooncakeDistributedStore()
    assert red.setup("127.0.0.1", "P2PHANDSHAKE", 0, "4MB", "tcp", "", master, tenant_id="compat-red") == 0
    assert blue.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0, "master_server_address": master,
                       "tenant_id": "compat-blue"}) == 0
    assert plain.setup("127.0.0.1", "P2PHANDSHAKE", 0, "4MB", "tcp", "", master, tenant_id="") == 0  # default
    try:
        assert red.put("tenant-key", b"red") == 0 and blue.put("tenant-key", b"blue") == 0
        assert red.put("red-only", b"r") == 0
        assert red.get("tenant-key") == b"red" and blue.get("tenant-key") == b"blue"
        assert plain.is_exist("tenant-key") == 0 and blue.is_exist("red-only") == 0
        assert blue.remove("red-only") == OBJECT_NOT_FOUND
        assert blue.remove_by_regex("^(tenant-key|red-only)$", force=True) == 1
        assert red.batch_is_exist(["tenant-key", "red-only"]) == [1, 1]
        assert red.remove_all(force=True) == 2 and red.is_exist("tenant-key") == 0
    finally:
        for store in (red, blue, plain):
            store.close()


def test_a_store_given_a_tenant_credential_acts_for_its_tenant_alone(master, secret_env, monkeypatch):
    """A consumer handed a tenant credential (MOONCAKE_TENANT_CREDENTIAL), not the cluster secret,
    as an operator would: its store reaches that tenant's keys only, and names its tenant by it."""
    cluster = ClusterSecret(secret_env["MOONCAKE_CLUSTER_SECRET"])
    admin = MooncakeDistributedStore()  # the cluster secret's, acting for the tenant
    assert admin.setup("127.0.0.1", "P2PHANDSHAKE", 0, "4MB", "tcp", "", master, tenant_id="compat-cred") == 0
    try:
        assert admin.put("by-admin", b"put with the cluster secret") == 0
        monkeypatch.delenv("MOONCAKE_CLUSTER_SECRET")
        monkeypatch.setenv("MOONCAKE_TENANT_CREDENTIAL", cluster.tenant_credential("compat-cred").text)
        tenant, wrong = MooncakeDistributedStore(), MooncakeDistributedStore()
        assert tenant.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                             "master_server_address": master, "tenant_id": "compat-cred"}) == 0
        assert wrong.setup("127.0.0.1", "P2PHANDSHAKE", 0, "4MB", "tcp", "", master, tenant_id="compat-red") != 0
        try:
            assert tenant.get("by-admin") == b"put with the cluster secret"
            assert tenant.put("by-tenant", b"put with the tenant credential") == 0
            assert admin.get("by-tenant") == b"put with the tenant credential"
            assert tenant.remove_all(force=True) == 2
        finally:
            tenant.close()
    finally:
        admin.close()
