"""Payload framing: the header a codec puts before its body, and its checks on the way in.

:class:`PayloadFraming` is the part of :class:`ccl.codecs.Codec` that codecs
call from their own ``_encode``, ``_decode`` and ``_add``: :meth:`~PayloadFraming.pack`
prepends the 32-byte :class:`~ccl.codecs.Header` to a body,
:meth:`~PayloadFraming.flagged_payload` makes the header-only payloads of
non-finite or overflowed chunks, and :meth:`~PayloadFraming.read_header`
rejects a payload made by another codec or configuration before any kernel
reads its body.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from .._xp import HOST, backend_of
from ..errors import PayloadError
from .header import HEADER_SIZE, Header, wire_name

__all__ = ["PayloadFraming"]


class PayloadFraming:
    """The header around a codec's body: written by :meth:`pack`, checked by :meth:`read_header`.

    It reads the codec's ``codec_id``, ``wire_id`` and ``config_hash``.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import HEADER_SIZE, get_codec
    >>> codec = get_codec("none")
    >>> payload = codec.pack(np.arange(3, dtype=np.float32).view(np.uint8), 3)
    >>> payload.size - HEADER_SIZE, codec.read_header(payload).n
    (12, 3)
    """

    def read_header(self, payload: ArrayLike) -> Header:
        """Validate ``payload``'s header for this codec and return it.

        Parameters
        ----------
        payload : numpy.ndarray
            A 1-D ``uint8`` payload.

        Returns
        -------
        Header
            The validated header.

        Raises
        ------
        PayloadError
            If the header is malformed, or made by another codec or configuration.
        """
        header = Header.unpack(payload)
        if header.wire_id != self.wire_id:
            other = wire_name(header.wire_id)
            name = repr(other) if other else f"unknown id {header.wire_id}"
            raise PayloadError(f"payload was made by codec {name}, not {self.codec_id!r}")
        if header.config_hash != self.config_hash:
            raise PayloadError(f"payload was made by a {self.codec_id!r} codec with another "
                               "configuration")
        return header

    def pack(self, body: ArrayLike, n: int, flags: int = 0, contributors: int = 1,
             dtype: DTypeLike = np.float32) -> np.ndarray:
        """Prepend a header to ``body`` and return the payload.

        A device body gives a device payload.

        Parameters
        ----------
        body : bytes or numpy.ndarray
            The codec's body (bytes or a uint8 array).
        n : int
            Elements the payload decodes to.
        flags : int
            Header flags.
        contributors : int
            Encoded inputs summed into this payload.
        dtype : numpy.dtype
            The dtype decode returns.

        Returns
        -------
        numpy.ndarray
            1-D ``uint8`` payload.
        """
        be = HOST if isinstance(body, (bytes, bytearray)) else backend_of(body)
        if be.device:
            from . import device

            return device.pack(self, body, n, be, flags=flags, contributors=contributors,
                               dtype=dtype)
        body = np.frombuffer(body, dtype=np.uint8) if isinstance(body, (bytes, bytearray)) \
            else np.asarray(body, dtype=np.uint8).reshape(-1)
        header = Header(self.wire_id, flags, np.dtype(dtype), contributors, self.config_hash,
                        int(n), body.size)
        out = np.empty(HEADER_SIZE + body.size, dtype=np.uint8)
        out[:HEADER_SIZE] = np.frombuffer(header.pack(), dtype=np.uint8)
        out[HEADER_SIZE:] = body
        return out

    def flagged_payload(self, n: int, flag: int, contributors: int = 1,
                        dtype: DTypeLike = np.float32) -> np.ndarray:
        """A header-only payload flagged ``NONFINITE`` or ``OVERFLOW``.

        Parameters
        ----------
        n : int
            Elements the payload decodes to (as NaN).
        flag : int
            ``FLAG_NONFINITE`` or ``FLAG_OVERFLOW``.
        contributors : int
            Encoded inputs summed into this payload.
        dtype : numpy.dtype
            The dtype decode returns.

        Returns
        -------
        numpy.ndarray
            1-D ``uint8`` payload with an empty body.
        """
        return self.pack(b"", n, flags=flag, contributors=contributors, dtype=dtype)
