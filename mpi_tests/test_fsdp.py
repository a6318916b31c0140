"""ccl.torch.fsdp_compress: ccl's collectives inside FSDP2 (fully_shard), at every rank count.

FSDP's process group is gloo on 127.0.0.1 (one per test module, over all
ranks of the world); what ccl installs runs over ccl.torch's MPI
communicator. Every rank builds the same small model of three linear blocks
(each fully_shard-ed, row counts that do not divide by every rank count, so
FSDP pads) and trains on its own batches (seeded by rank and step).
"""

import copy
import io

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
fsdp = pytest.importorskip("torch.distributed.fsdp")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)

# "auto" sends tensors this small uncompressed: name the algorithm to compress them
COMPRESS = dict(algorithm="ring", min_compress_bytes=0)
WIDTHS = (6, 17, 13, 3)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(a, b)
                                          for a, b in zip(WIDTHS, WIDTHS[1:]))

    def forward(self, x):
        for block in self.blocks[:-1]:
            x = torch.tanh(block(x))
        return self.blocks[-1](x)


def make_model(**shard_options):
    """The seeded model, each block and the whole fully_shard-ed (no options: not sharded)."""
    torch.manual_seed(0)
    model = Net()
    if shard_options.pop("sharded", True):
        for block in model.blocks:
            fsdp.fully_shard(block, **shard_options)
        fsdp.fully_shard(model, **shard_options)
    return model


TEACHER = torch.randn(WIDTHS[0], WIDTHS[-1], generator=torch.Generator().manual_seed(7))


def batch(rank, step, n=16):
    x = torch.randn(n, WIDTHS[0], generator=torch.Generator().manual_seed(10_000 * step + rank))
    return x, (x @ TEACHER).argmax(dim=1)


def eval_loss(model):
    with torch.no_grad():
        return float(loss_of(model, -1, 0))


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x).float(), y)


def train(model, opt, rank, steps, start=0):
    for step in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()


def full(model):
    """Every parameter whole (FSDP's exact all-gather), flat, float32."""
    with torch.no_grad():
        return torch.cat([p.full_tensor().reshape(-1).float() for p in model.parameters()]).numpy()


@pytest.fixture
def hvd(comm, process_group):
    """ccl.torch initialised on the test's own communicator."""
    ct.init(comm)
    yield ct
    ct.shutdown()


def trained(steps=3, codec=None, ccl_options=None, lr=0.05, **shard_options):
    model = make_model(**shard_options)
    state = None if codec is None else ct.fsdp_compress(model, **codec, **(ccl_options or {}))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    train(model, opt, ct.rank(), steps)
    return model, state


@pytest.mark.parametrize("reshard", [True, False])
def test_none_matches_fsdp2_without_ccl(comm, hvd, reshard):
    theirs, _ = trained(reshard_after_forward=reshard)
    ours, state = trained(codec=dict(codec=None, all_gather_codec="none"),
                          reshard_after_forward=reshard)
    # the same mean, summed in another order
    np.testing.assert_allclose(full(ours), full(theirs), rtol=1e-5, atol=1e-6)
    assert_same_on_all_ranks(comm, full(ours))
    stats = state.stats()
    if comm.size > 1:  # FSDP runs no collective on one rank
        assert sorted(stats["modules"]) == ["blocks.0", "blocks.1", "blocks.2"]
        assert stats["bytes_gradients"] > 0 and stats["bytes_weights"] > 0
        # resharded after forward: gathered again for backward
        assert stats["calls"]["all_gather"] == 3 * 3 * (2 if reshard else 1)
        assert stats["calls"]["reduce_scatter"] == 3 * 3


