"""Hierarchical allreduce for nodes of several ranks: exact inside a node, compressed across.

Links inside a node are fast (shared memory) and links between nodes slow,
so only traffic between nodes is worth compressing:

1. **Inside the node**, the MPI library's own reduce-scatter (over shared
   memory, exact) leaves local rank ``i`` with the node's sum of slice ``i``
   of the input (``numpy.array_split`` into the node's rank count).
2. **Across nodes**, local rank ``i`` runs a compressed allreduce of its
   slice with local rank ``i`` of every other node: any codec, with any flat
   algorithm underneath (``cross_algorithm``; by default the one that fits
   the codec), with error feedback at each of that algorithm's lossy points.
   Each node's link carries one compressed copy of the data, not one per
   rank, and each rank encodes a slice of it, not all of it.
3. **Inside the node** again, an allgather of the slices.

Every node holds the same slices' results (step 2 gives identical results
on every rank of a cross-node group), so replicas agree bitwise. The flags of
every slice are shared inside the node, so every rank raises alike. Nodes
come from :meth:`ccl.transport.Channel.topology` (shared memory, or
``CCL_LOCAL_SIZE``); they must hold the same number of ranks, else every
rank raises ``ValueError`` (use a flat algorithm there). A node of one rank
is the flat algorithm itself; with **one node** of every rank there is no link
between nodes, and the call is exact (the MPI library's reduce-scatter and
allgather in the node, nothing compressed).

A timeout report inside a node or across names the world ranks involved
(the node's own communicator numbers them from 0).
"""

import contextlib

import numpy as np
from mpi4py import MPI

from .base import Call, chunk_bounds

__all__ = ["allreduce", "CHUNKED", "check_topology"]

#: The outer call is not cut into chunks (the slices are the node's business).
CHUNKED = False


def check_topology(topology):
    """Raise ``ValueError`` (on every rank alike) if the nodes differ in size."""
    if not topology.uniform:
        raise ValueError(f"algorithm 'hierarchical' needs nodes of equal size; the nodes "
                         f"hold {topology.node_sizes} ranks: use a flat algorithm (e.g. "
                         "'auto'), or CCL_LOCAL_SIZE to set the nodes")


def allreduce(call, x):
    """Sum of ``x`` over all ranks: reduce-scatter in the node, compressed across, allgather.

    ``call.cross`` names the flat algorithm module across nodes (set by the
    planner).
    """
    topology = call.channel.topology()
    check_topology(topology)
    local, cross = topology.local, topology.cross
    bounds = chunk_bounds(x.size, local.size)
    start = int(bounds[local.rank])

    def traffic():  # (sent, plain) inside the node and across together
        return tuple(a + b for a, b in zip(local.traffic(), cross.traffic()))

    before = traffic()
    try:
        return _three_steps(call, x, local, cross, bounds, start)
    finally:
        # what this rank sent inside its node and across is the call's traffic
        after = traffic()
        call.channel.add_traffic(after[0] - before[0], after[1] - before[1])


@contextlib.contextmanager
def _step(call, channel):
    """One step of the call on the node's or the cross-node ``channel``, as a collective there.

    With the call's report and deadline, and its payloads routed for the
    call's arrays: a channel goes back to host memory when a collective
    ends, so each step routes its own.
    """
    with channel.collective(call.channel.activity, call.channel.timeout) as tag:
        channel.use_backend(call.channel.backend)
        yield tag


def _three_steps(call, x, local, cross, bounds, start):
    """Reduce-scatter in the node, the compressed allreduce across, allgather in the node."""
    with _step(call, local):
        part = local.reduce_scatter_sum(x, bounds)
    if cross.size == 1:
        # one node: no link between nodes to spare, so nothing is compressed; the node's
        # exact sum is the result (a keyed call then holds no residual)
        return _allgather_in_node(call, x, local, part, 0, bounds)
    with _step(call, cross) as tag:
        inner = Call.for_algorithm(call.cross, cross, call.codec, part, tag=tag, step=call.step,
                                   key=call.key, state=call.state, offset=call.offset + start,
                                   chunk_base=call.chunk_base, segment_bytes=call.segment_bytes)
        if call.codec.shared_statistics:
            inner.agree_shared_stats(part)
        mine = call.cross.allreduce(inner, part)
    call.take_over(inner)
    return _allgather_in_node(call, x, local, mine, inner.flags, bounds)


def _allgather_in_node(call, x, local, mine, flags, bounds):
    """Share the flags of every slice in the node, then allgather the node's slices."""
    with _step(call, local):
        # every rank of the node learns the flags of every slice, so all raise alike
        flags = np.array([flags], dtype=np.int64)
        local.wait(local.comm.Iallreduce(MPI.IN_PLACE, [flags, MPI.INT64_T], op=MPI.BOR),
                   "the node's result flags")
        call.flags |= int(flags[0])
        return local.allgather_blocks(mine.astype(x.dtype, copy=False), bounds)
