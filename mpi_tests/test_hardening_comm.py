"""Hardening, third round (issue #27), communication side, inside one MPI job.

* a bad ``CCL_*`` value on one rank raises on every rank, at a channel's
  creation and on a channel in use (#3, #17);
* ``CCL_LINK_GBPS=probe`` on some ranks equals unset; ``link_gbps="probe"``
  on one rank neither hangs nor disagrees (#13, #7);
* ``Communicator.stats()`` reports the threads and link speed used (#14);
* the stall inspector names the rank that has not joined (#18).
"""

import math
import time
import warnings

import numba
import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl import launch, transport
from ccl.testing import assert_same_on_all_ranks, rank_input

# (variable, a bad value): every CCL_* variable ccl reads
BAD_VALUES = [("CCL_NUM_THREADS", "abc"), ("CCL_SKIP_LAUNCH_CHECK", "maybe"),
              ("CCL_LOCAL_SIZE", "\u00b2"), ("CCL_STALL_CHECK_SECONDS", "-1"),
              ("CCL_CUDA_AWARE", "2"), ("CCL_TIMEOUT", "soon"), ("CCL_SEGMENT_BYTES", "1MB"),
              ("CCL_LINK_GBPS", "fast")]


def _expect_everywhere(comm, bad_rank, name, run):
    """``run()`` raises ValueError naming ``name`` on ``bad_rank``, MismatchError elsewhere."""
    if comm.rank == bad_rank:
        with pytest.raises(ValueError, match=name):
            run()
    else:
        with pytest.raises(ccl.MismatchError, match=f"rank.*{bad_rank}"):
            run()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name, value", BAD_VALUES, ids=lambda v: str(v))
def test_a_bad_variable_on_one_rank_raises_everywhere_at_the_first_call(comm, monkeypatch,
                                                                        name, value):
    bad = comm.size - 1
    # the launch check runs before the first channel of a process: it reads its variable
    monkeypatch.setattr(launch, "_PASSED", False)
    if comm.rank == bad:
        monkeypatch.setenv(name, value)
    x = rank_input(comm.rank, 1000)
    _expect_everywhere(comm, bad, name, lambda: ccl.compressed_allreduce(
        x, "3lc", comm=comm, algorithm="ring", key="k", timeout=60))
    monkeypatch.delenv(name, raising=False)
    y = ccl.compressed_allreduce(x, "3lc", comm=comm, algorithm="ring", key="k", timeout=60)
    assert_same_on_all_ranks(comm, y)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name, value", BAD_VALUES, ids=lambda v: str(v))
def test_a_bad_variable_on_one_rank_raises_everywhere_on_a_channel_in_use(comm, monkeypatch,
                                                                         name, value):
    bad = 0
    c = ccl.Communicator(comm, codec="3lc", algorithm="auto", min_compress_bytes=0,
                         timeout=60)
    x = rank_input(comm.rank, 1 << 15)
    c.allreduce(x, key="k")
    if comm.rank == bad:
        monkeypatch.setenv(name, value)
    # hierarchical reads the nodes, auto the threads and the link: every variable is used
    _expect_everywhere(comm, bad, name, lambda: c.allreduce(x, key="k"))
    _expect_everywhere(comm, bad, name, lambda: c.allreduce(x, algorithm="hierarchical"))
    monkeypatch.delenv(name, raising=False)
    assert_same_on_all_ranks(comm, c.allreduce(x, key="k"))


@pytest.mark.mpi(min_size=2)
def test_link_gbps_probe_on_some_ranks_equals_unset(comm, monkeypatch):
    if comm.rank == 0:
        monkeypatch.setenv("CCL_LINK_GBPS", "probe")
    else:
        monkeypatch.delenv("CCL_LINK_GBPS", raising=False)
    x = rank_input(comm.rank, 1 << 17)  # large enough for auto to weigh the link
    c = ccl.Communicator(comm, codec="3lc", timeout=120)
    assert_same_on_all_ranks(comm, c.allreduce(x, key="g"))
    link = c.stats()["link_gbps"]
    assert link is not None and link > 0
    assert_same_on_all_ranks(comm, np.array([link]))


