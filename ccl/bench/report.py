"""Regenerate ``docs/benchmarks.md``: every benchmark, its command, the machine, and plots.

``python -m ccl.bench report [--quick] [--out docs/benchmarks.md]`` runs, each
as its own process (MPI ones under the ``mpiexec`` next to this Python):

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
   on Laplace data and on real gradients (``ccl.bench selection``).

Figures are ratios against ``MPI_Allreduce`` measured in the same run; the
page records the exact command of every table.
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")

# codec configurations compared on the network, with the algorithm that fits each
NETWORK_CODECS = [
    ('{"id":"fp16"}', "ring"), ('{"id":"3lc","s":1.5}', "direct"),
    ('{"id":"onebit"}', "direct"), ('{"id":"thc","bits":4}', "ring"),
    ('{"id":"sidco","density":0.01,"dist":"gpareto","adaptive":true}', "allgather"),
    ('{"id":"randomk","density":0.01}', "ring"),
]


# THC section: bits settings, rank counts, and the decode-and-re-encode variants
THC_BITS = (2, 3, 4)
THC_RANKS = (2, 3, 4, 5)
THC_VARIANTS = ((None, "homomorphic"), ("own", "re-encode, own norm"),
                ("agreed", "re-encode, agreed norm"))


def _env(extra=None):
    env = dict(os.environ, HYDRA_LAUNCHER="fork", NUMBA_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", **(extra or {}))
    # run the ccl this module belongs to, also from a source checkout
    root = os.path.dirname(os.path.dirname(HERE))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _run(args, json_path, log, extra_env=None):
    """Run a benchmark command that writes ``--json json_path``; return (rows, command).

    ``extra_env`` adds environment variables (not shown in the command).
    """
    command = list(args) + ["--json", json_path]
    shown = " ".join(shlex.quote(a) for a in command)
    shown = shown.replace(sys.executable, "python").replace(MPIEXEC, "mpiexec")
    shown = shown.replace(json_path, "out.json")
    print(f"report: {shown}", file=log, flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=_env(extra_env), stdout=log, stderr=log)
    print(f"report:   done in {time.perf_counter() - start:.0f} s", file=log, flush=True)
    with open(json_path) as f:
        return json.load(f), shown


def machine():
    """A few lines describing this machine and the software stack."""
    import mpi4py
    import numba
    import numpy
    from mpi4py import MPI

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f", {kb / 2**20:.0f} GiB memory"
    except (OSError, ValueError, IndexError):
        pass
    return (f"{cpu}, {os.cpu_count()} cores{mem}; {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}, numpy {numpy.__version__}, "
            f"numba {numba.__version__}, mpi4py {mpi4py.__version__}, "
            f"{MPI.Get_library_version().splitlines()[0].strip()}")


def _table(rows, columns):
    head = "| " + " | ".join(name for name, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r) for _, fmt in columns) + " |" for r in rows]
    return "\n".join([head, rule] + body)


def _size(nbytes):
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}"
        nbytes /= 1024


def _config(r):
    cfg = dict(r["config"]) if "config" in r else {"id": r["codec"]}
    name = cfg.pop("id")
    extra = ", ".join(f"{k}={v}" for k, v in cfg.items() if v is not None)
    return f"`{name}`" + (f" ({extra})" if extra else "")


ALLREDUCE_COLUMNS = [
    ("size/rank", lambda r: _size(r["bytes"])),
    ("codec", lambda r: f"`{r['codec']}`"),
    ("algorithm", lambda r: r["algorithm"]),
    ("time ms", lambda r: f"{r['time_s'] * 1e3:.2f}"),
    ("vs MPI_Allreduce", lambda r: f"{r['speedup']:.2f}x"),
    ("sent/rank", lambda r: _size(r["sent_bytes"])),
    ("rel. error", lambda r: f"{r['rel_error']:.1e}"),
]


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


def build(args, log):
    out_dir = os.path.dirname(os.path.abspath(args.out))
    img_dir = os.path.join(out_dir, "img")
    os.makedirs(img_dir, exist_ok=True)
    py = sys.executable
    ranks = str(args.ranks)
    sections = []
    tmp = tempfile.mkdtemp(prefix="ccl-report-")

    sizes = args.sizes or (["256KB", "4MB"] if args.quick else ["4KB", "256KB", "4MB", "64MB"])
    rows, cmd = _run([MPIEXEC, "-n", ranks, py, "-m", "mpi4py", "-m", "ccl.bench",
                      "--sizes", *sizes, "--reps", "3" if args.quick else "5"],
                     os.path.join(tmp, "shm.json"), log)
    img = _plot(rows, os.path.join(img_dir, "allreduce-shm.png"),
                f"{args.ranks} ranks, shared memory")
    sections.append(("Allreduce on shared memory", cmd,
                     "Every codec with every algorithm against `MPI_Allreduce` of the same "
                     "data in the same run. Shared memory is not a network: this is where "
                     "compression costs most and saves least.",
                     _table(rows, ALLREDUCE_COLUMNS), img))

    for rate in args.rates:
        from .cluster import unavailable_reason
        reason = unavailable_reason()
        if reason:
            sections.append((f"Emulated cluster at {rate}", "(not run)",
                             f"Not run on this machine: {reason}.", "", None))
            continue
        size = "4MB" if args.quick else args.network_size
        rows_all = []
        cmds = []
        for codec, algorithm in NETWORK_CODECS:
            for algo in (algorithm, "auto"):
                rows, cmd = _run([py, "-m", "ccl.bench.cluster", "--hosts", ranks, "--rate",
                                  rate, "--", py, "-m", "mpi4py", "-m", "ccl.bench", "--codecs",
                                  codec, "--algorithms", algo, "--sizes", size, "--reps", "3"],
                                 os.path.join(tmp, f"net-{rate}.json"), log)
                mpi = [r for r in rows if r["codec"] == "MPI_Allreduce"]
                if not rows_all:
                    rows_all.extend(mpi)
                rows_all.extend(r for r in rows if r["codec"] != "MPI_Allreduce")
                cmds.append(cmd)
        sections.append((f"Emulated cluster: {args.ranks} hosts at {rate}", "\n".join(cmds),
                         f"{args.ranks} network namespaces joined by {rate} links "
                         "(`python -m ccl.bench.cluster`, see benchmarks-howto.md). Each codec "
                         "in its own run, each run measuring `MPI_Allreduce` again; the first "
                         "run's `MPI_Allreduce` row is shown.",
                         _table(rows_all, ALLREDUCE_COLUMNS), None))

    rows, cmd = _run([py, "-m", "ccl.bench", "codecs", "--elements",
                      str(1 << 20 if args.quick else 16 << 20)],
                     os.path.join(tmp, "codecs.json"), log)
    sections.append(("Codec throughput, one core", cmd,
                     "Encode and decode of float32 input in GB/s with one numba thread, next to "
                     "`np.copyto` of the same array measured in the same run.",
                     _table(rows, [("codec", _config),
                                   ("encode GB/s", lambda r: f"{r['encode_gbs']:.2f}"),
                                   ("decode GB/s", lambda r: f"{r['decode_gbs']:.2f}"),
                                   ("copy GB/s", lambda r: f"{r['copy_gbs']:.2f}"),
                                   ("bits/value", lambda r: f"{r['bits_per_value']:.3f}")]),
                     None))

    rows, cmd = _run([MPIEXEC, "-n", ranks, py, "-m", "mpi4py", "-m", "ccl.bench", "accuracy",
                      "--steps", "20" if args.quick else "100"],
                     os.path.join(tmp, "accuracy.json"), log)
    sections.append(("Accuracy: one allreduce, and a running sum with error feedback", cmd,
                     "Normalised error `||result - exact|| / ||exact||` of one allreduce of "
                     "fresh normal data, and of the running sum over the steps with error "
                     "feedback (a key), per algorithm; bits sent per value and rank.",
                     _table(rows, [("codec", _config), ("algorithm", lambda r: r["algorithm"]),
                                   ("1 call", lambda r: f"{r['single_error']:.2e}"),
                                   (f"{rows[0]['steps']} steps with EF",
                                    lambda r: f"{r['running_error']:.2e}"),
                                   ("bits/value sent",
                                    lambda r: f"{r['sent_bits_per_value']:.3f}")]), None))

    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    if have_torch:
        rows, cmd = _run([py, "-m", "ccl.bench", "gradients", "--steps",
                          "40" if args.quick else "200"],
                         os.path.join(tmp, "gradients.json"), log)
        sections.append(("Real gradients (MLP on scikit-learn digits)", cmd,
                         "Each layer's gradient compressed at every SGD step with its own "
                         "error-feedback residual; steady state is the second half of the "
                         "steps. `kept` is the fraction of values a codec delivered non-zero.",
                         _table(rows, [("codec", _config),
                                       ("bits/value", lambda r: f"{r['bits_per_value']:.3f}"),
                                       ("ratio vs fp32", lambda r: f"{r['ratio']:.1f}x"),
                                       ("kept", lambda r: f"{r['kept_fraction']:.4f}"),
                                       ("running error", lambda r: f"{r['running_error']:.2e}")]),
                         None))
    if have_torch:
        sections.append(_torch_section(args, tmp, log, img_dir))
    sections.append(_thc_section(args, tmp, log))
    sections.extend(_selection_sections(args, tmp, log, have_torch))
    return sections


def _thc_section(args, tmp, log):
    """THC's error per bits setting at 2-5 ranks: homomorphic ring against decode and re-encode."""
    py = sys.executable
    # Every rank of every run would compile THC's kernels again (seconds each on a
    # loaded machine); one warm-up process fills a cache that the runs then read.
    cache = {"CCL_NUMBA_CACHE": "1", "NUMBA_CACHE_DIR": os.path.join(tmp, "numba-cache")}
    subprocess.run([py, "-c", "import ccl; ccl.warmup(['thc', 'none'])"], check=True,
                   env=_env(cache), stdout=log, stderr=log)
    elements, steps = ("16384", "10") if args.quick else ("65536", "100")
    specs = [json.dumps({"id": "thc", "bits": b}, separators=(",", ":")) for b in THC_BITS]
    flags = {None: [], "own": ["--decode-reencode"], "agreed": ["--decode-reencode", "agreed"]}
    found, cmds = {}, []
    for ranks in THC_RANKS:
        for variant, _ in THC_VARIANTS:
            # fp32 (`none`) once per rank count, for the bytes it puts on the wire
            codecs = specs + (["none"] if variant is None else [])
            rows, cmd = _run([MPIEXEC, "-n", str(ranks), py, "-m", "mpi4py", "-m", "ccl.bench",
                              "accuracy", "--codecs", *codecs, "--algorithms", "ring",
                              "--elements", elements, "--steps", steps, *flags[variant]],
                             os.path.join(tmp, "thc.json"), log, extra_env=cache)
            cmds.append(cmd)
            for r in rows:
                found[r["ranks"], r["config"].get("bits"), variant] = r
    table_rows = [dict(bits=bits, ranks=ranks, fp32=found[ranks, None, None],
                       **{str(v): found[ranks, bits, v] for v, _ in THC_VARIANTS})
                  for bits in THC_BITS for ranks in THC_RANKS]

    def sent(key):
        return lambda r: (f"{r[key]['sent_bits_per_value']:.2f} "
                          f"({r[key]['sent_bytes'] / 1024:.1f} KB)")

    columns = [("bits", lambda r: str(r["bits"])), ("ranks", lambda r: str(r["ranks"]))]
    for field, label in (("single_error", "1 call"), ("running_error", f"{steps} steps, EF")):
        columns += [(f"{label}: {name}", lambda r, v=str(v), f=field: f"{r[v][f]:.2e}")
                    for v, name in THC_VARIANTS]
    columns += [("sent bits/value (per rank): homomorphic", sent("None")),
                ("re-encode", sent("own")), ("fp32 ring (`none`)", sent("fp32"))]
    text = (f"`thc` with 2, 3 and 4 bits (other parameters default) in a ring allreduce of "
            f"{elements} standard-normal float32 values per rank, at 2 to 5 ranks. "
            "*homomorphic*: relays add payloads in integer lanes, the only lossy point is "
            "each rank's own encode. *re-encode*: the same codec run with `homomorphic = "
            "False` (`--decode-reencode`), so every relay decodes the partial sum, adds its "
            "chunk and encodes again (with relay error feedback); *own norm* scales each "
            "encode by its input's norm, *agreed norm* keeps THC's norm agreed over the "
            "ranks' inputs (`--decode-reencode agreed`), which partial sums exceed. Error = "
            "`||result - exact|| / ||exact||` of one call, and of the running sum over the "
            "steps with error feedback. Sent = payload bits per value of the rank that sent "
            "most in one call (and its bytes); both re-encode variants send the same bytes.")
    return ("THC: error per bits setting, 2–5 ranks, homomorphic vs decode-and-re-encode",
            "\n".join(cmds), text, _table(table_rows, columns), None)


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
    return _table(lines, columns)


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


