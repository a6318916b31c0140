"""Horovod's DistributedOptimizer signature and broadcasts in ccl.torch, against exact averaging.

The reference trains a plain copy of the model with gradients averaged by
the MPI library's own ``Allreduce``: the wrapped optimizer must end at the
same weights (exactly without compression, closely with fp16).
"""

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]

torch.set_num_threads(1)


def model_and_data(rank, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
               for _ in range(4)]
    return model, batches


def loss_of(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def reference_weights(comm, rank, op="mean", closure=False):
    """Train with gradients reduced by MPI_Allreduce (float64 sum, then /size)."""
    model, batches = model_and_data(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for batch in batches:
        opt.zero_grad()
        loss_of(model, batch).backward()
        for p in model.parameters():
            total = np.empty(p.grad.numel(), dtype=np.float32)
            comm.Allreduce(p.grad.numpy().ravel(), total, op=MPI.SUM)
            grad = torch.from_numpy(total).reshape(p.shape)
            p.grad.copy_(grad / comm.Get_size() if op == "mean" else grad)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train(hvd, closure=False, **kwargs):
    model, batches = model_and_data(hvd.rank())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), **kwargs)
    for batch in batches:
        if closure:
            def step_closure(batch=batch):
                opt.zero_grad()
                loss = loss_of(model, batch)
                loss.backward()
                return loss

            loss = opt.step(step_closure)
            assert torch.is_tensor(loss)
        else:
            opt.zero_grad()
            loss_of(model, batch).backward()
            opt.step()
    return model, opt


def weights(model):
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("kwargs", [
    {}, {"compression": ct.Compression.none, "op": ct.Average},
    {"gradient_predivide_factor": 2.0}, {"num_groups": 2}, {"groups": 1},
    {"sparse_as_dense": True}, {"backward_passes_per_step": 1},
    {"process_set": ct.global_process_set},
])
def test_uncompressed_matches_exact_averaging(hvd, comm, kwargs):
    model, _ = train(hvd, **kwargs)
    for got, want in zip(weights(model), reference_weights(comm, hvd.rank())):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_op_sum(hvd, comm):
    model, _ = train(hvd, op=ct.Sum)
    for got, want in zip(weights(model), reference_weights(comm, hvd.rank(), op="sum")):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_step_with_closure_averages_its_gradients(hvd, comm):
    model, _ = train(hvd, closure=True)
    for got, want in zip(weights(model), reference_weights(comm, hvd.rank())):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_synchronize_then_skip_synchronize(hvd, comm):
    model, batches = model_and_data(hvd.rank())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    for batch in batches:
        opt.zero_grad()
        loss_of(model, batch).backward()
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
    for got, want in zip(weights(model), reference_weights(comm, hvd.rank())):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compression", ["fp16", "fp16-positional", "3lc", "codec-object"])
def test_compressed_training_is_close_and_compressed(hvd, comm, compression):
    chosen = {"fp16": ct.Compression.fp16, "fp16-positional": "fp16",
              "3lc": ct.Compression.codec("3lc", s=1.5),
              "codec-object": ccl.codecs.get_codec("thc")}[compression]
    if compression == "fp16-positional":  # ccl's third positional argument was the codec
        model, batches = model_and_data(hvd.rank())
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                       momentum=0.9),
                                       model.named_parameters(), chosen)
        for batch in batches:
            opt.zero_grad()
            loss_of(model, batch).backward()
            opt.step()
    else:
        model, opt = train(hvd, compression=chosen)
    assert opt.communication_stats()["compressed_buckets"] > 0
    reference = reference_weights(comm, hvd.rank())
    tolerance = 1e-2 if compression.startswith("fp16") else 0.5
    for got, want in zip(weights(model), reference):
        assert (got - want).abs().max().item() < tolerance
    if hvd.size() > 1:  # compressed on the wire (whatever the link speed): not exact
        assert opt.communication_stats()["bytes_sent"] > 0
        assert any(not torch.equal(got, want) for got, want in zip(weights(model), reference))
    from ccl.testing import assert_same_on_all_ranks

    assert_same_on_all_ranks(comm, torch.cat([w.reshape(-1) for w in weights(model)]).numpy())


@pytest.mark.parametrize("kwargs, error", [
    ({"op": ct.Max}, ValueError), ({"op": ct.Adasum, "compression": "3lc"}, ValueError),
    ({"compression": type("Custom", (), {"compress": staticmethod(lambda t: (t, None)),
                                         "decompress": staticmethod(lambda t, c: t)})},
     TypeError),
    ({"gradient_predivide_factor": 2.0, "op": ct.Sum}, ValueError),
    ({"gradient_predivide_factor": 0.0}, ValueError),
    ({"compression": ct.Compression.fp16, "codec": "fp16"}, ValueError),
    ({"num_groups": -1}, ValueError),
    ({"sparse_as_dense": "yes"}, TypeError),
])
def test_bad_arguments_raise_on_every_rank(hvd, kwargs, error):
    model, _ = model_and_data(hvd.rank())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(error):
        hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), **kwargs)
    if hvd.size() > 1:  # one rank's bad argument: the others raise MismatchError
        bad = kwargs if hvd.rank() == 0 else {}
        with pytest.raises(error if hvd.rank() == 0 else ccl.MismatchError):
            hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), **bad)


