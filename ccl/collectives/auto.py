"""``algorithm="auto"``: pick the algorithm, and whether to compress at all.

Compression pays only when the network, not the CPU, sets the time. ``auto``
compares two estimates of the cost model :mod:`ccl.collectives.model`
(:func:`estimate`), per byte of input:

- ``MPI_Allreduce`` moves ``2 (p-1)/p · n`` bytes per rank, at the rate
  the MPI library's own allreduce reaches on this communicator: the *link
  speed*;
- a compressing algorithm moves the compressed bytes at the same rate and
  spends the codec's encode and decode time, overlapped with the transfers
  when the algorithm is pipelined. The codec states what it sends and how
  fast it runs (``Codec.bits_per_value``, ``encode_gbps``,
  ``decode_gbps``, one core's figures); inside a collective ``auto``
  measures instead how fast the codec runs with every rank encoding at once
  (``ccl.collectives.link.codec_speeds``), which counts the cores the ranks
  share and the cores other work is using.

Up to :data:`FITTING_MAX_RANKS` ranks the compressing algorithm is the one
:func:`fitting` the codec; past them, the model's fastest flat algorithm
whose modelled error stays within the codec's bound
(:func:`ccl.collectives.model.best`, twice its one-shot error): the error of
a ring that re-encodes at every hop grows with the ranks.
It compresses when the estimate wins by :data:`MARGIN`, or by the spread of
the link probe's rounds where that is larger (:func:`decide`): the more
timings vary, the clearer the win must be. The bandwidth terms
are proportional to the size; one term is not: each sequential step of
messages of the compressing algorithm costs the point-to-point latency
measured once per communicator (:func:`probe_latency`), so messages too
small to earn it back go uncompressed. A partitioned tensor is decided
once, as a whole, and its pieces all run that decision.

Where the link speed comes from (:mod:`ccl.collectives.link`), in order:
``link_gbps=`` (``Communicator``), else ``CCL_LINK_GBPS``; else, when every
rank of the communicator is on one node, nothing is timed: shared memory
counts as faster than any codec, so float32 and float64 go to the MPI
library's own exact allreduce, the same way in every run; else (ranks on
several nodes) the file named by ``CCL_LINK_PROFILE``, else it is
**measured** once per communicator (:func:`probe_link_gbps`, collective,
under a second). Every input of the decision is agreed by every rank (the
measured figures are one value for all), so every rank picks the same
algorithm; :func:`decide` also says why (:data:`REASONS`).
"""

import math
import time
from collections import namedtuple

import numpy as np

from . import model
from .figures import codec_figures

__all__ = ["choose", "decide", "Decision", "fitting", "estimate", "needs_link",
           "probe_link", "probe_link_gbps", "probe_latency", "rounds", "REASONS",
           "MIN_COMPRESS_BYTES", "TREE_MAX_BYTES", "MARGIN", "FITTING_MAX_RANKS"]

#: Below this many bytes per rank, latency dominates: send uncompressed with MPI.
MIN_COMPRESS_BYTES = 65536
#: Homomorphic codecs use the tree (log p rounds) below this size, the ring above.
TREE_MAX_BYTES = 1 << 20
#: Up to this many ranks ``auto`` runs the algorithm :func:`fitting` the codec (measured
#: there, docs/benchmarks.md); past it, the model's fastest flat algorithm whose modelled error
#: stays within the codec's bound (:func:`ccl.collectives.model.best`).
FITTING_MAX_RANKS = 4
#: Compress only when the model says it is this many times faster than MPI_Allreduce.
MARGIN = 1.1
#: The probe grows its message from this size (large enough that bandwidth, not the
#: scheduling of ranks on a loaded machine, sets its time) ...
PROBE_MIN_BYTES = 1 << 22
#: ... by this factor ...
PROBE_GROWTH = 4
#: ... until one allreduce takes this long (seconds), or it reaches this size.
PROBE_TARGET_S = 0.03
PROBE_MAX_BYTES = 1 << 24
#: Timed rounds at the size the probe settled on; the fastest round counts.
PROBE_ROUNDS = 5


