"""Hardening of ccl.torch's optimizers: checkpoints, dropped and edited steps, misaligned steps.

Each test drives a real training loop of ``DistributedOptimizer`` or
``CompressedAdam`` on every rank into one edge (a checkpoint loaded from rank
0 on every rank, a step dropped, gradients clipped after backward, a frozen
parameter, ranks at different steps, a rank that stops early) and checks the
defined outcome: training goes on, or every rank raises the same error.
The DDP hook's cases are in ``test_ddp_hook.py`` (they need its process group).
"""

import io
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)

# keyed, compressed buckets (their error-feedback steps are checked at every call)
COMPRESS = dict(algorithm="ring", min_compress_bytes=0)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def loss_of(model, rank, step):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    return torch.nn.functional.cross_entropy(model(x), y)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def train(model, opt, rank, steps, start=0):
    for step in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()


def adam(model, **kw):
    kw = {**COMPRESS, "codec": "onebit", "warmup_steps": 2, "lr": 0.01, "weight_decay": 0.1,
          **kw}
    return ct.CompressedAdam(model.parameters(), named_parameters=model.named_parameters(),
                             **kw)


def distributed(model, **kw):
    kw = {**COMPRESS, "codec": "onebit", **kw}
    return ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), **kw)


BUILD = {"DistributedOptimizer": distributed, "CompressedAdam": adam}


def rank0_state(comm, opt):
    """Rank 0's ``opt.state_dict()``, saved there and loaded on every rank."""
    data = None
    if comm.rank == 0:
        buffer = io.BytesIO()
        torch.save(opt.state_dict(), buffer)
        data = buffer.getvalue()
    return torch.load(io.BytesIO(comm.bcast(data, root=0)), weights_only=True)


