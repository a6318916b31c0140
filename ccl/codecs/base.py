"""The codec contract: :class:`Codec`, the base class of every codec.

A codec turns a 1-D float array into a self-describing ``uint8`` payload and
back. Its configuration is the set of its public instance attributes (the
constructor arguments under the same names); ``get_config()``,
``from_config()``, equality and ``repr`` all follow from that one rule, as in
numcodecs. Private state starts with ``_``.

Every payload starts with the 32-byte :class:`Header`; a subclass only writes
and reads the *body*. The base class owns what is common to every codec
(the configuration rule in :mod:`ccl.codecs.configurable`, the header around
the body in :mod:`ccl.codecs.framing`, the header itself in
:mod:`ccl.codecs.header`):

* input checks (dtype, flattening, non-contiguous input is copied);
* the non-finite policy: a chunk whose input holds NaN or Inf encodes to a
  header-only payload flagged ``NONFINITE`` that decodes to NaN everywhere,
  and combines with anything into ``NONFINITE``;
* the overflow flag: a codec whose format cannot hold a value (fp16 above
  65504, an integer lane that would wrap) flags ``OVERFLOW`` instead of
  returning a saturated result; the collectives raise
  :class:`ccl.CompressionOverflowError` on every rank;
* validation of the header (magic, version, codec, configuration hash,
  element count, body length) before any kernel touches the body.

Homomorphic codecs (``homomorphic = True``) also implement :meth:`Codec._add`,
which adds two payloads without decoding them, and may ask for parameters
agreed by all ranks: :meth:`Codec.shared_stats` returns a few float64 numbers
per chunk that the collective reduces with ``MAX`` across ranks and hands
back as ``ctx.shared``.
"""

from __future__ import annotations


import numpy as np
from numpy.typing import DTypeLike

from .._xp import ArrayT, backend_of
from ..errors import CompressionOverflowError, PayloadError
from .configurable import Configurable
from .context import CodecContext, all_finite
from .framing import PayloadFraming
from .header import (FLAG_FAILED, FLAG_NONFINITE, FLAG_OVERFLOW, HEADER_SIZE,
                     MAX_UNCHECKED_ELEMENTS, Header, dominant_flag)

__all__ = ["Codec"]



