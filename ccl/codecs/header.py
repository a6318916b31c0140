"""The wire format's fixed part: the 32-byte payload header, its flags, and wire ids.

Every payload starts with a :class:`Header` (magic, format version, the
codec's wire id, flags, the decoded dtype, the contributor count, the
configuration hash, the element count and the body length); codecs write and
read only the body after it. :func:`claim_wire_id` keeps the table of wire
ids in use, so a payload from another codec is named in the error.
"""

import struct
from dataclasses import dataclass

import numpy as np

from .._xp import backend_of
from ..errors import PayloadError

__all__ = ["Header", "HEADER_SIZE", "MAGIC", "FORMAT_VERSION", "FLAG_NONFINITE",
           "FLAG_OVERFLOW", "FLAG_FAILED", "MAX_UNCHECKED_ELEMENTS", "claim_wire_id",
           "wire_name", "dominant_flag"]

MAGIC = b"\xcc\x1d"
FORMAT_VERSION = 1
FLAG_NONFINITE = 1
FLAG_OVERFLOW = 2
# A rank failed to encode, decode or add this payload's data (an exception mid-collective):
# the flag travels with the data like the others, so every rank learns of the failure
# instead of waiting for messages that never come.
FLAG_FAILED = 4
_KNOWN_FLAGS = FLAG_NONFINITE | FLAG_OVERFLOW | FLAG_FAILED


def dominant_flag(flags):
    """The one flag a payload combined from payloads with ``flags`` carries (0 if none).

    A failure outranks non-finite input, which outranks an overflow: the
    result of a sum is only as good as its worst part.
    """
    for flag in (FLAG_FAILED, FLAG_NONFINITE, FLAG_OVERFLOW):
        if flags & flag:
            return flag
    return 0
# A header-only (flagged) payload cannot prove its element count by its size;
# without an expected count (CodecContext.n) larger claims are refused. The bound
# caps what a few bytes can make a decoder allocate (512 MiB of float64; at 2^32
# a 32-byte payload asked for 32 GiB).
MAX_UNCHECKED_ELEMENTS = 1 << 26

# magic, version, wire id, flags, dtype code, reserved, contributors,
# config hash, element count, body length
_HEADER = struct.Struct("<2sBBBBHIIQQ")
HEADER_SIZE = _HEADER.size  # 32

_DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2}
_CODE_DTYPES = {code: dt for dt, code in _DTYPE_CODES.items()}


@dataclass(frozen=True)
class Header:
    """The fixed 32-byte header that starts every payload.

    Attributes
    ----------
    wire_id : int
        The codec's numeric id (``Codec.wire_id``).
    flags : int
        Bit 0 ``NONFINITE`` (decodes to NaN), bit 1 ``OVERFLOW``, bit 2
        ``FAILED`` (a rank failed mid-collective; decodes to NaN).
    dtype : numpy.dtype
        The dtype that :meth:`Codec.decode` returns.
    contributors : int
        How many encoded inputs were summed into this payload (1 when fresh).
    config_hash : int
        CRC32 of the codec configuration; a payload from a codec configured
        differently is rejected.
    n : int
        Number of elements the payload decodes to.
    body_len : int
        Bytes after the header.

    Parameters
    ----------
    wire_id, flags, dtype, contributors, config_hash, n, body_len
        The attributes above, in that order.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import Header, get_codec
    >>> payload = get_codec("fp16").encode(np.ones(10, np.float32))
    >>> header = Header.unpack(payload)
    >>> header.wire_id, header.n, header.body_len, header.dtype
    (2, 10, 20, dtype('float32'))
    """

    wire_id: int
    flags: int
    dtype: np.dtype
    contributors: int
    config_hash: int
    n: int
    body_len: int

    def pack(self):
        """Return the header as 32 bytes.

        Returns
        -------
        bytes
            The little-endian header (magic, version, fields).
        """
        return _HEADER.pack(MAGIC, FORMAT_VERSION, self.wire_id, self.flags,
                            _DTYPE_CODES[np.dtype(self.dtype)], 0, self.contributors,
                            self.config_hash, self.n, self.body_len)

    @classmethod
    def unpack(cls, payload):
        """Parse and validate the header of ``payload``.

        Parameters
        ----------
        payload : numpy.ndarray or cupy.ndarray
            A 1-D ``uint8`` payload, on the host or a device.

        Returns
        -------
        Header
            The parsed fields.

        Raises
        ------
        PayloadError
            If the payload is too short, has the wrong magic or version, an
            unknown flag or dtype code, or a body length that disagrees with
            its size.
        """
        be = backend_of(payload)
        if not be.owns(payload) or payload.dtype != np.uint8 or payload.ndim != 1:
            raise PayloadError("a payload must be a 1-D numpy (or cupy) uint8 array")
        if payload.size < HEADER_SIZE:
            raise PayloadError(f"payload of {payload.size} bytes is shorter than the "
                               f"{HEADER_SIZE}-byte header")
        head = be.to_host(payload[:HEADER_SIZE]) if be.device else payload[:HEADER_SIZE]
        (magic, version, wire_id, flags, dtype_code, _reserved, contributors,
         config_hash, n, body_len) = _HEADER.unpack(head.tobytes())
        if magic != MAGIC:
            raise PayloadError("not a ccl payload (bad magic)")
        if version != FORMAT_VERSION:
            raise PayloadError(f"payload format version {version} is not supported "
                               f"(this ccl reads version {FORMAT_VERSION})")
        if flags & ~_KNOWN_FLAGS:
            raise PayloadError(f"unknown payload flags {flags:#x}")
        if dtype_code not in _CODE_DTYPES:
            raise PayloadError(f"unknown dtype code {dtype_code}")
        if contributors < 1:
            raise PayloadError("payload claims zero contributors")
        if body_len != payload.size - HEADER_SIZE:
            raise PayloadError(f"payload body is {payload.size - HEADER_SIZE} bytes but the "
                               f"header says {body_len}")
        return cls(wire_id, flags, _CODE_DTYPES[dtype_code], contributors, config_hash, n,
                   body_len)


# wire id -> codec id of every registered codec (filled by claim_wire_id)
_WIRE_NAMES = {}


def claim_wire_id(wire_id, codec_id):
    """Record that ``codec_id`` writes ``wire_id`` into its headers.

    Raises
    ------
    ValueError
        If ``wire_id`` is not an int in 1..255, or another codec claimed it.
    """
    if not isinstance(wire_id, int) or not 1 <= wire_id <= 255:
        raise ValueError(f"wire_id must be an int in 1..255, got {wire_id!r}")
    existing = _WIRE_NAMES.get(wire_id)
    if existing is not None and existing != codec_id:
        raise ValueError(f"wire id {wire_id} is already used by codec {existing!r}")
    _WIRE_NAMES[wire_id] = codec_id


def wire_name(wire_id):
    """The id of the registered codec that writes ``wire_id`` (None if unknown)."""
    return _WIRE_NAMES.get(wire_id)
