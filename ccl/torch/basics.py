"""What Horovod's ``hvd.*_built()`` and ``hvd.*_enabled()`` ask, answered truthfully for ccl.

ccl runs on MPI (mpi4py) only: no Gloo, no NCCL, no DDL, no oneCCL, no
ROCm. CUDA tensors are reduced through cupy when it is installed (see the
GPU guide), so :func:`cuda_built` says whether cupy imports.

>>> import ccl.torch as hvd
>>> hvd.mpi_built(), hvd.gloo_built(), hvd.nccl_built()
(True, False, False)
"""

import importlib.util

from .runtime import is_initialized, threads_supported

__all__ = ["mpi_threads_supported", "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled",
           "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "is_homogeneous"]


def mpi_threads_supported():
    """Whether MPI provides ``MPI_THREAD_MULTIPLE`` (collectives then overlap the caller)."""
    return threads_supported()


def mpi_built():
    """True: ccl always runs on MPI."""
    return True


def mpi_enabled():
    """True once :func:`ccl.torch.init` ran (MPI is then the controller)."""
    return is_initialized()


def gloo_built():
    """False: ccl has no Gloo controller."""
    return False


def gloo_enabled():
    """False: ccl has no Gloo controller."""
    return False


def nccl_built():
    """False: GPU tensors go through cupy and MPI, not NCCL."""
    return False


def ddl_built():
    """False: no IBM DDL."""
    return False


def ccl_built():
    """False: Horovod's ``ccl_built`` means Intel oneCCL, which this library does not use."""
    return False


def cuda_built():
    """Whether CUDA tensors can be reduced on the GPU (cupy is importable)."""
    return importlib.util.find_spec("cupy") is not None


def rocm_built():
    """False: no ROCm path."""
    return False


def is_homogeneous():
    """Whether every node runs the same number of ranks (collective)."""
    from .runtime import current

    runtime = current()
    sizes = runtime.comm.allgather(runtime.local_size)
    return len(set(sizes)) == 1
