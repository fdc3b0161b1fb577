"""Put reservations in the master's state machine (store.reservations.state) and the allocator's
carve: a commit publishes objects exactly as PutStart and PutEnd of each would, and a
reservation's range is always accounted for (held, turned into objects, or freed)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from master_helpers import KIB, mounted, put
from store.allocator import RangeAllocator
from store.errors import InvalidParams, ObjectAlreadyExists, ObjectNotFound
from store.events.recorder import STORED, StoreEvent
from store.objects import ReplicateConfig
from store.reservations.state import MAX_RESERVATION_BYTES, MAX_PER_CLIENT

ONE = ReplicateConfig()


def used(m, segment_id="s1") -> int:
    return m.segments[segment_id].allocator.num_used_bytes


def check(m) -> None:
    """Every segment's ranges tile it, and its used bytes are its objects' and reservations'."""
    for segment_id, state in m.segments.items():
        state.allocator.check_invariants()
        objects = sum(state.allocator.block_size(o.size) for o in m.objects.values()
                      for r in o.replicas if r.segment_id == segment_id and r.in_memory)
        reserved = sum(r.length for r in m.reservations.values() if r.segment_id == segment_id)
        assert state.allocator.num_used_bytes == objects + reserved


# -- the allocator's carve --------------------------------------------------------------------
def test_carve_makes_each_piece_a_range_and_frees_the_gaps_and_the_rest():
    a = RangeAllocator(0, 4096, alignment=64)
    start = a.allocate(1024)
    assert a.carve(start, [(0, 100), (192, 64)]) == [0, 192]
    assert a.allocated_size(0) == 128 and a.allocated_size(192) == 64
    assert a.num_used_bytes == 192 and a.num_free_ranges == 2  # [128, 192) and [256, 4096)
    a.check_invariants()
    a.free(0)
    a.free(192)
    assert a.num_used_bytes == 0 and a.num_free_ranges == 1


def test_carve_keeps_the_range_from_keep_from_on():
    a = RangeAllocator(0, 4096, alignment=64)
    start = a.allocate(1024)
    assert a.carve(start, [(0, 64)], keep_from=128) == [0]
    assert a.allocated_size(128) == 896 and a.num_used_bytes == 64 + 896
    a.check_invariants()


@pytest.mark.parametrize("pieces, keep_from", [
    ([(0, 64), (32, 64)], None),  # overlapping
    ([(10, 64)], None),  # unaligned
    ([(0, 0)], None),  # empty
    ([(0, 2048)], None),  # beyond the range
    ([(0, 128)], 64),  # beyond what may be cut
    ([(0, 64)], 100),  # an unaligned rest
    ([(0, True)], None),
])
def test_carve_refuses_bad_pieces_and_changes_nothing(pieces, keep_from):
    a = RangeAllocator(0, 4096, alignment=64)
    start = a.allocate(1024)
    with pytest.raises(InvalidParams):
        a.carve(start, pieces, keep_from)
    assert a.allocated_size(start) == 1024 and a.num_used_bytes == 1024
    a.check_invariants()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 200)), max_size=8), st.integers(0, 16))
def test_carve_keeps_the_segment_tiled_whatever_the_pieces(gaps_and_sizes, keep_blocks):
    a = RangeAllocator(0, 8192, alignment=64)
    start = a.allocate(4096)
    pieces, cursor = [], 0
    for gap, size in gaps_and_sizes:
        pieces.append((cursor + gap * 64, size))
        cursor += gap * 64 + a.block_size(size)
    keep_from = max(cursor, keep_blocks * 64)
    if keep_from > 4096:
        return
    addresses = a.carve(start, pieces, keep_from if keep_from < 4096 else None)
    a.check_invariants()
    assert a.num_used_bytes == sum(a.block_size(n) for _, n in pieces) + (4096 - keep_from if keep_from < 4096 else 0)
    assert addresses == [start + offset for offset, _ in pieces]


