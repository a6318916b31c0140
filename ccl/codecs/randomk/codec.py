"""The ``randomk`` codec: k values at indices every rank draws from a shared seed.

All ranks draw the same k distinct indices from ``ctx.seed(seed)``, which
depends on (seed, step, key, chunk) and never on the rank, so only the
values travel and two payloads add exactly as float32 vectors: the codec is
homomorphic and any ring or tree can sum payloads without a lossy relay.

The indices come from a counter-based generator (SplitMix64 of the seed and
a draw counter) with no state carried between calls: a rank that skips a
step cannot fall out of step. Robert Floyd's algorithm marks ``m = min(k,
d - k)`` distinct indices in a bitmap of ``d`` bits (when ``k > d/2`` the
``d - k`` marked indices are the ones left out), and a parallel scan of the
bitmap lists the chosen indices in ascending order: ``O(min(k, d - k) +
d / 64)`` work and ``d / 8`` bytes of scratch, no sort.

Body layout (little-endian, after the 32-byte header)::

    offset 0   uint64   k, the number of values (depends only on n and the config)
    offset 8   uint32   seed hash: low 32 bits of SplitMix64 output number n of the
                        stream seeded with ctx.seed(seed) (n = element count)
    offset 12  uint8    1 if the values were multiplied by n / k (``scale=True``), else 0
    offset 13  3 bytes  zero (keeps the values 4-byte aligned)
    offset 16  k float32 values, in ascending index order
"""

from __future__ import annotations

import struct

import numpy as np

from ...errors import PayloadError
from .._shared_kernels import stream64
from ..base import Codec
from ..header import FLAG_OVERFLOW, MAX_UNCHECKED_ELEMENTS
from ..registry import register_codec
from ._kernels import gather, gather_unscaled, sample_sorted, scatter

__all__ = ["RandomKCodec", "randomk_indices"]

_BODY = struct.Struct("<QIB3x")
def randomk_indices(seed, d, k):
    """The ``k`` indices in ``[0, d)`` that every rank draws from ``seed``, ascending.

    Parameters
    ----------
    seed : int
        A 64-bit seed, usually ``ctx.seed(codec.seed)``.
    d : int
        Number of candidates.
    k : int
        Number of indices, ``0 <= k <= d``.

    Returns
    -------
    numpy.ndarray
        int64 array of ``k`` distinct sorted indices.
    """
    if not 0 <= k <= d:
        raise ValueError(f"need 0 <= k <= d, got k={k}, d={d}")
    out = np.empty(k, dtype=np.int64)
    if k:
        sample_sorted(np.uint64(seed), d, k, out)
    return out


def _seed_hash(seed, d):
    # Covers the element count too, so a corrupted count is caught before allocating.
    return int(stream64(np.uint64(seed), np.uint64(d))) & 0xFFFFFFFF


