"""``mooncake.store``: the names vLLM, SGLang and LMCache import from the original."""

from mooncake.store.buffers import BufferHandle, MooncakeHostMemAllocator, ReplicaDescriptor
from mooncake.store.parallel_tensors import ParallelAxis, ParallelTensorApi, ReadTarget, TensorParallelism
from mooncake.store.replicate_config import ReplicateConfig, SoftPinAction


class MooncakeDistributedStore(ParallelTensorApi):
    """The original's store client: setup/close (lifecycle), bytes calls (bytes_api),
    registered-memory calls (zero_copy), tensor calls (tensors) and the unified parallel tensor
    calls (parallel_tensors), one mixin per file."""


__all__ = ["BufferHandle", "MooncakeDistributedStore", "MooncakeHostMemAllocator", "ParallelAxis", "ReadTarget",
           "ReplicaDescriptor", "ReplicateConfig", "SoftPinAction", "TensorParallelism"]
