"""The ``dithering`` codec: unbiased stochastic rounding, linear or natural levels."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ccl.codecs import FLAG_OVERFLOW, HEADER_SIZE, CodecContext, DitheringCodec, Header, get_codec
from ccl.codecs.dithering._kernels import dither_natural
from ccl.errors import PayloadError
from mpi_tests.helpers.codec_checks import (
    ODD_SIZES, check_config, check_malformed, check_random_bytes, check_roundtrip)
from mpi_tests.helpers.lossy_checks import (
    check_parallel_matches_serial, check_unaligned_decode, run_error_feedback)

CONFIGS = [{}, {"levels": 7, "partition": "natural"}, {"levels": 300}, {"levels": 1},
           {"levels": 5, "norm": "l2", "seed": 4}, {"levels": 2000, "partition": "natural"}]


def body_parts(codec, payload):
    (scale,) = struct.unpack("<f", payload[HEADER_SIZE:HEADER_SIZE + 4].tobytes())
    return scale, payload[HEADER_SIZE + 4:].view(codec.code_dtype)


def data(n, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    x[::9] = 0.0
    return x


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("n", ODD_SIZES)
def test_roundtrip_codes_in_range_and_on_levels(config, n):
    codec = DitheringCodec(**config)
    x = data(n, n)
    y = check_roundtrip(codec, x, CodecContext(step=1, rank=2))
    payload = codec.encode(x, CodecContext(step=1, rank=2))
    scale, codes = body_parts(codec, payload)
    s = codec.levels
    assert codes.size == n and np.abs(codes.astype(np.int64)).max(initial=0) <= s
    stat = np.linalg.norm(x.astype(np.float64)) if codec.norm == "l2" else np.abs(x).max(initial=0)
    assert scale >= stat and scale == np.float32(scale)
    assert scale <= np.nextafter(np.float32(stat), np.float32(np.inf))
    # each value decodes to sign * scale * level(|code|), and the sign follows x
    levels = codec.level_values()
    np.testing.assert_array_equal(
        y, (np.sign(codes) * (scale * levels[np.abs(codes.astype(np.int64))])).astype(np.float32))
    assert np.all(codes[x > 0] >= 0) and np.all(codes[x < 0] <= 0) and np.all(codes[x == 0] == 0)
    # every value goes to one of its two neighbouring levels (natural levels below
    # 2^-1074 are zero in float64, so compare level values, not indices)
    r = np.abs(x.astype(np.float64)) / scale if scale else np.zeros(n)
    got = levels[np.abs(codes.astype(np.int64))]
    lower = np.searchsorted(levels, r, side="right") - 1
    assert np.all((got == levels[lower]) | (got == levels[np.minimum(lower + 1, s)]))


def test_level_sets():
    np.testing.assert_array_equal(DitheringCodec(levels=4).level_values(), [0, .25, .5, .75, 1])
    np.testing.assert_array_equal(DitheringCodec(levels=4, partition="natural").level_values(),
                                  [0, 0.125, 0.25, 0.5, 1])


def test_int8_int16_switch_at_128():
    x = data(10, 0)
    for levels, width in ((127, 1), (128, 2), (32767, 2)):
        codec = DitheringCodec(levels=levels)
        assert codec.code_dtype.itemsize == width
        assert codec.encode(x).size == HEADER_SIZE + 4 + width * x.size


@pytest.mark.parametrize("config", [{"levels": 3}, {"levels": 4, "partition": "natural"},
                                    {"levels": 3, "norm": "l2"},
                                    {"levels": 2, "partition": "natural", "norm": "l2"}])
def test_unbiased_over_per_rank_seeds(config):
    codec = DitheringCodec(**config)
    x = np.random.default_rng(5).standard_normal(64).astype(np.float32)
    x[3] = 0.0
    draws = 4000
    acc = np.zeros(x.size)
    for rank in range(draws):
        ctx = CodecContext(step=7, rank=rank)
        acc += codec.decode(codec.encode(x, ctx), ctx)
    mean = acc / draws
    scale = np.float32(np.linalg.norm(x) if codec.norm == "l2" else np.abs(x).max())
    s = codec.levels
    if codec.partition == "linear":
        gap = np.full(x.size, scale / s)  # rounding between neighbours: variance <= gap^2 / 4
    else:
        gap = np.maximum(np.abs(x), scale * 2.0 ** (1 - s))
    np.testing.assert_array_less(np.abs(mean - x), 5 * gap / (2 * np.sqrt(draws)) + 1e-6)
    assert mean[3] == 0.0


def test_randomness_is_per_rank_and_reproducible():
    codec = DitheringCodec(levels=3)
    x = data(1000, 1)
    a = codec.encode(x, CodecContext(step=1, rank=0))
    np.testing.assert_array_equal(a, codec.encode(x, CodecContext(step=1, rank=0)))
    assert not np.array_equal(a, codec.encode(x, CodecContext(step=1, rank=1)))
    assert not np.array_equal(a, codec.encode(x, CodecContext(step=2, rank=0)))
    assert not np.array_equal(a, DitheringCodec(levels=3, seed=1).encode(
        x, CodecContext(step=1, rank=0)))


def test_natural_fast_path_matches_frexp_path():
    # the bit-level exponent path (s <= 1000) and the frexp/ldexp path give the same codes
    x = np.concatenate([data(5000, 2), np.float32([1e-30, 3e-8, -1e-12, 2.0 ** -20])])
    scale = float(np.abs(x).max())
    for s in (1, 2, 7, 30, 127):
        fast, exact = np.empty(x.size, np.int16), np.empty(x.size, np.int16)
        dither_natural(x, 1.0 / scale, s, 2.0 ** (s - 1), np.uint64(99), fast)
        dither_natural(x, 1.0 / scale, s, 0.0, np.uint64(99), exact)
        np.testing.assert_array_equal(fast, exact)


def test_natural_wide_dynamic_range_float64():
    codec = DitheringCodec(levels=2000, partition="natural")
    x = np.array([1.0, 1e-300, -3e-310, 0.0, -0.5, 2.0 ** -1000])
    y = codec.decode(codec.encode(x))
    assert y[0] == 1.0 and y[4] == -0.5 and y[3] == 0.0  # powers of two of the scale are exact
    assert np.all(np.isfinite(y)) and np.all(np.abs(y) <= 1.0)


def test_zero_scale_gives_zeros():
    for config in CONFIGS:
        codec = DitheringCodec(**config)
        payload = codec.encode(np.zeros(17, np.float32))
        scale, codes = body_parts(codec, payload)
        assert scale == 0.0 and not codes.any()
        y = codec.decode(payload)
        assert y.dtype == np.float32 and not y.any()


def test_l2_norm_scale():
    codec = DitheringCodec(levels=15, norm="l2")
    x = data(100, 3)
    scale, _ = body_parts(codec, codec.encode(x))
    assert scale == pytest.approx(np.linalg.norm(x.astype(np.float64)), rel=1e-7)


def test_overflow_flag_for_float64_beyond_float32():
    for config in ({}, {"norm": "l2"}):
        payload = DitheringCodec(**config).encode(np.array([1e39, 1.0]))
        assert Header.unpack(payload).flags == FLAG_OVERFLOW


@pytest.mark.parametrize("levels", [2, 7, 127])
def test_error_feedback_linear_bound(levels):
    # |p - D(C(p))| <= scale / s = max|p| / s <= (max|x| + max|e|) / s, whose fixed
    # point bounds the residual by max|x| / (s - 1) at every step
    out = run_error_feedback(DitheringCodec(levels=levels), d=500, steps=1000, seed=2)
    assert out["abs_e"].max() <= out["max_abs_x"] / (levels - 1) * (1 + 1e-6)


@pytest.mark.parametrize("levels", [3, 7])
def test_error_feedback_natural_bounded(levels):
    # natural rounding has relative variance <= 1/8 above level 1, so E||e|| <~ 0.55 ||x||
    out = run_error_feedback(DitheringCodec(levels=levels, partition="natural"),
                             d=500, steps=1000, seed=3)
    assert out["norm_e"].max() <= 1.0 * out["max_norm_x"]
    assert out["abs_e"].max() <= 2.0 * out["max_abs_x"]


@pytest.mark.parametrize("config", [{}, {"levels": 7, "partition": "natural", "norm": "l2"}])
def test_parallel_kernels_match_serial(monkeypatch, config):
    x = data((1 << 17) + 333, 4)
    check_parallel_matches_serial(monkeypatch, DitheringCodec(**config), x,
                                  CodecContext(step=2, rank=1))


@pytest.mark.parametrize("config", CONFIGS)
def test_config(config):
    check_config(DitheringCodec(**config))
    assert get_codec({"id": "dithering", **config}) == DitheringCodec(**config)


def test_bad_parameters():
    for kw in ({"levels": 0}, {"levels": 32768}, {"levels": 2.0}, {"levels": True},
               {"partition": "log"}, {"norm": "l1"}, {"seed": -1}):
        with pytest.raises(ValueError, match="dithering"):
            DitheringCodec(**kw)


def test_invalid_fields_raise_payload_error():
    for levels, bad_code in ((127, -128), (3, 4), (300, -301)):
        codec = DitheringCodec(levels=levels)
        payload = codec.encode(data(9, 5))
        bad = payload.copy()
        bad[HEADER_SIZE + 4:].view(codec.code_dtype)[5] = bad_code
        with pytest.raises(PayloadError, match="codes outside"):
            codec.decode(bad)
        for scale in (np.nan, np.inf, -2.0):
            bad = payload.copy()
            bad[HEADER_SIZE:HEADER_SIZE + 4] = np.frombuffer(struct.pack("<f", scale), np.uint8)
            with pytest.raises(PayloadError, match="scale"):
                codec.decode(bad)
    natural = DitheringCodec(levels=5, partition="natural")
    bad = natural.encode(data(9, 6))
    bad[-1] = 6
    with pytest.raises(PayloadError, match="codes outside"):
        natural.decode(bad)


def test_malformed_payloads():
    x = data(333, 7)
    for config in CONFIGS:
        check_malformed(DitheringCodec(**config), x)


def test_unaligned_payload_decodes():
    check_unaligned_decode(DitheringCodec(levels=1000), data(40, 8))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), which=st.sampled_from(range(len(CONFIGS))))
def test_random_bytes_never_crash(data, which):
    check_random_bytes(DitheringCodec(**CONFIGS[which]), data)
