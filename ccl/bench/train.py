"""Step time and time to accuracy of one model under DDP's hooks, ccl's codecs, no communication.

On an emulated cluster (root), or on shared memory::

    python -m ccl.bench.cluster --hosts 4 --rate 1gbit -- \\
        python -m mpi4py -m ccl.bench.train --steps 40 --json train.json --plot train.png
    mpiexec -n 4 python -m mpi4py -m ccl.bench.train --steps 40

In one run, every method (:data:`ccl.bench.train_methods.METHODS`, see that
module) trains the same MLP (64 -> ``--hidden`` -> ``--hidden`` -> 10;
``--hidden 4096`` is 17.1M parameters) on scikit-learn's digits from the
same initial weights, on the same per-rank batches (``--batch`` per rank,
drawn from each rank's shard in a seeded order), with SGD (momentum 0.9,
constant ``--lr``), for the same number of steps. Every step starts after a
barrier; its time is the slowest rank's (forward, backward, communication,
update). The test accuracy is measured every ``--eval-every`` steps, outside
the timed steps: each rank classifies its share of the 450 test images with
its model (for ``local``, every rank has a model of its own).

Reported per method, time to accuracy first: the training time until the
test accuracy first reached the target (the measured step times of the
slowest rank summed up to that evaluation, never steps times a median: the
first steps differ), that time over ``ddp/powersgd``'s, the median step time
over the steps after ``--warmup``, the final accuracy and the payload bytes
one rank sent per step (ccl: counted by ``communication_stats()``; DDP:
computed from its buckets, see
:func:`ccl.bench.train_methods.ddp_bytes_per_step`). The target is
``--target``, or else :data:`DEFAULT_TARGET` (95 %), or ``ddp/none``'s final
accuracy where that is lower. ``ddp/powersgd`` (torch's PowerSGD hook) is
always in the comparison: it is added to ``--methods`` when missing.
"""

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI

from . import set_torch_threads, train_methods
from .gloo import gloo_group
from .train_methods import METHODS, codec_ids, kind

#: The default target test accuracy (lowered to ``ddp/none``'s final accuracy if that is lower).
DEFAULT_TARGET = 0.95
#: The method every run compares with: torch's PowerSGD hook.
REFERENCE = "ddp/powersgd"


def batches(n, batch, seed, rank):
    """Index tensors of ``batch`` samples: a seeded permutation of ``range(n)`` per epoch."""
    import torch

    epoch = 0
    while True:
        generator = torch.Generator().manual_seed(1_000_003 * seed + 1000 * epoch + rank)
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - batch + 1, batch):
            yield order[start:start + batch]
        epoch += 1


def _evaluate(comm, model, x_test, y_test):
    """Test accuracy: each rank classifies every ``comm.size``-th image from its rank on."""
    import torch

    model.eval()
    with torch.no_grad():
        mine = slice(comm.rank, None, comm.size)
        correct = int((model(x_test[mine]).argmax(1) == y_test[mine]).sum())
    model.train()
    return comm.allreduce(correct) / len(y_test)


class _Progress:
    """Progress lines on rank 0's stderr: at most one per ``every`` seconds, and at the end."""

    def __init__(self, comm, every=15.0, stream=None):
        self.rank, self.every = comm.rank, every
        self.stream = sys.stderr if stream is None else stream
        self.started = time.perf_counter()

    def method(self, name, steps):
        self.name, self.steps, self.t0 = name, steps, time.perf_counter()
        self.last = self.t0

    def step(self, step, accuracy=None):
        now = time.perf_counter()
        if self.rank != 0 or (now - self.last < self.every and step < self.steps):
            return
        self.last = now
        elapsed = now - self.t0
        eta = elapsed / step * (self.steps - step)
        acc = "" if accuracy is None else f", test accuracy {accuracy:.4f}"
        print(f"train: {self.name} step {step}/{self.steps}, {elapsed:.1f} s elapsed, "
              f"ETA {eta:.0f} s{acc} (run: {now - self.started:.0f} s)",
              file=self.stream, flush=True)


