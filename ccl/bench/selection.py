"""Top-k selection speed: SIDCo, DGC and the topk codec against exact ``np.argpartition``.

Run without mpiexec: ``python -m ccl.bench selection``. For each density the
time of every method on the same float32 input, measured in one run with
the methods interleaved (round by round, so a change in the machine's load
hits all of them alike); the figure is the median over the rounds after one
warm-up call each. One numba thread (``--threads``, set with
``numba.set_num_threads``), so the figures are per core.

For a codec the time is its whole ``encode``: selection *and* packing of
the payload (gap-coded indices, values, header). For exact top-k it is the
bare ``np.argpartition(np.abs(x), -k)[-k:]`` call, which packs nothing. The
achieved density is the count of nonzero decoded values divided by ``n``.

``--data laplace`` (default) draws Laplace values, the law SIDCo-E assumes.
``--data gradients`` trains the MLP of ``ccl.bench.gradients`` on
scikit-learn's digits (needs torch and scikit-learn), concatenates every
layer's gradient of one late step into one vector, and tiles or cuts it to
``--elements``; it then also reports the density each codec delivers on the
real per-layer gradients with error feedback in steady state
(``ccl.bench.gradients.measure``).
"""

import argparse
import json
import time

from . import numba_threads

DENSITIES = (0.01, 0.001)
EXACT = "argpartition"
COPY = "copy"


def selection_specs(density):
    """The codec configurations compared at ``density``: SIDCo (3 laws x 1-2 stages), DGC, topk."""
    # fixed stage counts (adaptive=False): the timed calls repeat one input, and an
    # adapting codec would change its M between the rounds
    specs = [{"id": "sidco", "density": density, "dist": dist, "stages": stages,
              "adaptive": False}
             for dist in ("exp", "gpareto", "gamma") for stages in (1, 2)]
    return specs + [{"id": "dgc", "density": density}, {"id": "topk", "density": density}]


# What tells the compared variants of one codec apart (SIDCo's law and stages), as a
# method's label shows it; a method without these parameters is labelled by its id alone.
LABEL_PARAMETERS = (("dist", "{}"), ("stages", "M={}"))


def method_name(config):
    """Short label of a method: ``sidco exp M=2``, ``dgc``, ``topk``."""
    return " ".join([config["id"]] + [form.format(config[name])
                                      for name, form in LABEL_PARAMETERS if name in config])


def laplace_data(n, seed=0):
    """``n`` float32 Laplace values (heavier tails than a normal, like many gradients)."""
    import numpy as np

    return np.random.default_rng(seed).laplace(size=n).astype(np.float32)


