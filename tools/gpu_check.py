#!/usr/bin/env python3
"""Every GPU check in one run, for a GPU machine without a package index: ``make gpu-check``.

On the GPU machine, from the repository root (``python3`` with cupy, numba-cuda,
torch, mpi4py and pytest installed)::

    python3 tools/gpu_check.py --out DIR

On any machine, under numba's CUDA simulator with tiny sizes (``make test`` runs
it, so the script cannot rot)::

    python3 tools/gpu_check.py --dry-run --out DIR

It never reaches the network. The wheels the GPU machine lacks (``mpich``,
``mpi4py`` and ``pytest-mpi``, the versions this repository is tested with)
are fetched beforehand by ``make gpu-wheels`` into ``gpu-wheels/`` and travel
with the tree; the ``install`` step puts them under ``--site`` with ``pip
--no-index --prefix`` (``--target`` would drop the MPI library in
``lib/``) and points ``PYTHONPATH``, ``PATH`` and ``MPI4PY_LIBMPI`` at them.
``ccl`` itself runs from the tree (``PYTHONPATH``), not installed.

The steps (:data:`STEPS`), each a subprocess with its own time budget
(``--budget NAME=SECONDS``), all within ``--limit`` seconds (default 480): a
step that overruns is killed with its process group and recorded as
``timeout``, and the run goes on to the next. ``DIR/gpu-check.json`` holds
the environment and every step's status, test counts and benchmark rows;
``DIR/gpu-check.log`` every command and its output. A summary is printed last.
The exit status is 0 only if no step failed or timed out.
"""

import argparse
import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: (name, budget in seconds on a GPU, budget in a dry run), in the order they run.
STEPS = (("install", 45, 45), ("environment", 50, 60), ("warmup", 60, 90),
         ("tests-1", 120, 90), ("tests-mpi", 100, 90), ("bench-gpu", 75, 60),
         ("allreduce", 70, 90), ("train", 90, 90))
#: Left at the end of ``--limit`` for killing the last step (up to 10 s) and the summary; a
#: step starts only with MIN_STEP_S more, and leaves FLOOR_S to each step after it (a slow
#: step cannot starve all the others).
RESERVE_S, MIN_STEP_S, FLOOR_S = 15, 10, 25
#: Characters of one command's output kept in the log (its head and tail): a dozen commands
#: stay under the 16 MiB a file may have to come back from a remote machine.
LOG_CHARS = 1_000_000
#: Marks the JSON line the environment probe (tools/gpu_probe.py) prints.
ENV_MARK = "GPU-CHECK-ENV "
PROBE = os.path.join(ROOT, "tools", "gpu_probe.py")


class Run:
    """The output folder, the log, the deadline, and the results gathered so far."""

    def __init__(self, args):
        self.args, self.start = args, time.monotonic()
        self.deadline = self.start + args.limit
        os.makedirs(args.out, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="ccl-gpu-check-")
        self.log_file = open(os.path.join(args.out, "gpu-check.log"), "w", encoding="utf-8")
        self.env = dict(os.environ)
        self.mpiexec = "mpiexec"
        self.result = dict(schema=1, dry_run=args.dry_run, limit_s=args.limit, mpi=args.mpi,
                           started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           command=args.command, environment={}, steps=[])

    def log(self, text):
        self.log_file.write(text if text.endswith("\n") else text + "\n")
        self.log_file.flush()

    def say(self, text):
        print(text, flush=True)
        self.log(text)

    def left(self):
        return self.deadline - time.monotonic()

    def budget(self, name):
        table = {n: (dry if self.args.dry_run else real) for n, real, dry in STEPS}
        return float(self.args.budget.get(name, table[name]))

    def execute(self, cmd, budget, env=None):
        """Run ``cmd`` for at most ``budget`` seconds: (returncode or None on timeout, output)."""
        self.log(f"$ {shlex.join(cmd)}")
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out:
            try:
                rc = run_killed_after(cmd, budget, env=self.env if env is None else env,
                                      stdout=out, cwd=ROOT)
            except OSError as exc:  # no such program (nvidia-smi on a machine without GPU)
                rc = 127
                out.write(f"{exc}\n")
            out.seek(0)
            text = out.read()
        if len(text) > LOG_CHARS:  # the log must stay small enough to fetch from the machine
            text = f"{text[:LOG_CHARS // 4]}\n[... cut ...]\n{text[-3 * LOG_CHARS // 4:]}"
        self.log(text + (f"[rc {rc}]" if rc is not None else f"[killed after {budget:.0f} s]"))
        return rc, text


