"""Codec throughput: single-core encode and decode GB/s next to a memcpy-class copy.

Run without mpiexec: ``python -m ccl.bench codecs``. Kernels run on one numba
thread (``--threads`` changes it), so the figures are per core. Throughput is float32
input bytes divided by the median time.
"""

import argparse
import json
import time


def _median_time(fn, reps):
    import numpy as np

    fn()  # compile / warm caches
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure(specs, n, reps, seed=0):
    """Return rows: codec, config, encode/decode GB/s, copy GB/s, bits per value."""
    import numpy as np

    from ccl.codecs import get_codec

    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    dst = np.empty_like(x)
    copy_s = _median_time(lambda: np.copyto(dst, x), reps)
    rows = []
    for spec in specs:
        codec = get_codec(spec)
        payload = codec.encode(x)
        enc_s = _median_time(lambda codec=codec: codec.encode(x), reps)
        dec_s = _median_time(lambda codec=codec, payload=payload: codec.decode(payload), reps)
        rows.append(dict(codec=codec.codec_id, config=codec.get_config(), n=n,
                         encode_gbs=x.nbytes / enc_s / 1e9, decode_gbs=x.nbytes / dec_s / 1e9,
                         copy_gbs=x.nbytes / copy_s / 1e9,
                         bits_per_value=8 * payload.size / max(n, 1)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench codecs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=None,
                        help="codec ids or JSON configs (default: every registered codec)")
    parser.add_argument("--elements", type=int, default=16 * 2**20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="numba threads (default 1)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    from ccl.codecs import registered_codecs

    from . import numba_threads

    specs = [json.loads(s) if s.startswith("{") else s for s in
             (args.codecs or [c for c in registered_codecs() if not c.startswith("test")])]
    with numba_threads(args.threads) as threads:
        rows = measure(specs, args.elements, args.reps)
    for r in rows:
        r["threads"] = threads
    print(f"{'codec':>10} {'encode GB/s':>12} {'decode GB/s':>12} {'copy GB/s':>10} "
          f"{'bits/value':>10}  config")
    for r in rows:
        print(f"{r['codec']:>10} {r['encode_gbs']:12.2f} {r['decode_gbs']:12.2f} "
              f"{r['copy_gbs']:10.2f} {r['bits_per_value']:10.3f}  {json.dumps(r['config'])}")
    print(f"({args.elements} float32 elements, median of {args.reps}, "
          f"{threads} numba thread(s); copy = np.copyto of the same input)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
