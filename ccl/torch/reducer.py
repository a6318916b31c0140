"""The per-step bookkeeping of a ``DistributedOptimizer``: hooks, buckets, state.

A ``post_accumulate_grad`` hook per parameter copies its gradient into its
bucket's flat buffer once the gradient is final for this step (after
``backward_passes_per_step`` backward passes). When a bucket is complete, and
every bucket before it has been started, it is handed to the
:class:`~ccl.torch.engine.Engine`, which reduces buckets strictly in bucket
order with ``key="bucket<i>"`` (error feedback per bucket) while backward is
still computing the earlier layers' gradients. :meth:`Reducer.synchronize`
starts the rest and writes the averages back into ``.grad``.
"""

import threading
import weakref
import zlib

import numpy as np
import torch
from mpi4py import MPI

from ..agreement import agree
from .buckets import work_dtype
from .engine import Engine, Job, release
from . import checkpoint
from .functions import from_array, to_array
from .hooks import Bucket, BucketHooks
from .powersgd import PowerSGDJob
from .sgd_momentum import LocalMomentum

__all__ = ["Reducer", "OWNER"]

#: The ``owner`` of a DistributedOptimizer's checkpoint entry (:mod:`.checkpoint`).
OWNER = "DistributedOptimizer"


def _sparse_like(grad, dense):
    """The reduced ``dense`` gradient in ``grad``'s sparse layout (slices with any nonzero).

    Horovod allgathers sparse gradients, so its result holds every rank's
    entries and its dense value is the average; this one has the same dense
    value, exactly. Slices whose average is exactly zero are left out, where
    Horovod keeps explicit zeros (an optimizer that treats a present zero row
    differently from an absent one, as ``SparseAdam`` does, can differ there).
    """
    return dense.to(grad.dtype).to_sparse(grad.sparse_dim())


