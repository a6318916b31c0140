"""Ring allreduce: a reduce-scatter around the ring, then an allgather.

At step ``s`` of the reduce-scatter, rank ``r`` sends chunk ``r-s-1`` to
``r+1`` and receives chunk ``r-s-2`` from ``r-1``; after ``p-1`` steps rank
``r`` owns the complete sum of chunk ``r``. A homomorphic codec encodes each
of the rank's own chunks once (worker point) and adds payloads at every hop
without decoding. Any other codec decodes the partial sum, adds its own
chunk exactly and re-encodes (relay point); the owner encodes the final sum
once more (owner point). The allgather forwards each owner's payload
unchanged, so every rank decodes the same bytes: results agree bitwise.
"""

from .._xp import array_module
from .base import OWNER, RELAY, WORKER

__all__ = ["allreduce", "reduce_scatter"]


def _reduce_scatter(call, x, encode_owner):
    """Run the ring reduce-scatter.

    Returns ``(payload, exact)``: the owned chunk's final payload (None when
    ``encode_owner`` is false for a non-homomorphic codec) and its exact sum
    (None for a homomorphic codec, whose sum exists only encoded).
    """
    p, r, codec = call.size, call.rank, call.codec
    right, left = (r + 1) % p, (r - 1) % p
    if p == 1:  # the rank owns its only chunk: one lossy point, as at any p
        own = call.chunk(x, 0)
        if codec.homomorphic:
            return call.encode(own, 0, WORKER), None
        return (call.encode(own, 0, OWNER) if encode_owner else None), own.copy()
    outgoing = None
    for s in range(p - 1):
        send_j, recv_j = (r - s - 1) % p, (r - s - 2) % p
        if s == 0:
            outgoing = call.encode(call.chunk(x, send_j), send_j, WORKER)
        incoming = call.channel.sendrecv(outgoing, right, left, call.tag)
        own = call.chunk(x, recv_j)
        last = s == p - 2
        if codec.homomorphic:
            outgoing = call.add(incoming, call.encode(own, recv_j, WORKER), recv_j)
        else:
            partial = call.decode(incoming, recv_j) + own
            if last:
                return (call.encode(partial, recv_j, OWNER) if encode_owner else None), partial
            outgoing = call.encode(partial, recv_j, RELAY)
    return outgoing, None


def allreduce(call, x):
    """Sum of ``x`` over all ranks (1-D working array in, 1-D sum out)."""
    owned, _ = _reduce_scatter(call, x, encode_owner=True)
    payloads = call.channel.allgather(owned)
    return _concatenate(call, x, payloads)


def reduce_scatter(call, x):
    """This rank's chunk of the sum over all ranks (no owner re-encode)."""
    owned, exact = _reduce_scatter(call, x, encode_owner=False)
    if exact is not None:
        if not array_module(exact).isfinite(exact).all():
            call.mark_nonfinite(call.rank)
        return exact
    return call.decode_result(owned, call.rank)


def _concatenate(call, x, payloads):
    out = array_module(x).empty_like(x)
    for j, payload in enumerate(payloads):
        call.chunk(out, j)[:] = call.decode_result(payload, j)
    return out
