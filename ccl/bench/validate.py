"""The cost model against the emulated cluster: predicted against measured, host by host.

``python -m ccl.bench.validate --out DIR --hosts 2 3 4 6 8 12 16 --rates 100mbit 1gbit``
(root) starts one job per host count and rate on
:class:`ccl.bench.cluster.EmulatedCluster` (one rank per host). Each job first
measures what ``auto`` measures on its communicator (the link profile of
:func:`ccl.collectives.link.profile`: link speed, latency, share of cores),
then times every codec x algorithm x size with ``python -m ccl.bench``'s
sweep (:func:`ccl.bench.allreduce.run`), and writes both to
``DIR/<hosts>x<rate>.json``. A job whose file exists is not run again, so a
sweep that was stopped goes on where it stopped.

``python -m ccl.bench.validate --report DIR [--plot FILE]`` predicts every
measured row with :mod:`ccl.collectives.model` from the job's own profile
and the calibrated codec figures, and prints the share of points within
20%, a table of the points and the measured against the modelled error.
"""

import argparse
import json
import math
import os
import subprocess
import sys

__all__ = ["main", "predicted_rows", "summary", "auto_against_fixed"]

ALGORITHMS = ["ring", "tree", "direct", "allgather"]
#: The emulated links' token bucket (``ccl.bench.network.TBF``: ``burst 512kb``).
BURST_BYTES = 512 * 1024
#: A point is "within" when predicted / measured lies in [1 / (1 + TOLERANCE), 1 + TOLERANCE].
TOLERANCE = 0.2


def _inner(args):
    """One job under mpiexec: the profile, then the sweep; rank 0 writes the JSON file."""
    from mpi4py import MPI

    import ccl
    from ccl.codecs import get_codec
    from ccl.collectives import link
    from ccl.transport import channel as _channel

    from . import allreduce

    comm = MPI.COMM_WORLD
    codecs = [get_codec(c) for c in args.codecs]
    ccl.warmup([c.codec_id for c in codecs])
    channel = _channel(comm)
    found = dict(link.profile(channel, "probe"))
    found["nodes"] = list(found["nodes"])
    # what auto measures too: each codec as every rank runs it at once, at this load
    found["codec_gbps"] = {json.dumps(c.get_config(), sort_keys=True):
                           list(link.codec_speeds(channel, c)) for c in codecs}
    rows = allreduce.run(comm, codecs, args.algorithms, args.sizes, args.reps, args.warmup,
                         link_gbps=found["link_gbps"], codec_bound=False)
    if comm.rank == 0:
        with open(args.inner, "w") as f:
            json.dump({"ranks": comm.size, "rate": args.rate, "profile": found,
                       "rows": rows}, f, indent=1)
    return 0


