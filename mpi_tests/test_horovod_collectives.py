"""Horovod's tensor collectives in ccl.torch (``import ccl.torch as hvd``), at every rank count.

Every rank builds its input from its rank, so each rank can rebuild every
other rank's input and compute the exact reference with torch math (or
compare with the MPI library's own collectives through mpi4py).
"""

import threading

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402
from ccl.torch import handles  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

pytestmark = pytest.mark.mpi

torch.set_num_threads(1)

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def rank_tensor(rank, shape, dtype, seed=0):
    """Rank ``rank``'s input: small integers (exact in every dtype, products included)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, shape, generator=g).to(dtype)


def reference(size, shape, dtype, op, seed=0):
    """The exact reduction over every rank's input, in float64, like Horovod's result."""
    xs = torch.stack([rank_tensor(r, shape, dtype, seed).to(torch.float64) for r in range(size)])
    if op in (ct.Sum, ct.Average):
        out = xs.sum(0) / (size if op == ct.Average else 1)
    elif op == ct.Min:
        out = xs.min(0).values
    elif op == ct.Max:
        out = xs.max(0).values
    else:
        out = xs.prod(0)
    return out


@pytest.mark.parametrize("dtype", INTS + FLOATS)
@pytest.mark.parametrize("op", ["Sum", "Average", "Min", "Max", "Product"])
def test_allreduce_every_op_and_dtype(hvd, dtype, op):
    op = getattr(hvd, op)
    size, shape = hvd.size(), (5, 3)
    if dtype in (torch.uint8, torch.int8) and op == hvd.Product and size > 3:
        pytest.skip("3**p overflows an 8-bit integer")
    x = rank_tensor(hvd.rank(), shape, dtype)
    before = x.clone()
    out = hvd.allreduce(x, op=op, name=f"ar.{dtype}.{op}")
    assert out.dtype == dtype and out.shape == shape
    assert torch.equal(x, before)  # the input is not modified
    expected = reference(size, shape, dtype, op)
    if not dtype.is_floating_point:
        expected = expected.floor()  # integers average rounding down (Horovod's tests)
    if dtype.is_floating_point and op == hvd.Average:  # x * (1/p) rounds in the dtype
        torch.testing.assert_close(out, expected.to(dtype))
    else:  # sums, products, extrema of small integers are exact in every dtype
        torch.testing.assert_close(out.to(torch.float64), expected.to(dtype).to(torch.float64),
                                   rtol=0, atol=0)
    assert_same_on_all_ranks(hvd.runtime.current().comm, out.to(torch.float64).numpy())


def test_allreduce_matches_mpi_allreduce_on_random_floats(hvd, comm):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(hvd.rank()),
                    dtype=torch.float64)
    summed = hvd.allreduce(x, op=hvd.Sum)
    mpi = np.empty(1000)
    comm.Allreduce(x.numpy(), mpi, op=MPI.SUM)
    assert np.array_equal(summed.numpy(), mpi)
    averaged = hvd.allreduce(x, average=True)
    assert np.allclose(averaged.numpy(), mpi / hvd.size(), rtol=1e-15, atol=0)


def test_allreduce_scale_factors_and_inplace_and_async(hvd):
    size = hvd.size()
    x = torch.full((4,), float(hvd.rank() + 1))
    total = size * (size + 1) / 2
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert out.tolist() == [total] * 4
    y = x.clone()
    assert hvd.allreduce_(y, op=hvd.Average) is y
    assert torch.allclose(y, torch.full((4,), total / size))
    h = hvd.allreduce_async(x, name="async", op=hvd.Sum)
    h_ = hvd.allreduce_async_(x, name="async_", op=hvd.Sum)
    assert isinstance(hvd.poll(h), bool)
    assert hvd.synchronize(h).tolist() == [total] * 4
    assert hvd.synchronize(h_) is x and x.tolist() == [total] * 4
    assert hvd.poll(hvd.allreduce_async(torch.ones(1))) in (True, False)
    with pytest.raises(ValueError, match="unknown handle"):
        hvd.synchronize(h)
    hvd.barrier()


def test_grouped_allreduce_mixed_dtypes(hvd):
    size = hvd.size()
    shapes = [(3,), (2, 2), (7,)]
    dtypes = [torch.float32, torch.int64, torch.float16]
    xs = [rank_tensor(hvd.rank(), s, d, seed=i) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
    for i, (out, s, d) in enumerate(zip(outs, shapes, dtypes)):
        assert out.dtype == d
        assert torch.equal(out.to(torch.float64), reference(size, s, d, hvd.Sum, seed=i))
    handle = hvd.grouped_allreduce_async(xs, op=hvd.Max)
    for i, (out, s, d) in enumerate(zip(hvd.synchronize(handle), shapes, dtypes)):
        assert torch.equal(out.to(torch.float64), reference(size, s, d, hvd.Max, seed=i))
    ys = [x.clone() for x in xs]
    assert hvd.grouped_allreduce_(ys, op=hvd.Min) == ys
    for i, (y, s, d) in enumerate(zip(ys, shapes, dtypes)):
        assert torch.equal(y.to(torch.float64), reference(size, s, d, hvd.Min, seed=i))
    zs = [x.clone() for x in xs]
    hvd.synchronize(hvd.grouped_allreduce_async_(zs, op=hvd.Sum))
    assert torch.equal(zs[0].to(torch.float64), reference(size, shapes[0], dtypes[0], hvd.Sum))


def test_fp16_compression_is_horovods_interface(hvd):
    x = torch.randn(64, generator=torch.Generator().manual_seed(hvd.rank()))
    compressed, ctx = hvd.Compression.fp16.compress(x)
    assert compressed.dtype == torch.float16
    assert hvd.Compression.fp16.decompress(compressed, ctx).dtype == torch.float32
    assert hvd.Compression.none.compress(x)[0] is x
    out = hvd.allreduce(x, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32
    exact = hvd.allreduce(x)
    assert 0 < (out - exact).abs().max() < 1e-2  # rounded to fp16 on the wire, not exact


@pytest.mark.parametrize("compression", ["3lc", "fp16-codec", "object", "id"])
def test_ccl_codec_as_compression(hvd, comm, compression):
    """A codec as compression= gives what a ccl.Communicator gives with that codec."""
    import ccl
    from ccl.codecs import get_codec
    from ccl.collectives.auto import fitting

    choice = {"3lc": ct.Compression.codec("3lc", s=1.5),
              "fp16-codec": ct.Compression.codec("fp16"),
              "object": get_codec("thc"), "id": "topk"}[compression]
    # a fresh codec of the same configuration (some codecs keep per-call state)
    codec = get_codec(get_codec(getattr(choice, "codec", choice)).get_config())
    x = torch.randn(4096, generator=torch.Generator().manual_seed(hvd.rank()))
    out = hvd.allreduce(x, compression=choice, name=f"codec.{compression}")
    assert out.shape == x.shape and out.dtype == x.dtype
    assert_same_on_all_ranks(comm, out.numpy())
    # the key is the name and the tensor's index in the call (THC seeds its rotation from it)
    reference = ccl.Communicator(comm, min_compress_bytes=0)
    expected = reference.allreduce(x.numpy(), codec=codec, algorithm=fitting(codec),
                                   key=f"codec.{compression}.0") * np.float32(1 / hvd.size())
    assert np.array_equal(out.numpy(), expected)
    if hvd.size() > 1:
        assert not torch.equal(out, hvd.allreduce(x))  # compressed on the wire: lossy
    # a codec only takes the floats it encodes and only sums or averages
    with pytest.raises(ValueError, match="Sum or hvd.Average"):
        hvd.allreduce(x, compression=choice, op=hvd.Max)
    with pytest.raises(TypeError, match="does not take"):
        hvd.allreduce(x.to(torch.int32), compression=choice)


def test_codec_compression_keeps_error_feedback_per_name(hvd):
    """With 3lc's error feedback, the running mean of outputs converges to the exact one."""
    x = torch.randn(2048, generator=torch.Generator().manual_seed(hvd.rank()))
    exact = hvd.allreduce(x)
    codec = ct.Compression.codec("3lc", s=1.0)
    steps = 40
    total = torch.zeros_like(x)
    for _ in range(steps):
        total += hvd.allreduce(x, compression=codec, name="ef")
    one = hvd.allreduce(x, compression=ct.Compression.codec("3lc", s=1.0), name="fresh")
    err_one = (one - exact).norm().item()
    err_mean = (total / steps - exact).norm().item()
    assert err_one > 0  # compressed (at one rank too): lossy
    assert err_mean < err_one / 4


