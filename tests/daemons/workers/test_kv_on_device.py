"""A prefill worker's KV pages in GPU memory: its new blocks go to the store layer by layer, come
back into other pages as a loaded prefix, and go layer by layer into a decode worker's landing
pages, which the decode worker copies onto its device; every byte as computed.

The transfer engine sees those pages as ``cuda:0`` memory and stages every byte through its
pinned host mirror, checksums included. Here that memory is a fake GPU buffer over the CPU
pages (:class:`tests.transfer.fake_gpu.FakeGpuBuffer`: a missed staging copy leaves the pages or
the mirror stale, and the bytes differ); on a CUDA host (marked gpu) the pages are a real CUDA
tensor. A real master and store clients on loopback, with the workers' own PrefixStore and
KvSender.
"""

from __future__ import annotations

import pytest
import torch

from daemons.cluster.store_access import connect
from daemons.model import BlockManager, KVCache, KVCacheLayout, ModelConfig, ModelRunner, Sequence, random_model
from daemons.workers.kv_sender import KvSender, PageSink
from daemons.workers.prefix_store import PrefixStore
from tests.conftest import Mooncake, require_cuda
from tests.transfer.fake_gpu import FakeGpuBuffer
from transfer.settings import resolve

BLOCK, PAGES = 16, 8


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("kv-on-device") / "cluster")
    runner.json("up", env={"MOONCAKE_SEGMENT_SIZE": "16MiB"}, timeout=120)
    yield resolve({"workdir": str(runner.workdir)}, environ={})
    runner("down", timeout=60)


class DevicePages:
    """KV pages registered with a store client's engine as GPU memory: fake or real."""

    def __init__(self, kind: str, layout: KVCacheLayout, store) -> None:
        self.fake = None
        if kind == "fake-gpu":
            self.kv = KVCache(layout)
            self.fake = FakeGpuBuffer(memory=self.kv.numpy())
            self.address = store.register_buffer(self.fake)
        else:
            self.kv = KVCache(layout, device="cuda:0")
            self.address = store.register_buffer(self.kv.transfer_buffer())
        assert store.engine.memory.find(self.address, layout.nbytes).location == "cuda:0"

    def staged(self, direction: str) -> bool:
        """Whether the engine copied bytes this way between the pages and its mirror (fakes
        count their copies; a real GPU buffer is trusted to have been staged)."""
        return self.fake is None or any(copy[0] == direction for copy in self.fake.copies)


@pytest.mark.parametrize("kind", ["fake-gpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_kv_in_gpu_memory_moves_through_the_engines_staging(config, kind):
    if kind == "cuda":
        require_cuda()
    model = random_model(ModelConfig.tiny(), seed=0).to("cuda:0" if kind == "cuda" else "cpu")
    layout = KVCacheLayout.for_model(model.config, BLOCK, PAGES)
    tokens = [256] + [(7 * i) % 256 for i in range(3 * BLOCK + 4)]  # three full blocks and a tail
    with connect(config, segment_size=4 << 20) as worker, connect(config) as decode_host:
        segment = worker.owner.segment.segment_id
        computed = DevicePages(kind, layout, worker)
        seq = Sequence.from_prompt("prompt", tokens, max_tokens=1)
        BlockManager(PAGES, BLOCK).allocate(seq)
        keys = seq.block_keys(BLOCK)
        prefix = PrefixStore(worker, layout, computed.address, segment)
        puts = []
        ModelRunner(model, computed.kv).prefill(
            seq, lambda layer, blocks: puts.append(prefix.store_layer(layer, keys[:len(blocks)], blocks)))
        assert [put.result() for put in puts] == [3] * layout.num_layers  # checksummed puts
        assert computed.staged("to_host")
        prefix.close()

        # A later prefill loads the prefix into pages of its own, layer by layer.
        loaded = DevicePages(kind, layout, worker)
        loader = PrefixStore(worker, layout, loaded.address, segment)
        hit, pending = loader.load(keys, [7, 6, 5], local_blocks=3)
        for future in pending[1:]:
            future.result()
        loader.close()
        assert hit == 3 and loaded.staged("from_host")
        for theirs, mine in zip(seq.block_table[:3], [7, 6, 5]):
            assert loaded.kv.export_block(mine) == computed.kv.export_block(theirs)

        # The pages, layer by layer, into a decode worker's landing pages in host memory, and
        # from there onto the decode worker's device.
        sink = PageSink(decode_host.engine, PAGES, layout.block_bytes)
        target = sink.target(PAGES)
        sender = KvSender(worker.engine, layout, computed.address)
        stream = sender.stream(seq.block_table, target["segment"], target["kv_address"], target["block_ids"][::-1])
        for layer in range(layout.num_layers):
            stream.send_layers(layer, layer + 1)
        assert stream.wait() == len(seq.block_table) * layout.block_bytes
        sender.close()
        landing = KVCache(layout, buffer=sink.buffer)
        decode_pages = KVCache(layout, device=model.device)
        received = target["block_ids"][::-1][:len(seq.block_table)]
        decode_pages.copy_pages_from(landing, received)
        for mine, theirs in zip(seq.block_table, received):
            assert decode_pages.export_block(theirs) == computed.kv.export_block(mine)
        assert torch.count_nonzero(decode_pages.tensor[received]) > 0
