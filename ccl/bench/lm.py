"""Train a small character-level transformer on Python's standard library: Adam variants.

Run under mpiexec (4 ranks is the reference setting)::

    mpiexec -n 4 python -m mpi4py -m ccl.bench.lm --steps 300 \\
        --json lm.json --plot lm.png

The text is the source of the running Python's own standard library (the
``.py`` files under ``sysconfig.get_paths()["stdlib"]``, in sorted order, up
to ``--text-bytes``; site-packages excluded), so every machine has it and no
download is needed; its last tenth is the validation set. Rank 0 reads it
and broadcasts it. Every method trains the same model from the same initial
weights on the same per-rank batches with the same learning-rate schedule,
in the same run:

- ``adamw``: exact AdamW (``torch.optim.AdamW`` in
  :func:`ccl.torch.DistributedOptimizer` without a codec: the MPI library's
  ``Allreduce``);
- ``do/<codec>``: AdamW in ``DistributedOptimizer`` with that codec (error
  feedback on the gradients, which then feed AdamW's second moment);
- ``cadam/<codec>``: :class:`ccl.torch.CompressedAdam` with that codec
  (exact warm-up of ``--warmup`` steps, then the momentum compressed and the
  variance frozen);
- ``ddp/adamw``, ``ddp/powersgd``: ``DistributedDataParallel`` (gloo) with
  AdamW, with no communication hook and with PowerSGD's (rank
  ``--powersgd-rank``, uncompressed for the first ``--warmup`` steps);
- ``diloco/<codec>`` (only with ``--methods ... diloco``):
  :class:`ccl.torch.DiLoCo` with AdamW inside, an outer step every
  ``--sync-every`` steps on pseudo-gradients averaged with that codec
  (:mod:`ccl.bench.lm_diloco`).

``--fsdp`` runs the model sharded with FSDP2 instead, exact and with
:func:`ccl.torch.fsdp_compress` (:mod:`ccl.bench.lm_fsdp`).

Compressed methods use the algorithm that fits each codec
(:func:`ccl.collectives.auto.fitting`). Reported per method: validation loss
against steps and against training wall time (the slowest rank's, evaluation
excluded), the training time at which it first reaches exact AdamW's final
validation loss (linear between evaluations) and that time over
``ddp/adamw``'s whole training time, and the payload bytes rank 0 sent per
step (ccl's own count; the MPI library's ``Allreduce`` counted as a ring
moves it), overall and after the warm-up. DDP's bytes are not counted
(``-``).

Under the emulated cluster (``python -m ccl.bench.cluster ... --``) each rank
has a network namespace of its own; gloo then rendezvouses on rank 0's
address (:func:`ccl.bench.gloo.init_gloo`).
"""

import argparse
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.collectives.auto import fitting

from .lm_diloco import add_arguments as add_diloco_arguments
from .lm_diloco import run_diloco
from .lm_fsdp import add_arguments as add_fsdp_arguments
from .lm_fsdp import main_fsdp
from . import set_torch_threads

METHODS = ("adamw", "do", "cadam", "ddp")
DEFAULT_CODECS = ("onebit", "3lc", "topk", "sidco", "dgc", "thc")
# '\n' and the printable ASCII characters; anything else reads as '?'
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))


def stdlib_text(limit):
    """Up to ``limit`` bytes of the standard library's ``.py`` sources, in sorted path order.

    Returns
    -------
    numpy.ndarray
        uint8 indices into :data:`VOCAB` (tabs become four spaces).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    table = np.full(256, VOCAB.index("?"), dtype=np.uint8)
    for i, ch in enumerate(VOCAB):
        table[ord(ch)] = i
    parts, total = [], 0
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        if {"site-packages", "dist-packages"} & set(path.parts):
            continue
        try:
            raw = path.read_bytes().replace(b"\t", b"    ")
        except OSError:
            continue
        parts.append(table[np.frombuffer(raw, dtype=np.uint8)])
        total += len(raw)
        if total >= limit:
            break
    return np.concatenate(parts)[:limit]


def shared_text(comm, limit):
    """Rank 0's :func:`stdlib_text`, on every rank (one file system read, one Bcast)."""
    text = stdlib_text(limit) if comm.rank == 0 else None
    n = comm.bcast(None if text is None else text.size, root=0)
    if text is None:
        text = np.empty(n, dtype=np.uint8)
    comm.Bcast(text, root=0)
    return text


