"""SGD's momentum corrected by DistributedOptimizer (``ccl.torch.sgd_momentum``), any rank count.

Every rank trains the same small model on its own batches (seeded by rank
and step), so the ranks' local momenta differ. A codec with error feedback
that loses nothing (top-k keeping every value) must then step exactly as SGD
on the exact average does, whatever SGD's options: the correction changes
what is sent, never what SGD computes from exact sums.
"""

import io

import pytest

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402
from ccl.codecs import get_codec  # noqa: E402
from ccl.collectives.auto import fitting  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)

EVERY_VALUE = {"id": "topk", "density": 1.0}  # error feedback, and nothing lost
COMPRESS = dict(min_compress_bytes=0, fusion_threshold_bytes=200)
STEPS = 4


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3))


def train(net, opt, rank, steps, start=0):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(10_000 * step + rank)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()


def flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def wrapped(net, codec, momentum_correction=True, optimizer=None, op=ct.Average, **options):
    """``DistributedOptimizer`` over ``optimizer`` (default: SGD, lr 0.1, momentum 0.9).

    A codec runs on the algorithm that fits it: ``auto`` would send every
    bucket exact, all ranks being on one node.
    """
    if optimizer is None:
        optimizer = torch.optim.SGD(net.parameters(), **{"lr": 0.1, "momentum": 0.9, **options})
    algorithm = "auto" if codec is None else fitting(get_codec(codec))
    return ct.DistributedOptimizer(optimizer, named_parameters=net.named_parameters(),
                                   codec=codec, algorithm=algorithm, op=op,
                                   momentum_correction=momentum_correction, **COMPRESS)


@pytest.mark.parametrize("options", [{}, {"weight_decay": 0.01}, {"nesterov": True},
                                     {"weight_decay": 0.01, "nesterov": True}],
                         ids=["plain", "decay", "nesterov", "decay-nesterov"])
def test_a_codec_that_loses_nothing_steps_as_exact_sgd(hvd, options):
    exact_net, net = model(), model()
    exact = wrapped(exact_net, None, **options)
    corrected = wrapped(net, EVERY_VALUE, **options)
    for step in range(STEPS):
        train(exact_net, exact, ct.rank(), 1, start=step)
        train(net, corrected, ct.rank(), 1, start=step)
        # .grad holds the average gradient SGD's update implies, as without correction
        for p, q in zip(exact_net.parameters(), net.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(corrected.state[q]["momentum_buffer"],
                                       exact.state[p]["momentum_buffer"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(flat(net), flat(exact_net), rtol=1e-4, atol=1e-6)
    # the ranks' own momenta were sent (and are kept for checkpoints)
    saved = corrected.state_dict()["ccl"]["momenta"]
    assert sorted(saved) == sorted(name for name, _ in net.named_parameters())


@pytest.mark.parametrize("codec", ["onebit", "sidco", "3lc", "thc"])
def test_lossy_codecs_keep_every_rank_identical(comm, hvd, codec):
    net = model()
    opt = wrapped(net, codec)
    train(net, opt, comm.rank, STEPS)
    assert_same_on_all_ranks(comm, flat(net).numpy())
    for p in net.parameters():  # SGD's one buffer: the averaged momentum, everywhere alike
        assert_same_on_all_ranks(comm, opt.state[p]["momentum_buffer"].numpy())
    assert len(opt.state_dict()["ccl"]["momenta"]) == 4
    if comm.size > 1:  # compressed, not sent exact
        assert opt.communication_stats()["bytes_compressed"] > 0


def test_half_precision_parameters_are_corrected_in_the_work_dtype(comm, hvd):
    net = model().to(torch.bfloat16)
    opt = wrapped(net, "onebit", weight_decay=0.01)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(10_000 * step + comm.rank)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x.to(torch.bfloat16)).float(), y).backward()
        opt.step()
    assert_same_on_all_ranks(comm, flat(net).float().numpy())
    momenta = opt.state_dict()["ccl"]["momenta"]
    assert len(momenta) == 4 and all(u.dtype == torch.float32 for u in momenta.values())
    assert all(torch.isfinite(u).all() for u in momenta.values())


@pytest.mark.parametrize("codec", ["onebit", "sidco"])
def test_the_correction_changes_what_a_lossy_codec_learns(comm, hvd, codec):
    runs = []
    for on in (True, False):
        net = model()
        train(net, wrapped(net, codec, momentum_correction=on), comm.rank, STEPS)
        runs.append(flat(net))
    assert not torch.equal(*runs)


def test_checkpoint_continues_bit_for_bit(hvd):
    net = model()
    opt = wrapped(net, "onebit")
    train(net, opt, ct.rank(), 3)
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buffer)
    train(net, opt, ct.rank(), 3, start=3)

    def resumed(keep_momenta):
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=True)
        if not keep_momenta:
            del saved["opt"]["ccl"]["momenta"]
        again = model()
        again.load_state_dict(saved["model"])
        opt = wrapped(again, "onebit")
        opt.load_state_dict(saved["opt"])
        train(again, opt, ct.rank(), 3, start=3)
        return flat(again)

    assert torch.equal(resumed(True), flat(net))
    if ct.size() > 1:  # without the ranks' momenta (they start from SGD's buffer) it differs
        assert not torch.equal(resumed(False), flat(net))


def test_a_momentum_of_the_wrong_shape_is_refused(hvd):
    net = model()
    opt = wrapped(net, "onebit")
    train(net, opt, ct.rank(), 1)
    state = opt.state_dict()
    state["ccl"]["momenta"]["0.weight"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="momentum of '0.weight'"):
        opt.load_state_dict(state)
    del state["ccl"]["momenta"]["0.weight"]
    state["ccl"]["momenta"]["nowhere"] = torch.zeros(2)
    with pytest.raises(ValueError, match="does not reduce"):
        opt.load_state_dict(state)


@pytest.mark.parametrize("case", ["off", "adam", "fp16", "sum", "no momentum"])
def test_where_the_correction_does_not_apply_gradients_are_sent(hvd, case):
    net = model()
    if case == "adam":
        opt = wrapped(net, "onebit", optimizer=torch.optim.Adam(net.parameters(), lr=0.01))
    else:
        opt = wrapped(net, "fp16" if case == "fp16" else "onebit",
                      momentum_correction=case != "off",
                      **({"momentum": 0.0} if case == "no momentum" else {}),
                      op=ct.Sum if case == "sum" else ct.Average)
    train(net, opt, ct.rank(), 2)
    assert "momenta" not in opt.state_dict()["ccl"] or not opt.state_dict()["ccl"]["momenta"]


def test_the_switch_must_be_a_bool_on_every_rank(hvd):
    with pytest.raises(TypeError, match="momentum_correction"):
        wrapped(model(), "onebit", momentum_correction="yes")
