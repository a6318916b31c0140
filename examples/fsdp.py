"""FSDP2 (``fully_shard``) with ccl codecs: compressed gradient reduce-scatter, weight all-gather.

Run on 4 ranks (any number works)::

    mpiexec -n 4 python -m mpi4py examples/fsdp.py

FSDP needs a process group of its own (gloo here) besides ccl's MPI
communicator; ``fsdp_compress`` moves the gradients (thc) and the gathered
weights (bf16) to ccl, so the group carries none of them. On one machine
this script finds the group's address itself; on several, set
``MASTER_ADDR`` (rank 0's host) and ``MASTER_PORT`` in the job's environment.
"""

import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import ccl.torch as ct

ct.init()                                                   # ccl's MPI communicator
if "MASTER_PORT" not in os.environ:                         # one machine: rank 0 picks a port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_PORT"] = str(ct.broadcast_object(port, root_rank=0))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
dist.init_process_group("gloo", rank=ct.rank(), world_size=ct.size())  # FSDP's own group

torch.manual_seed(0)                                        # the same weights everywhere
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
                              for _ in range(3)], torch.nn.Linear(256, 2))
for block in model:
    fully_shard(block)                                      # one FSDP unit per block
fully_shard(model)
state = ct.fsdp_compress(model, codec="thc", all_gather_codec="bf16")  # collective
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

data = torch.Generator().manual_seed(ct.rank())             # each rank its own batches
for step in range(30):
    x = torch.randn(64, 256, generator=data)
    y = (x[:, 0] + x[:, 1] > 0).long()
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()                                         # ccl reduce-scatters each block
    optimizer.step()
    if step % 10 == 9 and ct.rank() == 0:
        print(f"step {step + 1} loss {loss.item():.4f}")

with torch.no_grad():                                       # FSDP's exact gather of the shards
    weights = torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()])
assert all(torch.equal(weights, w) for w in ct.allgather_object(weights))
stats = state.stats()
if ct.rank() == 0:
    print(f"FSDP with thc gradients and bf16 weights on {ct.size()} ranks: replicas identical, "
          f"{stats['bytes_gradients']} gradient and {stats['bytes_weights']} weight bytes "
          "sent by rank 0")
dist.destroy_process_group()
ct.shutdown()
