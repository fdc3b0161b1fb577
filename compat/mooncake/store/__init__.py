"""``mooncake.store``: the names vLLM, SGLang and LMCache import from the original."""

from mooncake.store.buffers import BufferHandle, MooncakeHostMemAllocator, ReplicaDescriptor
from mooncake.store.parallel_tensors import ParallelAxis, ParallelTensorApi, ReadTarget, TensorParallelism
from mooncake.store.replicate_config import ReplicateConfig, SoftPinAction
from mooncake.store.segments import SegmentApi
from mooncake.store.sessions import SessionApi
from mooncake.store.tasks import QueryTaskResponse, TaskApi, TaskStatus, TaskType


class MooncakeDistributedStore(ParallelTensorApi, SessionApi, TaskApi, SegmentApi):
    """The original's store client: setup/close (lifecycle), bytes calls (bytes_api),
    registered-memory calls (zero_copy), tensor calls (tensors), the unified parallel tensor
    calls (parallel_tensors), put and get sessions (sessions), replica copy and move tasks
    (tasks) and the segment mounts it refuses (segments), one mixin per file."""


__all__ = ["BufferHandle", "MooncakeDistributedStore", "MooncakeHostMemAllocator", "ParallelAxis",
           "QueryTaskResponse", "ReadTarget", "ReplicaDescriptor", "ReplicateConfig", "SoftPinAction",
           "TaskStatus", "TaskType", "TensorParallelism"]
