"""The documentation's example scripts run under ``mpiexec -n 4`` and do what the pages say.

The pages (quick start, PyTorch tutorial, error feedback) ``literalinclude``
these scripts, so what a reader copies is what ran here. Each script checks
its own result with ``assert`` (an assertion on one rank aborts the job via
``python -m mpi4py``); the test checks the exit status and the line rank 0
prints. Serial tests: each launches its own 4-rank job once.
"""

import os
import re
import subprocess
import sys

import pytest

from mpi_tests.helpers.launch import ROOT, launch

RANKS = 4
JOB_TIMEOUT = 240


def run_example(name, timeout=JOB_TIMEOUT):
    """Run ``examples/<name>`` on 4 ranks; return its output, failing on a non-zero exit."""
    result = launch(["-m", "mpi4py", os.path.join(ROOT, "examples", name)], RANKS, timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{name} failed ({result.returncode}):\n{output[-3000:]}"
    return result.stdout


@pytest.mark.serial
def test_quickstart_allreduce_on_four_ranks():
    out = run_example("quickstart.py")
    match = re.search(r"fp16 ring allreduce on (\d+) ranks: max error vs MPI_Allreduce (\S+)",
                      out)
    assert match, out
    assert int(match.group(1)) == RANKS
    assert 0 < float(match.group(2)) < 1e-2  # lossy but close: fp16 rounding only


@pytest.mark.serial
def test_error_feedback_and_checkpoint():
    out = run_example("error_feedback.py")
    match = re.search(r"onebit, (\d+) ranks, 30 steps: delivered \+ held residuals = inputs "
                      r"\(running error without the residuals (\S+)\); restored state "
                      r"continues identically", out)
    assert match, out
    assert int(match.group(1)) == RANKS
    # the residuals held are what makes the books balance: without them the sum is off
    assert float(match.group(2)) > 0.01


@pytest.mark.serial
def test_torch_two_lines():
    pytest.importorskip("torch")
    out = run_example("torch_two_lines.py")
    losses = [float(x) for x in re.findall(r"^epoch \d+ loss (\S+)$", out, re.MULTILINE)]
    assert len(losses) == 10, out
    assert losses[-1] < 0.3  # a linearly separable toy problem: training converges


@pytest.mark.serial
def test_compressed_adam_example():
    pytest.importorskip("torch")
    out = run_example("compressed_adam.py")
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", out, re.MULTILINE)]
    assert len(losses) == 5, out
    assert losses[-1] < losses[0] / 4  # it trains through the warm-up and after it
    match = re.search(r"(\d+) ranks, 100 steps \(4 compressed parameters\): replicas "
                      r"identical, (\d+) bytes sent by rank 0", out)
    assert match, out
    assert int(match.group(1)) == RANKS and int(match.group(2)) > 0


@pytest.mark.serial
def test_ddp_hook_example():
    """The PyTorch guide's DDP section: the hook, a DistributedSampler, MASTER_* found."""
    pytest.importorskip("torch")
    out = run_example("ddp_hook.py")
    losses = [float(x) for x in re.findall(r"^epoch \d+ loss (\S+)$", out, re.MULTILINE)]
    assert len(losses) == 5, out
    assert losses[-1] < losses[0]
    assert f"DDP with the thc hook on {RANKS} ranks: replicas identical" in out


@pytest.mark.serial
def test_fsdp_example():
    """The PyTorch guide's FSDP section: thc gradients, bf16 weights, replicas identical."""
    pytest.importorskip("torch")
    out = run_example("fsdp.py", timeout=2 * JOB_TIMEOUT)  # four ranks of FSDP: the slowest
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", out, re.MULTILINE)]
    assert len(losses) == 3, out
    assert losses[-1] < losses[0] / 2  # a linearly separable toy problem: training converges
    match = re.search(r"FSDP with thc gradients and bf16 weights on (\d+) ranks: replicas "
                      r"identical, (\d+) gradient and (\d+) weight bytes sent by rank 0", out)
    assert match, out
    assert int(match.group(1)) == RANKS
    # thc's 4 bits a value against bf16's 16: gradients, reduce-scattered once a step,
    # cost less than weights, gathered twice a step (resharded after forward)
    assert 0 < int(match.group(2)) < int(match.group(3))


@pytest.mark.serial
def test_gpu_allreduce_example():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no GPU")
    except Exception as exc:  # cupy without a driver raises its own errors
        pytest.skip(f"no GPU for cupy: {exc}")
    out = run_example("gpu_allreduce.py")
    assert f"onebit allreduce of CuPy arrays on {RANKS} ranks: {1 << 24} values" in out


@pytest.mark.serial
def test_emulated_cluster_example():
    """benchmarks-howto's cluster-from-Python example: the quick start on 4 emulated hosts."""
    from ccl.bench.cluster import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no emulated cluster here: {reason}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples",
                                                          "emulated_cluster.py")],
                            capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=JOB_TIMEOUT + 60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fp16 ring allreduce on 4 ranks" in result.stdout
    sent = int(re.search(r"^0 (\d+) bytes sent by host 0$", result.stdout, re.M).group(1))
    assert sent > 0


@pytest.mark.serial
def test_diloco_example():
    pytest.importorskip("torch")
    out = run_example("diloco.py")
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", out, re.MULTILINE)]
    assert len(losses) == 5, out
    assert losses[-1] < losses[0] / 4  # the outer steps on compressed averages train it
    match = re.search(r"(\d+) ranks, 100 inner steps, (\d+) fragment syncs: global weights "
                      r"identical, (\d+) bytes sent by rank 0", out)
    assert match, out
    assert int(match.group(1)) == RANKS and int(match.group(2)) == 20
    assert int(match.group(3)) > 0
