"""The report's speed sections on one machine: every codec and algorithm, and codec throughput.

Both compare with a baseline measured in the same run: ``MPI_Allreduce`` of
the same data, ``np.copyto`` of the same array.
"""

import os
import sys

from .runs import MPIEXEC, run_benchmark
from .tables import config_label, human_size, table

__all__ = ["ALLREDUCE_COLUMNS", "shared_memory_section", "codecs_section"]

ALLREDUCE_COLUMNS = [
    ("size/rank", lambda r: human_size(r["bytes"])),
    ("codec", lambda r: f"`{r['codec']}`"),
    ("algorithm", lambda r: r["algorithm"]),
    ("time ms", lambda r: f"{r['time_s'] * 1e3:.2f}"),
    ("vs MPI_Allreduce", lambda r: f"{r['speedup']:.2f}x"),
    ("sent/rank", lambda r: human_size(r["sent_bytes"])),
    ("rel. error", lambda r: f"{r['rel_error']:.1e}"),
]


def shared_memory_section(args, tmp, log, img_dir):
    """Every codec with every algorithm against ``MPI_Allreduce``, over ``args.sizes``.

    Uses ``args.ranks``, ``args.sizes`` and ``args.quick``; arguments and result as
    every section's (see :mod:`tools.report`).
    """
    sizes = args.sizes or (["256KB", "4MB"] if args.quick else ["4KB", "256KB", "4MB", "64MB"])
    rows, cmd = run_benchmark([MPIEXEC, "-n", str(args.ranks), sys.executable, "-m", "mpi4py",
                               "-m", "ccl.bench", "--sizes", *sizes,
                               "--reps", "3" if args.quick else "5"],
                              os.path.join(tmp, "shm.json"), log)
    img = _plot(rows, os.path.join(img_dir, "allreduce-shm.png"),
                f"{args.ranks} ranks, shared memory")
    return ("Allreduce on shared memory", cmd,
            "Every codec with every algorithm against `MPI_Allreduce` of the same "
            "data in the same run. Shared memory is not a network: this is where "
            "compression costs most and saves least.",
            table(rows, ALLREDUCE_COLUMNS), img)


def codecs_section(args, tmp, log):
    """Encode and decode GB/s of every codec on one core, next to a copy of the same array.

    Uses ``args.quick``; arguments and result as every section's (see
    :mod:`tools.report`).
    """
    rows, cmd = run_benchmark([sys.executable, "-m", "ccl.bench", "codecs", "--elements",
                               str(1 << 20 if args.quick else 16 << 20)],
                              os.path.join(tmp, "codecs.json"), log)
    return ("Codec throughput, one core", cmd,
            "Encode and decode of float32 input in GB/s with one numba thread, next to "
            "`np.copyto` of the same array measured in the same run.",
            table(rows, [("codec", config_label),
                         ("encode GB/s", lambda r: f"{r['encode_gbs']:.2f}"),
                         ("decode GB/s", lambda r: f"{r['decode_gbs']:.2f}"),
                         ("copy GB/s", lambda r: f"{r['copy_gbs']:.2f}"),
                         ("bits/value", lambda r: f"{r['bits_per_value']:.3f}")]),
            None)


def _plot(rows, path, title):
    """Speedup against size, one line per codec/algorithm; returns the path or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    lines = {}
    for r in rows:
        if r["codec"] == "MPI_Allreduce":
            continue
        lines.setdefault(f"{r['codec']} / {r['algorithm']}", []).append(
            (r["bytes"], r["speedup"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("speedup over MPI_Allreduce (same run)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
