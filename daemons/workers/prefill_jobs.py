"""What every prefill instance does around the prefill itself: a job queue and the report.

Operation ``prefill.run`` (from the conductor) queues one job (a PrefillJob of
:mod:`daemons.serving.messages`) and answers at once::

    {"request_id", "token_ids": [int], "load_blocks": int, "store": bool,
     "decode": {"segment", "kv_address", "block_ids"},
     "local_blocks": int, "source_segment": str | None, "replicate": bool, "deadline_s": float}
        -> {"accepted": bool, "queued": int}

One thread takes jobs in order, runs :meth:`PrefillJobsDaemon.prefill` on each and reports
``conductor.prefill_done`` (a PrefillReport)::

    {"request_id", "ok", "error", "first_token", "loaded_blocks", "stored_blocks",
     "replicated_blocks", "kv_bytes", "timings": {"queue", "load", "compute", "store", "transfer"}}

``stored_blocks`` counts the leading prompt blocks the instance holds or is still putting when it
reports (its puts end after the report); the conductor reads what is cached where from the
master's KV events instead (:mod:`daemons.serving.kv_events`), so it is for logs and benches. A
plain worker (:mod:`daemons.workers.prefill`) and a CPP group (:mod:`daemons.workers.cpp.group_worker`) differ
only in how they prefill.

Jobs and the decode pages they write: a job not started within ``deadline_s`` of its arrival is
dropped unstarted, and so is a queued job the decode worker asks about with ``prefill.drop``
(``{"request_id"}`` -> a DropAnswer) once the reservation it writes into expired. A dropped job
never runs: the conductor gets a PrefillReport with ``dropped`` set and frees its pages. The
answer to ``prefill.drop`` is ``dropped: false`` only while the job runs (it may still write;
ask again); a job finished, dropped or never seen is dropped, and its id is remembered (the
last ``DROPPED_MEMORY``) so that a ``prefill.run`` arriving after the drop is refused
(``accepted: false``) instead of writing into pages freed meanwhile. The heartbeat names the
processes that write this worker's KV (``writers``, WriterProcess records), so that a decode
worker can tell whether they are still alive when this worker stops answering.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from daemons.observe.metrics import counter, gauge
from daemons.serving.messages import DropAnswer, PrefillJob, PrefillReport
from daemons.workers.base import WorkerDaemon
from daemons.workers.writer_liveness import this_process
from transfer.errors import InvalidArgument, MooncakeError
from transfer.rpc.client_server import Request

log = logging.getLogger(__name__)


DROPPED_MEMORY = 4096  # ids of dropped jobs remembered, to refuse a prefill.run arriving after its drop


@dataclass
class Job:
    request: PrefillJob
    arrived: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> float:
        """When the job may no longer start (time.monotonic of this process)."""
        return self.arrived + self.request.deadline_s


class JobQueue:
    """The jobs in arrival order, the one running, and the dropped ones, under one lock; no I/O.

    :meth:`next` hands the compute thread each job to run, or to report as dropped with why.
    """

    def __init__(self, remember: int = DROPPED_MEMORY, clock: Callable[[], float] = time.monotonic) -> None:
        self._cond = threading.Condition()
        self._queued: OrderedDict[str, Job] = OrderedDict()
        self._to_report: deque[Job] = deque()  # dropped on request, not yet reported
        self._dropped: OrderedDict[str, None] = OrderedDict()  # the last `remember` dropped ids
        self._running: str | None = None
        self._closed = False
        self._remember, self._clock = remember, clock

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued)

    def put(self, job: Job) -> bool:
        """Queue ``job``; False (refused) if its request was dropped before it arrived."""
        request_id = job.request.request_id
        with self._cond:
            if request_id in self._dropped:
                return False
            self._queued[request_id] = job
            self._cond.notify()
            return True

    def drop(self, request_id: str) -> bool:
        """Whether the job can no longer write: False only while it runs. A queued job is
        removed (and reported by :meth:`next`); any id answered True is remembered as dropped."""
        with self._cond:
            if request_id == self._running:
                return False
            job = self._queued.pop(request_id, None)
            if job is not None:
                self._to_report.append(job)
                self._cond.notify()
            self._remember_dropped(request_id)
            return True

    def next(self) -> tuple[Job, str | None] | None:
        """Wait for the next job: (job, None) to run it - it counts as running until
        :meth:`finished` - or (job, why) to report it dropped unstarted; None once closed."""
        with self._cond:
            while not (self._queued or self._to_report or self._closed):
                self._cond.wait()
            if self._closed:
                return None
            if self._to_report:
                return self._to_report.popleft(), "the decode worker gave its pages up"
            request_id, job = self._queued.popitem(last=False)
            if self._clock() > job.deadline:
                self._remember_dropped(request_id)
                return job, f"not started within its deadline ({job.request.deadline_s:.3g}s)"
            self._running = request_id
            return job, None

    def finished(self) -> None:
        """The running job returned: it writes nothing more."""
        with self._cond:
            self._running = None

    def close(self) -> None:
        """Stop handing out jobs; the one running finishes."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _remember_dropped(self, request_id: str) -> None:
        self._dropped[request_id] = None
        self._dropped.move_to_end(request_id)
        while len(self._dropped) > self._remember:
            self._dropped.popitem(last=False)


