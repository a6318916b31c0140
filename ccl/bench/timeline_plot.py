"""Draw one training step of a timeline (``HOROVOD_TIMELINE``/``CCL_TIMELINE``) as a PNG.

::

    python -m ccl.run -np 3 --timeline-filename timeline.json --fusion-threshold-mb 1 \\
        python -m mpi4py examples/horovod_synthetic.py --model mlp --fp16-allreduce
    python -m ccl.bench.timeline_plot timeline.json --png step.png

One row per rank and thread that ran collectives; each collective is a grey
bar with its measured phases drawn over it in colour (``NEGOTIATE``,
``ENCODE``, ``DECODE``, ``ADD``, ``WIRE``; see :mod:`ccl.trace`). A step is
the time from one start of the first collective of the trace (the first
gradient bucket of a ``DistributedOptimizer``) to the next: ``--step``
picks it (default: the last whole one). The same file opens in
chrome://tracing or https://ui.perfetto.dev for every detail.
"""

import argparse
import json

__all__ = ["load", "step_window", "plot", "main", "COLOURS"]

#: Phase colours (a collective's own bar is grey).
COLOURS = {"NEGOTIATE": "tab:purple", "ENCODE": "tab:orange", "DECODE": "tab:green",
           "ADD": "tab:olive", "WIRE": "tab:blue"}


def load(path):
    """``(events, rows)``: the complete events and ``{(pid, tid): row name}`` of a trace."""
    with open(path) as f:
        trace = json.load(f)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace
               if e.get("name") == "thread_name"}
    events = [e for e in trace if e.get("ph") == "X"]
    rows = {}
    for e in sorted(events, key=lambda e: (e["pid"], e["tid"])):
        key = (e["pid"], e["tid"])
        rows.setdefault(key, f"{names.get(e['pid'], e['pid'])} "
                             f"{threads.get(key, e['tid'])}")
    return events, rows


def _collectives(events):
    return [e for e in events if e["name"] not in COLOURS]


def step_window(events, step=None):
    """``(start, end)`` in microseconds of step ``step`` (0-based; None: the last whole one).

    Steps start where rank 0's first collective name of the trace starts again.

    Raises
    ------
    ValueError
        If the trace holds no collective, or not that many steps.
    """
    calls = sorted(_collectives(events), key=lambda e: e["ts"])
    if not calls:
        raise ValueError("the trace holds no collective")
    first = calls[0]
    starts = [e["ts"] for e in calls if e["name"] == first["name"] and e["pid"] == first["pid"]
              and e["tid"] == first["tid"]]
    end = max(e["ts"] + e["dur"] for e in events)
    bounds = starts + [end]
    if step is None:
        step = max(0, len(starts) - 2)  # the last step may be cut short by the trace's end
    if not 0 <= step < len(starts):
        raise ValueError(f"the trace holds {len(starts)} step(s); --step {step} is not one")
    return bounds[step], bounds[step + 1]


def plot(events, rows, window, path, title=None):
    """Draw the events within ``window`` (microseconds) to a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    start, end = window
    shown = [e for e in events if e["ts"] + e["dur"] >= start and e["ts"] <= end]
    keys = {(e["pid"], e["tid"]) for e in shown}
    rows = {key: name for key, name in rows.items() if key in keys}
    index = {key: i for i, key in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 1.4))
    # collectives first, their phases over them
    for e in sorted(shown, key=lambda e: e["name"] in COLOURS):
        y = index[(e["pid"], e["tid"])]
        left, width = (e["ts"] - start) / 1e3, e["dur"] / 1e3
        if e["name"] in COLOURS:
            # WIRE waits nest inside NEGOTIATE: drawn thinner, so both show
            height = 0.3 if e["name"] == "WIRE" else 0.55
            ax.barh(y, width, left=left, height=height, color=COLOURS[e["name"]],
                    linewidth=0)
        else:
            ax.barh(y, width, left=left, height=0.8, color="0.88", edgecolor="0.3",
                    linewidth=0.6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(rows.values()), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (end - start) / 1e3)
    ax.set_xlabel("ms from the start of the step's first collective")
    handles = [Patch(color="0.85", label="collective")] + [
        Patch(color=c, label=n) for n, c in COLOURS.items()]
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              ncol=len(handles), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None):
    """Command-line entry point; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m ccl.bench.timeline_plot",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="a timeline JSON file")
    parser.add_argument("--png", required=True, help="the picture to write")
    parser.add_argument("--step", type=int, default=None,
                        help="which step, from 0 (default: the last whole one)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    events, rows = load(args.trace)
    try:
        window = step_window(events, args.step)
    except ValueError as exc:
        parser.error(str(exc))
    plot(events, rows, window, args.png, args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
