"""Train one MLP on scikit-learn's digits: ccl codecs vs DDP (gloo) with its comm hooks.

Run under mpiexec (4 ranks is the reference setting)::

    mpiexec -n 4 python -m mpi4py -m ccl.bench.torch_digits --epochs 30 \\
        --json torch-digits.json --plot torch-digits.png

Every method trains the same model from the same initial weights on the same
per-rank shards with the same hyperparameters, in the same run:

- ``ccl/<codec>``: :class:`ccl.torch.DistributedOptimizer` with that codec
  and, by default, the algorithm that fits it (``--algorithm``; codecs that
  are not registered in this installation are skipped, with a note);
- ``ddp/<hook>``: ``torch.nn.parallel.DistributedDataParallel`` on the gloo
  backend (rank and world size from MPI, ``env://`` rendezvous on
  127.0.0.1), with no hook, ``fp16_compress_hook`` or ``powerSGD_hook``.

Reported per method: final test accuracy, training wall time (the slowest
rank's, evaluation excluded) and, for ccl, the payload bytes rank 0 sent.
On one machine both transports move bytes through memory, so the times say
more about per-step overheads than about a network.
"""

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.bench import set_torch_threads
from ccl.collectives.auto import fitting

DEFAULT_CODECS = ("none", "fp16", "3lc", "thc", "onebit", "sidco")
DDP_HOOKS = ("none", "fp16", "powersgd")


def digits_shards(rank, size, seed=0):
    """This rank's training shard and the whole test set of the digits data (no download).

    Every rank gets the same number of samples (``len(train) // size``), so
    every rank runs the same number of steps per epoch: a rank with one more
    step would wait forever in a collective the others never join.

    Returns
    -------
    (x_train, y_train, x_test, y_test) : tuple of torch.Tensor
    """
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25,
                                                        random_state=seed, stratify=y)
    per_rank = len(x_train) // size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    return (torch.from_numpy(x_train[mine]), torch.from_numpy(y_train[mine]).long(),
            torch.from_numpy(x_test), torch.from_numpy(y_test).long())


def mlp(hidden, seed=0):
    """The model: 64 -> hidden -> hidden -> 10, the same initial weights for a given seed."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def train_epoch(model, optimizer, x, y, batch, seed):
    """One pass over this rank's shard in a seeded order; returns the mean loss."""
    import torch

    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    total, steps = 0.0, 0
    model.train()
    for start in range(0, len(x) - batch + 1, batch):
        index = order[start:start + batch]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
        loss.backward()
        optimizer.step()
        total, steps = total + loss.item(), steps + 1
    return total / max(steps, 1)


def accuracy(model, x, y):
    """Fraction of ``x`` classified as ``y``."""
    import torch

    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _run(comm, name, model, optimizer, data, args, stats=None):
    """Train for ``args.epochs``; return a result row (identical on every rank)."""
    import torch

    x_train, y_train, x_test, y_test = data
    # the same schedule for every method; a decaying rate makes the final accuracy
    # a property of the method rather than of where the last epoch's noise landed
    schedule = (torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs)
                if args.schedule == "cosine" else None)
    losses, accuracies, train_time = [], [], 0.0
    for epoch in range(args.epochs):
        comm.Barrier()
        t0 = time.perf_counter()
        loss = train_epoch(model, optimizer, x_train, y_train, args.batch,
                           seed=1000 * epoch + comm.rank)
        elapsed = time.perf_counter() - t0
        train_time += comm.allreduce(elapsed, op=MPI.MAX)
        losses.append(comm.allreduce(loss) / comm.size)
        accuracies.append(accuracy(model, x_test, y_test))
        if schedule is not None:
            schedule.step()
    row = dict(method=name, seed=args.seed, ranks=comm.size, epochs=args.epochs,
               hidden=args.hidden, batch=args.batch, lr=args.lr, schedule=args.schedule,
               final_accuracy=accuracies[-1], train_seconds=train_time, losses=losses,
               accuracies=accuracies,
               bytes_sent=None if stats is None else stats()["bytes_sent"])
    return comm.bcast(row, root=0)


def summarise(runs):
    """One row per method from its runs (one per seed), in first-seen order.

    ``final_accuracy``, ``train_seconds``, ``bytes_sent`` and the per-epoch curves
    are means over the seeds; ``final_accuracies`` lists each seed's accuracy.
    """
    methods = {}
    for run in runs:
        methods.setdefault(run["method"], []).append(run)
    rows = []
    for group in methods.values():
        accs = [g["final_accuracy"] for g in group]
        sent = [g["bytes_sent"] for g in group]
        rows.append(dict(
            group[0], seed=None, seeds=[g["seed"] for g in group],
            final_accuracy=float(np.mean(accs)), final_accuracy_std=float(np.std(accs)),
            final_accuracies=accs,
            train_seconds=float(np.mean([g["train_seconds"] for g in group])),
            bytes_sent=None if None in sent else float(np.mean(sent)),
            losses=np.mean([g["losses"] for g in group], axis=0).tolist(),
            accuracies=np.mean([g["accuracies"] for g in group], axis=0).tolist()))
    return rows