class Codec(Configurable, PayloadFraming):
    """Base class of every codec.

    Subclasses set the class attributes below, store their parameters as
    public attributes in ``__init__`` (validating them eagerly with
    ``ValueError``), and implement ``_encode`` and ``_decode``
    (plus ``_add`` if homomorphic). The contributing guide walks through
    adding one.

    Attributes
    ----------
    codec_id : str
        Lower-case id used by :func:`get_codec` and in configs.
    wire_id : int
        Unique id 1..255 written into every payload header.
    homomorphic : bool
        Payloads can be added in the compressed domain (:meth:`add`).
    error_feedback : bool
        Lossy points keep a residual (False for exact or cast codecs).
    predivide_mean : bool
        For ``op="mean"``, divide the input by the rank count before encoding
        (low-precision formats, to avoid overflow) instead of dividing the
        decoded sum.
    sparse : bool
        Payload size varies with the data (``auto`` prefers ``allgather``).
    input_dtypes : tuple of numpy dtypes
        Accepted input dtypes; others raise ``TypeError``.

    The *capabilities* below tell the collectives what to expect of a codec,
    so no part of ccl outside the codec's own files needs to know its id.
    A codec that states none of them gets the defaults, which are safe: no
    compression assumed, so ``auto`` does not choose it where it cannot pay.

    bits_per_value : float
        Expected payload bits per input value for this configuration, in
        steady state under error feedback on real gradients where that
        depends on the data (``python -m ccl.bench steady``). ``auto``'s cost
        model and the pipeline's segment sizes read it. Default 32.
    encode_gbps, decode_gbps : float
        Throughput of one core, GB/s of float32 input, as ``python -m
        ccl.bench codecs`` measures it. Default 1.
    shared_statistics : bool
        Ranks agree on per-chunk statistics (:meth:`shared_stats`, reduced
        with MAX) before encoding. Default False.
    identity : bool
        The codec sends values unchanged (``none``): nothing is compressed,
        so ``auto`` hands it to the MPI library. Default False.
    sum_rounds : bool
        Adding two payloads (:meth:`add`) rounds the sum to the payload's
        precision (fp16, bf16), so every addition adds an error. ``direct``'s
        owners then decode, sum exactly and encode the sum once, which
        keeps two lossy points at any rank count; where False, a homomorphic
        codec's payloads are added encoded. Default False.

    Examples
    --------
    A toy codec that sends every value as float32 (it would need a free
    wire id to be registered with :func:`register_codec`):

    >>> import numpy as np
    >>> from ccl.codecs import Codec
    >>> class Float32Codec(Codec):
    ...     codec_id, wire_id, error_feedback = "float32-example", 200, False
    ...     def _encode(self, x, ctx):
    ...         return x.astype(np.float32).view(np.uint8), 0
    ...     def _decode(self, header, body, ctx):
    ...         return body.view(np.float32).copy()
    >>> codec = Float32Codec()
    >>> codec.decode(codec.encode(np.array([1.0, 2.0])))
    array([1., 2.], dtype=float32)
    >>> codec.get_config()
    {'id': 'float32-example'}
    """

    codec_id = None
    wire_id = None
    homomorphic = False
    error_feedback = True
    predivide_mean = False
    sparse = False
    input_dtypes = (np.dtype(np.float32), np.dtype(np.float64))
    bits_per_value = 32.0
    encode_gbps = decode_gbps = 1.0
    shared_statistics = False
    identity = False
    sum_rounds = False

    def sum_bits_per_value(self, contributors: int) -> float:
        """Payload bits per value of a sum of ``contributors`` payloads (homomorphic codecs).

        The cost model reads it: a codec whose payloads widen as they add
        (THC's lanes) says by how much. The default: the sum is as large as
        one payload (``bits_per_value``; a codec that is not homomorphic
        re-encodes every sum).

        Parameters
        ----------
        contributors : int
            How many ranks' contributions the payload holds.

        Returns
        -------
        float
        """
        return float(self.bits_per_value)

    def check_error_feedback(self) -> None:
        """Refuse a configuration whose residual would grow under error feedback.

        The collectives call it on every rank before any message moves, for
        calls with ``key=`` (the ones that keep residuals), so a refusal is
        raised on every rank alike. The default accepts every configuration.

        Raises
        ------
        ValueError
            If this configuration diverges with error feedback; the message
            says what to use instead.
        """

    # ------------------------------------------------------------ public API
    def encode(self, x: ArrayT, ctx: CodecContext | None = None) -> ArrayT:
        """Encode a float array into a self-describing uint8 payload.

        Parameters
        ----------
        x : numpy.ndarray or cupy.ndarray
            Input of any shape (flattened in C order); dtype must be one of
            ``input_dtypes``. A cupy array is encoded on its device.
        ctx : CodecContext, optional
            Seeds and agreed parameters; collectives pass one per chunk.

        Returns
        -------
        numpy.ndarray or cupy.ndarray
            1-D ``uint8`` payload: a 32-byte header and the codec's body, in
            ``x``'s array module; the bytes do not depend on the device.

        Raises
        ------
        TypeError
            If ``x`` is not an array of an accepted dtype.

        Examples
        --------
        >>> import numpy as np
        >>> from ccl.codecs import get_codec
        >>> payload = get_codec("onebit").encode(np.ones((4, 8), np.float32))
        >>> payload.dtype, payload.size          # header, scale, 32 bits
        (dtype('uint8'), 40)
        """
        be = backend_of(x)
        x = self.check_input(x)
        ctx = CodecContext() if ctx is None else ctx
        if be.device:
            from . import device  # the codec's device twin (numba.cuda only from here)

            return device.encode(self, x, ctx, be)
        if not all_finite(x) or (ctx.shared is not None and not np.isfinite(ctx.shared).all()):
            return self.flagged_payload(x.size, FLAG_NONFINITE)
        body, flags = self._encode(x, ctx)
        return self.pack(body, x.size, flags=flags, dtype=self.decoded_dtype(x.dtype))

    def decode(self, payload: ArrayT, ctx: CodecContext | None = None) -> ArrayT:
        """Decode a payload made by :meth:`encode` (or :meth:`add`).

        Parameters
        ----------
        payload : numpy.ndarray
            1-D ``uint8`` payload.
        ctx : CodecContext, optional
            The context the payload was encoded with (codecs with shared
            randomness need the same step, key and chunk).

        Returns
        -------
        numpy.ndarray
            1-D array of ``header.n`` elements; all NaN for a ``NONFINITE``
            payload.

        Raises
        ------
        PayloadError
            If the payload is malformed, truncated or made by another codec
            or configuration, or flagged ``FAILED`` (made by a collective in
            which a rank failed: it holds no data).
        CompressionOverflowError
            If the payload is flagged ``OVERFLOW``.

        Examples
        --------
        >>> import numpy as np
        >>> from ccl.codecs import get_codec
        >>> codec = get_codec("bf16")
        >>> codec.decode(codec.encode(np.array([0.5, -1.0], np.float32)))
        array([ 0.5, -1. ], dtype=float32)
        >>> codec.decode(np.zeros(40, np.uint8))
        Traceback (most recent call last):
        ...
        ccl.errors.PayloadError: not a ccl payload (bad magic)
        """
        values, header = self.decode_with_header(payload, ctx)
        if header.flags & FLAG_FAILED:
            raise PayloadError(f"codec {self.codec_id!r}: the payload marks a collective in "
                               "which a rank failed; it holds no data")
        if header.flags & FLAG_OVERFLOW:
            raise CompressionOverflowError(
                f"codec {self.codec_id!r}: a sum overflowed the compressed format")
        return values

    def decode_with_header(self, payload: ArrayT,
                           ctx: CodecContext | None = None) -> tuple[ArrayT, Header]:
        """Decode without raising on ``OVERFLOW`` (flagged payloads decode to NaN).

        Collectives use this so that every rank can first finish the
        exchange and then raise together.

        Parameters
        ----------
        payload : numpy.ndarray
            1-D ``uint8`` payload.
        ctx : CodecContext, optional
            The context the payload was encoded with.

        Returns
        -------
        values : numpy.ndarray
            The decoded values (NaN for a flagged payload).
        header : Header
            The validated header, with its flags.
        """
        be = backend_of(payload)
        header = self.read_header(payload)
        payload = be.xp.ascontiguousarray(payload)  # bodies are viewed as other dtypes
        ctx = CodecContext() if ctx is None else ctx
        if ctx.n is not None and header.n != ctx.n:
            raise PayloadError(f"payload holds {header.n} elements, expected {ctx.n}")
        if header.flags:
            if header.body_len:
                raise PayloadError("a flagged payload must have an empty body")
            if ctx.n is None and header.n > MAX_UNCHECKED_ELEMENTS:
                raise PayloadError(f"flagged payload claims {header.n} elements; pass "
                                   "CodecContext(n=...) to decode payloads this large")
            return be.xp.full(header.n, np.nan, dtype=header.dtype), header
        if be.device:
            from . import device

            values = device.decode(self, header, payload[HEADER_SIZE:], ctx, be)
        else:
            values = self._decode(header, payload[HEADER_SIZE:], ctx)
        if values.shape != (header.n,):
            raise PayloadError(f"codec {self.codec_id!r} decoded {values.size} elements, "
                               f"header says {header.n}")
        return values, header

    def add(self, a: ArrayT, b: ArrayT, ctx: CodecContext | None = None) -> ArrayT:
        """Add two payloads in the compressed domain (homomorphic codecs only).

        ``decode(add(a, b)) == decode(a) + decode(b)`` (exactly, or to the
        codec's documented rounding). Flags combine: ``NONFINITE`` wins over
        everything, ``OVERFLOW`` over data.

        Parameters
        ----------
        a, b : numpy.ndarray
            Payloads of this codec holding the same element count.
        ctx : CodecContext, optional
            The encodes' context (codecs with shared randomness need it).

        Returns
        -------
        numpy.ndarray
            The payload of the sum; its header counts both contributors.

        Raises
        ------
        TypeError
            If the codec is not homomorphic.
        PayloadError
            If a payload is malformed or the two hold different element counts.

        Examples
        --------
        >>> import numpy as np
        >>> from ccl.codecs import get_codec
        >>> codec = get_codec("fp16")
        >>> a, b = codec.encode(np.ones(3, np.float32)), codec.encode(np.full(3, 2, np.float32))
        >>> codec.decode(codec.add(a, b))
        array([3., 3., 3.], dtype=float32)
        """
        if not self.homomorphic:
            raise TypeError(f"codec {self.codec_id!r} is not homomorphic: decode, add and "
                            "re-encode instead")
        be = backend_of(a)
        if backend_of(b) is not be:
            raise PayloadError("cannot add a host payload and a device payload")
        ha, hb = self.read_header(a), self.read_header(b)
        a, b = be.xp.ascontiguousarray(a), be.xp.ascontiguousarray(b)
        if ha.n != hb.n:
            raise PayloadError(f"cannot add payloads of {ha.n} and {hb.n} elements")
        contributors = ha.contributors + hb.contributors
        if contributors > 0xFFFFFFFF:
            raise PayloadError("too many contributors for one payload")
        flag = dominant_flag(ha.flags | hb.flags)
        if flag:
            flagged = self.flagged_payload(ha.n, flag, contributors, dtype=ha.dtype)
            return be.to_device(flagged) if be.device else flagged
        ctx = CodecContext() if ctx is None else ctx
        if be.device:
            from . import device

            return device.add(self, ha, a[HEADER_SIZE:], hb, b[HEADER_SIZE:], ctx, be)
        return self._add(ha, a[HEADER_SIZE:], hb, b[HEADER_SIZE:], ctx)

    def shared_stats(self, x: np.ndarray) -> np.ndarray:
        """Statistics of a chunk that all ranks must agree on (reduced with MAX).

        The collective calls this on each rank's chunk input (after error
        feedback), takes the element-wise maximum over ranks, and passes it
        as ``ctx.shared``.

        Parameters
        ----------
        x : numpy.ndarray
            This rank's chunk input.

        Returns
        -------
        numpy.ndarray
            A 1-D float64 array (empty by default: nothing to agree on).
        """
        return np.empty(0, dtype=np.float64)

    # ------------------------------------------------------ helpers for codecs
    # (read_header, pack and flagged_payload come from PayloadFraming)
    def check_input(self, x: ArrayT) -> ArrayT:
        """Return ``x`` as a 1-D contiguous array of an accepted dtype.

        Device (cupy) arrays stay on their device.

        Parameters
        ----------
        x : array_like
            Input of any shape.

        Returns
        -------
        numpy.ndarray
            ``x`` flattened in C order (copied if it was not contiguous).

        Raises
        ------
        TypeError
            If ``x`` is not an array, or its dtype is not in ``input_dtypes``.
        """
        if not hasattr(x, "dtype") or not hasattr(x, "shape"):
            raise TypeError(f"codec {self.codec_id!r} encodes arrays, got {type(x).__name__}")
        if isinstance(x, np.ma.MaskedArray):
            raise TypeError(f"codec {self.codec_id!r} does not encode masked arrays (the mask "
                            "would be ignored): pass x.filled(0)")
        xp = backend_of(x).xp
        x = xp.asarray(x)
        if x.dtype not in self.input_dtypes:
            accepted = ", ".join(str(d) for d in self.input_dtypes)
            raise TypeError(f"codec {self.codec_id!r} accepts {accepted}; got {x.dtype}")
        return xp.ascontiguousarray(x).reshape(-1)

    def decoded_dtype(self, input_dtype: DTypeLike) -> np.dtype:
        """The dtype :meth:`decode` returns for input of ``input_dtype``.

        Parameters
        ----------
        input_dtype : numpy.dtype
            The dtype given to :meth:`encode`.

        Returns
        -------
        numpy.dtype
            float32 by default.
        """
        return np.dtype(np.float32)

    # --------------------------------------------------------- subclass hooks
    def _encode(self, x: np.ndarray, ctx: CodecContext) -> tuple[np.ndarray, int]:
        """Encode finite 1-D ``x``; return ``(body, flags)``."""
        raise NotImplementedError

    def _decode(self, header: Header, body: np.ndarray, ctx: CodecContext) -> np.ndarray:
        """Decode ``body`` (validated header) into ``header.n`` elements."""
        raise NotImplementedError

    def _add(self, ha: Header, a_body: np.ndarray, hb: Header, b_body: np.ndarray,
             ctx: CodecContext) -> np.ndarray:
        """Add two unflagged payload bodies; return a full payload."""
        raise NotImplementedError
