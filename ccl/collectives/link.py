"""What ``auto`` knows of a communicator's network and cores: its link profile.

:func:`profile` returns the figures ``auto``'s cost model decides from, the
same on every rank, found once per communicator and kept in its channel's
measurements (:class:`ccl.transport.cache.Measurements`):

1. **Given.** ``link_gbps=`` or ``CCL_LINK_GBPS``: that speed, as given.
2. **One node.** Every rank of the communicator on one node (shared memory,
   or one block of ``CCL_LOCAL_SIZE``): nothing is timed. Shared memory
   counts as faster than any codec (``link_gbps = inf``), so ``auto`` runs
   float32 and float64 on the MPI library's own exact allreduce, in every
   run alike. Name an algorithm to compress on one machine.
3. **A saved profile.** ``CCL_LINK_PROFILE=<file>`` names a JSON file
   ``{"link_gbps": ..., "latency_s": ..., "ranks": ..., "node_sizes":
   [...], "spread": ...}``: where it exists for the same ranks and nodes,
   its figures are used (rank 0 reads it and sends them to every rank);
   where it does not, the figures are measured and rank 0 writes it. A
   file for another layout is measured again and overwritten.
4. **Measured.** :func:`ccl.collectives.auto.probe_link` and
   :func:`~ccl.collectives.auto.probe_latency`: the fastest of several
   rounds, each as slow as its slowest rank, so every rank has one value;
   the spread of the rounds (slowest over fastest) is the margin
   compression must win by where it exceeds ``MARGIN``.

Where the cost model runs (a finite link speed), the codec's speed is
measured too, not taken from its stated one-core figures
(:func:`codec_speeds`): every rank encodes and decodes a 16 MB sample at
once, with the call's thread budget, so ranks that share cores and other
work on the machine slow it as they slow the call; the slowest of
:data:`CODEC_ROUNDS` rounds counts, once per communicator and codec
configuration. The two sides are measured on purpose in opposite ways:
``MPI_Allreduce`` at its fastest round, the codec at its slowest, so
``auto`` compresses only where compression wins even then: where timings
vary (a loaded machine) it keeps to the exact ``MPI_Allreduce``. The share
of a core each rank gets (:func:`ccl.threads.cores_share`: its cores among
the ranks of its machine and the cores other work keeps busy) is measured
alongside: below one, codec time does not overlap transfers in the model,
and it says why a codec runs below its stated speed.
``Communicator.stats()["auto"]`` shows the profile.
"""

import json
import math
import os
import time
import warnings
from collections import Counter

import numpy as np

from .. import config
from ..codecs import get_codec
from ..threads import budgeted, channel_budget, cores_share
from . import auto

__all__ = ["profile", "codec_speeds", "read_profile", "write_profile", "decision_stats",
           "CODEC_SAMPLE", "CODEC_ROUNDS"]

#: Float32 elements of the sample every rank encodes and decodes to time a codec ...
CODEC_SAMPLE = 1 << 22
#: ... this many times; each round is as slow as its slowest rank, the slowest round counts.
CODEC_ROUNDS = 5
#: The keys of a saved profile (``CCL_LINK_PROFILE``).
PROFILE_KEYS = ("link_gbps", "latency_s", "ranks", "node_sizes")


def read_profile(path, ranks, node_sizes):
    """``(link_gbps, latency_s, spread)`` from the file ``path``; None if absent or another layout.

    ``spread`` (:func:`ccl.collectives.auto.probe_link`) is optional in the file (1.0).

    Raises
    ------
    ValueError
        If the file exists but is not a ccl link profile.
    """
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        link, latency = float(data["link_gbps"]), float(data["latency_s"])
        spread = float(data.get("spread", 1.0))
        layout = (int(data["ranks"]), [int(v) for v in data["node_sizes"]])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"CCL_LINK_PROFILE={path!r} is not a ccl link profile "
                         f"(JSON with {', '.join(PROFILE_KEYS)}): {exc}") from None
    if not (link > 0 and latency >= 0 and spread >= 1):
        raise ValueError(f"CCL_LINK_PROFILE={path!r}: link_gbps must be > 0, latency_s >= 0 "
                         f"and spread >= 1, got {link!r}, {latency!r} and {spread!r}")
    return (link, latency, spread) if layout == (ranks, list(node_sizes)) else None