def train(comm, method, data, args, progress):
    """Train ``method`` for ``args.steps`` steps; return its row (identical on every rank)."""
    import torch

    x, y, x_test, y_test = data
    model, optimizer, sent = train_methods.build(method, args.hidden, args.seed, args.lr)
    order = batches(len(x), args.batch, args.seed, comm.rank)
    curve = [(0, 0.0, _evaluate(comm, model, x_test, y_test))]
    times, losses, clock = [], [], 0.0
    progress.method(method, args.steps)
    for step in range(1, args.steps + 1):
        index = next(order)
        comm.Barrier()
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - t0
        seconds, loss_values = zip(*comm.allgather((elapsed, loss.item())))
        times.append(max(seconds))
        losses.append(float(np.mean(loss_values)))
        clock += times[-1]
        accuracy = None
        if step % args.eval_every == 0 or step == args.steps:
            accuracy = _evaluate(comm, model, x_test, y_test)
            curve.append((step, clock, accuracy))
        progress.step(step, accuracy)
    if sent is not None:
        bytes_per_step, source = comm.allreduce(sent()) / comm.size / args.steps, "counted"
    elif kind(method) == "ddp":
        bytes_per_step = train_methods.ddp_bytes_per_step(method, model, comm.size, args.steps)
        source = "computed"
    else:
        bytes_per_step, source = 0.0, "none"
    row = dict(method=method, steps=args.steps, step_times=times, losses=losses,
               curve=[list(c) for c in curve], train_seconds=clock,
               median_step_s=float(np.median(times[args.warmup:] or times)),
               final_accuracy=curve[-1][2], bytes_per_step=bytes_per_step,
               bytes_source=source)
    if kind(method) in ("ccl", "hvd"):
        stats = optimizer.communication_stats()
        row.update(buckets=stats["buckets"], compressed_buckets=stats["compressed_buckets"])
    return comm.bcast(row, root=0)


def run_methods(comm, methods, data, args, progress):
    """Every method's row, the ``ccl`` ones in one ``ccl.torch`` session, the DDP ones in
    one gloo group, the hook ones with both; rows come back in the order of ``methods``."""
    rows = {}
    group = [m for m in methods if kind(m) in ("ccl", "hvd")]
    if group:
        import ccl
        import ccl.torch as ct

        ccl.warmup(codec_ids(group))
        ct.init(comm)
        try:
            rows.update((m, train(comm, m, data, args, progress)) for m in group)
        finally:
            ct.shutdown()
    group = [m for m in methods if kind(m) == "ddp"]
    if group:
        with gloo_group(comm):
            rows.update((m, train(comm, m, data, args, progress)) for m in group)
    group = [m for m in methods if kind(m) == "hook"]
    if group:  # DDP on gloo, averaging through ccl's hook on ccl's own communicator
        import ccl
        import ccl.torch as ct

        ccl.warmup(codec_ids(group))
        ct.init(comm)
        try:
            with gloo_group(comm):
                rows.update((m, train(comm, m, data, args, progress)) for m in group)
        finally:
            ct.shutdown()
    rows.update((m, train(comm, m, data, args, progress))
                for m in methods if kind(m) == "local")
    return [rows[m] for m in methods]


def pick_target(rows, target=None):
    """The target accuracy and where it came from.

    ``target`` when given (``--target``); else :data:`DEFAULT_TARGET`, or the
    final accuracy of ``ddp/none`` (uncompressed training) where that is lower,
    so that the uncompressed run always reaches it.
    """
    if target is not None:
        return target, "--target"
    reference = next((r for r in rows if r["method"] == "ddp/none"), None)
    if reference is not None and reference["final_accuracy"] < DEFAULT_TARGET:
        return reference["final_accuracy"], (f"ddp/none's final accuracy (step "
                                              f"{reference['steps']}), under {DEFAULT_TARGET}")
    return DEFAULT_TARGET, "default"


def add_target(rows, target):
    """Set ``time_to_target_s`` and ``steps_to_target`` (None where never reached).

    The time is the curve's clock at the first evaluation whose accuracy is at
    least ``target``: the measured step times of the slowest rank summed up to
    that step. ``vs_reference`` is that time over :data:`REFERENCE`'s (None
    where either never reached the target, or the reference had at step 0).
    """
    for r in rows:
        hit = next((c for c in r["curve"] if c[2] >= target), None)
        r["steps_to_target"] = None if hit is None else hit[0]
        r["time_to_target_s"] = None if hit is None else hit[1]
    ref = next((r["time_to_target_s"] for r in rows if r["method"] == REFERENCE), None)
    for r in rows:
        r["vs_reference"] = (None if not ref or r["time_to_target_s"] is None
                             else r["time_to_target_s"] / ref)


def table(rows, markdown=False):
    """The result table, plain or as Markdown."""
    by = {r["method"]: r for r in rows}

    def ratio(r, name):
        ref = by.get(name)
        return "-" if ref is None else f"{r['median_step_s'] / ref['median_step_s']:.2f}"

    head = ["method", "to target s", "x powersgd", "steps", "step s", "x ddp/none", "x local",
            "final acc", "MB/step"]
    lines = []
    for r in rows:
        mb = r["bytes_per_step"] / 1e6
        lines.append([r["method"],
                      "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}",
                      "-" if r.get("vs_reference") is None else f"{r['vs_reference']:.2f}",
                      "-" if r["steps_to_target"] is None else str(r["steps_to_target"]),
                      f"{r['median_step_s']:.3f}", ratio(r, "ddp/none"), ratio(r, "local"),
                      f"{r['final_accuracy']:.4f}",
                      f"{mb:.2f}" + ("*" if r["bytes_source"] == "computed" else "")])
    if markdown:
        rule = ["---"] * len(head)
        return "\n".join("| " + " | ".join(c) + " |" for c in [head, rule] + lines)
    widths = [max(len(str(c[i])) for c in [head] + lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(cells, widths)))
                     for cells in [head] + lines)


