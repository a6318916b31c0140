"""GPU codec throughput: device encode and decode GB/s next to a device-to-device copy.

Run without mpiexec on a machine with a GPU and cupy: ``python -m ccl.bench gpu``.
Each figure is float32 input bytes divided by the median time of ``--reps``
calls after a warm-up call (kernel compilation), timed with CUDA events on
the current stream; the copy is ``cupy.copyto`` of the same array in the
same run. On a machine without a GPU it exits with status 2 and says why.
"""

import argparse
import json
import sys

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


def _median_seconds(cupy, fn, reps):
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


def measure(specs, n, reps, seed=0):
    """Rows of codec, config, encode/decode GB/s and the copy's GB/s in the same run."""
    import cupy

    from ccl.codecs import get_codec

    x = cupy.random.default_rng(seed).standard_normal(n, dtype=cupy.float32)
    dst = cupy.empty_like(x)
    copy_s = _median_seconds(cupy, lambda: cupy.copyto(dst, x), reps)
    rows = []
    for spec in specs:
        codec = get_codec(spec)
        payload = codec.encode(x)
        enc_s = _median_seconds(cupy, lambda: codec.encode(x), reps)
        dec_s = _median_seconds(cupy, lambda: codec.decode(payload), reps)
        rows.append(dict(codec=codec.codec_id, config=codec.get_config(), n=n,
                         encode_gbs=x.nbytes / enc_s / 1e9, decode_gbs=x.nbytes / dec_s / 1e9,
                         copy_gbs=2 * x.nbytes / copy_s / 1e9,
                         bits_per_value=8 * int(payload.size) / n))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench gpu", description=__doc__)
    parser.add_argument("--n", type=int, default=1 << 24, help="float32 elements (default 2^24)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    reason = gpu_missing()
    if reason:
        sys.stderr.write(f"python -m ccl.bench gpu: needs a GPU: {reason}\n")
        return 2
    rows = measure(DEFAULT_SPECS, args.n, args.reps)
    print(f"{'codec':<10} {'encode GB/s':>12} {'decode GB/s':>12} {'copy GB/s':>10} "
          f"{'bits/value':>10}")
    for r in rows:
        print(f"{r['codec']:<10} {r['encode_gbs']:>12.1f} {r['decode_gbs']:>12.1f} "
              f"{r['copy_gbs']:>10.1f} {r['bits_per_value']:>10.3f}")
    print("copy GB/s counts bytes read plus written; codec GB/s count float32 input bytes")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
