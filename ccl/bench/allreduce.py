"""Benchmark every codec x algorithm x size against MPI_Allreduce, in one run.

For each configuration: the median wall time over repeated runs after a
warm-up (the slowest rank's time for each run), the speedup over
``MPI_Allreduce`` of the same data measured in the same run, the payload
bytes each rank sent, and the relative error against the exact float64 sum.
"""

import argparse
import csv
import json
import os
import time

import numpy as np
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.collectives.auto import fitting
from ccl.transport import channel as _channel

ALGORITHMS = ("ring", "tree", "direct", "allgather", "auto")
# "fit": the algorithm that fits each codec (ccl.collectives.auto.fitting)
CHOICES = ALGORITHMS + ("fit",)


def _parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().rstrip("b")
    factor = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    return int(float(number) * factor)


def _codec_specs(names):
    specs = []
    for name in names:
        spec = json.loads(name) if name.startswith("{") else name
        specs.append(get_codec(spec))
    return specs


def _timed(comm, fn, reps, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - t0
        times.append(comm.allreduce(elapsed, op=MPI.MAX))
    return float(np.median(times)), out


def run(comm, codecs, algorithms, sizes, reps, warmup, seed=0, progress=None):
    """Run the sweep; return a list of row dicts (identical on every rank)."""
    rows = []
    ch = _channel(comm)
    total = len(sizes) * sum(len(_algorithms_for(c, algorithms)) for c in codecs)
    done = 0
    for nbytes in sizes:
        n = max(nbytes // 4, 1)
        x = np.random.default_rng([seed, comm.rank]).standard_normal(n).astype(np.float32)
        exact = np.empty(n, dtype=np.float64)
        comm.Allreduce(x.astype(np.float64), exact)
        norm = float(np.linalg.norm(exact)) or 1.0

        def mpi_allreduce():
            out = np.empty_like(x)
            comm.Allreduce(x, out)
            return out

        mpi_time, _ = _timed(comm, mpi_allreduce, reps, warmup)
        rows.append(dict(codec="MPI_Allreduce", algorithm="mpi", bytes=4 * n, ranks=comm.size,
                         time_s=mpi_time, speedup=1.0,
                         sent_bytes=2 * (comm.size - 1) * 4 * n // comm.size,
                         rel_error=0.0))
        for codec in codecs:
            for algorithm in _algorithms_for(codec, algorithms):
                def call():
                    return ccl.compressed_allreduce(x, codec, comm=comm, algorithm=algorithm)
                before = ch.bytes_sent
                call()
                sent = ch.bytes_sent - before
                median, y = _timed(comm, call, reps, warmup)
                error = float(np.linalg.norm(y.astype(np.float64) - exact)) / norm
                rows.append(dict(codec=codec.codec_id, algorithm=algorithm, bytes=4 * n,
                                 ranks=comm.size, time_s=median, speedup=mpi_time / median,
                                 sent_bytes=comm.allreduce(sent, op=MPI.MAX),
                                 rel_error=error))
                done += 1
                if progress:
                    progress(done, total)
    return rows


def _algorithms_for(codec, algorithms):
    """``algorithms`` with "fit" replaced by the codec's fitting algorithm, no repeats."""
    out = []
    for name in algorithms:
        name = fitting(codec) if name == "fit" else name
        if name not in out:
            out.append(name)
    return out


def format_table(rows):
    """Rows as an aligned text table."""
    header = (f"{'size':>9} {'codec':>14} {'algorithm':>9} {'time ms':>9} {'vs MPI':>7} "
              f"{'sent/rank':>10} {'rel.err':>9}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{_human(r['bytes']):>9} {r['codec']:>14} {r['algorithm']:>9} "
                     f"{r['time_s'] * 1e3:9.3f} {r['speedup']:6.2f}x "
                     f"{_human(r['sent_bytes']):>10} {r['rel_error']:9.2e}")
    return "\n".join(lines)


def _human(nbytes):
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f}{unit}" if unit == "B" else f"{nbytes:.1f}{unit}"
        nbytes /= 1024


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ccl.bench",
        description="Compressed allreduce against MPI_Allreduce, measured in the same run. "
                    "Run under mpiexec, e.g. mpiexec -n 4 python -m mpi4py -m ccl.bench --quick")
    parser.add_argument("--quick", action="store_true",
                        help="a short sweep (finishes in under a minute at 4 ranks)")
    parser.add_argument("--codecs", nargs="+", default=None,
                        help="codec ids or JSON configs (default: every registered codec)")
    parser.add_argument("--algorithms", nargs="+", default=None, choices=CHOICES,
                        help="algorithms to run; 'fit' is the one that fits each codec "
                             "(default: all; with --quick: fit and auto)")
    parser.add_argument("--sizes", nargs="+", default=None,
                        help="message sizes per rank, e.g. 4KB 1MB 64MB")
    parser.add_argument("--reps", type=int, default=None, help="timed runs per configuration")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--csv", help="write the rows to this CSV file (rank 0)")
    parser.add_argument("--json", help="write the rows to this JSON file (rank 0)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    codec_ids = args.codecs or [c for c in registered_codecs() if not c.startswith("test")]
    codecs = _codec_specs(codec_ids)
    algorithms = args.algorithms or (["fit", "auto"] if args.quick else list(ALGORITHMS))
    sizes = [_parse_size(s) for s in (args.sizes or (["256KB", "4MB"] if args.quick
                                                     else ["4KB", "256KB", "4MB", "64MB"]))]
    reps = args.reps or (3 if args.quick else 10)
    ccl.warmup([c.codec_id for c in codecs])
    rank0 = comm.rank == 0

    def progress(done, total):
        if rank0 and (done % 10 == 0 or done == total):
            print(f"  [{done}/{total}]", flush=True)

    if rank0:
        print(f"ccl.bench: {comm.size} ranks, {MPI.Get_library_version().splitlines()[0]}, "
              f"host {os.uname().nodename}", flush=True)
    t0 = time.perf_counter()
    rows = run(comm, codecs, algorithms, sizes, reps, args.warmup, progress=progress)
    if rank0:
        print(format_table(rows))
        print(f"({time.perf_counter() - t0:.1f} s; time = median of {reps} runs, slowest "
              "rank; 'vs MPI' = MPI_Allreduce time / this time, same data, same run)")
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0
