"""Run by test_cluster.py on an emulated cluster, never collected.

Where ranks are, and what crosses links.

``python -m mpi4py cluster_placement.py RANKS_PER_HOST NBYTES`` prints (on
rank 0) one JSON line per rank: its ``eth0`` address and network namespace, the node sizes MPI
(``COMM_TYPE_SHARED``) and ccl (``ccl.launch.node_comm``) see, and the bytes
its host sent on ``eth0`` while

1. *local*: each rank sent NBYTES to the next rank of its own host (a ring
   inside every host; nothing with one rank per host), then while
2. *cross*: each rank sent NBYTES to its counterpart on the next host.

The counters are the host's (every rank of a host reads the same one), read
between two barriers, so no phase's traffic leaks into another's reading.
Times are printed for the record, not checked.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

from ccl.launch import node_comm

per_host, nbytes = int(sys.argv[1]), int(sys.argv[2])
comm = MPI.COMM_WORLD


def eth0():
    """(IPv4 address, bytes sent so far) of this namespace's eth0; (None, 0) without one."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show", "eth0"], capture_output=True,
                         text=True).stdout
    if not out.strip():  # shared-memory mode: no emulated host around this rank
        return None, 0
    address = json.loads(out)[0]["addr_info"][0]["local"]
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return address, int(f.read())


def counter():
    comm.Barrier()
    sent = eth0()[1]
    comm.Barrier()
    return sent, time.perf_counter()


shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
node = node_comm(comm)
members = node.allgather(comm.rank)
data, received = np.full(nbytes, comm.rank % 251, np.uint8), np.empty(nbytes, np.uint8)
first = comm.rank - comm.rank % per_host
local, next_host = comm.rank - first, (comm.rank + per_host) % comm.size

sent0, t0 = counter()
if per_host > 1:
    comm.Sendrecv(data, dest=first + (local + 1) % per_host, recvbuf=received,
                  source=first + (local - 1) % per_host)
    assert received[0] == (first + (local - 1) % per_host) % 251
sent1, t1 = counter()
comm.Sendrecv(data, dest=next_host, recvbuf=received,
              source=(comm.rank - per_host) % comm.size)
assert received[0] == (comm.rank - per_host) % comm.size % 251
sent2, t2 = counter()

row = dict(rank=comm.rank, size=comm.size, address=eth0()[0],
           netns=os.stat("/proc/self/ns/net").st_ino, mpi_node=shared.size, ccl_node=members,
           local_bytes=sent1 - sent0, cross_bytes=sent2 - sent1, local_s=t1 - t0,
           cross_s=t2 - t1)
rows = comm.gather(row)  # printed by one rank: lines of several ranks could interleave
if comm.rank == 0:
    print("\n".join(json.dumps(row) for row in rows), flush=True)