def write_profile(path, link_gbps, latency_s, ranks, node_sizes, spread=1.0):
    """Write a profile file (atomically); a warning, not an error, where it cannot."""
    data = {"link_gbps": link_gbps, "latency_s": latency_s, "ranks": ranks,
            "node_sizes": list(node_sizes), "spread": spread}
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"CCL_LINK_PROFILE={path!r} could not be written ({exc}); the link "
                      "will be measured again next time", RuntimeWarning, stacklevel=2)


def _saved(channel, path, node_sizes):
    """The saved figures, read on rank 0 and sent to every rank (collective); None: none.

    ``path`` is rank 0's ``CCL_LINK_PROFILE`` (None on the other ranks)."""
    figures, error = np.zeros(4), None
    if path:
        try:
            saved = read_profile(path, channel.size, node_sizes)
        except ValueError as exc:
            figures[0], error = -1.0, exc
        else:
            if saved is not None:
                figures[:] = (1.0, *saved)
    channel.wait(channel.comm.Ibcast(figures, root=0), "rank 0's saved link profile")
    if figures[0] < 0:  # every rank raises alike
        raise error or ValueError("CCL_LINK_PROFILE on rank 0 is not a ccl link profile "
                                  "(see rank 0's error)")
    return tuple(float(v) for v in figures[1:]) if figures[0] > 0 else None


def profile(channel, given=None):
    """The link profile ``auto`` decides from on ``channel`` (collective the first time).

    Parameters
    ----------
    channel : ccl.transport.Channel
    given : float, "probe" or None
        The link speed the call was given (``link_gbps=``, else
        ``CCL_LINK_GBPS``); agreed by every rank. A call's ``"probe"`` is
        the same as None (equal in the agreement); ``"probe"`` passed here
        directly (``ccl.collectives.plan.probed_link_gbps``, the
        benchmarks) measures also on one node.

    Returns
    -------
    dict
        ``link_gbps``, ``link_source`` (``"given"``, ``"one node"``,
        ``"saved"`` or ``"measured"``), ``latency_s``, ``spread`` (1.0 unless
        measured or saved), ``nodes`` (node sizes), and ``share``, ``cores``, ``ranks_on_machine``,
        ``other_cores`` (:func:`ccl.threads.cores_share`).

    Raises
    ------
    ValueError
        On every rank, if rank 0's ``CCL_LINK_PROFILE`` file is not a link profile.
    """
    return channel.measured.profile(given, lambda: _profile(channel, given))


def _profile(channel, given):
    """:func:`profile`, found now (collective)."""
    node_sizes = list(channel.topology().node_sizes)
    one_node = len(node_sizes) == 1 and given != "probe"
    spread = 1.0
    if isinstance(given, float):
        link, latency, source = given, _latency(channel), "given"
    elif one_node:  # nothing to time: shared memory beats every codec
        link, latency, source = math.inf, 0.0, "one node"
    else:
        # rank 0's file counts; every rank takes part in sending its figures
        path = config.read("CCL_LINK_PROFILE") if given is None and channel.rank == 0 else None
        saved = _saved(channel, path, node_sizes) if given is None else None
        if saved is not None:
            (link, latency, spread), source = saved, "saved"
        else:
            (link, spread), latency, source = _link(channel), _latency(channel), "measured"
            if path:  # rank 0's
                write_profile(path, link, latency, channel.size, node_sizes, spread)
    return {"link_gbps": link, "link_source": source, "latency_s": latency, "spread": spread,
            "nodes": node_sizes, **cores_share(channel, measure=not one_node)}


