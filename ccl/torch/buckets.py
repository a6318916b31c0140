"""Which parameters a ``DistributedOptimizer`` reduces, in what order, in which buckets.

At construction the optimizer's parameters are put in a fixed order (reverse
registration order, like DDP: the last layers' gradients are ready first in
backward) and cut into **buckets** of one dtype and at most
``fusion_threshold_bytes``. :class:`Plan` holds the validated arguments and
that cut; its :meth:`Plan.signature` is what every rank must agree on.
"""

import numpy as np
import torch

from ..codecs import get_codec
from ..collectives import ALGORITHM_NAMES, OPS
from .powersgd import powersgd_method

__all__ = ["plan_buckets", "work_dtype", "named_params", "Plan", "MIN_COMPRESS_SHARE"]

#: A bucket is compressed only if it holds at least this share of the model's gradient
#: bytes (and ``min_compress_bytes``; ``min_compress_bytes=0`` compresses every bucket
#: whatever its share). A smaller one can save little of the traffic, and
#: lossy codecs cost it accuracy out of proportion: on the 17.1M-parameter MLP of
#: ``ccl.bench.train`` (4 emulated hosts, 1 Gbit/s), compressing its 1 MB first and 160 KB
#: last layers beside the 64 MB middle one took 3LC from 0.909 to 0.860 test accuracy after
#: 15 steps, 1-bit from 0.893 to 0.880 and SIDCo from 0.887 to 0.842, and no step got
#: faster (docs/benchmarks.md, "Small layers stay exact").
MIN_COMPRESS_SHARE = 1 / 20


def work_dtype(dtype):
    """The dtype a parameter's gradient is reduced in (numpy has no bfloat16)."""
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"DistributedOptimizer reduces floating-point gradients (float16, "
                    f"bfloat16, float32, float64); got a {dtype} parameter")


def plan_buckets(entries, threshold, solo_bytes=None, groups=None):
    """Cut parameters into buckets: one dtype (and group) each, at most ``threshold`` bytes.

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
    groups : sequence, optional
        A label per entry (Horovod's fusion groups): entries of different
        labels never share a bucket.

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
    >>> plan_buckets([(8, "f4"), (8, "f4"), (8, "f4")], 64, groups=["a", "b", "a"])
    [[0, 2], [1]]
    """
    open_buckets, done = {}, []
    if solo_bytes:
        threshold = min(threshold, solo_bytes - 1)
    for index, (nbytes, dtype) in enumerate(entries):
        if solo_bytes and nbytes >= solo_bytes:
            done.append([index])
            continue
        kind = dtype if groups is None else (groups[index], dtype)
        bucket = open_buckets.get(kind)
        if bucket is not None and bucket[0] + nbytes > threshold:
            done.append(bucket[1])
            bucket = None
        if bucket is None:
            bucket = open_buckets[kind] = [0, []]
        bucket[0] += nbytes
        bucket[1].append(index)
    done.extend(indices for _, indices in open_buckets.values())
    return sorted(done, key=lambda indices: indices[0])


# ----------------------------------------------------------------------- parameters
def named_params(optimizer, named_parameters):
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