@pytest.mark.parametrize("dtype", INTS + FLOATS + [torch.bool])
def test_allgather_variable_first_dimension(hvd, dtype):
    size = hvd.size()
    x = rank_tensor(hvd.rank(), (hvd.rank() + 1, 2, 3), dtype)
    out = hvd.allgather(x)
    expected = torch.cat([rank_tensor(r, (r + 1, 2, 3), dtype) for r in range(size)])
    assert out.dtype == dtype and torch.equal(out, expected)
    outs = hvd.synchronize(hvd.grouped_allgather_async([x, x[:, 0]]))
    assert torch.equal(outs[0], expected) and torch.equal(outs[1], expected[:, 0])
    assert torch.equal(hvd.synchronize(hvd.allgather_async(x)), expected)
    assert [torch.equal(a, b) for a, b in zip(hvd.grouped_allgather([x, x]),
                                               [expected, expected])] == [True, True]


def test_allgather_empty_and_scalar(hvd):
    rows = hvd.rank() % 2
    out = hvd.allgather(torch.ones(rows, 4))
    assert out.shape == (sum(r % 2 for r in range(hvd.size())), 4)
    scalars = hvd.allgather(torch.tensor(float(hvd.rank())))
    assert scalars.tolist() == [float(r) for r in range(hvd.size())]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float16, torch.bfloat16,
                                   torch.float32, torch.bool])
