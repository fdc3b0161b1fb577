"""RDMA endpoints (a few connected QPs per device pair) and the slices in flight on them.

Posting is round-robin over the endpoint's QPs. An endpoint that saw an error is *broken*: it
leaves the pool at once (the next slice for that pair handshakes a new one) and is closed when
the last of its work requests has completed, since the HCA flushes those with an error status
and destroying a QP earlier would lose their completions (Mooncake's waiting list does the same).
"""

from __future__ import annotations

import itertools
import threading

from transfer.batch import Slice
from transfer.rdma.verbs import Op, QueuePair

EndpointKey = tuple[str, str, str, str]  # (peer name, peer incarnation, local device, peer device)


class Endpoint:
    def __init__(self, key: EndpointKey, qps: list[QueuePair]) -> None:
        self.key, self.qps = key, qps
        self.broken = False
        self._lock = threading.Lock()
        self._next = itertools.cycle(range(len(qps)))
        self._outstanding = 0
        self._closed = False

    @property
    def local_device(self) -> str:
        return self.key[2]

    def post(self, wr_id: int, op: Op, local_address: int, length: int, lkey: int,
             remote_address: int, rkey: int) -> None:
        with self._lock:
            if self.broken:
                raise ConnectionError("endpoint is broken")
            qp = self.qps[next(self._next)]
            self._outstanding += 1
        try:
            qp.post(wr_id, op, local_address, length, lkey, remote_address, rkey)
        except Exception:
            self.completed()
            raise

    def completed(self) -> None:
        with self._lock:
            self._outstanding -= 1
            drained = self.broken and self._outstanding == 0
        if drained:
            self.close()

    def break_(self) -> None:
        with self._lock:
            self.broken = True
            drained = self._outstanding == 0
        if drained:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for qp in self.qps:
            qp.close()


class Flight:
    """One attempt of a slice: the work requests it was cut into, reported to the sink once."""

    def __init__(self, piece: Slice, endpoint: Endpoint, num_requests: int) -> None:
        self.piece, self.endpoint = piece, endpoint
        self._lock = threading.Lock()
        self._remaining = num_requests
        self._over = False

    def request_done(self) -> bool:
        """True when this completion finished the slice (and nothing failed before)."""
        with self._lock:
            self._remaining -= 1
            if self._over or self._remaining:
                return False
            self._over = True
            return True

    def request_failed(self) -> bool:
        """True the first time: only then is the failure reported."""
        with self._lock:
            first = not self._over
            self._over = True
            return first
