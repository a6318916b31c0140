"""CompressedAdam and learning-rate-corrected error feedback, at every rank count.

Every rank builds the same small model from a seed and feeds it batches
seeded by rank and step, so ranks' gradients differ and every rank can
rebuild the exact averaged gradient a reference AdamW needs.
"""

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402
from ccl.codecs import get_codec, registered_codecs  # noqa: E402
from ccl.collectives.auto import fitting  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)

# Every codec that keeps error feedback, and THC (homomorphic).
CODECS = [c for c in ("onebit", "3lc", "topk", "sidco", "dgc", "thc") if c in registered_codecs()]
# direct keeps residuals at the worker and at the owner (two-way)
OPTIONS = dict(algorithm="direct", min_compress_bytes=0)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def loss_of(model, rank, step):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    return torch.nn.functional.cross_entropy(model(x), y)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy().copy()


def train(model, opt, rank, steps, start=0):
    for step in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()


def adam(model, **kw):
    kw = {**OPTIONS, "codec": "onebit", "warmup_steps": 3, "lr": 0.01, "weight_decay": 0.1,
          **kw}
    return ct.CompressedAdam(model.parameters(), named_parameters=model.named_parameters(),
                             **kw)


def test_warmup_is_exact_adamw_then_variance_freezes(hvd):
    model, reference = make_model(), make_model()
    opt = adam(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01, weight_decay=0.1,
                                foreach=False)
    size = hvd.size()
    for step in range(3):  # warm-up: AdamW on the exactly averaged gradient
        train(model, opt, hvd.rank(), 1, start=step)
        grads = None
        for r in range(size):
            reference.zero_grad()
            loss_of(reference, r, step).backward()
            g = [p.grad.clone() for p in reference.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(reference.parameters(), grads):
            p.grad = g / size
        ref_opt.step()
        np.testing.assert_allclose(flat(model.parameters()), flat(reference.parameters()),
                                   rtol=1e-5, atol=1e-7)
        assert opt.communication_stats()["bytes_sent"] >= 0
    variance = flat(opt.state[p]["exp_avg_sq"] for p in model.parameters())
    momentum = flat(opt.state[p]["exp_avg"] for p in model.parameters())
    train(model, opt, hvd.rank(), 3, start=3)
    assert np.array_equal(variance, flat(opt.state[p]["exp_avg_sq"]
                                         for p in model.parameters()))
    assert not np.array_equal(momentum, flat(opt.state[p]["exp_avg"]
                                             for p in model.parameters()))
    stats = opt.communication_stats()
    assert stats["step"] == 6 and not stats["warmup"]
    assert stats["compressed_params"] == 4


@pytest.mark.parametrize("codec", CODECS)
def test_replicas_stay_identical(hvd, comm, codec):
    model = make_model()
    opt = adam(model, codec=codec, warmup_steps=2,
               algorithm=fitting(get_codec(codec)))
    before = flat(model.parameters())
    train(model, opt, hvd.rank(), 6)
    after = flat(model.parameters())
    assert np.isfinite(after).all() and not np.array_equal(before, after)
    assert_same_on_all_ranks(comm, after)
    assert_same_on_all_ranks(comm, flat(opt.state[p]["exp_avg"] for p in model.parameters()))


def _scaled_run(codec, scale, grow, warmup=5, steps=12, lr=0.01):
    """A vector trained on set gradients ``scale * z`` (z ~ N(0.3, 1), per rank and step);
    after the warm-up, the gradients of the coordinates where ``grow`` is set are
    multiplied by 1000. Returns the parameter after each step."""
    p = torch.nn.Parameter(torch.zeros(2048))
    opt = ct.CompressedAdam([p], lr=lr, codec=codec, warmup_steps=warmup, **OPTIONS)
    trajectory = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + ct.rank())
        z = torch.randn(2048, generator=g) + 0.3
        p.grad = scale * z * torch.where(grow & (step >= warmup), 1000.0, 1.0)
        opt.step()
        trajectory.append(p.detach().clone())
    return trajectory


