"""Adasum (Maleki et al., *Scaling Distributed Training with Adaptive Summation*, MLSys 2021).

Adasum combines two gradients ``a`` and ``b`` as::

    (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

so orthogonal gradients add and parallel ones average. Over ``p`` ranks
(a power of two, as in Horovod) the combination is applied along a binary
tree: at level ``k`` each rank exchanges its current vector with the rank
``2^k`` away (distance doubling) and both compute the combination in the
same order (lower rank first), so after ``log2 p`` levels every rank holds
the same bits. Dot products and norms are computed in float64. Each
exchange sends the whole vector: Horovod's vector halving, which splits
the bandwidth among the pair, is not used.

>>> import numpy as np
>>> adasum_pair(np.array([1.0, 0.0]), np.array([0.0, 1.0])).tolist()  # orthogonal: sum
[1.0, 1.0]
>>> adasum_pair(np.array([2.0, 2.0]), np.array([2.0, 2.0])).tolist()  # parallel: average
[2.0, 2.0]
"""

import numpy as np

__all__ = ["adasum_pair", "adasum_allreduce", "check_size"]


def adasum_pair(a, b):
    """Adasum's combination of two vectors (float64 arrays of one length).

    Parameters
    ----------
    a, b : numpy.ndarray
        The two vectors.

    Returns
    -------
    numpy.ndarray
        The combination; a zero vector's coefficient is 1 (it adds nothing).
    """
    dot = float(np.dot(a, b))
    na, nb = float(np.dot(a, a)), float(np.dot(b, b))
    ca = 1.0 - dot / (2.0 * na) if na > 0 else 1.0
    cb = 1.0 - dot / (2.0 * nb) if nb > 0 else 1.0
    return ca * a + cb * b


def check_size(size):
    """Raise ValueError unless ``size`` is a power of two (Adasum's tree needs one)."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"op=hvd.Adasum needs a power-of-two number of ranks, got {size}")


def adasum_allreduce(comm, vector):
    """Adasum of every rank's ``vector`` over ``comm`` (collective; the same bits everywhere).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        A communicator of a power-of-two size, used by this thread only.
    vector : numpy.ndarray
        This rank's float64 vector (1-D; the same length on every rank).

    Returns
    -------
    numpy.ndarray
        The combined vector.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    current = np.ascontiguousarray(vector, dtype=np.float64)
    distance = 1
    while distance < size:
        partner = rank ^ distance
        received = np.empty_like(current)
        comm.Sendrecv(current, dest=partner, recvbuf=received, source=partner)
        low, high = (current, received) if rank < partner else (received, current)
        current = adasum_pair(low, high)
        distance <<= 1
    return current
