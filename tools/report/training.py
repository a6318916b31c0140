"""The report's training section: ``ccl.torch.DistributedOptimizer`` against DDP's hooks."""

import os
import sys

from .runs import MPIEXEC, run_benchmark
from .tables import table

__all__ = ["torch_section"]


def torch_section(args, tmp, log, img_dir):
    """ccl.torch.DistributedOptimizer per codec against DDP (gloo) hooks, same model and data.

    Uses ``args.ranks`` and ``args.quick``; arguments and result as every section's (see
    :mod:`tools.report`).
    """
    plot = os.path.join(img_dir, "torch-digits.png")
    out, cmd = run_benchmark([MPIEXEC, "-n", str(args.ranks), sys.executable, "-m", "mpi4py",
                              "-m", "ccl.bench.torch_digits", "--epochs",
                              "5" if args.quick else "30", "--plot", plot],
                             os.path.join(tmp, "torch.json"), log)
    cmd = cmd.replace(plot, "docs/img/torch-digits.png")
    rows = out["rows"]
    seeds = rows[0].get("seeds", [rows[0].get("seed")])
    text = ("The same MLP, data shards and initial weights trained with "
            "`ccl.torch.DistributedOptimizer` (one codec per row with the algorithm that "
            "fits it, error feedback on) and with "
            "`torch.nn.parallel.DistributedDataParallel` on gloo (no hook, "
            "`fp16_compress_hook`, `powerSGD_hook`), in one run: SGD with momentum 0.9 and a "
            f"cosine learning-rate schedule, once per seed ({', '.join(map(str, seeds))}; the "
            "seed sets the data split and the initial weights). *test accuracy* is the mean "
            "of the seeds' final accuracies (450 test images: one image is 0.22 points), "
            "*std* their standard deviation; *train s* is the mean training time per seed. "
            "On one machine the times measure per-step overheads, not a network.")
    if out.get("notes"):
        text += " Notes: " + "; ".join(out["notes"]) + "."
    rows_text = table(rows, [("method", lambda r: f"`{r['method']}`"),
                             ("test accuracy", lambda r: f"{r['final_accuracy']:.4f}"),
                             ("std", lambda r: f"{r.get('final_accuracy_std', 0.0):.4f}"),
                             ("per seed", lambda r: " ".join(
                                 f"{a:.4f}" for a in r.get("final_accuracies",
                                                           [r["final_accuracy"]]))),
                             ("train s", lambda r: f"{r['train_seconds']:.2f}"),
                             ("MB sent/rank", lambda r: "-" if r["bytes_sent"] is None
                              else f"{r['bytes_sent'] / 1e6:.2f}")])
    return ("PyTorch: accuracy and time against DDP (scikit-learn digits)", cmd, text,
            rows_text, plot if os.path.exists(plot) else None)