@register_codec
class RandomKCodec(Codec):
    """k values per chunk at indices drawn from a seed shared by all ranks.

    Parameters
    ----------
    density : float, optional
        Fraction of the values sent, ``0 < density <= 1``: a chunk of ``d``
        values sends ``k = max(1, round(density * d))`` (at most ``d``).
        Default 0.01 when ``k`` is not given.
    k : int, optional
        Number of values sent per chunk (``>= 1``; chunks smaller than ``k``
        send every value). Give ``density`` or ``k``, not both.
    seed : int
        Base seed (``>= 0``); the indices also depend on step, key and chunk.
    scale : bool or None
        ``True`` multiplies the values by ``d / k``, the unbiased estimator
        for use without error feedback. ``None`` (default) or ``False`` sends
        them unscaled, for use with the collectives' error feedback, which
        keeps every value not sent in the residual.

    Notes
    -----
    Homomorphic and exact: :meth:`~ccl.codecs.Codec.add` sums two value vectors in float32, and
    ``decode(add(a, b)) == decode(a) + decode(b)`` bit for bit. 32 bits per
    value sent (``32 k / d`` per element) plus a 16-byte body header. Decode
    needs the encode's step, key and chunk (as the collectives pass them);
    another context is detected by the seed hash and raises
    :class:`ccl.PayloadError`.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> codec = get_codec("randomk", k=3)
    >>> x = np.arange(10, dtype=np.float32)
    >>> y = codec.decode(codec.encode(x))
    >>> int(np.count_nonzero(y)) <= 3 and bool(np.isin(y[y != 0], x).all())
    True
    """

    codec_id = "randomk"
    wire_id = 9
    device_twin = "ccl.codecs.randomk._cuda:RandomKTwin"  # see ccl.codecs.device
    homomorphic = True
    error_feedback = True
    encode_gbps, decode_gbps = 11.92, 6.07

    @property
    def bits_per_value(self):
        """Expected payload bits per value: a float32 per kept value (indices are shared)."""
        return 32.0 * self.density if self.density is not None else 32.0

    def __init__(self, density: float | None = None, k: int | None = None, seed: int = 0,
                 scale: bool | None = None) -> None:
        if density is not None and k is not None:
            raise ValueError("randomk: give either density or k, not both")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
                raise ValueError(f"randomk: k must be an int >= 1, got {k!r}")
            k = int(k)
        else:
            density = 0.01 if density is None else density
            if isinstance(density, bool) or not isinstance(density, (int, float, np.number)) \
                    or not 0 < float(density) <= 1:
                raise ValueError(f"randomk: density must be a number with 0 < density <= 1, "
                                 f"got {density!r}")
            density = float(density)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"randomk: seed must be an int >= 0, got {seed!r}")
        if scale is not None and not isinstance(scale, (bool, np.bool_)):
            raise ValueError(f"randomk: scale must be True, False or None, got {scale!r}")
        self.density = density
        self.k = k
        self.seed = int(seed)
        self.scale = None if scale is None else bool(scale)

    def check_error_feedback(self):
        """Refuse ``scale=True`` with error feedback: scaled values overshoot the residual.

        Raises
        ------
        ValueError
            If ``scale`` is True: each sent value is multiplied by ``d/k``
            and the residual ``p - decode(c)`` then holds ``-(d/k - 1)`` times
            it, which grows without bound.
        """
        if self.scale:
            raise ValueError(
                "randomk: scale=True with error feedback (a call with key=) diverges: the "
                "residual takes back the d/k scaling at every step. Use scale=False (the "
                "default) with key=, or scale=True without key= (unbiased, no residual)")

    def count(self, d):
        """Number of values sent for a chunk of ``d`` elements.

        Parameters
        ----------
        d : int
            Elements in the chunk.

        Returns
        -------
        int
            ``k`` for this chunk (0 for an empty chunk).
        """
        if d == 0:
            return 0
        if self.k is not None:
            return min(self.k, d)
        return min(d, max(1, int(round(self.density * d))))

    def indices(self, d, ctx):
        """The sorted indices a chunk of ``d`` elements sends under ``ctx``.

        Parameters
        ----------
        d : int
            Elements in the chunk.
        ctx : CodecContext
            Step, key and chunk of the encode (every rank draws the same).

        Returns
        -------
        numpy.ndarray
            :meth:`count` sorted integer indices into the chunk.
        """
        return randomk_indices(ctx.seed(self.seed), d, self.count(d))

    def _encode(self, x, ctx):
        d = x.size
        k = self.count(d)
        seed = ctx.seed(self.seed)
        idx = randomk_indices(seed, d, k)
        body = np.empty(_BODY.size + 4 * k, dtype=np.uint8)
        body[:_BODY.size] = self._body_head(k, seed, d)
        values = body[_BODY.size:].view(np.float32)
        if not k:
            return body, 0
        if self.scale:
            gather(x, idx, d / k, values)
        else:
            gather_unscaled(x, idx, values)
        # float64 input beyond the float32 range, or a scaled value beyond it
        if x.dtype != np.float32 or self.scale:
            if not np.isfinite(values).all():
                return np.empty(0, np.uint8), FLAG_OVERFLOW
        return body, 0

    def _parse(self, header, body):
        """Validate a body against its header; return ``(k, seed_hash, values)``."""
        if body.size < _BODY.size:
            raise PayloadError(f"randomk: body of {body.size} bytes is shorter than its "
                               f"{_BODY.size}-byte header")
        k, seed_hash, scaled = _BODY.unpack(body[:_BODY.size].tobytes())
        if body[13:_BODY.size].any():
            raise PayloadError("randomk: reserved body bytes are not zero")
        if scaled != int(bool(self.scale)):
            raise PayloadError(f"randomk: payload scaled flag {scaled} does not match the "
                               f"codec's scale={self.scale!r}")
        expected = self.count(header.n)
        if k != expected or body.size != _BODY.size + 4 * k:
            raise PayloadError(f"randomk: payload holds {k} values in {body.size} bytes for "
                               f"{header.n} elements; this codec sends {expected}")
        values = body[_BODY.size:].view(np.float32)
        if not np.isfinite(values).all():
            raise PayloadError("randomk: payload holds non-finite values")
        return k, seed_hash, values

    def _parse_for(self, header, body, ctx):
        """:meth:`_parse` plus the checks against the decoding context; ``(k, values, seed)``."""
        # With an explicit k the body size does not bound n: without the receiver's
        # expected count (ctx.n, checked by the base class) cap what may be allocated.
        if ctx.n is None and header.n > MAX_UNCHECKED_ELEMENTS:
            raise PayloadError(f"randomk: payload claims {header.n} elements; pass "
                               "CodecContext(n=...) to decode payloads this large")
        k, seed_hash, values = self._parse(header, body)
        seed = ctx.seed(self.seed)
        if seed_hash != _seed_hash(seed, header.n):
            raise PayloadError("randomk: payload was drawn with another seed, step, key or chunk "
                               "than the context it is decoded with")
        return k, values, seed

    def _body_head(self, k, seed, d):
        return np.frombuffer(_BODY.pack(k, _seed_hash(seed, d), int(bool(self.scale))),
                             dtype=np.uint8)

    def _decode(self, header, body, ctx):
        k, values, seed = self._parse_for(header, body, ctx)
        out = np.zeros(header.n, dtype=np.float32)
        if k:
            scatter(values, randomk_indices(seed, header.n, k), out)
        return out

    def _add(self, ha, a_body, hb, b_body, ctx):
        _, hash_a, va = self._parse(ha, a_body)
        _, hash_b, vb = self._parse(hb, b_body)
        if hash_a != hash_b:
            raise PayloadError("randomk: cannot add payloads drawn with different seeds "
                               "(another step, key, chunk or seed)")
        contributors = ha.contributors + hb.contributors
        body = a_body.copy()
        with np.errstate(over="ignore"):  # overflow is reported by the flag below
            np.add(va, vb, out=body[_BODY.size:].view(np.float32))
        if not np.isfinite(body[_BODY.size:].view(np.float32)).all():
            return self.flagged_payload(ha.n, FLAG_OVERFLOW, contributors, dtype=ha.dtype)
        return self.pack(body, ha.n, contributors=contributors, dtype=ha.dtype)
