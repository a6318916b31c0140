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
   gradient into the momentum, ``m = beta1 m + (1 - beta1) g``, and the
   momenta are averaged by a keyed :meth:`ccl.Communicator.allreduce`, with
   error feedback at every lossy point of the algorithm (the worker and the
   chunk's owner for ``direct`` and ``ring``: two-way, as in 1-bit Adam).
   The averaged momentum replaces every rank's momentum. ccl's results are
   bitwise identical on every rank, so the replicas stay identical.

The update of both phases is AdamW's, with decoupled weight decay::

    p <- p (1 - lr wd) - lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^s)) + eps)

where ``t`` is the step and ``s = min(t, warmup_steps)``: the bias
correction of the frozen variance stays the one of the step it was frozen
at. Coordinates whose frozen variance is zero (they got no gradient in the
whole warm-up, e.g. embedding rows of tokens not seen yet) keep a zero
momentum: without a variance estimate their step would be ``m / eps``.
Parameters smaller than ``min_compress_bytes`` are averaged uncompressed
in both phases (fused into one ``Allreduce`` per dtype). The compressed
momenta are fused too, as 1-bit Adam does, into buckets of consecutive
parameters of one group and dtype of at most ``fusion_threshold_bytes``,
one keyed allreduce each: fewer collectives, at the price of codec scales
shared by neighbouring layers (error feedback makes up the difference).
"""

import warnings
import zlib

import numpy as np
import torch

from ..agreement import agree
from ..api import Communicator
from ..codecs import get_codec
from ..collectives import ALGORITHM_NAMES
from ..collectives.auto import MIN_COMPRESS_BYTES
from .functions import from_array, to_array
from .runtime import current

__all__ = ["CompressedAdam"]

_STATE_VERSION = 1
_DTYPES = (torch.float32, torch.float64)


def _check_number(name, value, low, high=float("inf"), high_open=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value \
        and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"{name} must be a number in [{low}, {high}{')' if high_open else ']'}, "
                         f"got {value!r}")


def _check_group(group):
    """Validate one parameter group's hyperparameters (ValueError says what is accepted)."""
    _check_number("lr", group["lr"], 0.0)
    betas = group["betas"]
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    _check_number("betas[0]", betas[0], 0.0, 1.0, high_open=True)
    _check_number("betas[1]", betas[1], 0.0, 1.0, high_open=True)
    _check_number("eps", group["eps"], 0.0)
    _check_number("weight_decay", group["weight_decay"], 0.0)


def _names(param_groups, named_parameters):
    """``{param: name}`` of the trainable parameters; names fix keys and order."""
    trainable = [p for group in param_groups for p in group["params"] if p.requires_grad]
    if named_parameters is None:
        return {p: f"group{g}.param{i}" for g, group in enumerate(param_groups)
                for i, p in enumerate(group["params"]) if p.requires_grad}
    names, taken = {}, set()
    for item in named_parameters:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise ValueError("named_parameters should hold (name, parameter) pairs, usually "
                             f"model.named_parameters(); got a {type(item).__name__}")
        name, p = item
        if name in taken or p in names:
            raise ValueError(f"named_parameters names {name!r} twice, or names one "
                             "parameter twice: pass model.named_parameters()")
        taken.add(name)
        names[p] = name
    missing = [tuple(p.shape) for p in trainable if p not in names]
    if missing:
        raise ValueError(f"{len(missing)} parameter(s) (shapes {missing[:5]}) are not in "
                         "named_parameters: pass the named parameters of the whole model, "
                         "or leave named_parameters out")
    return {p: names[p] for p in trainable}


def _convert(obj, kind, fn):
    """Apply ``fn`` to every ``kind`` leaf of nested dicts, lists and tuples."""
    if isinstance(obj, kind):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _convert(v, kind, fn) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_convert(v, kind, fn) for v in obj)
    return obj