def bucket_names(opt):
    return [sorted(name for name, _, _ in bucket) for bucket in opt._ccl.plan.layout()]


def deep_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])


def test_groups_are_the_buckets(hvd):
    model = deep_model()
    params = dict(model.named_parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                   groups=[[params["0.weight"], params["2.bias"]],
                                           [params["1.weight"], params["1.bias"]]])
    # each group one bucket; a parameter in no group is alone (Horovod's semantics)
    assert sorted(bucket_names(opt)) == [["0.bias"], ["0.weight", "2.bias"],
                                         ["1.bias", "1.weight"], ["2.weight"]]
    model = deep_model()
    with pytest.warns(DeprecationWarning, match="num_groups"):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), num_groups=4)
    # six parameters in four contiguous groups of the optimizer's order: 2, 2, 1, 1
    assert sorted(bucket_names(opt)) == [["0.bias", "0.weight"], ["1.bias", "1.weight"],
                                         ["2.bias"], ["2.weight"]]
    model = deep_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=1,
                                   fusion_threshold_bytes=64)
    # within a group the fusion threshold still cuts (4x4 float32 weights: 64 bytes)
    assert all(sum(params[n].numel() * 4 for n in names) <= 64 or len(names) == 1
               for names in bucket_names(opt))
    model = deep_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert bucket_names(opt) == [sorted(params)]  # no groups: fused by size alone


@pytest.mark.parametrize("groups", ["two", 0, -2, [[1.0]], [7], "dup"])
def test_invalid_groups_raise_on_every_rank(hvd, groups):
    model = deep_model()
    if groups == "dup":
        groups = [[model[0].weight], [model[1].bias, model[0].weight]]
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), groups=groups)
    if hvd.size() > 1:  # one rank's bad groups: the others raise MismatchError
        with pytest.raises(ValueError if hvd.rank() == 0 else ccl.MismatchError):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     groups=groups if hvd.rank() == 0 else None)


def test_broadcasts_with_horovods_signatures(hvd):
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    model, _ = model_and_data(rank, seed=rank)
    hvd.broadcast_parameters(model.state_dict(), root)
    expected, _ = model_and_data(root, seed=root)
    for got, want in zip(weights(model), weights(expected)):
        assert torch.equal(got, want)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * size)
    assert hvd.broadcast_object({"r": rank}, root, name="obj") == {"r": root}
    assert hvd.broadcast_object(rank) == 0
    assert hvd.allgather_object(rank, name="ranks") == list(range(size))


def test_codec_keyword_keeps_ccl_defaults(hvd, comm):
    """ccl's codec= keeps algorithm="auto" (it may send uncompressed where that is faster)."""
    model, opt = train(hvd, codec="fp16", algorithm="ring", min_compress_bytes=0)
    reference = reference_weights(comm, hvd.rank())
    for got, want in zip(weights(model), reference):
        assert (got - want).abs().max().item() < 1e-2


