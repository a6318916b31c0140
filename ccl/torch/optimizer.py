"""``DistributedOptimizer``: a Horovod-style wrapper that averages gradients, compressed.

How a step flows
----------------
1. At construction the optimizer's parameters are put in a fixed order and
   cut into buckets (``ccl.torch.buckets``). Every rank checks once (one
   tiny ``Allgather``) that all ranks built the same buckets.
2. A hook per parameter fills its bucket's flat buffer; complete buckets go,
   in bucket order, to one background thread (``ccl.torch.engine``) that
   reduces them through :meth:`ccl.Communicator.allreduce` while backward is
   still running (``ccl.torch.reducer``).
3. :meth:`synchronize` (called by :meth:`step`) starts the buckets that are
   not complete, with zeros for parameters that got no gradient on this rank
   (every rank must take part in every bucket's collective), waits for all
   of them, and writes the averaged gradients back into ``.grad``.

Buckets smaller than ``min_compress_bytes`` go uncompressed through the MPI
library's own ``Allreduce``: below that size latency, not bandwidth, costs.

This module holds what the user sees: :func:`DistributedOptimizer` and the
methods it adds to the wrapped optimizer.
"""

import contextlib
import warnings
import weakref

from ..agreement import agree
from ..collectives.auto import MIN_COMPRESS_BYTES
from .buckets import Plan, plan_buckets  # plan_buckets: re-exported, public here
from .engine import decision_stats
from .reducer import Reducer
from .runtime import current
from .sgd_momentum import LocalMomentum, applies

__all__ = ["DistributedOptimizer", "DEFAULT_FUSION_THRESHOLD_BYTES", "plan_buckets", "wrap"]

#: Default bucket size cap: 64 MiB (Horovod fuses up to 128 MB, DDP 25 MB).
DEFAULT_FUSION_THRESHOLD_BYTES = 64 * 1024 * 1024


