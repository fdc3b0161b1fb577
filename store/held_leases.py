"""Read leases a store client still holds, so that reading a key again need not ask the master.

A get is granted a read lease of ``lease_ttl`` (counted from no earlier than when the client
asked): until it ends the master neither removes (unless forced), overwrites nor evicts the
object, and an upsert of it is refused. So while a lease it was granted still has time left,
the replica list that came with it still says where those very bytes are, and another read
can go straight to them: no round trip, the master's CPU left to others.

What keeps that honest:
- a list is kept from a key's second read when its get named several keys (a batch scan that
  reads each key once holds none), from its first when it named one key: a single get's round
  trip (100-200 us) is most of its time and holding costs a few us, while a batch's share of its
  round trip per key (~5 us) is not worth holding for keys a scan never reads again; and only
  once a read through it was verified against the object's checksum, and only while every
  replica is in memory (a disk read may promote the object, which the master
  must hear of); every reuse verifies the checksum again, so a reuse never returns bytes other
  than those put, whatever happened to the range (a forced remove, a segment that left);
- it is reused only in the first half of the lease (``REUSE_SHARE``): the read must finish
  before the lease ends, which the client checks as for any read (LeaseExpired);
- a reuse that fails in any way is dropped and the key asked of the master again, in the same
  call; this client's own removes and copies drop the keys they name (all of them for
  remove_all).
What a reuse does not see: a forced remove by another client, or the loss of the segment,
during that half lease: the reader gets the object's (verified) bytes, as a read that started
just before it would. The master's LRU and lease counters see one get per lease, not per read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from store.objects import ReplicaDescriptor, ReplicaList, ReplicaTier, tuple_of

REUSE_SHARE = 0.5  # of the lease: the rest is left for the read itself
_MEMORY = ReplicaTier.MEMORY.value


class HeldLeases:
    def __init__(self, capacity: int) -> None:
        """``capacity``: most replica lists kept (the oldest leases go first)."""
        self.capacity = capacity
        # key -> _Entry, in the order the leases were asked for
        self._held: OrderedDict[str, _Entry] = OrderedDict()
        # Keys read once by a get of several keys, whose lists are held only from a key's second
        # read (a get of one key holds from the first). Holding costs a client several us a key
        # (its entries' memory and the cycle collector's passes over them: 48,000 first reads of
        # 4 KiB objects went 88-111k -> 62-68k objects/s when each was held, /tmp/s21/rr_var.py),
        # which a batch get's share of its round trip (~5 us) does not repay unless the key is
        # read again; a one-pass scan now pays a set insert.
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # several threads may share one client

    def reusable(self, keys: list[str], now: float) -> list[tuple[ReplicaList, float] | None]:
        """Per key its (replica list, when its lease was asked for) if it may be read again now."""
        held = self._held
        if not held:
            return [None] * len(keys)
        found: list[tuple[ReplicaList, float] | None] = []
        with self._lock:
            for key in keys:
                entry = held.get(key)
                if entry is None:
                    found.append(None)
                elif not now < _reuse_until(entry):
                    del held[key]
                    found.append(None)
                else:
                    name, size, replicas, lease_ttl, checksum, asked = entry
                    found.append((tuple_of(ReplicaList, (name, size, [tuple_of(ReplicaDescriptor, r) for r in replicas],
                                                         lease_ttl, checksum, False)), asked))
        return found

    def hold(self, replicas: list[tuple[str, ReplicaList, float]], now: float, first_read: bool = False) -> None:
        """Keep (key, replica list, when its lease was asked for) of reads just verified;
        ``first_read``: even of a key read for the first time (a get of one key; see above)."""
        with self._lock:
            held = self._held
            for key, item, asked in replicas:
                if item.checksum is None or item.promote:
                    continue
                for replica in item.replicas:
                    if replica.tier != _MEMORY:
                        break
                else:
                    if not first_read and key not in self._seen:
                        if len(self._seen) >= 4 * self.capacity:  # full: start noting afresh
                            self._seen.clear()
                        self._seen.add(key)
                        continue
                    if key in held:  # asked again meanwhile: it moves to the young end
                        del held[key]
                    held[key] = (item.key, item.size, tuple([tuple(r) for r in item.replicas]), item.lease_ttl,
                                 item.checksum, asked)
            while len(held) > self.capacity:
                held.popitem(last=False)
            while held and not now < _reuse_until(next(iter(held.values()))):
                held.popitem(last=False)

    def forget(self, keys: list[str]) -> None:
        if self._held or self._seen:
            with self._lock:
                for key in keys:
                    self._held.pop(key, None)
                    self._seen.discard(key)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._seen.clear()

    def __len__(self) -> int:
        return len(self._held)


# A held replica list as plain tuples of its fields and its lease's start: (key, size, replicas,
# lease_ttl, checksum, asked), not the named tuples themselves: the cycle collector stops
# following a plain tuple of numbers and strings at its first pass (never a tuple subclass), and
# held named tuples made a client's collections cost more than holding saves on a first pass
# over many keys: 48,000 first reads took 200-300 ms of GC, 17-28 without holding, 130-140 as
# plain tuples (packed with msgpack instead: 40-90 ms of GC, but packing cost 3 us a key against
# 0.4; /tmp/s21/remote_reuse.py, first_blocks.py).
_Entry = tuple[str, int, tuple[tuple, ...], float, int, float]


def _reuse_until(entry: _Entry) -> float:
    return entry[5] + entry[3] * REUSE_SHARE
