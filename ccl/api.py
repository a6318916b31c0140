"""The public collectives: ``compressed_allreduce``, ``reduce_scatter``, ``allgather``,
and the stateful :class:`Communicator`.

These are thin: each call ends in :func:`ccl.collectives.run`, which checks
that the ranks agree on the call (a rank with bad arguments raises its error,
every other rank a :class:`ccl.MismatchError`, never a hang), runs the
algorithm and shapes the result like the input. The module-level functions
keep the error-feedback state of their keys on the communicator (freed with
it); a :class:`Communicator` keeps its own, with its own default options.
"""

import collections

from mpi4py import MPI

from . import collectives
from .collectives import Options
from .feedback import ErrorFeedback
from .transport import channel as _channel
from .transport import comm_cache

__all__ = ["compressed_allreduce", "reduce_scatter", "allgather", "Communicator"]

# The module-level functions' defaults: one partition, compress everything.
_MODULE_OPTIONS = Options.make()


def _module_call(comm, collective, x, key, **options):
    comm = MPI.COMM_WORLD if comm is None else comm
    ch = _channel(comm)
    cache = comm_cache(comm)
    feedback = cache.get("feedback")  # made once, never replaced
    if feedback is None:
        with cache.lock:
            feedback = cache.setdefault("feedback", ErrorFeedback())
    return collectives.run(ch, feedback, collective, x, _MODULE_OPTIONS, key, **options)


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
    algorithm : {"auto", "ring", "tree", "direct", "allgather", "hierarchical", "mpi"}
        How chunks travel (see the algorithms page). ``"auto"`` compresses
        where that beats ``MPI_Allreduce`` at the link speed, which it
        measures once per communicator unless ``CCL_LINK_GBPS`` gives it
        (see :mod:`ccl.collectives.auto`), and on nodes of several ranks
        runs ``hierarchical`` (exact inside a node, compressed across).
        ``ring`` and ``direct`` are pipelined in segments of
        ``CCL_SEGMENT_BYTES`` payload bytes.
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
    return _module_call(comm, "allreduce", x, key, codec=codec, op=op, algorithm=algorithm,
                        check_finite=check_finite, timeout=timeout)


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
    return _module_call(comm, "reduce_scatter", x, key, codec=codec, op=op,
                        algorithm=algorithm, check_finite=check_finite, timeout=timeout)


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
    return _module_call(comm, "allgather", block, key, codec=codec, check_finite=check_finite,
                        timeout=timeout)


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
        :mod:`ccl.collectives.auto`). ``None``: ``CCL_LINK_GBPS``, else
        measured once per communicator when ``auto`` first needs it;
        ``"probe"`` measures it here, now (collective).
    cross_algorithm : str or None
        With ``algorithm="hierarchical"`` (nodes of several ranks: exact
        inside a node, compressed across), the flat algorithm across nodes
        (``"ring"``, ``"direct"``, ...). None: the one that fits the codec.
    lr_corrected : bool
        Learning-rate-corrected error feedback: after :meth:`set_lr` changes
        the rate from eta(t-1) to eta(t), each key's residuals are scaled by
        eta(t-1)/eta(t) at its next call (see ``ccl.feedback``).

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
                 segment_bytes=None, link_gbps=None, cross_algorithm=None,
                 lr_corrected=False):
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self._channel = _channel(self.comm)
        self.options = Options.make(codec, op, algorithm, check_finite, timeout,
                                    partition_bytes, min_compress_bytes, segment_bytes,
                                    link_gbps, cross_algorithm)
        if self.options.link_gbps == "probe":  # measured now, once per communicator
            self.options = self.options.replace(
                link_gbps=collectives.plan.probed_link_gbps(self._channel))
        if not isinstance(lr_corrected, bool):
            raise TypeError(f"lr_corrected must be True or False, got {lr_corrected!r}")
        self.lr_corrected = lr_corrected
        self.feedback = ErrorFeedback()
        self._calls = self._bytes_sent = 0
        self._algorithms = collections.Counter()

    @property
    def rank(self):
        """This process's rank."""
        return self._channel.rank

    @property
    def size(self):
        """Number of ranks."""
        return self._channel.size

    def stats(self):
        """Counters of this communicator's calls on this rank, and what ``auto`` decided from.

        Returns
        -------
        dict
            ``calls`` (collectives run), ``bytes_sent`` (payload bytes this
            rank put on the wire for them, ccl's own count), ``algorithms``
            (how many calls ran each algorithm, ``auto`` resolved),
            ``decisions`` (``{algorithm: {reason: calls}}``, reasons from
            :data:`ccl.collectives.auto.REASONS`, ``"given"`` for a named
            algorithm), ``auto`` (what ``auto`` decided from: link speed and
            its source, latency, nodes, share of a core; None until needed,
            :func:`ccl.collectives.link.profile`), ``link_gbps`` (its link
            speed, or the one given) and ``threads``
            (the numba threads this rank's kernels use, :mod:`ccl.threads`;
            None before the first call, or when ``NUMBA_NUM_THREADS``
            decides).

        Examples
        --------
        >>> import numpy as np, ccl
        >>> c = ccl.Communicator(codec="fp16", algorithm="ring", min_compress_bytes=0)
        >>> _ = c.allreduce(np.ones(8, np.float32))
        >>> c.stats()["calls"], c.stats()["decisions"]
        (1, {'ring': {'given': 1}})
        """
        return {"calls": self._calls, "bytes_sent": self._bytes_sent,
                **collectives.link.decision_stats(self._channel, self._algorithms,
                                                  self.options.link_gbps)}

    def set_lr(self, lr):
        """Tell learning-rate-corrected error feedback the current learning rate (local).

        Not a collective: each rank scales only its own residuals, lazily, at
        each key's next call. Does nothing unless ``lr_corrected=True``. A rate
        of 0 leaves the residuals as they are (their last positive rate counts).

        Parameters
        ----------
        lr : float
            The learning rate of the step the next calls belong to, >= 0.

        Raises
        ------
        ValueError
            If ``lr`` is negative, NaN or infinite.
        """
        lr = float(lr)
        if not 0 <= lr < float("inf"):
            raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
        if self.lr_corrected:
            self.feedback.lr = lr

    def _call(self, collective, x, key, **overrides):
        before = self._channel.bytes_sent
        try:
            return collectives.run(self._channel, self.feedback, collective, x, self.options,
                                   key, record=self._algorithms, **overrides)
        finally:
            self._calls += 1
            self._bytes_sent += self._channel.bytes_sent - before

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
        return self._call("allreduce", x, key, op=op, algorithm=algorithm,
                          check_finite=check_finite, codec=codec)

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
        if algorithm is None and self.options.algorithm not in collectives.REDUCE_SCATTER:
            algorithm = "auto"
        return self._call("reduce_scatter", x, key, op=op, algorithm=algorithm,
                          check_finite=check_finite, codec=codec)

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
        return self._call("allgather", block, key, check_finite=check_finite, codec=codec)

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
        if not isinstance(state, dict) or "feedback" not in state:
            raise ValueError(f"not a Communicator state (a dict from state_dict()), got "
                             f"{type(state).__name__}")
        if state.get("codec") != self.codec.get_config():
            raise ValueError(f"state was saved with codec {state.get('codec')!r}, this "
                             f"communicator uses {self.codec.get_config()!r}")
        self.feedback.load_state_dict(state["feedback"])
        loader = getattr(self.codec, "load_state_dict", None)
        if callable(loader) and state.get("codec_state") is not None:
            loader(state["codec_state"])


def _option_property(name):
    def option(self):
        return getattr(self.options, name)

    def set_option(self, value):
        self.options = self.options.updated(**{name: value})

    option.__doc__ = f"The default ``{name}`` of this communicator's calls."
    return property(option, set_option)


for _name in ("codec", "op", "algorithm", "check_finite", "timeout", "partition_bytes",
              "min_compress_bytes", "segment_bytes", "link_gbps", "cross_algorithm"):
    setattr(Communicator, _name, _option_property(_name))
del _name
