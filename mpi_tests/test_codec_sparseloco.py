"""The ``sparseloco`` codec: top-k per chunk, the kept values in 2-bit levels."""

import json
import struct

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.codecs import HEADER_SIZE, CodecContext, get_codec
from ccl.codecs.sparse import _common as sparse, sparseloco
from mpi_tests.helpers.codec_checks import (
    ODD_SIZES, check_config, check_header_edits, check_malformed, check_random_bytes,
    check_roundtrip)
from ccl.testing import assert_same_on_all_ranks, rank_input
from mpi_tests.helpers.lossy_checks import run_error_feedback

CONFIGS = [{"id": "sparseloco"}, {"id": "sparseloco", "density": 0.01},
           {"id": "sparseloco", "k": 5}, {"id": "sparseloco", "density": 0.5},
           {"id": "sparseloco", "density": 0.05, "block": 64}, {"id": "sparseloco", "k": 3,
                                                               "block": 100}]


def _levels(y):
    return np.unique(np.abs(y[y != 0]))


def _topk_per_block(codec, x):
    """What ``topk`` keeps of each block of ``x`` (the whole of it without a block), exactly."""
    config = {"density": codec.density} if codec.k is None else {"k": codec.k}
    block = codec.block or max(x.size, 1)
    if codec.k is None and x.size > block:  # the count comes from the block length
        config = {"k": max(1, int(np.ceil(codec.density * block)))}
    top = get_codec("topk", **config)
    return np.concatenate([top.decode(top.encode(x[i:i + block]))
                           for i in range(0, x.size, block)] or [np.zeros(0, np.float32)])


# ------------------------------------------------------------ configuration
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: json.dumps(c))
def test_config_roundtrip(config):
    codec = get_codec(config)
    check_config(codec)
    assert (codec.homomorphic, codec.error_feedback, codec.sparse) == (False, True, True)


def test_id_and_defaults():
    codec = get_codec("sparseloco")
    assert codec.wire_id == 12
    assert codec.get_config() == {"id": "sparseloco", "density": 0.02, "k": None,
                                  "block": None}
    assert get_codec("sparseloco", k=3, block=64).get_config() == {
        "id": "sparseloco", "density": None, "k": 3, "block": 64}
    assert codec.bits_per_value < get_codec("topk", density=0.02).bits_per_value


@pytest.mark.parametrize("params", [{"k": 0}, {"k": 2.5}, {"density": 0.0}, {"density": 1.5},
                                    {"density": 0.1, "k": 4}, {"density": "0.1"}, {"block": 0},
                                    {"block": 64.0}, {"block": True}])
def test_bad_parameters_raise_value_error(params):
    with pytest.raises(ValueError):
        get_codec("sparseloco", **params)


