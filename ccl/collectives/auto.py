"""``algorithm="auto"``: pick the algorithm, and whether to compress at all.

The rule uses only what every rank agrees on (size, dtype, rank count,
codec), so every rank picks the same algorithm. It is deliberately simple;
the benchmarks (``python -m ccl.bench``) are where it is tuned.
"""

import numpy as np

__all__ = ["choose", "fitting", "MIN_COMPRESS_BYTES", "TREE_MAX_BYTES"]

#: Below this many bytes per rank, latency dominates: send uncompressed with MPI.
MIN_COMPRESS_BYTES = 65536
#: Homomorphic codecs use the tree (log p rounds) below this size, the ring above.
TREE_MAX_BYTES = 1 << 20


def choose(codec, nbytes, size, dtype, collective="allreduce"):
    """Return the algorithm name ``auto`` resolves to.

    Parameters
    ----------
    codec : ccl.codecs.Codec
    nbytes : int
        Bytes of the input on each rank.
    size : int
        Ranks in the communicator.
    dtype : numpy.dtype
        Input dtype.
    collective : {"allreduce", "reduce_scatter"}

    Returns
    -------
    str
        ``"mpi"`` (the MPI library's own uncompressed ``Allreduce``), ``"ring"``,
        ``"tree"``, ``"direct"`` or ``"allgather"``.
    """
    if collective == "reduce_scatter":
        return "ring" if codec.homomorphic else "direct"
    mpi_ok = np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64))
    # one rank has no network to save; small messages are latency-bound
    if mpi_ok and (codec.codec_id == "none" or nbytes < MIN_COMPRESS_BYTES or size == 1):
        return "mpi"
    if codec.homomorphic and nbytes < TREE_MAX_BYTES:
        return "tree"
    return fitting(codec)


def fitting(codec):
    """The algorithm that fits ``codec`` for large messages (codec-specs.md §11).

    Sparse codecs gather their small payloads; homomorphic ones add on the
    ring with no relay loss; the others go through owners (two lossy points).
    """
    if codec.sparse:
        return "allgather"
    return "ring" if codec.homomorphic else "direct"
