"""The ``3lc`` codec: quantization, quartic layout, zero-run coding, wire format, safety.

Expected values come from a plain numpy re-statement of the codec spec
(section 1 of the codec specification), independent of the numba kernels.
"""

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import ccl
from ccl.codecs import HEADER_SIZE, Header, get_codec
from ccl.codecs.threelc import _kernels as K
from ccl.codecs.threelc import (ThreeLCCodec, quartic_decode, quartic_encode, zre_decode,
                                zre_encode)
from mpi_tests.helpers.codec_checks import (
    ODD_SIZES, check_config, check_malformed, check_random_bytes, check_roundtrip)

F32_MAX = float(np.finfo(np.float32).max)
OPERATING_POINTS = (1.0, 1.5, 1.75, 1.9)
S_GRID = sorted(set(np.linspace(1.0, 2.0, 41, endpoint=False).tolist()
                    + [1.9999999, float(np.nextafter(2.0, 0.0))]))


# ------------------------------------------------------------ numpy reference
def ref_scale(x, s):
    """M of the spec: float32(max|x| * s), capped, kept strictly below 2 max|x|."""
    m = float(np.abs(np.asarray(x, np.float64)).max()) if np.size(x) else 0.0
    M = np.float32(min(m * s, F32_MAX))
    if M > 0 and not 2 * m > float(M):
        M = np.nextafter(M, np.float32(0))
    return float(M)


def ref_quantize(x, M):
    """q = round_half_even(x / M) in {-1, 0, 1}; all zeros when M == 0."""
    if M == 0:
        return np.zeros(np.size(x), np.int8)
    return np.clip(np.rint(np.asarray(x, np.float64) / M), -1, 1).astype(np.int8)


