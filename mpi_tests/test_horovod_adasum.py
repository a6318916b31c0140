"""op=hvd.Adasum: orthogonal gradients add, parallel ones average, the tree matches a local one."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402
from ccl.torch.adasum import adasum_pair  # noqa: E402
from conftest import assert_same_on_all_ranks  # noqa: E402

pytestmark = pytest.mark.mpi

torch.set_num_threads(1)


@pytest.fixture
def hvd(comm):
    ct.init(comm)
    yield ct
    ct.shutdown()


def power_of_two(size):
    return size & (size - 1) == 0


def test_orthogonal_gradients_add(hvd):
    if not power_of_two(hvd.size()):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    size, rank = hvd.size(), hvd.rank()
    basis = torch.zeros(size, dtype=torch.float64)
    basis[rank] = 3.0
    out = hvd.allreduce(basis, op=hvd.Adasum)
    assert torch.equal(out, torch.full((size,), 3.0, dtype=torch.float64))


def test_parallel_gradients_average(hvd):
    if not power_of_two(hvd.size()):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    g = torch.linspace(-1, 1, 10)
    out = hvd.allreduce(g * 2, op=hvd.Adasum)
    torch.testing.assert_close(out, g * 2)
    # a parallel but scaled pair lies between the average and the sum
    scaled = hvd.allreduce(g * (hvd.rank() + 1), op=hvd.Adasum, name="scaled")
    assert (scaled.norm() >= g.norm()).item()


def test_matches_the_tree_computed_locally(hvd, comm):
    if not power_of_two(hvd.size()):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    size = hvd.size()
    inputs = [np.random.default_rng(r).standard_normal(33) for r in range(size)]
    level = inputs
    while len(level) > 1:  # rank order: 0 with 1, 2 with 3, then the pairs' results
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    x = torch.from_numpy(inputs[hvd.rank()]).float()
    outs = hvd.grouped_allreduce([x, x.double()], op=hvd.Adasum, postscale_factor=0.5)
    torch.testing.assert_close(outs[1], torch.from_numpy(level[0]) * 0.5, rtol=1e-6,
                               atol=1e-6)
    assert outs[0].dtype == torch.float32
    assert_same_on_all_ranks(comm, outs[0].numpy())
    back = torch.ones(4, requires_grad=True)
    hvd.allreduce(back, op=hvd.Adasum).sum().backward()  # differentiable: Adasum of grads
    torch.testing.assert_close(back.grad, torch.ones(4))


def test_other_sizes_raise_on_every_rank(hvd):
    if power_of_two(hvd.size()):
        pytest.skip("every power of two works")
    with pytest.raises(ValueError, match="power-of-two"):
        hvd.allreduce(torch.ones(3), op=hvd.Adasum)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()
