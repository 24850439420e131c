"""mooncake.store — kvengine.mooncake under Mooncake's module name."""
from kvengine.mooncake import (BufferHandle, BufferLease, BufferLeaseView,  # noqa: F401
                               BufferPool, Descriptor, ErrorCode, MemoryDescriptor,
                               MooncakeDistributedStore, ParallelAxis, QueryTaskResponse,
                               ReadTarget, TaskStatus, TaskType,
                               RegisteredBufferLease, TensorParallelism,
                               RegisteredBufferLeaseView, RegisteredBufferPool,
                               ReplicaDescriptor, ReplicaStatus, ReplicateConfig,
                               SoftPinAction, bind_to_numa_node, _deserialize_tensor,
                               _serialize_tensor, _tensor_metadata_size)

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "BufferHandle",
           "ErrorCode", "BufferPool", "RegisteredBufferPool", "BufferLease", "BufferLeaseView",
           "RegisteredBufferLease", "RegisteredBufferLeaseView", "ReplicaDescriptor",
           "ReplicaStatus", "ParallelAxis", "TensorParallelism", "ReadTarget", "MemoryDescriptor", "Descriptor", "bind_to_numa_node",
           "QueryTaskResponse", "TaskStatus", "TaskType"]
