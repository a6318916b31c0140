"""The ``randomk`` codec: shared-seed random-k, values only, exactly homomorphic."""

import itertools
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ccl.codecs import FLAG_OVERFLOW, HEADER_SIZE, CodecContext, Header, RandomKCodec, get_codec
from ccl.codecs.randomk import randomk_indices
from ccl.errors import PayloadError
from mpi_tests.helpers.codec_checks import (
    ODD_SIZES, check_config, check_malformed, check_random_bytes, check_roundtrip)
from mpi_tests.helpers.lossy_checks import (
    check_parallel_matches_serial, check_unaligned_decode, run_error_feedback)

CONFIGS = [{}, {"density": 0.25, "seed": 3}, {"k": 5}, {"density": 0.9, "scale": True},
           {"density": 1.0, "scale": False}]


@pytest.mark.parametrize("d", [1, 2, 63, 64, 65, 100, 1000, 4097])
def test_indices_distinct_sorted_in_range(d):
    for k in sorted({0, 1, 2, d // 3, d // 2, d // 2 + 1, d - 1, d} - {-1}):
        if not 0 <= k <= d:
            continue
        idx = randomk_indices(12345 + d, d, k)
        assert idx.dtype == np.int64 and idx.size == k
        assert np.all(np.diff(idx) > 0), "indices must be strictly ascending (distinct)"
        if k:
            assert idx[0] >= 0 and idx[-1] < d
    np.testing.assert_array_equal(randomk_indices(7, d, d), np.arange(d))


@pytest.mark.parametrize("density", [0.01, 0.7])
def test_parallel_kernels_match_serial(monkeypatch, density):
    codec = RandomKCodec(density=density, scale=True)
    n = (1 << 17) + 64 * 1024 * 2 + 5
    x = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    ctx = CodecContext(step=3, key="big")
    _, y = check_parallel_matches_serial(monkeypatch, codec, x, ctx)
    idx = codec.indices(n, ctx)
    assert idx.size == codec.count(n) and np.all(np.diff(idx) > 0)
    assert np.count_nonzero(y) == idx.size


def test_every_subset_equally_likely():
    # Floyd's algorithm (and its complement for k > d/2) gives uniform k-subsets
    for d, k in ((6, 3), (6, 4)):
        counts = dict.fromkeys(itertools.combinations(range(d), k), 0)
        draws = 12000
        for s in range(draws):
            counts[tuple(randomk_indices(s, d, k).tolist())] += 1
        expected = draws / len(counts)
        chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
        assert chi2 < 60, f"chi-square {chi2:.1f} over {len(counts) - 1} degrees of freedom"


def test_indices_shared_across_ranks_and_fresh_each_step():
    codec = RandomKCodec(density=0.1, seed=9)
    d = 1000
    base = codec.indices(d, CodecContext(step=4, key="w", chunk=2, rank=0))
    for rank in (1, 5):
        np.testing.assert_array_equal(
            codec.indices(d, CodecContext(step=4, key="w", chunk=2, rank=rank)), base)
    for other in (CodecContext(step=5, key="w", chunk=2), CodecContext(step=4, key="b", chunk=2),
                  CodecContext(step=4, key="w", chunk=3)):
        assert not np.array_equal(codec.indices(d, other), base)
    assert not np.array_equal(RandomKCodec(density=0.1, seed=10).indices(
        d, CodecContext(step=4, key="w", chunk=2)), base)
    # what two ranks encode lands on the same support
    x = np.random.default_rng(0).standard_normal((2, d)).astype(np.float32) + 5
    ctxs = (CodecContext(step=4, rank=0), CodecContext(step=4, rank=1))
    supports = [np.flatnonzero(codec.decode(codec.encode(x[r], ctx), ctx))
                for r, ctx in enumerate(ctxs)]
    np.testing.assert_array_equal(supports[0], supports[1])


def test_count_from_density_or_k():
    assert RandomKCodec().count(16 * 2**20) == 167772
    assert RandomKCodec(density=0.07).count(100) == 7
    assert RandomKCodec(density=1e-6).count(10) == 1
    assert RandomKCodec(k=5).count(3) == 3
    assert RandomKCodec(k=5).count(100) == 5
    assert RandomKCodec().count(0) == 0


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("n", ODD_SIZES)
def test_roundtrip_keeps_values_at_the_indices(config, n):
    codec = RandomKCodec(**config)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    ctx = CodecContext(step=n, key="k", chunk=1)
    y = check_roundtrip(codec, x, ctx)
    idx = codec.indices(n, ctx)
    factor = np.float32(n / idx.size) if codec.scale and n else np.float32(1)
    np.testing.assert_array_equal(y[idx], (x[idx].astype(np.float64) * (n / max(idx.size, 1)))
                                  .astype(np.float32) if codec.scale else x[idx])
    assert np.count_nonzero(np.delete(y, idx)) == 0
    payload = codec.encode(x, ctx)
    assert payload.size == HEADER_SIZE + 16 + 4 * idx.size
    assert factor > 0


def test_add_is_exactly_homomorphic():
    rng = np.random.default_rng(1)
    for config in ({"density": 0.3}, {"density": 0.3, "scale": True}, {"k": 1}):
        codec = RandomKCodec(**config)
        ctx = CodecContext(step=2, key="layer", chunk=0)
        xs = [rng.standard_normal(257).astype(np.float32) for _ in range(3)]
        ps = [codec.encode(x, CodecContext(step=2, key="layer", chunk=0, rank=r))
              for r, x in enumerate(xs)]
        total = codec.add(codec.add(ps[0], ps[1], ctx), ps[2], ctx)
        assert Header.unpack(total).contributors == 3
        expected = (codec.decode(ps[0], ctx) + codec.decode(ps[1], ctx)) + codec.decode(ps[2], ctx)
        np.testing.assert_array_equal(codec.decode(total, ctx), expected)


def test_other_seed_is_detected():
    codec = RandomKCodec(density=0.2)
    x = np.random.default_rng(2).standard_normal(100).astype(np.float32)
    a = codec.encode(x, CodecContext(step=1))
    b = codec.encode(x, CodecContext(step=2))
    with pytest.raises(PayloadError, match="seed"):
        codec.add(a, b)
    with pytest.raises(PayloadError, match="seed"):
        codec.decode(a, CodecContext(step=2))
    with pytest.raises(PayloadError):  # another base seed is another configuration
        RandomKCodec(density=0.2, seed=1).decode(a, CodecContext(step=1))
    with pytest.raises(PayloadError):
        codec.add(a, codec.encode(x[:50], CodecContext(step=1)))


def test_unbiased_when_scaled_without_error_feedback():
    # each index is kept with probability k/d and scaled by d/k: E[decode] = x
    codec = RandomKCodec(density=0.1, scale=True)
    x = np.random.default_rng(3).standard_normal(200).astype(np.float32)
    steps = 4000
    acc = np.zeros(x.size)
    for t in range(steps):
        ctx = CodecContext(step=t)
        acc += codec.decode(codec.encode(x, ctx), ctx)
    mean = acc / steps
    # per element the estimator's standard deviation is |x| sqrt(d/k - 1) = 3 |x|
    np.testing.assert_array_less(np.abs(mean - x), 5 * 3 * np.abs(x) / np.sqrt(steps) + 1e-6)
    # unscaled, the mean is x * k/d instead
    plain = RandomKCodec(density=0.1)
    acc[:] = 0
    for t in range(steps):
        ctx = CodecContext(step=t)
        acc += plain.decode(plain.encode(x, ctx), ctx)
    np.testing.assert_allclose(acc / steps, 0.1 * x, atol=0.1 * 0.15 * np.abs(x).max() + 1e-6)


def test_error_feedback_keeps_exactly_what_was_not_sent():
    # e = p off the support, 0 on it (up to float32 rounding of p): the residual of an
    # element is the sum of its inputs since it was last sent, so
    # |e_i| <= (steps since i was last sent) * max|x|.
    d, steps = 400, 1000
    codec = RandomKCodec(density=0.05)
    last_sent = np.full(d, -1)
    worst_gap = 0

    def check(t, x, p, y, e):
        nonlocal worst_gap
        sent = codec.indices(d, CodecContext(step=t))
        np.testing.assert_array_equal(np.flatnonzero(y), sent[y[sent] != 0])
        np.testing.assert_array_equal(y[sent], p[sent].astype(np.float32))
        off = np.ones(d, bool)
        off[sent] = False
        np.testing.assert_array_equal(e[off], p[off])
        assert np.abs(e[sent]).max() <= 1e-6 * max(1.0, np.abs(p).max())
        last_sent[sent] = t
        worst_gap = max(worst_gap, int((t - last_sent).max()))

    out = run_error_feedback(codec, d=d, steps=steps, seed=4, on_step=check)
    assert out["abs_e"].max() <= (worst_gap + 1e-3) * out["max_abs_x"]
    # the residual of a random walk over a geometric gap: far below the worst case
    assert out["abs_e"].max() <= 25 * out["max_abs_x"]


def test_overflow_is_flagged():
    codec = RandomKCodec(density=1.0)
    big = np.full(4, 3e38, np.float32)
    a = codec.encode(big)
    assert Header.unpack(codec.add(a, a)).flags == FLAG_OVERFLOW
    assert Header.unpack(RandomKCodec(k=1, scale=True).encode(big)).flags == FLAG_OVERFLOW
    assert Header.unpack(codec.encode(np.array([1e300]))).flags == FLAG_OVERFLOW


@pytest.mark.parametrize("config", CONFIGS)
def test_config(config):
    check_config(RandomKCodec(**config))
    assert get_codec({"id": "randomk", **config}) == RandomKCodec(**config)


def test_bad_parameters():
    for kw in ({"density": 0.1, "k": 3}, {"density": 0.0}, {"density": 1.5}, {"density": "x"},
               {"k": 0}, {"k": 2.5}, {"k": True}, {"seed": -1}, {"seed": 1.5}, {"scale": "yes"}):
        with pytest.raises(ValueError, match="randomk"):
            RandomKCodec(**kw)


def test_invalid_fields_raise_payload_error():
    codec = RandomKCodec(density=0.5)
    x = np.random.default_rng(5).standard_normal(20).astype(np.float32)
    payload = codec.encode(x)
    for offset, value in ((0, struct.pack("<Q", 11)), (12, b"\x01"), (13, b"\x01"),
                          (16, struct.pack("<f", np.nan))):
        bad = payload.copy()
        bad[HEADER_SIZE + offset:HEADER_SIZE + offset + len(value)] = np.frombuffer(value, np.uint8)
        with pytest.raises(PayloadError):
            codec.decode(bad)
        with pytest.raises(PayloadError):
            codec.add(bad, payload)
    # an element count beyond what may be allocated unchecked
    huge = RandomKCodec(k=3).pack(np.zeros(28, np.uint8), 2**40)
    with pytest.raises(PayloadError, match="elements"):
        RandomKCodec(k=3).decode(huge)


def test_malformed_payloads():
    x = np.random.default_rng(6).standard_normal(333).astype(np.float32)
    for config in CONFIGS:
        check_malformed(RandomKCodec(**config), x, CodecContext(step=3))


def test_unaligned_payload_decodes():
    check_unaligned_decode(RandomKCodec(density=0.3), np.arange(1, 50, dtype=np.float32))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), which=st.sampled_from(range(len(CONFIGS))))
def test_random_bytes_never_crash(data, which):
    check_random_bytes(RandomKCodec(**CONFIGS[which]), data)
