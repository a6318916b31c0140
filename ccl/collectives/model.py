"""The cost model of ccl's allreduce algorithms: time, bytes and error, as functions of the ranks.

One model, used by ``algorithm="auto"`` (:mod:`ccl.collectives.auto`), by
the projection ``python -m ccl.bench.model`` and checked against the
emulated cluster by ``python -m ccl.bench.validate``. For ``p`` ranks, ``n``
input bytes per rank and an algorithm it predicts (:func:`predict`):

- **bytes**: what the most loaded rank sends, from the codec's payload bits
  per value as a function of how many contributions a payload holds
  (:func:`payload_bits`: THC's lanes widen with it, sparse and quantized
  payloads stay as they are), plus a header per message;
- **time**: alpha-beta-gamma. Every sequential step of messages costs the
  latency (alpha, :func:`steps`); every byte the link's time (beta, the
  rate ``MPI_Allreduce`` reaches); every encoded and decoded element the
  codec's time (gamma) at its one-core speed times the rank's share of
  the cores (:class:`Machine`); every call and every payload a rank
  handles ccl's own work (:data:`CALL_SECONDS`, :func:`payloads`), at
  the same share. Where the algorithm is pipelined (ring and
  direct, segments), codec time overlaps the transfers, also where ranks
  share cores: the link moves one segment while a core codes the next
  (measured on 4 emulated hosts on 2 cores: THC's ``direct`` at 64 MB took
  232 ms, its codec time alone 225 ms and its bytes 151 ms at the link's
  rate);
- **error**: the relative error of the sum for independent inputs, from the
  codec's one-shot error ``e`` (one encode and decode) and the algorithm's
  *lossy weight* ``F`` (:func:`lossy_weight`: how many times, in units of
  the sum's energy, values are encoded on their way): ``sqrt(1 - (1 -
  e^2)^F)``, which is ``e`` for one lossy point, ``~ e sqrt(F)`` for small
  errors and saturates at 1. A ring that decodes and re-encodes at every
  hop has ``F = (p + 1) / 2``, a binomial tree ``1 + log2(p) / 2``, direct
  ``(2p - 1) / p`` and the allgather 1; a codec whose payloads add exactly
  (THC's integer lanes, random-k's shared indices) has ``F = 1`` everywhere,
  one whose additions round (fp16, bf16) about ``(p + 3) / 2`` in the ring,
  and ``(2p - 1) / p`` in direct, whose owners sum them decoded.

The codec's inputs (:class:`~ccl.collectives.figures.CodecFigures`) come
from :mod:`ccl.collectives.figures`: calibrated by ``python -m ccl.bench
calibrate``, else the codec's stated speeds and an error measured on a
small sample.
"""

import functools
import math
from collections import namedtuple

from .figures import HEADER_BYTES, codec_figures

__all__ = ["ALGORITHMS", "FLAT", "Machine", "Prediction", "predict", "predict_all", "best",
           "mpi_sent_bytes", "mpi_halves", "payload_bits", "lossy_weight", "combined_error",
           "error_bound", "steps", "payloads", "ERROR_BOUND", "CALL_SECONDS",
           "PAYLOAD_SECONDS"]

#: The algorithms the model knows ("mpi": the MPI library's own allreduce).
ALGORITHMS = ("mpi", "ring", "tree", "direct", "allgather", "hierarchical")
#: The flat compressing algorithms (``hierarchical`` runs one of them across nodes).
FLAT = ("ring", "tree", "direct", "allgather")
#: ``auto`` never runs an algorithm whose modelled error exceeds this many times the codec's
#: one-shot error (:func:`error_bound`): twice what one encode and decode loses.
ERROR_BOUND = 2.0
#: Codec time overlapped with transfers still costs this much of the shorter of the two.
OVERLAP_LEFT = 0.25
#: Shared memory between the ranks of a node, Gbit/s (a memory copy, per rank).
NODE_GBPS = 80.0
#: ccl's own work once per compressed call (planning, error feedback, the result), seconds
#: of one core: fitted, with :data:`PAYLOAD_SECONDS`, to compressed allreduces of 16 KB per
#: rank (1-bit, 2 to 8 ranks on the 2-core VM, shared memory), where they are all of the
#: time: ``mpiexec -n P python -m mpi4py -m ccl.bench --codecs onebit --sizes 16KB``.
CALL_SECONDS = 3.8e-4
#: ccl's own work for each payload a rank sends or receives (the encode or decode call, its
#: framing, the message's queueing), seconds of one core (:func:`payloads` counts them).
PAYLOAD_SECONDS = 5.8e-5