# -- grants and commits -----------------------------------------------------------------------
def test_a_commit_publishes_its_objects_as_put_start_and_put_end_would():
    m = mounted(1, size=64 * KIB)
    m.kv_events.take()
    grant = m.reserve_space("c1", 4 * KIB, 1.0, ONE)
    assert grant.replica.segment_id == "s1" and grant.replica.size == 4 * KIB and grant.alignment == 64
    assert not m.exists("a") and used(m) == 4 * KIB  # reserved: used, and nobody's object
    results, following = m.batch_put_commit("c1", grant.reservation_id, ["a", "b"], [0, 128], [100, 64],
                                            [7, None], 2.0, ONE)
    assert results == [None, None] and following is None
    a, b = m.get_replica_list("a", 3.0), m.get_replica_list("b", 3.0)
    assert (a.size, a.checksum, a.replicas[0].address) == (100, 7, grant.replica.address)
    assert (b.size, b.checksum, b.replicas[0].address) == (64, None, grant.replica.address + 128)
    assert m.kv_events.take() == [StoreEvent(STORED, "a", "s1"), StoreEvent(STORED, "b", "s1")]
    assert [(c.kind, c.key, c.size, c.checksum) for c in m.journal.since("s1", 0)] == [
        ("complete", "a", 100, 7), ("complete", "b", 64, None)]
    assert (m.stats.num_put_starts, m.stats.num_put_ends, m.stats.num_reservations) == (2, 2, 1)
    assert m.reservations == {} and used(m) == 128 + 64  # the gap and the rest went back
    check(m)


def test_a_commit_with_consumed_keeps_the_rest_for_the_next_one():
    m = mounted(1, size=64 * KIB)
    grant = m.reserve_space("c1", 4 * KIB, 1.0, ONE)
    m.batch_put_commit("c1", grant.reservation_id, ["a"], [0], [64], [1], 1.1, ONE, consumed=64)
    assert used(m) == 4 * KIB  # one object, and the rest still reserved
    m.batch_put_commit("c1", grant.reservation_id, ["b"], [0], [64], [2], 1.2, ONE, consumed=64)
    assert m.get_replica_list("b", 2.0).replicas[0].address == grant.replica.address + 64
    _, following = m.batch_put_commit("c1", grant.reservation_id, ["c"], [0], [64], [3], 1.3, ONE,
                                      consumed=64, reserve=KIB)
    assert grant.reservation_id not in m.reservations and following.reservation_id in m.reservations
    assert following.replica.size == KIB and used(m) == 3 * 64 + KIB
    check(m)


def test_a_key_that_exists_fails_alone_and_its_range_is_freed():
    m = mounted(1, size=64 * KIB)
    put(m, "taken", 64, 0.0)
    grant = m.reserve_space("c1", KIB, 1.0, ONE)
    results, _ = m.batch_put_commit("c1", grant.reservation_id, ["new", "taken", "new"], [0, 64, 128],
                                    [64, 64, 64], [1, 2, 3], 1.0, ONE)
    assert results[0] is None and isinstance(results[1], ObjectAlreadyExists)
    assert isinstance(results[2], ObjectAlreadyExists)  # the batch's own first "new" took it
    assert m.get_replica_list("new", 2.0).checksum == 1 and m.get_replica_list("taken", 2.0).checksum is None
    assert used(m) == 2 * 64
    check(m)


def test_a_commit_preempts_an_abandoned_put_as_put_start_does():
    m = mounted(1, size=64 * KIB, put_start_discard_timeout=5.0)
    m.put_start("c2", "k", 64, 0.0)
    grant = m.reserve_space("c1", KIB, 1.0, ONE)
    assert isinstance(m.batch_put_commit("c1", grant.reservation_id, ["k"], [0], [64], [1], 1.0, ONE)[0][0],
                      ObjectAlreadyExists)  # young: refused
    grant = m.reserve_space("c1", KIB, 6.0, ONE)
    assert m.batch_put_commit("c1", grant.reservation_id, ["k"], [0], [64], [1], 6.0, ONE)[0] == [None]
    assert m.stats.num_preempted == 1 and m.get_replica_list("k", 7.0).checksum == 1
    check(m)