def make_model(args):
    """A pre-LayerNorm causal transformer over characters, seeded by ``args.seed``."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads) \
                .permute(2, 0, 3, 1, 4)
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class CharTransformer(nn.Module):
        def __init__(self, vocab, d, layers, heads, context):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            return self.head(self.ln(self.blocks(x)))

    torch.manual_seed(args.seed)
    return CharTransformer(len(VOCAB), args.d_model, args.layers, args.heads, args.context)


def windows(text, starts, context):
    """Inputs and next-character targets of the windows starting at ``starts``."""
    import torch

    index = np.asarray(starts)[:, None] + np.arange(context + 1)
    chunk = torch.from_numpy(text[index].astype(np.int64))
    return chunk[:, :-1], chunk[:, 1:]


def train_batch(train, rank, step, args):
    """This rank's batch of ``step`` (seeded by seed, step and rank: the same for every method)."""
    rng = np.random.default_rng([args.seed, step, rank])
    return windows(train, rng.integers(0, train.size - args.context - 1, args.batch),
                   args.context)


def val_loss(comm, model, val, args):
    """Mean loss over ``--val-windows`` evenly spaced windows, split over the ranks."""
    import torch

    starts = np.linspace(0, val.size - args.context - 2, args.val_windows).astype(np.int64)
    mine = np.array_split(starts, comm.size)[comm.rank]
    total = 0.0
    model.eval()
    with torch.no_grad():
        for part in np.array_split(mine, max(1, len(mine) // 32)):
            if part.size:
                x, y = windows(val, part, args.context)
                logits = model(x)
                total += float(torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
    model.train()
    return comm.allreduce(total) / (args.val_windows * args.context)


def schedule(step, args):
    """Learning-rate factor of ``step``: cosine from 1 to 0.1 (the same for every method)."""
    return 0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps))


def train(comm, name, model, optimizer, data, args, stats=None, settle=None):
    """Train ``args.steps`` steps; return a result row (identical on every rank).

    The training time is each rank's wall time over its steps, the slowest
    rank's at every evaluation; evaluations are not counted. A step's time
    starts before the barrier that lines the ranks up for it: where an
    optimizer's transfers run in the background, a rank's messages queue
    behind them (one connection per pair of ranks), so that wait is part of
    training. ``settle()`` (DiLoCo's ``synchronize``) is called, timed,
    before each evaluation, so that no transfer runs on into untimed work.
    """
    import torch

    train_text, val_text = data
    base = [group["lr"] for group in optimizer.param_groups]
    curve = {"step": [], "val_loss": [], "seconds": [], "bytes": []}
    seconds, local, bytes_at_warmup = 0.0, 0.0, None

    def record(step):
        curve["step"].append(step)
        curve["val_loss"].append(val_loss(comm, model, val_text, args))
        curve["seconds"].append(seconds)
        curve["bytes"].append(None if stats is None else stats()["bytes_sent"])
        if comm.rank == 0:
            print(f"  {name:<14} step {step:>5}/{args.steps}  val loss "
                  f"{curve['val_loss'][-1]:.4f}  {seconds:7.1f} s", flush=True)

    record(0)
    for step in range(args.steps):
        t0 = time.perf_counter()
        comm.Barrier()
        for group, lr in zip(optimizer.param_groups, base):
            group["lr"] = lr * schedule(step, args)
        x, y = train_batch(train_text, comm.rank, step, args)
        optimizer.zero_grad()
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                          y.reshape(-1)).backward()
        optimizer.step()
        evaluate = (step + 1) % args.eval_every == 0 or step + 1 == args.steps
        if evaluate and settle is not None:
            settle()
        local += time.perf_counter() - t0
        if step + 1 == args.warmup and stats is not None:
            bytes_at_warmup = stats()["bytes_sent"]
        if evaluate:
            seconds = comm.allreduce(local, op=MPI.MAX)
            record(step + 1)
    sent = curve["bytes"][-1]
    row = dict(method=name, ranks=comm.size, steps=args.steps,
               final_val_loss=curve["val_loss"][-1], train_seconds=seconds, curve=curve,
               bytes_per_step=None if sent is None else sent / args.steps,
               bytes_per_step_after_warmup=None if bytes_at_warmup is None
               else (sent - bytes_at_warmup) / max(1, args.steps - args.warmup))
    return comm.bcast(row, root=0)


