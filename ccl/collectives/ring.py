"""Ring allreduce: a reduce-scatter around the ring, then an allgather.

At step ``s`` of the reduce-scatter, rank ``r`` sends chunk ``r-s-1`` to
``r+1`` and receives chunk ``r-s-2`` from ``r-1``; after ``p-1`` steps rank
``r`` owns the complete sum of chunk ``r``. A homomorphic codec encodes each
of the rank's own chunks once (worker point) and adds payloads at every hop
without decoding. Any other codec decodes the partial sum, adds its own
chunk exactly and re-encodes (relay point); the owner encodes the final sum
once more (owner point). The allgather forwards each owner's payload
unchanged, so every rank decodes the same bytes: results agree bitwise.

**Pipelining.** Every chunk is cut into the call's segments (units, see
:class:`ccl.collectives.base.Call`), and each segment travels the ring on its
own: a rank sends a segment with a nonblocking send as soon as it is
encoded, then decodes, adds and re-encodes the next one while the previous
is on the wire. Sends and receives both run step by step, segment by segment
(row-major), so the order in which a rank receives from its left neighbour
is the order in which that neighbour sent, and one tag per call suffices.
The allgather is the same ring, so owners start forwarding their first
segment while they still encode their last. One segment per chunk is the
unpipelined algorithm.
"""

from .._xp import array_module
from .base import OWNER, RELAY, WORKER, SendQueue

__all__ = ["allreduce", "reduce_scatter", "CHUNKED"]

#: One chunk per rank, each owned by its rank (pipelined in segments).
CHUNKED = True


def _reduce_scatter(call, x, encode_owner, sends, forward):
    """Run the ring reduce-scatter.

    Returns ``(owned, exact)``: the owned chunk's final payload per segment
    (None entries when ``encode_owner`` is false for a non-homomorphic codec)
    and its exact sum (None for a homomorphic codec, whose sum exists only
    encoded). With ``forward``, each owned payload is sent on to the right
    neighbour as soon as it exists (step 0 of the allgather).
    """
    p, r, codec, channel, tag = call.size, call.rank, call.codec, call.channel, call.tag
    right, left = (r + 1) % p, (r - 1) % p
    homomorphic = codec.homomorphic
    own_units = call.units(r)
    exact = None if homomorphic else array_module(x).empty_like(call.chunk(x, r))
    start = call.bounds[own_units[0]]
    if p == 1:  # the rank owns its only chunk: one lossy point, as at any p
        if homomorphic:
            return [call.encode(call.unit(x, u), u, WORKER) for u in own_units], None
        exact[:] = x
        return [call.encode(call.unit(x, u), u, OWNER) if encode_owner else None
                for u in own_units], exact
    for u in call.units((r - 1) % p):  # step 0: this rank's own contribution
        sends.send(call.encode(call.unit(x, u), u, WORKER), right, tag)
    owned = []
    for s in range(p - 1):
        last = s == p - 2
        for u in call.units((r - s - 2) % p):
            incoming = channel.recv(left, tag)
            own = call.unit(x, u)
            if homomorphic:
                out = call.add(incoming, call.encode(own, u, WORKER), u)
            else:
                partial = call.decode(incoming, u) + own
                if last:
                    exact[call.bounds[u] - start:call.bounds[u + 1] - start] = partial
                    out = call.encode(partial, u, OWNER) if encode_owner else None
                else:
                    out = call.encode(partial, u, RELAY)
            if last:
                owned.append(out)
            if out is not None and (forward or not last):
                sends.send(out, right, tag)
            sends.poll()
    return owned, exact


def allreduce(call, x):
    """Sum of ``x`` over all ranks (1-D working array in, 1-D sum out)."""
    p, r, channel, tag = call.size, call.rank, call.channel, call.tag
    sends = SendQueue(channel)
    owned, _ = _reduce_scatter(call, x, True, sends, forward=True)
    out = call.result_with_own(x, owned)
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):  # allgather: pass every owner's payloads on, unchanged
        for u in call.units((r - s - 1) % p):
            payload = channel.recv(left, tag)
            if s < p - 2:
                sends.send(payload, right, tag)
            call.decode_into(out, payload, u)
            sends.poll()
    sends.wait_all()
    return out


def reduce_scatter(call, x):
    """This rank's chunk of the sum over all ranks (no owner re-encode)."""
    sends = SendQueue(call.channel)
    owned, exact = _reduce_scatter(call, x, False, sends, forward=False)
    sends.wait_all()
    return call.own_chunk(owned, exact)
