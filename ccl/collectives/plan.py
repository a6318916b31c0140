"""Planning and running one collective call, identically on every rank.

:func:`run` is what ``ccl.compressed_allreduce``, ``reduce_scatter``,
``allgather`` and every ``ccl.Communicator`` method end in:

1. **Validate** this rank's arguments (:class:`Request`) without raising yet.
2. **Agree** (:func:`ccl.agreement.agree`): one small ``Allgather`` of the
   arguments' fingerprints, the key and its step, and the calling thread's
   name; a rank with bad arguments raises its error, every other rank a
   :class:`ccl.MismatchError`, before any data moves.
3. **Choose**: ``auto`` resolves to an algorithm from what every rank agreed
   on (measuring the link once per communicator where it has to).
4. **Split** the flat input into pieces (partitions; pieces below the
   compression threshold go uncompressed) and **dispatch** each to its
   algorithm module with a :class:`ccl.collectives.base.Call`.
5. **Finish**: commit error-feedback residuals, raise overflow on every rank
   alike, and shape the result like the input.
"""

import math
import threading

import numpy as np

from .. import config, trace
from .._xp import backend_of
from ..agreement import Fingerprinted, agree, report_failure
from ..codecs import get_codec
from ..codecs.context import all_finite
from ..codecs.header import FLAG_FAILED, FLAG_OVERFLOW
from ..errors import CompressionOverflowError, NonFiniteError, PeerError
from ..threads import budgeted, channel_budget
from . import auto, link
from .base import DEFAULT_SEGMENT_BYTES, Call
from .algorithms import ALGORITHMS, REDUCE_SCATTER

