"""Regenerate ``docs/benchmarks.md``: every benchmark, its command, the machine, and plots.

A script of the repository, not of the installed package: from the
repository root, ``python -m tools.report [--quick] [--out docs/benchmarks.md]``
runs, each as its own process (MPI ones under the ``mpiexec`` next to this Python):

1. compressed allreduce against ``MPI_Allreduce`` on shared memory;
2. the same on emulated clusters (``ccl.bench.cluster``; needs root) at the
   link rates given with ``--rates``;
3. single-core codec throughput (``ccl.bench codecs``);
4. accuracy of one call and of 100 steps with error feedback
   (``ccl.bench accuracy``);
5. codecs on real torch gradients (``ccl.bench gradients``; needs torch);
6. THC's error per bits setting at 2-5 ranks, homomorphic against decode
   and re-encode at every relay (``ccl.bench accuracy --decode-reencode``);
7. top-k selection time of SIDCo, DGC and topk against ``np.argpartition``,
   on Laplace data and on real gradients (``ccl.bench selection``);
8. error feedback in steady state on real MLP, CNN and LM gradients
   (``ccl.bench steady``; needs torch).

Figures are ratios against ``MPI_Allreduce`` measured in the same run; the
page records the exact command of every table.

Each family of sections has its own module (``speed``, ``network``,
``accuracy``, ``training``, ``selection``, ``steady``), and each section is a function
``*_section(args, tmp, log[, img_dir])``: ``args`` are the report's
arguments, ``tmp`` a folder for the benchmarks' rows, ``log`` a file that
receives the commands and their output, ``img_dir`` where plots go. A
section is returned as ``(title, command, text, table, image or None)``,
which :func:`tools.report.page.render` turns into one ``## title``
block of the page.
"""

import argparse
import os
import sys
import tempfile
import time

# Each family of sections has its own module; the names below were all in this
# module once and stay importable from here.
from .accuracy import (THC_BITS, THC_RANKS, THC_VARIANTS, accuracy_section,
                       gradients_section, thc_section)
from .network import (AUTO_FLOOR, AUTO_RATES, BOUND_FACTOR, BOUND_TARGETS, NETWORK_CODECS,
                      NETWORK_COLUMNS, NETWORK_SEGMENTS, SPEEDUP_TARGETS, TARGETS_TEXT,
                      network_sections, targets_table)
from .page import NETWORK_NOTE, machine, merge_network, render
from .runs import MPIEXEC, ROOT
from .selection import SELECTION_TEXT, selection_sections
from .speed import ALLREDUCE_COLUMNS, codecs_section, shared_memory_section
from .steady import steady_section
from .training import torch_section

__all__ = ["ALLREDUCE_COLUMNS", "AUTO_FLOOR", "AUTO_RATES", "BOUND_FACTOR", "BOUND_TARGETS",
           "MPIEXEC", "NETWORK_CODECS", "NETWORK_COLUMNS", "NETWORK_NOTE",
           "NETWORK_SEGMENTS", "ROOT", "SELECTION_TEXT", "SPEEDUP_TARGETS", "TARGETS_TEXT",
           "THC_BITS", "THC_RANKS", "THC_VARIANTS", "build", "machine", "main", "merge_network",
           "network_sections", "render", "targets_table"]


def build(args, log):
    """Run every benchmark of the report (or only the network ones); return the sections.

    Parameters
    ----------
    args : argparse.Namespace
        The report's arguments.
    log : file
        Receives the commands and their output.

    Returns
    -------
    list of tuple
        ``(title, command, text, table, image or None)`` per section, in page order.
    """
    out_dir = os.path.dirname(os.path.abspath(args.out))
    img_dir = os.path.join(out_dir, "img")
    os.makedirs(img_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ccl-report-")

    if args.only_network:
        return network_sections(args, tmp, log, img_dir)
    sections = [shared_memory_section(args, tmp, log, img_dir)]
    sections.extend(network_sections(args, tmp, log, img_dir))
    sections.append(codecs_section(args, tmp, log))
    sections.append(accuracy_section(args, tmp, log))
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    if have_torch:
        sections.append(gradients_section(args, tmp, log))
        sections.append(steady_section(args, tmp, log))
        sections.append(torch_section(args, tmp, log, img_dir))
    sections.append(thc_section(args, tmp, log))
    sections.extend(selection_sections(args, tmp, log, have_torch))
    return sections


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.report",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few steps")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rates", nargs="*", default=[],
                        help="emulated link rates, e.g. 100mbit 1gbit 10gbit (needs root); "
                             "'shm' runs the same sweep on shared memory")
    parser.add_argument("--only-network", action="store_true",
                        help="run only the --rates sections and replace them in --out, "
                             "keeping every other section of the existing page")
    parser.add_argument("--sizes", nargs="+", default=None,
                        help="shared-memory sweep sizes per rank (default 4KB 256KB 4MB 64MB)")
    parser.add_argument("--network-size", default="64MB",
                        help="message size per rank on the emulated network")
    parser.add_argument("--out", default=os.path.join("docs", "benchmarks.md"))
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d")
    t0 = time.perf_counter()
    sections = build(args, sys.stderr)
    if args.only_network:
        text = merge_network(args.out, sections, args, started, time.perf_counter() - t0)
    else:
        text = render(sections, args, started, time.perf_counter() - t0)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {args.out}")
    return 0
