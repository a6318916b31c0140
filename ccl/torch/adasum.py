"""Adasum (Maleki et al., *Scaling Distributed Training with Adaptive Summation*, MLSys 2021).

Adasum combines two gradients ``a`` and ``b`` as::

    (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

so orthogonal gradients add and parallel ones average. As in Horovod, a
vector whose squared norm is below ``1e-8`` gets the coefficient 1.

Over ``p`` ranks the combination runs as Horovod's vector-halving,
distance-doubling (VHDD) allreduce. At the level of distance ``d``
(1, 2, 4, ...) each rank pairs with rank ``r ^ d``: the pair splits the
slice both hold in two halves, each sends the half it gives up and keeps
the other, so the slice a rank owns halves at every level. The dot
product and the two squared norms of the level's two vectors are sums
over the ``2d`` ranks that hold pieces of them, added by a small
recursive-doubling allreduce of three float64 numbers inside that group;
every rank of the group then applies the same coefficients to its piece.
After ``log2 p`` levels each rank owns ``1/p`` of the result, and the
halves are gathered back in the reverse order. Each rank sends about
``2 (1 - 1/p)`` times the vector in all, instead of ``log2 p`` times.

Horovod raises for a number of ranks that is not a power of two. Here the
``e = size - p2`` ranks above the largest power of two ``p2`` first send
their vector to rank ``r - p2``, which combines the two with one pairwise
Adasum; the ``p2`` ranks then run VHDD and rank ``r - p2`` sends the
result back. Those ``2e`` ranks move one more vector each.

Dot products, norms and the combination are computed in float64.

>>> import numpy as np
>>> adasum_pair(np.array([1.0, 0.0]), np.array([0.0, 1.0])).tolist()  # orthogonal: sum
[1.0, 1.0]
>>> adasum_pair(np.array([2.0, 2.0]), np.array([2.0, 2.0])).tolist()  # parallel: average
[2.0, 2.0]
"""

import numpy as np

__all__ = ["adasum_pair", "adasum_allreduce", "NORM_FLOOR"]

#: Squared norms below this get the coefficient 1 (Horovod's threshold).
NORM_FLOOR = 1e-8

_TAG = 0x4ADA


def _coefficients(dot, norm_a, norm_b):
    ca = 1.0 - dot / (2.0 * norm_a) if norm_a >= NORM_FLOOR else 1.0
    cb = 1.0 - dot / (2.0 * norm_b) if norm_b >= NORM_FLOOR else 1.0
    return ca, cb


def adasum_pair(a, b):
    """Adasum's combination of two vectors (float64 arrays of one length).

    Parameters
    ----------
    a, b : numpy.ndarray
        The two vectors.

    Returns
    -------
    numpy.ndarray
        The combination; a vector with a squared norm below
        :data:`NORM_FLOOR` keeps the coefficient 1 (it is added).
    """
    ca, cb = _coefficients(float(np.dot(a, b)), float(np.dot(a, a)), float(np.dot(b, b)))
    return ca * a + cb * b


def _exchange(comm, send, recv, partner):
    comm.Sendrecv(send, dest=partner, sendtag=_TAG, recvbuf=recv, source=partner,
                  recvtag=_TAG)


def _group_sum(comm, values, rank, group):
    """Sum ``values`` over the aligned block of ``group`` ranks holding ``rank``.

    Recursive doubling: at each step both partners add the same two
    partial sums, so every rank of the block ends with the same bits.
    """
    distance = 1
    while distance < group:
        other = np.empty_like(values)
        _exchange(comm, values, other, rank ^ distance)
        values = values + other
        distance <<= 1
    return values


def _vhdd(comm, buf, rank, size):
    """VHDD Adasum of ``buf`` over ranks ``0 .. size - 1`` (a power of two), in place."""
    lo, hi = 0, buf.size
    slices = []
    distance = 1
    while distance < size:
        partner = rank ^ distance
        mid = lo + (hi - lo) // 2
        left = not rank & distance  # the left rank keeps the first half
        keep, give = ((lo, mid), (mid, hi)) if left else ((mid, hi), (lo, mid))
        received = np.empty(keep[1] - keep[0], dtype=np.float64)
        _exchange(comm, buf[give[0]:give[1]], received, partner)
        mine = buf[keep[0]:keep[1]]
        # a: the vector of the group's lower half of ranks, b: of its upper half
        a, b = (mine, received) if left else (received, mine)
        sums = np.array([np.dot(a, b), np.dot(a, a), np.dot(b, b)])
        dot, norm_a, norm_b = _group_sum(comm, sums, rank, 2 * distance)
        ca, cb = _coefficients(float(dot), float(norm_a), float(norm_b))
        mine[:] = ca * a + cb * b
        slices.append((distance, lo, hi))
        lo, hi = keep
        distance <<= 1
    for distance, outer_lo, outer_hi in reversed(slices):  # gather the halves back
        other = (outer_lo, lo) if lo > outer_lo else (hi, outer_hi)
        _exchange(comm, buf[lo:hi], buf[other[0]:other[1]], rank ^ distance)
        lo, hi = outer_lo, outer_hi
    return buf


def adasum_allreduce(comm, vector):
    """Adasum of every rank's ``vector`` over ``comm`` (collective; the same bits everywhere).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The communicator (any size), used by this thread only.
    vector : numpy.ndarray
        This rank's vector (1-D; the same length on every rank).

    Returns
    -------
    numpy.ndarray
        The combined vector (float64, a new array).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.array(vector, dtype=np.float64).reshape(-1)
    power = 1 << (size.bit_length() - 1)
    if rank >= power:  # folded into rank - power, which sends the result back
        comm.Send(buf, dest=rank - power, tag=_TAG)
        comm.Recv(buf, source=rank - power, tag=_TAG)
        return buf
    folded = rank + power < size
    if folded:
        extra = np.empty_like(buf)
        comm.Recv(extra, source=rank + power, tag=_TAG)
        buf = adasum_pair(buf, extra)
    _vhdd(comm, buf, rank, power)
    if folded:
        comm.Send(buf, dest=rank + power, tag=_TAG)
    # every slice was computed by one rank and gathered: the same bits everywhere
    return buf