def gradient_data(n, grads, step=None):
    """One step's gradients of every layer, concatenated, then tiled or cut to ``n`` values.

    Parameters
    ----------
    n : int
        Elements wanted.
    grads : list of list of numpy.ndarray
        Per step, per layer gradients (:func:`ccl.bench.gradients.collect_gradients`).
    step : int, optional
        Which step (default: the last one, i.e. late in training).

    Returns
    -------
    data : numpy.ndarray
        ``n`` float32 values.
    source : int
        Length of the concatenated gradient before tiling or cutting.
    step : int
        The step used.
    """
    import numpy as np

    step = len(grads) - 1 if step is None else step
    vector = np.concatenate(grads[step]).astype(np.float32)
    reps = -(-n // vector.size)
    return np.tile(vector, reps)[:n].copy(), vector.size, step


def _timed(fn):
    """Wall and process CPU seconds of one call.

    On a loaded machine the wall time includes the time the process waited
    for a core; the CPU time (all threads of the process) does not.
    """
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    t1, c1 = time.perf_counter(), time.process_time()
    return t1 - t0, c1 - c0


def measure(x, densities, reps):
    """Time every method on ``x`` for every density, interleaved; return rows.

    Each row: ``method``, ``config`` (None for exact top-k and the copy),
    ``density`` (target), ``k``, ``achieved_density``, ``time_s`` (median
    wall time), ``cpu_s`` (median process CPU time), ``speedup`` and
    ``cpu_speedup`` (exact top-k time at that density / this time), ``n``.
    """
    import numpy as np

    from ccl.codecs import get_codec
    from ccl.codecs.sparse import target_count  # the count the sparse codecs target

    n = x.size
    dst = np.empty_like(x)
    # (density, name, config, callable) in the order they run in every round
    methods = []
    for density in densities:
        k = target_count(density, n)
        methods.append((density, EXACT, None,
                        lambda k=k: np.argpartition(np.abs(x), -k)[-k:]))
        for spec in selection_specs(density):
            codec = get_codec(spec)
            methods.append((density, method_name(spec), codec.get_config(),
                            lambda codec=codec: codec.encode(x)))
        methods.append((density, COPY, None, lambda: np.copyto(dst, x)))
    achieved = {}
    for density, name, config, fn in methods:  # warm-up: compile, fault pages in
        out = fn()
        if name == EXACT:
            achieved[density, name] = np.count_nonzero(x[out]) / n
        elif config is not None:
            achieved[density, name] = np.count_nonzero(get_codec(config).decode(out)) / n
        else:
            achieved[density, name] = None
    times = {(d, name): [] for d, name, _, _ in methods}
    for _ in range(reps):
        for density, name, _, fn in methods:
            times[density, name].append(_timed(fn))
    rows = []
    for density, name, config, _ in methods:
        wall, cpu = np.median(times[density, name], axis=0)
        exact_wall, exact_cpu = np.median(times[density, EXACT], axis=0)
        rows.append(dict(kind="selection", method=name, config=config, density=density,
                         k=target_count(density, n), achieved_density=achieved[density, name],
                         time_s=float(wall), cpu_s=float(cpu), speedup=float(exact_wall / wall),
                         cpu_speedup=float(exact_cpu / max(cpu, 1e-9)), n=n, reps=reps))
    return rows


def steady_state(grads, densities):
    """Density each codec delivers on the per-layer gradients with error feedback.

    Reuses :func:`ccl.bench.gradients.measure` (second half of the steps,
    one residual per layer); returns its rows tagged ``kind="steady_state"``.
    """
    from ccl.bench.gradients import measure as measure_gradients

    rows = []
    for density in densities:
        for row in measure_gradients(grads, selection_specs(density)):
            config = row["config"]
            rows.append(dict(row, kind="steady_state", method=method_name(config),
                             density=density))
    return rows


def _print_rows(rows, densities):
    by = {(r["method"], r["density"]): r for r in rows if r["kind"] == "selection"}
    names = list(dict.fromkeys(r["method"] for r in rows if r["kind"] == "selection"))
    head = f"{'method':>18}"
    for d in densities:
        head += (f" | {'ms @' + format(d, 'g'):>10} {'cpu ms':>7} {'vs exact':>8} "
                 f"{'cpu vs':>7} {'density':>9}")
    print(head)
    print("-" * len(head))
    for name in names:
        line = f"{name:>18}"
        for d in densities:
            r = by[name, d]
            dens = "" if r["achieved_density"] is None else f"{r['achieved_density']:.5f}"
            line += (f" | {r['time_s'] * 1e3:10.1f} {r['cpu_s'] * 1e3:7.1f} "
                     f"{r['speedup']:7.1f}x {r['cpu_speedup']:6.1f}x {dens:>9}")
        print(line)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench selection",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=16 * 2**20)
    parser.add_argument("--densities", type=float, nargs="+", default=list(DENSITIES))
    parser.add_argument("--reps", type=int, default=7, help="timed rounds (median)")
    parser.add_argument("--data", choices=("laplace", "gradients"), default="laplace")
    parser.add_argument("--grad-steps", type=int, default=200,
                        help="SGD steps of the digits MLP for --data gradients")
    parser.add_argument("--threads", type=int, default=1, help="numba threads (default 1)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    for d in args.densities:
        if not 0 < d <= 1:
            parser.error(f"densities must be in (0, 1], got {d}")
    if args.elements < 1 or args.reps < 1 or args.grad_steps < 2:
        parser.error("--elements and --reps must be >= 1, --grad-steps >= 2")
    with numba_threads(args.threads) as active:
        rows, notes = _run(args)
    for r in rows:
        r["threads"] = active
    _print_rows(rows, args.densities)
    steady = [r for r in rows if r["kind"] == "steady_state"]
    if steady:
        print(f"\nsteady state on the real per-layer gradients, with error feedback "
              f"({args.grad_steps} steps, second half):")
        print(f"{'method':>18} {'target':>8} {'kept':>9} {'kept/target':>11} "
              f"{'bits/value':>10}")
        for r in steady:
            print(f"{r['method']:>18} {r['density']:8g} {r['kept_fraction']:9.5f} "
                  f"{r['kept_fraction'] / r['density']:11.3f} {r['bits_per_value']:10.3f}")
    print(f"({' '.join(notes)} {args.elements} float32 elements; median of {args.reps} "
          f"interleaved rounds, {active} numba thread(s); codec time = whole encode "
          "(selection + packing), exact = bare np.argpartition(np.abs(x), -k)[-k:]; "
          "vs exact = argpartition time / this time; cpu = process CPU time, which leaves "
          "out waiting for a core on a loaded machine; density = nonzero decoded / n; "
          "copy = np.copyto of the input)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _run(args):
    """Build the data, measure; return (rows, notes for the footer)."""
    if args.data == "laplace":
        x = laplace_data(args.elements)
        rows = measure(x, args.densities, args.reps)
        for r in rows:
            r["data"] = "laplace"
        return rows, ["Laplace data,"]
    from ccl.bench.gradients import collect_gradients

    grads = collect_gradients(args.grad_steps)
    x, source, step = gradient_data(args.elements, grads)
    if source < args.elements:
        how = f"tiled {args.elements / source:.1f} times"
    elif source > args.elements:
        how = f"cut to its first {args.elements} values"
    else:
        how = "used as is"
    note = (f"gradients of step {step} of {args.grad_steps} of the digits MLP, all layers "
            f"concatenated ({source} values), {how}:")
    print(note)
    rows = measure(x, args.densities, args.reps)
    for r in rows:
        r.update(data="gradients", source_elements=source, grad_step=step)
    rows += steady_state(grads, args.densities)
    return rows, [note]