def _complete(request, wait, what):
    """Wait for ``request``: with ``wait(request, what)`` (a deadline) or MPI's own wait."""
    if wait is None:
        request.Wait()
    else:
        wait(request, what)


def _slowest_per_round(comm, seconds, wait=None, what="a probe"):
    """The slowest rank's time of every round (one ``MAX`` allreduce): agreed by every rank."""
    from mpi4py import MPI

    slowest = np.empty(len(seconds))
    _complete(comm.Iallreduce(np.asarray(seconds, dtype=np.float64), slowest, op=MPI.MAX),
              wait, what)
    return slowest


def probe_link(comm, rounds=None, wait=None):
    """Measure the link speed that ``MPI_Allreduce`` reaches, and its spread, on every rank alike.

    First the size: float32 messages grow from ``PROBE_MIN_BYTES`` (4 MB:
    a smaller message measures how long ranks wait for a core on a loaded
    machine, not the link) by ``PROBE_GROWTH`` until one allreduce takes
    ``PROBE_TARGET_S`` (or reaches ``PROBE_MAX_BYTES``). Then ``rounds`` (default
    ``PROBE_ROUNDS``) allreduces of that size, each after a barrier; a
    round lasts as long as its slowest rank, and the *fastest* round counts:
    other work on the machine, or a rank not yet scheduled, only ever adds
    time, so the minimum is the statistic that repeats from run to run. The
    time converts to Gbit/s with the bytes the busiest link carries
    (:func:`~ccl.collectives.model.mpi_sent_bytes`: the ring bound ``2
    (p-1)/p · n``, or MPICH's algorithm where ``p`` is not a power of two),
    so that it is the links' speed, which ccl's algorithms run at too, while
    ``MPI_Allreduce`` is predicted as fast as it ran. On a 1 Gbit/s network
    it settles on 4 MB, in about half a second; at 100 Mbit/s it takes a
    few seconds.
    Collective: every rank must call it.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The communicator (ccl passes its private duplicate).
    rounds : int, optional
        Timed rounds at the final size.
    wait : callable, optional
        ``wait(request, what)`` completes each (nonblocking) MPI call; ccl
        passes its channel's, which honours the call's timeout. Default:
        MPI's own wait.

    Returns
    -------
    (float, float)
        Gbit/s (``math.inf`` on one rank: there is no network), and the
        spread: the slowest round's time over the fastest's (1.0 on one
        rank). A machine whose timings vary (other work on it) has a large
        spread; :func:`decide` then asks compression to win by as much.
    """
    p = comm.Get_size()
    if p == 1:
        return math.inf, 1.0
    rounds = PROBE_ROUNDS if rounds is None else max(1, int(rounds))
    what = "the link probe (MPI_Allreduce of every rank)"
    x = np.ones(PROBE_MAX_BYTES // 4, dtype=np.float32)
    out = np.empty_like(x)
    # connections are set up on first use
    _complete(comm.Iallreduce(x[:1 << 14], out[:1 << 14]), wait, what)
    n = PROBE_MIN_BYTES // 4

    def timed(count):
        times = []
        for _ in range(count):
            _complete(comm.Ibarrier(), wait, what)
            start = time.perf_counter()
            _complete(comm.Iallreduce(x[:n], out[:n]), wait, what)
            times.append(time.perf_counter() - start)
        return _slowest_per_round(comm, times, wait, what)

    # every rank takes the same branch: the slowest rank's times decide
    while min(timed(2)) < PROBE_TARGET_S and n * 4 < PROBE_MAX_BYTES:
        n = min(n * PROBE_GROWTH, x.size)
    slowest = timed(rounds)
    best = max(float(slowest.min()), 1e-9)
    return model.mpi_sent_bytes(n * 4, p) * 8 / best / 1e9, float(slowest.max()) / best


def probe_link_gbps(comm, rounds=None, wait=None):
    """The link speed of :func:`probe_link` alone, in Gbit/s (collective).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
    rounds : int, optional
    wait : callable, optional
        As for :func:`probe_link`.

    Returns
    -------
    float
    """
    return probe_link(comm, rounds, wait)[0]


#: Point-to-point rounds the latency probe times (the fastest of them counts).
PROBE_LATENCY_ROUNDS = 9


def probe_latency(comm, wait=None):
    """Measure one round of point-to-point messages around the ring, identically on every rank.

    Every rank sends a byte to its right neighbour and receives one from its
    left, ``PROBE_LATENCY_ROUNDS`` times, every round after a barrier; a
    round lasts as long as its slowest rank, and the fastest round is the
    answer (the same statistic as :func:`probe_link_gbps`): the library's
    point-to-point latency, which a compressing algorithm pays per
    sequential step of messages beyond their bytes. ccl times it with the
    waits its collectives use (:func:`ccl.collectives.link.profile`), which
    yield the core between tests: a wait that spins instead holds up a
    neighbour that shares its core for a scheduler time slice, and measured
    3.9 and 7.5 ms a step on 3 and 4 emulated hosts on 2 cores, where the
    yielding waits measured 0.06 ms. Collective.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The communicator (ccl passes its private duplicate).
    wait : callable, optional
        As for :func:`probe_link`.

    Returns
    -------
    float
        Seconds (0.0 on one rank).
    """
    from mpi4py import MPI

    p, r = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return 0.0
    out, into = np.zeros(1, np.uint8), np.empty(1, np.uint8)
    what = "the latency probe (messages around the ring of ranks)"
    times = []
    for _ in range(PROBE_LATENCY_ROUNDS):
        _complete(comm.Ibarrier(), wait, what)
        start = time.perf_counter()
        receiving = comm.Irecv([into, MPI.BYTE], (r - 1) % p, 0)
        _complete(comm.Isend([out, MPI.BYTE], (r + 1) % p, 0), wait, what)
        _complete(receiving, wait, what)
        times.append(time.perf_counter() - start)
    return float(min(_slowest_per_round(comm, times, wait, what)))


def rounds(algorithm, size):
    """Sequential steps of messages of ``algorithm`` at ``size`` ranks (for the latency term).

    :func:`ccl.collectives.model.steps`.

    >>> rounds("ring", 4), rounds("direct", 4), rounds("tree", 4), rounds("allgather", 4)
    (6, 2, 4, 2)
    """
    return model.steps(algorithm, size)


def estimate(codec, nbytes, size, link_gbps, itemsize=4, algorithm=None, pipelined=True,
             cores=1.0, latency=0.0, speeds=None):
    """Estimated seconds of ``MPI_Allreduce`` and of a compressed allreduce.

    Parameters
    ----------
    codec : ccl.codecs.Codec
    nbytes : int
        Input bytes per rank.
    size : int
        Ranks.
    link_gbps : float
        Link speed in Gbit/s (what ``MPI_Allreduce`` reaches).
    itemsize : int
        Bytes per input element.
    algorithm : str, optional
        The compressing algorithm (default: :func:`fitting`).
    pipelined : bool
        Whether codec time overlaps the transfers (segmented ring and direct).
    cores : float
        The rank's share of its machine's cores; the codec runs that much
        slower when it is below 1 (unless ``speeds`` are given). A pipelined
        algorithm's codec time overlaps its transfers all the same.
    latency : float
        Seconds per sequential step of messages (:func:`probe_latency`); the
        compressing algorithm pays it :func:`rounds` times. ``MPI_Allreduce``
        is taken to pay none (its latency is in its measured link speed).
    speeds : tuple of float, optional
        ``(encode_gbps, decode_gbps)`` measured as the ranks run the codec
        now (``ccl.collectives.link.codec_speeds``): used in place of the
        codec's stated one-core figures, and ``cores`` is then not applied
        (the measurement already ran at the rank's share of the cores).

    Returns
    -------
    tuple of float
        ``(t_mpi, t_compressed)``.
    """
    machine = model.Machine(link_gbps, latency, cores)
    return (model.predict("mpi", None, nbytes, size, machine, itemsize=itemsize,
                          latency=False).seconds,
            _predict(algorithm or fitting(codec), codec, nbytes, size, machine, itemsize,
                     pipelined, speeds).seconds)


def _figures(codec, speeds):
    """The model's codec figures; with ``speeds`` (measured in a collective, agreed) in place
    of the stated ones, and then only figures every rank finds alike (no per-user file)."""
    if speeds is None:
        return codec_figures(codec)
    return codec_figures(codec, calibration={})._replace(
        encode_gbps=float(speeds[0]), decode_gbps=float(speeds[1]))


def _predict(algorithm, codec, nbytes, size, machine, itemsize, pipelined, speeds):
    # measured speeds already ran at the rank's share of the cores: not applied again
    return model.predict(algorithm, codec, nbytes, size, machine, _figures(codec, speeds),
                         itemsize, pipelined, codec_share=None if speeds is None else 1.0)


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


#: Why :func:`decide` picked what it did (``Communicator.stats()["decisions"]`` counts them).
REASONS = {
    "reduce_scatter": "a reduce-scatter is always compressed, direct: each chunk crosses one "
                      "link to its owner at the codec's own width (a ring widens homomorphic "
                      "lanes and re-encodes other codecs at every hop)",
    "one rank": "one rank: nothing to send",
    "no codec": "the codec is the identity: nothing to compress",
    "small": "below MIN_COMPRESS_BYTES per rank: latency, not bandwidth, costs",
    "dtype": "the MPI library cannot reduce this dtype: compressed",
    "shared memory": "no slower link than shared memory (all ranks on one node, or "
                     "link_gbps=inf): exact MPI_Allreduce",
    "no link speed": "the link speed is unknown: uncompressed",
    "model: MPI": "the cost model: MPI_Allreduce at least as fast at this link speed, "
                  "latency and share of cores",
    "model: compress": "the cost model: compressing wins by MARGIN at this link speed, "
                       "latency and share of cores",
}

#: ``decide``'s answer: the algorithm name, the key of :data:`REASONS`, and for the cost
#: model its ``(t_mpi, t_compressed)`` estimate in seconds (None otherwise).
Decision = namedtuple("Decision", ["algorithm", "reason", "estimate"])


def decide(codec, nbytes, size, dtype, collective="allreduce", link_gbps=None,
           pipelined=True, cores=1.0, latency=0.0, speeds=None, spread=1.0,
           ranks_per_node=1):
    """The algorithm ``auto`` resolves to, and why (:func:`choose` with the reason).

    Parameters are those of :func:`choose`, ``spread``: how much the link
    probe's rounds varied (:func:`probe_link`), and ``ranks_per_node``:
    where nodes hold several ranks each, a compressing call runs
    ``hierarchical`` (exact inside a node, compressed across), so past
    :data:`FITTING_MAX_RANKS` ranks that is what is weighed against
    ``MPI_Allreduce``, and the algorithm returned is the one across nodes.
    Compression must win by ``max(MARGIN, spread)``: on a machine whose
    timings vary, by as much as they vary.

    Returns
    -------
    Decision
        ``(algorithm, reason, estimate)``; ``reason`` is a key of :data:`REASONS`.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> decide(get_codec("3lc"), 64 << 20, 4, np.float32, link_gbps=math.inf)[:2]
    ('mpi', 'shared memory')
    >>> decide(get_codec("3lc"), 1024, 4, np.float32, link_gbps=1.0)[:2]
    ('mpi', 'small')
    """
    if collective == "reduce_scatter":
        return Decision("direct", "reduce_scatter", None)
    dtype = np.dtype(dtype)
    reason, times = "dtype", None
    if dtype in (np.dtype(np.float32), np.dtype(np.float64)):  # MPI can reduce it
        if not needs_link(codec, nbytes, size, dtype, collective):
            reason = ("one rank" if size <= 1 else "no codec" if codec.identity else "small")
            return Decision("mpi", reason, None)
        if link_gbps is None or link_gbps == "probe":
            return Decision("mpi", "no link speed", None)
        if math.isinf(link_gbps):
            return Decision("mpi", "shared memory", None)
        # up to FITTING_MAX_RANKS the fitting algorithm, weighed as it runs large messages
        algorithm, modelled = _fitting_at(codec, nbytes, size), fitting(codec)
        if size > FITTING_MAX_RANKS:  # the model's pick among the flat algorithms
            machine = model.Machine(link_gbps, latency, cores)
            algorithm = modelled = model.best(
                codec, nbytes, size, machine, _figures(codec, speeds), _candidates(algorithm),
                itemsize=dtype.itemsize, pipelined=pipelined,
                codec_share=None if speeds is None else 1.0).algorithm
        times = estimate(codec, nbytes, size, link_gbps, dtype.itemsize, modelled,
                         pipelined=pipelined, cores=cores, latency=latency, speeds=speeds)
        q = ranks_per_node
        if size > FITTING_MAX_RANKS and 1 < q < size and size % q == 0:
            # the call will run hierarchically: a flat algorithm's 4 (p - 1) payloads at 1024
            # ranks can lose to MPI where the same codec across 128 nodes wins
            nodes = model.Machine(link_gbps, latency, cores, ranks_per_node=q)
            across = model.predict("hierarchical", codec, nbytes, size, nodes,
                                   _figures(codec, speeds), itemsize=dtype.itemsize,
                                   pipelined=pipelined,
                                   codec_share=None if speeds is None else 1.0)
            algorithm, times = across.algorithm.split("/", 1)[1], (times[0], across.seconds)
        if times[1] * max(MARGIN, spread) > times[0]:
            return Decision("mpi", "model: MPI", times)
        return Decision(algorithm, "model: compress", times)
    algorithm = _fitting_at(codec, nbytes, size)
    if size > FITTING_MAX_RANKS:  # no time to model: keep the error within the bound
        figures = codec_figures(codec, calibration={})  # alike on every rank
        error = model.combined_error(figures.error,
                                     model.lossy_weight(algorithm, size, figures.exact_sum,
                                                        codec.homomorphic))
        if error > model.error_bound(figures):
            algorithm = "direct"  # two lossy points at any size
    return Decision(algorithm, reason, times)


def _fitting_at(codec, nbytes, size):
    """The algorithm :func:`fitting` the codec, the tree for small homomorphic messages."""
    return "tree" if codec.homomorphic and nbytes < TREE_MAX_BYTES else fitting(codec)


def _candidates(first):
    """The flat algorithms, ``first`` first (it wins ties)."""
    return (first,) + tuple(name for name in model.FLAT if name != first)


def choose(codec, nbytes, size, dtype, collective="allreduce", link_gbps=None,
           pipelined=True, cores=1.0, latency=0.0, speeds=None):
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
        allreduce of float32/float64 is not compressed (the collectives
        find it before asking, see :func:`needs_link`); ``math.inf``:
        shared memory, never compressed.
    pipelined : bool
        Whether ring and direct run pipelined (segments), for the estimate.
    cores : float
        The rank's share of cores (agreed: the smallest share,
        :func:`ccl.threads.cores_share`).
    latency : float
        Seconds per sequential step of messages (agreed, :func:`probe_latency`).
    speeds : tuple of float, optional
        The codec's measured ``(encode_gbps, decode_gbps)`` (agreed, see
        :func:`estimate`).

    Returns
    -------
    str
        ``"mpi"`` (the MPI library's own uncompressed ``Allreduce``), ``"ring"``,
        ``"tree"``, ``"direct"`` or ``"allgather"``.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> choose(get_codec("3lc"), 64 << 20, 4, np.float32, link_gbps=1.0)
    'direct'
    >>> choose(get_codec("none"), 64 << 20, 4, np.float32, link_gbps=1.0)
    'mpi'
    """
    return decide(codec, nbytes, size, dtype, collective, link_gbps, pipelined, cores,
                  latency, speeds).algorithm


def fitting(codec):
    """The algorithm that fits ``codec`` for large messages (docs/algorithms.md).

    Sparse codecs gather their small payloads; homomorphic ones add on the
    ring with no relay loss; the others go through owners (two lossy points).

    Examples
    --------
    >>> from ccl.codecs import get_codec
    >>> fitting(get_codec("sidco")), fitting(get_codec("thc")), fitting(get_codec("3lc"))
    ('allgather', 'ring', 'direct')
    """
    if codec.sparse:
        return "allgather"
    return "ring" if codec.homomorphic else "direct"
