"""ccl.torch.ddp_comm_hook: ccl codecs inside DistributedDataParallel, at every rank count.

DDP's process group is gloo on 127.0.0.1 (one per test module, over all
ranks of the world); the hook's traffic goes over ccl.torch's MPI
communicator. Every rank builds the same tiny model from a seed and trains on
its own batches (seeded by rank and step), labelled by a fixed teacher so
that the loss can fall.
"""

import io
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)

# Tiny caps: after DDP's rebuild every parameter has a bucket of its own (its first
# buckets follow another rule, so the rebuild changes them).
SMALL_BUCKETS_MB = 0.0001
LOSSY = ["fp16", "onebit", "thc", "topk"]
# "auto" sends buckets this small uncompressed: name the algorithm to compress them
COMPRESS = dict(algorithm="ring", min_compress_bytes=0)


@pytest.fixture
def hvd(comm, process_group):
    """ccl.torch initialised on the test's own communicator."""
    ct.init(comm)
    yield ct
    ct.shutdown()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


TEACHER = torch.randn(6, 3, generator=torch.Generator().manual_seed(7))


def batch(rank, step, n=16):
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(10_000 * step + rank))
    return x, (x @ TEACHER).argmax(dim=1)


def train(model, opt, rank, steps, start=0):
    for step in range(start, start + steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def eval_loss(model):
    x, y = batch(-1, 0, n=256)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def ddp(model, codec=None, **options):
    wrapped = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=SMALL_BUCKETS_MB)
    state = None
    if codec is not None:
        state, hook = ct.ddp_comm_hook(codec, **options)
        wrapped.register_comm_hook(state, hook)
    return wrapped, state


def test_none_codec_matches_ddp_without_hook(comm, hvd):
    ours, _ = ddp(make_model(), "none")
    theirs, _ = ddp(make_model())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
    for model, opt in zip((ours, theirs), opts):
        train(model, opt, comm.rank, 3)
    # the same average, summed in another order (DDP divides first, then sums)
    torch.testing.assert_close(flat(ours.module), flat(theirs.module), rtol=1e-6, atol=1e-7)
    assert_same_on_all_ranks(comm, flat(ours.module))


@pytest.mark.parametrize("codec", LOSSY)
def test_lossy_codecs_keep_replicas_identical_and_learn(comm, hvd, codec):
    model, state = ddp(make_model(), codec, **COMPRESS)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    before = eval_loss(model)
    train(model, opt, comm.rank, 12)
    assert_same_on_all_ranks(comm, flat(model.module))
    assert eval_loss(model) < 0.9 * before
    assert state.communicator.stats()["calls"] > 12  # several buckets per step


def test_without_thread_multiple_reductions_run_in_the_hook(comm, hvd, monkeypatch):
    monkeypatch.setattr("ccl.torch.engine.threads_supported", lambda: False)
    model, state = ddp(make_model(), "fp16", **COMPRESS)
    assert not state.engine.threaded
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), comm.rank, 3)
    assert_same_on_all_ranks(comm, flat(model.module))


def test_public_state_and_hook_pair_as_torch_powersgd(comm, hvd):
    """``register_comm_hook(DDPHookState(...), ccl_comm_hook)``, as ``PowerSGDState``."""
    runs = []
    for make in ("pair", "factory"):
        model = torch.nn.parallel.DistributedDataParallel(make_model(),
                                                          bucket_cap_mb=SMALL_BUCKETS_MB)
        if make == "pair":
            state = ct.DDPHookState("thc", "ring", min_compress_bytes=0)
            model.register_comm_hook(state, ct.ccl_comm_hook)
        else:
            model.register_comm_hook(*ct.ddp_comm_hook("thc", **COMPRESS))
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), comm.rank, 3)
        runs.append(flat(model.module))
    assert runs[0].tobytes() == runs[1].tobytes()
    assert state.communicator.stats()["calls"] > 3
    with pytest.raises(TypeError, match="unknown options"):
        ct.DDPHookState("fp16", op="sum")
    runtime = ct.runtime.current()  # the constructor's former, internal signature
    with pytest.warns(DeprecationWarning, match="DDPHookState"):
        old = ct.DDPHookState(runtime, ccl.codecs.get_codec("fp16"), "auto", {})
    assert old.communicator.codec.codec_id == "fp16"


