"""The public API's annotations, as a user's type checker sees them (PEP 561).

mypy runs on a small user program against this checkout's ``ccl``: a
collective returns the kind of array it was given, and a wrong argument type
is an error before anything runs. The project's own mypy configuration
(``mypy.ini``, what ``make lint`` runs) must pass too.
"""

import importlib.resources
import os
import subprocess
import sys

import pytest

from mpi_tests.helpers.launch import ROOT

pytest.importorskip("mypy", reason="mypy comes with the test extras (make install-test)")


USER_PROGRAM = """\
import numpy as np

import ccl

x = np.ones(4, np.float32)
reveal_type(ccl.compressed_allreduce(x, "fp16"))
reveal_type(ccl.Communicator(codec="fp16").allreduce(x, key="k"))
reveal_type(ccl.allgather(x, "none", timeout=None))
ccl.compressed_allreduce(x, "fp16", timeout="soon")
ccl.Communicator(codec="fp16").allreduce(x, key="k", check_finite="yes")
"""


def _mypy(args, tmp_path):
    """``python -m mypy ARGS`` from the repository root, its cache under ``tmp_path``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                           *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)


@pytest.mark.serial
def test_the_package_says_it_is_typed():
    assert importlib.resources.files("ccl").joinpath("py.typed").is_file()


@pytest.mark.serial
def test_a_user_program_sees_the_annotations(tmp_path):
    program = tmp_path / "user.py"
    program.write_text(USER_PROGRAM)
    result = _mypy(["--config-file", os.devnull, "--python-version", "3.10", str(program)],
                   tmp_path)
    lines = result.stdout.splitlines()
    revealed = [line for line in lines if "Revealed type" in line]
    assert len(revealed) == 3, result.stdout + result.stderr
    # a float32 array in, a float32 array out (unannotated, mypy would say Any)
    assert all("numpy.ndarray" in line and "32Bit" in line for line in revealed), result.stdout
    errors = [line for line in lines if ": error:" in line]
    assert len(errors) == 2, result.stdout
    assert '"timeout"' in errors[0] and "user.py:9:" in errors[0], result.stdout
    assert '"check_finite"' in errors[1] and "user.py:10:" in errors[1], result.stdout


@pytest.mark.serial
def test_the_project_configuration_passes(tmp_path):
    result = _mypy([], tmp_path)  # mypy.ini: the public modules, every function annotated
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout
