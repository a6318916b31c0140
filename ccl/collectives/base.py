"""What every collective algorithm is given: a :class:`Call`.

An algorithm module (``ring``, ``tree``, ``direct``, ``allgather``) is a pair of
functions ``allreduce(call, x)`` and, where it fits, ``reduce_scatter(call, x)``,
written against this small interface: chunk views, encoding at a named lossy
point (error feedback is applied here, once for every algorithm), decoding,
homomorphic adds, and the channel's byte transport.
:func:`ccl.collectives.plan.run` builds the call after the ranks agree, and
turns the algorithm's sum into the user's result.
"""

import functools
import math

import numpy as np

from .. import trace
from .._xp import array_module
from ..codecs.context import CodecContext, all_finite
from ..feedback import OWNER, RELAY, WORKER
from ..codecs.header import (FLAG_FAILED, FLAG_NONFINITE, FLAG_OVERFLOW, Header,
                             dominant_flag)

__all__ = ["Call", "SendQueue", "WORKER", "RELAY", "OWNER", "chunk_bounds", "segment_count",
           "DEFAULT_SEGMENT_BYTES", "SEGMENT_ID_STRIDE"]


#: Payload (wire) bytes per pipeline segment of ring and direct (``CCL_SEGMENT_BYTES``):
#: about 8 ms at 1 Gbit/s, so that per-segment Python and message overheads stay small,
#: while a large chunk still has enough segments to overlap codec and transfers (1 MiB
#: beat 256 KiB for fp16 and thc at 1 Gbit/s on the emulated cluster; benchmarks-howto.md).
DEFAULT_SEGMENT_BYTES = 1 << 20
#: Segment ``k > 0`` of chunk id ``c`` has the id ``c + k * SEGMENT_ID_STRIDE``: segment 0
#: keeps the chunk's own id (unsegmented calls are unchanged), and ids stay distinct in
#: the low 32 bits that seeds use while ``c < 2**20`` and ``k < 2**12``.
SEGMENT_ID_STRIDE = 1 << 20


