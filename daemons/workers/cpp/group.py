"""A CPP prefill group: X stage processes that together act as one prefill instance.

The group starts the stages (``daemons.workers.cpp.stage``), wires stage k's outbox to stage k+1's inbox
(their transfer-engine segments, exchanged once at start), and runs prompts: one longer than
``prefill_chunk`` new tokens goes to every stage as a pipelined job, a shorter one to stage 0
alone. A job runs in two rounds: each stage loads the cached prefix of its layers and says how
many blocks it has; the group starts every stage from the fewest, so all compute from the same
token. Each stage writes each of its layers into the decode worker's pages as soon as the layer
is computed, and answers when its share is computed, written to the decode worker and (unless
the caller does not wait for the store, as the serving group does) stored. The group's answer
is TTFT (job sent to logits ready on the last stage and, with a decode target, every layer in
decode's pages) and when the last stage finished storing.

With ``segment_owner`` the group has an instance-local cache: stage 0's store client contributes
one segment of ``prefill_segment_size`` bytes under that client id, and every stage reads,
puts and keeps replicas of its layers there (see :mod:`daemons.workers.cpp.stage`).

A job counts as finished only once every stage it went to has answered, or its process is gone:
a stage answers only after its writes into the decode worker's pages settled, so until then it
may still write there, and the caller (the group daemon's job queue) must keep the job running,
so that ``prefill.drop`` says so. A stage that misses the job's ``timeout`` therefore is waited
for, not abandoned; the job then fails once it answered. Why wait rather than stop and restart
the stage that overran: every step of a stage is bounded already (pipe and transfer timeouts,
``request_timeout`` for pages, the store's RPC timeout), so a live stage does answer; killing it
would not prove that nothing more arrives either (a TCP write may already sit in the decode
host's socket buffer), would tear down the pipeline's links and the group's segment (its whole
local cache), and would leave the stage's late answer to be read as the next job's.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from daemons.model import reusable_blocks
from daemons.serving.errors import GenerationFailed
from daemons.workers.cpp.stage import stage_main
from transfer.errors import TransferTimeout
from transfer.settings import Config

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0  # seconds for a stage to import torch and build its layers on a busy host
LIVENESS_POLL_S = 1.0  # how often a wait for a stage's answer checks that its process lives


class StageFailed(GenerationFailed):
    """A stage of the group reported an error; travels as GenerationFailed's code."""


