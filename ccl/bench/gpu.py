"""GPU codec throughput: device encode and decode GB/s next to a device-to-device copy.

Run without mpiexec on a machine with a GPU and cupy: ``python -m ccl.bench gpu``
(``--sizes 64MB 256MB 1GB`` for several input sizes). Each figure is float32
input bytes divided by the median time of ``--reps`` calls after a warm-up
call (kernel compilation), timed with CUDA events on the current stream; the
copy is ``cupy.copyto`` of the same array in the same run. On a machine
without a GPU it exits with status 2 and says why.

``--simulate`` runs the same loop on numpy arrays taken down the device code
paths under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), timed with
the host clock: its figures mean nothing, it exists so that tests can run
the benchmark end to end without a GPU.
"""

import argparse
import contextlib
import json
import os
import sys
import time
import warnings

DEFAULT_SPECS = ["fp16", "bf16", "onebit", {"id": "randomk", "density": 0.01},
                 {"id": "3lc", "s": 1.5}, {"id": "thc", "bits": 4},
                 {"id": "dithering", "levels": 127}, {"id": "topk", "density": 0.01},
                 {"id": "dgc", "density": 0.01}, {"id": "sidco", "density": 0.01}, "none"]


def gpu_missing():
    """Why this machine cannot run the benchmark, or None."""
    try:
        import cupy
    except ImportError:
        return "cupy is not installed (pip install '.[gpu]')"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device is visible"
    except Exception as exc:  # cupy's CUDARuntimeError when there is no driver
        return f"no usable CUDA device ({exc})"
    import numba

    if numba.config.ENABLE_CUDASIM:
        return "NUMBA_ENABLE_CUDASIM=1 is set: unset it to time real kernels"
    return None


def parse_size(text):
    """Bytes from ``"64MB"``, ``"1GB"``, ``"4k"`` or a plain number (powers of 1024)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().rstrip("b")
    factor = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    return int(float(number) * factor)


def write_rows(path, rows):
    """Write ``rows`` to the JSON file ``path`` whole (a new file replaces the old one)."""
    with open(path + ".part", "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    os.replace(path + ".part", path)


def simulator_missing():
    """Why ``--simulate`` cannot run here (the simulator is off), or None."""
    import numba

    if not numba.config.ENABLE_CUDASIM:
        return "--simulate needs NUMBA_ENABLE_CUDASIM=1 in the environment"
    return None


def _host_median_seconds(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def _median_seconds(cupy, fn, reps):
    if cupy is None:  # --simulate: host arrays, host clock
        return _host_median_seconds(fn, reps)
    fn()  # compile and warm up
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    times.sort()
    return times[len(times) // 2]


def measure(specs, n, reps, seed=0, simulate=False):
    """Rows of codec, config, encode/decode GB/s and the copy's GB/s in the same run.

    ``simulate=True`` takes numpy arrays down the device paths (numba's CUDA
    simulator must be on) and times them with the host clock.
    """
    from ccl._xp import simulated_device
    from ccl.codecs import get_codec

    if simulate:
        import numpy as xp

        cupy, context = None, simulated_device()
    else:
        import cupy

        xp, context = cupy, contextlib.nullcontext()
    x = xp.random.default_rng(seed).standard_normal(n, dtype=xp.float32)
    dst = xp.empty_like(x)
    with context:
        copy_s = _median_seconds(cupy, lambda: xp.copyto(dst, x), reps)
        return [_row(cupy, get_codec(spec), x, copy_s, reps) for spec in specs]


def _row(cupy, codec, x, copy_s, reps):
    from ccl.codecs import CodecContext

    payload = codec.encode(x)
    # the receiver's count, as a collective passes it: decoders refuse to allocate what a
    # payload claims past a limit (1 GB of float32 is past it) unless told what to expect
    expect = CodecContext(n=x.size)
    enc_s = _median_seconds(cupy, lambda: codec.encode(x), reps)
    dec_s = _median_seconds(cupy, lambda: codec.decode(payload, expect), reps)
    return dict(codec=codec.codec_id, config=codec.get_config(), n=x.size, bytes=x.nbytes,
                encode_gbs=x.nbytes / enc_s / 1e9, decode_gbs=x.nbytes / dec_s / 1e9,
                copy_gbs=2 * x.nbytes / copy_s / 1e9,
                bits_per_value=8 * int(payload.size) / x.size)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench gpu", description=__doc__)
    parser.add_argument("--n", type=int, default=1 << 24, help="float32 elements (default 2^24)")
    parser.add_argument("--sizes", nargs="+", default=None,
                        help="input sizes in bytes (64MB 1GB ...): one table each, instead of --n")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--codecs", nargs="+", default=None,
                        help="codec names or JSON specs (default: every codec)")
    parser.add_argument("--simulate", action="store_true",
                        help="numpy arrays under the CUDA simulator (tests; no real timing)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    reason = simulator_missing() if args.simulate else gpu_missing()
    if reason:
        need = "the simulator" if args.simulate else "a GPU"
        sys.stderr.write(f"python -m ccl.bench gpu: needs {need}: {reason}\n")
        return 2
    if args.simulate:  # the simulator's integer arithmetic wraps with warnings
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    specs = DEFAULT_SPECS if args.codecs is None else [
        json.loads(c) if c.startswith("{") else c for c in args.codecs]
    sizes = [args.n] if args.sizes is None else [parse_size(s) // 4 for s in args.sizes]
    rows = []
    for n in sizes:
        table = measure(specs, n, args.reps, simulate=args.simulate)
        rows.extend(table)
        if args.json:  # after every size: a run stopped early keeps what it measured
            write_rows(args.json, rows)
        print(f"float32 input of {4 * n / 2**20:.0f} MiB ({n} values)")
        print(f"{'codec':<10} {'encode GB/s':>12} {'decode GB/s':>12} {'copy GB/s':>10} "
              f"{'bits/value':>10}")
        for r in table:
            print(f"{r['codec']:<10} {r['encode_gbs']:>12.1f} {r['decode_gbs']:>12.1f} "
                  f"{r['copy_gbs']:>10.1f} {r['bits_per_value']:>10.3f}", flush=True)
    print("copy GB/s counts bytes read plus written; codec GB/s count float32 input bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
