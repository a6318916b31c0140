"""``DistributedOptimizer``: a Horovod-style wrapper that averages gradients, compressed.

How a step flows
----------------
1. At construction the optimizer's parameters are put in a fixed order
   (reverse registration order, like DDP: the last layers' gradients are
   ready first in backward) and cut into **buckets** of one dtype and at most
   ``fusion_threshold_bytes``. Every rank checks once (one tiny
   ``Allgather``) that all ranks built the same buckets.
2. A ``post_accumulate_grad`` hook per parameter copies its gradient into its
   bucket's flat buffer once the gradient is final for this step (after
   ``backward_passes_per_step`` backward passes). When a bucket is complete,
   and every bucket before it has been started, it is handed to one
   background thread that reduces buckets strictly in bucket order, the
   same order on every rank, through :meth:`ccl.Communicator.allreduce` with
   ``key="bucket<i>"`` (error feedback per bucket). That runs while backward
   is still computing the earlier layers' gradients.
3. :meth:`synchronize` (called by :meth:`step`) starts the buckets that are
   not complete, with zeros for parameters that got no gradient on this rank
   (every rank must take part in every bucket's collective), waits for all
   of them, and writes the averaged gradients back into ``.grad``.

Buckets smaller than ``min_compress_bytes`` go uncompressed through the MPI
library's own ``Allreduce``: below that size latency, not bandwidth, costs.
"""

import contextlib
import queue
import threading
import warnings
import weakref
import zlib

import numpy as np
import torch

from ..api import Communicator
from ..codecs import get_codec
from ..collectives.auto import MIN_COMPRESS_BYTES
from .functions import from_array, to_array
from ..agreement import agree
from ..collectives import ALGORITHM_NAMES, OPS
from .runtime import current, threads_supported

__all__ = ["DistributedOptimizer", "DEFAULT_FUSION_THRESHOLD_BYTES", "plan_buckets"]

#: Default bucket size cap: 64 MiB (Horovod fuses up to 128 MB, DDP 25 MB).
DEFAULT_FUSION_THRESHOLD_BYTES = 64 * 1024 * 1024

_STATE_VERSION = 1


def _work_dtype(dtype):
    """The dtype a parameter's gradient is reduced in (numpy has no bfloat16)."""
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"DistributedOptimizer reduces floating-point gradients (float16, "
                    f"bfloat16, float32, float64); got a {dtype} parameter")


def plan_buckets(entries, threshold, solo_bytes=None):
    """Cut parameters into buckets: one dtype each, at most ``threshold`` bytes.

    Parameters
    ----------
    entries : sequence of (nbytes, dtype)
        Parameters in reduction order.
    threshold : int
        Bytes per bucket; a parameter larger than that gets a bucket of its own.
    solo_bytes : int, optional
        Parameters of at least this many bytes get a bucket of their own, and
        smaller ones fuse only below it. Scaled codecs need this: one scale
        (or one top-k) over a bucket of unrelated layers starves the layers of
        small magnitude, so compressed buckets hold one tensor each, while
        small tensors still fuse (and stay under the compression threshold).

    Returns
    -------
    list of list of int
        Indices into ``entries``; buckets ordered by their first index, indices
        in order within a bucket. The result depends only on ``entries``, so
        every rank computes the same plan.

    Examples
    --------
    >>> plan_buckets([(8, "f4"), (8, "f8"), (8, "f4"), (8, "f4")], 16)
    [[0, 2], [1], [3]]
    >>> plan_buckets([(4, "f4"), (100, "f4"), (4, "f4"), (4, "f4")], 64, solo_bytes=50)
    [[0, 2, 3], [1]]
    """
    open_buckets, done = {}, []
    if solo_bytes:
        threshold = min(threshold, solo_bytes - 1)
    for index, (nbytes, dtype) in enumerate(entries):
        if solo_bytes and nbytes >= solo_bytes:
            done.append([index])
            continue
        bucket = open_buckets.get(dtype)
        if bucket is not None and bucket[0] + nbytes > threshold:
            done.append(bucket[1])
            bucket = None
        if bucket is None:
            bucket = open_buckets[dtype] = [0, []]
        bucket[0] += nbytes
        bucket[1].append(index)
    done.extend(indices for _, indices in open_buckets.values())
    return sorted(done, key=lambda indices: indices[0])


