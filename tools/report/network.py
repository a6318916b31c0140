"""The report's network sections: the issue's codecs per link rate, and the targets they meet.

One run per rate given with ``--rates``, on an emulated cluster
(``ccl.bench.cluster``; needs root) or on shared memory (``shm``), then a
summary of the targets of issue #7 against the rows measured.
"""

import json
import os
import sys

from .runs import run_benchmark
from .tables import algorithm_label, config_label, human_size, table

__all__ = ["NETWORK_CODECS", "NETWORK_SEGMENTS", "SPEEDUP_TARGETS", "AUTO_RATES", "AUTO_FLOOR",
           "BOUND_TARGETS", "BOUND_FACTOR", "NETWORK_COLUMNS", "TARGETS_TEXT", "network_title",
           "network_sections", "targets_table"]

# codec configurations compared on the network (issue #7), each with the algorithm that
# fits it ("fit"), unpipelined and pipelined, and with auto
NETWORK_CODECS = ['{"id":"3lc","s":1.5}', '{"id":"onebit"}',
                  '{"id":"sidco","density":0.01}', '{"id":"thc","bits":4}', '{"id":"fp16"}']
NETWORK_SEGMENTS = ("0", "1MB")
# (rate, codec id, least speedup over MPI_Allreduce) of the fitting, pipelined algorithm,
# and (rate, codec id) pairs whose auto row must reach AUTO_FLOOR; from issue #7
SPEEDUP_TARGETS = [("100mbit", "3lc", 12), ("100mbit", "onebit", 12), ("100mbit", "sidco", 10),
                   ("100mbit", "thc", 3), ("100mbit", "fp16", 1.9), ("1gbit", "3lc", 3),
                   ("1gbit", "onebit", 3), ("1gbit", "thc", 1.3), ("1gbit", "fp16", 1.5)]
AUTO_RATES, AUTO_FLOOR = ("10gbit", "shm"), 0.9
# pipelined ring/direct within this factor of the larger bound, at 1gbit
BOUND_TARGETS, BOUND_FACTOR = [("1gbit", "3lc"), ("1gbit", "thc")], 1.25


def _short_config(r):
    """The codec as NETWORK_CODECS gives it: its id and the parameters set there."""
    if not r.get("config"):
        return f"`{r['codec']}`"
    for spec in NETWORK_CODECS:
        given = json.loads(spec)
        if given["id"] == r["codec"] and all(r["config"].get(k) == v for k, v in given.items()
                                             if k != "id"):
            extra = ", ".join(f"{k}={v}" for k, v in given.items() if k != "id")
            return f"`{r['codec']}`" + (f" ({extra})" if extra else "")
    return config_label(r)


NETWORK_COLUMNS = [
    ("codec", _short_config),
    ("algorithm", algorithm_label),
    ("time ms", lambda r: f"{r['time_s'] * 1e3:.1f}"),
    ("vs MPI_Allreduce", lambda r: f"{r['speedup']:.2f}x"),
    ("sent/rank", lambda r: human_size(r["sent_bytes"])),
    ("ratio", lambda r: "-" if r.get("ratio") is None else f"{r['ratio']:.1f}x"),
    ("wire bound ms", lambda r: "-" if r.get("wire_s") is None else f"{r['wire_s'] * 1e3:.1f}"),
    ("codec bound ms", lambda r: "-" if r.get("codec_s") is None
     else f"{r['codec_s'] * 1e3:.1f}"),
    ("time / larger bound", lambda r: "-" if r.get("bound") is None else f"{r['bound']:.2f}x"),
    ("rel. error", lambda r: f"{r['rel_error']:.1e}"),
]


def _rate_gbps(rate):
    from ccl.bench.cluster import parse_rate, rate_bits_per_s
    return None if parse_rate(rate) is None else rate_bits_per_s(rate) / 1e9


def network_title(rate, hosts):
    """The title of the section of link ``rate`` (``shm``: shared memory) with ``hosts`` ranks."""
    if _rate_gbps(rate) is None:
        return f"{hosts} ranks on shared memory, 64 MB per rank"
    return f"Emulated cluster: {hosts} hosts at {rate}"


