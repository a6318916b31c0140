"""ccl.torch: topology, DistributedOptimizer and broadcasts, at every rank count.

Every rank builds the same small model from a seed and feeds it its own
batches (seeded by rank and step), so ranks' gradients differ and every
rank can rebuild every other rank's batch when a reference needs it.
"""

import io
import warnings

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402
from ccl.codecs import registered_codecs  # noqa: E402
from ccl.torch.optimizer import plan_buckets  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

# Several ranks share a few cores: one intra-op thread per rank is fastest.
torch.set_num_threads(1)

CODECS = [c for c in registered_codecs() if not c.startswith("test-")]
# Small enough that the tiny test models are cut into several buckets.
SMALL_BUCKETS = dict(fusion_threshold_bytes=200, min_compress_bytes=0)


class Net(torch.nn.Module):
    """Two layers plus a branch that only some ranks use."""

    def __init__(self, width=8, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(6, width)
        self.fc2 = torch.nn.Linear(width, 3)
        self.branch = torch.nn.Linear(width, 3)

    def forward(self, x, use_branch=False):
        h = torch.tanh(self.fc1(x))
        out = self.fc2(h)
        return out + self.branch(h) if use_branch else out


def batch(rank, step, n=8):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def loss_of(model, rank, step, **kw):
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x, **kw), y)


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def train(hvd, model, opt, steps, start=0):
    for step in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, hvd.rank(), step).backward()
        opt.step()


def manual_average(comm, tensor, like=None):
    if tensor is None:  # what the optimizer submits for a parameter without gradient
        tensor = torch.zeros_like(like)
    total = tensor.detach().numpy().astype(np.float32).copy()
    comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    return torch.from_numpy(total / comm.size)


# ------------------------------------------------------------------ topology
def test_topology(comm, hvd):
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (comm.rank, comm.size)
    assert 0 <= hvd.local_rank() < hvd.local_size() <= hvd.size()
    # every rank runs on one node here (mpiexec with the fork launcher)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    assert (hvd.local_rank(), hvd.local_size()) == (node.rank, node.size)
    node.Free()
    assert hvd.cross_size() * hvd.local_size() == hvd.size()
    hvd.init(comm)  # same communicator again: nothing happens
    with pytest.raises(ValueError, match="shutdown"):
        hvd.init(MPI.COMM_SELF)


def test_topology_honours_ccl_local_size(comm, monkeypatch):
    monkeypatch.setenv("CCL_LOCAL_SIZE", "2")
    ct.init(comm)
    try:
        # consecutive pairs of ranks form nodes; the last one alone at odd sizes
        assert (ct.local_rank(), ct.cross_rank()) == (comm.rank % 2, comm.rank // 2)
        assert ct.local_size() == min(2, comm.size - comm.rank // 2 * 2)
        assert ct.cross_size() == (comm.size + 1 - ct.local_rank()) // 2
    finally:
        ct.shutdown()


def test_not_initialised_raises():
    assert not ct.is_initialized()
    with pytest.raises(RuntimeError, match="init"):
        ct.rank()
    with pytest.raises(RuntimeError, match="init"):
        ct.DistributedOptimizer(torch.optim.SGD(Net().parameters(), lr=0.1))


def test_plan_buckets_one_dtype_each_and_deterministic():
    entries = [(100, torch.float32), (60, torch.float64), (60, torch.float32),
               (500, torch.float32), (8, torch.float64)]
    assert plan_buckets(entries, 128) == [[0], [1, 4], [2], [3]]
    assert plan_buckets(entries, 10**9) == [[0, 2, 3], [1, 4]]


# --------------------------------------------------------------- the optimizer
def test_wrapped_optimizer_keeps_its_class(hvd):
    model = Net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    assert opt.param_groups is sgd.param_groups
    adam = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()))
    assert isinstance(adam, torch.optim.Adam)
    with pytest.raises(TypeError, match="already"):
        hvd.DistributedOptimizer(opt)


