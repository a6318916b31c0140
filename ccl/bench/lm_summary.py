"""Summarise a ``python -m ccl.bench.lm`` run: the loss every method reaches, bytes, plots.

``python -m ccl.bench.lm_summary lm.json [--plot PNG]`` prints, per row, the
final validation loss against exact DiLoCo's and exact AdamW's, the bytes
rank 0 sent over the whole run, and the training time to the worst final
loss of all rows (a loss every method reaches), against ``ddp/adamw``'s and
``cadam/thc``'s; ``--plot`` draws validation loss against wall time and
against bytes.
"""

import argparse
import json

from .lm import seconds_to

__all__ = ["summary", "plot_curves"]


def summary(rows):
    """A text table: each row against the others, on the loss every row reaches.

    The target is the worst final validation loss of all rows (every method
    reaches it); times are training seconds to reach it (linear between
    evaluations), over ``ddp/adamw``'s and ``cadam/thc``'s where they ran.
    Bytes are rank 0's over the whole run, and how many times fewer than
    exact AdamW's (``adamw``: the same exchange as ``ddp/adamw``, counted as
    a ring moves it).
    """
    by = {r["method"]: r for r in rows}
    target = max(r["final_val_loss"] for r in rows)
    reach = {m: seconds_to(r["curve"], target) for m, r in by.items()}
    exact = by.get("diloco/none")
    lines = [f"target: {target:.4f} (the worst final validation loss)",
             f"{'method':<14} {'val loss':>8} {'vs diloco/none':>14} {'vs adamw':>8} "
             f"{'MB sent':>8} {'fewer bytes':>11} {'to target s':>11} {'vs ddp/adamw':>12} "
             f"{'vs cadam/thc':>12}"]

    def ratio(a, b, fmt="{:.3f}"):
        return "-" if a is None or not b else fmt.format(a / b)
    for m, r in by.items():
        sent = None if r["bytes_per_step"] is None else r["bytes_per_step"] * r["steps"]
        adamw = by.get("adamw", {}).get("bytes_per_step")
        lines.append(
            f"{m:<14} {r['final_val_loss']:8.4f} "
            f"{ratio(r['final_val_loss'], exact and exact['final_val_loss']):>14} "
            f"{ratio(r['final_val_loss'], by.get('adamw', {}).get('final_val_loss')):>8} "
            f"{'-' if sent is None else f'{sent / 1e6:.2f}':>8} "
            f"{ratio(adamw, r['bytes_per_step'], '{:.1f}x'):>11} "
            f"{'-' if reach[m] is None else f'{reach[m]:.1f}':>11} "
            f"{ratio(reach[m], reach.get('ddp/adamw'), '{:.2f}x'):>12} "
            f"{ratio(reach[m], reach.get('cadam/thc'), '{:.2f}x'):>12}")
    return "\n".join(lines)


def plot_curves(rows, path, title):
    """Validation loss against training wall time and against bytes rank 0 sent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        style = "-" if r["method"].startswith("diloco") else "--"
        axes[0].plot(r["curve"]["seconds"], r["curve"]["val_loss"], style, label=r["method"])
        if r["curve"]["bytes"][-1]:
            axes[1].plot([b / 1e6 for b in r["curve"]["bytes"]], r["curve"]["val_loss"], style,
                         label=r["method"])
    axes[0].set_xlabel("training wall time (s, slowest rank)")
    axes[1].set_xlabel("MB sent by rank 0 (log)")
    axes[1].set_xscale("log")
    low = min(min(r["curve"]["val_loss"]) for r in rows)
    for ax in axes:
        ax.set_ylabel("validation loss (nats/char)")
        ax.set_ylim(low - 0.05, low + 1.2)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench.lm_summary",
                                     description="Summarise a python -m ccl.bench.lm JSON")
    parser.add_argument("json", help="what python -m ccl.bench.lm --json wrote")
    parser.add_argument("--plot", help="write a PNG of loss against time and bytes here")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        run = json.load(f)
    print(summary(run["rows"]))
    if args.plot:
        plot_curves(run["rows"], args.plot, run["title"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
