"""Broadcasts that start every rank from the same model and optimizer state.

Tensors travel as raw bytes in one ``MPI_Bcast`` per call (bitwise copies,
any dtype, ``bfloat16`` and ``bool`` included), after a small agreement
check so that ranks passing different tensors raise instead of hanging or
reading garbage. Only :func:`broadcast_object`, :func:`allgather_object` and
the *structure* of an optimizer's state (not its tensors) are pickled: those
are explicit user-level objects, never gradient payloads.
"""

import numpy as np
import torch
from mpi4py import MPI

from ..agreement import agree
from .runtime import current

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object", "to_array", "from_array"]

# Tensors start at multiples of this many bytes in the broadcast buffer, so a
# byte slice can be viewed as any dtype without a copy.
_ALIGN = 16


def to_array(tensor):
    """A zero-copy array view of a tensor: numpy for CPU tensors, cupy (DLPack) for CUDA ones.

    CUDA tensors need cupy (``pip install '.[gpu]'``); the ccl collectives then keep
    the work on the tensor's device.
    """
    tensor = tensor.detach()
    if tensor.is_cuda:
        import cupy

        return cupy.from_dlpack(tensor)
    return tensor.numpy()


def from_array(array, like):
    """A tensor sharing ``array``'s memory (DLPack for device arrays), on ``like``'s device."""
    if isinstance(array, np.ndarray):
        return torch.from_numpy(array).to(like.device)
    return torch.from_dlpack(array)


def _check_root(root_rank, size):
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        return TypeError(f"root_rank must be an int, got {type(root_rank).__name__}")
    if not 0 <= root_rank < size:
        return ValueError(f"root_rank must be in [0, {size}), got {root_rank}")
    return None


def _as_bytes(tensor):
    """The tensor's values as a flat CPU ``uint8`` tensor (a view where possible)."""
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return flat.contiguous().view(torch.uint8)


def _bcast_tensors(comm, tensors, root_rank):
    """Overwrite every tensor in place with root's values (one ``Bcast`` of raw bytes)."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += -(-n // _ALIGN) * _ALIGN
    buf = np.zeros(total, dtype=np.uint8)
    is_root = comm.Get_rank() == root_rank
    if is_root:
        for t, start, n in zip(tensors, offsets, sizes):
            buf[start:start + n] = _as_bytes(t).numpy()
    comm.Bcast([buf, MPI.BYTE], root=root_rank)
    if is_root:
        return
    raw = torch.from_numpy(buf)
    with torch.no_grad():
        for t, start, n in zip(tensors, offsets, sizes):
            t.copy_(raw[start:start + n].view(t.dtype).view(t.shape))


def _named_tensors(params):
    """``[(name, tensor)]`` from a state dict, named parameters, or a list of tensors."""
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        try:
            entries = list(params)
        except TypeError:
            raise TypeError("broadcast_parameters takes a state dict (model.state_dict()), "
                            "model.named_parameters(), or a list of tensors; got "
                            f"{type(params).__name__}") from None
        items = []
        for index, entry in enumerate(entries):
            if isinstance(entry, tuple) and len(entry) == 2:
                items.append(entry)
            else:
                items.append((str(index), entry))
    for name, value in items:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"broadcast_parameters: entry {name!r} is a "
                            f"{type(value).__name__}, not a tensor; pass model.state_dict() "
                            "or model.named_parameters()")
    return items


def broadcast_parameters(params, root_rank=0):
    """Overwrite tensors on every rank with ``root_rank``'s values, in place (collective).

    Parameters
    ----------
    params : dict, or iterable of tensors or (name, tensor) pairs
        ``model.state_dict()`` (broadcast in order of sorted keys, buffers
        included), ``model.named_parameters()``, or a list of tensors. Every
        rank passes the same names, shapes and dtypes in the same order.
    root_rank : int
        The rank whose values everyone gets.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (on the rank that passed them).
    ccl.MismatchError
        Ranks passed different names, shapes, dtypes or roots (on every other rank).

    Examples
    --------
    >>> import torch, ccl.torch as ct
    >>> ct.init()
    >>> model = torch.nn.Linear(4, 2)
    >>> ct.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    runtime = current()
    error, items = _check_root(root_rank, runtime.size), []
    if error is None:
        try:
            items = _named_tensors(params)
        except TypeError as exc:
            error = exc
    signature = (root_rank, [(name, tuple(t.shape), str(t.dtype)) for name, t in items])
    agree(runtime.comm, "broadcast_parameters", [("arguments", signature)], error)
    _bcast_tensors(runtime.comm, [t for _, t in items], root_rank)


class _Slot:
    """Stands for a tensor in the pickled structure of an optimizer state."""

    __slots__ = ("index", "shape", "dtype")

    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, shape, dtype

    def __reduce__(self):
        return _Slot, (self.index, self.shape, self.dtype)