@pytest.mark.parametrize("threshold", [200, 64 << 20])
def test_none_codec_equals_manual_allreduce(comm, hvd, threshold):
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   fusion_threshold_bytes=threshold)
    loss_of(model, comm.rank, 0, use_branch=True).backward()
    stats = opt.communication_stats()
    # every parameter got its gradient: each bucket was started during backward
    assert stats["reductions"] == stats["buckets"] == (1 if threshold > 1000 else 3)
    local = {name: p.grad.clone() for name, p in model.named_parameters()}
    opt.synchronize()
    for name, p in model.named_parameters():
        expected = manual_average(comm, local[name])
        torch.testing.assert_close(p.grad, expected, rtol=1e-6, atol=1e-7)
        assert_same_on_all_ranks(comm, p.grad.numpy())
    with opt.skip_synchronize():
        opt.step()


@pytest.mark.parametrize("codec", CODECS)
def test_parameters_stay_identical_on_every_rank(comm, hvd, codec):
    model = Net()
    before = flat_params(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5),
                                   named_parameters=model.named_parameters(), codec=codec,
                                   **SMALL_BUCKETS)
    stats = opt.communication_stats()
    assert stats["buckets"] > 1 and stats["compressed_buckets"] == (
        0 if codec == "none" else stats["buckets"])
    train(hvd, model, opt, 10)
    after = flat_params(model)
    assert np.isfinite(after).all() and not np.array_equal(before, after)
    assert_same_on_all_ranks(comm, after)
    # the branch is unused on every rank: its .grad is the zero tensor the optimizer gave every
    # trainable parameter, and, as in Horovod, its buckets are reduced like the others (an
    # error-feedback codec still delivers what it held back for them)
    assert not model.branch.weight.grad.any()
    assert opt.communication_stats()["reductions"] == 10 * stats["buckets"]


def test_without_thread_multiple_reductions_run_at_synchronize(comm, hvd, monkeypatch):
    def run():
        model = Net()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                       named_parameters=model.named_parameters(),
                                       codec="fp16", **SMALL_BUCKETS)
        train(hvd, model, opt, 4)
        return flat_params(model)

    threaded = run()
    monkeypatch.setattr("ccl.torch.engine.threads_supported", lambda: False)
    np.testing.assert_array_equal(run(), threaded)


def test_bfloat16_parameters(comm, hvd):
    model = Net().to(torch.bfloat16)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                   named_parameters=model.named_parameters(), codec="fp16",
                                   **SMALL_BUCKETS)
    for step in range(5):
        opt.zero_grad()
        x, y = batch(comm.rank, step)
        torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)), y).backward()
        opt.step()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert_same_on_all_ranks(comm, flat_params(model.float()))


def test_backward_passes_per_step_matches_accumulated_passes(comm, hvd):
    model, reference = Net(), Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2, **SMALL_BUCKETS)
    plain = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(4):
        opt.zero_grad()
        plain.zero_grad()
        for micro in (2 * step, 2 * step + 1):
            loss_of(model, comm.rank, micro).backward()
            loss_of(reference, comm.rank, micro).backward()
        opt.step()
        for p in reference.parameters():
            p.grad = manual_average(comm, p.grad, p)
        plain.step()
    np.testing.assert_allclose(flat_params(model), flat_params(reference), rtol=1e-5,
                               atol=1e-6)
    # a third pass before step() is refused, on every rank alike
    opt.zero_grad()
    for micro in range(2):
        loss_of(model, comm.rank, micro).backward()
    with pytest.raises(RuntimeError, match="backward_passes_per_step"):
        loss_of(model, comm.rank, 2).backward()
    opt.synchronize()


