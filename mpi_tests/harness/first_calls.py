"""A new process' first compressed allreduce calls, and what numba compiled for them.

``python first_calls.py CODEC...`` (under ``mpiexec`` or alone) runs one
``ccl.compressed_allreduce`` per codec (algorithm ``direct``) on a 4 MB float32 array and prints, on
rank 0, one JSON line: seconds from this script's start to the end of each
call, and the cache hits and misses (compilations) of every numba kernel of
ccl that ran.
"""

import time

START = time.perf_counter()

import json  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402
from numba.core.registry import CPUDispatcher  # noqa: E402

import ccl  # noqa: E402


def kernels():
    """Every numba dispatcher defined in a module of ccl, by qualified name."""
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("ccl.") or module is None:
            continue
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher):
                found[f"{name}.{attr}"] = value
    return found


def main(codecs):
    comm = MPI.COMM_WORLD
    x = np.sin(np.arange(1 << 20, dtype=np.float32) + comm.rank)
    seconds = {}
    for codec in codecs:
        # direct: auto could decide to send a small job's data uncompressed, running no kernel
        y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm="direct")
        assert np.isfinite(y).all() and y.shape == x.shape
        seconds[codec] = time.perf_counter() - START
    hits = misses = 0
    for dispatcher in kernels().values():
        stats = dispatcher.stats
        hits += sum(stats.cache_hits.values())
        misses += sum(stats.cache_misses.values())
    counts = comm.gather((hits, misses))
    if comm.rank == 0:
        print(json.dumps({"seconds": seconds, "ranks": comm.size,
                          "hits": [h for h, _ in counts], "misses": [m for _, m in counts]}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["3lc", "thc", "onebit", "sidco"])