# ----------------------------------------------------------------------- parameters
def _named_params(optimizer, named_parameters):
    """Return ``[(name, param)]`` in registration order, validated; raise what to pass."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    trainable = [p for p in params if p.requires_grad]
    if named_parameters is None:
        # Positions in param_groups are the same on every rank: usable as names.
        names = {}
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                names[p] = f"group{g}.param{i}"
        return [(names[p], p) for p in trainable]
    items = list(named_parameters.items()) if isinstance(named_parameters, dict) \
        else list(named_parameters)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise ValueError("named_parameters should be a sequence of (name, parameter) "
                             "tuples, usually model.named_parameters(); got an item of type "
                             f"{type(item).__name__}")
    seen_names, seen_params, dup_names = set(), {}, []
    for name, p in items:
        if name in seen_names:
            dup_names.append(name)
        seen_names.add(name)
        if p in seen_params and seen_params[p] != name:
            raise ValueError(f"parameter {name!r} is the same tensor as {seen_params[p]!r} "
                             "(tied weights?): pass each parameter once, as "
                             "model.named_parameters() does")
        seen_params[p] = name
    if dup_names:
        raise ValueError(f"named_parameters holds duplicate names {sorted(set(dup_names))}: "
                         "names must be unique; pass model.named_parameters()")
    unnamed = [p for p in trainable if p not in seen_params]
    if unnamed:
        shapes = ", ".join(str(tuple(p.shape)) for p in unnamed[:5])
        raise ValueError(f"{len(unnamed)} parameter(s) of the optimizer are not in "
                         f"named_parameters (shapes {shapes}{', ...' if len(unnamed) > 5 else ''}"
                         "): pass the named parameters of every module the optimizer "
                         "updates, e.g. model.named_parameters() of the whole model, or "
                         "leave named_parameters out")
    owned = set(trainable)
    return [(name, p) for name, p in items if p in owned]


class _Bucket:
    """A group of parameters reduced as one flat array."""

    __slots__ = ("members", "flat", "codec", "algorithm", "key", "missing", "job")

    def __init__(self, members, flat):
        self.members = members  # indices into the reducer's parameter list, in order
        self.flat = flat
        self.missing = len(members)  # parameters whose gradient is not in flat yet
        self.job = None
        self.codec = self.algorithm = self.key = None


class _Plan:
    """Validated arguments of one DistributedOptimizer: names, buckets and options."""

    def __init__(self, optimizer, named_parameters, codec, algorithm, backward_passes_per_step,
                 op, fusion_threshold_bytes, min_compress_bytes):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, _DistributedMixin):
            raise TypeError("optimizer is already a ccl.torch.DistributedOptimizer")
        if op not in OPS:
            raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
        if algorithm not in ALGORITHM_NAMES:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHM_NAMES)}; "
                             f"got {algorithm!r}")
        k = backward_passes_per_step
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {k!r}")
        for name, value in (("fusion_threshold_bytes", fusion_threshold_bytes),
                            ("min_compress_bytes", min_compress_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.codec = get_codec(codec)
        self.algorithm, self.op, self.passes = algorithm, op, k
        self.threshold, self.min_compress = fusion_threshold_bytes, min_compress_bytes
        named = _named_params(optimizer, named_parameters)
        named.reverse()  # gradients of the last layers are ready first
        for name, p in named:
            if p.is_sparse or p.layout != torch.strided:
                raise TypeError(f"parameter {name!r} is not a dense tensor; "
                                "DistributedOptimizer reduces dense gradients only")
            _work_dtype(p.dtype)
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        entries = [(p.numel() * _work_dtype(p.dtype).itemsize, _work_dtype(p.dtype))
                   for p in self.params]
        # lossy codecs scale (or select) per chunk: keep their chunks inside one tensor
        solo = max(min_compress_bytes, 1) if self.codec.error_feedback else None
        self.buckets = plan_buckets(entries, max(fusion_threshold_bytes, 1), solo)
        self.compressed = []
        for members in self.buckets:
            dtype = entries[members[0]][1]
            nbytes = sum(entries[i][0] for i in members)
            compress = not self.codec.identity and nbytes >= min_compress_bytes
            np_dtype = np.dtype(str(dtype).replace("torch.", ""))
            if compress and np_dtype not in self.codec.input_dtypes:
                raise TypeError(f"codec {self.codec.codec_id!r} does not take {np_dtype} "
                                f"gradients (parameters {[self.names[i] for i in members][:3]}"
                                "...): use float32 parameters or a codec that accepts "
                                f"{np_dtype}")
            self.compressed.append(compress)

    def layout(self):
        """What the buckets are made of: names, shapes and dtypes, bucket by bucket."""
        return [[(self.names[i], tuple(self.params[i].shape), str(self.params[i].dtype))
                 for i in members] for members in self.buckets]

    def signature(self):
        """Everything every rank must agree on."""
        return (self.layout(), self.codec.get_config(), self.algorithm, self.op, self.passes,
                self.threshold, self.min_compress, self.compressed)


# ------------------------------------------------------------------------ the engine
class _Job:
    """One bucket's reduction: input, options, and the result or error once done."""

    __slots__ = ("x", "key", "codec", "algorithm", "lr", "result", "error", "done")

    def __init__(self, x, key, codec, algorithm, lr=None):
        self.x, self.key, self.codec, self.algorithm, self.lr = x, key, codec, algorithm, lr
        self.result = self.error = None
        self.done = threading.Event()

    def run(self, communicator):
        try:
            if self.lr is not None:  # lr-corrected error feedback, on the thread that reduces
                communicator.set_lr(self.lr)
            self.result = communicator.allreduce(self.x, key=self.key, codec=self.codec,
                                                 algorithm=self.algorithm)
        except BaseException as exc:  # handed to the thread that waits for the job
            self.error = exc
        finally:
            self.done.set()


