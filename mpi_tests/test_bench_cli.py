"""``python -m ccl.bench``'s command line: help, errors said once, warm timings, clear units.

No test asserts a time: the warm-up is checked by counting calls, the
cluster's link rate by the environment it hands the benchmark.
"""

import os
import re
import subprocess
import sys

import pytest
from mpi4py import MPI

from ccl.bench import allreduce as bench
from ccl.bench import cli
from ccl.bench.cluster import EmulatedCluster
from ccl.codecs import get_codec
from mpi_tests.helpers.launch import ROOT, launch

SUBCOMMANDS = ("codecs", "accuracy", "diagnose", "gradients", "selection", "steady", "train", "lm",
               "cluster", "gpu")


@pytest.mark.serial
def test_help_lists_every_subcommand():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "ccl.bench", "--help"], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    listed = re.findall(r"^  (\w+) ", result.stdout, flags=re.M)
    for name in SUBCOMMANDS:
        assert name in listed, (name, result.stdout)
    assert "--codecs" in result.stdout  # and the default command's options after the list
    under_mpiexec = launch(["-m", "mpi4py", "-m", "ccl.bench", "--help"], 3, 120)
    assert under_mpiexec.returncode == 0, under_mpiexec.stderr
    assert under_mpiexec.stdout.count("commands (") == 1  # rank 0 alone prints it
    assert under_mpiexec.stdout.count("show this help") == 1


@pytest.mark.serial
def test_the_report_writer_is_a_script_of_the_repository_not_of_the_package():
    """It only regenerates this repository's docs/benchmarks.md: tools/report, outside ccl."""
    import importlib.util

    assert importlib.util.find_spec("ccl.bench.report") is None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    script = subprocess.run([sys.executable, "-m", "tools.report", "--help"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert script.returncode == 0, script.stderr
    assert script.stdout.startswith("usage: python -m tools.report"), script.stdout
    assert "--only-network" in script.stdout
    # the old command says where the writer went instead of "unknown command"
    old = subprocess.run([sys.executable, "-m", "ccl.bench", "report"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=120)
    assert old.returncode == 2 and "python -m tools.report" in old.stderr, old.stderr
    assert "Traceback" not in old.stderr


@pytest.mark.serial
@pytest.mark.parametrize("argv, says", [
    (["--codecs", "3lx"], "unknown codec '3lx'"),
    (["--codecs", '{"id": "thc", "bit": 4}'], "no parameter 'bit'"),
    (["--codecs", "{bad"], "not JSON"),
    (["--sizes", "4XB"], "bad size '4XB'"),
    (["accuracy", "--codecs", "3lx"], "unknown codec '3lx'"),
])
def test_a_bad_option_gives_one_error_and_status_2(argv, says):
    result = launch(["-m", "mpi4py", "-m", "ccl.bench", *argv], 3, 120)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1 and says in errors[0], output  # rank 0 alone says it
    assert "Traceback" not in output and "Abort" not in output, output


def test_sizes_use_one_binary_convention():
    assert cli.parse_size("4KB") == cli.parse_size("4KiB") == cli.parse_size("4k") == 4096
    assert cli.parse_size("64MB") == 64 << 20 and cli.parse_size("1GB") == 1 << 30
    assert cli.parse_size("1.5KB") == 1536 and cli.parse_size("100") == 100
    for bad in ("4XB", "MB", "-1KB", "1e3", "4 K B"):
        with pytest.raises(ValueError, match="1024"):
            cli.parse_size(bad)


def test_unknown_codec_parameter_lists_the_parameters():
    with pytest.raises(ValueError, match=r"no parameter 'bit' \(did you mean 'bits'\?\); "
                                         r"its parameters: bits=4, .*block="):
        get_codec({"id": "thc", "bit": 4})
    with pytest.raises(ValueError, match="has no parameter 'density'.*its parameters: s="):
        get_codec("3lc", density=0.1)
    with pytest.raises(ValueError, match="no parameter 'bit'"):
        type(get_codec("thc")).from_config({"id": "thc", "bit": 4})
    assert get_codec({"id": "thc", "bits": 2}).bits == 2


@pytest.mark.mpi
def test_timing_always_runs_untimed_first(comm):
    calls = []
    median, _ = bench._timed(comm, lambda: calls.append(1), reps=2, warmup=0)
    assert len(calls) == 3 and median >= 0  # a first call that compiles is never timed
    calls.clear()
    bench._timed_pair(comm, lambda: calls.append(1), lambda: None, reps=2, warmup=0)
    assert len(calls) == 3


def test_the_emulated_cluster_hands_its_rate_to_the_benchmark(monkeypatch):
    env = EmulatedCluster(2, "100mbit").environment({})
    assert env["CCL_BENCH_WIRE_GBPS"] == "0.1"
    assert "CCL_BENCH_WIRE_GBPS" not in EmulatedCluster(2, "none").environment({})
    monkeypatch.setenv("CCL_BENCH_WIRE_GBPS", env["CCL_BENCH_WIRE_GBPS"])
    assert bench.parse_args([]).wire_gbps == 0.1
    assert bench.parse_args(["--wire-gbps", "10"]).wire_gbps == 10.0  # the option wins


@pytest.mark.mpi
def test_the_table_explains_its_columns(comm, capsys):
    assert bench.main(["--codecs", "fp16", "--algorithms", "ring", "--sizes", "4KB",
                       "--reps", "1", "--wire-gbps", "1"]) == 0
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.rank == 0:
        text = " ".join(out.split())
        assert "'rel.err' = ||result - exact|| / ||exact|| of one call, before error " \
            "feedback" in text
        assert "'bound' = time / the larger of the two" in text
        assert "1 KB = 1024 bytes" in text and "wire bound at 1 Gbit/s" in text
