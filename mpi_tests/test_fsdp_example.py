"""The PyTorch guide's FSDP example runs under ``mpiexec -n 4`` and does what the page says.

A serial test: it launches its own 4-rank job (see ``test_examples.py``).
"""

import os
import re

import pytest

from conftest import ROOT, launch
from test_examples import serial

# four ranks of FSDP on a loaded machine: more than the other examples' limit
JOB_TIMEOUT = 600


@serial
def test_fsdp_example():
    """FSDP2 with thc gradients and bf16 weights: it learns, replicas identical, bytes counted."""
    pytest.importorskip("torch")
    result = launch(["-m", "mpi4py", os.path.join(ROOT, "examples", "fsdp.py")], 4, JOB_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    out = result.stdout
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", out, re.MULTILINE)]
    assert len(losses) == 3, out
    assert losses[-1] < losses[0] / 2  # a linearly separable toy problem: training converges
    match = re.search(r"FSDP with thc gradients and bf16 weights on (\d+) ranks: replicas "
                      r"identical, (\d+) gradient and (\d+) weight bytes sent by rank 0", out)
    assert match, out
    assert int(match.group(1)) == 4
    # thc's 4 bits a value and bf16's 16: gradients, reduce-scattered once a step, cost
    # less than weights, gathered twice a step (resharded after forward)
    assert 0 < int(match.group(2)) < int(match.group(3))
