"""What this machine offers the GPU checks: one JSON line after ``GPU-CHECK-ENV``.

Run by ``tools/gpu_check.py`` (``python3 tools/gpu_probe.py``): package versions,
the GPU as cupy and torch see it, whether numba's CUDA simulator is on, the MPI
library mpi4py loaded (its version string and file) and whether ccl takes it
for CUDA-aware (only that with ``--mpi-only``). Each part records its own error
instead of stopping the rest.
"""

import importlib.metadata
import json
import sys

DISTRIBUTIONS = ("numpy", "numba", "numba-cuda", "cupy-cuda13x", "cupy-cuda12x", "torch",
                 "mpi4py", "mpich", "pytest", "pytest-mpi", "pytest-timeout", "hypothesis")


def numba_info():
    import numba
    from numba import cuda

    return dict(cuda_simulator=bool(numba.config.ENABLE_CUDASIM),
                numba_cuda_available=bool(cuda.is_available()))


def cupy_info():
    import cupy

    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(0)
    return dict(cupy=dict(version=cupy.__version__, runtime=rt.runtimeGetVersion(),
                          driver=rt.driverGetVersion(), devices=rt.getDeviceCount(),
                          device0=props["name"].decode(),
                          capability=f"{props['major']}.{props['minor']}",
                          memory_gib=round(props["totalGlobalMem"] / 2**30, 1)))


def torch_info():
    import torch

    return dict(torch=dict(version=torch.__version__, cuda=torch.version.cuda,
                           cuda_available=torch.cuda.is_available()))


def mpi_info():
    import mpi4py
    from mpi4py import MPI

    from ccl.transport.staging import detect_cuda_aware

    with open("/proc/self/maps", encoding="utf-8") as maps:  # the library files loaded
        libmpi = sorted({line.split()[-1] for line in maps if "libmpi" in line})
    return dict(mpi4py_file=mpi4py.__file__, libmpi=libmpi,
                mpi_library_version=MPI.Get_library_version().strip().splitlines()[0],
                mpi_standard="%d.%d" % MPI.Get_version(), cuda_aware=detect_cuda_aware())


def main(argv):
    info = dict(python=sys.version.split()[0], executable=sys.executable, packages={})
    for dist in DISTRIBUTIONS:
        try:
            info["packages"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    parts = (("numba", numba_info), ("cupy", cupy_info), ("torch", torch_info),
             ("mpi", mpi_info))
    for name, part in parts[-1:] if "--mpi-only" in argv else parts:
        try:
            info.update(part())
        except Exception as exc:  # no GPU, no driver, no libmpi: recorded, not fatal
            info[f"{name}_error"] = repr(exc)
    print("GPU-CHECK-ENV " + json.dumps(info), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
