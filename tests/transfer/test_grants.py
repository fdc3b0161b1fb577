"""Data-plane grants (transfer.grants): what a tenant's connection may move, and nothing more."""

from __future__ import annotations

from transfer import grants
from transfer.auth import ClusterSecret
from transfer.batch import OpCode

SECRET = ClusterSecret("a-cluster-secret-for-grants")
READ, WRITE = OpCode.READ, OpCode.WRITE


def test_a_grant_covers_its_segment_operation_and_range_until_it_expires():
    ranges = grants.GrantedRanges(SECRET, "seg-a")
    assert ranges.add(grants.issue(SECRET, "seg-a", READ, 4096, 1000, expiry=100.0), now=10.0) == 0
    assert ranges.covers(READ, 4096, 1000, 10.0) and ranges.covers(READ, 4500, 100, 99.0)  # a slice of it
    assert not ranges.covers(READ, 4096, 1001, 10.0)  # past its end
    assert not ranges.covers(READ, 4000, 100, 10.0)  # before its start
    assert not ranges.covers(WRITE, 4096, 1000, 10.0)  # a READ grant writes nothing
    assert not ranges.covers(READ, 4096, 1000, 100.0)  # expired


def test_grants_of_another_segment_secret_or_tampered_or_expired_are_refused():
    ranges = grants.GrantedRanges(SECRET, "seg-a")
    token = grants.issue(SECRET, "seg-a", WRITE, 0, 64, expiry=100.0)
    tampered = token[:1] + (1 << 20).to_bytes(8, "little") + token[9:]  # the address moved
    refused = [grants.issue(SECRET, "seg-b", WRITE, 0, 64, 100.0),
               grants.issue(ClusterSecret("another-cluster-secret!"), "seg-a", WRITE, 0, 64, 100.0),
               tampered, grants.issue(SECRET, "seg-a", WRITE, 0, 64, expiry=5.0)]
    assert ranges.add(b"".join(refused), now=10.0) == len(refused)
    assert not ranges.covers(WRITE, 0, 64, 10.0) and not ranges.covers(WRITE, 1 << 20, 64, 10.0)


def test_a_full_table_forgets_expired_grants_first():
    ranges = grants.GrantedRanges(SECRET, "seg-a")
    stale = b"".join(grants.issue(SECRET, "seg-a", READ, n * 64, 64, expiry=20.0) for n in range(grants.MAX_GRANTS))
    assert ranges.add(stale, now=10.0) == 0
    ranges.add(grants.issue(SECRET, "seg-a", READ, 1 << 40, 64, expiry=100.0), now=30.0)
    assert ranges.covers(READ, 1 << 40, 64, 30.0) and not ranges.covers(READ, 0, 64, 15.0)
