"""The report's steady-state section: error feedback on real MLP, CNN and LM gradients."""

import os
import sys

from .runs import run_benchmark
from .tables import config_label, table

__all__ = ["steady_section"]


def steady_section(args, tmp, log):
    """Error feedback in steady state on real MLP, CNN and LM gradients (``ccl.bench steady``).

    Uses ``args.quick``; arguments and result as every section's (see
    :mod:`tools.report`).
    """
    steps = ["--steps", "20", "--zero-steps", "20"] if args.quick else []
    rows, cmd = run_benchmark([sys.executable, "-m", "ccl.bench", "steady"] + steps,
                              os.path.join(tmp, "steady.json"), log)
    zero = rows[0]["zero_steps"] if rows else 0
    return ("Error feedback in steady state", cmd,
            "Real gradients of three models (an MLP and a CNN on scikit-learn's digits, a "
            "word-level GRU language model with an embedding), every layer through "
            "`Communicator(codec=codec, algorithm=\"ring\", min_compress_bytes=0).allreduce(g, "
            "key=layer)` at one rank; steady state is the second half of the gradient steps. "
            "*density/target*: values delivered non-zero over the target count "
            "`max(1, ceil(density*n))` summed over the layers; *bits/value*: payload bits per "
            "input value (headers included), against the codec's stated `bits_per_value`; "
            f"*error after zeros*: the running-sum error after {zero} zero steps.",
            table(rows, [("model", lambda r: r["model"]), ("codec", config_label),
                         ("density/target", lambda r: "-" if r["density_ratio"] is None
                          else f"{r['density_ratio']:.2f}"),
                         ("bits/value", lambda r: f"{r['bits_per_value']:.3f}"),
                         ("stated", lambda r: f"{r['stated_bits_per_value']:.3f}"),
                         ("error after gradients", lambda r: f"{r['err_grad']:.2e}"),
                         ("error after zeros", lambda r: f"{r['err_zero']:.2e}")]),
            None)