@pytest.mark.parametrize("codec", CODECS + ["test-stepquant"])
def test_checkpoint_continues_exactly(comm, hvd, codec):
    # an explicit algorithm compresses even at one rank (auto would not)
    def build():
        model = Net()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2,
                                                       momentum=0.5),
                                       named_parameters=model.named_parameters(),
                                       codec=codec, algorithm="direct", **SMALL_BUCKETS)
        return model, opt

    model, opt = build()
    train(hvd, model, opt, 8)
    uninterrupted = flat_params(model)

    model, opt = build()
    train(hvd, model, opt, 4)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    saved = opt.state_dict()["ccl"]["communicators"][0]["feedback"]
    if codec == "test-stepquant":  # a lossy codec: there are residuals to carry over
        assert any(r.abs().sum() > 0 for entry in saved.values()
                   for (_, _, r) in entry["residuals"].values())

    def resume(keep_residuals):
        buf.seek(0)
        checkpoint = torch.load(buf, weights_only=True)
        if not keep_residuals:
            del checkpoint["opt"]["ccl"]
        model, opt = build()
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
        train(hvd, model, opt, 4, start=4)
        return flat_params(model)

    np.testing.assert_array_equal(resume(True), uninterrupted)
    if codec == "test-stepquant":  # and they matter: without them the run differs
        assert not np.array_equal(resume(False), uninterrupted)


@pytest.mark.mpi(min_size=2)
def test_residuals_of_another_rank_are_not_loaded(comm, hvd):
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   codec="test-stepquant", **SMALL_BUCKETS)
    train(hvd, model, opt, 2)
    state = comm.bcast(opt.state_dict(), root=0)  # everyone loads rank 0's file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.load_state_dict(state)
    assert bool(caught) == (comm.rank != 0)
    held = opt.state_dict()["ccl"]["communicators"][0]["feedback"]
    if comm.rank != 0:  # residuals start from zero, the keys' steps are kept
        assert held and all(entry["residuals"] == {} for entry in held.values())
    steps = {key: entry["step"] for key, entry in held.items()}
    assert comm.allgather(steps) == [steps] * comm.size
    train(hvd, model, opt, 1)  # and training goes on


def test_unused_branch_on_rank_zero_only(comm, hvd):
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), codec="fp16",
                                   **SMALL_BUCKETS)
    branch_before = model.branch.weight.detach().clone()
    for step in range(5):
        opt.zero_grad()
        loss_of(model, comm.rank, step, use_branch=comm.rank == 0).backward()
        # Horovod's zero gradients: zeroed in place, not None, where the branch took no part
        assert bool(model.branch.weight.grad.any()) == (comm.rank == 0)
        opt.synchronize()
        assert model.branch.weight.grad is not None  # zeros went in, the average came out
        with opt.skip_synchronize():
            opt.step()
    assert not torch.equal(model.branch.weight, branch_before)
    assert_same_on_all_ranks(comm, flat_params(model))


def test_param_group_added_after_wrapping_is_averaged(comm, hvd):
    model = Net()
    body = [p for n, p in model.named_parameters() if not n.startswith("branch")]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(body, lr=0.1),
                                   named_parameters=model.named_parameters(), **SMALL_BUCKETS)
    train(hvd, model, opt, 1)
    buckets = opt.communication_stats()["buckets"]
    opt.add_param_group({"params": list(model.branch.parameters()), "lr": 0.05})
    assert opt.communication_stats()["buckets"] > buckets
    for step in range(1, 3):
        opt.zero_grad()
        loss_of(model, comm.rank, step, use_branch=True).backward()
        local = model.branch.weight.grad.clone()
        opt.synchronize()
        torch.testing.assert_close(model.branch.weight.grad, manual_average(comm, local),
                                   rtol=1e-6, atol=1e-7)
        with opt.skip_synchronize():
            opt.step()
    assert_same_on_all_ranks(comm, flat_params(model))
    # a group that fails on one rank fails on all, and no rank keeps it
    groups = len(opt.param_groups)
    extra = torch.nn.Parameter(torch.zeros(2))
    params = [model.fc1.weight] if comm.rank == 0 else [extra]  # rank 0: already in a group
    with pytest.raises(ValueError if comm.rank == 0 else ccl.MismatchError):
        opt.add_param_group({"params": params})
    assert len(opt.param_groups) == groups
    train(hvd, model, opt, 1, start=3)  # the ranks still agree on the buckets
    assert_same_on_all_ranks(comm, flat_params(model))