@pytest.mark.parametrize("codec", [None, "onebit", "3lc", "thc"])
def test_no_step_larger_than_exact_adams(hvd, comm, codec):
    # Adam's step does not depend on the scale of a coordinate's gradients. Here a
    # quarter of the coordinates get gradients 1e-6 times smaller (a tiny variance,
    # like an input pixel that is almost always 0) and an eighth gradients that grow
    # 1000-fold once the variance is frozen (like a ReLU unit that comes back to life).
    from ccl.torch.adam import step_bound

    tiny = torch.arange(2048) < 512
    grow = torch.arange(2048) >= 2048 - 256
    scale = torch.where(tiny, 1e-6, 1.0)
    lr = 0.01
    runs = {name: _scaled_run(codec, s, grow, lr=lr)
            for name, s in (("plain", torch.ones(2048)), ("scaled", scale))}
    for name, trajectory in runs.items():
        before = torch.zeros(2048)
        for t, after in enumerate(trajectory, start=1):
            # never more than exact Adam could move, whatever the codec did
            largest = float((after - before).abs().max())
            assert largest <= lr * step_bound(0.9, 0.999, t) * (1 + 1e-5), (name, t, largest)
            before = after
        assert_same_on_all_ranks(comm, trajectory[-1].numpy())
    # the coordinates with tiny gradients travel about as far as with plain ones
    moved = {name: float(tr[-1][tiny].abs().mean()) for name, tr in runs.items()}
    assert 0.5 < moved["scaled"] / moved["plain"] < 2, moved


def test_state_dict_resumes_bit_identically(hvd):
    model = make_model()
    opt = adam(model, codec="onebit", warmup_steps=2, lr_corrected=True)
    train(model, opt, hvd.rank(), 4)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    train(model, opt, hvd.rank(), 3, start=4)
    expected = flat(model.parameters())

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = make_model(seed=5)
    resumed.load_state_dict(saved["model"])
    opt2 = adam(resumed, codec="onebit", warmup_steps=2, lr_corrected=True)
    opt2.load_state_dict(saved["opt"])
    assert opt2.communication_stats()["step"] == 4
    train(resumed, opt2, hvd.rank(), 3, start=4)
    assert np.array_equal(flat(resumed.parameters()), expected)


def test_state_dict_at_another_size_loads_all_but_the_residuals(comm, hvd):
    model = make_model()
    opt = adam(model, warmup_steps=1)
    train(model, opt, hvd.rank(), 3)
    state = opt.state_dict()
    state["ccl"] = dict(state["ccl"], size=hvd.size() + 1)  # as if saved at another size
    model2 = make_model()
    model2.load_state_dict(model.state_dict())
    again = adam(model2, warmup_steps=1)
    with pytest.warns(ct.ResidualsNotLoadedWarning, match="steps are kept"):
        again.load_state_dict(state)
    assert again.communication_stats()["step"] == 3
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        # the moments, the same on every rank, are loaded
        assert torch.equal(again.state[q]["exp_avg"], opt.state[p]["exp_avg"])
    saved = state["ccl"]["communicators"][0]["feedback"]
    held = again.state_dict()["ccl"]["communicators"][0]["feedback"]
    assert {k: e["step"] for k, e in held.items()} == {k: e["step"] for k, e in saved.items()}
    assert all(entry["residuals"] == {} for entry in held.values())
    train(model2, again, hvd.rank(), 1, start=3)  # and training goes on
    assert_same_on_all_ranks(comm, flat(model2.parameters()))


def test_state_dict_of_another_codec_raises(hvd):
    model = make_model()
    opt = adam(model)
    train(model, opt, hvd.rank(), 1)
    with pytest.raises(ValueError, match="codec"):
        adam(make_model(), codec="3lc").load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="ccl"):
        opt.load_state_dict(torch.optim.AdamW(model.parameters()).state_dict())


