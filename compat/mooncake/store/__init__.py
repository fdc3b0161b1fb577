"""``mooncake.store``: the names vLLM, SGLang and LMCache import from the original."""

from mooncake.store.buffers import BufferHandle, MooncakeHostMemAllocator, ReplicaDescriptor
from mooncake.store.replicate_config import ReplicateConfig, SoftPinAction
from mooncake.store.zero_copy import ZeroCopyApi


class MooncakeDistributedStore(ZeroCopyApi):
    """The original's store client: setup/close (lifecycle), bytes calls (bytes_api) and
    registered-memory calls (zero_copy), one mixin per file."""


__all__ = ["BufferHandle", "MooncakeDistributedStore", "MooncakeHostMemAllocator", "ReplicaDescriptor",
           "ReplicateConfig", "SoftPinAction"]