def test_parameters_without_gradient_anywhere_keep_none(comm, hvd):
    # Plain PyTorch skips a parameter whose .grad is None: momentum and weight decay
    # leave it alone. The wrapper must too, for frozen and unused parameters, once the
    # gradients are set to None (Horovod's default zero_grad keeps zero tensors instead).
    model = Net()
    reference = Net()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1),
        named_parameters=model.named_parameters(), codec="fp16", **SMALL_BUCKETS)
    train(hvd, model, opt, 1)
    model.fc1.weight.requires_grad_(False)  # frozen after wrapping
    fc1_weight, branch = model.fc1.weight.detach().clone(), flat_params(model.branch)
    for step in range(1, 4):
        opt.zero_grad(set_to_none=True)
        loss_of(model, comm.rank, step).backward()  # the branch is unused on every rank
        opt.synchronize()
        assert model.fc1.weight.grad is None and model.branch.weight.grad is None
        assert model.fc2.weight.grad is not None
        with opt.skip_synchronize():
            opt.step()
    assert torch.equal(model.fc1.weight, fc1_weight)
    assert np.array_equal(flat_params(model.branch), branch)
    assert not torch.equal(model.fc2.weight, reference.fc2.weight)
    assert_same_on_all_ranks(comm, flat_params(model))


def test_zero_grad_raises_while_reductions_are_pending(comm, hvd):
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_of(model, comm.rank, 0).backward()
    with pytest.raises(RuntimeError, match="zero_grad"):
        opt.zero_grad()
    with pytest.raises(RuntimeError, match="state_dict"):
        opt.state_dict()
    opt.step()
    opt.zero_grad()  # Horovod's default: zeroed in place
    assert all(not p.grad.any() for p in model.parameters())
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())


def test_skip_synchronize_with_gradient_clipping(comm, hvd):
    model, reference = Net(), Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), **SMALL_BUCKETS)
    plain = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(3):
        opt.zero_grad()
        plain.zero_grad()
        loss_of(model, comm.rank, step).backward()
        loss_of(reference, comm.rank, step).backward()
        opt.synchronize()
        reductions = opt.communication_stats()["reductions"]
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
        assert norm > 0.05  # clipping did something
        with opt.skip_synchronize():
            opt.step()
        assert opt.communication_stats()["reductions"] == reductions  # no second reduction
        for p in reference.parameters():
            p.grad = manual_average(comm, p.grad, p)
        torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=0.05)
        plain.step()
    np.testing.assert_allclose(flat_params(model), flat_params(reference), rtol=1e-5,
                               atol=1e-6)
    assert_same_on_all_ranks(comm, flat_params(model))


def test_step_after_synchronize_warns(comm, hvd):
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss_of(model, comm.rank, 0).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()

    def closure():  # Horovod's step(closure): its gradients are averaged, then the step
        opt.zero_grad()
        loss = loss_of(model, comm.rank, 1)
        loss.backward()
        return loss

    assert torch.is_tensor(opt.step(closure))


def test_bad_parameters_are_rejected_with_advice(comm, hvd):
    model = Net()
    named = list(model.named_parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    model.extra = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match="duplicate names"):
        hvd.DistributedOptimizer(sgd, named_parameters=named + [("fc1.weight", model.extra)])
    with pytest.raises(ValueError, match="not in named_parameters"):
        hvd.DistributedOptimizer(sgd, named_parameters=named[:2])
    with pytest.raises(ValueError, match="same tensor"):
        hvd.DistributedOptimizer(sgd, named_parameters=named + [("alias", model.fc1.weight)])
    with pytest.raises(ValueError, match=r"\(name, parameter\)"):
        hvd.DistributedOptimizer(sgd, named_parameters=list(model.parameters()))
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="unknown codec"):
        hvd.DistributedOptimizer(sgd, codec="no-such-codec")


