"""Horovod's tensor collectives: ``allreduce``, ``allgather``, ``broadcast``, ``alltoall``, ...

Same names, arguments and defaults as ``horovod.torch``; ``*_async`` return
a handle for :func:`~ccl.torch.synchronize`, trailing ``_`` work in place,
``grouped_*`` take lists. Results are exact (the MPI library's own
collectives), unless ``compression=`` names a ccl codec
(``hvd.Compression.codec("3lc")``). Errors (ranks passing different shapes,
dtypes, names or roots) raise a ``RuntimeError`` on every rank of the set.
Autograd: the synchronous forms are differentiable as Horovod defines them
(their gradients live in :mod:`ccl.torch.autograd`).

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> hvd.allreduce(torch.tensor([1.0, 2.0])).tolist()   # the average
[1.0, 2.0]
"""

import numpy as np
import torch

from . import tensor_ops
from .compression import resolve_codec
from .handles import submit, synchronize
from .process_sets import global_process_set
from .tensor_ops import DTYPES, Adasum, Average, Max, Min, Product, Sum, check_tensor

__all__ = [
    "allreduce_async", "allreduce_async_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather_async", "grouped_allgather_async",
    "broadcast_async", "broadcast_async_", "alltoall_async", "reducescatter_async",
    "grouped_reducescatter_async", "grouped_allgather_sizes", "barrier", "join",
    "resolve_op",
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


def _guard(check):
    """Run ``check()``; return the TypeError/ValueError it raised (else None)."""
    try:
        check()
    except (TypeError, ValueError, NotImplementedError) as exc:
        return exc
    return None


def _reduce_checks(tensors, op, codec, what):
    for t in tensors:
        check_tensor(t, what, DTYPES)
    if op == Adasum:
        raise NotImplementedError("op=hvd.Adasum is not available in ccl.torch yet: use "
                                  "hvd.Average, or a ccl codec as compression=")
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
        The same shape and dtype on every rank of the set; not modified.
    average : bool, optional
        Deprecated (Horovod's): ``True`` is ``op=Average``, ``False`` ``op=Sum``.
    name : str, optional
        Names the collective (and a codec's error feedback); generated if None.
    op : int, optional
        ``hvd.Average`` (default), ``hvd.Sum``, ``hvd.Min``, ``hvd.Max``, ``hvd.Product``.
    prescale_factor, postscale_factor : float
        Multiply the input before, and the result after, the reduction.
    process_set : ProcessSet
        The ranks that reduce together (default: all).
    compression : optional
        A ccl codec (``hvd.Compression.codec(...)``, a codec or its id) that
        compresses the chunks on the wire; Horovod's compressors are applied
        by :func:`~ccl.torch.allreduce`.

    Returns
    -------
    int
        A handle for :func:`~ccl.torch.synchronize` (which returns a new tensor).
    """
    return _allreduce_any([tensor], average, name, op, prescale_factor, postscale_factor,
                          process_set, compression, "allreduce", lambda r: r[0])


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set, compression=None):
    """As :func:`allreduce_async`, but :func:`~ccl.torch.synchronize` writes into ``tensor``.

    Returns
    -------
    int
        A handle; synchronizing it returns ``tensor``, holding the result.
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
    """Start reducing a list of tensors as one fused collective; return a handle.

    Arguments as :func:`allreduce_async`; tensors of one dtype travel in one
    MPI call. Synchronizing the handle returns the list of results.
    """
    return _allreduce_any(list(tensors), average, name, op, prescale_factor,
                          postscale_factor, process_set, compression, "grouped_allreduce",
                          None)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set,
                             compression=None):
    """As :func:`grouped_allreduce_async`, writing the results into ``tensors``."""
    tensors = list(tensors)

    def post(results):
        with torch.no_grad():
            for t, r in zip(tensors, results):
                t.copy_(r)
        return tensors

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

    error = _guard(check)
    return _allreduce_handle(kind, tensors, name, resolved, prescale, postscale, process_set,
                             codec, error, post)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start concatenating every rank's ``tensor`` along dimension 0; return a handle.

    First dimensions may differ between ranks; the other dimensions and the
    dtype may not. Synchronizing returns the concatenation, rank order.
    """
    return _allgather_any([tensor], name, process_set, "allgather",
                          lambda r: r[0][0])


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start allgathering a list of tensors in one collective; synchronize returns a list."""
    return _allgather_any(list(tensors), name, process_set, "grouped_allgather",
                          lambda r: [out for out, _ in r])


def _allgather_any(tensors, name, process_set, kind, post):
    error = _guard(lambda: [check_tensor(t, kind) for t in tensors])

    def work(ps, name, error):
        return tensor_ops.allgather(ps, tensors, name, error)

    return submit(kind, name, process_set, work, error, post)


def grouped_allgather_sizes(tensors, name=None, process_set=global_process_set):
    """``[(concatenation, first dimension of every rank)]``: what allgather's gradient needs."""
    kind = "allgather" if len(tensors) == 1 else "grouped_allgather"
    return synchronize(_allgather_any(list(tensors), name, process_set, kind, None))


def _check_root(root_rank, process_set):
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        raise TypeError(f"root_rank must be an int, got {type(root_rank).__name__}")
    members = process_set.ranks if process_set.process_set_id else range(process_set.size())
    if root_rank not in members:
        raise ValueError(f"root_rank {root_rank} is not a rank of {process_set!r}")


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Start sending ``root_rank``'s ``tensor`` to every rank of the set; return a handle.

    ``root_rank`` is a global rank (a member of the set). Synchronizing returns
    a new tensor; ``tensor`` is not modified.
    """
    return _broadcast_any(tensor, root_rank, name, process_set, lambda r: r[0])


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """As :func:`broadcast_async`, but synchronizing writes root's values into ``tensor``."""
    def post(results):
        with torch.no_grad():
            tensor.copy_(results[0])
        return tensor

    return _broadcast_any(tensor, root_rank, name, process_set, post)


def _broadcast_any(tensor, root_rank, name, process_set, post):
    error = _guard(lambda: (check_tensor(tensor, "broadcast"),
                            _check_root(root_rank, process_set)))

    def work(ps, name, error):
        return tensor_ops.broadcast(ps, [tensor], root_rank, name, error)

    return submit("broadcast", name, process_set, work, error, post)


def _splits(tensor, splits, size):
    if tensor.dim() == 0:
        raise ValueError("alltoall takes tensors of at least one dimension")
    if splits is None:
        if tensor.shape[0] % size:
            raise ValueError(f"without splits, alltoall needs a first dimension divisible by "
                             f"the set's size {size}, got {tensor.shape[0]}")
        return [tensor.shape[0] // size] * size
    values = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    if len(values) != size or any(int(v) < 0 for v in values):
        raise ValueError(f"splits must hold {size} non-negative counts, got {values}")
    if sum(int(v) for v in values) != tensor.shape[0]:
        raise ValueError(f"splits sum to {sum(values)}, the first dimension is "
                         f"{tensor.shape[0]}")
    return [int(v) for v in values]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start scattering ``tensor``'s rows to the set's ranks and gathering theirs.

    Parameters
    ----------
    tensor : torch.Tensor
        Rows ``splits[0]`` go to the set's rank 0, the next ``splits[1]`` to
        rank 1, ...
    splits : torch.Tensor or list of int, optional
        Rows per destination (default: equal shares).
    name : str, optional
        Names the collective.
    process_set : ProcessSet
        The ranks taking part.

    Returns
    -------
    int
        A handle; synchronizing it returns ``(output, received_splits)``.
    """
    sizes = [None]

    def check():
        check_tensor(tensor, "alltoall")
        sizes[0] = _splits(tensor, splits, process_set.size())

    error = _guard(check)

    def work(ps, name, error):
        return tensor_ops.alltoall(ps, tensor, sizes[0] or [0] * ps.size(), name, error)

    return submit("alltoall", name, process_set, work, error, None)


def reducescatter_async(tensor, name=None, compression=None, op=Average,
                        process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Start reducing ``tensor`` over the set; each rank gets its rows of dimension 0.

    Rank ``r`` of the set gets ``dim0 // size`` rows, one more if ``r <
    dim0 % size``. Ops ``hvd.Average`` (default) and ``hvd.Sum`` (``Min``,
    ``Max``, ``Product`` too); ``compression`` may be a ccl codec.

    Returns
    -------
    int
        A handle; synchronizing it returns this rank's rows.
    """
    return _reducescatter_any([tensor], name, compression, op, process_set, prescale_factor,
                              postscale_factor, "reducescatter", lambda r: r[0])


def grouped_reducescatter_async(tensors, name=None, compression=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """As :func:`reducescatter_async` for a list; synchronizing returns a list."""
    return _reducescatter_any(list(tensors), name, compression, op, process_set,
                              prescale_factor, postscale_factor, "grouped_reducescatter", None)


def _reducescatter_any(tensors, name, compression, op, process_set, prescale, postscale,
                       kind, post):
    codec = None

    def check():
        nonlocal codec
        resolve_op(op)
        if compression is not None:
            codec, _ = resolve_codec(compression)
        _reduce_checks(tensors, op, codec, kind)
        if any(t.dim() == 0 for t in tensors):
            raise ValueError(f"{kind} takes tensors of at least one dimension")

    error = _guard(check)

    def work(ps, name, error):
        return tensor_ops.reducescatter(ps, tensors, op, name, prescale, postscale, codec,
                                        error)

    return submit(kind, name, process_set, work, error, post)


def barrier(process_set=global_process_set):
    """Wait until every rank of the set calls ``barrier`` (after its earlier collectives).

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.barrier()
    """
    synchronize(submit("barrier", None, process_set,
                       lambda ps, name, error: tensor_ops.barrier(ps, error)))


def join(device=-1):
    """Wait until every rank calls ``join``; return the rank that called it last.

    Horovod lets joined ranks take part in the other ranks' later
    allreduces with zeros; here every rank must have submitted the same
    collectives before it joins (the order check raises otherwise), so
    ``join`` is a barrier that also reports which rank was last.

    Parameters
    ----------
    device : int
        Ignored (Horovod's GPU for the zeros).

    Returns
    -------
    int
        The global rank that reached ``join`` last.
    """
    import time

    from .runtime import current

    arrived = torch.tensor([time.time()], dtype=torch.float64)
    times = synchronize(allgather_async(arrived, name=None))
    del device
    return int(torch.argmax(times).item()) if current().size else 0
