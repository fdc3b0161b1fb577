"""The metadata service over real RPC, and the pure pieces: slicing and path choice."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from transfer.batch import cut
from transfer.descriptor import BufferDesc, Endpoint, SegmentDescriptor
from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.auth import ClusterSecret
from transfer.errors import InvalidArgument, RpcError, SegmentNotFound, TableFull
from transfer.metadata.client import MasterMetadata
from transfer.metadata.http_backend import BoundedValues, HttpMetadata, HttpMetadataServer
from transfer.metadata.table import MetadataTable, serve_metadata
from transfer.path_selection import PathSet
from transfer.rpc.client_server import RpcServer


def _descriptor(name: str, incarnation: str) -> SegmentDescriptor:
    return SegmentDescriptor(name, incarnation, "host/boot", "tcp://127.0.0.1:1",
                             [Endpoint("lo", "127.0.0.1", 2)], [BufferDesc(4096, 100, "cpu:0", "r")])


def test_master_serves_versioned_descriptors_and_restarts_replace_them():
    server = RpcServer().start()
    serve_metadata(server, MetadataTable())
    client = MasterMetadata(server.address, timeout=2)
    try:
        first = client.publish(_descriptor("seg", "one"))
        assert client.fetch("seg").incarnation == "one" and client.fetch("seg").version == first
        second = client.publish(_descriptor("seg", "two"))  # restarted under the same name
        assert second > first and client.fetch("seg").incarnation == "two"
        client.withdraw(_descriptor("seg", "one"))  # a late remove from the dead process: ignored
        assert client.fetch("seg").buffers == [BufferDesc(4096, 100, "cpu:0", "r")]
        client.withdraw(_descriptor("seg", "two"))
        with pytest.raises(SegmentNotFound):
            client.fetch("seg")
    finally:
        client.close()
        server.stop()


def test_cut_merges_a_small_tail_into_the_previous_slice():
    assert cut(100, 64, 64) == [(0, 64), (64, 36)]  # a 36-byte tail is >= 64/4: its own slice
    assert cut(1000, 256, 256) == [(0, 256), (256, 256), (512, 256), (768, 232)]
    assert cut(1040, 256, 256) == [(0, 256), (256, 256), (512, 256), (768, 272)]
    assert cut(10, 256, 0) == [(0, 10)]


def test_paths_stripe_over_preferred_then_fail_over_and_cool_down():
    paths = PathSet({"cpu:0": [["a", "b"], ["c"]]}, cooldown=10)
    assert [paths.choose("cpu:0", i, 0, now=0) for i in range(4)] == ["a", "b", "a", "b"]
    paths.mark_failed("a", now=0)
    assert [paths.choose("cpu:0", i, 0, now=1) for i in range(2)] == ["b", "b"]
    assert paths.choose("cpu:0", 0, 1, now=1) in ("b", "c")  # a retry never picks the failed one
    assert paths.choose("cpu:0", 0, 0, now=11) == "a"  # cool-down over: tried again
    assert paths.tiers("cuda:3") == (["a", "b", "c"], [])
    with pytest.raises(InvalidArgument):
        PathSet({"cpu:0": [["a"]]}, cooldown=1)


def test_registries_are_bounded_and_still_replace_what_they_hold():
    """40k registrations once grew a master by 181 MiB; each registry now holds
    metadata_max_entries names, refuses a new one beyond it and still takes a known one."""
    server = RpcServer().start()
    serve_metadata(server, MetadataTable(max_entries=3))
    client = MasterMetadata(server.address, timeout=2)
    http = HttpMetadataServer(port=0, max_entries=2)
    try:
        for name in ("a", "b", "c"):
            client.publish(_descriptor(name, "one"))
        with pytest.raises(TableFull):
            client.publish(_descriptor("d", "one"))
        client.publish(_descriptor("c", "two"))  # a restart under a known name
        assert client.fetch("c").incarnation == "two"

        def put(key: str) -> int:
            request = urllib.request.Request(f"{http.url}?key={key}", data=b"v", method="PUT")
            try:
                return urllib.request.urlopen(request, timeout=5).status
            except urllib.error.HTTPError as exc:
                return exc.code

        assert [put("x"), put("y"), put("z"), put("x")] == [200, 200, 507, 200]
        assert http.keys() == ["x", "y"]
    finally:
        http.close()
        client.close()
        server.stop()


def test_the_http_servers_byte_bound_counts_replaced_and_deleted_values_once():
    values = BoundedValues(max_entries=10, max_total=10)
    assert values.put("a", b"123456") is None
    assert values.put("b", b"12345") == "metadata server full: 1 keys, 11 bytes"
    assert values.put("a", b"12") is None  # a replacement frees the old value's bytes
    assert values.put("b", b"12345") is None
    assert values.delete("a") and not values.delete("a")
    assert values.put("c", b"12345") is None  # 10 bytes: exactly the bound
    assert values.put("d", b"1") is not None
    assert values.keys() == ["b", "c"] and values.get("c") == b"12345" and values.get("a") is None


def test_the_http_metadata_server_with_a_token_serves_only_requests_that_carry_it():
    """Anyone could PUT, overwrite or DELETE any key; with the cluster's token every request
    needs it: reads too, since a descriptor names a segment's memory addresses."""
    secret = ClusterSecret("the-cluster-secret-of-these-tests")
    http = HttpMetadataServer(port=0, token=secret.http_token)
    ours = HttpMetadata(http.url, timeout=5, token=secret.http_token)
    try:
        def status(method: str, token: str | None) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            request = urllib.request.Request(f"{http.url}?key=mooncake/ram/x", method=method, headers=headers,
                                             data=b"forged" if method == "PUT" else None)
            try:
                return urllib.request.urlopen(request, timeout=5).status
            except urllib.error.HTTPError as exc:
                return exc.code

        for method in ("PUT", "DELETE", "GET"):
            assert status(method, None) == 401
            assert status(method, "not-the-token") == 403
        assert http.keys() == []
        assert status("PUT", secret.http_token) == 200 and status("DELETE", secret.http_token) == 200
        ours.publish(_descriptor("x", "one"))
        assert ours.fetch("x").incarnation == "one"
        with pytest.raises(RpcError, match="HTTP 401"):  # a client without the token reads nothing
            HttpMetadata(http.url, timeout=5).fetch("x")
    finally:
        http.close()