class Machine(namedtuple("Machine", ["link_gbps", "latency_s", "share", "burst_bytes",
                                     "ranks_per_node", "node_gbps"])):
    """The network and cores a prediction is for.

    Attributes
    ----------
    link_gbps : float
        Gbit/s a node's link carries (what ``MPI_Allreduce`` reaches on it).
    latency_s : float
        Seconds per sequential step of messages (alpha).
    share : float
        The share of a core each rank gets (:func:`ccl.threads.cores_share`);
        below 1 the codec runs that much slower and does not overlap transfers.
    burst_bytes : int
        Bytes a rank's idle link passes at once before its rate applies (a
        token bucket: the emulated cluster's links have 512 KB; 0 elsewhere).
    ranks_per_node : int
        Ranks sharing a node and its link (1: one rank per node).
    node_gbps : float
        Gbit/s between the ranks of one node (shared memory).
    """

    __slots__ = ()

    def __new__(cls, link_gbps, latency_s=0.0, share=1.0, burst_bytes=0, ranks_per_node=1,
                node_gbps=NODE_GBPS):
        return super().__new__(cls, float(link_gbps), float(latency_s), float(share),
                               int(burst_bytes), int(ranks_per_node), float(node_gbps))


#: One prediction: seconds, bytes the most loaded rank sends, relative error of the sum.
Prediction = namedtuple("Prediction", ["algorithm", "seconds", "sent_bytes", "error"])


def steps(algorithm, p):
    """Sequential steps of messages of ``algorithm`` at ``p`` ranks (each pays the latency).

    >>> steps("ring", 4), steps("direct", 4), steps("tree", 4), steps("allgather", 4)
    (6, 2, 4, 2)
    """
    if p <= 1:
        return 0
    log = math.ceil(math.log2(p))
    return {"ring": 2 * (p - 1), "direct": 2, "tree": 2 * log, "allgather": log,
            "mpi": 2 * log}.get(algorithm, 2 * (p - 1))


def payloads(algorithm, p):
    """Payloads a rank of ``algorithm`` at ``p`` ranks encodes or decodes, each sent or received.

    Each costs :data:`PAYLOAD_SECONDS` of ccl's own work besides its bytes
    and codec throughput: at 1024 ranks the ring's and ``direct``'s
    ``4 (p - 1)`` of them are a quarter of a second of one core.

    >>> payloads("ring", 4), payloads("direct", 4), payloads("tree", 4), payloads("allgather", 4)
    (12, 12, 4, 4)
    """
    if p <= 1:
        return 0
    log = math.ceil(math.log2(p))
    # ring and direct: a worker's p - 1 chunks out, p - 1 in to add, p - 1 results in;
    # tree: up to log p children in, one sum up, the broadcast in; allgather: one out, p - 1 in
    return {"ring": 4 * (p - 1), "direct": 4 * (p - 1), "tree": log + 2,
            "allgather": p}.get(algorithm, 0)


def mpi_sent_bytes(nbytes, p):
    """Bytes over the busiest link in the MPI library's own allreduce of ``nbytes`` per rank.

    MPICH (and the libraries that report themselves as MPICH) reduces a large
    message by recursive halving and gathers it by recursive doubling among
    the largest power of two ``q <= p`` of the ranks; each of the other
    ``p - q`` sends its whole input to a partner first and receives the
    whole sum back, so that partner's link carries ``2 n`` more: ``3 n`` at
    three ranks, where a ring carries ``4/3 n``. Measured on the emulated
    cluster at 1 Gbit/s, 64 MB: 2.68 times the ring's bound at 3 hosts,
    2.42 at 6, 1.03 and 1.09 at 2 and 4. Other libraries are taken to reach
    the ring's bound ``2 (p - 1) / p n``.

    >>> mpi_sent_bytes(3, 3) if mpi_halves() else 9.0
    9.0
    >>> mpi_sent_bytes(4, 4)
    6.0
    """
    if p <= 1:
        return 0.0
    q = 1 << (p.bit_length() - 1)
    if q == p or not mpi_halves():
        return 2 * (p - 1) / p * nbytes
    return (2 * (q - 1) / q + 2) * nbytes


@functools.cache
def mpi_halves():
    """Whether the MPI library in use is MPICH, whose allreduce :func:`mpi_sent_bytes` follows."""
    try:
        from mpi4py import MPI
    except ImportError:
        return False
    return "MPICH" in MPI.Get_library_version()


