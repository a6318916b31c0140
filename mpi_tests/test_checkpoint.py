"""ccl.torch checkpoints: files of every format version load, at every rank count.

``mpi_tests/checkpoints/v<N>/`` holds, per scenario (``checkpoints/scenarios.py``)
and rank, a checkpoint saved at two ranks by the code of format version N.
Loaded at two ranks on the rank that saved it, training continues to the
weights the saving run reached (bit for bit on the saving machine; to a few
ulps on a CPU whose float kernels round otherwise), and bit for bit to what
the loaded state, saved again in today's format and loaded, continues to;
at any other rank count (or another rank's file) everything but the
per-rank residuals loads, with one warning.
"""

import glob
import os
import warnings

import pytest

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402
import ccl.torch.checkpoint  # noqa: E402,F401
from ccl.testing import assert_same_on_all_ranks  # noqa: E402
from mpi_tests.checkpoints.scenarios import BEFORE, MORE, NAMES, Run  # noqa: E402

pytestmark = pytest.mark.mpi

torch.set_num_threads(1)

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints")
VERSIONS = sorted(os.path.basename(d) for d in glob.glob(os.path.join(HERE, "v*"))
                  if os.path.isdir(d))


@pytest.fixture
def hvd(comm, process_group):
    """ccl.torch on the test's communicator, with DDP's and FSDP's gloo group."""
    ct.init(comm)
    yield ct
    ct.shutdown()


def fixture(version, name, rank):
    return torch.load(os.path.join(HERE, version, f"{name}-rank{rank}.pt"), weights_only=True)


def feedback_steps(state):
    """``{key: step}`` of every communicator of a saved ccl state, in any format version."""
    entry = state.get("ccl", state)
    communicators = entry["communicators"] if "communicators" in entry \
        else [entry["communicator"]]
    return [{k: int(v["step"]) for k, v in c["feedback"].items()} for c in communicators]


def residual_sum(state):
    entry = state.get("ccl", state)
    communicators = entry["communicators"] if "communicators" in entry \
        else [entry["communicator"]]
    return sum(float(r.abs().sum()) for c in communicators for e in c["feedback"].values()
               for (_, _, r) in e["residuals"].values())


def test_fixtures_exist():
    assert "v1" in VERSIONS
    for version in VERSIONS:
        for name in NAMES:
            for rank in (0, 1):
                assert os.path.exists(os.path.join(HERE, version, f"{name}-rank{rank}.pt"))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", NAMES)
def test_saved_checkpoint_loads(comm, hvd, version, name):
    saved = fixture(version, name, comm.rank % 2)
    own = comm.size == 2
    run = Run(name)
    if name == "fsdp" and not own:  # other shards at another size: the model stays as built
        saved = {k: v for k, v in saved.items() if k != "model"}
        run.load = lambda s: run.ccl.load_state_dict(s["ccl"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.load(saved)
    told = [str(w.message) for w in caught if "residuals" in str(w.message)]
    assert len(told) == (0 if own else 1), told
    now = run.ccl.state_dict()
    assert feedback_steps(now) == feedback_steps(saved["ccl"])  # the keys' steps load everywhere
    assert (residual_sum(now) > 0) == own  # this rank's residuals only where they are its own
    if own:
        assert residual_sum(now) == residual_sum(saved["ccl"])
        again = Run(name)  # the loaded state, saved in today's format and loaded anew
        again.load(run.save())
        run.train(MORE, start=BEFORE)
        again.train(MORE, start=BEFORE)
        # bit for bit on this machine: nothing of the loaded state is lost on the way
        assert torch.equal(again.flat(), run.flat())
        # the saving machine's weights: another CPU's float kernels round a few values
        # differently (1 to 4 ulps in up to 41 of 163 values, the code of the files' own
        # commit included, on a CPU with AVX-512); a state that loaded wrong is far off
        torch.testing.assert_close(run.flat(), saved["after"], rtol=1e-5, atol=1e-7)
    else:
        assert f"rank {comm.rank} of {comm.size}" in told[0] and "steps" in told[0]
        run.train(1, start=BEFORE)  # and training goes on
        if name not in ("fsdp", "diloco"):  # replicas: the same weights on every rank
            assert_same_on_all_ranks(comm, run.flat().numpy())


def test_a_state_of_another_object_or_a_newer_format_is_refused(comm, hvd):
    adam = fixture(VERSIONS[-1], "adam", comm.rank % 2)["ccl"]["ccl"]
    run = Run("diloco")
    with pytest.raises(ValueError, match="checkpoint of a ccl CompressedAdam, not of a DiLoCo"):
        run.ccl.load_state_dict(adam)
    newer = dict(run.ccl.state_dict(), version=ct.checkpoint.FORMAT_VERSION + 1)
    with pytest.raises(ValueError, match="format version .* is not supported"):
        run.ccl.load_state_dict(newer)
    with pytest.raises(ValueError, match="not a ccl DiLoCo state"):
        run.ccl.load_state_dict({"version": 1})
    run.train(1)  # nothing was loaded: the run goes on from where it was


@pytest.mark.parametrize("name", ["optimizer", "adam", "ddp", "fsdp", "diloco"])
def test_every_object_saves_the_one_format(comm, hvd, name):
    run = Run(name)
    run.train(2)
    state = run.ccl.state_dict()
    entry = state.get("ccl", state)
    owner = {"optimizer": "DistributedOptimizer", "adam": "CompressedAdam",
             "ddp": "DDPHookState", "fsdp": "FSDPState", "diloco": "DiLoCo"}[name]
    assert (entry["version"], entry["owner"]) == (ct.checkpoint.FORMAT_VERSION, owner)
    assert (entry["rank"], entry["size"]) == (comm.rank, comm.size)
    assert entry["steps"] == (None if name == "fsdp" else 2)
    assert {c["codec"]["id"] for c in entry["communicators"]} <= {"thc", "onebit"}
    # a rank's own state loads without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run.ccl.load_state_dict(state)
