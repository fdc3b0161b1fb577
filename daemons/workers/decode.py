"""The decode worker: continuous batching over KV pages the prefill workers write into.

Its KV pages land in a shared-memory region registered with its transfer engine at start, so a
prefill worker on this host copies pages straight in (TCP or RDMA from other hosts). On the CPU
the model decodes over those very pages. On a GPU (model_device cuda) the model's pages are a
CUDA tensor, and ``decode.start`` copies the request's prompt pages into it from where they
landed: a prefill worker cannot write into GPU memory of another process (the transfer engine
publishes a GPU buffer only where GPUDirect RDMA reaches it), so host pages stay the target.
Operations (from the conductor; the typed messages are in :mod:`daemons.serving.messages`)::

    decode.reserve {"request_id", "token_ids", "max_tokens",
                    "writer": {"name", "address", "processes"}}  the prefill worker that writes them
        -> KvTarget {"segment", "kv_address", "block_ids"}  pages for the request's whole life, so it
                                                     never runs out mid-generation (KVCacheFull)
    decode.start   {"request_id", "first_token"}    the prefill wrote the pages: join the batch
        -> {"finish_reason"}                         set when the first token already ended it
    decode.release {"request_id"}                   cancel: leave the batch, free the pages
                                                    (sent once the prefill can no longer write)

After every step the batch loop reports the step's tokens (``conductor.tokens``, a DecodeStep)::

    {"events": [[request_id, token, finish_reason], ...], "step_s", "batch", "context"}

``step_s`` with ``batch`` (sequences stepped) and ``context`` (tokens they attended over) is
what the conductor refits its TBT model from.

Reserved pages are freed only on ``decode.start`` (they join the batch), ``decode.release``, or
once the prefill worker that writes them is done with them: a reservation not started within
``request_timeout`` is not freed then, since a late prefill would write into pages given to
another request. A thread asks the writer named in the reservation (``prefill.drop``) every
:data:`~daemons.workers.reservations.ASK_INTERVAL` until it says the job can no longer write
(dropped unstarted, finished, or unknown to it), or until every process writing for it is
verifiably dead (same machine only); :mod:`daemons.workers.reservations` has the rules. A writer
on another machine that never answers again keeps its expired reservations until this worker
restarts: ``load()`` counts them (``expired_reserved``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import topology
from daemons.cluster.workdir import shm_prefix
from daemons.model import BlockManager, ContinuousBatcher, KVCache, ModelRunner, Sequence
from daemons.observe.metrics import counter, gauge
from daemons.serving.messages import DecodedToken, DecodeStep, DropAnswer, KvTarget, PrefillWriter, checked_int
from daemons.workers.base import WorkerDaemon
from daemons.workers.reservations import ASK_INTERVAL, Reservations, may_free
from daemons.workers.writer_liveness import verifiably_dead
from transfer.errors import InvalidArgument, MooncakeError
from transfer.from_settings import open_engine
from transfer.memory import address_of
from transfer.rpc.client_server import Request, RpcClient

log = logging.getLogger(__name__)


class DecodeWorkerDaemon(WorkerDaemon):
    role = "decode"

    def setup_worker(self) -> None:
        matrix_file = self.paths.topology_file
        matrix = topology.load_matrix(matrix_file) if matrix_file.exists() else None
        self.engine = open_engine(f"{self.name}-{self.cluster_id}-{self.started_at:.0f}", self.master_address,
                                  self.config, topology=matrix, shm_prefix=shm_prefix(self.cluster_id))
        buffer = self.engine.allocate_shared_buffer(self.layout.nbytes)
        self.landing = KVCache(self.layout, buffer=buffer)  # where the prefill workers write
        self.kv = (self.landing if self.model.device.type == "cpu"
                   else KVCache(self.layout, device=self.model.device))
        self.kv_address = address_of(buffer)
        self.pages = BlockManager(self.layout.num_blocks, self.layout.block_size)
        self.batcher = ContinuousBatcher(ModelRunner(self.model, self.kv), self.pages,
                                         stop_token_ids=self.model.config.stop_token_ids,
                                         max_batch_size=self.config.max_batch_size)
        self.reservations = Reservations()
        self.cond = threading.Condition()
        self.num_steps = self.num_tokens = 0
        for op, handler in (("decode.reserve", self._reserve), ("decode.start", self._start),
                            ("decode.release", self._release)):
            self.server.register(op, handler, blocking=True)
        self.loop = threading.Thread(target=self._decode_loop, name="decode-loop", daemon=True)
        self.loop.start()
        self.writer_clients: dict[str, RpcClient] = {}  # prefill address -> client; the asker's own
        self.asker = threading.Thread(target=self._ask_writers_loop, name="reservation-asker", daemon=True)
        self.asker.start()

    def load(self) -> dict[str, Any]:
        return {"running": self.batcher.num_running, "waiting": self.batcher.num_waiting,
                "reserved": len(self.reservations), "free_blocks": self.pages.num_free_blocks,
                "expired_reserved": self.reservations.num_expired(time.monotonic())}

    def metric_families(self) -> Iterator[Any]:
        yield from super().metric_families()
        with self.cond:
            load = self.load()
        yield gauge("mooncake_worker_kv_blocks_free", "KV pages neither reserved nor in use", load["free_blocks"])
        yield gauge("mooncake_worker_decode_running", "Sequences in the running batch", load["running"])
        yield gauge("mooncake_worker_decode_waiting", "Sequences waiting to join the batch", load["waiting"])
        yield gauge("mooncake_worker_decode_reserved", "Requests holding pages their prefill still writes", load["reserved"])
        yield counter("mooncake_worker_decode_steps_total", "Decode steps run", self.num_steps)
        yield counter("mooncake_worker_decode_tokens_total", "Tokens generated", self.num_tokens)

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            with self.cond:
                self.cond.notify_all()
            self.loop.join(timeout=self.config.drain_timeout)
            self.asker.join(timeout=self.config.drain_timeout)
            self.engine.close()
        super().teardown()

    def _reserve(self, request: Request) -> dict:
        args = request.args
        try:
            writer = PrefillWriter.from_wire(args["writer"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"decode.reserve needs the writing prefill worker ({type(exc).__name__}: {exc})") from None
        vocab = self.model.config.vocab_size
        token_ids = args.get("token_ids")
        if not isinstance(token_ids, list) or not token_ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in token_ids):
            raise InvalidArgument(f"decode.reserve: token_ids must be a non-empty list of ids in 0..{vocab - 1}")
        seq = Sequence.from_prompt(_request_id(args), token_ids, checked_int(args, "max_tokens", 1, 2**31))
        with self.cond:
            if seq.seq_id in self.reservations:
                raise InvalidArgument(f"request {seq.seq_id!r} already holds pages here")
            self.pages.allocate(seq, len(seq) + seq.max_tokens)  # KVCacheFull travels to the conductor
            self.reservations.hold(seq, writer, time.monotonic() + self.config.request_timeout)
        return KvTarget(self.engine.name, self.kv_address, list(seq.block_table)).to_wire()

    def _start(self, request: Request) -> dict:
        request_id = _request_id(request.args)
        first_token = checked_int(request.args, "first_token", 0, self.model.config.vocab_size - 1)
        with self.cond:
            seq = self.reservations.take(request_id)
            if seq is None:
                raise InvalidArgument(f"no reservation for request {request_id!r}")
            seq.num_kv_tokens = len(seq)  # the prefill worker wrote KV of every prompt token
            if self.kv is not self.landing:
                self.kv.copy_pages_from(self.landing, seq.block_table[:-(-len(seq) // self.layout.block_size)])
            seq.append(first_token, self.model.config.stop_token_ids)
            if seq.is_finished:
                self.pages.deallocate(seq)
            else:
                self.batcher.add(seq)
                self.cond.notify_all()
        return {"finish_reason": seq.finish_reason}

    def _release(self, request: Request) -> dict:
        request_id = _request_id(request.args)
        with self.cond:
            seq = self.reservations.take(request_id)
            if seq is not None:
                self.pages.deallocate(seq)
                return {"released": True}
            return {"released": self.batcher.cancel(request_id)}

    def _decode_loop(self) -> None:
        while not self.stop_requested.is_set():
            with self.cond:
                if not self.batcher.num_active:
                    self.cond.wait(0.1)
                    continue
                began = time.monotonic()
                # Not holding the lock during the forward: reserve, start and release (two of
                # them on every request's TTFT path) answer while a step runs.
                events = self.batcher.step(lock=self.cond)
                step_s, batch = time.monotonic() - began, len(events)
                context = self.batcher.last_step_context
                self.num_steps += 1
                self.num_tokens += batch
            step = DecodeStep(self.name, step_s, batch, context,
                              [DecodedToken(e.seq_id, e.token, e.finish_reason) for e in events], self.credential)
            try:
                self.conductor_client.call("conductor.tokens", step.to_wire())
            except MooncakeError as exc:
                log.warning("could not report %d token(s) to the conductor: %s", batch, exc)

    def _ask_writers_loop(self) -> None:
        """Ask the writers of expired reservations whether they are done; free what they confirm."""
        try:
            while not self.stop_requested.wait(ASK_INTERVAL / 5):
                with self.cond:
                    asks = self.reservations.due(time.monotonic())
                for request_id, writer in asks:
                    if may_free(writer, self._ask_writer(writer, request_id), verifiably_dead):
                        with self.cond:
                            seq = self.reservations.take(request_id)
                            if seq is not None:
                                log.warning("freeing pages of %s: reserved but never started, and its "
                                            "prefill on %s can no longer write them", request_id, writer.name)
                                self.pages.deallocate(seq)
                self._close_idle_writer_clients()
        finally:
            for client in self.writer_clients.values():
                client.close()

    def _ask_writer(self, writer: PrefillWriter, request_id: str) -> DropAnswer | None:
        """The writer's answer to ``prefill.drop``, or None if it gave none that counts."""
        client = self.writer_clients.get(writer.address)
        if client is None:
            client = self.writer_clients[writer.address] = RpcClient(writer.address, timeout=self.config.rpc_timeout,
                                                                           secret=self.secret)
        try:
            return DropAnswer.from_wire(client.call("prefill.drop", {"request_id": request_id},
                                                    timeout=min(self.config.rpc_timeout, 1.0)))
        except MooncakeError as exc:
            log.warning("pages of %s stay reserved: prefill worker %s did not answer (%s)",
                        request_id, writer.name, exc)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("pages of %s stay reserved: prefill worker %s answered nonsense (%s)",
                        request_id, writer.name, exc)
        return None

    def _close_idle_writer_clients(self) -> None:
        with self.cond:
            wanted = self.reservations.writer_addresses()
        for address in set(self.writer_clients) - wanted:
            self.writer_clients.pop(address).close()


def _request_id(args: dict) -> str:
    request_id = args.get("request_id")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= 256:
        raise InvalidArgument(f"request_id must be a string, got {request_id!r:.40}")
    return request_id