def _selection_sections(args, tmp, log, have_torch):
    """Selection speed on Laplace data and, with torch, on real gradients."""
    py = sys.executable
    common = ["--elements", str(1 << 20 if args.quick else 16 << 20),
              "--reps", "3" if args.quick else "7"]
    sections = []
    rows, cmd = _run([py, "-m", "ccl.bench", "selection", *common],
                     os.path.join(tmp, "selection.json"), log)
    densities = " and ".join(f"{d * 100:g}%" for d in dict.fromkeys(r["density"] for r in rows))
    text = SELECTION_TEXT.format(density=densities, n=rows[0]["n"], reps=rows[0]["reps"])
    sections.append(("Top-k selection: SIDCo, DGC and topk against exact top-k", cmd,
                     text + " Data: Laplace, the law SIDCo-E assumes.", _selection_table(rows),
                     None))
    if not have_torch:
        return sections
    steps = "40" if args.quick else "200"
    rows, cmd = _run([py, "-m", "ccl.bench", "selection", "--data", "gradients",
                      "--grad-steps", steps, *common],
                     os.path.join(tmp, "selection-gradients.json"), log)
    first = rows[0]
    times = first["n"] / first["source_elements"]
    data = (f" Data: the gradients of every layer of the digits MLP at step "
            f"{first['grad_step']} of {steps}, concatenated ({first['source_elements']} "
            "values) and " + (f"tiled {times:.1f} times." if times > 1 else "cut to size."))
    steady = [r for r in rows if r["kind"] == "steady_state"]
    steady_table = _table(steady, [
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


def _torch_section(args, tmp, log, img_dir):
    """ccl.torch.DistributedOptimizer per codec against DDP (gloo) hooks, same model and data."""
    plot = os.path.join(img_dir, "torch-digits.png")
    out, cmd = _run([MPIEXEC, "-n", str(args.ranks), sys.executable, "-m", "mpi4py", "-m",
                     "ccl.bench.torch_digits", "--epochs", "5" if args.quick else "30",
                     "--plot", plot], os.path.join(tmp, "torch.json"), log)
    cmd = cmd.replace(plot, "docs/img/torch-digits.png")
    rows = out["rows"]
    seeds = rows[0].get("seeds", [rows[0].get("seed")])
    text = ("The same MLP, data shards and initial weights trained with "
            "`ccl.torch.DistributedOptimizer` (one codec per row, error feedback on) and with "
            "`torch.nn.parallel.DistributedDataParallel` on gloo (no hook, "
            "`fp16_compress_hook`, `powerSGD_hook`), in one run: SGD with momentum 0.9 and a "
            f"cosine learning-rate schedule, once per seed ({', '.join(map(str, seeds))}; the "
            "seed sets the data split and the initial weights). *test accuracy* is the mean "
            "of the seeds' final accuracies (450 test images: one image is 0.22 points), "
            "*std* their standard deviation; *train s* is the mean training time per seed. "
            "On one machine the times measure per-step overheads, not a network.")
    if out.get("notes"):
        text += " Notes: " + "; ".join(out["notes"]) + "."
    table = _table(rows, [("method", lambda r: f"`{r['method']}`"),
                          ("test accuracy", lambda r: f"{r['final_accuracy']:.4f}"),
                          ("std", lambda r: f"{r.get('final_accuracy_std', 0.0):.4f}"),
                          ("per seed", lambda r: " ".join(
                              f"{a:.4f}" for a in r.get("final_accuracies",
                                                        [r["final_accuracy"]]))),
                          ("train s", lambda r: f"{r['train_seconds']:.2f}"),
                          ("MB sent/rank", lambda r: "-" if r["bytes_sent"] is None
                           else f"{r['bytes_sent'] / 1e6:.2f}")])
    return ("PyTorch: accuracy and time against DDP (scikit-learn digits)", cmd, text, table,
            plot if os.path.exists(plot) else None)


def render(sections, args, started, elapsed):
    lines = ["# Benchmarks", "",
             "Generated by `python -m ccl.bench report" + (" --quick" if args.quick else "") +
             (f" --sizes {' '.join(args.sizes)}" if args.sizes else "") +
             (f" --rates {' '.join(args.rates)}" if args.rates else "") + "` "
             f"on {started} in {elapsed / 60:.0f} minutes. Regenerate it with the same "
             "command (root is needed for the emulated-cluster sections).", "",
             f"**Machine:** {machine()}.", "",
             "Speed is always a ratio against `MPI_Allreduce` measured in the same run; "
             "absolute times on a shared machine are noise. The machine has few cores, so "
             "`N` ranks share them and codec time competes with the MPI library's own "
             "copies.", ""]
    for title, cmd, text, table, img in sections:
        lines += [f"## {title}", "", text, "", "```bash", cmd, "```", ""]
        if table:
            lines += [table, ""]
        if img:
            lines += [f"![{title}](img/{os.path.basename(img)})", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench report",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few steps")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rates", nargs="*", default=[],
                        help="emulated link rates, e.g. 100mbit 1gbit 10gbit (needs root)")
    parser.add_argument("--sizes", nargs="+", default=None,
                        help="shared-memory sweep sizes per rank (default 4KB 256KB 4MB 64MB)")
    parser.add_argument("--network-size", default="64MB",
                        help="message size per rank on the emulated network")
    parser.add_argument("--out", default=os.path.join("docs", "benchmarks.md"))
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d")
    t0 = time.perf_counter()
    sections = build(args, sys.stderr)
    text = render(sections, args, started, time.perf_counter() - t0)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {args.out}")
    return 0