class Plan:
    """Validated arguments of one DistributedOptimizer: names, buckets and options."""

    def __init__(self, optimizer, named_parameters, codec, algorithm, backward_passes_per_step,
                 op, fusion_threshold_bytes, min_compress_bytes, groups=None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
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
        # PowerSGD is a reduction method, not a codec: its inner codec carries P and Q
        self.powersgd = powersgd_method(codec)
        self.codec = get_codec(codec) if self.powersgd is None else self.powersgd.inner
        self.algorithm, self.op, self.passes = algorithm, op, k
        self.threshold, self.min_compress = fusion_threshold_bytes, min_compress_bytes
        self.lr_corrected = False  # DistributedOptimizer sets it (lr-corrected error feedback)
        # Horovod's fusion groups: {parameter: label}; a parameter outside them is alone
        self.groups = groups
        if named_parameters is not None and not isinstance(named_parameters, dict):
            named_parameters = list(named_parameters)  # read twice: here and by extend()
        named = named_params(optimizer, named_parameters)
        # names of parameters a later add_param_group may bring (positions otherwise)
        self.given_names = None if named_parameters is None else \
            {p: name for name, p in dict(named_parameters).items()}
        self.names, self.params, self.buckets, self.compressed = [], [], [], []
        self._add(named)

    def _add(self, named):
        """Append buckets of the parameters ``named`` (registration order); return them."""
        named = named[::-1]  # gradients of the last layers are ready first
        for name, p in named:
            if p.is_sparse or p.layout != torch.strided:
                raise TypeError(f"parameter {name!r} is not a dense tensor; "
                                "DistributedOptimizer reduces dense gradients only")
            work_dtype(p.dtype)
        first = len(self.params)
        entries = [(p.numel() * work_dtype(p.dtype).itemsize, work_dtype(p.dtype))
                   for _, p in named]
        # lossy codecs scale (or select) per chunk: keep their chunks inside one tensor
        # (PowerSGD approximates each matrix of a bucket by itself: its buckets may fuse)
        solo = max(self.min_compress, 1) if self.codec.error_feedback and \
            self.powersgd is None else None
        labels = None if self.groups is None else \
            [self.groups.get(p, ("alone", name)) for name, p in named]
        added, compressed = [], []
        # the whole model's gradient bytes, the parameters planned before included
        total = sum(nbytes for nbytes, _ in entries) + sum(
            p.numel() * work_dtype(p.dtype).itemsize for p in self.params)
        # min_compress_bytes=0 asks for every bucket compressed (Horovod's compression=)
        smallest = max(self.min_compress, MIN_COMPRESS_SHARE * total) if self.min_compress \
            else 0
        for members in plan_buckets(entries, max(self.threshold, 1), solo, labels):
            dtype = entries[members[0]][1]
            nbytes = sum(entries[i][0] for i in members)
            # PowerSGD decides per matrix (its min_compression_rate), not per bucket
            compress = self.powersgd is not None or \
                (not self.codec.identity and nbytes >= smallest)
            np_dtype = np.dtype(str(dtype).replace("torch.", ""))
            if compress and np_dtype not in self.codec.input_dtypes:
                raise TypeError(f"codec {self.codec.codec_id!r} does not take {np_dtype} "
                                f"gradients (parameters {[named[i][0] for i in members][:3]}"
                                "...): use float32 parameters or a codec that accepts "
                                f"{np_dtype}")
            added.append([first + i for i in members])
            compressed.append(compress)
        # nothing changes before every check passed
        self.names += [name for name, _ in named]
        self.params += [p for _, p in named]
        self.buckets += added
        self.compressed += compressed
        return added

    def extend(self, optimizer):
        """Plan the optimizer's trainable parameters that have no bucket yet.

        For parameters that ``add_param_group`` brought after wrapping. A
        parameter is named as in ``named_parameters`` if it was there, else by
        its position in ``param_groups`` (the same on every rank).

        Returns
        -------
        list of list of int
            The new buckets, as indices into :attr:`params`.
        """
        known = set(self.params)
        named = []
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                if p.requires_grad and p not in known:
                    known.add(p)
                    given = self.given_names.get(p) if self.given_names else None
                    named.append((given or f"group{g}.param{i}", p))
        return self._add(named)

    def drop(self, buckets):
        """Forget the last ``buckets`` that :meth:`extend` returned (and their parameters)."""
        if buckets:
            first = buckets[0][0]
            del self.names[first:], self.params[first:]
            del self.buckets[-len(buckets):], self.compressed[-len(buckets):]

    def layout(self):
        """What the buckets are made of: names, shapes and dtypes, bucket by bucket."""
        return [[(self.names[i], tuple(self.params[i].shape), str(self.params[i].dtype))
                 for i in members] for members in self.buckets]

    def config(self):
        """The codec's config, or PowerSGD's settings (``"id": "powersgd"``)."""
        return (self.powersgd or self.codec).get_config()

    def signature(self):
        """Everything every rank must agree on."""
        return (self.layout(), self.config(), self.algorithm, self.op, self.passes,
                self.threshold, self.min_compress, self.compressed)


