"""The batch's running account (open tasks, bytes, failures) against a pass over its tasks.

``Batch.summary`` and ``Batch.pending`` answer from counters once every task has ended; these
seeded random histories of slices landing and failing check that the counters never disagree
with what the tasks themselves say.
"""

from __future__ import annotations

import random

from transfer.batch import Batch, OpCode, Status, Task, TransferRequest, TransferStatus

SEVERITY = [Status.FAILED, Status.TIMEOUT, Status.PENDING, Status.WAITING, Status.COMPLETED]


def _by_pass(tasks: list[Task], now: float) -> TransferStatus:
    statuses = [task.status(now) for task in tasks]
    worst = min((s.status for s in statuses), key=SEVERITY.index, default=Status.COMPLETED)
    errors = [s.error for s in statuses if s.error]
    return TransferStatus(worst, sum(s.transferred_bytes for s in statuses), errors[0] if errors else "")


def test_the_batch_account_agrees_with_its_tasks_through_random_histories():
    rng = random.Random(20)
    for _ in range(400):
        count = rng.randint(1, 12)
        requests = [TransferRequest(OpCode.WRITE, i * 100, 1, i * 100, rng.randint(1, 100)) for i in range(count)]
        batch = Batch(count)
        tasks = batch.add(requests, deadline=10.0)
        slices = {}
        for task in tasks:
            slices[task] = rng.randint(1, 3)
            if slices[task] > 1:
                task.expect(slices[task])
        events = [(task, "land") for task in tasks for _ in range(slices[task])]
        events += [(task, "fail") for task in rng.sample(tasks, rng.randint(0, count))]
        rng.shuffle(events)
        for task, event in events[:rng.randint(0, len(events))]:
            if event == "land":
                task.slice_done(rng.randint(1, 50))
            else:
                task.fail(f"request {tasks.index(task)} failed")
            for now in (5.0, 11.0):  # before and after the deadline
                assert batch.summary(now) == _by_pass(tasks, now)
                assert batch.pending(now) == any(t.status(now).status == Status.PENDING for t in tasks)


def test_whole_requests_landed_together_end_at_once():
    requests = [TransferRequest(OpCode.READ, i * 10, 1, i * 10, 10) for i in range(5)]
    batch = Batch(5)
    tasks = batch.add(requests, deadline=10.0)
    Task.land_whole(tuple(tasks[:4]))
    assert batch.pending(5.0) and batch.open == 1
    assert batch.summary(5.0) == TransferStatus(Status.PENDING, 40)
    Task.land_whole((tasks[4],))
    assert not batch.pending(5.0) and batch.open == 0
    assert batch.summary(11.0) == TransferStatus(Status.COMPLETED, 50)
