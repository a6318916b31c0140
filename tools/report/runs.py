"""Running one benchmark of the report as its own process, and the command the page shows."""

import json
import os
import shlex
import subprocess
import sys
import time

__all__ = ["ROOT", "MPIEXEC", "benchmark_env", "run_benchmark"]

#: The repository root: the checkout whose ccl the benchmarks run and whose docs they write.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def benchmark_env(extra=None):
    """The environment of a benchmark process: one numba thread, this ccl first on the path.

    Parameters
    ----------
    extra : dict, optional
        More variables to set.

    Returns
    -------
    dict
        A copy of ``os.environ`` with the additions.
    """
    env = dict(os.environ, HYDRA_LAUNCHER="fork", NUMBA_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", **(extra or {}))
    # run the ccl of this checkout, whichever ccl is installed
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_benchmark(args, json_path, log, extra_env=None):
    """Run a benchmark command that writes ``--json json_path``; return (rows, command).

    Parameters
    ----------
    args : list of str
        The command, without ``--json``.
    json_path : str
        Where the command writes its rows.
    log : file
        Receives the command line, its output and its duration.
    extra_env : dict, optional
        Environment variables to add (not shown in the command).

    Returns
    -------
    rows : object
        What the command wrote, parsed from JSON.
    command : str
        The command as the page shows it (``python``, ``mpiexec``, ``out.json``).
    """
    command = list(args) + ["--json", json_path]
    shown = " ".join(shlex.quote(a) for a in command)
    shown = shown.replace(sys.executable, "python").replace(MPIEXEC, "mpiexec")
    shown = shown.replace(json_path, "out.json")
    print(f"report: {shown}", file=log, flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=benchmark_env(extra_env), stdout=log, stderr=log)
    print(f"report:   done in {time.perf_counter() - start:.0f} s", file=log, flush=True)
    with open(json_path) as f:
        return json.load(f), shown
