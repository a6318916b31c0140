"""Horovod's reductions, asynchronous forms: ``allreduce_async``, ``reducescatter_async``, ...

Same names, arguments and defaults as ``horovod.torch``; ``*_async`` return
a handle for :func:`~ccl.torch.synchronize`, trailing ``_`` work in place,
``grouped_*`` take lists. Results are exact (the MPI library's own
collectives), unless ``compression=`` names a ccl codec
(``hvd.Compression.codec("3lc")``). Errors (ranks passing different shapes,
dtypes, names or roots) raise a ``RuntimeError`` on every rank of the set.
The data-moving collectives (allgather, broadcast, alltoall) are in
``ccl.torch.movement``; the synchronous, differentiable forms in
``ccl.torch.autograd`` and ``ccl.torch.autograd_movement``.

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> hvd.allreduce(torch.tensor([1.0, 2.0])).tolist()   # the average
[1.0, 2.0]
"""

import numpy as np
import torch

from . import tensor_ops
from .compression import resolve_codec
from .handles import submit
from .process_sets import global_process_set
from .tensor_ops import DTYPES, Adasum, Average, Max, Min, Product, Sum, check_tensor

__all__ = [
    "allreduce_async", "allreduce_async_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "reducescatter_async", "grouped_reducescatter_async",
    "resolve_op", "capture_error",
]

_OPS = (Average, Sum, Adasum, Min, Max, Product)


def resolve_op(op, average=None, allowed=_OPS):
    """Horovod's ``op`` from ``op`` and the deprecated ``average`` (default Average)."""
    if op is not None and average is not None:
        raise ValueError("give op= or the deprecated average=, not both")
    if op is None:
        op = Sum if average is False else Average
    if op not in allowed:
        names = ", ".join(tensor_ops.OP_NAMES[o] for o in allowed)
        raise ValueError(f"op must be one of hvd.{names.replace(', ', ', hvd.')}; got {op!r}")
    return op


def capture_error(check):
    """Run ``check()``; return the TypeError/ValueError/NotImplementedError it raised, or None.

    The error is handed to the collective's agreement, so that the other
    ranks raise too instead of waiting.
    """
    try:
        check()
    except (TypeError, ValueError, NotImplementedError) as exc:
        return exc
    return None


def _reduce_checks(tensors, op, codec, what):
    for t in tensors:
        check_tensor(t, what, DTYPES)
    if op == Adasum:
        if codec is not None:
            raise ValueError("op=hvd.Adasum does not take a ccl codec as compression=")
        if not all(t.dtype.is_floating_point for t in tensors):
            raise TypeError("op=hvd.Adasum reduces floating-point tensors only")
    if codec is not None:
        if op not in (Sum, Average):
            raise ValueError("a ccl codec as compression= reduces with hvd.Sum or hvd.Average")
        for t in tensors:
            if np.dtype(str(t.dtype).replace("torch.", "")) not in codec.input_dtypes:
                raise TypeError(f"codec {codec.codec_id!r} does not take {t.dtype} tensors")


def _allreduce_handle(kind, tensors, name, op, prescale, postscale, process_set, codec,
                      error, post):
    def work(ps, name, error):
        return tensor_ops.allreduce(ps, tensors, op, name, prescale, postscale, codec, error)

    return submit(kind, name, process_set, work, error, post)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set, compression=None):
    """Start averaging (or summing, ...) ``tensor`` over the set; return a handle.

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
    compression : optional
        A ccl codec (``Compression.codec(...)``, a codec or its id) that
        compresses on the wire, with error feedback per name.

    Returns
    -------
    int
        A handle for :func:`~ccl.torch.synchronize`, which returns a new tensor.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> handle = hvd.allreduce_async(torch.ones(2), op=hvd.Sum)
    >>> hvd.synchronize(handle).tolist() == [float(hvd.size())] * 2
    True
    """
    return _allreduce_any([tensor], average, name, op, prescale_factor, postscale_factor,
                          process_set, compression, "allreduce", lambda r: r[0])


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set, compression=None):
    """As :func:`allreduce_async`, but :func:`~ccl.torch.synchronize` writes into ``tensor``.

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
    compression : optional
        A ccl codec (``Compression.codec(...)``, a codec or its id) that
        compresses on the wire, with error feedback per name.

    Returns
    -------
    int
        A handle; synchronizing it returns ``tensor``, holding the result.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> t = torch.ones(2)
    >>> hvd.synchronize(hvd.allreduce_async_(t)) is t
    True
    """
    def post(results):
        with torch.no_grad():
            tensor.copy_(results[0])
        return tensor

    return _allreduce_any([tensor], average, name, op, prescale_factor, postscale_factor,
                          process_set, compression, "allreduce", post)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set,
                            compression=None):
    """Start reducing a list of tensors in one collective; return a handle.

    Tensors of one dtype travel fused, in one MPI call.

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
    compression : optional
        A ccl codec (``Compression.codec(...)``, a codec or its id) that
        compresses on the wire, with error feedback per name.

    Returns
    -------
    int
        A handle; synchronizing it returns the list of results.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> handle = hvd.grouped_allreduce_async([torch.ones(2), torch.zeros(3)])
    >>> [t.tolist() for t in hvd.synchronize(handle)]
    [[1.0, 1.0], [0.0, 0.0, 0.0]]
    """
    return _allreduce_any(list(tensors), average, name, op, prescale_factor,
                          postscale_factor, process_set, compression, "grouped_allreduce",
                          None)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set,
                             compression=None):
    """As :func:`grouped_allreduce_async`, writing the results into ``tensors``.

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
    compression : optional
        A ccl codec (``Compression.codec(...)``, a codec or its id) that
        compresses on the wire, with error feedback per name.

    Returns
    -------
    int
        A handle; synchronizing it returns ``tensors``, holding the results.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> ts = [torch.ones(2)]
    >>> hvd.synchronize(hvd.grouped_allreduce_async_(ts)) is ts
    True
    """
    given, tensors = tensors, list(tensors)

    def post(results):
        with torch.no_grad():
            for t, r in zip(tensors, results):
                t.copy_(r)
        return given if isinstance(given, list) else tensors

    return _allreduce_any(tensors, average, name, op, prescale_factor, postscale_factor,
                          process_set, compression, "grouped_allreduce", post)


