"""A tenant's credential reaches its own keys only, on tcp and unix:// alike.

One cluster `up` started (so authenticated), two tenants ``red`` and ``blue`` with the same key
names, each with the credential `mooncake tenant credential` printed for it. Before, any client
holding the cluster secret could name any tenant, and there was nothing else to hold.
"""

from __future__ import annotations

from contextlib import closing

import pytest

from daemons.cluster.directory import daemon_address, local_daemon_address
from daemons.cluster.workdir import ClusterPaths
from store.client import StoreClient
from store.errors import InvalidParams
from store.master_client import MasterClient
from store.objects import ReplicateConfig, Segment
from store_cluster import FAST, client_for, config_for, value_for
from tests.conftest import Mooncake
from transfer.auth import ClusterSecret, TenantCredential
from transfer.batch import OpCode, TransferRequest
from transfer.errors import AuthenticationFailed, RpcTimeout, TransferFailed, Unauthorized
from transfer.rpc.client_server import RpcClient

WRONG = ClusterSecret("somebody-elses-cluster-secret")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    mooncake = Mooncake(tmp_path_factory.mktemp("tenantauth") / "cluster")
    mooncake.env.update(FAST)
    assert mooncake("up").returncode == 0
    yield mooncake, ClusterPaths.of(mooncake.workdir)
    mooncake("down", timeout=60)


def _credential(mooncake, tenant: str) -> str:
    printed = mooncake("tenant", "credential", tenant)
    assert printed.returncode == 0, printed.stderr.decode()
    return printed.stdout.decode().strip()


@pytest.fixture(scope="module")
def objects(cluster):
    """``same`` in tenants red and blue, each put by a client holding its tenant's credential
    (over TCP: never shared memory, which one tenant's process could map for another's)."""
    mooncake, paths = cluster
    for tenant in ("red", "blue"):
        with StoreClient(daemon_address(paths, "master"),
                         config_for(mooncake.workdir, tenant_credential=_credential(mooncake, tenant))) as client:
            assert client.master.tenant == tenant and "shm" not in client.engine.status()["transports"]
            assert client.reservations is None  # reserving is the cluster secret's: these puts go plain
            client.put("same", value_for(f"{tenant}/same", 4096))
            client.put("big", value_for(f"{tenant}/big", 3 << 19))  # a batch of slices, not inline
            assert client.get("same") == value_for(f"{tenant}/same", 4096)
            assert client.get("big") == value_for(f"{tenant}/big", 3 << 19)


def _tenant_master(address: str, credential: str, client_id: str) -> MasterClient:
    return MasterClient(address, client_id, secret=TenantCredential.parse(credential))


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_tenant_credential_reaches_only_its_own_keys(cluster, objects, transport):
    mooncake, paths = cluster
    address = (daemon_address if transport == "tcp" else local_daemon_address)(paths, "master")
    assert address.startswith(f"{transport}://")
    red_credential = _credential(mooncake, "red")
    with closing(_tenant_master(address, red_credential, "red")) as red:
        assert red.tenant == "red"  # the credential names it
        assert red.exists("same") and red.batch_exists(["same", "other"]) == [True, False]
        assert sorted(o["key"] for o in red.inspect("objects")) == ["big", "same"]
        assert red.inspect("key", "same")["tenant"] == "red"
        assert red.get_replica_list("same").replicas

        # Red's connection names tenant blue: every op on keys is refused, not served as red's.
        red.tenant, red._scope = "blue", {"tenant": "blue"}
        for attempt in (lambda: red.get_replica_list("same"), lambda: red.exists("same"),
                        lambda: red.remove("same", force=True), lambda: red.inspect("objects"),
                        lambda: red.remove_all(force=True), lambda: red.batch_exists(["same"]),
                        lambda: red.put_start("new", 10, ReplicateConfig())):
            with pytest.raises(Unauthorized, match="reaches no keys of tenant 'blue'"):
                attempt()
        # Nor what only the cluster secret may do, whatever tenant it names.
        red._scope = {}
        for attempt in (lambda: red.set_tenant_quota("red", 1 << 30), lambda: red.kv_events(),
                        lambda: red.mount_segment(Segment("stolen", "red", 0, 1 << 20, "tcp://127.0.0.1:1")),
                        lambda: red.drain_status("stolen")):
            with pytest.raises(Unauthorized, match="takes the cluster secret"):
                attempt()
        red.tenant, red._scope = "red", {"tenant": "red"}
        with pytest.raises(Unauthorized, match="own objects and key only"):
            red.inspect("tenants")

    # Nothing of blue's went, and the cluster secret still reaches both tenants.
    for tenant in ("red", "blue"):
        with closing(MasterClient(address, f"admin-{tenant}", secret=mooncake.secret, tenant=tenant)) as admin:
            assert admin.exists("same") and admin.inspect("tenants")