def _serve(jobs, communicator):
    """The communication thread: run jobs in the order they were submitted."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run(communicator)


class _Engine:
    """One optimizer's private communicator, :class:`ccl.Communicator` and thread."""

    def __init__(self, runtime, plan):
        # A communicator of its own: this engine's thread must never share a
        # communicator's message order with another thread (collective).
        self.comm = runtime.comm.Dup()
        # The plan already sends small buckets uncompressed; large ones are reduced in
        # partitions with their own residuals (the Communicator's partition_bytes).
        self.communicator = Communicator(self.comm, plan.codec, plan.algorithm, op=plan.op,
                                         min_compress_bytes=0, lr_corrected=plan.lr_corrected)
        self.reductions = 0
        self.closed = False
        self._jobs = queue.SimpleQueue()
        self._inline = []
        self._thread = None
        if threads_supported():
            self._thread = threading.Thread(target=_serve, args=(self._jobs, self.communicator),
                                            name="ccl.torch-comm", daemon=True)
            self._thread.start()
        runtime.engines.append(self)

    def submit(self, job):
        """Queue a job; jobs run in submission order."""
        if self.closed:
            raise RuntimeError("ccl.torch was shut down: this optimizer cannot reduce "
                               "gradients any more")
        self.reductions += 1
        if self._thread is None:
            self._inline.append(job)  # run by wait(), in the calling thread
        else:
            self._jobs.put(job)

    def wait(self, job):
        """Block until ``job`` is done."""
        while self._inline and not job.done.is_set():
            self._inline.pop(0).run(self.communicator)
        job.done.wait()

    def stop(self):
        """Stop the thread once the queued jobs are done (no MPI calls: safe anywhere)."""
        if self._thread is not None and self._thread.is_alive():
            self._jobs.put(None)

    def close(self):
        """Finish queued jobs, stop the thread and free the communicator (collective)."""
        if self.closed:
            return
        self.closed = True
        self.stop()
        if self._thread is not None:
            self._thread.join()
        for job in self._inline:
            job.run(self.communicator)
        self._inline = []
        self.comm.Free()


