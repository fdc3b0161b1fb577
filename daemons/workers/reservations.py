"""A decode worker's reserved pages and when they may be freed; pure state, no I/O, no lock
(the decode worker holds its own).

A reservation holds a request's pages from ``decode.reserve`` until ``decode.start`` (they join the
batch) or ``decode.release``. Past ``expires`` (its ``request_timeout``) the pages are still not
freed: :meth:`Reservations.due` names the prefill worker to ask (``prefill.drop``), every
``ASK_INTERVAL``, and :func:`may_free` decides from its answer. Pages are freed only when the
writer itself says the job can no longer write, or when every process that writes for it is
verifiably dead; an unreachable writer, or one that cannot be proven dead (another machine),
keeps them reserved and is asked again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from daemons.model import Sequence
from daemons.serving.messages import DropAnswer, PrefillWriter, WriterProcess

ASK_INTERVAL = 0.5  # seconds between two asks about one expired reservation


@dataclass
class Reservation:
    seq: Sequence
    writer: PrefillWriter
    expires: float
    next_ask: float


class Reservations:
    def __init__(self) -> None:
        self._held: dict[str, Reservation] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    def hold(self, seq: Sequence, writer: PrefillWriter, expires: float) -> None:
        self._held[seq.seq_id] = Reservation(seq, writer, expires, expires)

    def take(self, request_id: str) -> Sequence | None:
        """End the reservation (started, released, or its writer is done): its sequence, whose
        pages the caller now owns, or None if there is none."""
        reservation = self._held.pop(request_id, None)
        return None if reservation is None else reservation.seq

    def due(self, now: float) -> list[tuple[str, PrefillWriter]]:
        """Expired reservations whose writer is to be asked now; each is asked again only
        ``ASK_INTERVAL`` later."""
        asks = []
        for request_id, reservation in self._held.items():
            if now >= reservation.next_ask:
                reservation.next_ask = now + ASK_INTERVAL
                asks.append((request_id, reservation.writer))
        return asks

    def num_expired(self, now: float) -> int:
        """Reservations past their expiry, held until their writer is done."""
        return sum(now >= reservation.expires for reservation in self._held.values())

    def writer_addresses(self) -> set[str]:
        return {reservation.writer.address for reservation in self._held.values()}


def may_free(writer: PrefillWriter, answer: DropAnswer | None, dead: Callable[[WriterProcess], bool]) -> bool:
    """Whether an expired reservation's pages may be freed, given the writer's answer to
    ``prefill.drop`` (None: it could not be reached or answered nonsense).

    The process named in the reservation answers for its own jobs. A successor answering at the
    same address knows nothing of them, and a silent worker may only be slow: then every
    process that writes for the writer must be verifiably dead.
    """
    if answer is not None and writer.processes and answer.process == writer.processes[0]:
        return answer.dropped
    return bool(writer.processes) and all(dead(process) for process in writer.processes)
