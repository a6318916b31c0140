"""PowerSGD inside ccl.torch: exactness, error feedback, warm start, state, training.

The reduction itself is checked on a :class:`ccl.Communicator` with random
buckets that every rank can rebuild for every other rank; the optimizer and
the DDP hook with the tiny models of ``test_torch`` and ``test_ddp_hook``;
training on scikit-learn's digits against exact averaging.
"""

import io

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402
from ccl.bench.torch_digits import accuracy, digits_shards, mlp  # noqa: E402
from ccl.codecs import get_codec, registered_codecs  # noqa: E402
from ccl.torch.powersgd import PowerSGD  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402
from mpi_tests.test_ddp_hook import ddp, make_model  # noqa: E402,F401
from mpi_tests.test_ddp_hook import train as train_ddp  # noqa: E402
from mpi_tests.test_compressed_adam_digits import batches  # noqa: E402
from mpi_tests.test_torch import Net, flat_params, train  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)

# a 12 x 5 matrix, a 4 x 3 x 2 "convolution" (a 4 x 6 matrix) and a vector
SHAPES = [torch.Size((12, 5)), torch.Size((4, 3, 2)), torch.Size((7,))]
SIZE = sum(s.numel() for s in SHAPES)
INNER = ["none", "bf16", "fp16", "thc"]


def gradient(rank, step):
    return torch.randn(SIZE, generator=torch.Generator().manual_seed(1000 * step + rank))


def exact_mean(size, step):
    return torch.stack([gradient(r, step) for r in range(size)]).double().mean(0)


def reduce(method, comm, step, key="bucket"):
    """``method`` applied to this rank's gradient of ``step`` (ring, small P compressed too)."""
    communicator = ccl.Communicator(comm, algorithm="ring", min_compress_bytes=0)
    return method.reduce(communicator, key, gradient(comm.rank, step), SHAPES, step)


@pytest.mark.parametrize("op", ["mean", "sum"])
def test_full_rank_is_the_exact_mean(comm, op):
    method = PowerSGD(rank=6, inner="none", warmup_steps=0, min_compression_rate=0)
    communicator = ccl.Communicator(comm, algorithm="ring", min_compress_bytes=0)
    out = method.reduce(communicator, "b", gradient(comm.rank, 0), SHAPES, 0, op=op)
    factor = comm.size if op == "sum" else 1
    np.testing.assert_allclose(out.double(), exact_mean(comm.size, 0) * factor, rtol=1e-4,
                               atol=1e-5 * factor)
    assert_same_on_all_ranks(comm, out.numpy())
    # full rank leaves each rank only its deviation from the mean (zero in sum); a lower
    # rank approximates
    total = np.empty(SIZE)
    comm.Allreduce(method.residuals["b"].double().numpy(), total, op=MPI.SUM)
    assert np.abs(total).max() < 1e-4
    low = PowerSGD(rank=1, inner="none", warmup_steps=0, min_compression_rate=0)
    approx = reduce(low, comm, 0)
    assert float((approx.double() - exact_mean(comm.size, 0)).abs().max()) > 1e-2


def test_warmup_steps_are_exact_and_small_matrices_stay_uncompressed(comm):
    method = PowerSGD(rank=1, inner="bf16", warmup_steps=2)  # min_compression_rate 2
    for step in range(2):
        out = reduce(method, comm, step)
        np.testing.assert_allclose(out.double(), exact_mean(comm.size, step), rtol=1e-5,
                                   atol=1e-6)
    assert not method.residuals and not method.q
    # (12 + 5) * 1 * 2 < 60 compresses the first matrix only; (4 + 6) * 2 = 20 < 24 too
    out = reduce(method, comm, 2)
    np.testing.assert_allclose(out[-7:].double(), exact_mean(comm.size, 2)[-7:], rtol=1e-5,
                               atol=1e-6)
    assert float(method.residuals["bucket"][-7:].abs().max()) == 0
    big = PowerSGD(rank=1, inner="none", warmup_steps=0, min_compression_rate=5)
    np.testing.assert_allclose(reduce(big, comm, 0).double(), exact_mean(comm.size, 0),
                               rtol=1e-5, atol=1e-6)  # nothing worth compressing: exact


