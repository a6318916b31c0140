"""``tools/gpu_profile.py`` under the CUDA simulator, so that the profiler cannot rot.

Its figures mean nothing here; what is checked is that every codec's encode
and decode is timed stage by stage, and that a training step is profiled.
"""

import os
import re
import subprocess
import sys

import pytest

from mpi_tests.helpers.launch import ROOT

pytestmark = pytest.mark.serial
SCRIPT = os.path.join(ROOT, "tools", "gpu_profile.py")


def _profile(*args):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("PMI_SIZE", "PMI_RANK", "PMI_FD", "PMI_PORT", "HYDI_CONTROL_FD", "PMIX_RANK",
                 "OMPI_COMM_WORLD_SIZE", "CCL_TEST_GPU"):
        env.pop(name, None)  # a process of its own, not a rank of the test's job
    proc = subprocess.run([sys.executable, SCRIPT, *args, "--simulate"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_codecs_are_timed_stage_by_stage():
    out = _profile("codecs", "--size", "4kB")
    for codec in ("fp16", "onebit", "thc", "3lc", "topk", "sidco"):
        for what in ("encode", "decode"):
            assert re.search(rf"^{codec} {what}: [\d.]+ ms untimed", out, re.MULTILINE), codec
    assert "kernel onebit_partial" in out and "all_finite" in out


def test_a_training_step_is_profiled():
    out = _profile("train", "--codecs", "onebit", "--width", "16", "--steps", "1")
    assert re.search(r"^== onebit: [\d.]+ ms per step", out, re.MULTILINE)
    assert "-- main thread" in out and "gpu_train.py" in out