def test_descriptors_not_published_again_within_the_ttl_are_dropped_and_refreshes_keep_versions():
    """An engine killed without withdrawing left its descriptor for good: enough of them filled
    the table (TABLE_FULL for every new engine). Engines now publish theirs again; the rest expire."""
    now = [100.0]
    table = MetadataTable(clock=lambda: now[0])
    live, dead = _descriptor("live", "one"), _descriptor("dead", "one")
    first = table.put(live)
    table.put(dead)
    now[0] += 200
    assert table.put(live) == first  # the same descriptor again: fresh, same version
    now[0] += 200
    assert table.expire(300) == ["dead"]
    assert table.names() == ["live"] and table.get("live").version == first
    assert table.put(_descriptor("live", "two")) > first  # a restart is a new version


def test_an_engine_publishes_its_descriptor_again_so_it_never_expires():
    server = RpcServer().start()
    table = MetadataTable()
    serve_metadata(server, table)
    engine = TransferEngine("refreshing", metadata=server.address,
                            options=EngineOptions(protocol="tcp", metadata_ttl=0.5))
    try:
        for _ in range(3):
            time.sleep(0.6)
            assert table.expire(1.0) == []  # published again every 0.1 s, so never 1 s old
        engine.close()
        assert table.names() == []  # withdrawn on close
    finally:
        engine.close()
        server.stop()
