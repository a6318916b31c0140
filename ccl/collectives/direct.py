"""Direct (parameter-server pattern) allreduce, as in BytePS-Compress.

Every rank sends chunk ``j`` straight to its owner ``j`` (worker point). The
owner decodes all of them, sums in rank order with its own exact chunk, and
re-encodes once (owner point) with its own error feedback; a homomorphic
codec adds the payloads instead. The owners' payloads are then allgathered
unchanged. Two lossy points per element, whatever the rank count.
"""

from .._xp import array_module
from .base import OWNER, WORKER

__all__ = ["allreduce", "reduce_scatter"]


def _owner_sum(call, x, encode_owner):
    """Scatter chunks to their owners and reduce this rank's chunk.

    Returns ``(payload, exact)`` as :func:`ccl.collectives.ring._reduce_scatter`.
    """
    p, r, channel, codec = call.size, call.rank, call.channel, call.codec
    requests = []
    for step in range(1, p):
        j = (r + step) % p  # stagger destinations so every owner is not hit at once
        payload = call.encode(call.chunk(x, j), j, WORKER)
        requests.append((channel.isend(payload, j, call.tag), j))
    received = {}
    for step in range(1, p):
        source = (r - step) % p
        received[source] = channel.recv(source, call.tag)
    for request, j in requests:
        channel.wait(request, f"the send to rank {j}")
    own = call.chunk(x, r)
    if codec.homomorphic:
        total = None
        for i in range(p):
            payload = call.encode(own, r, WORKER) if i == r else received[i]
            total = payload if total is None else call.add(total, payload, r)
        return total, None
    exact = array_module(own).zeros_like(own)
    for i in range(p):  # rank order, so the sum is reproducible; in place
        exact += own if i == r else call.decode(received[i], r)
    return (call.encode(exact, r, OWNER) if encode_owner else None), exact


def allreduce(call, x):
    """Sum of ``x`` over all ranks."""
    owned, _ = _owner_sum(call, x, encode_owner=True)
    payloads = call.channel.allgather(owned)
    out = array_module(x).empty_like(x)
    for j, payload in enumerate(payloads):
        call.chunk(out, j)[:] = call.decode_result(payload, j)
    return out


def reduce_scatter(call, x):
    """This rank's chunk of the sum (the owner's exact sum; no owner re-encode)."""
    owned, exact = _owner_sum(call, x, encode_owner=False)
    if exact is None:
        return call.decode_result(owned, call.rank)
    if not array_module(exact).isfinite(exact).all():
        call.mark_nonfinite(call.rank)
    return exact
