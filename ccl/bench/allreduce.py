"""Benchmark every codec x algorithm x size against MPI_Allreduce, in one run.

For each configuration: the median wall time over repeated runs after a
warm-up (the slowest rank's time for each run), the speedup over
``MPI_Allreduce`` of the same data measured in the same run, the payload
bytes each rank sent and the compression ratio on the wire (``MPI_Allreduce``'s
bytes / these bytes), the relative error against the exact float64 sum, and
two lower bounds:

- *wire*: the most bytes a rank sent, at the link rate (``--wire-gbps`` or
  ``CCL_BENCH_WIRE_GBPS``, else ``--link-gbps``;
  empty when the rate is unknown);
- *codec*: the same data encoded and decoded, in the same pieces as the
  algorithm's, on every rank at once and without communication (slowest
  rank, median): what the codec alone costs on these CPUs.

``bound`` is time / the larger of the two; a perfectly pipelined algorithm
approaches 1. Ring and direct rows can be repeated for several
``--segment-bytes`` (0: unpipelined), to show what pipelining gains.

The data (``--data``): ``gaussian`` (the default) draws standard normal
values per rank; ``gradients`` feeds every codec what it meets in training
in steady state: a real gradient plus the error-feedback residual of the
steps before it (:func:`steady_input`, per codec and rank), repeated up to
the message size. A codec's bytes depend on the data: 3LC's run-length
code, for one, compresses Gaussian data far better than gradients plus
residuals.
"""

import csv
import json
import os
import textwrap
import time

import numpy as np
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.collectives import CHUNKED, chunk_bounds
from ccl import config
from ccl._xp import host_norm
from ccl.collectives.auto import fitting, probe_link_gbps
from ccl.collectives.base import DEFAULT_SEGMENT_BYTES, segment_count
from ccl.threads import budgeted, channel_budget
from ccl.transport import channel as _channel

from .cli import SIZE_UNITS, Parser, codec_arg, size_arg

ALGORITHMS = ("ring", "tree", "direct", "allgather", "auto")
# "fit": the algorithm that fits each codec (ccl.collectives.auto.fitting); "hierarchical"
# runs only when asked for (it needs nodes of several ranks)
CHOICES = ALGORITHMS + ("hierarchical", "fit")


def _timed(comm, fn, reps, warmup):
    """Median over ``reps`` runs of ``fn`` (slowest rank), after ``warmup`` untimed runs.

    At least one untimed run whatever ``warmup`` says: numba compiles a kernel
    on its first call, and a variant (a size, a piece count) that
    :func:`ccl.warmup` did not meet would otherwise be compiled inside the
    first timed run.
    """
    for _ in range(max(warmup, 1)):
        fn()
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - t0
        times.append(comm.allreduce(elapsed, op=MPI.MAX))
    return float(np.median(times)), out


def _timed_pair(comm, fn, reference, reps, warmup):
    """Medians of ``fn`` and ``reference`` timed alternately, rep by rep (slowest rank).

    On a machine whose load changes while a sweep runs, a reference measured
    once at the start drifts away from the rows measured minutes later; timed
    in alternation, both see the same load.
    """
    for _ in range(max(warmup, 1)):  # at least once: see _timed
        fn()
    times, ref_times, result = [], [], None

    def once(f, into):
        comm.Barrier()
        t0 = time.perf_counter()
        out = f()
        into.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        return out

    for _ in range(reps):
        once(reference, ref_times)
        result = once(fn, times)
    return float(np.median(times)), float(np.median(ref_times)), result


DATA = ("gaussian", "gradients")


def gradient_steps(comm, seed=0, steps=40):
    """Real gradients of this rank: one flat float32 array per training step.

    Each rank trains the MLP of :func:`ccl.bench.gradients.collect_gradients`
    on scikit-learn's digits (hidden width 512, a seed of its own); every
    layer's gradient is concatenated.

    Returns
    -------
    list of numpy.ndarray
    """
    from .gradients import collect_gradients

    grads = collect_gradients(steps=steps, hidden=512, seed=seed * 10_007 + comm.rank)
    return [np.concatenate(layers) for layers in grads]


def steady_input(codec, steps):
    """The last step's gradient plus the residual error feedback holds by then.

    What a worker's codec encodes in steady state is ``g + e``: the gradient
    and the residual of every earlier step (``e = p - decode(encode(p))``).
    Configurations that refuse error feedback get ``g`` alone.

    Parameters
    ----------
    codec : Codec
    steps : list of numpy.ndarray
        :func:`gradient_steps`.

    Returns
    -------
    numpy.ndarray
    """
    residual = np.zeros_like(steps[0])
    try:
        codec.check_error_feedback()
    except ValueError:
        return steps[-1]
    for g in steps[:-1]:
        p = g + residual
        residual = p - codec.decode(codec.encode(p)).astype(np.float32)
    return steps[-1] + residual


