"""The communication of ``CompressedAdam``: buckets that start during backward.

A ``post_accumulate_grad`` hook per parameter hands the parameter's final
gradient of this step (after ``backward_passes_per_step`` backward passes) to
the optimizer, which folds it into what the parameter sends: the gradient
itself during the warm-up, the rank's local momentum after it. That goes into
the parameter's bucket's flat buffer. A complete bucket is handed to the
:class:`~ccl.torch.engine.Engine` as soon as every bucket before it in launch
order has been, so the reductions of the last layers run while backward is
still computing the first layers' gradients.

Launch order is fixed at construction and is the same on every rank, whatever
the timing of backward: the compressed buckets from the last parameters to the
first (the order in which backward produces gradients), then the parameters
too small to compress, one bucket per dtype. :meth:`MomentumReducer.finish`
starts what backward did not (parameters without a gradient send zeros) and
waits for every bucket.
"""

import threading
import weakref

import numpy as np
import torch

from .engine import Census, Engine, Job, release
from .functions import from_array, to_array
from .hooks import BucketHooks

__all__ = ["MomentumReducer"]


class _Bucket:
    """Parameters reduced as one flat array: compressed with error feedback, or exactly."""

    __slots__ = ("members", "flat", "key", "missing", "job")

    def __init__(self, members, flat, key):
        self.members = members  # indices into the optimizer's parameter list, in order
        self.flat = flat
        self.key = key  # the error-feedback key; None: reduced uncompressed in every phase
        self.missing = len(members)
        self.job = None


class MomentumReducer(BucketHooks):
    """Hooks, flat buffers and launches of one ``CompressedAdam`` (collective to make).

    Parameters
    ----------
    optimizer : ccl.torch.CompressedAdam
        The owner (held weakly): it says whether the step is a warm-up step,
        folds gradients into momenta and gives each bucket's learning rate.
    runtime : object
        The initialised ``ccl.torch``; the engine duplicates its communicator.
    compressed : list of list of int
        The compressed buckets, as indices into ``optimizer.params``, in
        parameter order.
    keys : list of str
        Each compressed bucket's error-feedback key.
    passes : int
        Backward passes per step (gradient accumulation).
    codec, algorithm, lr_corrected
        The engine's :class:`ccl.Communicator` settings for compressed buckets.
    """

    drop_advice = "optimizer.skip_step() drops a step"

    def __init__(self, optimizer, runtime, compressed, keys, passes, codec, algorithm,
                 lr_corrected):
        self.owner = weakref.ref(optimizer)
        self.params = optimizer.params
        self.passes = passes
        self.engine = Engine(runtime, codec, algorithm, "mean", min_compress_bytes=0,
                             lr_corrected=lr_corrected)
        self.engine.what = "CompressedAdam"
        self.lock = threading.RLock()
        taken = {i for members in compressed for i in members}
        exact = {}
        for i, p in enumerate(self.params):
            if i not in taken:
                exact.setdefault(p.dtype, []).append(i)
        # launch order: compressed buckets last parameter first, then the small ones
        self.buckets = [self._bucket(members, key)
                        for members, key in reversed(list(zip(compressed, keys)))]
        self.buckets += [self._bucket(members, None) for members in exact.values()]
        self.bucket_of, self.offset_of = {}, {}
        for bucket in self.buckets:
            offset = 0
            for i in bucket.members:
                self.bucket_of[i], self.offset_of[i] = bucket, offset
                offset += self.params[i].numel()
        self._handles = self.hook(range(len(self.params)))
        weakref.finalize(self, release, self._handles, self.engine)
        self.reset()

    def _bucket(self, members, key):
        first = self.params[members[0]]
        numel = sum(self.params[i].numel() for i in members)
        return _Bucket(members, torch.zeros(numel, dtype=first.dtype, device=first.device), key)

    # ------------------------------------------------------------- backward
    def param_name(self, i):
        return self.owner().names[i]

    def fill(self, i):
        """Fold parameter ``i``'s gradient (zeros if none) and copy what it sends into the bucket."""
        p, bucket = self.params[i], self.bucket_of[i]
        start = self.offset_of[i]
        with torch.no_grad():
            sent = self.owner().fold(p)
            bucket.flat[start:start + p.numel()].copy_(sent.reshape(-1))
        return bucket

    def launch(self, bucket):
        optimizer = self.owner()
        if bucket.key is None or optimizer.in_warmup():
            # exact: the MPI library's own Allreduce (no error feedback)
            job = Job(to_array(bucket.flat), None, codec="none", algorithm="mpi")
        else:
            job = Job(to_array(bucket.flat), bucket.key,
                      lr=optimizer.lr_of(self.params[bucket.members[0]]))
        bucket.job = job
        self.submit(job)

    # ----------------------------------------------------------------- step
    def finish(self, flag=0):
        """Start what backward did not, wait for every bucket; return the means (collective).

        Then the ranks exchange one small row (the MPI library's exact
        allreduce): each rank's ``flag`` and which parameters have a gradient.

        Parameters
        ----------
        flag : int
            This rank's flags for the step (bits the optimizer defines).

        Returns
        -------
        means : list of (int, torch.Tensor)
            Per parameter index, the mean over the ranks of what it sent
            (a view of a fresh tensor, shaped like the parameter).
        flags : numpy.ndarray
            Every rank's ``flag``, by rank.
        anywhere : numpy.ndarray
            Per parameter index, whether some rank has a gradient for it.

        Raises
        ------
        Exception
            What a reduction raised (on every rank, as the collectives do).
        """
        with self.lock:
            for bucket in self.buckets[self.next_launch:]:
                for i in bucket.members:
                    if not self.ready[i]:
                        self.take(i)
                self.launch(bucket)
            self.next_launch = len(self.buckets)
            size = self.engine.communicator.size
            row = np.zeros(size + len(self.params))
            row[self.engine.communicator.rank] = flag
            row[size:] = [p.grad is not None for p in self.params]
            census = Census(row, None, codec="none", algorithm="mpi")  # averaged: times size
            self.submit(census)
            for bucket in self.buckets:
                self.engine.wait(bucket.job)
            self.engine.wait(census)
            jobs = (self.check, *(bucket.job for bucket in self.buckets), census)
            error = next((job.error for job in jobs if job.error is not None), None)
            means = flags = anywhere = None
            if error is None:
                table = np.rint(census.result * size).astype(np.int64)
                flags, anywhere = table[:size], table[size:] > 0
                means = []
                for bucket in self.buckets:
                    result = from_array(bucket.job.result, like=bucket.flat)
                    for i in bucket.members:
                        p, start = self.params[i], self.offset_of[i]
                        means.append((i, result[start:start + p.numel()].view(p.shape)))
            self.reset()
        if error is not None:
            raise error
        return means, flags, anywhere

