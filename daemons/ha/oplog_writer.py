"""The leader's op-log writer: makes the store's changes durable in etcd before PutEnd answers.

One thread drains the store's :class:`store.oplog.OpLogJournal` and writes each batch in etcd
transactions (group commit: every PutEnd that arrived while a write was in flight rides the
next one, so a burst of puts costs a few round trips, not one each). Every transaction is
fenced on ``master_view`` still naming this master, so a deposed leader that has not noticed yet
can never overwrite what its successor replayed. A failed write is kept and retried: the journal
has already moved on, and dropping it would lose the change.

PutEnd handlers call :meth:`OpLogWriter.wait_durable`; a store state replaced under them (this
master was deposed) fails the wait with NOT_LEADER rather than acknowledging a change no one
will write. Key layout and why it is latest-state rather than an append log: :mod:`store.oplog`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from store.oplog import Batch, replay
from transfer.errors import NotLeader
from transfer.etcd.kv import EtcdKV, EtcdUnavailable
from transfer.etcd.leader import master_view_key

log = logging.getLogger(__name__)
MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


def oplog_prefix(cluster_id: str) -> str:
    return f"mooncake-store/{cluster_id}/oplog/"


class OpLogWriter:
    def __init__(self, kv: EtcdKV, cluster_id: str, address: str, timeout: float) -> None:
        self.kv, self.prefix, self.timeout = kv, oplog_prefix(cluster_id), timeout
        self.fence = (master_view_key(cluster_id), address)
        self.generation = 0  # bumped whenever a fresh store state is attached
        self._service: Any = None
        self._durable = 0  # journal changes of the attached state written to etcd
        self._unwritten: list[Batch] = []
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ha-oplog", daemon=True)
        self._thread.start()

    def attach(self, service: Any) -> None:
        """Drain ``service`` (a StoreService) from now on; waiters on the previous one fail."""
        with self._cond:
            self._service, self._durable, self._unwritten = service, 0, []
            self.generation += 1
            self._cond.notify_all()

    @property
    def attached(self) -> Any:
        return self._service

    def replay_into(self, service: Any, now: float) -> int:
        """Rebuild ``service``'s state from the log (raises EtcdUnavailable); objects rebuilt."""
        entries = {k[len(self.prefix):]: v for k, v in self.kv.get_prefix_utf8(self.prefix).items()}
        with service.lock:
            state = service.state
            count = replay(state, entries, now)
            state.journal.take(state.segments, state.offload_pending)  # what we read is already there
        return count

    def wait_durable(self, generation: int) -> None:
        service = self.attached
        with service.lock:
            target = service.state.journal.num_changes
        self._wake.set()
        with self._cond:
            done = self._cond.wait_for(lambda: self.generation != generation or self._durable >= target,
                                       self.timeout)
            if self.generation != generation:
                raise NotLeader("this master was deposed before the change reached etcd")
            if not done:
                raise EtcdUnavailable(f"the op log did not reach etcd within {self.timeout:.1f}s")

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.05)  # also flushes what evictions and expiries change on their own
            self._wake.clear()
            with self._cond:
                service, generation = self._service, self.generation
            if service is None:
                continue
            with service.lock:
                state = service.state
                batches, upto = state.journal.take(state.segments, state.offload_pending)
            with self._cond:
                if generation != self.generation:
                    continue
                self._unwritten += batches
                pending = list(self._unwritten)
            if self._write(pending):
                with self._cond:
                    if generation == self.generation:
                        self._unwritten = self._unwritten[len(pending):]
                        self._durable = upto
                        self._cond.notify_all()

    def _write(self, batches: list[Batch]) -> bool:
        try:
            for batch in batches:
                items, prefixes = list(batch.puts.items()), sorted(batch.delete_prefixes)
                while items or prefixes:
                    chunk_prefixes, prefixes = prefixes[:MAX_TXN_OPS], prefixes[MAX_TXN_OPS:]
                    room = MAX_TXN_OPS - len(chunk_prefixes)
                    chunk, items = dict(items[:room]), items[room:]
                    if self.kv.txn({self.prefix + k: v for k, v in chunk.items()},
                                   tuple(self.prefix + p for p in chunk_prefixes), if_value=self.fence) is None:
                        log.warning("op log write refused: %s no longer names this master", self.fence[0])
                        return False
        except EtcdUnavailable as exc:
            log.warning("op log write failed (will retry): %s", exc.message)
            return False
        return True
