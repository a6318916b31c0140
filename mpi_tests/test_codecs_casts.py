"""The ``none``, ``fp16`` and ``bf16`` codecs, and the shared codec contract."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ccl
from ccl.codecs import FLAG_NONFINITE, Header, get_codec, registered_codecs
from mpi_tests.helpers.codec_checks import (
    ODD_SIZES, check_config, check_malformed, check_random_bytes, check_roundtrip)

CASTS = ["none", "fp16", "bf16"]


@pytest.mark.parametrize("cid", CASTS)
@pytest.mark.parametrize("n", ODD_SIZES)
def test_roundtrip_odd_sizes(cid, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    tol = {"none": 0, "fp16": 1e-3, "bf16": 8e-3}[cid]
    check_roundtrip(get_codec(cid), x, rtol=tol, atol=1e-7 if tol else 0)


def test_none_is_exact_in_every_dtype():
    for dtype in (np.float16, np.float32, np.float64):
        x = np.random.default_rng(1).standard_normal(37).astype(dtype)
        y = get_codec("none").decode(get_codec("none").encode(x))
        assert y.dtype == dtype and np.array_equal(y, x)


def test_bf16_rounds_to_nearest_even():
    # 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0)
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8)], dtype=np.float32)
    y = get_codec("bf16").decode(get_codec("bf16").encode(x))
    assert y.tolist() == [1.0, 1 + 2**-6, -1.0]


@pytest.mark.parametrize("cid", CASTS)
def test_config_roundtrip(cid):
    check_config(get_codec(cid))


def test_registry():
    assert {"none", "fp16", "bf16"} <= set(registered_codecs())
    config = {"id": "fp16"}
    get_codec(config)
    assert config == {"id": "fp16"}, "get_codec must not modify the caller's dict"
    with pytest.raises(ValueError, match="known codecs"):
        get_codec("nope")
    with pytest.raises(TypeError):
        get_codec(3)
    with pytest.raises(ValueError, match="'id'"):
        get_codec({"s": 1})
    codec = get_codec("fp16")
    assert get_codec(codec) is codec


def test_every_codec_subclass_is_registered():
    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)
    for cls in walk(ccl.codecs.Codec):
        if cls.codec_id is not None and cls.__module__.startswith("ccl.codecs."):
            assert get_codec(cls.codec_id).__class__ is cls


@pytest.mark.parametrize("cid", CASTS)
def test_unsupported_dtype_raises_type_error(cid):
    with pytest.raises(TypeError, match="accepts"):
        get_codec(cid).encode(np.arange(4, dtype=np.int32))
    with pytest.raises(TypeError):
        get_codec(cid).encode([1.0, 2.0])


@pytest.mark.parametrize("cid", CASTS)
def test_nonfinite_input_decodes_to_nan(cid):
    x = np.array([1.0, np.inf, 2.0], dtype=np.float32)
    payload = get_codec(cid).encode(x)
    assert Header.unpack(payload).flags == FLAG_NONFINITE
    assert np.isnan(get_codec(cid).decode(payload)).all()


def test_fp16_overflow_is_flagged_not_saturated():
    codec = get_codec("fp16")
    with pytest.raises(ccl.CompressionOverflowError):
        codec.decode(codec.encode(np.array([7e4], dtype=np.float32)))
    a = codec.encode(np.array([4e4], dtype=np.float32))
    with pytest.raises(ccl.CompressionOverflowError):
        codec.decode(codec.add(a, a))


@pytest.mark.parametrize("cid", CASTS)
def test_add_is_homomorphic(cid):
    codec = get_codec(cid)
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(101).astype(np.float32) for _ in range(2))
    pa, pb = codec.encode(a), codec.encode(b)
    total = codec.add(pa, pb)
    assert Header.unpack(total).contributors == 2
    expected = codec.decode(codec.encode(codec.decode(pa) + codec.decode(pb)))
    np.testing.assert_array_equal(codec.decode(total), expected)
    with pytest.raises(ccl.PayloadError):
        codec.add(pa, codec.encode(a[:5]))


@pytest.mark.parametrize("cid", CASTS)
def test_malformed_payloads(cid):
    x = np.random.default_rng(2).standard_normal(333).astype(np.float32)
    check_malformed(get_codec(cid), x)


def test_foreign_payload_is_rejected():
    payload = get_codec("fp16").encode(np.ones(4, np.float32))
    with pytest.raises(ccl.PayloadError, match="fp16"):
        get_codec("bf16").decode(payload)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), cid=st.sampled_from(CASTS))
def test_random_bytes_never_crash(data, cid):
    check_random_bytes(get_codec(cid), data)
