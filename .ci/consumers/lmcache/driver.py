"""LMCache's mooncakestore remote backend across two processes, on our store through compat.

    python driver.py put --master 127.0.0.1:50051 --metadata http://127.0.0.1:8080/metadata \
        --save-chunk-meta true --run-id X
    python driver.py get ...same flags...

``put`` stores CHUNKS KV chunks through LMCache's own RemoteBackend (remote_url
mooncakestore://..., the mooncake keys in extra_config, as LMCache's MooncakestoreConnector reads
them), waits for every put and exits. ``get``, a second process, reads them back through a new
RemoteBackend and checks every byte against the same seeded pattern; it exits 1 on a miss or a
mismatch. The pool is a mooncake_client store service, so the bytes outlive process 1 (both
LMCache processes set up with global_segment_size 0). With save_chunk_meta true LMCache writes
put_parts (header + bytes) and reads batch_get_buffer; false, batch_put_from / batch_get_into on
its registered CPU buffer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

CHUNKS = 8
CHUNK_SIZE = 256
KV_SHAPE = (4, 2, CHUNK_SIZE, 8, 64)  # layers, k/v, tokens, kv heads, head size
DTYPE = torch.float16


def backend(args: argparse.Namespace) -> tuple[RemoteBackend, LocalCPUBackend, LMCacheMetadata]:
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK_SIZE, local_cpu=False, max_local_cpu_size=0.25,
        remote_url=f"mooncakestore://{args.master}/", remote_serde="naive",
        extra_config={
            "local_hostname": "127.0.0.1", "metadata_server": args.metadata, "protocol": "tcp",
            "device_name": "", "master_server_address": args.master,
            "global_segment_size": 0, "local_buffer_size": 64 * 2**20,
            "save_chunk_meta": args.save_chunk_meta, "transfer_timeout": 10,
        })
    metadata = LMCacheMetadata(model_name="ci-model", world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=DTYPE, kv_shape=KV_SHAPE, chunk_size=CHUNK_SIZE)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    local = LocalCPUBackend(config, metadata, dst_device="cpu")
    return RemoteBackend(config, metadata, loop, local, dst_device="cpu"), local, metadata


def keys(run_id: str) -> list[CacheEngineKey]:
    model = f"ci-model-{run_id}"
    return [CacheEngineKey(model, 1, 0, 1000 + i, DTYPE) for i in range(CHUNKS)]


def pattern(i: int, shape: torch.Size) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7919 * (i + 1))
    return torch.randint(-2**15, 2**15, shape, generator=generator, dtype=torch.int32).to(torch.int16).view(DTYPE)


def put(args: argparse.Namespace) -> int:
    remote, local, metadata = backend(args)
    objs = []
    for i in range(CHUNKS):
        obj = local.allocate(metadata.get_shapes(), metadata.get_dtypes(), MemoryFormat.KV_2LTD)
        assert obj is not None and obj.tensor is not None, "LMCache could not allocate a chunk"
        obj.tensor.copy_(pattern(i, obj.tensor.shape))
        objs.append(obj)
    done = threading.Semaphore(0)
    remote.batched_submit_put_task(keys(args.run_id), objs, on_complete_callback=lambda _key: done.release())
    for _ in range(CHUNKS):  # LMCache calls back once per key when its write has completed
        if not done.acquire(timeout=60):
            break
    stored = sum(remote.contains(key) for key in keys(args.run_id))
    print(f"put: {stored}/{CHUNKS} chunks stored, {remote.put_failed_count} failed puts "
          f"(save_chunk_meta={args.save_chunk_meta})")
    remote.close()
    return 0 if stored == CHUNKS and remote.put_failed_count == 0 else 1


def get(args: argparse.Namespace) -> int:
    remote, _, _ = backend(args)
    got = remote.batched_get_blocking(keys(args.run_id))
    bad = 0
    for i, obj in enumerate(got):
        if obj is None or obj.tensor is None:
            print(f"get: chunk {i} missing")
            bad += 1
        elif not torch.equal(obj.tensor.view(torch.int16), pattern(i, obj.tensor.shape).view(torch.int16)):
            print(f"get: chunk {i} bytes differ")
            bad += 1
    print(f"get: {CHUNKS - bad}/{CHUNKS} chunks match byte for byte (save_chunk_meta={args.save_chunk_meta})")
    remote.close()
    return 0 if bad == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["put", "get"])
    parser.add_argument("--master", required=True)
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--save-chunk-meta", type=lambda v: v == "true", required=True)
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args()
    return put(args) if args.phase == "put" else get(args)


if __name__ == "__main__":
    sys.exit(main())
