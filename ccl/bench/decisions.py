"""Whether ``auto`` makes the same decisions launch after launch.

``python -m ccl.bench.decisions --launches 10 --ranks 4 --busy 0 2``

Starts the same job ``--launches`` times under ``mpiexec -n RANKS``, first
alone, then beside each count of ``--busy`` processes that spin on a core
(``python -c "while 1: pass"``). Every job reduces ``--sizes`` of float32
per rank with each of ``--codecs`` and the default ``algorithm="auto"`` on a
fresh communicator, and prints what ``auto`` ran. The table counts the
launches that made each set of decisions: one row per busy count means every
launch decided alike. Run it under ``python -m ccl.bench.cluster ... --``
with ``--inner`` to check ranks on several nodes.
"""

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

__all__ = ["main"]

DEFAULT_CODECS = ["fp16", "3lc", "onebit", "thc", "sidco"]


def _job(codecs, sizes):
    """One launch: rank 0 prints ``{"codec@bytes": algorithm}`` as JSON (collective)."""
    import numpy as np
    from mpi4py import MPI

    import ccl

    decided = {}
    for nbytes in sizes:
        x = np.random.default_rng(MPI.COMM_WORLD.rank).standard_normal(
            nbytes // 4).astype(np.float32)
        for codec in codecs:
            comm = MPI.COMM_WORLD.Dup()
            try:
                c = ccl.Communicator(comm, codec=codec)
                c.allreduce(x)
                (algorithm,) = c.stats()["algorithms"]
                decided[f"{codec}@{nbytes}"] = algorithm
            finally:
                comm.Free()
    if MPI.COMM_WORLD.rank == 0:
        print("DECISIONS " + json.dumps(decided, sort_keys=True), flush=True)


def _launch(args, sizes):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(args.ranks),
           sys.executable, "-m", "mpi4py", "-m", "ccl.bench.decisions", "--inner",
           "--codecs", *args.codecs, "--sizes", *map(str, sizes)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                         env=dict(os.environ, HYDRA_LAUNCHER="fork"))
    for line in out.stdout.splitlines():
        if line.startswith("DECISIONS "):
            return line[len("DECISIONS "):]
    raise RuntimeError(f"the job printed no decisions (exit {out.returncode}):\n"
                       f"{out.stderr[-2000:]}")


def _loadavg():
    try:
        return os.getloadavg()[0]
    except OSError:  # not available
        return float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ccl.bench.decisions",
        description="Launch the same job several times; count the sets of decisions auto made.")
    parser.add_argument("--launches", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2],
                        help="spinning processes beside the job, one series per count")
    parser.add_argument("--codecs", nargs="+", default=DEFAULT_CODECS)
    parser.add_argument("--sizes", nargs="+", default=["4MB"],
                        help="float32 bytes per rank, with KB/MB/GB suffixes (powers of 1024)")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--inner", action="store_true", help="run one job (under mpiexec)")
    args = parser.parse_args(argv)
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    sizes = [int(s[:-2]) * units[s[-2:].upper()] if s[-2:].upper() in units else int(s)
             for s in args.sizes]
    if args.inner:
        _job(args.codecs, sizes)
        return 0
    print("| busy processes | launches | distinct decision sets | load average (1 min) | "
          "decisions (launches) |")
    print("|---|---|---|---|---|")
    for busy in args.busy:
        spinners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"])
                    for _ in range(busy)]
        try:
            loads, seen = [], Counter()
            for _ in range(args.launches):
                loads.append(_loadavg())
                seen[_launch(args, sizes)] += 1
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
        sets = "; ".join(f"{', '.join(f'{k}→{v}' for k, v in json.loads(d).items())} "
                         f"({n})" for d, n in seen.most_common())
        print(f"| {busy} | {args.launches} | {len(seen)} | {min(loads):.1f} to "
              f"{max(loads):.1f} | {sets} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
