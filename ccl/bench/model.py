"""``python -m ccl.bench.model``: the cost model's projection to many ranks (no MPI).

``python -m ccl.bench.model --ranks 1024 --link 25gbit --size 256MB [--ranks-per-node 8]``
prints, for every codec, each algorithm's predicted time, bytes sent per
rank and relative error of the sum (:mod:`ccl.collectives.model`), whether
that error is within the codec's bound, and what ``algorithm="auto"`` would
run (:func:`ccl.collectives.auto.decide`, then ``hierarchical`` across nodes
of several ranks, as :mod:`ccl.collectives.plan` does). Every figure is
modelled: the codec inputs are the calibration file's (``python -m
ccl.bench calibrate``) or the codec's stated ones, the latency is
``--latency`` (assumed, not measured), and every rank has a core of its own
unless ``--share`` says otherwise.

``--plot DIR`` writes the figures of docs/at-scale.md instead: time, bytes
and error from 8 to 1024 ranks at 10, 25 and 100 Gbit/s.
"""

import argparse
import os
import sys

import numpy as np

__all__ = ["main", "project", "auto_pick"]

DEFAULT_CODECS = ["fp16", "3lc", "onebit", "thc", "sidco"]
#: The ranks the plots run over.
PLOT_RANKS = [8, 16, 32, 64, 128, 256, 512, 1024]
PLOT_LINKS = ["10gbit", "25gbit", "100gbit"]
#: (codec, algorithm) of the time plot: each codec's fitting algorithm and its alternative.
PLOT_SERIES = [("fp16", "ring"), ("fp16", "direct"), ("thc", "ring"), ("3lc", "direct"),
               ("onebit", "direct"), ("sidco", "allgather"), ("sidco", "direct")]


def auto_pick(codec, nbytes, p, machine):
    """What ``auto`` runs: ``decide``'s algorithm, hierarchical across nodes of several ranks."""
    from ccl.collectives import auto

    q = machine.ranks_per_node
    decision = auto.decide(codec, nbytes, p, np.float32, link_gbps=machine.link_gbps,
                           cores=machine.share, latency=machine.latency_s, ranks_per_node=q)
    if decision.algorithm != "mpi" and 1 < q < p and p % q == 0:
        return f"hierarchical/{decision.algorithm}"
    return decision.algorithm


def project(codec, nbytes, p, machine):
    """``{algorithm: Prediction}`` of every algorithm, with ``hierarchical`` across ``auto``'s
    cross algorithm where nodes hold several ranks."""
    from ccl.collectives import model

    found = model.predict_all(codec, nbytes, p, machine)
    pick = auto_pick(codec, nbytes, p, machine)
    if pick.startswith("hierarchical/"):
        found["hierarchical"] = model.predict("hierarchical", codec, nbytes, p, machine,
                                              cross=pick.split("/")[1])
    return found, pick


def _human(nbytes):
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024


def _table(codecs, nbytes, p, machine):
    from ccl.collectives import model
    from ccl.collectives.figures import codec_figures

    lines = [f"{p} ranks ({machine.ranks_per_node} per node), {machine.link_gbps:g} Gbit/s "
             f"links, latency {machine.latency_s * 1e6:g} us, {_human(nbytes)} per rank "
             "(modelled)",
             f"{'codec':>8} {'algorithm':>24} {'time ms':>10} {'sent/rank':>11} "
             f"{'rel. error':>11} {'bound':>9}  auto"]
    for codec in codecs:
        found, pick = project(codec, nbytes, p, machine)
        bound = model.error_bound(codec_figures(codec))
        for name, guess in found.items():
            label = guess.algorithm if name == "hierarchical" else name
            within = "" if name == "mpi" else ("ok" if guess.error <= bound else "over")
            mark = "<- auto" if label == pick or (pick == "mpi" and name == "mpi") else ""
            lines.append(f"{codec.codec_id:>8} {label:>24} {guess.seconds * 1e3:10.2f} "
                         f"{_human(guess.sent_bytes):>11} {guess.error:11.2e} "
                         f"{within:>9}  {mark}")
    lines.append(f"bound: {model.ERROR_BOUND:g} x the codec's one-shot error; error: "
                 "relative error of the sum, independent inputs, no error feedback")
    return "\n".join(lines)