@pytest.mark.mpi(min_size=2)
def test_ranks_with_different_models_raise_mismatch(comm, hvd):
    model = Net(width=8 if comm.rank else 9)
    with pytest.raises(ccl.MismatchError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters())
    # one rank with bad arguments: it raises its ValueError, the others MismatchError
    bad = comm.rank == comm.size - 1
    expected = ValueError if bad else ccl.MismatchError
    model = Net()
    with pytest.raises(expected):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 op="max" if bad else "mean")


# ---------------------------------------------------------------- broadcasts
def test_broadcast_parameters(comm, hvd):
    root = comm.size - 1
    torch.manual_seed(comm.rank)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4))
    model(torch.randn(6, 5))  # rank-dependent running statistics and counters
    extra = torch.randn(3, 2).to(torch.bfloat16)
    expected = comm.bcast({k: v.clone() for k, v in model.state_dict().items()}, root=root)
    expected_extra = comm.bcast(extra.clone(), root=root)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key
    hvd.broadcast_parameters([("extra", extra)], root_rank=root)
    assert torch.equal(extra, expected_extra)
    params = [torch.full((2,), float(comm.rank)), torch.zeros(0)]
    hvd.broadcast_parameters(params, root_rank=0)
    assert torch.equal(params[0], torch.zeros(2))
    with pytest.raises(TypeError, match="state_dict"):
        hvd.broadcast_parameters({"a": 1.0})
    if comm.size > 1:
        with pytest.raises(ccl.MismatchError):
            hvd.broadcast_parameters([torch.zeros(1 + (comm.rank == 0))])


def test_broadcast_optimizer_state(comm, hvd):
    model = Net()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3 * (comm.rank + 1))
    if comm.rank == 0:  # only root has state yet
        loss_of(model, 0, 0).backward()
        adam.step()
    opt = hvd.DistributedOptimizer(adam, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)
    state = opt.state_dict()["state"]
    reference = comm.bcast({k: {n: v.clone() for n, v in s.items()}
                            for k, s in state.items()}, root=0)
    assert sorted(state) == sorted(reference) and len(state) == 4  # the branch had no grad
    for index, entry in state.items():
        for name, value in entry.items():
            assert torch.equal(value, reference[index][name]), (index, name)


def test_broadcast_optimizer_state_with_reductions_pending_raises_everywhere(comm, hvd):
    """Reductions pending on every rank: every rank raises, none waits in the broadcast."""
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    loss_of(model, comm.rank, 0).backward()
    with pytest.raises(RuntimeError, match="being reduced"):
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # usable again
    assert_same_on_all_ranks(comm, flat_params(model))


def test_broadcast_optimizer_state_pending_on_the_root_only(comm, hvd):
    """Only the root has reductions pending: it raises, the others raise MismatchError."""
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    if comm.rank == 0:
        loss_of(model, 0, 0).backward()
    expected = RuntimeError if comm.rank == 0 or comm.size == 1 else ccl.MismatchError
    with pytest.raises(expected):
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    if comm.rank != 0:  # the others catch up, and the root's reductions complete
        loss_of(model, comm.rank, 0).backward()
    opt.step()
    assert_same_on_all_ranks(comm, flat_params(model))


def test_broadcast_and_allgather_object(comm, hvd):
    root = comm.size // 2
    obj = hvd.broadcast_object({"epoch": comm.rank, "tag": "x"}, root_rank=root)
    assert obj == {"epoch": root, "tag": "x"}
    assert hvd.allgather_object(comm.rank * 2) == [2 * r for r in range(comm.size)]
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast_object(1, root_rank=comm.size)


def test_buckets_with_a_small_share_of_the_gradient_bytes_stay_exact(hvd):
    # one layer carries almost all the bytes: the others stay exact under the default rule,
    # and every bucket is compressed with min_compress_bytes=0 (Horovod's compression=)
    model = torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.Linear(512, 512),
                                torch.nn.Linear(512, 4))
    for min_compress in (1024, 0):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       codec="onebit", min_compress_bytes=min_compress)
        stats = opt.communication_stats()
        assert 512 * 512 * 4 in stats["bucket_bytes"] and stats["buckets"] > 2
        assert stats["compressed_buckets"] == (1 if min_compress else stats["buckets"])
