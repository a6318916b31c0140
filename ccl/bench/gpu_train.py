"""Training steps on CUDA tensors: ``DistributedOptimizer`` and ``CompressedAdam`` per codec.

Run under MPI on a machine with a GPU, PyTorch and cupy (several ranks may
share one GPU)::

    mpiexec -n 4 python -m mpi4py -m ccl.bench gpu-train --steps 5

Every rank trains the same multilayer perceptron (``--width`` wide, four
linear layers, on random data of its own) on GPU ``local rank % device
count``. One row per configuration: :func:`ccl.torch.DistributedOptimizer`
around SGD with each of ``--codecs`` (``none`` is ``codec=None``, the MPI
library's ``Allreduce``), then :class:`ccl.torch.CompressedAdam` with each of
``--adam-codecs`` past its warm-up, the compressed ones once per algorithm
of ``--algorithm`` (``auto``, the library's default, runs the exact MPI
allreduce when every rank is on one node). ``seconds`` is the median over
``--steps`` steps (forward, backward, ``step()``, device synchronised) of
the slowest rank, after ``--warmup`` untimed steps; ``vs_none`` divides the
``DistributedOptimizer`` ``codec=None`` step time by the row's (above 1:
faster). ``identical`` says whether the weights are bitwise the same on every
rank afterwards.

``--simulate`` trains on CPU tensors taken down the device code paths under
numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``): its figures mean
nothing, it lets tests run the benchmark end to end without a GPU.
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

from ccl._xp import simulated_device
from ccl.bench.gpu import gpu_missing, simulator_missing, write_rows

__all__ = ["measure", "main"]

#: The word for ``codec=None`` (the MPI library's allreduce) in ``--codecs``: not the
#: ``none`` codec.
NO_CODEC = "none"


def _device(comm, simulate):
    """The torch device to train on, and the context the run happens in."""
    import torch

    if simulate:
        return torch.device("cpu"), simulated_device()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    index = local.Get_rank() % torch.cuda.device_count()
    local.Free()
    torch.cuda.set_device(index)
    return torch.device("cuda", index), contextlib.nullcontext()


def _model(width, device):
    import torch

    torch.manual_seed(0)  # the same initial weights on every rank
    layers = []
    for _ in range(3):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)).to(device)


def _optimizer(kind, codec, algorithm, model, args):
    import torch

    import ccl.torch as ct

    named = model.named_parameters()
    options = dict(named_parameters=named, codec=codec, algorithm=algorithm)
    if args.min_compress_bytes is not None:
        options["min_compress_bytes"] = args.min_compress_bytes
    if kind == "DistributedOptimizer":
        sgd = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        return ct.DistributedOptimizer(sgd, **options)
    return ct.CompressedAdam(model.parameters(), lr=1e-4, warmup_steps=args.warmup, **options)


def _run(comm, kind, codec, algorithm, device, args):
    """Median seconds per step (slowest rank), parameters, and whether replicas are identical."""
    import torch

    model = _model(args.width, device)
    optimizer = _optimizer(kind, codec, algorithm, model, args)
    gen = torch.Generator(device=device).manual_seed(1 + comm.rank)
    data = torch.randn(args.batch, args.width, device=device, generator=gen)
    target = torch.randn(args.batch, 1, device=device, generator=gen)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for step in range(args.warmup + args.steps):
        sync()
        comm.Barrier()
        t0 = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(data), target).backward()
        optimizer.step()
        sync()
        elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if step >= args.warmup:
            times.append(elapsed)
    weights = torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().numpy()
    crcs = comm.allgather(zlib.crc32(np.ascontiguousarray(weights).view(np.uint8)))
    times.sort()
    return times[len(times) // 2], weights.size, len(set(crcs)) == 1


def measure(comm, args):
    """Rows of optimizer, codec, seconds per step, ``vs_none`` and ``identical``, as measured.

    A generator: each row comes as soon as it is measured, ``codec=None``
    first (the others are compared with it).
    """
    import ccl.torch as ct

    device, context = _device(comm, args.simulate)
    algorithms = args.algorithm if isinstance(args.algorithm, list) else [args.algorithm]
    configs = [("DistributedOptimizer", NO_CODEC, None)] if NO_CODEC in args.codecs else []
    configs += [(kind, c, a) for a in algorithms
                for kind, codecs in (("DistributedOptimizer", args.codecs),
                                     ("CompressedAdam", args.adam_codecs))
                for c in codecs if c != NO_CODEC]
    ct.init(comm)
    base = None
    try:
        with context:
            for kind, name, algorithm in configs:
                codec = None if name == NO_CODEC else (
                    json.loads(name) if name.startswith("{") else name)
                seconds, params, identical = _run(comm, kind, codec, algorithm, device, args)
                if kind == "DistributedOptimizer" and codec is None:
                    base = seconds
                yield dict(optimizer=kind, codec=name, algorithm=algorithm or "", ranks=comm.size,
                           device=str(device), params=params, seconds=seconds,
                           identical=identical,
                           vs_none=None if base is None else base / seconds)
    finally:
        ct.shutdown()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench gpu-train", description=__doc__)
    parser.add_argument("--codecs", nargs="+", default=["none", "fp16", "onebit", "3lc", "topk"],
                        help="DistributedOptimizer codecs (none: codec=None)")
    parser.add_argument("--adam-codecs", nargs="+", default=["onebit"],
                        help="CompressedAdam codecs")
    parser.add_argument("--algorithm", nargs="+", default=["ring"],
                        help="algorithms of compressed buckets, a row each (default ring: "
                             "auto runs exact inside a node)")
    parser.add_argument("--width", type=int, default=2048,
                        help="hidden width (4 layers, about 3 x width^2 parameters)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps first (also CompressedAdam's warmup_steps)")
    parser.add_argument("--min-compress-bytes", type=int, default=None,
                        help="smaller parameters travel uncompressed (default: the library's)")
    parser.add_argument("--simulate", action="store_true",
                        help="CPU tensors under the CUDA simulator (tests; no real timing)")
    parser.add_argument("--json", help="write the rows to this file (rank 0)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    reason = simulator_missing() if args.simulate else gpu_missing()
    if reason is None and not args.simulate:
        import torch

        if not torch.cuda.is_available():
            reason = "torch sees no CUDA device"
    if reason:
        if comm.rank == 0:
            need = "the simulator" if args.simulate else "a GPU"
            sys.stderr.write(f"python -m ccl.bench gpu-train: needs {need}: {reason}\n")
        return 2
    if args.simulate:  # the simulator's integer arithmetic wraps with warnings
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    rows = []
    for r in measure(comm, args):
        rows.append(r)
        if comm.rank != 0:
            continue
        if len(rows) == 1:
            print(f"{comm.size} ranks on {r['device']}, {r['params']} parameters; "
                  f"vs none: the codec=None step time / this one")
            print(f"{'optimizer':<21} {'codec':<10} {'algorithm':<9} {'ms/step':>9} "
                  f"{'vs none':>8} identical")
        vs = "" if r["vs_none"] is None else f"{r['vs_none']:.2f}"
        print(f"{r['optimizer']:<21} {r['codec']:<10} {r['algorithm']:<9} "
              f"{1e3 * r['seconds']:>9.2f} {vs:>8} {r['identical']}", flush=True)
        if args.json:  # after every row: a run stopped early keeps what it measured
            write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
