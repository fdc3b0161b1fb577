"""Send a request's KV pages from a prefill worker into the decode worker's registered pages.

Both workers build the same layout from the same settings, so a page is ``block_bytes`` at
``base + block_id * block_bytes`` on either side; the decode worker tells its base address and
page ids when it reserves them. Runs of pages consecutive on both sides travel as one transfer
request (a fresh cache hands out consecutive pages, so a prompt is usually a single request).

A prefill streams the pages layer by layer (:class:`LayerStream`): as soon as layer L is
computed, layer L of every page of the prompt is queued on the sender's own thread, which writes
it while the model computes layer L+1; the prefill's report goes once the last layer is written.
Layers go in the order they were queued, one write at a time.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from daemons.model import KVCacheLayout
from transfer.batch import OpCode, TransferRequest
from transfer.engine import TransferEngine


def page_runs(local: list[int], remote: list[int]) -> list[tuple[int, int, int]]:
    """(first local page, first remote page, count) runs covering ``zip(local, remote)``."""
    runs: list[tuple[int, int, int]] = []
    for mine, theirs in zip(local, remote):
        if runs and runs[-1][0] + runs[-1][2] == mine and runs[-1][1] + runs[-1][2] == theirs:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((mine, theirs, 1))
    return runs


def send_pages(engine: TransferEngine, layout: KVCacheLayout, local_base: int, local_pages: list[int],
               segment: str, remote_base: int, remote_pages: list[int],
               layers: tuple[int, int] | None = None) -> int:
    """WRITE the pages and wait; returns bytes moved (TransferFailed/TransferTimeout otherwise).

    ``layers`` [a, b) sends only those layers of each page: a CPP stage holds just its own, and
    they lie contiguous inside a page, so each page is one request (runs of pages would carry
    the other stages' layers along)."""
    if len(remote_pages) < len(local_pages):
        raise ValueError(f"{len(local_pages)} pages to send, {len(remote_pages)} reserved")
    first, stop = layers or (0, layout.num_layers)
    skip, span = first * layout.layer_block_bytes, (stop - first) * layout.layer_block_bytes
    runs = (page_runs(local_pages, remote_pages) if span == layout.block_bytes
            else [(mine, theirs, 1) for mine, theirs in zip(local_pages, remote_pages)])
    handle = engine.open_segment(segment)
    requests = [TransferRequest(OpCode.WRITE, local_base + layout.block_offset(mine) + skip, handle,
                                remote_base + layout.block_offset(theirs) + skip,
                                (count - 1) * layout.block_bytes + span)
                for mine, theirs, count in runs]
    return engine.transfer_sync(requests)


class KvSender:
    """The thread that writes a worker's pages into decode workers' pages, and its streams."""

    def __init__(self, engine: TransferEngine, layout: KVCacheLayout, local_base: int) -> None:
        self.engine, self.layout, self.local_base = engine, layout, local_base
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="kv-send")

    def stream(self, local_pages: list[int], segment: str, remote_base: int,
               remote_pages: list[int]) -> LayerStream:
        """A stream of one request's pages to the decode worker's reserved ``remote_pages``."""
        if len(remote_pages) < len(local_pages):
            raise ValueError(f"{len(local_pages)} pages to send, {len(remote_pages)} reserved")
        return LayerStream(self, list(local_pages), segment, remote_base, list(remote_pages))

    def close(self) -> None:
        self._thread.shutdown(wait=True)


class LayerStream:
    """One request's pages on their way to decode, a range of layers at a time."""

    def __init__(self, sender: KvSender, local_pages: list[int], segment: str, remote_base: int,
                 remote_pages: list[int]) -> None:
        self._sender = sender
        self._pages = (local_pages, segment, remote_base, remote_pages)
        self._writes: list[Future] = []

    def send_layers(self, first: int, stop: int) -> None:
        """Queue layers [first, stop) of every page (their KV is final); returns at once."""
        sender, (local, segment, remote_base, remote) = self._sender, self._pages
        self._writes.append(sender._thread.submit(send_pages, sender.engine, sender.layout, sender.local_base,
                                                  local, segment, remote_base, remote, (first, stop)))

    def wait(self) -> int:
        """Wait for every queued write; bytes moved, or the first write's error (after all
        finished: none may still read the pages when the caller frees them)."""
        for write in self._writes:
            write.exception()
        return sum(write.result() for write in self._writes)

    def settle(self) -> None:
        """Wait for every queued write, whatever its outcome (the prefill failed, or :meth:`wait`
        raised already): the pages may be freed after this."""
        for write in self._writes:
            write.exception()


class PageSink:
    """Registered pages that stand in for a decode worker's (`mooncake bench prefill`): a prefill
    writes a prompt's KV there as it would into decode's reserved pages."""

    def __init__(self, engine: TransferEngine, num_pages: int, page_bytes: int) -> None:
        self.engine, self.num_pages = engine, num_pages
        self.buffer = engine.allocate_shared_buffer(num_pages * page_bytes)

    def target(self, num_pages: int) -> dict:
        """A decode target ({"segment", "kv_address", "block_ids"}) of the first ``num_pages``."""
        if num_pages > self.num_pages:
            raise ValueError(f"{num_pages} pages wanted, the sink has {self.num_pages}")
        return {"segment": self.engine.name, "kv_address": int(self.buffer.ctypes.data),
                "block_ids": list(range(num_pages))}
