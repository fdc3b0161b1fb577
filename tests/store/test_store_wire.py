"""The store's batch messages as the master packs them and the client reads them back.

Replica lists and segment-journal changes travel as msgpack arrays of their named tuples'
fields (no per-object map on the master's lock-holding I/O thread), so the reading side must
take exactly that shape and refuse anything else with InvalidParams.
"""

from __future__ import annotations

import msgpack
import pytest

from store.errors import InvalidParams
from store.objects import ReplicaDescriptor, ReplicaList
from store.segment_journal import SegmentJournal
from store.tenants import DEFAULT_TENANT, scoped_key, scoped_keys
from store.wire import batch_from_wire, batch_to_wire, int_list_arg, replica_list_from_wire, str_list_arg


def _over_the_wire(value):
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


def test_a_batch_of_replica_lists_comes_back_as_it_was_put_on_the_wire():
    memory = ReplicaDescriptor("s1", "seg-1", "tcp://h:1", "h", 4096, 100)
    disk = ReplicaDescriptor("s2", "seg-2", "tcp://h:2", "h", 0, 100, "LOCAL_DISK")
    lists = [ReplicaList("a", 100, [memory, disk], 5.0, 123, False),
             ReplicaList("b", 100, [memory], 5.0, None, True)]
    decoded = batch_from_wire(_over_the_wire(batch_to_wire(lists)), replica_list_from_wire)
    assert decoded == lists
    # The named tuples themselves (equality alone would take plain tuples), with the fields' names.
    assert all(type(d) is ReplicaList for d in decoded)
    assert all(type(r) is ReplicaDescriptor for d in decoded for r in d.replicas)
    assert decoded[0].replicas[1].tier == "LOCAL_DISK" and decoded[1].promote


@pytest.mark.parametrize("bad", [
    {"key": "a", "size": 1, "replicas": [], "lease_ttl": 5.0, "checksum": None, "promote": False},  # a map
    ["a", 1, [], 5.0, None],  # a field short
    ["a", True, [], 5.0, None, False],  # a bool is no size
    ["a", 1, [], 5.0, "123", False],  # a checksum is an integer or nil
    ["a", 1, [["s1", "seg-1", "e", "h", 0, 1]], 5.0, None, False],  # a replica a field short
])
def test_a_replica_list_of_the_wrong_shape_is_refused(bad):
    with pytest.raises(InvalidParams):
        replica_list_from_wire(_over_the_wire(bad))


def test_journal_changes_unpack_positionally_in_field_order():
    journal = SegmentJournal()
    journal.completed("s1", "k", 4096, 100, 7, True)
    journal.gone("s1", "k", 4096)
    unpacked = _over_the_wire(journal.since("s1", 0))
    assert unpacked == [[1, "complete", "k", 4096, 100, 7, True], [2, "gone", "k", 4096, 0, None, False]]


@pytest.mark.parametrize("name, values, culprit", [
    ("keys", ["a", "b", 3], "keys must be a string, got int"),
    ("offsets", [0, 64, True], "offsets must be an integer, got bool"),  # a bool is no integer
    ("offsets", [0, 64.0], "offsets must be an integer, got float"),
])
def test_a_list_argument_with_one_bad_item_is_refused_naming_it(name, values, culprit):
    check = str_list_arg if name == "keys" else int_list_arg
    with pytest.raises(InvalidParams, match=culprit):
        check({name: _over_the_wire(values)}, name)


def test_list_arguments_of_the_right_items_come_back_as_sent():
    assert str_list_arg({"keys": ["a", "é"]}, "keys") == ["a", "é"]
    assert int_list_arg({"sizes": [0, 1 << 40]}, "sizes") == [0, 1 << 40]


def test_a_batch_of_keys_is_scoped_like_each_key_and_refused_whole_for_a_nul():
    keys = ["a", "b\x01", "é"]
    assert scoped_keys("t", keys) == [scoped_key("t", k) for k in keys]
    assert scoped_keys(DEFAULT_TENANT, keys) == keys
    for tenant in ("t", DEFAULT_TENANT):
        with pytest.raises(InvalidParams, match="NUL"):
            scoped_keys(tenant, ["a", "b\0c", "d"])
