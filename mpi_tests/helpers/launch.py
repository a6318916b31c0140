"""MPI jobs that a test starts itself: ``mpiexec -n N python ...`` from the repository root."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

#: The repository root (the parent of ``mpi_tests/``).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The programs tests launch as jobs of their own.
HARNESS = os.path.join(ROOT, "mpi_tests", "harness")

# the launcher variables of an enclosing job would describe that job, not the new one
LAUNCHER_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def mpiexec():
    """The ``mpiexec`` next to this Python, else on PATH (None if there is none)."""
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return candidate if os.path.exists(candidate) else shutil.which("mpiexec")


def is_mpich_hydra():
    """Whether :func:`mpiexec` is MPICH's (hydra), whose options the fault tests use."""
    if mpiexec() is None:
        return False
    try:
        text = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in text


def job_env(timeout, **extra):
    """The environment of a job of its own: ``ccl`` from this tree, hydra's fork launcher."""
    env = dict(os.environ, HYDRA_LAUNCHER="fork", MPIEXEC_TIMEOUT=str(timeout),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    for name in LAUNCHER_VARIABLES:
        env.pop(name, None)
    env.update(extra)
    return env


def launch(args, ranks, timeout):
    """Run ``mpiexec -n ranks python *args`` as a job of its own, from the repository root.

    Skips the test where there is no ``mpiexec``. Returns the
    ``subprocess.CompletedProcess`` (text output captured).
    """
    if mpiexec() is None:
        pytest.skip("no mpiexec on PATH")
    return subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, *args],
                          capture_output=True, text=True, timeout=timeout + 30,
                          env=job_env(timeout), cwd=ROOT)


def load_tool(name):
    """Import (once) ``tools/<name>.py`` (scripts, not a package) as a module of its own."""
    if f"_ccl_tool_{name}" in sys.modules:
        return sys.modules[f"_ccl_tool_{name}"]
    path = os.path.join(ROOT, "tools", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_ccl_tool_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module
