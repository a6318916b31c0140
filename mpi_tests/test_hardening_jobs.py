"""Hardening, third round (issue #27): what only a job of its own can show.

Each test launches a small MPI job on a script in ``mpi_tests/harness/`` and
asserts on its output and exit status:

* every wait outside the data (the channel's creation, ``auto``'s link and
  latency probes, the node detection) honours the timeout: the waiting
  ranks report what they waited for and abort the job (#7);
* a hierarchical timeout report names world ranks (#16);
* ``ccl.torch.shutdown()`` after ``MPI.Finalize()`` does nothing (#9).

Generous outer timeouts only keep a broken build from hanging the suite.
Each stuck-rank job runs once per session: the hierarchical one answers two tests.
"""

import functools
import os
import re

import pytest

from mpi_tests.helpers.launch import launch

HERE = os.path.dirname(__file__)
TIMEOUT = 3


def _run(script, args, ranks, env=None, timeout=120):
    saved = {name: os.environ.get(name) for name in (env or {})}
    os.environ.update(env or {})
    try:
        return launch(["-m", "mpi4py", os.path.join(HERE, "harness", script),
                       *map(str, args)], ranks, timeout)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# where the last rank is stuck -> what the others say they waited for
STUCK = {
    "channel": "every rank to duplicate the communicator|the argument check of the creation",
    "link_probe": "the link probe",
    "latency_probe": "the latency probe",
    "nodes": r"the argument check of node_comm",
    "hierarchical": "MPI_Reduce_scatter|a message from world rank|the send to world rank",
}


@functools.cache
def stuck_job(where):
    """``(returncode, output)`` of the 4-rank job whose last rank is stuck at ``where``."""
    env = {"CCL_TIMEOUT": str(TIMEOUT), "CCL_LOCAL_SIZE": "2" if where == "hierarchical"
           else "", "CCL_LINK_GBPS": ""}
    result = _run("stuck_rank.py", [where, TIMEOUT], 4, env)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("where", sorted(STUCK))
def test_every_wait_honours_the_timeout(where):
    returncode, output = stuck_job(where)
    print(f"{where}: rc {returncode}\n{output}")
    assert returncode != 0, output
    assert "UNEXPECTED" not in output, output
    assert "rank 3: stuck in" in output, output
    reports = re.findall(r"ccl: (.*) timed out after 3 s waiting for (.*) in (.*); ", output)
    assert reports, f"no rank reported the wait:\n{output}"
    for _who, what, _ in reports:
        assert re.search(STUCK[where], what), output
    # a hung rank would have run into the launcher's MPIEXEC_TIMEOUT instead
    assert "APPLICATION TIMED OUT" not in output, output


def test_a_hierarchical_timeout_names_world_ranks():
    _, output = stuck_job("hierarchical")
    reports = re.findall(r"ccl: (.*) timed out after 3 s waiting for (.*) in (.*); ", output)
    assert reports, output
    for who, what, _ in reports:
        # the reporter and the silent rank by their world ranks, not "rank 0 of 2"
        assert re.match(r"world rank [0-2] \(rank [01] of 2 of (its node|the ranks across "
                        r"nodes)\)$", who), output
        assert "no word from world rank" in what, output


def test_shutdown_after_mpi_finalize_does_nothing():
    pytest.importorskip("torch")
    result = _run("finalize_then_shutdown.py", [], 2)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert output.count(": done") == 2, output
