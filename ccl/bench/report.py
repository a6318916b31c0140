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
   on Laplace data and on real gradients (``ccl.bench selection``);
8. error feedback in steady state on real MLP, CNN and LM gradients
   (``ccl.bench steady``; needs torch).

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


def _steady_section(args, tmp, log):
    """Error feedback in steady state on real MLP, CNN and LM gradients (``ccl.bench steady``)."""
    py = sys.executable
    steps = ["--steps", "20", "--zero-steps", "20"] if args.quick else []
    rows, cmd = _run([py, "-m", "ccl.bench", "steady"] + steps,
                     os.path.join(tmp, "steady.json"), log)
    zero = rows[0]["zero_steps"] if rows else 0
    return ("Error feedback in steady state", cmd,
            "Real gradients of three models (an MLP and a CNN on scikit-learn's digits, a "
            "word-level GRU language model with an embedding), every layer through "
            "`Communicator(codec, algorithm=\"ring\", min_compress_bytes=0).allreduce(g, "
            "key=layer)` at one rank; steady state is the second half of the gradient steps. "
            "*density/target*: values delivered non-zero over the target count "
            "`max(1, ceil(density*n))` summed over the layers; *bits/value*: payload bits per "
            "input value (headers included), against the codec's stated `bits_per_value`; "
            f"*error after zeros*: the running-sum error after {zero} zero steps.",
            _table(rows, [("model", lambda r: r["model"]), ("codec", _config),
                          ("density/target", lambda r: "-" if r["density_ratio"] is None
                           else f"{r['density_ratio']:.2f}"),
                          ("bits/value", lambda r: f"{r['bits_per_value']:.3f}"),
                          ("stated", lambda r: f"{r['stated_bits_per_value']:.3f}"),
                          ("error after gradients", lambda r: f"{r['err_grad']:.2e}"),
                          ("error after zeros", lambda r: f"{r['err_zero']:.2e}")]),
            None)


def _config(r):
    cfg = dict(r["config"]) if r.get("config") else {"id": r["codec"]}
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
    return _config(r)


NETWORK_COLUMNS = [
    ("codec", _short_config),
    ("algorithm", lambda r: _label(r)),
    ("time ms", lambda r: f"{r['time_s'] * 1e3:.1f}"),
    ("vs MPI_Allreduce", lambda r: f"{r['speedup']:.2f}x"),
    ("sent/rank", lambda r: _size(r["sent_bytes"])),
    ("ratio", lambda r: "-" if r.get("ratio") is None else f"{r['ratio']:.1f}x"),
    ("wire bound ms", lambda r: "-" if r.get("wire_s") is None else f"{r['wire_s'] * 1e3:.1f}"),
    ("codec bound ms", lambda r: "-" if r.get("codec_s") is None
     else f"{r['codec_s'] * 1e3:.1f}"),
    ("time / larger bound", lambda r: "-" if r.get("bound") is None else f"{r['bound']:.2f}x"),
    ("rel. error", lambda r: f"{r['rel_error']:.1e}"),
]


def _label(row):
    from .allreduce import algorithm_label
    return algorithm_label(row)


def _rate_gbps(rate):
    from .cluster import parse_rate, rate_bits_per_s
    return None if parse_rate(rate) is None else rate_bits_per_s(rate) / 1e9


def _network_title(rate, hosts):
    if _rate_gbps(rate) is None:
        return f"{hosts} ranks on shared memory, 64 MB per rank"
    return f"Emulated cluster: {hosts} hosts at {rate}"


