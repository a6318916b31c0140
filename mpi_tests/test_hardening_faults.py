"""Faults that end a job: a rank that dies or hangs mid-collective, and messages over 2 GiB.

Each test launches its own small MPI job (``mpiexec -n 3`` or ``-n 2``) on a
script in ``mpi_tests/harness/`` and asserts on its output and exit status;
generous outer timeouts only keep a broken build from hanging the suite.
"""

import os
import re
import subprocess
import sys
import time

import pytest

from mpi_tests.helpers.launch import HARNESS, is_mpich_hydra, job_env, mpiexec

KEY = "layer7.weight"


needs_hydra = pytest.mark.skipif(not is_mpich_hydra(),
                                 reason="needs MPICH's mpiexec (hydra) on PATH")


def _launch(ranks, script, args, launcher_args=(), timeout=180, env=None):
    command = [mpiexec(), *launcher_args, "-n", str(ranks), sys.executable, "-m", "mpi4py",
               os.path.join(HARNESS, script), *map(str, args)]
    environment = job_env(timeout - 30, **(env or {}))
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=environment)
    return result, result.stdout + result.stderr, time.monotonic() - start


# (how the last rank dies, when, collective, launcher arguments)
# Hydra ends the whole job by itself when a rank is killed or exits without MPI_Finalize;
# -disable-auto-cleanup stands for launchers that do not (srun's default), and SIGSTOP for a
# hung node no launcher can see. Those are the cases only ccl's timeout can end.
DEAD_RANK_CASES = [
    ("stop", "midway", "allreduce", ()),
    ("exit", "start", "reduce_scatter", ("-disable-auto-cleanup",)),
    ("exit", "midway", "allgather", ("-disable-auto-cleanup",)),
    ("exit", "midway", "allreduce", ("-disable-auto-cleanup",)),
    ("kill", "midway", "allreduce", ()),
]


@needs_hydra
@pytest.mark.parametrize("how,when,collective,launcher", DEAD_RANK_CASES,
                         ids=lambda v: "-".join(v) if isinstance(v, tuple) else str(v))
def test_dead_rank_ends_the_job_with_a_report(how, when, collective, launcher):
    timeout = 4
    result, output, elapsed = _launch(3, "dead_rank.py", [how, when, timeout, collective],
                                      launcher)
    print(f"{how}/{when}/{collective}: rc {result.returncode} after {elapsed:.1f} s\n{output}")
    assert result.returncode != 0, output
    assert "UNEXPECTED" not in output, output
    assert f"rank 2: dying ({how}, {when}) in {collective}" in output, output
    reports = re.findall(r"ccl: rank (\d) of 3 (.*)", output)
    if how == "kill":
        # Hydra kills the survivors itself as soon as a rank dies of a signal, often before
        # they notice; a survivor that noticed first reports like the others
        assert reports or "BAD TERMINATION" in output, output
    else:
        assert reports, f"no survivor reported the dead rank:\n{output}"
    for rank, text in reports:
        assert rank in ("0", "1"), output
        assert f"in {collective}(key='{KEY}'" in text, output
        assert "Aborting the job" in text and ("may have died" in text or "rank died" in text)
        assert "timed out after 4 s waiting for" in text or "MPI error" in text, text
    # a hung survivor would have run into the launcher's MPIEXEC_TIMEOUT (150 s) instead
    assert "APPLICATION TIMED OUT" not in output, output


LARGE = os.environ.get("CCL_TEST_LARGE") == "1"


@needs_hydra
@pytest.mark.skipif(not LARGE, reason="opt-in: CCL_TEST_LARGE=1; needs about 14 GB of free RAM "
                    "(docs/reliability.md)")
@pytest.mark.parametrize("args", [("transport",), ("allreduce", "none", "auto"),
                                  ("allreduce", "fp16", "ring")], ids="-".join)
def test_messages_larger_than_2_gib(args):
    """2 ranks: payloads of 2^31 + 40 bytes, allreduce of 2^29 + 7 float32 (2 GiB + 28 B)."""
    result, output, elapsed = _launch(2, "large_allreduce.py", args, timeout=1800)
    print(f"{args}: rc {result.returncode} after {elapsed:.0f} s\n{output}")
    assert result.returncode == 0, output
    assert output.count("exact") == 2, output
