"""Adam with compressed traffic: ccl.torch.CompressedAdam on a small regression.

Run on 4 ranks (any number works)::

    mpiexec -n 4 python -m mpi4py examples/compressed_adam.py

The first ``warmup_steps`` steps are exact AdamW; after them the variance
stays frozen and each rank's momentum, divided by the frozen denominator,
is averaged with 1-bit compression (error feedback at both ends). The
reductions start during backward.
"""

import torch

import ccl.torch as ct

ct.init()
torch.manual_seed(ct.rank())                   # each rank gets its own data ...
data = torch.randn(512, 32)
target = data @ torch.linspace(-1, 1, 32).unsqueeze(1) + 0.01 * torch.randn(512, 1)

torch.manual_seed(0)                           # ... but the same initial weights
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
optimizer = ct.CompressedAdam(model.parameters(), lr=3e-3, weight_decay=0.01,
                              named_parameters=model.named_parameters(), codec="onebit",
                              algorithm="direct", warmup_steps=20, min_compress_bytes=0)

for step in range(100):
    batch = torch.randint(0, 512, (64,))
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[batch]), target[batch])
    loss.backward()            # compressed momenta start reducing while this runs
    optimizer.step()           # waits for them, then takes the AdamW step
    if ct.rank() == 0 and step % 20 == 19:
        print(f"step {step + 1} loss {loss.item():.4f}")

stats = optimizer.communication_stats()
# one allreduce per bucket per step, all of one payload: every replica is identical
weights = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
assert all(torch.equal(weights, w) for w in ct.allgather_object(weights))
if ct.rank() == 0:
    print(f"{ct.size()} ranks, {stats['step']} steps ({stats['compressed_params']} compressed "
          f"parameters): replicas identical, {stats['bytes_sent']} bytes sent by rank 0")
ct.shutdown()
