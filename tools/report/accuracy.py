"""The report's accuracy sections: one call and 100 steps, real gradients, THC per bits setting.

Errors are ``||result - exact|| / ||exact||``; bits are what the codecs put
on the wire per value.
"""

import json
import os
import subprocess
import sys

from .runs import MPIEXEC, benchmark_env, run_benchmark
from .tables import config_label, table

__all__ = ["THC_BITS", "THC_RANKS", "THC_VARIANTS", "accuracy_section", "gradients_section",
           "thc_section"]

# THC section: bits settings, rank counts, and the decode-and-re-encode variants
THC_BITS = (2, 3, 4)
THC_RANKS = (2, 3, 4, 5)
THC_VARIANTS = ((None, "homomorphic"), ("own", "re-encode, own norm"),
                ("agreed", "re-encode, agreed norm"))


def accuracy_section(args, tmp, log):
    """Error of one allreduce, and of a running sum with error feedback, per algorithm.

    Uses ``args.ranks`` and ``args.quick``; arguments and result as every section's (see
    :mod:`tools.report`).
    """
    rows, cmd = run_benchmark([MPIEXEC, "-n", str(args.ranks), sys.executable, "-m", "mpi4py",
                               "-m", "ccl.bench", "accuracy",
                               "--steps", "20" if args.quick else "100"],
                              os.path.join(tmp, "accuracy.json"), log)
    return ("Accuracy: one allreduce, and a running sum with error feedback", cmd,
            "Normalised error `||result - exact|| / ||exact||` of one allreduce of "
            "fresh normal data, and of the running sum over the steps with error "
            "feedback (a key), per algorithm; bits sent per value and rank.",
            table(rows, [("codec", config_label), ("algorithm", lambda r: r["algorithm"]),
                         ("1 call", lambda r: f"{r['single_error']:.2e}"),
                         (f"{rows[0]['steps']} steps with EF",
                          lambda r: f"{r['running_error']:.2e}"),
                         ("bits/value sent", lambda r: f"{r['sent_bits_per_value']:.3f}")]),
            None)


def gradients_section(args, tmp, log):
    """Codecs on the real per-layer gradients of an MLP (needs torch).

    Uses ``args.quick``; arguments and result as every section's (see
    :mod:`tools.report`).
    """
    rows, cmd = run_benchmark([sys.executable, "-m", "ccl.bench", "gradients", "--steps",
                               "40" if args.quick else "200"],
                              os.path.join(tmp, "gradients.json"), log)
    return ("Real gradients (MLP on scikit-learn digits)", cmd,
            "Each layer's gradient compressed at every SGD step with its own "
            "error-feedback residual; steady state is the second half of the "
            "steps. `kept` is the fraction of values a codec delivered non-zero.",
            table(rows, [("codec", config_label),
                         ("bits/value", lambda r: f"{r['bits_per_value']:.3f}"),
                         ("ratio vs fp32", lambda r: f"{r['ratio']:.1f}x"),
                         ("kept", lambda r: f"{r['kept_fraction']:.4f}"),
                         ("running error", lambda r: f"{r['running_error']:.2e}")]),
            None)


def thc_section(args, tmp, log):
    """THC's error per bits setting at 2-5 ranks: homomorphic ring against decode and re-encode.

    Uses ``args.quick``; arguments and result as every section's (see
    :mod:`tools.report`).
    """
    py = sys.executable
    # Every rank of every run would compile THC's kernels again (seconds each on a
    # loaded machine); one warm-up process fills a cache that the runs then read.
    cache = {"CCL_NUMBA_CACHE": "1", "NUMBA_CACHE_DIR": os.path.join(tmp, "numba-cache")}
    subprocess.run([py, "-c", "import ccl; ccl.warmup(['thc', 'none'])"], check=True,
                   env=benchmark_env(cache), stdout=log, stderr=log)
    elements, steps = ("16384", "10") if args.quick else ("65536", "100")
    specs = [json.dumps({"id": "thc", "bits": b}, separators=(",", ":")) for b in THC_BITS]
    flags = {None: [], "own": ["--decode-reencode"], "agreed": ["--decode-reencode", "agreed"]}
    found, cmds = {}, []
    for ranks in THC_RANKS:
        for variant, _ in THC_VARIANTS:
            # fp32 (`none`) once per rank count, for the bytes it puts on the wire
            codecs = specs + (["none"] if variant is None else [])
            rows, cmd = run_benchmark([MPIEXEC, "-n", str(ranks), py, "-m", "mpi4py", "-m",
                                       "ccl.bench", "accuracy", "--codecs", *codecs,
                                       "--algorithms", "ring", "--elements", elements,
                                       "--steps", steps, *flags[variant]],
                                      os.path.join(tmp, "thc.json"), log, extra_env=cache)
            cmds.append(cmd)
            for r in rows:
                found[r["ranks"], r["config"].get("bits"), variant] = r
    table_rows = [dict(bits=bits, ranks=ranks, fp32=found[ranks, None, None],
                       **{str(v): found[ranks, bits, v] for v, _ in THC_VARIANTS})
                  for bits in THC_BITS for ranks in THC_RANKS]

    def sent(key):
        return lambda r: (f"{r[key]['sent_bits_per_value']:.2f} "
                          f"({r[key]['sent_bytes'] / 1024:.1f} KB)")

    columns = [("bits", lambda r: str(r["bits"])), ("ranks", lambda r: str(r["ranks"]))]
    for field, label in (("single_error", "1 call"), ("running_error", f"{steps} steps, EF")):
        columns += [(f"{label}: {name}", lambda r, v=str(v), f=field: f"{r[v][f]:.2e}")
                    for v, name in THC_VARIANTS]
    columns += [("sent bits/value (per rank): homomorphic", sent("None")),
                ("re-encode", sent("own")), ("fp32 ring (`none`)", sent("fp32"))]
    text = (f"`thc` with 2, 3 and 4 bits (other parameters default) in a ring allreduce of "
            f"{elements} standard-normal float32 values per rank, at 2 to 5 ranks. "
            "*homomorphic*: relays add payloads in integer lanes, the only lossy point is "
            "each rank's own encode. *re-encode*: the same codec run with `homomorphic = "
            "False` (`--decode-reencode`), so every relay decodes the partial sum, adds its "
            "chunk and encodes again (with relay error feedback); *own norm* scales each "
            "encode by its input's norm, *agreed norm* keeps THC's norm agreed over the "
            "ranks' inputs (`--decode-reencode agreed`), which partial sums exceed. Error = "
            "`||result - exact|| / ||exact||` of one call, and of the running sum over the "
            "steps with error feedback. Sent = payload bits per value of the rank that sent "
            "most in one call (and its bytes); both re-encode variants send the same bytes.")
    return ("THC: error per bits setting, 2–5 ranks, homomorphic vs decode-and-re-encode",
            "\n".join(cmds), text, table(table_rows, columns), None)
