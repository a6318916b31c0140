"""Every codec's device kernels against its CPU kernels, on small inputs.

Runs the numba.cuda kernels (under the CUDA simulator on machines without a GPU)
through :func:`ccl._xp.simulated_device`, so the inputs stay numpy arrays and the
CPU path is the oracle:

(a) payloads cross devices: the device decoder reads CPU payloads and the CPU
    decoder reads device payloads, to the same values;
(b) payloads are bit-identical where the codec is deterministic (all but SIDCo,
    whose fitted threshold sums float64 moments in another order);
(c) homomorphic adds agree.
"""

import numpy as np
import pytest

from ccl import PayloadError
from ccl._xp import simulated_device
from ccl.codecs import CodecContext, get_codec
from ccl.codecs.randomk._cuda import randomk_indices as device_randomk_indices
from ccl.codecs.randomk import randomk_indices

SIZES = [0, 1, 7, 1000, 1009]
# (spec, bit-identical payloads)
SPECS = [
    ("none", True), ("fp16", True), ("bf16", True),
    ({"id": "3lc", "s": 1.5}, True), ({"id": "3lc", "s": 1.0}, True),
    ({"id": "thc", "bits": 4, "block": 8}, True), ({"id": "thc", "bits": 3, "block": 16}, True),
    ({"id": "thc", "bits": 2, "block": 64}, True),
    ("onebit", True),
    ({"id": "randomk", "density": 0.3}, True), ({"id": "randomk", "density": 0.8, "scale": True},
                                                True),
    ({"id": "dithering", "levels": 5}, True),
    ({"id": "dithering", "levels": 200, "partition": "natural", "norm": "l2"}, True),
    ({"id": "dithering", "levels": 1200, "partition": "natural"}, True),
    ({"id": "topk", "density": 0.1}, True), ({"id": "dgc", "density": 0.1}, True),
    ({"id": "sparseloco", "density": 0.1}, True), ({"id": "sparseloco", "k": 3}, True),
    ({"id": "sparseloco", "density": 0.1, "block": 64}, True),
    ({"id": "sidco", "density": 0.05}, False),
    ({"id": "sidco", "density": 0.05, "dist": "gamma", "stages": 2}, False),
]


def test_thc_blocks_past_shared_memory_match_the_cpu():
    # blocks above SHARED_BLOCK take a launch per transform stage instead of shared memory
    from ccl.codecs.thc._cuda import SHARED_BLOCK

    codec = get_codec("thc", bits=4, block=2 * SHARED_BLOCK)
    x = _input(1009)
    ctx = _context(codec, x)
    cpu = codec.encode(x, ctx)
    with simulated_device():
        dev = codec.encode(x, ctx)
        decoded = codec.decode(cpu, ctx)
    assert cpu.tobytes() == dev.tobytes()
    assert _same(decoded, codec.decode(cpu, ctx))


def test_encode_never_writes_in_front_of_its_input():
    # the header goes in front of a twin's own body buffer only, never into an input that
    # happens to sit HEADER_SIZE bytes into a larger array
    buf = np.random.default_rng(0).standard_normal(1032).astype(np.float32)
    before = buf.copy()
    for spec in ("none", "fp16", "onebit", {"id": "thc", "bits": 4, "block": 8}):
        codec = get_codec(spec)
        x = buf[8:]
        with simulated_device():
            payload = codec.encode(x, _context(codec, x))
        assert np.array_equal(buf, before), spec
        assert payload.tobytes() == codec.encode(x, _context(codec, x)).tobytes(), spec