def plot(rows, target, title, path):
    """Accuracy against training time, one line per method, and the median step times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5),
                                      gridspec_kw={"width_ratios": [3, 2]})
    styles = {"ccl": "-", "ddp": "--", "hook": "-.", "hvd": "-", "local": ":"}
    for r in rows:
        _, seconds, accuracy = zip(*r["curve"])
        line, = left.plot(seconds, accuracy, styles[kind(r["method"])], marker=".",
                          label=r["method"])
        hit = next((c for c in r["curve"] if c[0] == r.get("steps_to_target")), None)
        if hit is not None:  # a star where it first reached the target
            left.plot([hit[1]], [hit[2]], "*", color=line.get_color(), markersize=10)
    left.axhline(target, color="grey", linewidth=0.8)
    left.set_xlabel("training time (s, sum of the slowest rank's steps)")
    left.set_ylabel("test accuracy")
    left.set_ylim(max(0.0, min(target - 0.3, 0.6)), 1.0)
    left.legend(fontsize=8, ncol=2)
    right.barh([r["method"] for r in rows], [r["median_step_s"] for r in rows])
    right.set_xlabel("median step time (s, slowest rank)")
    right.invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench.train",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        help=f"default: all of {' '.join(METHODS)}; {REFERENCE} is always "
                             "added")
    parser.add_argument("--steps", type=int, default=60, help="steps per method")
    parser.add_argument("--epochs", type=float, default=None,
                        help="instead of --steps: passes over each rank's shard")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--hidden", type=int, default=4096, help="width of both hidden layers")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0,
                        help="data split, initial weights and batch order")
    parser.add_argument("--target", type=float, default=None,
                        help=f"target test accuracy (default: {DEFAULT_TARGET}, or ddp/none's "
                             "final accuracy where lower)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="first steps left out of the median step time")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="steps between test evaluations (default: steps / 20)")
    parser.add_argument("--json", help="write the rows, curves and settings here")
    parser.add_argument("--plot", help="write a PNG of accuracy against time here")
    args = parser.parse_args(argv)
    try:
        train_methods.check_methods(args.methods)
    except ValueError as exc:
        parser.error(str(exc))
    if len(set(args.methods)) != len(args.methods):
        parser.error("--methods lists a method twice")
    if REFERENCE not in args.methods:
        args.methods.append(REFERENCE)
    return parser, args


def main(argv=None, comm=None):
    """Command-line entry point; ``comm`` defaults to ``MPI.COMM_WORLD``. Returns 0."""
    parser, args = parse_args(argv)
    if comm is None:
        from ccl.launch import check_launch

        check_launch()
        comm = MPI.COMM_WORLD
    from .torch_digits import digits_shards

    data = digits_shards(comm.rank, comm.size, args.seed)
    per_epoch = len(data[0]) // args.batch
    if per_epoch < 1:
        parser.error(f"--batch {args.batch} is larger than a rank's shard ({len(data[0])})")
    if args.epochs is not None:
        args.steps = max(1, round(args.epochs * per_epoch))
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    args.eval_every = args.eval_every or max(1, args.steps // 20)
    threads = set_torch_threads(comm)
    started = time.perf_counter()
    rows = run_methods(comm, args.methods, data, args, _Progress(comm))
    target, source = pick_target(rows, args.target)
    add_target(rows, target)
    h = args.hidden
    params = 64 * h + h + h * h + h + h * 10 + 10
    setting = (f"{comm.size} ranks, MLP 64-{args.hidden}-{args.hidden}-10 "
               f"({params / 1e6:.1f}M parameters), digits, batch {args.batch}/rank, "
               f"{args.steps} steps ({args.steps / per_epoch:.1f} epochs), SGD lr {args.lr} "
               f"momentum 0.9, {threads} torch thread(s)/rank")
    if comm.rank == 0:
        print(table(rows))
        print(f"target accuracy {target:.4f} ({source}); to target: summed step times of the "
              f"slowest rank; step times: median after {args.warmup} warm-up steps; "
              "* computed, not counted")
        missed = [r["method"] for r in rows if r["time_to_target_s"] is None]
        if missed:
            print(f"not reached in {args.steps} steps: {' '.join(missed)} (more --steps?)")
        print(f"({setting}; {time.perf_counter() - started:.0f} s in all)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"setting": setting, "ranks": comm.size, "parameters": params,
                           "torch_threads": threads, "target": target,
                           "target_source": source, "args": vars(args), "rows": rows},
                          f, indent=1)
        if args.plot:
            plot(rows, target, f"digits MLP: {setting.replace('; ', chr(10))}"
                 .replace(", digits,", ",\n"), args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