def test_broadcast_from_every_root(hvd, dtype):
    for root in range(hvd.size()):
        x = rank_tensor(hvd.rank(), (3, 4), dtype)
        out = hvd.broadcast(x, root_rank=root)
        assert torch.equal(out, rank_tensor(root, (3, 4), dtype))
        assert torch.equal(x, rank_tensor(hvd.rank(), (3, 4), dtype))
        assert hvd.broadcast_(x, root) is x and torch.equal(x, out)
        y = rank_tensor(hvd.rank(), (3, 4), dtype)
        assert torch.equal(hvd.synchronize(hvd.broadcast_async(y, root)), out)
        hvd.synchronize(hvd.broadcast_async_(y, root))
        assert torch.equal(y, out)


def test_alltoall_with_and_without_splits(hvd):
    size, rank = hvd.size(), hvd.rank()
    # rank r sends (r + 1) rows of value 10 * r + destination to each destination
    rows = [torch.full((rank + 1, 2), 10 * rank + d, dtype=torch.int32) for d in range(size)]
    out, received = hvd.alltoall(torch.cat(rows), splits=[rank + 1] * size)
    assert received.tolist() == [r + 1 for r in range(size)]
    expected = torch.cat([torch.full((r + 1, 2), 10 * r + rank, dtype=torch.int32)
                          for r in range(size)])
    assert torch.equal(out, expected)
    even = hvd.alltoall(torch.arange(2 * size, dtype=torch.float64) + 100 * rank)
    assert even.tolist() == [100 * r + 2 * rank + k for r in range(size) for k in range(2)]
    out2, received2 = hvd.synchronize(hvd.alltoall_async(torch.cat(rows),
                                                         torch.tensor([rank + 1] * size)))
    assert torch.equal(out2, expected) and torch.equal(received2, received)


