"""torch.distributed's gloo group for the benchmarks' DDP and FSDP rows.

gloo needs an address every rank can reach. When all ranks share memory it
is 127.0.0.1; otherwise (the emulated cluster, where each rank has a network
namespace of its own) every rank uses its first non-loopback interface
(``GLOO_SOCKET_IFNAME``) and the rendezvous is rank 0's address on it.
"""

import contextlib
import fcntl
import gc
import os
import socket
import struct

from mpi4py import MPI

__all__ = ["init_gloo", "gloo_group"]

_SIOCGIFADDR = 0x8915


def _ipv4(interface):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", interface[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _network_interface():
    """This rank's first interface other than loopback with an IPv4 address, or None."""
    for _, name in sorted(socket.if_nameindex()):
        if name != "lo":
            address = _ipv4(name)
            if address is not None:
                return name, address
    return None


def _one_network(comm):
    """Whether every rank of ``comm`` is in this rank's network namespace (one loopback)."""
    try:
        mine = os.readlink("/proc/self/ns/net")
    except OSError:  # no /proc: ranks that share memory share a loopback too
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        mine = node.size
        node.Free()
        return comm.allreduce(mine) == comm.size * comm.size
    return len(set(comm.allgather(mine))) == 1


def _free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def init_gloo(comm):
    """Start torch.distributed's gloo group on ``comm``'s ranks (collective).

    Returns
    -------
    str
        The rendezvous address used.
    """
    import torch.distributed as dist

    address = "127.0.0.1"
    if _one_network(comm):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    else:
        found = _network_interface()
        if found is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", found[0])
            address = found[1]
    address = comm.bcast(address, root=0)
    port = comm.bcast(_free_port(address) if comm.rank == 0 else None, root=0)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    dist.init_process_group("gloo", init_method="env://", rank=comm.rank,
                            world_size=comm.size)
    return address


@contextlib.contextmanager
def gloo_group(comm):
    """A gloo group (:func:`init_gloo`) for the ``with`` block, destroyed after what it freed.

    torch's ``ProcessGroupGloo`` destructor waits for its worker threads
    while holding the GIL. Where a DDP model's reducer holds the group's last
    reference when it is freed, and a worker needs the GIL to free a tensor,
    the process hangs. So the models must not outlive the block (build and
    train them in a function called inside it), and a garbage collection
    frees what they left in reference cycles while the group is still
    registered, before the group is destroyed.
    """
    import torch.distributed as dist

    init_gloo(comm)
    try:
        yield
    finally:
        gc.collect()
        dist.destroy_process_group()