def payload_bits(codec, figures, contributors):
    """Bits per value of a payload holding the sum of ``contributors`` contributions.

    THC's lanes widen (8, 16, 32 bits) as sums grow; other codecs' payloads
    keep their size (a non-exact codec re-encodes each sum).

    >>> from ccl.codecs import get_codec
    >>> thc = get_codec("thc")
    >>> [payload_bits(thc, codec_figures(thc), c) for c in (1, 2, 16, 4096, 8192)]
    [4.0, 8.0, 8.0, 16.0, 32.0]
    """
    if contributors > 1 and codec is not None and codec.homomorphic:
        widened = codec.sum_bits_per_value(contributors)
        if widened != codec.bits_per_value:  # the codec states how its sums widen
            return float(widened)
    return float(figures.bits)


def lossy_weight(algorithm, p, exact_sum=False, homomorphic=False):
    """How often values are encoded on the way, in units of the sum's energy (``F``).

    For independent inputs of equal energy a point that encodes (or, for a
    homomorphic codec that rounds, adds into) a partial sum of ``k``
    contributions adds ``k / p`` of the sum's energy, times the codec's
    squared one-shot error. A homomorphic codec whose sums round (fp16,
    bf16) encodes every input once and rounds every partial sum it adds:
    in the ring and the tree, sums of 2 to ``p`` contributions. ``direct``'s
    owners sum such payloads decoded and encode the sum once
    (``Codec.sum_rounds``): two lossy points, as for any codec.

    >>> [round(lossy_weight(a, 16), 3) for a in ("allgather", "direct", "tree", "ring")]
    [1.0, 1.938, 3.0, 8.5]
    >>> round(lossy_weight("ring", 16, homomorphic=True), 3)
    9.438
    >>> round(lossy_weight("direct", 16, homomorphic=True), 3)
    1.938
    >>> lossy_weight("ring", 16, exact_sum=True)
    1.0
    """
    if algorithm == "mpi":
        return 0.0
    if p <= 1 or exact_sum or algorithm == "allgather":
        return 1.0
    if homomorphic and algorithm != "direct":  # each input once, then every rounded sum
        if algorithm == "tree":
            return 1.0 + sum(_tree_adds(r, p) for r in range(p)) / p
        return 1.0 + (p * (p + 1) / 2 - 1) / p
    if algorithm == "direct":  # workers' chunks (not the owner's own), then the owner's sum
        return (2 * p - 1) / p
    if algorithm == "tree":  # every rank encodes its subtree's sum once
        return sum(_subtree(r, p) for r in range(p)) / p
    return (p + 1) / 2  # ring: worker 1, relays 2 .. p-1, owner p


def _tree_adds(rank, p):
    """Contributions of every partial sum ``rank`` rounds as it adds its children in."""
    total, held, mask = 0, 1, 1
    while mask < p and not rank & mask:
        if rank + mask < p:
            held += _subtree(rank + mask, p)
            total += held
        mask <<= 1
    return total


def _subtree(rank, p):
    """Ranks in the binomial subtree rooted at ``rank`` (the tree of :mod:`.tree`)."""
    low = rank & -rank if rank else 1 << max(p - 1, 1).bit_length()
    return min(low, p - rank)


def combined_error(error, weight):
    """The relative error of a sum encoded with lossy weight ``weight`` (``sqrt(1-(1-e^2)^F)``).

    >>> combined_error(0.1, 1.0), round(combined_error(0.01, 4.0), 5)
    (0.1, 0.02)
    """
    if weight <= 0:
        return 0.0
    if weight == 1.0 or error >= 1.0:
        return float(error)
    return float(math.sqrt(1.0 - (1.0 - error * error) ** weight))


def error_bound(figures):
    """The error ``auto`` allows a codec: :data:`ERROR_BOUND` times its one-shot error."""
    return ERROR_BOUND * figures.error


def _codec_seconds(figures, elements, encodes, decodes, share):
    # GB/s of float32 input: 4 bytes per element
    work = elements * 4 * (encodes / (figures.encode_gbps * 1e9)
                           + decodes / (figures.decode_gbps * 1e9))
    return work / min(share, 1.0)