@pytest.mark.parametrize("op", ["Sum", "Average"])
@pytest.mark.parametrize("dim0_extra", [0, 1])
def test_reducescatter_uneven_rows(hvd, op, dim0_extra):
    size, rank = hvd.size(), hvd.rank()
    op = getattr(hvd, op)
    dim0 = 2 * size + dim0_extra
    x = rank_tensor(rank, (dim0, 3), torch.float64)
    out = hvd.reducescatter(x, op=op)
    full = reference(size, (dim0, 3), torch.float64, op)
    rows = [dim0 // size + (1 if r < dim0 % size else 0) for r in range(size)]
    start = sum(rows[:rank])
    # sums of small integers are exact; averages round x * (1/p) once
    torch.testing.assert_close(out, full[start:start + rows[rank]])
    outs = hvd.grouped_reducescatter([x, x.float()], op=op)
    torch.testing.assert_close(outs[1], full[start:start + rows[rank]].float())
    assert torch.equal(hvd.synchronize(hvd.reducescatter_async(x, op=op)), out)
    assert torch.equal(hvd.synchronize(hvd.grouped_reducescatter_async([x], op=op))[0], out)


@pytest.mark.mpi(min_size=2)
def test_mismatches_raise_on_every_rank(hvd):
    size, rank = hvd.size(), hvd.rank()
    with pytest.raises(RuntimeError, match="tensors"):
        hvd.allreduce(torch.ones(3 + rank))
    with pytest.raises(RuntimeError, match="tensors"):
        hvd.allreduce(torch.ones(3, dtype=torch.float32 if rank else torch.float64))
    with pytest.raises(RuntimeError, match="name"):
        hvd.allreduce(torch.ones(3), name=f"rank{rank}")
    with pytest.raises(RuntimeError, match="tensors"):
        hvd.allgather(torch.ones(2, 3 + rank))
    with pytest.raises(RuntimeError, match="root_rank"):
        hvd.broadcast(torch.ones(2), root_rank=rank)
    with pytest.raises((RuntimeError, ValueError)):
        hvd.alltoall(torch.ones(size + rank))
    # everything still works afterwards
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [size] * 2


def test_bad_arguments_raise_on_every_rank(hvd):
    size = hvd.size()
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(torch.ones(2), root_rank=size)
    with pytest.raises(TypeError, match="complex"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TypeError, match="Adasum"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(ValueError, match="op must be one of"):
        hvd.reducescatter(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(ValueError, match="op="):
        hvd.allreduce(torch.ones(2), op=hvd.Sum, average=True)
    with pytest.raises(TypeError, match="compression"):
        hvd.allreduce(torch.ones(2), compression=object())
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.ones(size), splits=[1] * (size + 1))
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_duplicate_name_in_flight(hvd):
    # A name is free again as soon as its collective has run (as in Horovod), so the
    # collectives' thread is held until the second call: else "dup" may be done by then.
    gate = threading.Event()
    held = handles.submit("gate", None, None, lambda ps, name, error: gate.wait(60))
    handle = hvd.allreduce_async(torch.ones(4), name="dup")
    try:
        with pytest.raises(ValueError, match="in flight"):
            hvd.allreduce_async(torch.ones(4), name="dup")
    finally:
        gate.set()
    assert hvd.synchronize(held) is True
    assert hvd.synchronize(handle).tolist() == [1.0] * 4
    # the name is free again once its collective is done
    assert hvd.allreduce(torch.ones(1), name="dup").item() == 1.0


def test_autograd(hvd):
    size, rank = hvd.size(), hvd.rank()
    x = torch.arange(4.0, requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * (rank + 1)).sum().backward()
    assert x.grad.tolist() == [size * (size + 1) / 2] * 4  # the summed upstream gradients
    x.grad = None
    hvd.allreduce(x).sum().backward()
    assert x.grad.tolist() == [1.0] * 4
    # allgather: this rank's rows of the summed gradient
    y = torch.ones(rank + 1, 2, requires_grad=True)
    gathered = hvd.allgather(y)
    weights = torch.arange(gathered.shape[0], dtype=torch.float32)[:, None].expand(-1, 2)
    (gathered * weights).sum().backward()
    start = sum(r + 1 for r in range(rank))
    assert torch.equal(y.grad, size * weights[start:start + rank + 1])
    # broadcast: the summed gradient on the root, zero elsewhere
    z = torch.ones(3, requires_grad=True)
    (hvd.broadcast(z, root_rank=0) * 2).sum().backward()
    assert z.grad.tolist() == ([2.0 * size] if rank == 0 else [0.0]) * 3
    # alltoall: gradients go back where their rows came from
    w = torch.ones(size * 2, requires_grad=True)
    out = hvd.alltoall(w)
    (out * (rank + 1)).sum().backward()
    assert w.grad.tolist() == [float(d + 1) for d in range(size) for _ in range(2)]
    # reducescatter: the allgathered gradient (divided by size for Average)
    v = torch.ones(size * 2, 3, requires_grad=True)
    (hvd.reducescatter(v, op=hvd.Average) * (rank + 1)).sum().backward()
    expected = torch.tensor([float(r + 1) / size for r in range(size) for _ in range(2)])
    assert torch.allclose(v.grad, expected[:, None].expand(-1, 3))


def test_fp16_compression_autograd_and_dtype(hvd):
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float64
    out.sum().backward()
    assert x.grad.tolist() == [float(hvd.size())] * 3


def test_barrier_and_join(hvd):
    hvd.barrier()
    last = hvd.join()
    assert 0 <= last < hvd.size()
    assert hvd.allgather_object(last) == [last] * hvd.size()


def test_basics_are_truthful():
    assert ct.mpi_built() is True
    assert not ct.gloo_built() and not ct.gloo_enabled() and not ct.nccl_built()
    assert not ct.ddl_built() and not ct.ccl_built() and not ct.rocm_built()
    assert ct.mpi_threads_supported() == (MPI.Query_thread() >= MPI.THREAD_MULTIPLE)
    import importlib.util

    assert ct.cuda_built() == (importlib.util.find_spec("cupy") is not None)
    with pytest.raises(NotImplementedError, match="elastic"):
        ct.elastic.run  # noqa: B018 - the access raises


def test_not_initialised_raises():
    with pytest.raises(RuntimeError, match="init"):
        ct.allreduce(torch.ones(1))
    assert not ct.mpi_enabled()


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_integer_average_rounds_toward_minus_infinity(hvd, dtype):
    """As the reference of Horovod's own test suite (``torch.floor_divide`` of the sum)."""
    size, rank = hvd.size(), hvd.rank()
    values = [-7, 7, -1, 5, -size, 0]
    x = torch.tensor(values if rank == 0 else [0] * len(values), dtype=dtype)
    want = torch.tensor([v // size for v in values], dtype=dtype)
    assert torch.equal(hvd.allreduce(x, op=hvd.Average), want)
    rows = hvd.reducescatter(x.repeat(size, 1), op=hvd.Average)
    assert torch.equal(rows, want.repeat(1, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_average_is_the_sum_divided_by_the_ranks(hvd, dtype):
    """The average is the exact sum divided by the size, correctly rounded (not times 1/size)."""
    size, rank = hvd.size(), hvd.rank()
    shape = (64, 5)
    got = hvd.allreduce(rank_tensor(rank, shape, dtype, seed=3) * 37, op=hvd.Average)
    total = sum(rank_tensor(r, shape, dtype, seed=3) * 37 for r in range(size))  # exact
    assert torch.equal(got, total / size)
    scaled = hvd.grouped_allreduce([rank_tensor(rank, shape, dtype, seed=4) * 37],
                                   op=hvd.Average, postscale_factor=2.0)[0]
    total = sum(rank_tensor(r, shape, dtype, seed=4) * 37 for r in range(size))
    assert torch.equal(scaled, total / size * 2.0)
