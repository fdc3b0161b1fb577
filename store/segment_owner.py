"""A store client's contributed segment: mount it, keep it alive, and re-mount it after a restart.

The segment is a named shared-memory region of this process's transfer engine, so same-host
peers copy into it directly and remote ones reach it over TCP. With ``commit`` (the
``segment_prefault`` setting) its memory is taken and mapped when it is mounted, so a /dev/shm too
small fails the start and no put pays page faults; without, it costs RAM only where objects are
written. Other clients write objects into it; the owner learns which ones
through the changes the master returns with each ping (:mod:`store.segment_journal`) and keeps
that record, so that when a ping is answered NEED_REMOUNT (the master restarted, or dropped us
as silent) it re-mounts and re-reports every complete object it holds, in memory and (after
checking each file's header and checksum) on disk.

With an SSD tier (``offload_dir``) the owner also copies objects to files (:mod:`store.disk_tier`)
and reports them as disk replicas, so they outlive their eviction from memory: with
``offload_policy`` "all" each object as it learns it completed; with "evicted" only those the
master hands it as eviction victims (an "offload" change), whose memory the master frees once
the copy is reported; it serves those files to readers on its own small RPC server (``store.disk_read``,
the segment's ``disk_endpoint``), and deletes a file when the master says its replica is gone.
Only objects with a checksum are offloaded: the copy is checked against it, since the range may
have been evicted and reused before the owner read it.

Drained (:mod:`store.drain.state`): when a ping answer lists the segment under ``unmount``, every
object held there lives on another segment and no lease on it is left, so the owner unmounts it,
drops its SSD tier's files and frees the memory. The store client then holds no segment and
pings no more (``heartbeat`` answers DRAINED); the process keeps running until it is stopped.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import xxhash

from store.disk_tier import DiskTier
from store.errors import InvalidParams
from store.master_client import MasterClient
from store.objects import ClientStatus, ReportedObject, Segment, tuple_of
from transfer.engine import TransferEngine
from transfer.errors import MooncakeError
from transfer.memory import address_of
from transfer.rpc.client_server import FAREWELL_TIMEOUT_S, Reply, Request, RpcServer

log = logging.getLogger(__name__)


class SegmentOwner:
    def __init__(self, engine: TransferEngine, master: MasterClient, size: int,
                 offload_dir: str = "", host: str = "127.0.0.1", offload_policy: str = "evicted",
                 commit: bool = False) -> None:
        self.engine, self.master = engine, master
        self.offload_all = offload_policy == "all"
        self.buffer = engine.allocate_shared_buffer(size, commit=commit)
        self._view = memoryview(self.buffer)  # flat bytes: see views()
        self.disk: DiskTier | None = None
        self.disk_server: RpcServer | None = None
        if offload_dir:
            self.disk = DiskTier(Path(offload_dir) / master.client_id)
            self.disk_server = RpcServer(f"tcp://{host}:*", secret=engine.options.secret)
            self.disk_server.register("store.disk_read", self._disk_read, blocking=True)
            self.disk_server.start()
        self.segment = Segment(f"{engine.name}/seg-{uuid.uuid4().hex[:8]}", engine.name,
                               address_of(self.buffer), size, engine.rpc_address, engine.host_id,
                               self.disk_server.address if self.disk_server else "")
        self.record: dict[str, ReportedObject] = {}  # complete objects in our segment, by key
        # Our files the master recorded as disk replicas, by key (address 0): re-reported on a
        # remount, so objects held only on disk outlive a master restart.
        self.disk_record: dict[str, ReportedObject] = {}
        self.acked = 0  # the last journal change applied to the record
        self.num_remounts = 0
        self.num_offloaded = 0
        self.drained = False  # unmounted at the master's word after a drain; the memory is freed
        master.mount_segment(self.segment)

    def views(self, addresses: list[int], lengths: list[int]) -> list[memoryview | None]:
        """Per range (an address the master handed out in our segment, and a length) our
        segment's bytes there, for copies in this process; None once the segment was drained and
        its memory freed. One call per batch of copies, not one per object."""
        base, size, whole = self.segment.base, self.segment.size, self._view
        if self.drained:
            return [None] * len(addresses)
        return [whole[address - base:address - base + length] if base <= address and address - base + length <= size
                else None for address, length in zip(addresses, lengths)]

    def heartbeat(self, timeout: float) -> str:
        """Ping once; apply the master's news, re-mount, or leave after a drain. Returns the
        status, "UNREACHABLE", or "DRAINED" once the segment left (then it pings no more)."""
        if self.drained:
            return "DRAINED"
        try:
            answer = self.master.ping({self.segment.segment_id: self.acked}, timeout=timeout)
            if answer["status"] == ClientStatus.NEED_REMOUNT.value:
                self.remount()
            else:
                self._apply(answer["changes"].get(self.segment.segment_id, []))
                if self.segment.segment_id in answer.get("unmount", ()):
                    self._leave(timeout)
                    return "DRAINED"
            return answer["status"]
        except MooncakeError as exc:
            log.warning("ping to the master failed: %s", exc.message)
            return "UNREACHABLE"

    def remount(self) -> None:
        # A restarted master also lost our engine's descriptor: publish it before anyone reads.
        self.engine.republish()
        outcome = self.master.remount([self.segment], list(self.record.values()), self._intact_files())
        for key in outcome["rejected"]:
            self.record.pop(key, None)
        for key in outcome["disk_rejected"]:
            self._forget_file(key)
        self.acked = 0  # the new master's journal starts over
        self.num_remounts += 1
        log.info("re-mounted %s: %d objects taken back, %d rejected", self.segment.segment_id,
                 len(outcome["accepted"]), len(outcome["rejected"]))

    def unmount(self) -> None:
        if self.drained:
            return  # it left already
        try:
            # Short deadline: on shutdown a master that is gone must not hold up our exit.
            self.master.unmount_segment(self.segment.segment_id, timeout=FAREWELL_TIMEOUT_S)
        finally:
            self._drop_disk_tier()

    def _leave(self, timeout: float) -> None:
        """Unmount the drained segment and free what it held. A failed unmount raises before
        anything is freed, and the next ping answer asks again."""
        self.master.unmount_segment(self.segment.segment_id, timeout=timeout)
        self.drained = True
        self.record.clear()
        self._drop_disk_tier()
        self.engine.unregister_local_memory(self.buffer)
        log.info("drained segment %s unmounted and its memory freed", self.segment.segment_id)

    def _drop_disk_tier(self) -> None:
        if self.disk is not None:
            self.disk_server.stop(drain_timeout=0.5)
            self.disk.destroy()  # its replicas left the pool with the segment
            self.disk = None

    def _apply(self, changes: list[list]) -> None:
        """``changes``: store.segment_journal.SegmentChange's fields, in order, per change."""
        to_offload = []
        # Names looked up once: a ping's answer carries one change per object put into (or
        # removed from) our segment since the last, applied on the thread beside our own puts.
        record, segment_id, offload_all = self.record, self.segment.segment_id, self.offload_all
        for seq, kind, key, address, size, checksum, hard_pinned in changes:
            if kind == "complete":
                report = record[key] = tuple_of(ReportedObject, (key, segment_id, address, size, checksum,
                                                                 hard_pinned))
                if offload_all:
                    to_offload.append(report)
            elif kind == "offload":
                report = record.get(key)
                if report is not None and report.address == address:
                    to_offload.append(report)
            elif kind == "disk_gone":
                if self.disk is not None:
                    self._forget_file(key)
            else:
                report = record.get(key)
                if report is not None and report.address == address:
                    del record[key]
            self.acked = seq
        if self.disk is not None:
            for report in to_offload:
                self._offload(report)

    def _offload(self, report: ReportedObject) -> None:
        """Copy one object of our segment to disk and report the disk replica."""
        if report.checksum is None or self.record.get(report.key) != report:
            return
        start = report.address - self.segment.base
        data = bytes(self.buffer[start:start + report.size])  # one read: check what we write
        if xxhash.xxh3_64_intdigest(data) != report.checksum:
            return  # evicted and overwritten since it completed
        self.disk.write(report.key, memoryview(data), report.checksum)
        try:
            self.master.add_disk_replica(report.key, self.segment.segment_id, report.address,
                                         report.checksum)
            self.disk_record[report.key] = ReportedObject(report.key, report.segment_id, 0, report.size,
                                                          report.checksum, report.hard_pinned)
            self.num_offloaded += 1
        except MooncakeError as exc:
            log.info("disk copy of %r not recorded (%s): removed", report.key, exc.message)
            self.disk.remove(report.key)

    def _intact_files(self) -> list[ReportedObject]:
        """Our recorded files whose header, size and checksum still check out; a damaged one is
        deleted rather than reported."""
        intact = []
        for key, report in list(self.disk_record.items()):
            try:
                data, checksum = self.disk.read(key)
            except MooncakeError as exc:
                log.warning("disk copy of %r not re-reported: %s", key, exc.message)
                self._forget_file(key)
                continue
            if data.nbytes == report.size and checksum == report.checksum:
                intact.append(report)
            else:
                self._forget_file(key)  # rewritten by something else since: trust neither
        return intact

    def _forget_file(self, key: str) -> None:
        self.disk_record.pop(key, None)
        self.disk.remove(key)

    def _disk_read(self, request: Request) -> Reply:
        key = request.args.get("key")
        if not isinstance(key, str):
            raise InvalidParams("disk_read needs a string 'key'")
        data, checksum = self.disk.read(key)
        return Reply({"size": data.nbytes, "checksum": checksum}, [data])
