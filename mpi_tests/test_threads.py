"""The thread budget (ccl.threads): the rule, its overrides, and what a job on this machine uses.

Correctness only: which thread counts the kernels run with, never how fast.
"""

import threading

import numba
import numpy as np
import pytest

import ccl
from ccl import threads
from ccl.codecs._shared_kernels import sized_kernel, PARALLEL_MIN_SIZE
from mpi_tests.helpers.stepquant import StepQuantCodec


@pytest.mark.parametrize("cores, ranks, expected", [
    (2, 4, 1), (2, 2, 1), (2, 1, 2), (16, 4, 4), (64, 8, 8), (7, 2, 3), (1, 1, 1), (3, 5, 1)])
def test_budget_is_the_fair_share_of_cores(cores, ranks, expected):
    assert threads.budget(cores, ranks, environ={}) == expected


def test_explicit_settings_win():
    assert threads.budget(2, 4, {"CCL_NUM_THREADS": "3"}) == 3
    # CCL_NUM_THREADS is ccl's own setting: it wins over numba's variable too
    assert threads.budget(2, 4, {"CCL_NUM_THREADS": "3", "NUMBA_NUM_THREADS": "2"}) == 3
    assert threads.budget(64, 1, {"NUMBA_NUM_THREADS": "5"}) is None
    with pytest.raises(ValueError, match="CCL_NUM_THREADS"):
        threads.budget(2, 1, {"CCL_NUM_THREADS": "0"})
    with pytest.raises(ValueError, match="CCL_NUM_THREADS"):
        threads.budget(2, 1, {"CCL_NUM_THREADS": "two"})


def test_fair_share_for_the_cost_model():
    assert threads.fair_share(2, 4) == 0.5
    assert threads.fair_share(16, 4) == 1.0
    assert threads.fair_share(1, 3) == pytest.approx(1 / 3)


def test_budgeted_sets_this_thread_and_restores():
    before = numba.get_num_threads()
    with threads.budgeted(1):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before
    with threads.budgeted(10 ** 6):  # capped at numba's pool
        assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    with threads.budgeted(None):
        assert numba.get_num_threads() == before


def test_budgeted_leaves_torch_threads_alone():
    """numba's OpenMP layer shares the thread's OpenMP count with torch: it must survive."""
    torch = pytest.importorskip("torch")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs numba's pool to have two threads")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        with threads.budgeted(1):
            pass
        assert torch.get_num_threads() == 1
        ccl.warmup(["3lc"])  # numba's first parallel kernel in a thread sets its count
        assert torch.get_num_threads() == 1
        result = []
        worker = threading.Thread(target=lambda: result.append(
            (torch.set_num_threads(1), ccl.warmup(["3lc"]), torch.get_num_threads())))
        worker.start()
        worker.join()
        assert result[0][2] == 1
    finally:
        torch.set_num_threads(before)


def test_a_budget_of_one_runs_the_serial_kernel():
    @sized_kernel(0)
    def double(x):
        return x * 2

    ran = []
    double.parallel = lambda x: ran.append("parallel")
    double.serial = lambda x: ran.append("serial")
    big = np.zeros(PARALLEL_MIN_SIZE)
    with threads.budgeted(1):
        double(big)
    double(big[:10])
    assert ran[:2] == ["serial", "serial"]
    if numba.config.NUMBA_NUM_THREADS > 1:
        with threads.budgeted(2):
            double(big)
        assert ran[2] == "parallel"


def test_machine_id_is_stable():
    assert threads.machine_id() == threads.machine_id()
    assert 0 <= threads.machine_id() < 2 ** 63


@pytest.mark.mpi
def test_a_job_on_this_machine_gets_its_share(comm, monkeypatch):
    """Every rank of the job runs here, so each gets cores // ranks (or the explicit setting)."""
    seen = []
    encode = StepQuantCodec._encode

    def recording(self, x, ctx):  # the numba thread count the encoder runs with
        seen.append(numba.get_num_threads())
        return encode(self, x, ctx)

    monkeypatch.setattr(StepQuantCodec, "_encode", recording)
    assert threads.ranks_on_machine(comm) == comm.size
    c = ccl.Communicator(comm, codec="test-stepquant", algorithm="ring",
                         min_compress_bytes=0)
    assert c.stats()["threads"] is None  # nothing decided before the first call
    x = np.ones(1000, np.float32)
    c.allreduce(x)
    expected = threads.budget(threads.available_cores(), comm.size)
    assert c.stats()["threads"] == expected
    if comm.rank == 0:
        print(f"\n{comm.size} ranks on {threads.available_cores()} cores: "
              f"{expected} numba thread(s) per rank")

    # the caller's own count survives the call, and a second thread's call runs with
    # the same budget as the main thread's (numba's count is per thread)
    seen.clear()
    before = numba.get_num_threads()
    c.allreduce(x, key="main")
    assert numba.get_num_threads() == before
    worker = threading.Thread(target=c.allreduce, args=(x,), kwargs={"key": "worker"},
                              name="ccl-test-worker")  # the same name on every rank
    worker.start()
    worker.join()
    assert seen and len(set(seen)) == 1, seen
    if expected is not None:
        assert seen[0] == min(expected, numba.config.NUMBA_NUM_THREADS)


@pytest.mark.mpi
def test_auto_weighs_the_agreed_share(comm):
    """The share of cores ``auto`` uses is the same on every rank."""
    c = ccl.Communicator(comm, codec="fp16", min_compress_bytes=0)
    c.allreduce(np.ones(10, np.float32))
    share = c._channel.measured.thread_budget()[1]
    shares = comm.allgather(share)
    assert len(set(shares)) == 1
    assert share == threads.fair_share(threads.available_cores(), comm.size)
