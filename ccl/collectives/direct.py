"""Direct (parameter-server pattern) allreduce, as in BytePS-Compress.

Every rank sends chunk ``j`` straight to its owner ``j`` (worker point). The
owner decodes all of them, sums in rank order with its own exact chunk, and
re-encodes once (owner point) with its own error feedback; a homomorphic
codec whose payloads add exactly (THC's integer lanes) adds them encoded
instead. The owners' payloads are then sent to every rank unchanged. Two
lossy points per element, whatever the rank count: fp16 and bf16, whose
encoded sums would round at each of the owner's ``p - 1`` additions
(``Codec.sum_rounds``), are summed decoded, so their error
stays flat in ``p`` too.

**Pipelining.** Chunks are cut into the call's segments (units, see
:class:`ccl.collectives.base.Call`). Workers encode and send segment by
segment with nonblocking sends; an owner sums and re-encodes segment ``k``
as soon as every rank's segment ``k`` arrived and sends the result out at
once, while segment ``k + 1`` is still arriving. Between any two ranks the
worker segments precede the owner segments, each in segment order, on both
the sending and the receiving side, so one tag per call suffices. One
segment per chunk is the unpipelined algorithm.
"""

from .._xp import array_module
from .base import OWNER, WORKER, SendQueue

__all__ = ["allreduce", "reduce_scatter", "CHUNKED"]

#: One chunk per rank, each owned by its rank (pipelined in segments).
CHUNKED = True


def _owner_sum(call, x, encode_owner, sends, broadcast):
    """Scatter segments to their owners and reduce this rank's chunk.

    Returns ``(owned, exact)`` as :func:`ccl.collectives.ring._reduce_scatter`.
    With ``broadcast``, each owned payload is sent to every other rank as soon
    as it exists.
    """
    p, r, channel, codec, tag = call.size, call.rank, call.channel, call.codec, call.tag
    add_encoded = codec.homomorphic and not codec.sum_rounds
    for k in range(call.segments):  # segment-major: every owner can start on segment 0
        for step in range(1, p):
            j = (r + step) % p  # stagger destinations so every owner is not hit at once
            u = call.units(j)[k]
            sends.send(call.encode(call.unit(x, u), u, WORKER), j, tag)
        sends.poll()
    own_units = call.units(r)
    start = call.bounds[own_units[0]]
    exact = None if add_encoded else array_module(x).empty_like(call.chunk(x, r))
    owned = []
    for u in own_units:
        received = {}
        for step in range(1, p):
            source = (r - step) % p
            received[source] = channel.recv(source, tag)
        own = call.unit(x, u)
        if add_encoded:
            total = None
            for i in range(p):
                payload = call.encode(own, u, WORKER) if i == r else received[i]
                total = payload if total is None else call.add(total, payload, u)
            out = total
        else:
            total = exact[call.bounds[u] - start:call.bounds[u + 1] - start]
            total[:] = 0
            for i in range(p):  # rank order, so the sum is reproducible; in place
                total += own if i == r else call.decode(received[i], u)
            out = call.encode(total, u, OWNER) if encode_owner else None
        owned.append(out)
        if broadcast and out is not None:
            for step in range(1, p):
                sends.send(out, (r + step) % p, tag)
        sends.poll()
    return owned, exact


def allreduce(call, x):
    """Sum of ``x`` over all ranks."""
    p, r, channel, tag = call.size, call.rank, call.channel, call.tag
    sends = SendQueue(channel)
    owned, _ = _owner_sum(call, x, True, sends, broadcast=True)
    out = call.result_with_own(x, owned)
    for k in range(call.segments):
        for step in range(1, p):
            source = (r - step) % p
            u = call.units(source)[k]
            call.decode_into(out, channel.recv(source, tag), u)
        sends.poll()
    sends.wait_all()
    return out


def reduce_scatter(call, x):
    """This rank's chunk of the sum (the owner's exact sum; no owner re-encode)."""
    sends = SendQueue(call.channel)
    owned, exact = _owner_sum(call, x, False, sends, broadcast=False)
    sends.wait_all()
    return call.own_chunk(owned, exact)
