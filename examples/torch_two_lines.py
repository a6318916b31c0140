"""PyTorch in two lines: data-parallel training with ccl.torch.

Run on 4 ranks (any number works)::

    mpiexec -n 4 python -m mpi4py examples/torch_two_lines.py
"""

import torch

import ccl.torch as ct

ct.init()                                                                  # line 1
torch.manual_seed(ct.rank())                   # each rank gets its own data ...
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
data = torch.randn(256, 20)
labels = (data[:, 0] > 0).long()

optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
optimizer = ct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    codec="fp16")                          # line 2
ct.broadcast_parameters(model.state_dict(), root_rank=0)   # ... but the same weights

for epoch in range(10):
    for batch in torch.split(torch.randperm(256), 32):     # same step count on every rank
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data[batch]), labels[batch])
        loss.backward()        # buckets are reduced while this runs
        optimizer.step()       # waits for them, then steps with the average
    if ct.rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")

# the averaged gradients kept every replica identical
weights = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
assert all(torch.equal(weights, w) for w in ct.allgather_object(weights))
ct.shutdown()
