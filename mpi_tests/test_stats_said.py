"""Say what ran: bytes sent compressed and plain, next to the algorithm and its reason.

A newcomer's ``DistributedOptimizer(codec="3lc")`` on one machine reported
``compressed_buckets: 2`` while ``auto`` sent every bucket uncompressed (one
node: exact ``MPI_Allreduce``). ``communication_stats()`` and
``Communicator.stats()`` now split the bytes into compressed and plain.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402

pytestmark = pytest.mark.mpi


def test_communicator_splits_compressed_and_plain_bytes(comm):
    x = np.linspace(-1, 1, 50_000, dtype=np.float32) + comm.rank
    c = ccl.Communicator(comm, "3lc", min_compress_bytes=0)
    c.allreduce(x, key="lossy", algorithm="direct")
    lossy = c.stats()
    c.allreduce(x, key="exact", algorithm="mpi")
    c.allreduce(x, key="none", algorithm="ring", codec="none")
    both = c.stats()
    assert both["bytes_compressed"] + both["bytes_plain"] == both["bytes_sent"]
    assert both["bytes_compressed"] == lossy["bytes_compressed"]
    if comm.size == 1:
        assert both["bytes_sent"] == 0
        return
    assert lossy["bytes_plain"] == 0 and lossy["bytes_compressed"] > 0
    # MPI's own allreduce counted as a ring moves it, then the identity codec's payloads
    assert both["bytes_plain"] >= 2 * (comm.size - 1) * x.nbytes // comm.size + x.nbytes // 2


def _stats_after_steps(comm, algorithm):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    ct.init(comm)
    try:
        opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                      named_parameters=model.named_parameters(), codec="3lc",
                                      algorithm=algorithm, min_compress_bytes=0)
        gen = torch.Generator().manual_seed(comm.rank)
        for _ in range(2):
            opt.zero_grad()
            x = torch.randn(8, 64, generator=gen)
            model(x).pow(2).mean().backward()
            opt.step()
        return opt.communication_stats()
    finally:
        ct.shutdown()


def test_optimizer_says_auto_sent_buckets_plain_on_one_node(comm):
    stats = _stats_after_steps(comm, "auto")
    assert stats["compressed_buckets"] >= 1  # given the codec ...
    assert stats["bytes_compressed"] + stats["bytes_plain"] == stats["bytes_sent"]
    assert stats["bytes_compressed"] == 0  # ... yet on one node auto sends them exact
    ran = stats["decisions"]
    assert set(ran) <= {"mpi"}, ran
    if comm.size > 1:
        assert stats["bytes_plain"] > 0
        assert "shared memory" in ran["mpi"], ran  # the large buckets (small ones: "small")


def test_optimizer_says_what_it_compressed(comm):
    stats = _stats_after_steps(comm, "direct")
    assert stats["decisions"] == {"direct": {"given": stats["reductions"]}}
    if comm.size > 1:
        assert stats["bytes_compressed"] > 0 and stats["bytes_plain"] == 0