class PrefillGroup:
    def __init__(self, config: Config, stages: int, *, with_store: bool = False,
                 master: tuple[str, str] | None = None, segment_owner: str | None = None) -> None:
        """``with_store``: each stage is a client of the cluster in ``config.workdir``, or of
        ``master`` (address, cluster id) when a daemon of a cluster still starting runs the group.
        ``segment_owner``: the client id under which stage 0 contributes the group's segment
        (none with it unset or ``prefill_segment_size`` 0)."""
        context = multiprocessing.get_context("spawn")  # no forked torch or engine threads
        self.config, self.stages = config, stages
        links = [context.Pipe() for _ in range(stages - 1)]
        self.jobs: list[Connection] = []
        self.procs = []
        for k in range(stages):
            mine, theirs = context.Pipe()
            prev = links[k - 1][1] if k else None
            next_ = links[k][0] if k < stages - 1 else None
            proc = context.Process(target=stage_main, name=f"cpp-stage-{k}", daemon=True,
                                   args=(dict(config.values), k, stages, theirs, prev, next_,
                                         master or with_store, segment_owner if k == 0 else None))
            proc.start()
            self.jobs.append(mine)
            self.procs.append(proc)
        try:
            hellos = [self._answer(k, START_TIMEOUT) for k in range(stages)]
            for k in range(stages):
                self.jobs[k].send(hellos[k + 1] if k + 1 < stages else None)
            connected = [self._answer(k, START_TIMEOUT) for k in range(stages)]
            self.segment: str | None = connected[0]["segment"]
            for k in range(stages):
                self.jobs[k].send(self.segment)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> PrefillGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _answer(self, k: int, timeout: float) -> Any:
        if not self.jobs[k].poll(timeout):
            raise TransferTimeout(f"stage {k} did not answer within {timeout:g}s "
                                  f"(alive: {self.procs[k].is_alive()})")
        try:
            return self.jobs[k].recv()
        except EOFError:
            raise StageFailed(f"stage {k} exited (code {self.procs[k].exitcode})") from None

    def prefill(self, token_ids: list[int], *, load_blocks: int = 0, decode: dict | None = None,
                store: str = "none", want_kv: bool = False, wait_store: bool = True,
                local_blocks: int | None = None, source_segment: str | None = None, replicate: bool = False,
                timeout: float = 600.0) -> dict[str, Any]:
        """Prefill one prompt, loading up to ``load_blocks`` prefix blocks from the store (the
        leading ``local_blocks``, default all, from the group's segment, the rest from
        ``source_segment``, None: any replica; with ``replicate`` keeping a copy of those in the
        group's segment) and writing the KV into ``decode``'s pages; without ``wait_store`` it
        returns once the KV is there and the puts end in the background. Returns or raises only
        once no stage still works on the job (``timeout`` passed: StageFailed). {"first_token",
        "logits", "ttft", "done", "pipelined", "loaded_blocks", "stored_blocks",
        "replicated_blocks", "kv_bytes", "timings", "stages": [...]}."""
        size = self.config.kv_block_tokens
        planned = reusable_blocks(len(token_ids), size, load_blocks) * size
        pipelined = self.stages > 1 and len(token_ids) - planned > self.config.prefill_chunk
        targets = range(self.stages) if pipelined else range(1)
        sent = time.monotonic()
        for k in targets:
            self.jobs[k].send({"token_ids": token_ids, "pipelined": pipelined, "store": store, "want_kv": want_kv,
                               "wait_store": wait_store, "load_blocks": load_blocks, "local_blocks": local_blocks,
                               "source_segment": source_segment, "replicate": replicate, "decode": decode})
        deadline = sent + timeout
        loads = self._round(targets, deadline, abort=True)
        hit = min(a["loaded"] for a in loads)
        began = time.monotonic()
        for k in targets:
            self.jobs[k].send(hit * size)
        answers = self._round(targets, deadline, abort=False)
        last = answers[-1]
        logits = np.frombuffer(last["logits"], dtype=np.float32)
        stored = min(a["stored"] for a in answers) if store != "none" else 0
        replicated = min(a["replicated"] for a in answers)
        local = hit if local_blocks is None else min(local_blocks, hit)
        # The leading blocks the group holds, or is putting (with a segment: in it). Pulled
        # blocks it does not keep end with this job, as on a plain worker.
        held = hit + stored
        if store != "none" and self.segment and hit > local and not replicated:
            held = local
        # TTFT as the served path sees it: the first token known and, with ``decode``, every
        # stage's layers in the decode worker's pages (store puts may still run).
        ready = max([last["logits_at"], *(a["sent_at"] for a in answers)]) if decode else last["logits_at"]
        return {"first_token": int(logits.argmax()), "logits": logits, "pipelined": pipelined,
                "ttft": ready - sent, "done": max(a["done_at"] for a in answers) - sent,
                "loaded_blocks": hit, "stored_blocks": held, "replicated_blocks": replicated,
                "kv_bytes": sum(a["kv_bytes"] for a in answers),
                "timings": {"load": began - sent, "compute": last["logits_at"] - began,
                            "transfer": max(a["transfer"] for a in answers),
                            "store": max(a["store_tail"] for a in answers)},
                "stages": answers}

    def _round(self, targets: range, deadline: float, *, abort: bool) -> list[dict]:
        """Every target's answer (:func:`answers_of`); StageFailed if any failed (after the load
        round, telling the others to drop the job, since each waits for a start)."""
        answers = answers_of([(self.jobs[k], self.procs[k]) for k in targets], deadline)
        failed = [f"stage {k}: {a['error']}" for k, a in zip(targets, answers) if not a["ok"]]
        if failed:
            if abort:
                for k in targets:
                    self.jobs[k].send(None)
            raise StageFailed("; ".join(failed))
        return answers

    def close(self) -> None:
        for k, proc in enumerate(self.procs):
            if proc.is_alive():
                try:
                    self.jobs[k].send(None)
                except OSError:
                    pass  # the stage is gone already
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def answers_of(stages: Sequence[tuple[Connection, BaseProcess]], deadline: float) -> list[dict]:
    """Each stage's answer to one round of a job, waiting for it as long as the stage's process
    lives, past ``deadline`` (a ``time.monotonic()`` stamp) too: until it answers, the stage may
    still write into the decode worker's pages. One that answers late, or whose process is gone,
    gets a failed answer ({"ok": False, "error"}) in its place."""
    return [_answer_of(conn, proc, deadline) for conn, proc in stages]


def _answer_of(conn: Connection, proc: BaseProcess, deadline: float) -> dict:
    overran = False
    while True:
        left = deadline - time.monotonic()
        if conn.poll(min(left, LIVENESS_POLL_S) if left > 0 else LIVENESS_POLL_S):
            break
        if not proc.is_alive():  # the group holds the stage's pipe end too: no EOF tells
            return {"ok": False, "error": f"exited (code {proc.exitcode})"}
        if left <= 0 and not overran:
            overran = True
            log.warning("%s missed the job's timeout; waiting for its answer, since until then it may "
                        "still write into the decode worker's pages", proc.name)
    late = time.monotonic() > deadline
    try:
        answer = conn.recv()
    except EOFError:
        return {"ok": False, "error": f"exited (code {proc.exitcode})"}
    if late and answer["ok"]:
        return {"ok": False, "error": "answered after the job's timeout"}
    return answer
