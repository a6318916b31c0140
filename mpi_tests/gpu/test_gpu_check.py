"""``tools/gpu_check.py``, the one run of every GPU check, end to end under the CUDA simulator.

The dry run takes every step the GPU machine takes (tests at one rank and
under mpiexec, the three device benchmarks, optimizer steps) with tiny
sizes, so that the script and the benchmarks it drives cannot rot between
the rare runs on a real GPU.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from mpi_tests.helpers.launch import ROOT, load_tool

SCRIPT = os.path.join(ROOT, "tools", "gpu_check.py")
gpu_check = load_tool("gpu_check")  # tools/ holds scripts, not a package

STEP_NAMES = [name for name, _, _ in gpu_check.STEPS]


def _check(out, *options):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("PMI_SIZE", "PMI_RANK", "PMI_FD", "PMI_PORT", "HYDI_CONTROL_FD", "PMIX_RANK",
                 "OMPI_COMM_WORLD_SIZE", "NUMBA_ENABLE_CUDASIM", "CCL_TEST_GPU"):
        env.pop(name, None)  # the script launches its own MPI jobs and sets the simulator
    cmd = [sys.executable, SCRIPT, "--dry-run", "--out", str(out), *options]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    with open(os.path.join(out, "gpu-check.json"), encoding="utf-8") as f:
        return proc, json.load(f)


def test_dry_run_takes_every_step_and_records_it(tmp_path):
    proc, result = _check(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = {s["name"]: s for s in result["steps"]}
    assert [s["name"] for s in result["steps"]] == STEP_NAMES
    assert steps["install"]["status"] == "skipped"  # a dry run uses what is installed
    for name in STEP_NAMES[1:]:
        assert steps[name]["status"] == "passed", steps[name]
    assert result["dry_run"] and result["summary"] == {"skipped": 1, "passed": 7}
    env = result["environment"]
    assert env["cuda_simulator"] and "MPICH" in env["mpi_library_version"]
    assert env["cuda_aware"] is False
    # pytest ran tests, at one rank and on each rank of the MPI run
    assert steps["tests-1"]["tests"]["per_rank"][0]["passed"] > 0
    mpi = steps["tests-mpi"]["ranks"]["2"]["tests"]["per_rank"]
    assert len(mpi) == 2 and all(c["passed"] > 0 for c in mpi)
    codecs = {r["codec"] for r in steps["bench-gpu"]["rows"]}
    assert codecs == {"fp16", "onebit"}
    assert all(r["encode_gbs"] > 0 and r["bytes"] == 4096 for r in steps["bench-gpu"]["rows"])
    rows = steps["allreduce"]["rows"]
    assert [r["method"] for r in rows] == ["mpi-staged", "ccl", "ccl"]
    assert all(r["identical"] and r["ranks"] == 2 for r in rows)
    assert not steps["allreduce"]["partial"] and not steps["train"]["partial"]
    train = [(r["optimizer"], r["codec"], r["identical"]) for r in steps["train"]["rows"]]
    assert train == [("DistributedOptimizer", "none", True),
                     ("DistributedOptimizer", "onebit", True),
                     ("CompressedAdam", "onebit", True)]
    log = (tmp_path / "gpu-check.log").read_text()
    assert "$ " in log and "-m ccl.bench gpu-train" in log
    assert "== gpu-check summary (dry run" in proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["gpu-check.json", "gpu-check.log"]


def test_a_step_past_its_budget_is_a_timeout_and_the_run_goes_on(tmp_path):
    # importing ccl alone takes longer than the 0.1 s floor of a budget
    proc, result = _check(tmp_path, "--only", "warmup", "--budget", "warmup=0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = {s["name"]: s["status"] for s in result["steps"]}
    assert status.pop("warmup") == "timeout"
    assert set(status.values()) == {"skipped"}
    assert "killed after" in (tmp_path / "gpu-check.log").read_text()
    assert "warmup       timeout" in proc.stdout


def test_an_overrun_kills_the_whole_process_group(tmp_path):
    # a child that starts a grandchild, both sleeping: both must be gone afterwards
    pidfile = tmp_path / "grandchild"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(300)")
    assert gpu_check.run_killed_after([sys.executable, "-c", code], 3) is None
    assert pidfile.exists(), "the child had not started its grandchild within 3 s"
    pid = int(pidfile.read_text())
    for _ in range(100):  # killed, it may linger as a zombie until init reaps it
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {pid} survived the kill")


def test_budgets_are_parsed_and_checked():
    assert gpu_check._budgets(["train=30", "tests-1=2.5"]) == {"train": 30.0, "tests-1": 2.5}
    with pytest.raises(SystemExit, match="NAME=SECONDS"):
        gpu_check._budgets(["nosuchstep=3"])


def test_pytest_counts_finds_every_rank_even_on_one_line():
    # Two ranks of one mpiexec share stdout; one summary can follow another without a newline.
    text = ("..ss\n19 passed, 15 skipped in 11.65s19 passed, 15 skipped in 11.65s\n"
            "=== 1 failed, 3 passed, 2 deselected in 0.50s ===\nFAILED tests/x.py::t - boom\n")
    counts = gpu_check._pytest_counts(text)
    assert counts["per_rank"] == [{"passed": 19, "skipped": 15}, {"passed": 19, "skipped": 15},
                                  {"failed": 1, "passed": 3, "deselected": 2}]
    assert counts["failed"] == ["FAILED tests/x.py::t - boom"]