def run_killed_after(cmd, budget, stdout=None, **popen):
    """Run ``cmd`` in a session of its own; past ``budget`` seconds kill the whole group.

    Returns the exit status, or None if it was killed (every process it
    started, mpiexec's ranks included, gets SIGTERM, then SIGKILL 5 s later).
    """
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, **popen)
    try:
        return proc.wait(timeout=max(budget, 0.1))
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # stragglers of the group
            os.killpg(proc.pid, signal.SIGKILL)
        return None


# ----------------------------------------------------------------- the steps
def step_install(run, budget):
    """The carried wheels under ``--site``; PYTHONPATH, PATH and the MPI library point there."""
    args = run.args
    run.env["PYTHONPATH"] = os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    run.env.setdefault("CCL_NUMBA_CACHE", "1")
    run.env.setdefault("NUMBA_CACHE_DIR", os.path.join(args.site, "numba-cache"))
    run.env["HYDRA_LAUNCHER"] = "fork"  # one node: no ssh between ranks
    if args.dry_run:
        run.env["NUMBA_ENABLE_CUDASIM"] = "1"
        run.env.pop("CCL_TEST_GPU", None)
        run.mpiexec = args.mpiexec or _beside_python("mpiexec")
        return dict(status="skipped", reason="dry run: the packages already here are used")
    run.env.pop("NUMBA_ENABLE_CUDASIM", None)
    run.env["CCL_TEST_GPU"] = "1"
    wheels = sorted(glob.glob(os.path.join(args.wheels, "*.whl")))
    if args.mpi == "system":
        wheels = [w for w in wheels if not re.match(r"(mpich|mpi4py)-", os.path.basename(w))]
    if not wheels:
        run.mpiexec = args.mpiexec or "mpiexec"
        return dict(status="skipped", reason=f"no wheels in {args.wheels} (make gpu-wheels)")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--ignore-installed", "--prefix", args.site]
    rc, text = run.execute(cmd + wheels, budget)
    packages = sorted({os.path.dirname(p) for p in glob.glob(
        os.path.join(args.site, "**", "*-packages", "*.dist-info"), recursive=True)})
    run.env["PYTHONPATH"] = os.pathsep.join([ROOT] + packages + run.env["PYTHONPATH"].split(
        os.pathsep)[1:])
    libmpi = glob.glob(os.path.join(args.site, "**", "lib", "libmpi.so.12"), recursive=True)
    mpiexec = glob.glob(os.path.join(args.site, "**", "bin", "mpiexec"), recursive=True)
    if libmpi and args.mpi == "wheel":
        run.env["MPI4PY_LIBMPI"] = libmpi[0]  # mpi4py does not search --prefix's lib/
        run.env.pop("MPI4PY_MPIABI", None)
    if mpiexec:
        run.env["PATH"] = os.pathsep.join([os.path.dirname(mpiexec[0]), run.env["PATH"]])
    run.mpiexec = args.mpiexec or (mpiexec[0] if mpiexec and args.mpi == "wheel" else "mpiexec")
    return dict(_status(rc, text), wheels=[os.path.basename(w) for w in wheels],
                site_packages=packages, libmpi=libmpi[:1], mpiexec=run.mpiexec)


def _beside_python(name):
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else name


