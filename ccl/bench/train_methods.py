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

gloo needs an address every rank can reach. When all ranks share memory it
is 127.0.0.1; otherwise (the emulated cluster, where each rank has a network
namespace of its own) every rank uses its first non-loopback interface
(``GLOO_SOCKET_IFNAME``) and the rendezvous is rank 0's address on it.
"""

import contextlib
import fcntl
import gc
import os
import socket
import struct

from mpi4py import MPI

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
_SIOCGIFADDR = 0x8915


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


def set_torch_threads(comm):
    """One share of this machine's cores per rank on it, for torch's intra-op pool.

    The share is ccl's thread budget rule (:mod:`ccl.threads`): the rank's
    cores over the ranks on its machine, counted by boot id, so the emulated
    cluster's namespaces count as the one machine they share. Returns the
    thread count set.
    """
    import torch

    from ccl import threads

    ranks = threads.ranks_on_machine(comm)
    torch.set_num_threads(max(1, threads.available_cores() // ranks))
    return torch.get_num_threads()


def _ipv4(interface):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", interface[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _network_interface():
    """This rank's first interface other than loopback with an IPv4 address, or None."""
    for _, name in sorted(socket.if_nameindex()):
        if name != "lo":
            address = _ipv4(name)
            if address is not None:
                return name, address
    return None


def _one_network(comm):
    """Whether every rank of ``comm`` is in this rank's network namespace (one loopback)."""
    try:
        mine = os.readlink("/proc/self/ns/net")
    except OSError:  # no /proc: ranks that share memory share a loopback too
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        mine = node.size
        node.Free()
        return comm.allreduce(mine) == comm.size * comm.size
    return len(set(comm.allgather(mine))) == 1


def _free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def init_gloo(comm):
    """Start torch.distributed's gloo group on ``comm``'s ranks (collective).

    Returns
    -------
    str
        The rendezvous address used.
    """
    import torch.distributed as dist

    address = "127.0.0.1"
    if _one_network(comm):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    else:
        found = _network_interface()
        if found is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", found[0])
            address = found[1]
    address = comm.bcast(address, root=0)
    port = comm.bcast(_free_port(address) if comm.rank == 0 else None, root=0)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    dist.init_process_group("gloo", init_method="env://", rank=comm.rank,
                            world_size=comm.size)
    return address


@contextlib.contextmanager
def gloo_group(comm):
    """A gloo group (:func:`init_gloo`) for the ``with`` block, destroyed after what it freed.

    torch's ``ProcessGroupGloo`` destructor waits for its worker threads
    while holding the GIL. Where a DDP model's reducer holds the group's last
    reference when it is freed, and a worker needs the GIL to free a tensor,
    the process hangs. So the models must not outlive the block (build and
    train them in a function called inside it), and a garbage collection
    frees what they left in reference cycles while the group is still
    registered, before the group is destroyed.
    """
    import torch.distributed as dist

    init_gloo(comm)
    try:
        yield
    finally:
        gc.collect()
        dist.destroy_process_group()


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
    ``hook/`` methods, the gloo group (:func:`init_gloo`) for ``ddp/`` and
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
