"""What every collective algorithm is given: a :class:`Call`.

An algorithm module (``ring``, ``tree``, ``direct``, ``allgather``) is a pair of
functions ``allreduce(call, x)`` and, where it fits, ``reduce_scatter(call, x)``,
written against this small interface: chunk views, encoding at a named lossy
point (error feedback is applied here, once for every algorithm), decoding,
homomorphic adds, and the channel's byte transport. The public functions in
:mod:`ccl.api` build the call, check that the ranks agree, and turn the
algorithm's sum into the user's result.
"""

import numpy as np

from ..codecs.base import FLAG_NONFINITE, CodecContext

__all__ = ["Call", "WORKER", "RELAY", "OWNER", "chunk_bounds"]

# The three kinds of lossy point (codec-specs.md §0): a rank's own contribution,
# a partial sum re-encoded on its way, and the final chunk encoded by its owner.
WORKER, RELAY, OWNER = "worker", "relay", "owner"


def chunk_bounds(n, parts):
    """Start offsets of ``numpy.array_split(range(n), parts)`` plus ``n`` (length parts+1)."""
    base, extra = divmod(n, parts)
    sizes = np.full(parts, base, dtype=np.int64)
    sizes[:extra] += 1
    bounds = np.zeros(parts + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


class Call:
    """One collective in progress on one rank.

    Parameters
    ----------
    channel : ccl.transport.Channel
    codec : ccl.codecs.Codec
    n : int
        Elements of the flattened input.
    parts : int
        Chunks the input is split into (``comm.size`` for ring and direct, 1
        for tree and allgather).
    tag : int
        Message tag of this call.
    step : int
        Step of the key (seeds shared randomness).
    key : object
        The user's key (None: no error feedback).
    state : ccl.feedback.KeyState or None
        Where residuals live; None disables error feedback.
    offset : int
        Where this call's input starts in the user's tensor (partitioned calls).
    chunk_base : int
        Id of this call's chunk 0 within the tensor (partitioned calls), so that
        residuals, seeds and flags of different partitions never collide.
    """

    def __init__(self, channel, codec, n, parts, tag, step, key, state, offset=0,
                 chunk_base=0):
        self.channel = channel
        self.rank = channel.rank
        self.size = channel.size
        self.codec = codec
        self.bounds = chunk_bounds(n, parts)
        self.tag = tag
        self.step = step
        self.key = key
        self.state = state if codec.error_feedback else None
        self.offset, self.chunk_base = offset, chunk_base
        self.shared = None  # per chunk: agreed statistics (homomorphic codecs)
        self.flags = 0  # OR of the flags of every payload the result was decoded from
        self.nonfinite_chunks = set()  # chunks whose result decoded to NaN

    # ------------------------------------------------------------------ chunks
    def chunk(self, x, j):
        """View of chunk ``j`` of the 1-D array ``x``."""
        return x[self.bounds[j]:self.bounds[j + 1]]

    def context(self, j):
        """The :class:`CodecContext` for chunk ``j`` on this rank."""
        shared = None if self.shared is None else self.shared[j]
        return CodecContext(step=self.step, key=self.key, chunk=self.chunk_base + j,
                            rank=self.rank,
                            shared=shared, n=int(self.bounds[j + 1] - self.bounds[j]))

    # ------------------------------------------------------------------ codec
    def encode(self, values, j, role):
        """Encode ``values`` (chunk ``j``) at lossy point ``(role, j)`` with error feedback."""
        ctx = self.context(j)
        if self.state is None:
            return self.codec.encode(values, ctx)
        point = (role, self.chunk_base + j)
        residual = self.state.residual(point)
        target = values if residual is None else values + residual
        payload = self.codec.encode(target, ctx)
        decoded, header = self.codec.decode_with_header(payload, ctx)
        if not header.flags:
            # A non-finite or overflowed chunk leaves the residual as it was (not poisoned).
            self.state.stage(point, self.offset + int(self.bounds[j]),
                             self.offset + int(self.bounds[j + 1]),
                             (target - decoded).astype(target.dtype, copy=False))
        return payload

    def decode(self, payload, j):
        """Decode an intermediate payload of chunk ``j`` (flags do not raise here)."""
        return self.codec.decode_with_header(payload, self.context(j))[0]

    def decode_result(self, payload, j):
        """Decode a payload the result is made of; remembers its flags for the final check."""
        values, header = self.codec.decode_with_header(payload, self.context(j))
        self.note_flags(header.flags, j)
        return values

    def note_flags(self, flags, j):
        """Remember the flags of a payload of chunk ``j`` that the result is made of."""
        self.flags |= flags
        if flags & FLAG_NONFINITE:
            self.mark_nonfinite(j)

    def mark_nonfinite(self, j):
        """Record that chunk ``j``'s result is NaN (its residuals stay as they were)."""
        self.nonfinite_chunks.add(self.chunk_base + j)

    def add(self, a, b, j):
        """Homomorphic sum of two payloads of chunk ``j``."""
        return self.codec.add(a, b, self.context(j))

    def shared_stats(self, x, parts):
        """This rank's :meth:`Codec.shared_stats` of every chunk's worker input, stacked."""
        stats = []
        for j in range(parts):
            values = self.chunk(x, j)
            residual = (None if self.state is None
                        else self.state.residual((WORKER, self.chunk_base + j)))
            stats.append(self.codec.shared_stats(values if residual is None
                                                 else values + residual))
        return stats
