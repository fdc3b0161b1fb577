"""Segments mounted after setup: ``mount_segment``, ``allocate_and_mount_segment`` and their
unmounts, refused here with the original's own failure answers (ret -1, no segment ids).

Our store client contributes exactly one segment, the one ``setup`` sizes with
``global_segment_size``: it keeps that segment's record of objects and re-mounts it with them
after a master restart (store.segment_owner), which a second segment would need too. And a
segment is shared memory our transfer engine creates and names itself, so a file or an
existing /dev/shm region given by path cannot be one. The original fails these calls the same
way for a client that cannot own such segments (a dummy client), so callers already handle it.
"""

from __future__ import annotations

from mooncake._codes import log
from mooncake.store.lifecycle import StoreLifecycle

FAILED = -1
ONE_SEGMENT = "our store client contributes one segment, sized by setup's global_segment_size"


class SegmentApi(StoreLifecycle):
    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp",
                      location: str = "") -> dict:
        log.error("mount_segment(%s) refused: %s; a file or shm path cannot be a segment here", path, ONE_SEGMENT)
        return {"ret": FAILED, "segment_ids": []}

    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        log.error("unmount_segment(%s): no segment was mounted with mount_segment (%s)", segment_ids, ONE_SEGMENT)
        return FAILED

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp", location: str = "") -> dict:
        log.error("allocate_and_mount_segment(%d) refused: %s", size, ONE_SEGMENT)
        return {"ret": FAILED, "segment_ids": [], "allocated_size": 0}

    def unmount_and_free_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        log.error("unmount_and_free_segment(%s): no segment was allocated with allocate_and_mount_segment (%s)",
                  segment_ids, ONE_SEGMENT)
        return FAILED
