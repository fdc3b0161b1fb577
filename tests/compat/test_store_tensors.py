"""The tensor calls in the original's object format: round trips, TP split and join along
split_dim, reads into registered memory that share it, writes from it, upserts and safetensors."""

from __future__ import annotations

import ctypes
import pathlib
import struct

import pytest
import torch

from mooncake.store import ReplicateConfig
from mooncake.store import tensor_codec as codec

INVALID, NOT_FOUND = -600, -704


def test_objects_use_the_originals_304_byte_metadata(store):
    tensor = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    assert store.put_tensor("t-fmt", tensor) == 0
    assert store.get_size("t-fmt") == 304 + 12 * 8
    raw = store.get("t-fmt")
    magic, version, header_size, dtype, ndim = struct.unpack_from("<IHHii", raw)
    assert (magic, version, header_size, dtype, ndim) == (0x4D4F4F4E, 1, 304, 8, 2)  # INT64 is code 8
    assert struct.unpack_from("<8q", raw, 40)[:3] == (3, 4, -1)
    assert raw[304:] == tensor.numpy().tobytes()
    assert store.get_tensor("missing-tensor") is None
    assert store.put("not-a-tensor", b"x" * 400) == 0 and store.get_tensor("not-a-tensor") is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.int8])
def test_round_trip_keeps_dtype_and_shape(store, dtype):
    tensor = (torch.arange(24) % 3).to(dtype).reshape(2, 3, 4)
    key = f"t-{dtype}"
    assert store.put_tensor(key, tensor) == 0
    got = store.get_tensor(key)
    assert got.dtype == dtype and got.shape == tensor.shape and torch.equal(got, tensor)


def test_zero_sized_and_batch_tensors(store):
    tensors = [torch.empty((2, 0, 3)), torch.arange(6.0)]
    assert store.batch_put_tensor(["z0", "z1"], tensors) == [0, 0]
    got = store.batch_get_tensor(["z0", "z1", "missing-z"])
    assert got[0].shape == (2, 0, 3) and torch.equal(got[1], tensors[1]) and got[2] is None
    assert store.batch_put_tensor(["only-one-key"], tensors)[0] == INVALID


def test_tp_writes_every_rank_and_reads_one_slice(store):
    tensor = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert store.put_tensor_with_tp("tp", tensor, tp_size=3, split_dim=1) == 0
    shards = [store.get_tensor_with_tp("tp", tp_rank=r, tp_size=3) for r in range(3)]
    assert all(s.shape == (4, 2) for s in shards)
    assert torch.equal(torch.cat(shards, dim=1), tensor)  # joined along the split dimension
    assert store.is_exist("tp_tp_2") == 1 and store.is_exist("tp") == 0
    raw = store.get("tp_tp_1")  # a shard object says which slice of which whole it is
    assert struct.unpack_from("<I", raw, 16)[0] == codec.SHARD
    assert struct.unpack_from("<2q", raw, 40) == (4, 6)
    assert struct.unpack_from("<iiiii", raw, 40 + 136) == (codec.AXIS_TP, 0, 1, 3, 1)
    batch = store.batch_get_tensor_with_tp(["tp"], tp_rank=2, tp_size=3)
    assert torch.equal(batch[0], tensor[:, 4:])
    assert store.put_tensor_with_tp("tp-uneven", tensor, tp_size=4, split_dim=1) == INVALID  # 6 % 4
    assert store.get_tensor_with_tp("tp", tp_size=1) is None  # tp_size 1 reads the key itself
    assert store.batch_put_tensor_with_tp(["tpb0", "tpb1"], [tensor, tensor], tp_size=2) == [0, 0]
    assert torch.equal(store.get_tensor_with_tp("tpb1", tp_rank=1, tp_size=2), tensor[2:])


def test_into_shares_the_buffer_and_from_stores_it_back(store):
    original = torch.ones(100, dtype=torch.float32)
    assert store.put_tensor("into", original) == 0
    size = 304 + 400
    buffer = ctypes.create_string_buffer(size)
    ptr = ctypes.addressof(buffer)
    assert store.register_buffer(ptr, size) == 0
    got = store.get_tensor_into("into", ptr, size)
    assert torch.equal(got, original)
    got.fill_(42.0)  # writes the registered buffer itself
    assert store.upsert_tensor_from("into", ptr, size) == 0
    assert torch.equal(store.get_tensor("into"), torch.full((100,), 42.0))
    assert store.put_tensor_from("from-copy", ptr, size) == 0 and torch.equal(store.get_tensor("from-copy"), got)
    assert store.put_tensor_with_tp_from("from-tp", ptr, size, tp_size=4) == 0
    assert torch.equal(store.get_tensor_with_tp("from-tp", tp_rank=3, tp_size=4), torch.full((25,), 42.0))
    ctypes.memset(ptr, 0, 8)  # no longer a tensor object
    assert store.put_tensor_from("from-garbage", ptr, size) == INVALID
    assert store.get_tensor_into("missing-into", ptr, size) is None
    # A batch read answers per key: None for a failed read, INVALID_PARAMS for every key when
    # the lists do not pair up (a code, as the original, not a None to compare with 0).
    assert store.batch_get_tensor_into(["missing-into"], [ptr], [size]) == [None]
    assert store.batch_get_tensor_into(["into", "missing-into"], [ptr], [size]) == [INVALID, INVALID]
    assert store.unregister_buffer(ptr) == 0


def test_tensor_upserts_replace_and_pub_takes_a_config(store):
    config = ReplicateConfig()
    config.replica_num = 1
    assert store.pub_tensor("pub", torch.ones(4), config) == 0
    assert store.upsert_tensor("pub", torch.zeros(8)) == 0  # another size
    assert torch.equal(store.get_tensor("pub"), torch.zeros(8))  # read: now under a lease
    assert store.upsert_pub_tensor("pub", torch.full((8,), 3.0), config) == 0  # waits the lease out
    assert torch.equal(store.get_tensor("pub"), torch.full((8,), 3.0))
    assert store.batch_upsert_pub_tensor(["pub", "pub2"], [torch.ones(2), torch.ones(3)], config) == [0, 0]
    assert store.batch_upsert_tensor(["pub2"], [torch.zeros(3)]) == [0]
    assert store.batch_pub_tensor(["pub3"], [torch.ones(1)], config) == [0]
    assert store.pub_tensor_with_tp("pub-tp", torch.ones(4, 2), config, tp_size=2) == 0


def test_safetensors_files_round_trip(store, tmp_path):
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    assert store.put_tensor("st", tensor) == 0
    path = str(tmp_path / "st.safetensors")
    assert store.save_tensor_to_safetensor("st", path) == 0
    header = pathlib.Path(path).read_bytes()
    length = struct.unpack("<Q", header[:8])[0]
    assert b'"dtype":"BF16"' in header[:8 + length]
    loaded = store.load_tensor_from_safetensor("st-copy", path)
    assert torch.equal(loaded, tensor) and torch.equal(store.get_tensor("st-copy"), tensor)
    assert store.save_tensor_to_safetensor("missing-st", path) == NOT_FOUND
    assert store.load_tensor_from_safetensor("x", str(tmp_path / "absent")) is None