def _to_torch(obj):
    """numpy arrays -> tensors in a nested structure (checkpoints load with weights_only)."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, dict):
        return {k: _to_torch(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_to_torch(v) for v in obj)
    return obj


def _to_numpy(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy().copy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_to_numpy(v) for v in obj)
    return obj


def _release(handles, engine):
    for handle in handles:
        handle.remove()
    engine.stop()


class _Reducer:
    """Hooks, buckets and per-step bookkeeping of one DistributedOptimizer."""

    def __init__(self, runtime, plan):
        self.plan = plan
        self.params = plan.params
        self.rank, self.size = runtime.rank, runtime.size
        self.engine = _Engine(runtime, plan)
        self.lock = threading.RLock()
        self.bucket_of, self.offset_of = [0] * len(self.params), [0] * len(self.params)
        self.buckets = []
        for b, members in enumerate(plan.buckets):
            offset = 0
            for i in members:
                self.bucket_of[i], self.offset_of[i] = b, offset
                offset += self.params[i].numel()
            first = self.params[members[0]]
            bucket = _Bucket(members, torch.zeros(offset, dtype=_work_dtype(first.dtype),
                                                  device=first.device))
            if plan.compressed[b]:
                bucket.codec, bucket.algorithm, bucket.key = plan.codec, plan.algorithm, \
                    f"bucket{b}"
            else:
                # Too small to pay for compression: the MPI library's own Allreduce.
                bucket.codec, bucket.algorithm, bucket.key = "none", "auto", None
            self.buckets.append(bucket)
        self.layout_hash = zlib.crc32(repr(plan.layout()).encode("utf-8"))
        self._reset()
        self.skip = False
        self.synced_since_step = False
        ref = weakref.ref(self)
        handles = [p.register_post_accumulate_grad_hook(
            lambda param, i=i: _hook(ref, i)) for i, p in enumerate(self.params)]
        weakref.finalize(self, _release, handles, self.engine)

    def _reset(self):
        self.remaining = [self.plan.passes] * len(self.params)
        self.ready = [False] * len(self.params)
        for bucket in self.buckets:
            bucket.missing, bucket.job = len(bucket.members), None
        self.next_launch = 0
        self.dirty = False  # a hook fired since the last synchronize()

    # ------------------------------------------------------------- backward
    def on_grad(self, i):
        """A gradient was accumulated into parameter ``i`` (runs inside backward)."""
        with self.lock:
            self.dirty = True
            if self.ready[i]:
                raise RuntimeError(
                    f"the gradient of {self.plan.names[i]!r} was computed more than "
                    f"backward_passes_per_step={self.plan.passes} times before step() or "
                    "synchronize(); raise backward_passes_per_step to accumulate more "
                    "backward passes locally")
            self.remaining[i] -= 1
            if self.remaining[i] > 0:
                return
            self._take(i)
            self._launch_complete()

    def _take(self, i):
        """Copy parameter ``i``'s gradient (zeros if it has none) into its bucket."""
        p, bucket = self.params[i], self.buckets[self.bucket_of[i]]
        start = self.offset_of[i]
        view = bucket.flat[start:start + p.numel()].view(p.shape)
        with torch.no_grad():
            if p.grad is None:
                view.zero_()
            else:
                if p.grad.is_sparse:
                    raise TypeError(f"parameter {self.plan.names[i]!r} got a sparse "
                                    "gradient; DistributedOptimizer reduces dense gradients")
                view.copy_(p.grad)
        self.ready[i] = True
        bucket.missing -= 1

    def _launch_complete(self):
        """Start complete buckets, in bucket order, up to the first incomplete one."""
        while self.next_launch < len(self.buckets) and \
                self.buckets[self.next_launch].missing == 0:
            self._launch(self.buckets[self.next_launch])
            self.next_launch += 1

    def _launch(self, bucket):
        bucket.job = _Job(to_array(bucket.flat), bucket.key, bucket.codec, bucket.algorithm,
                          self.lr_of(bucket))
        self.engine.submit(bucket.job)

    def lr_of(self, bucket):
        """The lr of the group of the bucket's first parameter (lr-corrected EF), or None."""
        optimizer = self.optimizer() if self.plan.lr_corrected else None
        if optimizer is None or bucket.key is None:
            return None
        first = self.params[bucket.members[0]]
        lr = next(float(g["lr"]) for g in optimizer.param_groups
                  if any(q is first for q in g["params"]))
        return lr if 0 <= lr < float("inf") else None

    # ----------------------------------------------------------- synchronize
    def synchronize(self):
        with self.lock:
            for b in range(self.next_launch, len(self.buckets)):
                bucket = self.buckets[b]
                for i in bucket.members:
                    if not self.ready[i]:
                        self._take(i)
                self._launch(bucket)
            self.next_launch = len(self.buckets)
            jobs = [bucket.job for bucket in self.buckets]
            for job in jobs:
                self.engine.wait(job)
            error = next((job.error for job in jobs if job.error is not None), None)
            if error is None:
                self._write_back(jobs)
            self._reset()
        if error is not None:
            raise error

    def _write_back(self, jobs):
        with torch.no_grad():
            for bucket, job in zip(self.buckets, jobs):
                result = from_array(job.result, like=bucket.flat)
                for i in bucket.members:
                    p, start = self.params[i], self.offset_of[i]
                    values = result[start:start + p.numel()].view(p.shape)
                    if p.grad is None:
                        p.grad = torch.empty_like(p)
                    p.grad.copy_(values)

    @property
    def pending(self):
        return self.dirty or any(bucket.job is not None for bucket in self.buckets)

    # ----------------------------------------------------------------- state
    def state_dict(self):
        return {"version": _STATE_VERSION, "rank": self.rank, "size": self.size,
                "buckets": self.layout_hash,
                "communicator": _to_torch(self.engine.communicator.state_dict())}

    def check_state(self, state):
        """Validate a :meth:`state_dict`; return whether its residuals apply to this rank."""
        try:
            version, layout = state["version"], state["buckets"]
            saved_rank, saved_size = state["rank"], state["size"]
            codec = state["communicator"]["codec"]
        except (KeyError, TypeError):
            raise ValueError("the 'ccl' entry of the state dict is not a "
                             "DistributedOptimizer state") from None
        if version != _STATE_VERSION:
            raise ValueError(f"ccl state version {version} is not supported "
                             f"(this is version {_STATE_VERSION})")
        if layout != self.layout_hash:
            raise ValueError("the state was saved by a DistributedOptimizer with other "
                             "buckets (other parameters, fusion_threshold_bytes or "
                             "named_parameters)")
        if codec != self.plan.codec.get_config():
            raise ValueError(f"the state was saved with codec {codec!r}, this optimizer uses "
                             f"{self.plan.codec.get_config()!r}")
        if (saved_rank, saved_size) != (self.rank, self.size):
            warnings.warn(f"error-feedback residuals saved by rank {saved_rank} of "
                          f"{saved_size} are not loaded on rank {self.rank} of {self.size} "
                          "(they are per rank): residuals start from zero. Save "
                          "optimizer.state_dict() on every rank to keep them.", stacklevel=3)
            return False
        return True

    def load_state_dict(self, state):
        self.engine.communicator.load_state_dict(_to_numpy(state["communicator"]))

    def reset_residuals(self):
        self.engine.communicator.feedback.load_state_dict({})