def test_sparse_as_dense(hvd, comm):
    """An embedding with sparse gradients trains as with dense ones, averaged exactly."""
    def run(sparse):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 4, sparse=sparse)
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        if sparse:
            opt = hvd.DistributedOptimizer(opt, named_parameters=emb.named_parameters(),
                                           sparse_as_dense=True)
        for step in range(3):
            opt.zero_grad()
            ids = torch.tensor([(hvd.rank() + step) % 10, 3])
            emb(ids).sum().backward()
            if not sparse:  # the reference: MPI's sum of the dense gradients, / size
                total = np.empty(emb.weight.numel(), dtype=np.float32)
                comm.Allreduce(emb.weight.grad.numpy().ravel(), total, op=MPI.SUM)
                emb.weight.grad.copy_(torch.from_numpy(total).reshape(10, 4) / hvd.size())
            opt.step()
        return emb.weight.detach()

    torch.testing.assert_close(run(True), run(False), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("extra_dense", [False, True])
def test_sparse_gradients_without_sparse_as_dense(hvd, comm, extra_dense):
    """Sparse gradients come back sparse, their dense value the exact average of every rank's."""
    size, rank = hvd.size(), hvd.rank()

    def model():
        torch.manual_seed(0)
        emb = torch.nn.Embedding(12, 3, sparse=True)
        head = torch.nn.Linear(3, 1) if extra_dense else None
        params = list(emb.parameters()) + (list(head.parameters()) if head else [])
        return emb, head, params

    def loss(emb, head, step, r):
        ids = torch.tensor([(r + step) % 12, 5, (3 * r) % 12])
        out = emb(ids)
        return (head(out) if head else out * (r + 1)).sum()

    emb, head, params = model()
    names = [(f"p{i}", p) for i, p in enumerate(params)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.5), named_parameters=names)
    ref_emb, ref_head, ref_params = model()
    ref_opt = torch.optim.SGD(ref_params, lr=0.5)
    for step in range(3):
        opt.zero_grad(set_to_none=True)  # as torch's default: the next gradient is sparse
        loss(emb, head, step, rank).backward()
        assert emb.weight.grad.is_sparse
        opt.synchronize()
        assert emb.weight.grad.is_sparse  # handed back sparse, as Horovod's allgathered one
        # the reference: every rank's gradient rebuilt here, averaged in float64
        ref_opt.zero_grad(set_to_none=True)
        want = [torch.zeros_like(p, dtype=torch.float64) for p in ref_params]
        for r in range(size):
            ref_opt.zero_grad(set_to_none=True)
            loss(ref_emb, ref_head, step, r).backward()
            for w, p in zip(want, ref_params, strict=True):
                w += p.grad.to_dense().to(torch.float64)
        for p, w, got in zip(ref_params, want, params, strict=True):
            p.grad = (w / size).to(p.dtype)
            torch.testing.assert_close(got.grad.to_dense(), p.grad, rtol=1e-6, atol=1e-6)
        with opt.skip_synchronize():
            opt.step()
        ref_opt.step()
        for got, p in zip(params, ref_params, strict=True):
            torch.testing.assert_close(got.detach(), p.detach(), rtol=1e-6, atol=1e-6)


def test_horovod_fusion_threshold_variable(hvd, monkeypatch):
    model, _ = model_and_data(hvd.rank())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    default = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    assert default.communication_stats()["buckets"] == 1  # a tiny model: one bucket
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "64")
    model, _ = model_and_data(hvd.rank())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    small = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    assert small.communication_stats()["buckets"] > 1


def test_other_horovod_variables_warn_once(comm, monkeypatch):
    monkeypatch.setenv("HOROVOD_CYCLE_TIME_FOR_THIS_TEST", "5")
    with pytest.warns(RuntimeWarning, match="HOROVOD_CYCLE_TIME_FOR_THIS_TEST"):
        ct.init(comm)
    ct.shutdown()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.init(comm)  # once per process
    ct.shutdown()


def test_trainable_parameters_keep_zero_gradients(hvd):
    """As Horovod: wrapping gives trainable parameters zero gradients, zero_grad keeps them.

    A GAN-style loop freezes one half per step; the frozen half's gradients
    stay (zero) tensors that the program can read.
    """
    gen, disc = torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)
    opt_g = hvd.DistributedOptimizer(torch.optim.SGD(gen.parameters(), lr=0.1),
                                     named_parameters=gen.named_parameters())
    opt_d = hvd.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.1),
                                     named_parameters=disc.named_parameters())
    assert all(p.grad is not None and not p.grad.any() for p in gen.parameters())
    x = torch.ones(2, 3)
    for train_gen in (True, False, True, False):
        for p in gen.parameters():
            p.requires_grad_(train_gen)
        for p in disc.parameters():
            p.requires_grad_(not train_gen)
        opt_g.zero_grad()
        opt_d.zero_grad()
        disc(gen(x)).sum().backward()
        assert all(bool(p.grad.any()) == train_gen for p in gen.parameters())
        assert all(bool(p.grad.any()) != train_gen for p in disc.parameters())
        (opt_g if train_gen else opt_d).step()
    opt_g.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in gen.parameters())


def test_step_after_synchronize_warns_in_horovods_words(hvd):
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match=r"optimizer\.step\(\) called without "
                                         r"optimizer\.skip_synchronize\(\)"):
        opt.step()


@pytest.mark.parametrize("factor", [1.0, "size"])
def test_gradient_predivide_factor_divides_before_the_sum(hvd, factor):
    """Horovod's predivide: gradients near float32's limit add up without overflowing."""
    size = hvd.size()
    factor = float(size) if factor == "size" else factor
    w = torch.nn.Parameter(torch.full((3,), 0.5))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=0.0),
                                   named_parameters=[("w", w)],
                                   gradient_predivide_factor=factor)
    big = torch.full((3,), 2e38)  # every rank's gradient: the sum of two overflows
    opt.zero_grad()
    (w * big).sum().backward()
    opt.synchronize()
    if size == 1 or factor == size:
        torch.testing.assert_close(w.grad, big)
    else:
        assert torch.isinf(w.grad).all()  # the plain sum overflows
    with opt.skip_synchronize():
        opt.step()
