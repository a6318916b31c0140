"""Benchmarks: ``mpiexec -n 4 python -m mpi4py -m ccl.bench`` (see ``--help``).

Speed is measured here, side by side with the MPI library's own
``MPI_Allreduce`` in the same run, never in timed tests.
"""

import contextlib


@contextlib.contextmanager
def numba_threads(count):
    """Run the body with at most ``count`` numba threads, then restore the old count.

    ``NUMBA_NUM_THREADS`` cannot be used here: importing ccl loads numba first,
    and numba refuses a changed value once its pool runs. ``set_num_threads``
    can lower the count at run time. Yields the count in effect.
    """
    import numba

    from ccl import threads

    with threads.budgeted(count):
        yield numba.get_num_threads()


def set_torch_threads(comm):
    """Give torch's intra-op pool one share of this machine's cores per rank on it.

    The share is ccl's thread budget rule (:mod:`ccl.threads`): the rank's
    cores (its affinity) over the ranks on its machine, counted by boot id,
    so the emulated cluster's namespaces count as the one machine they
    share.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The benchmark's ranks; every one must call (collective).

    Returns
    -------
    int
        The thread count torch now uses.
    """
    import torch

    from ccl import threads

    ranks = threads.ranks_on_machine(comm)
    torch.set_num_threads(max(1, threads.available_cores() // ranks))
    return torch.get_num_threads()
