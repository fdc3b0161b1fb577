"""The store client's half of put reservations: the grants it holds, and which one a put may use.

A grant of ``GRANT_BYTES`` serves several puts: each commit takes the bytes its objects used from
the front, and the one that leaves too little asks for the next grant. A grant is used only
within ``USE_WINDOW_S`` of the request that brought it. The master keeps a
reservation far longer (``put_start_discard_timeout``), so a grant the client still uses is one
the master still holds for it, unless the master restarted in between: a new master knows no
reservation and may give the range to another object. Its start takes longer than the window
(it loads, then every store client re-mounts), and a commit to it fails as a whole, upon which
the client puts the same objects the plain way. Grants held longer are released with the next
request for one, or expire at the master.

Shared by every thread of one client: a thread takes a grant out (no other thread can use it),
and keeps the next one its commit brought.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from store.objects import ReplicateConfig
from store.reservations.messages import SpaceGrant

USE_WINDOW_S = 0.25
# After the master granted nothing (no room without evicting, a quota, a config that needs
# PutStart), ask again only this much later: each refused ask is a round trip wasted.
REFUSED_BACKOFF_S = 1.0
# The master's allocator alignment until a grant says otherwise (store.policy's default).
DEFAULT_ALIGNMENT = 64
# What a client asks for when its put needs less: one grant then serves the next puts too (64 of
# 4 KiB), each committed in one round trip that grants nothing.
GRANT_BYTES = 256 << 10


class HeldGrant(NamedTuple):
    grant: SpaceGrant
    config: ReplicateConfig  # the placement it was granted for: a put with another config cannot use it
    asked_at: float  # monotonic time before the request that brought it went out
    used: int = 0  # bytes from its start that earlier commits took: the reservation starts after them

    @property
    def room(self) -> int:
        return self.grant.replica.size - self.used

    def after(self, consumed: int) -> HeldGrant:
        """This grant once a commit took ``consumed`` more bytes."""
        return self._replace(used=self.used + consumed)


class ReservationHolder:
    def __init__(self, use_window: float = USE_WINDOW_S) -> None:
        self.use_window = use_window
        self._lock = threading.Lock()
        self._held: list[HeldGrant] = []
        self._refused_until = 0.0
        self._last_put = float("-inf")
        self.alignment = DEFAULT_ALIGNMENT

    @staticmethod
    def layout(sizes: list[int], alignment: int) -> tuple[list[int], int]:
        """Where objects of ``sizes`` go in a reservation, and the bytes it needs for them."""
        offsets, cursor = [], 0
        for size in sizes:
            offsets.append(cursor)
            cursor += -(-size // alignment) * alignment
        return offsets, cursor

    def take(self, config: ReplicateConfig, length: int, now: float) -> tuple[HeldGrant | None, list[int]]:
        """A grant for ``config`` with room for ``length`` bytes, taken out (or None), and the ids
        of the grants dropped here, to release at the master: those too old to use and, when none
        fits, those for ``config`` (its puts have grown; the next grant will fit them)."""
        with self._lock:
            kept, dropped, chosen = [], [], None
            for held in self._held:
                if now - held.asked_at >= self.use_window:
                    dropped.append(held)
                elif chosen is None and held.config == config and held.room >= length:
                    chosen = held
                else:
                    kept.append(held)
            if chosen is None:
                dropped += [h for h in kept if h.config == config]
                kept = [h for h in kept if h.config != config]
            self._held = kept
        return chosen, [h.grant.reservation_id for h in dropped]

    def keep(self, held: HeldGrant) -> None:
        with self._lock:
            self.alignment = held.grant.alignment
            self._held.append(held)

    def may_ask(self, now: float) -> bool:
        """Whether a put with no grant to use should ask for one: only within a run of puts
        (one less than ``use_window`` after the last), so that a lone put (`mooncake put`) goes
        the plain way, with no grant left to release, and not while the master refused lately."""
        last, self._last_put = self._last_put, now
        return now - last < self.use_window and now >= self._refused_until

    def refused(self, now: float) -> None:
        self._refused_until = now + REFUSED_BACKOFF_S

    def take_all(self) -> list[int]:
        """The ids of every grant held, now dropped (the client is closing: release them)."""
        with self._lock:
            held, self._held = self._held, []
        return [h.grant.reservation_id for h in held]
