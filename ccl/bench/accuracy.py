"""Accuracy of compressed allreduce: one call, and a 100-step running sum with error feedback.

Run under mpiexec: ``mpiexec -n 4 python -m mpi4py -m ccl.bench accuracy``.
For each codec x algorithm: the normalised error ``||y - s|| / ||s||`` of one
allreduce of fresh data (``s`` the exact float64 sum), and of the running sum
of 100 steps with error feedback (``key=...``) against the exact running sum,
plus the payload bits per value each rank sent.

``--decode-reencode`` runs each homomorphic codec (THC) as a non-homomorphic
variant of itself (:func:`decode_reencode`): same configuration, same wire
format, but every relay decodes the partial sum, adds its own chunk and
encodes again, as for any other codec. The ``homomorphic`` column says which
variant ran.
"""

import json

import numpy as np
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.transport import channel as _channel

from .cli import Parser, codec_arg

ALGORITHMS = ("ring", "tree", "direct", "allgather")


def _inputs(comm, n, step, data):
    rng = np.random.default_rng([7, step, comm.rank])
    if data == "laplace":  # heavier tails, closer to gradients than a normal
        return rng.laplace(size=n).astype(np.float32)
    return rng.standard_normal(n).astype(np.float32)


def decode_reencode(codec, stats="own"):
    """The codec with its compressed-domain sum switched off (a new, unregistered class).

    A homomorphic codec becomes an instance of a subclass with ``homomorphic
    = False``: the collectives then decode, add and re-encode at every relay
    (with relay error feedback) instead of adding payloads. The codec id,
    configuration and wire format stay the same. A codec that is not
    homomorphic is returned unchanged.

    Parameters
    ----------
    codec : Codec
    stats : {"own", "agreed"}
        What a homomorphic codec's agreed statistics become. THC agrees on the
        largest norm of the ranks' *inputs* (``shared_stats``) only so that
        payloads can be added; a relay re-encodes a partial sum, whose norm
        is larger. ``"own"`` drops the agreement, so every encode scales by
        its own input's norm, as a codec that never adds payloads would.
        ``"agreed"`` keeps it (the subclass changes ``homomorphic`` only),
        so partial sums are scaled by the inputs' norm and clamp more.

    Returns
    -------
    Codec
    """
    if stats not in ("own", "agreed"):
        raise ValueError(f"stats must be 'own' or 'agreed', got {stats!r}")
    if not codec.homomorphic:
        return codec
    base = type(codec)
    attrs = {"homomorphic": False,
             "__doc__": f"{base.__name__} decoded and re-encoded at every relay."}
    if stats == "own":
        attrs["shared_statistics"] = False
    variant = type(f"{base.__name__}DecodeReencode", (base,), attrs)
    return variant.from_config(codec.get_config())


def agrees(codec):
    """Whether the collectives agree on statistics for ``codec`` before encoding."""
    return codec.shared_statistics


def measure(comm, specs, algorithms, n, steps, data="normal", reencode=None):
    """Return rows (identical on every rank).

    With ``reencode`` (``"own"`` or ``"agreed"``), homomorphic codecs run as
    :func:`decode_reencode` variants.
    """
    rows = []
    ch = _channel(comm)
    for spec in specs:
        codec = get_codec(spec)
        if reencode:
            codec = decode_reencode(codec, reencode)
        for algorithm in algorithms:
            x = _inputs(comm, n, 0, data)
            exact = np.empty(n)
            comm.Allreduce(x.astype(np.float64), exact)
            before = ch.bytes_sent
            y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm=algorithm)
            sent = comm.allreduce(ch.bytes_sent - before, op=MPI.MAX)
            single = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
            c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0)
            run, run_exact = np.zeros(n), np.zeros(n)
            for step in range(steps):
                x = _inputs(comm, n, step + 1, data)
                step_exact = np.empty(n)
                comm.Allreduce(x.astype(np.float64), step_exact)
                run += c.allreduce(x, key="bench")
                run_exact += step_exact
            running = float(np.linalg.norm(run - run_exact) / np.linalg.norm(run_exact))
            rows.append(dict(codec=codec.codec_id, config=codec.get_config(),
                             homomorphic=codec.homomorphic, agreed_stats=agrees(codec),
                             algorithm=algorithm, ranks=comm.size, n=n, data=data,
                             single_error=single, running_error=running, steps=steps,
                             sent_bits_per_value=8 * sent / n, sent_bytes=sent))
    return rows


def main(argv=None, comm=None):
    """Run the command line ``argv`` on ``comm`` (default ``MPI.COMM_WORLD``); rank 0 prints."""
    parser = Parser(prog="python -m ccl.bench accuracy", description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=None, type=codec_arg,
                        help="codec ids or JSON configs (default: every registered codec)")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                        choices=ALGORITHMS)
    parser.add_argument("--elements", type=int, default=1 << 16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--data", choices=("normal", "laplace"), default="normal")
    parser.add_argument("--decode-reencode", nargs="?", const="own", choices=("own", "agreed"),
                        help="run homomorphic codecs (thc) non-homomorphically: relays "
                             "decode, add and re-encode; each encode scales by its own "
                             "statistics (own, the default) or the agreed ones (agreed)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD if comm is None else comm
    specs = args.codecs or [c for c in registered_codecs() if not c.startswith("test")]
    rows = measure(comm, specs, args.algorithms, args.elements, args.steps, args.data,
                   reencode=args.decode_reencode)
    if comm.rank == 0:
        print(f"{'codec':>10} {'homomorphic':>11} {'agreed':>6} {'algorithm':>9} "
              f"{'1-call err':>10} {str(args.steps) + '-step err':>12} "
              f"{'sent bits/val':>13}  config")
        for r in rows:
            print(f"{r['codec']:>10} {str(r['homomorphic']):>11} {str(r['agreed_stats']):>6} "
                  f"{r['algorithm']:>9} "
                  f"{r['single_error']:10.2e} {r['running_error']:12.2e} "
                  f"{r['sent_bits_per_value']:13.3f}  {json.dumps(r['config'])}")
        print(f"({comm.size} ranks, {args.elements} elements of {args.data} data; error = "
              f"||result - exact|| / ||exact||; running error over {args.steps} steps with "
              "error feedback)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0