def _tiled(comm, base, n):
    """``base`` repeated to ``n`` values, and the exact float64 sum over the ranks of that."""
    exact = np.empty(base.size, dtype=np.float64)
    comm.Allreduce(base.astype(np.float64), exact)
    return np.resize(base, n).astype(np.float32, copy=False), np.resize(exact, n)


def _codec_time(comm, codec, x, pieces, reps, warmup):
    """Encode then decode ``x`` in ``pieces`` equal pieces on every rank at once (no messages).

    With the threads the collectives give each rank (its share of the
    machine's cores): outside a collective numba would use every core in
    every rank, and the ranks would fight over them.
    """
    bounds = chunk_bounds(x.size, pieces)
    threads = channel_budget(_channel(comm))[0]

    def work():
        with budgeted(threads):
            for j in range(pieces):
                codec.decode(codec.encode(x[bounds[j]:bounds[j + 1]]))

    median, _ = _timed(comm, work, reps, warmup)
    return median


def _rows_to_run(codecs, algorithms, segments):
    """``(codec, algorithm, segment_bytes)`` of every configuration, in run order."""
    out = []
    for codec in codecs:
        for algorithm in _algorithms_for(codec, algorithms):
            # auto runs once, with the last segment size (the pipelined one in "0 1MB")
            for seg in segments if algorithm in CHUNKED else segments[-1:]:
                out.append((codec, algorithm, seg))
    return out


def run(comm, codecs, algorithms, sizes, reps, warmup, seed=0, progress=None, segments=None,
        link_gbps=None, codec_bound=True, paired=False, wire_gbps=None, data="gaussian"):
    """Run the sweep; return a list of row dicts (identical on every rank).

    ``segments`` lists the ``segment_bytes`` to run ring, direct and auto with
    (default: the library default); ``link_gbps`` is the link speed given to
    ``auto`` (None: the library's default, which measures it) and
    ``wire_gbps`` the rate of the wire bound (default ``link_gbps``). With ``paired``,
    every row's speedup is against ``MPI_Allreduce`` timed in alternation
    with it (``mpi_time_s``), not only once at the start. ``data`` is one of
    :data:`DATA` (see the module docstring).
    """
    rows = []
    ch = _channel(comm)
    if not segments:
        default = config.read("CCL_SEGMENT_BYTES")
        segments = [DEFAULT_SEGMENT_BYTES if default is None else default]
    configs = _rows_to_run(codecs, algorithms, segments)
    total = len(sizes) * len(configs)
    done = 0
    wire_gbps = link_gbps if wire_gbps is None else wire_gbps
    rate = None if wire_gbps is None else wire_gbps * 1e9 / 8
    p = comm.size
    steps = None  # the real gradients of --data gradients, made once
    for nbytes in sizes:
        n = max(nbytes // 4, 1)
        if data == "gradients":
            steps = steps or gradient_steps(comm, seed)
            x, exact = _tiled(comm, steps[-1], n)
        else:
            x = np.random.default_rng([seed, comm.rank]).standard_normal(n).astype(np.float32)
            exact = np.empty(n, dtype=np.float64)
            comm.Allreduce(x.astype(np.float64), exact)

        def mpi_allreduce(x=x):
            out = np.empty_like(x)
            comm.Allreduce(x, out)
            return out

        mpi_time, _ = _timed(comm, mpi_allreduce, reps, warmup)
        mpi_sent = 2 * (p - 1) * 4 * n // p
        rows.append(dict(codec="MPI_Allreduce", config=None, algorithm="mpi", resolved="mpi",
                         segment_bytes=None, bytes=4 * n, ranks=p, time_s=mpi_time,
                         mpi_time_s=mpi_time,
                         speedup=1.0, sent_bytes=mpi_sent, ratio=1.0,
                         wire_s=None if rate is None else mpi_sent / rate, codec_s=None,
                         bound=mpi_time / (mpi_sent / rate) if rate and mpi_sent else None,
                         rel_error=0.0, link_gbps=link_gbps))
        codec_times = {}
        for codec, algorithm, seg in configs:
            t0 = time.perf_counter()
            c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, partition_bytes=None,
                                 min_compress_bytes=None, segment_bytes=seg,
                                 link_gbps=link_gbps)
            xc, exact_c = (x, exact) if data != "gradients" else \
                _tiled(comm, steady_input(codec, steps), n)

            def call(c=c, xc=xc):
                return c.allreduce(xc)
            before = ch.bytes_sent
            call()
            sent = comm.allreduce(ch.bytes_sent - before, op=MPI.MAX)
            resolved = next(iter(c.stats()["algorithms"]))  # what auto chose
            if paired:
                median, row_mpi, y = _timed_pair(comm, call, mpi_allreduce, reps, warmup)
            else:
                (median, y), row_mpi = _timed(comm, call, reps, warmup), mpi_time
            error = host_norm(y.astype(np.float64) - exact_c) / (host_norm(exact_c) or 1.0)
            codec_s = None
            if codec_bound and resolved != "mpi":
                pieces = (p * segment_count(n, p, seg, codec.bits_per_value)
                          if resolved in CHUNKED else 1)
                key = (codec.codec_id, codec.config_hash, pieces)
                if key not in codec_times:
                    codec_times[key] = _codec_time(comm, codec, xc, pieces, reps, warmup)
                codec_s = codec_times[key]
            wire_s = None if rate is None else sent / rate
            bounds = [b for b in (wire_s, codec_s) if b]
            rows.append(dict(codec=codec.codec_id, config=codec.get_config(),
                             algorithm=algorithm, resolved=resolved,
                             segment_bytes=seg if resolved in CHUNKED else None,
                             bytes=4 * n, ranks=p, time_s=median, mpi_time_s=row_mpi,
                             speedup=row_mpi / median, sent_bytes=sent,
                             ratio=mpi_sent / sent if sent else None,
                             wire_s=wire_s, codec_s=codec_s,
                             bound=median / max(bounds) if bounds else None,
                             rel_error=error, link_gbps=link_gbps, data=data,
                             load=os.getloadavg()[0]))
            done += 1
            if progress:
                progress(done, total, rows[-1], time.perf_counter() - t0)
    return rows