def _allreduce_any(tensors, average, name, op, prescale, postscale, process_set, compression,
                   kind, post):
    codec, error, resolved = None, None, Average

    def check():
        nonlocal codec, resolved
        resolved = resolve_op(op, average)
        if compression is not None:
            codec, _ = resolve_codec(compression)
        _reduce_checks(tensors, resolved, codec, kind)

    error = capture_error(check)
    return _allreduce_handle(kind, tensors, name, resolved, prescale, postscale, process_set,
                             codec, error, post)


def reducescatter_async(tensor, name=None, compression=None, op=Average,
                        process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Start reducing ``tensor`` over the set; each rank gets its rows of dimension 0.

    Rank ``r`` of the set gets ``dim0 // size`` rows, one more if ``r <
    dim0 % size``.

    Parameters
    ----------
    tensor : torch.Tensor
        The input, the same shape and dtype on every rank of the set; not modified.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    compression : optional
        A ccl codec (``Compression.codec(...)``, a codec or its id) that
        compresses on the wire, with error feedback per name.
    op : int
        ``Average`` (default) or ``Sum`` (``Min``, ``Max``, ``Product`` too).
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.

    Returns
    -------
    int
        A handle; synchronizing it returns this rank's rows.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> rows = hvd.synchronize(hvd.reducescatter_async(torch.ones(hvd.size(), 2)))
    >>> rows.tolist()
    [[1.0, 1.0]]
    """
    return _reducescatter_any([tensor], name, compression, op, process_set, prescale_factor,
                              postscale_factor, "reducescatter", lambda r: r[0])


def grouped_reducescatter_async(tensors, name=None, compression=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """As :func:`reducescatter_async` for a list of tensors.

    Parameters
    ----------
    tensors : list of torch.Tensor
        The inputs, the same shapes and dtypes on every rank of the set.
    name : str, optional
        Names the collective (generated if None); ranks must use the same names.
    compression : optional
        A ccl codec (``Compression.codec(...)``, a codec or its id) that
        compresses on the wire, with error feedback per name.
    op : int
        ``Average`` (default) or ``Sum`` (``Min``, ``Max``, ``Product`` too).
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.

    Returns
    -------
    int
        A handle; synchronizing it returns the list of this rank's rows.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> h = hvd.grouped_reducescatter_async([torch.ones(hvd.size())], op=hvd.Sum)
    >>> [t.tolist() for t in hvd.synchronize(h)] == [[float(hvd.size())]]
    True
    """
    return _reducescatter_any(list(tensors), name, compression, op, process_set,
                              prescale_factor, postscale_factor, "grouped_reducescatter", None)


def _reducescatter_any(tensors, name, compression, op, process_set, prescale, postscale,
                       kind, post):
    codec = None

    def check():
        nonlocal codec
        resolve_op(op, allowed=(Average, Sum, Min, Max, Product))
        if compression is not None:
            codec, _ = resolve_codec(compression)
        _reduce_checks(tensors, op, codec, kind)
        if any(t.dim() == 0 for t in tensors):
            raise ValueError(f"{kind} takes tensors of at least one dimension")

    error = capture_error(check)

    def work(ps, name, error):
        return tensor_ops.reducescatter(ps, tensors, op, name, prescale, postscale, codec,
                                        error)

    return submit(kind, name, process_set, work, error, post)
