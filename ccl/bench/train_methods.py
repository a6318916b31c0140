"""The methods :mod:`ccl.bench.train` compares: how each is set up, and what it sends.

A method is a name (``ddp/<hook>``, ``ccl/<codec>`` or ``local``) that
:func:`build` turns into a model and an optimizer, every one from the same
initial weights (:func:`ccl.bench.torch_digits.mlp` with the run's seed):

- ``ddp/none``, ``ddp/fp16``, ``ddp/powersgd``: ``DistributedDataParallel``
  on gloo with no hook, ``fp16_compress_hook`` or ``powerSGD_hook`` (rank
  :data:`POWERSGD_RANK`, after :data:`POWERSGD_START` uncompressed steps, the
  fewest its error feedback allows); bucket sizes are DDP's defaults, except
  for PowerSGD: one bucket (see :func:`build`);
- ``ccl/<codec>``: :func:`ccl.torch.DistributedOptimizer` with that codec
  and nothing else: default codec settings, ``algorithm="auto"``, default
  fusion; ``ccl/powersgd`` is ccl's PowerSGD at ``ddp/powersgd``'s rank and
  warm-up (its default inner codec, bf16), ``ccl/powersgd+<codec>`` the
  same with that inner codec (:func:`ccl_codec`);
- ``hook/<codec>``: ``DistributedDataParallel`` on gloo with ccl's codec as
  its communication hook (:func:`ccl.torch.ddp_comm_hook`, default settings),
  DDP's default buckets;
- ``hvd/<compression>``: a Horovod program's setup, unchanged but for
  ``import ccl.torch as hvd`` (:func:`horovod_style`): ``broadcast_parameters``,
  ``broadcast_optimizer_state`` and ``hvd.DistributedOptimizer`` with
  ``compression=hvd.Compression.fp16`` or ``hvd.Compression.codec("3lc")``
  (always compressed, on the algorithm that fits the codec);
- ``local``: no communication at all, each rank steps on its own gradient
  (the floor of the step time).

The gloo group of the ``ddp/`` and ``hook/`` methods is
:func:`ccl.bench.gloo.gloo_group`'s.
"""

DDP_HOOKS = ("none", "fp16", "powersgd")
CCL_CODECS = ("none", "fp16", "3lc", "onebit", "thc", "sidco", "topk", "powersgd",
              "powersgd+thc")
HOOK_CODECS = ("3lc", "onebit")
HVD_COMPRESSIONS = ("fp16", "3lc")
METHODS = (tuple(f"ddp/{h}" for h in DDP_HOOKS) + tuple(f"ccl/{c}" for c in CCL_CODECS)
           + tuple(f"hook/{c}" for c in HOOK_CODECS)
           + tuple(f"hvd/{c}" for c in HVD_COMPRESSIONS) + ("local",))
POWERSGD_RANK = 4
POWERSGD_START = 2  # powerSGD_hook's minimum with error feedback (buckets rebuild after step 1)


def ccl_codec(name):
    """The ``codec`` argument of method ``ccl/<name>``.

    ``powersgd`` and ``powersgd+<inner>`` get ``ddp/powersgd``'s rank and
    warm-up steps, so that the rows compare the implementations.
    """
    method, _, inner = name.partition("+")
    if method != "powersgd":
        return name
    return {"id": "powersgd", "rank": POWERSGD_RANK, "warmup_steps": POWERSGD_START,
            **({"inner": inner} if inner else {})}


def codec_ids(methods):
    """The ids of the codecs the ``ccl/`` ``methods`` run (PowerSGD's: its inner codec)."""
    from ccl.torch.powersgd import powersgd_method

    ids = []
    for method in methods:
        codec = ccl_codec(method.split("/", 1)[1])
        powersgd = powersgd_method(codec)
        ids.append(codec if powersgd is None else powersgd.inner.codec_id)
    return ids


def kind(method):
    """``"ddp"``, ``"ccl"``, ``"hook"``, ``"hvd"`` or ``"local"``: the runtime ``method`` needs."""
    return method.split("/", 1)[0]


