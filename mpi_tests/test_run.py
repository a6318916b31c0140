"""``python -m ccl.run``: horovodrun's flags mapped onto mpiexec and srun, and a real launch.

The mapping tests are plain unit tests (no MPI); the launch test is serial:
it starts its own 3-rank job through ``python -m ccl.run``.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from ccl import run
from mpi_tests.helpers.launch import ROOT


def command(argv, flavour="hydra", environ=None, plugin=None):
    built, env = run.build(run.parse(argv), flavour=flavour, environ=environ or {},
                           plugin=plugin)
    return built[1:] if built[0] != "srun" else built, env


def test_hydra_gets_hosts_interface_variables_and_extra_arguments():
    argv = ["-np", "4", "-H", "h1:2,h2:2", "--network-interface", "eth1",
            "--timeline-filename", "tl.json", "--fusion-threshold-mb", "1.5",
            "--stall-check-warning-time-seconds", "30", "--mpi-args=-ppn 2",
            "--cycle-time-ms", "5", "--log-level", "INFO", "--disable-cache", "--mpi",
            "python", "train.py", "--epochs", "3"]
    built, env = command(argv)
    assert built == ["-n", "4", "-hosts", "h1:2,h2:2", "-iface", "eth1",
                     "-genv", "HOROVOD_TIMELINE", os.path.abspath("tl.json"),
                     "-genv", "HOROVOD_FUSION_THRESHOLD", str(3 << 19),
                     "-genv", "CCL_STALL_CHECK_SECONDS", "30",
                     "-ppn", "2", "python", "train.py", "--epochs", "3"]
    assert env == {"HOROVOD_TIMELINE": os.path.abspath("tl.json"),
                   "HOROVOD_FUSION_THRESHOLD": str(3 << 19), "CCL_STALL_CHECK_SECONDS": "30"}


def test_open_mpi_gets_its_own_spelling_and_ssh_options():
    built, _ = command(["-np", "2", "-H", "a,b", "-p", "2222", "--no-stall-check",
                        "--network-interface", "ib0", "python", "t.py"], flavour="openmpi")
    assert built == ["-n", "2", "--host", "a:1,b:1", "--mca", "btl_tcp_if_include", "ib0",
                     "--mca", "plm_rsh_args", "-p 2222", "-x", "CCL_STALL_CHECK_SECONDS=0",
                     "python", "t.py"]


def test_hydra_refuses_ssh_options_it_cannot_pass():
    with pytest.raises(ValueError, match="ssh/config"):
        command(["-np", "2", "-p", "2222", "python", "t.py"])


def test_inside_a_slurm_allocation_srun_runs_the_ranks():
    built, env = command(["-np", "4", "-H", "n1:2,n2:2", "--timeline-filename", "t.json",
                          "python", "train.py"], environ={"SLURM_JOB_ID": "7"}, plugin="pmi2")
    assert built == ["srun", "--ntasks=4", "--mpi=pmi2", "--nodelist=n1,n2",
                     "--ntasks-per-node=2", "python", "train.py"]
    assert env == {"HOROVOD_TIMELINE": os.path.abspath("t.json")}
    built, _ = command(["-np", "3", "--launcher", "mpiexec", "python", "t.py"],
                       environ={"SLURM_JOB_ID": "7"})
    assert built == ["-n", "3", "python", "t.py"]
    built, _ = command(["-np", "3", "-H", "n1:2,n2:1", "python", "t.py"],
                       environ={"SLURM_JOB_ID": "7"}, plugin="pmix")
    assert built == ["srun", "--ntasks=3", "--mpi=pmix", "--nodelist=n1,n2", "python", "t.py"]


def test_hostfile_in_either_format_sets_hosts_and_the_rank_count(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes\nnode1 slots=4\nnode2:2\n\nnode3\n")
    args = run.parse(["--hostfile", str(hostfile), "python", "t.py"])
    assert args.host_slots == [("node1", 4), ("node2", 2), ("node3", 1)]
    assert args.np == 7
    hostfile.write_text("node1 slots=x\n")
    with pytest.raises(SystemExit):
        run.parse(["--hostfile", str(hostfile), "python", "t.py"])


@pytest.mark.parametrize("argv, message", [
    (["--gloo", "-np", "2", "python", "t.py"], "MPI only"),
    (["--min-np", "2", "-np", "2", "python", "t.py"], "elastic"),
    (["-np", "2"], "no program"),
    (["python", "t.py"], "-np is required"),
    (["-np", "0", "python", "t.py"], "at least 1"),
])
def test_refused_command_lines_say_why(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        run.parse(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_says_what_every_flag_maps_to(capsys):
    with pytest.raises(SystemExit):
        run.parse(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flags, _, meaning in run.FLAGS:
        assert flags[0] in text
        assert " ".join(meaning.split())[:30] in text
    ignored = {flags[0] for flags, _, meaning in run.FLAGS if meaning.startswith(run.IGNORED)}
    assert {"--cycle-time-ms", "--log-level", "--disable-cache", "--start-timeout"} <= ignored


PROGRAM = """
import json, os, sys, torch, ccl.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="ranks")
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "sum": total.item(),
                  "fusion": os.environ.get("HOROVOD_FUSION_THRESHOLD")}), flush=True)
hvd.shutdown()
"""


@pytest.mark.serial
def test_a_real_launch_runs_every_rank_with_the_flags_variables(tmp_path):
    pytest.importorskip("torch")
    if run.mpiexec_path() is None:
        pytest.skip("no mpiexec")
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    timeline = tmp_path / "timeline.json"
    env = dict(os.environ, HYDRA_LAUNCHER="fork", MPIEXEC_TIMEOUT="300",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_ID",
                 "HOROVOD_TIMELINE", "CCL_TIMELINE"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "ccl.run", "-np", "3", "--fusion-threshold-mb", "2",
         "--timeline-filename", str(timeline), sys.executable, "-m", "mpi4py", str(script)],
        capture_output=True, text=True, timeout=330, env=env, cwd=str(tmp_path))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    # mpiexec may put two ranks' lines on one (a newline written after the other's line)
    rows = [json.loads(row) for row in re.findall(r"\{[^{}]*\}", result.stdout)]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2]
    assert all(r["size"] == 3 and r["sum"] == 3.0 and r["fusion"] == str(2 << 20)
               for r in rows)
    events = json.loads(timeline.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e.get("name") == "ranks"} == {0, 1, 2}