@pytest.mark.parametrize("inner", INNER)
def test_error_feedback_conserves_the_sum(comm, inner):
    """Sent + residual == gradients + last residual, summed over ranks, at every step."""
    method = PowerSGD(rank=2, inner=inner, warmup_steps=1, min_compression_rate=0)
    before = torch.zeros(SIZE, dtype=torch.float64)
    for step in range(4):
        out = reduce(method, comm, step)
        assert_same_on_all_ranks(comm, out.numpy())
        after = method.residuals.get("bucket", torch.zeros(SIZE)).double()
        sides = np.stack([(out.double() + after).numpy(),
                          (gradient(comm.rank, step).double() + before).numpy()])
        total = np.empty_like(sides)
        comm.Allreduce(sides, total, op=MPI.SUM)
        np.testing.assert_allclose(total[0], total[1], rtol=1e-5, atol=1e-5)
        before = after
    assert float(before.abs().max()) > 0  # rank 2 < full rank: there was a residual


def test_warm_start_converges_to_the_best_rank_r_approximation(comm):
    """Each warm-started step is one more power iteration on the same matrix."""
    g = torch.Generator().manual_seed(3)
    u, _ = torch.linalg.qr(torch.randn(40, 30, generator=g))
    v, _ = torch.linalg.qr(torch.randn(30, 30, generator=g))
    matrix = (u * 0.8 ** torch.arange(30.0)) @ v.T  # singular values 0.8^i
    best = float(torch.linalg.matrix_norm(matrix - u[:, :2] * 0.8 ** torch.arange(2.0)
                                          @ v[:, :2].T))
    communicator = ccl.Communicator(comm, algorithm="ring", min_compress_bytes=0)
    errors = {}
    for warm in (True, False):
        method = PowerSGD(rank=2, inner="none", warmup_steps=0, warm_start=warm)
        for step in range(12):
            method.residuals.clear()  # the same matrix each step, no feedback
            out = method.reduce(communicator, "m", matrix.reshape(-1), [matrix.shape], step)
        errors[warm] = float(torch.linalg.matrix_norm(out.view(40, 30) - matrix))
    assert errors[True] < 1.01 * best < 1.05 * best < errors[False]


def test_get_codec_says_powersgd_is_a_method():
    assert "powersgd" not in registered_codecs()
    with pytest.raises(ValueError, match="not a codec.*DistributedOptimizer"):
        get_codec("powersgd")


def _optimizer(hvd, model, codec, **options):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5),
                                    named_parameters=model.named_parameters(), codec=codec,
                                    min_compress_bytes=0, **options)


CODEC = {"id": "powersgd", "rank": 1, "min_compression_rate": 0, "warmup_steps": 1}


def test_optimizer_bad_arguments_raise_on_every_rank(comm, hvd):
    model = Net()
    for bad, error in (({"id": "powersgd", "rank": 0}, "rank must be an int"),
                       ({"id": "powersgd", "inner": "powersgd"}, "cannot be PowerSGD"),
                       ({"id": "powersgd", "ranks": 2}, "no setting.*'ranks'"),
                       ({"id": "powersgd", "inner": "nope"}, "unknown codec")):
        with pytest.raises(ValueError, match=error):
            _optimizer(hvd, model, bad)
    with pytest.raises(ValueError, match="lr_corrected"):
        _optimizer(hvd, model, "powersgd", lr_corrected=True)
    if comm.size > 1:
        with pytest.raises(ValueError if comm.rank == 0 else ccl.MismatchError):
            _optimizer(hvd, model, {"id": "powersgd", "rank": 0} if comm.rank == 0
                       else "powersgd")
        with pytest.raises(ccl.MismatchError):  # valid, but different settings
            _optimizer(hvd, model, PowerSGD(rank=1 + comm.rank))
    opt = _optimizer(hvd, model, "powersgd")  # the ranks still agree afterwards
    assert opt._ccl.plan.config() == PowerSGD().get_config()


