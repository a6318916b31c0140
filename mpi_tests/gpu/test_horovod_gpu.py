"""Horovod's API on CUDA tensors: results come back on the tensor's device, exact or close.

Runs on one rank with a real GPU (``CCL_TEST_GPU=1 python -m pytest mpi_tests/gpu``); skips
without one (fails with ``CCL_TEST_GPU=1``).
"""

import os

import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    if os.environ.get("CCL_TEST_GPU") == "1":
        raise RuntimeError("CCL_TEST_GPU=1 but torch sees no CUDA device")
    pytest.skip("no CUDA device", allow_module_level=True)

import ccl.torch as hvd  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def initialised():
    hvd.init()
    yield
    hvd.shutdown()


def test_collectives_keep_the_device():
    size = hvd.size()
    x = torch.arange(6, dtype=torch.float32, device="cuda").reshape(3, 2)
    for out, expected in [
        (hvd.allreduce(x, op=hvd.Sum), x * size),
        (hvd.allreduce(x.half(), compression=hvd.Compression.fp16), x.half()),
        (hvd.broadcast(x, 0), x),
        (hvd.allgather(x), torch.cat([x] * size)),
        (hvd.reducescatter(torch.cat([x] * size), op=hvd.Sum)[:3], x * size),
    ]:
        assert out.device == x.device
        torch.testing.assert_close(out.float(), expected.float())
    out, received = hvd.alltoall(x, splits=[3] + [0] * (size - 1))
    assert out.device == x.device and received.tolist()[0] == 3
    codec = hvd.allreduce(x.reshape(-1), compression=hvd.Compression.codec("fp16"), name="c")
    assert codec.device == x.device
    torch.testing.assert_close(codec, x.reshape(-1))
    y = x.clone().requires_grad_()
    hvd.allreduce(y, op=hvd.Sum).sum().backward()
    assert y.grad.device == x.device
    torch.testing.assert_close(y.grad, torch.full_like(x, float(size)))


@pytest.mark.parametrize("compression", ["none", "fp16", "3lc"])
def test_distributed_optimizer_on_cuda(compression):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 2)).cuda()
    chosen = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
              "3lc": hvd.Compression.codec("3lc")}[compression]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=chosen)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(32, 8, device="cuda")
    y = (x[:, 0] > 0).long()
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.device.type == "cuda" for p in model.parameters())
