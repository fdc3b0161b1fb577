"""A batch op of the master does to its state exactly what its keys one by one do.

The batch forms pay once for what their keys share (the config, the client's touch, the tenants'
quota room, the journal and KV-event appends); hypothesis drives two masters through the same
random history, one with the batch ops, the other with each batch as the single-key path runs it
(one placement order, then each key through ``_put_start`` / ``_put_end`` / ``get_replica_list``),
and compares after every step what each call answered and everything the state holds: objects,
LRU order, every allocator's ranges, tenants' charges, quarantined grants, journals (the op log's
too), KV events, counters, the random placement's state.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.errors import MooncakeError
from store.master_state import MasterState
from store.objects import ReplicateConfig, Segment
from store.oplog import OpLogJournal
from store.policy import StorePolicy
from store.tenants import scoped_key

CLIENTS = ("c1", "c2")
TENANTS = ("default", "t")
SEGMENTS = ("s1", "s2", "s3")


def per_key_batch_put_start(m: MasterState, client_id, keys, sizes, now, config):
    """A batch PutStart key by key: one placement order, then each key as a single put."""
    m._check_batch(keys, sizes)
    try:
        m._check_config(config)
        m._touch(client_id, now)
    except MooncakeError as exc:
        return [exc] * len(keys)
    order = m._placement(client_id, config)
    return [attempt(m._put_start, client_id, k, n, now, config, order) for k, n in zip(keys, sizes)]


def per_key_batch_put_end(m: MasterState, client_id, keys, now, checksums):
    try:
        m._touch(client_id, now)
    except MooncakeError as exc:
        return [exc] * len(keys)
    return [attempt(m._put_end, client_id, k, now, c) for k, c in zip(keys, checksums)]


def per_key_batch_get(m: MasterState, keys, now):
    return [attempt(m.get_replica_list, k, now) for k in keys]


def attempt(method, *args):
    try:
        return method(*args)
    except MooncakeError as exc:
        return exc


def answered(result):
    """A call's answer, comparable: errors by type and message."""
    if isinstance(result, MooncakeError):
        return type(result).__name__, str(result)
    if isinstance(result, (list, tuple)) and not hasattr(result, "_fields"):  # not a named tuple
        return [answered(r) for r in result]
    return result


def state_of(m: MasterState):
    batches, num_changes = m.journal.take(m.segments, m.offload_pending)
    return {
        "objects": list(m.objects.items()),
        "lru": list(m.lru),
        "allocators": {sid: vars(s.allocator) for sid, s in m.segments.items()},
        "tenants": list(m.tenants.used.items()),
        "quarantine": vars(m.quarantine),
        "journal": {sid: m.journal.since(sid, 0) for sid in m.segments},
        "oplog": (batches, num_changes),
        "events": m.kv_events.take(),
        "stats": vars(m.stats),
        "offload_pending": list(m.offload_pending.items()),
        "evicting_for": m._evicting_for,
        "clients": list(m.clients.items()),
        "drains": m.drains,
        "rng": m._rng.getstate(),
    }


keys = st.builds(scoped_key, st.sampled_from(TENANTS), st.sampled_from([*"abcdefghijkl", *"abcdef", "", "long-key-name"]))
sizes = st.sampled_from([1, 64, 64, 100, 100, 300, 700, 1500, 4000, 0, -1])
configs = st.builds(ReplicateConfig, replica_num=st.sampled_from([1, 1, 1, 1, 2, 3, 0]), soft_pin=st.booleans(),
                    hard_pin=st.sampled_from([False, False, True]),
                    preferred_segments=st.lists(st.sampled_from(SEGMENTS), max_size=2).map(tuple),
                    host=st.sampled_from(["", "h1"]))
clients = st.sampled_from(CLIENTS)
# A whole batch put (start, then end of the same keys) is the common case: it fills segments
# up to eviction, and it makes objects for the other ops to find.
whole_batch_put = st.tuples(st.just("batch_put"), clients, st.lists(st.tuples(keys, sizes), min_size=1, max_size=8),
                            configs, st.booleans())
batch_put_start = st.tuples(st.just("batch_put_start"), clients, st.lists(st.tuples(keys, sizes), max_size=8),
                            configs, st.booleans())