class Reducer(BucketHooks):
    """Hooks, buckets and per-step bookkeeping of one DistributedOptimizer."""

    def __init__(self, runtime, plan):
        self.plan = plan
        self.params = plan.params
        self.passes = plan.passes
        self.rank, self.size = runtime.rank, runtime.size
        # The plan already sends small buckets uncompressed; large ones are reduced in
        # partitions with their own residuals (the Communicator's partition_bytes).
        self.engine = Engine(runtime, plan.codec, plan.algorithm, plan.op, min_compress_bytes=0,
                             lr_corrected=plan.lr_corrected)
        self.engine.what = "DistributedOptimizer"
        self.optimizer = None  # a weak reference to the wrapped optimizer (lr-corrected EF)
        self.comm = runtime.comm  # this thread's: the gradient census of synchronize()
        # Horovod's gradient_predivide_factor f: gradients times 1/f before the reduction,
        # the result times f after it (set by ccl.torch.horovod_optimizer)
        self.prescale = self.postscale = 1.0
        self.lock = threading.RLock()
        # SGD's momentum corrected (ccl.torch.sgd_momentum): set by wrap() where it applies
        self.momentum = None
        self.bucket_of, self.offset_of, self.buckets = [], [], []
        self.skip = False
        self.synced_since_step = False
        self._handles = []
        self._add_buckets(plan.buckets)
        self.engine.joined_step = weakref.WeakMethod(self.joined_step)
        weakref.finalize(self, release, self._handles, self.engine)

    def _add_buckets(self, buckets):
        """Flat buffers and gradient hooks for the plan's new ``buckets``."""
        plan = self.plan
        self.bucket_of += [0] * (len(self.params) - len(self.bucket_of))
        self.offset_of += [0] * (len(self.params) - len(self.offset_of))
        for members in buckets:
            b, offset = len(self.buckets), 0
            for i in members:
                self.bucket_of[i], self.offset_of[i] = b, offset
                offset += self.params[i].numel()
            first = self.params[members[0]]
            flat = torch.zeros(offset, dtype=work_dtype(first.dtype), device=first.device)
            if plan.compressed[b]:
                bucket = Bucket(members, flat, f"bucket{b}", plan.codec, plan.algorithm)
            else:
                # Too small to pay for compression: the MPI library's own Allreduce.
                bucket = Bucket(members, flat, None, "none", "auto")
            self.buckets.append(bucket)
            self._handles += self.hook(members)
        self.layout_hash = zlib.crc32(repr(plan.layout()).encode("utf-8"))
        self.reset()

    def extend(self, optimizer, error=None):
        """Reduce the parameters ``add_param_group`` brought too (collective).

        Parameters
        ----------
        optimizer : torch.optim.Optimizer
            The wrapped optimizer, its new group already added.
        error : Exception, optional
            What this rank's ``add_param_group`` raised: raised here after
            the ranks compared their new buckets, so that all of them raise.
        """
        buckets = []
        if error is None:
            try:
                buckets = self.plan.extend(optimizer)
            except (TypeError, ValueError) as exc:
                error = exc
        layout = self.plan.layout()[len(self.plan.buckets) - len(buckets):] if buckets else []
        try:
            agree(self.comm, "add_param_group", [("new buckets", layout)], error)
        except Exception:
            self.plan.drop(buckets)  # another rank failed: back to the buckets all ranks have
            raise
        self._add_buckets(buckets)

    # ------------------------------------------------------------- backward
    def param_name(self, i):
        return self.plan.names[i]

    def fill(self, i):
        """Copy parameter ``i``'s gradient (zeros if it has none) into its bucket."""
        p, bucket = self.params[i], self.buckets[self.bucket_of[i]]
        start = self.offset_of[i]
        view = bucket.flat[start:start + p.numel()].view(p.shape)
        with torch.no_grad():
            # a sparse gradient (nn.Embedding(sparse=True)) is averaged densely in
            # its bucket and handed back sparse (see _write_back)
            grad = None if p.grad is None else \
                p.grad.to_dense() if p.grad.is_sparse else p.grad
            # with SGD's momentum corrected, this rank's momentum goes instead
            if self.momentum is None or bucket.key is None or \
                    not self.momentum.fold(i, p, view, grad):
                if grad is None:
                    view.zero_()
                else:
                    view.copy_(grad)
            if self.prescale != 1.0:
                view.mul_(self.prescale)
        return bucket

    def launch(self, bucket):
        if self.plan.powersgd is not None and bucket.key is not None:
            shapes = [self.params[i].shape for i in bucket.members]
            bucket.job = PowerSGDJob(self.plan.powersgd, bucket.flat, bucket.key, shapes,
                                     self.engine.steps, self.plan.op)
        else:
            bucket.job = Job(to_array(bucket.flat), bucket.key, bucket.codec, bucket.algorithm,
                             lr=self.lr_of(bucket))
        self.submit(bucket.job)

    def lr_of(self, bucket):
        """The lr of the group of the bucket's first parameter (lr-corrected EF), or None."""
        optimizer = self.optimizer() if self.plan.lr_corrected and self.optimizer else None
        if optimizer is None or bucket.key is None:
            return None
        first = self.params[bucket.members[0]]
        lr = next(float(g["lr"]) for g in optimizer.param_groups
                  if any(q is first for q in g["params"]))
        return lr if 0 <= lr < float("inf") else None

    # ----------------------------------------------------------- synchronize
    def synchronize(self):
        with self.lock:
            try:  # before the census: ranks at other steps (or shut down) never reach it
                self.engine.check_passed(self.step_check())
            except Exception:
                for bucket in self.buckets:  # the step's other jobs skip their collective
                    if bucket.job is not None:
                        self.engine.wait(bucket.job)
                self.reset()
                raise
            anywhere = self._gradients_anywhere()
            for b in range(self.next_launch, len(self.buckets)):
                bucket = self.buckets[b]
                if not any(anywhere[i] for i in bucket.members):
                    continue  # no rank has a gradient for these: they keep .grad None
                for i in bucket.members:
                    if not self.ready[i]:
                        self.take(i)
                self.launch(bucket)
            self.next_launch = len(self.buckets)
            launched = [bucket for bucket in self.buckets if bucket.job is not None]
            for bucket in launched:
                self.engine.wait(bucket.job)
            error = next((b.job.error for b in launched if b.job.error is not None), None)
            if error is None:
                self._write_back(launched, anywhere)
                self.engine.steps += 1
            self.reset()
        if error is not None:
            raise error

    def joined_step(self, check):
        """Take part in the other ranks' step with zeros: this rank is in ``join()`` (collective).

        As Horovod's joined ranks: every bucket the others reduce gets zeros
        from this rank (an average still divides by every rank), and this
        rank's gradients and parameters are left as they are. The step counts
        as one, so every rank is at the same step once all joined.

        Parameters
        ----------
        check : ccl.torch.engine.JoinCheck
            The step's check, done: the others started a step.
        """
        with self.lock:
            self.reset()
            self.check = check  # the step's check: the buckets' jobs run after it
            has = np.zeros(len(self.params), dtype=np.uint8)  # no gradient here
            self.comm.Allreduce(MPI.IN_PLACE, has, op=MPI.MAX)
            launched = []
            for bucket in self.buckets:
                if any(has[i] for i in bucket.members):
                    bucket.flat.zero_()
                    self.launch(bucket)
                    launched.append(bucket)
            for bucket in launched:
                self.engine.wait(bucket.job)
            error = next((b.job.error for b in launched if b.job.error is not None), None)
            if error is None:
                self.engine.steps += 1
            self.reset()
        if error is not None:
            raise error

    def _gradients_anywhere(self):
        """Per parameter: whether some rank has a gradient for it (collective, tiny).

        As in PyTorch, a parameter that got no gradient (frozen, or unused in
        this step) on every rank keeps ``.grad`` None, so the optimizer skips
        it; one that got a gradient on some ranks gets zeros on the others
        and the average everywhere, as in Horovod.
        """
        has = np.fromiter((self.ready[i] or p.grad is not None
                           for i, p in enumerate(self.params)), dtype=np.uint8,
                          count=len(self.params))
        self.comm.Allreduce(MPI.IN_PLACE, has, op=MPI.MAX)
        return has.astype(bool)

    def _write_back(self, buckets, anywhere):
        with torch.no_grad():
            for bucket in buckets:
                result = from_array(bucket.job.result, like=bucket.flat)
                for i in bucket.members:
                    if not anywhere[i]:
                        continue
                    p, start = self.params[i], self.offset_of[i]
                    values = result[start:start + p.numel()].view(p.shape)
                    if p.grad is not None and p.grad.is_sparse:
                        p.grad = _sparse_like(p.grad, values * self.postscale)
                        continue
                    if p.grad is None:
                        p.grad = torch.empty_like(p)
                    p.grad.copy_(values)
                    if self.postscale != 1.0:
                        p.grad.mul_(self.postscale)
                    if self.momentum is not None:
                        self.momentum.gradient(i, p, p.grad)
        if self.momentum is not None:
            self.momentum.commit(anywhere)

    def reset(self):
        super().reset()
        if self.momentum is not None:
            self.momentum.drop()  # a failed step keeps the momenta it had

    # ----------------------------------------------------------------- state
    def state_dict(self):
        """This rank's ``"ccl"`` entry of the optimizer's state dict (:mod:`.checkpoint`)."""
        extra = {} if self.plan.powersgd is None else \
            {"powersgd": self.plan.powersgd.state_dict()}
        if self.momentum is not None:
            extra["momenta"] = self.momentum.state_dict(self.plan.names)
        return checkpoint.save(OWNER, rank=self.rank, size=self.size, layout=self.layout_hash,
                               steps=self.engine.steps,
                               communicators=[self.engine.communicator.state_dict()], **extra)

    def check_state(self, state):
        """Validate a ``"ccl"`` entry; return it in the current format and whether it is ours.

        Residuals saved by another rank or at another size are not loaded:
        one :class:`~ccl.torch.checkpoint.ResidualsNotLoadedWarning` says so.
        """
        entry = checkpoint.checked(
            state, OWNER, layout=self.layout_hash,
            layout_error="the state was saved by a DistributedOptimizer with other buckets "
                         "(other parameters, fusion_threshold_bytes or named_parameters)",
            codecs=[self.plan.codec.get_config()])
        if (self.plan.powersgd is None) != ("powersgd" not in entry):
            codec = entry["communicators"][0]["codec"]
            raise ValueError("the state was saved with codec "
                             f"{'powersgd' if 'powersgd' in entry else codec!r}, this "
                             f"optimizer uses {self.plan.config()!r}")
        if self.plan.powersgd is not None:
            self.plan.powersgd.check_state(entry["powersgd"])
        if self.momentum is not None and entry.get("momenta") is not None:
            LocalMomentum.check(entry["momenta"], self.plan.names, self.params)
        return entry, checkpoint.owns(entry, self.rank, self.size, stacklevel=4)

    def load_state_dict(self, entry, own=True):
        """Load a checked entry: its steps, and its residuals if ``own`` (this rank's)."""
        checkpoint.restore(self.engine.communicator, entry["communicators"][0], own)
        if self.plan.powersgd is not None:
            self.plan.powersgd.load_state_dict(entry["powersgd"], own)
        if self.momentum is not None:
            self.momentum.load_state_dict(entry.get("momenta"), self.plan.names, self.params,
                                          own)
        if entry["steps"] is not None:
            self.engine.steps = int(entry["steps"])
