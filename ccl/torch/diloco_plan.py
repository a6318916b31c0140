"""What :class:`ccl.torch.DiLoCo` synchronises: argument checks, replicas, fragments.

DiLoCo averages pseudo-gradients over every rank of ``ccl.torch.init()``'s
communicator and treats each rank's parameters as one whole replica of the
model. :func:`check_replica` refuses the models for which that is not true
or not what the user wants, with a message that says what to do:

* a model wrapped in ``DistributedDataParallel`` (ccl's DDP hook included):
  DDP averages gradients over its process group at every step, so DiLoCo
  would average again what DDP already synchronised, over the whole world;
* a model sharded by FSDP (``FullyShardedDataParallel``, ``fully_shard``)
  or with ``DTensor`` parameters: each rank holds a shard, not a replica,
  and averaging shards of different ranks mixes unrelated numbers.
"""

import torch

__all__ = ["check_number", "check_integer", "check_replica", "trainable", "split_fragments"]

_DTYPES = (torch.float32, torch.float64)


def check_number(name, value, low, high=float("inf")):
    """``ValueError`` unless ``value`` is a finite int or float in ``[low, high]``.

    Examples
    --------
    >>> check_number("outer_lr", 0.7, 0.0)
    >>> check_number("outer_lr", -1, 0.0)
    Traceback (most recent call last):
    ...
    ValueError: outer_lr must be a number in [0.0, inf], got -1
    """
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and low <= value <= high and value != float("inf")):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")


def check_integer(name, value, low):
    """``ValueError`` unless ``value`` is an int (not a bool) ``>= low``.

    Examples
    --------
    >>> check_integer("sync_every", 20, 1)
    >>> check_integer("sync_every", True, 1)
    Traceback (most recent call last):
    ...
    ValueError: sync_every must be an int >= 1, got True
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def split_fragments(sizes, fragments):
    """Cut parameters (in order) into ``fragments`` consecutive groups of about equal size.

    Parameters
    ----------
    sizes : sequence of int
        Element counts of the parameters, in order.
    fragments : int
        Number of groups, at most ``len(sizes)``.

    Returns
    -------
    list of list of int
        Indices into ``sizes``: every index exactly once, no group empty.

    Examples
    --------
    >>> split_fragments([10, 10, 10, 10], 2)
    [[0, 1], [2, 3]]
    >>> split_fragments([100, 1, 1, 1], 2)
    [[0], [1, 2, 3]]
    """
    total, groups, done, last = sum(sizes), [[] for _ in range(fragments)], 0, -1
    for i, n in enumerate(sizes):
        # the group of the parameter's midpoint, but no group skipped (none stays empty)
        # and enough parameters left for the groups after this one
        f = (2 * done + n) * fragments // max(2 * total, 1)
        f = max(min(f, last + 1, fragments - 1), last, fragments - (len(sizes) - i), 0)
        groups[f].append(i)
        done, last = done + n, f
    return groups


def _distributed_types():
    """DDP, FSDP (both APIs) and DTensor classes of this torch build (those it has)."""
    if not torch.distributed.is_available():
        return (), ()
    wrappers, tensors = [torch.nn.parallel.DistributedDataParallel], []
    try:
        from torch.distributed import fsdp
        wrappers += [getattr(fsdp, name) for name in ("FullyShardedDataParallel", "FSDPModule")
                     if hasattr(fsdp, name)]
        from torch.distributed.tensor import DTensor
        tensors.append(DTensor)
    except ImportError:  # older torch: what it lacks cannot wrap the model either
        pass
    return tuple(wrappers), tuple(tensors)


def check_replica(model):
    """Refuse a model that is not one whole replica per rank (DDP- or FSDP-wrapped).

    Parameters
    ----------
    model : torch.nn.Module
        What was passed to :class:`ccl.torch.DiLoCo`.

    Raises
    ------
    TypeError
        If ``model`` is not a ``torch.nn.Module``.
    ValueError
        If it is, or contains, a ``DistributedDataParallel`` or FSDP module,
        or has ``DTensor`` parameters.

    Examples
    --------
    >>> check_replica(torch.nn.Linear(2, 2))
    >>> check_replica("model")
    Traceback (most recent call last):
    ...
    TypeError: model must be a torch.nn.Module, got str
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    wrappers, tensors = _distributed_types()
    for module in model.modules():
        if isinstance(module, wrappers):
            raise ValueError(
                f"DiLoCo got a model wrapped in {type(module).__name__}: not supported. DiLoCo "
                "averages over every rank of ccl.torch.init()'s communicator and needs a whole "
                "replica on each rank, synchronised only by DiLoCo; DDP would also average "
                "every step, FSDP shards the parameters. Pass the unwrapped model, one "
                "process per replica (docs/torch.md, 'Slow links').")
    for name, p in model.named_parameters():
        if isinstance(p, tensors):
            raise ValueError(f"parameter {name!r} is a {type(p).__name__} (sharded): DiLoCo "
                             "needs a whole replica on each rank (docs/torch.md, 'Slow links')")


def trainable(model, named_parameters):
    """The ``(name, parameter)`` pairs DiLoCo synchronises: trainable, named once, dense.

    Parameters
    ----------
    model : torch.nn.Module
        The replica.
    named_parameters : iterable of (str, torch.nn.Parameter), dict or None
        None: ``model.named_parameters()``.

    Returns
    -------
    list of (str, torch.nn.Parameter)
        Those with ``requires_grad``, in the given order.

    Raises
    ------
    ValueError
        If a parameter or name repeats, or none is trainable.
    TypeError
        If a parameter is not a dense float32 or float64 tensor.

    Examples
    --------
    >>> [name for name, _ in trainable(torch.nn.Linear(2, 2), None)]
    ['weight', 'bias']
    """
    if named_parameters is None:
        named_parameters = model.named_parameters()
    named = list(named_parameters.items() if isinstance(named_parameters, dict)
                 else named_parameters)
    named = [(n, p) for n, p in named if p.requires_grad]
    if len({id(p) for _, p in named}) != len(named) or len(dict(named)) != len(named):
        raise ValueError("named_parameters must name each parameter once, under unique "
                         "names (pass model.named_parameters())")
    if not named:
        raise ValueError("the model has no trainable parameters to synchronise")
    for name, p in named:
        if p.dtype not in _DTYPES or p.layout != torch.strided:
            raise TypeError(f"parameter {name!r} is a {p.dtype} {p.layout} tensor; "
                            "DiLoCo synchronises dense float32 or float64 parameters")
    return named
