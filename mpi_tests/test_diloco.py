"""DiLoCo: exactness against a reference, identical global weights, residuals, fragments.

Every rank builds the same small model from a seed and feeds it batches
seeded by rank and step, so ranks' pseudo-gradients differ. The reference
DiLoCo below is plain torch plus ``MPI_Allreduce`` in float64.
"""

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402
from ccl.codecs import get_codec  # noqa: E402
from ccl.collectives.auto import fitting  # noqa: E402
from ccl.torch.diloco import split_fragments  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def loss_of(model, rank, step):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    return torch.nn.functional.cross_entropy(model(x), y)


def inner_of(model, kind):
    """An inner optimizer and (for "sgd") a learning-rate schedule on it."""
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1,
                                 foreach=False), None
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5, foreach=False)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + t))


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy().copy()


def global_flat(opt):
    return flat([g for _, g in opt.global_parameters()])


def train(model, opt, rank, steps, start=0, schedule=None, on_step=None, passes=1):
    for step in range(start, start + steps):
        opt.zero_grad()
        for k in range(passes):  # gradient accumulation: passes backward() per step()
            loss_of(model, rank, 100 * k + step).backward()
        opt.step()
        if schedule is not None:
            schedule.step()
        if on_step is not None:
            on_step(step + 1)


def reference_diloco(comm, model, inner, schedule, rank, steps, H, F, delay, lr, mu, nesterov,
                     passes=1):
    """DiLoCo in plain torch, the average by MPI_Allreduce in float64; returns global weights."""
    params = list(model.parameters())
    groups = split_fragments([p.numel() for p in params], F)
    offsets = [f * H // F for f in range(F)]
    glob = [p.detach().clone() for p in params]
    buf = [torch.zeros_like(p) for p in params]
    pending = []
    for t in range(1, steps + 1):
        inner.zero_grad()
        for k in range(passes):
            loss_of(model, rank, 100 * k + t - 1).backward()
        inner.step()
        if schedule is not None:
            schedule.step()
        with torch.no_grad():
            for f, offset in enumerate(offsets):
                if t % H == offset:
                    sent, mean = {}, {}
                    for i in groups[f]:
                        sent[i] = (glob[i] - params[i]).clone()
                        x = sent[i].double().numpy()
                        total = np.empty_like(x)
                        comm.Allreduce(x, total)
                        mean[i] = torch.from_numpy(total / comm.size).to(params[i].dtype)
                    pending.append((t + delay, sent, mean))
            while pending and pending[0][0] <= t:
                _, sent, mean = pending.pop(0)
                for i, d in mean.items():
                    buf[i].mul_(mu).add_(d)
                    step = (d + mu * buf[i] if nesterov else buf[i]) if mu else d
                    local_then = glob[i] - sent[i]
                    glob[i] -= lr * step
                    if delay:
                        params[i] += glob[i] - local_then
                    else:
                        params[i].copy_(glob[i])
    return glob


@pytest.mark.parametrize("inner_kind, nesterov, fragments, delay, passes", [
    ("adamw", True, 1, 0, 1), ("adamw", False, 2, 0, 1), ("sgd", True, 3, 0, 1),
    ("adamw", True, 2, 1, 1), ("sgd", True, 1, 2, 1), ("adamw", True, 1, 1, 3)])
def test_uncompressed_equals_reference_diloco(hvd, comm, inner_kind, nesterov, fragments,
                                              delay, passes):
    H, steps, rank = 3, 10, hvd.rank()
    model, reference = make_model(), make_model()
    inner, schedule = inner_of(model, inner_kind)
    opt = ct.DiLoCo(model, inner, sync_every=H, outer_lr=0.7, outer_momentum=0.9,
                    nesterov=nesterov, codec=None, fragments=fragments, overlap=delay,
                    algorithm="direct")
    train(model, opt, rank, steps, schedule=schedule, passes=passes)
    ref_inner, ref_schedule = inner_of(reference, inner_kind)
    glob = reference_diloco(comm, reference, ref_inner, ref_schedule, rank, steps, H,
                            fragments, delay, 0.7, 0.9, nesterov, passes)
    stats = opt.communication_stats()
    assert stats["step"] == steps and stats["fragments"] == fragments
    assert stats["outer_steps"] > 0
    np.testing.assert_allclose(global_flat(opt), flat(glob), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(flat(model.parameters()), flat(reference.parameters()),
                               rtol=1e-5, atol=1e-6)
    # the outer steps moved the weights: a reference without them would differ
    assert not np.allclose(flat(glob), flat(make_model().parameters()), atol=1e-3)


@pytest.mark.parametrize("codec", ["thc", "topk", "onebit"])
def test_global_weights_identical_on_every_rank_after_each_sync(hvd, comm, codec):
    model = make_model()
    opt = ct.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=0.01), sync_every=4,
                    codec=codec, fragments=2, overlap=1, algorithm=fitting(get_codec(codec)))
    seen = []

    def check(step):
        done = opt.communication_stats()["outer_steps"]
        if not seen or seen[-1] != done:
            seen.append(done)
            assert_same_on_all_ranks(comm, global_flat(opt))
            assert_same_on_all_ranks(comm, flat(opt.momenta))
    start = global_flat(opt)
    train(model, opt, hvd.rank(), 13, on_step=check)
    assert seen[-1] == 6  # fragments sync at t % 4 == 0 and 2, each applied a step later
    assert not np.allclose(global_flat(opt), start)
    if hvd.size() > 1:  # local weights are each rank's own
        rows = comm.allgather(flat(model.parameters()))
        assert any(not np.array_equal(rows[0], r) for r in rows[1:])


