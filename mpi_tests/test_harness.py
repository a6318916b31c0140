"""The test harness itself: a failure on one rank ends the MPI job (MPI_Abort), no timeout."""

import os
import re
import subprocess
import sys

import pytest

from mpi_tests.helpers.launch import HARNESS, job_env, mpiexec

# the job's own limit (MPIEXEC_TIMEOUT): far above what an aborted job takes
JOB_TIMEOUT = 120


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")
def test_failure_on_one_rank_aborts_the_job():
    target = os.path.join(HARNESS, "fails_on_one_rank.py")
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "pytest",
               "--with-mpi", "-x", "-q", "-p", "no:cacheprovider", "--timeout=60",
               "--timeout-method=thread", "--rootdir", os.path.dirname(target), target]
    result = subprocess.run(command, capture_output=True, text=True, timeout=JOB_TIMEOUT + 30,
                            env=job_env(JOB_TIMEOUT))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "deliberate failure on rank 0" in output
    # ended by `python -m mpi4py`'s MPI_Abort from the failing rank: not by pytest-timeout
    # on the waiting rank ("+++ Timeout +++") nor by the job limit (hydra: "TIMED OUT")
    assert re.search("MPI_Abort|MPI_ABORT", output), output[-2000:]
    assert "Timeout" not in output and "TIMED OUT" not in output, output[-2000:]
