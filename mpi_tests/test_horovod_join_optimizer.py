"""``join()`` with ``DistributedOptimizer``: ranks with fewer batches join early, at any rank count.

As in Horovod, a rank in ``join()`` takes part in the other ranks' steps
with zeros: the average still divides by every rank, the joined rank's own
weights stay as they were, and the others' steps complete. Every rank can
rebuild every other rank's batches, so each rank computes the exact
reference of the whole run locally.
"""

import pytest

torch = pytest.importorskip("torch")

from ccl import MismatchError  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)

# batches of rank r: BATCHES[pattern][r % 5]
BATCHES = {"last-rank-short": [3, 3, 4, 2, 3], "first-rank-short": [1, 3, 2, 4, 2]}


def model_of():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.mse_loss(model(x), y)


def reference(size, counts, steps, momentum):
    """Weights after ``steps`` steps: gradients of the ranks with a batch left, summed, / size."""
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    params = list(model.parameters())
    for step in range(steps):
        total = [torch.zeros_like(p, dtype=torch.float64) for p in params]
        for r in range(size):
            if step < counts[r]:
                model.zero_grad()
                loss_of(model, r, step).backward()
                for t, p in zip(total, params, strict=True):
                    t += p.grad.to(torch.float64)
        for t, p in zip(total, params, strict=True):
            p.grad = (t / size).to(p.dtype)
        opt.step()
    return [p.detach().clone() for p in params]


def assert_weights(got, want):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.detach(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pattern", sorted(BATCHES))
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_joined_ranks_zeros_complete_the_others_steps(hvd, pattern, momentum):
    size, rank = hvd.size(), hvd.rank()
    counts = [BATCHES[pattern][r % 5] for r in range(size)]
    model = model_of()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                   momentum=momentum),
                                   named_parameters=model.named_parameters())
    for step in range(counts[rank]):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()
    last = hvd.join()
    assert counts[last] == max(counts)
    # a joined rank stopped at its own last step; the others took every step
    assert_weights(model.parameters(), reference(size, counts, counts[rank], momentum))
    # the last rank's weights and momentum for everyone, then train on together
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    hvd.broadcast_optimizer_state(opt, root_rank=last)
    final = reference(size, counts, max(counts), momentum)
    assert_weights(model.parameters(), final)
    opt.zero_grad()
    loss_of(model, rank, 99).backward()
    opt.step()  # the step counters agree again: no rank is "at another step"
    got = hvd.allgather_object([p.detach().clone() for p in model.parameters()])
    for other in got:
        assert_weights(other, got[0])


def test_allreduces_and_steps_mix_while_a_rank_joined(hvd):
    """The joined rank serves the optimizer's steps and plain allreduces side by side."""
    size, rank = hvd.size(), hvd.rank()
    model = model_of()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    counts = [2 if r == 0 and size > 1 else 3 for r in range(size)]
    losses = []
    for step in range(counts[rank]):
        opt.zero_grad()
        loss = loss_of(model, rank, step)
        loss.backward()
        opt.step()
        losses.append(hvd.allreduce(loss.detach(), op=hvd.Sum, name=f"loss.{step}"))
    hvd.join()
    # the loss sums: rank 0 contributed zeros to the last one
    for step, got in enumerate(losses):
        want = reference(size, counts, step, 0.0)
        check = model_of()
        with torch.no_grad():
            for p, w in zip(check.parameters(), want, strict=True):
                p.copy_(w)
        total = sum(loss_of(check, r, step).item() for r in range(size) if step < counts[r])
        assert got.item() == pytest.approx(total, rel=1e-5)


@pytest.mark.mpi(min_size=2)
def test_owner_without_zero_steps_raises_instead_of_hanging(hvd):
    """CompressedAdam cannot step with a joined rank: the stepping ranks raise, nobody hangs."""
    size, rank = hvd.size(), hvd.rank()
    model = model_of()
    opt = hvd.CompressedAdam(model.parameters(), lr=1e-3, warmup_steps=10,
                             named_parameters=model.named_parameters())
    if rank > 0:
        loss_of(model, rank, 0).backward()
        with pytest.raises(MismatchError, match="called join"):
            opt.step()
    assert 0 <= hvd.join() < size
