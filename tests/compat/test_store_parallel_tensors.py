"""The unified parallel tensor calls (``*_with_parallelism``) against a live cluster: where each
layout's objects go, the three read modes, interop with the legacy ``*_with_tp`` calls, the
``_from``/``_into`` forms on registered memory, and INVALID_PARAMS for arguments the original
refuses."""

from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace

import pytest
import torch

from mooncake.store import ParallelAxis, ReadTarget, TensorParallelism

INVALID = -600


def axis(kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    made = ParallelAxis()
    made.kind, made.rank, made.size, made.split_dim = kind, rank, size, split_dim
    made.expert_id, made.stage_id = expert_id, stage_id
    return made


def layout(*axes):
    made = TensorParallelism()
    made.axes = list(axes)
    return made


def target(mode, parallelism=None):
    made = ReadTarget()
    made.mode, made.parallelism = mode, parallelism
    return made


def tp(rank, size, split_dim):
    return layout(axis("tp", rank, size, split_dim))


def dp_tp(tp_rank, tp_size=3, split_dim=1):
    return layout(axis("dp", 1, 2), axis("tp", tp_rank, tp_size, split_dim))


def writer(rank, size, split_dim):
    return SimpleNamespace(rank=rank, size=size, split_dim=split_dim)


def arange(*shape):
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)


@pytest.fixture
def registered(store):
    """A registered 1 MiB host buffer: its address."""
    buffer = ctypes.create_string_buffer(1 << 20)
    ptr = ctypes.addressof(buffer)
    assert store.register_buffer(ptr, len(buffer)) == 0
    yield ptr
    store.unregister_buffer(ptr)


def test_classes_keep_the_originals_defaults():
    made = ParallelAxis()
    assert (made.kind, made.rank, made.size, made.split_dim, made.expert_id, made.stage_id) == ("", 0, 1, None, None,
                                                                                               None)
    assert TensorParallelism().axes == []
    read = ReadTarget()
    assert (read.mode, read.parallelism) == ("as_stored", None)
    read.mode = "FULL"
    assert read.mode == "full"
    with pytest.raises(RuntimeError):
        read.mode = "everything"


def test_no_parallelism_is_a_whole_tensor_object(store):
    tensor = arange(4, 6)
    assert store.put_tensor_with_parallelism("p-full", tensor) == 0
    assert torch.equal(store.get_tensor("p-full"), tensor)
    assert torch.equal(store.get_tensor_with_parallelism("p-full"), tensor)
    assert torch.equal(store.get_tensor_with_parallelism("p-full", target("as_stored")), tensor)
    assert store.upsert_tensor_with_parallelism("p-full", tensor + 1) == 0
    assert torch.equal(store.get_tensor("p-full"), tensor + 1)
    assert store.batch_put_tensor_with_parallelism(["p-b0", "p-b1"], [tensor, tensor * 2]) == [0, 0]
    got = store.batch_get_tensor_with_parallelism(["p-b0", "p-b1", "p-missing"])
    assert torch.equal(got[1], tensor * 2) and got[2] is None
    assert store.get_tensor_with_parallelism("p-missing", target("full")) is None


