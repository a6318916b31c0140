"""Horovod's DistributedOptimizer and broadcast_optimizer_state on a process set.

Only the set's members call them and only they communicate: each set
averages its own gradients (checked against a float64 average of the
members' gradients), keeps its own error feedback and checkpoints, and a
rank outside the set takes no part.
"""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)


def model_and_batches(seed, rank, steps=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.Tanh(), torch.nn.Linear(12, 2))
    g = torch.Generator().manual_seed(1000 * seed + rank)
    batches = [(torch.randn(6, 5, generator=g), torch.randn(6, 2, generator=g))
               for _ in range(steps)]
    return model, batches


def backward(model, batch):
    x, y = batch
    torch.nn.functional.mse_loss(model(x), y).backward()


def split_evens_odds(hvd, comm):
    """Register the even and odd ranks as two sets: (my set, its ranks, my sub-comm, sets)."""
    size, rank = hvd.size(), hvd.rank()
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    even_set = hvd.add_process_set(evens)
    odd_set = hvd.add_process_set(odds) if odds else None
    mine = even_set if rank % 2 == 0 else odd_set
    return mine, (evens if rank % 2 == 0 else odds), comm.Split(rank % 2, key=rank), \
        [s for s in (even_set, odd_set) if s is not None]


def test_disjoint_sets_train_different_models_exactly(hvd, comm):
    rank = hvd.rank()
    mine, members, sub, _ = split_evens_odds(hvd, comm)
    model, batches = model_and_batches(seed=1 + rank % 2, rank=rank)  # one model per set
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   process_set=mine)
    for batch in batches:
        opt.zero_grad()
        backward(model, batch)
        local = [p.grad.detach().double().numpy().copy() for p in model.parameters()]
        opt.synchronize()
        everyone = sub.allgather(local)  # the members' own gradients, float64
        for i, p in enumerate(model.parameters()):
            want = np.mean([grads[i] for grads in everyone], axis=0)
            np.testing.assert_allclose(p.grad.double().numpy(), want, rtol=1e-6, atol=1e-7)
        with opt.skip_synchronize():
            opt.step()
    # the members end at the same weights; the other set's model is another one
    gathered = sub.allgather([p.detach().numpy() for p in model.parameters()])
    for other in gathered:
        for got, want in zip(other, gathered[0]):
            np.testing.assert_array_equal(got, want)
    assert opt.communication_stats()["reductions"] == len(batches)
    assert len(members) == sub.Get_size()
    sub.Free()


def test_rank_outside_the_set_is_never_involved(hvd, comm):
    size, rank = hvd.size(), hvd.rank()
    members = list(range(max(size - 1, 1)))  # every rank but the last (at 1 rank: rank 0)
    first = hvd.add_process_set(members)
    model, batches = model_and_batches(seed=3, rank=rank, steps=4)
    if rank in members:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       process_set=first)
        hvd.broadcast_optimizer_state(opt, root_rank=members[-1], process_set=first)
        for batch in batches:
            opt.zero_grad()
            backward(model, batch)
            opt.step()
        assert opt.state_dict()["ccl"]["size"] == len(members)
    else:
        # the outsider cannot join the set's optimizer (raises at once, alone) and meanwhile
        # trains on its own, for longer than the set does: nobody waits for anybody
        with pytest.raises(ValueError, match="is not in"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     process_set=first)
        with pytest.raises(ValueError, match="is not in"):
            hvd.broadcast_optimizer_state(torch.optim.SGD(model.parameters(), lr=0.1), 0,
                                          process_set=first)
        plain = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in batches * 10:
            plain.zero_grad()
            backward(model, batch)
            plain.step()
    # every rank again, on the global set
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size
    assert hvd.remove_process_set(first)


def test_broadcast_optimizer_state_on_a_set(hvd, comm):
    rank = hvd.rank()
    mine, members, sub, _ = split_evens_odds(hvd, comm)
    model, _ = model_and_batches(seed=1, rank=rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.5)
    root = members[-1]
    hvd.broadcast_optimizer_state(opt, root_rank=root, process_set=mine)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * (root + 1))
    assert opt.param_groups[0]["momentum"] == 0.5
    outsider = (root + 1) % hvd.size()
    if outsider not in members:  # a root outside the set: every member raises
        with pytest.raises(ValueError, match="not a rank of"):
            hvd.broadcast_optimizer_state(opt, root_rank=outsider, process_set=mine)
    sub.Free()


def test_error_feedback_and_checkpoint_on_a_set(hvd, comm):
    """Stopping after a checkpoint and resuming from it gives the uninterrupted weights."""
    rank = hvd.rank()
    mine, members, sub, _ = split_evens_odds(hvd, comm)
    model, batches = model_and_batches(seed=4, rank=rank, steps=4)

    def distributed(model):
        return hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=model.named_parameters(), process_set=mine,
            compression=hvd.Compression.codec("topk", density=0.25))

    def run(opt, model, batches):
        for batch in batches:
            opt.zero_grad()
            backward(model, batch)
            opt.step()

    opt = distributed(model)
    run(opt, model, batches[:2])
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    assert (saved_opt["ccl"]["rank"], saved_opt["ccl"]["size"]) == \
        (members.index(rank), len(members))
    run(opt, model, batches[2:])
    resumed, _ = model_and_batches(seed=4, rank=rank)
    resumed.load_state_dict(saved_model)
    again = distributed(resumed)
    again.load_state_dict(saved_opt)  # this rank's own residuals: no warning
    run(again, resumed, batches[2:])
    for got, want in zip(resumed.parameters(), model.parameters()):
        assert torch.equal(got, want)
    if len(members) == 1:  # nothing to compress among one rank
        sub.Free()
        return
    # the residuals are real: without them the resumed run ends elsewhere
    fresh, _ = model_and_batches(seed=4, rank=rank)
    fresh.load_state_dict(saved_model)
    without = distributed(fresh)
    state = dict(saved_opt)
    state.pop("ccl")
    without.load_state_dict(state)
    run(without, fresh, batches[2:])
    assert any(not torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))
    sub.Free()


def test_optimizer_of_a_removed_set_cannot_step(hvd, comm):
    rank = hvd.rank()
    mine, _, sub, sets = split_evens_odds(hvd, comm)
    model, batches = model_and_batches(seed=5, rank=rank)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   process_set=mine)
    backward(model, batches[0])
    opt.step()
    for process_set in sets:
        assert hvd.remove_process_set(process_set)
    opt.zero_grad()
    with pytest.raises(RuntimeError, match="shut down"):
        backward(model, batches[1])
        opt.step()
    sub.Free()
