"""Moving bytes between ranks on a private communicator: ccl's transport.

``channel(comm)`` returns the :class:`~ccl.transport.p2p.Channel`
cached on a user's communicator; every collective runs on one, inside ``with
channel.collective(activity, timeout) as tag:``. The package, one module
per job:

``p2p``
    :class:`~ccl.transport.p2p.Channel` (the private duplicate, one
    collective at a time, point-to-point payloads), its
    :class:`~ccl.transport.p2p.Topology` (nodes),
    :func:`~ccl.transport.p2p.channel` and
    :func:`~ccl.transport.p2p.private_duplicate`.
``mpi_calls``
    The MPI library's own collectives, on byte payloads and uncompressed
    values (a part of the channel).
``waits``
    Waiting for MPI requests: the deadline and its report, the stall
    inspector, yielding the core (a part of the channel).
``staging``
    Device payloads: CUDA-aware detection, pinned host staging, and the
    :class:`~ccl.transport.staging.Route` a channel's payloads take.
``cache``
    What ccl keeps per communicator: :func:`~ccl.transport.cache.comm_cache`
    on the user's, and the :class:`~ccl.transport.cache.Measurements` on a
    channel (the probed link and latency, the share of cores, the codec
    speeds, the thread budget).
"""

from .cache import Measurements, comm_cache
from .p2p import Channel, Topology, channel, private_duplicate
from .waits import POLL_SLEEP_MAX_S, POLL_SPIN_S

__all__ = ["Channel", "Topology", "Measurements", "channel", "comm_cache", "private_duplicate",
           "POLL_SPIN_S", "POLL_SLEEP_MAX_S"]