def predict(algorithm, codec, nbytes, p, machine, figures=None, itemsize=4, pipelined=True,
            latency=True, codec_share=None, cross="fit"):
    """Predicted time, bytes and error of one allreduce.

    Parameters
    ----------
    algorithm : str
        One of :data:`ALGORITHMS`.
    codec : ccl.codecs.Codec or None
        None for ``"mpi"``.
    nbytes : int
        Input bytes per rank.
    p : int
        Ranks.
    machine : Machine
    figures : CodecFigures, optional
        Default: :func:`~ccl.collectives.figures.codec_figures` of ``codec``.
    itemsize : int
        Bytes per input element.
    pipelined : bool
        Whether ring and direct run in segments (codec time overlaps transfers).
    latency : bool
        Whether ``"mpi"`` pays latency too (``auto`` takes its latency to be
        in its measured link speed and passes False).
    codec_share : float, optional
        The share of a core the codec speeds are to be scaled by (default
        ``machine.share``; 1.0 where the speeds were measured at that share).
    cross : str
        The flat algorithm ``"hierarchical"`` runs across nodes (``"fit"``:
        the fastest within :func:`error_bound`).

    Returns
    -------
    Prediction
    """
    q = max(machine.ranks_per_node, 1)
    if algorithm == "hierarchical" or (algorithm == "mpi" and q > 1):
        return _hierarchical(algorithm, codec, nbytes, p, machine, figures, itemsize,
                             pipelined, latency, codec_share, cross)
    rate = machine.link_gbps * 1e9 / 8
    if q > 1 and algorithm != "ring":  # a node's ranks share its link (a ring crosses it once)
        rate = min(rate * p / max(q * (p - q), 1), machine.node_gbps * 1e9 / 8)
    elements = nbytes / itemsize

    def wire_seconds(sent, idle=0.0):
        # a token bucket (burst_bytes) refills while the link idles: after an idle stretch,
        # that much passes at once (calls timed back to back that keep the link busy, as
        # MPI_Allreduce's, find it empty: 1 MB at 2 hosts took 8.4 ms, the whole megabyte)
        return max(sent - min(machine.burst_bytes, rate * idle), 0.0) / rate

    if algorithm == "mpi" or p <= 1 or codec is None:
        sent = mpi_sent_bytes(nbytes, p)
        alpha = steps("mpi", p) * machine.latency_s if latency else 0.0
        return Prediction("mpi", wire_seconds(sent) + alpha, sent, 0.0)
    figures = figures or codec_figures(codec)
    share = machine.share if codec_share is None else codec_share

    def payload(contributors, count=elements):
        return count * payload_bits(codec, figures, contributors) / 8 + HEADER_BYTES

    def coding(encodes, decodes):
        return _codec_seconds(figures, elements, encodes, decodes, share)

    log = math.ceil(math.log2(p))
    overlap = pipelined and algorithm in ("ring", "direct")
    if algorithm in ("ring", "direct"):
        chunk = elements / p
        if algorithm == "ring":  # hop k carries k contributions, the allgather all p
            sent = sum(payload(c, chunk) for c in range(1, p)) + (p - 1) * payload(p, chunk)
        else:  # workers' chunks to their owners, the owners' sums to every rank
            sent = (p - 1) * (payload(1, chunk) + payload(p, chunk))
        codec_s = coding((p + 1) / p, (2 * p - 1) / p)
        # the link idles while the codec runs (beyond what the transfers overlap)
        idle = max(codec_s - sent / rate, 0.0) if overlap else codec_s
        wire = wire_seconds(sent, idle)
    elif algorithm == "tree":  # log p levels up, then MPI's broadcast of the root's payload
        up = [payload(min(1 << level, p)) for level in range(log)]
        last = payload(p)
        down = log * last if last < 12288 else 2 * (p - 1) / p * last
        # counted as ccl counts it: the root sends to log p children, rank p/2 up and on
        sent = max(log * last, up[-1] + (log - 1) * last)
        # every rank encodes its leaf and decodes the broadcast at once; level l of the
        # way up runs on p / 2^l ranks, which share the cores less (the codec speeds are
        # those of every rank at once: faster by up to 1 / share where fewer run)
        relays = 1.0 + sum(1 / min(2 ** level, 1 / min(machine.share, 1.0))
                           for level in range(1, log + 1))
        codec_s = coding(relays, relays)
        # a rank sends up once a call, its link idle otherwise; the root's link idles
        # until the broadcast
        climb = sum(wire_seconds(b, math.inf) for b in up)
        wire = climb + wire_seconds(down, climb + codec_s)
    elif algorithm == "allgather":
        sent = (p - 1) * payload(1)
        codec_s = coding(1.0, float(p))
        wire = wire_seconds(sent, codec_s)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}; the model knows {ALGORITHMS}")
    # ccl's own work per call and payload, at the rank's share of the cores, runs beside the
    # codec (16 KB calls, which are nothing else, took 0.6 ms at 2 ranks and 6.5 ms at 8
    # ranks on 2 cores)
    codec_s += (CALL_SECONDS + PAYLOAD_SECONDS * payloads(algorithm, p)) / min(machine.share,
                                                                              1.0)
    busy = (max(wire, codec_s) + OVERLAP_LEFT * min(wire, codec_s) if overlap
            else wire + codec_s)
    error = combined_error(figures.error, lossy_weight(algorithm, p, figures.exact_sum,
                                                       codec.homomorphic))
    rounds = steps(algorithm, p)
    if algorithm == "direct" and machine.share < 1.0:
        # direct posts a phase's p - 1 messages at once, and they overlap where every rank
        # has a core; where ranks share cores each needs its peer scheduled, one latency each
        # (8 and 16 emulated hosts on 2 cores, 1 MB: 0.2 to 0.4 of the measured time before)
        rounds = 2 * (p - 1)
    return Prediction(algorithm, busy + rounds * machine.latency_s, sent, error)


