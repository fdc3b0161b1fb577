"""``mooncake.store``: the names vLLM, SGLang and LMCache import from the original."""

from mooncake.store.buffers import BufferHandle, MooncakeHostMemAllocator, ReplicaDescriptor
from mooncake.store.replicate_config import ReplicateConfig, SoftPinAction
from mooncake.store.tensors import TensorApi


class MooncakeDistributedStore(TensorApi):
    """The original's store client: setup/close (lifecycle), bytes calls (bytes_api),
    registered-memory calls (zero_copy) and tensor calls (tensors), one mixin per file."""


__all__ = ["BufferHandle", "MooncakeDistributedStore", "MooncakeHostMemAllocator", "ReplicaDescriptor",
           "ReplicateConfig", "SoftPinAction"]