def test_a_tenant_cannot_move_another_tenants_bytes_by_their_address(cluster, objects):
    mooncake, paths = cluster
    with client_for(mooncake.workdir, tenant="blue") as admin:
        blue_same, blue_big = (admin.master.get_replica_list(key).replicas[0] for key in ("same", "big"))
    with StoreClient(daemon_address(paths, "master"),
                     config_for(mooncake.workdir, tenant_credential=_credential(mooncake, "red"))) as red:
        red_same = red.master.get_replica_list("same").replicas[0]  # granted: a READ of red's own range
        view, local = red._staging(3 << 19)
        handle = red.engine.open_segment(blue_same.segment_name)
        forged = [
            TransferRequest(OpCode.READ, local, handle, blue_same.address, 4096),  # no grant
            TransferRequest(OpCode.READ, local, handle, blue_same.address, 4096, red_same.grant),  # red's
            TransferRequest(OpCode.WRITE, local, handle, red_same.address, 4096, red_same.grant),  # a READ's
            TransferRequest(OpCode.READ, local, handle, red_same.address, 8192, red_same.grant),  # past it
            TransferRequest(OpCode.READ, local, handle, blue_big.address, 3 << 19, red_same.grant),  # a batch
            TransferRequest(OpCode.READ, local, handle, blue_same.address, 4096,
                            red_same.grant[:-1] + bytes([red_same.grant[-1] ^ 1])),  # tampered
        ]
        for request in forged:
            with pytest.raises(TransferFailed, match="code -911"):
                red.engine.transfer_sync([request])
            outcome = red.engine.transfer_now_many([request])[0]
            assert outcome is False or "code -911" in str(outcome)
        assert value_for("blue/same", 4096) not in bytes(view)
        red.engine.transfer_sync([TransferRequest(OpCode.READ, local, handle, red_same.address, 4096, red_same.grant)])
        assert bytes(view[:4096]) == value_for("red/same", 4096)
    with client_for(mooncake.workdir, tenant="blue") as admin:
        assert admin.get("same") == value_for("blue/same", 4096)  # never overwritten


def test_an_explicit_tenant_that_disagrees_with_the_credential_is_an_error(cluster):
    mooncake, paths = cluster
    credential = _credential(mooncake, "red")
    with pytest.raises(InvalidParams, match="tenant credential is for tenant 'red'"):
        StoreClient(daemon_address(paths, "master"),
                    config_for(mooncake.workdir, tenant_credential=credential, tenant="blue"))


def test_a_tenant_credential_of_another_secret_is_refused_on_both_transports(cluster):
    mooncake, paths = cluster
    forged = WRONG.tenant_credential("red")
    # The daemons' public key is not secret; the forger copies it from a real credential.
    forged.server_public_key = TenantCredential.parse(_credential(mooncake, "red")).server_public_key
    with RpcClient(daemon_address(paths, "master"), timeout=5, secret=forged) as client:
        with pytest.raises(Unauthorized, match="not the key of tenant 'red'"):
            client.call("store.exists", {"key": "same", "tenant": "red"})
    with RpcClient(local_daemon_address(paths, "master"), timeout=5, secret=forged) as client:
        with pytest.raises(AuthenticationFailed, match="does not match the credential of tenant 'red'"):
            client.call("store.exists", {"key": "same", "tenant": "red"})


def test_daemons_other_than_the_master_refuse_tenant_credentials(cluster):
    mooncake, paths = cluster
    red = TenantCredential.parse(_credential(mooncake, "red"))
    with RpcClient(daemon_address(paths, "store-client"), timeout=1.0, secret=red) as client:
        with pytest.raises(RpcTimeout, match="reaches the master alone"):  # ZAP admits the cluster's key alone
            client.call("status")
    with RpcClient(local_daemon_address(paths, "store-client"), timeout=5, secret=red) as client:
        with pytest.raises(AuthenticationFailed, match="does not admit"):
            client.call("status")