def check_methods(methods):
    """Raise ``ValueError`` naming the known methods if one of ``methods`` is unknown."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")


def wrap_ddp(model, hook, powersgd_rank=POWERSGD_RANK, powersgd_start=POWERSGD_START):
    """``model`` in ``DistributedDataParallel`` (gloo), with a communication hook.

    Parameters
    ----------
    model : torch.nn.Module
    hook : str
        ``"none"`` (or ``"adamw"``: DDP's own allreduce), ``"fp16"``
        (``fp16_compress_hook``) or ``"powersgd"``.
    powersgd_rank, powersgd_start : int
        PowerSGD's matrix rank and its first compressed iteration (>= 2).

    Returns
    -------
    torch.nn.parallel.DistributedDataParallel
    """
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    # PowerSGD gets all gradients in one bucket: with more buckets than gloo has worker
    # threads (2), each bucket's callback blocks a thread in a nested wait (allreduce of
    # P inside the callback of the first allreduce), and the step deadlocks or mismatches
    cap = None if hook != "powersgd" else sum(p.numel() * p.element_size()
                                              for p in model.parameters()) / 2**20 + 1
    model = torch.nn.parallel.DistributedDataParallel(
        model, **({} if cap is None else {"bucket_cap_mb": cap}))
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None,
                                            matrix_approximation_rank=powersgd_rank,
                                            start_powerSGD_iter=max(2, powersgd_start))
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return model


def build(method, hidden, seed, lr):
    """The model and optimizer of ``method``, from the seed's initial weights.

    The ``ccl`` runtime (:func:`ccl.torch.init`) must be up for ``ccl/`` and
    ``hook/`` methods, the gloo group (:func:`ccl.bench.gloo.gloo_group`) for ``ddp/`` and
    ``hook/`` ones.

    Returns
    -------
    (model, optimizer, stats) : tuple
        ``stats`` is a callable returning the payload bytes this rank sent
        so far (``ccl/`` methods), or None.
    """
    import torch

    from .torch_digits import mlp

    model = mlp(hidden, seed)
    family, _, name = method.partition("/")
    if family == "ddp":
        model = wrap_ddp(model, name)
    import ccl.torch as ct

    if family == "hook":
        model = torch.nn.parallel.DistributedDataParallel(model)
        state, hook = ct.ddp_comm_hook(name)
        model.register_comm_hook(state, hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        return model, optimizer, lambda: state.communicator.stats()["bytes_sent"]
    if family == "hvd":
        optimizer = horovod_style(model, lr, name)
        return model, optimizer, lambda: optimizer.communication_stats()["bytes_sent"]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if family != "ccl":
        return model, optimizer, None

    optimizer = ct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        codec=ccl_codec(name))
    return model, optimizer, lambda: optimizer.communication_stats()["bytes_sent"]


def horovod_style(model, lr, compression):
    """A Horovod program's setup (``pytorch_mnist.py``'s), with ``ccl.torch`` as ``hvd``.

    ``hvd.init()`` has run (``ccl.bench.train`` initialises ``ccl.torch``
    once for every method that needs it). The learning rate is not scaled by
    ``hvd.size()``, as in every other method of the benchmark.
    """
    import torch

    import ccl.torch as hvd  # import horovod.torch as hvd

    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    if compression == "fp16":
        compression = hvd.Compression.fp16
    else:  # any ccl codec, beyond Horovod's fp16
        compression = hvd.Compression.codec(compression)
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    compression=compression)


def ddp_bytes_per_step(method, model, ranks, steps):
    """Payload bytes one rank sends per step under a DDP hook, computed, not counted.

    Each allreduce is counted as a ring's, ``2 (p - 1) / p`` times its
    buffer, as ccl counts ``MPI_Allreduce``: fp32 gradients for ``none``,
    half of that for ``fp16``, and for ``powersgd`` the first
    :data:`POWERSGD_START` steps uncompressed, then per matrix the factors
    ``P`` (n x r) and ``Q`` (m x r) and every tensor it leaves uncompressed
    (vectors, and matrices too small to gain ``powerSGD_hook``'s default
    compression rate of 2). Averaged over ``steps`` steps.
    """
    ring = 2 * (ranks - 1) / ranks
    params = [p for p in model.parameters() if p.requires_grad]
    full = sum(4 * p.numel() for p in params)
    if method == "ddp/fp16":
        return ring * full / 2
    if method != "ddp/powersgd":
        return ring * full
    compressed = 0
    for p in params:
        n, m = (p.shape[0], p.numel() // p.shape[0]) if p.dim() > 1 else (1, p.numel())
        if p.dim() > 1 and (n + m) * POWERSGD_RANK * 2 < n * m:
            compressed += 4 * (n + m) * POWERSGD_RANK
        else:
            compressed += 4 * p.numel()
    warm = min(POWERSGD_START, steps)
    return ring * (warm * full + (steps - warm) * compressed) / max(steps, 1)