def network_sections(args, tmp, log, img_dir):
    """One run per link rate: the issue's codecs, fit (unpipelined, pipelined) and auto.

    Every run measures ``MPI_Allreduce`` once, then every configuration, on the
    same emulated network; ``auto`` and the wire bound know the link rate
    (``--link-gbps``), except on shared memory, where it is unknown.
    """
    from ccl.bench.cluster import unavailable_reason
    py = sys.executable
    size = "4MB" if args.quick else args.network_size
    sections, measured = [], {}
    for rate in args.rates:
        gbps = _rate_gbps(rate)
        title = network_title(rate, args.ranks)
        reason = unavailable_reason() if gbps is not None else None
        if reason:
            sections.append((title, "(not run)", f"Not run on this machine: {reason}.", "",
                             None))
            continue
        command = [py, "-m", "ccl.bench.cluster", "--hosts", str(args.ranks), "--rate",
                   rate if gbps is not None else "none", "--", py, "-m", "mpi4py", "-m",
                   "ccl.bench", "--codecs", *NETWORK_CODECS, "--algorithms", "fit", "auto",
                   "--sizes", size, "--reps", "3" if args.quick or (gbps or 1e9) < 1 else "5",
                   "--segment-bytes", *NETWORK_SEGMENTS, "--paired", "--data", "gradients"]
        if gbps is not None:
            command += ["--link-gbps", f"{gbps:g}"]
        rows, cmd = run_benchmark(command, os.path.join(tmp, f"net-{rate}.json"), log)
        measured[rate] = rows
        loads = [r["load"] for r in rows if r.get("load") is not None]
        where = ("shared memory (`--rate none`: no namespaces; `auto` measures the link "
                 "itself, as with no setting)" if gbps is None else
                 f"{args.ranks} network namespaces joined by {rate} links "
                 "(`python -m ccl.bench.cluster`, see benchmarks-howto.md), TCP only")
        text = (f"{args.ranks} ranks, {size} of float32 per rank, on {where}. The data are "
                "real gradients in steady state (`--data gradients`): each rank's MLP "
                "gradient on scikit-learn's digits plus the error-feedback residual its "
                "codec holds after 39 steps, repeated up to the size. One run: "
                "`MPI_Allreduce` first, then each codec with the algorithm that fits it, "
                "unpipelined (`/unpipelined`, `--segment-bytes 0`) and pipelined (`/seg "
                "1MB`: segments of about 1 MB of payload), then `auto` (`auto→x`: what "
                "it chose). *vs MPI_Allreduce* compares with `MPI_Allreduce` timed in "
                "alternation with the row (`--paired`), so both see the same machine load; "
                "the first row is `MPI_Allreduce` timed alone. *ratio* = bytes "
                "`MPI_Allreduce` sends per rank / bytes this sends; *wire bound* = the "
                "most bytes a rank sent at the link rate; *codec bound* = the same data "
                "encoded and decoded in the same pieces on every rank at once, without "
                "messages; the last column is time / the larger bound.")
        if loads:
            text += (f" Load average (1 min) while measuring: {min(loads):.1f} to "
                     f"{max(loads):.1f}.")
        img = _plot_network(rows, os.path.join(img_dir, f"allreduce-net-{rate}.png"), title)
        sections.append((title, cmd, text, table(rows, NETWORK_COLUMNS), img))
    if measured:
        sections.append(("Targets of issue #7", "(computed from the tables above)",
                         TARGETS_TEXT, targets_table(measured), None))
    return sections


TARGETS_TEXT = (
    "Each target against the rows measured above: the fitting algorithm, pipelined, for "
    "the speedups; `auto` for the floor at 10 Gbit/s and shared memory; time / larger bound "
    "for the pipelined rows at 1 Gbit/s. *missed* rows are discussed in "
    "benchmarks-howto.md (\"What limits the figures\").")


def _target_row(rows, codec, pick):
    for r in rows:
        if r["codec"] == codec and pick(r):
            return r
    return None


def targets_table(measured):
    """Rows of (target, measured, met) for every target whose rate was measured."""
    lines = []

    def add(what, value, text, ok):
        lines.append({"target": what, "measured": text, "met": "met" if ok else "missed"})

    for rate, codec, least in SPEEDUP_TARGETS:
        r = _target_row(measured.get(rate, ()), codec,
                        lambda r: r["algorithm"] != "auto" and r["segment_bytes"] != 0)
        if r is not None:
            add(f"{rate}: `{codec}` ≥ {least:g}x", r["speedup"],
                f"{r['speedup']:.2f}x ({algorithm_label(r)})", r["speedup"] >= least)
    for rate in AUTO_RATES:
        for r in measured.get(rate, ()):
            if r["algorithm"] == "auto":
                add(f"{rate}: `auto` with `{r['codec']}` ≥ {AUTO_FLOOR:g}x", r["speedup"],
                    f"{r['speedup']:.2f}x ({algorithm_label(r)})", r["speedup"] >= AUTO_FLOOR)
    for rate, codec in BOUND_TARGETS:
        r = _target_row(measured.get(rate, ()), codec,
                        lambda r: r["algorithm"] != "auto" and r["segment_bytes"] != 0)
        if r is not None and r.get("bound") is not None:
            add(f"{rate}: pipelined `{codec}` within {BOUND_FACTOR:g}x of the larger bound",
                r["bound"], f"{r['bound']:.2f}x ({algorithm_label(r)})",
                r["bound"] <= BOUND_FACTOR)
    return table(lines, [("target", lambda r: r["target"]),
                         ("measured", lambda r: r["measured"]),
                         ("", lambda r: r["met"])])


def _plot_network(rows, path, title):
    """Speedup over MPI_Allreduce per codec and algorithm (horizontal bars)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in rows if r["codec"] != "MPI_Allreduce"]
    labels = [f"{r['codec']} {algorithm_label(r)}" for r in rows]
    speed = [r["speedup"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(rows) + 1.2))
    ax.barh(range(len(rows)), speed, color=["C1" if r["algorithm"] == "auto" else
                                            ("C0" if r["segment_bytes"] else "C7")
                                            for r in rows])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("speedup over MPI_Allreduce (same run; grey: unpipelined, orange: auto)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