def test_pins_come_from_the_commits_config():
    m = mounted(1, size=64 * KIB)
    grant = m.reserve_space("c1", KIB, 1.0, ONE)
    m.batch_put_commit("c1", grant.reservation_id, ["p"], [0], [64], [1], 1.0, ReplicateConfig(hard_pin=True))
    assert m.objects["p"].hard_pinned


def test_a_commit_naming_no_config_puts_and_grants_again_with_the_grants():
    """What a client sends: it commits with the config it asked the grant for."""
    m = mounted(2, size=64 * KIB)
    pinned = ReplicateConfig(hard_pin=True, preferred_segments=("s1",))
    grant = m.reserve_space("c1", KIB, 1.0, pinned)
    _, following = m.batch_put_commit("c1", grant.reservation_id, ["p"], [0], [64], [1], 1.0, None, reserve=KIB)
    assert m.objects["p"].hard_pinned
    assert following is not None and following.replica.segment_id == "s1"
    m.batch_put_commit("c1", following.reservation_id, ["q"], [0], [64], [1], 1.1, None)
    assert m.objects["q"].hard_pinned and m.objects["q"].replicas[0].segment_id == "s1"
    check(m)


@pytest.mark.parametrize("lose", ["expiry", "release", "unmount", "drain", "client_expiry", "other_client", "quota"])
def test_a_commit_into_a_lost_reservation_fails_whole_and_leaves_no_range_behind(lose):
    m = mounted(2, size=64 * KIB, put_start_discard_timeout=30.0, client_ttl=10.0)
    grant = m.reserve_space("c2", KIB, 1.0, ReplicateConfig(preferred_segments=("s1",)))
    assert grant.replica.segment_id == "s1"
    now = 2.0
    client = "c2"
    if lose == "expiry":
        now = 31.0
        m.ping("c2", now)
        m.ping("c1", now)
        m.expire_reservations(now)
    elif lose == "release":
        m.reserve_space("c2", 0, now, ONE, release=[grant.reservation_id])
    elif lose == "unmount":
        m.unmount_segment("c1", "s1", now)
    elif lose == "drain":
        m.drain_start("c1", "s1", now)
    elif lose == "client_expiry":
        m.ping("c1", 11.5)
        m.expire_clients(11.5)
        assert "c2" not in m.clients
    elif lose == "other_client":
        client = "c1"
    elif lose == "quota":
        m.tenants.set_quota("default", 1 << 20)
    with pytest.raises(ObjectNotFound):
        m.batch_put_commit(client, grant.reservation_id, ["k"], [0], [64], [1], now, ONE)
    assert not m.exists("k")
    if lose == "other_client":
        assert grant.reservation_id in m.reservations  # still its owner's
    else:
        assert m.reservations == {} and ("s1" not in m.segments or used(m) == 0)
    check(m)


def test_bad_pieces_refuse_the_commit_and_free_the_reservation():
    m = mounted(1, size=64 * KIB)
    grant = m.reserve_space("c1", KIB, 1.0, ONE)
    with pytest.raises(InvalidParams):
        m.batch_put_commit("c1", grant.reservation_id, ["a", "b"], [0, 32], [64, 64], [1, 2], 1.0, ONE)
    assert m.reservations == {} and used(m) == 0 and not m.exists("a")
    check(m)


@pytest.mark.parametrize("config, length, quota", [
    (ReplicateConfig(replica_num=2), KIB, None),  # PutStart places replicas on distinct segments
    (ONE, MAX_RESERVATION_BYTES + 64, None),
    (ONE, 128 * KIB, None),  # no room without evicting: a put evicts, a reservation does not
    (ONE, KIB, 1 << 20),  # a tenant quota may need eviction per key
])
def test_no_grant_where_a_reservation_could_change_what_a_put_means(config, length, quota):
    m = mounted(2, size=64 * KIB)
    if quota is not None:
        m.tenants.set_quota("t", quota)
    assert m.reserve_space("c1", length, 1.0, config) is None
    assert m.reservations == {} and used(m) == used(m, "s2") == 0


