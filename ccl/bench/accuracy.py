"""Accuracy of compressed allreduce: one call, and a 100-step running sum with error feedback.

Run under mpiexec: ``mpiexec -n 4 python -m mpi4py -m ccl.bench accuracy``.
For each codec x algorithm: the normalised error ``||y - s|| / ||s||`` of one
allreduce of fresh data (``s`` the exact float64 sum), and of the running sum
of 100 steps with error feedback (``key=...``) against the exact running sum,
plus the payload bits per value each rank sent.
"""

import argparse
import json

import numpy as np
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.transport import channel as _channel

ALGORITHMS = ("ring", "tree", "direct", "allgather")


def _inputs(comm, n, step, data):
    rng = np.random.default_rng([7, step, comm.rank])
    if data == "laplace":  # heavier tails, closer to gradients than a normal
        return rng.laplace(size=n).astype(np.float32)
    return rng.standard_normal(n).astype(np.float32)


def measure(comm, specs, algorithms, n, steps, data="normal"):
    """Return rows (identical on every rank)."""
    rows = []
    ch = _channel(comm)
    for spec in specs:
        codec = get_codec(spec)
        for algorithm in algorithms:
            x = _inputs(comm, n, 0, data)
            exact = np.empty(n)
            comm.Allreduce(x.astype(np.float64), exact)
            before = ch.bytes_sent
            y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm=algorithm)
            sent = comm.allreduce(ch.bytes_sent - before, op=MPI.MAX)
            single = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
            c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0)
            run, run_exact = np.zeros(n), np.zeros(n)
            for step in range(steps):
                x = _inputs(comm, n, step + 1, data)
                step_exact = np.empty(n)
                comm.Allreduce(x.astype(np.float64), step_exact)
                run += c.allreduce(x, key="bench")
                run_exact += step_exact
            running = float(np.linalg.norm(run - run_exact) / np.linalg.norm(run_exact))
            rows.append(dict(codec=codec.codec_id, config=codec.get_config(),
                             algorithm=algorithm, ranks=comm.size, n=n, data=data,
                             single_error=single, running_error=running, steps=steps,
                             sent_bits_per_value=8 * sent / n))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench accuracy",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=None)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                        choices=ALGORITHMS)
    parser.add_argument("--elements", type=int, default=1 << 16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--data", choices=("normal", "laplace"), default="normal")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    specs = [json.loads(s) if s.startswith("{") else s for s in
             (args.codecs or [c for c in registered_codecs() if not c.startswith("test")])]
    rows = measure(comm, specs, args.algorithms, args.elements, args.steps, args.data)
    if comm.rank == 0:
        print(f"{'codec':>10} {'algorithm':>9} {'1-call err':>10} {'100-step err':>12} "
              f"{'sent bits/val':>13}  config")
        for r in rows:
            print(f"{r['codec']:>10} {r['algorithm']:>9} {r['single_error']:10.2e} "
                  f"{r['running_error']:12.2e} {r['sent_bits_per_value']:13.3f}  "
                  f"{json.dumps(r['config'])}")
        print(f"({comm.size} ranks, {args.elements} elements of {args.data} data; error = "
              f"||result - exact|| / ||exact||; running error over {args.steps} steps with "
              "error feedback)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0
