"""Horovod's data-moving collectives: ``allgather``, ``broadcast``, ``alltoall``, ``barrier``.

As :mod:`ccl.torch.collectives` (the reductions): Horovod's names, arguments
and defaults; ``*_async`` return a handle for :func:`~ccl.torch.synchronize`.
Tensors travel as raw bytes (any dtype, ``bool`` included), so results are
exact copies.

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> hvd.synchronize(hvd.broadcast_async(torch.tensor([hvd.rank()]), 0)).item()
0
"""

import time

import numpy as np
import torch

from . import tensor_ops
from .collectives import capture_error
from .handles import submit, synchronize
from .joins import join_work, serve_steps, zeros_of
from .process_sets import global_process_set
from .runtime import current
from .tensor_ops import check_tensor

__all__ = ["allgather_async", "sparse_allreduce_async", "grouped_allgather_async",
           "grouped_allgather_sizes",
           "broadcast_async", "broadcast_async_", "alltoall_async", "barrier", "join"]


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start concatenating every rank's ``tensor`` along dimension 0; return a handle.

    First dimensions may differ between ranks; the other dimensions and the
    dtype may not.

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
    int
        A handle; synchronizing it returns the concatenation, in rank order.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> out = hvd.synchronize(hvd.allgather_async(torch.tensor([hvd.rank()])))
    >>> out.tolist() == list(range(hvd.size()))
    True
    """
    return _allgather_any([tensor], name, process_set, "allgather",
                          lambda r: r[0][0])


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Start reducing a sparse tensor by allgathering its indices and values (Horovod's way).

    Parameters
    ----------
    tensor : torch.Tensor
        A sparse COO tensor, the same dense shape on every rank of the set.
    name : str
        Names the two allgathers (``name.indices``, ``name.values``).
    op : int
        ``hvd.Average`` or ``hvd.Sum``.
    process_set : ProcessSet
        The ranks taking part (default: every rank).

    Returns
    -------
    callable
        As Horovod's: calling it waits and returns the sparse result, every
        rank's entries side by side (duplicates add up when coalesced).

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> x = torch.sparse_coo_tensor([[1]], [2.0], (3,))
    >>> wait = hvd.sparse_allreduce_async(x, name="emb", op=hvd.Average)
    >>> wait().to_dense().tolist()
    [0.0, 2.0, 0.0]
    """
    if op not in (tensor_ops.Average, tensor_ops.Sum):
        raise ValueError("sparse_allreduce_async takes op=hvd.Average or hvd.Sum")
    t = tensor.coalesce() if tensor.is_sparse else tensor
    if not t.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse tensor")
    # allgather concatenates along dimension 0: indices travel transposed
    indices = allgather_async(t.indices().transpose(0, 1).contiguous(), f"{name}.indices",
                              process_set)
    values = allgather_async(t.values(), f"{name}.values", process_set)

    def wait():
        vals, idx = synchronize(values), synchronize(indices)
        if op == tensor_ops.Average:
            vals = vals / process_set.size()
        return torch.sparse_coo_tensor(idx.transpose(0, 1), vals, t.shape)

    return wait


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start allgathering a list of tensors in one collective; return a handle.

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
    int
        A handle; synchronizing it returns the list of concatenations.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> outs = hvd.synchronize(hvd.grouped_allgather_async([torch.ones(1), torch.ones(2, 2)]))
    >>> [tuple(o.shape) for o in outs] == [(hvd.size(),), (2 * hvd.size(), 2)]
    True
    """
    return _allgather_any(list(tensors), name, process_set, "grouped_allgather",
                          lambda r: [out for out, _ in r])


def _allgather_any(tensors, name, process_set, kind, post):
    error = capture_error(lambda: [check_tensor(t, kind) for t in tensors])

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
    int
        A handle; synchronizing it returns a new tensor holding root's values.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.synchronize(hvd.broadcast_async(torch.tensor([hvd.rank()]), 0)).item()
    0
    """
    return _broadcast_any(tensor, root_rank, name, process_set, lambda r: r[0])


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """As :func:`broadcast_async`, but synchronizing writes root's values into ``tensor``.

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
    int
        A handle; synchronizing it returns ``tensor``.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> t = torch.tensor([hvd.rank()])
    >>> hvd.synchronize(hvd.broadcast_async_(t, 0)) is t and t.item() == 0
    True
    """
    def post(results):
        with torch.no_grad():
            tensor.copy_(results[0])
        return tensor

    return _broadcast_any(tensor, root_rank, name, process_set, post)


def _broadcast_any(tensor, root_rank, name, process_set, post):
    error = capture_error(lambda: (check_tensor(tensor, "broadcast"),
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
        Rows per destination (default: equal shares of the first dimension).
    name : str, optional
        Names the collective (generated if None).
    process_set : ProcessSet
        The ranks taking part (default: every rank); this rank must be one.

    Returns
    -------
    int
        A handle; synchronizing it returns ``(output, received_splits)``.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> out, received = hvd.synchronize(hvd.alltoall_async(torch.zeros(hvd.size())))
    >>> received.tolist() == [1] * hvd.size()
    True
    """
    sizes = [None]

    def check():
        check_tensor(tensor, "alltoall")
        sizes[0] = _splits(tensor, splits, process_set.size())

    error = capture_error(check)

    def work(ps, name, error):
        return tensor_ops.alltoall(ps, tensor, sizes[0] or [0] * ps.size(), name, error)

    return submit("alltoall", name, process_set, work, error, None)


def barrier(process_set=global_process_set):
    """Wait until every rank of the set calls ``barrier`` (after its earlier collectives).

    Parameters
    ----------
    process_set : ProcessSet
        The ranks taking part (default: every rank).

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

    As Horovod: a rank that joined (ran out of data) takes part in the other
    ranks' later allreduces of the global process set with zeros, until every
    rank joined; an average still divides by the number of all ranks. So do
    its ``DistributedOptimizer`` objects: their buckets get zeros from it in
    the others' steps, while its own gradients and parameters stay as they
    are (broadcast the parameters afterwards where every rank needs the
    same weights); those steps count, so every rank is at the same step once
    all joined. Other collectives (allgather, broadcast, alltoall, ...) while
    a rank has joined raise :class:`~ccl.torch.HorovodInternalError` on the
    ranks that called them. Collectives the rank submitted before ``join``
    finish first.

    Parameters
    ----------
    device : int
        Ignored (Horovod's GPU for the zeros).

    Returns
    -------
    int
        The global rank that called ``join`` last (of ranks that joined
        together, the one with the latest clock).

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> 0 <= hvd.join() < hvd.size()
    True
    """
    del device

    def zeros(spec):
        tensor_ops.allreduce_data(global_process_set, zeros_of(spec), spec["op"],
                                  spec["prescale"], spec["postscale"])

    called = int(time.time() * 1e6)  # "last" is the last to call, whenever the work runs
    handle = submit("join", None, global_process_set,
                    lambda ps, name, error: join_work(ps._comm, zeros, called))
    try:  # the optimizers' steps, in this thread, while the collectives' thread joins
        serve_steps(current())
    finally:
        last = synchronize(handle)
    return last