# ------------------------------------------------------------- round trips
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: json.dumps(c))
@pytest.mark.parametrize("n", ODD_SIZES + (5000,))
def test_topk_support_and_two_levels_per_sign(config, n):
    """The support is top-k's, each value keeps its sign and decodes to one of two levels.

    Where the sparse body would not be smaller than the dense array (tiny
    chunks), the dense encoding sends the values exactly, as top-k's does.
    """
    x = np.random.default_rng(n).laplace(size=n).astype(np.float32)
    codec = get_codec(config)
    y = check_roundtrip(codec, x)
    assert y.dtype == np.float32
    exact = _topk_per_block(codec, x)
    np.testing.assert_array_equal(y != 0, exact != 0)
    kept = exact[exact != 0]
    if n and codec.encode(x)[HEADER_SIZE] == sparse.ENC_DENSE:
        np.testing.assert_array_equal(y, exact)
        return
    if kept.size == 0:
        return
    assert (np.sign(y[y != 0]) == np.sign(kept)).all()
    ordered, half = np.sort(np.abs(kept)), kept.size // 2
    low, high = ordered[half // 2], ordered[half + (kept.size - half) // 2]
    assert set(_levels(y)) <= {low, high}
    np.testing.assert_array_equal(np.abs(y[exact != 0]),
                                  np.where(np.abs(kept) >= ordered[half], high, low))


@pytest.mark.parametrize("n, block, k", [(1000, 64, 3), (1000, 100, 1), (4097, 4096, 82),
                                         (300, 7, 7), (5000, 128, 200)])
def test_block_selection_is_topk_of_every_block(n, block, k):
    rng = np.random.default_rng(n + block)
    x = rng.laplace(size=n).astype(np.float32)
    x[10:40] = 0.0  # zeros are never kept
    x[50:60] = 0.25  # ties go to the lower index
    chosen = sparseloco.block_top_k(x, k, block, np)
    expected = np.flatnonzero(_topk_per_block(get_codec("sparseloco", k=k, block=block), x))
    np.testing.assert_array_equal(chosen, expected)
    assert (np.diff(chosen) > 0).all()


def test_payload_is_a_fraction_of_topk():
    x = np.random.default_rng(3).standard_normal(100_000).astype(np.float32)
    codec, top = get_codec("sparseloco"), get_codec("topk", density=0.02)
    payload = codec.encode(x)
    # 2000 indices as gaps, 2000 2-bit codes (500 bytes) and two levels, not 8000 value bytes
    assert payload.size < top.encode(x).size // 3
    k, width = struct.unpack_from("<QI", payload, HEADER_SIZE + 4)
    assert k == 2000 and payload[HEADER_SIZE] == sparse.ENC_GAPS
    codes = 4 * -(-k // 16)
    assert payload.size == HEADER_SIZE + sparse.BODY_HEAD_SIZE + 4 * -(-k * width // 32) \
        + 8 + codes


def test_empty_zero_constant_and_single():
    codec = get_codec("sparseloco")
    assert codec.decode(codec.encode(np.zeros(0, np.float32))).shape == (0,)
    for n in (1, 7, 5000):
        payload = codec.encode(np.zeros(n, np.float32))
        assert payload.size == HEADER_SIZE + sparse.BODY_HEAD_SIZE  # nothing selected
        np.testing.assert_array_equal(codec.decode(payload), np.zeros(n, np.float32))
    y = codec.decode(codec.encode(np.full(5000, -0.5, np.float32)))
    np.testing.assert_array_equal(np.flatnonzero(y), np.arange(100))
    assert (y[:100] == -0.5).all()
    assert codec.decode(codec.encode(np.float32([3.5]))).tolist() == [3.5]


def test_float64_input_and_overflow():
    codec = get_codec("sparseloco", k=2)
    y = codec.decode(codec.encode(np.array([1e-3, 1 / 3, -2 / 3, 0.1])))
    assert y.dtype == np.float32 and np.flatnonzero(y).tolist() == [1, 2]
    with pytest.raises(ccl.CompressionOverflowError):
        codec.decode(codec.encode(np.array([1.0, 1e300, 3.0])))


def test_error_feedback_delivers_everything():
    """With error feedback the residual stays bounded: what was held back is sent later."""
    stats = run_error_feedback(get_codec("sparseloco", density=0.05), 4000, 120)
    assert stats["norm_e"][-1] < 40 * stats["max_norm_x"]
    assert stats["norm_e"][60:].max() < 1.5 * stats["norm_e"][30:60].max()


# ------------------------------------------------------------ decoder safety
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: json.dumps(c))
def test_malformed_payloads(config):
    codec = get_codec(config)
    rng = np.random.default_rng(5)
    for n in (1, 7, 333, 5000):
        x = rng.standard_normal(n).astype(np.float32)
        ctx = CodecContext(step=1, key="w", chunk=0, n=n)
        check_header_edits(codec, x, ctx)
        check_malformed(codec, x, ctx, rng=rng, flips=60)


@pytest.mark.parametrize("data", [b"", b"\x00" * 40, bytes(range(256)), b"\xff" * 100])
def test_random_bytes(data):
    check_random_bytes(get_codec("sparseloco"), data)


def _body():
    return HEADER_SIZE + sparse.BODY_HEAD_SIZE


def test_bad_levels_padding_and_value_format_are_payload_errors():
    codec = get_codec("sparseloco", k=3)
    x = np.zeros(1000, np.float32)
    x[[10, 500, 900]] = [1.0, -2.0, 3.0]
    payload = codec.encode(x)
    k, width = struct.unpack_from("<QI", payload, HEADER_SIZE + 4)
    levels = _body() + 4 * -(-k * width // 32)
    for bad_level in (np.nan, np.inf, -1.0):
        bad = payload.copy()
        bad[levels:levels + 4] = np.frombuffer(np.float32(bad_level).tobytes(), np.uint8)
        with pytest.raises(ccl.PayloadError, match="levels"):
            codec.decode(bad)
    bad = payload.copy()
    bad[-1] |= 0x80  # a code beyond the third
    with pytest.raises(ccl.PayloadError, match="after the last"):
        codec.decode(bad)
    bad = payload.copy()
    bad[HEADER_SIZE + 1] = sparse.VALUES_F32  # float32 values announced, 2-bit ones sent
    with pytest.raises(ccl.PayloadError, match="value format"):
        codec.decode(bad)
    top = get_codec("topk", k=3)
    foreign = top.encode(x)
    foreign[HEADER_SIZE + 1] = sparse.VALUES_2BIT
    with pytest.raises(ccl.PayloadError, match="value format"):
        top.decode(foreign)


# ------------------------------------------------------------- collectives
@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["allgather", "direct", "ring", "tree"])
def test_allreduce_with_error_feedback_converges(comm, algorithm):
    """The running mean delivered under error feedback approaches the exact one, on every rank."""
    n, steps = 4099, 40
    c = ccl.Communicator(comm, codec=get_codec("sparseloco", density=0.05),
                         algorithm=algorithm, min_compress_bytes=0)
    delivered, exact = np.zeros(n), np.zeros(n)
    for step in range(steps):
        x = rank_input(comm.rank, n, step=step)
        y = c.allreduce(x, key="w", op="mean")
        assert_same_on_all_ranks(comm, y)
        delivered += y
        exact += comm.allreduce(x.astype(np.float64), op=MPI.SUM) / comm.size
    held = comm.allreduce(c.feedback.get("w").held(n), op=MPI.SUM) / comm.size
    np.testing.assert_allclose(delivered + held, exact, atol=1e-3 * np.abs(exact).max())
    gap = np.linalg.norm(delivered - exact) / np.linalg.norm(exact)
    assert gap < 0.5, f"the delivered mean is {gap:.2f} of the exact one away"