def test_plain_tp_stores_the_shard_given_under_the_legacy_key(store):
    tensor = arange(4, 6)
    shards = tensor.chunk(3, dim=1)
    for rank, shard in enumerate(shards):
        assert store.put_tensor_with_parallelism("p-tp", shard.contiguous(), tp(rank, 3, 1)) == 0
    assert [store.is_exist(f"p-tp_tp_{r}") for r in range(3)] == [1, 1, 1]
    assert store.is_exist("p-tp__parallelism_manifest") == 1
    raw = store.get("p-tp_tp_1")
    assert struct.unpack_from("<2q", raw, 40) == (4, 6)  # global shape: the shard's, times 3 on dim 1
    assert struct.unpack_from("<iiiiiiq", raw, 40 + 136) == (1, 0, 1, 3, 1, 0, 2)  # TP, local extent 2
    for rank, shard in enumerate(shards):
        assert torch.equal(store.get_tensor_with_tp("p-tp", tp_rank=rank, tp_size=3), shard)
        assert torch.equal(store.get_tensor_with_parallelism("p-tp", target("shard", tp(rank, 3, 1))), shard)
    for read_rank in range(3):
        assert torch.equal(store.get_tensor_with_parallelism("p-tp", target("full", tp(read_rank, 3, 1))), tensor)
    # Another TP size reads the same shards: the full tensor, or its slice for that size.
    assert torch.equal(store.get_tensor_with_parallelism("p-tp", target("full", tp(0, 2, 1))), tensor)
    assert torch.equal(store.get_tensor_with_parallelism("p-tp", target("shard", tp(1, 2, 1))), tensor[:, 3:])


def test_legacy_with_tp_shards_read_through_the_unified_calls(store):
    tensor = arange(8, 4)
    assert store.put_tensor_with_tp("p-legacy", tensor, tp_size=4, split_dim=0) == 0
    assert store.is_exist("p-legacy__parallelism_manifest") == 0  # the legacy call writes none
    assert torch.equal(store.get_tensor_with_parallelism("p-legacy", target("full", tp(0, 4, 0))), tensor)
    assert torch.equal(store.get_tensor_with_parallelism("p-legacy", target("full", tp(0, 2, 0))), tensor)
    assert torch.equal(store.get_tensor_with_parallelism("p-legacy", target("shard", tp(3, 4, 0))), tensor[6:])
    assert store.get_tensor_with_parallelism("p-legacy", target("full", tp(0, 4, 1))) is None  # split_dim differs


def test_tp_with_other_axes_takes_the_full_tensor(store):
    tensor = arange(4, 6)
    for rank in range(3):
        assert store.put_tensor_with_parallelism("p-dptp", tensor, dp_tp(rank)) == 0
    assert store.is_exist("p-dptp__dp_1of2__tp_2of3_sd1") == 1
    raw = store.get("p-dptp__dp_1of2__tp_2of3_sd1")
    assert struct.unpack_from("<2q", raw, 40) == (4, 6) and struct.unpack_from("<2q", raw, 40 + 64) == (4, 2)
    assert struct.unpack_from("<I", raw, 40 + 128)[0] == 2  # axis count; the axes in the order given
    assert struct.unpack_from("<iiiii", raw, 40 + 136) == (0, 0, 1, 2, -1)
    for rank in range(3):
        got = store.get_tensor_with_parallelism("p-dptp", target("shard", dp_tp(rank)))
        assert torch.equal(got, tensor.chunk(3, dim=1)[rank])
    assert torch.equal(store.get_tensor_with_parallelism("p-dptp", target("full", dp_tp(1))), tensor)
    other_replica = layout(axis("dp", 0, 2), axis("tp", 0, 3, 1))
    assert store.get_tensor_with_parallelism("p-dptp", target("shard", other_replica)) is None
    # Key names follow DP, TP, EP, PP whatever order the axes come in.
    tp_pp = layout(axis("tp", 1, 2, 0), axis("pp", 0, 2, stage_id=7))
    assert store.put_tensor_with_parallelism("p-pptp", tensor, tp_pp) == 0
    assert store.is_exist("p-pptp__tp_1of2_sd0__pp_0of2_sid7") == 1
    raw = store.get("p-pptp__tp_1of2_sd0__pp_0of2_sid7")
    assert struct.unpack_from("<iiiiiiq", raw, 40 + 136 + 32) == (3, 1, 0, 2, -1, 7, 0)  # PP keeps stage_id
    assert torch.equal(store.get_tensor_with_parallelism("p-pptp", target("shard", tp_pp)), tensor[2:])
    assert store.put_tensor_with_parallelism("p-uneven", tensor, dp_tp(0, tp_size=4)) == INVALID  # 6 % 4


