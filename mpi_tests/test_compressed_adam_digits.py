"""CompressedAdam with its defaults trains a ReLU MLP on digits like exact AdamW.

The model a newcomer writes first: 64-256-256-10 with ReLU on
scikit-learn's digits, batch 32 per rank, lr 1e-3. Digits has pixels that
are always 0 and ReLU units that die, so some coordinates end the warm-up
with a tiny variance. When the codec compressed the momentum, its error
(onebit gives every coordinate its chunk's mean magnitude) divided by that
tiny variance's root made steps thousands of times Adam's (the largest
weight went from 0.2 to 23 in the first compressed step) and the training
diverged a few steps later.
"""

import math

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

import ccl.torch as ct  # noqa: E402
from ccl.bench.torch_digits import accuracy, digits_shards, mlp  # noqa: E402
from ccl.codecs import registered_codecs  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)

CODECS = [c for c in ("onebit", "3lc", "thc") if c in registered_codecs()]
STEPS = 240  # CompressedAdam's default warm-up is 100 steps
BATCH = 32


def batches(x, rank, steps):
    """The indices of ``rank``'s batches for ``steps`` steps (a seeded order per epoch)."""
    out = []
    while len(out) < steps:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(
            1000 * len(out) + rank))
        out += [order[i:i + BATCH] for i in range(0, len(x) - BATCH + 1, BATCH)]
    return out[:steps]


def exact_adamw(size):
    """Test accuracy of AdamW on the gradients averaged exactly over ``size`` ranks'
    batches: what DistributedOptimizer(AdamW) without a codec computes, here computed
    by every rank alone (cheap for this model)."""
    shards = [digits_shards(r, size) for r in range(size)]
    order = [batches(shards[r][0], r, STEPS) for r in range(size)]
    model = mlp(256)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        opt.zero_grad()
        for (x, y, _, _), index in zip(shards, (o[step] for o in order)):
            (torch.nn.functional.cross_entropy(model(x[index]), y[index]) / size).backward()
        opt.step()
    return accuracy(model, *shards[0][2:])


def train(comm, model, optimizer, data):
    """``STEPS`` steps on this rank's shard; the first step whose loss was not finite or
    above 100 on some rank (None: none), and the test accuracy."""
    x, y, x_test, y_test = data
    diverged = None
    for step, index in enumerate(batches(x, comm.rank, STEPS), start=1):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
        loss.backward()
        optimizer.step()
        worst = comm.allreduce(loss.item(), op=MPI.MAX)
        if diverged is None and not (math.isfinite(worst) and worst <= 100):
            diverged = step
    return diverged, accuracy(model, x_test, y_test)


@pytest.mark.max_ranks(3)
def test_defaults_train_like_exact_adamw(hvd, comm):
    data = digits_shards(comm.rank, comm.size)
    reference = exact_adamw(comm.size)
    assert reference > 0.9
    failures = []
    for codec in CODECS:
        model = mlp(256)
        # every argument at its default but the codec and the algorithm ("auto" decides
        # from a timed probe of the link)
        opt = ct.CompressedAdam(model.parameters(), lr=1e-3, codec=codec,
                                named_parameters=model.named_parameters(), algorithm="direct")
        diverged, acc = train(comm, model, opt, data)
        largest = max(float(p.detach().abs().max()) for p in model.parameters())
        if diverged is not None or not acc >= reference - 0.02 or not largest < 1.0:
            failures.append(f"{codec}: diverged at step {diverged}, accuracy {acc:.4f} "
                            f"against exact AdamW's {reference:.4f}, max |w| {largest:.3g}")
    assert not failures, "; ".join(failures)


@pytest.mark.serial
def test_benchmark_runs(tmp_path, capsys):
    import json

    from ccl.bench import adam_digits

    path = tmp_path / "adam.json"
    threads = torch.get_num_threads()
    try:  # main() sets torch's thread count for the benchmark
        assert adam_digits.main(["--seeds", "0", "--epochs", "1", "--batch", "128",
                                 "--warmup", "5", "--codecs", "onebit", "no-such-codec",
                                 "--json", str(path)]) == 0
    finally:
        torch.set_num_threads(threads)
    runs = json.loads(path.read_text())["runs"]
    assert [r["method"] for r in runs] == ["adamw", "cadam/onebit"]
    assert all(r["diverged_at"] is None and r["steps"] == 10 for r in runs)
    out = capsys.readouterr().out
    assert "cadam/onebit" in out and "'no-such-codec' skipped" in out