def step_environment(run, budget):
    """Versions, the GPU, the MPI library and whether it is CUDA-aware (nvidia-smi too)."""
    env = {}
    if not run.args.dry_run:
        run.execute(["nvidia-smi"], min(20, budget))
        rc, text = run.execute(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], min(20, budget))
        env["nvidia_smi"] = text.strip() if rc == 0 else f"unavailable (rc {rc})"
    rc, text = run.execute([sys.executable, PROBE], 2 * budget / 3)
    env.update(_marked_json(text) or {"probe_error": _tail(text)})
    env["mpiexec"] = run.mpiexec
    env["env"] = {k: run.env[k] for k in ("PYTHONPATH", "MPI4PY_LIBMPI", "NUMBA_ENABLE_CUDASIM",
                                          "CCL_TEST_GPU", "CCL_CUDA_AWARE") if k in run.env}
    if not run.args.dry_run and run.args.mpi == "wheel":
        # What the machine's own mpi4py would load, for a second run with --mpi system
        system = dict(os.environ, PYTHONPATH=ROOT)
        system.pop("MPI4PY_LIBMPI", None)
        _, text2 = run.execute([sys.executable, PROBE, "--mpi-only"], budget / 4, env=system)
        probe = _marked_json(text2) or {}
        env["system_mpi"] = {k: probe.get(k) for k in (
            "mpi4py_file", "mpi_library_version", "libmpi", "cuda_aware", "mpi_error")}
    run.result["environment"] = env
    return dict(status="passed" if rc == 0 else "failed", returncode=rc)


def step_warmup(run, budget):
    """Compile the host kernels once into the numba cache, before ranks share it."""
    codecs = "['fp16', 'onebit']" if run.args.dry_run else ""
    rc, text = run.execute([sys.executable, "-c", f"import ccl; ccl.warmup({codecs})"], budget)
    return _status(rc, text)


def _pytest_cmd(run, mpi):
    cmd = [sys.executable, "-m", "mpi4py", "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
           f"--timeout={60 if not run.args.dry_run else 120}", "--timeout-method=thread",
           "--only-mpi" if mpi else "--with-mpi"]
    if run.args.dry_run:  # a few tests: the harness is checked, make test-gpu-sim runs them all
        return cmd + ["mpi_tests/gpu/test_api_xp.py", "-k", "encode_keeps_module or auto_mpi"]
    return cmd + ["mpi_tests/gpu", "--ignore=mpi_tests/gpu/test_gpu_check.py"]


def step_tests_1(run, budget):
    """mpi_tests/gpu at one rank on the device (``CCL_TEST_GPU=1``: a missing GPU fails)."""
    rc, text = run.execute(_pytest_cmd(run, mpi=False), budget)
    return dict(_status(rc, text), tests=_pytest_counts(text))


def step_tests_mpi(run, budget):
    """mpi_tests/gpu's MPI tests at each of ``--ranks``, every rank on the same GPU."""
    results, status = {}, "passed"
    end = time.monotonic() + budget
    counts = run.args.ranks
    for i, ranks in enumerate(counts):
        # an equal share of what is left, so a slow first run leaves time for the next
        left = (min(end, run.deadline - RESERVE_S) - time.monotonic()) / (len(counts) - i)
        if left < MIN_STEP_S:
            results[str(ranks)], status = dict(status="timeout", reason="no time left"), "timeout"
            continue
        cmd = [run.mpiexec, "-n", str(ranks)] + _pytest_cmd(run, mpi=True)
        rc, text = run.execute(cmd, left)
        results[str(ranks)] = dict(_status(rc, text), tests=_pytest_counts(text))
        if results[str(ranks)]["status"] != "passed" and status == "passed":
            status = results[str(ranks)]["status"]
    return dict(status=status, ranks=results)


