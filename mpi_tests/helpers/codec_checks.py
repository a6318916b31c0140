"""The codec contract written once; each codec's test module calls these.

Like numcodecs' ``tests/common.py``: round trips, config round trips, and the
decoder-safety rule that any byte string decodes to a valid result or raises
:class:`ccl.PayloadError`, never anything else (random bytes, truncations,
bit flips, header edits; the property itself is ``ccl.tools.fuzz.check_decode``).
"""

import dataclasses
import json

import numpy as np
import pytest

from ccl.codecs import FLAG_OVERFLOW, HEADER_SIZE, CodecContext, Header, get_codec
from ccl.codecs.header import FLAG_FAILED
from ccl.errors import CompressionOverflowError, PayloadError
from ccl.tools.fuzz import check_decode, edit_header

ODD_SIZES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 127, 1000, 1031)


def check_config(codec):
    """JSON and repr round trips give an equal codec with an equal hash."""
    config = codec.get_config()
    again = get_codec(json.loads(json.dumps(config)))
    assert again == codec and hash(again) == hash(codec)
    assert again.config_hash == codec.config_hash
    assert repr(again) == repr(codec)
    assert config == codec.get_config(), "get_config must not be mutated by get_codec"


def check_roundtrip(codec, x, ctx=None, atol=None, rtol=None):
    """Encode/decode ``x``; check shape, dtype and (if given) the error bound.

    Returns the decoded array.
    """
    payload = codec.encode(x, ctx)
    assert payload.dtype == np.uint8 and payload.ndim == 1 and payload.size >= HEADER_SIZE
    y = codec.decode(payload, ctx)
    assert y.shape == (x.size,)
    if atol is not None or rtol is not None:
        np.testing.assert_allclose(y, np.ravel(x), atol=atol or 0, rtol=rtol or 0)
    return y


def decode_or_payload_error(codec, payload, ctx=None):
    """Decode ``payload``; anything but a valid result or PayloadError fails the test.

    A payload flagged ``OVERFLOW`` or ``FAILED`` (a bit flip can set the flag)
    is a valid payload whose ``decode`` raises CompressionOverflowError or
    PayloadError by contract.
    """
    y = check_decode(codec, payload, ctx)
    if y is not None:
        try:
            np.testing.assert_array_equal(codec.decode(payload, ctx), y)
        except CompressionOverflowError:
            assert Header.unpack(payload).flags & FLAG_OVERFLOW
        except PayloadError:
            assert Header.unpack(payload).flags & FLAG_FAILED
    return y


def check_malformed(codec, x, ctx=None, rng=None, flips=200):
    """Truncations, bit flips and header edits of a valid payload: result or PayloadError."""
    rng = np.random.default_rng(0) if rng is None else rng
    payload = codec.encode(x, ctx)
    # every truncation near the header, then a sample through the body
    cuts = set(range(min(payload.size, HEADER_SIZE + 16)))
    cuts.update(rng.integers(0, payload.size, size=min(50, payload.size)).tolist())
    for cut in sorted(cuts):
        decode_or_payload_error(codec, payload[:cut].copy(), ctx)
    # one appended byte
    decode_or_payload_error(codec, np.append(payload, np.uint8(7)), ctx)
    # single bit flips anywhere
    for _ in range(flips):
        bad = payload.copy()
        pos = int(rng.integers(0, bad.size))
        bad[pos] ^= np.uint8(1 << int(rng.integers(0, 8)))
        decode_or_payload_error(codec, bad, ctx)
    # a body filled with random bytes under a valid header
    bad = payload.copy()
    bad[HEADER_SIZE:] = rng.integers(0, 256, size=bad.size - HEADER_SIZE, dtype=np.uint8)
    decode_or_payload_error(codec, bad, ctx)


def check_header_edits(codec, x, ctx=None):
    """Every header field of a valid payload set to boundary and off-by-one values.

    Each edit gives a result or PayloadError; edits that make the header
    invalid for this codec (magic, version, wire id, config hash, body length,
    unknown flags or dtype codes, zero contributors) must be rejected.
    """
    payload = codec.encode(x, ctx)
    header = Header.unpack(payload)
    must_reject = {"magic": [b"\x00\x00", b"\x1d\xcc"], "version": [0, 2, 255],
                   "wire_id": [0, codec.wire_id ^ 1, 255],
                   "config_hash": [header.config_hash ^ 1, 0 if header.config_hash else 1],
                   "body_len": [header.body_len + 1, header.body_len - 1, 2**63, 2**64 - 1],
                   "flags": [8, 128, 255], "dtype": [3, 255], "contributors": [0]}
    for field, values in must_reject.items():
        for value in values:
            bad = edit_header(payload, field, value)
            if bad.tobytes() == payload.tobytes():
                continue  # e.g. a body length of -1 for an empty body wraps to 2^64 - 1 above
            with pytest.raises(PayloadError):
                codec.decode_with_header(bad, ctx)
    maybe = {"n": [0, 1, header.n - 1, header.n + 1, 2 * header.n + 1, 2**32, 2**40, 2**64 - 1],
             "contributors": [2, 3, 2**31, 2**32 - 1], "flags": [0, 1, 2, 3, 4, 7],
             "dtype": [0, 1, 2], "reserved": [1, 2**16 - 1]}
    for field, values in maybe.items():
        for value in values:
            decode_or_payload_error(codec, edit_header(payload, field, value), ctx)
            # as inside a collective, which knows the count it expects
            decode_or_payload_error(codec, edit_header(payload, field, value),
                                    CodecContext(n=header.n) if ctx is None
                                    else dataclasses.replace(ctx, n=header.n))


def check_random_bytes(codec, data, ctx=None):
    """Arbitrary bytes, also behind a header valid for this codec: result or PayloadError."""
    raw = np.frombuffer(data, dtype=np.uint8).copy()
    decode_or_payload_error(codec, raw, ctx)
    # a header this codec accepts in front of random bytes, for several claimed sizes,
    # so the body parser itself meets garbage
    for n in (0, 1, len(data), 5 * len(data) + 3, 2**40):
        decode_or_payload_error(codec, codec.pack(raw, n), ctx)


def default_ctx(**kw):
    """A CodecContext with the given fields."""
    return CodecContext(**kw)
