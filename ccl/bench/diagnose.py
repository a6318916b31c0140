"""Where a codec's accuracy goes: its decoded average against the exact one, step by step.

Run under mpiexec::

    mpiexec -n 4 python -m mpi4py -m ccl.bench diagnose --steps 30 --hidden 1024

Every rank trains :mod:`ccl.bench.train`'s MLP on its shard of the digits
(batch ``--batch``, SGD with momentum 0.9) with the *exact* average of the
ranks' gradients, so every variant sees the same gradients. At every step each
variant (codec x algorithm x mode) averages the same per-layer gradients
through :meth:`ccl.Communicator.allreduce` with error feedback, one call per
tensor as :class:`ccl.torch.DistributedOptimizer` makes for a scaled codec,
and is compared with the exact average ``g``:

- ``cos``, ``err``: cosine and relative error ``||d - g|| / ||g||`` of the
  decoded average ``d`` of this step;
- ``m err``: relative error of the momentum the optimizer steps with
  (``m = 0.9 m + d`` against the exact ``0.9 m + g``): what moves the weights;
- ``drift``: relative error of the summed updates since step 1 (where the
  weights would be);
- the worst layer's ``err`` (one scale per chunk across values of very
  different magnitude shows there).

Modes: ``grad`` (the default: the gradient is compressed, the optimizer's
momentum applied to what arrives), ``warm<K>`` (the first K steps exact), and
``momentum`` (each rank compresses its local momentum ``u = 0.9 u + g_rank``
and the average is the update itself, DGC's momentum correction).
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from .cli import Parser

MOMENTUM = 0.9


def _variant_name(spec, algorithm, mode):
    codec = spec if isinstance(spec, str) else json.dumps(spec, separators=(",", ":"))
    return f"{codec}/{algorithm}/{mode}"


class Variant:
    """One codec x algorithm x mode: its communicator, momentum and running sums."""

    def __init__(self, comm, spec, algorithm, mode, sizes):
        import ccl

        self.name = _variant_name(spec, algorithm, mode)
        self.spec, self.algorithm, self.mode = spec, algorithm, mode
        self.comm = ccl.Communicator(comm, codec=spec, algorithm=algorithm, op="mean",
                                     min_compress_bytes=0)
        self.warm = int(mode[4:]) if mode.startswith("warm") else 0
        self.local = [np.zeros(n, np.float32) for n in sizes]  # mode momentum: own u
        self.momentum = [np.zeros(n) for n in sizes]
        self.moved = [np.zeros(n) for n in sizes]
        self.rows = []

    def step(self, step, local, exact, momentum, moved):
        """Average ``local`` (this rank's per-layer gradients); record this step's errors."""
        if self.mode == "momentum":
            for u, g in zip(self.local, local):
                u *= MOMENTUM
                u += g
            sent = self.local
        else:
            sent = local
        if step <= self.warm:
            decoded = exact if self.mode != "momentum" else None
        else:
            decoded = [self.comm.allreduce(x, key=("diagnose", i)) for i, x in enumerate(sent)]
        if self.mode == "momentum":
            decoded = decoded if decoded is not None else momentum
            self.momentum = [np.asarray(d, np.float64) for d in decoded]
        else:
            for m, d in zip(self.momentum, decoded):
                m *= MOMENTUM
                m += d
        for w, m in zip(self.moved, self.momentum):
            w += m
        layer_err = [_rel(d, g) for d, g in zip(decoded, exact)]
        self.rows.append(dict(step=step, cos=_cos(decoded, exact), err=_rel(decoded, exact),
                              m_err=_rel(self.momentum, momentum),
                              drift=_rel(self.moved, moved), layer_err=layer_err,
                              bytes=self.comm.stats()["bytes_sent"]))


def _flat(arrays):
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def _rel(a, b):
    if isinstance(a, list):
        a, b = _flat(a), _flat(b)
    norm = np.linalg.norm(b)
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / norm) if norm else 0.0


def _cos(a, b):
    a, b = _flat(a), _flat(b)
    denominator = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denominator) if denominator else 1.0


def run(comm, specs, algorithms, modes, steps, hidden, batch, lr, seed):
    """Train with exact averages for ``steps`` steps; return every variant's rows."""
    import torch

    from .torch_digits import digits_shards, mlp
    from .train import batches as seeded_batches

    x, y, _, _ = digits_shards(comm.rank, comm.size, seed)
    model = mlp(hidden, seed)
    params = list(model.parameters())[::-1]  # backward's order, as the optimizer buckets
    sizes = [p.numel() for p in params]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    variants = [Variant(comm, s, a, m, sizes) for s in specs for a in algorithms for m in modes]
    momentum = [np.zeros(n) for n in sizes]
    moved = [np.zeros(n) for n in sizes]
    order = seeded_batches(len(x), batch, seed, comm.rank)
    for step in range(1, steps + 1):
        index = next(order)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[index]), y[index]).backward()
        local = [p.grad.detach().numpy().ravel().copy() for p in params]
        exact = []
        for g in local:
            total = np.empty(g.size)
            comm.Allreduce(g.astype(np.float64), total)
            exact.append(total / comm.size)
        for m, w, g in zip(momentum, moved, exact):
            m *= MOMENTUM
            m += g
            w += m
        for v in variants:
            v.step(step, local, exact, momentum, moved)
        for p, g in zip(params, exact):
            p.grad.copy_(torch.from_numpy(g.astype(np.float32)).view_as(p.grad))
        optimizer.step()
        if comm.rank == 0:
            print(f"diagnose: step {step}/{steps}", file=sys.stderr, flush=True)
    return variants, [tuple(p.shape) for p in params]