def _bench(run, budget, command, options, ranks=None):
    path = os.path.join(run.tmp, f"{command}.json")
    cmd = [sys.executable, "-m", "mpi4py", "-m", "ccl.bench", command] + options
    if ranks:
        cmd = [run.mpiexec, "-n", str(ranks)] + cmd
    if run.args.dry_run:
        cmd.append("--simulate")
    rc, text = run.execute(cmd + ["--json", path], budget)
    result = _status(rc, text)
    needs = re.search(r"^python -m ccl\.bench \S+: needs .*$", text, re.MULTILINE)
    if rc == 2 and needs:  # the benchmark's own "needs a GPU: why"
        result = dict(status="skipped", returncode=rc, reason=needs.group(0))
    if os.path.exists(path):  # the benchmarks write their rows as they go
        with open(path, encoding="utf-8") as f:
            result["rows"] = json.load(f)
        result["partial"] = rc != 0
    return result


def step_bench_gpu(run, budget):
    """``python -m ccl.bench gpu``: every codec's device encode/decode GB/s, 64 MB to 1 GB."""
    if run.args.dry_run:
        options = ["--sizes", "4kB", "--reps", "1", "--codecs", "fp16", "onebit"]
    else:
        options = ["--sizes", "64MB", "256MB", "1GB", "--reps", "3"]
    return _bench(run, budget, "gpu", options)


def step_allreduce(run, budget):
    """Compressed allreduce of cupy arrays vs MPI_Allreduce (staged; on device if CUDA-aware)."""
    if run.args.dry_run:
        options = ["--sizes", "4kB", "--reps", "1", "--warmup", "0", "--codecs", "fp16", "onebit"]
    else:
        options = ["--sizes", "64MB", "256MB", "--reps", "3"]
    return _bench(run, budget, "gpu-allreduce", options, ranks=run.args.bench_ranks)


def step_train(run, budget):
    """DistributedOptimizer (codec=None and lossy codecs) and CompressedAdam on CUDA tensors."""
    if run.args.dry_run:
        options = ["--width", "16", "--batch", "8", "--steps", "1", "--warmup", "1",
                   "--codecs", "none", "onebit", "--min-compress-bytes", "0"]
    else:
        options = ["--steps", "5", "--warmup", "2", "--algorithm", "ring", "auto"]
    return _bench(run, budget, "gpu-train", options, ranks=run.args.bench_ranks)


def _status(rc, text):
    if rc is None:
        return dict(status="timeout", returncode=None)
    return dict(status="passed" if rc == 0 else "failed", returncode=rc,
                **({} if rc == 0 else {"reason": _tail(text)}))


def _tail(text, lines=5):
    return "\n".join(text.strip().splitlines()[-lines:])


def _marked_json(text):
    for line in text.splitlines():
        if line.startswith(ENV_MARK):
            return json.loads(line[len(ENV_MARK):])
    return None


# Not anchored to a line: the ranks of one mpiexec share its stdout, so one rank's summary
# can land on the same line as another's ("... in 11.65s19 passed, ...").
_SUMMARY = re.compile(r"((?:\d+ [a-z]+, )*\d+ [a-z]+) in \d+\.\d+s")
_PROGRESS = re.compile(r"^([.FEsxX]+)(?:\s+\[\s*\d+%\])?$")
_MARKS = {".": "passed", "F": "failed", "E": "errors", "s": "skipped", "x": "xfailed",
          "X": "xpassed"}


def _pytest_counts(text):
    """The outcome counts of each pytest summary line (one per rank), and the FAILED lines."""
    counts = [{kind: int(num) for num, kind in (part.split() for part in m.group(1).split(", "))}
              for m in _SUMMARY.finditer(text)]
    failed = sorted({line.strip() for line in text.splitlines()
                     if line.startswith(("FAILED ", "ERROR "))})
    result = dict(per_rank=counts, failed=failed[:50])
    if not counts:  # killed before its summary: what the progress characters showed so far
        marks = "".join(m.group(1) for m in map(_PROGRESS.match, text.splitlines()) if m)
        result["progress"] = {kind: marks.count(c) for c, kind in _MARKS.items()
                              if marks.count(c)}
    return result


HANDLERS = dict(install=step_install, environment=step_environment, warmup=step_warmup,
                **{"tests-1": step_tests_1, "tests-mpi": step_tests_mpi,
                   "bench-gpu": step_bench_gpu, "allreduce": step_allreduce,
                   "train": step_train})