def _hierarchical(algorithm, codec, nbytes, p, machine, figures, itemsize, pipelined,
                  latency, codec_share, cross):
    """Exact reduce-scatter in the node, a flat allreduce of ``1/q`` across, allgather in it.

    ``"mpi"`` on nodes of several ranks is taken to run the same way, exact
    (MPI libraries reduce inside a node first)."""
    q = max(machine.ranks_per_node, 1)
    nodes = max(p // q, 1)
    inside = 2 * (q - 1) / q * nbytes / (machine.node_gbps * 1e9 / 8)
    # the node's q ranks share its link, each with 1/q of the data: one rank's link and bytes
    across = machine._replace(ranks_per_node=1, link_gbps=machine.link_gbps / q)
    if algorithm == "mpi" or codec is None:
        flat = predict("mpi", None, nbytes / q, nodes, across, latency=latency)
    elif cross == "fit":
        flat = best(codec, nbytes / q, nodes, across, figures, itemsize=itemsize,
                    pipelined=pipelined, codec_share=codec_share)
    else:
        flat = predict(cross, codec, nbytes / q, nodes, across, figures, itemsize, pipelined,
                       codec_share=codec_share)
    name = "mpi" if algorithm == "mpi" else f"hierarchical/{flat.algorithm}"
    return Prediction(name, inside + flat.seconds, flat.sent_bytes, flat.error)


def best(codec, nbytes, p, machine, figures=None, candidates=FLAT, **kwargs):
    """The fastest of ``candidates`` whose error is within :func:`error_bound` (a Prediction).

    Equally fast candidates go to the smaller error (a ring that re-encodes
    at every hop and ``direct`` move the same bytes and do the same coding,
    so they tie where ranks share cores; ``direct`` keeps two lossy
    points), then to the earlier candidate; where none is within the bound,
    the one with the smallest error.
    """
    figures = figures or codec_figures(codec)
    found = [predict(name, codec, nbytes, p, machine, figures, **kwargs) for name in candidates]
    bound = error_bound(figures)
    allowed = [f for f in found if f.error <= bound * (1 + 1e-9)]
    if not allowed:
        return min(found, key=lambda f: f.error)
    return min(allowed, key=lambda f: (f.seconds, f.error))


def predict_all(codec, nbytes, p, machine, figures=None, **kwargs):
    """:func:`predict` of ``"mpi"``, every flat algorithm and, on nodes of several ranks,
    ``"hierarchical"`` (across nodes the fastest within the bound), as a dict by name."""
    names = ALGORITHMS if machine.ranks_per_node > 1 else ALGORITHMS[:-1]
    figures = figures or (None if codec is None else codec_figures(codec))
    return {name: predict(name, codec, nbytes, p, machine, figures, **kwargs)
            for name in names}


#: Names that moved to :mod:`ccl.collectives.figures`; still found here, with a warning.
_MOVED = ("CodecFigures", "measure_figures", "calibration_path", "load_calibration",
          "save_calibration", "ERROR_SAMPLE")


def __getattr__(name):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    from . import figures

    warnings.warn(f"ccl.collectives.model.{name} moved: import it from "
                  "ccl.collectives.figures", DeprecationWarning, stacklevel=2)
    return getattr(figures, name)