@pytest.mark.parametrize("case", ["normal", "ties", "zeros", "misleading sample"])
def test_sampled_top_k_is_exact(monkeypatch, case):
    # the device's top-k of a large input (made small here) keeps the CPU's exact choice
    from ccl.codecs.sparse import _common, _cuda

    monkeypatch.setattr(_cuda, "SAMPLED_TOP_K", 64)
    monkeypatch.setattr(_cuda, "_SAMPLE", 32)
    n = 1001
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    if case == "ties":
        x = np.round(x * 2) / 2
    elif case == "zeros":
        x[np.arange(n) % 3 != 0] = 0.0
    elif case == "misleading sample":  # the sampled elements are the largest by far
        x[::n // 32] = 100.0
    for k in (1, 30, 300, n - 1):
        want = _common.top_k(x, k)
        with simulated_device():
            got = _common.top_k(x, k)
        assert np.array_equal(got, want), (case, k)


def _id(spec):
    return spec if isinstance(spec, str) else "-".join(f"{v}" for v in spec.values())


def _input(n, seed=0, dtype=np.float32):
    x = np.random.default_rng([seed, n]).standard_normal(n).astype(dtype)
    x[n // 10:n // 3] = 0.0  # zero runs (3LC's run coding, sparse gaps)
    if n > 7:
        x[5] = -x[6]  # a tie for top-k
    return x


def _context(codec, x, rank=2):
    shared = codec.shared_stats(x) if codec.codec_id == "thc" else None
    return CodecContext(step=3, key="w", chunk=1, rank=rank, shared=shared, n=x.size)


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("spec,identical", SPECS, ids=[_id(s) for s, _ in SPECS])
@pytest.mark.parametrize("n", SIZES)
def test_payloads_cross_devices(spec, identical, n):
    codec = get_codec(spec)
    x = _input(n)
    ctx = _context(codec, x)
    cpu = codec.encode(x, ctx)
    with simulated_device():
        dev = codec.encode(x, ctx)
        cpu_on_dev = codec.decode(cpu, ctx)
        dev_on_dev = codec.decode(dev, ctx)
    assert dev.dtype == np.uint8 and dev.ndim == 1
    assert _same(cpu_on_dev, codec.decode(cpu, ctx)), "device decoder misreads a CPU payload"
    assert _same(dev_on_dev, codec.decode(dev, ctx)), "CPU decoder misreads a device payload"
    if identical:
        assert cpu.tobytes() == dev.tobytes(), "device payload differs from the CPU's"


@pytest.mark.parametrize("spec", ["fp16", "bf16", "none", {"id": "thc", "bits": 4, "block": 8},
                                  {"id": "randomk", "density": 0.5}], ids=_id)
@pytest.mark.parametrize("n", [1, 7, 1009])
def test_homomorphic_add_matches(spec, n):
    codec = get_codec(spec)
    a, b = _input(n, seed=1), _input(n, seed=2)
    shared = np.maximum(codec.shared_stats(a), codec.shared_stats(b))
    ctx_a = CodecContext(step=1, key="k", rank=0, shared=shared, n=n)
    ctx_b = CodecContext(step=1, key="k", rank=1, shared=shared, n=n)
    pa, pb = codec.encode(a, ctx_a), codec.encode(b, ctx_b)
    cpu = codec.add(codec.add(pa, pb, ctx_a), pb, ctx_a)  # also lanes + packed (THC)
    with simulated_device():
        da, db = codec.encode(a, ctx_a), codec.encode(b, ctx_b)
        dev = codec.add(codec.add(da, db, ctx_a), db, ctx_a)
        decoded = codec.decode(dev, ctx_a)
    assert cpu.tobytes() == dev.tobytes()
    assert _same(decoded, codec.decode(cpu, ctx_a))


def test_fp16_decode_every_bit_pattern():
    codec = get_codec("fp16")
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    payload = codec.pack(halves.view(np.uint8), halves.size)
    with simulated_device():
        dev = codec.decode(payload)
    assert dev.view(np.uint32).tobytes() == codec.decode(payload).view(np.uint32).tobytes()


def test_fp16_encode_edges():
    x = np.array([0.0, -0.0, 5.96e-8, 2.98e-8, 2.9802326e-08, 6.1e-5, 6.09e-5, 65504.0, -65519.0,
                  1e-40, 3.14159, -2.5e-6], dtype=np.float32)
    codec = get_codec("fp16")
    with simulated_device():
        dev = codec.encode(x)
    assert dev.tobytes() == codec.encode(x).tobytes()
    with simulated_device():  # 65520 rounds to Inf: flagged, as on the CPU
        over = codec.encode(np.array([1.0, 65520.0], np.float32))
    assert over.tobytes() == codec.encode(np.array([1.0, 65520.0], np.float32)).tobytes()


@pytest.mark.parametrize("d,k", [(1, 1), (10, 3), (10, 7), (10, 10), (257, 1), (257, 128),
                                 (257, 129), (1000, 990), (4099, 40)])
def test_randomk_indices_match_floyd(d, k):
    from ccl._xp import SIMULATED

    for seed in (0, 12345, 2**63 - 25):
        assert np.array_equal(device_randomk_indices(seed, d, k, SIMULATED),
                              randomk_indices(seed, d, k))


@pytest.mark.parametrize("run", [1, 2, 13, 14, 15, 28, 29, 70, 71])
def test_3lc_zero_runs(run):
    """Runs of zero bytes around the 14-byte limit of one run code, at every position."""
    codec = get_codec("3lc")
    x = np.ones(5 * 40, np.float32)
    for start in (0, 3, 40 - run if run < 40 else 0):
        y = x.copy()
        for k in range(5):  # zero the same quartic bytes in all five partitions
            y[k * 40 + start:k * 40 + min(start + run, 40)] = 0.0
        with simulated_device():
            dev = codec.encode(y)
        assert dev.tobytes() == codec.encode(y).tobytes()


def test_thc_float64_and_local_norm_decode_across():
    codec = get_codec("thc", bits=4, block=16)
    x = _input(100, dtype=np.float64)
    cpu = codec.encode(x)  # local norms: summed in another order on each side
    with simulated_device():
        dev = codec.encode(x)
        back = codec.decode(cpu)
    assert _same(back, codec.decode(cpu))
    assert codec.decode(dev).shape == (100,)


def test_nonfinite_and_overflow_flags_match():
    for spec in ("fp16", "onebit", "3lc", "topk", "thc"):
        codec = get_codec(spec)
        x = _input(50)
        x[7] = np.nan
        with simulated_device():
            dev = codec.encode(x)
            decoded = codec.decode(dev)
        assert dev.tobytes() == codec.encode(x).tobytes()
        assert np.isnan(decoded).all()
    big = np.full(20, 1e300, np.float64)
    for spec in ("onebit", "3lc", "randomk"):
        codec = get_codec(spec, **({"density": 0.5} if spec == "randomk" else {}))
        with simulated_device():
            dev = codec.encode(big)
        assert dev.tobytes() == codec.encode(big).tobytes()


@pytest.mark.parametrize("spec", [s for s, _ in SPECS], ids=[_id(s) for s, _ in SPECS])
def test_device_decoder_rejects_what_the_cpu_rejects(spec):
    """Truncations and bit flips: the device decoder raises PayloadError where the CPU does."""
    codec = get_codec(spec)
    x = _input(300)
    ctx = _context(codec, x)
    payload = codec.encode(x, ctx)
    rng = np.random.default_rng(7)
    variants = [payload[:-1], payload[:40], payload[:32]]
    for _ in range(12):
        bad = payload.copy()
        pos = int(rng.integers(32, payload.size))
        bad[pos] ^= np.uint8(1 << int(rng.integers(8)))
        variants.append(bad)
    for bad in variants:
        try:
            expected = codec.decode(bad, ctx)
        except PayloadError:
            with simulated_device(), pytest.raises(PayloadError):
                codec.decode(bad, ctx)
            continue
        with simulated_device():
            got = codec.decode(bad, ctx)
        assert _same(got, expected)


def test_sidco_device_selection_is_a_valid_threshold():
    """SIDCo on the device: its own threshold, a count near the CPU's, a payload both read."""
    codec = get_codec("sidco", density=0.02)
    x = np.random.default_rng(3).laplace(size=5000).astype(np.float32)
    with simulated_device():
        dev = codec.encode(x)
    values = codec.decode(dev)
    chosen = np.flatnonzero(values)
    cpu_count = np.count_nonzero(codec.decode(codec.encode(x)))
    assert abs(chosen.size - cpu_count) <= 2
    assert np.array_equal(values[chosen], x[chosen])
    assert np.abs(x[chosen]).min() >= np.abs(np.delete(x, chosen)).max() - 1e-6 or \
        chosen.size <= np.ceil(4 * 100 / 3)
