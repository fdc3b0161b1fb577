"""Tenants in the master's state machine: quotas, what each tenant is charged, and eviction that
never takes one tenant's objects to make room for another's.

Segments are 1 KiB with 64-byte alignment (16 slots). Keys are scoped as the service scopes them
(store.tenants): ``a\\0k`` is key ``k`` of tenant ``a``; a bare key is the default tenant's.
"""

import random

import pytest

from master_helpers import KIB, mounted, put, segment
from store.errors import InvalidParams, MooncakeError, NoAvailableHandle, TenantQuotaExceeded
from store.objects import ReplicateConfig, ReportedObject
from store.tenants import DEFAULT_TENANT, check_tenant, parse_quotas, scoped_key, split_key, tenant_of


def a(key: str) -> str:
    return scoped_key("a", key)


def b(key: str) -> str:
    return scoped_key("b", key)


def recount(m) -> dict[str, int]:
    """What every tenant holds, counted from scratch: object size once per memory range."""
    held: dict[str, int] = {}
    for obj in m.objects.values():
        ranges = [r for r in obj.replicas + obj.copying if r.in_memory]
        ranges += [obj.promoting] if obj.promoting else []
        if ranges:
            held[tenant_of(obj.key)] = held.get(tenant_of(obj.key), 0) + obj.size * len(ranges)
    return held


def test_scoped_keys_keep_the_default_tenants_keys_as_they_were_and_refuse_nul():
    assert scoped_key(DEFAULT_TENANT, "k") == "k" and split_key("k") == (DEFAULT_TENANT, "k")
    assert split_key(scoped_key("team-1", "k")) == ("team-1", "k") != split_key("k")
    with pytest.raises(InvalidParams):
        scoped_key(DEFAULT_TENANT, "b\0k")  # would otherwise name tenant b's key k
    for bad in ("", "_reserved", "tab\there", "é", "x" * 129, 7):
        with pytest.raises(InvalidParams):
            check_tenant(bad)
    assert parse_quotas(" a=1KiB, b=0 ,") == {"a": 1024, "b": 0}
    for bad in ("a", "a=lots", "=1KiB", "_a=1"):
        with pytest.raises(InvalidParams):
            parse_quotas(bad)


def test_a_put_past_the_quota_fails_with_tenant_quota_exceeded_and_frees_nothing():
    m = mounted(2, tenant_quotas="a=256")
    for i in range(4):
        put(m, a(f"k{i}"), 64, now=float(i), hard_pin=True)
    with pytest.raises(TenantQuotaExceeded) as failed:
        m.put_start("c1", a("one-more"), 64, now=5.0)
    assert failed.value.code == -1700 and failed.value.name == "TENANT_QUOTA_EXCEEDED"
    assert m.tenants.used == {"a": 256} and len(m.objects) == 4
    # Replicas count: 2 x 64 of b's own quota is 128.
    m.tenants.set_quota("b", 128)
    put(m, b("two"), 64, now=6.0, replica_num=2, hard_pin=True)
    with pytest.raises(TenantQuotaExceeded):
        m.put_start("c1", b("more"), 64, now=7.0)
    put(m, "default-tenant", 64, now=8.0)  # unlimited, and unaffected by a and b
    assert m.stats.num_quota_rejections == 2


def test_at_its_quota_a_tenant_evicts_its_own_lru_objects_not_others():
    m = mounted(1, tenant_quotas="a=256")
    for i in range(4):
        put(m, a(f"k{i}"), 64, now=float(i))
        put(m, b(f"k{i}"), 64, now=float(i))
    put(m, a("new"), 128, now=10.0)
    assert {split_key(k)[1] for k in m.objects if tenant_of(k) == "a"} == {"k2", "k3", "new"}
    assert all(b(f"k{i}") in m.objects for i in range(4))
    assert m.tenants.used == {"a": 256, "b": 256} and m.stats.num_quota_evictions == 2