def run_ccl(comm, methods, specs, data, args):
    """The exact baseline, DistributedOptimizer and CompressedAdam runs."""
    import torch

    import ccl.torch as ct

    rows = []
    ct.init(comm)
    hyper = dict(lr=args.lr, betas=(0.9, 0.98), weight_decay=args.weight_decay)
    try:
        runs = [("adamw", None)] if "adamw" in methods else []
        runs += [(m, s) for m in ("do", "cadam") if m in methods for s in specs]
        for method, spec in runs:
            model = make_model(args)
            ct.broadcast_parameters(model.state_dict(), root_rank=0)
            named = list(model.named_parameters())
            codec = None if spec is None else get_codec(spec)
            if method == "cadam":
                opt = ct.CompressedAdam(model.parameters(), eps=1e-8, **hyper,
                                        named_parameters=named, codec=codec,
                                        algorithm=fitting(codec), warmup_steps=args.warmup,
                                        lr_corrected=args.lr_corrected,
                                        min_compress_bytes=args.min_compress_bytes,
                                        **({} if args.fusion_bytes is None else
                                           {"fusion_threshold_bytes": args.fusion_bytes}))
            else:
                extra = {} if codec is None else dict(
                    codec=codec, algorithm=fitting(codec), lr_corrected=args.lr_corrected,
                    min_compress_bytes=args.min_compress_bytes)
                opt = ct.DistributedOptimizer(torch.optim.AdamW(model.parameters(), **hyper),
                                              named_parameters=named, **extra)
            label = method if codec is None else f"{method}/{codec.codec_id}"
            rows.append(train(comm, label, model, opt, data, args, opt.communication_stats))
    finally:
        ct.shutdown()
    return rows


def run_ddp(comm, data, args):
    """AdamW under DDP (gloo): no communication hook, then PowerSGD's."""
    from .gloo import gloo_group

    rows = []
    for hook in ("adamw", "powersgd"):
        with gloo_group(comm):  # a group per method: nothing of one DDP run reaches the next
            rows.append(_ddp_row(comm, hook, data, args))
    return rows


def _ddp_row(comm, hook, data, args):
    """One DDP run; its model is freed on return, inside its gloo group."""
    import torch

    from .train_methods import wrap_ddp

    model = wrap_ddp(make_model(args), hook, args.powersgd_rank, args.warmup)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98),
                            weight_decay=args.weight_decay)
    return train(comm, f"ddp/{hook}", model, opt, data, args)


def seconds_to(curve, loss):
    """Training seconds at which ``curve`` first reaches ``loss`` (linear between evaluations).

    Returns
    -------
    float or None
        None if the curve never gets that low.
    """
    points = list(zip(curve["seconds"], curve["val_loss"]))
    if points and points[0][1] <= loss:
        return points[0][0]
    for (t0, l0), (t1, l1) in zip(points, points[1:]):
        if l1 <= loss:  # l0 > loss >= l1
            return t0 + (t1 - t0) * (l0 - loss) / (l0 - l1)
    return None


def add_time_to_target(rows):
    """Per row: seconds to exact AdamW's final loss, and that over DDP-AdamW's training time."""
    exact = next((r for r in rows if r["method"] == "adamw"), None)
    ddp = next((r for r in rows if r["method"] == "ddp/adamw"), None)
    for r in rows:
        r["seconds_to_adamw_loss"] = None if exact is None else \
            seconds_to(r["curve"], exact["final_val_loss"])
        r["vs_ddp_adamw_time"] = None if ddp is None or r["seconds_to_adamw_loss"] is None \
            else r["seconds_to_adamw_loss"] / ddp["train_seconds"]


def table(rows):
    """Text table of the rows, with losses and bytes relative to exact AdamW where it ran."""
    exact = next((r for r in rows if r["method"] == "adamw"), None)
    lines = [f"{'method':<14} {'val loss':>8} {'vs adamw':>8} {'train s':>8} "
             f"{'to adamw loss s':>15} {'vs ddp/adamw':>12} "
             f"{'KB/step':>8} {'KB/step after warm-up':>21} {'fewer bytes':>11}"]
    for r in rows:
        ratio = "-" if exact is None else f"{r['final_val_loss'] / exact['final_val_loss']:.3f}"
        per, after = r["bytes_per_step"], r["bytes_per_step_after_warmup"]
        fewer = "-" if exact is None or not after else \
            f"{exact['bytes_per_step_after_warmup'] / after:.1f}x"
        reach, vs = r.get("seconds_to_adamw_loss"), r.get("vs_ddp_adamw_time")
        lines.append(f"{r['method']:<14} {r['final_val_loss']:8.4f} {ratio:>8} "
                     f"{r['train_seconds']:8.1f} "
                     f"{'-' if reach is None else f'{reach:.1f}':>15} "
                     f"{'-' if vs is None else f'{vs:.2f}x':>12} "
                     f"{'-' if per is None else f'{per / 1e3:.1f}':>8} "
                     f"{'-' if after is None else f'{after / 1e3:.1f}':>21} {fewer:>11}")
    return "\n".join(lines)


