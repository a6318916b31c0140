"""Command-line pieces the MPI benchmarks share: sizes, codecs, and errors said once.

Units, in every benchmark's options and tables: sizes are bytes, with
``KB``, ``MB`` and ``GB`` the powers of 1024 (``KiB``, ``MiB``, ``GiB`` are
accepted as the same); link rates are decimal bits per second, ``Gbit/s``
being 10^9 bit/s (as ``tc`` and network cards count them).

Under ``mpiexec`` every rank parses the same command line: :class:`Parser`
prints a bad option's error on rank 0 only (one message, not one per rank)
and exits with status 2 on every rank, as argparse does.

>>> parse_size("64MB"), parse_size("1.5 KiB"), parse_size("4096")
(67108864, 1536, 4096)
"""

import argparse
import json
import os
import re
import sys

from ccl.codecs import get_codec

__all__ = ["Parser", "parse_size", "size_arg", "codec_arg", "world_rank", "SIZE_UNITS"]

SIZE_UNITS = "bytes; KB, MB, GB = 1024, 1024^2, 1024^3 bytes (KiB, MiB, GiB alike)"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmg])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_FACTOR = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text):
    """Parse a size in bytes: ``4096``, ``4KB``, ``1.5MB``, ``64MiB`` (1 KB = 1024 bytes).

    Raises
    ------
    ValueError
        For anything else, saying what is accepted.
    """
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"bad size {text!r}: give a number of {SIZE_UNITS}, e.g. 4KB 1MB 64MB")
    number, unit = match.groups()
    return int(float(number) * _FACTOR[unit and unit.lower()])


def size_arg(text):
    """argparse ``type=`` for sizes (:func:`parse_size`)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def codec_arg(text):
    """argparse ``type=`` for a codec: an id or a JSON config, checked by :func:`get_codec`.

    Returns
    -------
    Codec
    """
    try:
        spec = json.loads(text) if text.lstrip().startswith("{") else text
        return get_codec(spec)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"bad codec config {text!r}: not JSON ({exc})") \
            from None
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def world_rank():
    """This process' rank in ``MPI.COMM_WORLD``; before MPI starts, the launcher's (else 0)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.rank
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors and help print on rank 0 only.

    Every rank still parses the command line and exits (status 2 for an
    error, 0 for ``--help``), so no rank waits in a collective for one that
    stopped.
    """

    def _print_message(self, message, file=None):
        if world_rank() == 0:
            super()._print_message(message, file)
