"""What every prefill instance does around the prefill itself: a job queue and the report.

Operation ``prefill.run`` (from the conductor) queues one job (a PrefillJob of
:mod:`daemons.serving.messages`) and answers at once::

    {"request_id", "token_ids": [int], "load_blocks": int, "store": bool,
     "decode": {"segment", "kv_address", "block_ids"},
     "local_blocks": int, "source_segment": str | None, "replicate": bool}

One thread takes jobs in order, runs :meth:`PrefillJobsDaemon.prefill` on each and reports
``conductor.prefill_done`` (a PrefillReport)::

    {"request_id", "ok", "error", "first_token", "loaded_blocks", "stored_blocks",
     "replicated_blocks", "kv_bytes", "timings": {"queue", "load", "compute", "store", "transfer"}}

``stored_blocks`` counts the leading prompt blocks the instance holds or is still putting when it
reports (its puts end after the report); the conductor records them as cached at this instance. A plain worker
(:mod:`daemons.workers.prefill`) and a CPP group (:mod:`daemons.workers.cpp.group_worker`) differ
only in how they prefill.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from daemons.serving.messages import PrefillJob, PrefillReport
from daemons.workers.base import WorkerDaemon
from transfer.errors import MooncakeError
from transfer.rpc.client_server import Request

log = logging.getLogger(__name__)


@dataclass
class Job:
    request: PrefillJob
    arrived: float = field(default_factory=time.monotonic)


class PrefillJobsDaemon(WorkerDaemon):
    role = "prefill"

    def start_jobs(self) -> None:
        """Serve ``prefill.run``; called at the end of ``setup_worker``."""
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.num_done = 0
        self.server.register("prefill.run", self._enqueue)
        self.compute = threading.Thread(target=self._serve_jobs, name="prefill-compute", daemon=True)
        self.compute.start()

    def prefill(self, job: Job) -> PrefillReport:
        """The report of one job without its ``queue`` timing (which this class adds)."""
        raise NotImplementedError

    def load(self) -> dict[str, Any]:
        return {"queued": self.jobs.qsize(), "num_done": self.num_done}

    def stop_jobs(self) -> None:
        """Finish the job at hand (up to drain_timeout) and stop taking more."""
        if hasattr(self, "compute"):
            self.jobs.put(None)
            self.compute.join(timeout=self.config.drain_timeout)

    def _enqueue(self, request: Request) -> dict:
        self.jobs.put(Job(PrefillJob.from_wire(request.args)))
        return {"queued": self.jobs.qsize()}

    def _serve_jobs(self) -> None:
        while (job := self.jobs.get()) is not None:
            started = time.monotonic()
            try:
                report = self.prefill(job)
                report.timings.queue = started - job.arrived
            except Exception as exc:  # report every failure: the client is waiting for this job
                log.exception("prefill of %s failed", job.request.request_id)
                report = PrefillReport.failed(job.request.request_id, f"{type(exc).__name__}: {exc}")
            self.num_done += 1
            try:
                self.conductor_client.call("conductor.prefill_done", report.to_wire())
            except MooncakeError as exc:
                log.warning("could not report %s to the conductor: %s", report.request_id, exc)
