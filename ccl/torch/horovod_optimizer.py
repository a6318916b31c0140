"""``DistributedOptimizer`` with Horovod's signature, on ccl's bucketed optimizer wrapper.

Horovod's arguments map onto :func:`ccl.torch.optimizer.DistributedOptimizer`:
``compression=`` becomes the codec (``Compression.fp16`` is ccl's ``fp16``
codec; ``Compression.codec("3lc")`` any other), ``op=hvd.Average`` /
``hvd.Sum`` become ``"mean"`` / ``"sum"``. ``gradient_predivide_factor``
``f`` splits the averaging as in Horovod: gradients are multiplied by
``1/f`` before the sum and the average by ``f`` after it (which keeps
large gradients from overflowing in the sum). ``groups`` (or the older
``num_groups``) are Horovod's fusion groups: the parameters of a group
share buckets with no other parameter. ``process_set=`` reduces over the
set's members only (``ccl.torch.process_sets.set_runtime``). ccl's own
arguments (``codec``, ``algorithm``, ...) stay available as keywords.
"""

import numbers
import warnings

import torch

from ..agreement import agree
from ..codecs import get_codec
from ..collectives.auto import MIN_COMPRESS_BYTES, fitting
from .adasum_optimizer import with_adasum_step
from .compression import Compression, FP16Compressor, NoneCompressor, resolve_codec
from .horovod_env import fusion_threshold
from .optimizer import DEFAULT_FUSION_THRESHOLD_BYTES
from .optimizer import wrap
from .process_sets import global_process_set, set_runtime
from .runtime import current
from .tensor_ops import OP_NAMES, Adasum, Average, Sum

__all__ = ["DistributedOptimizer"]

_DEFAULT_MIN_COMPRESS = object()


class _HorovodStep:
    """Horovod's ``step(closure)``: the closure's gradients are averaged before the step."""

    def step(self, closure=None):
        """Synchronize and step; with a closure, run it first (its backward is averaged).

        Parameters
        ----------
        closure : callable, optional
            Recomputes the loss and calls ``backward()`` (as for
            ``torch.optim``); called once, before the gradients are averaged.

        Returns
        -------
        object
            The closure's loss, else what the wrapped ``step()`` returns.
        """
        if closure is None:
            return super().step()
        with torch.enable_grad():
            loss = closure()
        super().step()
        return loss

    def zero_grad(self, set_to_none=False):
        """Zero the gradients, keeping them as tensors by default (Horovod's behaviour).

        Horovod gives every trainable parameter a zero gradient when it wraps
        the optimizer, and programs written for it read ``p.grad`` of
        parameters that took no part in a backward pass (a GAN's frozen half):
        so the gradients are zeroed in place unless ``set_to_none=True``.

        Parameters
        ----------
        set_to_none : bool
            As in ``torch.optim.Optimizer.zero_grad`` (default False here).

        Returns
        -------
        None
            As the wrapped ``zero_grad``.
        """
        return super().zero_grad(set_to_none=set_to_none)


_CLASSES = {}


def _with_horovod_step(wrapped):
    base = type(wrapped)
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(base.__name__, (_HorovodStep, base),
                                    {"__module__": base.__module__,
                                     "__qualname__": base.__qualname__})
    wrapped.__class__ = cls
    return wrapped


def _codec_of(compression, codec):
    if codec is not None:
        if compression not in (None, Compression.none):
            raise ValueError("give compression= or codec=, not both")
        return codec
    if compression is FP16Compressor or isinstance(compression, FP16Compressor):
        return get_codec("fp16")
    resolved, compressor = resolve_codec(compression)
    if resolved is not None and resolved.identity:
        return None
    if compressor is not None and compressor is not Compression.none:
        raise TypeError("DistributedOptimizer takes hvd.Compression.none, hvd.Compression.fp16 "
                        "or a ccl codec (hvd.Compression.codec(...)); a custom compressor "
                        f"class ({compression!r}) cannot compress ccl's buckets")
    return resolved


def _op_of(op):
    if op in ("mean", "sum"):
        return op
    if op == Adasum:
        return "adasum"
    if op not in (Average, Sum):
        raise ValueError(f"DistributedOptimizer reduces with hvd.Average or hvd.Sum, got "
                         f"{OP_NAMES.get(op, op)!r}")
    return "mean" if op == Average else "sum"