def network_sections(args, tmp, log, img_dir):
    """One run per link rate: the issue's codecs, fit (unpipelined, pipelined) and auto.

    Every run measures ``MPI_Allreduce`` once, then every configuration, on the
    same emulated network; ``auto`` and the wire bound know the link rate
    (``--link-gbps``), except on shared memory, where it is unknown.
    """
    from .cluster import unavailable_reason
    py = sys.executable
    size = "4MB" if args.quick else args.network_size
    sections, measured = [], {}
    for rate in args.rates:
        gbps = _rate_gbps(rate)
        title = _network_title(rate, args.ranks)
        reason = unavailable_reason() if gbps is not None else None
        if reason:
            sections.append((title, "(not run)", f"Not run on this machine: {reason}.", "",
                             None))
            continue
        command = [py, "-m", "ccl.bench.cluster", "--hosts", str(args.ranks), "--rate",
                   rate if gbps is not None else "none", "--", py, "-m", "mpi4py", "-m",
                   "ccl.bench", "--codecs", *NETWORK_CODECS, "--algorithms", "fit", "auto",
                   "--sizes", size, "--reps", "3" if args.quick or (gbps or 1e9) < 1 else "5",
                   "--segment-bytes", *NETWORK_SEGMENTS, "--paired"]
        if gbps is not None:
            command += ["--link-gbps", f"{gbps:g}"]
        rows, cmd = _run(command, os.path.join(tmp, f"net-{rate}.json"), log)
        measured[rate] = rows
        loads = [r["load"] for r in rows if r.get("load") is not None]
        where = ("shared memory (`--rate none`: no namespaces; the link is unknown to "
                 "`auto`, which therefore does not compress)" if gbps is None else
                 f"{args.ranks} network namespaces joined by {rate} links "
                 "(`python -m ccl.bench.cluster`, see benchmarks-howto.md), TCP only")
        text = (f"{args.ranks} ranks, {size} of float32 per rank, on {where}. One run: "
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
        sections.append((title, cmd, text, _table(rows, NETWORK_COLUMNS), img))
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
                f"{r['speedup']:.2f}x ({_label(r)})", r["speedup"] >= least)
    for rate in AUTO_RATES:
        for r in measured.get(rate, ()):
            if r["algorithm"] == "auto":
                add(f"{rate}: `auto` with `{r['codec']}` ≥ {AUTO_FLOOR:g}x", r["speedup"],
                    f"{r['speedup']:.2f}x ({_label(r)})", r["speedup"] >= AUTO_FLOOR)
    for rate, codec in BOUND_TARGETS:
        r = _target_row(measured.get(rate, ()), codec,
                        lambda r: r["algorithm"] != "auto" and r["segment_bytes"] != 0)
        if r is not None and r.get("bound") is not None:
            add(f"{rate}: pipelined `{codec}` within {BOUND_FACTOR:g}x of the larger bound",
                r["bound"], f"{r['bound']:.2f}x ({_label(r)})", r["bound"] <= BOUND_FACTOR)
    return _table(lines, [("target", lambda r: r["target"]),
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
    labels = [f"{r['codec']} {_label(r)}" for r in rows]
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


def build(args, log):
    out_dir = os.path.dirname(os.path.abspath(args.out))
    img_dir = os.path.join(out_dir, "img")
    os.makedirs(img_dir, exist_ok=True)
    py = sys.executable
    ranks = str(args.ranks)
    sections = []
    tmp = tempfile.mkdtemp(prefix="ccl-report-")

    if args.only_network:
        return network_sections(args, tmp, log, img_dir)
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

    sections.extend(network_sections(args, tmp, log, img_dir))

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
        sections.append(_steady_section(args, tmp, log))
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
            "`ccl.torch.DistributedOptimizer` (one codec per row with the algorithm that "
            "fits it, error feedback on) and with "
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


NETWORK_NOTE = "**Network sections:**"


def merge_network(path, sections, args, started, elapsed):
    """The page at ``path`` with the network sections replaced (or added before the rest).

    Sections are the page's ``## `` blocks; a network section is one this
    report writes for a rate (its title comes from :func:`_network_title`),
    or the targets summary.
    """
    with open(path) as f:
        old = f.read()
    head, *blocks = old.split("\n## ")
    titles = {_network_title(rate, args.ranks) for rate in args.rates}
    network_prefixes = ("Emulated cluster", "Targets of issue #7") + tuple(titles)
    kept = [b for b in blocks if not b.startswith(network_prefixes)
            and " ranks on shared memory, 64 MB per rank" not in b.split("\n", 1)[0]]
    note = (f"{NETWORK_NOTE} regenerated by `python -m ccl.bench report --only-network "
            f"--rates {' '.join(args.rates)}` on {started} in {elapsed / 60:.0f} minutes "
            "(root); the other sections are as the command above left them.")
    lines = [line for line in head.rstrip("\n").split("\n")
             if not line.startswith(NETWORK_NOTE)]
    new = render(sections, args, started, elapsed).split("\n## ")[1:]
    # the network sections come first: they are what the page is mostly read for
    return "\n## ".join(["\n".join(lines) + "\n\n" + note + "\n"] + new + kept).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ccl.bench report",
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
