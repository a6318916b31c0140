"""Horovod's signatures of the broadcasts of parameters, optimizer state and objects.

On the global process set these are :mod:`ccl.torch.functions`'
collectives; on another set they run on that set's communicator, queued
with the tensor collectives (in the collectives' thread).
"""

from ..agreement import agree
from . import functions
from .handles import submit, synchronize
from .process_sets import global_process_set, set_runtime
from .tensor_ops import HorovodInternalError

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]


def _is_global(process_set):
    return process_set is None or process_set is global_process_set


def _on_set(kind, name, process_set, fields, move, error=None):
    """Run ``move(comm)`` on the set's communicator after agreeing on ``fields``."""
    def work(ps, name, error):
        try:
            agree(ps._comm, kind, [("name", name)] + fields, error)
        except Exception as exc:
            if isinstance(exc, (TypeError, ValueError)) and exc is error:
                raise
            raise HorovodInternalError(f"{kind}: {exc}") from exc
        return move(ps)

    return synchronize(submit(kind, name, process_set, work, error))


def broadcast_parameters(params, root_rank=0, process_set=global_process_set):
    """Overwrite ``params`` with root's values, in place (collective).

    Parameters
    ----------
    params : dict or iterable
        ``model.state_dict()``, ``model.named_parameters()`` or a list of
        tensors; the same names, shapes and dtypes on every rank of the set.
    root_rank : int
        The (global) rank whose values every rank of the set gets.
    process_set : ProcessSet
        The ranks taking part (default: every rank).

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(2, 1)
    >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    if _is_global(process_set):
        functions.broadcast_parameters(params, root_rank=root_rank)
        return
    from .autograd_movement import broadcast_

    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        items = [e if isinstance(e, tuple) else (str(i), e) for i, e in enumerate(params)]
    for name, tensor in items:
        broadcast_(tensor.data, root_rank, name=f"broadcast_parameters.{name}",
                   process_set=process_set)


def broadcast_optimizer_state(optimizer, root_rank=0, process_set=global_process_set):
    """Give every rank root's optimizer state and hyperparameters (collective).

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The same kind of optimizer over the same parameter shapes on every rank.
    root_rank : int
        The rank whose state every rank gets.
    process_set : ProcessSet
        The ranks taking part (default: every rank); only its members call
        this. ``root_rank`` is a global rank, a member of the set.

    Raises
    ------
    ValueError
        If this rank is not a member (on this rank alone), or ``root_rank``
        is not a member (on every member).

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1 * (hvd.rank() + 1))
    >>> hvd.broadcast_optimizer_state(opt, root_rank=0)
    >>> opt.param_groups[0]["lr"]
    0.1
    """
    if _is_global(process_set):
        functions.broadcast_optimizer_state(optimizer, root_rank=root_rank)
        return
    runtime = set_runtime(process_set)  # the members' thread communicator, as the optimizer's
    error = None
    if root_rank not in process_set.ranks:
        error = ValueError(f"root_rank {root_rank} is not a rank of {process_set!r}")
    functions.broadcast_state(runtime.comm, optimizer,
                              process_set.ranks.index(root_rank) if error is None else 0, error)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Return root's ``obj`` on every rank of the set (collective; pickled).

    Unpickles what root sends: use it between ranks of one trusted job only.

    Parameters
    ----------
    obj : object
        A picklable object (only root's is used).
    root_rank : int
        The (global) rank whose object everyone gets.
    name : str, optional
        Names the collective.
    process_set : ProcessSet
        The ranks taking part (default: every rank).

    Returns
    -------
    object
        Root's ``obj``.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.broadcast_object({"epoch": 3} if hvd.rank() == 0 else None, root_rank=0)
    {'epoch': 3}
    """
    if _is_global(process_set):
        return functions.broadcast_object(obj, root_rank=root_rank)
    error = None
    if root_rank not in (process_set.ranks or []):
        error = ValueError(f"root_rank {root_rank} is not a rank of {process_set!r}")

    def move(ps):
        return ps._comm.bcast(obj, root=ps.ranks.index(root_rank))

    return _on_set("broadcast_object", name, process_set, [("root_rank", root_rank)], move,
                   error)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Return the list of every set rank's ``obj``, in rank order (collective; pickled).

    Parameters
    ----------
    obj : object
        This rank's picklable object.
    name : str, optional
        Names the collective.
    process_set : ProcessSet
        The ranks taking part (default: every rank).

    Returns
    -------
    list
        One object per rank of the set.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
    True
    """
    if _is_global(process_set):
        return functions.allgather_object(obj)
    return _on_set("allgather_object", name, process_set, [],
                   lambda ps: ps._comm.allgather(obj))
