"""examples/horovod_mnist.py, a script in Horovod's API only, trains on ccl.torch.

Serial tests: each launches its own job (2 or 4 ranks) and reads the test
accuracy rank 0 prints after every epoch.
"""

import os
import re

import pytest
from mpi4py import MPI

from conftest import ROOT, launch

pytest.importorskip("torch")
pytest.importorskip("sklearn")

JOB_TIMEOUT = 400
EPOCHS = 5

serial = pytest.mark.skipif(MPI.COMM_WORLD.size > 1,
                            reason="serial test: launches its own job")


def accuracies(ranks, *args):
    script = os.path.join(ROOT, "examples", "horovod_mnist.py")
    result = launch(["-m", "mpi4py", script, "--epochs", str(EPOCHS), *args], ranks,
                    JOB_TIMEOUT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"failed ({result.returncode}):\n{output[-3000:]}"
    found = [float(a) for a in re.findall(r"^epoch \d+ test loss \S+ accuracy (\S+)%$",
                                          result.stdout, re.MULTILINE)]
    assert len(found) == EPOCHS, result.stdout
    return found


@serial
@pytest.mark.parametrize("ranks, args", [(2, []), (4, ["--fp16-allreduce"]),
                                         (3, ["--codec", "3lc"])])
def test_horovod_script_trains(ranks, args):
    found = accuracies(ranks, *args)
    assert max(found) > 85.0  # 10 classes: chance is 10%
    assert found[-1] > found[0]