def _fusion_groups(optimizer, num_groups, groups):
    """Horovod's ``groups`` as ``{parameter: group}`` (None: no groups); raise as Horovod.

    An int ``n`` cuts the trainable parameters, in ``param_groups`` order,
    into ``n`` contiguous groups of sizes differing by at most one; a list of
    lists of parameters gives the groups. A parameter in no group is alone.
    """
    if not isinstance(num_groups, numbers.Integral) or num_groups < 0:
        raise ValueError(f"num_groups must be a non-negative int, got {num_groups!r}")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is None:
        return None
    if isinstance(groups, bool) or not (isinstance(groups, list) or
                                        isinstance(groups, numbers.Integral) and groups > 0):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "torch.Tensor.")
    if not isinstance(groups, list):
        params = [p for group in optimizer.param_groups for p in group["params"]
                  if p.requires_grad]
        size, extra = divmod(len(params), groups)
        starts = [i * size + min(i, extra) for i in range(groups + 1)]
        return {p: g for g in range(groups) for p in params[starts[g]:starts[g + 1]]}
    labels = {}
    for g, group in enumerate(groups):
        if not isinstance(group, (list, tuple)):
            raise ValueError("groups must be a list of lists of torch.Tensor.")
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError("groups must consist of torch.Tensor.")
            if p in labels:
                raise ValueError("A parameter can only appear once in groups.")
            labels[p] = g
    return labels


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, *, codec=None, algorithm=None,
                         fusion_threshold_bytes=None, min_compress_bytes=_DEFAULT_MIN_COMPRESS,
                         lr_corrected=False, momentum_correction=True):
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged over the set (collective).

    Horovod's signature; ccl's options as keywords. See
    :func:`ccl.torch.optimizer.DistributedOptimizer` for how gradients are
    bucketed and reduced.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        Any optimizer; use the returned one from now on.
    named_parameters : iterable of (str, torch.nn.Parameter), optional
        Usually ``model.named_parameters()``.
    compression : optional
        ``hvd.Compression.none`` (default), ``hvd.Compression.fp16``, or a
        ccl codec: ``hvd.Compression.codec("3lc", s=1.5)``, a codec, or its id.
    backward_passes_per_step : int
        Backward passes accumulated locally before one reduction.
    op : int
        ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum`` (Horovod's
        delta optimizer: each rank steps with its own gradients and the
        parameters' changes are combined with Adasum, see
        :mod:`ccl.torch.adasum_optimizer`; ``compression=`` none or fp16,
        ccl's keywords other than ``codec`` have no effect there).
    gradient_predivide_factor : float
        As in Horovod (only with ``op=hvd.Average``): gradients are divided
        by it before the sum and the average multiplied by it after.
    num_groups : int
        Horovod's older ``groups=num_groups`` (deprecated there; warns).
    groups : int or list of list of torch.Tensor, optional
        Fusion groups, as in Horovod: ``n`` cuts the trainable parameters
        (in ``param_groups`` order) into ``n`` contiguous groups; a list
        gives them, and a parameter in none is a group of its own. A
        group's gradients share buckets (cut by dtype and
        ``fusion_threshold_bytes``) with no other parameter's.
    sparse_as_dense : bool
        Turn sparse gradients (``nn.Embedding(sparse=True)``) dense before
        they are reduced, and leave them dense. Without it a sparse gradient
        is averaged (densely, in its bucket) and handed back sparse, its
        dense value the exact average, as Horovod's allgathered result.
    process_set : ProcessSet
        The ranks whose gradients are averaged (default: every rank); only
        its members call this, and ``step()`` is collective over them.
    codec, algorithm, fusion_threshold_bytes, min_compress_bytes, lr_corrected, momentum_correction
        ccl's options (``codec`` instead of ``compression``);
        ``fusion_threshold_bytes`` defaults to ``HOROVOD_FUSION_THRESHOLD``
        when that is set, else ``DEFAULT_FUSION_THRESHOLD_BYTES``. A codec from
        ``compression=`` compresses every bucket, as Horovod compresses every
        tensor: by default ``min_compress_bytes=0`` and the algorithm that
        fits the codec (``ccl.collectives.auto.fitting``); a ``codec=``
        keeps ccl's defaults (``algorithm="auto"`` compresses where it pays).

    Returns
    -------
    torch.optim.Optimizer
        The wrapped optimizer (``synchronize()``, ``skip_synchronize()``,
        ``step(closure)``).

    Raises
    ------
    TypeError, ValueError, NotImplementedError
        Bad arguments (on the rank that passed them; the others raise
        :class:`ccl.MismatchError`).
        ``ValueError`` on a rank outside ``process_set`` too (alone: the
        members do not wait for it).

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                                named_parameters=model.named_parameters(),
    ...                                compression=hvd.Compression.fp16)
    >>> isinstance(opt, torch.optim.SGD)
    True
    """
    error, resolved, reduce_op, labels = None, None, "mean", None
    # a rank outside the set raises here, alone: the members do not wait for it
    runtime = current() if process_set is None or process_set is global_process_set \
        else set_runtime(process_set)
    try:
        resolved = _codec_of(compression, codec)
        reduce_op = _op_of(op)
        if reduce_op == "adasum" and (codec is not None or not (
                compression in (None, Compression.none, Compression.fp16)
                or isinstance(compression, (NoneCompressor, FP16Compressor)))):
            raise ValueError("op=hvd.Adasum takes hvd.Compression.none or hvd.Compression.fp16, "
                             "not a ccl codec")
        if reduce_op == "adasum" and runtime is not current():
            raise ValueError("op=hvd.Adasum runs on the global process set only")
        if not isinstance(gradient_predivide_factor, numbers.Real) or \
                gradient_predivide_factor <= 0:
            raise ValueError("gradient_predivide_factor must be a positive number")
        if gradient_predivide_factor != 1.0 and reduce_op != "mean":
            raise ValueError("gradient_predivide_factor needs op=hvd.Average")
        labels = _fusion_groups(optimizer, num_groups, groups)
        if not isinstance(sparse_as_dense, bool):
            raise TypeError("sparse_as_dense must be True or False")
        if fusion_threshold_bytes is None:
            fusion_threshold_bytes = fusion_threshold(default=DEFAULT_FUSION_THRESHOLD_BYTES)
    except (TypeError, ValueError, NotImplementedError) as exc:
        error = exc
    agree(runtime.comm, "DistributedOptimizer", [("Horovod arguments", (
        reduce_op, float(gradient_predivide_factor) if error is None else None))], error)
    if reduce_op == "adasum":  # Horovod's delta optimizer: no buckets, no averaging
        return with_adasum_step(optimizer, compression or Compression.none)
    min_compress = MIN_COMPRESS_BYTES
    if min_compress_bytes is not _DEFAULT_MIN_COMPRESS:
        min_compress = min_compress_bytes
    elif codec is None and resolved is not None:
        min_compress = 0
    sparse_hooks = _densify_hooks(optimizer) if sparse_as_dense is True else []
    if algorithm is None:
        # compression= is Horovod's: every tensor is compressed, on the algorithm that fits
        # the codec; codec= is ccl's: "auto" compresses where it pays at the link speed
        algorithm = fitting(resolved) if resolved is not None and codec is None else "auto"
    wrapped = wrap(runtime, optimizer, named_parameters, resolved, algorithm,
                   backward_passes_per_step, reduce_op, fusion_threshold_bytes,
                   min_compress, lr_corrected, labels, momentum_correction)
    wrapped._ccl_sparse_hooks = sparse_hooks
    if gradient_predivide_factor != 1.0:  # Horovod: divide by f before the sum, f/size after
        wrapped._ccl.prescale = 1.0 / gradient_predivide_factor
        wrapped._ccl.postscale = float(gradient_predivide_factor)
    with torch.no_grad():  # Horovod's zero gradients for every trainable parameter
        for group in wrapped.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    return _with_horovod_step(wrapped)


def _densify_hooks(optimizer):
    """Hooks that turn sparse gradients dense (``sparse_as_dense=True``).

    Registered before the optimizer wrapper's own hooks, so they run first:
    the wrapper then copies a dense gradient into its bucket.
    """
    def densify(param):
        if param.grad is not None and param.grad.is_sparse:
            param.grad = param.grad.to_dense()

    return [p.register_post_accumulate_grad_hook(densify)
            for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
