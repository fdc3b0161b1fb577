"""The model on its device (model_device): choosing it, pages moving between devices, and, on a
CUDA host (tests marked gpu, run by tests/gpu/run_on_gpu.sh), prefill, prefix reuse, pipeline
stages and batched decode on the GPU giving the CPU reference's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from daemons.model import (BlockManager, ContinuousBatcher, KVCache, KVCacheLayout, ModelConfig, ModelRunner,
                           Sequence, StageModel, StageRunner, build_model, generate_reference, prefill_in_threads,
                           random_model, split_layers)
from daemons.model.device import model_device
from daemons.model.errors import DeviceUnavailable
from tests.conftest import require_cuda
from tests.daemons.model.conftest import BLOCK, prompt
from transfer.settings import resolve


def test_cpu_is_always_there_and_cuda_without_a_gpu_is_refused_in_one_line():
    assert model_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the refusal cannot happen here")
    with pytest.raises(DeviceUnavailable) as caught:
        model_device("cuda:1")
    assert str(caught.value) == ("model_device cuda:1: this host has no usable CUDA device "
                                 "(torch.cuda.is_available() is false)")


def test_build_model_refuses_a_missing_device_before_it_reads_a_checkpoint(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the refusal cannot happen here")
    config = resolve({"model_device": "cuda", "model_dir": str(tmp_path / "no-such-checkpoint")}, environ={})
    with pytest.raises(DeviceUnavailable, match="no usable CUDA device"):
        build_model(config)


def test_pages_copy_between_caches_page_by_page(model):
    layout = KVCacheLayout.for_model(model.config, BLOCK, 6)
    source, target = KVCache(layout), KVCache(layout)
    source.tensor.copy_(torch.randn(layout.shape))
    target.copy_pages_from(source, [4, 1])
    for block in range(layout.num_blocks):
        copied = target.export_block(block) == source.export_block(block)
        assert copied == (block in (1, 4))
    assert not target.tensor[[0, 2, 3, 5]].any()
    with pytest.raises(ValueError, match="same layout"):
        target.copy_pages_from(KVCache(KVCacheLayout.for_model(model.config, BLOCK, 7)), [1])


def test_host_pages_register_as_their_bytes_and_a_runner_refuses_pages_elsewhere(model):
    layout = KVCacheLayout.for_model(model.config, BLOCK, 4)
    kv = KVCache(layout)
    registered = kv.transfer_buffer()
    assert registered.nbytes == layout.nbytes and registered.ctypes.data == kv.tensor.data_ptr()
    with pytest.raises(ValueError, match="on meta, the model on cpu"):
        ModelRunner(model, KVCache(layout, device="meta"))
    with pytest.raises(ValueError, match="on meta, the stage's layers on cpu"):
        StageRunner(StageModel(model, 0, 2), KVCache(layout, device="meta"))
    with pytest.raises(ValueError, match="live on the CPU"):
        KVCache(layout, buffer=kv.numpy(), device="meta")


# -- on a CUDA GPU ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_model():
    """The conftest's tiny model (same config, same seed) on the GPU."""
    require_cuda()
    return random_model(ModelConfig.tiny(), seed=0).to("cuda:0")


@pytest.mark.gpu
def test_cuda_model_greedy_tokens_equal_the_cpu_reference(model, cuda_model):
    device = torch.device("cuda:0")
    assert model_device("cuda") == device and cuda_model.device == device
    layout = KVCacheLayout.for_model(cuda_model.config, BLOCK, 64)
    kv = KVCache(layout, device=device)
    assert kv.transfer_buffer() is kv.tensor
    pages = BlockManager(layout.num_blocks, BLOCK)
    batcher = ContinuousBatcher(ModelRunner(cuda_model, kv), pages, stop_token_ids=cuda_model.config.stop_token_ids)
    runner = ModelRunner(cuda_model, kv)
    prompts = [prompt(n, seed=n) for n in (5, 16, 40, 77)]
    seqs = []
    for tokens in prompts:  # prefill each, then decode all four as one batch
        seq = Sequence.from_prompt(len(seqs), tokens, max_tokens=8)
        pages.allocate(seq, len(tokens) + 8)
        seq.append(int(runner.prefill(seq).argmax()), cuda_model.config.stop_token_ids)
        batcher.add(seq)
        seqs.append(seq)
    while not all(seq.is_finished for seq in seqs):
        batcher.step()
    for tokens, seq in zip(prompts, seqs):
        assert seq.generated == generate_reference(model, tokens, 8)


@pytest.mark.gpu
def test_cuda_prefix_reused_from_bytes_gives_bitwise_kv(cuda_model):
    """Prefix reuse's premise on the GPU: a block's KV computed cold equals, bit for bit, the
    block computed after the prefix before it was loaded from exported bytes."""
    device = torch.device("cuda:0")
    layout = KVCacheLayout.for_model(cuda_model.config, BLOCK, 16)
    tokens = prompt(4 * BLOCK + 3, seed=21)
    cold_kv, warm_kv = KVCache(layout, device=device), KVCache(layout, device=device)
    cold = Sequence.from_prompt("cold", tokens, max_tokens=1)
    warm = Sequence.from_prompt("warm", tokens, max_tokens=1)
    BlockManager(16, BLOCK).allocate(cold)
    BlockManager(16, BLOCK).allocate(warm)
    cold_logits = ModelRunner(cuda_model, cold_kv).prefill(cold)
    for block in range(2):
        warm_kv.import_block(warm.block_table[block], cold_kv.export_block(cold.block_table[block]))
    warm.num_kv_tokens = 2 * BLOCK
    warm_logits = ModelRunner(cuda_model, warm_kv).prefill(warm)
    assert int(warm_logits.argmax()) == int(cold_logits.argmax())
    for mine, theirs in zip(cold.block_table[:4], warm.block_table[:4]):
        assert cold_kv.export_block(mine) == warm_kv.export_block(theirs)


@pytest.mark.gpu
def test_cuda_pipeline_stages_give_the_cpu_reference_tokens(model, cuda_model):
    device = torch.device("cuda:0")
    tokens = prompt(3 * 2 * BLOCK + 9, seed=22)
    runners, seqs = [], []
    for k, (start, stop) in enumerate(split_layers(cuda_model.config.num_layers, 2)):
        kv = KVCache(KVCacheLayout.for_model(cuda_model.config, BLOCK, 16), device=device)
        seq = Sequence.from_prompt(k, tokens, max_tokens=1)
        BlockManager(16, BLOCK).allocate(seq)
        runners.append(StageRunner(StageModel(cuda_model, start, stop), kv))
        seqs.append(seq)
    logits = prefill_in_threads(runners, seqs, 2 * BLOCK)
    assert logits.device == device
    assert int(logits.argmax()) == generate_reference(model, tokens, 1)[0]
