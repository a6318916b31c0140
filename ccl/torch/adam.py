"""``CompressedAdam``: Adam that averages its momentum compressed, with the variance frozen.

Why not ``DistributedOptimizer(AdamW, codec=...)``
---------------------------------------------------
Error feedback makes a compressed *sum* of gradients unbiased over steps,
but Adam's second moment squares each step's gradient: the compression
noise lands in the variance, which then shrinks the steps of every
coordinate the codec made noisy. 1-bit Adam (DeepSpeed) and BytePS-Compress
avoid that by splitting training in two phases:

1. **Warm-up** (``warmup_steps``): exact AdamW on gradients averaged
   uncompressed (the MPI library's ``Allreduce``). The variance settles.
2. **Compressed phase**: the variance is frozen. Each rank folds its *local*
   gradient into the momentum, ``m = beta1 m + (1 - beta1) g``, and sends
   ``m / d`` (``d`` below), averaged by a keyed
   :meth:`ccl.Communicator.allreduce` with error feedback at every lossy
   point (the worker and the chunk's owner for ``direct`` and ``ring``:
   two-way, as in 1-bit Adam). The average times ``d`` replaces every
   rank's momentum; ccl's results are bitwise identical on every rank, so
   the replicas stay identical.

The update of both phases is AdamW's, with decoupled weight decay::

    p <- p (1 - lr wd) - lr / (1 - beta1^t) * m / d,   d = sqrt(v / (1 - beta2^s)) + eps

where ``t`` is the step and ``s = min(t, warmup_steps)``: the bias
correction of the frozen variance stays the one of the step it was frozen
at. ``d`` is the same on every rank, so averaging ``m / d`` is averaging
``m``, but a codec's error (of the order of a chunk's scale) becomes one of
the steps' scale: compressing ``m``, coordinates with a tiny frozen
variance (a pixel almost always 0, a ReLU unit dead in the warm-up) took
steps of ``lr * scale / d`` and a ReLU MLP diverged. As a frozen variance
stops tracking, the step also keeps exact Adam's bound
(:func:`~ccl.torch.momentum.step_bound`, for any gradients): each rank's
``m / d`` is limited to ``B_t (1 - beta1^t)`` before it is sent and the
mean after decoding, in effect raising the frozen variance to the least
exact Adam could have with that momentum. Where the frozen variance is
zero (no gradient in the whole warm-up, e.g. embedding rows of tokens not
seen yet) ranks send zero and the momentum stays zero.
Parameters smaller than ``min_compress_bytes`` are averaged uncompressed
in both phases (fused into one ``Allreduce`` per dtype). The compressed
momenta are fused too, as 1-bit Adam does, into buckets of consecutive
parameters of one group and dtype of at most ``fusion_threshold_bytes``,
one keyed allreduce each: fewer collectives, at the price of codec scales
shared by neighbouring layers (error feedback makes up the difference).

The reductions overlap backward (``ccl.torch.momentum``): a gradient hook
folds each parameter's final gradient into its local momentum and starts its
bucket's allreduce in the background once the bucket is complete.
"""

import warnings
import zlib
from typing import Any, Callable, Iterable

import numpy as np
import torch

from ..agreement import agree
from ..codecs import get_codec
from ..collectives import ALGORITHM_NAMES
from ..collectives.auto import MIN_COMPRESS_BYTES
from .buckets import named_params
from . import checkpoint
from .momentum import MomentumReducer, check_adam_group, preconditioner, step_bound
from .stepcontrol import StepControl
from .runtime import current

__all__ = ["CompressedAdam"]

_OWNER = "CompressedAdam"  # of its checkpoint entry
_DTYPES = (torch.float32, torch.float64)


def _deprecated(name):
    """``name``, the public name of a callback that is private (``_name``) now."""
    def alias(self, *args):
        warnings.warn(f"CompressedAdam.{name}() is deprecated: it is the reducer's callback, "
                      f"private now (_{name})", DeprecationWarning, stacklevel=2)
        return getattr(self, "_" + name)(*args)

    alias.__name__ = name
    alias.__doc__ = f"""Deprecated: the reducer's callback, private now (``_{name}``).

        Parameters
        ----------
        *args
            As for ``_{name}``.

        Returns
        -------
        object
            What ``_{name}`` returns.
        """
    return alias


