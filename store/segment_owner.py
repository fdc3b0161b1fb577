"""A store client's contributed segment: mount it, keep it alive, and re-mount it after a restart.

The segment is a named shared-memory region of this process's transfer engine (lazily touched:
it costs RAM only where objects are written), so same-host peers copy into it directly and
remote ones reach it over TCP. Other clients write objects into it; the owner learns which ones
through the changes the master returns with each ping (:mod:`store.segment_journal`) and keeps
that record, so that when a ping is answered NEED_REMOUNT (the master restarted, or dropped us
as silent) it re-mounts and re-reports every complete object it holds.
"""

from __future__ import annotations

import logging
import uuid

from store.master_client import MasterClient
from store.objects import ClientStatus, ReportedObject, Segment
from transfer.engine import TransferEngine
from transfer.errors import MooncakeError
from transfer.memory import address_of

log = logging.getLogger(__name__)


class SegmentOwner:
    def __init__(self, engine: TransferEngine, master: MasterClient, size: int) -> None:
        self.engine, self.master = engine, master
        self.buffer = engine.allocate_shared_buffer(size)
        self.segment = Segment(f"{engine.name}/seg-{uuid.uuid4().hex[:8]}", engine.name,
                               address_of(self.buffer), size, engine.rpc_address, engine.host_id)
        self.record: dict[str, ReportedObject] = {}  # complete objects in our segment, by key
        self.acked = 0  # the last journal change applied to the record
        self.num_remounts = 0
        master.mount_segment(self.segment)

    def heartbeat(self, timeout: float) -> str:
        """Ping once; apply the master's news or re-mount. Returns the status, or "UNREACHABLE"."""
        try:
            answer = self.master.ping({self.segment.segment_id: self.acked}, timeout=timeout)
            if answer["status"] == ClientStatus.NEED_REMOUNT.value:
                self.remount()
            else:
                self._apply(answer["changes"].get(self.segment.segment_id, []))
            return answer["status"]
        except MooncakeError as exc:
            log.warning("ping to the master failed: %s", exc.message)
            return "UNREACHABLE"

    def remount(self) -> None:
        # A restarted master also lost our engine's descriptor: publish it before anyone reads.
        self.engine.republish()
        outcome = self.master.remount([self.segment], list(self.record.values()))
        for key in outcome["rejected"]:
            self.record.pop(key, None)
        self.acked = 0  # the new master's journal starts over
        self.num_remounts += 1
        log.info("re-mounted %s: %d objects taken back, %d rejected", self.segment.segment_id,
                 len(outcome["accepted"]), len(outcome["rejected"]))

    def unmount(self) -> None:
        # Short deadline: on shutdown a master that is gone must not hold up our exit.
        self.master.unmount_segment(self.segment.segment_id, timeout=1.0)

    def _apply(self, changes: list[dict]) -> None:
        for change in changes:
            key = change["key"]
            if change["kind"] == "complete":
                self.record[key] = ReportedObject(key, self.segment.segment_id, change["address"],
                                                  change["size"], change["checksum"], change["hard_pinned"])
            elif key in self.record and self.record[key].address == change["address"]:
                del self.record[key]
            self.acked = change["seq"]
