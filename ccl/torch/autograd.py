"""The synchronous reductions of ``ccl.torch``, differentiable as in Horovod.

Gradients: an allreduce's is the allreduce (same op and scale factors) of
the output's gradient; a reducescatter's is the allgather of the gradient
(divided by the set's size for ``Average``).

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> x = torch.ones(3, requires_grad=True)
>>> hvd.allreduce(x, op=hvd.Sum).sum().backward()
>>> x.grad.tolist() == [float(hvd.size())] * 3
True
"""

import torch

from .collectives import (allreduce_async_, grouped_allreduce_async,
                          grouped_allreduce_async_, grouped_reducescatter_async, resolve_op)
from .movement import grouped_allgather_sizes
from .compression import Compression, resolve_codec
from .handles import synchronize
from .process_sets import global_process_set
from .tensor_ops import Average

__all__ = ["allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_",
           "reducescatter", "grouped_reducescatter"]


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
    """Average (or sum, ...) a list of tensors over the set in one collective.

    Differentiable, like :func:`allreduce`.

    Parameters
    ----------
    tensors : list of torch.Tensor
        The inputs, the same shapes and dtypes on every rank of the set.
    average : bool, optional
        Deprecated (Horovod's): ``True`` is ``op=Average``, ``False`` ``op=Sum``.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    compression : optional
        ``Compression.none`` (default), ``Compression.fp16`` (or any object with
        Horovod's ``compress``/``decompress``), or a ccl codec:
        ``Compression.codec("3lc", s=1.5)``, a codec, or its id.
    op : int, optional
        ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

    Returns
    -------
    list of torch.Tensor
        The results, new tensors.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> [t.tolist() for t in hvd.grouped_allreduce([torch.ones(1), torch.full((2,), 2.0)])]
    [[1.0], [2.0, 2.0]]
    """
    codec, compressor = _split_compression(compression)
    pairs = [compressor.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply((average, name, op, prescale_factor, postscale_factor,
                                    process_set, codec), *[t for t, _ in pairs])
    return [compressor.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Average (or sum, min, max, multiply) ``tensor`` over the set; differentiable.

    The gradient is the allreduce of the output's gradient (same op and scale
    factors), as in Horovod.

    Parameters
    ----------
    tensor : torch.Tensor
        The input, the same shape and dtype on every rank of the set; not modified.
    average : bool, optional
        Deprecated (Horovod's): ``True`` is ``op=Average``, ``False`` ``op=Sum``.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    compression : optional
        ``Compression.none`` (default), ``Compression.fp16`` (or any object with
        Horovod's ``compress``/``decompress``), or a ccl codec:
        ``Compression.codec("3lc", s=1.5)``, a codec, or its id.
    op : int, optional
        ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

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
    """As :func:`allreduce`, in place: ``tensor`` gets the result.

    Parameters
    ----------
    tensor : torch.Tensor
        The input, the same shape and dtype on every rank of the set; not modified.
    average : bool, optional
        Deprecated (Horovod's): ``True`` is ``op=Average``, ``False`` ``op=Sum``.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    op : int, optional
        ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.
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
    >>> t = torch.ones(2)
    >>> hvd.allreduce_(t, op=hvd.Sum) is t and t.tolist() == [float(hvd.size())] * 2
    True
    """
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """As :func:`grouped_allreduce`, in place.

    Parameters
    ----------
    tensors : list of torch.Tensor
        The inputs, the same shapes and dtypes on every rank of the set.
    average : bool, optional
        Deprecated (Horovod's): ``True`` is ``op=Average``, ``False`` ``op=Sum``.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    op : int, optional
        ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

    Returns
    -------
    list of torch.Tensor
        ``tensors``, holding the results.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> ts = [torch.ones(2), torch.ones(1)]
    >>> hvd.grouped_allreduce_(ts) is ts
    True
    """
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


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
    """Reducescatter a list of tensors in one collective (differentiable).

    Parameters
    ----------
    tensors : list of torch.Tensor
        The inputs, the same shapes and dtypes on every rank of the set.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    compression : optional
        ``Compression.none`` (default), ``Compression.fp16`` (or any object with
        Horovod's ``compress``/``decompress``), or a ccl codec:
        ``Compression.codec("3lc", s=1.5)``, a codec, or its id.
    op : int
        ``Average`` (default) or ``Sum`` (``Min``, ``Max``, ``Product`` too).
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.

    Returns
    -------
    list of torch.Tensor
        This rank's rows of each result.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> [t.shape[0] for t in hvd.grouped_reducescatter([torch.ones(hvd.size(), 2)])]
    [1]
    """
    codec, compressor = _split_compression(compression)
    pairs = [compressor.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply((name, codec, op, process_set, prescale_factor,
                                        postscale_factor), *[t for t, _ in pairs])
    return [compressor.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over the set; return this rank's rows of dimension 0.

    Rank ``r`` of the set gets ``dim0 // size`` rows, one more when ``r <
    dim0 % size``. The gradient is the allgather of the output's gradient
    (divided by the set's size for ``Average``), as in Horovod.

    Parameters
    ----------
    tensor : torch.Tensor
        The input, the same shape and dtype on every rank of the set; not modified.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    compression : optional
        ``Compression.none`` (default), ``Compression.fp16`` (or any object with
        Horovod's ``compress``/``decompress``), or a ccl codec:
        ``Compression.codec("3lc", s=1.5)``, a codec, or its id.
    op : int
        ``Average`` (default) or ``Sum`` (``Min``, ``Max``, ``Product`` too).
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.

    Returns
    -------
    torch.Tensor
        This rank's rows of the result.

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
