"""ccl.torch's lifecycle.

Communicators are freed when their owner goes; a program exits cleanly without shutdown().

* Every DistributedOptimizer (and DDP hook) duplicates ``ccl.torch``'s
  communicator; an MPI library has a few thousand communicators at most, so
  a job that makes optimizers again and again must get them back when the
  optimizers are garbage-collected, not only at ``shutdown()``.
* A script that ends without ``ccl.torch.shutdown()`` must exit 0, also with
  a reduction still queued for the communication thread. The serial test
  launches such a script several times (``CCL_TEST_EXIT_RUNS``, default 3)
  on 3 ranks.
"""


import pytest

torch = pytest.importorskip("torch")

from ccl.torch.process_sets import OpsEngine  # noqa: E402
from ccl import config  # noqa: E402
from ccl.torch.runtime import current  # noqa: E402
from ccl.testing import assert_same_on_all_ranks  # noqa: E402
from mpi_tests.helpers.launch import launch  # noqa: E402

torch.set_num_threads(1)

# More than MPICH's communicators (2048 context ids, two per optimizer) allow at once.
OPTIMIZERS = 1100
EXIT_RUNS = config.read("CCL_TEST_EXIT_RUNS") or 3
EXIT_TIMEOUT = 180

# Trains two steps, then leaves one backward pass's reductions queued, and ends.
NO_SHUTDOWN = """
import torch
import ccl.torch as ct

torch.set_num_threads(1)
ct.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                              named_parameters=model.named_parameters(), codec="thc",
                              algorithm="ring", fusion_threshold_bytes=200,
                              min_compress_bytes=0)
for step in range(3):
    g = torch.Generator().manual_seed(100 * step + ct.rank())
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    if step < 2:
        opt.step()
print("done", ct.rank(), flush=True)
"""


@pytest.mark.mpi
@pytest.mark.max_ranks(3)
def test_dropped_optimizers_free_their_communicators(comm, hvd):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    for _ in range(OPTIMIZERS):
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       codec="fp16")
    state, _ = hvd.ddp_comm_hook("fp16")
    for _ in range(20):
        state, _ = hvd.ddp_comm_hook("fp16")
    # the last of each is alive; the ones before were freed when the next one was made
    # (init's engine of the tensor collectives, hvd.allreduce & co., is not counted)
    assert len([e for e in current().engines.values() if not isinstance(e, OpsEngine)]) <= 3
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(comm.rank))
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()  # the survivor still reduces
    assert_same_on_all_ranks(comm, model.weight.detach().numpy())


@pytest.mark.serial
def test_exit_without_shutdown_is_clean(tmp_path):
    script = tmp_path / "no_shutdown.py"
    script.write_text(NO_SHUTDOWN)
    for run in range(EXIT_RUNS):
        result = launch([str(script)], 3, EXIT_TIMEOUT)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and output.count("done") == 3, \
            f"run {run} exited with {result.returncode}:\n{output[-3000:]}"
