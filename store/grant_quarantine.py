"""Ranges a tenant was granted, kept out of reuse until every grant on them has expired.

A grant (:mod:`transfer.grants`) lets a tenant's engine move one range's bytes until the grant
expires, whatever becomes of the object meanwhile. Were the master to give that range to another
object first (a put revoked early, an object removed with ``force`` during a read lease, an
eviction of an object whose put was revoked), the granted tenant could still read or write it:
another tenant's bytes. So a range freed while a grant on it may still be valid is quarantined:
it stays allocated (counted as used, charged to no tenant) until the last grant on it has
expired, then goes back to its segment's allocator.

Pure: no I/O; times are the master's monotonic clock. Ranges nobody was granted (every client
with the cluster secret) are never held.
"""

from __future__ import annotations

import heapq

# A grant is checked against the segment owner's wall clock, which may run behind the master's
# by as much as NTP lets it: keep a range this much longer than the grant's own lifetime.
CLOCK_MARGIN = 1.0


class GrantQuarantine:
    def __init__(self) -> None:
        # (segment id, range address) -> when the last grant on it expires
        self._granted: dict[tuple[str, int], float] = {}
        # freed ranges waiting out their grants: (release time, segment id, address), a heap
        self._held: list[tuple[float, str, int]] = []

    def granted(self, segment_id: str, address: int, until: float) -> None:
        """A grant on the range at ``address`` of ``segment_id`` is valid until ``until``."""
        key = (segment_id, address)
        self._granted[key] = max(self._granted.get(key, 0.0), until + CLOCK_MARGIN)

    def hold(self, segment_id: str, address: int) -> bool:
        """The range was just freed: True if it must wait for its grants (it is then held until
        :meth:`released` gives it back), False if it may be reused at once."""
        until = self._granted.pop((segment_id, address), None)
        if until is None:
            return False
        heapq.heappush(self._held, (until, segment_id, address))
        return True

    def released(self, now: float) -> list[tuple[str, int]]:
        """The held ranges (segment id, address) whose grants have all expired by ``now``: no
        longer held, to be freed by the caller."""
        free = []
        while self._held and self._held[0][0] <= now:
            _, segment_id, address = heapq.heappop(self._held)
            free.append((segment_id, address))
        return free

    def forget_segment(self, segment_id: str) -> None:
        """``segment_id`` was unmounted: its ranges went with it."""
        self._granted = {k: v for k, v in self._granted.items() if k[0] != segment_id}
        self._held = [h for h in self._held if h[1] != segment_id]
        heapq.heapify(self._held)

    def __len__(self) -> int:
        """Ranges held now."""
        return len(self._held)
