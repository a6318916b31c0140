"""Semantics of the collectives (docs/architecture.md), at every rank count the suite runs at.

Every rank rebuilds every other rank's input from a seed (``rank_input``), so
the exact float64 reference needs no communication.
"""

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec
from ccl.testing import assert_same_on_all_ranks, exact_sum, rank_input

pytestmark = pytest.mark.mpi

ALGORITHMS = ["ring", "tree", "direct", "allgather", "auto"]
CASTS = ["none", "fp16", "bf16"]
# absolute error allowed per rank in the sum of standard-normal inputs
TOLERANCE = {"none": 2e-6, "fp16": 4e-3, "bf16": 3e-2}


def sizes(p):
    """Element counts that break chunking: 0, 1, p-1, p, p+1, a prime near 1e5, 2^20+3."""
    return sorted({0, 1, max(p - 1, 0), p, p + 1, 99991, 2**20 + 3})


def _run_and_check(comm, codec, algorithm, n, op="sum"):
    p = comm.size
    x = rank_input(comm.rank, n)
    y = ccl.compressed_allreduce(x, codec, comm=comm, op=op, algorithm=algorithm)
    assert y.shape == x.shape and y.dtype == x.dtype and isinstance(y, np.ndarray)
    assert_same_on_all_ranks(comm, y)
    expected = exact_sum(p, n) / (p if op == "mean" else 1)
    scale = 1 if op == "mean" else p
    np.testing.assert_allclose(y, expected, rtol=0, atol=TOLERANCE[codec] * scale * 4)
    return y


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("codec", CASTS)
def test_allreduce_matches_exact_sum_at_odd_sizes(comm, codec, algorithm):
    for n in sizes(comm.size):
        _run_and_check(comm, codec, algorithm, n)


@pytest.mark.parametrize("algorithm", ALGORITHMS + ["mpi"])
def test_none_equals_float64_sum_to_float32_rounding(comm, algorithm):
    n = 4099
    y = ccl.compressed_allreduce(rank_input(comm.rank, n), None, comm=comm, algorithm=algorithm)
    expected = exact_sum(comm.size, n)
    # each of the p-1 float32 additions rounds once: |error| <= (p-1) * eps32 * |partial sums|
    bound = max(comm.size - 1, 1) * np.finfo(np.float32).eps * (np.abs(expected) + comm.size)
    assert np.all(np.abs(y - expected) <= bound)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_mean(comm, algorithm):
    for codec in CASTS:
        _run_and_check(comm, codec, algorithm, 1001, op="mean")


@pytest.mark.parametrize("codec", CASTS + ["test-stepquant"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_shape_dtype_and_noncontiguous_input(comm, codec, algorithm):
    base = rank_input(comm.rank, 6 * 35).reshape(6, 35)
    for x in (base, base[:, ::2], np.asfortranarray(base), base.T, base[::-1]):
        y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm=algorithm)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert_same_on_all_ranks(comm, y)
        # non-contiguous input is read correctly (copied, never misread)
        reference = ccl.compressed_allreduce(np.ascontiguousarray(x), codec, comm=comm,
                                             algorithm=algorithm)
        np.testing.assert_array_equal(y, reference)


def test_float64_and_float16_inputs(comm):
    x64 = rank_input(comm.rank, 257, dtype=np.float64)
    y64 = ccl.compressed_allreduce(x64, "none", comm=comm, algorithm="ring")
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, exact_sum(comm.size, 257, dtype=np.float64), atol=1e-12)
    x16 = rank_input(comm.rank, 257, dtype=np.float16)
    y16 = ccl.compressed_allreduce(x16, "none", comm=comm)
    assert y16.dtype == np.float16
    assert_same_on_all_ranks(comm, y16)


@pytest.mark.parametrize("algorithm", ["ring", "direct"])
@pytest.mark.parametrize("codec", CASTS)
def test_reduce_scatter_returns_this_ranks_block(comm, codec, algorithm):
    for n in sizes(comm.size):
        x = rank_input(comm.rank, n)
        block = ccl.reduce_scatter(x, codec, comm=comm, algorithm=algorithm)
        expected = np.array_split(exact_sum(comm.size, n), comm.size)[comm.rank]
        assert block.shape == expected.shape and block.dtype == np.float32
        np.testing.assert_allclose(block, expected, atol=TOLERANCE[codec] * comm.size * 4)


