"""ccl for PyTorch: a Horovod-style optimizer wrapper, a compressed Adam, DiLoCo, broadcasts.

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

from .adam import CompressedAdam
from .diloco import DiLoCo
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .ddp import ddp_comm_hook
from .optimizer import DEFAULT_FUSION_THRESHOLD_BYTES, DistributedOptimizer
from .runtime import (cross_rank, cross_size, init, is_initialized, local_rank, local_size,
                      rank, shutdown, size, threads_supported)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "threads_supported",
    "DistributedOptimizer", "DEFAULT_FUSION_THRESHOLD_BYTES", "CompressedAdam",
    "DiLoCo", "ddp_comm_hook",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object",
]
