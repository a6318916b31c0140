"""Training over a slow link: ccl.torch.DiLoCo on a small regression.

Run on 4 ranks (any number works)::

    mpiexec -n 4 python -m mpi4py examples/diloco.py

Every rank takes its own AdamW steps; every ``sync_every`` steps each of the
two fragments of the model averages its pseudo-gradient (global weights minus
local weights) with THC compression and error feedback, in the background,
and takes an outer Nesterov step on the global weights.
"""

import torch

import ccl.torch as ct

ct.init()
torch.manual_seed(ct.rank())                   # each rank gets its own data ...
data = torch.randn(512, 32)
target = data @ torch.linspace(-1, 1, 32).unsqueeze(1) + 0.01 * torch.randn(512, 1)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
inner = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
# "ring" compresses on one machine too ("auto" would average exactly inside a node)
optimizer = ct.DiLoCo(model, inner, sync_every=10, outer_lr=0.7, outer_momentum=0.5,
                      codec="thc", fragments=2, overlap=True, algorithm="ring")

for step in range(100):
    batch = torch.randint(0, 512, (64,))
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data[batch]), target[batch])
    loss.backward()
    optimizer.step()           # an inner step; a fragment syncs every 5 steps
    if ct.rank() == 0 and step % 20 == 19:
        print(f"step {step + 1} loss {loss.item():.4f}")
optimizer.flush()              # apply the outer steps still in flight

stats = optimizer.communication_stats()
# ccl's averages are identical on every rank: so are the global weights
weights = torch.cat([g.reshape(-1) for _, g in optimizer.global_parameters()])
assert all(torch.equal(weights, w) for w in ct.allgather_object(weights))
if ct.rank() == 0:
    print(f"{ct.size()} ranks, {stats['step']} inner steps, {stats['outer_steps']} fragment "
          f"syncs: global weights identical, {stats['bytes_sent']} bytes sent by rank 0")
ct.shutdown()