def test_one_client_holds_a_bounded_number_of_reservations():
    m = mounted(1, size=1 << 20)
    grants = [m.reserve_space("c1", KIB, 1.0, ONE) for _ in range(MAX_PER_CLIENT + 1)]
    assert all(grants[:MAX_PER_CLIENT]) and grants[-1] is None
    assert m.reserve_space("c2", KIB, 1.0, ONE) is not None  # another client's are its own


@pytest.mark.parametrize("strategy", ["random", "local_first"])
@pytest.mark.parametrize("config", [ONE, ReplicateConfig(preferred_segments=("s2",)), ReplicateConfig(host="h3")])
def test_a_reservation_goes_where_the_put_would(strategy, config):
    """Placed by the same placement order as a PutStart: two masters alike, one putting, one
    reserving, choose the same segments call after call."""
    putting, reserving = mounted(3, size=64 * KIB, allocation_strategy=strategy), \
        mounted(3, size=64 * KIB, allocation_strategy=strategy)
    for n in range(6):
        chosen = putting.put_start("c9", f"k{n}", KIB, 1.0, config)[0].segment_id
        assert reserving.reserve_space("c9", KIB, 1.0, config).replica.segment_id == chosen


# Tenants' keys, and keys the master refuses: empty, a tenant's empty key, over max_key_length
# (8 bytes in this test) in characters or only in UTF-8 bytes.
keys = st.sampled_from(["a", "b", "c", "d", "", "t\0a", "t\0b", "t\0", "\0a", "éé", "ééééé", "abcdefghi"])
batches = st.lists(st.tuples(keys, st.integers(1, 300)), min_size=0, max_size=6)
configs = st.sampled_from([ONE, ReplicateConfig(hard_pin=True), ReplicateConfig(soft_pin=True),
                           ReplicateConfig(soft_pin=True, soft_pin_ttl=5.0)])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), batches, configs), max_size=6))
def test_committed_puts_end_as_plain_puts_do(history):
    """The same batches, put the plain way (PutStart, PutEnd per key) into one master and
    committed from reservations into another: the same answers, objects, journal and events,
    addresses aside; and every range accounted for throughout."""
    plain, reserved = mounted(1, size=64 * KIB, max_key_length=8), mounted(1, size=64 * KIB, max_key_length=8)
    for step, (keep_rest, batch, config) in enumerate(history):
        now = float(step)
        names, sizes = [k for k, _ in batch], [n for _, n in batch]
        started = plain.batch_put_start("c1", names, sizes, now, config)
        ended = plain.batch_put_end("c1", [k for k, s in zip(names, started) if isinstance(s, list)], now,
                                    [n for n, s in zip(sizes, started) if isinstance(s, list)])
        expected = iter(ended)
        want = [type(s) if not isinstance(s, list) else type(next(expected)) for s in started]
        grant = reserved.reserve_space("c1", 2 * KIB, now, config)
        offsets = [i * 320 for i in range(len(batch))]  # aligned, a gap after each
        results, _ = reserved.batch_put_commit("c1", grant.reservation_id, names, offsets, sizes, sizes, now, config,
                                               consumed=len(batch) * 320 if keep_rest else None)
        assert [type(r) for r in results] == want
        check(reserved)
    assert {k: _record(o) for k, o in plain.objects.items()} == {k: _record(o) for k, o in reserved.objects.items()}
    assert list(plain.lru) == list(reserved.lru) and plain.tenants.used == reserved.tenants.used
    assert plain.stats.num_put_starts == reserved.stats.num_put_starts
    assert [(c.kind, c.key, c.size, c.checksum) for c in plain.journal.since("s1", 0)] == \
        [(c.kind, c.key, c.size, c.checksum) for c in reserved.journal.since("s1", 0)]
    assert plain.kv_events.take() == reserved.kv_events.take()
    assert plain.stats.num_put_ends == reserved.stats.num_put_ends


def _record(obj) -> tuple:
    """Everything the master keeps of an object but where its replicas are."""
    fields = {**{name: getattr(obj, name) for name in obj.__slots__}, "replicas": None}
    return (*sorted(fields.items()), *[(r.segment_id, r.status, r.tier) for r in obj.replicas])
