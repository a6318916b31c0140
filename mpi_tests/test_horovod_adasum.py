"""op=hvd.Adasum: vector-halving, distance-doubling Adasum at any number of ranks.

Checked against the float64 pairwise tree of whole vectors computed locally
(``adasum_reference.adasum_tree``): orthogonal gradients add, parallel ones
average, every rank gets the same bits, and a rank sends about twice the
vector (the halves), not ``log2 p`` times.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402
from mpi_tests.helpers.adasum_reference import adasum_tree  # noqa: E402
from ccl.torch.adasum import adasum_allreduce, adasum_pair  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

pytestmark = pytest.mark.mpi

torch.set_num_threads(1)


class CountingComm:
    """The real communicator, counting the bytes this rank sends."""

    def __init__(self, comm):
        self.comm, self.sent = comm, 0

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def Sendrecv(self, sendbuf, **kwargs):  # noqa: N802 (mpi4py's name)
        self.sent += sendbuf.nbytes
        return self.comm.Sendrecv(sendbuf, **kwargs)

    def Send(self, buf, **kwargs):  # noqa: N802
        self.sent += buf.nbytes
        return self.comm.Send(buf, **kwargs)


def test_orthogonal_gradients_add(hvd):
    size, rank = hvd.size(), hvd.rank()
    basis = torch.zeros(size, dtype=torch.float64)
    basis[rank] = 3.0
    out = hvd.allreduce(basis, op=hvd.Adasum)
    assert torch.equal(out, torch.full((size,), 3.0, dtype=torch.float64))


def test_parallel_gradients_average(hvd):
    g = torch.linspace(-1, 1, 10)
    out = hvd.allreduce(g * 2, op=hvd.Adasum)
    torch.testing.assert_close(out, g * 2)
    # a parallel but scaled pair lies between the average and the sum
    scaled = hvd.allreduce(g * (hvd.rank() + 1), op=hvd.Adasum, name="scaled")
    assert (scaled.norm() >= g.norm()).item()


@pytest.mark.parametrize("length", [0, 1, 3, 33, 1000])
def test_matches_the_pairwise_tree(hvd, comm, length):
    size = hvd.size()
    inputs = [np.random.default_rng(r).standard_normal(length) for r in range(size)]
    want = adasum_tree(inputs)
    x = torch.from_numpy(inputs[hvd.rank()])
    outs = hvd.grouped_allreduce([x.float(), x], op=hvd.Adasum, postscale_factor=0.5)
    np.testing.assert_allclose(outs[1].numpy(), want * 0.5, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(outs[0].numpy(), want * 0.5, rtol=1e-5, atol=1e-5)
    assert outs[0].dtype == torch.float32
    assert_same_on_all_ranks(comm, outs[0].numpy())
    assert_same_on_all_ranks(comm, outs[1].numpy())


def test_tiny_vectors_are_added_as_horovod_does(comm):
    """Squared norms below 1e-8 get the coefficient 1: parallel tiny vectors add up."""
    size = comm.Get_size()
    out = adasum_allreduce(comm, np.full(4, 1e-6))
    np.testing.assert_allclose(out, np.full(4, 1e-6 * size), rtol=1e-12)


def test_a_rank_sends_about_twice_the_vector(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    n = 4096
    counting = CountingComm(comm)
    out = adasum_allreduce(counting, np.random.default_rng(rank).standard_normal(n))
    np.testing.assert_allclose(
        out, adasum_tree([np.random.default_rng(r).standard_normal(n) for r in range(size)]),
        rtol=1e-12, atol=1e-12)
    power = 1 << (size.bit_length() - 1)
    levels = power.bit_length() - 1
    dots = 3 * 8 * levels * (levels + 1) // 2  # the small allreduces of each level
    halves = 2 * (n - n // power) * 8  # n/2 + n/4 + ... out, and as much back
    folded = rank + power < size or rank >= power  # one more whole vector
    assert counting.sent == (n * 8 if rank >= power else halves + dots + folded * n * 8)
    assert counting.sent <= 3 * n * 8
    if size == power and size > 2:  # a whole-vector tree would send log2(p) vectors
        assert counting.sent < levels * n * 8


def test_differentiable_and_checked(hvd):
    back = torch.ones(4, requires_grad=True)
    hvd.allreduce(back, op=hvd.Adasum).sum().backward()  # differentiable: Adasum of grads
    torch.testing.assert_close(back.grad, torch.ones(4))
    with pytest.raises(TypeError, match="Adasum"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()


def test_pair_is_symmetric_and_scale_aware():
    a, b = np.array([3.0, 1.0]), np.array([1.0, 2.0])
    np.testing.assert_allclose(adasum_pair(a, b), adasum_pair(b, a), rtol=1e-15)
    np.testing.assert_allclose(adasum_pair(a, np.zeros(2)), a)


def _regression_data(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)


def _grads(init, batch):
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p, value in zip(model.parameters(), init):
            p.copy_(value)
    x, y = batch
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.double().numpy().ravel() for p in model.parameters()]


@pytest.mark.parametrize("compression, tolerance", [
    (ct.Compression.none, 1e-6), (ct.Compression.fp16, 2e-3)])
def test_distributed_optimizer_adasum_combines_the_steps(hvd, comm, compression, tolerance):
    """Horovod's delta optimizer: each rank's SGD step ``-lr g_r``, combined with Adasum."""
    size, rank, lr = hvd.size(), hvd.rank(), 0.1
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    init = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(),
                                   op=hvd.Adasum, compression=compression)
    x, y = _regression_data(rank)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    grads = [_grads(init, _regression_data(r)) for r in range(size)]
    for i, p in enumerate(model.parameters()):
        want = init[i].double().numpy().ravel() + adasum_tree([-lr * g[i] for g in grads])
        np.testing.assert_allclose(p.detach().double().numpy().ravel(), want,
                                   rtol=tolerance, atol=tolerance)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    assert_same_on_all_ranks(comm, flat)
    if size > 1:  # not the average of the steps, not their sum
        mean = init[0].double().numpy().ravel() - lr * np.mean([g[0] for g in grads], axis=0)
        assert not np.allclose(model.weight.detach().numpy().ravel(), mean, atol=1e-6)


def test_distributed_optimizer_adasum_trains_and_skip_synchronize_raises(hvd):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    x, y = _regression_data(0)  # one task for every rank: parallel steps, averaged

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    first = opt.step(closure).item()
    for _ in range(30):
        last = opt.step(closure).item()
    assert last < 0.8 * first
    opt.synchronize()
    with pytest.raises(RuntimeError, match="skip_synchronize"):
        opt.skip_synchronize()