class CompressedAdam(torch.optim.Optimizer):
    """AdamW that averages its momentum compressed after a warm-up, variance frozen (collective).

    A 1-bit-Adam-style optimizer: it communicates by itself (do not wrap it in
    :func:`~ccl.torch.DistributedOptimizer`). :meth:`step` averages over all
    ranks: during the first ``warmup_steps`` steps the gradients,
    uncompressed (exact AdamW); then the momenta, compressed with ``codec``
    and error feedback, while the variance stays frozen. See the module
    docstring (:mod:`ccl.torch.adam`) for the update.

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
        residuals at the workers and at the owners (two-way). ``"auto"`` on
        one node of several ranks runs ``hierarchical``, which is exact inside
        a node.
    warmup_steps : int
        Exact AdamW steps before the variance is frozen, >= 1. 1-bit Adam
        recommends 15-25% of the training steps. Too short a warm-up leaves
        a rough variance: coordinates with a tiny one then take huge steps
        once the codec gives their momentum its chunk's scale (one warm-up
        step diverged on the benchmark's model).
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
    Every rank must call :meth:`step` the same number of times. A parameter
    without a gradient on a rank contributes zeros there (unlike
    ``torch.optim.AdamW``, which skips it): all ranks take part in every
    allreduce. :meth:`state_dict` holds the moments, the step and this
    rank's residuals; loading it at another world size raises.

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

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 named_parameters=None, codec="onebit", algorithm="auto", warmup_steps=100,
                 lr_corrected=False, min_compress_bytes=MIN_COMPRESS_BYTES,
                 fusion_threshold_bytes=64 * 1024 * 1024):
        runtime = current()
        error, signature = None, None
        try:
            defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
            _check_group(defaults)
            super().__init__(params, defaults)
            signature = self._plan(named_parameters, codec, algorithm, warmup_steps,
                                   lr_corrected, min_compress_bytes, fusion_threshold_bytes)
        except (TypeError, ValueError) as exc:
            error = exc
        agree(runtime.comm, "CompressedAdam", [("arguments", signature)], error)
        self.rank, self.size = runtime.rank, runtime.size
        self.communicator = Communicator(runtime.comm, self.codec, algorithm, op="mean",
                                         min_compress_bytes=0, lr_corrected=lr_corrected)
        self.steps = self.reductions = 0

    def _plan(self, named_parameters, codec, algorithm, warmup_steps, lr_corrected,
              min_compress_bytes, fusion_threshold_bytes):
        """Validate the options and fix the parameters' order; return the signature."""
        for group in self.param_groups:
            _check_group(group)
        if algorithm not in ALGORITHM_NAMES:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHM_NAMES)}; "
                             f"got {algorithm!r}")
        for name, value, low in (("warmup_steps", warmup_steps, 1),
                                 ("min_compress_bytes", min_compress_bytes, 0),
                                 ("fusion_threshold_bytes", fusion_threshold_bytes, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(lr_corrected, bool):
            raise TypeError(f"lr_corrected must be True or False, got {lr_corrected!r}")
        self.codec = get_codec(codec)
        self.warmup_steps, self.min_compress = warmup_steps, min_compress_bytes
        names = _names(self.param_groups, named_parameters)
        self.params = list(names)  # registration order: the same on every rank
        self.names = [names[p] for p in self.params]
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
                lr_corrected, min_compress_bytes, self.buckets)

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
    def _exact_mean(self, tensors):
        """Average ``tensors`` over the ranks in place, uncompressed, one Allreduce per dtype."""
        for dtype in _DTYPES:
            group = [t for t in tensors if t.dtype == dtype]
            if group:
                self._average(group, codec="none", algorithm="mpi")

    def _average(self, tensors, **call):
        """Replace ``tensors`` (one dtype) by their mean over the ranks: one allreduce."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        mean = from_array(self.communicator.allreduce(to_array(flat), **call), like=flat)
        offset = 0
        for t in tensors:
            t.copy_(mean[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        self.reductions += 1

    def _moments(self):
        """Each parameter's (gradient, momentum, variance), state created on first use."""
        out = []
        for p in self.params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grad = torch.zeros_like(p) if p.grad is None else p.grad
            if grad.is_sparse:  # densified rather than refused: raising here on one rank
                grad = grad.to_dense()  # would leave the others in the allreduce
            out.append((grad, state["exp_avg"], state["exp_avg_sq"]))
        return out

    @torch.no_grad()
    def step(self, closure=None):
        """Average over all ranks and update the parameters (collective).

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
        moments = self._moments()
        self.steps += 1
        t = self.steps
        # looked up every step: load_state_dict() replaces the group dicts
        group_of = {p: group for group in self.param_groups for p in group["params"]}
        warm = t <= self.warmup_steps
        if warm:
            grads = [g.clone() for g, _, _ in moments]
            self._exact_mean(grads)
            for (_, m, v), g, p in zip(moments, grads, self.params):
                beta1, beta2 = group_of[p]["betas"]
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        else:
            for (g, m, _), p in zip(moments, self.params):
                m.lerp_(g, 1 - group_of[p]["betas"][0])  # the local momentum
            for bucket in self.buckets:
                self.communicator.set_lr(float(group_of[self.params[bucket[0]]]["lr"]))
                self._average([moments[i][1] for i in bucket], key=self.names[bucket[0]])
            self._exact_mean([m for (_, m, _), c in zip(moments, self.compressed) if not c])
            for _, m, v in moments:
                # No variance estimate (no gradient in the whole warm-up): m / eps would be
                # a huge step, and a codec's scale makes such coordinates' momenta nonzero.
                m.masked_fill_(v == 0, 0)
        frozen = min(t, self.warmup_steps)
        for (_, m, v), p in zip(moments, self.params):
            group = group_of[p]
            lr, (beta1, beta2) = group["lr"], group["betas"]
            # AdamW's order of operations (torch's single-tensor path)
            p.mul_(1 - lr * group["weight_decay"])
            denom = (v.sqrt() / (1 - beta2 ** frozen) ** 0.5).add_(group["eps"])
            p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** t))
        return loss

    # -------------------------------------------------------------------- state
    def state_dict(self):
        """The moments, the frozen variance, the step and this rank's residuals ("ccl").

        Returns
        -------
        dict
            ``torch.optim.Optimizer.state_dict()`` (``exp_avg``,
            ``exp_avg_sq`` per parameter) plus ``"ccl"``: the step, rank,
            size and the communicator's residuals as tensors (so
            ``torch.load(..., weights_only=True)`` reads it). Residuals are
            per rank: save every rank's state dict.
        """
        state = super().state_dict()
        comm_state = _convert(self.communicator.state_dict(), np.ndarray,
                              lambda a: torch.from_numpy(np.array(a, copy=True)))
        state["ccl"] = {"version": _STATE_VERSION, "step": self.steps, "rank": self.rank,
                        "size": self.size, "params": self.layout_hash,
                        "communicator": comm_state}
        return state

    def load_state_dict(self, state_dict):
        """Load a :meth:`state_dict`; continues bit-identically on the rank that saved it.

        Residuals saved by another rank of the same world size are not loaded
        (they start from zero, with a warning); the moments and the step are.

        Parameters
        ----------
        state_dict : dict
            What :meth:`state_dict` returned.

        Raises
        ------
        ValueError
            If the state has no ``"ccl"`` entry, was saved at another world
            size (the residuals and the averaged momenta belong to that
            size's chunking: restart the warm-up instead), with other
            parameters or another codec.
        """
        state_dict = dict(state_dict)
        ccl_state = state_dict.pop("ccl", None)
        try:
            version, size, rank = ccl_state["version"], ccl_state["size"], ccl_state["rank"]
            layout, comm_state = ccl_state["params"], ccl_state["communicator"]
        except (KeyError, TypeError):
            raise ValueError("not a CompressedAdam state dict (no valid 'ccl' entry)") from None
        if version != _STATE_VERSION:
            raise ValueError(f"CompressedAdam state version {version} is not supported "
                             f"(this is version {_STATE_VERSION})")
        if size != self.size:
            raise ValueError(f"this CompressedAdam state was saved at world size {size}; "
                             f"this job has {self.size} ranks. Its error-feedback residuals "
                             "cannot move to another size: resume at the same size")
        if layout != self.layout_hash:
            raise ValueError("the state was saved by a CompressedAdam over other parameters "
                             "(names, shapes or dtypes differ)")
        if comm_state.get("codec") != self.codec.get_config():
            raise ValueError(f"the state was saved with codec {comm_state.get('codec')!r}, "
                             f"this optimizer uses {self.codec.get_config()!r}")
        super().load_state_dict(state_dict)
        self.steps = int(ccl_state["step"])
        if rank == self.rank:
            self.communicator.load_state_dict(
                _convert(comm_state, torch.Tensor, lambda t: t.detach().cpu().numpy().copy()))
        else:
            warnings.warn(f"error-feedback residuals saved by rank {rank} are not loaded on "
                          f"rank {self.rank}: they start from zero. Save state_dict() on "
                          "every rank to keep them.", stacklevel=2)
            self.communicator.feedback.load_state_dict({})

    def communication_stats(self):
        """Counters of this rank: reductions, payload bytes sent, the step.

        Returns
        -------
        dict
            ``step``, ``warmup`` (whether the next step is a warm-up step),
            ``params`` and ``compressed_params`` (parameters whose momentum is
            compressed), ``buckets`` (their allreduces per step), ``reductions``
            (allreduces started) and ``bytes_sent``
            (payload bytes this rank put on the wire, ccl's own count).
        """
        return {"step": self.steps, "warmup": self.steps < self.warmup_steps,
                "params": len(self.params), "compressed_params": sum(self.compressed),
                "buckets": len(self.buckets),
                "reductions": self.reductions,
                "bytes_sent": self.communicator.stats()["bytes_sent"]}
