"""DistributedDataParallel with ccl's communication hook: DDP's buckets averaged by a ccl codec.

Run on 4 ranks (any number works)::

    mpiexec -n 4 python -m mpi4py examples/ddp_hook.py

DDP needs a process group of its own (gloo here) besides ccl's MPI
communicator; the hook sends every gradient bucket through ccl, so the
group carries none of them. On one machine this script finds the group's
address itself; on several, set ``MASTER_ADDR`` (rank 0's host) and
``MASTER_PORT`` in the job's environment.
"""

import os
import socket

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ccl.torch as ct

ct.init()                                                   # ccl's MPI communicator
if "MASTER_PORT" not in os.environ:                         # one machine: rank 0 picks a port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_PORT"] = str(ct.broadcast_object(port, root_rank=0))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
dist.init_process_group("gloo", rank=ct.rank(), world_size=ct.size())  # DDP's own group

torch.manual_seed(0)                                        # the same data and weights everywhere
x = torch.randn(1024, 20)
ds = TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())
# each rank its own shard, all of one length: every rank must take the same number of steps
sampler = DistributedSampler(ds, num_replicas=ct.size(), rank=ct.rank(), drop_last=True)
loader = DataLoader(ds, batch_size=32, sampler=sampler)

model = torch.nn.Sequential(torch.nn.Linear(20, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
model = torch.nn.parallel.DistributedDataParallel(model)
state, hook = ct.ddp_comm_hook("thc")                       # collective: every rank calls it
model.register_comm_hook(state, hook)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

for epoch in range(5):
    sampler.set_epoch(epoch)                                # a new shuffle every epoch
    for inputs, labels in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()                                     # the hook averages each bucket
        optimizer.step()
    if ct.rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")

weights = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
assert all(torch.equal(weights, w) for w in ct.allgather_object(weights))
if ct.rank() == 0:
    print(f"DDP with the thc hook on {ct.size()} ranks: replicas identical")
dist.destroy_process_group()
ct.shutdown()