def summary(variant, steps, size):
    """Mean of each figure over the first ``steps`` steps and over the rest, bytes per step."""
    rows = variant.rows
    first, rest = rows[:steps], rows[steps:] or rows
    worst = int(np.argmax(np.mean([r["layer_err"] for r in rest], axis=0)))

    def mean(part, field):
        return float(np.mean([r[field] for r in part]))

    return dict(variant=variant.name, early_cos=mean(first, "cos"), cos=mean(rest, "cos"),
                early_err=mean(first, "err"), err=mean(rest, "err"),
                m_err=mean(rest, "m_err"), drift=rows[-1]["drift"], worst_layer=worst,
                worst_err=float(np.mean([r["layer_err"][worst] for r in rest])),
                bytes_per_step=rows[-1]["bytes"] / len(rows), values=size)


def main(argv=None, comm=None):
    """Run the command line ``argv`` on ``comm`` (default ``MPI.COMM_WORLD``); rank 0 prints."""
    parser = Parser(prog="python -m ccl.bench diagnose", description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=["onebit", "3lc", "sidco", "thc"],
                        help="codec ids or JSON configs")
    parser.add_argument("--algorithms", nargs="+", default=["ring", "tree", "direct"])
    parser.add_argument("--modes", nargs="+", default=["grad"],
                        help="grad, warm<K> (first K steps exact) or momentum")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--early", type=int, default=5, help="steps counted as the first ones")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the summaries and per-step rows here")
    args = parser.parse_args(argv)
    for mode in args.modes:
        if mode not in ("grad", "momentum") and not (mode.startswith("warm")
                                                     and mode[4:].isdigit()):
            parser.error(f"unknown mode {mode!r}: grad, warm<K> or momentum")
    specs = [json.loads(s) if s.startswith("{") else s for s in args.codecs]
    comm = MPI.COMM_WORLD if comm is None else comm
    variants, shapes = run(comm, specs, args.algorithms, args.modes, args.steps, args.hidden,
                           args.batch, args.lr, args.seed)
    size = sum(int(np.prod(s)) for s in shapes)
    rows = [summary(v, args.early, size) for v in variants]
    if comm.rank == 0:
        head = (f"{'variant':<34} {'cos 1-' + str(args.early):>7} {'cos':>6} "
                f"{'err 1-' + str(args.early):>7} {'err':>6} {'m err':>6} {'drift':>6} "
                f"{'worst layer err':>18} {'bits/val':>8}")
        print(head)
        for r in rows:
            layer = f"{shapes[r['worst_layer']]}: {r['worst_err']:.2f}"
            print(f"{r['variant']:<34} {r['early_cos']:7.3f} {r['cos']:6.3f} "
                  f"{r['early_err']:7.3f} {r['err']:6.3f} {r['m_err']:6.3f} {r['drift']:6.3f} "
                  f"{layer:>18} {8 * r['bytes_per_step'] / size:8.3f}")
        print(f"({comm.size} ranks, MLP 64-{args.hidden}-{args.hidden}-10, {args.steps} steps "
              f"of exact-average SGD; first {args.early} steps apart, others averaged; "
              "err = ||decoded - exact|| / ||exact|| of the average, m err of the momentum, "
              "drift of the summed updates at the end)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"summary": rows, "steps": {v.name: v.rows for v in variants}},
                          f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