#: The step that always runs: the others need the environment it sets.
ALWAYS = ("install",)


def run_steps(run):
    """Run every selected step within its budget and the overall limit; record each."""
    args = run.args
    selected = [n for n, _, _ in STEPS if n in ALWAYS or (
        n not in args.skip and (not args.only or n in args.only))]
    for name, _, _ in STEPS:
        record = dict(name=name, doc=HANDLERS[name].__doc__.splitlines()[0])
        later = len(selected) - selected.index(name) - 1 if name in selected else 0
        if name not in selected:
            record.update(status="skipped", reason="not selected (--only, --skip)")
        elif run.left() - RESERVE_S < MIN_STEP_S:
            record.update(status="timeout", reason=f"no time left within --limit {args.limit} s")
        else:
            budget = min(run.budget(name),
                         max(MIN_STEP_S, run.left() - RESERVE_S - FLOOR_S * later))
            run.say(f"== {name} (at most {budget:.0f} s): {record['doc']}")
            t0 = time.monotonic()
            try:
                record.update(HANDLERS[name](run, budget), budget_s=round(budget, 1))
            except Exception as exc:  # a bug here must not lose the other steps' results
                record.update(status="failed", reason=f"gpu_check.py: {exc!r}")
            record["seconds"] = round(time.monotonic() - t0, 1)
        run.result["steps"].append(record)
        run.say(f"   {name}: {record['status']}" + (f" ({record['seconds']} s)"
                                                     if "seconds" in record else ""))
        write_json(run)


def write_json(run):
    run.result["elapsed_s"] = round(time.monotonic() - run.start, 1)
    counts = {}
    for step in run.result["steps"]:
        counts[step["status"]] = counts.get(step["status"], 0) + 1
    run.result["summary"] = counts
    path = os.path.join(run.args.out, "gpu-check.json")
    with open(path + ".part", "w", encoding="utf-8") as f:
        json.dump(run.result, f, indent=1, default=str)
    os.replace(path + ".part", path)  # a run killed from outside leaves the last whole file


def _tests_brief(tests):
    """``12 passed, 1 failed (every rank of 4)`` from what :func:`_pytest_counts` found."""
    if tests.get("per_rank"):
        outcomes = [", ".join(f"{n} {k}" for k, n in c.items()) for c in tests["per_rank"]]
        runs = len(outcomes)
        if len(set(outcomes)) == 1:
            return outcomes[0] + (f" (every rank of {runs})" if runs > 1 else "")
        return " | ".join(outcomes)
    if tests.get("progress"):
        return "before the kill: " + ", ".join(f"{n} {k}" for k, n in tests["progress"].items())
    return ""


def summary_lines(result):
    """The printed summary: each step, the environment, then the benchmark figures."""
    env = result["environment"]
    cupy = env.get("cupy") or {}
    lines = [f"== gpu-check summary ({'dry run, ' if result['dry_run'] else ''}"
             f"{result['elapsed_s']} s of {result['limit_s']} s)",
             f"device: {env.get('nvidia_smi') or cupy.get('device0') or 'none'}; "
             f"MPI: {env.get('mpi_library_version', env.get('mpi_error'))}; "
             f"CUDA-aware: {env.get('cuda_aware')}"]
    for step in result["steps"]:
        extra = step.get("reason") or ""
        if step.get("tests"):
            extra = _tests_brief(step["tests"]) or extra
        if step.get("ranks"):
            extra = "; ".join(f"{n} ranks: {_tests_brief(r.get('tests') or {}) or r['status']}"
                              for n, r in step["ranks"].items())
        lines.append(f"{step['name']:<12} {step['status']:<8} "
                     f"{step.get('seconds', ''):>6} s  {(extra.splitlines() or [''])[-1][:90]}")
    for step in result["steps"]:
        rows = step.get("rows") or []
        if step["name"] == "bench-gpu" and rows:
            lines.append("codec       MiB   encode GB/s  decode GB/s  copy GB/s")
            lines += [f"{r['codec']:<10} {r['bytes'] / 2**20:>5.0f} {r['encode_gbs']:>12.1f} "
                      f"{r['decode_gbs']:>12.1f} {r['copy_gbs']:>10.1f}" for r in rows]
        elif step["name"] == "allreduce" and rows:
            lines.append("allreduce   MiB  method      algorithm      ms  speedup identical")
            lines += [f"{str(r['codec']):<10} {r['bytes'] / 2**20:>5.0f}  {r['method']:<11} "
                      f"{r['algorithm']:<9} {1e3 * r['seconds']:>8.2f} {r['speedup']:>7.2f} "
                      f"{r['identical']}" for r in rows]
        elif step["name"] == "train" and rows:
            lines.append("optimizer            codec      algorithm  ms/step  vs none identical")
            lines += [f"{r['optimizer']:<20} {r['codec']:<10} {r.get('algorithm', ''):<9} "
                      f"{1e3 * r['seconds']:>8.2f} {r['vs_none'] or 0:>8.2f} {r['identical']}"
                      for r in rows]
    return lines


