"""A compressed allreduce of CuPy arrays: each rank's GPU data, averaged with onebit.

Run on a machine with GPUs, cupy installed (``pip install '.[gpu]'``)::

    mpiexec -n 4 python -m mpi4py examples/gpu_allreduce.py
"""

import cupy as cp
from mpi4py import MPI

import ccl

comm = MPI.COMM_WORLD
local_rank = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
cp.cuda.Device(local_rank % cp.cuda.runtime.getDeviceCount()).use()  # one GPU per rank
grad = cp.random.standard_normal(1 << 24, dtype=cp.float32)
avg = ccl.compressed_allreduce(grad, "onebit", comm=comm, op="mean", key="layer1")
assert isinstance(avg, cp.ndarray)                  # the result stays on the device
if comm.rank == 0:
    print(f"onebit allreduce of CuPy arrays on {comm.size} ranks: {avg.size} values")
