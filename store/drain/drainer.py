"""The drainer: moves every object held only on a segment elsewhere, then sees the segment leave.

    report = Drainer(client, segment_id, unmount_timeout=12.0, on_progress=print).run()

It runs in any library client (`mooncake drain` makes one without a segment of its own), and
the bytes pass through it: for each object the master lists as held only on the segment, it
reads the object's replica there and writes a new one on a segment the master's placement picks
(:meth:`store.client.StoreClient.move_off`); the master publishes the new replica and drops the
old one in one step, so a reader always finds one. How the master keeps the segment closed to
new replicas meanwhile, and why leases cannot hold a drain up, is in :mod:`store.drain.state`.

What happens to each kind of object:

- held only here: moved. One that keeps failing (``MAX_ATTEMPTS`` times over at least
  ``GIVE_UP_AFTER`` seconds: a bad source replica, transfers that fail, another client's copy of
  it that does not end) is left, with the reason; one that no room elsewhere can take stops the
  drain (the master checked the room at the start; puts since may have taken it).
- held on another segment too: nothing to move; its replica here is dropped at the end.
- being written here (a put that started before the drain): moved once it completes; left if
  it is still being written after ``in_flight_wait`` seconds.
- held only on the segment's SSD tier: the master refuses the drain before anything moves.

When nothing is held only here any more, :meth:`MasterClient.drain_finish` drops the remaining
replicas and the segment's owner unmounts it on its next ping, once the readers' leases ran out;
the drainer waits for that, up to ``unmount_timeout`` seconds past the leases. If anything is
left, or the drainer is interrupted (Ctrl-C) or fails, it cancels the drain: the segment stays
mounted and serving, and what was moved stays moved.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from store.client import StoreClient
from store.errors import IllegalClient, InvalidParams, MooncakeError, NoAvailableHandle

MAX_ATTEMPTS = 5
GIVE_UP_AFTER = 2.0  # seconds from a key's first failure: a copy by another client ends by then
PAGE = 512  # keys asked for per round: each round scans the master's objects once, under its lock
POLL = 0.05  # seconds between looks while waiting for puts in flight or for the unmount


@dataclass
class DrainProgress:
    moved: int
    total: int  # moved, plus what is still held only on the segment
    phase: str  # moving, finishing, unmounting


@dataclass
class DrainReport:
    segment_id: str
    outcome: str = "moving"  # unmounted, not unmounted (the owner did not in time), or stopped
    num_moved: int = 0
    bytes_moved: int = 0
    num_replicated: int = 0  # held elsewhere too: the replica here was dropped, nothing moved
    num_left: int = 0  # still held only on the segment when the drain stopped
    left: dict[str, str] = field(default_factory=dict)  # key -> why it was not moved

    def as_json(self) -> dict:
        return {"segment_id": self.segment_id, "outcome": self.outcome, "moved": self.num_moved,
                "bytes_moved": self.bytes_moved, "already_replicated": self.num_replicated,
                "num_left": self.num_left,
                "left": [{"key": key, "reason": why} for key, why in self.left.items()]}


class Drainer:
    def __init__(self, client: StoreClient, segment_id: str, *, unmount_timeout: float,
                 in_flight_wait: float, on_progress: Callable[[DrainProgress], None] = lambda p: None) -> None:
        self.client, self.master = client, client.master
        self.segment_id = segment_id
        self.unmount_timeout, self.in_flight_wait = unmount_timeout, in_flight_wait
        self.on_progress = on_progress
        self.report = DrainReport(segment_id)
        self._num_only_here = 0

    def run(self) -> DrainReport:
        """Drain the segment; raises (changing nothing) when the master refuses to start: an
        unknown segment (SegmentNotFound), not enough room elsewhere (NoAvailableHandle)."""
        plan = self.master.drain_start(self.segment_id)
        self._num_only_here = plan.num_only_here
        try:
            finish = self._move_then_finish()
        except BaseException:
            self._cancel()
            raise
        if finish is None:
            self._cancel()
            self.report.outcome = "stopped"
            return self.report
        self.report.num_replicated = finish.num_dropped
        self._progress("unmounting")
        unmounted = self._wait_unmounted(finish.unmount_in + self.unmount_timeout)
        self.report.outcome = "unmounted" if unmounted else "not unmounted"
        return self.report

    def _move_then_finish(self):
        """Move until nothing is held only here, then finish; None when something was left. A
        finish refused because an object became held only here meanwhile (its other segment
        went) goes back to moving."""
        while True:
            if not self._move_all():
                return None
            self._progress("finishing")
            try:
                return self.master.drain_finish(self.segment_id)
            except InvalidParams:
                self._check_still_ours()

    def _move_all(self) -> bool:
        """Move every object held only on the segment; False when some were left."""
        attempts: Counter = Counter()
        first_failure: dict[str, float] = {}
        waiting_since: float | None = None
        while True:
            pending = self.master.drain_pending(self.segment_id, PAGE, list(self.report.left))
            self._num_only_here = pending.num_only_here
            self._progress("moving")
            if pending.disk_only:  # offloaded since the start: the drain cannot move them
                self.report.left.update(dict.fromkeys(pending.disk_only, "held only on the segment's SSD tier"))
            if not pending.to_move and not pending.in_flight:
                self.report.num_left = pending.num_only_here + len(pending.disk_only)
                return not self.report.left
            if not pending.to_move:  # only puts in flight here, which end soon (or are revoked)
                waiting_since = waiting_since or time.monotonic()
                if time.monotonic() - waiting_since > self.in_flight_wait:
                    self.report.left.update(dict.fromkeys(
                        pending.in_flight, f"still being written after {self.in_flight_wait:g}s"))
                    self.report.num_left = pending.num_only_here + len(pending.in_flight)
                    return False
                time.sleep(POLL)
                continue
            waiting_since = None
            moved_any = False
            for key in pending.to_move:
                try:
                    self.report.bytes_moved += self.client.move_off(key, self.segment_id)
                except NoAvailableHandle as exc:  # puts took the room the start counted on
                    self.report.left[key] = exc.message
                    self.report.num_left = self.master.drain_pending(self.segment_id, 1).num_only_here
                    return False
                except IllegalClient:
                    raise  # another drainer took over
                except MooncakeError as exc:
                    # Being copied by someone else, overwritten, a source that went (then it
                    # comes back in the next round if it still exists) or a transfer failure.
                    if isinstance(exc, InvalidParams):
                        self._check_still_ours()
                    attempts[key] += 1
                    since = time.monotonic() - first_failure.setdefault(key, time.monotonic())
                    if attempts[key] >= MAX_ATTEMPTS and since >= GIVE_UP_AFTER:
                        self.report.left[key] = exc.message
                    continue
                self.report.num_moved += 1
                self._num_only_here -= 1
                moved_any = True
                self._progress("moving")
            if not moved_any:
                time.sleep(POLL)  # everything failed this round: let whatever held them move on

    def _check_still_ours(self) -> None:
        """Raise when the drain is no longer this drainer's running one (the master restarted
        and forgot it, or it was cancelled when we were taken for dead)."""
        status = self.master.drain_status(self.segment_id)
        if status.phase != "draining" or status.drainer != self.master.client_id:
            raise InvalidParams(f"the drain of segment {self.segment_id!r} ended under us ({status.phase}): "
                                "run it again to resume")

    def _wait_unmounted(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.master.drain_status(self.segment_id).phase == "unmounted":
                return True
            time.sleep(POLL)
        return False

    def _cancel(self) -> None:
        try:
            self.master.drain_cancel(self.segment_id)
        except MooncakeError:
            pass  # gone with a restarted master, or finished: nothing to undo either way

    def _progress(self, phase: str) -> None:
        self.on_progress(DrainProgress(self.report.num_moved, self.report.num_moved + max(0, self._num_only_here),
                                       phase))
