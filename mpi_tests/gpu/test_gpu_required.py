"""``CCL_TEST_GPU=1`` turns a missing GPU from a skip into a failure."""

import os
import subprocess
import sys

import pytest

from mpi_tests.helpers.gpu import gpu_unavailable_reason

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _pytest(extra_env):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **extra_env)
    for name in ("NUMBA_ENABLE_CUDASIM", "PMI_SIZE", "PMI_RANK", "PMI_FD", "PMI_PORT",
                 "HYDI_CONTROL_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"):
        env.pop(name, None)
    if "CCL_TEST_GPU" not in extra_env:
        env.pop("CCL_TEST_GPU", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
           os.path.join(HERE, "test_api_xp.py"), "-k", "cupy and encode_keeps_module"]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_missing_gpu_skips_by_default_and_fails_when_required():
    if os.environ.get("CCL_TEST_GPU") == "1" and gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present: the cupy cases run for real")
    skipped = _pytest({})
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout
    required = _pytest({"CCL_TEST_GPU": "1"})
    if gpu_unavailable_reason() is None:  # pragma: no cover - a GPU machine
        return
    assert required.returncode == 1, required.stdout + required.stderr
    # the fixture fails, so pytest reports the case as an error: never a skip or a pass
    assert "1 error" in required.stdout and "skipped" not in required.stdout
    assert "CCL_TEST_GPU=1 but cupy is not installed" in required.stdout