def test_reducer_callbacks_are_private_with_deprecated_aliases(hvd):
    model = make_model()
    opt = adam(model, warmup_steps=1)
    p = next(model.parameters())
    for name, args in (("in_warmup", ()), ("group_of", (p,)), ("lr_of", (p,))):
        with pytest.warns(DeprecationWarning, match=f"CompressedAdam.{name}"):
            assert getattr(opt, name)(*args) == getattr(opt, "_" + name)(*args)
    with pytest.warns(DeprecationWarning, match="CompressedAdam.fold"):
        assert opt.fold(p).shape == p.shape  # the warm-up: the gradient (zeros: none yet)


def test_init_not_called(comm):
    assert not ct.is_initialized()
    with pytest.raises(RuntimeError, match="init"):
        ct.CompressedAdam(make_model().parameters())


@pytest.mark.parametrize("bad", [dict(codec="no-such-codec"), dict(warmup_steps=0),
                                 dict(lr=-1.0), dict(betas=(0.9, 1.5)),
                                 dict(algorithm="nope")])
def test_bad_argument_on_one_rank_raises_everywhere(hvd, bad):
    kw = dict(bad) if hvd.rank() == 0 else {}
    if hvd.rank() == 0:
        with pytest.raises(ValueError):
            adam(make_model(), **kw)
    else:
        with pytest.raises(ccl.MismatchError):
            adam(make_model(), **kw)


@pytest.mark.mpi(min_size=2)
def test_mismatched_arguments_raise_on_every_rank(hvd):
    with pytest.raises(ccl.MismatchError):
        adam(make_model(), warmup_steps=2 + hvd.rank())
    # still usable afterwards: no rank was left in a collective
    model = make_model()
    train(model, adam(model), hvd.rank(), 1)


def test_parameter_without_gradient_counts_as_zero(hvd, comm):
    model = make_model()
    extra = torch.nn.Parameter(torch.ones(4))
    opt = ct.CompressedAdam([*model.parameters(), extra], lr=0.01, warmup_steps=1, **OPTIONS)
    train(model, opt, hvd.rank(), 3)
    assert_same_on_all_ranks(comm, flat(model.parameters()))
    assert torch.equal(extra.detach(), torch.ones(4))  # zero momentum, no weight decay


@pytest.mark.parametrize("warmup_steps", [1, 5])  # compressed momenta, exact gradients
def test_reductions_start_during_backward(hvd, comm, warmup_steps):
    model = make_model()
    opt = adam(model, warmup_steps=warmup_steps, fusion_threshold_bytes=0)
    train(model, opt, hvd.rank(), 1)
    seen = []
    # Runs after the optimizer's own hook of the first layer's weight, whose gradient
    # backward computes last: the last layer's buckets must have started by then.
    model[0].weight.register_post_accumulate_grad_hook(
        lambda p: seen.append(opt.communication_stats()["reductions"]))
    started = opt.communication_stats()["reductions"]
    opt.zero_grad()
    loss_of(model, hvd.rank(), 1).backward()
    assert seen and seen[0] - started >= 3  # 2.bias, 2.weight, 0.bias started before
    assert opt.communication_stats()["reductions"] - started == 4
    opt.step()
    assert opt.communication_stats()["reductions"] - started == 4
    assert_same_on_all_ranks(comm, flat(model.parameters()))


def test_gradient_accumulation_over_backward_passes(hvd):
    model, reference = make_model(), make_model()
    opt = adam(model, backward_passes_per_step=2, warmup_steps=10)
    ref_opt = adam(reference, warmup_steps=10)
    for step in range(3):
        opt.zero_grad()
        for _half in (0, 1):  # the loss's two halves, one backward pass each
            (loss_of(model, hvd.rank(), step) / 2).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_of(reference, hvd.rank(), step).backward()
        ref_opt.step()
        np.testing.assert_allclose(flat(model.parameters()), flat(reference.parameters()),
                                   rtol=1e-5, atol=1e-6)
    opt.zero_grad()
    for _ in range(2):
        loss_of(model, hvd.rank(), 9).backward()
    with pytest.raises(RuntimeError, match="backward_passes_per_step"):
        loss_of(model, hvd.rank(), 9).backward()  # a third pass before step(): refused
    # it added to gradients already taken: the step is refused (and dropped) on every rank
    with pytest.raises(RuntimeError, match="changed between backward"):
        opt.step()
    train(model, opt, hvd.rank(), 1)  # and training goes on


