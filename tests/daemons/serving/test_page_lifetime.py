"""The rules of decode page lifetime, without a cluster: the prefill job queue (deadlines,
``prefill.drop``, late ``prefill.run``), the decode worker's expired reservations, and the
liveness proof of a writing process."""

from __future__ import annotations

import os
import subprocess

from daemons.model import Sequence
from daemons.serving.messages import DropAnswer, KvTarget, PrefillJob, PrefillReport, PrefillWriter, WriterProcess
from daemons.workers.prefill_jobs import Job, JobQueue
from daemons.workers.reservations import ASK_INTERVAL, Reservations, may_free
from daemons.workers.writer_liveness import this_process, verifiably_dead


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def job(request_id: str, clock: Clock, deadline_s: float = 10.0) -> Job:
    return Job(PrefillJob(request_id, [256, 1, 2], 0, False, KvTarget("decode", 0, [0]), deadline_s=deadline_s), clock.now)


def test_prefill_job_and_report_carry_deadline_and_drop_over_the_wire():
    sent = PrefillJob("r", [256], 0, True, KvTarget("d", 4, [1, 2]), deadline_s=2.5)
    assert PrefillJob.from_wire(sent.to_wire()) == sent
    assert PrefillJob.from_wire({k: v for k, v in sent.to_wire().items() if k != "deadline_s"}).deadline_s == float("inf")
    report = PrefillReport.from_wire(PrefillReport.dropped_unstarted("r", "late").to_wire())
    assert report.dropped and not report.ok and "late" in report.error
    writer = PrefillWriter("prefill-0", "tcp://h:1", [WriterProcess("host/boot", 12, 345)])
    assert PrefillWriter.from_wire(writer.to_wire()) == writer
    answer = DropAnswer(True, writer.processes[0])
    assert DropAnswer.from_wire(answer.to_wire()) == answer


def test_a_job_past_its_deadline_is_dropped_unstarted_and_its_late_run_refused():
    clock = Clock()
    jobs = JobQueue(clock=clock)
    assert jobs.put(job("late", clock, deadline_s=1.0)) and jobs.put(job("fine", clock))
    clock.now += 2.0
    dropped, why = jobs.next()
    assert dropped.request.request_id == "late" and "deadline" in why
    assert not jobs.put(job("late", clock))  # a retried prefill.run is refused
    running, why = jobs.next()
    assert running.request.request_id == "fine" and why is None


def test_prefill_drop_removes_a_queued_job_but_not_the_running_one():
    clock = Clock()
    jobs = JobQueue(clock=clock)
    for name in ("a", "b", "c"):
        jobs.put(job(name, clock))
    running, _ = jobs.next()
    assert running.request.request_id == "a"
    assert jobs.drop("a") is False  # it runs: it may still write, ask again
    assert jobs.drop("c") is True and len(jobs) == 1
    reported, why = jobs.next()  # a job dropped on request is reported before the next runs
    assert reported.request.request_id == "c" and "decode worker" in why
    jobs.finished()
    assert jobs.drop("a") is True  # finished
    assert jobs.drop("never-seen") is True
    assert not jobs.put(job("never-seen", clock))  # its prefill.run came after the drop
    assert jobs.next()[0].request.request_id == "b"


def test_dropped_ids_are_remembered_within_a_bound():
    clock = Clock()
    jobs = JobQueue(remember=2, clock=clock)
    for name in ("x", "y", "z"):
        jobs.drop(name)
    assert jobs.put(job("x", clock))  # forgotten: the oldest of three
    assert not jobs.put(job("z", clock))


def test_close_stops_handing_out_jobs():
    jobs = JobQueue()
    jobs.put(job("a", Clock()))
    jobs.close()
    assert jobs.next() is None


WRITER = PrefillWriter("prefill-0", "tcp://h:1", [WriterProcess("host/boot", 12, 345)])


def test_expired_reservations_are_asked_about_not_freed_and_asked_again_later():
    book = Reservations()
    seq = Sequence.from_prompt("r", [256, 1], 4)
    book.hold(seq, WRITER, expires=10.0)
    assert book.due(9.0) == [] and book.num_expired(9.0) == 0
    assert book.due(10.0) == [("r", WRITER)] and book.num_expired(10.0) == 1
    assert book.due(10.0 + ASK_INTERVAL / 2) == []
    assert book.due(10.0 + ASK_INTERVAL) == [("r", WRITER)]
    assert "r" in book and book.writer_addresses() == {"tcp://h:1"}
    assert book.take("r") is seq and book.take("r") is None and len(book) == 0


def test_pages_are_freed_only_on_the_writers_word_or_proof_of_death():
    def alive(process: WriterProcess) -> bool:
        return False

    def dead(process: WriterProcess) -> bool:
        return True

    same, other = WRITER.processes[0], WriterProcess("host/boot", 99, 1)
    assert may_free(WRITER, DropAnswer(True, same), alive)
    assert not may_free(WRITER, DropAnswer(False, same), dead)  # it says the job runs
    assert not may_free(WRITER, None, alive)  # unreachable: maybe only slow
    assert may_free(WRITER, None, dead)
    assert not may_free(WRITER, DropAnswer(True, other), alive)  # a successor cannot speak for it
    assert may_free(WRITER, DropAnswer(True, other), dead)
    assert not may_free(PrefillWriter("p", "tcp://h:1", []), None, dead)  # no processes named, no proof


def test_a_process_is_dead_only_when_provably_so_on_this_machine():
    me = this_process()
    assert not verifiably_dead(me)
    child = subprocess.Popen(["sleep", "30"])
    try:
        record = this_process(child.pid)
        assert not verifiably_dead(record)
    finally:
        child.kill()
    child.wait()
    assert verifiably_dead(record)
    assert verifiably_dead(WriterProcess(me.host, os.getpid(), me.started + 1))  # the pid was reused
    assert not verifiably_dead(WriterProcess("another-host/boot", child.pid, record.started))