def test_synchronize_waits_without_applying(hvd, comm):
    # synchronize() finishes the transfers in flight; the outer steps still land when due,
    # so the training is bit for bit the one without it
    def run(wait):
        model = make_model()
        opt = ct.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=0.01), sync_every=4,
                        codec="thc", fragments=2, overlap=1, algorithm="ring")
        for step in range(9):
            opt.zero_grad()
            loss_of(model, hvd.rank(), step).backward()
            opt.step()
            if wait:
                before, pending = global_flat(opt), opt.communication_stats()["pending"]
                opt.synchronize()
                assert opt.communication_stats()["pending"] == pending
                assert np.array_equal(global_flat(opt), before)
                assert all(job.done.is_set() for sync in opt.pending for _, _, job in sync.buckets)
        return global_flat(opt), flat(model.parameters())

    waited, plain = run(True), run(False)
    assert np.array_equal(waited[0], plain[0]) and np.array_equal(waited[1], plain[1])


def test_residuals_conserve_the_pseudo_gradients(hvd, comm):
    # outer_lr 1 without momentum: the global step is the delivered mean itself
    model = make_model()
    opt = ct.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                    outer_lr=1.0, outer_momentum=0.0, codec="onebit", overlap=1,
                    algorithm="direct")
    put_in, delivered, before, sent = 0.0, 0.0, None, None
    for step in range(12):
        train(model, opt, hvd.rank(), 1, start=step)
        if sent is not None:  # the sync of the step before was applied in this one
            delivered = delivered + (before - global_flat(opt)).astype(np.float64) * comm.size
            sent = None
        if (step + 1) % 2 == 0:  # a sync started: local weights not reset yet
            before = global_flat(opt)
            sent = (before - flat(model.parameters())).astype(np.float64)
            put_in = put_in + comm.allreduce(sent)
    opt.flush()
    delivered = delivered + (before - global_flat(opt)).astype(np.float64) * comm.size
    held = opt.communicator.feedback.get("diloco.fragment0.bucket0").held(put_in.size)
    held = comm.allreduce(held)
    np.testing.assert_allclose(delivered + held, put_in, atol=1e-4)
    # onebit is lossy: without the residuals the books would not balance
    assert np.abs(delivered - put_in).max() > 1e-2


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the weights its last step left (the local weights a sync sends from)."""

    def step(self, closure=None):
        out = super().step(closure)
        self.after = flat(self.param_groups[0]["params"])
        return out


def test_error_decay_scales_the_residuals_before_each_sync(hvd, comm):
    """SparseLoCo's feedback: the residual after a sync is p - C(p), p = beta * residual + delta."""
    beta, codec = 0.8, get_codec("sparseloco", density=0.1)
    model = make_model()
    inner = RecordingSGD(model.parameters(), lr=0.1)
    opt = ct.DiLoCo(model, inner, sync_every=2, outer_lr=1.0, outer_momentum=0.0, codec=codec,
                    overlap=False, algorithm="allgather", error_decay=beta)
    residual = np.zeros(global_flat(opt).size, np.float32)
    for step in range(10):
        before = global_flat(opt)
        train(model, opt, hvd.rank(), 1, start=step)
        if (step + 1) % 2 == 0:  # a sync: delta is this rank's global minus local weights
            p = (beta * residual + (before - inner.after)).astype(np.float32)
            held = opt.communicator.feedback.get("diloco.fragment0.bucket0").held(p.size)
            np.testing.assert_allclose(held, p - codec.decode(codec.encode(p)), rtol=1e-5,
                                       atol=1e-6)
            assert np.abs(held).max() > 1e-3  # sparseloco held something back
            residual = held.astype(np.float32)