def _relative_error(y, exact):
    return np.linalg.norm(np.asarray(y, np.float64) - exact) / np.linalg.norm(exact)


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
def test_direct_sums_rounding_casts_decoded_so_the_error_stays_flat(comm, codec):
    """Every input rounded once, every owner's sum once: no rounding per addition.

    Adding the payloads encoded would round each of the owner's ``p - 1``
    partial sums (the error grew from 1.5x to 3.2x the one-shot error between 2
    and 16 ranks); summed decoded it is ``sqrt((2p - 1) / p)`` times it at any
    ``p``, and the reduce-scatter's owner returns its exact sum.
    """
    p, n = comm.size, 1 << 16
    x = rank_input(comm.rank, n)
    exact = exact_sum(p, n)
    c = get_codec(codec)
    one_shot = _relative_error(c.decode(c.encode(exact.astype(np.float32))), exact)
    y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm="direct")
    assert _relative_error(y, exact) <= np.sqrt((2 * p - 1) / p) * one_shot * 1.1
    block = ccl.reduce_scatter(x, codec, comm=comm, algorithm="direct")
    mine = np.array_split(exact, p)[comm.rank]
    assert _relative_error(block, mine) <= np.sqrt((p - 1) / p) * one_shot * 1.1


def test_auto_reduce_scatter_sends_each_chunk_once_at_the_codecs_width(comm):
    # a ring widens THC's lanes at every hop; auto's direct sends each chunk to its owner
    # at the encoded width: never more bytes than the ring, fewer from 3 ranks on
    x = rank_input(comm.rank, 1 << 16)
    sent = {}
    for algorithm in ("ring", "auto"):
        c = ccl.Communicator(comm, "thc", algorithm=algorithm)
        block = c.reduce_scatter(x)
        expected = np.array_split(exact_sum(comm.size, x.size), comm.size)[comm.rank]
        assert block.shape == expected.shape
        sent[algorithm] = comm.allreduce(c.stats()["bytes_sent"], op=MPI.MAX)
    if comm.size > 1:
        assert dict(c.stats()["algorithms"]) == {"direct": 1}
    assert sent["auto"] <= sent["ring"]
    if comm.size >= 3:
        assert sent["auto"] < sent["ring"]


def test_reduce_scatter_rejects_tree(comm):
    with pytest.raises(ValueError, match="reduce_scatter supports"):
        ccl.reduce_scatter(np.ones(8, np.float32), "none", comm=comm, algorithm="tree")


@pytest.mark.parametrize("codec", CASTS)
def test_allgather_blocks_of_different_lengths(comm, codec):
    lengths = [(3 * r) % 5 for r in range(comm.size)]  # includes zero-length blocks
    block = rank_input(comm.rank, lengths[comm.rank])
    full = ccl.allgather(block, codec, comm=comm)
    expected = np.concatenate([rank_input(r, lengths[r]) for r in range(comm.size)])
    assert full.shape == expected.shape
    np.testing.assert_allclose(full, expected, atol=TOLERANCE[codec] * 4)
    assert_same_on_all_ranks(comm, full)


@pytest.mark.parametrize("codec", ["none", "fp16"])
def test_allgather_of_a_mean_communicator_gathers_blocks_unscaled(comm, codec):
    # op is a reduction's: a Communicator made for means gathers blocks as they are
    c = ccl.Communicator(comm, codec, op="mean")
    block = rank_input(comm.rank, 56)
    full = c.allgather(block)
    expected = np.concatenate([rank_input(r, 56) for r in range(comm.size)])
    np.testing.assert_allclose(full, expected, atol=TOLERANCE[codec] * 4)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "direct", "allgather"])
def test_error_feedback_conserves_mass(comm, algorithm):
    """delivered + residuals held == sum of inputs, over 50 steps (test-stepquant: lossy)."""
    n, steps = 1003, 50
    c = ccl.Communicator(comm, codec="test-stepquant", algorithm=algorithm, min_compress_bytes=0)
    delivered = np.zeros(n)
    put_in = np.zeros(n)
    for step in range(steps):
        x = rank_input(comm.rank, n, step=step)
        delivered += c.allreduce(x, key="w")
        put_in += exact_sum(comm.size, n, step=step)
    held = comm.allreduce(c.feedback.get("w").held(n), op=MPI.SUM)
    np.testing.assert_allclose(delivered + held, put_in, atol=1e-3)
    if comm.size > 1:
        # the codec is lossy: the residuals really hold something
        assert np.abs(held).max() > 1e-3


