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

**One scale per parameter.** A codec's scale (THC's norm, 1-bit's means,
3LC's maximum) spans what one call compresses, and one FSDP module's flat
gradients mix tensors whose magnitudes differ by orders (a LayerNorm gain
beside an attention weight): under one scale the small ones drown in the
large ones' rounding, and Adam, which divides each coordinate by its own
magnitude, turns that rounding into full-sized steps. So each parameter
large enough to compress is reduced by a call of its own, with its own
error-feedback key, and the small ones together, exactly
(:class:`Parameters`).
"""

import collections

import numpy as np
import torch
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from .buckets import work_dtype
from .functions import from_array, to_array

__all__ = ["Tally", "Parameters", "CclReduceScatter", "CclAllGather", "CclAllReduceHook"]


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

    def run(self, name, collective, communicators, call):
        """Run ``call()`` and charge what ``communicators`` sent meanwhile to ``name``."""
        def sent():
            return sum(c.stats()["bytes_sent"] for c in communicators if c is not None)

        before = sent()
        try:
            return call()
        finally:
            self.modules[name][collective] += sent() - before
            self.calls[collective] += 1

    def totals(self):
        """``{collective: bytes}`` over every module."""
        totals = dict.fromkeys(self.what, 0)
        for counts in self.modules.values():
            for collective, sent in counts.items():
                totals[collective] += sent
        return totals


class Parameters:
    """Where each parameter of one FSDP module lies in a shard of its gradients.

    FSDP2 pads each parameter's gradient along dimension 0 to a multiple of
    the group's size, cuts it into that many chunks and writes chunk ``r``
    of every parameter, in parameter order, into row ``r`` of the flat
    reduce-scatter input: a shard is the parameters' chunks side by side.

    Parameters
    ----------
    group : FSDPParamGroup or None
        The module's parameter group (None: one part, the module's).
    key : str or None
        The module's error-feedback key; a parameter's is ``key/qualified name``.
    """

    def __init__(self, group, key):
        self.group, self.key = group, key
        self.split = True  # False: the whole shard in one call (checkpoints from before)

    def parts(self, width, rows, itemsize, min_compress_bytes):
        """The shard's columns as ``[(start, stop, key)]``, in order; ``key`` None: exact.

        A parameter whose reduction is smaller than ``min_compress_bytes``
        (``rows`` ranks x its columns) is reduced exactly, with the other
        small ones. Where the parameters do not add up to ``width`` (a
        parameter without a gradient this step, a layout this does not
        know), or the split is off, the shard is one part.
        """
        whole = [(0, width, self.key)]
        if not self.split or self.key is None or self.group is None:
            return whole
        sizes = [(fsdp_param._param_fqn or str(i), fsdp_param.padded_sharded_param_size.numel())
                 for i, fsdp_param in enumerate(self.group.fsdp_params)
                 if fsdp_param.sharded_param.requires_grad]
        if len(sizes) < 2 or sum(n for _, n in sizes) != width:
            return whole
        parts, start = [], 0
        for name, n in sizes:
            small = rows * n * itemsize < (min_compress_bytes or 0)
            parts.append((start, start + n, None if small else f"{self.key}/{name}"))
            start += n
        return parts


def _by_parts(x, parts, compressed, exact):
    """Reduce the columns of ``x`` (ranks x width) part by part: one call per keyed part.

    ``compressed(flat, key)`` and ``exact(flat)`` reduce a flat ``ranks x
    columns`` array to this rank's ``columns`` values; the unkeyed parts go
    through ``exact`` in one call. Every rank makes the same calls in the
    same order (the parts are the same everywhere).
    """
    if len(parts) == 1:  # the module's shard whole, under the module's key (or None)
        return compressed(x.reshape(-1), parts[0][2])
    out = np.empty(x.shape[1], x.dtype)
    for start, stop, key in parts:
        if key is not None:
            out[start:stop] = compressed(np.ascontiguousarray(x[:, start:stop]).reshape(-1), key)
    small = [(start, stop) for start, stop, key in parts if key is None]
    if small:
        joined = exact(np.concatenate([x[:, a:b] for a, b in small], axis=1).reshape(-1))
        at = 0
        for a, b in small:
            out[a:b] = joined[at:at + b - a]
            at += b - a
    return out


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
    group : FSDPParamGroup or None
        The module's parameters (:class:`Parameters`; None: one call per module).
    exact : ccl.Communicator or None
        Over the same ranks, no codec: the parameters too small to compress.
    """

    def __init__(self, name, communicator, tally, key, group=None, exact=None):
        self.name, self.communicator, self.tally, self.key = name, communicator, tally, key
        self.parameters, self.exact = Parameters(group, key), exact

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
        x = _work(input_tensor).reshape(self.communicator.size, -1)
        parts = self.parameters.parts(x.shape[1], x.shape[0], x.itemsize,
                                      self.communicator.min_compress_bytes)
        block = self.tally.run(self.name, "reduce_scatter", (self.communicator, self.exact),
                               lambda: _by_parts(
                                   x, parts,
                                   lambda flat, key: self.communicator.reduce_scatter(flat,
                                                                                      key=key),
                                   lambda flat: self.exact.reduce_scatter(flat)))
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
        full = self.tally.run(self.name, "all_gather", (self.communicator,),
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
    group : FSDPParamGroup or None
        The module's parameters (:class:`Parameters`; None: one call per module).
    exact : ccl.Communicator or None
        Over the same ranks, no codec: the parameters too small to compress.
    """

    def __init__(self, name, communicator, tally, key, group=None, exact=None):
        self.name, self.communicator, self.tally, self.key = name, communicator, tally, key
        self.parameters, self.exact = Parameters(group, key), exact

    def __call__(self, reduce_output):
        """Average ``reduce_output`` over the replicas, in place."""
        x = _work(reduce_output).reshape(1, -1)
        parts = self.parameters.parts(x.shape[1], 1, x.itemsize,
                                      self.communicator.min_compress_bytes)
        mean = self.tally.run(self.name, "all_reduce", (self.communicator, self.exact),
                              lambda: _by_parts(
                                  x, parts,
                                  lambda flat, key: self.communicator.allreduce(flat, key=key),
                                  lambda flat: self.exact.allreduce(flat)))
        _write(reduce_output, mean)
