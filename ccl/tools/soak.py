"""A long run of mixed collectives, each checked: ``python -m ccl.tools.soak --calls 10000``.

Run under MPI (``mpiexec -n 4 python -m mpi4py -m ccl.tools.soak``). Every rank
draws the same plan from ``--seed``: each call is an allreduce,
reduce-scatter or allgather of a random size (0, 1, around the rank count,
primes, random), with a random codec (every registered one, plus the
variants in :data:`ccl.tools.VARIANTS`), algorithm, op and key. Every rank
can rebuild every other rank's input, so the exact float64 reference needs
no communication. Each call is checked:

* shape and dtype, and bitwise agreement of the result on every rank;
* ``none``: the exact sum to float32 rounding; ``fp16``/``bf16``: to their
  rounding (:data:`ccl.testing.CAST_ROUNDING`);
* other (lossy) codecs without a key: finite, and within a loose bound
  (:data:`LOSSY_FACTOR` times the sum of the ranks' largest inputs);
* calls with a key (through one :class:`ccl.Communicator` with small
  partitions) keep error feedback; at the end, for every key, what was
  delivered plus the residuals still held equals what was put in
  (:func:`ccl.testing.conservation_tolerance`): nothing lost.

The resident set size is read after a warm-up (``--warmup`` calls) and at
the end; rank 0 prints the figures, and the exit status is 1 if any check
failed on any rank.
"""

import argparse
import os
import resource
import sys
import time

import numpy as np
from mpi4py import MPI

from .. import Communicator, allgather, compressed_allreduce, reduce_scatter, warmup
from ..codecs import get_codec, registered_codecs
from ..testing import CAST_ROUNDING, cast_bound, conservation_tolerance, same_on_all_ranks
from . import VARIANTS

__all__ = ["CAST_ROUNDING", "LOSSY_FACTOR", "conservation_tolerance", "rss_bytes", "run",
           "main"]

EPS32 = float(np.finfo(np.float32).eps)
#: Keyless lossy calls: |result - exact| <= LOSSY_FACTOR * (sum over ranks of max|x_r|),
#: times n for random-k with ``scale=True`` (it multiplies kept values by n / k). Loose on
#: purpose: these calls must not return garbage; keyed calls check conservation exactly.
LOSSY_FACTOR = 32.0
_PRIMES = (2, 3, 5, 7, 13, 31, 97, 251, 1009, 4099)
_KEYS = 12