__all__ = ["run", "Request", "pieces"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
#: dtypes the MPI library's own Allreduce takes (the MPI wheels have no 16-bit float)
MPI_DTYPES = _DTYPES[:2]
# the agreement's dtype field, without formatting the dtype at every call
_DTYPE_NAMES = {dtype: str(dtype) for dtype in _DTYPES}


class Request:
    """One rank's arguments to a collective, validated without raising yet.

    Parameters
    ----------
    collective : str
    x : array
    options : ccl.collectives.options.Options
        The defaults of the call (a Communicator's, or the module functions').
    overrides : dict
        Per-call options; None values keep the defaults.

    Attributes
    ----------
    error : Exception or None
        What this rank would raise; raised after the agreement.
    timeout : float or None
        Seconds for this call (None or ``inf``: forever), from the options or
        ``CCL_TIMEOUT``; None when the variable is bad (then ``error`` says so).
    """

    def __init__(self, collective, x, options, overrides):
        self.collective = collective
        self.error = None
        self.options = options
        self.codec = self.x = self.flat = None
        self.backend = backend_of(x)
        self.nonfinite = False
        self.timeout = self.segment_bytes = self.link_gbps = self.cross = self.reason = None
        try:
            self.options = options = options.replace(**overrides)
            self.codec = options.codec
            # The environment may be bad on some ranks only: like any argument error, it
            # is raised after the agreement, so no rank is left waiting.
            self.timeout = (options.timeout if options.timeout is not None
                            else config.read("CCL_TIMEOUT"))
            self.segment_bytes = options.segment_bytes
            if self.segment_bytes is None:
                self.segment_bytes = config.read("CCL_SEGMENT_BYTES")
                if self.segment_bytes is None:
                    self.segment_bytes = DEFAULT_SEGMENT_BYTES
            self.link_gbps = options.link_gbps
            if self.link_gbps is None:
                self.link_gbps = config.read("CCL_LINK_GBPS")
            if self.link_gbps == "probe":  # what unset means too: equal in the agreement
                self.link_gbps = None
            # every other variable too: a bad one on some ranks raises on every rank
            error = config.check_environment()
            if error is not None:
                raise error
            self._validate(x)
        except (TypeError, ValueError) as exc:
            self.error = exc

    def _validate(self, x):
        if not (hasattr(x, "dtype") and hasattr(x, "shape")):
            raise TypeError(f"x must be a numpy or cupy array, got {type(x).__name__}")
        if isinstance(x, np.ma.MaskedArray):
            raise TypeError("masked arrays are not reduced (the mask would be ignored): pass "
                            "x.filled(0), or the data and the mask as two arrays")
        xp = self.backend.xp
        self.x = x = xp.asarray(x)
        if not x.dtype.isnative:  # big-endian input: reduced (and returned) in native order
            self.x = x = x.astype(x.dtype.newbyteorder("="))
        if x.dtype not in _DTYPES or x.dtype not in self.codec.input_dtypes:
            accepted = ", ".join(str(d) for d in self.codec.input_dtypes)
            raise TypeError(f"codec {self.codec.codec_id!r} reduces arrays of {accepted}; "
                            f"got {x.dtype}")
        algorithm = self.options.algorithm
        if self.collective == "reduce_scatter" and algorithm not in REDUCE_SCATTER | {"auto"}:
            raise ValueError(f"reduce_scatter supports algorithms "
                             f"{', '.join(sorted(REDUCE_SCATTER))} and 'auto'; "
                             f"got {algorithm!r}")
        if algorithm == "mpi" and x.dtype not in MPI_DTYPES:
            raise TypeError("algorithm 'mpi' reduces float32 or float64 only (the MPI wheels "
                            "have no 16-bit float type); use 'ring'")
        # Work in float32 (float64 for float64 input); copies non-contiguous input.
        work = np.float64 if x.dtype == np.float64 else np.float32
        self.flat = xp.ascontiguousarray(x, dtype=work).reshape(-1)
        if self.options.check_finite:
            self.nonfinite = not all_finite(self.flat)

    def fields(self, key, step):
        """What every rank must agree on, as ``(name, value)`` pairs, in checking order."""
        ok = self.error is None
        options = self.options
        shape = tuple(self.x.shape) if ok else None
        return [
            ("collective", self.collective),
            ("codec", None if self.codec is None
             else Fingerprinted(self.codec, self.codec.config_hash)),
            ("dtype", _DTYPE_NAMES[self.x.dtype] if ok else None),
            ("ndim", len(shape) if ok else None),
            # allgather blocks may differ in length
            ("shape", None if self.collective == "allgather" else shape),
            ("op", options.op),
            ("algorithm", (options.algorithm, options.cross_algorithm, options.partition_bytes,
                           options.min_compress_bytes, self.segment_bytes, self.link_gbps)),
            ("key", key),
            ("key's step", step),
            # two threads' calls on one communicator must not pair up across ranks
            ("calling thread", threading.current_thread().name),
        ]

    def resolve(self, channel):
        """The algorithm of the call (``auto`` decided), after the agreement (collective).

        Also sets ``cross``: the flat algorithm ``hierarchical`` runs across
        nodes (None for the others), and ``reason``: why (a key of
        :data:`ccl.collectives.auto.REASONS`, or ``"given"`` for an
        algorithm the caller named). ``auto`` picks ``hierarchical`` where
        compressing pays and the ranks sit on several nodes of several ranks
        each (``Channel.topology()`` in ``ccl.transport``). Its inputs come
        from :func:`ccl.collectives.link.profile`.
        """
        self.cross, self.reason = None, "given"
        if self.collective == "allgather":
            return "allgather"
        algorithm, codec = self.options.algorithm, self.codec
        nbytes, dtype = self.x.nbytes, self.x.dtype
        if algorithm == "auto":
            found = {"link_gbps": None, "share": 1.0, "latency_s": 0.0, "nodes": None}
            speeds = None
            if auto.needs_link(codec, nbytes, channel.size, dtype, self.collective):
                # every rank reaches this point alike (the decision's inputs were agreed)
                found = link.profile(channel, self.link_gbps)
                if math.isfinite(found["link_gbps"]):  # the cost model will run: time the codec
                    speeds = link.codec_speeds(channel, codec)
            nodes = found["nodes"]  # ranks per node, node by node
            per_node = (nodes[0] if nodes is not None and len(set(nodes)) == 1
                        and 1 < len(nodes) < channel.size else 1)
            algorithm, self.reason, _ = auto.decide(
                codec, nbytes, channel.size, dtype, self.collective, found["link_gbps"],
                bool(self.segment_bytes), found["share"], found["latency_s"], speeds,
                found.get("spread", 1.0), per_node)
            if algorithm != "mpi" and per_node > 1:  # compressed across nodes, exact inside
                self.cross, algorithm = algorithm, "hierarchical"
        if algorithm == "hierarchical" and self.cross is None:
            self.cross = self.options.cross_algorithm or auto.fitting(codec)
        return algorithm


def probed_link_gbps(channel):
    """The link speed of ``channel``'s communicator, measured once (collective)."""
    return link.profile(channel, "probe")["link_gbps"]


def pieces(request, algorithm, size):
    """Split the flat input into ``(start, stop, codec, algorithm)`` pieces.

    With ``partition_bytes`` an allreduce runs partition by partition (each
    with its own chunk map and residuals, as BytePS-Compress does), every one
    with the algorithm chosen for the whole tensor; a piece smaller than
    ``min_compress_bytes`` is sent uncompressed.
    """
    flat, codec, options = request.flat, request.codec, request.options
    n, itemsize = flat.size, request.x.dtype.itemsize
    per = n
    if options.partition_bytes and request.collective == "allreduce":
        per = max(1, options.partition_bytes // itemsize)
    out = []
    for start in range(0, max(n, 1), max(per, 1)):
        stop = min(start + per, n)
        piece_codec, piece_algorithm = codec, algorithm
        nbytes = (stop - start) * itemsize
        # an allgather's blocks differ in size between ranks, so a size rule could pick
        # different codecs on different ranks: the call's codec is used for every block
        if (options.min_compress_bytes and nbytes < options.min_compress_bytes
                and request.collective != "allgather"):
            piece_codec = get_codec(None)
            if request.collective == "allreduce":
                piece_algorithm = "mpi" if flat.dtype in MPI_DTYPES else "ring"
        out.append((start, stop, piece_codec, piece_algorithm))
    return out


def run(channel, feedback, collective, x, options, key=None, record=None, **overrides):
    """Run one collective on every rank alike; return the user's result.

    Parameters
    ----------
    channel : ccl.transport.Channel
    feedback : ccl.feedback.ErrorFeedback
        Where the residuals and steps of keyed calls live.
    collective : {"allreduce", "reduce_scatter", "allgather"}
    x : array
    options : ccl.collectives.options.Options
    key : hashable, optional
    record : collections.Counter, optional
        Counts ``(algorithm, reason)`` of the call: the algorithm it ran
        (``auto`` resolved) and why (:meth:`Request.resolve`).
    **overrides
        Per-call options (None keeps the default).
    """
    request = Request(collective, x, options, overrides)
    if key is not None and request.error is None and request.codec.error_feedback:
        try:  # the codec config is agreed, so every rank refuses alike (after the agreement)
            request.codec.check_error_feedback()
        except ValueError as exc:
            request.error = exc
    completed = False
    began, before = trace.now(), channel.traffic()
    algorithm = tag = None
    try:
        with channel.collective(f"{collective}(key={key!r})", request.timeout) as tag:
            step = feedback.step(key) if key is not None else channel.calls
            with trace.span("NEGOTIATE", collective):
                flagged = agree(channel.comm, collective, request.fields(key, step),
                                request.error, [("nonfinite", request.nonfinite)],
                                wait=channel.wait)
            if flagged["nonfinite"]:
                raise NonFiniteError(f"NaN or Inf in the input of rank(s) "
                                     f"{flagged['nonfinite']} to {collective} "
                                     "(check_finite=True)")
            threads = channel_budget(channel)[0]  # collective at a channel's first call
            algorithm = request.resolve(channel)
            if record is not None:
                record[algorithm, request.reason] += 1
            # MPI's own allreduce runs no kernel: it needs no thread budget (setting one
            # costs more than a small call's reduction)
            reducing = channel.traffic()
            with budgeted(None if algorithm == "mpi" else threads):
                total = _reduce(channel, feedback, request, algorithm, key, step, tag)
            if request.codec.identity:  # its payloads are the values themselves: all plain
                channel.count_as_plain(reducing)
            completed = True
    finally:
        # the whole call as one event, once the channel is released (if it was taken)
        if tag is not None and trace.recording():
            _trace_call(channel, request, key, algorithm, began, before, completed)
    options, codec, p = request.options, request.codec, channel.size
    # an allgather sums nothing: a Communicator's default op "mean" does not apply to it
    mean = options.op == "mean" and collective != "allgather"
    if mean and not codec.predivide_mean and p > 1:
        total = total / p
    result = total
    if total.dtype != request.x.dtype:
        with np.errstate(over="ignore"):
            result = total.astype(request.x.dtype)
    # float16 input is summed in float32: a sum beyond float16 is an overflow (and the
    # same on every rank), not a silent Inf
    if result.dtype.itemsize < total.dtype.itemsize and not all_finite(result) \
            and all_finite(total):
        raise CompressionOverflowError(
            f"the sum does not fit {request.x.dtype}: use op='mean', scale the input down, "
            "or reduce float32")
    return result.reshape(request.x.shape) if collective == "allreduce" else result


def _trace_call(channel, request, key, algorithm, began, before, completed):
    """Record the whole call as a timeline event (:mod:`ccl.trace`)."""
    ok = request.error is None
    sent, plain = channel.traffic()
    trace.add(request.collective if key is None else str(key), request.collective, began,
              trace.now(), collective=request.collective, key=None if key is None else str(key),
              codec=None if request.codec is None else request.codec.codec_id,
              algorithm=algorithm, bytes=int(request.x.nbytes) if ok else None,
              bytes_sent=int(sent - before[0]), plain_bytes_sent=int(plain - before[1]),
              completed=completed)


def _reduce(channel, feedback, request, algorithm, key, step, tag):
    """Run the pieces of the call with error feedback; return the flat sum."""
    codec, flat, p = request.codec, request.flat, channel.size
    channel.use_backend(request.backend)  # device payloads: CUDA-aware MPI or staging
    channel.describe(f"{request.collective}(key={key!r}, codec={codec.codec_id!r}, "
                     f"algorithm={algorithm!r})")
    if request.options.op == "mean" and codec.predivide_mean and p > 1 \
            and request.collective != "allgather":
        flat = flat / p
    state = None
    if key is not None:
        options = request.options
        layout = (flat.size, flat.dtype.str, algorithm, codec.config_hash, p,
                  options.partition_bytes, options.min_compress_bytes, request.segment_bytes,
                  request.cross)
        state, flat = feedback.begin(key, layout, flat)
    results, skip = [], set()
    try:
        for index, (start, stop, piece_codec, piece_algorithm) in enumerate(
                pieces(request, algorithm, p)):
            piece = flat[start:stop]
            call = _call(channel, request, piece_codec, piece_algorithm, piece, key, state,
                         step, tag, start, index * p)
            # sums past the float range and NaN are reported by the payload flags
            with np.errstate(over="ignore", invalid="ignore"):
                results.append(_dispatch(call, request.collective, piece_algorithm, piece))
            skip.update(call.nonfinite_chunks)
    except BaseException:
        if state is not None:
            state.discard()
        raise
    if state is not None:
        state.commit(skip_chunks=skip)
    return results[0] if len(results) == 1 else request.backend.xp.concatenate(results)


def _call(channel, request, codec, algorithm, piece, key, state, step, tag, offset,
          chunk_base):
    call = Call.for_algorithm(ALGORITHMS[algorithm], channel, codec, piece, tag=tag, step=step,
                              key=key, state=state, offset=offset, chunk_base=chunk_base,
                              segment_bytes=request.segment_bytes)
    if algorithm == "hierarchical":
        call.cross = ALGORITHMS[request.cross]
    return call


def _dispatch(call, collective, algorithm, flat):
    """Run ``algorithm`` for ``collective`` on one piece; return its flat result."""
    if collective == "allgather":
        result = ALGORITHMS["allgather"].gather_blocks(call, flat)
    else:
        # hierarchical agrees on the statistics of each rank's slice across nodes itself
        # (those of the whole input would read the slices' residuals as the input's)
        if call.codec.shared_statistics and algorithm != "hierarchical":
            call.agree_shared_stats(flat)
        module = ALGORITHMS[algorithm]
        result = (module.allreduce(call, flat) if collective == "allreduce"
                  else module.reduce_scatter(call, flat))
    _raise_flags(call, collective)
    return result


def _raise_flags(call, collective):
    """Raise what the result's flags (and this rank's own failure) call for.

    Every rank decoded the same final payloads of an allreduce or allgather,
    so every rank sees the same flags and raises alike. A reduce-scatter rank
    decodes its own block only: it raises for what that block holds.
    """
    if call.flags & FLAG_FAILED and collective != "reduce_scatter":
        # some rank's codec failed mid-collective; every rank saw it in the result
        report_failure(call.channel.comm, collective, call.error, wait=call.channel.wait)
    if call.error is not None:
        raise call.error
    if call.flags & FLAG_FAILED:
        raise PeerError(f"another rank failed in the middle of {collective} while reducing "
                        "this rank's block; the call has no result")
    if call.flags & FLAG_OVERFLOW:
        # Every rank decoded the same final payloads, so every rank raises here.
        raise CompressionOverflowError(
            f"codec {call.codec.codec_id!r}: the sum overflowed its compressed format; use "
            "op='mean', scale the input down, or a wider codec")