operations = st.one_of(
    whole_batch_put, batch_put_start,
    st.tuples(st.just("batch_put_end"), clients, st.lists(st.tuples(keys, st.sampled_from([None, 7])), max_size=8)),
    st.tuples(st.just("batch_get"), st.lists(keys, max_size=6)),
    st.tuples(st.just("put_start"), clients, keys, sizes, configs),
    st.tuples(st.just("put_end"), clients, keys),
    st.tuples(st.just("put_revoke"), clients, keys),
    st.tuples(st.just("remove"), st.lists(keys, max_size=4), st.booleans()),
    st.tuples(st.just("remove_all"), st.booleans(), st.sampled_from(TENANTS)),
    st.tuples(st.just("evict")),
    st.tuples(st.just("quota"), st.sampled_from(TENANTS), st.sampled_from([0, 1000, 3000, 8000])),
    st.tuples(st.just("drain_start"), st.sampled_from(SEGMENTS)),
    st.tuples(st.just("drain_cancel"), st.sampled_from(SEGMENTS)),
)


def run(m: MasterState, op: tuple, now: float, batched: bool):
    """Apply ``op`` (batches as the batch op, or key by key); its answer."""
    kind, *args = op
    if kind == "batch_put":
        started = run(m, ("batch_put_start", *args), now, batched)
        ended = run(m, ("batch_put_end", args[0], [(k, 7) for k, _ in args[1]]), now, batched)
        return started, ended
    if kind == "batch_put_start":
        client_id, items, config, grant = args
        keys, sizes = [k for k, _ in items], [n for _, n in items]
        put = m.batch_put_start if batched else lambda *a: per_key_batch_put_start(m, *a)
        result = put(client_id, keys, sizes, now, config)
        if grant:  # as the service does for a tenant's put: its ranges are held while granted
            for replicas in result:
                for r in replicas if isinstance(replicas, list) else []:
                    m.quarantine.granted(r.segment_id, r.address, now + 5.0)
        return result
    if kind == "batch_put_end":
        client_id, items = args
        keys, checksums = [k for k, _ in items], [c for _, c in items]
        if batched:
            return m.batch_put_end(client_id, keys, now, checksums)
        return per_key_batch_put_end(m, client_id, keys, now, checksums)
    if kind == "batch_get":
        return m.batch_get_replica_list(args[0], now) if batched else per_key_batch_get(m, args[0], now)
    if kind == "put_start":
        client_id, key, size, config = args
        return attempt(m.put_start, client_id, key, size, now, config)
    if kind in ("put_end", "put_revoke"):
        return attempt(getattr(m, kind), *args, now)
    if kind == "remove":
        return m.batch_remove(args[0], now, args[1])
    if kind == "remove_all":
        return m.remove_all(now, *args)
    if kind == "evict":
        return m.evict(now)
    if kind == "quota":
        return m.set_tenant_quota(*args)
    if kind in ("drain_start", "drain_cancel"):
        return attempt(getattr(m, kind), "o1", args[0], now)
    raise AssertionError(kind)


def fresh(policy: StorePolicy, segment_sizes: list[int]) -> MasterState:
    m = MasterState(policy, seed=7)
    m.journal = OpLogJournal()  # the HA master's: what it writes to etcd must agree too
    for i, size in enumerate(segment_sizes, 1):
        m.mount_segment("o1", Segment(f"s{i}", f"seg{i}", i << 20, size, f"ep{i}", f"h{i}"), 0.0)
    return m


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.builds(StorePolicy, allocation_strategy=st.sampled_from(["random", "free_ratio_first", "local_first"]),
                        max_key_length=st.sampled_from([8, 4096]), offload_policy=st.sampled_from(["evicted", "all"]),
                        tenant_quotas=st.sampled_from(["", "t=2000", "default=5000,t=1000"]),
                        default_tenant_quota=st.sampled_from([0, 6000]), lease_ttl=st.just(10.0),
                        put_start_discard_timeout=st.just(30.0), high_watermark=st.sampled_from([0.5, 0.9])),
       segment_sizes=st.lists(st.sampled_from([2048, 4096, 8192]), min_size=1, max_size=3),
       # Rounds of: any op, a batch put, a pause; so that every state an op leaves (ranges held
       # for their grants, objects to preempt, full segments, quotas) meets a batch.
       history=st.lists(st.tuples(operations, st.one_of(whole_batch_put, batch_put_start),
                                  st.sampled_from([0.0, 0.5, 3.0, 12.0, 40.0])), min_size=3, max_size=15))
def test_a_batch_does_what_its_keys_one_by_one_do(policy, segment_sizes, history):
    batched, by_key = fresh(policy, segment_sizes), fresh(policy, segment_sizes)
    now = 1.0
    for step, (op, batch, pause) in enumerate(history):
        for call in (op, batch):
            got, expected = answered(run(batched, call, now, True)), answered(run(by_key, call, now, False))
            assert got == expected, f"step {step} {call}: answers differ"
            assert state_of(batched) == state_of(by_key), f"step {step} {call}: states differ"
        now += pause
