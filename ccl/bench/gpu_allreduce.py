"""Compressed allreduce of device arrays against ``MPI_Allreduce`` of the same arrays.

Run under MPI on a machine with a GPU and cupy (several ranks may share one GPU)::

    mpiexec -n 4 python -m mpi4py -m ccl.bench gpu-allreduce --sizes 64MB 256MB

Each rank takes GPU ``local rank % device count`` and a float32 cupy array of
each size. Per size, in one run:

- ``mpi-staged``: ``MPI_Allreduce`` through host staging, as a program without
  a CUDA-aware MPI does it: device to page-locked host memory, ``MPI_Allreduce``
  in place, back to the device;
- ``mpi-device``: ``MPI_Allreduce`` on the device buffers themselves, only
  where the MPI library is CUDA-aware (:func:`ccl.transport.staging.cuda_aware`);
- ``ccl``: :func:`ccl.compressed_allreduce` with each codec and algorithm
  (device kernels; the payloads staged or handed over as the library allows).

Each time is the median over ``--reps`` calls, after ``--warmup`` untimed ones
(kernel compilation), of the slowest rank's wall time, the device synchronised
before the clock stops. ``identical`` says whether the last result is bitwise
the same on every rank (a CRC-32 of its bytes, gathered).

``--simulate`` takes numpy arrays down the same device paths under numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``): its figures mean nothing, it lets
tests run the benchmark end to end without a GPU.
"""

import argparse
import contextlib
import json
import sys
import time
import warnings
import zlib

import numpy as np
from mpi4py import MPI

import ccl
from ccl.transport.staging import cuda_aware
from ccl._xp import backend_of, simulated_device, to_numpy
from ccl.codecs import get_codec
from ccl.bench.gpu import (DEFAULT_SPECS, gpu_missing, parse_size, simulator_missing,
                           write_rows)

__all__ = ["measure", "main"]


def _device_setup(comm, simulate):
    """The array module to allocate with, and the context the run happens in."""
    if simulate:
        return np, simulated_device()
    import cupy

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    cupy.cuda.Device(local.Get_rank() % cupy.cuda.runtime.getDeviceCount()).use()
    local.Free()
    return cupy, contextlib.nullcontext()


def _timed(comm, backend, fn, reps, warmup):
    for _ in range(warmup):
        fn()
    backend.synchronize()
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        out = fn()
        backend.synchronize()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    times.sort()
    return times[len(times) // 2], out


def _identical(comm, out):
    crc = zlib.crc32(np.ascontiguousarray(to_numpy(out)).view(np.uint8))
    return len(set(comm.allgather(crc))) == 1


def _mpi_rows(comm, backend, x, reps, warmup):
    """``MPI_Allreduce`` staged through pinned host memory, and on the device if it can."""
    host = backend.pinned_empty(x.nbytes).view(np.float32)
    out = backend.xp.empty_like(x)

    def staged():
        backend.download(x, host)
        comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
        backend.upload(out, host)
        return out

    seconds, result = _timed(comm, backend, staged, reps, warmup)
    rows = [dict(method="mpi-staged", seconds=seconds, identical=_identical(comm, result))]
    if cuda_aware():
        def on_device():
            backend.synchronize()  # MPI cannot see the stream that wrote x
            comm.Allreduce(x, out, op=MPI.SUM)
            return out

        seconds, result = _timed(comm, backend, on_device, reps, warmup)
        rows.append(dict(method="mpi-device", seconds=seconds,
                         identical=_identical(comm, result)))
    return rows


def measure(comm, specs, sizes, algorithms, reps, warmup, simulate=False):
    """Rows of method, codec, algorithm, bytes, seconds, speedup and ``identical``, as measured.

    A generator: each row comes as soon as it is measured. ``speedup`` is the
    ``mpi-staged`` time of the same size over the row's time.
    """
    xp, context = _device_setup(comm, simulate)
    with context:
        for nbytes in sizes:
            n = nbytes // 4
            x = xp.random.default_rng(comm.rank).standard_normal(n, dtype=xp.float32)
            backend = backend_of(x)
            base = dict(ranks=comm.size, bytes=4 * n, cuda_aware=cuda_aware(),
                        codec=None, algorithm="mpi")
            mpi = _mpi_rows(comm, backend, x, reps, warmup)
            staged = mpi[0]["seconds"]
            for row in mpi:
                yield dict(base, **row, speedup=staged / row["seconds"])
            for spec in specs:
                for algorithm in algorithms:
                    def call(spec=spec, algorithm=algorithm, x=x):
                        return ccl.compressed_allreduce(x, spec, comm=comm, algorithm=algorithm)

                    seconds, out = _timed(comm, backend, call, reps, warmup)
                    codec = get_codec(spec)
                    yield dict(base, method="ccl", codec=codec.codec_id,
                               config=codec.get_config(), algorithm=algorithm, seconds=seconds,
                               speedup=staged / seconds, identical=_identical(comm, out))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench gpu-allreduce",
                                     description=__doc__)
    parser.add_argument("--sizes", nargs="+", default=["64MB", "256MB"],
                        help="bytes of float32 data per rank (default 64MB 256MB)")
    parser.add_argument("--codecs", nargs="+", default=None,
                        help="codec names or JSON specs (default: every codec)")
    parser.add_argument("--algorithms", nargs="+", default=["ring"],
                        help="ccl algorithms (default ring; auto runs exact inside a node)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--simulate", action="store_true",
                        help="numpy arrays under the CUDA simulator (tests; no real timing)")
    parser.add_argument("--json", help="write the rows to this file (rank 0)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    reason = simulator_missing() if args.simulate else gpu_missing()
    if reason:
        if comm.rank == 0:
            need = "the simulator" if args.simulate else "a GPU"
            sys.stderr.write(f"python -m ccl.bench gpu-allreduce: needs {need}: {reason}\n")
        return 2
    if args.simulate:  # the simulator's integer arithmetic wraps with warnings
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    specs = DEFAULT_SPECS if args.codecs is None else [
        json.loads(c) if c.startswith("{") else c for c in args.codecs]
    rows = []
    if comm.rank == 0:
        print(f"{comm.size} ranks; speedup over MPI_Allreduce through host staging")
        print(f"{'MiB':>6} {'method':<11} {'codec':<10} {'algorithm':<10} {'ms':>9} "
              f"{'speedup':>8} identical", flush=True)
    for r in measure(comm, specs, [parse_size(s) for s in args.sizes], args.algorithms,
                     args.reps, args.warmup, simulate=args.simulate):
        rows.append(r)
        if comm.rank == 0:
            print(f"{r['bytes'] / 2**20:>6.0f} {r['method']:<11} {str(r['codec']):<10} "
                  f"{r['algorithm']:<10} {1e3 * r['seconds']:>9.2f} {r['speedup']:>8.2f} "
                  f"{r['identical']}", flush=True)
            if args.json:  # after every row: a run stopped early keeps what it measured
                write_rows(args.json, rows)
    if comm.rank == 0 and rows:
        print(f"CUDA-aware MPI: {rows[0]['cuda_aware']} (mpi-device rows only where it is)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
