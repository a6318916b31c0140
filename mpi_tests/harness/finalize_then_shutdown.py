"""Run by test_hardening_jobs.py, never collected: ``ccl.torch.shutdown()`` after MPI_Finalize.

Every rank trains one step with a ``DistributedOptimizer`` (whose engine
holds a communicator of its own), finalizes MPI itself, then calls
``ccl.torch.shutdown()``, which must neither free a communicator (the MPI
library aborts the process then) nor raise. Prints ``done`` per rank.
"""

import torch
from mpi4py import MPI

import ccl
import ccl.torch as ct

ct.init()
model = torch.nn.Linear(8, 2)
opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                              named_parameters=model.named_parameters(), codec="fp16")
model(torch.ones(4, 8)).sum().backward()
opt.step()
c = ccl.Communicator(codec="fp16")
rank = MPI.COMM_WORLD.rank
MPI.Finalize()
ct.shutdown()
ct.shutdown()  # and again: nothing left to do
del c
print(f"rank {rank}: done", flush=True)
