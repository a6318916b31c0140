"""Tiny training runs of every ``ccl.torch`` object that checkpoints error feedback.

Shared by ``make_fixtures.py``, which saves each run's checkpoint at two
ranks into ``v<version>/`` (one file per scenario and rank), and by
``test_checkpoint.py``, which loads the files of every format version into
the same run built again. A file holds ``model`` (this rank's weights: whole,
or its FSDP shards), ``opt`` (the torch optimizer's state, where the ccl
object is not the optimizer), ``ccl`` (what the ccl object's
``state_dict()`` returned) and ``after`` (the weights after ``MORE`` further
steps of the uninterrupted run: a loaded state must reach them bit for bit).
"""

import copy

import torch

import ccl.torch as ct

#: Steps before the checkpoint, and after it.
BEFORE, MORE = 4, 3
#: Small tensors are compressed too, with a lossy codec (so that residuals exist).
COMPRESS = dict(algorithm="ring", min_compress_bytes=0)
#: The scenarios; "ddp" and "fsdp" need a torch.distributed process group.
NAMES = ("optimizer", "optimizer-powersgd", "adam", "ddp", "fsdp", "diloco")
POWERSGD = {"id": "powersgd", "rank": 1, "inner": "thc", "warmup_steps": 1,
            "min_compression_rate": 0}
TEACHER = torch.randn(6, 3, generator=torch.Generator().manual_seed(7))


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def loss(net, rank, step):
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(10_000 * step + rank))
    return torch.nn.functional.cross_entropy(net(x), (x @ TEACHER).argmax(dim=1))


class Run:
    """One scenario: its model, its optimizer and the ccl object whose state is saved."""

    def __init__(self, name):
        self.name, self.net, self.module = name, model(), None
        named = self.net.named_parameters()
        if name in ("optimizer", "optimizer-powersgd"):
            codec = "thc" if name == "optimizer" else POWERSGD
            self.opt = ct.DistributedOptimizer(
                torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9),
                named_parameters=named, codec=codec, fusion_threshold_bytes=200,
                # the files were saved before SGD's momentum was corrected: the runs that
                # continue them must send gradients as those did (the "momenta" entry is
                # tested in test_sgd_momentum.py)
                momentum_correction=False, **COMPRESS)
            self.ccl = self.opt
        elif name == "adam":
            self.opt = self.ccl = ct.CompressedAdam(
                self.net.parameters(), lr=0.01, named_parameters=named, codec="onebit",
                warmup_steps=2, **COMPRESS)
        elif name == "ddp":
            self.module = torch.nn.parallel.DistributedDataParallel(self.net,
                                                                    bucket_cap_mb=0.0001)
            self.ccl, hook = ct.ddp_comm_hook("thc", **COMPRESS)
            self.module.register_comm_hook(self.ccl, hook)
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        elif name == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for layer in (self.net[0], self.net[2]):
                fully_shard(layer)
            fully_shard(self.net)
            self.ccl = ct.fsdp_compress(self.net, codec="thc", all_gather_codec="thc",
                                        **COMPRESS)
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)  # no state to save
        elif name == "diloco":
            inner = torch.optim.AdamW(self.net.parameters(), lr=0.01)
            self.opt = self.ccl = ct.DiLoCo(self.net, inner, sync_every=4, codec="thc",
                                            fragments=2, overlap=1, algorithm="ring")
        else:
            raise ValueError(f"no scenario {name!r}")

    def train(self, steps, start=0):
        net = self.module or self.net
        for step in range(start, start + steps):
            self.opt.zero_grad()
            loss(net, ct.rank(), step).backward()
            self.opt.step()

    def weights(self):
        """This rank's weights (an FSDP module's local shards), as plain tensors."""
        return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone()
                for k, v in self.net.state_dict().items()}

    def flat(self):
        return torch.cat([v.reshape(-1) for v in self.weights().values()])

    def save(self):
        """What a checkpoint of this rank holds (``after`` is added by the caller)."""
        saved = {"model": self.weights(), "ccl": self.ccl.state_dict()}
        if self.opt is not self.ccl:
            saved["opt"] = self.opt.state_dict()
        return copy.deepcopy(saved)  # torch's state dicts hold the live tensors

    def load(self, saved):
        """Load a checkpoint's weights and states (``saved["ccl"]`` last)."""
        with torch.no_grad():
            for k, v in self.net.state_dict().items():
                (v.to_local() if hasattr(v, "to_local") else v).copy_(saved["model"][k])
        if "opt" in saved:
            self.opt.load_state_dict(saved["opt"])
        self.ccl.load_state_dict(saved["ccl"])