def _algorithms_for(codec, algorithms):
    """``algorithms`` with "fit" replaced by the codec's fitting algorithm, no repeats."""
    out = []
    for name in algorithms:
        name = fitting(codec) if name == "fit" else name
        if name not in out:
            out.append(name)
    return out


def algorithm_label(row):
    """``ring``, ``auto→direct``, with ``/seg 1.0MB`` or ``/unpipelined`` for ring and direct."""
    name = row["algorithm"]
    if name == "auto":
        name = f"auto→{row['resolved']}"
    if row.get("segment_bytes") is not None:
        seg = row["segment_bytes"]
        name += f" /seg {_human(seg)}" if seg else " /unpipelined"
    return name


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def format_table(rows):
    """Rows as an aligned text table."""
    header = (f"{'size':>9} {'codec':>14} {'algorithm':>26} {'time ms':>9} {'vs MPI':>7} "
              f"{'sent/rank':>10} {'ratio':>7} {'wire ms':>8} {'codec ms':>8} {'bound':>6} "
              f"{'rel.err':>9}")
    lines = [header, "-" * len(header)]
    for r in rows:
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.1f}x"
        bound = "-" if r.get("bound") is None else f"{r['bound']:.2f}x"
        lines.append(f"{_human(r['bytes']):>9} {r['codec']:>14} {algorithm_label(r):>26} "
                     f"{r['time_s'] * 1e3:9.3f} {r['speedup']:6.2f}x "
                     f"{_human(r['sent_bytes']):>10} {ratio:>7} {_ms(r.get('wire_s')):>8} "
                     f"{_ms(r.get('codec_s')):>8} {bound:>6} {r['rel_error']:9.2e}")
    return "\n".join(lines)


def _human(nbytes):
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f}{unit}" if unit == "B" else f"{nbytes:.1f}{unit}"
        nbytes /= 1024