def test_error_feedback_changes_algorithm_without_losing_mass(comm):
    n = 517
    c = ccl.Communicator(comm, codec="test-stepquant", min_compress_bytes=0)
    delivered, put_in = np.zeros(n), np.zeros(n)
    for step, algorithm in enumerate(["ring", "tree", "direct", "allgather", "ring"] * 4):
        delivered += c.allreduce(rank_input(comm.rank, n, step=step), key="k",
                                 algorithm=algorithm)
        put_in += exact_sum(comm.size, n, step=step)
    held = comm.allreduce(c.feedback.get("k").held(n), op=MPI.SUM)
    np.testing.assert_allclose(delivered + held, put_in, atol=1e-3)


def test_keyed_module_function_keeps_state_on_the_communicator(comm):
    n = 300
    x = rank_input(comm.rank, n)
    first = ccl.compressed_allreduce(x, "test-stepquant", comm=comm, algorithm="direct",
                                     key="g")
    second = ccl.compressed_allreduce(x, "test-stepquant", comm=comm, algorithm="direct",
                                      key="g")
    if comm.size > 1:
        assert not np.array_equal(first, second), "the residual of step 1 must enter step 2"


def test_state_dict_round_trip_continues_exactly(comm):
    n = 777
    a = ccl.Communicator(comm, codec="test-stepquant", algorithm="ring",
                         min_compress_bytes=0)
    for step in range(5):
        a.allreduce(rank_input(comm.rank, n, step=step), key="w")
    saved = a.state_dict()
    b = ccl.Communicator(comm, codec="test-stepquant", algorithm="ring",
                         min_compress_bytes=0)
    b.load_state_dict(saved)
    for step in range(5, 10):
        x = rank_input(comm.rank, n, step=step)
        np.testing.assert_array_equal(a.allreduce(x, key="w"), b.allreduce(x, key="w"))
    with pytest.raises(ValueError, match="codec"):
        ccl.Communicator(comm, codec="fp16").load_state_dict(saved)


@pytest.mark.mpi(min_size=2)
def test_mismatched_shapes_raise_on_every_rank(comm):
    n = 10 + (1 if comm.rank == 0 and comm.size > 1 else 0)
    for algorithm in ALGORITHMS:
        with pytest.raises(ccl.MismatchError, match="shape") as info:
            ccl.compressed_allreduce(np.ones(n, np.float32), "fp16", comm=comm,
                                     algorithm=algorithm)
        assert info.value.field == "shape"
    # the communicator is still usable afterwards
    y = ccl.compressed_allreduce(np.ones(4, np.float32), "fp16", comm=comm)
    assert (y == comm.size).all()


@pytest.mark.mpi(min_size=2)
def test_mismatched_dtype_codec_op_algorithm_raise_on_every_rank(comm):
    odd = comm.rank == comm.size - 1
    cases = [
        (dict(x=np.ones(8, np.float64 if odd else np.float32)), "dtype"),
        (dict(codec="bf16" if odd else "fp16"), "codec"),
        (dict(op="mean" if odd else "sum"), "op"),
        (dict(algorithm="tree" if odd else "ring"), "algorithm"),
    ]
    for kwargs, field in cases:
        args = dict(x=np.ones(8, np.float32), codec="fp16", comm=comm)
        args.update(kwargs)
        with pytest.raises(ccl.MismatchError) as info:
            ccl.compressed_allreduce(**args)
        assert info.value.field == field
    with pytest.raises(ccl.MismatchError, match="collective"):
        if odd:
            ccl.reduce_scatter(np.ones(8, np.float32), "fp16", comm=comm)
        else:
            ccl.compressed_allreduce(np.ones(8, np.float32), "fp16", comm=comm)


def test_unsupported_dtype_raises_type_error(comm):
    with pytest.raises(TypeError, match="int32"):
        ccl.compressed_allreduce(np.ones(8, np.int32), "fp16", comm=comm)
    if comm.size > 1:
        # only one rank is wrong: it raises TypeError, every other rank MismatchError
        x = np.ones(8, np.int32 if comm.rank == 0 else np.float32)
        expected = TypeError if comm.rank == 0 else ccl.MismatchError
        with pytest.raises(expected):
            ccl.compressed_allreduce(x, "fp16", comm=comm)


def test_bad_arguments_raise_value_errors(comm):
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="op"):
        ccl.compressed_allreduce(x, "fp16", comm=comm, op="max")
    with pytest.raises(ValueError, match="algorithm"):
        ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="butterfly")
    with pytest.raises(ValueError, match="known codecs"):
        ccl.compressed_allreduce(x, "zstd", comm=comm)
    with pytest.raises(TypeError, match="comm"):
        ccl.compressed_allreduce(x, "fp16", comm="world")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("codec", CASTS + ["test-stepquant"])
