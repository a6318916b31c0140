"""hvd.SyncBatchNorm: the same as torch's BatchNorm on the concatenation of every rank's batch."""

import pytest

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402

pytestmark = pytest.mark.mpi

torch.set_num_threads(1)


def batch(rank, shape):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (rank + 1) + rank


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (3, 3, 2, 2)])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_matches_batch_norm_on_the_global_batch(hvd, shape, momentum):
    size, rank = hvd.size(), hvd.rank()
    sync = ct.SyncBatchNorm(3, momentum=momentum).double()
    full = torch.nn.BatchNorm1d(3, momentum=momentum).double() if len(shape) < 4 else \
        torch.nn.BatchNorm2d(3, momentum=momentum).double()
    with torch.no_grad():
        for m in (sync, full):
            m.weight.copy_(torch.tensor([1.0, 2.0, -0.5]))
            m.bias.copy_(torch.tensor([0.0, 0.5, 1.0]))
    inputs = [batch(r, shape).requires_grad_() for r in range(size)]
    weights = [batch(100 + r, shape) for r in range(size)]
    for _ in range(2):  # twice: the running statistics are updated alike
        mine = inputs[rank].detach().clone().requires_grad_()
        out = sync(mine)
        (out * weights[rank]).sum().backward()
        for x in inputs:
            x.grad = None
        reference = full(torch.cat(inputs))
        (reference * torch.cat(weights)).sum().backward()
        rows = slice(rank * shape[0], (rank + 1) * shape[0])
        torch.testing.assert_close(out, reference[rows])
        torch.testing.assert_close(mine.grad, inputs[rank].grad)
    torch.testing.assert_close(sync.running_mean, full.running_mean)
    torch.testing.assert_close(sync.running_var, full.running_var)
    sync.eval()
    full.eval()
    torch.testing.assert_close(sync(inputs[rank]), full(inputs[rank]))


def test_rejects_one_dimensional_input(hvd):
    with pytest.raises(ValueError, match="2-D"):
        ct.SyncBatchNorm(3)(torch.ones(3))