def _strip_tensors(obj, tensors):
    """Replace the tensors in a nested dict/list/tuple by :class:`_Slot` (collected in order)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _strip_tensors(v, tensors) for k, v in obj.items()}
    if type(obj) in (list, tuple):  # exact types: a namedtuple is pickled whole
        return type(obj)(_strip_tensors(v, tensors) for v in obj)
    return obj


def _slots(obj):
    """Yield the :class:`_Slot` objects of a nested dict/list/tuple."""
    if isinstance(obj, _Slot):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _slots(v)
    elif type(obj) in (list, tuple):
        for v in obj:
            yield from _slots(v)


def _fill_slots(obj, tensors):
    if isinstance(obj, _Slot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill_slots(v, tensors) for k, v in obj.items()}
    if type(obj) in (list, tuple):  # exact types: a namedtuple is pickled whole
        return type(obj)(_fill_slots(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Give every rank ``root_rank``'s optimizer state and hyperparameters (collective).

    The state's structure (hyperparameters, step counts) is pickled and
    broadcast; its tensors (momentum, Adam moments) travel as raw bytes. Then
    every other rank calls ``optimizer.load_state_dict``. A
    :class:`~ccl.torch.DistributedOptimizer`'s error-feedback residuals are
    per rank and stay as they were.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The same kind of optimizer over the same parameter shapes on every rank.
    root_rank : int
        The rank whose state every rank gets.

    Raises
    ------
    RuntimeError
        On a rank whose :class:`~ccl.torch.DistributedOptimizer` has gradient
        reductions pending (call ``step()`` or ``synchronize()`` first); the
        other ranks raise :class:`ccl.MismatchError`.
    ccl.MismatchError
        If ranks' optimizers hold different parameter groups or shapes.

    Examples
    --------
    >>> import torch, ccl.torch as ct
    >>> ct.init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1 * (ct.rank() + 1))
    >>> ct.broadcast_optimizer_state(opt, root_rank=0)
    >>> opt.param_groups[0]["lr"]
    0.1
    """
    runtime = current()
    broadcast_state(runtime.comm, optimizer, root_rank, _check_root(root_rank, runtime.size))


def broadcast_state(comm, optimizer, root_rank, error=None):
    """:func:`broadcast_optimizer_state` on ``comm`` (root's rank in it; collective).

    ``error``, this rank's error in the arguments, is raised on every rank.
    """
    if error is None and not isinstance(optimizer, torch.optim.Optimizer):
        error = TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                          f"{type(optimizer).__name__}")
    state = None
    if error is None:
        # What can fail (a DistributedOptimizer with reductions pending refuses to give
        # or take its state) fails on every rank before the agreement, not on the root
        # alone while the others wait in the broadcast.
        try:
            state = dict(optimizer.state_dict())
        except RuntimeError as exc:
            error = exc
    signature = (root_rank, type(optimizer).__name__, [
        [tuple(p.shape) for p in group["params"]] for group in optimizer.param_groups
    ] if error is None else None)
    agree(comm, "broadcast_optimizer_state", [("arguments", signature)], error)
    is_root = comm.Get_rank() == root_rank
    tensors, skeleton = [], None
    if is_root:
        state.pop("ccl", None)  # error feedback is per rank
        skeleton = _strip_tensors(state, tensors)
    skeleton = comm.bcast(skeleton, root=root_rank)
    if not is_root:
        slots = sorted(_slots(skeleton), key=lambda slot: slot.index)
        tensors = [torch.empty(slot.shape, dtype=slot.dtype) for slot in slots]
    _bcast_tensors(comm, tensors, root_rank)
    if not is_root:
        optimizer.load_state_dict(_fill_slots(skeleton, tensors))



def broadcast_object(obj, root_rank=0):
    """Return ``root_rank``'s ``obj`` on every rank (collective; pickled).

    For small user-level objects (epoch counters, config dicts, a checkpoint
    path). It uses mpi4py's pickle-based ``bcast`` on ``ccl.torch``'s private
    communicator, so it unpickles what root sends: use it between ranks of
    one trusted job only. Tensors are better sent with
    :func:`broadcast_parameters`.

    Parameters
    ----------
    obj : object
        A picklable object (only root's is used).
    root_rank : int
        The rank whose object every rank gets.

    Returns
    -------
    object
        Root's ``obj``.

    Raises
    ------
    ValueError
        If ``root_rank`` is not a rank of the communicator.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> ct.broadcast_object({"epoch": 3} if ct.rank() == 0 else None)
    {'epoch': 3}
    """
    runtime = current()
    agree(runtime.comm, "broadcast_object", [("root_rank", root_rank)],
          _check_root(root_rank, runtime.size))
    return runtime.comm.bcast(obj, root=root_rank)


def allgather_object(obj):
    """Return the list of every rank's ``obj``, in rank order (collective; pickled).

    Same caveats as :func:`broadcast_object`.

    Parameters
    ----------
    obj : object
        This rank's picklable object.

    Returns
    -------
    list
        ``size()`` objects, rank 0's first.

    Raises
    ------
    RuntimeError
        If :func:`ccl.torch.init` was not called.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> ct.allgather_object(ct.rank()) == list(range(ct.size()))
    True
    """
    return current().comm.allgather(obj)