def test_state_and_groups_are_refused_mid_step(hvd):
    model = make_model()
    opt = adam(model)
    train(model, opt, hvd.rank(), 1)
    state = opt.state_dict()
    loss_of(model, hvd.rank(), 1).backward()
    with pytest.raises(RuntimeError, match="between backward"):
        opt.load_state_dict(state)
    opt.step()
    opt.load_state_dict(state)  # between steps it loads
    with pytest.raises(RuntimeError, match="construction"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(3))]})

# ------------------------------------------------------------------ lr-corrected EF
def _residuals(communicator, key):
    state = communicator.feedback.get(key)
    return {point: res.copy() for point, (_, _, res) in state.residuals.items()}


@pytest.mark.parametrize("codec", ["onebit", "test-stepquant"])
def test_lr_change_scales_residuals(comm, codec):
    rng = np.random.default_rng([7, comm.rank])
    x1, x2 = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
    corrected = ccl.Communicator(comm, codec, algorithm="direct", min_compress_bytes=0,
                                 lr_corrected=True)
    plain = ccl.Communicator(comm, codec, algorithm="direct", min_compress_bytes=0)
    corrected.set_lr(0.1)
    corrected.allreduce(x1, key="w")
    before = _residuals(corrected, "w")
    assert before and corrected.feedback.get("w").lr == 0.1
    # the plain communicator starts from the same residuals, doubled by hand
    state = corrected.state_dict()
    for entry in state["feedback"].values():
        entry["residuals"] = {p: (a, b, r * 2) for p, (a, b, r) in entry["residuals"].items()}
    plain.load_state_dict(state)
    corrected.set_lr(0.05)  # eta(t-1)/eta(t) = 2
    assert np.array_equal(corrected.allreduce(x2, key="w"), plain.allreduce(x2, key="w"))
    assert corrected.feedback.get("w").lr == 0.05
    # a rate of 0 (a schedule's first step) and an unchanged rate leave residuals alone
    now = _residuals(corrected, "w")
    corrected.set_lr(0.0)
    corrected.feedback.get("w").rescale(0.0)
    corrected.set_lr(0.05)
    corrected.feedback.get("w").rescale(0.05)
    assert all(np.array_equal(now[p], r) for p, r in _residuals(corrected, "w").items())
    with pytest.raises(ValueError):
        corrected.set_lr(float("nan"))


def test_set_lr_without_correction_does_nothing(comm):
    c = ccl.Communicator(comm, "onebit", algorithm="direct", min_compress_bytes=0)
    c.set_lr(0.1)
    x = np.linspace(-1, 1, 500, dtype=np.float32)
    c.allreduce(x, key="w")
    before = _residuals(c, "w")
    c.set_lr(0.01)
    c.allreduce(np.zeros_like(x), key="w")
    assert c.feedback.get("w").lr is None and before


def test_optimizers_follow_the_group_lr(hvd, comm):
    model = make_model()
    opt = adam(model, warmup_steps=1, lr_corrected=True)
    train(model, opt, hvd.rank(), 2)
    opt.param_groups[0]["lr"] = 0.005
    train(model, opt, hvd.rank(), 1, start=2)
    key = "0.weight"
    assert opt.communicator.feedback.get(key).lr == 0.005
    assert_same_on_all_ranks(comm, flat(model.parameters()))

    model = make_model()
    wrapped = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(),
                                      codec="onebit", algorithm="direct",
                                      min_compress_bytes=0, lr_corrected=True)
    train(model, wrapped, hvd.rank(), 1)
    wrapped.param_groups[0]["lr"] = 0.02
    train(model, wrapped, hvd.rank(), 1, start=1)
    assert wrapped._ccl.engine.communicator.feedback.get("bucket0").lr == 0.02
    assert_same_on_all_ranks(comm, flat(model.parameters()))