@pytest.mark.parametrize("H, F", [(6, 3), (4, 4), (5, 2)])
def test_fragments_sync_every_parameter_once_per_period(hvd, H, F):
    model = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(3)],
                                torch.nn.Linear(6, 3))
    opt = ct.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.05), sync_every=H,
                    codec=None, fragments=F, overlap=False, algorithm="direct")
    names = [n for n, _ in opt.global_parameters()]
    changed = {n: [] for n in names}
    last = [g.clone() for _, g in opt.global_parameters()]

    def record(step):
        for (name, g), old in zip(opt.global_parameters(), last):
            if not torch.equal(g, old):
                changed[name].append(step)
                old.copy_(g)
    train(model, opt, ct.rank(), 3 * H, on_step=record)
    groups = split_fragments([p.numel() for p in model.parameters()], F)
    assert sorted(i for g in groups for i in g) == list(range(len(names)))
    for f, group in enumerate(groups):
        for i in group:  # exactly once per period, at the fragment's offset
            steps = changed[names[i]]
            assert len(steps) == 3 and len({s // H for s in steps}) == 3, (names[i], steps)
            assert all(s % H == f * H // F for s in steps)
    assert opt.communication_stats()["outer_steps"] == 3 * F


def test_overlap_converges_like_no_overlap(hvd):
    rank = hvd.rank()
    torch.manual_seed(100 + rank)
    data = torch.randn(256, 8)
    target = data @ torch.linspace(-1, 1, 8).unsqueeze(1)

    def run(delay):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 1))
        opt = ct.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=0.01), sync_every=6,
                        outer_lr=0.7, outer_momentum=0.5, codec="thc", fragments=2,
                        overlap=delay, algorithm="ring")
        g = torch.Generator().manual_seed(rank)
        losses = []
        for _ in range(120):
            batch = torch.randint(0, 256, (32,), generator=g)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data[batch]), target[batch])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        opt.flush()
        with torch.no_grad():
            final = torch.func.functional_call(model, dict(opt.global_parameters()), (data,))
        return losses[0], torch.nn.functional.mse_loss(final, target).item(), opt

    first, delayed, opt = run(2)
    assert opt.communication_stats()["delay"] == 2
    _, immediate, _ = run(0)
    assert delayed < first / 10  # trains through the delayed outer steps
    assert delayed < 3 * immediate + 1e-3  # and about as well as without the delay


