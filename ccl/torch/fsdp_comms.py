"""The collectives :func:`~ccl.torch.fsdp_compress` installs in FSDP2: ccl behind torch's API.

PyTorch's ``fully_shard`` (FSDP2) lets a library replace its collectives
with objects of the ``ReduceScatter`` and ``AllGather`` interfaces of
``torch.distributed.fsdp._fully_shard._fsdp_api``, and run code of its own
on each reduced shard (``set_all_reduce_hook``). The classes here are those
objects: each belongs to one FSDP module and calls a :class:`ccl.Communicator`
in the thread FSDP calls it from, synchronously (every rank runs FSDP's
collectives in the same order, so ccl's calls pair up the same way).

numpy has no ``bfloat16``: gradients and weights in a 16-bit float are
widened to float32 for ccl and narrowed again into FSDP's buffer.
"""

import collections

import torch
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from .buckets import work_dtype
from .functions import from_array, to_array

__all__ = ["Tally", "CclReduceScatter", "CclAllGather", "CclAllReduceHook"]


class Tally:
    """Bytes this rank sent, per FSDP module and collective, read from the communicators' stats.

    Parameters
    ----------
    what : tuple of str
        The collectives counted (``"reduce_scatter"``, ``"all_gather"``, ``"all_reduce"``).
    """

    def __init__(self, what):
        self.what = what
        self.owner = None  # whatever must live as long as the collectives that count here
        self.modules = collections.defaultdict(lambda: dict.fromkeys(self.what, 0))
        self.calls = collections.Counter()

    def run(self, name, collective, communicator, call):
        """Run ``call()`` and charge what ``communicator`` sent meanwhile to ``name``."""
        before = communicator.stats()["bytes_sent"]
        try:
            return call()
        finally:
            self.modules[name][collective] += communicator.stats()["bytes_sent"] - before
            self.calls[collective] += 1

    def totals(self):
        """``{collective: bytes}`` over every module."""
        totals = dict.fromkeys(self.what, 0)
        for counts in self.modules.values():
            for collective, sent in counts.items():
                totals[collective] += sent
        return totals


def _work(tensor):
    """``tensor`` as an array ccl reduces: float32 or float64, contiguous."""
    if not tensor.is_floating_point():
        raise TypeError(f"ccl compresses floating-point tensors; FSDP handed a {tensor.dtype} "
                        "buffer (parameters of mixed dtypes are all-gathered as bytes): "
                        "leave all_gather_codec=None for this model")
    return to_array(tensor.to(work_dtype(tensor.dtype), copy=True).contiguous())


def _write(output, array):
    """Copy ccl's result into FSDP's ``output`` buffer, in the buffer's dtype."""
    with torch.no_grad():
        output.copy_(from_array(array, like=output).reshape(output.shape))


def _check_group(group, communicator, what):
    # FSDP's group and ccl's communicator must hold the same ranks: the mapping was
    # checked once by fsdp_compress; a module re-sharded on another mesh since is refused
    if group is not None and (group.size(), group.rank()) != (communicator.size,
                                                               communicator.rank):
        raise RuntimeError(f"FSDP called ccl's {what} on a process group of {group.size()} "
                           f"ranks (this one is rank {group.rank()}), ccl's communicator has "
                           f"{communicator.size}: call fsdp_compress() again after "
                           "fully_shard changed the mesh")


class CclReduceScatter(ReduceScatter):
    """FSDP's gradient reduce-scatter by ccl: the mean over ranks, with error feedback.

    FSDP hands it the flat ``size x shard`` input of one module's gradients
    (``op`` a sum: :func:`~ccl.torch.fsdp_compress` forces sum reductions and a
    divide factor of 1, so the mean is ccl's, divided once).

    Parameters
    ----------
    name : str
        The module's qualified name (error-feedback key, stats).
    communicator : ccl.Communicator
        Over the ranks of FSDP's reduce-scatter group, op ``"mean"``.
    tally : Tally
    key : str or None
        Error-feedback key (None: no residuals, for exact reductions).
    """

    def __init__(self, name, communicator, tally, key):
        self.name, self.communicator, self.tally, self.key = name, communicator, tally, key

    def allocate(self, size, *, dtype, device):
        """A plain buffer, as FSDP's default comm allocates."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        """Average ``input_tensor`` over the ranks; this rank's block into ``output_tensor``."""
        _check_group(group, self.communicator, "reduce-scatter")
        if op != torch.distributed.ReduceOp.SUM:
            raise RuntimeError(f"FSDP asked ccl for a {op} reduce-scatter: something reset "
                               "set_force_sum_reduction_for_comms after fsdp_compress()")
        if input_tensor.numel() != output_tensor.numel() * self.communicator.size:
            raise RuntimeError(f"reduce-scatter of {input_tensor.numel()} values into shards of "
                               f"{output_tensor.numel()} on {self.communicator.size} ranks")
        x = _work(input_tensor)
        block = self.tally.run(self.name, "reduce_scatter", self.communicator,
                               lambda: self.communicator.reduce_scatter(x, key=self.key))
        _write(output_tensor, block)
        return None  # done: FSDP waits for nothing


class CclAllGather(AllGather):
    """FSDP's weight all-gather by ccl: every rank's shard, compressed, decoded alike everywhere.

    No error feedback: a weight is sent whole at every gather, so a residual
    would only carry the last rounding into a later, different weight. The
    sharded weights FSDP keeps (and the optimizer updates) stay exact; only
    the gathered copy that forward and backward use is rounded.

    Parameters
    ----------
    name : str
        The module's qualified name (stats).
    communicator : ccl.Communicator
        Over the ranks of FSDP's all-gather group, with the weights' codec.
    tally : Tally
    """

    def __init__(self, name, communicator, tally):
        self.name, self.communicator, self.tally = name, communicator, tally

    def allocate(self, size, *, dtype, device):
        """A plain buffer, as FSDP's default comm allocates."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        """Gather every rank's ``input_tensor`` into ``output_tensor``, in rank order."""
        _check_group(group, self.communicator, "all-gather")
        if output_tensor.numel() != input_tensor.numel() * self.communicator.size:
            raise RuntimeError(f"all-gather of {input_tensor.numel()} values into "
                               f"{output_tensor.numel()} on {self.communicator.size} ranks")
        x = _work(input_tensor)
        full = self.tally.run(self.name, "all_gather", self.communicator,
                              lambda: self.communicator.allgather(x))
        _write(output_tensor, full)
        return None


class CclAllReduceHook:
    """HSDP's cross-replica step: the mean of a reduced shard over the replicas, compressed.

    FSDP calls it with each module's reduce-scatter output (the shard's mean
    inside the replica) and keeps what it leaves in that tensor.

    Parameters
    ----------
    name : str
        The module's qualified name (stats).
    communicator : ccl.Communicator
        Over the ranks holding the same shard in the other replicas, op ``"mean"``.
    tally : Tally
    key : str or None
        Error-feedback key (None: no residuals).
    """

    def __init__(self, name, communicator, tally, key):
        self.name, self.communicator, self.tally, self.key = name, communicator, tally, key

    def __call__(self, reduce_output):
        """Average ``reduce_output`` over the replicas, in place."""
        x = _work(reduce_output)
        mean = self.tally.run(self.name, "all_reduce", self.communicator,
                              lambda: self.communicator.allreduce(x, key=self.key))
        _write(reduce_output, mean)
