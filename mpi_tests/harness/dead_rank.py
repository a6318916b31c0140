"""Run by test_hardening_faults.py, never collected: one rank dies in the middle of a collective.

``python -m mpi4py dead_rank.py HOW WHEN TIMEOUT COLLECTIVE``: every rank
starts ``COLLECTIVE`` (``allreduce``, ``reduce_scatter`` or ``allgather``)
under the key ``"layer7.weight"`` with ``timeout=TIMEOUT``, and the last
rank dies inside it. ``HOW`` is ``exit`` (``os._exit(0)``: a process that
quits without MPI_Finalize), ``kill`` (SIGKILL to itself: a crash, an OOM
kill) or ``stop`` (SIGSTOP: a hung node that the launcher cannot notice).
``WHEN`` is ``start`` (before it joins the argument check, so its peers
wait for a message that never comes) or ``midway`` (right after it
sent its first payload, so a peer may be reading from a vanished process;
in the allgather collective: as it joins the payload exchange).

The survivors must print ccl's report and abort the job. A survivor that
ever returns from the collective prints ``UNEXPECTED``.
"""

import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import ccl
from ccl import transport
from ccl.collectives import plan

how, when, timeout, collective = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
comm = MPI.COMM_WORLD
victim = comm.size - 1
x = np.ones(100_000, np.float32)
# one complete collective first: every rank is up and connected before the victim dies
ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring", timeout=timeout)


def die(activity):
    sys.stdout.write(f"rank {comm.rank}: dying ({how}, {when}) in {activity}\n")
    sys.stdout.flush()
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)


if comm.rank == victim and when == "start":
    def agree(comm, what, *args, **kwargs):
        die(what)

    plan.agree = agree
elif comm.rank == victim:
    original_isend = transport.Channel.isend

    def isend(self, payload, dest, tag):
        request = original_isend(self, payload, dest, tag)
        die(self.activity)
        return request

    def allgather(self, payload):  # the allgather collective sends no point-to-point message
        die(self.activity)

    transport.Channel.isend = isend
    transport.Channel.allgather = allgather

if collective == "allreduce":
    ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring", key="layer7.weight",
                             timeout=timeout)
elif collective == "reduce_scatter":
    ccl.reduce_scatter(x, "fp16", comm=comm, algorithm="direct", key="layer7.weight",
                       timeout=timeout)
else:
    ccl.allgather(x, "fp16", comm=comm, key="layer7.weight", timeout=timeout)
print(f"rank {comm.rank}: UNEXPECTED: {collective} returned although rank {victim} died",
      flush=True)