def _algorithm(codec, requested):
    """``requested``, or for ``"fit"`` the algorithm that fits ``codec`` (MPI for ``none``).

    ``auto`` hands a codec that sends values unchanged to the MPI library.
    """
    if requested != "fit":
        return requested
    return "auto" if codec.identity else fitting(codec)


def run_ccl(comm, specs, data, args):
    """Train once per codec with ccl.torch.DistributedOptimizer."""
    import torch

    import ccl.torch as ct

    rows = []
    ct.init(comm)
    try:
        for spec in specs:
            codec = get_codec(spec)
            model = mlp(args.hidden, args.seed)
            ct.broadcast_parameters(model.state_dict(), root_rank=0)
            optimizer = ct.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                named_parameters=model.named_parameters(), codec=codec,
                algorithm=_algorithm(codec, args.algorithm),
                **({} if args.fusion_bytes is None
                   else {"fusion_threshold_bytes": args.fusion_bytes}))
            label = codec.codec_id if isinstance(spec, str) else json.dumps(spec)
            rows.append(_run(comm, f"ccl/{label}", model, optimizer, data, args,
                             optimizer.communication_stats))
    finally:
        ct.shutdown()
    return rows


def run_ddp(comm, hooks, data, args):
    """Train once per DDP comm hook on the gloo backend."""
    from .gloo import gloo_group

    with gloo_group(comm):
        return [_ddp_row(comm, hook, data, args) for hook in hooks]


def _ddp_row(comm, hook, data, args):
    """One DDP run; its model is freed on return, inside the gloo group."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    model = torch.nn.parallel.DistributedDataParallel(mlp(args.hidden, args.seed))
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        # rank-1 approximation after 10 uncompressed warm-up steps (error feedback
        # needs them: DDP rebuilds its buckets after the first step)
        state = powerSGD_hook.PowerSGDState(process_group=None,
                                            matrix_approximation_rank=1,
                                            start_powerSGD_iter=10)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return _run(comm, f"ddp/{hook}", model, optimizer, data, args)


def _table(rows):
    lines = [f"{'method':<16} {'test acc':>8} {'std':>6} {'per seed':<24} {'train s':>8} "
             f"{'MB sent/rank':>12}"]
    for r in rows:
        sent = "-" if r["bytes_sent"] is None else f"{r['bytes_sent'] / 1e6:.2f}"
        seeds = " ".join(f"{a:.4f}" for a in r["final_accuracies"])
        lines.append(f"{r['method']:<16} {r['final_accuracy']:8.4f} "
                     f"{r['final_accuracy_std']:6.4f} {seeds:<24} "
                     f"{r['train_seconds']:8.2f} {sent:>12}")
    return "\n".join(lines)


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        epochs = range(1, len(r["accuracies"]) + 1)
        style = "-" if r["method"].startswith("ccl/") else "--"
        left.plot(epochs, r["accuracies"], style, label=r["method"])
    left.set_xlabel("epoch")
    left.set_ylabel("test accuracy (mean over seeds)")
    left.set_ylim(0.5, 1.0)
    left.legend(fontsize=8)
    right.barh([r["method"] for r in rows], [r["train_seconds"] for r in rows])
    right.set_xlabel("training wall time per seed (s, slowest rank)")
    right.invert_yaxis()
    fig.suptitle(f"digits MLP, {rows[0]['ranks']} ranks, {rows[0]['epochs']} epochs, "
                 f"mean of {len(rows[0]['seeds'])} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench.torch_digits",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=list(DEFAULT_CODECS),
                        help="codec ids or JSON configs; unregistered ids are skipped")
    parser.add_argument("--ddp-hooks", nargs="*", default=list(DDP_HOOKS), choices=DDP_HOOKS)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="one training run per seed (data split and initial weights); "
                             "accuracies are reported per seed and as their mean")
    parser.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                        help="learning-rate schedule over the epochs, the same for every method")
    parser.add_argument("--fusion-bytes", type=int, default=None,
                        help="fusion_threshold_bytes of DistributedOptimizer (1: a bucket "
                             "per parameter)")
    parser.add_argument("--algorithm", default="fit",
                        help="algorithm of DistributedOptimizer; 'fit' (default): the one "
                             "that fits each codec, which 'auto' also picks on a link slow "
                             "enough for compression to pay ('auto' measures the link unless "
                             "CCL_LINK_GBPS gives its speed)")
    parser.add_argument("--json", help="write the rows (with per-epoch curves) here")
    parser.add_argument("--plot", help="write a PNG of accuracy curves and wall times here")
    args = parser.parse_args(argv)

    import torch

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
        args.seed = seed
        data = digits_shards(comm.rank, comm.size, seed)
        runs += run_ccl(comm, specs, data, args) + run_ddp(comm, args.ddp_hooks, data, args)
    rows = summarise(runs)
    if comm.rank == 0:
        print(_table(rows))
        print(f"({comm.size} ranks, {args.epochs} epochs, seeds {args.seeds}, "
              f"MLP 64-{args.hidden}-{args.hidden}-10, batch {args.batch}/rank, "
              f"SGD lr {args.lr} ({args.schedule}) momentum 0.9, "
              f"{torch.get_num_threads()} torch thread(s)/rank)")
        for note in notes:
            print(note)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "runs": runs, "notes": notes}, f, indent=1)
        if args.plot:
            _plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
