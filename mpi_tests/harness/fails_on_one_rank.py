"""Run by test_harness.py, never collected directly: a test that fails on rank 0 only.

Rank 1 then waits in a collective that rank 0 never joins. The harness must
end the whole job promptly with rank 0's failure shown, not hang.
"""

import pytest
from mpi4py import MPI


@pytest.mark.mpi(min_size=2)
def test_rank0_fails_while_others_wait():
    comm = MPI.COMM_WORLD
    assert comm.rank != 0, "deliberate failure on rank 0"
    comm.Barrier()
