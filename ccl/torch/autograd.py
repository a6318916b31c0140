"""The synchronous tensor collectives of ``ccl.torch``, differentiable as in Horovod.

Gradients: an allreduce's is the allreduce (same op and scale factors) of
the output's gradient; an allgather's is this rank's rows of the summed
gradient; a broadcast's is the summed gradient on the root and zero
elsewhere; an alltoall's is the alltoall of the gradient back along the
received splits; a reducescatter's is the allgather of the gradient (divided
by the set's size for ``Average``).

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> x = torch.ones(3, requires_grad=True)
>>> hvd.allreduce(x, op=hvd.Sum).sum().backward()
>>> x.grad.tolist() == [float(hvd.size())] * 3
True
"""

import torch

from .collectives import (allreduce_async, allreduce_async_, alltoall_async,
                          broadcast_async, broadcast_async_, grouped_allgather_sizes,
                          grouped_allreduce_async, grouped_allreduce_async_,
                          grouped_reducescatter_async, resolve_op)
from .compression import Compression, resolve_codec
from .handles import synchronize
from .process_sets import global_process_set
from .tensor_ops import Average, Sum

__all__ = ["allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather",
           "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter",
           "grouped_reducescatter"]


def _split_compression(compression):
    """``(codec for the collective, Horovod compressor applied around it)``."""
    try:
        codec, compressor = resolve_codec(compression)
    except (TypeError, ValueError):
        return compression, Compression.none  # the collective reports it on every rank
    return codec, compressor or Compression.none


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, options, *tensors):
        ctx.options = options
        average, name, op, pre, post, process_set, codec = options
        return tuple(synchronize(grouped_allreduce_async(
            tensors, average, name, op, pre, post, process_set, codec)))

    @staticmethod
    def backward(ctx, *grads):
        average, _, op, pre, post, process_set, _ = ctx.options
        grads = [g.contiguous() for g in grads]
        return (None,) + tuple(synchronize(grouped_allreduce_async(
            grads, None, None, resolve_op(op, average), pre, post, process_set)))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """Average (or sum, ...) a list of tensors over the set in one collective (differentiable).

    Arguments as :func:`allreduce`; returns the list of results.
    """
    codec, compressor = _split_compression(compression)
    pairs = [compressor.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply((average, name, op, prescale_factor, postscale_factor,
                                    process_set, codec), *[t for t, _ in pairs])
    return [compressor.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Average (or sum, min, max, multiply) ``tensor`` over the set; differentiable.

    Parameters
    ----------
    tensor : torch.Tensor
        The same shape and dtype on every rank of the set; not modified.
    average : bool, optional
        Deprecated: ``True`` is ``op=hvd.Average``, ``False`` ``op=hvd.Sum``.
    name : str, optional
        Names the collective (and a codec's error feedback).
    compression : optional
        ``hvd.Compression.none`` (default), ``hvd.Compression.fp16`` (any
        object with Horovod's ``compress``/``decompress``), or a ccl codec:
        ``hvd.Compression.codec("3lc", s=1.5)``, a codec, or its id.
    op : int, optional
        ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Min``, ``hvd.Max``, ``hvd.Product``.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.
    process_set : ProcessSet
        The ranks that reduce together (default: all).

    Returns
    -------
    torch.Tensor
        A new tensor: the result, on every rank of the set.

    Raises
    ------
    RuntimeError
        (:class:`~ccl.torch.HorovodInternalError`) on every rank when ranks
        passed different shapes, dtypes, ops or names; a rank's own bad
        arguments raise its ``TypeError``/``ValueError`` there.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.allreduce(torch.tensor([hvd.rank()]), op=hvd.Max).item() == hvd.size() - 1
    True
    """
    return grouped_allreduce([tensor], average, name, compression, op, prescale_factor,
                             postscale_factor, process_set)[0]


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """As :func:`allreduce`, in place: ``tensor`` gets the result (and is returned)."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """As :func:`grouped_allreduce`, in place; returns ``tensors``."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


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
    """Allgather a list of tensors in one collective (differentiable); returns a list."""
    return list(_GroupedAllgather.apply((name, process_set), *tensors))


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` along dimension 0, in rank order (differentiable).

    First dimensions may differ between ranks; the rest and the dtype may not.

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
        summed = synchronize(allreduce_async(grad.contiguous(), op=Sum,
                                             process_set=ctx.process_set))
        from .runtime import rank

        if rank() != ctx.root_rank:
            summed = torch.zeros_like(summed)
        return summed, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """``root_rank``'s ``tensor`` on every rank of the set, as a new tensor (differentiable).

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.broadcast(torch.tensor([hvd.rank()]), root_rank=0).item()
    0
    """
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrite ``tensor`` with ``root_rank``'s values, in place; returns ``tensor``."""
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


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, options, *tensors):
        name, compression, op, process_set, pre, post = options
        ctx.scale = pre * post / (process_set.size() if op == Average else 1)
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(
            tensors, name, compression, op, process_set, pre, post)))

    @staticmethod
    def backward(ctx, *grads):
        outs = [out * ctx.scale for out, _ in grouped_allgather_sizes(
            [g.contiguous() for g in grads], None, ctx.process_set)]
        return (None,) + tuple(outs)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatter a list of tensors in one collective (differentiable); returns a list."""
    codec, compressor = _split_compression(compression)
    pairs = [compressor.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply((name, codec, op, process_set, prescale_factor,
                                        postscale_factor), *[t for t, _ in pairs])
    return [compressor.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over the set; return this rank's rows of dimension 0 (differentiable).

    Rank ``r`` of the set gets ``dim0 // size`` rows, one more when ``r <
    dim0 % size``.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> rows = hvd.reducescatter(torch.ones(2 * hvd.size(), 3), op=hvd.Sum)
    >>> rows.shape == (2, 3) and bool((rows == hvd.size()).all())
    True
    """
    return grouped_reducescatter([tensor], name, compression, op, process_set,
                                 prescale_factor, postscale_factor)[0]