def _sweep(args):
    from .cluster import EmulatedCluster

    os.makedirs(args.out, exist_ok=True)
    for rate in args.rates:
        for hosts in args.hosts:
            path = os.path.join(args.out, f"{hosts}x{rate}{args.suffix}.json")
            if os.path.exists(path):
                continue
            sizes = [s for s in args.sizes if hosts <= args.max_hosts.get(s, hosts)]
            cmd = [sys.executable, "-m", "mpi4py", "-m", "ccl.bench.validate",
                   "--inner", path, "--rate", rate, "--reps", str(args.reps),
                   "--warmup", str(args.warmup), "--codecs", *args.codecs,
                   "--algorithms", *args.algorithms, "--sizes", *map(str, sizes)]
            print(f"== {hosts} hosts at {rate}: {len(sizes)} sizes", flush=True)
            with EmulatedCluster(hosts, rate) as cluster:
                try:
                    result = cluster.run(cmd, timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    print(f"   killed after {args.timeout:g} s", flush=True)
                    continue
            if result.returncode:
                print(f"   exit status {result.returncode}", flush=True)
    return 0


def predicted_rows(job, link="rate"):
    """Every measured row of one job's file, with the model's time, bytes and error added.

    Parameters
    ----------
    job : dict
        A file written by a job (``ranks``, ``rate``, ``profile``, ``rows``).
    link : {"rate", "probe", "mpi"}
        The link speed the model is given: the emulated links' rate (with
        their token bucket's burst, :data:`ccl.bench.network.TBF`); what
        the job's probe measured (``auto``'s view; no burst); or the rate
        ``MPI_Allreduce`` reached at the same size in the same job (its rows
        are then left out: they would predict themselves).

    Returns
    -------
    list of dict
        The rows, each with ``predicted_s``, ``predicted_bytes`` and ``predicted_error``.
        The codec runs at the speeds the job measured with every rank running it
        (``profile["codec_gbps"]``, as ``auto`` does) where the file has them, else at
        its stated one-core speed times the job's share of the cores.
    """
    from ccl.codecs import get_codec
    from ccl.collectives import model
    from ccl.collectives.figures import codec_figures

    from .network import rate_bits_per_s

    prof, p = job["profile"], job["ranks"]
    if link == "rate":
        machine = model.Machine(rate_bits_per_s(job["rate"]) / 1e9, prof["latency_s"],
                                prof["share"], BURST_BYTES)
    else:
        machine = model.Machine(prof["link_gbps"], prof["latency_s"], prof["share"])
    # the rate MPI_Allreduce reached at each size in this job (its ring bound)
    reached = {r["bytes"]: 2 * (p - 1) / p * r["bytes"] * 8 / r["time_s"] / 1e9
               for r in job["rows"] if r["algorithm"] == "mpi" and r["time_s"] > 0}
    measured = prof.get("codec_gbps", {})
    out = []
    for row in job["rows"]:
        if link == "mpi":
            if row["algorithm"] == "mpi":
                continue  # its own measurement: nothing to predict
            machine = model.Machine(reached[row["bytes"]], prof["latency_s"], prof["share"])
        codec, figures, share = None, None, None
        if row["algorithm"] != "mpi":
            codec = get_codec(row["config"])
            figures = codec_figures(codec, calibration={})
            speeds = measured.get(json.dumps(row["config"], sort_keys=True))
            if speeds:
                figures, share = figures._replace(encode_gbps=speeds[0],
                                                  decode_gbps=speeds[1]), 1.0
        guess = model.predict(row["resolved"], codec, row["bytes"], job["ranks"], machine,
                              figures, pipelined=bool(row.get("segment_bytes")),
                              codec_share=share)
        out.append(dict(row, predicted_s=guess.seconds, predicted_bytes=guess.sent_bytes,
                        predicted_error=guess.error, rate=job.get("rate")))
    return out


def summary(rows):
    """``(within, total)``: the points whose predicted time is within :data:`TOLERANCE`."""
    ratios = [r["predicted_s"] / r["time_s"] for r in rows if r["time_s"] > 0]
    within = sum(1 / (1 + TOLERANCE) <= q <= 1 + TOLERANCE for q in ratios)
    return within, len(ratios)


def auto_against_fixed(job):
    """What ``auto`` would run in one job, per codec and size, against the best fixed choice.

    ``auto`` is asked (:func:`ccl.collectives.auto.decide`) with what it
    would know in that job: the probe's link speed, latency and share of
    cores, and the codec speeds the job measured with every rank running it.
    Its measured time is that of the row it picks (``MPI_Allreduce`` when it
    does not compress); the best fixed choice is the fastest measured row of
    the codec among the algorithms within the codec's error bound, and
    ``MPI_Allreduce``.

    Returns
    -------
    list of dict
        ``ranks``, ``rate``, ``bytes``, ``codec``, ``pick``, ``pick_s``,
        ``best``, ``best_s``, ``ratio`` (``pick_s / best_s``), ``error``
        (the pick's modelled error) and ``bound`` (the codec's).
    """
    import numpy as np

    from ccl.codecs import get_codec
    from ccl.collectives import auto, model
    from ccl.collectives.figures import codec_figures

    prof, p = job["profile"], job["ranks"]
    measured = prof.get("codec_gbps", {})
    out = []
    for nbytes in sorted({r["bytes"] for r in job["rows"]}):
        rows = [r for r in job["rows"] if r["bytes"] == nbytes]
        mpi = next(r for r in rows if r["algorithm"] == "mpi")
        for config in {json.dumps(r["config"], sort_keys=True) for r in rows
                       if r["algorithm"] != "mpi"}:
            mine = [r for r in rows if json.dumps(r["config"], sort_keys=True) == config]
            codec = get_codec(json.loads(config))
            decision = auto.decide(codec, nbytes, p, np.float32, link_gbps=prof["link_gbps"],
                                   cores=prof["share"], latency=prof["latency_s"],
                                   speeds=measured.get(config), spread=prof["spread"])
            ran = next((r for r in mine if r["algorithm"] == decision.algorithm), mpi)
            fig = codec_figures(codec, calibration={})

            def error_of(algorithm, fig=fig, codec=codec):
                return model.combined_error(fig.error, model.lossy_weight(
                    algorithm, p, fig.exact_sum, codec.homomorphic))

            error = error_of(decision.algorithm) if decision.algorithm != "mpi" else 0.0
            # the fixed choices auto may make: those within the codec's bound, and MPI
            allowed = [r for r in mine if error_of(r["algorithm"]) <= model.error_bound(fig)]
            best = min(allowed + [mpi], key=lambda r: r["time_s"])
            out.append(dict(ranks=p, rate=job.get("rate"), bytes=nbytes, codec=codec.codec_id,
                            pick=decision.algorithm, pick_s=ran["time_s"],
                            best=best["algorithm"], best_s=best["time_s"],
                            ratio=ran["time_s"] / best["time_s"], error=error,
                            bound=model.error_bound(fig)))
    return out


def _auto_report(jobs):
    print("\n| rate | ranks | MB | codec | auto runs | measured ms | best fixed within the bound "
          "| measured ms "
          "| auto / best | modelled error | bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for job in jobs:
        for r in sorted(auto_against_fixed(job), key=lambda r: (r["bytes"], r["codec"])):
            mark = "" if r["ratio"] <= 1.1 else " **over 10%**"
            print(f"| {r['rate']} | {r['ranks']} | {r['bytes'] / 2**20:g} | {r['codec']} | "
                  f"{r['pick']} | {r['pick_s'] * 1e3:.0f} | {r['best']} | "
                  f"{r['best_s'] * 1e3:.0f} | {r['ratio']:.2f}{mark} | "
                  f"{r['error']:.2e} | {r['bound']:.2e} |")


def _report(args):
    rows, jobs = [], []
    for name in sorted(os.listdir(args.report)):
        if name.endswith(".json"):
            with open(os.path.join(args.report, name)) as f:
                jobs.append(json.load(f))
            rows += predicted_rows(jobs[-1], args.link)
    if args.auto:
        _auto_report([j for j in jobs if j["ranks"] in args.auto])
        return 0
    rows.sort(key=lambda r: (r["rate"], r["ranks"], r["bytes"], r["codec"], r["algorithm"]))
    within, total = summary(rows)
    lossy = [r for r in rows if r["algorithm"] != "mpi"]
    sent = sum(abs(r["predicted_bytes"] / r["sent_bytes"] - 1) <= 0.1 for r in lossy)
    errors = sum(abs(r["predicted_error"] / r["rel_error"] - 1) <= 0.25 for r in lossy)
    print(f"predicted time within {TOLERANCE:.0%} of measured: {within} of {total} points "
          f"({within / max(total, 1):.0%}); bytes within 10%: {sent} of {len(lossy)}; "
          f"error within 25%: {errors} of {len(lossy)} (link: {args.link})")
    print("\n| rate | ranks | points | time within 20% | predicted / measured time: "
          "median (min - max) | load average |")
    print("|---|---|---|---|---|---|")
    for rate, ranks in sorted({(r["rate"], r["ranks"]) for r in rows}):
        pick = [r for r in rows if (r["rate"], r["ranks"]) == (rate, ranks)]
        q = sorted(r["predicted_s"] / r["time_s"] for r in pick)
        loads = [r["load"] for r in pick if r.get("load") is not None]
        print(f"| {rate} | {ranks} | {len(q)} | {summary(pick)[0]} | {q[len(q) // 2]:.2f} "
              f"({q[0]:.2f} - {q[-1]:.2f}) | "
              f"{min(loads, default=0):.0f} - {max(loads, default=0):.0f} |")
    if args.points:
        _points(rows)
    if args.errors:
        _errors(rows, args.errors)
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _errors(rows, rate):
    """Measured (modelled) error per codec and algorithm against ranks, smallest size."""
    rows = [r for r in rows if r["rate"] == rate and r["algorithm"] != "mpi"]
    size = min(r["bytes"] for r in rows)
    ranks = sorted({r["ranks"] for r in rows})
    found = {(r["codec"], r["algorithm"], r["ranks"]): r for r in rows if r["bytes"] == size}
    print(f"\nerror of the sum at {size / 2**20:g} MB, {rate}: measured (modelled)\n")
    print("| codec | algorithm | " + " | ".join(f"{p} ranks" for p in ranks) + " |")
    print("|---|---|" + "---|" * len(ranks))
    for codec, algorithm in sorted({k[:2] for k in found}):
        cells = [found.get((codec, algorithm, p)) for p in ranks]
        print(f"| {codec} | {algorithm} | " + " | ".join(
            "-" if r is None else f"{r['rel_error']:.2e} ({r['predicted_error']:.2e})"
            for r in cells) + " |")


def _points(rows):
    print("\n| rate | ranks | MB | codec | algorithm | measured ms | predicted ms | "
          "pred/meas | error measured | error modelled |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = r["predicted_s"] / r["time_s"]
        mark = "" if 1 / (1 + TOLERANCE) <= q <= 1 + TOLERANCE else " **miss**"
        print(f"| {r['rate']} | {r['ranks']} | {r['bytes'] / 2**20:g} | {r['codec']} | "
              f"{r['algorithm']} | {r['time_s'] * 1e3:.1f} | {r['predicted_s'] * 1e3:.1f} | "
              f"{q:.2f}{mark} | {r['rel_error']:.2e} | {r['predicted_error']:.2e} |")


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 5))
    for rate, marker in (("100mbit", "o"), ("1gbit", "s")):
        pick = [r for r in rows if r["rate"] == rate]
        if not pick:
            continue
        ax.scatter([r["time_s"] for r in pick], [r["predicted_s"] for r in pick], s=12,
                   c=[math.log2(r["ranks"]) for r in pick], marker=marker, cmap="viridis",
                   label=rate)
        lossy = [r for r in pick if r["rel_error"] > 0]
        bx.scatter([r["rel_error"] for r in lossy], [r["predicted_error"] for r in lossy],
                   s=12, marker=marker, c=[math.log2(r["ranks"]) for r in lossy],
                   cmap="viridis", label=rate)
    for axis, what in ((ax, "time (s)"), (bx, "relative error")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        low, high = axis.get_xlim()
        axis.plot([low, high], [low, high], "k-", lw=0.8)
        if what.startswith("time"):
            axis.plot([low, high], [low * 1.2, high * 1.2], "k:", lw=0.6)
            axis.plot([low, high], [low / 1.2, high / 1.2], "k:", lw=0.6)
        axis.set_xlabel(f"measured {what}")
        axis.set_ylabel(f"modelled {what}")
        axis.legend(title="colour: log2 ranks")
    ax.set_title("allreduce time, 2-16 emulated hosts")
    bx.set_title("one-shot error of the sum")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None):
    from .cli import size_arg

    parser = argparse.ArgumentParser(
        prog="python -m ccl.bench.validate",
        description="Measure codecs x algorithms on emulated clusters of several sizes (root), "
                    "or report the cost model's predictions against such measurements.")
    parser.add_argument("--out", help="directory of the jobs' JSON files (sweep)")
    parser.add_argument("--report", help="directory to report on (no MPI, no root)")
    parser.add_argument("--plot", help="with --report: write the predicted-vs-measured plot")
    parser.add_argument("--errors", metavar="RATE",
                        help="with --report: the measured and modelled error against ranks "
                             "at this rate")
    parser.add_argument("--points", action="store_true",
                        help="with --report: also a row per point")
    parser.add_argument("--link", choices=["rate", "probe", "mpi"], default="rate",
                        help="with --report: the link speed the model is given: the links' "
                             "rate, what each job's probe measured, or the rate "
                             "MPI_Allreduce reached at the same size in the same job "
                             "(default: %(default)s)")
    parser.add_argument("--auto", type=int, nargs="+", default=None,
                        help="with --report: auto's pick against the best fixed choice at "
                             "these rank counts instead")
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 3, 4, 6, 8, 12, 16])
    parser.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    parser.add_argument("--codecs", nargs="+", default=["fp16", "3lc", "onebit", "thc", "sidco"])
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    parser.add_argument("--sizes", nargs="+", type=size_arg, default=[1 << 20, 16 << 20])
    parser.add_argument("--max-hosts", nargs="*", default=[],
                        help="SIZE:HOSTS pairs: run SIZE only up to HOSTS hosts (memory)")
    parser.add_argument("--suffix", default="",
                        help="added to each job's file name (several sweeps in one directory)")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--rate", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        return _inner(args)
    if args.report:
        return _report(args)
    if not args.out:
        parser.error("give --out DIR (sweep) or --report DIR")
    args.max_hosts = {size_arg(k): int(v) for k, v in (p.split(":") for p in args.max_hosts)}
    return _sweep(args)


if __name__ == "__main__":
    sys.exit(main())
