"""examples/horovod_mnist.py, a script in Horovod's API only, trains on ccl.torch.

Serial tests: each launches its own job (2 or 3 ranks) and reads the test
accuracy rank 0 prints after every epoch. A job runs once per session: the
exact and fp16 runs both train and compare.
"""

import functools
import os
import re

import pytest

from mpi_tests.helpers.launch import ROOT, launch

pytest.importorskip("torch")
pytest.importorskip("sklearn")

JOB_TIMEOUT = 400
EPOCHS = 5


@functools.cache
def accuracies(ranks, *args):
    script = os.path.join(ROOT, "examples", "horovod_mnist.py")
    result = launch(["-m", "mpi4py", script, "--epochs", str(EPOCHS), *args], ranks,
                    JOB_TIMEOUT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"failed ({result.returncode}):\n{output[-3000:]}"
    found = [float(a) for a in re.findall(r"^epoch \d+ test loss \S+ accuracy (\S+)%$",
                                          result.stdout, re.MULTILINE)]
    assert len(found) == EPOCHS, result.stdout
    return tuple(found)


@pytest.mark.serial
@pytest.mark.parametrize("ranks, args", [(2, []), (2, ["--fp16-allreduce"]),
                                         (3, ["--codec", "3lc"])])
def test_horovod_script_trains(ranks, args):
    found = accuracies(ranks, *args)
    assert max(found) > 85.0  # 10 classes: chance is 10%
    assert found[-1] > found[0]


@pytest.mark.serial
def test_fp16_allreduce_reaches_the_accuracy_of_exact_averaging():
    exact = accuracies(2)
    fp16 = accuracies(2, "--fp16-allreduce")
    assert abs(fp16[-1] - exact[-1]) <= 3.0, (exact, fp16)  # 3 points of 397 test images


@pytest.mark.serial
@pytest.mark.parametrize("args", [[], ["--fp16-allreduce"]])
def test_horovod_synthetic_benchmark_runs_unchanged(args):
    script = os.path.join(ROOT, "examples", "horovod_synthetic.py")
    result = launch(["-m", "mpi4py", script, "--num-iters", "2", "--num-batches-per-iter", "2",
                     *args], 2, JOB_TIMEOUT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert re.search(r"^Total img/sec on 2 CPU\(s\): \S+ \+-\S+$", result.stdout, re.MULTILINE)
    # every rank stepped on the same averaged gradients
    assert "Largest weight difference between ranks: 0\n" in result.stdout
