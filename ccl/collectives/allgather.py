"""Allgather-based allreduce: encode once, gather every payload, decode and sum.

One lossy point (each rank's own contribution), and payloads of any length,
which is what sparse codecs (top-k, SIDCo, DGC) need. Every rank receives
``p`` payloads, so it pays when they are small. Sums run in rank order, so
every rank gets bitwise the same result. Also home of :func:`gather_blocks`,
the compressed allgather of :func:`ccl.allgather`.
"""

from dataclasses import replace

from .._xp import array_module
from .base import WORKER

__all__ = ["allreduce", "gather_blocks", "CHUNKED"]

#: The whole input is one chunk.
CHUNKED = False


def allreduce(call, x):
    """Sum of ``x`` over all ranks."""
    payloads = call.channel.allgather(call.encode(x, 0, WORKER))
    # rank order, in place: no array per rank
    return call.sum_results(payloads, 0, array_module(x).zeros_like(x))


def gather_blocks(call, block):
    """Every rank's block (lengths may differ), decoded and concatenated in rank order."""
    payloads = call.channel.allgather(call.encode(block, 0, WORKER))
    parts = []
    for i, payload in enumerate(payloads):
        # blocks differ in length, so the expected count comes from each header
        ctx = replace(call.context(0), rank=i, n=None)
        values, header = call.codec.decode_with_header(payload, ctx)
        call.note_flags(header.flags, 0)
        parts.append(values.astype(block.dtype, copy=False))
    return array_module(block).concatenate(parts) if parts else block[:0].copy()