class CompressedAdam(StepControl, torch.optim.Optimizer):
    """AdamW that averages its momentum compressed after a warm-up, variance frozen (collective).

    A 1-bit-Adam-style optimizer: it communicates by itself (do not wrap it in
    :func:`~ccl.torch.DistributedOptimizer`). It averages over all ranks:
    during the first ``warmup_steps`` steps the gradients, uncompressed
    (exact AdamW); then the momenta divided by the frozen denominator (the
    steps' own scale, limited to exact Adam's bound), compressed with
    ``codec`` and error feedback, while the variance stays frozen. As in
    ``DistributedOptimizer``, a bucket's reduction starts during backward,
    in a background thread, as soon as its gradients are final;
    :meth:`step` waits for them. See the module docstring
    (:mod:`ccl.torch.adam`) for the update.

    Parameters
    ----------
    params : iterable of tensors or dicts
        Parameters or parameter groups, as for ``torch.optim.AdamW``; float32
        or float64, dense. Groups may set their own ``lr``, ``betas``,
        ``eps`` and ``weight_decay``.
    lr : float
        Learning rate, >= 0.
    betas : tuple of float
        Decay rates of the momentum and the variance, each in [0, 1).
    eps : float
        Added to the denominator, >= 0.
    weight_decay : float
        Decoupled weight decay (AdamW's), >= 0.
    named_parameters : iterable of (str, torch.nn.Parameter), optional
        Usually ``model.named_parameters()``: names key each parameter's
        error-feedback residuals. Default: names from positions in the groups.
    codec : Codec, str, dict or None
        How momenta are compressed after the warm-up (default ``"onebit"``);
        every codec works (``None``: uncompressed).
    algorithm : str
        Algorithm of the compressed allreduces (see
        :func:`ccl.compressed_allreduce`). ``"direct"`` and ``"ring"`` keep
        residuals at the workers and at the owners (two-way). ``"auto"``
        with every rank on one node sends float32 momenta uncompressed with
        ``MPI_Allreduce`` (exact, nothing timed: see
        :mod:`ccl.collectives.link`); name an algorithm to compress there.
    warmup_steps : int
        Exact AdamW steps before the variance is frozen, >= 1. 1-bit Adam
        recommends 15-25% of the training steps. A short warm-up does not
        diverge (the steps keep exact Adam's bound) but freezes a rougher
        variance.
    lr_corrected : bool
        Learning-rate-corrected error feedback: residuals are scaled by
        eta(t-1)/eta(t) when a group's ``lr`` changes (see
        :meth:`ccl.Communicator.set_lr`).
    min_compress_bytes : int
        Parameters smaller than this are averaged uncompressed (default
        65536): their payload is latency, not bandwidth.
    fusion_threshold_bytes : int
        Compressed momenta are reduced in buckets of at most this many
        bytes (default 64 MiB; 0: one allreduce per parameter).
    backward_passes_per_step : int
        Backward passes whose gradients accumulate locally before each
        :meth:`step` (gradient accumulation), >= 1. A bucket's reduction
        starts inside the last of them, once its gradients are final.
    grad_scaler : torch.amp.GradScaler, optional
        The scaler of mixed-precision training (``scaler.scale(loss).backward()``,
        ``scaler.step(optimizer)``, ``scaler.update()``): gradients are divided
        by its scale before they are folded in, and a step whose gradients
        hold NaN or Inf on any rank is dropped on every rank (each rank's
        scaler then lowers its scale alike). ``GradScaler("cpu")`` works.

    Raises
    ------
    RuntimeError
        If :func:`ccl.torch.init` was not called.
    TypeError, ValueError
        Bad arguments (on the rank that passed them).
    ccl.MismatchError
        On the other ranks, or if ranks' parameters or options differ.

    Notes
    -----
    Every rank must call :meth:`step` (or
    :meth:`~ccl.torch.stepcontrol.StepControl.skip_step`) as often as the
    others (:class:`ccl.MismatchError` names the ranks that do not). A
    parameter without a gradient contributes zeros; one without a gradient
    on every rank (frozen) is skipped, as in ``torch.optim.AdamW``.
    Changing gradients between ``backward()`` and :meth:`step` (clipping,
    ``unscale_``) raises ``RuntimeError`` (see :mod:`ccl.torch.stepcontrol`).
    :meth:`state_dict` holds the moments, the step and this rank's
    residuals (:mod:`ccl.torch.checkpoint`). Call
    :meth:`state_dict` and :meth:`load_state_dict` between steps, not
    between ``backward()`` and :meth:`step` (the momenta are being
    reduced then: both raise ``RuntimeError``). The parameters are fixed
    at construction: ``add_param_group`` afterwards raises.

    Examples
    --------
    >>> import torch, ccl.torch as ct
    >>> ct.init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = ct.CompressedAdam(model.parameters(), lr=1e-3, warmup_steps=10,
    ...                         named_parameters=model.named_parameters(), codec="onebit")
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> opt.step()
    >>> opt.communication_stats()["step"]
    1
    """

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *,
                 named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                 codec: Any = "onebit", algorithm: str = "auto", warmup_steps: int = 100,
                 lr_corrected: bool = False, min_compress_bytes: int = MIN_COMPRESS_BYTES,
                 fusion_threshold_bytes: int = 64 * 1024 * 1024,
                 backward_passes_per_step: int = 1, grad_scaler: Any = None) -> None:
        runtime = current()
        error, signature = None, None
        try:
            defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
            check_adam_group(defaults)
            super().__init__(params, defaults)
            signature = self._plan(named_parameters, codec, algorithm, warmup_steps,
                                   lr_corrected, min_compress_bytes, fusion_threshold_bytes,
                                   backward_passes_per_step)
            signature = (signature, self.check_scaler(grad_scaler))
        except (TypeError, ValueError) as exc:
            error = exc
        agree(runtime.comm, "CompressedAdam", [("arguments", signature)], error)
        self.rank, self.size = runtime.rank, runtime.size
        self.steps, self._groups = 0, None
        self.grad_scaler, self.skipped_steps = grad_scaler, 0
        self.reset_taken()
        self.reducer = MomentumReducer(self, runtime, self.buckets,
                                       [self.names[b[0]] for b in self.buckets],
                                       backward_passes_per_step, self.codec, algorithm,
                                       lr_corrected)
        self.communicator = self.reducer.engine.communicator

    def _plan(self, named_parameters, codec, algorithm, warmup_steps, lr_corrected,
              min_compress_bytes, fusion_threshold_bytes, passes):
        """Validate the options and fix the parameters' order; return the signature."""
        for group in self.param_groups:
            check_adam_group(group)
        if algorithm not in ALGORITHM_NAMES:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHM_NAMES)}; "
                             f"got {algorithm!r}")
        for name, value, low in (("warmup_steps", warmup_steps, 1),
                                 ("min_compress_bytes", min_compress_bytes, 0),
                                 ("fusion_threshold_bytes", fusion_threshold_bytes, 0),
                                 ("backward_passes_per_step", passes, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(lr_corrected, bool):
            raise TypeError(f"lr_corrected must be True or False, got {lr_corrected!r}")
        self.codec = get_codec(codec)
        self.warmup_steps, self.min_compress = warmup_steps, min_compress_bytes
        self.lr_corrected = lr_corrected
        named = named_params(self, named_parameters)  # the same order on every rank
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.compressed = []
        for name, p in zip(self.names, self.params):
            if p.dtype not in _DTYPES or p.layout != torch.strided:
                raise TypeError(f"parameter {name!r} is a {p.dtype} {p.layout} tensor; "
                                "CompressedAdam trains dense float32 or float64 parameters")
            big = p.numel() * p.element_size() >= min_compress_bytes
            np_dtype = np.dtype(str(p.dtype).replace("torch.", ""))
            if big and not self.codec.identity and np_dtype not in self.codec.input_dtypes:
                raise TypeError(f"codec {self.codec.codec_id!r} does not take {np_dtype} "
                                f"(parameter {name!r}): use float32 parameters or another "
                                "codec")
            self.compressed.append(big and not self.codec.identity)
        self.buckets = self._fuse(fusion_threshold_bytes)
        layout = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self.names, self.params)]
        self.layout_hash = zlib.crc32(repr((layout, self.buckets)).encode("utf-8"))
        groups = [(repr(g["lr"]), tuple(g["betas"]), g["eps"], g["weight_decay"])
                  for g in self.param_groups]
        return (layout, groups, self.codec.get_config(), algorithm, warmup_steps,
                lr_corrected, min_compress_bytes, self.buckets, passes)

    def _fuse(self, threshold):
        """Buckets of compressed parameters: consecutive, one group and dtype, <= threshold."""
        group_index = {p: g for g, group in enumerate(self.param_groups)
                       for p in group["params"]}
        buckets, kind, nbytes = [], None, 0
        for i, p in enumerate(self.params):
            if not self.compressed[i]:
                continue
            size = p.numel() * p.element_size()
            if not buckets or kind != (group_index[p], p.dtype) or nbytes + size > threshold:
                buckets.append([])
                kind, nbytes = (group_index[p], p.dtype), 0
            buckets[-1].append(i)
            nbytes += size
        return buckets

    # ----------------------------------------------------------------- the step
    fold, group_of, lr_of, in_warmup = (_deprecated(name) for name in
                                        ("fold", "group_of", "lr_of", "in_warmup"))

    def _in_warmup(self):
        """Whether the coming step is a warm-up step (exact AdamW).

        Returns
        -------
        bool
        """
        return self.steps < self.warmup_steps

    def _group_of(self, p):
        """The parameter group of ``p`` (looked up again after ``load_state_dict``).

        Parameters
        ----------
        p : torch.Tensor
            One of the optimizer's parameters.

        Returns
        -------
        dict
        """
        if self._groups is None:
            self._groups = {q: group for group in self.param_groups for q in group["params"]}
        return self._groups[p]

    def _lr_of(self, p):
        """The lr of ``p``'s group for lr-corrected error feedback.

        Parameters
        ----------
        p : torch.Tensor
            One of the optimizer's parameters.

        Returns
        -------
        float or None
            None when the error feedback is not lr-corrected (or the rate is
            not finite).
        """
        lr = float(self._group_of(p)["lr"])
        return lr if self.lr_corrected and 0 <= lr < float("inf") else None

    def _fold(self, p):
        """What ``p`` sends this step: its gradient (warm-up) or its updated local momentum.

        Called once per step and parameter, by the gradient hook or by
        :meth:`step` (a parameter without a gradient counts as zeros).

        Parameters
        ----------
        p : torch.Tensor
            One of the optimizer's parameters, its gradient final for the step.

        Returns
        -------
        torch.Tensor
            The gradient, or the momentum ``m = beta1 m + (1 - beta1) g``
            updated in place.
        """
        state = self.state[p]
        if not state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        grad = torch.zeros_like(p) if p.grad is None else p.grad
        if grad.is_sparse:  # densified rather than refused: raising here on one rank
            grad = grad.to_dense()  # would leave the others in the allreduce
        grad = self.take_gradient(p, grad)
        if self._in_warmup():
            return grad
        group, t = self._group_of(p), self.steps + 1
        (beta1, beta2), v = group["betas"], state["exp_avg_sq"]
        # not in place: a dropped step must leave the momentum as it was (the same on
        # every rank); step() replaces it with the average
        m = torch.lerp(state["exp_avg"], grad, 1 - beta1)
        # sent: the step's own scale m / d, within exact Adam's bound (module docstring)
        limit = step_bound(beta1, beta2, t) * (1 - beta1 ** t)
        d = preconditioner(v, beta2, self.warmup_steps, group["eps"])
        return torch.div(m, d, out=d).clamp_(-limit, limit)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Average over all ranks and update the parameters (collective).

        The reductions of buckets whose gradients are complete started during
        backward; this starts the others, waits for all and updates.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss (run with gradients
            enabled, before any communication).

        Returns
        -------
        object
            What ``closure`` returned, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        warm = self._in_warmup()
        if not self._finish(skip=False):
            return loss
        t, frozen = self.steps, min(self.steps, self.warmup_steps)
        for i, mean in self._means:
            if not self._anywhere[i]:  # frozen: no gradient on any rank (AdamW skips it)
                continue
            p = self.params[i]
            group, state = self._group_of(p), self.state[p]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            lr, (beta1, beta2) = group["lr"], group["betas"]
            if warm:  # exact AdamW on the averaged gradient
                m.lerp_(mean, 1 - beta1)
                v.mul_(beta2).addcmul_(mean, mean, value=1 - beta2)
            else:  # the mean of m / d (see fold) within exact Adam's bound, 0 where v is 0
                limit = step_bound(beta1, beta2, t) * (1 - beta1 ** t)
                mean.masked_fill_(v == 0, 0).clamp_(-limit, limit)
                d = preconditioner(v, beta2, frozen, group["eps"])
                m.copy_(mean).mul_(d).masked_fill_(v == 0, 0)
            # AdamW's order of operations (torch's single-tensor path)
            p.mul_(1 - lr * group["weight_decay"])
            denom = (v.sqrt() / (1 - beta2 ** frozen) ** 0.5).add_(group["eps"])
            p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** t))
        self._means = None
        return loss

    def add_param_group(self, param_group: dict) -> None:
        """Refused after construction: the buckets and their keys are fixed then.

        Parameters
        ----------
        param_group : dict
            As ``torch.optim.Optimizer.add_param_group``.

        Raises
        ------
        RuntimeError
            Always, once the optimizer is built (make a new ``CompressedAdam``).
        """
        if hasattr(self, "reducer"):
            raise RuntimeError("CompressedAdam fixes its parameters at construction: build "
                               "it with every parameter group instead of adding one")
        super().add_param_group(param_group)

    # -------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """The moments, the frozen variance, the step and this rank's residuals ("ccl").

        Returns
        -------
        dict
            ``torch.optim.Optimizer.state_dict()`` (``exp_avg``,
            ``exp_avg_sq`` per parameter) plus ``"ccl"``, the entry of
            :mod:`ccl.torch.checkpoint` (step, rank, size, a hash of the
            parameters and buckets, this rank's residuals as tensors, so that
            ``torch.load(..., weights_only=True)`` reads it).

        Raises
        ------
        RuntimeError
            Between ``backward()`` and :meth:`step`: the step is half done.
        """
        self.check_between_steps("state_dict")
        state = super().state_dict()
        state["ccl"] = checkpoint.save(_OWNER, rank=self.rank, size=self.size,
                                       layout=self.layout_hash, steps=self.steps,
                                       communicators=[self.communicator.state_dict()])
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict`; continues bit-identically on the rank that saved it.

        The moments (the same on every rank) and the steps load at any rank
        and world size; residuals saved by another rank or at another size
        start from zero, with one warning (:mod:`ccl.torch.checkpoint`).

        Parameters
        ----------
        state_dict : dict
            What :meth:`state_dict` returned.

        Raises
        ------
        ValueError
            If the state has no valid ``"ccl"`` entry or was saved with
            other parameters or another codec.
        """
        self.check_between_steps("load_state_dict")
        state_dict = dict(state_dict)
        entry = checkpoint.checked(
            state_dict.pop("ccl", None), _OWNER, layout=self.layout_hash,
            layout_error="the state was saved by a CompressedAdam over other parameters "
                         "(names, shapes or dtypes differ)",
            codecs=[self.codec.get_config()])
        own = checkpoint.owns(entry, self.rank, self.size)
        super().load_state_dict(state_dict)
        self._groups = None  # torch made new group dicts
        self.steps = self.reducer.engine.steps = int(entry["steps"])
        checkpoint.restore(self.communicator, entry["communicators"][0], own)
