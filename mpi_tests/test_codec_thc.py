"""The ``thc`` codec: tables, rotation, packing, integer lanes, error and safety."""

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ccl
from ccl.codecs import FLAG_NONFINITE, FLAG_OVERFLOW, HEADER_SIZE, CodecContext, Header, \
    get_codec
from ccl.codecs.thc import _kernels as kernels
from ccl.codecs.thc._tables import GRID_POINTS, clamp_t, kernel_tables, receiver_table, \
    rounding_variance, sender_tables
from ccl.codecs.thc.codec import BODY_HEADER_SIZE, KIND_LANES, THCCodec, lane_bytes
from mpi_tests.helpers.codec_checks import (
    ODD_SIZES, check_config, check_malformed, check_random_bytes, check_roundtrip)

# Reference 4-bit tables of the authors' BytePS fork (docs/codecs/thc.md): (g, p) -> R
REFERENCE_TABLES = {
    (30, 1 / 32): [0, 3, 5, 7, 9, 11, 13, 14, 16, 17, 19, 21, 23, 25, 27, 30],
    (30, 1 / 128): [0, 4, 6, 8, 10, 12, 13, 14, 16, 17, 18, 20, 22, 24, 26, 30],
    (30, 1 / 512): [0, 4, 7, 9, 11, 12, 13, 14, 16, 17, 18, 19, 21, 23, 26, 30],
    (30, 1 / 16): list(range(0, 31, 2)),
    (34, 1 / 16): [0, 3, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 31, 34],
    (34, 1 / 32): [0, 3, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 31, 34],
    (34, 1 / 64): [0, 3, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 31, 34],
    (34, 1 / 128): [0, 3, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 31, 34],
    (34, 1 / 256): [0, 4, 7, 9, 11, 13, 15, 16, 18, 19, 21, 23, 25, 27, 30, 34],
    (34, 1 / 512): [0, 4, 7, 9, 11, 13, 15, 16, 18, 19, 21, 23, 25, 27, 30, 34],
    (34, 1 / 1024): [0, 5, 8, 10, 12, 14, 15, 16, 18, 19, 20, 22, 24, 26, 29, 34],
}


