"""The public collectives: ``compressed_allreduce``, ``reduce_scatter``, ``allgather``,
and the stateful :class:`Communicator`.

Every call starts with one tiny ``Allgather`` of a fixed-size signature
(collective, codec, dtype, shape, op, algorithm, and whether the rank's
arguments were valid). Ranks that disagree, or a rank whose arguments were
rejected, make *every* rank raise, instead of some ranks raising while the
others wait forever in the exchange. Then the algorithm runs on the
flattened input, and the decoded sum becomes the user's result: same shape,
dtype and array module as the input.
"""

import zlib

import numpy as np
from mpi4py import MPI

from . import collectives
from .codecs.base import Codec
from .codecs.context import all_finite
from .codecs.header import FLAG_OVERFLOW
from .codecs.registry import get_codec
from ._xp import backend_of
from .errors import CompressionOverflowError, MismatchError, NonFiniteError
from .feedback import ErrorFeedback
from .transport import channel as _channel
from .transport import default_timeout

__all__ = ["compressed_allreduce", "reduce_scatter", "allgather", "Communicator"]

_OPS = ("sum", "mean")
_ALGORITHMS = ("auto", "mpi", "ring", "tree", "direct", "allgather")
_COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))

# Signature fields exchanged before every collective, in the order they are checked.
_FIELDS = ("error", "collective", "codec", "dtype", "ndim", "shape", "op", "algorithm",
           "resolved algorithm", "nonfinite")
_ERRORS = {1: TypeError, 2: ValueError}


def _crc(value):
    return zlib.crc32(repr(value).encode("utf-8"))


class _Request:
    """One rank's arguments to a collective, validated without raising yet."""

    def __init__(self, collective, x, codec, op, algorithm, check_finite, size,
                 partition_bytes=None, min_compress_bytes=None, segment_bytes=None,
                 link_gbps=None):
        self.collective = collective
        self.partition_bytes, self.min_compress_bytes = partition_bytes, min_compress_bytes
        self.segment_bytes, self.link_gbps = segment_bytes, link_gbps
        self.error = None
        self.codec = self.x = self.flat = self.algorithm = None
        self.backend = backend_of(x)
        self.op, self.requested = op, algorithm
        self.nonfinite = False
        try:
            # the knobs' environment fallbacks may be bad on some ranks only: raised after
            # the agreement like any other argument error, so no rank is left waiting
            self.segment_bytes, self.link_gbps = _knobs(segment_bytes, link_gbps)
            self._validate(x, codec, op, algorithm, check_finite, size)
        except (TypeError, ValueError) as exc:
            self.error = exc

    def probe_link(self, channel, size):
        """Measure the link speed if ``auto`` needs it; resolve ``auto`` again with it.

        Called after the agreement: every rank then asked for the probe alike (the
        setting is in the signature), so the measurement is a collective they all
        join. Measured once per channel.
        """
        if self.link_gbps != "probe":
            return
        speed = getattr(channel, "probed_link_gbps", None)
        if speed is None:
            speed = channel.probed_link_gbps = collectives.auto.probe_link_gbps(channel.comm)
        self.link_gbps = speed
        self.algorithm = self._resolve(self.requested, size)

    def _validate(self, x, codec, op, algorithm, check_finite, size):
        self.codec = get_codec(codec)
        if op not in _OPS:
            raise ValueError(f"op must be 'sum' or 'mean', got {op!r}")
        if algorithm not in _ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(_ALGORITHMS)}; "
                             f"got {algorithm!r}")
        if not (hasattr(x, "dtype") and hasattr(x, "shape")):
            raise TypeError(f"x must be a numpy or cupy array, got {type(x).__name__}")
        xp = self.backend.xp
        self.x = x = xp.asarray(x)
        if x.dtype not in _DTYPES or x.dtype not in self.codec.input_dtypes:
            accepted = ", ".join(str(d) for d in self.codec.input_dtypes)
            raise TypeError(f"codec {self.codec.codec_id!r} reduces arrays of {accepted}; "
                            f"got {x.dtype}")
        # Work in float32 (float64 for float64 input); copies non-contiguous input.
        work = np.float64 if x.dtype == np.float64 else np.float32
        self.flat = xp.ascontiguousarray(x, dtype=work).reshape(-1)
        self.algorithm = self._resolve(algorithm, size)
        if check_finite:
            self.nonfinite = not all_finite(self.flat)

    def _resolve(self, algorithm, size):
        if self.collective == "allgather":
            return "allgather"
        if algorithm == "auto":
            return collectives.auto.choose(self.codec, self.x.nbytes, size, self.x.dtype,
                                           self.collective, self.link_gbps,
                                           bool(self.segment_bytes))
        if self.collective == "reduce_scatter" and algorithm not in collectives.REDUCE_SCATTER:
            raise ValueError(f"reduce_scatter supports algorithms "
                             f"{', '.join(sorted(collectives.REDUCE_SCATTER))} and 'auto'; "
                             f"got {algorithm!r}")
        if algorithm == "mpi" and self.x.dtype not in _DTYPES[:2]:
            raise TypeError("algorithm 'mpi' reduces float32 or float64 only (the MPI wheels "
                            "have no 16-bit float type); use 'ring'")
        return algorithm

    def signature(self):
        """The fixed-size int64 row this rank contributes to the agreement check."""
        ok = self.error is None
        error = 0 if ok else (1 if isinstance(self.error, TypeError) else 2)
        shape = tuple(self.x.shape) if ok else ()
        if self.collective == "allgather":
            shape = ()  # blocks may differ in length
        return np.array([
            error,
            _COLLECTIVES.index(self.collective),
            self.codec.config_hash if self.codec is not None else 0,
            _crc(str(self.x.dtype)) if ok else 0,
            len(shape),
            _crc(shape),
            _OPS.index(self.op) if self.op in _OPS else -1,
            _crc((self.requested, self.partition_bytes, self.min_compress_bytes,
                  self.segment_bytes, self.link_gbps)),
            _crc(self.algorithm),
            int(self.nonfinite),
        ], dtype=np.int64)

    def describe(self, name):
        """This rank's value of signature field ``name``, for error messages."""
        if name == "codec":
            return self.codec.get_config() if self.codec is not None else None
        return {"collective": self.collective, "dtype": getattr(self.x, "dtype", None),
                "ndim": getattr(self.x, "ndim", None), "shape": getattr(self.x, "shape", None),
                "op": self.op,
                "algorithm": (self.requested, self.partition_bytes, self.min_compress_bytes,
                              self.segment_bytes, self.link_gbps),
                "resolved algorithm": self.algorithm}.get(name)