def test_bf16_parameters_none_matches_fsdp2(comm, hvd):
    policy = fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    theirs, _ = trained(mp_policy=policy)
    ours, _ = trained(codec=dict(codec="none", all_gather_codec="bf16"), mp_policy=policy)
    # bf16 weights gathered as bf16 lose nothing: the same training to float rounding
    np.testing.assert_allclose(full(ours), full(theirs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("codec,weights", [("thc", None), ("3lc", None), ("thc", "bf16"),
                                           ("fp16", "thc"), ("onebit", "dithering")])
def test_lossy_codecs_keep_replicas_identical_and_learn(comm, hvd, codec, weights):
    model, state = trained(steps=0, codec=dict(codec=codec, all_gather_codec=weights,
                                               **COMPRESS))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    before = eval_loss(model)
    train(model, opt, comm.rank, 15)
    assert eval_loss(model) < before
    assert_same_on_all_ranks(comm, full(model))
    if comm.size > 1:
        assert set(state.stats()["algorithms"]) <= {"ring", "allgather"}


@pytest.mark.parametrize("weights", ["thc", "bf16", "dithering"])
def test_gathered_weights_are_identical_on_every_rank(comm, hvd, weights):
    policy = fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    model = make_model(mp_policy=policy if weights == "bf16" else fsdp.MixedPrecisionPolicy())
    ct.fsdp_compress(model, codec="thc", all_gather_codec=weights, **COMPRESS)
    seen = []
    for block in model.blocks:
        # after FSDP's own pre-forward hook: the weights forward uses, gathered
        block.register_forward_pre_hook(lambda m, i: seen.append(
            torch.cat([m.weight.detach().reshape(-1), m.bias.detach().reshape(-1)]).float()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, comm.rank, 2)
    gathered = torch.cat(seen).numpy()
    assert_same_on_all_ranks(comm, gathered)
    master = full(model)  # the sharded weights the optimizer keeps: exact
    if comm.size > 1 and weights == "thc":
        # what forward used was rounded: it is not the master weights of the same step
        model(batch(comm.rank, 0)[0])
        assert not np.array_equal(torch.cat(seen[-3:]).numpy(), master)


def _flat_layout(tensors, size):
    """FSDP's reduce-scatter input: rank r's rows of every tensor (dim 0 padded), rank by rank."""
    padded = []
    for t in tensors:
        rows = -(-t.shape[0] // size) * size
        p = torch.zeros((rows,) + tuple(t.shape[1:]), dtype=torch.float64)
        p[:t.shape[0]] = t
        padded.append(p.reshape(size, -1))
    return torch.cat([torch.cat([p[r] for p in padded]) for r in range(size)]).numpy()


def test_error_feedback_conserves_what_was_put_in(comm, hvd):
    """delivered + residuals held == the exact mean of every rank's gradients, over steps."""
    steps = 6
    model = make_model()
    plain = make_model(sharded=False)  # the same weights: lr 0 keeps them
    state = ct.fsdp_compress(model, codec="thc", **COMPRESS)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    put_in = {i: 0.0 for i in range(len(plain.blocks))}
    for step in range(steps):
        loss_of(model, comm.rank, step).backward()  # no zero_grad: .grad sums what came
        opt.step()
        plain.zero_grad()
        loss_of(plain, comm.rank, step).backward()
        for i, block in enumerate(plain.blocks):
            local = _flat_layout([block.weight.grad, block.bias.grad], comm.size)
            put_in[i] = put_in[i] + comm.allreduce(local, op=MPI.SUM) / comm.size
    feedback = state.communicators[0].feedback
    lossy = 0.0
    for i, block in enumerate(model.blocks):
        delivered = _flat_layout([block.weight.grad.full_tensor(),
                                  block.bias.grad.full_tensor()], comm.size)
        # FSDP's padding rows carry nothing in and are dropped from what comes out
        real = _flat_layout([torch.ones_like(block.weight.grad.full_tensor()),
                             torch.ones_like(block.bias.grad.full_tensor())], comm.size) > 0
        # each parameter has its residuals under its own key, over its ranks x columns
        held = []
        for name, grad in (("weight", block.weight.grad), ("bias", block.bias.grad)):
            width = _flat_layout([grad.full_tensor()], comm.size).size // comm.size
            entry = feedback.get(f"blocks.{i}/blocks.{i}.{name}")  # none on one rank
            part = np.zeros(comm.size * width) if entry is None else entry.held(
                comm.size * width)
            held.append(part.reshape(comm.size, width))
        held = np.concatenate(held, axis=1).reshape(-1)
        held = comm.allreduce(held, op=MPI.SUM) / comm.size
        np.testing.assert_allclose((delivered + held)[real], put_in[i][real], atol=2e-5)
        lossy = max(lossy, float(np.abs(held[real]).max()))
    if comm.size > 1:
        assert lossy > 1e-4  # thc is lossy: the residuals really hold something


class TwoScales(torch.nn.Module):
    """One FSDP module whose bias gets gradients 10^4 times smaller than its weight's."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(64, 32))
        self.bias = torch.nn.Parameter(torch.zeros(64))

    def forward(self, x):
        return x @ self.weight.t() + 1e-4 * self.bias


def _bias_gradient_error(comm, per_parameter):
    """Relative error of the bias's reduced gradient under THC, against the exact mean."""
    torch.manual_seed(0)
    model = TwoScales()
    plain = copy.deepcopy(model)
    fsdp.fully_shard(model)
    state = ct.fsdp_compress(model, codec="thc", **COMPRESS)
    saved = state.state_dict()
    saved["per_parameter"] = per_parameter  # False: as states saved before the split
    state.load_state_dict(saved)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(comm.rank))
    (model(x) ** 2).mean().backward()
    (plain(x) ** 2).mean().backward()
    exact = comm.allreduce(plain.bias.grad.double().numpy(), op=MPI.SUM) / comm.size
    got = model.bias.grad.full_tensor().double().numpy()
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


@pytest.mark.mpi(min_size=2)  # one rank: FSDP reduces nothing
def test_each_parameter_is_compressed_at_its_own_scale(comm, hvd):
    own = _bias_gradient_error(comm, per_parameter=True)
    shared = _bias_gradient_error(comm, per_parameter=False)
    # under the weight's scale the bias's gradient is lost in the rounding
    assert own < 0.5 and shared > 20 * own, (own, shared)


@pytest.mark.parametrize("weights", [None, "thc"])
def test_checkpoint_round_trip_continues_bit_identically(comm, hvd, weights):
    options = dict(codec="thc", all_gather_codec=weights, **COMPRESS)
    model, state = trained(steps=3, codec=options)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    train(model, opt, comm.rank, 2, start=3)
    shards = [p.to_local().detach().clone() for p in model.parameters()]
    saved_opt = copy.deepcopy(opt.state_dict())
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    train(model, opt, comm.rank, 3, start=5)
    expected = full(model)

    again = make_model()
    restored = ct.fsdp_compress(again, **options)
    with torch.no_grad():
        for p, shard in zip(again.parameters(), shards):
            p.to_local().copy_(shard)
    opt2 = torch.optim.AdamW(again.parameters(), lr=0.05)
    opt2.load_state_dict(saved_opt)
    buffer.seek(0)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    train(again, opt2, comm.rank, 3, start=5)
    np.testing.assert_array_equal(full(again), expected)


def test_checkpoint_of_other_modules_is_refused(comm, hvd):
    state = ct.fsdp_compress(make_model(), codec="thc")
    saved = state.state_dict()
    saved["layout"] = ["blocks.0"]
    with pytest.raises(ValueError, match="saved for the FSDP modules"):
        state.load_state_dict(saved)
    with pytest.raises(ValueError, match="not a ccl FSDPState state"):
        state.load_state_dict({"version": 1})


@pytest.mark.parametrize("codec", [None, "thc"])
def test_gradient_accumulation_without_sync(comm, hvd, codec):
    def accumulate(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            model.set_requires_gradient_sync(False)
            loss_of(model, comm.rank, 2 * step).backward()
            model.set_requires_gradient_sync(True)
            loss_of(model, comm.rank, 2 * step + 1).backward()
            opt.step()
        return full(model)

    theirs = accumulate(make_model())
    model = make_model()
    state = ct.fsdp_compress(model, codec=codec, **COMPRESS)
    ours = accumulate(model)
    assert_same_on_all_ranks(comm, ours)
    if comm.size > 1:  # one reduce-scatter per block and step: the synced backward only
        assert state.stats()["calls"]["reduce_scatter"] == 3 * 3
    if codec is None:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.max_ranks(4)  # a 2 x 2 mesh: the one layout it needs
def test_hsdp_exact_inside_replicas_compressed_across(comm, hvd):
    if comm.size < 4 or comm.size % 2:
        pytest.skip("two replicas of at least two ranks each")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, comm.size // 2), mesh_dim_names=("replicate", "shard"))
    theirs, _ = trained()
    ours, state = trained(codec=dict(codec="none"), mesh=mesh["shard"])
    # each replica holds the whole model sharded over its ranks; shards averaged across
    np.testing.assert_allclose(full(ours), full(theirs), rtol=1e-5, atol=1e-6)
    stats = state.stats()["collectives"]
    assert stats["reduce_scatter"] > 0 and stats["all_reduce"] > 0

    lossy, state = trained(steps=5, codec=dict(codec="thc", all_gather_codec="bf16",
                                               **COMPRESS), mesh=mesh["shard"])
    assert_same_on_all_ranks(comm, full(lossy))
    keys = sorted(state.state_dict()["communicators"][0]["feedback"])
    shard = comm.rank % (comm.size // 2)
    assert keys == [f"blocks.{i} shard {shard} of {comm.size // 2}/blocks.{i}.{name}"
                    for i in range(3) for name in ("bias", "weight")]


def test_state_not_kept_by_the_caller_lives_as_long_as_the_model(comm, hvd):
    import gc

    model = make_model()
    ct.fsdp_compress(model, codec="thc", all_gather_codec="bf16", **COMPRESS)
    gc.collect()
    ct.fsdp_compress(make_model(), codec="fp16")  # frees the communicators of dropped states
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, comm.rank, 2)
    assert_same_on_all_ranks(comm, full(model))


def test_model_without_fully_shard_raises_on_every_rank(comm, hvd):
    with pytest.raises(TypeError, match="fully_shard"):
        ct.fsdp_compress(make_model(sharded=False), codec="thc")


@pytest.mark.parametrize("weights", ["onebit", "topk", "3lc"])
def test_weights_codec_that_loses_too_much_raises_on_every_rank(comm, hvd, weights):
    with pytest.raises(ValueError, match="all_gather_codec"):
        ct.fsdp_compress(make_model(), codec="thc", all_gather_codec=weights)


def test_bad_arguments_raise_on_every_rank(comm, hvd):
    with pytest.raises(ValueError, match="algorithm"):
        ct.fsdp_compress(make_model(), codec="thc", algorithm="tree")
    with pytest.raises(TypeError, match="unknown options"):
        ct.fsdp_compress(make_model(), codec="thc", bucket_bytes=1)


@pytest.mark.mpi(min_size=2)
def test_ranks_disagreeing_on_the_codec_raise_on_every_rank(comm, hvd):
    with pytest.raises(ccl.MismatchError):
        ct.fsdp_compress(make_model(), codec="thc" if comm.rank == 0 else "fp16")
    # the ranks are still in step: a valid call works
    model, _ = trained(steps=1, codec=dict(codec="fp16"))
    assert_same_on_all_ranks(comm, full(model))