def plot(rows, path, title):
    """Validation loss against steps and against wall time, and bytes per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for r in rows:
        style = {"adamw": "k-", "ddp/adamw": "c:", "ddp/powersgd": "m:"}.get(
            r["method"], "-" if r["method"].startswith("cadam") else "--")
        axes[0].plot(r["curve"]["step"], r["curve"]["val_loss"], style, label=r["method"])
        axes[1].plot(r["curve"]["seconds"], r["curve"]["val_loss"], style, label=r["method"])
    for ax, label in ((axes[0], "step"), (axes[1], "training wall time (s, slowest rank)")):
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss (nats/char)")
        low = min(min(r["curve"]["val_loss"]) for r in rows)
        ax.set_ylim(low - 0.05, low + 1.2)
    axes[0].legend(fontsize=7, ncol=2)
    counted = [r for r in rows if r["bytes_per_step_after_warmup"]]
    axes[2].barh([r["method"] for r in counted],
                 [r["bytes_per_step_after_warmup"] / 1e3 for r in counted])
    axes[2].set_xscale("log")
    axes[2].xaxis.set_minor_formatter(plt.NullFormatter())
    axes[2].set_xlabel("KB sent per step by rank 0 after warm-up (log)")
    axes[2].invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench.lm",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        choices=METHODS + ("diloco",))
    parser.add_argument("--codecs", nargs="+", default=list(DEFAULT_CODECS),
                        help="codec ids of do/ and cadam/; unregistered ids are skipped")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=None,
                        help="CompressedAdam's exact steps (and PowerSGD's); default steps/5")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--val-windows", type=int, default=256)
    parser.add_argument("--text-bytes", type=int, default=1_500_000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--lr-corrected", action="store_true",
                        help="learning-rate-corrected error feedback in do/ and cadam/")
    parser.add_argument("--min-compress-bytes", type=int, default=16384,
                        help="parameters (buckets) below this go uncompressed")
    parser.add_argument("--fusion-bytes", type=int, default=None,
                        help="fusion_threshold_bytes of CompressedAdam (0: an allreduce per "
                             "parameter; default: its default)")
    parser.add_argument("--powersgd-rank", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    add_diloco_arguments(parser)
    add_fsdp_arguments(parser)
    parser.add_argument("--json", help="write the rows (with their curves) here")
    parser.add_argument("--plot", help="write a PNG of the curves and bytes here")
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = max(1, args.steps // 5)

    import torch

    comm = MPI.COMM_WORLD
    set_torch_threads(comm)
    specs = [c for c in args.codecs if c in registered_codecs()]
    notes = [f"codec {c!r} skipped: not registered" for c in args.codecs if c not in specs]
    ccl.warmup(specs)
    text = shared_text(comm, args.text_bytes)
    cut = text.size * 9 // 10
    data = (text[:cut], text[cut:])
    params = sum(p.numel() for p in make_model(args).parameters())
    title = (f"char transformer ({args.layers} layers, d={args.d_model}, {params} parameters) "
             f"on {text.size / 1e6:.2f} MB of the Python {sys.version_info[0]}."
             f"{sys.version_info[1]} stdlib, {comm.size} ranks x batch {args.batch}, "
             f"{args.steps} steps")
    if comm.rank == 0:
        print(title, flush=True)
    if args.fsdp:
        return main_fsdp(comm, data, args, make_model, train, seconds_to, title)
    rows = run_ccl(comm, args.methods, specs, data, args)
    if "ddp" in args.methods:
        rows += run_ddp(comm, data, args)
    if "diloco" in args.methods:
        rows += run_diloco(comm, data, args, make_model, train)
    add_time_to_target(rows)
    if comm.rank == 0:
        print(table(rows))
        print(f"({title}; AdamW lr {args.lr} cosine to 10%, warm-up {args.warmup} steps, "
              f"min_compress_bytes {args.min_compress_bytes}, lr-corrected EF "
              f"{'on' if args.lr_corrected else 'off'}, {torch.get_num_threads()} torch "
              "thread(s)/rank)")
        for note in notes:
            print(note)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"title": title, "args": vars(args), "rows": rows, "notes": notes},
                          f, indent=1)
        if args.plot:
            plot(rows, args.plot, title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