def ref_quartic(q):
    """Five equal contiguous partitions, pad digit 1."""
    n = len(q)
    L = -(-n // 5)
    t = np.ones(5 * L, np.int64)
    t[:n] = np.asarray(q, np.int64) + 1
    P = t.reshape(5, L)
    return (81 * P[0] + 27 * P[1] + 9 * P[2] + 3 * P[3] + P[4]).astype(np.uint8)


def ref_zre(a):
    out, i = [], 0
    while i < len(a):
        if a[i] != 121:
            out.append(int(a[i]))
            i += 1
            continue
        j = i
        while j < len(a) and a[j] == 121:
            j += 1
        r = j - i
        out += [255] * (r // 14)
        rem = r % 14
        out += [] if rem == 0 else [121] if rem == 1 else [243 + rem - 2]
        i = j
    return np.array(out, np.uint8)


def ref_zre_decode(z):
    out = []
    for b in z:
        out += [int(b)] if b <= 242 else [121] * (int(b) - 241)
    return np.array(out, np.uint8)


def ref_decode(x, s):
    M = ref_scale(x, s)
    return (np.float32(M) * ref_quantize(x, M).astype(np.float32)), M


def body_fields(payload):
    """(layout, M, L, zre_len, zre bytes) of a 3lc payload."""
    body = payload[HEADER_SIZE:]
    layout, M, L, zlen = struct.unpack("<BfQQ", body[:21].tobytes())
    return layout, M, L, zlen, body[21:]


def raw_payload(n, zre, M=1.0, L=None, zlen=None, layout=0, s=1.0):
    """A payload with a handcrafted body (fields default to consistent values)."""
    codec = get_codec("3lc", s=s)
    zre = np.asarray(zre, np.uint8)
    L = -(-n // 5) if L is None else L
    zlen = zre.size if zlen is None else zlen
    body = np.concatenate([np.frombuffer(struct.pack("<BfQQ", layout, M, L, zlen), np.uint8),
                           zre])
    return codec, codec.pack(body, n)


# ------------------------------------------------------------ configuration
def test_registered_with_its_ids():
    codec = get_codec("3lc")
    assert type(codec) is ThreeLCCodec and codec.wire_id == 4 and codec.s == 1.0
    assert not codec.homomorphic and codec.error_feedback
    assert get_codec({"id": "3lc", "s": 1.5}).get_config() == {"id": "3lc", "s": 1.5}


@pytest.mark.parametrize("s", OPERATING_POINTS + (1, S_GRID[-1]))
def test_config_roundtrip(s):
    check_config(get_codec("3lc", s=s))
    assert type(get_codec("3lc", s=s).s) is float


@pytest.mark.parametrize("s", [0.0, -0.5, 2.0, 2.5, -1.5, math.nan, math.inf, "1.5", True, None])
def test_s_outside_range_is_rejected(s):
    with pytest.raises(ValueError, match="0 < s < 2"):
        get_codec("3lc", s=s)


def test_configs_do_not_read_each_other():
    payload = get_codec("3lc", s=1.5).encode(np.ones(10, np.float32))
    with pytest.raises(ccl.PayloadError, match="configuration"):
        get_codec("3lc", s=1.0).decode(payload)


# ------------------------------------------------------------ quartic layout
@pytest.mark.parametrize("n", list(range(0, 16)) + [99, 100, 101, 102, 103, 1000])
def test_quartic_roundtrip_every_length_mod_5(n):
    q = np.random.default_rng(n).integers(-1, 2, size=n).astype(np.int8)
    a = quartic_encode(q)
    assert a.size == -(-n // 5)
    np.testing.assert_array_equal(a, ref_quartic(q))
    np.testing.assert_array_equal(quartic_decode(a, n), q.astype(np.float32))


def test_quartic_layout_is_five_contiguous_partitions_with_pad_digit_1():
    # n = 7, L = 2: t = 2 1 0 1 2 0 2 | pad 1 1 1; partitions [2 1] [0 1] [2 0] [2 1] [1 1]
    q = [1, 0, -1, 0, 1, -1, 1]
    assert quartic_encode(q).tolist() == [81 * 2 + 0 + 9 * 2 + 3 * 2 + 1,
                                          81 * 1 + 27 * 1 + 0 + 3 * 1 + 1]
    assert quartic_encode([1]).tolist() == [202]      # 2 then four pad digits 1
    assert quartic_encode([-1]).tolist() == [40]
    assert quartic_encode([0, 0, 0, 0, 0]).tolist() == [121]
    assert quartic_encode([-1] * 5).tolist() == [0] and quartic_encode([1] * 5).tolist() == [242]
    # n = 6, L = 2: partitions 3 and 4 are all padding
    assert quartic_encode([1, -1, 0, 1, -1, 0]).tolist() == [81 * 2 + 27 * 1 + 9 * 0 + 3 + 1,
                                                             81 * 0 + 27 * 2 + 9 * 1 + 3 + 1]


def test_payload_bytes_of_a_small_vector():
    x = np.array([1, 0, -1, 0, 1, -1, 1], np.float32) * np.float32(0.75)
    codec = get_codec("3lc", s=1.0)  # the paper's multiplier: M = max|x|
    payload = codec.encode(x)
    expected = struct.pack("<BfQQ", 0, 0.75, 2, 2) + bytes([187, 112])
    assert payload[HEADER_SIZE:].tobytes() == expected
    assert Header.unpack(payload).n == 7
    np.testing.assert_array_equal(codec.decode(payload), x)


def test_s_below_one_clips_to_the_scale():
    # s = 0.5: M = max|x| / 2, so the largest values are sent as +-M and the rest of
    # them waits in the residual; the wire format is the same
    x = np.array([1, 0.2, -0.3, 0.5, -1], np.float32)
    y = get_codec("3lc", s=0.5).decode(get_codec("3lc", s=0.5).encode(x))
    np.testing.assert_array_equal(y, np.array([0.5, 0, -0.5, 0.5, -0.5], np.float32))


def test_quartic_decode_rejects_bad_digits():
    with pytest.raises(ccl.PayloadError, match="242"):
        quartic_decode(np.array([243], np.uint8), 5)
    with pytest.raises(ccl.PayloadError, match="pad digit"):
        quartic_decode(np.array([0], np.uint8), 1)     # pad digits 0 = value -1
    with pytest.raises(ccl.PayloadError, match="quartic bytes"):
        quartic_decode(np.array([121, 121], np.uint8), 5)


# ------------------------------------------------------------ zero-run encoding
@pytest.mark.parametrize("run, code", [(1, [121]), (2, [243]), (13, [254]), (14, [255]),
                                       (15, [255, 121]), (16, [255, 243]), (28, [255, 255]),
                                       (29, [255, 255, 121]), (100, [255] * 7 + [243])])
def test_zre_run_codes(run, code):
    assert zre_encode(np.full(run, 121, np.uint8)).tolist() == code


@pytest.mark.parametrize("run", [1, 2, 13, 14, 15, 28, 29, 41, 100])
@pytest.mark.parametrize("where", ["start", "middle", "end", "everywhere"])
def test_zre_roundtrip_runs(run, where):
    zeros = [121] * run
    pieces = {"start": [zeros, [5, 242, 0]], "middle": [[7, 120], zeros, [122, 0]],
              "end": [[1, 2, 3], zeros], "everywhere": [zeros, [9], zeros, [240, 1], zeros]}
    a = np.array(sum(pieces[where], []), np.uint8)
    z = zre_encode(a)
    np.testing.assert_array_equal(z, ref_zre(a))
    assert z.size <= a.size
    np.testing.assert_array_equal(ref_zre_decode(z), a)
    np.testing.assert_array_equal(zre_decode(z, a.size), a)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.just(121), st.integers(0, 242)), max_size=400))
def test_zre_never_expands_and_roundtrips(values):
    a = np.array(values, np.uint8)
    z = zre_encode(a)
    assert z.size <= a.size
    np.testing.assert_array_equal(z, ref_zre(a))
    np.testing.assert_array_equal(zre_decode(z, a.size), a)


def test_zre_decode_kernel_never_writes_past_its_buffer():
    buf = np.full(20, 77, np.uint8)
    for stream in ([255], [7] * 11, [7, 7, 7, 7, 7, 7, 7, 7, 7, 254], [121] * 9 + [243]):
        buf[:] = 77
        assert K.zre_decode(np.array(stream, np.uint8), buf[:10]) == K.ERR_OVERFLOW
        assert (buf[10:] == 77).all()
    assert K.zre_decode(np.array([7, 250], np.uint8), buf[:10]) == K.OK
    assert K.zre_decode(np.array([7, 249], np.uint8), buf[:10]) == K.ERR_SHORT


def test_zre_decode_rejects_impossible_lengths():
    with pytest.raises(ccl.PayloadError, match="expand"):
        zre_decode(np.array([255], np.uint8), 15)
    with pytest.raises(ccl.PayloadError, match="fewer"):
        zre_decode(np.array([254], np.uint8), 14)


# ------------------------------------------------------------ quantization
@pytest.mark.parametrize("s", S_GRID)
def test_max_element_decodes_to_plus_minus_M(s):
    rng = np.random.default_rng(int(s * 1000))
    codec = get_codec("3lc", s=s)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal(257).astype(dtype)
        for sign in (1, -1):
            x = x * sign
            payload = codec.encode(x)
            M = body_fields(payload)[1]
            i = int(np.argmax(np.abs(x)))
            y = codec.decode(payload)
            assert M > 0 and 2 * abs(float(x[i])) > M
            assert y[i] == np.float32(np.sign(x[i]) * M)


def test_s_just_below_2_keeps_the_maximum():
    # float32(m * s) rounds up to exactly 2m here; M must step down below it
    s = float(np.nextafter(2.0, 0.0))
    x = np.array([0.25, -1.0, 0.5], np.float32)
    assert np.float32(1.0 * s) == 2.0
    y = get_codec("3lc", s=s).decode(get_codec("3lc", s=s).encode(x))
    assert y[1] == -np.nextafter(np.float32(2.0), np.float32(0)) and y[0] == y[2] == 0


def test_ties_round_half_to_even():
    # M = 4: 2 is exactly M/2 and goes to 0; the next float32 up goes to 1
    x = np.array([4.0, 2.0, -2.0, np.nextafter(np.float32(2), np.float32(3)), 1.0], np.float32)
    codec = get_codec("3lc", s=1.0)
    y = codec.decode(codec.encode(x))
    assert y.tolist() == [4.0, 0.0, 0.0, 4.0, 0.0]


@pytest.mark.parametrize("n", [0, 1, 4, 5, 6, 71, 1000])
def test_zero_input_decodes_to_zeros(n):
    codec = get_codec("3lc", s=1.5)
    payload = codec.encode(np.zeros(n, np.float32))
    layout, M, L, zlen, zre = body_fields(payload)
    assert (layout, M, L) == (0, 0.0, -(-n // 5))
    np.testing.assert_array_equal(zre, ref_zre(np.full(L, 121, np.uint8)))
    y = codec.decode(payload)
    assert y.shape == (n,) and (y == 0).all() and not np.signbit(y).any()


def test_M_zero_with_nonzero_digits_is_rejected():
    codec, payload = raw_payload(5, [0], M=0.0)
    with pytest.raises(ccl.PayloadError, match="M is 0"):
        codec.decode(payload)


@pytest.mark.parametrize("n", ODD_SIZES)
@pytest.mark.parametrize("s", OPERATING_POINTS)
def test_roundtrip_matches_reference(n, s):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    y = check_roundtrip(get_codec("3lc", s=s), x)
    expected, M = ref_decode(x, s)
    np.testing.assert_array_equal(y, expected)
    if n:
        assert body_fields(get_codec("3lc", s=s).encode(x))[1] == M


def test_float64_input():
    x = np.random.default_rng(3).standard_normal(333) * 1e-3
    y = get_codec("3lc", s=1.5).decode(get_codec("3lc", s=1.5).encode(x))
    expected, _ = ref_decode(x, 1.5)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, expected)


def test_float64_beyond_float32_range_is_flagged_overflow():
    codec = get_codec("3lc")
    with pytest.raises(ccl.CompressionOverflowError):
        codec.decode(codec.encode(np.array([1.0, 1e39])))
    # float32's own maximum still fits: M is capped at it and the maximum survives
    x = np.array([F32_MAX, 1.0], np.float32)
    assert get_codec("3lc", s=1.9).decode(get_codec("3lc", s=1.9).encode(x)).tolist() == \
        [F32_MAX, 0.0]


def test_nonfinite_input_decodes_to_nan():
    codec = get_codec("3lc")
    assert np.isnan(codec.decode(codec.encode(np.array([1, np.nan, 3], np.float32)))).all()


@settings(max_examples=150, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(0, 300),
                    elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       s=st.floats(1.0, 2.0, exclude_max=True))
def test_property_decode_equals_reference(x, s):
    codec = get_codec("3lc", s=s)
    payload = codec.encode(x)
    expected, M = ref_decode(x, s)
    np.testing.assert_array_equal(codec.decode(payload), expected)
    layout, M_wire, L, zlen, zre = body_fields(payload)
    assert (layout, L, zlen) == (0, -(-x.size // 5), zre.size)
    assert M_wire == M
    np.testing.assert_array_equal(zre, ref_zre(ref_quartic(ref_quantize(x, M))))


@pytest.mark.parametrize("s", OPERATING_POINTS)
def test_error_feedback_conserves_mass_over_100_steps(s):
    codec = get_codec("3lc", s=s)
    rng = np.random.default_rng(7)
    e = np.zeros(500, np.float32)
    sent = np.zeros(500, np.float64)
    total_in = np.zeros(500, np.float64)
    for _ in range(100):
        x = rng.standard_normal(500).astype(np.float32)
        total_in += x
        p = x + e
        d = codec.decode(codec.encode(p))
        e = p - d
        sent += d
    # per element, to float32 rounding of ~200 additions of values of order 10
    np.testing.assert_allclose(sent + e, total_in, rtol=0, atol=1e-3)
    assert abs((sent + e).sum() - total_in.sum()) < 0.05
    assert np.abs(e).max() < 100, "the residual must not grow without bound"


# ------------------------------------------------------------ decoder safety
@pytest.mark.parametrize("n", [0, 1, 7, 333, 2000])
@pytest.mark.parametrize("s", [1.0, 1.9])
def test_malformed_payloads(n, s):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    x[: n // 2] = 0  # long zero runs as well as literal bytes
    check_malformed(get_codec("3lc", s=s), x, flips=100)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_never_crash(data):
    check_random_bytes(get_codec("3lc"), data)


@settings(max_examples=150, deadline=None)
@given(zre=st.lists(st.one_of(st.integers(0, 255), st.integers(243, 255)), max_size=60),
       n=st.integers(0, 400))
def test_random_zre_streams_never_crash(zre, n):
    codec, payload = raw_payload(n, zre)
    try:
        y = codec.decode(payload)
    except ccl.PayloadError:
        return
    assert y.shape == (n,)


@pytest.mark.parametrize("n, zre, match", [
    (10, [255], "expand past"),                 # one run of 14 into L = 2
    (15, [7, 7, 243], "expand past"),           # trailing run overflows L = 3
    (15, [7, 243, 7], "expand past"),           # literal after the bytes are full
    (15, [7], "fewer"),                         # stream ends early
    (15, [7, 7, 7, 7], "cannot expand"),        # more ZRE bytes than L
    (100, [255], "cannot expand"),              # L = 20 > 14 * 1
    (5, [], "cannot expand"),                   # L = 1 from nothing
    (1, [0], "pad digit"),                      # pad digits must be 1
    (2**40, [255], "cannot expand"),            # a flipped count is caught before allocating
])
def test_handcrafted_bad_streams(n, zre, match):
    codec, payload = raw_payload(n, zre)
    with pytest.raises(ccl.PayloadError, match=match):
        codec.decode(payload)


def test_handcrafted_good_stream():
    codec, payload = raw_payload(15, [200, 243], M=0.5)
    expected = quartic_decode(np.array([200, 121, 121], np.uint8), 15) * np.float32(0.5)
    np.testing.assert_array_equal(codec.decode(payload), expected)


@pytest.mark.parametrize("fields, match", [
    (dict(layout=1), "layout"),
    (dict(M=math.nan), "finite"),
    (dict(M=math.inf), "finite"),
    (dict(M=-1.0), "non-negative"),
    (dict(M=-0.0), "non-negative"),
    (dict(L=3), "quartic bytes"),
    (dict(zlen=1), "zero-run bytes"),
])
def test_bad_body_fields(fields, match):
    codec, payload = raw_payload(10, [7, 8], **fields)
    with pytest.raises(ccl.PayloadError, match=match):
        codec.decode(payload)


def test_short_body():
    codec = get_codec("3lc")
    payload = codec.encode(np.ones(10, np.float32))
    with pytest.raises(ccl.PayloadError, match="shorter"):
        codec.decode(codec.pack(payload[HEADER_SIZE:HEADER_SIZE + 20], 10))