def test_nonfinite_input_propagates_consistently(comm, codec, algorithm):
    n = 40
    x = rank_input(comm.rank, n)
    if comm.rank == comm.size - 1:
        x[3] = np.nan
        x[n - 1] = np.inf
    c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0)
    c.allreduce(rank_input(comm.rank, n, step=1), key="k")
    before = c.feedback.get("k").held(n)
    y = c.allreduce(x, key="k")
    assert_same_on_all_ranks(comm, y)
    assert np.isnan(y[3]) and not np.isfinite(y[n - 1])
    uncompressed = ccl.collectives.auto.choose(get_codec(codec), x.nbytes, comm.size,
                                               x.dtype) == "mpi" and algorithm == "auto"
    if uncompressed:
        # auto sent it with MPI_Allreduce: NaN and Inf propagate element by element
        assert np.isinf(y[n - 1]) and np.isfinite(np.delete(y, [3, n - 1])).all()
    else:
        assert not np.isinf(y).any(), "a non-finite chunk decodes to NaN"
    after = c.feedback.get("k").held(n)
    assert np.isfinite(after).all(), "residuals must not be poisoned"
    # chunks holding NaN keep their residual untouched
    assert np.array_equal(before[np.isnan(y)], after[np.isnan(y)])


def test_check_finite_raises_on_every_rank(comm):
    x = rank_input(comm.rank, 50)
    if comm.rank == 0:
        x[7] = np.nan
    for algorithm in ALGORITHMS:
        with pytest.raises(ccl.NonFiniteError, match=r"rank\(s\) \[0\]"):
            ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm=algorithm,
                                     check_finite=True)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "direct", "allgather"])
def test_fp16_overflow_raises_on_every_rank_and_mean_predivides(comm, algorithm):
    x = np.full(64, 40000.0, np.float32)
    if comm.size > 1 and algorithm == "allgather":
        # partial sums never travel as fp16 here: each value is decoded, then summed in fp32
        y = ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm=algorithm)
        np.testing.assert_array_equal(y, 40000.0 * comm.size)
    elif comm.size > 1:
        with pytest.raises(ccl.CompressionOverflowError):
            ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm=algorithm)
    y = ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm=algorithm, op="mean")
    np.testing.assert_allclose(y, 40000.0, rtol=1e-3)


@pytest.mark.mpi(min_size=2)
def test_library_traffic_never_matches_user_messages(comm):
    mine = np.full(16, comm.rank, np.float64)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    request = comm.Isend(mine, dest=right, tag=0)  # pending user message, any tag
    for algorithm in ALGORITHMS:
        ccl.compressed_allreduce(np.ones(100, np.float32), "fp16", comm=comm,
                                 algorithm=algorithm)
    got = np.empty(16, np.float64)
    comm.Recv(got, source=left, tag=0)
    request.Wait()
    assert (got == left).all()


def test_comm_self_and_split_subcommunicators(comm):
    y = ccl.compressed_allreduce(np.arange(5, dtype=np.float32), "fp16", comm=MPI.COMM_SELF,
                                 algorithm="ring")
    np.testing.assert_array_equal(y, np.arange(5, dtype=np.float32))
    sub = comm.Split(color=comm.rank % 2, key=comm.rank)
    try:
        n = 1237
        for algorithm in ALGORITHMS:
            y = ccl.compressed_allreduce(rank_input(comm.rank, n), "none", comm=sub,
                                         algorithm=algorithm)
            members = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
            expected = sum(rank_input(r, n).astype(np.float64) for r in members)
            np.testing.assert_allclose(y, expected, atol=1e-5)
            assert_same_on_all_ranks(sub, y)
    finally:
        sub.Free()


def test_interleaved_keys_keep_separate_state(comm):
    c = ccl.Communicator(comm, codec="test-stepquant", algorithm="direct",
                         min_compress_bytes=0)
    for step in range(3):
        for key in ("a", "b"):
            c.allreduce(rank_input(comm.rank, 64 if key == "a" else 90, step=step), key=key)
    assert c.feedback.get("a").step == 3 and c.feedback.get("b").step == 3
    assert c.feedback.get("b").held(90).shape == (90,)


def test_codec_argument_forms(comm):
    x = rank_input(comm.rank, 32)
    results = [ccl.compressed_allreduce(x, spec, comm=comm, algorithm="ring")
               for spec in ("fp16", {"id": "fp16"}, get_codec("fp16"))]
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)