def test_a_full_pool_evicts_only_the_putting_tenants_objects():
    m = mounted(1, high_watermark=1.0)  # no background eviction of everyone's objects
    for i in range(12):
        put(m, b(f"k{i}"), 64, now=float(i))  # b holds 12 of the 16 slots, all evictable
    for i in range(4):
        put(m, a(f"k{i}"), 64, now=20.0 + i)
    put(m, a("new"), 128, now=30.0)  # the pool is full: a's two oldest make room
    assert a("k0") not in m.objects and a("k1") not in m.objects
    # The headroom the next tick makes comes from a alone too.
    assert all(tenant_of(k) == "a" for k in m.evict(now=31.0))
    assert all(b(f"k{i}") in m.objects for i in range(12))
    for key in [k for k in m.objects if tenant_of(k) == "a"]:
        m.remove(key, now=32.0)
    put(m, a("pinned"), 64 * 4, now=33.0, hard_pin=True)
    with pytest.raises(NoAvailableHandle):  # a has nothing left to evict; b is not touched
        m.put_start("c1", a("big"), 64, now=34.0)
    assert all(b(f"k{i}") in m.objects for i in range(12))


def test_background_eviction_takes_from_each_tenant_in_proportion_to_what_it_holds():
    m = mounted(1, high_watermark=0.5, eviction_ratio=0.25)
    for i in range(9):
        put(m, b(f"k{i}"), 64, now=float(i))  # b: 9 slots, older
    for i in range(3):
        put(m, a(f"k{i}"), 64, now=10.0 + i)  # a: 3 slots, newer
    evicted = m.evict(now=20.0)
    # 12 of 16 slots used, the target is 0.5 - 0.25 of 16 = 4: 8 go, 6 of b's and 2 of a's,
    # each tenant's least recently used first (plain LRU would have taken 8 of b's).
    assert sorted(evicted) == sorted([b(f"k{i}") for i in range(6)] + [a("k0"), a("k1")])
    assert m.tenants.used == recount(m) == {"a": 64, "b": 192}


def test_a_tenant_pinned_past_its_share_leaves_the_rest_to_the_others():
    m = mounted(1, high_watermark=0.5, eviction_ratio=0.25)
    for i in range(6):
        put(m, a(f"k{i}"), 64, now=float(i), hard_pin=True)
    for i in range(6):
        put(m, b(f"k{i}"), 64, now=10.0 + i)
    evicted = m.evict(now=20.0)  # 8 to go: a's share is 4 but it can give none
    assert len(evicted) == 6 and all(tenant_of(k) == "b" for k in evicted)


def test_a_quota_lowered_at_run_time_trims_that_tenant_only_and_raising_it_lets_puts_through():
    m = mounted(1)
    for i in range(4):
        put(m, a(f"k{i}"), 64, now=float(i))
        put(m, b(f"k{i}"), 64, now=float(i))
    m.tenants.set_quota("a", 128)
    assert sorted(m.evict(now=10.0)) == [a("k0"), a("k1")]
    assert m.tenants.used == {"a": 128, "b": 256}
    put(m, a("pinned"), 64, now=11.0, hard_pin=True)  # evicts a's k2 to stay within 128
    m.get_replica_list(a("k3"), now=12.0)  # leased: not evictable either
    with pytest.raises(TenantQuotaExceeded):
        m.put_start("c1", a("more"), 64, now=12.5)
    m.tenants.set_quota("a", 0)  # unlimited
    put(m, a("more"), 64, now=13.0)
    assert m.tenants.used == recount(m) == {"a": 192, "b": 256}


def test_the_charges_follow_every_range_a_tenant_holds():
    m = mounted(2, size=2 * KIB)
    put(m, a("x"), 100, now=0.0, replica_num=2)
    put(m, b("y"), 64, now=0.0, preferred_segments=("s1",))
    m.copy_start("c1", b("y"), ["s2"], now=1.0)  # a copy's target is held from its start
    assert m.tenants.used == recount(m) == {"a": 200, "b": 128}
    m.copy_end("c1", b("y"), now=2.0, drop_segment="s1")
    m.put_start("c1", a("inflight"), 64, now=3.0, config=ReplicateConfig(preferred_segments=("s1",)))
    assert m.tenants.used == recount(m) == {"a": 264, "b": 64}
    m.unmount_segment("c2", "s2", now=4.0)  # y lost its only replica; x keeps one
    assert "b" not in m.tenants.used and m.tenants.used == recount(m) == {"a": 164}
    m.remove_all(now=5.0, tenant="a")  # the complete ones; the put in flight stays
    assert m.tenants.used == recount(m) == {"a": 64}
    m.mount_segment("c3", segment(3), now=6.0)
    m.remount("c3", [segment(3)], [ReportedObject(b("back"), "s3", 3 << 20, 64)], now=7.0)
    assert m.tenants.used == recount(m) == {"a": 64, "b": 64}