@pytest.mark.mpi(min_size=2)
def test_communicator_link_gbps_probe_on_one_rank_only(comm, monkeypatch):
    monkeypatch.delenv("CCL_LINK_GBPS", raising=False)
    c = ccl.Communicator(comm, codec="3lc", link_gbps="probe" if comm.rank == 0 else None,
                         timeout=120)
    x = rank_input(comm.rank, 1 << 17)
    assert_same_on_all_ranks(comm, c.allreduce(x, key="g"))
    assert_same_on_all_ranks(comm, np.array([c.stats()["link_gbps"]]))


@pytest.mark.mpi
def test_stats_report_the_threads_the_kernels_run_on(comm, monkeypatch):
    pool = numba.config.NUMBA_NUM_THREADS
    monkeypatch.setenv("CCL_NUM_THREADS", str(pool + 62))
    c = ccl.Communicator(comm, codec="3lc", algorithm="ring", min_compress_bytes=0)
    c.allreduce(rank_input(comm.rank, 1000))
    assert c.stats()["threads"] == pool


@pytest.mark.mpi(min_size=2)
def test_stats_report_the_link_speed_of_the_environment(comm, monkeypatch):
    monkeypatch.setenv("CCL_LINK_GBPS", "0.5")
    c = ccl.Communicator(comm, codec="3lc")
    c.allreduce(rank_input(comm.rank, 1 << 17), key="g")
    assert c.stats()["link_gbps"] == 0.5
    c = ccl.Communicator(comm, codec="3lc", link_gbps=2.0)
    assert c.stats()["link_gbps"] == 2.0


@pytest.mark.mpi(min_size=2)
def test_the_stall_inspector_names_the_rank_that_has_not_joined(comm, monkeypatch):
    monkeypatch.setenv("CCL_STALL_CHECK_SECONDS", "1")
    late = comm.size - 1
    x = rank_input(comm.rank, 1000)
    ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring")  # the channel exists
    comm.Barrier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if comm.rank == late:
            time.sleep(3.5)
        y = ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring", key="stalled")
    assert_same_on_all_ranks(comm, y)
    stalls = [str(w.message) for w in caught if "ccl: stall" in str(w.message)]
    if comm.rank == late:
        assert stalls == []
        return
    assert stalls, "no stall warning after 3.5 s of waiting with a period of 1 s"
    # by the last warning every rank that joined has said so: only the late one is named
    assert f"no word from rank {late}:" in stalls[-1], stalls
    assert "allreduce(key='stalled'" in stalls[-1], stalls


def test_the_stall_period_follows_its_variable(monkeypatch):
    from ccl.transport import waits

    monkeypatch.delenv("CCL_STALL_CHECK_SECONDS", raising=False)
    assert waits.stall_period() == 60
    monkeypatch.setenv("CCL_STALL_CHECK_SECONDS", "0")
    assert waits.stall_period() == math.inf  # off
    monkeypatch.setenv("CCL_STALL_CHECK_SECONDS", "2.5")
    assert waits.stall_period() == 2.5


@pytest.mark.mpi
def test_sub_communicators_name_world_ranks(comm):
    """Reports on a node's communicator name world ranks (the numbering a user sees)."""
    odd = comm.Split(comm.rank % 2, key=comm.rank)
    try:
        channel = transport.Channel(odd, duplicate=False, scope="its node")
        first = MPI.COMM_WORLD.rank % 2
        assert channel.who(0) == (
            "rank 0" if odd.size == MPI.COMM_WORLD.size
            else f"world rank {first} (rank 0 of {odd.size} of its node)")
    finally:
        odd.Free()


@pytest.mark.mpi(min_size=4)
def test_thc_training_runs_on_where_auto_picks_hierarchical(comm, monkeypatch):
    """``DistributedOptimizer(codec="thc")`` stopped at step 2 on nodes of several ranks."""
    torch = pytest.importorskip("torch")
    import ccl.torch as ct

    if comm.size % 2:
        pytest.skip("needs nodes of two ranks")
    monkeypatch.setenv("CCL_LOCAL_SIZE", "2")
    monkeypatch.setenv("CCL_LINK_GBPS", "0.01")  # a slow link: auto compresses across nodes
    ct.init(comm)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(256, 128)  # 128 KB of weights: compressed
        opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                      named_parameters=model.named_parameters(), codec="thc")
        data = torch.randn(8, 256, generator=torch.Generator().manual_seed(comm.rank))
        for _ in range(3):
            opt.zero_grad()
            model(data).square().mean().backward()
            opt.step()
        assert_same_on_all_ranks(comm, model.weight.detach().numpy())
    finally:
        ct.shutdown()