def parse_args(argv=None):
    parser = Parser(
        prog="python -m ccl.bench",
        description="Compressed allreduce against MPI_Allreduce, measured in the same run. "
                    "Run under mpiexec, e.g. mpiexec -n 4 python -m mpi4py -m ccl.bench --quick",
        epilog=f"Units: sizes in {SIZE_UNITS}; rates in Gbit/s = 10^9 bit/s. " + FOOTER)
    parser.add_argument("--quick", action="store_true",
                        help="a short sweep (finishes in under a minute at 4 ranks)")
    parser.add_argument("--codecs", nargs="+", default=None, type=codec_arg,
                        help="codec ids or JSON configs (default: every registered codec)")
    parser.add_argument("--algorithms", nargs="+", default=None, choices=CHOICES,
                        help="algorithms to run; 'fit' is the one that fits each codec "
                             "(default: all; with --quick: fit and auto)")
    parser.add_argument("--sizes", nargs="+", default=None, type=size_arg,
                        help="message sizes per rank, e.g. 4KB 1MB 64MB (1 KB = 1024 bytes)")
    parser.add_argument("--reps", type=int, default=None, help="timed runs per configuration")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--segment-bytes", nargs="+", default=None, type=size_arg,
                        help="pipeline segment sizes to run ring, direct and auto with, e.g. "
                             "0 1MB (0: unpipelined; default: CCL_SEGMENT_BYTES or 1MB)")
    parser.add_argument("--link-gbps", default=None,
                        help="link speed in Gbit/s given to auto (and the wire bound), or "
                             "'probe' (default: CCL_LINK_GBPS; unset: auto measures it)")
    parser.add_argument("--wire-gbps", type=float, default=None,
                        help="link rate in Gbit/s for the wire bound only, leaving auto to "
                             "its default (default: CCL_BENCH_WIRE_GBPS, which "
                             "python -m ccl.bench.cluster sets to its links' rate)")
    parser.add_argument("--paired", action="store_true",
                        help="time MPI_Allreduce in alternation with every row and compute "
                             "its speedup from that (robust to a changing machine load)")
    parser.add_argument("--data", choices=DATA, default="gaussian",
                        help="gaussian: normal values; gradients: real gradients plus their "
                             "error-feedback residual (steady state)")
    parser.add_argument("--no-codec-bound", action="store_true",
                        help="skip measuring the codec-only time")
    parser.add_argument("--csv", help="write the rows to this CSV file (rank 0)")
    parser.add_argument("--json", help="write the rows to this JSON file (rank 0)")
    args = parser.parse_args(argv)
    try:
        if args.link_gbps:
            args.link_gbps = config.link_gbps(args.link_gbps, "--link-gbps")
        if args.wire_gbps is None:
            args.wire_gbps = config.read("CCL_BENCH_WIRE_GBPS")
    except ValueError as exc:
        parser.error(str(exc))
    return args


FOOTER = ("'rel.err' = ||result - exact|| / ||exact|| of one call, before error feedback "
          "(exact: the float64 sum); over many steps error feedback carries the rest into later "
          "steps (python -m ccl.bench accuracy). 'wire ms' = the most bytes a rank sent at the "
          "link rate; 'codec ms' = encoding and decoding the same pieces without messages; "
          "'bound' = time / the larger of the two: 1.0x is as fast as the link or the codec "
          "allows, higher is time lost elsewhere ('-': no link rate given).")


def main(argv=None):
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    codecs = args.codecs or [get_codec(c) for c in registered_codecs()
                             if not c.startswith("test")]
    algorithms = args.algorithms or (["fit", "auto"] if args.quick else list(ALGORITHMS))
    sizes = args.sizes or ([1 << 18, 1 << 22] if args.quick       # 256 KB, 4 MB
                           else [1 << 12, 1 << 18, 1 << 22, 1 << 26])  # also 4 KB, 64 MB
    reps = args.reps or (3 if args.quick else 10)
    segments = args.segment_bytes
    link = args.link_gbps or config.read("CCL_LINK_GBPS")
    ccl.warmup([c.codec_id for c in codecs])
    rank0 = comm.rank == 0
    if link == "probe":
        link = probe_link_gbps(comm)
    t0 = time.perf_counter()

    def progress(done, total, row, seconds):
        if rank0:
            elapsed = time.perf_counter() - t0
            print(f"  [{done}/{total}] {_human(row['bytes'])} {row['codec']} "
                  f"{algorithm_label(row)}: {row['time_s'] * 1e3:.1f} ms, "
                  f"{row['speedup']:.2f}x ({seconds:.0f} s; {elapsed:.0f} s elapsed, "
                  f"about {elapsed / done * (total - done):.0f} s left)", flush=True)

    if rank0:
        print(f"ccl.bench: {comm.size} ranks, {MPI.Get_library_version().splitlines()[0]}, "
              f"host {os.uname().nodename}, link "
              f"{'measured by auto' if link is None else f'{link:g} Gbit/s'}, load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
    rows = run(comm, codecs, algorithms, sizes, reps, args.warmup, progress=progress,
               segments=segments, link_gbps=link, codec_bound=not args.no_codec_bound,
               paired=args.paired, wire_gbps=args.wire_gbps, data=args.data)
    if rank0:
        print(format_table(rows))
        print(f"({time.perf_counter() - t0:.1f} s; time = median of {reps} runs, slowest "
              "rank; 'vs MPI' = MPI_Allreduce time / this time, same data, same run"
              + (", MPI_Allreduce timed in alternation with each row)" if args.paired
                 else ")"))
        wire = args.wire_gbps or (link if isinstance(link, float) else None)
        print(textwrap.fill(f"Units: sizes in binary KB/MB (1 KB = 1024 bytes), rates in "
                            f"Gbit/s (10^9 bit/s); wire bound at "
                            f"{'no link rate' if wire is None else f'{wire:g} Gbit/s'}. "
                            + FOOTER, 100))
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]), extrasaction="ignore")
                writer.writeheader()
                writer.writerows(rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0