def _groups(column):
    groups = {}
    for rank, value in enumerate(column.tolist()):
        groups.setdefault(value, []).append(rank)
    return groups


def _agree(channel, request):
    """Exchange signatures; raise the same error class on every rank if they disagree."""
    rows = channel.allgather_array(request.signature())
    errors = rows[:, 0]
    if errors.any():
        if request.error is not None:
            raise request.error
        bad = [int(r) for r in np.flatnonzero(errors)]
        kinds = sorted({_ERRORS[int(errors[r])].__name__ for r in bad})
        raise MismatchError(f"rank(s) {bad} rejected their arguments to {request.collective} "
                            f"({', '.join(kinds)}); see the error raised there",
                            field="arguments", ranks={"rejected": bad})
    for index, name in enumerate(_FIELDS[1:-1], start=1):
        groups = _groups(rows[:, index])
        if len(groups) > 1:
            where = "; ".join(f"ranks {ranks}" for ranks in groups.values())
            raise MismatchError(
                f"ranks disagree on the {name} of {request.collective}: {where} differ "
                f"(this rank, {channel.rank}, has {request.describe(name)!r})",
                field=name, ranks=list(groups.values()))
    bad = [int(r) for r in np.flatnonzero(rows[:, -1])]
    if bad:
        raise NonFiniteError(f"NaN or Inf in the input of rank(s) {bad} to "
                             f"{request.collective} (check_finite=True)")