def test_bucket_rebuild_keeps_keys(comm, hvd):
    model, _ = ddp(make_model())
    state, hook = ct.ddp_comm_hook("thc", **COMPRESS)
    names = {id(p): n for n, p in model.module.named_parameters()}
    seen = []  # per step: (bucket index, key, names of its parameters)

    def spy(state, bucket):
        seen[-1].append((bucket.index(), state.key(bucket),
                         tuple(sorted(names[id(p)] for p in bucket.parameters()))))
        return hook(state, bucket)

    model.register_comm_hook(state, spy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        seen.append([])
        train(model, opt, comm.rank, 1, start=step)
    assert [key for _, key, _ in seen[0]] != [key for _, key, _ in seen[1]]  # DDP rebuilt
    assert seen[1] == seen[2] == seen[3]  # and kept its new buckets
    params_of = {}
    for step in seen:
        for _, key, params in step:
            assert params_of.setdefault(key, params) == params  # a key names its parameters
    # residuals of the first buckets are gone; the others are the last pass's
    assert sorted(state.state_dict()["communicators"][0]["feedback"]) == \
        sorted(key for _, key, _ in seen[3])
    assert comm.allgather(seen) == [seen] * comm.size  # the same keys on every rank


@pytest.mark.parametrize("bucket_cap_mb", [SMALL_BUCKETS_MB, 25])
def test_state_round_trip_continues_bit_identically(comm, hvd, bucket_cap_mb):
    def build():
        model = torch.nn.parallel.DistributedDataParallel(make_model(),
                                                          bucket_cap_mb=bucket_cap_mb)
        state, hook = ct.ddp_comm_hook("thc", **COMPRESS)
        model.register_comm_hook(state, hook)
        return model, state, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, state, opt = build()
    train(model, opt, comm.rank, 3)
    buffer = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                "ccl": state.state_dict()}, buffer)
    train(model, opt, comm.rank, 3, start=3)
    expected = flat(model.module)

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model, state, opt = build()
    model.module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["ccl"])
    train(model, opt, comm.rank, 3, start=3)
    assert flat(model.module).tobytes() == expected.tobytes()
    assert_same_on_all_ranks(comm, expected)


def test_bad_arguments_raise_on_every_rank(comm, hvd):
    with pytest.raises(ValueError, match="no-such-codec"):
        ct.ddp_comm_hook("no-such-codec")
    with pytest.raises(TypeError, match="unknown options"):
        ct.ddp_comm_hook("fp16", op="sum")
    if comm.size > 1:
        expected = ValueError if comm.rank == 0 else ccl.MismatchError
        with pytest.raises(expected):
            ct.ddp_comm_hook("no-such-codec" if comm.rank == 0 else "fp16")
    state, _ = ct.ddp_comm_hook("fp16")  # the ranks still agree afterwards
    with pytest.raises(ValueError, match="not a ccl DDPHookState state"):
        state.load_state_dict({"version": 1})


# ------------------------------------------------------------------ hardening
def _rank0(comm, state):
    """Rank 0's ``state``, saved there and loaded on every rank (weights only)."""
    data = None
    if comm.rank == 0:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
    return torch.load(io.BytesIO(comm.bcast(data, root=0)), weights_only=True)


def test_rank0_state_loaded_on_every_rank_keeps_training(comm, hvd):
    model, state = ddp(make_model(), "thc", **COMPRESS)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, comm.rank, 3)
    saved = _rank0(comm, {"model": model.module.state_dict(), "ccl": state.state_dict()})
    model, state = ddp(make_model(), "thc", **COMPRESS)
    model.module.load_state_dict(saved["model"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.load_state_dict(saved["ccl"])
    assert len([w for w in caught if "steps are kept" in str(w.message)]) == (comm.rank != 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, comm.rank, 3, start=3)  # used to raise "disagree on the key's step"
    assert_same_on_all_ranks(comm, flat(model.module))


def test_collective_error_in_the_hook_is_catchable(comm, hvd):
    model, _ = ddp(make_model(), "fp16", check_finite=True, **COMPRESS)
    x, y = batch(comm.rank, 0)
    if comm.rank == 0:
        x[0, 0] = float("nan")
    # used to be "RuntimeError: Unable to cast ... to Tensor" from torch
    with pytest.raises(ccl.NonFiniteError, match="rank"):
        torch.nn.functional.cross_entropy(model(x), y).backward()


def test_one_hook_state_on_two_models_is_refused(comm, hvd):
    first, state = ddp(make_model(), "onebit", **COMPRESS)
    _, hook = ct.ddp_comm_hook("onebit", **COMPRESS)
    second, _ = ddp(make_model(seed=1))
    second.register_comm_hook(state, hook)
    train(first, torch.optim.SGD(first.parameters(), lr=0.1), comm.rank, 2)
    x, y = batch(comm.rank, 2)
    with pytest.raises(RuntimeError, match="another"):
        torch.nn.functional.cross_entropy(second(x), y).backward()


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_stops_early_makes_every_rank_raise(comm, hvd):
    model, _ = ddp(make_model(), "fp16", **COMPRESS)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, comm.rank, 2)
    last = comm.size - 1
    with pytest.raises(ccl.MismatchError, match="stopped after step 2") as info:
        if comm.rank == last:
            ct.shutdown()  # one batch fewer: the end of its training
        else:
            train(model, opt, comm.rank, 1, start=2)  # instead of waiting forever
    assert info.value.ranks == [[last], list(range(last))]