def _hook(ref, i):
    reducer = ref()
    if reducer is not None:
        reducer.on_grad(i)


# ---------------------------------------------------------------- the optimizer
class _DistributedMixin:
    """Methods a DistributedOptimizer adds to (or wraps in) the user's optimizer class."""

    def synchronize(self):
        """Finish every bucket's reduction and write the averaged gradients into ``.grad``.

        Buckets not started yet (some of their parameters got no gradient on
        this rank) are started now, with zeros for those parameters; every
        parameter then has a ``.grad``. Call it before clipping or inspecting
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
                warnings.warn("optimizer.step() after optimizer.synchronize() reduces the "
                              "gradients a second time; call step() inside "
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

    def state_dict(self):
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

    def load_state_dict(self, state_dict):
        """Load a state dict; restores residuals saved by this same rank.

        A state without a ``"ccl"`` entry (e.g. from a plain optimizer) keeps
        the current residuals. Residuals saved by another rank (or at another
        size) are not loaded: they start from zero, with a warning.

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
        own = ccl_state is not None and self._ccl.check_state(ccl_state)
        super().load_state_dict(state_dict)
        if own:
            self._ccl.load_state_dict(ccl_state)
        elif ccl_state is not None:
            self._ccl.reset_residuals()

    def communication_stats(self):
        """Counters of this rank: buckets, reductions started, payload bytes sent.

        Returns
        -------
        dict
            ``buckets``, ``compressed_buckets``, ``bucket_bytes`` (list),
            ``reductions`` and ``bytes_sent`` (payload bytes this rank put on
            the wire, ccl's own count).
        """
        reducer = self._ccl
        return {"buckets": len(reducer.buckets),
                "compressed_buckets": sum(reducer.plan.compressed),
                "bucket_bytes": [b.flat.numel() * b.flat.element_size()
                                 for b in reducer.buckets],
                "reductions": reducer.engine.reductions,
                "bytes_sent": reducer.engine.communicator.stats()["bytes_sent"]}


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
                         min_compress_bytes=MIN_COMPRESS_BYTES, lr_corrected=False):
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
    codec : Codec, str, dict or None
        How gradients are compressed (see :func:`ccl.codecs.get_codec`);
        ``None`` sends them uncompressed (the MPI library's ``Allreduce``).
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
        costs.
    lr_corrected : bool
        Learning-rate-corrected error feedback: a bucket's residuals are
        scaled by eta(t-1)/eta(t) when the ``lr`` of its first parameter's
        group changes (see :meth:`ccl.Communicator.set_lr`).

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
    runtime = current()
    plan, error = None, None
    try:
        plan = _Plan(optimizer, named_parameters, codec, algorithm, backward_passes_per_step,
                     op, fusion_threshold_bytes, min_compress_bytes)
        if not isinstance(lr_corrected, bool):
            raise TypeError(f"lr_corrected must be True or False, got {lr_corrected!r}")
        plan.lr_corrected = lr_corrected
    except (TypeError, ValueError) as exc:
        error = exc
    agree(runtime.comm, "DistributedOptimizer",
          [("arguments", plan.signature() if plan else None), ("lr_corrected", lr_corrected)],
          error)
    cls = _subclass(type(optimizer))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._ccl = _Reducer(runtime, plan)
    wrapped._ccl.optimizer = weakref.ref(wrapped)  # where lr-corrected EF reads the lr
    return wrapped
