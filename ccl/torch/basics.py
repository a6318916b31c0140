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
    """Whether MPI provides ``MPI_THREAD_MULTIPLE`` (collectives then overlap the caller).

    Returns
    -------
    bool
        As :func:`~ccl.torch.threads_supported`.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> from mpi4py import MPI
    >>> hvd.mpi_threads_supported() == (MPI.Query_thread() >= MPI.THREAD_MULTIPLE)
    True
    """
    return threads_supported()


def mpi_built():
    """Whether ccl runs on MPI: always.

    Returns
    -------
    bool
        True.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.mpi_built()
    True
    """
    return True


def mpi_enabled():
    """Whether MPI is the controller: once :func:`~ccl.torch.init` ran.

    Returns
    -------
    bool
        :func:`~ccl.torch.is_initialized`.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.mpi_enabled()
    True
    """
    return is_initialized()


def gloo_built():
    """Whether Gloo is built in: never in ccl.

    Returns
    -------
    bool
        False.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.gloo_built()
    False
    """
    return False


def gloo_enabled():
    """Whether Gloo is the controller: never in ccl.

    Returns
    -------
    bool
        False.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.gloo_enabled()
    False
    """
    return False


def nccl_built():
    """Whether NCCL is used: no, GPU tensors go through cupy and MPI.

    Returns
    -------
    bool
        False.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.nccl_built()
    False
    """
    return False


def ddl_built():
    """Whether IBM DDL is built in: no.

    Returns
    -------
    bool
        False.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.ddl_built()
    False
    """
    return False


def ccl_built():
    """Whether Intel oneCCL (Horovod's ``ccl``) is used: no.

    Returns
    -------
    bool
        False.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.ccl_built()
    False
    """
    return False


def cuda_built():
    """Whether CUDA tensors are reduced on the GPU: when cupy is importable.

    Returns
    -------
    bool
        True if ``cupy`` can be imported.

    Examples
    --------
    >>> import importlib.util, ccl.torch as hvd
    >>> hvd.cuda_built() == (importlib.util.find_spec("cupy") is not None)
    True
    """
    return importlib.util.find_spec("cupy") is not None


def rocm_built():
    """Whether a ROCm path is built in: no.

    Returns
    -------
    bool
        False.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.rocm_built()
    False
    """
    return False


def is_homogeneous():
    """Whether every node runs the same number of ranks (collective).

    Returns
    -------
    bool
        True if every rank's ``local_size()`` is the same.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> isinstance(hvd.is_homogeneous(), bool)
    True
    """
    from .runtime import current

    runtime = current()
    sizes = runtime.comm.allgather(runtime.local_size)
    return len(set(sizes)) == 1
