#!/usr/bin/env python3
"""Where device encodes and GPU training steps spend their time, on a real GPU.

``python3 tools/gpu_profile.py codecs --size 256MB`` times each stage of every
codec's device encode and decode: each numba.cuda kernel launch, each host
round trip (``to_host``, ``upload``), the finiteness check and the payload
packing, every one bracketed by a device synchronisation so that its time is
its own. The per-call total (no synchronisation inside) is printed beside
them, so the gaps between stages show too.

``mpiexec -n 4 python3 -m mpi4py tools/gpu_profile.py train --codecs none onebit``
profiles ``ccl.bench gpu-train`` steps with cProfile, in the main thread
and in ccl.torch's communication thread (one profile for both from Python
3.12 on), and prints the top functions of rank 0 by own time and by
cumulative time.

Both are diagnostics for a GPU machine; neither runs in ``make test``.
"""

import argparse
import collections
import contextlib
import cProfile
import io
import pstats
import sys
import time


class StageTimer:
    """Seconds per stage name, each stage bracketed by device synchronisations."""

    def __init__(self, sync):
        self.sync = sync
        self.seconds = collections.defaultdict(float)
        self.calls = collections.Counter()

    @contextlib.contextmanager
    def stage(self, name):
        self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[name] += time.perf_counter() - t0
            self.calls[name] += 1

    def wrap(self, owner, attr, name=None):
        original = getattr(owner, attr)

        def timed(*args, **kwargs):
            label = name or attr
            if label == "launch":
                kernel = getattr(args[1], "py_func", args[1])
                label = f"kernel {getattr(kernel, '__name__', kernel)}"
            with self.stage(label):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)

    def reset(self):
        self.seconds.clear()
        self.calls.clear()


def codecs(args):
    from ccl import _xp
    from ccl.codecs import _cuda_common, context, device

    if args.simulate:
        import numpy as xp

        sync, backend, scope = (lambda: None), _xp.SIMULATED, _xp.simulated_device()
    else:
        import cupy as xp

        sync, backend = xp.cuda.Device().synchronize, _xp._cupy_backend()
        scope = contextlib.nullcontext()
    with scope:
        _profile_codecs(args, xp, sync, backend, _cuda_common, context, device)


def _profile_codecs(args, xp, sync, backend, _cuda_common, context, device):
    from ccl.bench.gpu import DEFAULT_SPECS, parse_size
    from ccl.codecs import CodecContext, get_codec

    timer = StageTimer(sync)
    # before any twin is imported: they bind these names at import
    timer.wrap(_cuda_common, "launch")
    timer.wrap(_cuda_common, "ordered_total")
    timer.wrap(device, "all_finite", "all_finite")
    timer.wrap(device, "pack", "pack")
    timer.wrap(context, "all_finite", "all_finite")
    for attr in ("to_host", "upload", "to_device"):
        timer.wrap(backend, attr)
    n = parse_size(args.size) // 4
    x = xp.random.default_rng(0).standard_normal(n, dtype=xp.float32)
    expect = CodecContext(n=n)
    for spec in DEFAULT_SPECS:
        codec = get_codec(spec)
        payload = codec.encode(x)
        codec.decode(payload, expect)
        calls = (("encode", lambda c=codec: c.encode(x)),
                 ("decode", lambda c=codec, p=payload: c.decode(p, expect)))
        for what, call in calls:
            sync()
            t0 = time.perf_counter()
            call()
            sync()
            plain = time.perf_counter() - t0
            timer.reset()
            with timer.stage("total (stages timed)"):
                call()
            print(f"{codec.codec_id} {what}: {1e3 * plain:.3f} ms untimed "
                  f"({x.nbytes / plain / 1e9:.1f} GB/s)")
            for name, s in sorted(timer.seconds.items(), key=lambda kv: -kv[1]):
                print(f"    {1e3 * s:9.3f} ms  {timer.calls[name]:4d}x  {name}")
        sys.stdout.flush()


def train(args):
    from mpi4py import MPI

    from ccl.bench import gpu_train
    from ccl.torch import engine

    profiles = []
    serve = engine.Engine.serve

    def profiled_serve(self, jobs):
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        try:
            serve(self, jobs)
        finally:
            prof.disable()

    # From Python 3.12 one cProfile profiler sees every thread (it is built on sys.monitoring,
    # which allows one at a time): the communication thread's calls are then in the main
    # thread's profile. Before 3.12 each thread needs its own.
    if sys.version_info < (3, 12):
        engine.Engine.serve = profiled_serve
    comm = MPI.COMM_WORLD
    bench_args = argparse.Namespace(
        codecs=args.codecs, adam_codecs=[], algorithm=[args.algorithm], width=args.width,
        batch=256, steps=args.steps, warmup=2, min_compress_bytes=None, simulate=args.simulate,
        json=None)
    for codec in args.codecs:
        bench_args.codecs = [codec]
        main_prof = cProfile.Profile()
        profiles.clear()
        main_prof.enable()
        rows = list(gpu_train.measure(comm, bench_args))
        main_prof.disable()
        if comm.rank == 0:
            print(f"== {codec}: {1e3 * rows[0]['seconds']:.2f} ms per step")
            for label, prof in [("main thread", main_prof)] + [
                    (f"communication thread {i}", p) for i, p in enumerate(profiles)]:
                out = io.StringIO()
                stats = pstats.Stats(prof, stream=out)
                stats.sort_stats("tottime").print_stats(18)
                stats.sort_stats("cumulative").print_stats(22)
                print(f"-- {label}\n" + "\n".join(
                    line[:160] for line in out.getvalue().splitlines() if line.strip()))
            sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tools/gpu_profile.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("codecs")
    p.add_argument("--size", default="256MB")
    p.add_argument("--simulate", action="store_true", help="numpy arrays, CUDA simulator (tests)")
    p = sub.add_parser("train")
    p.add_argument("--codecs", nargs="+", default=["none", "onebit"])
    p.add_argument("--algorithm", default="ring")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--simulate", action="store_true", help="CPU tensors, CUDA simulator (tests)")
    args = parser.parse_args(argv)
    return codecs(args) if args.what == "codecs" else train(args)


if __name__ == "__main__":
    sys.exit(main())
