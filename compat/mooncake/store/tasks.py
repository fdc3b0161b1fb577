"""Replica copy and move tasks: ``create_copy_task``, ``create_move_task``, ``query_task``.

Each task is checked when it is created, with the original's codes (INVALID_PARAMS for no or
unknown targets, a move onto its own source or from a segment without a replica;
OBJECT_NOT_FOUND for a missing key), then runs in the background: PENDING, PROCESSING, then
SUCCESS or FAILED with a message. Running one is our master's replica copy
(:mod:`store.replication`): new replicas are allocated on the targets, written from a complete
replica, and published together; a move drops its source replica in that same step, so the
object is never without a replica and a reader never sees one half written. A copy to a
segment that holds the object already leaves it as it is. As in the original, a task that met
NO_AVAILABLE_HANDLE is retried; so is a move whose source a reader still holds a lease on, once
the lease has run out.

Where ours differs: the original's master queues tasks and hands them to the client owning the
source segment; ours has no task queue, so the store that creates a task runs it, on one thread
of its own, and keeps its record: ``query_task`` answers TASK_NOT_FOUND in another store, and a
task still pending when its store closes ends FAILED. ``assigned_client`` is that store's id.
Targets and sources are segment names as ``get_hostname`` gives them (our segment ids work too).
"""

from __future__ import annotations

import enum
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mooncake._codes import code_of, log
from mooncake.store.lifecycle import StoreLifecycle, wait_out_leases
from store.errors import NoAvailableHandle, ObjectHasLease, ObjectNotFound

TASK_NOT_FOUND = -1400
NO_TASK = (0, 0)  # the original's UUID{0, 0}, returned with a failed creation
MAX_RETRIES = 3
MAX_FINISHED_TASKS = 10000  # finished tasks kept for query_task; older ones are pruned
RETRY_DELAY = 0.1  # seconds before a NO_AVAILABLE_HANDLE retry: eviction makes room meanwhile


class TaskType(enum.IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(enum.IntEnum):
    # The original's order: FAILED before SUCCESS.
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class QueryTaskResponse:
    def __init__(self, task_id: tuple[int, int], task_type: TaskType, assigned_client: tuple[int, int]) -> None:
        self.id = task_id
        self.type = task_type
        self.status = TaskStatus.PENDING
        self.created_at_ms_epoch = self.last_updated_at_ms_epoch = _now_ms()
        self.assigned_client = assigned_client
        self.message = ""

    def _moved_to(self, status: TaskStatus, message: str = "") -> None:
        self.status, self.message, self.last_updated_at_ms_epoch = status, message, _now_ms()

    def __repr__(self) -> str:
        return (f"QueryTaskResponse(id={self.id}, type={self.type.name}, status={self.status.name}, "
                f"message={self.message!r})")


class TaskApi(StoreLifecycle):
    def __init__(self) -> None:
        super().__init__()
        self._tasks: OrderedDict[tuple[int, int], QueryTaskResponse] = OrderedDict()
        self._tasks_lock = threading.Lock()
        self._runner: ThreadPoolExecutor | None = None
        self._store_uuid = _pair(uuid.uuid4())

    def close(self) -> int:
        """Let the running task finish; those still pending end FAILED."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.shutdown(wait=True, cancel_futures=True)
        with self._tasks_lock:
            for task in self._tasks.values():
                if task.status is TaskStatus.PENDING:
                    task._moved_to(TaskStatus.FAILED, "the store was closed before the task ran")
        return super().close()

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        """(task id, 0), or ((0, 0), the code) when the task cannot be created."""
        def check(client: Any) -> tuple[list[str], str]:
            _replica_segments(client, key)  # OBJECT_NOT_FOUND before anything else, as the original
            if not targets:
                raise ValueError("a copy needs at least one target segment")
            return self._known_segments(targets), ""
        return self._submit("create_copy_task", TaskType.REPLICA_COPY, key, check)

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        def check(client: Any) -> tuple[list[str], str]:
            held = _replica_segments(client, key)
            if source == target:
                raise ValueError(f"a move onto its own source {source!r}")
            target_ids = self._known_segments([target])
            sources = [s for s in self._segment_ids([source]) if s in held]
            if not sources:
                raise ValueError(f"{key!r} has no replica on {source!r}")
            return target_ids, sources[0]
        return self._submit("create_move_task", TaskType.REPLICA_MOVE, key, check)

    def query_task(self, task_id: Any) -> tuple[QueryTaskResponse | None, int]:
        with self._tasks_lock:
            task = self._tasks.get(tuple(task_id))
        if task is None:
            log.error("query_task(%s): no such task in this store", task_id)
            return None, TASK_NOT_FOUND
        return task, 0

    # -- helpers --------------------------------------------------------------------------------
    def _submit(self, operation: str, task_type: TaskType, key: str, check: Any) -> tuple[tuple[int, int], int]:
        try:
            client = self._require()
            target_ids, drop = check(client)
        except Exception as exc:
            code = code_of(exc)
            log.error("%s(%s) failed (%d): %s", operation, key, code, exc)
            return NO_TASK, code
        task = QueryTaskResponse(_pair(uuid.uuid4()), task_type, self._store_uuid)
        with self._tasks_lock:
            self._tasks[task.id] = task
            self._prune()
            if self._runner is None:
                self._runner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooncake-task")
            self._runner.submit(self._run, task, client, key, target_ids, drop)
        return task.id, 0

    def _run(self, task: QueryTaskResponse, client: Any, key: str, target_ids: list[str], drop: str) -> None:
        task._moved_to(TaskStatus.PROCESSING)
        for attempt in range(MAX_RETRIES + 1):
            try:
                client.copy_replicas(key, target_ids, drop)
                task._moved_to(TaskStatus.SUCCESS, "done")
                return
            except (NoAvailableHandle, ObjectHasLease) as exc:
                if attempt == MAX_RETRIES:
                    task._moved_to(TaskStatus.FAILED, f"{exc.name}: {exc.message}")
                    return
                if isinstance(exc, NoAvailableHandle):
                    time.sleep(RETRY_DELAY)
                else:
                    wait_out_leases(client, [key])
            except Exception as exc:
                task._moved_to(TaskStatus.FAILED, f"{code_of(exc)}: {exc}")
                return

    def _known_segments(self, names: list[str]) -> list[str]:
        ids = []
        for name in names:
            found = self._segment_ids([name])
            if not found:
                raise ValueError(f"target segment {name!r} is not mounted")
            ids.extend(found)
        return ids

    def _prune(self) -> None:
        finished = [i for i, t in self._tasks.items() if t.status in (TaskStatus.SUCCESS, TaskStatus.FAILED)]
        for task_id in finished[:max(0, len(self._tasks) - MAX_FINISHED_TASKS)]:
            del self._tasks[task_id]


def _replica_segments(client: Any, key: str) -> set[str]:
    """The segments holding ``key`` (no lease taken); OBJECT_NOT_FOUND when it does not exist."""
    row = client.master.inspect("key", key)
    if row["state"] != "COMPLETE":
        raise ObjectNotFound(f"{key!r} is still being written")
    return {r["segment_id"] for r in row["replicas"]}


def _pair(value: uuid.UUID) -> tuple[int, int]:
    """The original's UUID: two 64-bit halves."""
    return value.int >> 64, value.int & (2**64 - 1)


def _now_ms() -> int:
    return int(time.time() * 1000)
