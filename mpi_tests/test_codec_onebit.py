"""The ``onebit`` codec: scaled sign, numpy packbits order."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ccl.codecs import FLAG_OVERFLOW, HEADER_SIZE, Header, OneBitCodec, get_codec
from ccl.errors import PayloadError
from mpi_tests.helpers.codec_checks import (
    ODD_SIZES, check_config, check_malformed, check_random_bytes, check_roundtrip)
from mpi_tests.helpers.lossy_checks import (
    check_parallel_matches_serial, check_unaligned_decode, run_error_feedback)


def signed_data(n, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    x[::5] = 0.0
    x[1::7] = -0.0
    return x


@pytest.mark.parametrize("n", list(range(17)) + [31, 64, 127, 1000, 1031, 70001])
def test_bits_match_numpy_packbits(n):
    codec = OneBitCodec()
    x = signed_data(n, n)
    payload = codec.encode(x)
    assert payload.size == HEADER_SIZE + 4 + (n + 7) // 8
    np.testing.assert_array_equal(payload[HEADER_SIZE + 4:], np.packbits(x < 0))
    (scale,) = struct.unpack("<f", payload[HEADER_SIZE:HEADER_SIZE + 4].tobytes())
    expected = np.float32(np.abs(x.astype(np.float64)).mean()) if n else np.float32(0)
    assert np.float32(scale) == expected
    y = codec.decode(payload)
    # magnitudes equal the scale; the sign is negative exactly where x < 0 (zero is positive)
    np.testing.assert_array_equal(np.abs(y), np.full(n, expected, np.float32))
    np.testing.assert_array_equal(np.signbit(y), x < 0)


def test_parallel_kernels_match_serial_and_numpy(monkeypatch):
    x = signed_data((1 << 17) + 4096 * 8 * 3 + 13, 11)
    payload, y = check_parallel_matches_serial(monkeypatch, OneBitCodec(), x)
    np.testing.assert_array_equal(payload[HEADER_SIZE + 4:], np.packbits(x < 0))
    scale = np.abs(x.astype(np.float64)).mean()
    np.testing.assert_allclose(np.abs(y), scale, rtol=1e-6)


def test_zero_and_negative_zero_decode_to_plus_scale():
    codec = OneBitCodec()
    y = codec.decode(codec.encode(np.array([0.0, -0.0, -2.0, 2.0], np.float32)))
    assert y.tolist() == [1.0, 1.0, -1.0, 1.0]
    assert not np.signbit(y[1])


def test_float64_input_and_overflow_flag():
    codec = OneBitCodec()
    x = np.array([1.5, -2.5, 0.25], np.float64)
    y = codec.decode(codec.encode(x))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, np.float32(np.abs(x).mean()) * np.array([1, -1, 1]), rtol=0)
    payload = codec.encode(np.array([1e300, -1e300]))
    assert Header.unpack(payload).flags == FLAG_OVERFLOW


@pytest.mark.parametrize("n", ODD_SIZES)
def test_roundtrip_odd_sizes(n):
    x = signed_data(n, 100 + n)
    y = check_roundtrip(OneBitCodec(), x)
    if n:
        assert np.unique(np.abs(y)).size == 1


def test_decode_unpacks_like_numpy():
    rng = np.random.default_rng(3)
    codec = OneBitCodec()
    for n in (9, 4096 * 8 + 13):
        payload = codec.encode(rng.standard_normal(n).astype(np.float32))
        bits = np.unpackbits(payload[HEADER_SIZE + 4:])[:n]
        scale = np.frombuffer(payload[HEADER_SIZE:HEADER_SIZE + 4].tobytes(), np.float32)[0]
        np.testing.assert_array_equal(codec.decode(payload), np.where(bits, -scale, scale))


def test_error_feedback_bounded_and_conserving():
    # For N(0,1) data the scaled sign keeps delta = ||p||_1^2 / (d ||p||_2^2) near 2/pi, so
    # ||p - C(p)||_2 <= sqrt(1 - delta) ||p||_2 and the residual stays below
    # sqrt(1-delta) / (1 - sqrt(1-delta)) * max ||x||_2, about 1.5 max ||x||_2.
    out = run_error_feedback(OneBitCodec(), d=500, steps=1000, seed=1)
    assert out["norm_e"].max() <= 1.5 * out["max_norm_x"]
    assert out["abs_e"].max() <= 3.0 * out["max_abs_x"]
    # it does not creep up: the last hundred steps look like the second hundred
    assert out["norm_e"][-100:].mean() <= 1.3 * out["norm_e"][100:200].mean()


def test_config_and_registry():
    check_config(OneBitCodec())
    assert get_codec("onebit") == OneBitCodec()
    assert OneBitCodec.wire_id == 10 and not OneBitCodec.homomorphic
    with pytest.raises(TypeError):
        OneBitCodec().add(OneBitCodec().encode(np.ones(3, np.float32)),
                          OneBitCodec().encode(np.ones(3, np.float32)))


def test_malformed_payloads():
    check_malformed(OneBitCodec(), signed_data(333, 2))


def test_invalid_fields_raise_payload_error():
    codec = OneBitCodec()
    payload = codec.encode(signed_data(13, 4))
    for scale in (np.nan, np.inf, -1.0):
        bad = payload.copy()
        bad[HEADER_SIZE:HEADER_SIZE + 4] = np.frombuffer(struct.pack("<f", scale), np.uint8)
        with pytest.raises(PayloadError, match="scale"):
            codec.decode(bad)
    bad = payload.copy()
    bad[-1] |= 1  # a padding bit of the last byte (13 values leave 3 spare bits)
    with pytest.raises(PayloadError, match="padding"):
        codec.decode(bad)


def test_unaligned_payload_decodes():
    check_unaligned_decode(OneBitCodec(), signed_data(77, 5))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_never_crash(data):
    check_random_bytes(OneBitCodec(), data)
