"""Run by test_hardening_jobs.py, never collected: one rank is stuck where ccl waits outside data.

``python -m mpi4py stuck_rank.py WHERE TIMEOUT``: the last rank stops (sleeps
far longer than ``TIMEOUT``) at ``WHERE`` while the others wait there:

``channel``
    before its first collective on a communicator (the others wait in the
    channel's creation, under ``CCL_TIMEOUT``, which the test sets);
``link_probe``, ``latency_probe``
    inside ``auto``'s measurement of the link or of the latency;
``nodes``
    inside the node detection of ``hierarchical``;
``hierarchical``
    inside a hierarchical allreduce, after its agreement (nodes of two ranks).

The others must report the wait (naming what they waited for) and abort the
job. A rank that ever returns from the collective prints ``UNEXPECTED``.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import ccl
from ccl import launch
from ccl.collectives import auto, hierarchical

where, timeout = sys.argv[1], float(sys.argv[2])
if where.endswith("probe"):
    os.environ["CCL_LOCAL_SIZE"] = "1"  # a node per rank: auto measures (one node is not timed)
comm = MPI.COMM_WORLD
stuck = comm.size - 1
x = np.ones(1 << 17, np.float32)  # 512 KB: auto weighs the link for it


def hang(label):
    sys.stdout.write(f"rank {comm.rank}: stuck in {label}\n")
    sys.stdout.flush()
    time.sleep(300)


def stalling(function, label):
    def stalled(*args, **kwargs):
        hang(label)
        return function(*args, **kwargs)
    return stalled


if where == "channel":
    if comm.rank == stuck:
        hang("its own code")
    ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring")
else:
    # the channel exists (and every rank is up) before the rank gets stuck
    ccl.compressed_allreduce(x[:10], "fp16", comm=comm, algorithm="ring", timeout=timeout)
    if comm.rank == stuck:
        if where == "link_probe":
            auto.probe_link = stalling(auto.probe_link, where)
        elif where == "latency_probe":
            auto.probe_latency = stalling(auto.probe_latency, where)
        elif where == "nodes":
            launch.node_comm = stalling(launch.node_comm, where)
        else:
            hierarchical._three_steps = stalling(hierarchical._three_steps, where)
    algorithm = "auto" if where.endswith("probe") else "hierarchical"
    ccl.compressed_allreduce(x, "3lc", comm=comm, algorithm=algorithm, key="w",
                             timeout=timeout)
print(f"rank {comm.rank}: UNEXPECTED: returned although rank {stuck} is stuck", flush=True)
