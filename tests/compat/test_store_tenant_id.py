"""`setup(..., tenant_id=...)` and `setup(dict)` with ``tenant_id``: each store sees its tenant's keys only."""

from __future__ import annotations

from mooncake.store import MooncakeDistributedStore

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
