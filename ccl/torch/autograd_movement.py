"""The synchronous data-moving collectives of ``ccl.torch``, differentiable as in Horovod.

An allgather's gradient is this rank's rows of the summed gradient; a
broadcast's is the summed gradient on the root and zero elsewhere; an
alltoall's is the alltoall of the gradient back along the received splits.

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> x = torch.ones(2, requires_grad=True)
>>> hvd.allgather(x).sum().backward()
>>> x.grad.tolist() == [float(hvd.size())] * 2
True
"""

import torch

from .collectives import grouped_allreduce_async
from .handles import synchronize
from .movement import alltoall_async, broadcast_async, broadcast_async_, grouped_allgather_sizes
from .process_sets import global_process_set
from .runtime import rank
from .tensor_ops import Sum

__all__ = ["allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall"]


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, options, *tensors):
        name, process_set = options
        ctx.process_set = process_set
        ctx.shapes = [t.shape for t in tensors]
        results = grouped_allgather_sizes(list(tensors), name, process_set)
        ctx.dims = [dims for _, dims in results]
        return tuple(out for out, _ in results)

    @staticmethod
    def backward(ctx, *grads):
        me = ctx.process_set.rank()
        summed = synchronize(grouped_allreduce_async(
            [g.contiguous() for g in grads], op=Sum, process_set=ctx.process_set))
        outs = []
        for g, dims, shape in zip(summed, ctx.dims, ctx.shapes):
            start = sum(dims[:me])
            outs.append(g.narrow(0, start, dims[me]).reshape(shape))
        return (None,) + tuple(outs)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgather a list of tensors in one collective (differentiable).

    Parameters
    ----------
    tensors : list of torch.Tensor
        The inputs, the same shapes and dtypes on every rank of the set.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

    Returns
    -------
    list of torch.Tensor
        The concatenations along dimension 0, in rank order.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> outs = hvd.grouped_allgather([torch.ones(1), torch.ones(3)])
    >>> [t.shape[0] for t in outs] == [hvd.size(), 3 * hvd.size()]
    True
    """
    return list(_GroupedAllgather.apply((name, process_set), *tensors))


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` along dimension 0, in rank order.

    First dimensions may differ between ranks; the rest and the dtype may not.
    The gradient is this rank's rows of the summed gradient, as in Horovod.

    Parameters
    ----------
    tensor : torch.Tensor
        The input, the same shape and dtype on every rank of the set; not modified.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

    Returns
    -------
    torch.Tensor
        The concatenation.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.allgather(torch.tensor([hvd.rank()])).tolist() == list(range(hvd.size()))
    True
    """
    return grouped_allgather([tensor], name, process_set)[0]


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        summed = synchronize(grouped_allreduce_async([grad.contiguous()], op=Sum,
                                                     process_set=ctx.process_set))[0]
        if rank() != ctx.root_rank:
            summed = torch.zeros_like(summed)
        return summed, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """``root_rank``'s ``tensor`` on every rank of the set, as a new tensor.

    The gradient is the summed gradient on the root and zero elsewhere, as in
    Horovod.

    Parameters
    ----------
    tensor : torch.Tensor
        The input, the same shape and dtype on every rank of the set; not modified.
    root_rank : int
        The global rank (a member of the set) whose tensor every rank gets.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

    Returns
    -------
    torch.Tensor
        Root's values.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.broadcast(torch.tensor([hvd.rank()]), root_rank=0).item()
    0
    """
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrite ``tensor`` with ``root_rank``'s values, in place.

    Parameters
    ----------
    tensor : torch.Tensor
        The input, the same shape and dtype on every rank of the set; not modified.
    root_rank : int
        The global rank (a member of the set) whose tensor every rank gets.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

    Returns
    -------
    torch.Tensor
        ``tensor``.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.broadcast_(torch.tensor([hvd.rank()]), 0).item()
    0
    """
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        back, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received,
                                             process_set=ctx.process_set))
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatter ``tensor``'s rows to the set's ranks and gather theirs (differentiable).

    The gradient travels back along the received splits, as in Horovod.

    Parameters
    ----------
    tensor : torch.Tensor
        Rows ``splits[0]`` go to the set's rank 0, the next ``splits[1]`` to
        rank 1, ...
    splits : torch.Tensor or list of int, optional
        Rows per destination (default: equal shares of the first dimension).
    name : str, optional
        Names the collective (generated if None).
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

    Returns
    -------
    torch.Tensor or tuple
        The rows received, in rank order; with ``splits`` given,
        ``(output, received_splits)`` as in Horovod.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> out = hvd.alltoall(torch.full((hvd.size(),), hvd.rank()))
    >>> out.tolist() == list(range(hvd.size()))
    True
    """
    out, received = _Alltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, received)
