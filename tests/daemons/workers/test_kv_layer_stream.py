"""Layer-wise P->D: a prefill's pages go to decode one layer at a time, in order, while it computes;
and its pages stay taken until its background puts end."""

from __future__ import annotations

import threading

import pytest

from daemons.model import KVCacheFull, KVCacheLayout, ModelConfig, Sequence
from daemons.workers.kv_sender import KvSender
from daemons.workers.prefill_pages import PrefillPages
from transfer.batch import OpCode

LOCAL_BASE, REMOTE_BASE = 1 << 20, 1 << 30


class RecordingEngine:
    """Stands in for the transfer engine: records each write batch, and holds the first one until
    the test lets it go (a write still moving while the model computes the next layer)."""

    def __init__(self) -> None:
        self.batches: list[list] = []
        self.release = threading.Event()
        self.first_started = threading.Event()

    def open_segment(self, name: str) -> int:
        assert name == "decode-0"
        return 7

    def transfer_sync(self, requests: list) -> int:
        if not self.batches:
            self.first_started.set()
            assert self.release.wait(10)
        self.batches.append(requests)
        return sum(r.length for r in requests)


def test_each_layer_is_written_as_it_is_queued_and_in_layer_order():
    layout = KVCacheLayout.for_model(ModelConfig.tiny(layers=4), 16, 32)
    engine = RecordingEngine()
    sender = KvSender(engine, layout, LOCAL_BASE)
    try:
        stream = sender.stream([3, 4, 9], "decode-0", REMOTE_BASE, [10, 11, 12, 13])
        stream.send_layers(0, 1)  # layer 0 computed: its write starts ...
        assert engine.first_started.wait(10)
        for layer in (1, 2, 3):  # ... and the later layers queue without waiting for it
            stream.send_layers(layer, layer + 1)
        assert engine.batches == []
        engine.release.set()
        assert stream.wait() == 4 * 3 * layout.layer_block_bytes
    finally:
        sender.close()
    assert len(engine.batches) == 4
    for layer, batch in enumerate(engine.batches):
        # One request per page carrying that layer only (K and V of the layer lie together).
        skip = layer * layout.layer_block_bytes
        assert [(r.opcode, r.source, r.target_id, r.target_offset, r.length) for r in batch] == [
            (OpCode.WRITE, LOCAL_BASE + layout.block_offset(mine) + skip, 7,
             REMOTE_BASE + layout.block_offset(theirs) + skip, layout.layer_block_bytes)
            for mine, theirs in ((3, 10), (4, 11), (9, 12))]


def test_a_job_waits_for_pages_still_being_stored_from_but_not_for_more_than_exist():
    pages = PrefillPages(num_blocks=4, block_size=16)
    storing = Sequence.from_prompt("storing", list(range(48)), max_tokens=1)  # 3 pages
    pages.take(storing, timeout=1)
    waiting = Sequence.from_prompt("next", list(range(40)), max_tokens=1)  # 3 pages: 1 free now
    threading.Timer(0.05, pages.give_back, (storing,)).start()  # its puts end
    pages.take(waiting, timeout=10)
    assert len(waiting.block_table) == 3
    with pytest.raises(KVCacheFull):
        pages.take(Sequence.from_prompt("huge", list(range(80)), max_tokens=1), timeout=30)