def test_remove_all_removes_only_the_callers_tenant():
    m = mounted(1)
    for key in ("k", a("k"), b("k")):
        put(m, key, 64, now=0.0)
    assert m.remove_all(now=1.0, tenant="a") == 1
    assert set(m.objects) == {"k", b("k")}
    assert m.remove_all(now=1.0) == 1 and set(m.objects) == {b("k")}


def test_a_batch_put_is_refused_per_key_past_the_quota():
    m = mounted(1, tenant_quotas="a=128")
    results = m.batch_put_start("c1", [a("k0"), a("k1"), a("k2")], [64, 64, 64], now=0.0,
                                config=ReplicateConfig(hard_pin=True))
    assert [type(r) for r in results[:2]] == [list, list] and isinstance(results[2], TenantQuotaExceeded)


@pytest.mark.parametrize("seed", range(12))
def test_the_ledger_matches_a_recount_after_any_sequence_of_operations(seed):
    """Random puts (some left in flight), reads, removals, upserts, copies, offloads,
    promotions, quota changes, evictions, unmounts, remounts and expiries: after each one, what
    every tenant is charged is what a recount of its objects' memory ranges gives."""
    rng = random.Random(seed)
    m = mounted(3, size=2 * KIB, client_ttl=5.0, high_watermark=0.7, tenant_quotas="a=1KiB")
    keys = [scoped_key(t, f"k{i}") for t in ("default", "a", "b") for i in range(4)]
    clients = ["c1", "c2", "c3"]
    now = 0.0

    def put(key, client):
        m.put_start(client, key, rng.randint(1, 300), now, ReplicateConfig(
            replica_num=rng.randint(1, 2), hard_pin=rng.random() < 0.1, soft_pin=rng.random() < 0.2))
        if rng.random() < 0.8:  # else left in flight
            m.put_end(client, key, now, rng.randint(1, 3))

    def finish_or_not(end, revoke):
        """End what was started, revoke it, or leave it in flight."""
        draw = rng.random()
        if draw < 0.5:
            end()
        elif draw < 0.8:
            revoke()

    def copy(key, client):
        m.copy_start(client, key, [rng.choice(list(m.segments))], now)
        drop = rng.choice(["", *m.segments])
        finish_or_not(lambda: m.copy_end(client, key, now, drop), lambda: m.copy_revoke(client, key, now))

    def offload(key, client):
        replica = next(r for r in m.objects[key].replicas if r.in_memory)
        m.add_disk_replica(m.segments[replica.segment_id].client_id, key, replica.segment_id, replica.address,
                           m.objects[key].checksum, now)
        if rng.random() < 0.7:
            m._evict([m.objects[key]])  # held only on disk now

    def promote(key, client):
        m.promote_start(client, key, now)
        finish_or_not(lambda: m.promote_end(client, key, now), lambda: m.promote_revoke(client, key, now))

    operations = [
        put, put, put, copy, offload, offload, promote, promote,
        lambda k, c: m.put_end(m.objects[k].owner, k, now, rng.randint(1, 3)),
        lambda k, c: m.put_revoke(m.objects[k].owner, k, now),
        lambda k, c: m.upsert_start(c, k, rng.choice([64, 128]), now),
        lambda k, c: m.get_replica_list(k, now),
        lambda k, c: m.remove(k, now, force=rng.random() < 0.5),
        lambda k, c: m.tenants.set_quota(tenant_of(k), rng.choice([0, 256, 1024])),
        lambda k, c: m.evict(now),
        lambda k, c: m.remove_all(now, tenant=tenant_of(k)),
        lambda k, c: m.unmount_segment(c, f"s{c[1:]}", now),
        lambda k, c: m.mount_segment(c, segment(int(c[1:]), 2 * KIB), now),
        lambda k, c: m.expire_clients(now),
    ]
    for _ in range(300):
        now += 0.5
        try:
            rng.choice(operations)(rng.choice(keys), rng.choice(clients))
        except (MooncakeError, KeyError, IndexError, StopIteration, TypeError):
            pass  # refused, or drawn for an object that is not there: the ledger must still hold
        assert m.tenants.used == recount(m)
        assert sum(m.tenants.used.values()) <= m.used_bytes
