"""A range a tenant was granted is not given to another object before the grant expired.

Grants (transfer.grants) are checked by segment owners against the range and the expiry alone, so
the master must not reuse a granted range while the grant is still good: a put revoked early, or an
object removed with force during a read, would otherwise leave its tenant able to write or read
the next object placed there. The service notes each grant it issues (store.master_service);
here the state machine is driven as the service drives it.
"""

import pytest

from master_helpers import KIB, mounted, put, where
from store.errors import NoAvailableHandle
from store.grant_quarantine import CLOCK_MARGIN, GrantQuarantine
from store.objects import ReplicateConfig
from store.tenants import scoped_key


def granted_put_start(m, key: str, size: int, now: float, lifetime: float):
    """put_start as a tenant's client sees it: each target range granted for ``lifetime``."""
    replicas = m.put_start("c1", key, size, now, ReplicateConfig())
    for r in replicas:
        m.quarantine.granted(r.segment_id, r.address, now + lifetime)
    return replicas


def test_a_revoked_puts_range_waits_for_its_write_grant_before_another_put_gets_it():
    m = mounted(1, size=KIB)  # 16 slots of 64 bytes
    mine = granted_put_start(m, scoped_key("a", "k"), KIB, now=0.0, lifetime=30.0)
    m.put_revoke("c1", scoped_key("a", "k"), now=1.0)
    assert len(m.quarantine) == 1 and m.tenants.used.get("a", 0) == 0  # no longer the tenant's
    # The whole segment is that one range: nobody can have it while the grant is good...
    with pytest.raises(NoAvailableHandle):
        put(m, scoped_key("b", "k"), KIB, now=29.0)
    # ...and once it expired (and the clock margin passed), the next put gets it.
    theirs = put(m, scoped_key("b", "k"), KIB, now=30.0 + CLOCK_MARGIN)
    assert where(theirs) == where(mine) and len(m.quarantine) == 0


def test_an_object_removed_with_force_during_a_granted_read_keeps_its_range_until_the_lease_ended():
    m = mounted(1, size=KIB)
    key = scoped_key("a", "k")
    mine = put(m, key, 512, now=0.0)
    listed = m.get_replica_list(key, now=1.0)
    for r in listed.replicas:
        m.quarantine.granted(r.segment_id, r.address, 1.0 + listed.lease_ttl)
    m.remove(key, now=1.5, force=True)
    other = put(m, scoped_key("b", "k"), 512, now=2.0)
    assert where(other) != where(mine)  # the other half of the segment
    m.remove(scoped_key("b", "k"), now=2.5)
    m.release_quarantined(1.0 + listed.lease_ttl + CLOCK_MARGIN)
    assert len(m.quarantine) == 0
    for s in m.segments.values():
        s.allocator.check_invariants()


def test_ranges_nobody_was_granted_are_reused_at_once():
    m = mounted(1, size=KIB)
    first = put(m, "k", KIB, now=0.0)
    m.remove("k", now=1.0)
    assert where(put(m, "k2", KIB, now=1.0)) == where(first) and len(m.quarantine) == 0


def test_an_unmounted_segment_takes_its_held_ranges_with_it():
    m = mounted(1, size=KIB)
    granted_put_start(m, scoped_key("a", "k"), KIB, now=0.0, lifetime=30.0)
    m.put_revoke("c1", scoped_key("a", "k"), now=1.0)
    held = len(m.quarantine)
    m.unmount_segment("c1", "s1", now=2.0)
    assert held == 1 and len(m.quarantine) == 0
    m.release_quarantined(100.0)  # nothing left to free in a segment that is gone


def test_the_quarantine_gives_each_range_back_once_at_its_latest_grant():
    q = GrantQuarantine()
    q.granted("s", 0, 5.0)
    q.granted("s", 0, 3.0)  # an earlier grant on the same range does not shorten the wait
    q.granted("s", 64, 1.0)
    assert q.hold("s", 0) and q.hold("s", 64) and not q.hold("s", 128)
    assert q.released(1.0) == [] and q.released(1.0 + CLOCK_MARGIN) == [("s", 64)]
    assert q.released(5.0 + CLOCK_MARGIN) == [("s", 0)] and q.released(1e9) == [] and len(q) == 0