def decision_stats(channel, record, given=None):
    """What a communicator's ``stats()`` says of its calls' algorithms and why.

    Parameters
    ----------
    channel : ccl.transport.Channel
    record : collections.Counter
        ``(algorithm, reason)`` of every call (``ccl.collectives.plan.run``'s ``record``).
    given : float or None
        The link speed the communicator was given.

    Returns
    -------
    dict
        ``algorithms`` (``{algorithm: calls}``), ``decisions``
        (``{algorithm: {reason: calls}}``), ``auto`` (the latest profile
        ``auto`` used on the communicator, a copy; None before one was
        needed; with ``codec_gbps``: the measured ``[encode, decode]`` GB/s
        of each codec, by id and config hash), ``link_gbps`` (``given``,
        else that profile's, else None)
        and ``threads`` (this rank's numba threads; None before the first
        call or under ``NUMBA_NUM_THREADS``).
    """
    algorithms, decisions = Counter(), {}
    for (algorithm, reason), calls in record.items():
        algorithms[algorithm] += calls
        decisions.setdefault(algorithm, {})[reason] = calls
    found = channel.measured.latest_profile
    budget = channel.measured.thread_budget()
    link = given if isinstance(given, float) else None
    if link is None and found is not None:
        link = found["link_gbps"]
    if found is not None:
        found = {**found, "nodes": list(found["nodes"]), "codec_gbps": {
            f"{codec_id} {key:016x}": list(speeds)
            for key, (codec_id, speeds) in channel.measured.codec_speeds_found().items()}}
    return {"algorithms": dict(algorithms), "decisions": decisions, "auto": found,
            "link_gbps": link, "threads": None if budget is None else budget[0]}


def codec_speeds(channel, codec):
    """``(encode_gbps, decode_gbps)`` of ``codec`` as every rank runs it now, agreed.

    Collective the first time per communicator and codec configuration
    (then kept in the channel's measurements). Every rank encodes and decodes
    :data:`CODEC_SAMPLE` standard-normal float32 values (SIDCo-like codecs
    vary with the data: this is a typical case, not a bound) once untimed
    (the first round touches fresh memory, which calls that repeat do not),
    then after a barrier, with the numba threads the call would use,
    :data:`CODEC_ROUNDS` times; each round counts its slowest rank, and the slowest round is the
    answer (the machine's load in it, at its worst: the cost model then
    compresses only where that still wins). GB/s of float32 input, like the
    codec's stated ``encode_gbps``.
    """
    return channel.measured.codec_speeds(codec.config_hash,
                                         lambda: (codec.codec_id, _codec_speeds(channel, codec)))


def _codec_speeds(channel, codec):
    """:func:`codec_speeds`, measured now (collective)."""
    x = np.random.default_rng([7, channel.rank]).standard_normal(CODEC_SAMPLE)
    x = x.astype(np.float32)
    codec = get_codec(codec.get_config())  # a copy: the sample must not adapt the call's codec
    times = np.zeros((CODEC_ROUNDS, 2))
    with budgeted(channel_budget(channel)[0]):
        # compiled (or loaded), and a first round's cold memory (fresh payload buffers:
        # 3LC encoded 16 MB at 1.8 GB/s in it, 9 to 11 GB/s after) paid, before it is timed
        codec.decode(codec.encode(x))
        for row in times:
            channel.wait(channel.comm.Ibarrier(), "the other ranks, to time the codec")
            start = time.perf_counter()
            payload = codec.encode(x)
            encoded = time.perf_counter()
            codec.decode(payload)
            row[:] = encoded - start, time.perf_counter() - encoded
    slowest = np.empty_like(times)
    from mpi4py import MPI

    channel.wait(channel.comm.Iallreduce(times, slowest, op=MPI.MAX), "the codec's speed")
    encode_s, decode_s = slowest.max(axis=0)
    return (float(x.nbytes / max(encode_s, 1e-9) / 1e9),
            float(x.nbytes / max(decode_s, 1e-9) / 1e9))


def _latency(channel):
    # timed with the waits the collectives use (test, yield the core): a step of theirs
    # pays that, not what a spinning wait pays where ranks share cores (a time slice, ms)
    return channel.measured.latency(lambda: auto.probe_latency(channel.comm, wait=channel.wait))


def _link(channel):
    return channel.measured.link(lambda: auto.probe_link(channel.comm, wait=channel.wait_spinning))