def _named(codecs, *names):
    """The codecs of ``codecs`` whose configuration has one of the registered ``names``."""
    return [c for c in codecs if c.get_config()["id"] in names]


def _plots(codecs, nbytes, latency, per_node, out):
    """The figures of docs/at-scale.md: time, bytes and error against ranks (modelled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ccl.collectives import model

    from .network import rate_bits_per_s

    os.makedirs(out, exist_ok=True)
    fig, axes = plt.subplots(1, len(PLOT_LINKS), figsize=(15, 4.6), sharey=True)
    by_id = {c.codec_id: c for c in codecs}
    series = [(by_id[c], a) for c, a in PLOT_SERIES if c in by_id]
    for ax, link in zip(axes, PLOT_LINKS):
        gbps = rate_bits_per_s(link) / 1e9
        flat = model.Machine(gbps, latency)
        nodes = model.Machine(gbps, latency, ranks_per_node=per_node)
        mpi = [model.predict("mpi", None, nbytes, p, flat).seconds for p in PLOT_RANKS]
        ax.plot(PLOT_RANKS, mpi, "k-", lw=2, label="MPI_Allreduce (ring bound)")
        for k, (codec, algorithm) in enumerate(series):
            t = [model.predict(algorithm, codec, nbytes, p, flat).seconds for p in PLOT_RANKS]
            ax.plot(PLOT_RANKS, t, lw=1.2, color=f"C{k}", label=f"{codec.codec_id} {algorithm}")
        for k, codec in enumerate(_named(codecs, "fp16", "3lc")):
            t = [model.predict("hierarchical", codec, nbytes, p, nodes).seconds
                 for p in PLOT_RANKS]
            ax.plot(PLOT_RANKS, t, "--", lw=1.5, color=f"C{len(series) + k}",
                    label=f"{codec.codec_id} hierarchical ({per_node}/node)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{link}, {_human(nbytes)} per rank")
        ax.set_xlabel("ranks")
    axes[0].set_ylabel("modelled seconds")
    axes[-1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "at-scale-time.png"), dpi=80)
    plt.close(fig)

    ranks = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    flat = model.Machine(25.0, latency)
    for k, codec in enumerate(_named(codecs, "fp16", "thc", "onebit")):
        for algorithm, style in zip(model.FLAT, ("-", "-.", "--", ":")):
            err = [model.predict(algorithm, codec, nbytes, p, flat).error for p in ranks]
            ax.plot(ranks, err, style, color=f"C{k}", lw=1.2,
                    label=f"{codec.codec_id} {algorithm}")
    for k, codec in enumerate(_named(codecs, "fp16", "thc", "sidco")):
        for algorithm, style in (("ring", "-"), ("allgather", ":")):
            sent = [model.predict(algorithm, codec, nbytes, p, flat).sent_bytes / nbytes
                    for p in ranks]
            bx.plot(ranks, sent, style, color=f"C{k}", lw=1.2,
                    label=f"{codec.codec_id} {algorithm}")
    bx.plot(ranks, [2 * (p - 1) / p for p in ranks], "k-", lw=2, label="MPI_Allreduce")
    for axis, what in ((ax, "relative error of the sum"), (bx, "bytes sent / input bytes")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("ranks")
        axis.set_ylabel(f"modelled {what}")
        axis.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "at-scale-error-bytes.png"), dpi=80)
    plt.close(fig)
    return [os.path.join(out, n) for n in ("at-scale-time.png", "at-scale-error-bytes.png")]


#: (what, first, second): the first rank count at which ``second`` is faster than ``first``.
CROSSOVERS = [
    ("sparse gather vs MPI_Allreduce", ("sidco", "allgather"), (None, "mpi")),
    ("sparse gather vs sparse direct", ("sidco", "allgather"), ("sidco", "direct")),
    ("ring vs tree, 3lc", ("3lc", "ring"), ("3lc", "tree")),
    ("flat vs hierarchical, 3lc", ("3lc", "direct"), ("3lc", "hierarchical")),
    ("compressed (fp16, best) vs MPI_Allreduce", ("fp16", "best"), (None, "mpi")),
    ("compressed (3lc, best) vs MPI_Allreduce", ("3lc", "best"), (None, "mpi")),
]


def crossovers(nbytes, latency, per_node, links=PLOT_LINKS, ranks=None):
    """``[(what, link, ranks or None)]``: where each pair of :data:`CROSSOVERS` swaps order."""
    from ccl.codecs import get_codec
    from ccl.collectives import model

    from .network import rate_bits_per_s

    ranks = ranks or [2 ** k for k in range(1, 11)]

    def seconds(which, p, machine):
        codec = None if which[0] is None else get_codec(which[0])
        if which[1] == "best":
            return model.best(codec, nbytes, p, machine).seconds
        return model.predict(which[1], codec, nbytes, p, machine, cross="fit").seconds

    out = []
    for link in links:
        machine = model.Machine(rate_bits_per_s(link) / 1e9, latency, ranks_per_node=per_node)
        flat = machine._replace(ranks_per_node=1)
        for what, first, second in CROSSOVERS:
            where = machine if "hierarchical" in second else flat
            found = next((p for p in ranks if p % per_node == 0 or where is flat
                          if seconds(second, p, where) < seconds(first, p, where)), None)
            out.append((what, link, found))
    return out


def main(argv=None):
    from ccl.codecs import get_codec
    from ccl.collectives import model

    from .cli import codec_arg, size_arg
    from .network import rate_bits_per_s

    parser = argparse.ArgumentParser(
        prog="python -m ccl.bench.model",
        description="The cost model's predictions (time, bytes, error) of every algorithm, "
                    "and auto's pick, at any number of ranks. Nothing is measured.")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024])
    parser.add_argument("--link", default="25gbit", help="a node's link, a tc rate: 25gbit")
    parser.add_argument("--size", type=size_arg, default=256 << 20,
                        help="float32 bytes per rank (default: 256MB)")
    parser.add_argument("--ranks-per-node", type=int, default=1)
    parser.add_argument("--latency", type=float, default=10e-6,
                        help="seconds per step of messages, assumed (default: %(default)s)")
    parser.add_argument("--share", type=float, default=1.0,
                        help="each rank's share of a core (default: %(default)s)")
    parser.add_argument("--codecs", nargs="+", type=codec_arg, default=None,
                        help=f"codec ids or JSON configs (default: {' '.join(DEFAULT_CODECS)})")
    parser.add_argument("--plot", help="write the docs' figures to this directory instead")
    parser.add_argument("--crossovers", action="store_true",
                        help="print where algorithms swap order, 2 to 1024 ranks, at 10, 25 "
                             "and 100 Gbit/s, instead")
    args = parser.parse_args(argv)
    codecs = args.codecs or [get_codec(c) for c in DEFAULT_CODECS]
    if args.crossovers:
        per_node = max(args.ranks_per_node, 8)
        print(f"| crossover ({_human(args.size)} per rank, {per_node} ranks per node for "
              "hierarchical) | link | first rank count where the second is faster |")
        print("|---|---|---|")
        for what, link, found in crossovers(args.size, args.latency, per_node):
            print(f"| {what} | {link} | {'none up to 1024' if found is None else found} |")
        return 0
    if args.plot:
        for path in _plots(codecs, args.size, args.latency, max(args.ranks_per_node, 8),
                           args.plot):
            print(f"wrote {path}")
        return 0
    try:
        gbps = rate_bits_per_s(args.link) / 1e9
    except (ValueError, AttributeError):  # a bad rate, or none/shm (no link to model)
        parser.error(f"--link must be a rate such as 10gbit or 25gbit, got {args.link!r}")
    for p in args.ranks:
        machine = model.Machine(gbps, args.latency, args.share,
                                ranks_per_node=args.ranks_per_node)
        print(_table(codecs, args.size, p, machine))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
