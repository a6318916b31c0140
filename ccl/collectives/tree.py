"""Tree allreduce: a binomial reduce to rank 0, then a broadcast of the encoded result.

Rank ``r`` receives from ``r + 2^k`` for every ``2^k`` below its lowest set
bit (in increasing ``k``), then sends to ``r - 2^lowbit``; ``log2(p)`` rounds
suit small, latency-bound messages. A homomorphic codec adds children's
payloads to its own encoding; any other codec decodes them, adds its exact
input and re-encodes (relay point; the root is the owner point). Every rank
decodes the root's payload, so results agree bitwise.
"""

from .base import OWNER, RELAY, WORKER

__all__ = ["allreduce", "CHUNKED"]

#: The whole input is one chunk.
CHUNKED = False


def _children_and_parent(rank, size):
    children, mask = [], 1
    while mask < size:
        if rank & mask:
            return children, rank - mask
        if rank + mask < size:
            children.append(rank + mask)
        mask <<= 1
    return children, None


def allreduce(call, x):
    """Sum of ``x`` over all ranks (one chunk: the whole array)."""
    children, parent = _children_and_parent(call.rank, call.size)
    channel, codec = call.channel, call.codec
    if codec.homomorphic:
        payload = call.encode(x, 0, WORKER)
        for child in children:
            payload = call.add(payload, channel.recv(child, call.tag), 0)
    else:
        partial = x
        for child in children:
            partial = partial + call.decode(channel.recv(child, call.tag), 0)
        role = OWNER if parent is None else (RELAY if children else WORKER)
        payload = call.encode(partial, 0, role)
    if parent is not None:
        channel.wait(channel.isend(payload, parent, call.tag), f"the send to rank {parent}")
    result = channel.bcast(payload, root=0)
    return call.decode_result(result, 0)
