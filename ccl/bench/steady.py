"""Error feedback in steady state: real gradients through keyed allreduce calls, then zeros.

``python -m ccl.bench steady`` trains three small torch models with
:func:`ccl.bench.gradients.collect_gradients` (an MLP and a CNN on
scikit-learn's digits, a word-level GRU language model with an embedding on
the standard library's docstrings; generated in the run, nothing is
downloaded or committed) and streams every layer's gradient through
``Communicator(codec=..., min_compress_bytes=0).allreduce(g, key=layer)``,
so the collectives keep the error-feedback residuals as in training. Then
``--zero-steps`` calls with zero gradients follow. Per codec and model it
prints:

* ``density/target``: values delivered non-zero in the steady state (the
  second half of the gradient steps) over the target count
  ``sum max(1, ceil(density*n))`` of the layers (sparsifiers only);
* ``bits/value``: payload bits per input value of every encode in the
  steady state (header included), the figure ``Codec.bits_per_value``
  states;
* ``err@grad`` and ``err@zero``: the running-sum error ``||sum delivered -
  sum of gradients|| / ||sum of gradients||`` after the last gradient step
  and after the zero steps (0 when the held residual was delivered).

Run it without mpiexec (one rank, algorithm ``ring``: each encode is one lossy point). Needs
``torch`` and ``scikit-learn``.
"""

import argparse
import json
import math

import numpy as np

from .gradients import MODELS, collect_gradients

DEFAULT_CODECS = [
    {"id": "sidco", "density": 0.01}, {"id": "sidco", "density": 0.001},
    {"id": "topk", "density": 0.01}, {"id": "dgc", "density": 0.01},
    {"id": "randomk", "density": 0.01}, {"id": "3lc"}, {"id": "onebit"},
    {"id": "dithering"}, {"id": "thc"},
]


def _counting(config):
    """The codec of ``config``, counting its payload bytes and input values while ``on``."""
    from ccl.codecs import get_codec

    base = type(get_codec(config))

    class Counting(base):
        def encode(self, x, ctx=None):
            payload = super().encode(x, ctx)
            if self._count["on"]:
                self._count["bytes"] += payload.size
                self._count["values"] += x.size
            return payload

    codec = Counting.from_config(get_codec(config).get_config())
    codec._count = {"on": False, "bytes": 0, "values": 0}
    return codec


def _error(delivered, truth):
    num = sum(float(np.sum((d - t) ** 2)) for d, t in zip(delivered, truth))
    return math.sqrt(num / sum(float(np.sum(t ** 2)) for t in truth))


def measure(grads, config, zero_steps, comm=None):
    """One codec on one gradient stream: the steady-state row (see the module docstring)."""
    import ccl

    codec = _counting(config)
    # one rank: every algorithm has one lossy point per chunk (auto would pick MPI)
    c = ccl.Communicator(comm, codec=codec, algorithm="ring", min_compress_bytes=0)
    steps = len(grads)
    delivered = [np.zeros(g.size) for g in grads[0]]
    truth = [np.zeros(g.size) for g in grads[0]]
    density = getattr(codec, "density", None)
    kept = target = 0
    for step in range(steps + zero_steps):
        steady = steps // 2 <= step < steps
        codec._count["on"] = steady
        for i, g in enumerate(grads[step] if step < steps else grads[0]):
            x = g if step < steps else np.zeros_like(g)
            y = c.allreduce(x, key=f"layer{i}")
            delivered[i] += y
            truth[i] += x
            if steady and density is not None:
                kept += int(np.count_nonzero(y))
                target += min(g.size, max(1, math.ceil(density * g.size)))
        if step == steps - 1:
            err_grad = _error(delivered, truth)
    count = codec._count
    return dict(codec=codec.codec_id, config=codec.get_config(),
                density_ratio=kept / target if target else None,
                bits_per_value=8 * count["bytes"] / count["values"],
                stated_bits_per_value=codec.bits_per_value,
                err_grad=err_grad, err_zero=_error(delivered, truth),
                steps=steps, zero_steps=zero_steps)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench steady",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--codecs", nargs="+", default=None,
                        help="codec ids or JSON configs (default: every error-feedback codec)")
    parser.add_argument("--steps", type=int, default=40, help="gradient steps per model")
    parser.add_argument("--zero-steps", type=int, default=100)
    parser.add_argument("--json", help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    specs = ([json.loads(s) if s.startswith("{") else {"id": s} for s in args.codecs]
             if args.codecs else DEFAULT_CODECS)
    rows = []
    print(f"{'model':>5} {'codec':>9} {'density':>8} {'dens/target':>11} {'bits/value':>10} "
          f"{'stated':>7} {'err@grad':>9} {'err@zero':>9}")
    for model in args.models:
        grads = collect_gradients(args.steps, model=model)
        for spec in specs:
            row = dict(measure(grads, spec, args.zero_steps), model=model,
                       layers=[g.size for g in grads[0]])
            rows.append(row)
            ratio = "-" if row["density_ratio"] is None else f"{row['density_ratio']:.3f}"
            print(f"{model:>5} {row['codec']:>9} {str(row['config'].get('density', '-')):>8} "
                  f"{ratio:>11} {row['bits_per_value']:10.3f} "
                  f"{row['stated_bits_per_value']:7.3f} {row['err_grad']:9.2e} "
                  f"{row['err_zero']:9.2e}", flush=True)
    print(f"({args.steps} gradient steps per model, steady state = second half; then "
          f"{args.zero_steps} zero steps; one rank, keyed allreduce per layer)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
