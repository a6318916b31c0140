"""The test tree keeps its rules: helpers as a package, one marker per idea, GPU tests apart."""

import pathlib
import re
import types

import pytest

from mpi_tests import conftest

TESTS = pathlib.Path(__file__).resolve().parent
SOURCES = {path.relative_to(TESTS).as_posix(): path.read_text()
           for path in sorted(TESTS.rglob("*.py")) if path.name != "test_test_tree.py"}

# what each rule forbids, and what to write instead
RULES = [
    (re.compile(r"sys\.path\.(insert|append)"),
     "import helpers as a package: from mpi_tests.helpers.<module> import ..."),
    (re.compile(r"^\s*(from conftest import|import conftest)", re.M),
     "fixtures come by name; shared code lives in mpi_tests/helpers or ccl.testing"),
    (re.compile(r"skipif\(\s*MPI\.COMM_WORLD\.size\s*>\s*1"),
     "mark the test @pytest.mark.serial"),
    (re.compile(r"if (comm\.size|hvd\.size\(\)|size) (== 1|< 2):\n\s+(pytest\.skip|return\n)"),
     "mark the test @pytest.mark.mpi(min_size=2)"),
    (re.compile(r"def _?mpiexec\("), "use mpi_tests.helpers.launch.mpiexec"),
]


@pytest.mark.parametrize("pattern,instead", RULES, ids=[i.split(":")[0] for _, i in RULES])
def test_no_test_breaks_the_rule(pattern, instead):
    breaking = sorted(name for name, text in SOURCES.items()
                      if pattern.search(text) and name != "helpers/launch.py")
    assert not breaking, f"{breaking}: {instead}"


def test_rules_can_fail():
    samples = ["sys.path.insert(0, HERE)", "from conftest import ROOT",
               "serial = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason='x')",
               "    if comm.size == 1:\n        pytest.skip('needs two ranks')",
               "def _mpiexec():"]
    for (pattern, _), sample in zip(RULES, samples, strict=True):
        assert pattern.search(sample), sample


def _config(*args):
    return types.SimpleNamespace(args=list(args),
                                 invocation_params=types.SimpleNamespace(dir=TESTS.parent))


@pytest.mark.parametrize("args,collected", [
    ((), False), (("mpi_tests",), False), (("mpi_tests/test_golden.py",), False),
    (("mpi_tests/gpu",), True), (("mpi_tests/gpu/test_api_xp.py::test_x",), True),
    (("mpi_tests", "mpi_tests/gpu/test_api_xp.py"), True)])
def test_gpu_tests_are_collected_only_when_named(args, collected):
    ignored = conftest.pytest_ignore_collect(conftest.GPU_TESTS, _config(*args))
    assert (ignored is None) == collected
    assert conftest.pytest_ignore_collect(TESTS / "helpers", _config(*args)) is None
