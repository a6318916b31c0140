"""ccl for PyTorch: Horovod's ``horovod.torch`` API, a compressed Adam, DiLoCo, every ccl codec.

``import ccl.torch as hvd`` runs Horovod programs: ``hvd.init()``,
``hvd.DistributedOptimizer(..., compression=hvd.Compression.fp16)``,
``hvd.allreduce``, ``hvd.allgather``, ``hvd.broadcast``, process sets, ...
(see the "Coming from Horovod" page), and any ccl codec compresses as
``compression=hvd.Compression.codec("3lc", s=1.5)``.

>>> import torch, ccl.torch as ct                       # doctest: +SKIP
>>> ct.init()                                           # doctest: +SKIP
>>> opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
...                               named_parameters=model.named_parameters(),
...                               codec="fp16")         # doctest: +SKIP
>>> ct.broadcast_parameters(model.state_dict(), root_rank=0)  # doctest: +SKIP

This subpackage imports the real ``torch`` with absolute imports (its own
name only lives inside ``ccl``); ``import ccl`` never imports torch.
"""

try:
    import torch as _torch  # noqa: F401  (fail early, with advice)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("ccl.torch needs PyTorch >= 2.1: pip install torch (on CPU-only "
                      "machines pin a CPU build, e.g. pip install torch==2.13.0)") from exc

from . import elastic
from .elastic import HostsUpdatedInterrupt
from .adam import CompressedAdam
from .diloco import DiLoCo
from .autograd import (allreduce, allreduce_, grouped_allreduce, grouped_allreduce_,
                       grouped_reducescatter, reducescatter)
from .autograd_movement import allgather, alltoall, broadcast, broadcast_, grouped_allgather
from .basics import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled,
                     is_homogeneous, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                     rocm_built)
from .collectives import (allreduce_async, allreduce_async_, grouped_allreduce_async,
                          grouped_allreduce_async_, grouped_reducescatter_async,
                          reducescatter_async)
from .compression import Compression
from .checkpoint import ResidualsNotLoadedWarning
from .ddp import DDPHookState, ccl_comm_hook, ddp_comm_hook
from .fsdp import fsdp_compress
from .handles import poll, stop_timeline, synchronize
from .horovod_functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                broadcast_parameters)
from .horovod_optimizer import DistributedOptimizer
from .movement import (allgather_async, alltoall_async, barrier, broadcast_async,
                       broadcast_async_, grouped_allgather_async, join, sparse_allreduce_async)
from .optimizer import DEFAULT_FUSION_THRESHOLD_BYTES
from .powersgd import PowerSGD
from .process_sets import (ProcessSet, add_process_set, global_process_set, init,
                           remove_process_set)
from .sync_batch_norm import SyncBatchNorm
from .timeline import start_timeline
from .runtime import (cross_rank, cross_size, is_initialized, local_rank, local_size, rank,
                      shutdown, size, threads_supported)
from .tensor_ops import Adasum, Average, HorovodInternalError, Max, Min, Product, Sum

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "threads_supported",
    "DistributedOptimizer", "DEFAULT_FUSION_THRESHOLD_BYTES", "CompressedAdam",
    "DiLoCo", "ddp_comm_hook", "DDPHookState", "ccl_comm_hook", "fsdp_compress", "PowerSGD",
    "ResidualsNotLoadedWarning",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object",
    # Horovod's API
    "mpi_threads_supported", "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "is_homogeneous",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression",
    "HorovodInternalError", "HostsUpdatedInterrupt",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async",
    "synchronize", "poll", "join", "barrier", "sparse_allreduce_async",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "elastic",
    "SyncBatchNorm", "start_timeline", "stop_timeline",
]
