"""``algorithm="auto"``: pick the algorithm, and whether to compress at all.

Compression pays only when the network, not the CPU, sets the time. ``auto``
compares two estimates with a deliberately simple cost model (see
:func:`estimate`):

- ``MPI_Allreduce``: a ring moves ``2 (p-1)/p · n`` bytes per rank, so it
  takes about ``2 (p-1)/p · n / B`` on links of ``B`` bytes per second;
- a compressing algorithm: the compressed bytes on the same links plus the
  codec's encode and decode time (the codec's own single-core throughput,
  ``Codec.encode_gbps``/``decode_gbps``, scaled by
  :data:`SPEED_IN_COLLECTIVE`), overlapped when the algorithm is pipelined.

It compresses only when the estimate wins by :data:`MARGIN`. ``B`` is the
link speed in Gbit/s, given by ``CCL_LINK_GBPS``, ``Communicator(link_gbps=)``
or measured once by :func:`probe_link_gbps` (``link_gbps="probe"``). Without
it (shared memory, or nobody said) ``auto`` does not compress: the MPI
library's own ``Allreduce`` is then never slower than itself.

The decision uses only what every rank agrees on (size, dtype, rank count,
codec, link speed; the speed is part of the argument check), so every rank
picks the same algorithm.
"""

import math
import time

import numpy as np

__all__ = ["choose", "fitting", "estimate", "needs_link", "probe_link_gbps",
           "SPEED_IN_COLLECTIVE", "MIN_COMPRESS_BYTES", "TREE_MAX_BYTES", "MARGIN"]

#: Below this many bytes per rank, latency dominates: send uncompressed with MPI.
MIN_COMPRESS_BYTES = 65536
#: Homomorphic codecs use the tree (log p rounds) below this size, the ring above.
TREE_MAX_BYTES = 1 << 20
#: Compress only when the model says it is this many times faster than MPI_Allreduce.
MARGIN = 1.25
#: A codec's single-core speeds (``Codec.encode_gbps``/``decode_gbps``) are scaled by
#: this inside a collective: the codec shares caches, memory bandwidth and often cores
#: with the other ranks and the MPI library.
SPEED_IN_COLLECTIVE = 0.5
#: Fixed cost of one compressed call (argument check, Python, a few messages), seconds.
CALL_OVERHEAD_S = 2e-3
#: Codec time relative to the estimate above when every rank does not have a core to
#: itself; the model assumes the worst case it is benchmarked on (2 ranks per core).
CPU_SHARE = 2.0


