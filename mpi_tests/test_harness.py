"""The test harness itself: a failure on one rank ends the MPI job promptly."""

import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(__file__)


def _mpiexec():
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return candidate if os.path.exists(candidate) else shutil.which("mpiexec")


@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec on PATH")
def test_failure_on_one_rank_aborts_the_job_promptly():
    target = os.path.join(HERE, "harness", "fails_on_one_rank.py")
    command = [_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "pytest",
               "--with-mpi", "-x", "-q", "-p", "no:cacheprovider", "--timeout=60",
               "--timeout-method=thread", "--rootdir", os.path.dirname(target), target]
    env = dict(os.environ, HYDRA_LAUNCHER="fork", MPIEXEC_TIMEOUT="120")
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=150, env=env)
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "deliberate failure on rank 0" in output
    # MPI_Abort from `python -m mpi4py` ends rank 1's Barrier, long before any timeout
    assert elapsed < 50, f"the job took {elapsed:.0f} s to end:\n{output[-2000:]}"