def gaussian(n, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def shared_ctx(xs, **kw):
    """Contexts of ranks 0..len(xs)-1 agreeing on the max norm, as a collective would."""
    top = max(float(np.linalg.norm(np.asarray(x, np.float64))) for x in xs)
    return [CodecContext(rank=r, shared=np.array([top]), **kw) for r in range(len(xs))]


def add_all(codec, payloads, ctx):
    total = payloads[0]
    for payload in payloads[1:]:
        total = codec.add(total, payload, ctx)
    return total


def body_fields(payload):
    return struct.unpack("<BBBBfIIQ", payload[HEADER_SIZE:HEADER_SIZE + BODY_HEADER_SIZE])


# ------------------------------------------------------------------ tables
@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("g", [15, 16, 30, 34, 101])
@pytest.mark.parametrize("p", [1 / 16, 1 / 32, 1 / 1024])
@pytest.mark.parametrize("table", ["optimal", "uniform"])
def test_tables_are_symmetric_increasing_levels(bits, g, p, table):
    levels = np.array(receiver_table(bits, g, p, table))
    q = 1 << bits
    assert levels.size == q and levels[0] == 0 and levels[-1] == g
    assert (np.diff(levels) > 0).all()
    np.testing.assert_array_equal(levels + levels[::-1], g)


@pytest.mark.parametrize("g, p", sorted(REFERENCE_TABLES))
def test_dp_regenerates_reference_tables(g, p):
    assert list(receiver_table(4, g, p)) == REFERENCE_TABLES[(g, p)]


def test_dp_extra_reference_points():
    # the 3-bit reference table (g = 16) and the default's rounding variance (docs/codecs/thc.md)
    assert receiver_table(3, 16, 1 / 32) == (0, 3, 5, 7, 9, 11, 13, 16)
    assert rounding_variance(receiver_table(4, 30, 1 / 32), 30, 1 / 32) == \
        pytest.approx(0.0135, abs=5e-5)
    assert clamp_t(1 / 32) == pytest.approx(2.1538746940614564, abs=1e-12)


def test_dp_is_optimal_against_brute_force():
    # every symmetric 3-bit table for g = 12: the DP's has the least rounding variance
    from itertools import combinations
    g, p = 12, 1 / 32
    best = min((rounding_variance((0, *left, *(g - r for r in reversed(left)), g), g, p),
                (0, *left, *(g - r for r in reversed(left)), g))
               for left in combinations(range(1, (g + 1) // 2), 3))
    assert receiver_table(3, g, p) == best[1]


def test_uniform_table():
    assert receiver_table(4, 30, 1 / 32, "uniform") == tuple(range(0, 31, 2))
    assert receiver_table(2, 30, 1 / 32, "uniform") == (0, 10, 20, 30)
    assert receiver_table(3, 30, 1 / 32, "uniform") == (0, 4, 9, 13, 17, 21, 26, 30)


@pytest.mark.parametrize("bits, g, p", [(4, 30, 1 / 32), (4, 34, 1 / 1024), (3, 30, 1 / 32),
                                        (2, 30, 1 / 32), (4, 101, 1 / 8)])
def test_sender_tables_are_unbiased(bits, g, p):
    levels = receiver_table(bits, g, p)
    xtab, ptab = sender_tables(levels, g)
    t = clamp_t(p)
    inc = 2 * t / g
    y = -t + np.arange(GRID_POINTS) * (2 * t / (GRID_POINTS - 1))
    r = np.array(levels, dtype=np.float64)
    assert ((0 <= ptab) & (ptab <= 1)).all() and (xtab <= len(levels) - 2).all()
    expected = (r[xtab] + ptab * (r[xtab + 1] - r[xtab]) - g / 2) * inc
    assert np.abs(expected - y).max() < 1e-6
    assert xtab[-1] == len(levels) - 2 and ptab[-1] == 1
    # the kernel's 32-bit thresholds give the same distribution
    xk, thr = kernel_tables(levels, g)
    kernel_mean = r[xk] + thr / 2.0**32 * (r[np.minimum(xk + 1, len(levels) - 1)] - r[xk])
    np.testing.assert_allclose(kernel_mean, r[xtab] + ptab * (r[xtab + 1] - r[xtab]),
                               atol=g * 2.0**-32)


# -------------------------------------------------------------- rotation
@pytest.mark.parametrize("block", [8, 64, 1024])
def test_hadamard_twice_is_identity_times_length(block):
    x = gaussian(block, 1)
    y = x.copy()
    kernels.fwht(y)
    # row 0 of H is all ones
    assert y[0] == pytest.approx(x.sum(), rel=1e-5)
    kernels.fwht(y)
    np.testing.assert_allclose(y / block, x, atol=1e-5)


@pytest.mark.parametrize("n", [1, 8, 1000, 1025, 3000])
def test_rotation_round_trip_and_orthonormal(n):
    block = 1024 if n > 8 else 8
    x = gaussian(n, 2)
    scale = 1 / math.sqrt(block)
    seed = np.uint64(CodecContext(step=3).seed(42))
    y = kernels.rotate(x, block, scale, seed, False)
    assert y.size == -(-n // block) * block
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-5)
    back = kernels.rotate(y, block, scale, seed, True)
    np.testing.assert_allclose(back[:n], x, atol=1e-5)
    np.testing.assert_allclose(back[n:], 0, atol=1e-5)
    # another seed is another rotation
    assert not np.allclose(kernels.rotate(x, block, scale, seed + np.uint64(1), False), y)


# --------------------------------------------------------------- packing
@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 8, 9, 15, 17, 64, 1001])
def test_packing_round_trip_matches_msb_first_bitstream(bits, n):
    idx = np.random.default_rng(n).integers(0, 1 << bits, n).astype(np.uint8)
    packed = kernels.pack_bits(idx, bits)
    stream = "".join(format(int(v), f"0{bits}b") for v in idx)
    stream += "0" * (-len(stream) % 8)
    assert packed.tolist() == [int(stream[i:i + 8], 2) for i in range(0, len(stream), 8)]
    np.testing.assert_array_equal(kernels.unpack_bits(packed, bits, n), idx)


def test_nibbles_high_first():
    idx = np.array([1, 2, 3], dtype=np.uint8)
    assert kernels.pack_bits(idx, 4).tolist() == [0x12, 0x30]
    assert kernels.pack_bits(np.array([1, 2, 3, 0, 1], np.uint8), 2).tolist() == [0x6C, 0x40]


# ------------------------------------------------------------ round trips
@pytest.mark.parametrize("n", sorted(set(ODD_SIZES) | {1025}))
def test_roundtrip_odd_sizes(n):
    codec = get_codec("thc")
    x = gaussian(n, n)
    payload = codec.encode(x)
    assert payload.size == HEADER_SIZE + BODY_HEADER_SIZE + (-(-n // 1024) * 512 if n else 0)
    y = check_roundtrip(codec, x)
    if n >= 64:
        assert np.sum((y - x) ** 2) / np.sum(x ** 2) < 0.05


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("table", ["optimal", "uniform"])
def test_roundtrip_every_setting(bits, table):
    codec = get_codec("thc", bits=bits, table=table, block=64)
    x = gaussian(1000, bits)
    y = check_roundtrip(codec, x)
    worst = {2: 0.7, 3: 0.15, 4: 0.05}[bits]
    assert np.sum((y - x) ** 2) / np.sum(x ** 2) < worst


def test_zero_input_sets_zero_flag():
    codec = get_codec("thc")
    x = np.zeros(1000, np.float32)
    payload = codec.encode(x)
    assert payload.size == HEADER_SIZE + BODY_HEADER_SIZE
    assert body_fields(payload)[3] == 1
    np.testing.assert_array_equal(codec.decode(payload), 0)
    total = codec.add(payload, payload)
    assert Header.unpack(total).contributors == 2
    np.testing.assert_array_equal(codec.decode(total), 0)


def test_float64_input_encodes_like_float32():
    codec = get_codec("thc")
    x = gaussian(3000, 3)
    np.testing.assert_array_equal(codec.encode(x), codec.encode(x.astype(np.float64)))
    huge = np.array([1e300, -3e299], dtype=np.float64)
    assert Header.unpack(codec.encode(huge)).flags == FLAG_OVERFLOW


def test_nonfinite_input_decodes_to_nan():
    codec = get_codec("thc")
    payload = codec.encode(np.array([1.0, np.nan], np.float32))
    assert Header.unpack(payload).flags == FLAG_NONFINITE
    assert np.isnan(codec.decode(payload)).all()
    other = codec.encode(np.ones(2, np.float32))
    assert Header.unpack(codec.add(payload, other)).flags == FLAG_NONFINITE


# ------------------------------------------------------ agreement, seeds
def test_shared_stats_and_shared_norm():
    codec = get_codec("thc")
    x = gaussian(100, 4)
    stats = codec.shared_stats(x)
    assert stats.dtype == np.float64 and stats.shape == (1,)
    assert stats[0] == pytest.approx(np.linalg.norm(x.astype(np.float64)))
    payload = codec.encode(x, CodecContext(shared=np.array([7.5])))
    assert body_fields(payload)[4] == 7.5
    assert body_fields(codec.encode(x))[4] == pytest.approx(stats[0], rel=1e-6)
    with pytest.raises(ValueError, match="shared"):
        codec.encode(x, CodecContext(shared=np.array([1.0, 2.0])))
    nan = codec.encode(x, CodecContext(shared=np.array([np.nan])))
    assert Header.unpack(nan).flags == FLAG_NONFINITE


def test_rotation_shared_and_rounding_per_rank():
    codec = get_codec("thc")
    x = gaussian(2048, 5)
    a0, a1 = (codec.encode(x, CodecContext(step=1, rank=r)) for r in (0, 1))
    assert np.array_equal(codec.encode(x, CodecContext(step=1, rank=0)), a0)
    assert not np.array_equal(a0, a1), "stochastic rounding must differ between ranks"
    assert body_fields(a0)[6] == body_fields(a1)[6], "the rotation is shared"
    assert body_fields(codec.encode(x, CodecContext(step=2)))[6] != body_fields(a0)[6]


def test_other_seed_or_context_is_a_payload_error():
    x = gaussian(500, 6)
    ctx = CodecContext(step=4, key="w", shared=np.array([40.0]))
    a = get_codec("thc", seed=1).encode(x, ctx)
    b = get_codec("thc", seed=2).encode(x, ctx)
    with pytest.raises(ccl.PayloadError):
        get_codec("thc", seed=1).add(a, b, ctx)
    with pytest.raises(ccl.PayloadError):
        get_codec("thc", seed=2).decode(a, ctx)
    codec = get_codec("thc", seed=1)
    later = CodecContext(step=5, key="w", shared=np.array([40.0]))
    with pytest.raises(ccl.PayloadError, match="seed, step"):
        codec.decode(a, later)
    with pytest.raises(ccl.PayloadError, match="seed, step"):
        codec.add(a, codec.encode(x, later), ctx)
    other_norm = codec.encode(x, CodecContext(step=4, key="w", shared=np.array([41.0])))
    with pytest.raises(ccl.PayloadError, match="max norm"):
        codec.add(a, other_norm, ctx)


# --------------------------------------------------------- homomorphism
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_lane_sum_is_exact(bits):
    codec = get_codec("thc", bits=bits, block=64)
    xs = [gaussian(1000, 10 + r) for r in range(3)]
    ctxs = shared_ctx(xs, step=7)
    payloads = [codec.encode(x, c) for x, c in zip(xs, ctxs)]
    total = add_all(codec, payloads, ctxs[0])
    levels = np.array(codec.levels)
    padded = 1024
    expected = sum(levels[kernels.unpack_bits(p[HEADER_SIZE + BODY_HEADER_SIZE:], bits, padded)]
                   for p in payloads)
    lanes = total[HEADER_SIZE + BODY_HEADER_SIZE:].view(np.uint8)
    np.testing.assert_array_equal(lanes, expected)
    # the order of additions does not matter, and decode(add) == sum of decodes
    again = codec.add(payloads[2], codec.add(payloads[1], payloads[0], ctxs[0]), ctxs[0])
    np.testing.assert_array_equal(again, total)
    decoded = sum(codec.decode(p, ctxs[0]).astype(np.float64) for p in payloads)
    np.testing.assert_allclose(codec.decode(total, ctxs[0]), decoded, atol=1e-5)


def test_default_granularity_keeps_byte_lanes_up_to_17_ranks():
    # g = 15 (every integer level of the 4-bit table) measured as accurate as the paper's
    # g = 30 on real gradients, and sums of up to 17 ranks fit 8-bit lanes (g = 30: 8)
    g = get_codec("thc").g
    assert g == 15 and lane_bytes(17, g) == 1 and lane_bytes(18, g) == 2
    assert lane_bytes(9, 30) == 2


def test_lanes_widen_with_contributors():
    codec = get_codec("thc", g=255, block=8)
    assert [lane_bytes(c, 255) for c in (1, 2, 257, 258)] == [1, 2, 2, 4]
    assert lane_bytes(4, 30) == 1 and lane_bytes(8, 30) == 1 and lane_bytes(9, 30) == 2
    assert lane_bytes(2**32 // 30, 30) == 4 and lane_bytes(2**32 // 30 + 1, 30) == 0
    # an input whose rotation is one spike: that coordinate clamps to level g on every
    # rank, so its lane reaches 260 * 255 > 65535
    seed = np.uint64(CodecContext().seed(codec.seed))
    spike = kernels.rotate(np.eye(1, 8, dtype=np.float32)[0], 8, 1 / math.sqrt(8), seed, True)
    xs = [spike + 0.01 * gaussian(8, 20 + r) for r in range(260)]
    ctxs = shared_ctx(xs)
    payloads = [codec.encode(x, c) for x, c in zip(xs, ctxs)]
    total, widths = payloads[0], {}
    decoded = codec.decode(payloads[0], ctxs[0]).astype(np.float64)
    for count, payload in enumerate(payloads[1:], start=2):
        total = codec.add(total, payload, ctxs[0])
        decoded += codec.decode(payload, ctxs[0])
        widths[count] = body_fields(total)[1]
        if count in (2, 257, 258, 260):
            np.testing.assert_allclose(codec.decode(total, ctxs[0]), decoded,
                                       atol=1e-4 * count)
    assert widths[2] == 2 and widths[257] == 2 and widths[258] == 4 and widths[260] == 4
    lanes = total[HEADER_SIZE + BODY_HEADER_SIZE:].view("<u4")
    assert lanes.max() == 260 * 255, "a 16-bit lane would have wrapped"


def lanes_payload(codec, n, contributors, lanes, max_norm=1.0, ctx=None):
    """A hand-made lanes payload (what a relay holding ``contributors`` partial sums sends)."""
    ctx = CodecContext() if ctx is None else ctx
    width = lane_bytes(contributors, codec.g)
    padded = -(-n // codec.block) * codec.block
    head = struct.pack("<BBBBfIIQ", KIND_LANES, width, codec.bits, 0, max_norm, codec.block,
                       codec._seed_hash(ctx), padded)
    data = np.asarray(lanes, dtype=f"<u{width}").tobytes()
    return codec.pack(np.frombuffer(head + data, np.uint8), n, contributors=contributors)


def test_overflow_is_flagged_never_wrapped():
    codec = get_codec("thc", block=8)
    most = (2**32 - 1) // codec.g
    full = lanes_payload(codec, 8, most, np.full(8, most * codec.g))
    assert codec.decode(full).shape == (8,)
    fresh = codec.encode(gaussian(8, 1), CodecContext(shared=np.array([1.0])))
    total = codec.add(full, fresh)
    assert Header.unpack(total).flags == FLAG_OVERFLOW
    assert Header.unpack(total).contributors == most + 1
    with pytest.raises(ccl.CompressionOverflowError):
        codec.decode(total)


# ------------------------------------------------------- error of the mean
def test_unbiased_mean_over_rank_seeds():
    codec = get_codec("thc", block=256)
    x = gaussian(1000, 30)
    ranks = 200
    # a max norm 4x the input's keeps the clamp (the only bias) out of the picture
    top = 4 * float(np.linalg.norm(x))
    ctxs = [CodecContext(step=2, rank=r, shared=np.array([top])) for r in range(ranks)]
    total = add_all(codec, [codec.encode(x, c) for c in ctxs], ctxs[0])
    mean = codec.decode(total, ctxs[0]) / ranks
    v = rounding_variance(codec.levels, codec.g, codec.p)
    err = np.sum((mean - x) ** 2)
    assert err < 2 * top**2 * v / ranks
    one = np.sum((codec.decode(codec.encode(x, ctxs[0]), ctxs[0]) - x) ** 2)
    assert err < one / 50, "the error of the mean must shrink like 1/ranks"


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_error_of_average_within_bound(bits):
    codec = get_codec("thc", bits=bits)
    levels = codec.levels
    inc = 2 * clamp_t(codec.p) / codec.g
    worst = (max(np.diff(levels)) * inc / 2) ** 2     # 0.046 for the default 4-bit table
    rng = np.random.default_rng(bits)
    for n in (2, 3, 4, 5):
        errs = []
        for trial in range(3):
            xs = [(rng.standard_normal(4096) * rng.uniform(0.5, 1.5)).astype(np.float32)
                  for _ in range(n)]
            ctxs = shared_ctx(xs, step=trial)
            total = add_all(codec, [codec.encode(x, c) for x, c in zip(xs, ctxs)], ctxs[0])
            mean = codec.decode(total, ctxs[0]) / n
            errs.append(np.sum((mean - np.mean(xs, axis=0)) ** 2) / ctxs[0].shared[0] ** 2)
        assert np.mean(errs) <= worst / n
        assert np.mean(errs) >= 0.2 * rounding_variance(levels, codec.g, codec.p) / n


# ---------------------------------------------------- config and safety
def test_config():
    check_config(get_codec("thc"))
    check_config(get_codec("thc", bits=3, g=16, p=0.01, table="uniform", seed=7, block=64))
    assert get_codec("thc").get_config() == {"id": "thc", "bits": 4, "g": 15, "p": 1 / 32,
                                             "table": "optimal", "seed": 42, "block": 1024}
    assert THCCodec.homomorphic and THCCodec.error_feedback and THCCodec.wire_id == 5


@pytest.mark.parametrize("bad", [dict(bits=5), dict(bits=True), dict(g=14), dict(g=2000),
                                 dict(g=30.0), dict(p=0), dict(p=1.0), dict(table="log"),
                                 dict(seed=-1), dict(seed=2**32), dict(block=1000),
                                 dict(block=4), dict(block=2**25)])
def test_bad_parameters(bad):
    with pytest.raises(ValueError):
        get_codec("thc", **bad)


@pytest.mark.parametrize("bits", [3, 4])
def test_malformed_packed_payloads(bits):
    codec = get_codec("thc", bits=bits, block=64)
    ctx = CodecContext(step=1, shared=np.array([30.0]))
    check_malformed(codec, gaussian(333, 40), ctx)
    check_malformed(codec, np.zeros(50, np.float32))


def test_malformed_lanes_payloads():
    codec = get_codec("thc", block=64)
    xs = [gaussian(333, 50 + r) for r in range(3)]
    ctxs = shared_ctx(xs, step=1)
    total = add_all(codec, [codec.encode(x, c) for x, c in zip(xs, ctxs)], ctxs[0])
    rng = np.random.default_rng(1)
    for _ in range(200):
        bad = total.copy()
        pos = int(rng.integers(0, bad.size))
        bad[pos] ^= np.uint8(1 << int(rng.integers(0, 8)))
        for op in (lambda p: codec.decode(p, ctxs[0]), lambda p: codec.add(p, total, ctxs[0])):
            try:
                op(bad)
            except ccl.PayloadError:
                pass
    # a lane above contributors * g, a wrong lane width, an unknown kind, a bad zero flag
    with pytest.raises(ccl.PayloadError, match="exceeds"):
        codec.decode(lanes_payload(codec, 64, 2, np.full(64, 61)))
    wide = total.copy()
    wide[HEADER_SIZE + 1] = 2
    kind = total.copy()
    kind[HEADER_SIZE] = 2
    zero = total.copy()
    zero[HEADER_SIZE + 3] = 1
    packed_many = total.copy()
    packed_many[HEADER_SIZE] = 0
    for bad in (wide, kind, zero, packed_many):
        with pytest.raises(ccl.PayloadError):
            codec.decode(bad, ctxs[0])


def test_huge_claimed_size_is_refused_before_allocation():
    codec = get_codec("thc")
    zero = codec.encode(np.zeros(4, np.float32))
    head = np.frombuffer(Header(5, 0, np.dtype(np.float32), 1, codec.config_hash, 2**40,
                                BODY_HEADER_SIZE).pack(), np.uint8)
    body = zero[HEADER_SIZE:].copy()
    body[16:24] = np.frombuffer(struct.pack("<Q", 2**40), np.uint8)
    with pytest.raises(ccl.PayloadError):
        codec.decode(np.concatenate([head, body]))


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_never_crash(data):
    check_random_bytes(get_codec("thc", block=8), data)


def test_lanes_too_narrow_for_their_contributor_count_are_a_payload_error():
    """A lanes payload of width 0 claiming 2^32-1 contributors (no lane holds that sum)."""
    codec = get_codec("thc")
    from ccl.tools.fuzz import edit_header
    payload = codec.encode(gaussian(10, 3))  # 32-byte header, 24-byte body header, data
    head = payload[:HEADER_SIZE + 24].copy()
    head[HEADER_SIZE] = 1  # lanes ...
    head[HEADER_SIZE + 1] = 0  # ... of width 0
    head = edit_header(edit_header(head, "contributors", 2**32 - 1), "body_len", 24)
    assert head.size == 56
    for op in (lambda: codec.decode(head), lambda: codec.add(head, head)):
        with pytest.raises(ccl.PayloadError, match="contributors"):
            op()