# ------------------------------------------------------------ item 1: rank 0's checkpoint
@pytest.mark.parametrize("kind", sorted(BUILD))
def test_rank0_checkpoint_loaded_on_every_rank_keeps_training(comm, hvd, kind):
    model = make_model()
    opt = BUILD[kind](model)
    train(model, opt, comm.rank, 4)  # CompressedAdam: 2 warm-up, 2 compressed steps
    state = rank0_state(comm, opt)
    model2 = make_model()
    model2.load_state_dict(model.state_dict())
    opt2 = BUILD[kind](model2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt2.load_state_dict(state)
    told = [w for w in caught if "residuals" in str(w.message)]
    assert len(told) == (comm.rank != 0)  # the other ranks' residuals start from zero
    if comm.rank:
        assert "steps are kept" in str(told[0].message)
    train(model2, opt2, comm.rank, 3, start=4)  # used to raise "disagree on the key's step"
    assert_same_on_all_ranks(comm, flat(model2))
    if kind == "CompressedAdam":
        assert opt2.communication_stats()["step"] == 7


# ------------------------------------------------------------ item 4: dropping a step
def test_compressed_adam_skip_step_drops_the_step(comm, hvd):
    model = make_model()
    opt = adam(model)
    train(model, opt, comm.rank, 3)
    before = flat(model)
    state = {k: v.clone() for k, v in opt.state[model[0].weight].items()}
    opt.zero_grad()
    loss_of(model, comm.rank, 3).backward()
    with pytest.raises(RuntimeError, match="skip_step"):
        opt.zero_grad()  # "zero_grad(); continue" would leave the step's reductions behind
    opt.skip_step()
    assert flat(model).tobytes() == before.tobytes()
    assert all(torch.equal(state[k], opt.state[model[0].weight][k]) for k in state)
    stats = opt.communication_stats()
    assert (stats["step"], stats["skipped_steps"]) == (3, 1)
    loss_of(model, comm.rank, 4).backward()
    with pytest.raises(RuntimeError, match="skip_step"):  # the advice for a pass too many
        loss_of(model, comm.rank, 4).backward()
    opt.skip_step()
    train(model, opt, comm.rank, 2, start=5)
    assert opt.communication_stats()["step"] == 5
    assert_same_on_all_ranks(comm, flat(model))


@pytest.mark.mpi(min_size=2)
def test_skip_step_on_some_ranks_only_raises_everywhere(comm, hvd):
    model = make_model()
    opt = adam(model)
    train(model, opt, comm.rank, 1)
    before = flat(model)
    opt.zero_grad()
    loss_of(model, comm.rank, 1).backward()
    with pytest.raises(ccl.MismatchError, match="skip_step") as info:
        opt.skip_step() if comm.rank == 0 else opt.step()
    assert info.value.ranks[0] == [0]
    assert flat(model).tobytes() == before.tobytes()  # dropped on every rank
    train(model, opt, comm.rank, 1, start=2)
    assert_same_on_all_ranks(comm, flat(model))


@pytest.mark.parametrize("warmup_steps", [2, 10])
def test_grad_scaler_on_cpu_drops_inf_steps_on_every_rank(comm, hvd, warmup_steps):
    model, reference = make_model(), make_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    opt = adam(model, grad_scaler=scaler, warmup_steps=warmup_steps)
    ref_opt = adam(reference, warmup_steps=warmup_steps)
    for step in range(5):
        opt.zero_grad()
        loss = loss_of(model, comm.rank, step)
        if step == 2 and comm.rank == comm.size - 1:
            loss = loss * math.inf  # an overflow on one rank
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step != 2:  # the reference never sees the inf step
            train(reference, ref_opt, comm.rank, 1, start=step)
        # power-of-two scales: unscaled gradients are bitwise the reference's
        assert flat(model).tobytes() == flat(reference).tobytes()
    assert opt.communication_stats()["skipped_steps"] == 1
    assert opt.communication_stats()["step"] == 4
    # every rank's scaler lowered its scale at the inf step alike
    assert comm.allgather(scaler.get_scale()) == [2.0 ** 11] * comm.size


# ------------------------------------------------------------ item 5: edited gradients
@pytest.mark.parametrize("who", ["every rank", "rank 0"])
def test_gradients_clipped_after_backward_raise_on_every_rank(comm, hvd, who):
    model = make_model()
    opt = adam(model, warmup_steps=1)
    train(model, opt, comm.rank, 2)
    before = flat(model)
    opt.zero_grad()
    loss_of(model, comm.rank, 2).backward()
    if who == "every rank" or comm.rank == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with pytest.raises(RuntimeError, match=r"changed between backward\(\) and step\(\)"):
        opt.step()
    assert flat(model).tobytes() == before.tobytes()  # the step was dropped
    train(model, opt, comm.rank, 1, start=3)
    assert_same_on_all_ranks(comm, flat(model))


def test_replaced_gradient_raises(comm, hvd):
    model = make_model()
    opt = adam(model)
    opt.zero_grad()
    loss_of(model, comm.rank, 0).backward()
    model[0].bias.grad = model[0].bias.grad * 0.5  # a new tensor, not an in-place edit
    with pytest.raises(RuntimeError, match="0.bias"):
        opt.step()


# ------------------------------------------------------------ item 6: frozen parameters
@pytest.mark.parametrize("warmup_steps", [1, 10])
def test_compressed_adam_does_not_move_frozen_parameters(comm, hvd, warmup_steps):
    model = make_model()
    opt = adam(model, warmup_steps=warmup_steps)
    train(model, opt, comm.rank, 3)
    model[0].weight.requires_grad_(False)  # frozen after construction, on every rank
    frozen = model[0].weight.detach().clone()
    moments = {k: v.clone() for k, v in opt.state[model[0].weight].items()}
    train(model, opt, comm.rank, 3, start=3)
    assert torch.equal(model[0].weight.detach(), frozen)  # as AdamW: not moved, no decay
    assert all(torch.equal(moments[k], opt.state[model[0].weight][k]) for k in moments)
    assert not torch.equal(model[2].weight.detach(), make_model()[2].weight.detach())
    assert_same_on_all_ranks(comm, flat(model))


# ------------------------------------------------ items 10 and 18: ranks at other steps
@pytest.mark.parametrize("kind", sorted(BUILD))
@pytest.mark.mpi(min_size=2)
def test_state_restored_on_some_ranks_only_raises(comm, hvd, kind):
    model = make_model()
    # uncompressed: no error-feedback key whose step would tell the ranks apart
    opt = BUILD[kind](model, codec=None if kind == "DistributedOptimizer" else "onebit",
                      **({"warmup_steps": 10} if kind == "CompressedAdam" else {}))
    train(model, opt, comm.rank, 4)
    saved = opt.state_dict()
    train(model, opt, comm.rank, 2, start=4)
    if comm.rank == 0:
        opt.load_state_dict(saved)  # back to step 4 on rank 0 only
    with pytest.raises(ccl.MismatchError, match="different steps") as info:
        train(model, opt, comm.rank, 1, start=6)
    assert sorted(info.value.ranks) == [[0], list(range(1, comm.size))]
    assert "rank 0 at step 5" in str(info.value)


@pytest.mark.parametrize("kind", sorted(BUILD))
@pytest.mark.mpi(min_size=2)
def test_a_rank_that_stops_early_makes_every_rank_raise(comm, hvd, kind):
    model = make_model()
    opt = BUILD[kind](model)
    last = comm.size - 1
    # [rank::size] shards of 3 * size - 1 batches: the last rank gets one batch fewer
    batches = len(range(comm.rank, 3 * comm.size - 1, comm.size))
    assert batches == (2 if comm.rank == last else 3)
    train(model, opt, comm.rank, 2)
    with pytest.raises(ccl.MismatchError, match="stopped after step 2") as info:
        if comm.rank == last:
            ct.shutdown()  # the end of its training
        else:
            train(model, opt, comm.rank, 1, start=2)  # instead of waiting forever
    assert info.value.ranks == [[last], list(range(last))]
    assert f"rank {last} stopped" in str(info.value)


def test_state_dict_between_backward_and_step_raises(comm, hvd):
    model = make_model()
    opt = adam(model)
    train(model, opt, comm.rank, 1)
    loss_of(model, comm.rank, 1).backward()
    with pytest.raises(RuntimeError, match="half"):
        opt.state_dict()
    opt.step()
    assert opt.state_dict()["ccl"]["steps"] == 2


def test_distributed_optimizer_state_carries_its_steps(comm, hvd):
    model = make_model()
    opt = distributed(model, codec=None)
    train(model, opt, comm.rank, 3)
    assert opt.state_dict()["ccl"]["steps"] == 3
    assert np.isfinite(flat(model)).all()
