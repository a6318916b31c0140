"""The report's top-k selection sections: SIDCo, DGC and topk against ``np.argpartition``.

One run on Laplace data and, with torch, one on the real gradients of an
MLP, with how much the fitted thresholds kept in steady state.
"""

import os
import sys

from .runs import run_benchmark
from .tables import table

__all__ = ["SELECTION_TEXT", "selection_sections"]


def _selection_table(rows):
    """Selection rows pivoted: one line per method, time/speedup/density per density."""
    rows = [r for r in rows if r["kind"] == "selection"]
    densities = list(dict.fromkeys(r["density"] for r in rows))
    by = {(r["method"], r["density"]): r for r in rows}
    lines = [{d: by[name, d] for d in densities}
             for name in dict.fromkeys(r["method"] for r in rows)]
    columns = [("method", lambda line: f"`{next(iter(line.values()))['method']}`")]
    for d in densities:
        pct = f"{d * 100:g}%"
        columns += [
            (f"ms ({pct})", lambda line, d=d: f"{line[d]['time_s'] * 1e3:.1f}"),
            ("CPU ms", lambda line, d=d: f"{line[d]['cpu_s'] * 1e3:.1f}"),
            ("vs exact", lambda line, d=d: f"{line[d]['speedup']:.1f}x"),
            ("vs exact, CPU", lambda line, d=d: f"{line[d]['cpu_speedup']:.1f}x"),
            ("density", lambda line, d=d: ("" if line[d]["achieved_density"] is None
                                           else f"{line[d]['achieved_density']:.5f}"))]
    return table(lines, columns)


SELECTION_TEXT = (
    "Time to select the top {density} of {n} float32 values on one core "
    "(`NUMBA_NUM_THREADS=1`), every method in the same run, interleaved round by round; "
    "median of {reps} rounds after a warm-up. For a codec the time is its whole `encode`: "
    "selection *and* packing of the payload (gap-coded indices, values, header); *exact* "
    "is the bare `np.argpartition(np.abs(x), -k)[-k:]`, which packs nothing, and `copy` "
    "is `np.copyto` of the input. *vs exact* = argpartition's time / this time. *CPU* is "
    "the process CPU time, which leaves out the time spent waiting for a core on a "
    "loaded machine (wall times of long calls suffer most from that). *density* = "
    "nonzero decoded values / n.")


def selection_sections(args, tmp, log, have_torch):
    """Selection speed on Laplace data and, with torch, on real gradients.

    Uses ``args.quick``; arguments and result as every section's (see
    :mod:`tools.report`), and ``have_torch`` says whether torch is installed (the
    gradients need it). Returns a list of sections.
    """
    py = sys.executable
    common = ["--elements", str(1 << 20 if args.quick else 16 << 20),
              "--reps", "3" if args.quick else "7"]
    sections = []
    rows, cmd = run_benchmark([py, "-m", "ccl.bench", "selection", *common],
                              os.path.join(tmp, "selection.json"), log)
    densities = " and ".join(f"{d * 100:g}%" for d in dict.fromkeys(r["density"] for r in rows))
    text = SELECTION_TEXT.format(density=densities, n=rows[0]["n"], reps=rows[0]["reps"])
    sections.append(("Top-k selection: SIDCo, DGC and topk against exact top-k", cmd,
                     text + " Data: Laplace, the law SIDCo-E assumes.", _selection_table(rows),
                     None))
    if not have_torch:
        return sections
    steps = "40" if args.quick else "200"
    rows, cmd = run_benchmark([py, "-m", "ccl.bench", "selection", "--data", "gradients",
                               "--grad-steps", steps, *common],
                              os.path.join(tmp, "selection-gradients.json"), log)
    first = rows[0]
    times = first["n"] / first["source_elements"]
    data = (f" Data: the gradients of every layer of the digits MLP at step "
            f"{first['grad_step']} of {steps}, concatenated ({first['source_elements']} "
            "values) and " + (f"tiled {times:.1f} times." if times > 1 else "cut to size."))
    steady = [r for r in rows if r["kind"] == "steady_state"]
    steady_table = table(steady, [
        ("method", lambda r: f"`{r['method']}`"),
        ("target density", lambda r: f"{r['density']:g}"),
        ("kept", lambda r: f"{r['kept_fraction']:.5f}"),
        ("kept / target", lambda r: f"{r['kept_fraction'] / r['density']:.3f}"),
        ("bits/value", lambda r: f"{r['bits_per_value']:.3f}"),
        ("running error", lambda r: f"{r['running_error']:.2e}")])
    tables = (_selection_table(rows) + "\n\nThe same codecs on the real per-layer gradients "
              f"of all {steps} steps, each layer with its own error-feedback residual "
              "(`ccl.bench gradients`' measurement; steady state = second half of the steps); "
              "*kept* is the fraction of values delivered non-zero; *kept / target* below 1 "
              "means the fitted threshold was too high for these data (error feedback "
              "carries what was not sent).\n\n" + steady_table)
    sections.append(("Top-k selection on real gradients", cmd,
                     SELECTION_TEXT.format(density=densities, n=first["n"], reps=first["reps"])
                     + data, tables, None))
    return sections