class _DistributedMixin:
    """Methods a DistributedOptimizer adds to (or wraps in) the user's optimizer class."""

    def synchronize(self):
        """Finish every bucket's reduction and write the averaged gradients into ``.grad``.

        Buckets not started yet (some of their parameters got no gradient on
        this rank) are started now, with zeros for those parameters, and every
        parameter that got a gradient on some rank then has the average in
        ``.grad``. A parameter that got none on any rank (frozen, or unused
        everywhere) keeps ``.grad`` None, as in PyTorch, so the optimizer
        skips it. Call it before clipping or inspecting
        gradients, then call :meth:`step` inside :meth:`skip_synchronize`.
        Collective: every rank calls it the same number of times.

        Raises
        ------
        ccl.CCLError, ValueError, TypeError
            What a bucket's collective raised (on every rank alike).
        """
        self._ccl.synchronize()
        self._ccl.synced_since_step = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Context in which :meth:`step` does not synchronize (call :meth:`synchronize` first).

        Examples
        --------
        >>> loss.backward()                                          # doctest: +SKIP
        >>> optimizer.synchronize()                                  # doctest: +SKIP
        >>> torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # doctest: +SKIP
        >>> with optimizer.skip_synchronize():                       # doctest: +SKIP
        ...     optimizer.step()
        """
        previous, self._ccl.skip = self._ccl.skip, True
        try:
            yield
        finally:
            self._ccl.skip = previous

    def step(self, closure=None):
        """Synchronize (unless inside :meth:`skip_synchronize`), then take the wrapped step.

        Parameters
        ----------
        closure : None
            Not supported (see Raises).

        Returns
        -------
        object
            What the wrapped optimizer's ``step()`` returns (usually None).

        Raises
        ------
        ValueError
            If a closure is given: gradients a closure computes inside
            ``step()`` could not be averaged first. Call ``loss.backward()``,
            then ``step()``.
        """
        if closure is not None:
            raise ValueError("DistributedOptimizer.step() does not take a closure: compute "
                             "loss.backward() first, then call step()")
        reducer = self._ccl
        if not reducer.skip:
            if reducer.synced_since_step:
                # Horovod's wording, which Horovod programs and tests look for
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(): the gradients are "
                              "reduced a second time; call step() inside "
                              "'with optimizer.skip_synchronize():'", stacklevel=2)
            self.synchronize()
        reducer.synced_since_step = False
        return super().step()

    def zero_grad(self, set_to_none=True):
        """Clear gradients; raises while reductions are pending.

        Parameters
        ----------
        set_to_none : bool
            As in ``torch.optim.Optimizer.zero_grad``.

        Returns
        -------
        None
            As the wrapped ``zero_grad``.

        Raises
        ------
        RuntimeError
            If backward ran since the last :meth:`step` or :meth:`synchronize`.
        """
        if self._ccl.pending:
            raise RuntimeError("optimizer.zero_grad() was called after loss.backward() but "
                               "before optimizer.step() or optimizer.synchronize(): the "
                               "gradients are still being reduced (and other ranks wait for "
                               "this rank's share); call step() or synchronize() first")
        return super().zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        """Add a parameter group, whose parameters are averaged too (collective).

        As ``torch.optim.Optimizer.add_param_group``; every rank adds the
        same group, in the same order. Its trainable parameters get buckets
        of their own after the existing ones, named as in
        ``named_parameters`` if they were there, else by their position in
        ``param_groups``.

        Parameters
        ----------
        param_group : dict
            ``{"params": ..., **hyperparameters}``.

        Raises
        ------
        TypeError, ValueError
            What ``torch.optim.Optimizer.add_param_group`` raises, on the rank
            it raised on; :class:`ccl.MismatchError` on the others, which
            then drop the group (no rank keeps it).
        RuntimeError
            While reductions are pending.
        """
        reducer = self.__dict__.get("_ccl")
        if reducer is None:  # the wrapped class's own __init__ (not wrapped yet)
            super().add_param_group(param_group)
            return
        if reducer.pending:
            raise RuntimeError("optimizer.add_param_group() while gradients are being "
                               "reduced: call step() or synchronize() first")
        groups, error = len(self.param_groups), None
        try:
            super().add_param_group(param_group)
        except (TypeError, ValueError) as exc:
            error = exc
        try:
            reducer.extend(self, error)
        except Exception:
            del self.param_groups[groups:]
            raise

    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict plus this rank's error-feedback state ("ccl").

        The ``"ccl"`` entry holds each bucket's residuals as tensors (so
        ``torch.load(..., weights_only=True)`` reads it). Residuals are per
        rank: to keep them, save every rank's state dict.

        Returns
        -------
        dict
            The optimizer's own entries and ``"ccl"``.

        Raises
        ------
        RuntimeError
            While reductions are pending.
        """
        if self._ccl.pending:
            raise RuntimeError("optimizer.state_dict() while gradients are being reduced: "
                               "call step() or synchronize() first")
        state = super().state_dict()
        state["ccl"] = self._ccl.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict; restores residuals saved by this same rank.

        A state without a ``"ccl"`` entry (e.g. from a plain optimizer) keeps
        the current residuals. Residuals saved by another rank (or at another
        size) are not loaded: they start from zero, with a warning, while the
        steps are kept (loading rank 0's checkpoint on every rank works).

        Parameters
        ----------
        state_dict : dict
            What :meth:`state_dict` returned (or a plain optimizer's state dict).

        Raises
        ------
        ValueError
            If the ``"ccl"`` entry was saved with other buckets or another codec.
        RuntimeError
            While reductions are pending.
        """
        if self._ccl.pending:
            raise RuntimeError("optimizer.load_state_dict() while gradients are being "
                               "reduced: call step() or synchronize() first")
        state_dict = dict(state_dict)
        ccl_state = state_dict.pop("ccl", None)
        if ccl_state is not None:
            ccl_state, own = self._ccl.check_state(ccl_state)
        super().load_state_dict(state_dict)
        if ccl_state is not None:
            self._ccl.load_state_dict(ccl_state, own)

    def communication_stats(self):
        """Counters of this rank: buckets, reductions started, payload bytes sent.

        Returns
        -------
        dict
            ``buckets``, ``compressed_buckets`` (buckets given the codec:
            ``auto`` may still send them plain where compressing does not
            pay), ``bucket_bytes`` (list), ``reductions``, ``bytes_sent``
            (payload bytes this rank put on the wire, ccl's own count), and
            what was sent compressed and plain, what ran and why:
            ``bytes_compressed``, ``bytes_plain``, ``algorithms``,
            ``decisions`` and ``auto`` (``ccl.torch.engine.decision_stats``).
        """
        reducer = self._ccl
        return {"buckets": len(reducer.buckets),
                "compressed_buckets": sum(reducer.plan.compressed),
                "bucket_bytes": [b.flat.numel() * b.flat.element_size()
                                 for b in reducer.buckets],
                "reductions": reducer.engine.reductions,
                "bytes_sent": reducer.engine.communicator.stats()["bytes_sent"],
                **decision_stats(reducer.engine.communicator)}


_CLASSES = {}


def _subclass(base):
    """The dynamic subclass of ``base`` (cached), so isinstance(opt, base) still holds."""
    cls = _CLASSES.get(base)
    if cls is None:
        # same name as the user's class; the module says who made it
        cls = _CLASSES[base] = type(base.__name__, (_DistributedMixin, base),
                                    {"__module__": __name__, "__qualname__": base.__qualname__})
    return cls


def DistributedOptimizer(optimizer, named_parameters=None, codec=None, algorithm="auto",
                         backward_passes_per_step=1, op="mean",
                         fusion_threshold_bytes=DEFAULT_FUSION_THRESHOLD_BYTES,
                         min_compress_bytes=MIN_COMPRESS_BYTES, lr_corrected=False,
                         momentum_correction=True):
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged over all ranks (collective).

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        Any optimizer. The result is an instance of a subclass of its class
        (``isinstance(opt, torch.optim.SGD)`` holds) sharing its parameter
        groups and state; use the result from now on.
    named_parameters : iterable of (str, torch.nn.Parameter), optional
        Usually ``model.named_parameters()``: names every parameter the
        optimizer updates (duplicates and unnamed ones are rejected) and fixes
        their order. Default: names from positions in ``param_groups``.
        Parameters with ``requires_grad=False`` are not reduced.
    codec : Codec, str, dict, PowerSGD or None
        How gradients are compressed (see :func:`ccl.codecs.get_codec`);
        ``None`` sends them uncompressed (the MPI library's ``Allreduce``).
        ``"powersgd"``, ``{"id": "powersgd", "rank": 2, "inner": "thc"}`` or
        a :class:`~ccl.torch.PowerSGD` reduce them with PowerSGD instead
        (low rank, error feedback; its ``P`` and ``Q`` travel with its inner
        codec and ``algorithm``).
    algorithm : {"auto", "ring", "tree", "direct", "allgather"}
        Algorithm of compressed buckets (see :func:`ccl.compressed_allreduce`).
        ``"auto"`` compresses where it pays at the link speed, which it
        measures once unless ``CCL_LINK_GBPS`` gives it.
    backward_passes_per_step : int
        Backward passes accumulated locally (summed in ``.grad``) before one
        reduction; call ``step()`` after every that many passes.
    op : {"mean", "sum"}
        Average (default) or sum the gradients over ranks.
    fusion_threshold_bytes : int
        Bucket size cap, default 64 MiB. Smaller buckets start earlier in
        backward (more overlap) but cost more collectives. With a lossy codec
        (one that keeps error feedback: it scales or selects per chunk), each
        parameter of at least ``min_compress_bytes`` gets a bucket of its own
        and only smaller ones fuse, so no scale spans two layers.
    min_compress_bytes : int
        Buckets smaller than this (default 65536, ``ccl.collectives.auto``'s
        threshold) are sent uncompressed: for them latency, not bandwidth,
        costs. So are buckets under 1/20 of the model's gradient bytes
        (``ccl.torch.buckets.MIN_COMPRESS_SHARE``): they carry little of the
        traffic, and lossy codecs cost them accuracy out of proportion.
        ``min_compress_bytes=0`` compresses every bucket. PowerSGD decides
        per matrix instead (its ``min_compression_rate``).
    lr_corrected : bool
        Learning-rate-corrected error feedback: a bucket's residuals are
        scaled by eta(t-1)/eta(t) when the ``lr`` of its first parameter's
        group changes (see :meth:`ccl.Communicator.set_lr`).
    momentum_correction : bool
        For ``torch.optim.SGD`` with momentum and a codec with error feedback
        (default True): each rank sends the momentum of its own gradients,
        compressed, instead of its gradient, and SGD's momentum buffer
        becomes their average (:mod:`ccl.torch.sgd_momentum`, Deep Gradient
        Compression's momentum correction). The codec's error then no longer
        misses the momentum while it waits in the residual. ``.grad`` still
        holds the averaged gradient that SGD's update implies. No effect with
        other optimizers, exact codecs (``fp16``, ``bf16``) or ``op="sum"``.

    Returns
    -------
    torch.optim.Optimizer
        The wrapped optimizer, with the methods of
        :class:`~ccl.torch.optimizer._DistributedMixin` (``synchronize()``,
        ``skip_synchronize()``, ``communication_stats()``); ``state_dict()``
        carries error-feedback residuals under ``"ccl"``.

    Raises
    ------
    RuntimeError
        If :func:`ccl.torch.init` was not called.
    TypeError, ValueError
        Bad arguments (on the rank that passed them).
    ccl.MismatchError
        On the other ranks, or if ranks' parameters (names, shapes, dtypes,
        order) or options differ.

    Examples
    --------
    >>> import torch, ccl.torch as ct
    >>> ct.init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                               named_parameters=model.named_parameters(), codec="fp16")
    >>> isinstance(opt, torch.optim.SGD)
    True
    """
    return wrap(current(), optimizer, named_parameters, codec, algorithm,
                backward_passes_per_step, op, fusion_threshold_bytes, min_compress_bytes,
                lr_corrected, momentum_correction=momentum_correction)


def wrap(runtime, optimizer, named_parameters, codec, algorithm, backward_passes_per_step, op,
         fusion_threshold_bytes, min_compress_bytes, lr_corrected, groups=None,
         momentum_correction=True):
    """:func:`DistributedOptimizer` over the ranks of ``runtime`` (collective over them).

    ``runtime`` is ``ccl.torch``'s, or a process set's
    (``ccl.torch.process_sets.set_runtime``); ``groups`` maps parameters to
    fusion groups (``Plan``'s ``groups``).
    """
    plan, error = None, None
    try:
        if isinstance(optimizer, _DistributedMixin):
            raise TypeError("optimizer is already a ccl.torch.DistributedOptimizer")
        plan = Plan(optimizer, named_parameters, codec, algorithm, backward_passes_per_step,
                    op, fusion_threshold_bytes, min_compress_bytes, groups)
        if not isinstance(lr_corrected, bool):
            raise TypeError(f"lr_corrected must be True or False, got {lr_corrected!r}")
        if lr_corrected and plan.powersgd is not None:
            raise ValueError("lr_corrected applies to codecs' error feedback; PowerSGD's "
                             "residuals are not lr-corrected: leave lr_corrected False")
        plan.lr_corrected = lr_corrected
        if not isinstance(momentum_correction, bool):
            raise TypeError("momentum_correction must be True or False, got "
                            f"{momentum_correction!r}")
    except (TypeError, ValueError) as exc:
        error = exc
    agree(runtime.comm, "DistributedOptimizer",
          [("arguments", plan.signature() if plan else None), ("lr_corrected", lr_corrected),
           ("momentum_correction", momentum_correction)], error)
    cls = _subclass(type(optimizer))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._ccl = Reducer(runtime, plan)
    wrapped._ccl.optimizer = weakref.ref(wrapped)  # where lr-corrected EF reads the lr
    if momentum_correction and applies(optimizer, plan):
        wrapped._ccl.momentum = LocalMomentum(wrapped._ccl.optimizer)
    return wrapped
