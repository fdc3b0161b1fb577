"""Counters of the master's state machine and of a store client's own operations, as the CLI's
`inspect` and the daemons' metrics show them."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field


@dataclass
class MasterStats:
    num_put_starts: int = 0
    num_put_ends: int = 0
    num_put_revokes: int = 0  # by the writer, or because the writer went silent
    num_preempted: int = 0  # puts older than the discard timeout, taken over by a new PutStart
    num_partial_allocations: int = 0  # puts that got fewer replicas than asked for
    num_allocation_failures: int = 0  # NO_AVAILABLE_HANDLE answers
    num_quota_rejections: int = 0  # TENANT_QUOTA_EXCEEDED answers
    num_quota_evictions: int = 0  # objects evicted to keep their tenant within its quota
    num_evicted: int = 0
    num_evicted_bytes: int = 0  # object sizes of the evicted, as Mooncake's master_evicted_size_bytes
    num_evicted_to_disk: int = 0  # evicted from memory but kept as a disk replica
    num_offloaded: int = 0  # disk replicas recorded
    num_offload_requests: int = 0  # eviction victims handed to their owner to copy first
    num_offload_timeouts: int = 0  # of those, freed (and lost) because no copy came in time
    num_promoted: int = 0  # disk-only objects copied back to memory
    num_promoted_bytes: int = 0
    num_copies: int = 0  # replica copies (and moves) published by copy_end
    num_removed: int = 0
    num_leases_granted: int = 0
    num_expired_clients: int = 0
    num_objects_lost: int = 0  # objects whose last replica was on an unmounted segment
    num_adopted: int = 0  # replicas taken back from re-mounting clients
    num_reservations: int = 0  # put reservations granted (store.reservations)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class ClientStats:
    """A store client's own puts and gets, by key: the daemon that owns the client exports them."""

    num_puts: int = 0
    num_put_errors: int = 0
    num_put_bytes: int = 0
    num_gets: int = 0
    num_get_errors: int = 0
    num_get_bytes: int = 0
    num_lease_reuses: int = 0  # of num_gets, those read through a lease held from an earlier get
    # Several threads of a worker share one client; += on an attribute is not atomic.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_puts(self, sizes: list[int], errors: list) -> None:
        """``errors``: per key None (stored) or its error."""
        stored = [size for size, error in zip(sizes, errors) if error is None]
        with self.lock:  # one update per batch: attribute += per key cost more than the sums
            self.num_puts += len(stored)
            self.num_put_bytes += sum(stored)
            self.num_put_errors += len(errors) - len(stored)

    def record_gets(self, results: list, lease_reuses: int = 0) -> None:
        """``results``: per key the bytes read, or its error; ``lease_reuses``: how many of them
        were read without asking the master (store.held_leases)."""
        read = [result for result in results if isinstance(result, int)]
        with self.lock:
            self.num_lease_reuses += lease_reuses
            self.num_gets += len(read)
            self.num_get_bytes += sum(read)
            self.num_get_errors += len(results) - len(read)

    def as_dict(self) -> dict[str, int]:
        with self.lock:
            return {name: value for name, value in self.__dict__.items() if name != "lock"}