class PrefillJobsDaemon(WorkerDaemon):
    role = "prefill"

    def start_jobs(self) -> None:
        """Serve ``prefill.run`` and ``prefill.drop``; called at the end of ``setup_worker``."""
        self.jobs = JobQueue()
        self.num_received = self.num_done = self.num_failed = self.num_dropped = 0
        self.num_prompt_tokens = self.num_loaded_blocks = 0
        self.writers = [this_process(pid) for pid in self.writer_pids()]
        self.server.register("prefill.run", self._enqueue)
        self.server.register("prefill.drop", self._drop)
        self.compute = threading.Thread(target=self._serve_jobs, name="prefill-compute", daemon=True)
        self.compute.start()

    def prefill(self, job: Job) -> PrefillReport:
        """The report of one job without its ``queue`` timing (which this class adds)."""
        raise NotImplementedError

    def writer_pids(self) -> list[int]:
        """The processes that write this worker's KV into decode pages (this one first)."""
        return [os.getpid()]

    def load(self) -> dict[str, Any]:
        return {"queued": len(self.jobs), "num_received": self.num_received, "num_done": self.num_done,
                "writers": [process.to_wire() for process in self.writers]}

    def metric_families(self) -> Iterator[Any]:
        yield from super().metric_families()
        yield gauge("mooncake_worker_prefill_queue_length", "Prefill jobs queued here, not yet started", len(self.jobs))
        yield counter("mooncake_worker_prefill_jobs_total", "Prefill jobs run (failed ones too)", self.num_done)
        yield counter("mooncake_worker_prefill_job_failures_total", "Prefill jobs that failed", self.num_failed)
        yield counter("mooncake_worker_prefill_jobs_dropped_total", "Prefill jobs dropped unstarted (deadline, or "
                      "their decode reservation expired)", self.num_dropped)
        yield counter("mooncake_worker_prefill_prompt_tokens_total", "Prompt tokens of the jobs run", self.num_prompt_tokens)
        yield counter("mooncake_worker_prefill_loaded_tokens_total", "Prompt tokens whose KV was loaded from the store",
                      self.num_loaded_blocks * self.layout.block_size)

    def stop_jobs(self) -> None:
        """Finish the job at hand (up to drain_timeout) and stop taking more."""
        if hasattr(self, "compute"):
            self.jobs.close()
            self.compute.join(timeout=self.config.drain_timeout)

    def _enqueue(self, request: Request) -> dict:
        accepted = self.jobs.put(Job(PrefillJob.from_wire(request.args)))
        self.num_received += accepted
        return {"accepted": accepted, "queued": len(self.jobs)}

    def _drop(self, request: Request) -> dict:
        request_id = request.args.get("request_id")
        if not isinstance(request_id, str):
            raise InvalidArgument(f"request_id must be a string, got {request_id!r}")
        return DropAnswer(self.jobs.drop(request_id), self.writers[0]).to_wire()

    def _serve_jobs(self) -> None:
        while (item := self.jobs.next()) is not None:
            job, dropped_because = item
            if dropped_because is not None:
                log.info("dropping the prefill of %s unstarted: %s", job.request.request_id, dropped_because)
                self._report(PrefillReport.dropped_unstarted(job.request.request_id, dropped_because))
                self.num_dropped += 1
                continue
            started = time.monotonic()
            try:
                report = self.prefill(job)
                report.timings.queue = started - job.arrived
            except Exception as exc:  # report every failure: the client is waiting for this job
                log.exception("prefill of %s failed", job.request.request_id)
                report = PrefillReport.failed(job.request.request_id, f"{type(exc).__name__}: {exc}")
            finally:
                self.jobs.finished()
            self.num_done += 1
            self.num_failed += not report.ok
            self.num_prompt_tokens += len(job.request.token_ids)
            self.num_loaded_blocks += report.loaded_blocks or 0
            self._report(report)

    def _report(self, report: PrefillReport) -> None:
        try:
            self.conductor_client.call("conductor.prefill_done", report.signed(self.name, self.credential).to_wire())
        except MooncakeError as exc:
            log.warning("could not report %s to the conductor: %s", report.request_id, exc)
