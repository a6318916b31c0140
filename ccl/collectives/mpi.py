"""The MPI library's own ``MPI_Allreduce``, uncompressed: what ``auto`` falls back to.

It reduces float32 and float64 (the MPI wheels have no 16-bit float type),
exactly as the library does, with no codec and no lossy point.
"""

__all__ = ["allreduce", "CHUNKED"]

#: The input is not cut into one chunk per rank (MPI chooses its own algorithm).
CHUNKED = False


def allreduce(call, x):
    """Sum of ``x`` over all ranks, by ``MPI_Allreduce``."""
    return call.channel.allreduce_sum(x)