def test_checkpoint_round_trip_continues_bit_identically(hvd, comm):
    rank = hvd.rank()

    def build(seed):
        model = make_model(seed)
        inner = torch.optim.AdamW(model.parameters(), lr=0.01)
        opt = ct.DiLoCo(model, inner, sync_every=4, codec="thc", fragments=2, overlap=1,
                        algorithm="ring")
        return model, opt
    model, opt = build(0)
    train(model, opt, rank, 6)  # fragment 1's sync of step 6 is in flight
    assert opt.communication_stats()["pending"] == 1
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    train(model, opt, rank, 7, start=6)
    opt.flush()
    expected = (flat(model.parameters()), global_flat(opt), flat(opt.momenta))

    resumed_model, resumed = build(1)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["opt"])
    assert resumed.communication_stats()["step"] == 6
    train(resumed_model, resumed, rank, 7, start=6)
    resumed.flush()
    got = (flat(resumed_model.parameters()), global_flat(resumed), flat(resumed.momenta))
    for a, b in zip(expected, got):
        assert np.array_equal(a, b)
    assert resumed.communication_stats()["outer_steps"] == opt.communication_stats()[
        "outer_steps"]

    with pytest.raises(ValueError, match="codec"):
        other = ct.DiLoCo(make_model(), torch.optim.SGD(make_model().parameters(), lr=0.1),
                          sync_every=4, codec="onebit", fragments=2, overlap=1,
                          algorithm="direct")
        other.load_state_dict(saved["opt"])
    with pytest.raises(ValueError, match="not a ccl DiLoCo state"):
        resumed.load_state_dict({"step": 3})


BAD = [
    (dict(sync_every=0), ValueError, "sync_every"),
    (dict(sync_every=2.5), ValueError, "sync_every"),
    (dict(sync_every=4, fragments=5), ValueError, "fragments"),
    (dict(sync_every=4, overlap=4), ValueError, "overlap"),
    (dict(sync_every=4, outer_momentum=1.0), ValueError, "outer_momentum"),
    (dict(sync_every=4, outer_lr=-1), ValueError, "outer_lr"),
    (dict(sync_every=4, nesterov=1), TypeError, "nesterov"),
    (dict(sync_every=4, codec="nope"), ValueError, "codec"),
    (dict(sync_every=4, algorithm="fastest"), ValueError, "algorithm"),
    (dict(sync_every=4, error_decay=1.5), ValueError, "error_decay"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD)
def test_bad_arguments_raise_on_every_rank(hvd, kwargs, error, match):
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(error, match=match):
        ct.DiLoCo(model, inner, **kwargs)
    with pytest.raises(TypeError, match="inner_optimizer"):
        ct.DiLoCo(model, "adamw", sync_every=4)
    with pytest.raises(TypeError, match="float32 or float64"):
        half = torch.nn.Linear(2, 2).half()
        ct.DiLoCo(half, torch.optim.SGD(half.parameters(), lr=0.1), sync_every=4)


def test_ddp_wrapped_model_is_refused_on_every_rank(hvd, process_group):
    """DDP inside DiLoCo would average every step as well: a clear error, not a silent cost."""
    ddp = torch.nn.parallel.DistributedDataParallel(make_model())
    with pytest.raises(ValueError, match="DistributedDataParallel.*unwrapped model"):
        ct.DiLoCo(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), sync_every=4)
    wrapped = torch.nn.Sequential(ddp)  # a wrapper anywhere inside the model
    with pytest.raises(ValueError, match="DistributedDataParallel"):
        ct.DiLoCo(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1), sync_every=4)


@pytest.mark.mpi(min_size=2)
def test_bad_argument_on_one_rank_raises_everywhere(hvd):
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    if hvd.rank() == 0:
        with pytest.raises(ValueError, match="sync_every"):
            ct.DiLoCo(model, inner, sync_every=0)
    else:
        with pytest.raises(ccl.MismatchError):
            ct.DiLoCo(model, inner, sync_every=4)
    # valid on each rank but different: every rank raises
    with pytest.raises(ccl.MismatchError):
        ct.DiLoCo(model, inner, sync_every=4 + hvd.rank())