def test_axis_only_layouts_store_the_tensor_as_given(store):
    tensor = arange(2, 3)
    expert = layout(axis("ep", 1, 4, expert_id=11))
    assert store.put_tensor_with_parallelism("p-ep", tensor, expert) == 0
    assert store.is_exist("p-ep__ep_1of4_eid11") == 1
    assert torch.equal(store.get_tensor_with_parallelism("p-ep", target("shard", expert)), tensor)
    assert store.get_tensor_with_parallelism("p-ep", target("full", expert)) is None  # no TP axis to join
    other_expert = layout(axis("ep", 1, 4, expert_id=12))
    assert store.get_tensor_with_parallelism("p-ep", target("shard", other_expert)) is None


def test_writer_partition_cuts_the_full_tensor(store):
    tensor = arange(6, 8)
    for rank in range(4):
        assert store.put_tensor_with_parallelism("p-wp", tensor, writer_partition=writer(rank, 4, 1)) == 0
    assert store.is_exist("p-wp__writer_3of4_sd1") == 1 and store.is_exist("p-wp__writer_manifest") == 1
    assert store.get_size("p-wp__writer_manifest") == 96
    assert torch.equal(store.get_tensor_with_parallelism("p-wp", target("full")), tensor)
    for rank in range(4):
        got = store.get_tensor_with_parallelism("p-wp", target("shard", tp(rank, 4, 1)))
        assert torch.equal(got, tensor.chunk(4, dim=1)[rank])
    tensors = [arange(4, 6), arange(6, 4)]
    assert store.batch_put_tensor_with_parallelism(["p-wb0", "p-wb1"], tensors,
                                                   writer_partitions=[writer(0, 2, 1), writer(0, 3, 0)]) == [0, 0]
    assert store.batch_upsert_tensor_with_parallelism(["p-wb0", "p-wb1"], tensors,
                                                      writer_partitions=[writer(1, 2, 1), writer(2, 3, 0)]) == [0, 0]
    assert store.put_tensor_with_parallelism("p-wb1", tensors[1], writer_partition=writer(1, 3, 0)) == 0
    full = store.batch_get_tensor_with_parallelism(["p-wb0", "p-wb1"], [target("full"), target("full")])
    assert all(torch.equal(got, want) for got, want in zip(full, tensors))


def test_arguments_the_original_refuses(store):
    tensor = arange(8, 8)
    refused = [
        layout(axis("dp", 0, 2, split_dim=0)),  # DP does not split
        layout(axis("ep", 0, 2)),  # EP needs expert_id
        layout(axis("pp", 0, 2)),  # PP needs stage_id
        layout(axis("tp", 0, 2)),  # TP needs split_dim
        layout(axis("tp", 2, 2, 0)),  # rank out of range
        layout(axis("tp", 0, 2, 0), axis("tp", 1, 2, 0)),  # one axis per kind
        layout(axis("sp", 0, 2)),
        layout(),
        layout(axis("dp", 0, 2), axis("tp", 0, 2, 5)),  # split_dim past the tensor's dims
    ]
    for parallelism in refused:
        assert store.put_tensor_with_parallelism("p-bad", tensor, parallelism) == INVALID, parallelism
        assert store.get_tensor_with_parallelism("p-bad", target("shard", parallelism)) is None
    assert store.put_tensor_with_parallelism("p-bad", tensor, tp(0, 2, 0), writer_partition=writer(0, 2, 0)) == INVALID
    assert store.put_tensor_with_parallelism("p-bad", tensor, writer_partition=writer(0, 3, 0)) == INVALID  # 8 % 3
    assert store.put_tensor_with_parallelism("p-bad", tensor, writer_partition=(0, 2, 0)) == INVALID
    assert store.put_tensor_with_parallelism("p-bad", "not a tensor") == INVALID
    keys, tensors = ["p-bad0", "p-bad1"], [tensor, tensor]
    assert store.batch_put_tensor_with_parallelism(keys, tensors, [tp(0, 2, 0)] * 2,
                                                   writer_partitions=[writer(0, 2, 0)] * 2) == [INVALID] * 2
    assert store.batch_put_tensor_with_parallelism(keys, tensors, [tp(0, 2, 0)]) == [INVALID] * 2
    assert store.batch_put_tensor_with_parallelism(keys, tensors, (None, None)) == [INVALID] * 2
    assert store.batch_put_tensor_with_parallelism(keys, [tensor]) == [INVALID] * 2
    assert store.batch_put_tensor_with_parallelism(keys, tensors, [None, layout()]) == [0, INVALID]
    assert store.is_exist("p-bad") == 0
    assert store.get_tensor_with_parallelism("p-bad0", target("shard")) is None  # shard needs parallelism
    assert store.get_tensor_with_parallelism("p-bad0", target("as_stored", tp(0, 2, 0))) is None
    assert store.batch_get_tensor_with_parallelism(keys, [target("as_stored")]) == [None, None]