def chunk_bounds(n, parts):
    """Start offsets of ``numpy.array_split(range(n), parts)`` plus ``n`` (length parts+1)."""
    base, extra = divmod(n, parts)
    sizes = np.full(parts, base, dtype=np.int64)
    sizes[:extra] += 1
    bounds = np.zeros(parts + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


def segment_count(n, parts, segment_bytes, bits_per_value=32.0):
    """Segments per chunk when ``n`` elements are split into ``parts`` chunks.

    Segments are sized by their *payload*: a chunk whose payload is expected
    to take ``bits_per_value`` bits per element gets about one segment per
    ``segment_bytes`` of it, so a strongly compressing codec is not cut into
    messages too small to be worth sending separately. Every chunk gets the
    same count (chunk lengths differ by at most one), so a segment is
    identified by ``(chunk, k)`` alike on every rank. ``segment_bytes`` of 0
    or None means one segment per chunk (no pipelining).
    """
    if not segment_bytes or n == 0:
        return 1
    payload = -(-n // parts) * bits_per_value / 8
    return max(1, min(-(-n // parts), math.ceil(payload / int(segment_bytes))))


@functools.lru_cache(maxsize=256)
def _geometry(n, parts, segments):
    """``(chunk_starts, bounds)`` of a :class:`Call`, read-only.

    Remembered: repeated calls of one size (every training step) share them
    instead of building them again.
    """
    starts = chunk_bounds(n, parts)
    if segments == 1:
        bounds = starts
    else:  # every chunk split as numpy.array_split would, then concatenated
        lengths = np.diff(starts)
        sub = [starts[j] + chunk_bounds(int(lengths[j]), segments)[:-1] for j in range(parts)]
        bounds = np.concatenate(sub + [starts[-1:]])
    starts.flags.writeable = bounds.flags.writeable = False
    return starts, bounds


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
    segments : int
        Segments per chunk (pipelined ring and direct). Every codec operation
        works on a *unit*: segment ``k`` of chunk ``j`` is unit ``j * segments + k``,
        with its own lossy points, seeds and flags (segment 0 keeps the chunk's
        id); with one segment per chunk, units are the chunks.
    x : array, optional
        This rank's input (to tell an overflowing sum from non-finite input).

    Notes
    -----
    **Flags travel with the data.** A payload flagged ``NONFINITE``,
    ``OVERFLOW`` or ``FAILED`` that a rank decodes into a partial sum makes the
    payload it encodes from that sum carry the flag too, so the final payloads,
    which every rank decodes, carry every flag of every contribution. A sum
    that becomes infinite from finite contributions is flagged ``OVERFLOW``.
    An exception in the codec on one rank does not stop that rank: the unit is
    sent flagged ``FAILED`` (:meth:`fail`), the collective runs to its end on
    every rank, and then every rank raises (see :mod:`ccl.collectives.plan`).
    """

    def __init__(self, channel, codec, n, parts, tag, step, key, state, offset=0,
                 chunk_base=0, segments=1, x=None):
        self.channel = channel
        self.rank = channel.rank
        self.size = channel.size
        self.codec = codec
        self.parts, self.segments = parts, max(1, int(segments))
        self.chunk_starts, self.bounds = _geometry(int(n), int(parts), self.segments)
        self.tag = tag
        self.step = step
        self.key = key
        self.state = state if codec.error_feedback else None
        self.offset, self.chunk_base = offset, chunk_base
        self.shared = None  # per chunk: agreed statistics (homomorphic codecs)
        self.flags = 0  # OR of the flags of every payload the result was decoded from
        self.nonfinite_chunks = set()  # chunks whose result decoded to NaN
        self.input = x
        self.inherited = {}  # unit -> flags of the payloads decoded into its partial sum
        self.error = None  # the first exception of this rank's codec, if any
        # set by the planner for algorithms that run another one inside (hierarchical)
        self.cross = None
        self.segment_bytes = None

    @classmethod
    def for_algorithm(cls, module, channel, codec, x, *, tag, step, key, state, offset=0,
                      chunk_base=0, segment_bytes=None):
        """The call that runs the algorithm ``module`` on this rank's ``x`` over ``channel``.

        The one set-up of a call, for the planner and for the algorithms that
        run another one inside (``hierarchical`` across nodes): a chunked
        algorithm (``module.CHUNKED``) cuts ``x`` into one chunk per rank of
        ``channel``, each into :func:`segment_count` segments of about
        ``segment_bytes`` of payload; the others take ``x`` whole. The other
        arguments are :class:`Call`'s.
        """
        parts = channel.size if module.CHUNKED else 1
        segments = (segment_count(x.size, parts, segment_bytes, codec.bits_per_value)
                    if module.CHUNKED else 1)
        call = cls(channel, codec, x.size, parts, tag, step, key, state, offset, chunk_base,
                   segments, x=x)
        call.segment_bytes = segment_bytes
        return call

    # ------------------------------------------------------------------ chunks
    def chunk(self, x, j):
        """View of chunk ``j`` of the 1-D array ``x``."""
        return x[self.chunk_starts[j]:self.chunk_starts[j + 1]]

    def unit(self, x, u):
        """View of unit ``u`` (segment ``u % segments`` of chunk ``u // segments``) of ``x``."""
        return x[self.bounds[u]:self.bounds[u + 1]]

    def units(self, j):
        """The units of chunk ``j``, in order."""
        return range(j * self.segments, (j + 1) * self.segments)

    def unit_id(self, u):
        """Chunk id of unit ``u``: names its lossy points, seeds and flags."""
        j, k = divmod(u, self.segments)
        return self.chunk_base + j + k * SEGMENT_ID_STRIDE

    def context(self, j):
        """The :class:`~ccl.codecs.CodecContext` for unit ``j`` on this rank."""
        shared = None if self.shared is None else self.shared[j]
        return CodecContext(step=self.step, key=self.key, chunk=self.unit_id(j),
                            rank=self.rank,
                            shared=shared, n=int(self.bounds[j + 1] - self.bounds[j]))

    # ------------------------------------------------------------------ codec
    def encode(self, values, j, role):
        """Encode ``values`` (unit ``j``) at lossy point ``(role, j)`` with error feedback."""
        if not trace.recording():
            return self._encode(values, j, role)
        with trace.span("ENCODE", self.codec.codec_id, unit=int(j), role=role) as args:
            payload = self._encode(values, j, role)
            args.update(bytes=int(values.nbytes), payload_bytes=int(payload.nbytes))
        return payload

    def _encode(self, values, j, role):
        inherited = self.inherited.pop(j, 0)
        if inherited:  # the partial sum holds flagged data: pass the flag on, unencoded
            return self.flagged(dominant_flag(inherited), j, values)
        ctx = self.context(j)
        point = (role, self.unit_id(j))
        try:
            residual = None if self.state is None else self.state.residual(point)
            if residual is not None and residual.shape != values.shape:
                raise ValueError(f"the error-feedback residual of key {self.key!r} at {point} "
                                 f"has {residual.size} elements for a chunk of {values.size}: "
                                 "its state was loaded from another configuration")
            target = values if residual is None else values + residual
            payload = self.codec.encode(target, ctx)
            if self.state is None:
                flags = Header.unpack(payload).flags
            else:
                decoded, header = self.codec.decode_with_header(payload, ctx)
                flags = header.flags
        except Exception as exc:  # every rank must still finish the collective
            self.fail(exc)
            return self.flagged(FLAG_FAILED, j, values)
        if flags & FLAG_NONFINITE and self._own_input_finite(j, values):
            # finite contributions, infinite sum: the format overflowed, not the input
            return self.flagged(FLAG_OVERFLOW, j, values)
        if not flags and self.state is not None:
            # A non-finite or overflowed unit leaves the residual as it was (not poisoned).
            self.state.stage(point, self.offset + int(self.bounds[j]),
                             self.offset + int(self.bounds[j + 1]),
                             (target - decoded).astype(target.dtype, copy=False))
        return payload

    def _own_input_finite(self, j, values):
        own = values if self.input is None else self.unit(self.input, j)
        return all_finite(own)

    def flagged(self, flag, j, like):
        """A header-only payload for unit ``j`` flagged ``flag``, in ``like``'s array module."""
        n = int(self.bounds[j + 1] - self.bounds[j])
        payload = self.codec.flagged_payload(n, flag)
        xp = array_module(like)
        return payload if xp is np else xp.asarray(payload)

    def fail(self, exc):
        """Record that this rank's codec raised ``exc`` (the first one is reported)."""
        if self.error is None:
            self.error = exc

    def _decode(self, payload, j):
        """``(values, flags)`` of a payload of unit ``j``; NaN and None if decoding raised."""
        if trace.recording():
            with trace.span("DECODE", self.codec.codec_id, unit=int(j),
                            payload_bytes=int(payload.nbytes)):
                return self._decode_unit(payload, j)
        return self._decode_unit(payload, j)

    def _decode_unit(self, payload, j):
        try:
            values, header = self.codec.decode_with_header(payload, self.context(j))
            return values, header.flags
        except Exception as exc:
            self.fail(exc)
            n = int(self.bounds[j + 1] - self.bounds[j])
            return array_module(payload).full(n, np.nan, dtype=np.float32), None

    def decode(self, payload, j):
        """Decode an intermediate payload of unit ``j``; its flags pass to the unit's sum."""
        values, flags = self._decode(payload, j)
        flags = FLAG_FAILED if flags is None else flags
        if flags:
            self.inherited[j] = self.inherited.get(j, 0) | flags
        return values

    def decode_result(self, payload, j):
        """Decode a payload the result is made of; remembers its flags for the final check.

        A payload this rank fails to decode is its own failure (``error``),
        not a flag: the other ranks decode the same bytes without it.
        """
        values, flags = self._decode(payload, j)
        if flags is not None:
            self.note_flags(flags, j)
        return values

    def sum_results(self, payloads, j, total):
        """Add the decoded result payloads of unit ``j`` into ``total``, in order.

        Their flags combine as :meth:`ccl.codecs.Codec.add` combines them:
        ``NONFINITE`` wins over ``OVERFLOW``. One rank's NaN makes the agreed
        statistics of a shared-statistics codec (THC's norm) infinite, which
        flags the other ranks' payloads ``OVERFLOW``; the unit is NaN, not an
        overflow, as it is where the payloads are added encoded.
        """
        combined = 0
        for payload in payloads:
            values, flags = self._decode(payload, j)
            total += values
            combined |= 0 if flags is None else flags
        if combined & FLAG_NONFINITE:
            combined &= ~FLAG_OVERFLOW
        self.note_flags(combined, j)
        return total

    def decode_into(self, out, payload, j):
        """Decode a result payload of unit ``j`` into its place in ``out``."""
        self.unit(out, j)[:] = self.decode_result(payload, j)

    def result_with_own(self, x, owned):
        """A new array like ``x`` with this rank's own chunk decoded from ``owned`` in place.

        The other chunks are filled by the algorithm as their payloads arrive.
        """
        out = array_module(x).empty_like(x)
        for payload, u in zip(owned, self.units(self.rank)):
            self.decode_into(out, payload, u)
        return out

    def own_chunk(self, owned, exact):
        """This rank's chunk of a reduce-scatter: ``exact`` if there is one, else decoded.

        ``owned`` are the payloads of the rank's units (a homomorphic sum exists
        only encoded); units whose exact sum is not finite are marked NaN.
        """
        units = self.units(self.rank)
        if exact is None:
            parts = [self.decode_result(payload, u) for payload, u in zip(owned, units)]
            return array_module(parts[0]).concatenate(parts)
        start, isfinite = self.bounds[units[0]], array_module(exact).isfinite
        for u in units:
            self.note_flags(self.inherited.pop(u, 0), u)  # the sum holds flagged data
            if not isfinite(exact[self.bounds[u] - start:self.bounds[u + 1] - start]).all():
                self.mark_nonfinite(u)
        return exact

    def take_over(self, inner):
        """Make the result of ``inner`` (a call run inside this one) part of this call's."""
        self.flags |= inner.flags
        self.nonfinite_chunks |= inner.nonfinite_chunks
        if inner.error is not None:
            self.fail(inner.error)

    def note_flags(self, flags, j):
        """Remember the flags of a payload of unit ``j`` that the result is made of."""
        self.flags |= flags
        if flags & FLAG_NONFINITE:
            self.mark_nonfinite(j)

    def mark_nonfinite(self, j):
        """Record that unit ``j``'s result is NaN (its residuals stay as they were)."""
        self.nonfinite_chunks.add(self.unit_id(j))

    def add(self, a, b, j):
        """Homomorphic sum of two payloads of unit ``j``.

        Flags combine; ``FAILED`` if it raises.
        """
        with trace.span("ADD", self.codec.codec_id, unit=int(j)):
            return self._add(a, b, j)

    def _add(self, a, b, j):
        try:
            return self.codec.add(a, b, self.context(j))
        except Exception as exc:
            self.fail(exc)
            return self.flagged(FLAG_FAILED, j, a)

    def agree_shared_stats(self, x):
        """Agree on the codec's per-unit statistics of ``x`` (one small MAX allreduce).

        Each unit's statistics are taken of its worker input (with its
        residual), reduced with MAX over the ranks and handed to the codec as
        ``ctx.shared``.
        """
        stats = []
        for j in range(len(self.bounds) - 1):
            values = self.unit(x, j)
            residual = (None if self.state is None
                        else self.state.residual((WORKER, self.unit_id(j))))
            stats.append(self.codec.shared_stats(values if residual is None
                                                 else values + residual))
        lengths = [s.size for s in stats]
        local = np.concatenate(stats) if stats else np.empty(0)
        # MAX with a NaN operand depends on the reduction order, so ranks could agree on
        # different values; +Inf is a maximum everywhere, and every rank then flags the unit
        local[~np.isfinite(local)] = np.inf
        agreed = self.channel.allreduce_max(local)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.shared = [agreed[offsets[j]:offsets[j + 1]] for j in range(len(stats))]


class SendQueue:
    """Nonblocking sends in flight during a pipelined collective.

    Keeps each payload alive until its send completes, lets the algorithm
    nudge MPI's progress between segments (:meth:`poll`), and waits for the
    rest at the end (:meth:`wait_all`) against the channel's deadline.
    """

    __slots__ = ("channel", "_pending")

    def __init__(self, channel):
        self.channel = channel
        self._pending = []

    def send(self, payload, dest, tag):
        """Start sending ``payload`` to ``dest``."""
        self._pending.append((self.channel.isend(payload, dest, tag), dest, payload))

    def poll(self):
        """Complete the sends that are done, oldest first, without blocking."""
        done = 0
        for request, _, _ in self._pending:
            if not request.Test():
                break
            done += 1
        del self._pending[:done]

    def wait_all(self):
        """Wait for every send still in flight."""
        for request, dest, _ in self._pending:
            self.channel.wait(request, f"the send to rank {dest}")
        self._pending = []
