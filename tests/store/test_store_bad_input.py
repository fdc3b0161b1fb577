"""Malformed and hostile requests to a real master: each gets an error, and it keeps serving."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zmq

from daemons.cluster.directory import daemon_address
from store.errors import IllegalClient, InvalidParams, MooncakeError, NoAvailableHandle
from store_cluster import FAST, client_for, paths_of, value_for
from transfer.errors import MessageTooLarge, UnknownOperation
from transfer.rpc import curve
from transfer.rpc.client_server import RpcClient


def test_bad_requests_get_errors_and_the_master_keeps_serving(mooncake):
    assert mooncake("up", env=FAST).returncode == 0
    address = daemon_address(paths_of(mooncake.workdir), "master")

    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    curve.make_client(raw, mooncake.secret)  # a peer that holds the secret, sending junk
    raw.connect(address)
    raw.send_multipart([b"\xc1 not msgpack"])
    assert raw.poll(5000) and b"MALFORMED" in raw.recv_multipart()[0]
    raw.close()

    with RpcClient(address, timeout=5, secret=mooncake.secret) as rpc:
        with pytest.raises(UnknownOperation):
            rpc.call("store.no_such_op")
        bad = [
            ("store.put_start", {"client_id": "c", "key": "k", "size": -1}),
            ("store.put_start", {"client_id": "c", "key": "", "size": 10}),
            ("store.put_start", {"client_id": "c", "key": "k" * 2**20, "size": 10}),
            ("store.put_start", {"client_id": "c", "key": "k", "size": "ten"}),
            ("store.put_start", {"client_id": "", "key": "k", "size": 10}),
            ("store.put_start", {"client_id": "c", "key": "k", "size": 10, "config": {"replica_num": 0}}),
            ("store.put_start", {"client_id": "c", "key": "k", "size": 10, "config": "nope"}),
            ("store.batch_put_start", {"client_id": "c", "keys": ["a", "b"], "sizes": [1]}),
            ("store.reserve_space", {"client_id": "c", "length": -1}),
            ("store.reserve_space", {"client_id": "c", "length": 64, "release": "all"}),
            ("store.batch_put_commit", {"client_id": "c", "reservation": 1, "keys": ["a"], "offsets": [0],
                                        "sizes": [1, 2]}),
            ("store.batch_put_commit", {"client_id": "c", "reservation": "r", "keys": [], "offsets": [],
                                        "sizes": []}),
            ("store.get_replica_list", {}),
            ("store.mount_segment", {"client_id": "c", "segment": {"segment_id": "s", "name": "n",
                                                                  "base": -5, "size": 10}}),
            ("store.ping", {"client_id": "c", "acks": ["not", "a", "map"]}),
            ("store.remount", {"client_id": "c", "segments": "x", "objects": []}),
            ("store.inspect", {"what": "everything"}),
        ]
        for op, args in bad:
            with pytest.raises(InvalidParams):
                rpc.call(op, args)
        with pytest.raises(NoAvailableHandle):  # huge but well-formed: no segment can hold it
            rpc.call("store.put_start", {"client_id": "c", "key": "huge", "size": 2**62})
        with pytest.raises(InvalidParams):  # no replica count this large can be placed
            rpc.call("store.put_start", {"client_id": "c", "key": "k", "size": 2**64 - 1,
                                         "config": {"replica_num": -(2**63)}})

    with client_for(mooncake.workdir) as writer, client_for(mooncake.workdir) as intruder:
        replicas = writer.master.put_start("mine", 64, writer.replicate_config())
        assert replicas
        with pytest.raises(IllegalClient):
            intruder.master.put_end("mine", None)
        with pytest.raises(IllegalClient):
            intruder.master.put_revoke("mine")
        writer.master.put_revoke("mine")
        writer.put("still-serving", b"yes")
        assert bytes(intruder.get("still-serving")) == b"yes"
        with pytest.raises(MooncakeError):
            writer.put("", b"x")
    assert mooncake.json("status", env=FAST)["healthy"] is True


def test_a_batch_over_the_limit_is_refused_before_it_can_starve_a_live_client(mooncake):
    """store_max_batch_keys bounds the work one request does under the master's lock: a hostile
    batch is refused at once (before the limit, 400k keys held the lock for seconds, longer than
    the 1 s client TTL, and the live store client was expired with its objects), while the
    library splits a legitimate large batch into calls under the limit."""
    limit = 64
    assert mooncake("up", env={**FAST, "MOONCAKE_STORE_MAX_BATCH_KEYS": str(limit)}).returncode == 0
    address = daemon_address(paths_of(mooncake.workdir), "master")
    with client_for(mooncake.workdir, store_max_batch_keys=limit) as client:
        keys = [f"bulk-{i}" for i in range(3 * limit + 5)]
        assert client.batch_put(keys, [value_for(k, 256) for k in keys]) == [None] * len(keys)
        with RpcClient(address, timeout=30, secret=mooncake.secret) as rpc:
            for _ in range(3):
                with pytest.raises(InvalidParams, match="store_max_batch_keys"):
                    rpc.call("store.batch_get_replica_list", {"keys": [f"k{i}" for i in range(400_000)]})
            assert len(rpc.call("store.batch_exists", {"keys": keys[:limit]})) == limit
            with pytest.raises(InvalidParams):
                rpc.call("store.batch_exists", {"keys": keys[:limit + 1]})
        # The store client that holds them stayed alive through it: nothing was dropped.
        assert client.batch_exists(keys) == [True] * len(keys)
        assert [bytes(v) for v in client.batch_get(keys)] == [value_for(k, 256) for k in keys]


def _peak_rss(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def test_a_frame_over_the_limit_is_dropped_before_the_master_buffers_it(mooncake):
    """ZeroMQ reads a frame whole before the daemon sees it: without MAXMSGSIZE on the socket,
    a 256 MiB frame sent to a master whose limit is 1 MiB raised its peak RSS by 256 MiB."""
    env = {**FAST, "MOONCAKE_RPC_MAX_MESSAGE_SIZE": "1MiB"}
    assert mooncake("up", env=env).returncode == 0
    paths = paths_of(mooncake.workdir)
    address = daemon_address(paths, "master")
    pid = json.loads(paths.pidfile("master").read_text())["pid"]
    before = _peak_rss(pid)

    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    curve.make_client(raw, mooncake.secret)  # a peer that holds the secret, sending junk
    raw.connect(address)
    raw.send_multipart([b"x" * (256 * 2**20)], copy=False)
    assert not raw.poll(3000)  # dropped unanswered: the connection is closed on the frame's header
    raw.close()

    with RpcClient(address, timeout=5, secret=mooncake.secret) as rpc:
        assert rpc.call("store.inspect", {"what": "counters"})  # still serving
        with pytest.raises(MessageTooLarge):  # frames under the cap, over the limit together: a typed error
            rpc.call("store.inspect", {"what": "counters"}, frames=[bytes(600 * 2**10)] * 2)
    assert _peak_rss(pid) - before < 64 * 2**20