def _budgets(items):
    names = [n for n, _, _ in STEPS]
    budgets = {}
    for item in items:
        name, _, seconds = item.partition("=")
        if name not in names or not seconds:
            raise SystemExit(f"--budget {item}: expected NAME=SECONDS, NAME one of {names}")
        budgets[name] = float(seconds)
    return budgets


def main(argv=None):
    names = [n for n, _, _ in STEPS]
    parser = argparse.ArgumentParser(prog="tools/gpu_check.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "gpu-check-out"),
                        help="folder for gpu-check.json and gpu-check.log")
    parser.add_argument("--dry-run", action="store_true",
                        help="numba's CUDA simulator, tiny sizes, no install (any machine)")
    parser.add_argument("--limit", type=float, default=480,
                        help="seconds for the whole run (default 480)")
    parser.add_argument("--budget", action="append", default=[], metavar="NAME=SECONDS",
                        help=f"a step's budget; steps: {', '.join(names)}")
    parser.add_argument("--only", nargs="+", default=None, choices=names,
                        help="run only these steps (and install, which sets their environment)")
    parser.add_argument("--skip", nargs="+", default=[], choices=names)
    parser.add_argument("--ranks", nargs="+", type=int, default=None,
                        help="rank counts of tests-mpi (default 2 4; dry run 2)")
    parser.add_argument("--bench-ranks", type=int, default=None,
                        help="ranks of allreduce and train (default 4; dry run 2)")
    parser.add_argument("--wheels", default=os.path.join(ROOT, "gpu-wheels"),
                        help="the carried wheels (make gpu-wheels)")
    parser.add_argument("--site", default=os.path.join(tempfile.gettempdir(), "ccl-gpu-site"),
                        help="where the wheels are installed (pip --prefix)")
    parser.add_argument("--mpi", choices=("wheel", "system"), default="wheel",
                        help="wheel: the carried mpich and mpi4py; system: the machine's own "
                             "mpi4py, its MPI and the mpiexec on PATH")
    parser.add_argument("--mpiexec", default=None, help="launcher to use instead")
    args = parser.parse_args(argv)
    args.command = [sys.executable, os.path.abspath(__file__)] + list(
        sys.argv[1:] if argv is None else argv)
    args.budget = _budgets(args.budget)
    args.out = os.path.abspath(args.out)
    args.ranks = args.ranks or ([2] if args.dry_run else [2, 4])
    args.bench_ranks = args.bench_ranks or (2 if args.dry_run else 4)
    run = Run(args)
    try:
        run_steps(run)
    finally:
        write_json(run)
        lines = summary_lines(run.result)
        run.log("\n".join(lines))
        run.log_file.close()
        shutil.rmtree(run.tmp, ignore_errors=True)
    print("\n".join(lines))
    print(f"wrote {os.path.join(args.out, 'gpu-check.json')} and gpu-check.log")
    bad = {"failed", "timeout"} & set(run.result["summary"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
