"""THC: Tensor Homomorphic Compression (Li et al., NSDI 2024).

Each rank rotates its chunk with a randomized Hadamard transform (signs from a
seed shared by all ranks), scales it by the norm agreed by all ranks (a tiny
``MAX`` allreduce of :meth:`THCCodec.shared_stats`), and stochastically rounds
every coordinate to one of ``2^bits`` integer table levels in ``[0, g]``. It
sends the b-bit table *indices*. Relays and owners add payloads without
decoding: indices become integer levels, and levels add exactly in integer
lanes (8, 16 or 32 bits, widened with the contributor count). Decoding
maps the lane sums back to values and undoes the rotation.

Normalisation with blocked rotation: the input of ``n`` elements is
zero-padded to ``P`` (a multiple of ``block``) and each block of ``block``
elements gets an orthonormal Hadamard transform. When the energy of ``x`` is
spread over its ``n`` elements, a rotated coordinate of a full block has
mean square ``||x||² / n``, so rotated values are scaled by
``sqrt(n) / max_norm`` (``z ≈ N(0, ||x||²/max_norm²)``, variance at most 1)
before the clamp to ``[-T, T]``. With ``n = P`` (no padding) this is the
paper's ``sqrt(D)``; scaling by ``sqrt(P)`` instead would inflate ``z`` by
``sqrt(P/n)`` (up to 1.4x) and clamp a partly filled last block hard.
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np

from ..._xp import backend_of
from ...errors import PayloadError
from . import _kernels as _k
from ._tables import GRID_POINTS, MAX_G, clamp_t, kernel_tables, receiver_table
from ..base import Codec
from ..header import FLAG_OVERFLOW, MAX_UNCHECKED_ELEMENTS
from ..registry import register_codec

__all__ = ["THCCodec"]

# kind, lane bytes, bits, zero flag, max_norm (f32), block, seed hash, padded length
_BODY = struct.Struct("<BBBBfIIQ")
BODY_HEADER_SIZE = _BODY.size  # 24
#: The smallest clamp probability: below it ``1 - p/2`` rounds to 1 in float64 and the
#: clamp ``Φ⁻¹(1 - p/2)`` is infinite.
MIN_P = 1e-15
KIND_PACKED = 0
KIND_LANES = 1
_LANE_DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}
_MAX_BLOCK = 1 << 24


def lane_bytes(contributors, g):
    """Bytes per lane holding a sum of ``contributors`` levels in ``[0, g]`` (0: none fits)."""
    top = contributors * g
    for width in (1, 2, 4):
        if top < 1 << (8 * width):
            return width
    return 0


@register_codec
class THCCodec(Codec):
    """THC: b-bit table indices after a randomized Hadamard rotation; adds in integer lanes.

    Unbiased up to the clamp at ``±T`` standard deviations (error feedback
    absorbs the clamp). Needs a shared max norm per chunk: collectives get
    it from :meth:`shared_stats` by a tiny ``MAX`` allreduce; a standalone
    :meth:`~ccl.codecs.Codec.encode` uses the local norm.

    Parameters
    ----------
    bits : {2, 3, 4}
        Bits per coordinate on the uplink (``q = 2^bits`` table levels).
    g : int
        Table granularity: levels are integers in ``[0, g]``; ``2^bits - 1 <= g <= 1024``.
        A sum of ``n`` payloads needs ``ceil(log2(n*g + 1))``-bit lanes.
    p : float
        Two-sided clamp probability in (0, 1): coordinates are clamped at
        ``T = Φ⁻¹(1 - p/2)`` standard deviations.
    table : {"optimal", "uniform"}
        ``"optimal"``: levels chosen by the dynamic programme of
        ``ccl.codecs.thc._tables`` (the reference tables); ``"uniform"``: evenly spaced levels
        ``round(i*g/(q-1))`` on the same clamp.
    seed : int
        Rotation seed, identical on all ranks (0 to 2^32 - 1).
    block : int
        Rotation block length, a power of two from 8 to 2^24; inputs are
        zero-padded to a multiple of it.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> codec = get_codec("thc", bits=4)
    >>> x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    >>> payload = codec.encode(x)
    >>> payload.size    # 32-byte header + 24-byte body header + 1024 nibbles
    568
    >>> codec.decode(payload).shape
    (1000,)
    """

    codec_id = "thc"
    wire_id = 5
    device_twin = "ccl.codecs.thc._cuda:THCTwin"  # see ccl.codecs.device
    homomorphic = True
    error_feedback = True
    shared_statistics = True
    encode_gbps, decode_gbps = 1.14, 1.50

    @property
    def bits_per_value(self):
        """Expected payload bits per value: ``bits`` (lanes widen only past the first hop)."""
        return float(self.bits)

    def sum_bits_per_value(self, contributors):
        """Bits per value of a sum of ``contributors`` payloads: its lanes widen (8, 16, 32).

        Parameters
        ----------
        contributors : int
            How many ranks' contributions the payload holds.

        Returns
        -------
        float
            ``bits`` for one contribution, else the lane width in bits.
        """
        if contributors <= 1:
            return float(self.bits)
        return float(8 * (lane_bytes(contributors, self.g) or 4))

    def __init__(self, bits: int = 4, g: int = 15, p: float = 1 / 32, table: str = "optimal",
                 seed: int = 42, block: int = 1024) -> None:
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) \
                or bits not in (2, 3, 4):
            raise ValueError(f"THC bits must be the int 2, 3 or 4, got {bits!r}")
        q = 1 << bits
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or not q - 1 <= g <= MAX_G:
            raise ValueError(f"THC g must be an int from {q - 1} (2^bits - 1) to {MAX_G}, "
                             f"got {g!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) \
                or not MIN_P <= float(p) < 1.0:
            raise ValueError(f"THC p (clamp probability) must be in [{MIN_P:g}, 1), got {p!r}")
        if table not in ("optimal", "uniform"):
            raise ValueError(f"THC table must be 'optimal' or 'uniform', got {table!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
                or not 0 <= seed < 1 << 32:
            raise ValueError(f"THC seed must be an int from 0 to 2^32 - 1, got {seed!r}")
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) \
                or not 8 <= block <= _MAX_BLOCK or block & (block - 1):
            raise ValueError(f"THC block must be a power of two from 8 to 2^24, got {block!r}")
        self.bits = int(bits)
        self.g = int(g)
        self.p = float(p)
        self.table = table
        self.seed = int(seed)
        self.block = int(block)

    # ------------------------------------------------------------------ tables
    @property
    def levels(self):
        """The receiver table ``R`` (tuple of ``2^bits`` ints from 0 to g)."""
        return receiver_table(self.bits, self.g, self.p, self.table)

    def _padded(self, n):
        return -(-n // self.block) * self.block

    def _fine_step(self):
        # δ: spacing of the S-point grid on [-T, T], in units of max_norm/sqrt(n)
        return 2.0 * clamp_t(self.p) / (GRID_POINTS - 1)

    def _seed_hash(self, ctx):
        # names the rotation (seed, step, key, chunk): a payload decoded or added
        # under another rotation is refused instead of decoding to garbage
        return zlib.crc32(struct.pack("<Q", ctx.seed(self.seed)))

    # --------------------------------------------------------------- encoding
    def shared_stats(self, x):
        """Return the chunk's norm; the collective takes the max over ranks.

        Parameters
        ----------
        x : numpy.ndarray
            This rank's chunk input (after error feedback).

        Returns
        -------
        numpy.ndarray
            ``[||x||_2]`` as float64.
        """
        x = self.check_input(x)
        return np.array([_norm(x)], dtype=np.float64)

    def _max_norm(self, x, ctx):
        if ctx.shared is None:
            return _norm(x)
        shared = np.asarray(ctx.shared, dtype=np.float64).reshape(-1)
        if shared.size != 1 or not shared[0] >= 0:
            raise ValueError("THC expects ctx.shared = [max over ranks of ||x||_2] "
                             f"(one non-negative number), got {ctx.shared!r}")
        return float(shared[0])

    def _encode(self, x, ctx):
        padded = self._padded(x.size)
        with np.errstate(over="ignore"):  # beyond float32: flagged just below
            max_norm = np.float32(self._max_norm(x, ctx))
        if not np.isfinite(max_norm):
            return np.empty(0, np.uint8), FLAG_OVERFLOW  # a norm beyond float32
        zero = max_norm == 0 or padded == 0
        # the kernel writes every data byte (block * bits is a multiple of 8)
        body = np.empty(BODY_HEADER_SIZE + (0 if zero else padded * self.bits // 8), np.uint8)
        body[:BODY_HEADER_SIZE] = self._body_head(KIND_PACKED, 0, zero, max_norm, ctx, padded)
        if not zero:
            xk, thr = kernel_tables(self.levels, self.g)
            factor = self._encode_factor(x.size, max_norm)
            if x.dtype != np.float32:
                # one kernel signature (float32) keeps compile time down; scaling first
                # keeps float64 values beyond float32's range finite
                x, factor = (x * factor).astype(np.float32), 1.0
            _k.encode_blocks(x, padded, self.block, factor, np.uint64(ctx.seed(self.seed)),
                             np.uint64(ctx.seed(self.seed, per_rank=True)), xk, thr,
                             self.bits, body[BODY_HEADER_SIZE:])
        return body, 0

    def _encode_factor(self, n, max_norm):
        # maps rotated values to fine-grid units: sqrt(n/block) / (max_norm * δ)
        return math.sqrt(n / self.block) / (float(max_norm) * self._fine_step())

    def _body_head(self, kind, width, zero, max_norm, ctx, padded):
        return np.frombuffer(_BODY.pack(kind, width, self.bits, int(zero), max_norm, self.block,
                                        self._seed_hash(ctx), padded), dtype=np.uint8)

    # ----------------------------------------------------------- parsing
    def _parse(self, header, body, ctx):
        """Validate a body against its header; return (width, zero, max_norm, data bytes).

        ``width`` is the lane width in bytes, 0 for packed indices.
        """
        if body.size < BODY_HEADER_SIZE:
            raise PayloadError(f"THC body of {body.size} bytes is shorter than its "
                               f"{BODY_HEADER_SIZE}-byte header")
        kind, width, bits, zero, max_norm, block, seed_hash, padded = _BODY.unpack(
            body[:BODY_HEADER_SIZE].tobytes())
        if bits != self.bits or block != self.block:
            raise PayloadError(f"THC payload has bits={bits}, block={block}; this codec "
                               f"has bits={self.bits}, block={self.block}")
        if padded != self._padded(header.n):
            raise PayloadError(f"THC payload pads {header.n} elements to {padded}, "
                               f"expected {self._padded(header.n)}")
        if seed_hash != self._seed_hash(ctx):
            raise PayloadError("THC payload was rotated with another seed, step, key or chunk "
                               "than this context")
        if zero not in (0, 1) or not (np.isfinite(max_norm) and max_norm >= 0) \
                or bool(zero) != (max_norm == 0 or padded == 0):
            raise PayloadError(f"THC payload has zero flag {zero} with max norm {max_norm}")
        if kind == KIND_PACKED:
            if header.contributors != 1 or width != 0:
                raise PayloadError("THC packed indices must come from one contributor "
                                   "with lane width 0")
            data_len = 0 if zero else padded * bits // 8
        elif kind == KIND_LANES:
            expected = lane_bytes(header.contributors, self.g)
            if expected == 0:
                raise PayloadError(f"THC lanes cannot hold a sum of {header.contributors} "
                                   "contributors (only an OVERFLOW-flagged payload can)")
            if width != expected:
                raise PayloadError(f"THC lanes of {width} bytes for {header.contributors} "
                                   f"contributors; expected {expected}")
            data_len = 0 if zero else padded * width
        else:
            raise PayloadError(f"unknown THC body kind {kind}")
        if body.size - BODY_HEADER_SIZE != data_len:
            raise PayloadError(f"THC body holds {body.size - BODY_HEADER_SIZE} data bytes, "
                               f"expected {data_len}")
        if zero and ctx.n is None and header.n > MAX_UNCHECKED_ELEMENTS:
            raise PayloadError(f"THC zero payload claims {header.n} elements; pass "
                               "CodecContext(n=...) to decode payloads this large")
        data = body[BODY_HEADER_SIZE:]
        if kind == KIND_LANES and not zero:
            if int(data.view(_LANE_DTYPES[width]).max()) > header.contributors * self.g:
                raise PayloadError("THC lane exceeds contributors * g")
        return width, bool(zero), float(max_norm), data

    # --------------------------------------------------------------- decoding
    def _decode(self, header, body, ctx):
        width, zero, max_norm, data = self._parse(header, body, ctx)
        n = header.n
        if zero:
            return np.zeros(n, dtype=np.float32)
        out = np.empty(n, dtype=np.float32)
        values, offset, scale = self._dequantizer(header, max_norm)
        _k.decode_blocks(data, width, self.bits, values, self._levels_u32(), offset, scale, n,
                         self.block, np.uint64(ctx.seed(self.seed)), out)
        return out

    def _dequantizer(self, header, max_norm):
        """``(values, offset, scale)``: index i decodes to ``values[i]``, a lane sum S to
        ``(S - offset) * scale`` (before the inverse rotation)."""
        g = self.g
        inc = 2.0 * clamp_t(self.p) / g
        # lane sum S of c contributors stands for c values in (S - c*g/2)*inc*max_norm/sqrt(n),
        # then the unnormalised Hadamard needs a further 1/sqrt(block)
        scale = inc * float(max_norm) / math.sqrt(header.n) / math.sqrt(self.block)
        offset = header.contributors * g / 2.0
        values = ((np.asarray(self.levels, dtype=np.float64) - offset) * scale).astype(np.float32)
        return values, offset, scale

    # --------------------------------------------------------------- addition
    def _add(self, ha, a_body, hb, b_body, ctx):
        return self._add_with(ha, a_body, hb, b_body, ctx, _k.add_lanes)

    def _add_with(self, ha, a_body, hb, b_body, ctx, add_lanes):
        """:meth:`_add` with the lane kernel ``add_lanes`` (the device twin passes its own)."""
        a_width, zero, max_norm, a_data = self._parse(ha, a_body, ctx)
        b_width, _, b_norm, b_data = self._parse(hb, b_body, ctx)
        if max_norm != b_norm:
            raise PayloadError(f"THC payloads were scaled by different max norms "
                               f"({max_norm} and {b_norm}): agree on ctx.shared first")
        contributors = ha.contributors + hb.contributors
        width = lane_bytes(contributors, self.g)
        be = backend_of(a_body)  # device payloads add on the device
        if width == 0:
            flagged = self.flagged_payload(ha.n, FLAG_OVERFLOW, contributors, dtype=ha.dtype)
            return be.to_device(flagged) if be.device else flagged
        padded = self._padded(ha.n)
        body = be.xp.empty(BODY_HEADER_SIZE + (0 if zero else padded * width), dtype=np.uint8)
        be.upload(body[:BODY_HEADER_SIZE],
                  self._body_head(KIND_LANES, width, zero, max_norm, ctx, padded))
        if not zero:
            add_lanes(a_data, a_width, b_data, b_width, self.bits, self._levels_u32(),
                      padded, body[BODY_HEADER_SIZE:], width)
        return self.pack(body, ha.n, contributors=contributors, dtype=ha.dtype)

    def _levels_u32(self):
        return np.asarray(self.levels, dtype=np.uint32)


def _norm(x):
    """||x||_2 in float64, without overflow for float64 input near its range limit.

    Device arrays are summed by the array module's ``dot``, in another order
    than the CPU kernel: the norms can differ in their last bits.
    """
    if x.size == 0:
        return 0.0
    be = backend_of(x)
    sum_squares = _device_sum_squares if be.device else _k.sum_squares
    total = sum_squares(x)
    if math.isfinite(total):
        return math.sqrt(total)
    big = float(be.xp.abs(x).max())
    return big * math.sqrt(sum_squares(x / big))


def _device_sum_squares(x):
    x64 = x.astype(np.float64)
    return float(backend_of(x).xp.dot(x64, x64))
