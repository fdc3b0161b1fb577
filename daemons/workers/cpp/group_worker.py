"""A CPP prefill group serving as one prefill instance of the cluster (``prefill_group_size`` > 1).

This daemon is the group's front: it registers with the conductor as one prefill worker (its
heartbeat says ``group_size`` and ``prefill_chunk``, so the conductor plans it with the CPP time
model), takes ``prefill.run`` jobs like a plain worker, and runs each on its stage processes
(:class:`daemons.workers.cpp.group.PrefillGroup`), which it starts and stops with itself. The stages do
the work: each loads its layers of the cached prefix from the store, computes its layers over
the prompt's chunks, writes each of its layers' slice of every page into the decode worker's
reserved pages as soon as the layer is computed, and stores its layers' new blocks (the group
reports once the KV is in decode's pages; the puts end in the background). The group owns one
store segment, its instance-local cache (stage 0 contributes it, ``prefill_segment_size`` bytes),
which its heartbeat announces (``segment``) like a plain worker's: the stages read the job's
``local_blocks`` from there, pull the rest from ``source_segment`` and, with ``replicate``, keep
a replica of them there. A job counts as running until every stage it went to answered (see
:mod:`daemons.workers.cpp.group`), so ``prefill.drop`` never calls a job dropped while a stage
may still write into the decode worker's pages. The KV never passes through this process or through
another stage, so no stage waits on a gather and the decode worker's pages fill from X senders
at once.
"""

from __future__ import annotations

from typing import Any

from daemons.serving.messages import PrefillReport, PrefillTimings
from daemons.workers.cpp.group import PrefillGroup
from daemons.workers.prefill_jobs import Job, PrefillJobsDaemon


class PrefillGroupDaemon(PrefillJobsDaemon):
    def setup_worker(self) -> None:
        self.group = PrefillGroup(self.config, self.config.prefill_group_size,
                                  master=(self.master_address, self.cluster_id),
                                  segment_owner=f"{self.name}-{self.cluster_id}-{self.started_at:.0f}")
        self.start_jobs()

    def writer_pids(self) -> list[int]:
        return [*super().writer_pids(), *(proc.pid for proc in self.group.procs)]  # the stages write

    def load(self) -> dict[str, Any]:
        own = {"segment": self.group.segment} if self.group.segment else {}
        return {**super().load(), "group_size": self.group.stages, "prefill_chunk": self.config.prefill_chunk,
                "stage_pids": [proc.pid for proc in self.group.procs], **own}

    def teardown(self) -> None:
        if hasattr(self, "group"):
            self.stop_jobs()
            self.group.close()
        super().teardown()

    def prefill(self, job: Job) -> PrefillReport:
        spec = job.request
        result = self.group.prefill(spec.token_ids, load_blocks=spec.load_blocks, decode=spec.decode.to_wire(),
                                    store="layer" if spec.store else "none", wait_store=False,
                                    local_blocks=spec.local_blocks, source_segment=spec.source_segment,
                                    replicate=spec.replicate, timeout=self.config.request_timeout)
        return PrefillReport(spec.request_id, True, first_token=result["first_token"],
                             loaded_blocks=result["loaded_blocks"], stored_blocks=result["stored_blocks"],
                             replicated_blocks=result["replicated_blocks"],
                             kv_bytes=result["kv_bytes"], pipelined=result["pipelined"],
                             timings=PrefillTimings(**result["timings"]))