def probe_link_gbps(comm, nbytes=1 << 22, reps=3):
    """Measure the effective link speed once, identically on every rank (collective).

    Times ``MPI_Allreduce`` of ``nbytes`` (best of ``reps`` after a warm-up),
    takes the slowest rank's time and converts it with the ring bound
    ``2 (p-1)/p · nbytes``. What it measures is what ``auto`` competes
    with: the MPI library's own allreduce on these links and CPUs.

    Returns
    -------
    float
        Gbit/s (``math.inf`` on one rank: there is no network).
    """
    from mpi4py import MPI

    p = comm.Get_size()
    if p == 1:
        return math.inf
    x = np.ones(max(nbytes // 4, 1), dtype=np.float32)
    out = np.empty_like(x)
    comm.Allreduce(x, out)  # connections and buffers are set up on first use
    best = math.inf
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(x, out)
        best = min(best, time.perf_counter() - t0)
    slowest = comm.allreduce(best, op=MPI.MAX)  # one value on every rank
    return 2 * (p - 1) / p * x.nbytes * 8 / max(slowest, 1e-9) / 1e9


def estimate(codec, nbytes, size, link_gbps, itemsize=4, algorithm=None, pipelined=True):
    """Estimated seconds of ``MPI_Allreduce`` and of a compressed allreduce.

    Parameters
    ----------
    codec : ccl.codecs.Codec
    nbytes : int
        Input bytes per rank.
    size : int
        Ranks.
    link_gbps : float
        Link speed in Gbit/s.
    itemsize : int
        Bytes per input element.
    algorithm : str, optional
        The compressing algorithm (default: :func:`fitting`).
    pipelined : bool
        Whether codec time overlaps the transfers (segmented ring and direct).

    Returns
    -------
    tuple of float
        ``(t_mpi, t_compressed)``.
    """
    p = size
    rate = link_gbps * 1e9 / 8  # bytes per second
    t_mpi = 2 * (p - 1) / p * nbytes / rate
    algorithm = algorithm or fitting(codec)
    elements = nbytes / itemsize
    payload = elements * codec.bits_per_value / 8
    encode_gbs = codec.encode_gbps * SPEED_IN_COLLECTIVE
    decode_gbs = codec.decode_gbps * SPEED_IN_COLLECTIVE
    if algorithm == "allgather":
        wire, encodes, decodes = (p - 1) * payload, 1.0, float(p)
    else:  # ring and direct: each encodes every element once, decodes (2p-1)/p of them
        wire, encodes, decodes = 2 * (p - 1) / p * payload, 1.0, (2 * p - 1) / p
    # the speeds are per byte of float32 input, i.e. per 4 bytes of elements
    codec_s = CPU_SHARE * elements * 4 * (encodes / (encode_gbs * 1e9)
                                          + decodes / (decode_gbs * 1e9))
    wire_s = wire / rate
    overlap = pipelined and algorithm in ("ring", "direct")
    busy = max(wire_s, codec_s) + 0.25 * min(wire_s, codec_s) if overlap else wire_s + codec_s
    return t_mpi, busy + CALL_OVERHEAD_S


def needs_link(codec, nbytes, size, dtype, collective="allreduce"):
    """Whether :func:`choose` needs the link speed to decide (it weighs compression).

    It does not for a reduce-scatter (always compressed), an identity codec,
    one rank, a message under :data:`MIN_COMPRESS_BYTES`, or a dtype the MPI
    library cannot reduce.
    """
    dtype = np.dtype(dtype)
    return (collective == "allreduce" and not codec.identity and size > 1
            and nbytes >= MIN_COMPRESS_BYTES
            and dtype in (np.dtype(np.float32), np.dtype(np.float64)))


def choose(codec, nbytes, size, dtype, collective="allreduce", link_gbps=None,
           pipelined=True):
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
    link_gbps : float or None
        Link speed in Gbit/s (agreed by every rank); None: unknown, so an
        allreduce of float32/float64 is not compressed.
    pipelined : bool
        Whether ring and direct run pipelined (segments), for the estimate.

    Returns
    -------
    str
        ``"mpi"`` (the MPI library's own uncompressed ``Allreduce``), ``"ring"``,
        ``"tree"``, ``"direct"`` or ``"allgather"``.
    """
    if collective == "reduce_scatter":
        return "ring" if codec.homomorphic else "direct"
    dtype = np.dtype(dtype)
    mpi_ok = dtype in (np.dtype(np.float32), np.dtype(np.float64))
    # one rank has no network to save; small messages are latency-bound
    if mpi_ok and (codec.identity or nbytes < MIN_COMPRESS_BYTES or size == 1):
        return "mpi"
    if mpi_ok:
        if link_gbps is None or link_gbps == "probe" or math.isinf(link_gbps):
            return "mpi"  # no network known to be slower than the codecs
        t_mpi, t_codec = estimate(codec, nbytes, size, link_gbps, dtype.itemsize,
                                  pipelined=pipelined)
        if t_codec * MARGIN > t_mpi:
            return "mpi"
    if codec.homomorphic and nbytes < TREE_MAX_BYTES:
        return "tree"
    return fitting(codec)


def fitting(codec):
    """The algorithm that fits ``codec`` for large messages (docs/algorithms.md).

    Sparse codecs gather their small payloads; homomorphic ones add on the
    ring with no relay loss; the others go through owners (two lossy points).
    """
    if codec.sparse:
        return "allgather"
    return "ring" if codec.homomorphic else "direct"
