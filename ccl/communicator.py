"""The stateful :class:`Communicator`: default options and its own error-feedback state.

A :class:`Communicator` holds an :class:`ccl.collectives.Options` as the
defaults of its calls (one property per option, each settable) and an
:class:`ccl.feedback.ErrorFeedback` with the residuals of every key it has
reduced, checkpointable with :meth:`Communicator.state_dict`. Its methods
take only the array positionally (:mod:`ccl.arguments`).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Hashable

from . import collectives, config
from ._xp import ArrayT
from .arguments import CodecLike, array_first, by_look, world_or
from .collectives import Options
from .collectives.auto import MIN_COMPRESS_BYTES
from .feedback import ErrorFeedback
from .transport import channel as _channel

if TYPE_CHECKING:
    from mpi4py import MPI

    from .codecs import Codec

__all__ = ["Communicator", "PARTITION_BYTES"]

#: A :class:`Communicator`'s default ``partition_bytes`` (its default
#: ``min_compress_bytes`` is ``auto``'s, :data:`ccl.collectives.auto.MIN_COMPRESS_BYTES`).
PARTITION_BYTES = 4_096_000

# The order the options once had as positional arguments: what an extra positional
# argument most likely meant (see ccl.arguments).
_INIT_ORDER = ("algorithm", "op", "check_finite", "timeout", "partition_bytes",
               "min_compress_bytes", "segment_bytes", "link_gbps", "cross_algorithm",
               "lr_corrected")
_CALL_ORDER = ("key", "op", "algorithm", "check_finite", "codec")
_ALLGATHER_ORDER = ("key", "check_finite", "codec")


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
        ``"probe"``: the same as ``None`` (measured in the first call that needs it).
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

    @array_first(2, by_look(_INIT_ORDER), "ccl.Communicator(comm, codec", method=True)
    def __init__(self, comm: MPI.Intracomm | None = None, codec: CodecLike = None, *,
                 algorithm: str = Options.algorithm, op: str = Options.op,
                 check_finite: bool = Options.check_finite, timeout: float | None = None,
                 partition_bytes: int | None = PARTITION_BYTES,
                 min_compress_bytes: int | None = MIN_COMPRESS_BYTES,
                 segment_bytes: int | None = None, link_gbps: float | str | None = None,
                 cross_algorithm: str | None = None, lr_corrected: bool = False) -> None:
        self.comm = world_or(comm, "ccl.Communicator(codec=...)")
        self._channel = _channel(self.comm)
        self.options = Options.make(
            codec=codec, op=op, algorithm=algorithm, check_finite=check_finite,
            timeout=timeout, partition_bytes=partition_bytes,
            min_compress_bytes=min_compress_bytes, segment_bytes=segment_bytes,
            link_gbps=link_gbps, cross_algorithm=cross_algorithm)
        if not isinstance(lr_corrected, bool):
            raise TypeError(f"lr_corrected must be True or False, got {lr_corrected!r}")
        self.lr_corrected = lr_corrected
        self.feedback = ErrorFeedback()
        self._calls = self._bytes_sent = self._bytes_plain = 0
        self._algorithms: collections.Counter[str] = collections.Counter()

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._channel.rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._channel.size

    def stats(self) -> dict[str, Any]:
        """Counters of this communicator's calls on this rank, and what ``auto`` decided from.

        Returns
        -------
        dict
            ``calls`` (collectives run), ``bytes_sent`` (payload bytes this
            rank put on the wire for them, ccl's own count), split into
            ``bytes_compressed`` (payloads of a compressing codec) and
            ``bytes_plain`` (sent uncompressed: the MPI library's own
            collectives, counted as a ring moves them, and identity codecs'
            payloads), ``algorithms``
            (how many calls ran each algorithm, ``auto`` resolved),
            ``decisions`` (``{algorithm: {reason: calls}}``, reasons from
            :data:`ccl.collectives.auto.REASONS`, ``"given"`` for a named
            algorithm), ``auto`` (what ``auto`` decided from: link speed and
            its source, latency, nodes, share of a core; None until needed,
            :func:`ccl.collectives.link.profile`), ``link_gbps`` (the link
            speed ``auto`` uses: ``link_gbps=``, else ``CCL_LINK_GBPS``, else
            the one it measured; None until measured) and ``threads`` (the
            numba threads this rank's kernels run on, :mod:`ccl.threads`, at
            most numba's pool size; None before the first call, or when
            ``NUMBA_NUM_THREADS`` decides).

        Examples
        --------
        >>> import numpy as np, ccl
        >>> c = ccl.Communicator(codec="fp16", algorithm="ring", min_compress_bytes=0)
        >>> _ = c.allreduce(np.ones(8, np.float32))
        >>> c.stats()["calls"], c.stats()["decisions"]
        (1, {'ring': {'given': 1}})
        """
        link = self.options.link_gbps
        link = config.read_or_none("CCL_LINK_GBPS") if link is None else link  # as the calls
        return {"calls": self._calls, "bytes_sent": self._bytes_sent,
                "bytes_compressed": self._bytes_sent - self._bytes_plain,
                "bytes_plain": self._bytes_plain,
                **collectives.link.decision_stats(self._channel, self._algorithms, link)}

    def set_lr(self, lr: float) -> None:
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

    def _call(self, collective: str, x: ArrayT, key: Hashable | None,
              **overrides: Any) -> ArrayT:
        channel = self._channel
        before, plain_before = channel.bytes_sent, channel.plain_bytes_sent
        try:
            return collectives.run(channel, self.feedback, collective, x, self.options,
                                   key, record=self._algorithms, **overrides)
        finally:
            self._calls += 1
            self._bytes_sent += channel.bytes_sent - before
            self._bytes_plain += channel.plain_bytes_sent - plain_before

    @array_first(1, by_look(_CALL_ORDER), "c.allreduce(x", method=True)
    def allreduce(self, x: ArrayT, *, key: Hashable | None = None, op: str | None = None,
                  algorithm: str | None = None, check_finite: bool | None = None,
                  codec: CodecLike = None, timeout: float | None = None) -> ArrayT:
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
        timeout : float, optional
            Override the communicator's timeout (seconds) for this call.

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
                          check_finite=check_finite, codec=codec, timeout=timeout)

    @array_first(1, by_look(_CALL_ORDER), "c.reduce_scatter(x", method=True)
    def reduce_scatter(self, x: ArrayT, *, key: Hashable | None = None, op: str | None = None,
                       algorithm: str | None = None, check_finite: bool | None = None,
                       codec: CodecLike = None, timeout: float | None = None) -> ArrayT:
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
        timeout : float, optional
            Override the communicator's timeout (seconds) for this call.

        Returns
        -------
        numpy.ndarray
            This rank's 1-D block of the result.
        """
        if algorithm is None and self.options.algorithm not in collectives.REDUCE_SCATTER:
            algorithm = "auto"
        return self._call("reduce_scatter", x, key, op=op, algorithm=algorithm,
                          check_finite=check_finite, codec=codec, timeout=timeout)

    @array_first(1, by_look(_ALLGATHER_ORDER), "c.allgather(block", method=True)
    def allgather(self, block: ArrayT, *, key: Hashable | None = None,
                  check_finite: bool | None = None, codec: CodecLike = None,
                  timeout: float | None = None) -> ArrayT:
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
        timeout : float, optional
            Override the communicator's timeout (seconds) for this call.

        Returns
        -------
        numpy.ndarray
            The 1-D concatenation of every rank's block.
        """
        return self._call("allgather", block, key, check_finite=check_finite, codec=codec,
                          timeout=timeout)

    def state_dict(self) -> dict[str, Any]:
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

    def load_state_dict(self, state: dict[str, Any]) -> None:
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

    @property
    def codec(self) -> Codec:
        """ccl.codecs.Codec: The codec of every call (set: a codec, its id or config)."""
        return self.options.codec

    @codec.setter
    def codec(self, value: CodecLike) -> None:
        self.options = self.options.updated(codec=value)

    @property
    def op(self) -> str:
        """str: The default op, ``"sum"`` or ``"mean"``."""
        return self.options.op

    @op.setter
    def op(self, value: str) -> None:
        self.options = self.options.updated(op=value)

    @property
    def algorithm(self) -> str:
        """str: The default algorithm of :meth:`allreduce`."""
        return self.options.algorithm

    @algorithm.setter
    def algorithm(self, value: str) -> None:
        self.options = self.options.updated(algorithm=value)

    @property
    def check_finite(self) -> bool:
        """bool: Whether calls raise :class:`ccl.NonFiniteError` on NaN/Inf input by default."""
        return self.options.check_finite

    @check_finite.setter
    def check_finite(self, value: bool) -> None:
        self.options = self.options.updated(check_finite=value)

    @property
    def timeout(self) -> float | None:
        """float or None: Seconds a call waits for a peer (None: ``CCL_TIMEOUT``)."""
        return self.options.timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self.options = self.options.updated(timeout=value)

    @property
    def partition_bytes(self) -> int | None:
        """int or None: The largest partition of an allreduce, in bytes (None: one)."""
        return self.options.partition_bytes

    @partition_bytes.setter
    def partition_bytes(self, value: int | None) -> None:
        self.options = self.options.updated(partition_bytes=value)

    @property
    def min_compress_bytes(self) -> int | None:
        """int or None: Tensors and partitions under this many bytes go uncompressed."""
        return self.options.min_compress_bytes

    @min_compress_bytes.setter
    def min_compress_bytes(self, value: int | None) -> None:
        self.options = self.options.updated(min_compress_bytes=value)

    @property
    def segment_bytes(self) -> int | None:
        """int or None: Payload bytes per pipeline segment (None: ``CCL_SEGMENT_BYTES``)."""
        return self.options.segment_bytes

    @segment_bytes.setter
    def segment_bytes(self, value: int | None) -> None:
        self.options = self.options.updated(segment_bytes=value)

    @property
    def link_gbps(self) -> float | str | None:
        """float, str or None: The link speed ``auto`` weighs compression against, as given."""
        return self.options.link_gbps

    @link_gbps.setter
    def link_gbps(self, value: float | str | None) -> None:
        self.options = self.options.updated(link_gbps=value)

    @property
    def cross_algorithm(self) -> str | None:
        """str or None: The flat algorithm ``hierarchical`` runs across nodes."""
        return self.options.cross_algorithm

    @cross_algorithm.setter
    def cross_algorithm(self, value: str | None) -> None:
        self.options = self.options.updated(cross_algorithm=value)