def rss_bytes():
    """This process's resident set size now (Linux ``/proc``; else the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _inputs(seed, call, rank, n):
    rng = np.random.default_rng([seed, call, rank])
    x = rng.standard_normal(n).astype(np.float32)
    return x * np.float32(10.0 ** rng.integers(-2, 3))  # magnitudes vary between ranks


def _refuses_error_feedback(config):
    """Whether the codec of ``config`` refuses error feedback (its residual would grow)."""
    try:
        get_codec(config).check_error_feedback()
    except ValueError:
        return True
    return False


class _Plan:
    """The shared random plan: codecs, key specifications, then one spec per call."""

    def __init__(self, seed, p, max_size):
        self.rng = np.random.default_rng([seed, 0x50a4])
        self.p, self.max_size = p, max_size
        self.codecs = [{"id": cid} for cid in registered_codecs()] + list(VARIANTS)
        self.keys = [self._spec(keyed=True) for _ in range(_KEYS)]

    def _size(self):
        r = self.rng.random()
        if r < 0.15:
            return int(self.rng.choice([0, 1, 2]))
        if r < 0.3:
            return max(0, self.p + int(self.rng.integers(-1, 2)))
        if r < 0.55:
            return int(self.rng.choice(_PRIMES))
        return int(self.rng.integers(3, self.max_size + 1))

    def _spec(self, keyed):
        collective = str(self.rng.choice(["allreduce", "allreduce", "reduce_scatter",
                                          "allgather"]))
        # keyed calls keep residuals: configurations whose residual grows (scaled random-k,
        # l2 dithering) are refused there, so keyed calls draw from the others
        codecs = [c for c in self.codecs if not (keyed and _refuses_error_feedback(c))]
        spec = {"collective": collective, "codec": codecs[self.rng.integers(len(codecs))],
                "op": str(self.rng.choice(["sum", "mean"])), "n": self._size()}
        if collective == "allgather":
            spec["op"] = "sum"
            spec["lengths"] = [self._size() % 64 for _ in range(self.p)]
        return spec

    def call(self, index):
        """Spec of call ``index`` (``key`` is None or an index into the key table)."""
        if self.rng.random() < 0.5:
            key = int(self.rng.integers(_KEYS))
            spec = dict(self.keys[key], key=key)
        else:
            spec = dict(self._spec(keyed=False), key=None)
        if spec["collective"] == "allreduce":
            spec["algorithm"] = str(self.rng.choice(["auto", "ring", "tree", "direct",
                                                     "allgather"]))
        elif spec["collective"] == "reduce_scatter":
            spec["algorithm"] = str(self.rng.choice(["auto", "ring", "direct"]))
        else:
            spec["algorithm"] = "auto"
        return spec


class _KeyBook:
    """What was put in and delivered under one key (float64, this rank's view)."""

    def __init__(self, length):
        self.put_in = np.zeros(length)
        self.delivered = np.zeros(length)
        self.calls = 0
        self.magnitude = 1.0


def run(comm, calls, seed=0, max_size=3000, warmup_calls=None, log=None):
    """Run the soak on ``comm``; return a dict of figures (the same on every rank).

    Returns
    -------
    dict
        ``calls``, ``failures`` (summed over ranks), ``keys_conserved``,
        ``rss_start``/``rss_end`` (bytes, the largest over ranks) and
        ``rss_growth`` (the largest relative growth of any rank), ``seconds``.
    """
    p, rank = comm.size, comm.rank
    warmup_calls = max(1, calls // 10) if warmup_calls is None else warmup_calls
    plan = _Plan(seed, p, max_size)
    keyed = Communicator(comm, codec=None, algorithm="auto", partition_bytes=1024,
                         min_compress_bytes=0)
    books = {}
    failures = []
    worst = 0.0  # largest error / peaks of a keyless lossy call

    def fail(index, spec, what):
        failures.append(f"rank {rank}, call {index} {spec}: {what}")
        if log is not None and len(failures) <= 5:
            log(failures[-1])

    rss_start = rss_bytes()
    start = time.perf_counter()
    for index in range(calls):
        if index == warmup_calls:
            comm.Barrier()
            rss_start = rss_bytes()
        spec = plan.call(index)
        collective, key, op = spec["collective"], spec["key"], spec["op"]
        codec = get_codec(spec["codec"])
        lengths = spec.get("lengths") or [spec["n"]] * p
        xs = [_inputs(seed, index, r, lengths[r]) for r in range(p)]
        x = xs[rank]
        kwargs = {"codec": dict(spec["codec"])}
        if collective != "allgather":
            kwargs.update(op=op, algorithm=spec["algorithm"])
        if key is not None:
            y = getattr(keyed, collective)(x, key=f"k{key}", **kwargs)
        elif collective == "allreduce":
            y = compressed_allreduce(x, comm=comm, **kwargs)
        elif collective == "reduce_scatter":
            y = reduce_scatter(x, comm=comm, **kwargs)
        else:
            y = allgather(x, comm=comm, **kwargs)
        # the exact reference, and what of it this rank receives
        if collective == "allgather":
            exact = np.concatenate(xs).astype(np.float64)
            abs_sum = np.abs(exact)
            mine = slice(0, exact.size)
        else:
            exact = np.sum(xs, axis=0, dtype=np.float64) if p > 1 else xs[0].astype(np.float64)
            abs_sum = np.sum(np.abs(xs), axis=0, dtype=np.float64)
            mine = slice(0, exact.size)
            if collective == "reduce_scatter":
                bounds = np.cumsum([0] + [b.size for b in np.array_split(exact, p)])
                mine = slice(int(bounds[rank]), int(bounds[rank + 1]))
        scale = p if op == "mean" else 1
        if y.shape != exact[mine].shape or y.dtype != np.float32:
            fail(index, spec, f"result {y.shape} {y.dtype}, expected {exact[mine].shape}")
            continue
        sums = y.astype(np.float64) * scale
        if collective != "reduce_scatter" and not same_on_all_ranks(comm, y):
            fail(index, spec, "results differ across ranks")
        error = np.abs(sums - exact[mine])
        if not np.isfinite(sums).all():
            fail(index, spec, "non-finite result of finite inputs")
        elif not codec.error_feedback:
            # (mean: one more float32 rounding, of the division)
            bound = cast_bound(codec.codec_id, exact[mine], abs_sum[mine], p) * (1 + EPS32)
            if not (error <= bound).all():
                fail(index, spec, f"error {error.max():.3g} beyond the codec's rounding")
        elif key is None:
            peaks = sum(float(np.abs(v).max(initial=0.0)) for v in xs)
            if getattr(codec, "scale", None) is True:
                peaks *= max(x.size, 1)
            ratio = error.max(initial=0.0) / peaks if peaks else 0.0
            worst = max(worst, ratio)
            if ratio > LOSSY_FACTOR:
                fail(index, spec, f"error {ratio:.3g} x the ranks' peak inputs")
        if key is not None:
            book = books.setdefault(key, _KeyBook(exact.size))
            book.put_in += exact
            book.delivered[mine] += sums
            book.calls += 1
            book.magnitude = max(book.magnitude, float(abs_sum.max(initial=0.0)))
    seconds = time.perf_counter() - start
    conserved = 0
    for key in sorted(books):
        book = books[key]
        held = keyed.feedback.get(f"k{key}")
        held = held.held(book.put_in.size) if held is not None else np.zeros_like(book.put_in)
        if plan.keys[key]["collective"] == "allgather":
            # rank r's residual belongs to its own block of the concatenation
            lengths = plan.keys[key]["lengths"]
            local = np.zeros_like(book.put_in)
            lo = sum(lengths[:rank])
            local[lo:lo + lengths[rank]] = held[:lengths[rank]]
            held = local
            delivered = book.delivered
        else:
            delivered = np.empty_like(book.delivered)
            if plan.keys[key]["collective"] == "reduce_scatter":
                comm.Allreduce(book.delivered, delivered, op=MPI.SUM)
            else:
                delivered = book.delivered
        total_held = np.empty_like(held)
        comm.Allreduce(held, total_held, op=MPI.SUM)
        magnitude = max(book.magnitude, float(np.abs(total_held).max(initial=0.0)))
        atol = conservation_tolerance(book.calls, p, magnitude)
        codec = get_codec(plan.keys[key]["codec"])
        if not codec.error_feedback:
            continue  # its calls were checked one by one against the codec's rounding
        error = np.abs(delivered + total_held - book.put_in).max(initial=0.0)
        if error > atol:
            fail("end", plan.keys[key], f"key k{key}: lost {error:.3g} (allowed {atol:.3g})")
        else:
            conserved += 1
    rss_end = rss_bytes()
    growth = (rss_end - rss_start) / rss_start
    figures = np.array([len(failures), rss_start, rss_end, growth, worst], np.float64)
    summed = np.empty_like(figures)
    comm.Allreduce(figures[:1], summed[:1], op=MPI.SUM)
    comm.Allreduce(figures[1:], summed[1:], op=MPI.MAX)
    return {"calls": calls, "failures": int(summed[0]), "keys_conserved": conserved,
            "keyed_lossy_keys": sum(get_codec(plan.keys[k]["codec"]).error_feedback
                                    for k in books),
            "rss_start": int(summed[1]), "rss_end": int(summed[2]), "rss_growth": summed[3],
            "worst_lossy_ratio": summed[4],
            "seconds": seconds, "messages": failures[:5]}


def main(argv=None):
    """Command line: run the soak on ``MPI.COMM_WORLD``; exit 1 if any check failed."""
    parser = argparse.ArgumentParser(prog="python -m ccl.tools.soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000, help="collectives (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-size", type=int, default=3000,
                        help="largest element count drawn (default 3000)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="calls before the starting RSS is read (default calls/10)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    warmup()

    def log(message):
        print(message, file=sys.stderr, flush=True)

    result = run(comm, args.calls, args.seed, args.max_size, args.warmup, log)
    if comm.rank == 0:
        mib = 2.0**20
        print(f"soak: {result['calls']} calls at {comm.size} ranks in {result['seconds']:.0f} s; "
              f"failed checks: {result['failures']}; keys conserved: {result['keys_conserved']}"
              f" of {result['keyed_lossy_keys']} lossy keys; RSS (max over ranks) after "
              f"warm-up {result['rss_start'] / mib:.1f} MiB, at the end "
              f"{result['rss_end'] / mib:.1f} MiB, growth {100 * result['rss_growth']:.2f} %; "
              f"worst keyless lossy error {result['worst_lossy_ratio']:.3g} x the peak inputs",
              flush=True)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