def _shared_parameters(call, flat):
    """Agree on the codec's shared statistics (one small MAX allreduce), if it has any."""
    if type(call.codec).shared_stats is Codec.shared_stats:
        return
    stats = call.shared_stats(flat)
    lengths = [s.size for s in stats]
    local = np.concatenate(stats) if stats else np.empty(0)
    # MAX with a NaN operand depends on the reduction order, so ranks could agree on
    # different values; +Inf is a maximum everywhere, and every rank then flags the chunk
    local[~np.isfinite(local)] = np.inf
    agreed = call.channel.allreduce_max(local)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    call.shared = [agreed[offsets[j]:offsets[j + 1]] for j in range(len(stats))]


def _pieces(request, size):
    """Split the flat input into ``(start, stop, codec, algorithm)`` pieces.

    With ``partition_bytes`` an allreduce runs partition by partition (each
    with its own chunk map and residuals, as BytePS-Compress does); a piece
    smaller than ``min_compress_bytes`` is sent uncompressed.
    """
    flat, codec, algo = request.flat, request.codec, request.algorithm
    n, itemsize = flat.size, request.x.dtype.itemsize
    per = n
    if request.partition_bytes and request.collective == "allreduce":
        per = max(1, request.partition_bytes // itemsize)
    pieces = []
    for start in range(0, max(n, 1), max(per, 1)):
        stop = min(start + per, n)
        piece_codec, piece_algo = codec, algo
        nbytes = (stop - start) * itemsize
        if request.min_compress_bytes and nbytes < request.min_compress_bytes:
            piece_codec = get_codec("none")
            if request.collective == "allreduce":
                piece_algo = "mpi" if flat.dtype in _DTYPES[:2] else "ring"
        elif request.requested == "auto" and per < n:
            piece_algo = collectives.auto.choose(codec, nbytes, size, request.x.dtype,
                                                 request.collective, request.link_gbps,
                                                 bool(request.segment_bytes))
        pieces.append((start, stop, piece_codec, piece_algo))
    return pieces


def _knobs(segment_bytes, link_gbps):
    """Fill unset pipelining and link-speed knobs from the environment (may raise ValueError)."""
    if segment_bytes is None:
        segment_bytes = collectives.base.default_segment_bytes()
    if link_gbps is None:
        link_gbps = collectives.auto.default_link_gbps()
    return segment_bytes, link_gbps


def _run(channel, feedback, collective, x, codec, op, algorithm, key, check_finite, timeout,
         partition_bytes=None, min_compress_bytes=None, segment_bytes=None, link_gbps=None):
    """Validate, agree, run the algorithm and finish the result, on every rank alike."""
    timeout = default_timeout() if timeout is None else timeout
    tag = channel.begin(f"{collective}(key={key!r})", timeout)
    try:
        request = _Request(collective, x, codec, op, algorithm, check_finite, channel.size,
                           partition_bytes, min_compress_bytes, segment_bytes, link_gbps)
        _agree(channel, request)
        request.probe_link(channel, channel.size)
        segment_bytes = request.segment_bytes
        channel.use_backend(request.backend)  # device payloads: CUDA-aware MPI or staging
        codec, flat, algo, p = request.codec, request.flat, request.algorithm, channel.size
        channel.activity = (f"{collective}(key={key!r}, codec={codec.codec_id!r}, "
                            f"algorithm={algo!r})")
        if op == "mean" and codec.predivide_mean and p > 1:
            flat = flat / p
        state = None
        if key is not None:
            layout = (flat.size, flat.dtype.str, algo, codec.config_hash, p, partition_bytes,
                      min_compress_bytes, segment_bytes)
            state, flat = feedback.begin(key, layout, flat)
        step = state.step if state is not None else channel.calls
        pieces = _pieces(request, p)
        try:
            results, skip = [], set()
            for index, (start, stop, piece_codec, piece_algo) in enumerate(pieces):
                result, nonfinite = _dispatch(channel, collective, piece_codec,
                                              flat[start:stop], piece_algo, key, state, step,
                                              tag, offset=start, chunk_base=index * p,
                                              segment_bytes=segment_bytes)
                results.append(result)
                skip.update(nonfinite)
        except BaseException:
            if state is not None:
                state.discard()
            raise
        if state is not None:
            state.commit(skip_chunks=skip)
    finally:
        channel.end()
    total = results[0] if len(results) == 1 else request.backend.xp.concatenate(results)
    if op == "mean" and not codec.predivide_mean and p > 1:
        total = total / p
    if collective != "allreduce":
        return total.astype(request.x.dtype, copy=False)
    return total.astype(request.x.dtype, copy=False).reshape(request.x.shape)


def _dispatch(channel, collective, codec, flat, algo, key, state, step, tag, offset=0,
              chunk_base=0, segment_bytes=None):
    """Run ``algo`` for ``collective``.

    Returns the flat (summed) result and the chunks whose result is NaN
    (their residuals are not updated).
    """
    if collective == "allgather":
        call = collectives.Call(channel, codec, flat.size, 1, tag, step, key, state, offset,
                                chunk_base)
        result = collectives.allgather.gather_blocks(call, flat)
    elif algo == "mpi":
        return channel.allreduce_sum(flat), ()
    else:
        parts = channel.size if algo in collectives.CHUNKED else 1
        segments = (collectives.base.segment_count(
            flat.size, parts, segment_bytes, collectives.auto.bits_per_value(codec))
            if algo in collectives.CHUNKED else 1)
        call = collectives.Call(channel, codec, flat.size, parts, tag, step, key, state, offset,
                                chunk_base, segments)
        _shared_parameters(call, flat)
        module = collectives.ALGORITHMS[algo]
        if collective == "allreduce":
            result = module.allreduce(call, flat)
        else:
            result = module.reduce_scatter(call, flat)
    if call.flags & FLAG_OVERFLOW:
        # Every rank decoded the same final payloads, so every rank raises here.
        raise CompressionOverflowError(
            f"codec {codec.codec_id!r}: the sum overflowed its compressed format; use "
            "op='mean', scale the input down, or a wider codec")
    return result, call.nonfinite_chunks


def compressed_allreduce(x, codec=None, comm=None, op="sum", algorithm="auto", key=None,
                         check_finite=False, timeout=None):
    """Sum (or average) an array over all ranks, compressing what is sent.

    Parameters
    ----------
    x : numpy.ndarray
        float32 (float64, float16 where the codec allows) array of any shape;
        the same shape and dtype on every rank.
    codec : Codec, str, dict or None
        The codec (see :func:`ccl.codecs.get_codec`); ``None`` is no
        compression: with ``algorithm="auto"`` the MPI library's own
        ``Allreduce``.
    comm : mpi4py.MPI.Intracomm, optional
        Defaults to ``MPI.COMM_WORLD``. ccl's traffic runs on a private
        duplicate cached on it.
    op : {"sum", "mean"}
        Sum or average over ranks (``mean`` divides once, at decode).
    algorithm : {"auto", "ring", "tree", "direct", "allgather", "mpi"}
        How chunks travel (see the algorithms page). ``"auto"`` weighs compression against ``MPI_Allreduce`` at the link
        speed ``CCL_LINK_GBPS`` (unset: it does not compress float32/float64;
        see :mod:`ccl.collectives.auto`). ``ring`` and ``direct`` are
        pipelined in segments of ``CCL_SEGMENT_BYTES`` payload bytes.
    key : hashable, optional
        Names the tensor: error-feedback residuals and the step counter are
        kept per key (on the communicator) across calls.
    check_finite : bool
        Raise :class:`ccl.NonFiniteError` on every rank if any rank's input
        holds NaN or Inf. Otherwise non-finite chunks decode to NaN on every
        rank and residuals are left untouched.
    timeout : float, optional
        Seconds to wait for a peer before aborting the job with a message
        naming the collective (default: ``CCL_TIMEOUT``, else forever).

    Returns
    -------
    numpy.ndarray
        The sum (or mean), with ``x``'s shape and dtype, bitwise identical on
        every rank.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (on the offending ranks; the others raise MismatchError).
    MismatchError
        Ranks passed different shapes, dtypes, codecs, ops or algorithms.
    NonFiniteError
        NaN/Inf input with ``check_finite=True``.
    CompressionOverflowError
        The compressed sum did not fit its format (e.g. fp16 above 65504).

    Examples
    --------
    >>> import numpy as np, ccl
    >>> from mpi4py import MPI
    >>> x = np.full(4, MPI.COMM_WORLD.rank + 1.0, dtype=np.float32)
    >>> y = ccl.compressed_allreduce(x, "fp16", algorithm="ring")
    >>> p = MPI.COMM_WORLD.size
    >>> float(y[0]) == p * (p + 1) / 2        # small integers are exact in fp16
    True
    """
    ch = _channel(MPI.COMM_WORLD if comm is None else comm)
    return _run(ch, ch.feedback, "allreduce", x, codec, op, algorithm, key, check_finite,
                timeout)


def reduce_scatter(x, codec=None, comm=None, op="sum", algorithm="ring", key=None,
                   check_finite=False, timeout=None):
    """Sum an array over all ranks and return this rank's block of the result.

    The block is ``numpy.array_split(result.ravel(), comm.size)[comm.rank]``.
    Errors and semantics are those of :func:`compressed_allreduce`. The
    owner of a block keeps its exact sum (there is no final re-encode).

    Parameters
    ----------
    x : numpy.ndarray
        Array of any shape; the same shape and dtype on every rank.
    codec : Codec, str, dict or None
        The codec (see :func:`ccl.codecs.get_codec`).
    comm : mpi4py.MPI.Intracomm, optional
        Defaults to ``MPI.COMM_WORLD``.
    op : {"sum", "mean"}
        Sum or average over ranks.
    algorithm : {"ring", "direct", "auto"}
        The algorithm of the reduce-scatter phase.
    key : hashable, optional
        Names the tensor for error feedback (see :func:`compressed_allreduce`).
    check_finite : bool
        Raise :class:`ccl.NonFiniteError` on every rank for NaN/Inf input.
    timeout : float, optional
        Seconds to wait for a peer before aborting the job.

    Returns
    -------
    numpy.ndarray
        1-D block of ``x``'s dtype.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (on the offending ranks; the others raise MismatchError).
    MismatchError
        Ranks passed different shapes, dtypes, codecs, ops or algorithms.
    NonFiniteError
        NaN/Inf input with ``check_finite=True``.

    Examples
    --------
    >>> import numpy as np, ccl
    >>> from mpi4py import MPI
    >>> blk = ccl.reduce_scatter(np.ones(10, np.float32), "fp16")
    >>> bool((blk == MPI.COMM_WORLD.size).all())
    True
    """
    ch = _channel(MPI.COMM_WORLD if comm is None else comm)
    return _run(ch, ch.feedback, "reduce_scatter", x, codec, op, algorithm, key, check_finite,
                timeout)


def allgather(block, codec=None, comm=None, key=None, check_finite=False, timeout=None):
    """Gather every rank's block, compressed; return their 1-D concatenation in rank order.

    Blocks may differ in length (zero-length blocks included) but not in
    dtype. Each block is encoded once by its rank (with error feedback under
    ``key``) and decoded by every rank, so results agree bitwise.

    Parameters
    ----------
    block : numpy.ndarray
        This rank's block (flattened); the same dtype on every rank.
    codec : Codec, str, dict or None
        The codec (see :func:`ccl.codecs.get_codec`).
    comm : mpi4py.MPI.Intracomm, optional
        Defaults to ``MPI.COMM_WORLD``.
    key : hashable, optional
        Names the block for error feedback (see :func:`compressed_allreduce`).
    check_finite : bool
        Raise :class:`ccl.NonFiniteError` on every rank for NaN/Inf input.
    timeout : float, optional
        Seconds to wait for a peer before aborting the job.

    Returns
    -------
    numpy.ndarray
        1-D array of ``block``'s dtype.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (on the offending ranks; the others raise MismatchError).
    MismatchError
        Ranks passed different dtypes or codecs.
    NonFiniteError
        NaN/Inf input with ``check_finite=True``.

    Examples
    --------
    >>> import numpy as np, ccl
    >>> from mpi4py import MPI
    >>> full = ccl.allgather(np.arange(3, dtype=np.float32), "none")
    >>> full.size == 3 * MPI.COMM_WORLD.size
    True
    """
    ch = _channel(MPI.COMM_WORLD if comm is None else comm)
    return _run(ch, ch.feedback, "allgather", block, codec, "sum", "auto", key, check_finite,
                timeout)


class Communicator:
    """A communicator with a default codec and its own error-feedback state.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        Defaults to ``MPI.COMM_WORLD``.
    codec : Codec, str, dict or None
        Default codec of every call.
    algorithm : str
        Default algorithm of :meth:`allreduce`.
    op : {"sum", "mean"}
        Default op.
    check_finite : bool
        Default of ``check_finite``.
    timeout : float, optional
        Default timeout in seconds (see :func:`compressed_allreduce`).
    partition_bytes : int or None
        An allreduce runs in partitions of at most this many bytes, each with
        its own chunk map and error-feedback residuals (worker and owner), as
        BytePS-Compress does; bounds memory and keeps scales local. ``None``
        or 0: one partition.
    min_compress_bytes : int or None
        Tensors (and partitions) smaller than this are sent uncompressed,
        where latency dominates and compression cannot pay. ``None`` or 0:
        compress everything (useful in tests on tiny data).
    segment_bytes : int or None
        Ring and direct cut every chunk into segments of about this many
        payload (wire) bytes and overlap the encoding and decoding of one
        segment with the transfer of others (pipelining; see
        ``ccl.collectives.base.segment_count``). 0: one segment per
        chunk, no overlap. ``None``: ``CCL_SEGMENT_BYTES``, else 1 MiB.
    link_gbps : float, "probe" or None
        Link speed in Gbit/s for ``algorithm="auto"``'s cost model (see
        :mod:`ccl.collectives.auto`); ``"probe"`` measures it here, once,
        with a few timed ``MPI_Allreduce`` calls (collective). ``None``:
        ``CCL_LINK_GBPS``, else unknown, and then ``auto`` does not compress
        allreduces of float32/float64.

    Examples
    --------
    >>> import numpy as np, ccl
    >>> c = ccl.Communicator(codec="fp16", algorithm="ring", min_compress_bytes=0)
    >>> y = c.allreduce(np.ones(8, np.float32), key="w")
    >>> sorted(c.state_dict()["feedback"]) == ["w"]
    True
    """

    def __init__(self, comm=None, codec=None, algorithm="auto", op="sum", check_finite=False,
                 timeout=None, partition_bytes=4_096_000, min_compress_bytes=65_536,
                 segment_bytes=None, link_gbps=None):
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self._channel = _channel(self.comm)
        self.codec = get_codec(codec)
        if algorithm not in _ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(_ALGORITHMS)}; "
                             f"got {algorithm!r}")
        if op not in _OPS:
            raise ValueError(f"op must be 'sum' or 'mean', got {op!r}")
        self.algorithm, self.op = algorithm, op
        self.check_finite, self.timeout = check_finite, timeout
        for name, value in (("partition_bytes", partition_bytes),
                            ("min_compress_bytes", min_compress_bytes)):
            if value is not None and (not isinstance(value, (int, np.integer)) or value < 0):
                raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
        self.partition_bytes = int(partition_bytes) if partition_bytes else None
        self.min_compress_bytes = int(min_compress_bytes) if min_compress_bytes else None
        if segment_bytes is not None and (not isinstance(segment_bytes, (int, np.integer))
                                          or segment_bytes < 0):
            raise ValueError(f"segment_bytes must be a non-negative int or None, "
                             f"got {segment_bytes!r}")
        self.segment_bytes = None if segment_bytes is None else int(segment_bytes)
        self.link_gbps = collectives.auto.check_link_gbps(link_gbps)
        if self.link_gbps == "probe":
            self.link_gbps = collectives.auto.probe_link_gbps(self._channel.comm)
        self.feedback = ErrorFeedback()

    @property
    def rank(self):
        """This process's rank."""
        return self._channel.rank

    @property
    def size(self):
        """Number of ranks."""
        return self._channel.size

    def _call(self, collective, x, key, op, algorithm, check_finite, codec):
        return _run(self._channel, self.feedback, collective, x,
                    self.codec if codec is None else codec,
                    self.op if op is None else op,
                    self.algorithm if algorithm is None else algorithm, key,
                    self.check_finite if check_finite is None else check_finite, self.timeout,
                    self.partition_bytes, self.min_compress_bytes, self.segment_bytes,
                    self.link_gbps)

    def allreduce(self, x, key=None, op=None, algorithm=None, check_finite=None, codec=None):
        """:func:`compressed_allreduce` with this communicator's defaults and state.

        Parameters
        ----------
        x : numpy.ndarray
            Array of any shape; the same on every rank.
        key : hashable, optional
            Names the tensor: error-feedback residuals are kept per key.
        op : {"sum", "mean"}, optional
            Override the communicator's default op.
        algorithm : str, optional
            Override the communicator's default algorithm.
        check_finite : bool, optional
            Override the communicator's default.
        codec : Codec, str, dict, optional
            Override the communicator's codec for this call.

        Returns
        -------
        numpy.ndarray
            The sum (or mean), with ``x``'s shape and dtype.

        Examples
        --------
        >>> import numpy as np, ccl
        >>> c = ccl.Communicator(codec="onebit", algorithm="direct")
        >>> y = c.allreduce(np.ones(100_000, np.float32), key="layer1.weight")
        >>> y.shape
        (100000,)
        """
        return self._call("allreduce", x, key, op, algorithm, check_finite, codec)

    def reduce_scatter(self, x, key=None, op=None, algorithm=None, check_finite=None,
                       codec=None):
        """:func:`reduce_scatter` with this communicator's defaults and state.

        ``algorithm=None`` uses ``"auto"`` unless the communicator's default
        algorithm supports reduce-scatter.

        Parameters
        ----------
        x : numpy.ndarray
            Array of any shape; the same on every rank.
        key : hashable, optional
            Names the tensor: error-feedback residuals are kept per key.
        op : {"sum", "mean"}, optional
            Override the communicator's default op.
        algorithm : str, optional
            Override the communicator's default algorithm.
        check_finite : bool, optional
            Override the communicator's default.
        codec : Codec, str, dict, optional
            Override the communicator's codec for this call.

        Returns
        -------
        numpy.ndarray
            This rank's 1-D block of the result.
        """
        if algorithm is None and self.algorithm not in collectives.REDUCE_SCATTER:
            algorithm = "auto"
        return self._call("reduce_scatter", x, key, op, algorithm, check_finite, codec)

    def allgather(self, block, key=None, check_finite=None, codec=None):
        """:func:`allgather` with this communicator's defaults and state.

        Parameters
        ----------
        block : numpy.ndarray
            This rank's block.
        key : hashable, optional
            Names the tensor: error-feedback residuals are kept per key.
        check_finite : bool, optional
            Override the communicator's default.
        codec : Codec, str, dict, optional
            Override the communicator's codec for this call.

        Returns
        -------
        numpy.ndarray
            The 1-D concatenation of every rank's block.
        """
        return self._call("allgather", block, key, "sum", "auto", check_finite, codec)

    def state_dict(self):
        """Checkpointable state of this rank: codec config and error-feedback residuals.

        Error feedback is per rank: save each rank's ``state_dict()`` (e.g.
        one file per rank) and restore it on the same rank.

        Returns
        -------
        dict
            ``{"codec": config, "feedback": {key: {"layout", "step",
            "residuals"}}, "codec_state": ...}``; picklable, for checkpoint
            files (never for the wire).
        """
        codec_state = getattr(self.codec, "state_dict", None)
        return {"codec": self.codec.get_config(),
                "feedback": self.feedback.state_dict(),
                "codec_state": codec_state() if callable(codec_state) else None}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output (residuals and steps of every key).

        Parameters
        ----------
        state : dict
            What :meth:`state_dict` returned on this rank.

        Raises
        ------
        ValueError
            If the state was saved with another codec configuration, or is
            not shaped like :meth:`state_dict` output.
        """
        if state.get("codec") != self.codec.get_config():
            raise ValueError(f"state was saved with codec {state.get('codec')!r}, this "
                             f"communicator uses {self.codec.get_config()!r}")
        self.feedback.load_state_dict(state["feedback"])
        loader = getattr(self.codec, "load_state_dict", None)
        if callable(loader) and state.get("codec_state") is not None:
            loader(state["codec_state"])