@pytest.mark.parametrize("inner", ["bf16", "thc"])
def test_optimizer_checkpoint_continues_bit_identically(comm, hvd, inner):
    codec = dict(CODEC, inner=inner)

    def build():
        model = Net()
        return model, _optimizer(hvd, model, codec, algorithm="ring",
                                 fusion_threshold_bytes=200)

    model, opt = build()
    train(hvd, model, opt, 8)
    uninterrupted = flat_params(model)
    assert_same_on_all_ranks(comm, uninterrupted)

    model, opt = build()
    train(hvd, model, opt, 4)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    saved = opt.state_dict()["ccl"]["powersgd"]
    assert saved["q"] and any(float(r.abs().max()) > 0 for r in saved["residuals"].values())

    def resume(keep):
        buf.seek(0)
        checkpoint = torch.load(buf, weights_only=True)
        if not keep:
            del checkpoint["opt"]["ccl"]
        model, opt = build()
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
        train(hvd, model, opt, 4, start=4)
        return flat_params(model)

    np.testing.assert_array_equal(resume(True), uninterrupted)
    assert not np.array_equal(resume(False), uninterrupted)  # the state matters
    other = _optimizer(hvd, Net(), dict(codec, rank=2), algorithm="ring",
                       fusion_threshold_bytes=200)
    with pytest.raises(ValueError, match="PowerSGD settings"):
        other.load_state_dict(opt.state_dict())


def test_ddp_hook_learns_and_continues_bit_identically(comm, hvd, process_group):  # noqa: F811
    def build():
        model, state = ddp(make_model(), dict(CODEC, inner="bf16"), algorithm="ring",
                           min_compress_bytes=0)
        return model, state, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, state, opt = build()
    train_ddp(model, opt, comm.rank, 3)
    buffer = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                "ccl": state.state_dict()}, buffer)
    assert state.state_dict()["powersgd"]["residuals"]
    train_ddp(model, opt, comm.rank, 3, start=3)
    expected = flat_params(model.module)
    assert_same_on_all_ranks(comm, expected)

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model, state, opt = build()
    model.module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["ccl"])
    train_ddp(model, opt, comm.rank, 3, start=3)
    assert flat_params(model.module).tobytes() == expected.tobytes()
    with pytest.raises(ValueError, match="without PowerSGD"):
        state.load_state_dict({k: v for k, v in saved["ccl"].items() if k != "powersgd"})
    if comm.size > 1:
        with pytest.raises(ValueError if comm.rank == 0 else ccl.MismatchError):
            ct.ddp_comm_hook({"id": "powersgd", "seed": -1} if comm.rank == 0 else "powersgd")


@pytest.mark.max_ranks(3)
def test_training_on_digits_reaches_exact_averaging(comm, hvd):
    """An MLP on digits learns as much per step as with exact averaging (rank 4, defaults)."""
    x, y, x_test, y_test = digits_shards(comm.rank, comm.size)
    order = batches(x, comm.rank, 150)
    accuracies, sent = {}, {}
    for codec in (None, {"id": "powersgd", "rank": 4}):
        model = mlp(64)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05,
                                                       momentum=0.9),
                                       named_parameters=model.named_parameters(), codec=codec)
        for index in order:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[index]), y[index]).backward()
            opt.step()
        assert_same_on_all_ranks(comm, flat_params(model))
        accuracies[codec is None] = accuracy(model, x_test, y_test)
        sent[codec is None] = opt.communication_stats()["bytes_sent"]
    if comm.size > 1:  # at one rank nothing is sent
        assert sent[False] < 0.25 * sent[True], sent
    assert accuracies[True] > 0.9
    assert accuracies[False] >= accuracies[True] - 0.015, accuracies


@pytest.mark.mpi(min_size=2)
def test_inner_codec_cuts_the_bytes_of_p_and_q(comm):
    """P and Q travel with the inner codec: bf16 sends half of float32's bytes."""
    shapes = [torch.Size((256, 128))]
    x = torch.randn(256 * 128, generator=torch.Generator().manual_seed(comm.rank))
    sent = {}
    for inner in ("none", "bf16"):
        communicator = ccl.Communicator(comm, algorithm="ring", min_compress_bytes=0)
        PowerSGD(rank=4, inner=inner, warmup_steps=0).reduce(communicator, "w", x, shapes, 0)
        sent[inner] = communicator.stats()["bytes_sent"]
    assert 0.45 * sent["none"] < sent["bf16"] < 0.55 * sent["none"], sent
