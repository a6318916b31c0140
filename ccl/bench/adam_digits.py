"""``CompressedAdam`` against exact AdamW on scikit-learn's digits (a ReLU MLP), per codec.

Run under mpiexec (4 ranks is the reference setting)::

    mpiexec -n 4 python -m mpi4py -m ccl.bench.adam_digits --seeds 0 1 2 3 4

The model is the one a newcomer writes first: 64 -> 256 -> 256 -> 10 with
ReLU, batch 32 per rank, a constant ``lr`` of 1e-3. Digits has pixels that
are always 0 and ReLU units that die, so some coordinates end the warm-up
with a tiny variance: the case where a codec's error, divided by that
variance's root, can turn into a huge step. Every method trains the same
model from the same initial weights on the same per-rank shards:

- ``adamw``: exact AdamW (:func:`ccl.torch.DistributedOptimizer` around
  ``torch.optim.AdamW``, no codec);
- ``cadam/<codec>``: :class:`ccl.torch.CompressedAdam` with that codec and
  every other argument at its default, but ``algorithm`` (``--algorithm``,
  default ``direct``: ``auto`` decides from a timed probe of the link).

Reported per method and seed: the final test accuracy, the first step
whose training loss was not finite or above ``--diverged-loss`` (``-``:
none) and the largest weight magnitude at the end.
"""

import argparse
import json
import math

import numpy as np
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.bench import set_torch_threads
from ccl.bench.torch_digits import accuracy, digits_shards, mlp

DEFAULT_CODECS = ("onebit", "3lc", "thc")


def _train(comm, model, optimizer, data, args):
    """Train ``args.epochs`` epochs; return (accuracy, first diverged step or None, max |w|)."""
    import torch

    x, y, x_test, y_test = data
    step, diverged = 0, None
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(
            1000 * epoch + comm.rank))
        for start in range(0, len(x) - args.batch + 1, args.batch):
            index = order[start:start + args.batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
            step += 1
            value = comm.allreduce(loss.item(), op=MPI.MAX)
            if diverged is None and not (math.isfinite(value) and value <= args.diverged_loss):
                diverged = step
    largest = max(float(p.detach().abs().max()) for p in model.parameters())
    return accuracy(model, x_test, y_test), diverged, largest, step


def run(comm, specs, seed, args):
    """One run of exact AdamW and of CompressedAdam per codec; rows identical on every rank."""
    import torch

    import ccl.torch as ct

    data = digits_shards(comm.rank, comm.size, seed)
    rows = []
    ct.init(comm)
    try:
        for spec in [None, *specs]:
            model = mlp(args.hidden, seed)
            if spec is None:
                name = "adamw"
                optimizer = ct.DistributedOptimizer(
                    torch.optim.AdamW(model.parameters(), lr=args.lr),
                    named_parameters=model.named_parameters(), codec=None)
            else:
                name = f"cadam/{get_codec(spec).codec_id}"
                extra = {} if args.warmup is None else {"warmup_steps": args.warmup}
                optimizer = ct.CompressedAdam(model.parameters(), lr=args.lr,
                                              named_parameters=model.named_parameters(),
                                              codec=spec, algorithm=args.algorithm, **extra)
            acc, diverged, largest, steps = _train(comm, model, optimizer, data, args)
            rows.append(dict(method=name, seed=seed, accuracy=acc, diverged_at=diverged,
                             max_abs_weight=largest, steps=steps))
            del optimizer
    finally:
        ct.shutdown()
    return comm.bcast(rows, root=0)


def _table(runs):
    methods = {}
    for r in runs:
        methods.setdefault(r["method"], []).append(r)
    exact = {r["seed"]: r["accuracy"] for r in methods.get("adamw", [])}
    lines = [f"{'method':<14} {'mean acc':>8} {'worst gap':>9} {'per seed':<40} "
             f"{'diverged at':<14} {'max |w|':>8}"]
    for name, group in methods.items():
        gaps = [exact[g["seed"]] - g["accuracy"] for g in group if g["seed"] in exact]
        accs = " ".join(f"{g['accuracy']:.4f}" for g in group)
        div = " ".join("-" if g["diverged_at"] is None else str(g["diverged_at"])
                       for g in group)
        largest = max(g["max_abs_weight"] for g in group)
        gap = f"{100 * max(gaps):+.2f}" if gaps else "-"
        lines.append(f"{name:<14} {np.mean([g['accuracy'] for g in group]):8.4f} "
                     f"{gap:>9} {accs:<40} {div:<14} {largest:8.3g}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench.adam_digits",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=list(DEFAULT_CODECS),
                        help="codec ids or JSON configs; unregistered ids are skipped")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="one run per seed (data split and initial weights)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=None,
                        help="CompressedAdam's warmup_steps (default: its own default)")
    parser.add_argument("--algorithm", default="direct",
                        help="CompressedAdam's algorithm (default direct)")
    parser.add_argument("--diverged-loss", type=float, default=100.0,
                        help="a training loss above this (on any rank) counts as diverged")
    parser.add_argument("--json", help="write the runs here")
    args = parser.parse_args(argv)

    comm = MPI.COMM_WORLD
    set_torch_threads(comm)
    specs, notes = [], []
    for name in args.codecs:
        spec = json.loads(name) if name.startswith("{") else name
        codec_id = spec["id"] if isinstance(spec, dict) else spec
        if codec_id in registered_codecs():
            specs.append(spec)
        else:
            notes.append(f"codec {codec_id!r} skipped: not registered in this installation")
    ccl.warmup([get_codec(s).codec_id for s in specs])
    runs = []
    for seed in args.seeds:
        runs += run(comm, specs, seed, args)
    if comm.rank == 0:
        print(_table(runs))
        print(f"({comm.size} ranks, {runs[0]['steps']} steps ({args.epochs} epochs), seeds "
              f"{args.seeds}, ReLU MLP 64-{args.hidden}-{args.hidden}-10, batch "
              f"{args.batch}/rank, lr {args.lr}, CompressedAdam warmup_steps "
              f"{'default' if args.warmup is None else args.warmup}, algorithm "
              f"{args.algorithm}; worst gap: exact AdamW's accuracy minus the method's, "
              "in points, over the seeds)")
        for note in notes:
            print(note)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"runs": runs, "notes": notes, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