def test_from_buffers_and_into_buffers(store, registered):
    tensor = arange(4, 6)
    size = 304 + tensor.numel() * 4
    assert store.put_tensor("p-seed", tensor) == 0
    assert torch.equal(store.get_tensor_into("p-seed", registered, size), tensor)  # the object now fills the buffer
    assert store.put_tensor_with_parallelism_from("p-from", registered, size) == 0
    assert torch.equal(store.get_tensor("p-from"), tensor)
    assert store.batch_upsert_tensor_with_parallelism_from(["p-from"], [registered], [size]) == [0]
    # With a TP axis the buffer holds the full tensor and every rank's shard is stored.
    assert store.put_tensor_with_parallelism_from("p-from-tp", registered, size, tp(0, 2, 1)) == 0
    assert torch.equal(store.get_tensor_with_tp("p-from-tp", tp_rank=1, tp_size=2), tensor[:, 3:])
    assert store.batch_put_tensor_with_parallelism_from(["p-from-dptp"], [registered], [size], [dp_tp(0)]) == [0]
    assert torch.equal(store.get_tensor("p-from-dptp__dp_1of2__tp_2of3_sd1"), tensor[:, 4:])
    assert store.upsert_tensor_with_parallelism_from("p-from-wp", registered, size,
                                                     writer_partition=writer(1, 2, 0)) == 0
    assert torch.equal(store.get_tensor("p-from-wp__writer_1of2_sd0"), tensor[2:])
    unregistered = ctypes.create_string_buffer(size)
    assert store.put_tensor_with_parallelism_from("p-from-x", ctypes.addressof(unregistered), size, tp(0, 2, 1)) < 0
    assert store.put_tensor_with_parallelism_from("p-from-x", registered, size - 1, tp(0, 2, 1)) == INVALID

    out = registered + 4096
    full = store.get_tensor_with_parallelism_into("p-from-tp", out, 8192, target("full", tp(0, 2, 1)))
    assert torch.equal(full, tensor)
    full.fill_(7.0)  # the tensor is the buffer's data part
    assert torch.equal(store.get_tensor_with_parallelism_into("p-from-tp", out, 8192, target("full", tp(0, 2, 1))),
                       tensor)
    got = store.batch_get_tensor_with_parallelism_into(
        ["p-from-dptp", "p-from", "p-missing"], [out, out + 4096, out + 8192], [4096] * 3,
        [target("shard", dp_tp(1)), None, target("full")])
    assert torch.equal(got[0], tensor[:, 2:4]) and torch.equal(got[1], tensor) and got[2] is None
    assert store.get_tensor_with_parallelism_into("p-from", out, size - 1) is None  # too small
    assert store.get_tensor_with_parallelism_into("p-from", ctypes.addressof(unregistered), size) is None
    assert store.batch_get_tensor_with_parallelism_into(["p-from", "p-from"], [out], [4096]) == [None, None]
